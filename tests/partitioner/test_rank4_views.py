"""A narrow tensor read through a rank-4 view and back (:func:`rkpart.grouping.views.with_rank4_views`):
exact, one way back per reader, and the partition hands the view to the NPU stage that reads it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.grouping.views import RANK4_PREFIX, with_rank4_views
from rkpart.ir import load_model
from rkpart.runtime.ort import make_session


def _model(path: Path) -> Path:
    """``m = mask * -1e4`` ([2, 3, 5], last dim unaligned), read by two Adds."""
    nodes = [helper.make_node("Mul", ["mask", "big"], ["m"], name="/mask/Mul"),
             helper.make_node("Add", ["x", "m"], ["a"], name="/a/Add"),
             helper.make_node("Add", ["a", "m"], ["y"], name="/b/Add")]
    g = helper.make_graph(nodes, "narrow",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5]),
                           helper.make_tensor_value_info("mask", TensorProto.FLOAT, [2, 3, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5])],
                          [numpy_helper.from_array(np.array(-1e4, np.float32), "big")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_the_view_is_exact_and_each_reader_has_its_own_way_back(tmp_path: Path) -> None:
    path = _model(tmp_path / "m.onnx")
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32),
             "mask": (np.arange(30).reshape(2, 3, 5) % 3 == 0).astype(np.float32)}
    ref = make_session(str(path)).run(["y"], feeds)[0]
    mg = with_rank4_views(load_model(path), ["m"])
    view = f"{RANK4_PREFIX}m"
    assert mg.tensor_types[view] == ("float32", (1, 2, 3, 5))
    backs = [c for c in mg.consumers[view]]
    assert len(backs) == 2 and all(mg.op(b).op_type == "Reshape" for b in backs)
    assert {mg.op(c).name for b in backs for c in mg.consumers[mg.op(b).outputs[0]]} == {"/a/Add", "/b/Add"}
    got = make_session(mg.model.SerializeToString()).run(["y"], feeds)[0]
    np.testing.assert_array_equal(got, ref)
