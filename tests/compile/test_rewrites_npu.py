"""NPU rewrites for what the toolkits left on the CPU inside NPU stages (issue 18, rewrites table).

Each rewrite is checked twice on a tiny model written the way the exporter writes the pattern:

* under ONNX Runtime (fast tier): the rewritten model gives the same bits as the original,
  including the inputs the pattern exists for (a fully masked attention row);
* with real rknn-toolkit2 builds (``toolkit``): the placement report ("Network Layer Information
  Table", Target column) lists the CPU layer without the rewrite and none with it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.plan.plan import Plan, TensorInfo
from rkpart.runtime.ort import make_session
from rkpart.targets.rewrites import apply_rewrites, rewrites_for
from tests.compile.plans import _stage
from tests.toolkits import get_toolkit

F, H, B = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BOOL
vi = helper.make_tensor_value_info
c = numpy_helper.from_array


def _model(graph: onnx.GraphProto, opset: int = 17) -> onnx.ModelProto:
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(m)
    return m


def _run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(x) for x in make_session(m.SerializeToString()).run(None, feeds)]


def _rewritten(m: onnx.ModelProto, toolkit: str = "2.3.0") -> tuple[onnx.ModelProto, dict[str, int]]:
    r = onnx.ModelProto()
    r.CopyFrom(m)
    done = apply_rewrites(r, rewrites_for(toolkit, "npu"))
    onnx.checker.check_model(r)
    return r, done


def _bits_equal(a: onnx.ModelProto, b: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    for x, y in zip(_run(a, feeds), _run(b, feeds), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y, equal_nan=True), float(np.nanmax(np.abs(x.astype(np.float64) - y)))


# -- models -----------------------------------------------------------------------------------

def ffn_f16(sqrt2: float = math.sqrt(2), h: type = np.float16) -> onnx.GraphProto:
    """MatMul - exact GELU - MatMul in float16, as the TorchScript exporter writes nn.GELU (the
    Div constant is float16(sqrt 2) = 1.4140625)."""
    rng = np.random.default_rng(0)
    et = H if h is np.float16 else F
    return helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="h"),
         helper.make_node("Constant", [], ["sqrt2"], value=c(np.array(sqrt2, h)), name="sqrt2"),
         helper.make_node("Div", ["h", "sqrt2"], ["hd"], name="hd"),
         helper.make_node("Erf", ["hd"], ["he"], name="he"),
         helper.make_node("Add", ["he", "one"], ["hp"], name="hp"),
         helper.make_node("Mul", ["h", "hp"], ["hm"], name="hm"),
         helper.make_node("Mul", ["hm", "half"], ["g"], name="g"),
         helper.make_node("MatMul", ["g", "w2"], ["y"], name="f")],
        "ffn16", [vi("x", et, [1, 8, 16])], [vi("y", et, [1, 8, 16])],
        [c((rng.standard_normal((16, 64)) * 0.3).astype(h), "w1"),
         c((rng.standard_normal((64, 16)) * 0.3).astype(h), "w2"),
         c(np.array(1.0, h), "one"), c(np.array(0.5, h), "half")])


def adaln_block(split: bool = False, d: int = 32, unsqueezed: bool = False) -> onnx.GraphProto:
    """DiT-style AdaLN-Zero: Gemm(SiLU(t)) chunked in 6 (Slices with bounds computed from constants,
    as TorchScript writes ``chunk``; ``split``: one Split, as dynamo writes it), two modulated
    LayerNorms, each ``norm(x) * (1 + scale) + shift``, gated residual branches.  ``unsqueezed``:
    the Gemm's output is unsqueezed to [1, 1, 6d] before the chunks (PRX), not each chunk after."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Sigmoid", ["t"], ["ts"]), helper.make_node("Mul", ["t", "ts"], ["silu"]),
             helper.make_node("Gemm", ["silu", "w_ada", "b_ada"], ["emb"], transB=1)]
    inits = [c((rng.standard_normal((6 * d, d)) * 0.2).astype(np.float32), "w_ada"),
             c((rng.standard_normal(6 * d) * 0.2).astype(np.float32), "b_ada"),
             c(np.ones(d, np.float32), "ln_s"), c(np.zeros(d, np.float32), "ln_b"),
             c(np.array(1.0, np.float32), "one"), c(np.array([1], np.int64), "ax1"),
             c(np.array([-1], np.int64), "axm1"), c(np.array([d], np.int64), "size")]
    chunks = [f"chunk{i}" for i in range(6)]
    if unsqueezed:
        nodes[-1].output[0] = "emb2"
        nodes.append(helper.make_node("Unsqueeze", ["emb2", "ax1"], ["emb"]))
    if split:
        nodes.append(helper.make_node("Split", ["emb"], chunks, axis=-1, num_outputs=6))
    else:
        for i in range(6):
            inits.append(c(np.array([i], np.int64), f"k{i}"))
            nodes += [helper.make_node("Mul", ["size", f"k{i}"], [f"lo{i}"]),
                      helper.make_node("Add", [f"lo{i}", "size"], [f"hi{i}"]),
                      helper.make_node("Slice", ["emb", f"lo{i}", f"hi{i}", "axm1"], [chunks[i]])]
    x = "x"
    for j, (shift, scale, gate) in enumerate([chunks[0:3], chunks[3:6]]):
        inits.append(c((rng.standard_normal((d, d)) * 0.2).astype(np.float32), f"w{j}"))
        nodes += [helper.make_node("LayerNormalization", [x, "ln_s", "ln_b"], [f"n{j}"], axis=-1, epsilon=1e-6),
                  _unsqueeze(unsqueezed, scale, f"sc{j}"),
                  helper.make_node("Add", [f"sc{j}", "one"], [f"sc1{j}"]),
                  helper.make_node("Mul", [f"n{j}", f"sc1{j}"], [f"m{j}"]),
                  _unsqueeze(unsqueezed, shift, f"sh{j}"),
                  helper.make_node("Add", [f"m{j}", f"sh{j}"], [f"mod{j}"]),
                  helper.make_node("MatMul", [f"mod{j}", f"w{j}"], [f"f{j}"]),
                  _unsqueeze(unsqueezed, gate, f"g{j}"),
                  helper.make_node("Mul", [f"g{j}", f"f{j}"], [f"gf{j}"]),
                  helper.make_node("Add", [x, f"gf{j}"], [f"x{j}"])]
        x = f"x{j}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    return helper.make_graph(nodes, "adaln", [vi("x", F, [1, 16, d]), vi("t", F, [1, d])],
                             [vi("y", F, [1, 16, d])], inits)


