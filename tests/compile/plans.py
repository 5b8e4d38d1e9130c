"""Tiny hand-built plans for the compile tests (real ONNX files, built by the real toolkit).

``tiny_plan``: three NPU stages and one host stage, each a few hundred parameters so a build
takes about a second::

    x[1,8,16] ─> [ffn (npu): MatMul ─ exact GELU ─ MatMul] ─ f ─> [erf (npu): Erf ─ Add] ─ e
    img[1,4,8,8] ─> [conv (npu): Conv ─ Relu] ─ c                                            │
    e ─> [scale (host): Mul 0.5] ─> y

The standalone ``Erf`` is not in the GELU pattern, so every toolkit version places it on
the CPU; the GELU inside ``ffn`` fuses and stays on the NPU.

``adaln_crash_plan``: AdaLN whose shift/scale come from SiLU+Linear (opset 17
``LayerNormalization``), followed by a MatMul: rknn-toolkit2 2.3.2 segfaults on it
(``fuse_exnorm_mul``), 2.3.0 and 2.5.0 build it::

    x[1,16,64] ─> LayerNorm ─> * (1 + scale) + shift ─> self-attention (MatMul, Softmax) ─> y
    t[1,64] ─> SiLU ─> Linear ─> Split ─> shift, scale

(With only a MatMul after the modulation, 2.3.2 built this tiny graph; with attention
after it, it crashes in the native pass ``RKNNSubgraphManager``.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.plan.plan import Plan, Stage, TensorInfo

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _save(graph: onnx.GraphProto, path: Path, opset: int = 17) -> str:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _stage(folder: Path, sid: str, device: str, graph: onnx.GraphProto, io_bytes: int,
           opset: int = 17) -> Stage:
    sha = _save(graph, folder / "stages" / f"{sid}.onnx", opset)
    weights = sum(numpy_helper.to_array(t).nbytes for t in graph.initializer)
    return Stage(id=sid, device=device, file=f"stages/{sid}.onnx",
                 inputs=tuple(i.name for i in graph.input), outputs=tuple(o.name for o in graph.output),
                 block=0, region=sid, kind=sid, weight_bytes=weights, io_bytes=io_bytes, sha256=sha,
                 num_nodes=len(graph.node), blocks=(0,))


def _w(rng: np.random.Generator, shape: tuple[int, ...], name: str, scale: float = 0.2) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def ffn_graph(seed: int = 0, inp: str = "x") -> onnx.GraphProto:
    rng = np.random.default_rng(seed)
    c = numpy_helper.from_array
    return helper.make_graph(
        [helper.make_node("MatMul", [inp, "w1"], ["h"]),
         helper.make_node("Div", ["h", "sqrt2"], ["hd"]),
         helper.make_node("Erf", ["hd"], ["he"]),
         helper.make_node("Add", ["he", "one"], ["hp"]),
         helper.make_node("Mul", ["h", "hp"], ["hm"]),
         helper.make_node("Mul", ["hm", "half"], ["g"]),
         helper.make_node("MatMul", ["g", "w2"], ["f"])],
        "ffn", [vi(inp, F, [1, 8, 16])], [vi("f", F, [1, 8, 16])],
        [_w(rng, (16, 32), "w1"), _w(rng, (32, 16), "w2"),
         c(np.array(np.sqrt(2.0), np.float32), "sqrt2"), c(np.array(1.0, np.float32), "one"),
         c(np.array(0.5, np.float32), "half")],
    )


def tiny_plan(folder: Path, seed: int = 0) -> Plan:
    rng = np.random.default_rng(seed + 1)
    erf = helper.make_graph(
        [helper.make_node("Erf", ["f"], ["ef"]), helper.make_node("Add", ["ef", "f"], ["e"])],
        "erf", [vi("f", F, [1, 8, 16])], [vi("e", F, [1, 8, 16])])
    conv = helper.make_graph(
        [helper.make_node("Conv", ["img", "wc", "bc"], ["cv"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["cv"], ["c"])],
        "conv", [vi("img", F, [1, 4, 8, 8])], [vi("c", F, [1, 8, 8, 8])],
        [_w(rng, (8, 4, 3, 3), "wc"), _w(rng, (8,), "bc")])
    scale = helper.make_graph(
        [helper.make_node("Mul", ["e", "k"], ["y"])], "scale", [vi("e", F, [1, 8, 16])],
        [vi("y", F, [1, 8, 16])], [numpy_helper.from_array(np.array(0.5, np.float32), "k")])
    tb = 8 * 16 * 4
    stages = (
        _stage(folder, "ffn", "npu", ffn_graph(seed), 2 * tb),
        _stage(folder, "erf", "npu", erf, 2 * tb),
        _stage(folder, "conv", "npu", conv, 4 * 64 * 4 + 8 * 64 * 4),
        _stage(folder, "scale", "host", scale, 2 * tb),
    )
    tensors = {n: TensorInfo(n, "float32", (1, 8, 16)) for n in ("x", "f", "e", "y")}
    tensors["img"] = TensorInfo("img", "float32", (1, 4, 8, 8))
    tensors["c"] = TensorInfo("c", "float32", (1, 8, 8, 8))
    plan = Plan(model={"file": "tiny.onnx", "sha256": "0" * 64, "opset": 17},
                strategy={"name": "test", "options": {}}, inputs=("x", "img"), outputs=("y", "c"),
                tensors=tensors, stages=stages)
    plan.save(folder)
    return plan


def adaln_graph(d: int = 64, tokens: int = 16) -> onnx.GraphProto:
    rng = np.random.default_rng(3)
    c = numpy_helper.from_array
    return helper.make_graph(
        [helper.make_node("Sigmoid", ["t"], ["ts"]),
         helper.make_node("Mul", ["t", "ts"], ["silu"]),
         helper.make_node("MatMul", ["silu", "wm"], ["mod0"]),
         helper.make_node("Add", ["mod0", "bm"], ["mod"]),
         helper.make_node("Split", ["mod", "split"], ["shift", "scale"], axis=-1),
         helper.make_node("Unsqueeze", ["shift", "ax"], ["shift3"]),
         helper.make_node("Unsqueeze", ["scale", "ax"], ["scale3"]),
         helper.make_node("LayerNormalization", ["x", "gamma"], ["ln"], axis=-1, epsilon=1e-6),
         helper.make_node("Add", ["scale3", "one"], ["s1"]),
         helper.make_node("Mul", ["ln", "s1"], ["lm"]),
         helper.make_node("Add", ["lm", "shift3"], ["h"]),
         # single-head self-attention after the modulation
         helper.make_node("MatMul", ["h", "wq"], ["q"]),
         helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["q", "qt"], ["s"]),
         helper.make_node("Softmax", ["s"], ["p"], axis=-1),
         helper.make_node("MatMul", ["p", "q"], ["y"])],
        "adaln", [vi("x", F, [1, tokens, d]), vi("t", F, [1, d])], [vi("y", F, [1, tokens, d])],
        [_w(rng, (d, 2 * d), "wm", 0.1), _w(rng, (2 * d,), "bm", 0.1), _w(rng, (d, d), "wq", 0.1),
         c(np.array([d, d], np.int64), "split"), c(np.array([1], np.int64), "ax"),
         c(np.ones(d, np.float32), "gamma"), c(np.array(1.0, np.float32), "one")],
    )


def adaln_crash_plan(folder: Path) -> Plan:
    """One NPU stage that crashes 2.3.2 and one that builds everywhere."""
    g = adaln_graph()
    stages = (
        _stage(folder, "adaln", "npu", g, 2 * 16 * 64 * 4 + 64 * 4),
        _stage(folder, "ffn", "npu", ffn_graph(inp="u"), 2 * 8 * 16 * 4),
    )
    tensors = {"x": TensorInfo("x", "float32", (1, 16, 64)), "t": TensorInfo("t", "float32", (1, 64)),
               "y": TensorInfo("y", "float32", (1, 16, 64))}
    tensors.update({n: TensorInfo(n, "float32", (1, 8, 16)) for n in ("u", "f")})
    plan = Plan(model={"file": "adaln.onnx", "sha256": "1" * 64, "opset": 17},
                strategy={"name": "test", "options": {}}, inputs=("x", "t", "u"), outputs=("y", "f"),
                tensors=tensors, stages=stages)
    plan.save(folder)
    return plan


def only(plan: Plan, *stage_ids: str) -> Plan:
    """The plan restricted to some stages (to keep tests that need one build short)."""
    import dataclasses

    return dataclasses.replace(plan, stages=tuple(s for s in plan.stages if s.id in stage_ids))
