"""Write a set of ops of a :class:`~rkpart.ir.ModelGraph` as a standalone ONNX model.

Like ``onnx.utils.Extractor`` this builds a *new* ``ModelProto`` from small steps
(:func:`_collect_nodes`, the weights, :func:`rkpart.ir.standalone.model_of`), but it works from the graph's
:class:`~rkpart.ir.Subgraph` view (boundary, constant closure, weights) instead of a DFS over
names, never serialises the source model, and
streams weight bytes (from the parsed proto or straight from the source's external-data
file) into the stage's own data file, so a 4 GB model is cut with a few MB of memory.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from rkpart.errors import InvalidModelError, first_line
from rkpart.io import atomic_writer, hash_file
from rkpart.ir import ModelGraph, Subgraph
from rkpart.ir.ops import CONTROL_FLOW_OPS
from rkpart.ir.standalone import model_of
from rkpart.plan.weights import Piece, put_bytes, write_pieces

#: weights at least this large go to the stage's external data file
DEFAULT_EXTERNAL_THRESHOLD = 1024
_CHUNK = 1 << 22


@dataclass(frozen=True)
class ExtractedStage:
    file: str
    data_file: str | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weight_bytes: int
    io_bytes: int
    sha256: str
    num_nodes: int


def _collect_nodes(mg: ModelGraph, sub: Subgraph) -> list[onnx.NodeProto]:
    """The stage's nodes: its data ops and their constant closure, in model order."""
    nodes = []
    for i in sub.all_ops:
        op = mg.op(i)
        if op.op_type in CONTROL_FLOW_OPS:
            raise InvalidModelError(
                f"control-flow op {op.op_type} ({op.name or i}) cannot be partitioned; "
                "inline it (e.g. onnxsim) or keep it in a single custom stage"
            )
        nodes.append(mg.const_node(i) if i in mg.const_ops else mg.node_proto(i))
    return nodes


def _initializer_bytes(mg: ModelGraph, init: TensorProto, dst: BinaryIO, chunk: int = _CHUNK) -> int:
    """Stream one initializer's raw little-endian bytes into ``dst``; returns bytes written."""
    if init.data_location == TensorProto.EXTERNAL:
        info = {e.key: e.value for e in init.external_data}
        src = mg.path.parent / info["location"]
        offset = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length") else mg.weight_bytes(init.name)
        with open(src, "rb") as f:
            f.seek(offset)
            left = length
            while left:
                buf = f.read(min(chunk, left))
                if not buf:
                    raise InvalidModelError(f"tensor {init.name!r}: external data file {src.name} is too short")
                dst.write(buf)
                left -= len(buf)
        return length
    data = init.raw_data if init.HasField("raw_data") else np.ascontiguousarray(numpy_helper.to_array(init)).tobytes()
    dst.write(data)
    return len(data)


def _inline(mg: ModelGraph, t: str) -> TensorProto:
    init = mg.initializers[t]
    if init.data_location != TensorProto.EXTERNAL:
        return init
    import io

    buf = io.BytesIO()
    _initializer_bytes(mg, init, buf)
    small = TensorProto(name=t, data_type=init.data_type, dims=list(init.dims))
    small.raw_data = buf.getvalue()
    return small


#: one piece of a stage's data file: zero padding, a slice of a source file, or bytes
_Piece = Piece


@dataclass
class PendingStage:
    """A stage whose ``.onnx`` is written and whose data file and sha256 may still be in flight."""

    stage: ExtractedStage
    _sha: Future[str] | None = None
    _data: Future[None] | None = None

    def done(self) -> bool:
        return all(f is None or f.done() for f in (self._sha, self._data))

    def result(self) -> ExtractedStage:
        """The finished stage (waits for its data file and hash)."""
        if self._data is not None:
            self._data.result()
        if self._sha is None:
            return self.stage
        return replace(self.stage, sha256=self._sha.result())


