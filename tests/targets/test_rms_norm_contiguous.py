"""``rms-norm-contiguous``: an RMSNorm's nodes listed together, right before the first node that reads it.

The toolkits' ``replace_rms_norm`` takes the norm's weight product from the node *listed* after the
norm: with an unrelated ``Mul`` by a constant there (RFD4's TorchScript export: the stream's
weightless adaptive norm, then the conditioning norm's weight), 2.5.0's optimiser never returns and
2.3.0 / 2.3.2 fail.  The rewrite only reorders; the toolkit test builds the 8-node graph
``rkpart repro`` reduced RFD4's block stage to (here hand-made) in both orders.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.rewrites import REWRITES, rewrites_for
from tests.targets.rewrite_check import rewritten, run_unoptimised

ROW = tuple(r for r in REWRITES if r.name == "rms-norm-contiguous")
F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


#: the nodes as RFD4 lists them: the unrelated ``c * w`` right after the norm
LISTED = ("sq", "mean", "add", "sqrt", "inv", "norm", "cond", "gate")
#: as the rewrite lists them
GATHERED = ("cond", "sq", "mean", "add", "sqrt", "inv", "norm", "gate")


def listed_weight(spelling: str = "div", order: tuple[str, ...] = LISTED) -> onnx.ModelProto:
    """A weightless RMSNorm of ``x`` times a gate ``g``, and an unrelated ``c * w`` (``w`` a constant),
    nodes listed in ``order`` (by name).

    ``spelling``: the norm's inverse as ``Div(1, Sqrt)`` ("div"), ``Reciprocal(Sqrt)`` ("reciprocal"),
    or the norm as ``Div(x, Sqrt)`` ("divide", no "inv" node); "square" squares with ``Mul(x, x)``."""
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("two", 2.0), ("eps", 1e-5),
                                                                              ("one", 1.0))]
    inits.append(numpy_helper.from_array((np.arange(16) % 5 + 1).astype(np.float32) / 2, "w"))
    mk = helper.make_node
    nodes = {"sq": mk("Mul", ["x", "x"], ["p"], name="sq") if spelling == "square"
             else mk("Pow", ["x", "two"], ["p"], name="sq"),
             "mean": mk("ReduceMean", ["p"], ["m"], axes=[-1], keepdims=1, name="mean"),
             "add": mk("Add", ["m", "eps"], ["a"], name="add"), "sqrt": mk("Sqrt", ["a"], ["s"], name="sqrt"),
             "inv": mk("Reciprocal", ["s"], ["r"], name="inv") if spelling == "reciprocal"
             else mk("Div", ["one", "s"], ["r"], name="inv"),
             "norm": mk("Div", ["x", "s"], ["n"], name="norm") if spelling == "divide"
             else mk("Mul", ["r", "x"] if spelling == "reciprocal" else ["x", "r"], ["n"], name="norm"),
             "cond": mk("Mul", ["c", "w"], ["cw"], name="cond"), "gate": mk("Mul", ["n", "g"], ["y"], name="gate")}
    g = helper.make_graph([nodes[k] for k in order if not (k == "inv" and spelling == "divide")], "g",
                          [vi("x", F, [1, 8, 32]), vi("c", F, [1, 8, 16]), vi("g", F, [1, 8, 32])],
                          [vi("cw", F, [1, 8, 16]), vi("y", F, [1, 8, 32])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal([1, 8, 32]).astype(np.float32),
            "c": rng.standard_normal([1, 8, 16]).astype(np.float32),
            "g": rng.standard_normal([1, 8, 32]).astype(np.float32)}


def _names(m: onnx.ModelProto) -> list[str]:
    return [n.name for n in m.graph.node]


@pytest.mark.parametrize("spelling", ["div", "reciprocal", "divide", "square"])
def test_the_norm_is_listed_together_before_its_reader(spelling: str) -> None:
    m = listed_weight(spelling)
    r, done = rewritten(m, ROW)
    assert done == {"rms-norm-contiguous": 1}
    names = _names(r)
    assert names == [k for k in GATHERED if not (k == "inv" and spelling == "divide")], names
    assert sorted(n.SerializeToString() for n in r.graph.node) == sorted(n.SerializeToString() for n in m.graph.node)
    feeds = _feeds()
    for a, b in zip(run_unoptimised(m, feeds), run_unoptimised(r, feeds), strict=True):
        assert np.array_equal(a, b)  # the same ops on the same values: bit for bit
    assert rewritten(r, ROW)[1] == {}  # and then it is as the toolkit wants it


def test_a_norm_spread_out_is_gathered() -> None:
    """The unrelated Mul listed inside the norm (before its last op): the norm's ops move together."""
    r, done = rewritten(listed_weight(order=("sq", "mean", "add", "sqrt", "inv", "cond", "norm", "gate")), ROW)
    assert done == {"rms-norm-contiguous": 1}
    assert _names(r) == list(GATHERED)


