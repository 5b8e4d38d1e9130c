"""The one-line summaries ``rkpart partition`` prints say what the plan and the discovery hold.

Issue 53: a 5-block plan of one fused block and two fused pairs was summarised as
``NPU stages=3 (1 per block)``, and the discovery line gave block 0's regions as every block's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rkpart.pipeline import load, partition
from rkpart.plan.plan import Plan


def test_split_and_fused_summaries_count_stages_per_block(plans: dict[str, tuple[Plan, Path]]) -> None:
    split, _ = plans["split"]
    fused, _ = plans["fused"]
    assert split.stage_shape() == "3 per block"
    assert "blocks=2  NPU stages=6 (3 per block)" in split.render_summary("p")
    assert fused.stage_shape() == "1 per block"


@pytest.mark.slow  # writes a plan
def test_a_run_of_fused_blocks_is_one_stage_for_two_blocks(tmp_path: Path, example_model: Path) -> None:
    plan = partition(example_model, tmp_path / "x2", "fused", blocks_per_stage=2)
    assert len(plan.npu_stages) == 1
    assert "blocks=2  NPU stages=1 (1 per 2 blocks)" in plan.render_summary("p")  # was "(1 per block)"


def test_mixed_covers_are_counted_per_kind(plans: dict[str, tuple[Plan, Path]]) -> None:
    """A plan whose block 0 is split and block 1 fused, as ``auto`` may choose: each kind with its blocks."""
    split, _ = plans["split"]
    fused, _ = plans["fused"]
    mixed = dataclasses.replace(split, stages=(*(s for s in split.stages if s.blocks != (1,) and s.block != 1),
                                               *(s for s in fused.npu_stages if 1 in s.blocks)))
    assert mixed.stage_shape() == "3 per block for 1 block, 1 per block for 1 block"
    no_npu = dataclasses.replace(split, stages=split.host_stages)
    assert no_npu.stage_shape() == "none"


def test_the_discovery_line_gives_each_blocks_own_regions(example_model: Path) -> None:
    said: list[str] = []
    model = load(example_model)
    disc = model.discovery(said.append)
    assert said[-1] == "found 2 blocks by names: attn, xattn, ffn per block"
    # blocks whose regions differ (Lumina2's caption refiner before its joint blocks): each run of blocks
    # is named with its own regions, never block 0's for all
    b0, b1 = disc.blocks
    other = dataclasses.replace(disc, blocks=(b0, dataclasses.replace(b1, regions=b1.regions[::2]),
                                              dataclasses.replace(b1, index=2, regions=b1.regions[::2])))
    assert other.describe_regions() == "block 0: attn, xattn, ffn; blocks 1-2: attn, ffn"


@pytest.mark.export
@pytest.mark.slow
def test_the_discovery_line_of_a_family_with_two_block_kinds() -> None:
    from tests.models.diffusers_families import cached_export

    said: list[str] = []
    load(cached_export("lumina2", "torchscript")).discovery(said.append)
    assert said[-1] == "found 4 blocks by names: block 0: attn_txt, ffn_txt; blocks 1-3: attn, ffn"
