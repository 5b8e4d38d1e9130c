"""Integer preprocessing of model inputs stays off the NPU; shape-only reads keep nothing alive.

* Input index work (:meth:`rkpart.ir.ModelGraph.input_index_ops`): ops computing only on
  integer or boolean model inputs -- a class label's embedding ``Gather`` (DiT), a caption
  mask's ``Cast -> Reshape`` (Lumina2).  rknn-toolkit2 runs them on the CPU inside an NPU
  stage; the built-in strategies move them to the host prologue, so only their results (a
  float embedding row, a boolean mask) enter NPU stages.  A boolean turned into floats
  (``Where(mask, 0, -inf)``) stays with the attention that reads it.
* Dead ops after folding: TorchScript reads ``x.shape`` of a slice of an intermediate as
  ``Slice -> Shape``; the folded ``Shape`` leaves the ``Slice`` with no reader, and loading
  drops it (Wan's RoPE ``ScatterND`` chain was pulled across a cut by it).

Every plan must still reproduce its whole model under ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.auto import candidate_variants
from rkpart.ir import load_model
from rkpart.pipeline import load, partition, propose
from rkpart.plan.plan import Plan
from rkpart.runtime.executor import random_inputs, run_model
from tests.partitioner.checks import assert_reproduces

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _index_model(path: Path, tokens: int | str = 6) -> Path:
    """``x (1, 6, 8)`` float, ``label (1,)`` int64, ``mask (1, 6)`` int64: an embedding row and an
    additive key mask join float work; a bool computed from ``x`` (no model input) is not index
    work; a ``Slice`` of ``x``'s projection is read only by ``Shape``.  ``tokens="n"`` makes the
    token axis of ``x`` symbolic (a dynamic-axes export)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "table"),
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1, 1, 1, 6], np.int64), "mask_shape"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(-1e4, np.float32), "neg"),
        numpy_helper.from_array(np.array([0], np.int64), "s0"),
        numpy_helper.from_array(np.array([3], np.int64), "s3"),
        numpy_helper.from_array(np.array([2], np.int64), "ax2"),
    ]
    mk = helper.make_node
    nodes = [
        mk("Gather", ["table", "label"], ["emb"], name="label_gather"),  # index work -> float
        mk("Add", ["x", "emb"], ["h"], name="add_emb"),
        mk("MatMul", ["h", "w"], ["q"], name="proj"),
        mk("Slice", ["q", "s0", "s3", "ax2"], ["q_part"], name="dead_slice"),  # read only by Shape
        mk("Shape", ["q_part"], ["q_part_shape"], name="shape_of_slice"),
        mk("Cast", ["mask"], ["mask_b"], to=TensorProto.BOOL, name="mask_cast"),  # index work
        mk("Reshape", ["mask_b", "mask_shape"], ["mask_4d"], name="mask_reshape"),  # index work
        mk("Where", ["mask_4d", "zero", "neg"], ["mask_add"], name="mask_where"),  # bool -> float: stays
        mk("Transpose", ["q"], ["k"], perm=[0, 2, 1], name="k_t"),
        mk("MatMul", ["q", "k"], ["s"], name="scores"),
        mk("Unsqueeze", ["s", "s0"], ["s4"], name="s4"),
        mk("Add", ["s4", "mask_add"], ["s_masked"], name="add_mask"),
        mk("Softmax", ["s_masked"], ["p"], axis=-1, name="softmax"),
        mk("Greater", ["x", "zero"], ["pos"], name="pos"),  # bool from float data: not index work
        mk("Where", ["pos", "x", "zero"], ["relu_x"], name="relu_where"),
        mk("Identity", ["relu_x"], ["relu_out"], name="relu_out"),
        # the Shape's value is used (zeros of the slice's shape), the Slice's data is not
        mk("ConstantOfShape", ["q_part_shape"], ["zeros"], name="zeros"),
        mk("Slice", ["relu_x", "s0", "s3", "ax2"], ["rx3"], name="rx3"),
        mk("Add", ["rx3", "zeros"], ["out3"], name="out3"),
    ]
    graph = helper.make_graph(
        nodes, "index", [helper.make_tensor_value_info("x", F, [1, tokens, 8]),
                         helper.make_tensor_value_info("label", I64, [1]),
                         helper.make_tensor_value_info("mask", I64, [1, 6])],
        [helper.make_tensor_value_info("p", F, [1, 1, tokens, 6]),
         helper.make_tensor_value_info("relu_out", F, [1, tokens, 8]),
         helper.make_tensor_value_info("out3", F, [1, tokens, 3])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _names(mg_nodes: list[onnx.NodeProto], ops: frozenset[int] | set[int]) -> set[str]:
    return {mg_nodes[i].name for i in ops}


def test_index_work_is_what_computes_only_on_integer_model_inputs(tmp_path: Path) -> None:
    mg = load_model(_index_model(tmp_path / "m.onnx"))
    assert _names(mg.nodes, mg.input_index_ops()) == {"label_gather", "mask_cast", "mask_reshape"}
    # closed upwards: every data op an index op reads from is index work too
    idx = mg.input_index_ops()
    assert all(p in idx for i in idx for p in mg.ops.predecessors(i))


def test_load_drops_the_slice_only_a_folded_shape_read(tmp_path: Path) -> None:
    path = _index_model(tmp_path / "m.onnx")
    mg = load_model(path)
    names = {n.name for n in mg.nodes}
    assert "dead_slice" not in names and "shape_of_slice" not in names
    assert "proj" in names and "scores" in names  # what the outputs need stays
    # every remaining data op is read by another op or is a model output
    for i in mg.ops.nodes:
        assert any(mg.consumers.get(t) or t in mg.outputs for t in mg.nodes[i].output), mg.op_label(i)
    # the pruned model computes what the file computes
    pruned = tmp_path / "pruned.onnx"
    onnx.save(mg.model, pruned)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 6, 8)).astype(np.float32),
             "label": np.array([3], np.int64), "mask": np.array([[1, 1, 0, 1, 0, 1]], np.int64)}
    ref, got = run_model(path, feeds), run_model(pruned, feeds)
    for name in ("p", "relu_out", "out3"):
        np.testing.assert_array_equal(got[name], ref[name])


