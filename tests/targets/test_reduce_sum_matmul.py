"""``reduce-sum-matmul`` (2.3.0): a sum over the last axis, ``ReduceSum(x, -1)``, becomes
``MatMul(x, ones[D, 1])`` (and a Reshape dropping the axis when keepdims=0).

2.3.0 converts such a ReduceSum to a MatMul itself and, where the summed axis is dropped, runs the
conversion's Reshape on the CPU (``Reshape:<x>_rs_mm_tp_rs``); Sana-WM's linear attention,
``(k * gate).sum(-1)``, kept one per linear-attention stage that no ``--repartition`` round could
move.  The toolkit test builds a hand-made stage of that shape (rank-4 boundaries, a rank-5 inside,
the product read by the sum and a MatMul) with and without the rewrite.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.rewrites import REWRITES, rewrites_for
from tests import sampling
from tests.targets.rewrite_check import cpu_layers_before_after, rewritten, run_unoptimised

ROW = tuple(r for r in REWRITES if r.name == "reduce-sum-matmul")
vi = helper.make_tensor_value_info


def _sum(shape: list[int], axes: list[int] | None, keepdims: int, elem: int = TensorProto.FLOAT, *,
         opset: int = 17, dynamic: bool = False, noop: int = 0) -> onnx.ModelProto:
    """x -> Relu -> ReduceSum(axes, keepdims) -> y (axes an input from opset 13, an attribute before)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"])]
    inits = []
    attrs: dict[str, object] = {"keepdims": keepdims}
    if noop:
        attrs["noop_with_empty_axes"] = noop
    if axes is None:
        nodes.append(helper.make_node("ReduceSum", ["r"], ["y"], name="sum", **attrs))
    elif opset >= 13:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        nodes.append(helper.make_node("ReduceSum", ["r", "axes"], ["y"], name="sum", **attrs))
    else:
        nodes.append(helper.make_node("ReduceSum", ["r"], ["y"], name="sum", axes=axes, **attrs))
    dims: list[int | str] = [f"d{i}" for i in range(len(shape))] if dynamic else list(shape)
    summed = (set() if noop else set(range(len(shape)))) if axes is None else {a % len(shape) for a in axes}
    out = [1 if i in summed else d for i, d in enumerate(dims)] if keepdims else [
        d for i, d in enumerate(dims) if i not in summed]
    g = helper.make_graph(nodes, "g", [vi("x", elem, dims)], [vi("y", elem, out)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(("shape", "axis"), [
    ([4, 16], -1), ([1, 4, 16, 16], 3), ([1, 2, 2, 16, 16], -1), ([1, 2, 2, 2, 8, 16], 5), ([3, 1, 2048], -1)])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize(("elem", "opset"), [(TensorProto.FLOAT, 17), (TensorProto.FLOAT16, 17),
                                             (TensorProto.FLOAT, 11)], ids=["f32", "f16", "f32-opset11"])
def test_last_axis_sum_is_a_matmul_with_ones(shape: list[int], axis: int, keepdims: int, elem: int,
                                             opset: int) -> None:
    m = _sum(shape, [axis], keepdims, elem, opset=opset)
    r, done = rewritten(m, ROW)
    assert done == {"reduce-sum-matmul": 1}
    assert [n.op_type for n in r.graph.node] == ["Relu", "MatMul"] + ([] if keepdims else ["Reshape"])
    (ones,) = [t for t in r.graph.initializer if t.name == r.graph.node[1].input[1]]
    assert list(ones.dims) == [shape[-1], 1] and ones.data_type == elem
    assert r.graph.node[-1].output[0] == "y"
    onnx.checker.check_model(r)
    np_t = helper.tensor_dtype_to_np_dtype(elem)
    x = np.random.default_rng(7).standard_normal(shape).astype(np_t)
    want, got = run_unoptimised(m, {"x": x})[0], run_unoptimised(r, {"x": x})[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    # the same sums in the MatMul's order: float32 to a few ulps of the largest sum
    tol = 1e-6 if elem == TensorProto.FLOAT else 2e-3
    assert np.max(np.abs(got.astype(np.float64) - want)) <= tol * max(1.0, float(np.max(np.abs(want))))


@pytest.mark.parametrize("case", ["other-axis", "two-axes", "all-axes", "int64", "dynamic", "computed-axes",
                                  "noop-empty"])
def test_left_alone(case: str) -> None:
    """A sum over another axis or several, over all axes (no axes given), of integers, of a
    tensor without a static shape, over axes computed at run time, or a no-op: no match."""
    m = {"other-axis": lambda: _sum([1, 4, 16, 8], [2], 0),
         "two-axes": lambda: _sum([1, 4, 16, 8], [2, 3], 0),
         "all-axes": lambda: _sum([1, 4, 16, 8], None, 0),
         "int64": lambda: _sum([1, 4, 16, 8], [-1], 0, TensorProto.INT64),
         "dynamic": lambda: _sum([1, 4, 16, 8], [-1], 0, dynamic=True),
         "computed-axes": lambda: _sum([1, 4, 16, 8], [-1], 0),
         "noop-empty": lambda: _sum([1, 4, 16, 8], None, 1, noop=1)}[case]()
    if case == "computed-axes":
        (axes,) = list(m.graph.initializer)
        m.graph.initializer.remove(axes)
        m.graph.input.append(vi("axes", TensorProto.INT64, [1]))
    r, done = rewritten(m, ROW)
    assert done == {}
    assert list(r.graph.node) == list(m.graph.node)


def test_only_for_230() -> None:
    assert "reduce-sum-matmul" in [r.name for r in rewrites_for("2.3.0", "npu")]
    for v in ("2.3.2", "2.5.0"):
        assert "reduce-sum-matmul" not in [r.name for r in rewrites_for(v, "npu")]
    names = [r.name for r in REWRITES]
    assert names.index("rope-pair-matrix") < names.index("reduce-sum-matmul")  # Kandinsky 5's RoPE sums first


def test_rope_pair_matrix_keeps_its_sums() -> None:
    """Kandinsky 5's RoPE, ``ReduceSum(Mul(C, pairs), -1)``: rope-pair-matrix rewrites it whole,
    so no MatMul with ones is left of it on 2.3.0."""
    c = np.random.default_rng(1).standard_normal((1, 6, 1, 8, 2, 2)).astype(np.float32)
    nodes = [helper.make_node("Mul", ["rope", "x"], ["p"]),
             helper.make_node("ReduceSum", ["p", "axes"], ["y"], keepdims=0, name="rot")]
    g = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [1, 6, 2, 8, 1, 2])],
                          [vi("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(c, "rope"),
                           numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    r, done = rewritten(m, tuple(rewrites_for("2.3.0", "npu")))
    assert done.get("rope-pair-matrix") == 1 and "reduce-sum-matmul" not in done
    assert "MatMul" not in {n.op_type for n in r.graph.node}


def _linear_attention_sum(keepdims: int) -> onnx.ModelProto:
    """Sana-WM's shape of it: rank-4 stage inputs viewed as rank 5, the product of k and a gate read
    by a MatMul and by the sum over its last axis, the sum handed back as rank 4 (axis dropped)."""
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (
        ("k5", [1, 2, 2, 16, 16]), ("g5", [1, 2, 2, 1, 16]), ("axes", [-1]), ("s4", [1, 2, 2, 16]),
        ("m4", [1, 4, 16, 16]))]
    inits += [numpy_helper.from_array(rng.standard_normal((1, 2, 2, 16, 16)).astype(np.float32), "v")]
    nodes = [helper.make_node("Reshape", ["k", "k5"], ["k_5"]),
             helper.make_node("Reshape", ["g", "g5"], ["g_5"]),
             helper.make_node("Sigmoid", ["g_5"], ["gs"]),
             helper.make_node("Mul", ["k_5", "gs"], ["p"]),
             helper.make_node("MatMul", ["p", "v"], ["kv"]),
             helper.make_node("Reshape", ["kv", "m4"], ["kv4"]),
             helper.make_node("ReduceSum", ["p", "axes"], ["s"], keepdims=keepdims, name="ksum")]
    if keepdims:
        nodes.append(helper.make_node("Reshape", ["s", "s4"], ["s4_out"]))
    else:
        nodes.append(helper.make_node("Identity", ["s"], ["s4_out"]))
    g = helper.make_graph(nodes, "la", [vi("k", f, [1, 4, 16, 16]), vi("g", f, [1, 4, 1, 16])],
                          [vi("kv4", f, [1, 4, 16, 16]), vi("s4_out", f, [1, 2, 2, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.toolkit
@pytest.mark.parametrize("keepdims", [0, 1])
def test_230_runs_the_sum_on_the_npu_once_rewritten(keepdims: int, tmp_path: Path) -> None:
    """2.3.0 puts the Reshape of its own conversion of the sum on the CPU; rewritten, no CPU layer;
    the rewritten stage equals the original under ONNX Runtime."""
    from tests.toolkits import get_toolkit

    tk = get_toolkit("2.3.0")
    m = _linear_attention_sum(keepdims)
    r, done = rewritten(m, ROW)
    assert done == {"reduce-sum-matmul": 1}
    rng = np.random.default_rng(3)
    feeds = {"k": rng.standard_normal((1, 4, 16, 16)).astype(np.float32),
             "g": rng.standard_normal((1, 4, 1, 16)).astype(np.float32)}
    for a, b in zip(run_unoptimised(m, feeds), run_unoptimised(r, feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    cpu = cpu_layers_before_after(m, r, tk, tmp_path)
    assert cpu["after"] == ()
    assert [c for c in cpu["before"] if c.startswith("Reshape:") and c.endswith("_mm_tp_rs")], cpu["before"]


#: the exports of the sweep whose NPU stages hold a last-axis ReduceSum (the linear attentions' key sums)
EXPORTS = [("sana_wm", "torchscript"), ("sana_wm", "dynamo"), ("sana_video", "torchscript"), ("sana_video", "dynamo")]
#: Sana-WM's dynamo plan (4 min) holds the key sums its TorchScript plan holds
CASES = [sampling.full_only(f, e, id=f"{f}-{e}", why="sana_wm-torchscript has the same key sums")
         if (f, e) == ("sana_wm", "dynamo") else pytest.param(f, e, id=f"{f}-{e}") for f, e in EXPORTS]


@pytest.mark.export
@pytest.mark.parametrize(("family", "exporter"), CASES)
def test_plan_stages_keep_the_rewrite_under_the_gate(family: str, exporter: str, tmp_path: Path) -> None:
    """The split plan's NPU stages for 2.3.0: the rewrite matches each block's key sum and passes the
    check ``rkpart compile`` makes of it (the stage under ONNX Runtime, seeded inputs, ``exact_gate``)."""
    from rkpart import partition
    from rkpart.compile.prepare import _apply_checked, _finite_reference
    from tests.models.diffusers_families import cached_export

    folder = tmp_path / "plan"
    plan = partition(cached_export(family, exporter), folder, "split", toolkit="2.3.0")
    hits = 0
    for st in plan.npu_stages:
        m = onnx.load(str(folder / st.file))
        if not any(n.op_type == "ReduceSum" for n in m.graph.node):
            continue
        feeds, ref = _finite_reference(m, 0)
        _, kept, dropped = _apply_checked(m, ROW, ref, feeds)
        assert not dropped, (st.id, dropped)
        hits += kept.get("reduce-sum-matmul", 0)
    assert hits >= 2  # one key sum per linear-attention block at least (2 of each tiny model's blocks)
