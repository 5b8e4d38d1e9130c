"""Cutting a model into valid, statically shaped candidate graphs (no toolkit needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from rkpart.triage.reduce import Cutter, graph_hash


def _ops(sub: Cutter, *names: str) -> list[int]:
    by_name = {sub.mg.nodes[i].name: i for i in sub.ops}
    return [by_name[n] for n in names]


def _run(model: onnx.ModelProto) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    return [np.asarray(o) for o in sess.run(None, feeds)]


def test_cut_producers_become_static_inputs_and_unused_weights_are_dropped(adaln_chain: Path) -> None:
    sub = Cutter(adaln_chain)
    cand = sub.extract(_ops(sub, "mul", "add_shift", "q"))
    assert cand is not None
    g = cand.model.graph
    assert [n.name for n in g.node] == ["mul", "add_shift", "q"]
    # n (LayerNorm output), s1 and shift were produced by dropped ops: now inputs, shapes from the full model
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in g.input}
    assert shapes == {"n": [1, 8, 16], "s1": [1, 16], "shift": [1, 16]}
    assert [o.name for o in g.output] == ["q"]
    assert [i.name for i in g.initializer] == ["w_q"]  # w_in, w_mod, gamma, ... are gone
    onnx.checker.check_model(cand.model, full_check=True)
    assert _run(cand.model)[0].shape == (1, 8, 16)


def test_removing_a_middle_op_exposes_its_input_as_output(adaln_chain: Path) -> None:
    sub = Cutter(adaln_chain)
    keep = [i for i in sub.ops if sub.mg.nodes[i].name != "mul"]
    cand = sub.extract(keep)
    assert cand is not None
    g = cand.model.graph
    assert "mul" not in [n.name for n in g.node]
    assert "m" in [i.name for i in g.input]  # mul's result is now fed from outside
    outs = {o.name for o in g.output}
    assert {"n", "s1", "y", "z"} <= outs  # n and s1 lost their only reader
    onnx.checker.check_model(cand.model, full_check=True)
    assert len(_run(cand.model)) == len(g.output)


def test_extraction_is_deterministic_and_the_full_set_reproduces_the_model(adaln_chain: Path) -> None:
    sub = Cutter(adaln_chain)
    a = sub.extract(sub.ops)
    b = Cutter(adaln_chain).extract(reversed(sub.ops))
    assert a is not None and b is not None
    assert a.digest == b.digest == graph_hash(a.model)
    assert a.num_nodes == 13
    full = onnx.load(adaln_chain)
    want = _run(full)
    got = _run(a.model)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_no_candidate_without_inputs_or_ops(adaln_chain: Path) -> None:
    sub = Cutter(adaln_chain)
    assert sub.extract([]) is None


def test_constant_ops_are_folded_and_cut_integer_tensors_are_frozen(tmp_path: Path) -> None:
    """::

        x[2,6] ─ Relu ─ r ─ Reshape(c) ─ y[3,4]        c = Constant([3, 4]): folded, not an op
        x ─ ArgMax ─ am (int64, data-dependent) ─ Gather(r, am, axis=1) ─ g[2,2]
    """
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("ArgMax", ["x"], ["am"], name="argmax", axis=1, keepdims=0),
        helper.make_node("Gather", ["r", "am"], ["g"], name="gather", axis=1),
        helper.make_node("Constant", [], ["c"], name="const",
                         value=numpy_helper.from_array(np.array([3, 4], np.int64))),
        helper.make_node("Reshape", ["r", "c"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2, 6])],
                              [helper.make_tensor_value_info("y", f, [3, 4]),
                               helper.make_tensor_value_info("g", f, [2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    sub = Cutter(path)
    assert "const" not in [sub.mg.nodes[i].name for i in sub.ops]  # not a reducible op
    cand = sub.extract(_ops(sub, "relu", "reshape"))
    assert cand is not None
    assert [n.name for n in cand.model.graph.node] == ["relu", "reshape"]
    assert numpy_helper.to_array(next(i for i in cand.model.graph.initializer if i.name == "c")).tolist() == [3, 4]
    # Dropping argmax cuts an int64 tensor: it is frozen to its value, not made an (int) input.
    cut = sub.extract(_ops(sub, "relu", "gather"))
    assert cut is not None
    assert [i.name for i in cut.model.graph.input] == ["x"]
    frozen = {i.name: numpy_helper.to_array(i) for i in cut.model.graph.initializer}
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)  # the seeded freeze run's input
    np.testing.assert_array_equal(frozen["am"], np.argmax(x, axis=1))
    onnx.checker.check_model(cut.model, full_check=True)