def test_a_shape_read_resolved_by_input_shapes_keeps_nothing_alive(tmp_path: Path) -> None:
    """A dynamic-axes export: the ``Shape`` folds only once ``input_shapes`` fix the token axis."""
    path = _index_model(tmp_path / "dyn.onnx", tokens="n")
    mg = load_model(path, input_shapes={"x": (1, 6, 8)})
    names = {n.name: n.op_type for n in mg.nodes}
    assert "dead_slice" not in names
    assert names.get("shape_of_slice") in (None, "Constant")
    assert all(n.op_type != "Shape" for n in mg.nodes)
    plan = partition(path, tmp_path / "plan", "generic", input_shapes={"x": (1, 6, 8)})
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 6, 8)).astype(np.float32),
             "label": np.array([2], np.int64), "mask": np.array([[0, 1, 1, 1, 0, 1]], np.int64)}
    assert_reproduces(plan, tmp_path / "plan", path, feeds)


def test_generic_npu_segments_leave_index_work_to_the_host(tmp_path: Path) -> None:
    path = _index_model(tmp_path / "m.onnx")
    loaded = load(path)
    part = propose(loaded, "generic")
    idx = loaded.graph.input_index_ops()
    assert all(not (g.ops & idx) for g in part.partition.groups if g.device == "npu")
    assert any(g.device == "npu" for g in part.partition.groups)
    assert any("moved from NPU stages to the host prologue" in n for n in part.partition.notes)
    plan = partition(path, tmp_path / "plan", "generic")
    _no_npu_stage_reads(plan, tmp_path / "plan", {"label", "mask"})
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 6, 8)).astype(np.float32),
             "label": np.array([7], np.int64), "mask": np.array([[1, 0, 1, 1, 1, 0]], np.int64)}
    assert_reproduces(plan, tmp_path / "plan", path, feeds)


def _no_npu_stage_reads(plan: Plan, folder: Path, tensors: set[str]) -> None:
    """No NPU stage has an integer input, nor reads any of ``tensors``."""
    for s in plan.npu_stages:
        m = onnx.load(str(folder / s.file), load_external_data=False)
        assert not tensors & set(s.inputs), (s.id, s.inputs)
        for vi in m.graph.input:
            assert vi.type.tensor_type.elem_type not in (TensorProto.INT64, TensorProto.INT32), \
                (s.id, vi.name)


# -- real diffusers exports (cached under ~/.cache/rkpart/test-exports) -----------------------


def _export(family: str, exporter: str) -> Path:
    from tests.models.diffusers_families import cached_export, missing_dependencies

    if missing_dependencies():
        pytest.skip(f"not installed: {missing_dependencies()}")
    return cached_export(family, exporter)


