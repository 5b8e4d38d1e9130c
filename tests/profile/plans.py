"""Small hand-built plans for the profiler tests (real ONNX files run by ONNX Runtime).

``mini_block_plan``: one DiT-like block split the way the write-up did, with the modulation
and the residual on the host::

    x ─┐                          encoder_hidden_states ─┐
    temb ─> [adaln  (host)] ─ h ─> [attn (npu)] ─ a ─> [xattn (npu)] ─ c ─> [residual (host)] ─> y
                                                                      x ───────┘

``big_intermediate_plan``: one NPU stage whose execution needs a known, large intermediate
tensor (``Expand`` to ``rows x 4096`` float32, then ``ReduceSum``)::

    x[1] ─> Expand(rows, 4096) ─> ReduceSum ─> y[1]
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.plan.plan import Plan, Stage, TensorInfo

F = TensorProto.FLOAT
D = 32  # hidden size
T = 16  # tokens
C = 8  # context tokens


def _save(model: onnx.ModelProto, path: Path) -> str:
    model.opset_import[0].version = 17
    model.ir_version = 8
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _stage(folder: Path, sid: str, device: str, region: str, graph: onnx.GraphProto, block: int | None,
           io_bytes: int) -> Stage:
    model = helper.make_model(graph)
    sha = _save(model, folder / "stages" / f"{sid}.onnx")
    weights = sum(numpy_helper.to_array(t).nbytes for t in graph.initializer)
    return Stage(
        id=sid, device=device, file=f"stages/{sid}.onnx",
        inputs=tuple(i.name for i in graph.input), outputs=tuple(o.name for o in graph.output),
        block=block, region=region, kind=region, weight_bytes=weights, io_bytes=io_bytes,
        sha256=sha, num_nodes=len(graph.node), blocks=() if block is None else (block,),
    )


def mini_block_plan(folder: Path, strategy: str = "split") -> Plan:
    (folder / "stages").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32) * 0.1, "w_attn")
    vi = helper.make_tensor_value_info
    adaln = helper.make_graph(
        [helper.make_node("Unsqueeze", ["temb", "ax"], ["t3"]),
         helper.make_node("Add", ["t3", "one"], ["scale"]),
         helper.make_node("Mul", ["x", "scale"], ["h"])],
        "adaln", [vi("x", F, [1, T, D]), vi("temb", F, [1, D])], [vi("h", F, [1, T, D])],
        [numpy_helper.from_array(np.array([1], np.int64), "ax"),
         numpy_helper.from_array(np.ones((1,), np.float32), "one")],
    )
    attn = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w_attn"], ["q"]),
         helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["q", "qt"], ["s"]),
         helper.make_node("Softmax", ["s"], ["p"], axis=-1),
         helper.make_node("MatMul", ["p", "q"], ["a"])],
        "attn", [vi("h", F, [1, T, D])], [vi("a", F, [1, T, D])], [w],
    )
    xattn = helper.make_graph(
        [helper.make_node("Transpose", ["encoder_hidden_states"], ["kt"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["a", "kt"], ["s"]),
         helper.make_node("Softmax", ["s"], ["p"], axis=-1),
         helper.make_node("MatMul", ["p", "encoder_hidden_states"], ["c"])],
        "xattn", [vi("a", F, [1, T, D]), vi("encoder_hidden_states", F, [1, C, D])], [vi("c", F, [1, T, D])],
    )
    residual = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "residual", [vi("x", F, [1, T, D]), vi("c", F, [1, T, D])], [vi("y", F, [1, T, D])],
    )
    tb = T * D * 4
    stages = (
        _stage(folder, "b0_adaln", "host", "adaln", adaln, 0, 2 * tb),
        _stage(folder, "b0_attn", "npu", "attn", attn, 0, 2 * tb),
        _stage(folder, "b0_xattn", "npu", "xattn", xattn, 0, 2 * tb + C * D * 4),
        _stage(folder, "b0_residual", "host", "residual", residual, 0, 3 * tb),
    )
    tensors = {
        "x": TensorInfo("x", "float32", (1, T, D)),
        "temb": TensorInfo("temb", "float32", (1, D)),
        "encoder_hidden_states": TensorInfo("encoder_hidden_states", "float32", (1, C, D)),
        "h": TensorInfo("h", "float32", (1, T, D)),
        "a": TensorInfo("a", "float32", (1, T, D)),
        "c": TensorInfo("c", "float32", (1, T, D)),
        "y": TensorInfo("y", "float32", (1, T, D)),
    }
    plan = Plan(
        model={"file": "mini.onnx", "sha256": "0" * 64, "opset": 17},
        strategy={"name": strategy, "options": {}},
        inputs=("x", "temb", "encoder_hidden_states"), outputs=("y",),
        tensors=tensors, stages=stages,
    )
    plan.save(folder)
    return plan


def big_intermediate_plan(folder: Path, rows: int = 4096) -> Plan:
    """One stage that materialises a ``rows x 4096`` float32 tensor (rows * 16 KiB)."""
    (folder / "stages").mkdir(parents=True, exist_ok=True)
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["big"]),
         helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0)],
        "big", [vi("x", F, [1])], [vi("y", F, [])],
        [numpy_helper.from_array(np.array([rows, 4096], np.int64), "shape")],
    )
    st = _stage(folder, "big", "npu", "block", g, 0, 8)
    plan = Plan(
        model={"file": "big.onnx", "sha256": "1" * 64, "opset": 17},
        strategy={"name": "test", "options": {}},
        inputs=("x",), outputs=("y",),
        tensors={"x": TensorInfo("x", "float32", (1,)), "y": TensorInfo("y", "float32", ())},
        stages=(st,),
    )
    plan.save(folder)
    return plan
