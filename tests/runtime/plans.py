"""A hand-built plan with two consecutive host stages (real ONNX files, run by ONNX Runtime)::

    x ─> [scale (host): x * w] ─ s ─> [shift (host): s + x] ─ h ─> [mm (npu): h @ W] ─ m ─> [act (host): relu] ─> y

Built-in strategies merge consecutive host groups when they partition; a custom or plugin
plan need not, and the executor fuses them into one session at run time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.plan.plan import Plan, Stage, TensorInfo

F = TensorProto.FLOAT
D = 64
T = 32


def _stage(folder: Path, sid: str, device: str, nodes: list[onnx.NodeProto], ins: list[str], outs: list[str],
           inits: list[onnx.TensorProto]) -> Stage:
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, sid, [vi(n, F, [T, D]) for n in ins], [vi(n, F, [T, D]) for n in outs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    data = m.SerializeToString()
    (folder / "stages" / f"{sid}.onnx").write_bytes(data)
    return Stage(id=sid, device=device, file=f"stages/{sid}.onnx", inputs=tuple(ins), outputs=tuple(outs),  # type: ignore[arg-type]
                 block=0, region=sid, kind=sid, weight_bytes=sum(numpy_helper.to_array(t).nbytes for t in inits),
                 io_bytes=T * D * 4 * (len(ins) + len(outs)), sha256=hashlib.sha256(data).hexdigest(),
                 num_nodes=len(nodes), blocks=(0,))


def host_run_plan(folder: Path) -> Plan:
    (folder / "stages").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((D,)).astype(np.float32), "w")
    big = numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32) * 0.1, "W")
    stages = (
        _stage(folder, "scale", "host", [helper.make_node("Mul", ["x", "w"], ["s"])], ["x"], ["s"], [w]),
        _stage(folder, "shift", "host", [helper.make_node("Add", ["s", "x"], ["h"])], ["s", "x"], ["h"], []),
        _stage(folder, "mm", "npu", [helper.make_node("MatMul", ["h", "W"], ["m"])], ["h"], ["m"], [big]),
        _stage(folder, "act", "host", [helper.make_node("Relu", ["m"], ["y"])], ["m"], ["y"], []),
    )
    plan = Plan(
        model={"file": "hostrun.onnx", "sha256": "2" * 64, "opset": 17},
        strategy={"name": "custom", "options": {}},
        inputs=("x",), outputs=("y",),
        tensors={n: TensorInfo(n, "float32", (T, D)) for n in ("x", "s", "h", "m", "y")},
        stages=stages,
    )
    plan.save(folder)
    return plan
