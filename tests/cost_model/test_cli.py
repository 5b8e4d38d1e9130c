"""CLI: ``rkpart partition --strategy auto``, ``rkpart fit``, and predicted-vs-measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.cost_model.calibration import compare_with_model, fit_profiles, render_comparison, shipped_drift
from rkpart.cost_model.model import CostModel
from rkpart.pipeline import partition
from rkpart.plan.plan import load_plan
from rkpart.profile.lifecycle import ProfileOptions, profile_plan
from rkpart.profile.records import write_jsonl
from rkpart.runtime.ort import OrtBackend


def test_partition_auto_explains_and_writes_a_runnable_plan(tmp_path: Path) -> None:
    out = tmp_path / "auto"
    r = CliRunner().invoke(main, ["partition", "-o", str(out), "-s", "auto", "--explain", "-q", "--budget-mib", "64",
                                  "--steps", "30"])
    assert r.exit_code == 0, r.output
    assert "fused vs split (per-stage)" in r.output
    plan, _ = load_plan(out)
    assert plan.strategy["name"] == "auto"
    choices = plan.strategy["options"]["choices"]
    for c in choices:  # what --explain says is what the plan holds
        assert f"block {c['blocks'][0]}: chosen {c['candidate']}/{c['residency']}" in r.output
    assert plan.strategy["options"]["predicted_device_mib"] <= 64
    # the shipped accuracy term is the measured drift table: fused keeps the latent (cosine >= 0.999), so
    # it is not excluded, and the calibration's per-call overheads make the fewest stages fastest
    assert f"accuracy floor {shipped_drift()['default_max_ratio']:g}x" in r.output
    assert {c["candidate"] for c in choices} <= {"fused", "fused-x2"}
    run = CliRunner().invoke(main, ["run", str(out), "-q"])
    assert run.exit_code == 0 and "gate: PASS" in run.output


def test_partition_auto_accuracy_floor_keeps_split(tmp_path: Path) -> None:
    """A floor of 1x (nothing less accurate than the default split) leaves split as the only choice."""
    out = tmp_path / "auto"
    r = CliRunner().invoke(main, ["partition", "-o", str(out), "-s", "auto", "--explain", "-q", "--budget-mib", "64",
                                  "--steps", "30", "--option", "max_error_ratio=1"])
    assert r.exit_code == 0, r.output
    assert "block 0: chosen split/" in r.output and "accuracy: predicted error" in r.output
    plan, _ = load_plan(out)
    assert [c["candidate"] for c in plan.strategy["options"]["choices"]] == ["split", "split"]
    assert len(plan.npu_stages) == 6


def test_partition_auto_json_explanation(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["partition", "-o", str(tmp_path / "a"), "-s", "auto", "--explain", "--json", "-q"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    plan, _ = load_plan(tmp_path / "a")
    assert [c["candidate"] for c in data["auto"]["choices"]] == [c["candidate"]
                                                                 for c in plan.strategy["options"]["choices"]]
    assert {c["candidate"] for c in data["auto"]["blocks"][0]["candidates"]} >= {"split", "split-adaln-npu", "fused",
                                                                                   "fused-x2"}


def test_infeasible_budget_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "none"
    r = CliRunner().invoke(main, ["partition", "-o", str(out), "-s", "auto", "--budget-mib", "0.01", "-q"])
    assert r.exit_code == 9
    assert r.stderr.count("\n") == 1 and "smallest feasible budget is" in r.stderr
    assert not out.exists()


def test_auto_options_are_refused_for_other_strategies(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["partition", "-o", str(tmp_path / "x"), "-s", "split", "--explain"])
    assert r.exit_code == 2 and "--explain applies to --strategy auto only" in r.output
    r = CliRunner().invoke(main, ["partition", "-o", str(tmp_path / "y"), "-s", "fused", "--steps", "4"])
    assert r.exit_code == 2 and "option 'steps' does not apply to strategy fused but to auto" in r.output
    assert not (tmp_path / "y").exists()


@pytest.mark.slow
def test_fit_on_real_ort_profiles_prints_held_out_error(tmp_path: Path, example_model: Path) -> None:
    profiles = []
    for name, strategy, opts in (("split", "split", {}), ("npu", "split", {"adaln": "npu"}), ("fused", "fused", {})):
        folder = tmp_path / name
        plan = partition(example_model, folder, strategy, **opts)
        recs = profile_plan(plan, folder, ProfileOptions(rounds=2, warmup=1, cfg=True, device_pattern=None,
                                                         sample_interval=0.0, plan=str(folder / "plan.json")),
                                                         backend=OrtBackend()).to_json()
        profiles.append(write_jsonl(tmp_path / f"{name}.jsonl", recs))
    out = tmp_path / "model.json"
    r = CliRunner().invoke(main, ["fit", *map(str, profiles), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "held-out error (leave-one-plan-out)" in r.output
    for comp in ("load", "init", "infer", "release", "host"):
        assert f"  {comp} " in r.output
    model = CostModel.load(out)
    assert model.provenance.backends == ("ort",) and model.provenance.doc["runs"] == 3
    # the model is rkpart's own (its "format"): --force replaces it (issue 51: without it, refused)
    assert CliRunner().invoke(main, ["fit", *map(str, profiles), "-o", str(out)]).exit_code == 6
    rj = CliRunner().invoke(main, ["fit", *map(str, profiles), "-o", str(out), "--json", "--force"])
    report = json.loads(rj.stdout)
    cv = report["components"]["infer"]["cross_validation"]
    assert cv["n"] == 6 + 6 + 2 and 0.0 <= cv["within_10"] <= cv["within_20"] <= 1.0
    # `fit --json` prints the typed FitReport's JSON (the fit is deterministic)
    _, typed = fit_profiles(profiles)
    assert typed.components["infer"].cross_validation is not None
    assert typed.components["infer"].cross_validation.n == cv["n"]
    assert json.loads(json.dumps(typed.to_json())) == report

    from rkpart.profile.records import read_jsonl, stage_records

    rows = compare_with_model(stage_records(read_jsonl(profiles[0])), model, near=tmp_path)
    totals = {r["component"]: r for r in rows if r["stage"] == "total"}
    assert set(totals) == {"load", "init", "infer", "release", "host", "setup"}
    assert all(r["measured"] > 0 and r["predicted"] >= 0 for r in totals.values())
    assert "b00.attn" in render_comparison(rows)
