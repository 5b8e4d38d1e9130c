"""ModelGraph's constant bytes: what ``distinct_constants`` (the device model's weight count) reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.ir.load import load_model


def _model(path: Path, *, drop_length: bool) -> Path:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "wa"), numpy_helper.from_array(w.copy(), "wb"),
             numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "wc")]
    nodes = [helper.make_node("MatMul", ["x", n], [f"y{n}"]) for n in ("wa", "wb", "wc")]
    nodes += [helper.make_node("Add", ["ywa", "ywb"], ["s"]), helper.make_node("Add", ["s", "ywc"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
              size_threshold=0)
    if drop_length:  # optional in ONNX: the tensor runs to the end of the file (the last one here)
        m = onnx.load(str(path), load_external_data=False)
        last = m.graph.initializer[-1]
        keep = [e for e in last.external_data if e.key != "length"]
        del last.external_data[:]
        last.external_data.extend(keep)
        onnx.save(m, str(path))
    return path


def test_copies_are_found_by_their_bytes_in_external_data(tmp_path: Path) -> None:
    mg = load_model(_model(tmp_path / "m.onnx", drop_length=False))
    assert mg.distinct_constants(["wa", "wb", "wc"]) == ["wa", "wc"]
    assert mg.constant_digest("wa") == mg.constant_digest("wb") != mg.constant_digest("wc")


def test_a_sample_of_a_tensor_without_a_length_stops_at_the_sample(tmp_path: Path) -> None:
    mg = load_model(_model(tmp_path / "m.onnx", drop_length=True))
    assert len(mg._constant_bytes("wc", 100) or b"") == 100  # not the rest of the file
    assert len(mg._constant_bytes("wc") or b"") == 64 * 64 * 4
    assert mg.distinct_constants(["wa", "wb", "wc"]) == ["wa", "wc"]