@pytest.mark.parametrize("case", ["listed_well", "cond_last", "inner_read", "no_norm", "eps_computed"])
def test_left_alone(case: str) -> None:
    """Already listed as the rule wants (the reader next, or nothing after), an intermediate tensor
    read outside the norm, a ReduceMean that is no RMSNorm, an epsilon that is no constant."""
    if case == "listed_well":
        m = listed_weight(order=GATHERED)
    elif case == "cond_last":
        m = listed_weight(order=("sq", "mean", "add", "sqrt", "inv", "norm", "gate", "cond"))
    else:
        m = listed_weight()
        nodes = m.graph.node
        if case == "inner_read":
            nodes.append(helper.make_node("Neg", ["m"], ["mm"], name="neg"))
            m.graph.output.append(vi("mm", F, [1, 8, 1]))
        elif case == "no_norm":
            nodes[0].op_type = "Sub"  # x - 2, not a square
        else:
            nodes[2].input[1] = "c_eps"
            nodes.insert(0, helper.make_node("ReduceMax", ["c"], ["c_eps"], keepdims=1, axes=[-1], name="eps"))
            m.graph.output.append(vi("c_eps", F, [1, 8, 1]))
    before = m.SerializeToString(deterministic=True)
    r, done = rewritten(m, ROW)
    assert done == {} and r.SerializeToString(deterministic=True) == before


def test_every_toolkit_and_last() -> None:
    from rkpart.targets.rewrites import compile_rewrites_for

    for v in ("2.3.0", "2.3.2", "2.5.0"):
        assert "rms-norm-contiguous" in [r.name for r in rewrites_for(v, "npu")]
        assert compile_rewrites_for(v)[-1].name == "rms-norm-contiguous"  # sees the order the others left


@pytest.mark.toolkit
@pytest.mark.parametrize("version", ["2.3.0", "2.5.0"])
def test_the_listed_weight_fails_the_build_and_the_rewrite_builds(version: str, tmp_path: Path) -> None:
    """As listed, 2.5.0 does not return (killed at 60 s; a build of it takes ~4 s) and 2.3.0 fails;
    rewritten, both build, placed as the same graph listed with the unrelated Mul last (2.5.0: 0 CPU
    layers; 2.3.0 runs a weightless norm's ``Div(1, .)`` on the CPU in any order)."""
    from rkpart.compile.placement import cpu_ops
    from rkpart.triage.matrix import build_once
    from tests.toolkits import get_toolkit

    tk = get_toolkit(version)
    m = listed_weight()
    r, _ = rewritten(m, ROW)
    kinds, logs = {}, {}
    last = listed_weight(order=("sq", "mean", "add", "sqrt", "inv", "norm", "gate", "cond"))
    for tag, model in (("listed", m), ("rewritten", r), ("cond_last", last)):
        path = tmp_path / f"{tag}.onnx"
        onnx.save(model, str(path))
        kinds[tag] = build_once(path, tk, target="rk3588", log=tmp_path / f"{tag}.log", timeout=60).kind
        logs[tag] = (tmp_path / f"{tag}.log").read_text(errors="replace")
    assert kinds == {"listed": "timeout" if version == "2.5.0" else "error", "rewritten": "ok",
                     "cond_last": "ok"}, kinds
    assert "replace_rms_norm" in logs["listed"] and "'cond'" in logs["listed"]  # the rule took the unrelated Mul
    assert cpu_ops(logs["rewritten"]) == cpu_ops(logs["cond_last"]) == (() if version == "2.5.0" else ("Div:inv",))