def extract(
    mg: ModelGraph,
    sub: Subgraph,
    path: Path,
    *,
    name: str,
    external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD,
    doc: str = "",
    linked: Mapping[str, str] | None = None,
    durable: bool = True,
) -> ExtractedStage:
    """Write ``sub`` as ``path`` (+ ``path.data`` for weights >= ``external_threshold``).

    With ``linked`` (source data location -> location relative to ``path``'s folder, see
    :mod:`rkpart.plan.weights`) weights stored externally in the source are
    referenced there by their source offset and length instead of being copied.
    ``durable=False`` skips the per-file ``fsync`` (the caller flushes the folder once).
    """
    return extract_start(mg, sub, path, name=name, external_threshold=external_threshold, doc=doc,
                         linked=linked, durable=durable).result()


@dataclass(frozen=True)
class _Layout:
    """A stage decided but not written: its ``.onnx`` bytes and its data file's pieces."""

    onnx_bytes: bytes
    pieces: list[_Piece]
    stage: ExtractedStage

    def source_sha256(self) -> str:
        """The stage's sha256 (``.onnx`` bytes, then data bytes) computed from the *source*:
        what its files will hash to once written."""
        return _hash_pieces(self.onnx_bytes, self.pieces)


def _layout(
    mg: ModelGraph,
    sub: Subgraph,
    path: Path,
    *,
    name: str,
    external_threshold: int,
    doc: str,
    linked: Mapping[str, str] | None,
    infos: dict[str, onnx.ValueInfoProto] | None = None,
) -> _Layout:
    nodes = _collect_nodes(mg, sub)
    sizes = {t: mg.weight_bytes(t) for t in sub.weights}
    big = {t for t, n in sizes.items() if n >= external_threshold}
    data_name = path.name + ".data"
    initializers: list[TensorProto] = []
    pieces: list[_Piece] = []
    offset = 0
    for t in sub.weights:
        init = mg.initializers[t]
        if t not in big:
            initializers.append(_inline(mg, t))
            continue
        src = _source_ref(init)
        length = sizes[t]
        if linked and src is not None and src[0] in linked:
            initializers.append(_external(init, linked[src[0]], src[1], length))
            continue
        pad = (-offset) % 64  # keep tensors aligned for readers that mmap
        if pad:
            pieces.append(("pad", None, 0, pad))
            offset += pad
        if src is not None:
            pieces.append(("file", mg.path.parent / src[0], src[1], length))
        else:
            raw = _inline(mg, t).raw_data
            if len(raw) != length:
                from rkpart.errors import InternalError

                raise InternalError(f"tensor {t!r}: {len(raw)} bytes, its shape needs {length}")
            pieces.append(("bytes", raw, 0, length))
        initializers.append(_external(init, data_name, offset, length))
        offset += length
    model = model_of(mg, sub, nodes, initializers, name=name, doc=doc, producer_name="rkpart",
                   value_info=True, infos=infos)
    stage = ExtractedStage(
        file=path.name,
        data_file=data_name if pieces else None,
        inputs=sub.inputs,
        outputs=sub.outputs,
        weight_bytes=sub.weight_bytes,
        io_bytes=sub.io_bytes,
        sha256="",
        num_nodes=len(nodes),
    )
    return _Layout(model.SerializeToString(deterministic=True), pieces, stage)


def source_sha256(
    mg: ModelGraph,
    sub: Subgraph,
    path: Path,
    *,
    name: str,
    external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD,
    doc: str = "",
    linked: Mapping[str, str] | None = None,
) -> str:
    """The sha256 :func:`extract` would record for this stage, computed from the source
    without writing anything (a resumed stage is checked against it)."""
    return _layout(mg, sub, path, name=name, external_threshold=external_threshold, doc=doc,
                   linked=linked).source_sha256()


