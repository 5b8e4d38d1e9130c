"""A narrow tensor that the capability's moves leave crossing an NPU stage boundary crosses as a
rank-4 view.

Measured (``rkpart.triage.matrix.build_once``, rk3588, 2.3.0 and 2.5.0): a stage whose output is
``[1, 16, 2]`` gets ``Reshape:y-rs`` on the CPU, one whose output is ``[1, 1, 16, 2]`` (the same
values) gets none; a rank-3 input with an unaligned last dim is converted the same way
(:func:`rkpart.grouping.views.with_rank4_views`); on 2.3.0 a rank-5 stage input is converted and the op
giving a rank-5 stage output runs on the CPU (2.5.0: neither).  Sana-WM's linear attention on 2.3.0 kept such a
conversion (``Reshape:add_4-rs``, a ``[1, 2, 2]`` gate read by a host op) through every
``--repartition`` round: moving the producer only moved the boundary one op back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.grouping.views import NPU_ALIGN, RANK4_PREFIX
from rkpart.pipeline import partition
from rkpart.plan.plan import Plan
from tests.partitioner.checks import assert_reproduces


def gate_model(path: Path, width: int = 6) -> Path:
    """x [1, 16, 64] -> MatMul -> g [1, 16, width] -> IsNaN (a host op on rk3588) -> Where -> MatMul."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("MatMul", ["h", "w2"], ["g"], name="mm2"),
             helper.make_node("IsNaN", ["g"], ["bad"], name="isnan"),
             helper.make_node("Where", ["bad", "zero", "g"], ["clean"], name="where"),
             helper.make_node("MatMul", ["clean", "w3"], ["y"], name="mm3")]
    inits = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((64, width)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.zeros((), np.float32), "zero"),
             numpy_helper.from_array(rng.standard_normal((width, 64)).astype(np.float32), "w3")]
    g = helper.make_graph(nodes, "gate", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def wide_model(path: Path) -> Path:
    """x [1, 16, 64] -> MatMul -> Reshape [1, 16, 2, 4, 8] -> IsNaN (host) -> Where -> Reshape -> MatMul."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Reshape", ["h", "s5"], ["g"], name="view5"),
             helper.make_node("IsNaN", ["g"], ["bad"], name="isnan"),
             helper.make_node("Where", ["bad", "zero", "g"], ["clean"], name="where"),
             helper.make_node("Reshape", ["clean", "s3"], ["c3"], name="view3"),
             helper.make_node("MatMul", ["c3", "w3"], ["y"], name="mm3")]
    inits = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w1"),
             numpy_helper.from_array(np.array([1, 16, 2, 4, 8], np.int64), "s5"),
             numpy_helper.from_array(np.array([1, 16, 64], np.int64), "s3"),
             numpy_helper.from_array(np.zeros((), np.float32), "zero"),
             numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w3")]
    g = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _narrow_crossings(plan: Plan) -> list[tuple[str, str, tuple[int, ...]]]:
    model_io = {*plan.inputs, *plan.outputs}
    return [(s.id, t, plan.tensors[t].shape) for s in plan.npu_stages for t in (*s.inputs, *s.outputs)
            if t not in model_io and (len(plan.tensors[t].shape) > 4 or (len(plan.tensors[t].shape) == 3
                                      and plan.tensors[t].shape[-1] % NPU_ALIGN))]


def test_a_narrow_output_to_a_host_op_leaves_its_stage_as_a_rank4_view(tmp_path: Path) -> None:
    model = gate_model(tmp_path / "m.onnx")
    folder = tmp_path / "plan"
    plan = partition(model, folder, "generic", toolkit="2.5.0")
    assert [h["op_type"] for h in plan.extra["capability"]["host_ops"]] == ["IsNaN"]
    assert _narrow_crossings(plan) == []
    first = plan.npu_stages[0]
    assert f"{RANK4_PREFIX}g" in first.outputs and plan.tensors[f"{RANK4_PREFIX}g"].shape == (1, 1, 16, 6)
    # the host op reads its own way back; the bool it returns enters the next stage as a view too
    host = [s for s in plan.stages if s.device == "host"]
    assert len(host) == 1 and host[0].inputs == (f"{RANK4_PREFIX}g",)
    assert plan.tensors[host[0].outputs[0]].shape == (1, 1, 16, 6)
    assert_reproduces(plan, folder, model)


def test_a_rank5_crossing_is_a_rank4_view_both_ways(tmp_path: Path) -> None:
    model = wide_model(tmp_path / "m.onnx")
    folder = tmp_path / "plan"
    plan = partition(model, folder, "generic", toolkit="2.3.0")
    assert _narrow_crossings(plan) == []
    crossing = {t: plan.tensors[t].shape for s in plan.npu_stages for t in (*s.inputs, *s.outputs)
                if t.startswith(RANK4_PREFIX)}
    assert crossing == {f"{RANK4_PREFIX}g": (16, 2, 4, 8), f"{RANK4_PREFIX}bad": (16, 2, 4, 8)}
    assert_reproduces(plan, folder, model)


def test_an_aligned_crossing_is_left_as_it_is(tmp_path: Path) -> None:
    plan = partition(gate_model(tmp_path / "m.onnx", width=8), tmp_path / "plan", "generic", toolkit="2.5.0")
    assert not any(t.startswith(RANK4_PREFIX) for s in plan.stages for t in (*s.inputs, *s.outputs))
    assert next(plan.tensors[t].shape for s in plan.npu_stages for t in s.outputs if t in plan.tensors) == (1, 16, 8)


@pytest.mark.toolkit
@pytest.mark.parametrize("version", ["2.3.0", "2.5.0"])
@pytest.mark.parametrize("make", [gate_model, wide_model], ids=["narrow", "rank5"])
def test_the_views_build_with_no_cpu_layer(tmp_path: Path, version: str, make: Callable[[Path], Path]) -> None:
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from tests.toolkits import get_toolkit

    folder = tmp_path / "plan"
    plan = partition(make(tmp_path / "m.onnx"), folder, "generic", toolkit=version)
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit(version), "rk3588", {}, jobs=1))
    assert not rep.failed and len(rep.outcomes) == 2
    assert {o.stage_id: list(o.cpu_ops) for o in rep.outcomes} == {o.stage_id: [] for o in rep.outcomes}
