"""Plan execution: sessions created once per execution (resident) or per pass (per-stage),
consecutive host stages fused into one session, outputs identical whatever the policy.

Everything runs real ONNX Runtime; :mod:`tests.runtime.counting` only counts its calls.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from rkpart.errors import SpecError
from rkpart.plan.plan import Plan
from rkpart.runtime.executor import PlanExecutor, plan_residency, random_inputs, run_model, run_plan
from rkpart.runtime.ort import make_session
from rkpart.types import Residency
from tests.runtime.counting import CountingOrt
from tests.runtime.plans import host_run_plan

PASSES = 3


def _execute(plan: Plan, folder: Path, residency: str, passes: int = PASSES,
             **kw: object) -> tuple[list[dict[str, np.ndarray]], CountingOrt, CountingOrt]:
    npu, host = CountingOrt("npu-ort", ("npu",)), CountingOrt()
    feeds = random_inputs(plan.tensors, plan.inputs, seed=1)
    with PlanExecutor(plan, folder, backend=npu, host=host, residency=residency, **kw) as ex:  # type: ignore[arg-type]
        outs = [ex.run(feeds) for _ in range(passes)]
        held = set(ex.live)
    assert not npu.counts.live and not host.counts.live, "close() released every session"
    assert held  # something was resident while the executor was open
    return outs, npu, host


def test_resident_creates_every_session_once_per_execution(plans: dict[str, tuple[Plan, Path]]) -> None:
    plan, folder = plans["split"]
    outs, npu, host = _execute(plan, folder, "resident")
    assert set(npu.counts.init) == {s.id for s in plan.npu_stages}
    assert set(npu.counts.init.values()) == {1}
    assert set(host.counts.init) == {s.id for s in plan.host_stages} and set(host.counts.init.values()) == {1}
    assert set(npu.counts.infer.values()) == {PASSES} and set(host.counts.infer.values()) == {PASSES}
    for o in outs[1:]:
        np.testing.assert_array_equal(o["sample"], outs[0]["sample"])


def test_per_stage_reloads_npu_stages_every_pass_and_keeps_host_stages(plans: dict[str, tuple[Plan, Path]]) -> None:
    plan, folder = plans["split"]
    _, npu, host = _execute(plan, folder, "per-stage")
    assert set(npu.counts.init.values()) == {PASSES} and set(npu.counts.release.values()) == {PASSES}
    assert set(host.counts.init.values()) == {1}  # host code is loaded once per execution


def test_residency_policies_give_identical_outputs_equal_to_the_whole_model(
        plans: dict[str, tuple[Plan, Path]], example_model: Path) -> None:
    plan, folder = plans["split"]
    feeds = random_inputs(plan.tensors, plan.inputs, seed=1)
    res, _, _ = _execute(plan, folder, "resident", passes=1)
    per, _, _ = _execute(plan, folder, "per-stage", passes=1)
    unfused, _, _ = _execute(plan, folder, "resident", passes=1, fuse_host=False)
    np.testing.assert_array_equal(res[0]["sample"], per[0]["sample"])
    np.testing.assert_array_equal(res[0]["sample"], unfused[0]["sample"])
    whole = run_model(example_model, feeds, plan.outputs)["sample"]
    np.testing.assert_allclose(res[0]["sample"], whole, rtol=1e-5, atol=1e-5)


def test_consecutive_host_stages_run_as_one_session(tmp_path: Path) -> None:
    plan = host_run_plan(tmp_path)
    feeds = random_inputs(plan.tensors, plan.inputs, seed=2)
    npu, host = CountingOrt("npu-ort", ("npu",)), CountingOrt()
    seen: list[tuple[int, str, tuple[str, ...]]] = []
    with PlanExecutor(plan, tmp_path, backend=npu, host=host, residency="resident") as ex:
        assert [u.stage.id for u in ex.units] == ["scale+shift", "mm", "act"]
        for _ in range(2):
            got = ex.run(feeds, on_stage=lambda i, sid, out: seen.append((i, sid, tuple(out))))
    assert dict(host.counts.init) == {"scale+shift": 1, "act": 1}
    # on_stage still reports every plan stage with its own outputs
    assert seen[:4] == [(0, "scale", ("s",)), (1, "shift", ("h",)), (2, "mm", ("m",)), (3, "act", ("y",))]
    unfused = run_plan(plan, tmp_path, feeds, host=CountingOrt(), residency="resident")
    with PlanExecutor(plan, tmp_path, fuse_host=False) as ex:
        assert len(ex.units) == 4
        np.testing.assert_array_equal(ex.run(feeds)["y"], got["y"])
    np.testing.assert_array_equal(unfused["y"], got["y"])
    rng = np.random.default_rng(0)  # the weights host_run_plan drew
    w = rng.standard_normal((64,)).astype(np.float32)
    big = rng.standard_normal((64, 64)).astype(np.float32) * 0.1
    np.testing.assert_allclose(got["y"], np.maximum((feeds["x"] * w + feeds["x"]) @ big, 0), rtol=1e-5, atol=1e-5)


def test_block_subset_runs_only_those_stages(plans: dict[str, tuple[Plan, Path]]) -> None:
    plan, folder = plans["split"]
    feeds = random_inputs(plan.tensors, plan.inputs, seed=1)
    env = run_plan(plan, folder, feeds, keep=True)
    block1 = [s for s in plan.stages if s.block == 1 and s.id != "epilogue"]
    npu, host = CountingOrt("npu-ort", ("npu",)), CountingOrt()
    with PlanExecutor(plan, folder, backend=npu, host=host, stages=block1) as ex:
        got = ex.run(env, keep=True)
    assert set(npu.counts.infer) | set(host.counts.infer) == {s.id for s in block1}
    for s in block1:
        for o in s.outputs:
            np.testing.assert_array_equal(got[o], env[o])


def test_plan_residency_follows_the_auto_strategy_choice(plans: dict[str, tuple[Plan, Path]]) -> None:
    plan, _ = plans["split"]
    chosen = dataclasses.replace(plan, strategy={"name": "auto", "options": {"choices": [
        {"blocks": [0], "candidate": "split", "residency": "per-stage"},
        {"blocks": [1], "candidate": "split", "residency": "resident"}]}})
    r = plan_residency(chosen)
    for s in plan.stages:
        want = Residency.RESIDENT if s.device == "host" or s.block == 1 else Residency.PER_STAGE
        assert r[s.id] == want, s.id
    assert set(plan_residency(plan, "per-stage").values()) == {Residency.PER_STAGE, Residency.RESIDENT}
    assert {r for sid, r in plan_residency(plan).items()} == {Residency.RESIDENT}  # no choice recorded


def test_a_stage_out_of_order_is_refused(plans: dict[str, tuple[Plan, Path]]) -> None:
    plan, folder = plans["split"]
    broken = dataclasses.replace(plan, stages=tuple(reversed(plan.stages)))
    with pytest.raises(SpecError, match="cannot run in order"):
        PlanExecutor(broken, folder)


def test_a_failing_stage_leaves_no_session_behind(plans: dict[str, tuple[Plan, Path]]) -> None:
    plan, folder = plans["split"]
    feeds = random_inputs(plan.tensors, plan.inputs, seed=1)
    feeds["hidden_states"] = feeds["hidden_states"][..., :3]  # wrong shape: ORT refuses it in the prologue
    host = CountingOrt()
    with pytest.raises(Exception, match=r"dimension|shape|Got invalid"), PlanExecutor(plan, folder, host=host) as ex:
        ex.run(feeds)
    assert not host.counts.live


def test_sessions_do_not_spin() -> None:
    """Spinning intra-op pools of idle stage sessions cost a resident plan 2.3x (see ort.py)."""
    from rkpart.cli_args import bundled_example

    sess = make_session(str(bundled_example()))
    assert sess.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_cli_run_gives_the_same_outputs_under_every_residency(plans: dict[str, tuple[Plan, Path]],
                                                              example_model: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rkpart.cli import main

    _, folder = plans["split"]
    got = {}
    for residency in ("plan", "resident", "per-stage"):
        out = tmp_path / f"{residency}.npz"
        res = CliRunner().invoke(main, ["run", str(folder), "--model", str(example_model), "--residency", residency,
                                        "--save-outputs", str(out), "-q"])
        assert res.exit_code == 0, res.output
        assert "gate: PASS" in res.output
        with np.load(out) as z:
            got[residency] = z["sample"]
    np.testing.assert_array_equal(got["plan"], got["resident"])
    np.testing.assert_array_equal(got["resident"], got["per-stage"])