def _unsqueeze(done: bool, x: str, y: str) -> onnx.NodeProto:
    """``y = x.unsqueeze(1)``, or ``y = x`` where the chunk already has the axis."""
    return helper.make_node("Identity", [x], [y]) if done else helper.make_node("Unsqueeze", [x, "ax1"], [y])


def sdpa_bool_mask(fill: float = -math.inf, dtype: int = F, mask_rows: int = 8) -> onnx.GraphProto:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask)`` as the exporters write it:
    Where(mask, 0, fill) added to the scores, Softmax, then Where(IsNaN(p), 0, p).
    ``fill``: -inf (TorchScript) or float32's lowest (dynamo); ``mask_rows`` 1: a key-padding mask
    [1, 1, 1, K] (Lumina2's caption mask)."""
    np_t = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    return helper.make_graph(
        [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="kt"),
         helper.make_node("MatMul", ["q", "kt"], ["s0"], name="qk"),
         helper.make_node("Mul", ["s0", "scale"], ["s"], name="scale"),
         helper.make_node("Where", ["mask", "zero", "fill"], ["madd"], name="Where"),
         helper.make_node("Add", ["s", "madd"], ["x"], name="Add"),
         helper.make_node("Softmax", ["x"], ["p"], axis=-1, name="Softmax"),
         helper.make_node("IsNaN", ["p"], ["nan"], name="IsNaN"),
         helper.make_node("Where", ["nan", "zero", "p"], ["pg"], name="Where_1"),
         helper.make_node("MatMul", ["pg", "v"], ["y"], name="pv")],
        "sdpa", [vi("q", dtype, [1, 2, 8, 16]), vi("k", dtype, [1, 2, 8, 16]), vi("v", dtype, [1, 2, 8, 16]),
                 vi("mask", B, [1, 1, mask_rows, 8])], [vi("y", dtype, [1, 2, 8, 16])],
        [c(np.array(0.25, np_t), "scale"), c(np.array(0.0, np_t), "zero"), c(np.array(fill, np_t), "fill")])