@pytest.mark.export
@pytest.mark.parametrize("strategy", ["fused", "split"])
def test_dit_class_label_gather_runs_on_the_host_and_is_costed(tmp_path: Path, strategy: str) -> None:
    """Block 1's own class-label embedding (block 0's is shared with the final layer)."""
    model = _export("dit", "torchscript")
    loaded = load(model)
    mg, disc = loaded.graph, loaded.discovery()
    gathers = {i for i in mg.input_index_ops() if mg.nodes[i].op_type == "Gather"}
    assert len(gathers) == 2
    own = {i for i in gathers if i in disc.blocks[1].ops}
    assert len(own) == 1
    plan = partition(model, tmp_path / "plan", strategy)
    _no_npu_stage_reads(plan, tmp_path / "plan", {"class_labels", "timestep"})
    host_ops = {n.name for s in plan.stages if s.device == "host"
                for n in onnx.load(str(tmp_path / "plan" / s.file), load_external_data=False).graph.node}
    assert {mg.nodes[i].name for i in gathers} <= host_ops
    assert_reproduces(plan, tmp_path / "plan", model)
    # the cost model still sees the Gather as block 1's host work
    from rkpart.cost_model.candidates import candidates_from

    variants = [v for v in candidate_variants(mg, disc, plugins_too=False) if v[0] == strategy]
    (cand,) = candidates_from(mg, disc, variants)[1]
    host = frozenset().union(*(g.ops for g in cand.groups if g.device == "host"))
    npu = frozenset().union(*(g.ops for g in cand.groups if g.device == "npu"))
    assert own <= host and not own & npu and cand.host is not None
    if strategy == "fused":  # a run of fused blocks is costed like the fused strategy's stages
        variants = candidate_variants(mg, disc, max_run=2, plugins_too=False)
        run = next(c for c in candidates_from(mg, disc, variants)[0] if c.id == "fused-x2")
        host = frozenset().union(*(g.ops for g in run.groups if g.device == "host"))
        npu = frozenset().union(*(g.ops for g in run.groups if g.device == "npu"))
        assert own <= host and not own & npu and run.host is not None


@pytest.mark.export
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_lumina2_caption_mask_is_prepared_on_the_host(tmp_path: Path, exporter: str) -> None:
    """The export takes the caption mask as a graph input (rkpart.export's ``real_rope_lumina2``): its
    lengths (``ReduceSum``), the joint sequence's key mask (``Less``, ``Concat``), the image tokens' RoPE
    rows at the caption length (``Gather``) and each attention's ``Cast -> Reshape`` are index work."""
    model = _export("lumina2", exporter)
    mg = load(model).graph
    idx = mg.input_index_ops()
    gather = "GatherND" if exporter == "dynamo" else "Gather"
    assert {mg.nodes[i].op_type for i in idx} == {"Cast", "Reshape", "ReduceSum", "Unsqueeze", "Less", "Concat",
                                                   gather}
    # what meets the activations is boolean key masks and the gathered float RoPE rows, nothing else
    leaving = {t for i in idx for t in mg.nodes[i].output if any(j not in idx for j in mg.consumers.get(t, ()))}
    assert leaving and all(mg.dtype(t) == "bool" or mg.nodes[mg.producer[t]].op_type == gather for t in leaving)
    for strategy in ("split", "fused"):
        folder = tmp_path / strategy
        plan = partition(model, folder, strategy)
        _no_npu_stage_reads(plan, folder, {"encoder_attention_mask"})
        feeds = random_inputs(plan.tensors, plan.inputs)
        feeds["encoder_attention_mask"] = np.array([[1, 1, 1, 0, 0, 0]], np.int64)  # a padded caption
        assert_reproduces(plan, folder, model, feeds)


@pytest.mark.export
def test_wan_rope_scatter_chain_stays_inside_its_stage(tmp_path: Path) -> None:
    """The TorchScript export's ``Slice -> Shape`` read of the first ScatterND is gone: no
    ScatterND result crosses a stage boundary."""
    model = _export("wan", "torchscript")
    for strategy in ("split", "fused"):
        folder = tmp_path / strategy
        plan = partition(model, folder, strategy)
        mg = load(model).graph
        scattered = {t for n in mg.nodes if n.op_type == "ScatterND" for t in n.output}
        assert scattered
        crossing = {t for s in plan.stages for t in s.inputs} & scattered
        assert not crossing, crossing
        assert_reproduces(plan, folder, model)
