"""The accuracy term from a measured drift table instead of the fixed 4x floor (issue 15)."""

from __future__ import annotations

from pathlib import Path

from rkpart.auto import select
from rkpart.cost_model.drift_accuracy import accuracy_from_drift, family_of, with_drift
from rkpart.cost_model.model import CostModel, default_model_path
from rkpart.cost_model.select import SelectionConfig
from rkpart.pipeline import load
from rkpart.plan.plan import Plan
from rkpart.profile.drift import LATENT, DriftRow

FAMILIES = {"split": "adaln=host,residual=host", "fused": "adaln=npu,residual=npu"}


def _table(fused_mse: float, fused_cos: float) -> list[DriftRow]:
    rows = []
    for step in range(4):  # the last step is what counts; earlier ones and block rows are ignored
        rows.append(DriftRow("split", step, LATENT, None, 0.99999, 1e-3, 2e-8 * (step + 1)))
        rows.append(DriftRow("fused", step, LATENT, None, fused_cos, 1e-2, fused_mse * (step + 1) / 4))
        rows.append(DriftRow("fused", step, "cond", 0, 0.5, 1.0, 1.0))
    return rows


def test_ratios_are_final_latent_mse_over_the_baseline_and_the_floor_is_measured() -> None:
    acc = accuracy_from_drift(_table(fused_mse=8e-6, fused_cos=0.995), FAMILIES)
    fam = acc["families"]
    assert fam["adaln=host,residual=host"]["ratio"] == 1.0
    assert fam["adaln=npu,residual=npu"]["ratio"] == 100.0  # 8e-6 / 8e-8
    assert acc["default_max_ratio"] == 1.0  # fused ends below the cosine floor: only split is acceptable
    ok = accuracy_from_drift(_table(fused_mse=8e-6, fused_cos=0.9995), FAMILIES)
    assert ok["default_max_ratio"] == 100.0  # fused keeps the latent: its measured ratio is allowed


def test_two_plans_of_one_family_give_it_the_larger_drift() -> None:
    """fused and fused-x2 are both ``adaln=npu,residual=npu``: the family takes the worse, in either order."""
    rows = _table(fused_mse=8e-6, fused_cos=0.9995)
    worse = [DriftRow("fused-x2", 3, LATENT, None, 0.999, 1e-2, 2e-5)]
    for table in (rows + worse, worse + rows):
        fam = accuracy_from_drift(table, {**FAMILIES, "fused-x2": FAMILIES["fused"]})["families"]
        assert fam["adaln=npu,residual=npu"]["ratio"] == 250.0  # 2e-5 / 8e-8, not fused's 100
        assert fam["adaln=npu,residual=npu"]["source"].endswith("plan fused-x2")


def test_selection_uses_the_measured_term(example_model: Path) -> None:
    loaded = load(example_model)
    mg, disc = loaded.graph, loaded.discovery()
    shipped = CostModel.load(default_model_path())
    cfg = SelectionConfig(budget_mib=4096, steps=4, cfg=True)
    drifting = select(mg, disc, with_drift(shipped, _table(8e-6, 0.995), FAMILIES), cfg)
    fused = [o for opts in drifting.options.values() for o in opts if o.candidate.id.startswith("fused")]
    assert fused and all(o.excluded and o.excluded.startswith("accuracy") for o in fused)
    keeping = select(mg, disc, with_drift(shipped, _table(8e-6, 0.9995), FAMILIES), cfg)
    fused = [o for opts in keeping.options.values() for o in opts if o.candidate.id.startswith("fused")]
    assert fused and not any(o.excluded and o.excluded.startswith("accuracy") for o in fused)


def test_family_of_split_and_fused_plans(plans: dict[str, tuple[Plan, Path]]) -> None:
    assert family_of(plans["split"][0]) == "adaln=host,residual=host"
    assert family_of(plans["fused"][0]) == "adaln=npu,residual=npu"


def test_the_shipped_calibration_selects_with_the_shipped_full_size_drift_table() -> None:
    """The RK3588 calibration's accuracy term is the 28-block drift table in rkpart/data, not a set factor."""
    from rkpart.auto import load_accuracy
    from rkpart.cost_model.calibration import WRITEUP_BLOCK_MSE_RATIO, shipped_drift

    measured = shipped_drift()
    assert load_accuracy(default_model_path().with_name("drift_anima_full.json")) == measured  # a valid term
    shipped = CostModel.load(default_model_path()).accuracy.to_json()
    assert measured["measured"]["model"].startswith("full-size Anima DiT (28 blocks")
    assert shipped["default_max_ratio"] == measured["default_max_ratio"]
    for key, fam in measured["families"].items():
        assert shipped["families"][key]["ratio"] == fam["ratio"]
    fused = measured["families"]["adaln=npu,residual=npu"]["ratio"]
    # the families the table does not run take fused's measured ratio; the write-up's per-block
    # figure is kept for reference only
    assert shipped["families"]["adaln=npu,residual=host"]["ratio"] == fused
    assert shipped["writeup_block_mse_ratio"] == WRITEUP_BLOCK_MSE_RATIO != fused


def test_an_int8_plan_is_its_own_family_and_does_not_widen_the_bound(plans: dict[str, tuple[Plan, Path]]) -> None:
    """Issue 27: ``rkpart drift fp16/ int8/`` compares precision variants of one plan."""
    import dataclasses

    from rkpart.plan.plan import Artifact

    plan, _ = plans["split"]

    def compiled(precision: str) -> Plan:
        art = Artifact(kind="rknn", file="rknn/objects/x.rknn", toolkit="2.5.0", target="rk3588", config_hash="0",
                       sha256="0", size_bytes=1, precision=precision)
        return dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, artifacts=(art,)) if s.device == "npu"
                                                      else s for s in plan.stages))

    assert family_of(compiled("fp16")) == "adaln=host,residual=host"
    assert family_of(compiled("int8")) == "adaln=host,residual=host,precision=int8"
    rows = [DriftRow("fp16", 0, LATENT, None, 0.99999, 1e-3, 1e-6),
            DriftRow("int8", 0, LATENT, None, 0.9995, 0.2, 3e-3)]
    acc = accuracy_from_drift(rows, {"fp16": family_of(compiled("fp16")), "int8": family_of(compiled("int8"))})
    assert acc["families"]["adaln=host,residual=host,precision=int8"]["ratio"] == 3000.0
    assert acc["default_max_ratio"] == 1.0  # measured, but auto does not choose precision yet
