"""The custom strategy: blocks, regions and explicit cuts from a spec; schema errors are clear."""

from __future__ import annotations

import json

import pytest

from rkpart.errors import SpecError
from rkpart.pipeline import partition
from rkpart.runtime.executor import random_inputs, run_model, run_plan
from rkpart.validation.metrics import compare


def _write(tmp_path, spec, suffix=".yaml"):
    p = tmp_path / f"spec{suffix}"
    if suffix == ".json":
        p.write_text(json.dumps(spec))
    else:
        import yaml

        p.write_text(yaml.safe_dump(spec))
    return p


def _check(plan, folder, model):
    feeds = random_inputs(plan.tensors, plan.inputs, 0)
    ref = run_model(model, feeds, plan.outputs)
    got = run_plan(plan, folder, feeds)
    m = compare(got["sample"], ref["sample"])
    assert m.cosine >= 0.999999 and m.max_abs <= 1e-5 * m.ref_max_abs


def test_custom_blocks_regions_and_rest(tmp_path, example_model):
    spec = _write(tmp_path, {
        "version": 1,
        "rest": "split",
        "stages": [
            {"id": "b00-whole", "device": "npu", "blocks": [0]},
            # two branches in one stage need the residual between them inside it too
            {"id": "b01.attn-xattn", "device": "npu", "block": 1, "regions": ["attn", "xattn"],
             "include": ["adaln", "residual"]},
        ],
    })
    plan = partition(example_model, tmp_path / "p", "custom", spec=spec)
    ids = [s.id for s in plan.npu_stages]
    assert ids == ["b00-whole", "b01.attn-xattn", "b01.ffn"]
    _check(plan, tmp_path / "p", example_model)


def test_custom_cut_by_tensors(tmp_path, example_model):
    # everything from block 0's first residual output to block 1's first residual output
    spec = _write(tmp_path, {
        "version": 1,
        "rest": "host",
        "stages": [{"id": "middle", "device": "npu",
                    "cut": {"inputs": ["/transformer_blocks.0/Add_output_0"],
                            "outputs": ["/transformer_blocks.1/Add_output_0"]}}],
    }, ".json")
    plan = partition(example_model, tmp_path / "p", "custom", spec=spec)
    assert [s.id for s in plan.npu_stages] == ["middle"]
    assert "/transformer_blocks.0/Add_output_0" in plan.npu_stages[0].inputs
    _check(plan, tmp_path / "p", example_model)


@pytest.mark.parametrize(("spec", "message"), [
    ({"version": 2, "stages": [{"id": "a", "blocks": [0]}]}, "at version"),
    ({"version": 1, "stages": []}, "at stages"),
    ({"version": 1, "stages": [{"id": "a"}]}, "exactly one of"),
    ({"version": 1, "stages": [{"id": "a", "blocks": [0], "cut": {"inputs": ["x"], "outputs": ["y"]}}]},
     "exactly one of"),
    ({"version": 1, "stages": [{"id": "a", "blocks": [7]}]}, "block 7 does not exist"),
    ({"version": 1, "stages": [{"id": "a", "block": 0, "regions": ["mlp"]}]}, "no region 'mlp'"),
    ({"version": 1, "stages": [{"id": "a", "blocks": [0]}, {"id": "a", "blocks": [1]}]}, "used twice"),
    ({"version": 1, "stages": [{"id": "a", "cut": {"inputs": ["nope"], "outputs": ["sample"]}}]},
     "cut tensor 'nope'"),
])
def test_invalid_specs_are_refused(tmp_path, example_model, spec, message):
    with pytest.raises(SpecError, match=message):
        partition(example_model, tmp_path / "p", "custom", spec=_write(tmp_path, spec))
    assert not (tmp_path / "p").exists()


def test_two_branches_without_their_residual_is_a_cycle(tmp_path, example_model):
    spec = _write(tmp_path, {"version": 1, "stages": [
        {"id": "ax", "block": 1, "regions": ["attn", "xattn"], "include": ["adaln"]}]})
    # the message names the tensors that cross between the stages of the cycle
    with pytest.raises(SpecError, match=r"cycle: ax -\([^)?]+\)-> b01\.attn\.residual -\([^)?]+\)-> ax"):
        partition(example_model, tmp_path / "p", "custom", spec=spec)


def test_cyclic_grouping_is_refused(tmp_path, example_model):
    # attn of block 0 and ffn of block 1 in one stage, xattn of block 0 in another: each needs the other
    spec = _write(tmp_path, {"version": 1, "rest": "split", "stages": [
        {"id": "x", "block": 0, "regions": ["attn"]},
        {"id": "y", "blocks": [0, 1]},
    ]})
    # overlapping stages: the first one wins its ops, the rest of block 0/1 forms y; y feeds x and x feeds y
    with pytest.raises(SpecError, match="cycle"):
        partition(example_model, tmp_path / "p", "custom", spec=spec)
