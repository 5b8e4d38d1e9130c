"""An NPU stage never hands the host two tensors that hold the same values by construction.

rknn-toolkit2 builds one output for tensors it finds equal, and a stage declaring both builds into
an ``.rknn`` with fewer outputs, which every runner then refuses.  Measured below (``build_once``,
rk3588, 2.3.0 and 2.5.0): ``Cast(h)`` and ``Cast(Cast(h))`` to float32 (Kandinsky 5's TorchScript
blocks) -> one ``OutputOperator``; two equal Slices or Transposes of a tiny stage stay two (Sana-WM's
rank-5 Transposes computed twice, handed over as rank-4 views, were merged: 19 of 21 outputs on
2.5.0).  The partition reads the second as the first (:mod:`rkpart.ir.values`); compile refuses an
``.rknn`` with fewer outputs than its stage.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.compile.placement import missing_outputs
from rkpart.ir.load import load_model
from rkpart.ir.values import same_values, value_numbers
from rkpart.pipeline import partition
from tests.partitioner.checks import assert_reproduces


def _twins(form: str) -> tuple[list[onnx.NodeProto], list[TensorProto]]:
    """Two tensors ``a`` and ``b`` computed the same way from ``h`` (``form``), or two that are not."""
    i64 = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in
           (("s0", 0), ("e0", 32), ("x0", 2), ("s1", 0), ("e1", 32), ("x1", 2), ("e2", 16))]
    if form == "slices":  # the same bounds, as constants of other names
        return [helper.make_node("Slice", ["h", "s0", "e0", "x0"], ["a"], name="slice_a"),
                helper.make_node("Slice", ["h", "s1", "e1", "x1"], ["b"], name="slice_b")], i64
    if form == "transposes":  # the same Transpose twice (Sana-WM's TorchScript linear attention)
        return [helper.make_node("Transpose", ["h"], ["a"], name="tp_a", perm=[0, 2, 1]),
                helper.make_node("Transpose", ["h"], ["b"], name="tp_b", perm=[0, 2, 1])], []
    if form == "casts":  # Cast(h) and Cast(Cast(h)) to the type h has
        return [helper.make_node("Cast", ["h"], ["a"], name="cast_a", to=TensorProto.FLOAT),
                helper.make_node("Cast", ["a"], ["b"], name="cast_b", to=TensorProto.FLOAT)], []
    if form == "other_bounds":  # not the same values
        return [helper.make_node("Slice", ["h", "s0", "e0", "x0"], ["a"], name="slice_a"),
                helper.make_node("Slice", ["h", "s1", "e2", "x1"], ["b"], name="slice_b")], i64
    assert form == "random"  # drawn twice: never the same values
    return [helper.make_node("RandomNormalLike", ["h"], ["a"], name="rand_a", seed=1.0),
            helper.make_node("RandomNormalLike", ["h"], ["b"], name="rand_b", seed=1.0)], []


def twins_model(path: Path, form: str) -> Path:
    """x [1, 16, 64] -> MatMul -> h; a, b (:func:`_twins`) each read by a host op (IsNaN) and a Where,
    summed -> MatMul -> y."""
    rng = np.random.default_rng(0)
    twins, consts = _twins(form)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), *twins]
    for t in "ab":
        nodes += [helper.make_node("IsNaN", [t], [f"bad_{t}"], name=f"isnan_{t}"),
                  helper.make_node("Where", [f"bad_{t}", "zero", t], [f"clean_{t}"], name=f"where_{t}")]
    nodes += [helper.make_node("Add", ["clean_a", "clean_b"], ["s"], name="add"),
              helper.make_node("MatMul", ["s", "w3"], ["y"], name="mm3")]
    width = {"casts": 64, "random": 64, "transposes": 16}.get(form, 32)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w1"),
             numpy_helper.from_array(np.zeros((), np.float32), "zero"),
             numpy_helper.from_array(rng.standard_normal((width, 64)).astype(np.float32), "w3"), *consts]
    if form == "other_bounds":  # b is [.., 16]: pad the sum's operands to one width
        nodes[-2] = helper.make_node("Concat", ["clean_b", "clean_b"], ["bb"], name="cat", axis=2)
        nodes.insert(-1, helper.make_node("Add", ["clean_a", "bb"], ["s"], name="add"))
    rows = 64 if form == "transposes" else 16
    g = helper.make_graph(nodes, "twins", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, 64])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize(("form", "same"), [("slices", True), ("transposes", True), ("casts", True),
                                            ("other_bounds", False), ("random", False)])
def test_value_numbers_compare_constants_by_value_and_never_random_draws(tmp_path: Path, form: str,
                                                                         same: bool) -> None:
    mg = load_model(twins_model(tmp_path / "m.onnx", form))
    nums = value_numbers(mg)
    assert (nums["a"] == nums["b"]) is same
    assert same_values(mg, [["a", "b"]]) == ({"b": "a"} if same else {})
    assert same_values(mg, [["a"], ["b"]]) == {}  # only tensors of one stage are compared
    assert nums["h"] != nums["a"] or form == "casts"  # the Cast to h's own type hands h on


def cast_chain_model(path: Path) -> Path:
    """x -> MatMul -> h; a = Cast(h), b = Cast(a) (both to float32, h's type); a read by a host op
    (IsNaN), b by a MatMul on the NPU and by a host op; Kandinsky 5's TorchScript blocks end so."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Cast", ["h"], ["a"], name="cast_a", to=TensorProto.FLOAT),
             helper.make_node("Cast", ["a"], ["b"], name="cast_b", to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["b", "w2"], ["c"], name="mm2"),
             helper.make_node("IsNaN", ["a"], ["bad_a"], name="isnan_a"),
             helper.make_node("IsNaN", ["b"], ["bad_b"], name="isnan_b"),
             helper.make_node("Where", ["bad_a", "zero", "c"], ["ca"], name="where_a"),
             helper.make_node("Where", ["bad_b", "zero", "ca"], ["y"], name="where_b")]
    inits = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), n) for n in ("w1", "w2")]
    inits.append(numpy_helper.from_array(np.zeros((), np.float32), "zero"))
    g = helper.make_graph(nodes, "casts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_an_npu_stage_hands_the_host_a_tensor_not_also_its_alias(tmp_path: Path) -> None:
    folder, model = tmp_path / "plan", cast_chain_model(tmp_path / "m.onnx")
    plan = partition(model, folder, "generic", toolkit="2.5.0")
    assert "IsNaN" in {h["op_type"] for h in plan.extra["capability"]["host_ops"]}
    for s in plan.npu_stages:
        assert not {"a", "b"} <= set(s.outputs), s.outputs
    assert any("holds the same values" in n and "b -> a" in n for n in plan.extra["notes"])
    assert_reproduces(plan, folder, model)


@pytest.mark.parametrize(("form", "merged"), [("slices", True), ("other_bounds", False)])
def test_equal_computations_leave_an_npu_stage_once(tmp_path: Path, form: str, merged: bool) -> None:
    """Two Slices of equal bounds: one output; of other bounds: two.  (Two Transposes of h: the
    capability's cut takes them to the host with their readers, h crosses.)"""
    folder, model = tmp_path / "plan", twins_model(tmp_path / "m.onnx", form)
    plan = partition(model, folder, "generic", toolkit="2.5.0")
    outs = [t for s in plan.npu_stages for t in s.outputs]
    notes = [n for n in plan.extra["notes"] if "same values" in n]
    if merged:
        assert "a" in outs and "b" not in outs
        assert any("holds the same values" in n and "b -> a" in n for n in notes)
    else:
        assert {"a", "b"} <= set(outs)
        assert not notes
    assert_reproduces(plan, folder, model)


def _stage(path: Path, form: str) -> Path:
    """The NPU stage the partition would write without the merge: h -> a, b, both outputs."""
    twins, consts = _twins(form)
    w1 = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w1")
    shape = {"casts": [1, 16, 64], "transposes": [1, 64, 16]}.get(form, [1, 16, 32])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), *twins], "stage",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                          [helper.make_tensor_value_info(t, TensorProto.FLOAT, shape) for t in "ab"],
                          [w1, *consts])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.toolkit