def rms_residual(d: int = 32) -> onnx.GraphProto:
    """``h + RMSNorm(x) * w`` as the TorchScript exporter writes diffusers' RMSNorm (Lumina2's context
    refiner: ``x + norm2(attn(x))``, no modulation), then a Linear."""
    rng = np.random.default_rng(9)
    mk = helper.make_node
    return helper.make_graph(
        [mk("MatMul", ["x", "w0"], ["a"], name="attn_out"),
         mk("Pow", ["a", "two"], ["a2"], name="norm2/Pow"),
         mk("ReduceMean", ["a2"], ["ms"], axes=[-1], keepdims=1, name="norm2/ReduceMean"),
         mk("Add", ["ms", "eps"], ["mse"], name="norm2/Add"),
         mk("Sqrt", ["mse"], ["rms"], name="norm2/Sqrt"),
         mk("Div", ["one", "rms"], ["inv"], name="norm2/Div"),
         mk("Mul", ["a", "inv"], ["n"], name="norm2/Mul"),
         mk("Mul", ["n", "w"], ["nw"], name="norm2/Mul_1"),
         mk("Add", ["x", "nw"], ["r"], name="Add"),
         mk("MatMul", ["r", "w1"], ["y"], name="ffn")],
        "rms_residual", [vi("x", F, [1, 6, d])], [vi("y", F, [1, 6, d])],
        [c((rng.standard_normal((d, d)) * 0.2).astype(np.float32), "w0"),
         c((rng.standard_normal((d, d)) * 0.2).astype(np.float32), "w1"),
         c((1 + rng.standard_normal(d) * 0.1).astype(np.float32), "w"),
         c(np.array(2.0, np.float32), "two"), c(np.array(1e-6, np.float32), "eps"),
         c(np.array(1.0, np.float32), "one")])


