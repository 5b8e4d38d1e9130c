"""The rknn-toolkit2 simulator backend against ONNX Runtime, and the board backend's error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rkpart.compile.compile import compile_plan
from rkpart.compile.toolkits import Toolkit
from rkpart.errors import ToolkitError
from rkpart.plan.plan import Plan
from rkpart.runtime.base import Feeds
from rkpart.runtime.ort import OrtBackend
from rkpart.runtime.rknn_sim import RknnSimBackend
from rkpart.runtime.rknnlite import RknnLiteBackend
from tests.compile.plans import tiny_plan
from tests.toolkits import get_toolkit


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def _feeds() -> Feeds:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((1, 8, 16)).astype(np.float32),
            "f": rng.standard_normal((1, 8, 16)).astype(np.float32),
            "img": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)}


def _run(backend: object, plan: Plan, folder: Path, sid: str, feeds: Feeds) -> Feeds:
    r = backend.runner(plan.stage(sid), folder)  # type: ignore[attr-defined]
    r.load()
    r.init()
    try:
        return r.infer(feeds)
    finally:
        r.release()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, Path]:
    tk = get_toolkit("2.3.0")
    folder = tmp_path_factory.mktemp("plan")
    return compile_plan(tiny_plan(folder), folder, tk, "rk3588", {}, jobs=2), folder


@pytest.mark.toolkit
@pytest.mark.parametrize("sid", ["ffn", "erf", "conv"])
def test_simulator_matches_onnxruntime(compiled: tuple[Plan, Path], sid: str) -> None:
    plan, folder = compiled
    feeds = _feeds()
    sim = _run(RknnSimBackend(), plan, folder, sid, feeds)  # toolkit taken from the artifact
    ref = _run(OrtBackend(), plan, folder, sid, feeds)
    for name in plan.stage(sid).outputs:
        assert sim[name].shape == ref[name].shape  # conv: 4-D NCHW in and out
        assert sim[name].dtype == np.float32
        assert _cosine(sim[name], ref[name]) >= 0.999
        assert np.abs(sim[name] - ref[name]).max() < 1e-2  # fp16 on the NPU


@pytest.mark.toolkit
def test_fp16_feeds_are_accepted_and_outputs_keep_the_declared_dtype(compiled: tuple[Plan, Path]) -> None:
    plan, folder = compiled
    feeds = {k: v.astype(np.float16) for k, v in _feeds().items()}
    out = _run(RknnSimBackend("2.3.0"), plan, folder, "erf", feeds)
    ref = _run(OrtBackend(), plan, folder, "erf", {k: v.astype(np.float32) for k, v in feeds.items()})
    assert out["e"].dtype == np.float32
    assert _cosine(out["e"], ref["e"]) >= 0.999


@pytest.mark.toolkit
def test_one_session_serves_many_inferences(compiled: tuple[Plan, Path]) -> None:
    plan, folder = compiled
    r = RknnSimBackend().runner(plan.stage("ffn"), folder)
    r.load()
    r.init()
    a = r.infer(_feeds())["f"]
    b = r.infer({"x": _feeds()["x"] * 2})["f"]
    r.release()
    assert not np.allclose(a, b)
    assert r._hosted is None  # type: ignore[attr-defined]


def test_stage_without_artifact_needs_a_toolkit(tmp_path: Path) -> None:
    plan = tiny_plan(tmp_path)
    r = RknnSimBackend().runner(plan.stage("ffn"), tmp_path)
    with pytest.raises(ToolkitError, match="has no rknn artifact"):
        r.load()


def test_unknown_toolkit_version_is_a_user_error(tmp_path: Path) -> None:
    plan = tiny_plan(tmp_path)
    r = RknnSimBackend("9.9.9", toolkits_dir=tmp_path / "none").runner(plan.stage("ffn"), tmp_path)
    with pytest.raises(ToolkitError, match=r"rknn-toolkit2 9\.9\.9 is not installed"):
        r.load()


def test_simulator_crash_is_reported_not_raised_as_a_bug(tmp_path: Path) -> None:
    # A FAKE simulator worker that dies at once stands in for a simulator segfault.
    fake = tmp_path / "dying_worker.py"
    fake.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    import sys

    plan = tiny_plan(tmp_path)
    be = RknnSimBackend("fake", worker=fake)
    be._resolved["fake"] = Toolkit(version="fake", python=Path(sys.executable), managed=False)
    r = be.runner(plan.stage("ffn"), tmp_path)
    with pytest.raises(ToolkitError, match=r"simulator crashed: SIGSEGV \(exit 139\) during load"):
        r.load()


def test_rknnlite_backend_explains_that_it_needs_the_board() -> None:
    try:
        import rknnlite  # noqa: F401

        pytest.skip("rknn-toolkit-lite2 is installed here")
    except ImportError:
        pass
    with pytest.raises(ToolkitError, match="needs rknn-toolkit-lite2 on the board"):
        RknnLiteBackend()


# -- shared workers ------------------------------------------------------------------------------
SIDS = ("ffn", "erf", "conv")


def _resident(backend: RknnSimBackend, plan: Plan, folder: Path, rounds: int = 2) -> list[Feeds]:
    """Every stage loaded at once, then inferred round after round (what a resident plan does)."""
    runners = [backend.runner(plan.stage(s), folder) for s in SIDS]
    for r in runners:
        r.load()
        r.init()
    try:
        return [r.infer(_feeds()) for _ in range(rounds) for r in runners]
    finally:
        for r in runners:
            r.release()


@pytest.mark.toolkit
def test_one_shared_worker_hosts_every_stage_with_results_equal_to_one_worker_each(
        compiled: tuple[Plan, Path]) -> None:
    plan, folder = compiled
    shared, single = RknnSimBackend(), RknnSimBackend(shared=False)
    try:
        a, b = _resident(shared, plan, folder), _resident(single, plan, folder)
        assert (shared.pool.stats["workers"], single.pool.stats["workers"]) == (1, len(SIDS))
        assert shared.pool.stats["builds"] == len(SIDS) and shared.pool.stats["evictions"] == 0
        baseline, per_model = shared.pool.learned
        assert baseline > 100 << 20 and 0 < per_model < baseline  # tiny models, a toolkit-sized process
        # one process hosting three models is still one process, not three
        assert shared.pool.stats["peak_rss"] < single.pool.stats["peak_rss"] * len(SIDS)
        for x, y in zip(a, b, strict=True):
            assert x.keys() == y.keys()
            assert all(np.array_equal(x[k], y[k]) for k in x)  # bit-equal
        assert len(shared.pool.sessions) == 1  # released models leave the worker up for the next ones
    finally:
        shared.close()
        single.close()
    assert not shared.pool.sessions


@pytest.mark.toolkit
def test_over_the_memory_budget_idle_models_are_evicted_and_rebuilt_with_equal_results(
        compiled: tuple[Plan, Path]) -> None:
    plan, folder = compiled
    roomy, tight = RknnSimBackend(), RknnSimBackend(memory_budget=1)  # 1 byte: nothing else may stay
    try:
        a, b = _resident(roomy, plan, folder), _resident(tight, plan, folder)
        assert roomy.pool.stats["evictions"] == roomy.pool.stats["rebuilds"] == 0
        st = tight.pool.stats
        assert st["workers"] == 1 and st["evictions"] >= len(SIDS) and st["rebuilds"] >= len(SIDS)
        assert st["builds"] == len(SIDS) + st["rebuilds"]
        for x, y in zip(a, b, strict=True):
            assert all(np.array_equal(x[k], y[k]) for k in x)
    finally:
        roomy.close()
        tight.close()


@pytest.mark.toolkit
def test_a_worker_crash_fails_every_stage_it_hosts_and_the_next_stage_gets_a_new_worker(
        compiled: tuple[Plan, Path]) -> None:
    import os
    import signal

    plan, folder = compiled
    be = RknnSimBackend()
    runners = [be.runner(plan.stage(s), folder) for s in SIDS]
    try:
        for r in runners:
            r.load()
            r.init()
        (session,) = be.pool.sessions.values()
        os.kill(session.proc.pid, signal.SIGKILL)  # the real worker dies, as a segfault or the OOM killer would
        with pytest.raises(ToolkitError, match=r"stage ffn: .*simulator crashed: SIGKILL.* during infer.*"
                                               r"also hosted stage\(s\) conv, erf, which fail"):
            runners[0].infer(_feeds())
        for r in runners[1:]:
            with pytest.raises(ToolkitError,
                               match=rf"stage {r.stage.id}: .*worker died while running stage ffn: .*crashed: SIGKILL"):
                r.infer(_feeds())
        for r in runners:
            r.release()  # releasing a model of a dead worker is not an error
        fresh = be.runner(plan.stage("erf"), folder)
        fresh.load()
        fresh.init()
        ref = _run(OrtBackend(), plan, folder, "erf", _feeds())
        assert _cosine(fresh.infer(_feeds())["e"], ref["e"]) >= 0.999
        fresh.release()
        assert be.pool.stats["workers"] == 2
    finally:
        be.close()
