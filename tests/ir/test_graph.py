"""The graph rkpart.ir builds: typed op data, constants kept out of the op DAG, the subgraph view."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.errors import InvalidModelError
from rkpart.ir import ModelGraph, OpNode, graph_of, load_model, nbytes, tensor_nbytes


def _model() -> onnx.ModelProto:
    """::

        W[160,128] ─ Transpose ─ Wt          (80 KiB: too large to fold, stays a constant op)
        x[1,128] ─ MatMul(·, Wt) ─ h[1,160] ─ Relu ─ r ─ Add(·, b) ─ y
                                    └─ Sigmoid ─ z
    """
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((160, 128)).astype(np.float32), "W")
    b = numpy_helper.from_array(np.ones(160, np.float32), "b")
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Transpose", ["W"], ["Wt"], name="transpose"),
        helper.make_node("MatMul", ["x", "Wt"], ["h"], name="matmul"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "b"], ["y"], name="add"),
        helper.make_node("Sigmoid", ["h"], ["z"], name="sigmoid"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [1, 128])],
                          [helper.make_tensor_value_info("y", f, [1, 160]),
                           helper.make_tensor_value_info("z", f, [1, 160])], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def mg(tmp_path: Path) -> ModelGraph:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    return load_model(path)


def _ops(mg: ModelGraph, *names: str) -> list[int]:
    by_name = {n.name: i for i, n in enumerate(mg.nodes)}
    return [by_name[n] for n in names]


def test_the_op_graph_holds_data_ops_with_typed_records(mg: ModelGraph) -> None:
    (t,) = _ops(mg, "transpose")
    assert mg.const_ops == {t}
    assert sorted(mg.op(i).name for i in mg.ops.nodes) == ["add", "matmul", "relu", "sigmoid"]
    mm, relu, sig = _ops(mg, "matmul", "relu", "sigmoid")
    rec = mg.op(mm)
    assert isinstance(rec, OpNode) and (rec.op_type, rec.inputs, rec.outputs) == ("MatMul", ("x", "Wt"), ("h",))
    assert sorted(mg.ops.successors(mm)) == sorted([relu, sig])
    assert not hasattr(mg, "nx")  # the bipartite graph nobody read is gone


def test_subgraph_view_boundary_closure_and_bytes(mg: ModelGraph) -> None:
    (t,) = _ops(mg, "transpose")
    sub = mg.subgraph(_ops(mg, "matmul"))
    assert (sub.inputs, sub.outputs) == (("x",), ("h",))
    assert sub.const_ops == (t,) and sub.const_tensors == {"Wt"}
    assert sub.weights == ("W",) and sub.weight_bytes == 160 * 128 * 4
    assert (sub.in_bytes, sub.out_bytes, sub.io_bytes) == (128 * 4, 160 * 4, 288 * 4)
    tail = mg.subgraph(_ops(mg, "add", "relu"))  # order does not matter
    assert (tail.inputs, tail.outputs, tail.weights) == (("h",), ("y",), ("b",))
    assert tail.const_ops == () and tail.weight_bytes == 160 * 4


def test_sinks_expose_only_what_nothing_inside_reads(mg: ModelGraph) -> None:
    ops = _ops(mg, "matmul", "relu")
    assert mg.subgraph(ops).outputs == ("h", "r")  # h is also read by sigmoid, outside
    assert mg.subgraph(ops, sinks=True).outputs == ("r",)


def test_constant_values_come_from_the_graph(mg: ModelGraph) -> None:
    wt = numpy_helper.to_array(mg.constant("Wt"))
    np.testing.assert_array_equal(wt, numpy_helper.to_array(mg.initializers["W"]).T)
    with pytest.raises(ValueError, match="not a constant"):
        mg.constant("h")


def test_graph_of_leaves_the_given_model_alone() -> None:
    """``Constant -> Reshape``: loading folds the Constant into an initializer, but in its own copy."""
    model = _model()
    shape = helper.make_node("Constant", [], ["s"], name="shape",
                             value=numpy_helper.from_array(np.array([160], np.int64)))
    model.graph.node.append(shape)
    model.graph.node.append(helper.make_node("Reshape", ["y", "s"], ["y1"], name="reshape"))
    model.graph.output.append(helper.make_tensor_value_info("y1", TensorProto.FLOAT, [160]))
    before = model.SerializeToString(deterministic=True)
    g = graph_of(model, "stage.onnx")
    assert "s" in g.initializers and "shape" not in {n.name for n in g.nodes}
    assert model.SerializeToString(deterministic=True) == before
    assert g.shape("y1") == (160,) and g.nbytes("y1") == 640


def test_one_byte_counter() -> None:
    assert nbytes("float16", (2, 3)) == 12
    assert nbytes("onnx:23", (4,)) == 16  # a type numpy cannot name counts 4 bytes per element
    assert tensor_nbytes(TensorProto.INT4, [3]) == 2  # packed: 12 bits round up to 2 bytes
    assert tensor_nbytes(TensorProto.FLOAT, [2, 5]) == 40
    with pytest.raises(InvalidModelError, match="unsupported element type string"):
        tensor_nbytes(TensorProto.STRING, [1], "tensor 's'")
    with pytest.raises(InvalidModelError, match="negative dimension"):
        tensor_nbytes(TensorProto.FLOAT, [2, -1])


def test_nonzero_of_a_constant_mask_folds_to_a_static_shape(tmp_path: Path) -> None:
    """``x[:, mask]`` with ``mask`` a Constant (TorchScript: ``NonZero(Constant)`` -> ``Gather``)::

        mask (Constant, bool[6]) ─ NonZero ─ Transpose ─ Squeeze ─┐
        x [1, 6, 4] ──────────────────────────────────────────────── Gather(axis 1) ─ y [1, 3, 4]

    The indices depend on the constant's values only: loading folds them, so every shape is
    static (before: exit 3, "the shape ... depends on values")."""
    mask = np.array([True, False, True, False, False, True])
    nodes = [
        helper.make_node("Constant", [], ["mask"], value=numpy_helper.from_array(mask)),
        helper.make_node("NonZero", ["mask"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["nzt"], perm=[1, 0]),
        helper.make_node("Squeeze", ["nzt", "one"], ["idx"]),
        helper.make_node("Gather", ["x", "idx"], ["y"], axis=1),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", 4])],
                          [numpy_helper.from_array(np.array([1], dtype=np.int64), "one")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    mg = load_model(path)
    assert mg.shape("y") == (1, 3, 4)
    assert np.array_equal(numpy_helper.to_array(mg.constant("idx")), [0, 2, 5])


def test_chained_chunks_fold_however_deep(tmp_path: Path) -> None:
    """Ten ``x[:, : x.shape[1] // 2]`` in a row, as TorchScript writes ``chunk()``::

        x ─ Shape ─ Gather(1) ─ Div(2) ─ Unsqueeze ─┐
        x ──────────────────────────────────────── Slice(axis 1) ─ x' ─ (again, 10 times)

    ONNX shape inference does not carry values through ``Div``, so each level's bounds fold
    only once the level before is folded: a round each.  Loading folds until nothing is left
    (it stopped after 6 rounds, and the model was refused as value-dependent)."""
    nodes, inits, t = [], [numpy_helper.from_array(np.array(v, dtype=np.int64), n)
                           for n, v in (("one", 1), ("two", 2), ("zero1", [0]), ("ax1", [1]), ("ax0", [0]))], "x"
    for k in range(10):
        nodes += [helper.make_node("Shape", [t], [f"s{k}"]),
                  helper.make_node("Gather", [f"s{k}", "one"], [f"g{k}"], axis=0),
                  helper.make_node("Div", [f"g{k}", "two"], [f"d{k}"]),
                  helper.make_node("Unsqueeze", [f"d{k}", "ax0"], [f"e{k}"]),
                  helper.make_node("Slice", [t, "zero1", f"e{k}", "ax1"], [f"x{k}"])]
        t = f"x{k}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                          [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, "n"])], inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert load_model(path).shape(t) == (1, 1)


@pytest.mark.parametrize(("dim", "expect"), [(1, (2, 4)), (3, (2, 3, 4))])
def test_an_if_whose_condition_folds_is_its_branch(tmp_path: Path, dim: int, expect: tuple[int, ...]) -> None:
    """``x.squeeze(1)`` of a dim TorchScript cannot prove is 1 (Helios)::

        x[2, n, 4] ─ Shape ─ Gather(1) ─ Equal(1) ─ If ─ then: Squeeze(x, 1) ─ y
                                                          else: Identity(x)

    The condition depends on shapes only: loading takes the branch it chooses, so ``y`` has a
    static shape (before: exit 3, "depends on values ... If node", and ``--inputs`` asked for);
    the loaded graph computes what the model does under ONNX Runtime."""
    import onnxruntime as ort

    then = helper.make_graph([helper.make_node("Squeeze", ["x", "ax1"], ["sq"])], "then", [],
                             [helper.make_tensor_value_info("sq", TensorProto.FLOAT, ["a", "b"])],
                             [numpy_helper.from_array(np.array([1], dtype=np.int64), "ax1")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["same"])], "else", [],
                              [helper.make_tensor_value_info("same", TensorProto.FLOAT, ["a", "b", "c"])])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["d"], axis=0),
             helper.make_node("Equal", ["d", "one"], ["c"]),
             helper.make_node("If", ["c"], ["y0"], then_branch=then, else_branch=other),
             helper.make_node("Relu", ["y0"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"d{k}" for k in expect])],
                          [numpy_helper.from_array(np.array(1, dtype=np.int64), "one")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    mg = load_model(path, input_shapes={"x": (2, dim, 4)})  # the exporter's dynamic axis, made static
    assert mg.shape("y") == expect
    assert "If" not in {mg.op(i).op_type for i in range(mg.num_ops)}
    from rkpart.pipeline import partition
    from rkpart.runtime.executor import run_plan

    x = np.random.default_rng(0).standard_normal((2, dim, 4)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    assert ref.shape == expect
    plan = partition(path, tmp_path / "plan", "generic", input_shapes={"x": (2, dim, 4)})
    assert np.array_equal(run_plan(plan, tmp_path / "plan", {"x": x})["y"], ref)


def test_a_squeeze_of_a_dim_that_is_not_1_loads_as_torch_meant_it(tmp_path: Path) -> None:
    """``x.squeeze(1)`` of a dim of 16 is a no-op in torch; the dynamo exporter still writes a Squeeze,
    which ONNX Runtime refuses (PixArt's adaln_single, LTX-2).  Loading drops the axes that are not 1
    (an Identity when none is left), so the plan runs and computes what torch does."""
    nodes = [helper.make_node("Squeeze", ["x", "ax"], ["s"], name="no_op_squeeze"),  # [1, 16, 4]: axis 1 is 16
             helper.make_node("Squeeze", ["s", "ax0"], ["t"], name="half_squeeze"),  # axes 0 (is 1) and 1 (16)
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "ax"),
             numpy_helper.from_array(np.array([0, 1], np.int64), "ax0")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 4])], inits,
                          # the exporter types the outputs as torch computed them
                          value_info=[helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 16, 4]),
                                      helper.make_tensor_value_info("t", TensorProto.FLOAT, [16, 4])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    mg = load_model(path)
    ops = {mg.op(i).name: mg.op(i) for i in range(mg.num_ops)}
    assert ops["no_op_squeeze"].op_type == "Identity" and mg.shape("s") == (1, 16, 4)
    assert ops["half_squeeze"].op_type == "Squeeze" and mg.shape("t") == (16, 4)
    assert numpy_helper.to_array(mg.constant(ops["half_squeeze"].inputs[1])).tolist() == [0]
    from rkpart.pipeline import partition
    from rkpart.runtime.executor import run_plan

    x = np.random.default_rng(0).standard_normal((1, 16, 4)).astype(np.float32)
    plan = partition(path, tmp_path / "plan", "generic")
    assert np.array_equal(run_plan(plan, tmp_path / "plan", {"x": x})["y"], np.maximum(x[0], 0))