def _sdpa_feeds(dtype: type = np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    feeds: dict[str, np.ndarray] = {n: rng.standard_normal((1, 2, 8, 16)).astype(dtype) for n in "qkv"}
    mask = rng.random((1, 1, 8, 8)) > 0.5
    mask[0, 0, 3] = False  # a row that sees no key: NaN out of Softmax, 0 after the guard
    mask[0, 0, 5] = True
    feeds["mask"] = mask
    return feeds


# -- under ONNX Runtime -----------------------------------------------------------------------

def test_gelu_f16_sqrt2_is_bit_exact() -> None:
    m = _model(ffn_f16())
    r, done = _rewritten(m, "2.5.0")
    assert done == {"gelu-f16-sqrt2": 1}
    cast = next(n for n in r.graph.node if n.op_type == "Cast")
    f32 = next(t for t in r.graph.initializer if t.name == cast.input[0])
    assert numpy_helper.to_array(f32) == np.float32(math.sqrt(2))  # what the toolkit's GELU fusion matches
    x = np.random.default_rng(2).standard_normal((1, 8, 16)).astype(np.float16) * 3
    _bits_equal(m, r, {"x": x})


def test_gelu_f16_sqrt2_leaves_other_divisors_and_float32() -> None:
    assert _rewritten(_model(ffn_f16(sqrt2=1.5)))[1] == {}
    assert _rewritten(_model(ffn_f16(h=np.float32)))[1] == {}  # float32 sqrt 2: the toolkits fuse it as it is


@pytest.mark.parametrize("unsqueezed", [False, True], ids=["", "unsqueezed"])
@pytest.mark.parametrize("split", [False, True], ids=["slices", "split"])
def test_adaln_chunk_gemm_is_bit_exact(split: bool, unsqueezed: bool) -> None:
    m = _model(adaln_block(split, unsqueezed=unsqueezed), opset=18)
    r, done = _rewritten(m, "2.3.0")
    assert done == {"adaln-chunk-gemm": 1}
    ops = [n.op_type for n in r.graph.node]
    assert ops.count("Gemm") == 6 and "Slice" not in ops and "Split" not in ops
    assert ops.count("Reshape") == (6 if unsqueezed else 0)  # each chunk gets the unit axis back
    assert {"w_ada", "b_ada"}.isdisjoint(t.name for t in r.graph.initializer)  # the whole weight is gone
    rng = np.random.default_rng(3)
    _bits_equal(m, r, {"x": rng.standard_normal((1, 16, 32)).astype(np.float32),
                       "t": rng.standard_normal((1, 32)).astype(np.float32)})
    assert "adaln-chunk-gemm" not in _rewritten(m, "2.5.0")[1]  # 2.5.0 keeps these on the NPU as they are


def test_adaln_chunk_gemm_needs_every_reader_to_be_a_chunk() -> None:
    g = adaln_block()
    g.node.append(helper.make_node("ReduceSum", ["emb"], ["esum"], keepdims=1))
    g.output.append(vi("esum", F, [1, 1]))
    assert _rewritten(_model(g))[1] == {}


@pytest.mark.parametrize("toolkit", ["2.3.0", "2.5.0"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_nan_guard_is_bit_exact_with_a_fully_masked_row(exporter: str, toolkit: str) -> None:
    fill = -math.inf if exporter == "torchscript" else float(np.finfo(np.float32).min)
    m = _model(sdpa_bool_mask(fill))
    r, done = _rewritten(m, toolkit)
    assert done == {"nan-guard": 1}
    assert "IsNaN" not in {n.op_type for n in r.graph.node}
    feeds = _sdpa_feeds()
    (ref,) = _run(m, feeds)
    if exporter == "torchscript":
        assert (ref[0, :, 3] == 0).all()  # the guard's job
    _bits_equal(m, r, feeds)


def test_nan_guard_key_padding_mask_bit_exact() -> None:
    """Lumina2's caption mask [1, 1, 1, K]: every query row sees the same keys; with none, all rows are 0.
    The fill is broadcast to the mask's shape before its Where (2.5.0 segfaults otherwise)."""
    m = _model(sdpa_bool_mask(mask_rows=1))
    r, done = _rewritten(m, "2.5.0")
    assert done == {"nan-guard": 1}
    where = next(n for n in r.graph.node if n.name.endswith("/mask"))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in onnx.shape_inference.infer_shapes(r).graph.value_info}
    assert shapes[where.input[2]] == [1, 1, 1, 8]  # the computed branch has the mask's shape
    rng = np.random.default_rng(8)
    feeds: dict[str, np.ndarray] = {n: rng.standard_normal((1, 2, 8, 16)).astype(np.float32) for n in "qkv"}
    for mask in (rng.random((1, 1, 1, 8)) > 0.5, np.zeros((1, 1, 1, 8), bool)):
        feeds["mask"] = mask
        if not mask.any():
            assert (_run(m, feeds)[0] == 0).all()
        _bits_equal(m, r, feeds)


def test_norm_residual_sub_is_bit_exact() -> None:
    m = _model(rms_residual(), opset=13)
    r, done = _rewritten(m, "2.3.0")
    assert done == {"norm-residual-sub": 1}
    assert [n.op_type for n in r.graph.node].count("Sub") == 1
    assert _rewritten(m, "2.5.0")[1] == {}  # 2.5.0 keeps that exNorm on the NPU
    _bits_equal(m, r, {"x": np.random.default_rng(10).standard_normal((1, 6, 32)).astype(np.float32)})


def test_norm_residual_sub_leaves_a_rope_table_alone() -> None:
    """RoPE's q_normed * cos + ...: the constant is a [S, D] table, not a norm's 1-D weight."""
    g = rms_residual()
    for t in g.initializer:
        if t.name == "w":
            t.CopyFrom(c(np.ones((6, 32), np.float32), "w"))
    assert _rewritten(_model(g, opset=13))[1] == {}


def test_nan_guard_float16_with_finite_fill_is_kept() -> None:
    """float16 s - 65504 overflows to -inf once s < -16: the guard may fire there, so it stays."""
    m = _model(sdpa_bool_mask(-65504.0, TensorProto.FLOAT16))
    assert _rewritten(m, "2.5.0")[1] == {}


# -- real builds --------------------------------------------------------------------------------

def _cpu_layers(tmp_path: Path, graph: onnx.GraphProto, version: str, opset: int, rewrites: bool
                ) -> tuple[tuple[str, ...], dict[str, int]]:
    folder = tmp_path / ("rw" if rewrites else "plain")
    types = {F: "float32", H: "float16", B: "bool"}
    tensors = {v.name: TensorInfo(v.name, types[v.type.tensor_type.elem_type],
                                  tuple(d.dim_value for d in v.type.tensor_type.shape.dim))
               for v in (*graph.input, *graph.output)}
    stage = _stage(folder, "s", "npu", graph, 0, opset)
    plan = Plan(model={"file": "m.onnx", "sha256": "0" * 64, "opset": opset}, strategy={"name": "test", "options": {}},
                inputs=tuple(i.name for i in graph.input), outputs=tuple(o.name for o in graph.output),
                tensors=tensors, stages=(stage,))
    plan.save(folder)
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit(version), "rk3588", {}, rewrites=rewrites,
                                                           cache=False))
    assert not rep.failed, [f.message for o in rep.failed for f in o.failures]
    prepared = rep.plan.stage("s").prepared
    return rep.outcomes[0].cpu_ops, dict(prepared["rewrites"]) if prepared else {}


