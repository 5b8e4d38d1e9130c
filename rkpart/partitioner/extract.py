"""Write a set of ops of a :class:`ModelGraph` as a standalone ONNX model.

Like ``onnx.utils.Extractor`` this builds a *new* ``ModelProto`` from small steps
(:func:`_boundary`, :func:`_collect_nodes`, :func:`_write_weights`), but it works from the
precomputed op sets instead of a DFS over names, never serialises the source model, and
streams weight bytes (from the parsed proto or straight from the source's external-data
file) into the stage's own data file, so a 4 GB model is cut with a few MB of memory.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.errors import InvalidModelError, first_line
from rkpart.io import atomic_writer, hash_file
from rkpart.ir import ModelGraph, shape_as_constant
from rkpart.ir.ops import CONTROL_FLOW_OPS

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


def boundary(
    mg: ModelGraph, ops: Iterable[int], outside_consumers: Mapping[str, bool] | None = None
) -> tuple[list[str], list[str]]:
    """Inputs and outputs of the op set ``ops`` (constants excluded from inputs)."""
    opset = set(ops)
    produced: list[str] = []
    inputs: list[str] = []
    seen_in: set[str] = set()
    model_outputs = set(mg.outputs)
    for i in sorted(opset):
        n = mg.nodes[i]
        for t in n.input:
            if not t or t in seen_in or mg.is_const_tensor(t):
                continue
            p = mg.producer.get(t)
            if p is None or p not in opset:
                inputs.append(t)
                seen_in.add(t)
        produced.extend(t for t in n.output if t)
    outputs = []
    for t in produced:
        if t in model_outputs or any(c not in opset and c not in mg.const_ops for c in mg.consumers.get(t, [])):
            outputs.append(t)
    return inputs, outputs


def _collect_nodes(mg: ModelGraph, ops: Iterable[int]) -> list[onnx.NodeProto]:
    opset = set(ops)
    consts_needed = mg.const_closure(
        t for i in opset for t in mg.nodes[i].input if t and mg.is_const_tensor(t)
    )
    order = sorted(opset | set(consts_needed))
    nodes = []
    for i in order:
        n = mg.nodes[i]
        if n.op_type in CONTROL_FLOW_OPS:
            raise InvalidModelError(
                f"control-flow op {n.op_type} ({n.name or i}) cannot be partitioned; "
                "inline it (e.g. onnxsim) or keep it in a single custom stage"
            )
        if i in mg.const_ops and n.op_type == "Shape":
            nodes.append(shape_as_constant(n, mg.tensor_types))
        else:
            nodes.append(n)
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
    if init.HasField("raw_data"):
        dst.write(init.raw_data)
        return len(init.raw_data)
    arr = numpy_helper.to_array(init)
    data = np.ascontiguousarray(arr).tobytes()
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


def extract(
    mg: ModelGraph,
    ops: Iterable[int],
    path: Path,
    *,
    inputs: list[str],
    outputs: list[str],
    name: str,
    external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD,
    doc: str = "",
) -> ExtractedStage:
    """Write the op set as ``path`` (+ ``path.data`` for weights >= ``external_threshold``)."""
    nodes = _collect_nodes(mg, ops)
    used: list[str] = []
    seen: set[str] = set()
    for n in nodes:
        for t in n.input:
            if t in mg.initializers and t not in seen:
                used.append(t)
                seen.add(t)
    weight_bytes = sum(mg.weight_bytes(t) for t in used)
    big = {t for t in used if mg.weight_bytes(t) >= external_threshold}
    data_name = path.name + ".data"
    data_path = path.with_name(data_name)
    initializers: list[TensorProto] = []
    if big:
        with atomic_writer(data_path) as tmp_data, open(tmp_data, "wb") as dst:
            offset = 0
            for t in used:
                if t not in big:
                    initializers.append(_inline(mg, t))
                    continue
                init = mg.initializers[t]
                pad = (-offset) % 64  # keep tensors aligned for readers that mmap
                if pad:
                    dst.write(b"\0" * pad)
                    offset += pad
                written = _initializer_bytes(mg, init, dst)
                ext = TensorProto(name=t, data_type=init.data_type, dims=list(init.dims))
                ext.data_location = TensorProto.EXTERNAL
                for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(written))):
                    e = ext.external_data.add()
                    e.key, e.value = k, v
                offset += written
                initializers.append(ext)
    else:
        if data_path.exists():
            data_path.unlink()
        initializers = [_inline(mg, t) for t in used]
    return _finish(mg, nodes, initializers, path, data_path if big else None,
                   inputs, outputs, name, weight_bytes, doc)


def _finish(
    mg: ModelGraph,
    nodes: list[onnx.NodeProto],
    initializers: list[TensorProto],
    path: Path,
    data_path: Path | None,
    inputs: list[str],
    outputs: list[str],
    name: str,
    weight_bytes: int,
    doc: str,
) -> ExtractedStage:
    types = mg.tensor_types

    def vi(t: str) -> onnx.ValueInfoProto:
        dt, shape = types[t]
        return helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), list(shape))

    internal = sorted({
        t for n in nodes for t in n.output if t and t in types and t not in outputs
    }, key=lambda t: (mg.producer.get(t, -1), t))
    graph = helper.make_graph(
        nodes,
        name,
        [vi(t) for t in inputs],
        [vi(t) for t in outputs],
        initializer=initializers,
        value_info=[vi(t) for t in internal],
        doc_string=doc,
    )
    model = helper.make_model(
        graph,
        opset_imports=list(mg.model.opset_import),
        producer_name="rkpart",
        ir_version=mg.model.ir_version,
    )
    data = model.SerializeToString(deterministic=True)
    with atomic_writer(path) as tmp:
        tmp.write_bytes(data)
    io_bytes = sum(mg.nbytes(t) for t in [*inputs, *outputs])
    return ExtractedStage(
        file=path.name,
        data_file=data_path.name if data_path else None,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        weight_bytes=weight_bytes,
        io_bytes=io_bytes,
        sha256=stage_sha256(path),
        num_nodes=len(nodes),
    )


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
