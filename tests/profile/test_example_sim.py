"""Three-round CFG profiles of the bundled example's split and fused plans in the toolkit simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.pipeline import partition
from rkpart.profile import records as rec
from rkpart.profile.lifecycle import ProfileOptions, profile_plan
from rkpart.profile.report import render_compare
from rkpart.runtime.rknn_sim import RknnSimBackend
from tests.toolkits import get_toolkit

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]

VERSION = "2.5.0"  # builds the example's stages fastest, and builds fused blocks


@pytest.fixture(scope="module")
def sim_profiles(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> dict[str, list[dict]]:
    tk = get_toolkit(VERSION)
    out = {}
    for strategy in ("split", "fused"):
        d = tmp_path_factory.mktemp(f"sim-{strategy}") / "plan"
        plan = partition(example_model, d, strategy)
        rep = compile_plan_report(plan, d, CompileOptions(tk, "rk3588", {}, jobs=2))
        assert not rep.failed
        backend = RknnSimBackend(VERSION)
        try:
            # resident: each stage is built into the simulator once per round, then serves both CFG passes
            out[strategy] = profile_plan(rep.plan, d, ProfileOptions(rounds=3, warmup=0, cfg=True,
                                                                     residency="resident", sample_interval=0.05,
                                                                     plan=str(d / "plan.json")),
                                         backend=backend).to_json()
        finally:
            backend.close()
    return out


@pytest.mark.parametrize("strategy", ["split", "fused"])
def test_simulator_profiles_validate(sim_profiles: dict[str, list[dict]], strategy: str) -> None:
    records = sim_profiles[strategy]
    rec.validate_records(records, where=strategy)
    stages = [r for r in records if r["record"] == "stage"]
    npu = [r for r in stages if r["stage"]["device"] == "npu"]
    assert npu and all(r["env"]["backend"]["backend"] == "rknn-sim" for r in npu)
    # 3 rounds x 2 CFG passes for every NPU stage
    per_stage: dict[str, int] = {}
    for r in npu:
        per_stage[r["stage"]["id"]] = per_stage.get(r["stage"]["id"], 0) + 1
    assert set(per_stage.values()) == {6}
    assert all(r["timings"]["infer_s"] > 0 for r in npu)


def test_simulator_split_vs_fused_tables_print(sim_profiles: dict[str, list[dict]]) -> None:
    text = render_compare(sim_profiles["split"], sim_profiles["fused"], names=("split", "fused"))
    for row in ("Model Load", "Runtime Init", "NPU Inference (×2)", "Context Release", "Host AdaLN & Residual",
                "Net Component Sum", "Measured Wall", "NPU Device-Mapped PSS", "Peak Process PSS", "New System Swap"):
        assert row in text, row
