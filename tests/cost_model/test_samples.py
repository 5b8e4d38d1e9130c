"""Profile records -> fit samples: pooled runs of one plan, repeated inference calls (real ORT)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.cost_model.calibration import fit_profiles, samples_from_records
from rkpart.pipeline import partition
from rkpart.profile.lifecycle import ProfileOptions, profile_plan
from rkpart.profile.records import read_jsonl, stage_records, write_jsonl
from rkpart.runtime.ort import OrtBackend


@pytest.mark.slow  # profiles the example plan in ONNX Runtime
def test_runs_of_one_plan_are_pooled_and_every_repeated_call_counts(tmp_path: Path, example_model: Path) -> None:
    folder = tmp_path / "fused"
    plan = partition(example_model, folder, "fused")
    files = []
    for i in range(2):  # two runs of the same plan, as the interleaving bench writes them
        recs = profile_plan(plan, folder, ProfileOptions(rounds=1, warmup=0, cfg=False, residency="resident",
                                                         device_pattern=None, sample_interval=0.0,
                                                         plan=str(folder / "plan.json"), infer_repeat=3),
                                                         backend=OrtBackend(threads=1)).to_json()
        files.append(write_jsonl(tmp_path / f"run{i}.jsonl", recs))
    records = [r for f in files for r in read_jsonl(f)]
    samples = samples_from_records(stage_records(records), statistic="min")
    assert [s.label for s in samples] == [f"fused:{s.id}" for s in plan.stages]  # one sample per stage
    assert len({s.group for s in samples}) == 1  # one plan: one cross-validation group
    for s in samples:
        sid = s.label.partition(":")[2]
        calls = [c for r in records if r["record"] == "stage" and r["stage"]["id"] == sid
                 for c in r["timings"]["infer_calls_s"]]
        assert len(calls) == 2 * 3
        comp = "host" if s.features.device == "host" else "infer"
        assert s.targets[comp] == min(calls)
    _, report = fit_profiles(files, statistic="min")
    assert report.runs == 2 and report.plans == 1 and report.statistic == "min"
    # typed report: one plan, so nothing is held out; the JSON tune and `fit --json` write mirrors it
    assert report.backends == ("ort",) and report.samples == len(samples)
    assert set(report.components) >= {"infer", "host"} and report.components["infer"].terms
    j = report.to_json()
    assert list(j) == ["samples", "runs", "plans", "backends", "statistic", "method", "components", "whole_plan",
                       "fitted_range"]
    assert j["whole_plan"]["method"] == report.whole_plan.error.method and j["whole_plan"]["plans"] == []
    assert all(lo <= hi for lo, hi in report.fitted_range.values())
