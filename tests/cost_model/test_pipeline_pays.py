"""The fit measures what the pipeline pays: one clock for every call, host setup per stage,
timing runs apart from memory runs, rounds interleaved across plans, ORT without the memory
pattern (docs/cost-model.md, "What the pipeline pays").  Real ONNX Runtime profiles of real
plans of the bundled example."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from rkpart.cost_model.calibration import fit_profiles, samples_from_records
from rkpart.pipeline import partition
from rkpart.plan.plan import Plan
from rkpart.profile.lifecycle import ProfileOptions, profile_plan
from rkpart.profile.records import StageRecord, read_jsonl, stage_records, write_jsonl
from rkpart.runtime.ort import OrtBackend, make_session
from rkpart.tune import TuneConfig, profile_for_fit, single_plans
from rkpart.types import HOST

# outside the fast tier: profiles the example plan (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def split_plan(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> tuple[Plan, Path]:
    folder = tmp_path_factory.mktemp("pays") / "split"
    return partition(example_model, folder, "split"), folder


def _profile(plan: Plan, folder: Path, out: Path, *, residency: str, memory: bool, rounds: int = 2) -> Path:
    recs = profile_plan(plan, folder, ProfileOptions(rounds=rounds, warmup=1, cfg=True, device_pattern=None,
                                                     sample_interval=0.01 if memory else 0.0, snapshots=memory,
                                                     residency=residency, plan=str(folder / "plan.json")),
                                                     backend=OrtBackend(threads=1)).to_json()
    return write_jsonl(out, recs)


def _records(paths: list[Path]) -> list[StageRecord]:
    return [r for p in paths for r in stage_records(read_jsonl(p))]


def test_every_lifecycle_call_records_its_cpu_time_and_the_cpu_clock_uses_it(split_plan: tuple[Plan, Path],
                                                                              tmp_path: Path) -> None:
    plan, folder = split_plan
    path = _profile(plan, folder, tmp_path / "p.jsonl", residency="per-stage", memory=False)
    recs = [r for r in read_jsonl(path) if r["record"] == "stage" and r["stage"]["device"] != HOST]
    assert recs and all(r["timings"][f"{c}_cpu_s"] >= 0 for r in recs for c in ("load", "init", "release"))
    typed = _records([path])
    npu = next(r for r in typed if r.device != HOST)
    assert npu.calls("init", "cpu") == [npu.cpu["init"]]
    assert npu.calls("init", "wall") == [npu.seconds["init"]]


def test_host_setup_is_fitted_on_the_host_stages_own_calls(split_plan: tuple[Plan, Path], tmp_path: Path) -> None:
    plan, folder = split_plan
    paths = [_profile(plan, folder, tmp_path / f"{r}.jsonl", residency=r, memory=False)
             for r in ("per-stage", "resident")]
    samples = samples_from_records(_records(paths), near=tmp_path, clock="cpu")
    host = [s for s in samples if s.features.device == HOST]
    assert host and all(s.targets["setup"] > 0 for s in host)
    # one host stage's setup is its load + init + release of a round (median over rounds)
    recs = [r for r in _records(paths[:1]) if r.device == HOST and not r.warmup]
    sid = recs[0].stage_id
    per_round: dict[int, float] = {}
    for r in recs:
        if r.stage_id == sid:
            per_round[r.round] = per_round.get(r.round, 0.0) + sum(r.cpu.values())
    first = next(s for s in host if s.label.endswith(f":{sid}") and s.group == recs[0].run_id)
    assert first.targets["setup"] == pytest.approx(statistics.median(per_round.values()))
    model, _ = fit_profiles(paths, clock="cpu")
    assert model.components["setup"].terms == ("const", "nodes", "weight_bytes")
    assert model.components["setup"].samples == len(host)


def test_times_come_from_runs_that_read_no_memory_and_memory_from_the_others(split_plan: tuple[Plan, Path],
                                                                              tmp_path: Path) -> None:
    plan, folder = split_plan
    clean = _profile(plan, folder, tmp_path / "clean.jsonl", residency="per-stage", memory=False)
    sampled = _profile(plan, folder, tmp_path / "mem.jsonl", residency="per-stage", memory=True, rounds=1)
    pooled = samples_from_records(_records([clean, sampled]), near=tmp_path, clock="cpu")
    alone = samples_from_records(_records([clean]), near=tmp_path, clock="cpu")
    by_label = {s.label: s for s in alone}
    npu = [s for s in pooled if s.features.device != HOST]
    assert npu
    for s in npu:
        assert s.targets["infer"] == by_label[s.label].targets["infer"]  # the memory run's calls left out
        assert "pss_peak" in s.targets and "pss_peak" not in by_label[s.label].targets


def test_ort_sessions_run_without_the_memory_pattern(example_model: Path) -> None:
    from rkpart.runtime.malloc import keep_freed_memory, measuring_memory

    sess = make_session(str(example_model), threads=1)
    assert sess.get_session_options().enable_mem_pattern is False
    # freed memory is kept (glibc, the default here): no arena, ORT's buffers come from the kept heap
    assert keep_freed_memory() and sess.get_session_options().enable_cpu_mem_arena is False
    with measuring_memory():  # a memory profile: the arena keeps activations visible to snapshots
        assert make_session(str(example_model), threads=1).get_session_options().enable_cpu_mem_arena is True
    assert make_session(str(example_model), threads=1).get_session_options().enable_cpu_mem_arena is False


@pytest.mark.slow
def test_fit_profiling_interleaves_rounds_across_plans(example_model: Path, tmp_path: Path) -> None:
    plans, n, reps = single_plans(example_model, tmp_path)
    files = profile_for_fit(plans, n, reps, tmp_path, TuneConfig(rounds=2))
    names = [p.name for p in files]
    r0 = [i for i, f in enumerate(names) if ".r0." in f]
    r1 = [i for i, f in enumerate(names) if ".r1." in f]
    mem = [i for i, f in enumerate(names) if f.endswith(".memory.jsonl")]
    assert len(r0) == len(r1) == 2 * len(plans) and len(mem) == len(plans)
    assert max(r0) < min(r1) and max(r1) < min(mem)
    # one warm-up round before a plan's first measured round only
    warm = {f: sum(1 for r in read_jsonl(tmp_path / "profiles" / f) if r.get("record") == "round" and r["warmup"])
            for f in names}
    assert all(warm[f] == 1 for f in names if ".r0." in f) and all(warm[f] == 0 for f in names if ".r1." in f)
    model, report = fit_profiles(files, clock="cpu")
    assert report.plans == 2 * len(plans)  # the rounds of one plan and residency are pooled
    assert {"glue", "setup", "infer", "pss_peak"} <= set(model.components)
