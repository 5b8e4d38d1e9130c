"""``reciprocal-mul-div``: ``Mul(a, Reciprocal(v))`` and ``Mul(a, Div(1, v))`` become ``Div(a, v)``.

Both toolkits place the ``Div(1, v)`` they make of an inverse on the CPU and run ``Div(a, v)``
on the NPU (the measured row of the table; the real builds are the toolkit test below).  The
quotient is one rounding away from the product, so the check is the prepared-stage bound
(1e-6 x max|ref|), and the rewrite leaves float16 alone, where one rounding exceeds it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.rewrites import REWRITES, apply_rewrites, compile_rewrites_for
from tests.targets.rewrite_check import rewritten, run_unoptimised

ROW = tuple(r for r in REWRITES if r.name == "reciprocal-mul-div")
vi = helper.make_tensor_value_info


def _model(inverse: str, *, order: str = "ai", elem: int = TensorProto.FLOAT, also: bool = False,
           one: np.ndarray | None = None, sqrt: bool = False) -> onnx.ModelProto:
    """a (1,2,16,32) times the inverse of v (1,2,1,32): Sana-Video's linear-attention normaliser.
    ``also``: the inverse is read by a second op too (it must stay for that one)."""
    dt = helper.tensor_dtype_to_np_dtype(elem)
    inits = [numpy_helper.from_array(np.array(1e-3, dt), "eps")]
    nodes = [helper.make_node("Abs", ["v"], ["v0"]),
             helper.make_node("Sqrt" if sqrt else "Add", ["v0"] if sqrt else ["v0", "eps"], ["v1"])]
    if inverse == "Reciprocal":
        nodes.append(helper.make_node("Reciprocal", ["v1"], ["r"], name="recip"))
    else:
        inits.append(numpy_helper.from_array(np.array(1.0, dt) if one is None else one.astype(dt), "one"))
        nodes.append(helper.make_node("Div", ["one", "v1"], ["r"], name="inv"))
    nodes.append(helper.make_node("Mul", ["a", "r"] if order == "ai" else ["r", "a"], ["y"], name="mul"))
    outs = [vi("y", elem, [1, 2, 16, 32])]
    if also:
        nodes.append(helper.make_node("Neg", ["r"], ["z"]))
        outs.append(vi("z", elem, None))
    g = helper.make_graph(nodes, "g", [vi("a", elem, [1, 2, 16, 32]), vi("v", elem, [1, 2, 1, 32])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(elem: int = TensorProto.FLOAT) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    dt = helper.tensor_dtype_to_np_dtype(elem)
    return {"a": (rng.standard_normal((1, 2, 16, 32)) * 5).astype(dt),
            "v": rng.standard_normal((1, 2, 1, 32)).astype(dt)}


@pytest.mark.parametrize("inverse", ["Reciprocal", "Div"])
@pytest.mark.parametrize("order", ["ai", "ia"])
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.DOUBLE], ids=["f32", "f64"])
def test_product_with_an_inverse_becomes_a_quotient(inverse: str, order: str, elem: int) -> None:
    m = _model(inverse, order=order, elem=elem)
    r, done = rewritten(m, ROW)
    assert done == {"reciprocal-mul-div": 1}
    assert [n.op_type for n in r.graph.node] == ["Abs", "Add", "Div"]
    div = r.graph.node[-1]
    assert list(div.input) == ["a", "v1"] and div.name == "mul"
    assert {t.name for t in r.graph.initializer} == {"eps"}  # the 1 no node reads is gone
    onnx.checker.check_model(r, full_check=True)
    feeds = _feeds(elem)
    (want,), (got,) = run_unoptimised(m, feeds), run_unoptimised(r, feeds)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()
    np.testing.assert_array_equal(got, feeds["a"] / (np.abs(feeds["v"]) + feeds["a"].dtype.type(1e-3)))


def test_an_inverse_read_elsewhere_stays_for_that_reader() -> None:
    m = _model("Reciprocal", also=True)
    r, done = rewritten(m, ROW)
    assert done == {"reciprocal-mul-div": 1}
    assert [n.op_type for n in r.graph.node] == ["Abs", "Add", "Reciprocal", "Div", "Neg"]
    feeds = _feeds()
    want, got = run_unoptimised(m, feeds), run_unoptimised(r, feeds)
    np.testing.assert_array_equal(got[1], want[1])
    assert np.abs(got[0] - want[0]).max() <= 1e-6 * np.abs(want[0]).max()


@pytest.mark.parametrize("case", ["float16", "one-is-two", "one-not-scalar", "rms-norm"])
def test_left_alone(case: str) -> None:
    """float16 (one rounding is more than the check allows), a numerator that is not 1, a 1 that
    is not a scalar (it could widen the product's rank), an inverse of a Sqrt (RMSNorm): no match."""
    m = {"float16": lambda: _model("Reciprocal", elem=TensorProto.FLOAT16),
         "one-is-two": lambda: _model("Div", one=np.array(2.0)),
         "one-not-scalar": lambda: _model("Div", one=np.ones((1, 1, 1, 1, 1))),
         "rms-norm": lambda: _model("Reciprocal", sqrt=True)}[case]()
    r, done = rewritten(m, ROW)
    assert done == {}
    assert r.SerializeToString() == m.SerializeToString()


def test_it_runs_before_reciprocal_to_div() -> None:
    """In the table's order: the product is taken first, the lone Reciprocal is then Div(1, v)."""
    m = _model("Reciprocal", also=True)
    done = apply_rewrites(m, compile_rewrites_for("2.5.0"))
    assert done == {"reciprocal-mul-div": 1, "reciprocal-to-div": 1}
    assert [n.op_type for n in m.graph.node] == ["Abs", "Add", "Div", "Div", "Neg"]


@pytest.mark.toolkit
@pytest.mark.parametrize("version", ["2.3.0", "2.5.0"])
def test_real_build_places_the_quotient_on_the_npu(version: str, tmp_path: Path) -> None:
    """Real builds: the product with Div(1, v) leaves one Div on the CPU; rewritten, none."""
    from rkpart.compile.compiler_plan import parse_layer_rows
    from rkpart.triage.matrix import build_once
    from tests.toolkits import get_toolkit

    tk = get_toolkit(version)
    cpu = {}
    for what, m in (("before", _model("Div")), ("after", rewritten(_model("Div"), ROW)[0])):
        path = tmp_path / f"{what}.onnx"
        onnx.save(m, str(path))
        log = tmp_path / f"{what}.log"
        assert build_once(path, tk, target="rk3588", log=log).ok
        rows = parse_layer_rows(log.read_text(errors="replace")) or []
        cpu[what] = [x.op_type for x in rows if x.target.upper() == "CPU"
                     and x.op_type not in ("InputOperator", "OutputOperator")]
    assert cpu == {"before": ["Div"], "after": []}
