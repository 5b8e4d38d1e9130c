"""Real ONNX Runtime profiles of a hand-built split block (see tests/profile/plans.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rkpart.errors import SpecError
from rkpart.profile import records as rec
from rkpart.profile.lifecycle import ProfileOptions, make_inputs, profile_plan, unconditional_inputs
from rkpart.runtime.base import Backend, StageRunner
from rkpart.runtime.ort import OrtBackend, OrtRunner
from tests.profile.plans import mini_block_plan

# outside the fast tier: profiles plans in ONNX Runtime (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

LIFE = ("load_s", "init_s", "infer_s", "release_s")


@pytest.fixture(scope="module")
def split_profile(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    d = tmp_path_factory.mktemp("split")
    plan = mini_block_plan(d)
    lines: list[str] = []
    recs = profile_plan(plan, d, ProfileOptions(rounds=3, warmup=1, cfg=True), backend=OrtBackend(),
                                                progress=lines.append).to_json()
    assert len(lines) == 4 * 2 * 4  # rounds x passes x stages
    return recs


@pytest.mark.slow
def test_three_round_cfg_profile_has_one_record_per_stage_round_pass(split_profile: list[dict]) -> None:
    stages = [r for r in split_profile if r["record"] == "stage"]
    assert len(stages) == 4 * 4 * 2  # 4 stages x (1 warm-up + 3) rounds x 2 passes
    keys = Counter((r["stage"]["id"], r["round"], r["pass"]) for r in stages)
    assert set(keys.values()) == {1}
    assert {r["round"] for r in stages if r["warmup"]} == {0}
    assert [r["record"] for r in split_profile].count("round") == 4
    assert split_profile[-1]["record"] == "summary"
    assert split_profile[-1]["rounds_measured"] == [1, 2, 3] and split_profile[-1]["warmup_rounds"] == [0]
    rec.validate_records(split_profile)


@pytest.mark.slow
def test_per_stage_npu_records_hold_all_four_timings(split_profile: list[dict]) -> None:
    for r in split_profile:
        if r["record"] != "stage":
            continue
        t = r["timings"]
        if r["stage"]["device"] == "npu":
            assert r["residency"] == "per-stage"
            assert all(t[k] is not None and t[k] >= 0 for k in LIFE)
            assert t["wall_s"] >= sum(t[k] for k in LIFE)
        else:  # host stages are resident within a round
            assert r["residency"] == "resident"
            assert t["infer_s"] is not None
            first = r["pass"] == "cond"
            assert (t["load_s"] is not None) == first and (t["init_s"] is not None) == first
            assert (t["release_s"] is not None) == (not first)


@pytest.mark.slow
def test_stage_identity_and_environment_are_recorded(split_profile: list[dict]) -> None:
    r = next(r for r in split_profile if r["record"] == "stage" and r["stage"]["id"] == "b0_xattn")
    st = r["stage"]
    assert st["block"] == 0 and st["region"] == "xattn" and st["strategy"] == "split"
    assert len(st["sha256"]) == 64 and st["executor"] == "ort" and st["artifact"] is None
    assert r["env"]["backend"]["backend"] == "ort" and r["env"]["cpu_model"]
    assert r["settings"]["uncond_inputs"] == ["encoder_hidden_states"]
    assert r["memory"]["device_pss_kib"] == 0  # no NPU on this machine
    # after init, after inference, after release
    assert r["measurement"]["snapshots"] == 3 and r["measurement"]["snapshot_s"] > 0


@pytest.mark.slow
def test_measurement_time_is_reported_apart_and_inside_the_wall(split_profile: list[dict]) -> None:
    for r in (r for r in split_profile if r["record"] == "round"):
        m = r["measurement"]
        assert 0 < m["snapshot_s"] < r["timings"]["wall_s"]
        assert m["wall_minus_snapshots_s"] == pytest.approx(r["timings"]["wall_s"] - m["snapshot_s"])
    totals = split_profile[-1]["totals"]
    assert totals["net_s"]["n"] == 3
    assert totals["net_s"]["median"] < totals["wall_s"]["median"]
    assert totals["host_s"]["median"] > 0


def test_unconditional_pass_zeroes_the_text_context() -> None:
    cond = {"x": np.ones((2, 2), np.float32), "encoder_hidden_states": np.ones((2, 3), np.float32)}
    uncond, names = unconditional_inputs(cond)
    assert names == ["encoder_hidden_states"]
    assert not uncond["encoder_hidden_states"].any() and uncond["x"] is cond["x"]
    same, none = unconditional_inputs({"x": cond["x"]})
    assert none == [] and same["x"] is cond["x"]


class _OutputSpy(Backend):
    """Real ORT runners; remembers each xattn output so the two CFG passes can be compared."""

    name = "ort"

    def __init__(self) -> None:
        self.outputs: list[np.ndarray] = []

    def runner(self, stage, folder):  # type: ignore[no-untyped-def]
        spy = self

        class R(OrtRunner):
            def _infer_impl(self, feeds):  # type: ignore[no-untyped-def]
                out = super()._infer_impl(feeds)
                if stage.id == "b0_xattn":
                    spy.outputs.append(out["c"])
                return out

        return R(stage, folder)


def test_outputs_flow_between_stages_and_passes_differ(tmp_path: Path) -> None:
    plan = mini_block_plan(tmp_path)
    spy = _OutputSpy()
    profile_plan(plan, tmp_path, ProfileOptions(rounds=1, warmup=0, cfg=True, steps=2), backend=spy)
    assert len(spy.outputs) == 4  # 2 steps x 2 passes
    cond, uncond = spy.outputs[0], spy.outputs[1]
    assert not np.allclose(cond, uncond)  # zero context -> different cross-attention output
    assert not uncond.any()  # softmax(.) @ zeros
    np.testing.assert_array_equal(spy.outputs[0], spy.outputs[2])  # same inputs every step


def test_resident_loads_once_per_round_and_releases_at_the_end(tmp_path: Path) -> None:
    plan = mini_block_plan(tmp_path)
    recs = profile_plan(plan, tmp_path, ProfileOptions(rounds=2, warmup=0, cfg=True, steps=2, residency="resident",
                                                       sample_interval=0), backend=OrtBackend()).to_json()
    rec.validate_records(recs)
    npu = [r for r in recs if r["record"] == "stage" and r["stage"]["device"] == "npu"]
    assert len(npu) == 2 * 2 * 2 * 2  # stages x rounds x steps x passes
    for r in npu:
        first = (r["step"], r["pass"]) == (0, "cond")
        last = (r["step"], r["pass"]) == (1, "uncond")
        t = r["timings"]
        assert (t["load_s"] is not None) == first and (t["init_s"] is not None) == first
        assert (t["release_s"] is not None) == last
        assert t["infer_s"] is not None and r["residency"] == "resident"
    per_round = rec.round_totals(recs)
    assert sorted(per_round) == [0, 1]
    assert all(v["load_s"] > 0 and v["release_s"] > 0 for v in per_round.values())


class _CountingBackend(OrtBackend):
    """Real ORT; counts runner lifecycles to check every loaded stage is released."""

    def __init__(self) -> None:
        self.made: list[StageRunner] = []

    def runner(self, stage, folder):  # type: ignore[no-untyped-def]
        r = super().runner(stage, folder)
        self.made.append(r)
        return r


def test_every_runner_is_released_in_both_residencies(tmp_path: Path) -> None:
    plan = mini_block_plan(tmp_path)
    for residency in ("per-stage", "resident"):
        b = _CountingBackend()
        profile_plan(plan, tmp_path, ProfileOptions(rounds=1, warmup=0, residency=residency, sample_interval=0),
                                                    backend=b)
        assert b.made and all(r._state == "released" for r in b.made)
        npu_runners = [r for r in b.made if r.stage.device == "npu"]
        assert len(npu_runners) == (4 if residency == "per-stage" else 2)


def test_bad_plan_and_arguments_are_refused(tmp_path: Path) -> None:
    plan = mini_block_plan(tmp_path)
    with pytest.raises(ValueError, match="residency"):
        profile_plan(plan, tmp_path, ProfileOptions(residency="sometimes"), backend=OrtBackend())
    with pytest.raises(ValueError, match="rounds"):
        profile_plan(plan, tmp_path, ProfileOptions(rounds=0), backend=OrtBackend())
    import dataclasses

    reordered = dataclasses.replace(plan, stages=plan.stages[::-1])
    with pytest.raises(SpecError, match="reads"):
        profile_plan(reordered, tmp_path, ProfileOptions(), backend=OrtBackend())
    with pytest.raises(SpecError, match="no value for plan input"):
        profile_plan(plan, tmp_path, ProfileOptions(), backend=OrtBackend(),
                                                    inputs={"x": np.zeros((1, 16, 32), np.float32)})


def test_make_inputs_is_seeded_and_typed(tmp_path: Path) -> None:
    plan = mini_block_plan(tmp_path)
    a, b = make_inputs(plan, 3), make_inputs(plan, 3)
    assert set(a) == {"x", "temb", "encoder_hidden_states"}
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
        assert a[k].dtype == np.float32 and a[k].shape == plan.tensors[k].shape


def test_infer_repeat_records_every_call_and_their_median(tmp_path: Path) -> None:
    plan = mini_block_plan(tmp_path)
    recs = profile_plan(plan, tmp_path, ProfileOptions(rounds=1, warmup=0, cfg=True, residency="resident",
                                                       device_pattern=None, sample_interval=0.0, infer_repeat=3),
                                                       backend=OrtBackend(threads=1)).to_json()
    rec.validate_records(recs)
    stages = [r for r in recs if r["record"] == "stage"]
    assert stages and all(r["settings"]["infer_repeat"] == 3 for r in recs)
    for r in stages:  # host stages are repeated too
        t = r["timings"]
        calls = t["infer_calls_s"]
        assert len(calls) == 3 and t["infer_s"] == pytest.approx(sorted(calls)[1])
        assert t["infer_spread_s"] == pytest.approx(max(calls) - min(calls))
        # the record's wall time covers all three calls
        assert t["wall_s"] >= sum(calls)
    assert recs[0]["env"]["backend"]["intra_op_threads"] == 1


@pytest.mark.slow
def test_one_inference_call_keeps_the_old_record_shape(split_profile: list[dict], tmp_path: Path) -> None:
    stages = [r for r in split_profile if r["record"] == "stage"]
    assert all("infer_calls_s" not in r["timings"] and r["settings"]["infer_repeat"] == 1 for r in stages)
    with pytest.raises(ValueError, match="infer_repeat"):
        profile_plan(mini_block_plan(tmp_path), tmp_path, ProfileOptions(infer_repeat=0), backend=OrtBackend())


def test_profile_plan_returns_typed_lines_that_write_the_same_file(tmp_path: Path) -> None:
    plan = mini_block_plan(tmp_path)
    run = profile_plan(plan, tmp_path, ProfileOptions(rounds=1, warmup=1, cfg=True, device_pattern=None,
                                                      sample_interval=0.0, snapshots=False),
                       backend=OrtBackend(threads=1))
    assert isinstance(run, rec.ProfileRun)
    n_stages = len(plan.stages)
    assert len(run.stages) == 2 * 2 * n_stages and len(run.rounds) == 2  # (warm-up + 1 round) x 2 passes
    assert [r.warmup for r in run.rounds] == [True, False] and run.summary.rounds_measured == (1,)
    assert {x.stage_id for x in run.stages} == {s.id for s in plan.stages}
    assert {x.header.run_id for x in run.lines} == {run.run_id}
    assert all(x.device == next(s.device for s in plan.stages if s.id == x.stage_id) for x in run.stages)
    # the cost model's view: measured rounds only on request
    assert len(run.stage_records()) == len(run.stages) and len(run.stage_records(warmup=False)) == 2 * n_stages
    assert all(isinstance(t, rec.StageRecord) and not t.warmup for t in run.stage_records(warmup=False))
    # the file: what the typed lines write, read back into equal lines, byte for byte
    path = rec.write_jsonl(tmp_path / "p.jsonl", run.to_json())
    back = rec.ProfileRun.from_json(rec.read_jsonl(path))
    assert back == run
    assert rec.dumps_jsonl(back.to_json()).encode() == path.read_bytes()
    with pytest.raises(ValueError, match="ends with its summary"):
        rec.ProfileRun(run.lines[:-1])
