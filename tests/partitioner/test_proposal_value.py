"""A proposal is a value: ``propose`` returns the graph its partition is of and never changes its input.

Three models make the proposal loop edit the graph (each edit exact): a rank-5 model input an NPU
stage reads (read through a rank-4 view), a narrow tensor the capability's moves leave crossing
a boundary (a rank-4 view each way), and two outputs of an NPU stage holding the same values
(the second read as the first).  The loaded model's proto hashes the same before and after every
proposal, the proposal's graph is a new one, and the plan written from it reproduces the model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rkpart.grouping.views import RANK4_PREFIX, with_rank4_inputs, with_rank4_views
from rkpart.ir import ModelGraph
from rkpart.ir.load import with_merged_tensors
from rkpart.pipeline import PartitionConfig, load, propose, write_plan
from tests.partitioner.checks import assert_reproduces
from tests.partitioner.test_narrow_crossings import gate_model
from tests.partitioner.test_rank4_inputs import patch_embed_model
from tests.partitioner.test_same_value_outputs import cast_chain_model, twins_model


def _digest(mg: ModelGraph) -> str:
    return hashlib.sha256(mg.model.SerializeToString(deterministic=True)).hexdigest()


#: a model each edit of the proposal loop is made on, and the toolkit whose capability makes it
MODELS = {"rank5 input": (lambda p: patch_embed_model(p, 2), "2.3.0"), "narrow crossing": (gate_model, "2.3.0"),
          "value twins": (cast_chain_model, "2.5.0")}


@pytest.mark.slow  # 0.2-1.3 s each: a partition, a plan and its ONNX Runtime check
@pytest.mark.parametrize("case", list(MODELS))
def test_propose_never_changes_the_graph_it_is_given(tmp_path: Path, case: str) -> None:
    make, toolkit = MODELS[case]
    model = make(tmp_path / "m.onnx")
    loaded = load(model)
    graph, before = loaded.graph, _digest(loaded.graph)
    config = PartitionConfig(toolkit=toolkit)
    first = propose(loaded, "generic", config)
    assert _digest(loaded.graph) == before and loaded.graph is graph
    assert first.graph is not graph  # every case edits: views or a merged output
    edited = {n.name for n in first.graph.model.graph.node} - {n.name for n in graph.model.graph.node}
    removed = {n.name for n in graph.model.graph.node} - {n.name for n in first.graph.model.graph.node}
    assert edited or removed
    if case != "value twins":
        assert any(n.startswith(RANK4_PREFIX) for n in edited)
    # the same model proposed again gives the same proposal: nothing of the first stayed behind
    again = propose(loaded, "generic", config)
    assert _digest(again.graph) == _digest(first.graph) and again.partition == first.partition
    assert _digest(loaded.graph) == before
    plan = write_plan(loaded, first, tmp_path / "plan", config)
    assert_reproduces(plan, tmp_path / "plan", model)
    assert _digest(loaded.graph) == before


def test_the_graph_edits_return_new_graphs(tmp_path: Path) -> None:
    """Each edit the loop makes builds a new graph on a copy of the proto."""
    wide = load(patch_embed_model(tmp_path / "wide.onnx", 2)).graph
    narrow = load(gate_model(tmp_path / "narrow.onnx")).graph
    twins = load(twins_model(tmp_path / "twins.onnx", "casts")).graph
    for mg, edit in ((wide, with_rank4_inputs), (narrow, lambda g: with_rank4_views(g, ["g"])),
                     (twins, lambda g: with_merged_tensors(g, {"b": "a"}))):
        before = _digest(mg)
        out = edit(mg)
        assert out is not mg and out.model is not mg.model and _digest(mg) == before != _digest(out)
