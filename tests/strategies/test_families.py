"""The candidate families are named in one module, and ``fused-xK`` is the fused strategy's own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rkpart.auto import candidate_variants
from rkpart.cost_model.candidates import candidates_from
from rkpart.grouping.strategies.families import FUSED, SPLIT, SPLIT_ADALN_NPU, candidate_id_for, families, fused_run
from rkpart.grouping.strategies.fused import FusedOptions, FusedStrategy
from rkpart.pipeline import load
from tests.models.anima import AnimaConfig, build_anima_onnx

ROOT = Path(__file__).resolve().parents[2] / "rkpart"
#: the family names that are not also strategy names
NAMES = re.compile(r"split-adaln-npu|fused-x")


def test_candidate_names_appear_in_one_module() -> None:
    where = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py") if NAMES.search(p.read_text()))
    assert where == ["grouping/strategies/families.py"]


def test_families_in_order_and_back_from_a_plans_strategy() -> None:
    assert [f.id for f in families(max_run=3)] == [SPLIT.id, SPLIT_ADALN_NPU.id, FUSED.id, "fused-x2", "fused-x3"]
    assert [f.id for f in families(max_run=3, blocks=2)][-1] == "fused-x2"
    for f in families(max_run=3):
        assert candidate_id_for(f.strategy, f.options) == f.id
    assert candidate_id_for("split", {"residual": "npu"}) is None
    assert candidate_id_for("generic", {}) is None and candidate_id_for("myplugin", {}) == "myplugin"


@pytest.mark.parametrize("k", [2, 3])
def test_fused_runs_are_the_fused_strategys_stages_from_every_start(tmp_path: Path, k: int) -> None:
    loaded = load(build_anima_onnx(AnimaConfig.tiny(num_blocks=4, dtype="float32"), tmp_path / "m.onnx"))
    mg, disc = loaded.graph, loaded.discovery()
    n = len(disc.blocks)
    cands = candidates_from(mg, disc, candidate_variants(mg, disc, max_run=k, plugins_too=False))
    runs = {c.blocks: c for lst in cands.values() for c in lst if c.id == fused_run(k).id}
    assert sorted(runs) == [tuple(range(b, b + k)) for b in range(n - k + 1)]  # every start, not every k-th
    for start in (0, 1):
        whole = FusedStrategy(first_run=start).propose(mg, disc, FusedOptions(blocks_per_stage=k))
        (stage,) = [g for g in whole.groups if g.blocks == tuple(range(start, start + k))]
        npu = [g for g in runs[stage.blocks].groups if g.device == "npu"]
        assert [(g.id, g.ops) for g in npu] == [(stage.id, stage.ops)]
