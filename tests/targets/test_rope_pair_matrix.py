"""``rope-pair-matrix``: RoPE applied as a 2x2 matrix per pair of values becomes the Slice/Concat form.

Kandinsky 5 writes ``(rope * x.view(*x.shape[:-1], -1, 1, 2)).sum(-1)``: a 6-D broadcasting Mul and
a ReduceSum, which 2.5.0 fails to fold and 2.3.0 builds with CPU layers (the measured row of the
table).  The rewrite computes the same two products and one sum per value, so ONNX Runtime gives
the same bits; real builds of the hand-made graph are the toolkit test below.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.rewrites import REWRITES, apply_rewrites, compile_rewrites_for
from tests.targets.rewrite_check import rewritten, run_unoptimised

ROW = tuple(r for r in REWRITES if r.name == "rope-pair-matrix")
vi = helper.make_tensor_value_info


def _rope(*, opset: int = 17, elem: int = TensorProto.FLOAT, keepdims: int = 0, axis: int = -1,
          c_tail: tuple[int, int] = (2, 2), x_tail: tuple[int, int] = (1, 2), seq: int = 6,
          computed: bool = False) -> onnx.ModelProto:
    """q [1, seq, 2 heads, 16] -> pairs [1, seq, 2, 8, *x_tail] -> rope [1, seq, 1, 8, *c_tail] * pairs
    -> ReduceSum(axis) -> [1, seq, 2, 16].

    ``computed``: the matrices are computed in the graph from an input of angles ``ang [seq, 8]``, as
    Kandinsky 6's dynamo export does: ``stack([cos, -sin, sin, cos], -1).view(seq, 8, 2, 2)``, unsqueezed
    to ``[seq, 1, 8, 2, 2]`` (one rank fewer than the pairs: a broadcast over the batch)."""
    if computed:
        return _computed_rope(opset=opset, elem=elem, seq=seq)
    dt = helper.tensor_dtype_to_np_dtype(elem)
    ang = np.random.default_rng(7).uniform(-3, 3, (1, seq, 1, 8))
    cos, sin = np.cos(ang), np.sin(ang)
    rope = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)  # [1, seq, 1, 8, 2, 2]
    if c_tail != (2, 2):
        rope = rope[..., : c_tail[0], : c_tail[1]]
    pairs = [1, seq, 2, 8 * 2 // x_tail[1], *x_tail]
    inits = [numpy_helper.from_array(rope.astype(dt), "rope"),
             numpy_helper.from_array(np.array(pairs, np.int64), "pairs_shape"),
             numpy_helper.from_array(np.array([1, seq, 2, -1], np.int64), "back")]
    sum_in = ["prod"]
    kw: dict[str, object] = {"keepdims": keepdims}
    if opset >= 13:
        inits.append(numpy_helper.from_array(np.array([axis], np.int64), "axes"))
        sum_in.append("axes")
    else:
        kw["axes"] = [axis]
    nodes = [helper.make_node("Reshape", ["q", "pairs_shape"], ["pairs"]),
             helper.make_node("Mul", ["rope", "pairs"], ["prod"], name="rope/Mul"),
             helper.make_node("ReduceSum", sum_in, ["rot"], name="rope/ReduceSum", **kw),
             helper.make_node("Reshape", ["rot", "back"], ["y"])]
    g = helper.make_graph(nodes, "g", [vi("q", elem, [1, seq, 2, 16])], [vi("y", elem, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(m)


def _computed_rope(*, opset: int, elem: int, seq: int) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array([1, seq, 2, 8, 1, 2], np.int64), "pairs_shape"),
             numpy_helper.from_array(np.array([seq, 8, 2, 2], np.int64), "mat_shape"),
             numpy_helper.from_array(np.array([1, seq, 2, -1], np.int64), "back")]
    if opset >= 13:
        inits += [numpy_helper.from_array(np.array([ax], np.int64), f"{t}_axes") for t, ax in (("u", 2), ("m", 1))]
    nodes = [helper.make_node("Cos", ["ang"], ["cos"]), helper.make_node("Sin", ["ang"], ["sin"]),
             helper.make_node("Neg", ["sin"], ["nsin"])]
    for t in ("cos", "nsin", "sin"):
        ins, kw = ([t, "u_axes"], {}) if opset >= 13 else ([t], {"axes": [2]})
        nodes.append(helper.make_node("Unsqueeze", ins, [f"{t}3"], **kw))
    ins, kw = (["mat4", "m_axes"], {}) if opset >= 13 else (["mat4"], {"axes": [1]})
    sum_in, skw = (["prod", "s_axes"], {}) if opset >= 13 else (["prod"], {"axes": [-1]})
    if opset >= 13:
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "s_axes"))
    nodes += [helper.make_node("Concat", ["cos3", "nsin3", "sin3", "cos3"], ["stack"], axis=2),
              helper.make_node("Reshape", ["stack", "mat_shape"], ["mat4"]),
              helper.make_node("Unsqueeze", ins, ["rope"], **kw),
              helper.make_node("Reshape", ["q", "pairs_shape"], ["pairs"]),
              helper.make_node("Mul", ["rope", "pairs"], ["prod"], name="rope/Mul"),
              helper.make_node("ReduceSum", sum_in, ["rot"], name="rope/ReduceSum", keepdims=0, **skw),
              helper.make_node("Reshape", ["rot", "back"], ["y"])]
    g = helper.make_graph(nodes, "g", [vi("q", elem, [1, seq, 2, 16]), vi("ang", elem, [seq, 8])],
                          [vi("y", elem, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(m)


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
@pytest.mark.parametrize("axis", [-1, 5])
def test_pair_matrix_is_the_slice_concat_form_bit_for_bit(opset: int, elem: int, axis: int) -> None:
    m = _rope(opset=opset, elem=elem, axis=axis)
    r, done = rewritten(m, ROW)
    assert done == {"rope-pair-matrix": 1}
    ops = [n.op_type for n in r.graph.node]
    assert "ReduceSum" not in ops and ops.count("Mul") == 2 and ops.count("Slice") == 2 and "Concat" in ops
    assert "rope" not in {t.name for t in r.graph.initializer}  # the 6-D table went with its Mul
    onnx.checker.check_model(r)
    q = np.random.default_rng(2).standard_normal((1, 6, 2, 16)).astype(helper.tensor_dtype_to_np_dtype(elem))
    q.flat[:4] = [np.inf, -np.inf, np.nan, -0.0]
    want, got = run_unoptimised(m, {"q": q})[0], run_unoptimised(r, {"q": q})[0]
    assert got.shape == want.shape == (1, 6, 2, 16)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
def test_computed_pair_matrix_is_read_out_in_the_graph_bit_for_bit(opset: int, elem: int) -> None:
    """The matrices computed in the stage (Kandinsky 6 dynamo): diagonals and other entries are sliced
    out of them in the graph; the 6-D product and the sum go, the results are the same bits."""
    m = _rope(opset=opset, elem=elem, computed=True)
    r, done = rewritten(m, ROW)
    assert done == {"rope-pair-matrix": 1}
    ops = [n.op_type for n in r.graph.node]
    assert "ReduceSum" not in ops and ops.count("Mul") == 2 and ops.count("Slice") == 5
    assert {"Cos", "Sin", "Neg"} <= set(ops)  # the matrices are still computed, from the angles
    onnx.checker.check_model(r)
    dt = helper.tensor_dtype_to_np_dtype(elem)
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 6, 2, 16)).astype(dt)
    q.flat[:4] = [np.inf, -np.inf, np.nan, -0.0]
    feeds = {"q": q, "ang": rng.uniform(-3, 3, (6, 8)).astype(dt)}
    want, got = run_unoptimised(m, feeds)[0], run_unoptimised(r, feeds)[0]
    assert got.shape == want.shape == (1, 6, 2, 16)
    np.testing.assert_array_equal(got, want)


def test_the_product_stays_when_something_else_reads_it() -> None:
    m = _rope()
    m.graph.output.append(vi("prod", TensorProto.FLOAT, None))
    r, done = rewritten(m, ROW)
    assert done == {"rope-pair-matrix": 1}
    assert next(n.name for n in r.graph.node if n.op_type == "Mul") == "rope/Mul"
    q = np.random.default_rng(3).standard_normal((1, 6, 2, 16)).astype(np.float32)
    np.testing.assert_array_equal(run_unoptimised(r, {"q": q})[0], run_unoptimised(m, {"q": q})[0])


@pytest.mark.parametrize("case", ["keepdims", "other-axis", "not-2x2", "not-pairs", "computed-keepdims"])
def test_left_alone(case: str) -> None:
    """keepdims=1, a sum over another axis, a [.., 2, 1] matrix, values not laid out as [.., 1, 2] (the
    constant is the matrices or nothing matches), computed matrices summed with keepdims=1."""
    def computed_keepdims() -> onnx.ModelProto:
        m = _rope(computed=True)
        next(n for n in m.graph.node if n.op_type == "ReduceSum").attribute[0].i = 1
        return m

    m = {"keepdims": lambda: _rope(keepdims=1),
         "other-axis": lambda: _rope(axis=-2),
         "not-2x2": lambda: _rope(c_tail=(2, 1)),
         "not-pairs": lambda: _rope(x_tail=(2, 2), c_tail=(1, 2)),
         "computed-keepdims": computed_keepdims}[case]()
    r, done = rewritten(m, ROW)
    assert done == {}
    assert list(r.graph.node) == list(m.graph.node)


@pytest.mark.toolkit
@pytest.mark.parametrize(("version", "computed"), [("2.3.0", False), ("2.5.0", False), ("2.5.0", True)])
def test_real_build_of_the_pair_matrix(version: str, computed: bool, tmp_path: Path) -> None:
    """Real builds of the hand-made RoPE after a Linear: the rewritten graph builds with 0 CPU layers;
    as exported it fails or leaves layers on the CPU (matrices computed in the graph from constants,
    as Kandinsky 6's dynamo attention stages do: 2.5.0 fails as for a constant table, in its own
    constant folding; the whole stage failed in its reshape fusion, "Can not reshape")."""
    from rkpart.compile.compiler_plan import parse_layer_rows
    from rkpart.triage.matrix import build_once
    from tests.toolkits import get_toolkit

    m = _rope(computed=computed)
    if computed:  # Kandinsky 6's stage computes its matrices from constants the exporter did not fold
        ang = next(i for i in m.graph.input if i.name == "ang")
        m.graph.input.remove(ang)
        m.graph.initializer.append(numpy_helper.from_array(
            np.random.default_rng(6).uniform(-3, 3, (6, 8)).astype(np.float32), "ang"))
    # a Linear in front, as in the attention: q = x @ W
    m.graph.input[0].name = "x"
    m.graph.initializer.append(numpy_helper.from_array(
        np.random.default_rng(5).standard_normal((1, 6, 2, 16, 16)).astype(np.float32)[0, 0, 0] * 0.1, "W"))
    m.graph.node.insert(0, helper.make_node("MatMul", ["x", "W"], ["q"]))
    tk = get_toolkit(version)
    after = onnx.ModelProto()
    after.CopyFrom(m)
    assert "rope-pair-matrix" in apply_rewrites(after, compile_rewrites_for(version))
    out = {}
    for what, model in (("before", m), ("after", after)):
        path = tmp_path / f"{what}.onnx"
        onnx.save(model, str(path))
        log = tmp_path / f"{what}.log"
        ok = build_once(path, tk, target="rk3588", log=log).ok
        rows = parse_layer_rows(log.read_text(errors="replace")) or []
        out[what] = (ok, [x.op_type for x in rows if x.target.upper() == "CPU"
                          and x.op_type not in ("InputOperator", "OutputOperator")])
    assert out["after"] == (True, [])
    assert out["before"] != (True, [])
