"""onnxsim on an extracted NPU stage, kept only when ONNX Runtime says nothing changed.

Extraction copies every constant computation a stage needs into it; onnxsim folds those
and removes identities, which gives rknn-toolkit2 a cleaner graph.  The simplified stage
must keep its boundary (same input/output names, types and shapes) and produce outputs
equal to the original's on seeded random inputs; otherwise the original is kept.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import onnx

from rkpart.io import atomic_writer
from rkpart.ir import graph_io
from rkpart.plan.extract import ExtractedStage, stage_sha256

#: allowed difference between original and simplified stage outputs (fp32 reordering)
RTOL, ATOL = 1e-5, 1e-6


def _io(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(v.name, v.type.SerializeToString(deterministic=True).hex())
            for v in [*model.graph.input, *model.graph.output]]


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    from rkpart.runtime.executor import random_feeds

    return random_feeds(((n, dt, shape) for n, (dt, shape) in graph_io(model).inputs.items()), seed)


def simplify_stage(path: Path, stage: ExtractedStage) -> ExtractedStage | None:
    """Simplify ``path`` in place if that is safe; returns the new record or ``None`` if kept."""
    import onnxsim

    from rkpart.runtime.ort import make_session

    original = onnx.load(str(path))  # loads external data: one stage, not the whole model
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            simplified, ok = onnxsim.simplify(original, check_n=0, certify=False)
    except Exception:  # noqa: BLE001 - onnxsim failing means "keep the original", nothing more
        return None
    if not ok or _io(simplified) != _io(original):
        return None
    feeds = _feeds(original)
    names = [o.name for o in original.graph.output]
    ref = make_session(original.SerializeToString()).run(names, feeds)
    try:
        got = make_session(simplified.SerializeToString()).run(names, feeds)
    except Exception:  # noqa: BLE001 - an unrunnable result is simply not used
        return None
    for a, b in zip(got, ref, strict=True):
        if not np.allclose(a, b, rtol=RTOL, atol=ATOL):
            return None
    data_name = path.name + ".data"
    data_path = path.with_name(data_name)
    # write through a temp folder so the .onnx and its .data are swapped together
    blob = io.BytesIO()
    tensors = [t for t in simplified.graph.initializer
               if t.HasField("raw_data") and len(t.raw_data) >= 1024]
    offset = 0
    for t in tensors:
        pad = (-offset) % 64
        blob.write(b"\0" * pad)
        offset += pad
        raw = t.raw_data
        blob.write(raw)
        del t.external_data[:]
        for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
            e = t.external_data.add()
            e.key, e.value = k, v
        t.data_location = onnx.TensorProto.EXTERNAL
        t.ClearField("raw_data")
        offset += len(raw)
    data = simplified.SerializeToString(deterministic=True)
    if tensors:
        with atomic_writer(data_path) as tmp:
            tmp.write_bytes(blob.getvalue())
    elif data_path.exists():
        data_path.unlink()
    with atomic_writer(path) as tmp:
        tmp.write_bytes(data)
    return ExtractedStage(
        file=stage.file, data_file=data_name if tensors else None, inputs=stage.inputs, outputs=stage.outputs,
        weight_bytes=stage.weight_bytes, io_bytes=stage.io_bytes, sha256=stage_sha256(path),
        num_nodes=len(simplified.graph.node),
    )