CASES = [
    pytest.param("gelu-f16-sqrt2", ffn_f16, 17, "Erf:he", v, id=f"gelu-f16-sqrt2-{v}") for v in ("2.5.0", "2.3.0")
] + [
    pytest.param("adaln-chunk-gemm", adaln_block, 17, "Transpose:", "2.3.0", id="adaln-chunk-gemm-2.3.0"),
    pytest.param("adaln-chunk-gemm", lambda: adaln_block(unsqueezed=True), 17, "Transpose:", "2.3.0",
                 id="adaln-chunk-gemm-unsqueezed-2.3.0"),
] + [
    pytest.param("nan-guard", sdpa_bool_mask, 17, "IsNaN:IsNaN", v, id=f"nan-guard-{v}") for v in ("2.3.0", "2.5.0")
] + [
    pytest.param("norm-residual-sub", rms_residual, 17, "exNorm:", "2.3.0", id="norm-residual-sub-2.3.0"),
]


@pytest.mark.toolkit
@pytest.mark.slow
@pytest.mark.parametrize(("name", "make", "opset", "cpu_before", "version"), CASES)
def test_rewrite_takes_the_layer_off_the_cpu(tmp_path: Path, name: str, make: object, opset: int, cpu_before: str,
                                             version: str) -> None:
    graph = make()  # type: ignore[operator]
    before, _ = _cpu_layers(tmp_path, graph, version, opset, rewrites=False)
    assert len(before) == 1 and before[0].startswith(cpu_before), before
    after, applied = _cpu_layers(tmp_path, graph, version, opset, rewrites=True)
    assert after == () and applied.get(name) == 1


def test_scatternd_interleave_writes_an_intermediate_the_stage_outputs() -> None:
    """A fused Wan stage outputs the half-filled RoPE tensor (out[..., 0::2] = a on constant data)
    for the next block: it is written as an interleave with the data's constant values, so no
    ScatterND is left (measured: 2 per block left on the CPU before, 2.3.0 and 2.5.0)."""
    shape, half = [1, 4, 2, 16], [1, 4, 2, 8]
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in half], indexing="ij"), axis=-1)
    i0, i1 = grid.copy(), grid.copy()
    i0[..., 3] *= 2
    i1[..., 3] = i1[..., 3] * 2 + 1
    data = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("ScatterND", ["d", "i0", "a"], ["s0"]),
         helper.make_node("ScatterND", ["s0", "i1", "b"], ["s1"]), helper.make_node("Relu", ["s1"], ["y"])],
        "rope", [vi("a", F, half), vi("b", F, half)], [vi("y", F, shape), vi("s0", F, shape)],
        [c(data, "d"), c(i0.astype(np.int64), "i0"), c(i1.astype(np.int64), "i1")])
    m = _model(g)
    r, done = _rewritten(m, "2.5.0")
    assert done == {"scatternd-interleave": 1}
    assert "ScatterND" not in {n.op_type for n in r.graph.node}
    rng = np.random.default_rng(7)
    _bits_equal(m, r, {k: rng.standard_normal(half).astype(np.float32) for k in "ab"})