def extract_start(
    mg: ModelGraph,
    sub: Subgraph,
    path: Path,
    *,
    name: str,
    external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD,
    doc: str = "",
    linked: Mapping[str, str] | None = None,
    durable: bool = True,
    pool: Executor | None = None,
    infos: dict[str, onnx.ValueInfoProto] | None = None,
) -> PendingStage:
    """:func:`extract`, with the weight bytes moved and hashed on ``pool`` (when given).

    The data file's layout is decided first, so that the stage's ``.onnx`` can be written
    and its sha256 (the ``.onnx`` bytes, then the data bytes) computed while the data file
    is written (:func:`~rkpart.plan.weights.write_pieces`): every weight byte is read
    once from the source, hashed and written from the same buffer, never read back.
    """
    lay = _layout(mg, sub, path, name=name, external_threshold=external_threshold, doc=doc, linked=linked,
                  infos=infos)
    data, pieces, stage = lay.onnx_bytes, lay.pieces, lay.stage
    data_path = path.with_name(path.name + ".data")
    if durable:
        with atomic_writer(path) as tmp:
            tmp.write_bytes(data)
    else:
        put_bytes(path, data)
    if not pieces:
        if data_path.exists():
            data_path.unlink()
        return PendingStage(replace(stage, sha256=hashlib.sha256(data).hexdigest()))
    if pool is None:
        return PendingStage(replace(stage, sha256=_write_hashed(data, pieces, data_path, durable)))
    return PendingStage(stage, pool.submit(_write_hashed, data, pieces, data_path, durable))


def _hash_pieces(head: bytes, pieces: list[_Piece]) -> str:
    """sha256 of ``head`` followed by the data file ``pieces`` describe, read from their sources."""
    h = hashlib.sha256(head)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    for kind, src, off, length in pieces:
        if kind == "pad":
            h.update(bytes(length))
        elif kind == "bytes":
            h.update(src)
        else:
            with open(src, "rb", buffering=0) as f:
                f.seek(off)
                left = length
                while left:
                    k = f.readinto(view[:min(_CHUNK, left)])
                    if not k:
                        raise InvalidModelError(f"external data file {Path(src).name} is too short")
                    h.update(view[:k])
                    left -= k
    return h.hexdigest()


def _write_hashed(head: bytes, pieces: list[_Piece], path: Path, durable: bool) -> str:
    """Write the data file ``pieces`` describe; return sha256 of ``head`` then those bytes."""
    h = hashlib.sha256(head)
    if durable:
        with atomic_writer(path) as tmp:
            write_pieces(pieces, tmp, h)
    else:
        write_pieces(pieces, path, h)
    return h.hexdigest()


def _source_ref(init: TensorProto) -> tuple[str, int, int | None] | None:
    """``(location, offset, length)`` of an initializer stored externally in the source, else ``None``."""
    if init.data_location != TensorProto.EXTERNAL:
        return None
    info = {e.key: e.value for e in init.external_data}
    length = int(info["length"]) if info.get("length") else None
    return info["location"], int(info.get("offset", 0) or 0), length


def _external(init: TensorProto, location: str, offset: int, length: int) -> TensorProto:
    ext = TensorProto(name=init.name, data_type=init.data_type, dims=list(init.dims))
    ext.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = ext.external_data.add()
        e.key, e.value = k, v
    return ext


def stage_sha256(path: Path) -> str:
    """A stage's identity: its ``.onnx`` bytes followed by its ``.onnx.data`` bytes (if any)."""
    h = hashlib.sha256()
    hash_file(h, path)
    data = path.with_name(path.name + ".data")
    if data.is_file():
        hash_file(h, data)
    return h.hexdigest()


def check_stage(path: Path) -> None:
    """``onnx.checker`` on a written stage (external data resolved from its folder)."""
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        from rkpart.errors import InternalError

        raise InternalError(f"extracted stage {path.name} fails onnx.checker: {first_line(e)}") from None


def copy_file(src: Path, dst: Path) -> None:
    with atomic_writer(dst) as tmp:
        shutil.copyfile(src, tmp)
