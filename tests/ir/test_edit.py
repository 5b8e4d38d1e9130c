"""The editing view rewrites are written on: one type inference per stage, declared needs, one evaluator."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.ir.edit import NEEDS, GraphEdit, free_name
from rkpart.targets.rewrites import REWRITES, apply_rewrites, rewrites_for

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _model(opset: int = 17) -> onnx.ModelProto:
    """Relu(x) and a Split of x whose sizes are computed from constants (Add of two initializers)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Add", ["a", "b"], ["sizes"]),
             helper.make_node("Split", ["r", "sizes"], ["p", "q"], axis=1)]
    inits = [numpy_helper.from_array(np.array([1, 2], np.int64), "a"),
             numpy_helper.from_array(np.array([1, 4], np.int64), "b")]
    g = helper.make_graph(nodes, "g", [vi("x", F, [2, 8])], [vi("p", F, None), vi("q", F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_types_are_inferred_once_per_stage_until_a_row_matches() -> None:
    m = _model()
    view = GraphEdit(m)
    view.declare(("types", "shapes"))
    assert view.elem("q") == F and view.static_shapes()["r"] == [2, 8]
    for _ in range(3):  # more rows reading types: no new inference
        view.declare(("types", "shapes"))
        assert view.elem("p") == F
    assert view.inferences == 1
    view.retype()
    view.declare(("types",))
    assert view.elem("r") == F and view.inferences == 2


def test_reading_what_a_row_did_not_declare_raises() -> None:
    view = GraphEdit(_model())
    view.declare(())
    with pytest.raises(RuntimeError, match="without declaring"):
        view.elem("x")
    with pytest.raises(RuntimeError, match="without declaring"):
        view.static_shapes()


def test_every_row_declares_only_known_needs_and_the_table_is_stable() -> None:
    names = [r.name for r in REWRITES]
    assert len(names) == len(set(names))
    assert all(r.kind in ("lower", "npu") and (r.op_type or r.probe) and r.toolkits for r in REWRITES)
    assert all(set(r.needs) <= NEEDS for r in REWRITES)
    # a row reading what it did not declare raises (test_reading_what_a_row_did_not_declare_raises), and
    # the golden test runs every row on a graph it matches: so the declarations are complete
    with pytest.raises(ValueError, match="unknown needs"):
        dataclasses.replace(REWRITES[0], needs=("weights",))


def test_constant_values_evaluate_at_the_models_opset() -> None:
    """Split sizes computed by an Add: the one evaluator folds them (opset 17 and 13 alike)."""
    for opset in (13, 17):
        view = GraphEdit(_model(opset))
        assert view.value("sizes").tolist() == [2, 6]  # type: ignore[union-attr]
        assert view.value("x") is None  # a graph input is no constant


def test_fresh_names_avoid_every_name_in_use() -> None:
    view = GraphEdit(_model())
    assert view.fresh("r") == "r_rk1" and view.fresh("r") == "r_rk2" and view.fresh("new") == "new"
    used = {"a", "a_rk1"}
    assert free_name("a", used) == "a_rk2" and "a_rk2" in used  # the one rule load.py's views use too


def _sliced_pieces(piece: str) -> onnx.ModelProto:
    """Two Slices of a computed tensor sharing the int64 axis constant ``k``, concatenated; the first
    piece is named ``piece``."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("k", [1]), ("a0", [0]), ("a1", [1]),
                                                                           ("a2", [2]))]
    inits.append(numpy_helper.from_array(np.ones([1, 2, 32], np.float32), "w"))
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node("Slice", ["xw", "a1", "a2", "k"], [piece], name="n"),
             helper.make_node("Slice", ["xw", "a0", "a1", "k"], ["q"], name="q"),
             helper.make_node("Concat", [piece, "q"], ["y"], axis=1, name="cat")]
    vi = helper.make_tensor_value_info
    m = helper.make_model(helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [1, 2, 32])],
                                            [vi("y", TensorProto.FLOAT, [1, 2, 32])], inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.toolkit
def test_a_fresh_name_from_a_constants_name_builds_on_230(tmp_path: Path) -> None:
    """2.3.0 fails a build where a float tensor is named ``<int64 constant>_1`` (its ONNX Runtime
    constant folding binds the two: "Concat bound to different types"); the name ``fresh`` gives
    instead builds."""
    from rkpart.triage.matrix import build_once
    from tests.toolkits import get_toolkit

    tk = get_toolkit("2.3.0")
    ours = GraphEdit(_sliced_pieces("p")).fresh("k")
    kinds = {}
    for name in ("k_1", ours):
        path = tmp_path / f"{name}.onnx"
        onnx.save(_sliced_pieces(name), str(path))
        kinds[name] = build_once(path, tk, target="rk3588", log=tmp_path / f"{name}.log").kind
    assert kinds == {"k_1": "error", ours: "ok"}, kinds
    assert "bound to different types" in (tmp_path / "k_1.log").read_text(errors="replace")


def test_a_stage_with_no_match_is_left_byte_identical() -> None:
    m = _model()
    before = m.SerializeToString(deterministic=True)
    assert apply_rewrites(m, rewrites_for("2.5.0", "npu")) == {}
    assert m.SerializeToString(deterministic=True) == before


def test_a_tensor_of_unknown_rank_is_not_a_scalar() -> None:
    """A graph output declared without a shape (rank unknown) has no static shape.  It used to
    read as a 0-d one, and ``strided-slices-concat`` divided by its rank 0 (the tiny Flux
    TorchScript export, 2.5.0: ZeroDivisionError)."""
    c = numpy_helper.from_array
    inits = [c(np.array([6], np.int64), "s0"), c(np.array([12], np.int64), "e0"),
             c(np.array([18], np.int64), "s1"), c(np.array([24], np.int64), "e1"), c(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", ["r", "s0", "e0", "ax"], ["p0"]),
             helper.make_node("Slice", ["r", "s1", "e1", "ax"], ["p1"]),
             helper.make_node("Concat", ["p0", "p1"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "g", [vi("x", F, [1, 32])], [vi("y", F, [1, 12]), vi("r", F, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    view = GraphEdit(m)
    view.declare(("shapes",))
    assert "r" not in view.static_shapes() and view.static_shapes()["x"] == [1, 32]
    assert apply_rewrites(m, rewrites_for("2.5.0", "npu")) == {}


def test_inferred_shapes_leave_the_value_infos_as_they_are() -> None:
    """``"inferred_shapes"``: the same static shapes as ``"shapes"``, read from the one inference
    without writing it into the model (``"shapes"`` writes it: a toolkit then sees it)."""
    m = _model()
    before = m.SerializeToString(deterministic=True)
    view = GraphEdit(m)
    view.declare(("inferred_shapes",))
    assert view.static_shapes()["r"] == [2, 8] and view.inferences == 1
    assert m.SerializeToString(deterministic=True) == before
    with pytest.raises(RuntimeError, match="without declaring"):
        view.elem("x")
    view.declare(("shapes",))
    assert view.static_shapes()["r"] == [2, 8] and view.inferences == 1  # the same inference
    assert m.SerializeToString(deterministic=True) != before  # now written


def _chain() -> onnx.ModelProto:
    """An RMSNorm's tail and a residual, to walk up from the Add::

        x ──> Mul(x, x) ─ sq ─> ReduceMean ─ ms ─> Sqrt ─ rt ─> Div(x, rt) ─ n ─> Mul(n, w) ─ nw ─┐
        │                                                                                        Add ─> y
        └────────────────────────────────────────────────────────────────────────────────────────┘
    """
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="square"),
             helper.make_node("ReduceMean", ["sq"], ["ms"], name="mean", axes=[-1]),
             helper.make_node("Sqrt", ["ms"], ["rt"], name="sqrt"),
             helper.make_node("Div", ["x", "rt"], ["n"], name="div"),
             helper.make_node("Mul", ["n", "w"], ["nw"], name="scale"),
             helper.make_node("Add", ["x", "nw"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [vi("x", F, [2, 8])], [vi("y", F, [2, 8])],
                          [numpy_helper.from_array(np.ones(8, np.float32), "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_producer_readers_and_parent_paths() -> None:
    view = GraphEdit(_chain())
    add = view.producer("y")
    assert add is not None and add.name == "add" and view.producer("x") is None and view.producer("w") is None
    assert [n.name for n in view.readers("x")] == ["square", "div", "add"]  # the square reads x twice: once
    path = view.match_parent_path(add, [("Mul", 1), ("Div", 0), ("Sqrt", 1), ("ReduceMean", 0)])
    assert path is not None and [n.name for n in path] == ["scale", "div", "sqrt", "mean"]
    assert view.match_parent_path(add, [("Mul", 1), ("Div", 1)]) is None  # Div's input 1 is the Sqrt's
    assert view.match_parent_path(add, [("Mul", 0)]) is None  # x has no producer


def test_pending_edits_rebuild_the_node_list_once() -> None:
    m = _chain()
    view = GraphEdit(m)
    before = view.producer("n")
    view.replace_later(3, [helper.make_node("Mul", ["x", "inv"], ["n"], name="mul_inv"),])
    view.replace_later(2, [helper.make_node("Sqrt", ["ms"], ["rt"], name="sqrt"),
                           helper.make_node("Reciprocal", ["rt"], ["inv"], name="inv")])
    assert [n.name for n in m.graph.node][2:4] == ["sqrt", "div"] and view.producer("n") is before  # not yet
    view.apply_edits()
    assert [n.name for n in m.graph.node] == ["square", "mean", "sqrt", "inv", "mul_inv", "scale", "add"]
    got = view.producer("n")
    assert got is not None and got.name == "mul_inv"  # the lookups follow the rebuilt list
    view.apply_edits()  # nothing queued: nothing changes
    assert len(m.graph.node) == 7
