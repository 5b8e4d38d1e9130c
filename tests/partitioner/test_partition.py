"""Partitioning the bundled Anima-style example: stage counts, numerics, valid standalone stages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from rkpart.pipeline import PartitionConfig, partition
from rkpart.plan.plan import Plan, load_plan
from rkpart.runtime.executor import random_inputs, run_model, run_plan
from rkpart.validation.metrics import compare


def _reproduces(plan: Plan, folder: Path, model: Path, seed: int = 0) -> None:
    feeds = random_inputs(plan.tensors, plan.inputs, seed)
    ref = run_model(model, feeds, plan.outputs)
    got = run_plan(plan, folder, feeds)
    for name in plan.outputs:
        m = compare(got[name], ref[name])
        assert m.cosine >= 0.999999, (name, m)
        assert m.max_abs <= 1e-5 * m.ref_max_abs, (name, m)
        assert m.nan == 0 and m.inf == 0


def _npu_per_block(plan: Plan) -> dict[int, int]:
    counts: dict[int, int] = {}
    for s in plan.npu_stages:
        for b in s.blocks:
            counts[b] = counts.get(b, 0) + 1
    return counts


def test_split_has_three_npu_stages_per_block(plans, example_model):
    plan, folder = plans["split"]
    assert len(plan.blocks) == 2
    assert _npu_per_block(plan) == {0: 3, 1: 3}
    assert [s.region for s in plan.npu_stages] == ["attn", "xattn", "ffn"] * 2
    # AdaLN, gates and residual adds are on the host by default
    host_kinds = "+".join(s.kind for s in plan.host_stages)
    assert "adaln" in host_kinds and "residual" in host_kinds
    _reproduces(plan, folder, example_model)


def test_fused_has_one_npu_stage_per_block(plans, example_model):
    plan, folder = plans["fused"]
    assert _npu_per_block(plan) == {0: 1, 1: 1}
    assert all(s.region == "block" for s in plan.npu_stages)
    # nothing of a block is left on the host: host stages only hold prologue/epilogue work
    assert all(s.block is None for s in plan.host_stages)
    _reproduces(plan, folder, example_model)


def test_split_adaln_npu_moves_adaln_inside(plans, example_model):
    plan, folder = plans["split_npu"]
    assert _npu_per_block(plan) == {0: 3, 1: 3}
    assert not any("adaln" in s.kind.split("+") for s in plan.host_stages)
    assert all(s.kind.endswith("+adaln") for s in plan.npu_stages)
    _reproduces(plan, folder, example_model)


@pytest.mark.parametrize(("opts", "per_block"), [
    ({"adaln": "npu", "residual": "npu"}, 3),
    ({"adaln": "npu", "modulation": "npu"}, 3),  # each branch's modulation joins its stage
    ({"modulation": "npu"}, 4),  # AdaLN on the host needs the modulation first: its own NPU stage
])
def test_split_options_reproduce(tmp_path, example_model, opts, per_block):
    plan = partition(example_model, tmp_path / "p", "split", **opts)
    assert _npu_per_block(plan) == {0: per_block, 1: per_block}
    _reproduces(plan, tmp_path / "p", example_model, seed=3)


def test_fused_runs_of_blocks(tmp_path, example_model):
    plan = partition(example_model, tmp_path / "p", "fused", blocks_per_stage=2)
    assert len(plan.npu_stages) == 1 and plan.npu_stages[0].blocks == (0, 1)
    _reproduces(plan, tmp_path / "p", example_model)


def test_stages_are_standalone_valid_models(plans):
    plan, folder = plans["split"]
    opset = {o.domain: o.version for o in onnx.load(str(folder / plan.stages[0].file), load_external_data=False)
             .opset_import}
    for s in plan.stages:
        path = folder / s.file
        onnx.checker.check_model(str(path), full_check=True)
        m = onnx.load(str(path))
        assert {o.domain: o.version for o in m.opset_import} == opset
        assert [i.name for i in m.graph.input] == list(s.inputs)
        assert [o.name for o in m.graph.output] == list(s.outputs)
        for vi in [*m.graph.input, *m.graph.output, *m.graph.value_info]:
            dims = vi.type.tensor_type.shape.dim
            assert all(d.HasField("dim_value") for d in dims), (s.id, vi.name)
        # boundary tensors keep the exporter's names, so stages can be traced back to the model
        for t in s.inputs:
            assert t in plan.tensors


def test_weights_go_to_external_data_above_threshold(tmp_path, example_model):
    plan = partition(example_model, tmp_path / "p", "split", config=PartitionConfig(external_threshold=4096))
    stage = next(s for s in plan.npu_stages if s.region == "ffn")
    m = onnx.load(str(tmp_path / "p" / stage.file), load_external_data=False)
    ext = [t for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    inline = [t for t in m.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    assert ext, "large FFN weights must be external"
    assert all(len(t.raw_data) < 4096 for t in inline)
    assert (tmp_path / "p" / (stage.file + ".data")).is_file()
    assert stage.weight_bytes == sum(int(np.prod(t.dims)) * 4 for t in m.graph.initializer)


def test_plan_roundtrip_and_schema(plans):
    _, folder = plans["split"]
    _, f2 = load_plan(folder / "plan.json")
    assert f2 == folder
    data = json.loads((folder / "plan.json").read_text())
    assert data["format"] == "rkpart-plan" and data["version"] == 1
    assert Plan.from_json(data).to_json() == data
    ids = [s["id"] for s in data["stages"]]
    assert ids[0] == "prologue" and ids[-1] == "epilogue"
    assert all(s["sha256"] and s["weight_bytes"] >= 0 for s in data["stages"])


def test_partition_is_deterministic(tmp_path, example_model):
    a = partition(example_model, tmp_path / "a", "split")
    b = partition(example_model, tmp_path / "b", "split")
    assert a.to_json() == b.to_json()
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


@pytest.mark.slow
def test_simplify_keeps_outputs_and_shrinks_graph(tmp_path, example_model, plans):
    plan = partition(example_model, tmp_path / "p", "split", config=PartitionConfig(simplify=True))
    base, _ = plans["split"]
    before = {s.id: s.num_nodes for s in base.npu_stages}
    after = {s.id: s.num_nodes for s in plan.npu_stages}
    assert all(after[k] <= before[k] for k in before)
    assert sum(after.values()) < sum(before.values())
    feeds = random_inputs(plan.tensors, plan.inputs, 1)
    ref = run_model(example_model, feeds, plan.outputs)
    got = run_plan(plan, tmp_path / "p", feeds)
    assert compare(got["sample"], ref["sample"]).cosine >= 0.999999
