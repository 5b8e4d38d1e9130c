"""Sequence loops unrolled for the trip count a run gives them (:mod:`rkpart.ir.unroll`).

Hand-made models, run under ONNX Runtime before and after: a ``Loop`` whose trip count the
data decides (the number of set mask entries), carrying a tensor, a scan output and a sequence
that ``ConcatFromSequence`` stacks (``new_axis``) and ``SequenceLength`` counts.  What is not
rewritten is refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.errors import InvalidModelError
from rkpart.ir.load import DataDependentShapeError
from rkpart.runtime.ort import make_session
from rkpart.runtime.specialise import load_specialised

D = 4


def _model(path: Path, *, body_extra: list[onnx.NodeProto] = (), insert_pos: bool = False,
           cond_from_body: bool = False, read_op: str = "ConcatFromSequence") -> Path:
    """x (1, D), mask (6,) bool -> the loop runs sum(mask) times: acc += x * i, scan x * i, append x + i."""
    i, c, acc, seq = "i", "c_in", "acc_in", "seq_in"
    body_nodes = [
        helper.make_node("Cast", [i], ["fi"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "fi"], ["xi"]),
        helper.make_node("Add", [acc, "xi"], ["acc_out"]),
        helper.make_node("Add", ["x", "fi"], ["elem"]),
        helper.make_node("SequenceInsert", [seq, "elem", *(["pos"] if insert_pos else [])], ["seq_out"]),
        helper.make_node("Identity", ["xi"], ["scan"]),
        *body_extra,
    ]
    if cond_from_body:
        body_nodes.append(helper.make_node("Less", ["i", "three"], ["c_out"]))
    else:
        body_nodes.append(helper.make_node("Identity", [c], ["c_out"]))
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info(i, TensorProto.INT64, []),
         helper.make_tensor_value_info(c, TensorProto.BOOL, []),
         helper.make_tensor_value_info(acc, TensorProto.FLOAT, [1, D]),
         helper.make_tensor_sequence_value_info(seq, TensorProto.FLOAT, [1, D])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, D]),
         helper.make_tensor_sequence_value_info("seq_out", TensorProto.FLOAT, [1, D]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, D])])
    read = (helper.make_node("ConcatFromSequence", ["seq"], ["stacked"], axis=1, new_axis=1)
            if read_op == "ConcatFromSequence" else
            helper.make_node("SequenceAt", ["seq", "zero"], ["stacked"]))
    nodes = [
        helper.make_node("Cast", ["mask"], ["mi"], to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["mi"], ["m"], keepdims=0),
        helper.make_node("SequenceEmpty", [], ["seq0"], dtype=TensorProto.FLOAT),
        helper.make_node("Loop", ["m", "true", "acc0", "seq0"], ["acc", "seq", "scans"], body=body),
        read,
        helper.make_node("SequenceLength", ["seq"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["acc", "nf"], ["acc_n"]),
    ]
    values = {"true": np.array(True), "acc0": np.zeros((1, D), np.float32), "three": np.array(3, np.int64),
              "pos": np.array(0, np.int64), "zero": np.array(0, np.int64)}
    inits = [numpy_helper.from_array(v, k) for k, v in values.items()]
    g = helper.make_graph(nodes, "seqloop",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, D]),
                           helper.make_tensor_value_info("mask", TensorProto.BOOL, [6])],
                          [helper.make_tensor_value_info("acc_n", TensorProto.FLOAT, [1, D]),
                           helper.make_tensor_value_info("stacked", TensorProto.FLOAT, ["a", "b", "c"]),
                           helper.make_tensor_value_info("scans", TensorProto.FLOAT, ["d", 1, D])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def _feeds(k: int) -> dict[str, np.ndarray]:
    x = np.arange(D, dtype=np.float32).reshape(1, D) + 0.5
    return {"x": x, "mask": np.array([j < k for j in range(6)])}


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = make_session(model.SerializeToString())
    return [np.asarray(a) for a in sess.run(["acc_n", "stacked", "scans"], feeds)]


@pytest.mark.parametrize("k", [1, 3])
def test_the_unrolled_model_computes_what_the_loop_did(tmp_path: Path, k: int) -> None:
    path = _model(tmp_path / "m.onnx")
    with pytest.raises(DataDependentShapeError):
        load_specialised(path, None)
    mg = load_specialised(path, _feeds(k))
    recs = {r["op"]: r for r in mg.specialised}
    assert set(recs) == {"Loop", "ConcatFromSequence"}
    assert recs["ConcatFromSequence"]["shape"] == [1, k, D] \
        and recs["Loop"]["shape"] == list(mg.tensor_types[recs["Loop"]["tensor"]][1])
    for rec in recs.values():
        assert rec["trips"] == {"Loop_3": k}
        assert set(rec["inputs"]) == {"mask"}  # the trip count is the mask's sum: the mask is pinned, x is not
    assert mg.tensor_types["scans"][1] == (k, 1, D)
    assert not any(mg.op(i).op_type in ("Loop", "SequenceEmpty", "SequenceInsert", "ConcatFromSequence")
                   for i in range(mg.num_ops))
    # the specialised graph, run on other x with the same mask, equals the original model
    feeds = {**_feeds(k), "x": np.full((1, D), -1.25, np.float32)}
    want = _run(onnx.load(str(path)), feeds)
    got = _run(mg.model, feeds)
    for a, b in zip(want, got, strict=True):
        assert a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"read_op": "SequenceAt"}, "SequenceAt node"),
    ({"insert_pos": True}, "inserts at a position"),
    ({"cond_from_body": True}, "its body computes its condition"),
])
def test_what_is_not_rewritten_is_refused_in_one_line(tmp_path: Path, kwargs: dict[str, bool], message: str) -> None:
    path = _model(tmp_path / "m.onnx", **kwargs)
    with pytest.raises(InvalidModelError) as e:
        load_specialised(path, _feeds(2))
    assert message in str(e.value) and "\n" not in str(e.value)