@pytest.mark.parametrize("version", ["2.5.0", "2.3.0"])
@pytest.mark.parametrize("form", ["slices", "transposes", "casts"])
def test_the_toolkit_builds_one_output_for_a_tensor_and_its_alias(tmp_path: Path, version: str,
                                                                       form: str) -> None:
    from rkpart.triage.matrix import build_once
    from tests.toolkits import get_toolkit

    log = tmp_path / "build.log"
    res = build_once(_stage(tmp_path / "stage.onnx", form), get_toolkit(version), target="rk3588", log=log)
    assert res.ok, res.message
    lost = missing_outputs(log.read_text(errors="replace"), ["a", "b"])
    assert (lost is not None and len(lost) == 1) if form == "casts" else lost is None


@pytest.mark.toolkit
def test_compile_refuses_an_rknn_with_fewer_outputs_and_builds_the_merged_plan(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan written without the merge (as rkpart wrote it before) fails compile with the reason;
    the plan the partition writes now builds with every output."""
    import rkpart.grouping.propose as propose
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from tests.toolkits import get_toolkit

    model = cast_chain_model(tmp_path / "m.onnx")
    tk = get_toolkit("2.5.0")
    with monkeypatch.context() as m:
        m.setattr(propose, "same_values", lambda *a, **k: {})
        old = partition(model, tmp_path / "old", "generic", toolkit="2.5.0")
    assert any({"a", "b"} <= set(s.outputs) for s in old.npu_stages)
    rep = compile_plan_report(old, tmp_path / "old", CompileOptions(tk, "rk3588", {}, cache=False))
    (failed,) = rep.failed
    msg = failed.failures[-1].message
    assert "the .rknn has 2 outputs, the stage declares 3" in msg and "found equal" in msg, msg
    new = partition(model, tmp_path / "new", "generic", toolkit="2.5.0")
    rep = compile_plan_report(new, tmp_path / "new", CompileOptions(tk, "rk3588", {}, cache=False))
    assert not rep.failed and all(o.status == "built" for o in rep.outcomes)
    for o in rep.outcomes:
        assert o.artifact is not None and o.artifact.compiler is not None
        assert dict(o.artifact.compiler.by_op)["OutputOperator"] == len(new.stage(o.stage_id).outputs)
