"""A model input of rank > 4 that an NPU stage reads is handed over as a rank-4 view.

rknn-toolkit2 2.3.0 puts a Reshape of a rank-5 stage input on the CPU (WanVACE's control video
(1, 8, 1, 8, 8) into its patch-embedding Conv3d: ``Reshape:control_hidden_states_rs``); fed a
rank-4 view that the stage reshapes back, the same graph builds with every layer on the NPU.
``rkpart.grouping.views.with_rank4_inputs`` reads such inputs through ``Reshape(Reshape(x, rank 4),
x's shape)``; the strategies put the first on the host and the second in the NPU stage.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.cli_args import bundled_example
from rkpart.grouping.views import RANK4_PREFIX, rank4_view
from rkpart.pipeline import partition
from tests.partitioner.checks import assert_reproduces


@pytest.mark.parametrize(("shape", "view"), [
    ((1, 8, 1, 8, 8), (1, 8, 8, 8)),  # WanVACE's control video: the unit time axis goes
    ((1, 2, 3, 4, 5), (2, 3, 4, 5)),  # no unit axis after the first: the batch axis goes
    ((2, 3, 4, 5, 6), (2, 3, 20, 6)),  # none at all: the axes between the second and the last merge
    ((2, 1, 3, 4, 5, 6), (2, 3, 20, 6)),
    ((1, 1, 1, 1, 1, 1), (1, 1, 1, 1)),
    ((1, 8, 8, 8), None), ((4,), None),
])
def test_rank4_view_keeps_the_elements_in_order(shape: tuple[int, ...], view: tuple[int, ...] | None) -> None:
    assert rank4_view(shape) == view
    if view is not None:
        assert int(np.prod(view)) == int(np.prod(shape)) and len(view) == 4


def patch_embed_model(path: Path, t: int = 1) -> Path:
    """x (1, 8, T, 8, 8) -> Conv3d (1, 2, 2) -> tokens -> MatMul: the VACE control patch embedding."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 2, 2], strides=[1, 2, 2]),
             helper.make_node("Reshape", ["c", "s3"], ["r"]),
             helper.make_node("Transpose", ["r"], ["tk"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["tk", "wm"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((32, 8, 1, 2, 2)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([1, 32, 16 * t], np.int64), "s3"),
             numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "wm")]
    g = helper.make_graph(nodes, "vace_patch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, t, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16 * t, 32])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("t", [1, 2])
def test_the_npu_stage_reads_a_rank4_view_and_the_plan_reproduces(tmp_path: Path, t: int) -> None:
    model = patch_embed_model(tmp_path / "m.onnx", t)
    folder = tmp_path / "plan"
    plan = partition(model, folder, "generic")
    (npu,) = plan.npu_stages
    assert [(i, plan.tensors[i].shape) for i in npu.inputs] == [(f"{RANK4_PREFIX}x", rank4_view((1, 8, t, 8, 8)))]
    host = [s for s in plan.stages if s.device == "host"]
    assert [s.inputs for s in host] == [("x",)]  # the first Reshape, on the host
    assert_reproduces(plan, folder, model)


def test_a_model_whose_npu_stages_read_no_wide_input_is_left_as_it_is(tmp_path: Path) -> None:
    """The bundled example's patch embedding runs in the host prologue under ``split``: its
    rank-5 latent never reaches an NPU stage, and no view is inserted (the plan is unchanged)."""
    plan = partition(bundled_example(), tmp_path / "plan", "split")
    assert any(len(plan.tensors[i].shape) == 5 for s in plan.stages for i in s.inputs)  # the latent
    assert not any(i.startswith(RANK4_PREFIX) for s in plan.stages for i in (*s.inputs, *s.outputs))
