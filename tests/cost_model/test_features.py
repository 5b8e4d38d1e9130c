"""Features from static shapes: MACs, weights, activations, liveness peak."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.cost_model.features import combine, group_features, model_features, stage_features
from rkpart.discovery.structure import discover
from rkpart.grouping.groups import order_groups
from rkpart.grouping.strategies.split import SplitStrategy
from rkpart.ir import load_model
from rkpart.pipeline import partition


def _attention_like() -> onnx.ModelProto:
    """
    ::

        x[1,8,16] --MatMul(W[16,32])--> h[1,8,32] --Relu--> r --MatMul(r, r^T)--> s[1,8,8] --Softmax--> y
                                                       \\--Transpose--> rt --/
    """
    w = numpy_helper.from_array(np.ones((16, 32), np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["rt"], name="t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["r", "rt"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["y"], name="sm", axis=-1),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_macs_weights_and_peak_from_static_shapes() -> None:
    f = model_features(_attention_like(), device="npu")
    assert f.macs == 8 * 16 * 32  # weighted MatMul: M*K*N
    assert f.act_macs == 8 * 32 * 8  # activation x activation MatMul
    assert f.weight_bytes == 16 * 32 * 4
    assert f.in_bytes == 8 * 16 * 4 and f.out_bytes == 8 * 8 * 4
    # Relu output r (1 KiB) and its transpose rt (1 KiB) are both live when scores runs, with s
    assert f.peak_bytes == 8 * 32 * 4 * 2 + 8 * 8 * 4
    assert dict(f.op_counts) == {"MatMul": 2, "Relu": 1, "Softmax": 1, "Transpose": 1}
    # Relu + Transpose (output elements) + Softmax (its input) are elementwise work
    assert f.elementwise_elems == 256 + 256 + 64


def test_stage_file_and_candidate_group_give_the_same_features(tmp_path: Path, example_model: Path) -> None:
    plan = partition(example_model, tmp_path / "p", "split")
    mg = load_model(example_model)
    groups = order_groups(mg, SplitStrategy().propose(mg, discover(mg)))
    assert [g.id for g in groups] == [s.id for s in plan.stages]
    for s, g in zip(plan.stages, groups, strict=True):
        a = stage_features(tmp_path / "p", s)
        b = group_features(mg, g.ops, device=g.device)
        assert a == b, s.id


def test_combine_sums_work_but_not_peaks() -> None:
    f = model_features(_attention_like(), device="npu")
    both = combine([f, f])
    assert both.macs == 2 * f.macs and both.stages == 2
    assert both.peak_bytes == f.peak_bytes
