"""Fuzzing: mutated models never make rkpart fail uncontrolled or leave partial output.

Every case runs ``rkpart partition`` in-process (CliRunner) on a mutated copy of a valid
model and asserts: exit 0 with a loadable plan, or a documented user-error exit code with one
clean line on stderr; never an uncaught exception; on failure nothing is written (neither
the output folder nor any staging sibling).  The profile is derandomized so CI runs the
same cases every time; the case count is printed in the terminal summary ("rkpart fuzz").
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rkpart.plan.plan import load_plan
from tests.hostile.models import FUZZ_STATS, USER_EXIT_CODES, cli, mlp, siblings
from tests.hostile.mutations import mutate_bytes, mutate_structure

pytestmark = pytest.mark.slow  # 1000 cases; tests/hostile/test_models.py keeps the hand-made ones fast

FUZZ = settings(
    derandomize=True,  # reproducible in CI: the same cases every run
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                           HealthCheck.data_too_large],
)


def _check_partition(model_bytes: bytes, strategy: str, what: str, test: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="rkfuzz-"))
    try:
        model = work / "model.onnx"
        model.write_bytes(model_bytes)
        out = work / "out"
        r = cli(["partition", model, "-o", out, "-s", strategy, "-q"])
        FUZZ_STATS[f"cases:{test}"] += 1
        FUZZ_STATS[f"exit:{r.exit_code}"] += 1
        assert r.exception is None or isinstance(r.exception, SystemExit), (
            f"{what}: uncontrolled {type(r.exception).__name__}: {r.exception}"
        )
        if r.exit_code == 0:
            load_plan(out)
            return
        assert r.exit_code in USER_EXIT_CODES, f"{what}: exit {r.exit_code}: {r.stderr!r}"
        assert "Traceback" not in r.stderr, what
        errs = [ln for ln in r.stderr.splitlines() if ln.startswith("rkpart: error:")]
        assert len(errs) == 1 and len(r.stderr.strip().splitlines()) == 1, f"{what}: {r.stderr!r}"
        assert not out.exists(), f"{what}: output written on failure"
        assert siblings(out) == [], f"{what}: left {siblings(out)}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


_SEEDS: dict[str, bytes] = {}


@pytest.fixture(scope="module")
def seeds(mini_model: Path, bundled: Path) -> None:
    """Fill the module-level seed table (kept out of the test's arguments: hypothesis would
    print megabytes of model bytes in every failure report)."""
    _SEEDS.update(mini=mini_model.read_bytes(), mlp=mlp().SerializeToString(), bundled=bundled.read_bytes())


@settings(FUZZ, max_examples=400)
@given(data=st.data())
@pytest.mark.usefixtures("seeds")
def test_fuzz_bytes(data: st.DataObject) -> None:
    """Byte flips, overwrites, insertions, deletions and truncations of serialized models."""
    name = data.draw(st.sampled_from(["mini", "mini", "mini", "mlp", "bundled"]), label="seed")
    mutated, what = mutate_bytes(data.draw, _SEEDS[name])
    strategy = data.draw(st.sampled_from(["fused", "split"]), label="strategy")
    _check_partition(mutated, strategy, f"{name}: {what}", "bytes")


@settings(FUZZ, max_examples=600)
@given(data=st.data())
@pytest.mark.usefixtures("seeds")
def test_fuzz_structure(data: st.DataObject) -> None:
    """Structured ModelProto edits: dropped/rewired nodes, dims, dtypes, attributes, names, cycles."""
    name = data.draw(st.sampled_from(["mini", "mini", "mini", "mlp", "bundled"]), label="seed")
    m = onnx.ModelProto.FromString(_SEEDS[name])
    what = mutate_structure(data.draw, m)
    strategy = data.draw(st.sampled_from(["fused", "split"]), label="strategy")
    _check_partition(m.SerializeToString(), strategy, f"{name}: {what}", "structure")


# -- plan folders (issue 13) -------------------------------------------------------------------
# Mutated plan.json, swapped/corrupted/replaced stage files and compiled objects.  Each case
# copies a pristine plan folder next to an ``outside`` folder (targets of planted symlinks),
# runs ``rkpart run`` (ONNX Runtime) or compile (real runner and cache; the build is
# tests/compile/fake_worker.py, a fake that copies the stage: no toolkit needed), bounded in
# time by SIGALRM, and asserts: no uncaught exception or traceback, a documented exit code
# with one error line, nothing written outside the plan folder, and no silent wrong result
# (a run that exits 0 gives the pristine plan's outputs; a compile that succeeds has objects
# equal to the current stage files and stage files equal to plan.json's sha256).

import json  # noqa: E402 - this section's own imports
import os  # noqa: E402
import signal  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from rkpart.errors import UserError  # noqa: E402
from tests.hostile.models import snapshot  # noqa: E402
from tests.hostile.mutations import mutate_plan_files, mutate_plan_json  # noqa: E402

#: seconds one case may take before it counts as a hang
CASE_TIMEOUT_S = 20
#: exit codes a run on a hostile plan may give: user errors, 8 = the gate caught a difference
PLAN_EXIT_CODES = USER_EXIT_CODES | {8, 10}


class _Hang(Exception):
    pass


@contextmanager
def _bounded(seconds: int, what: str) -> Iterator[None]:
    def on_alarm(_sig: int, _frame: Any) -> None:
        raise _Hang(f"{what}: still running after {seconds} s (hang)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


_PRISTINE: dict[str, Any] = {}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, mini_model: Path) -> None:
    """A split plan of the mini DiT (stages with external data), its compiled form (fake
    builds), fixed model inputs and the plan's outputs on them."""
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from rkpart.runtime.executor import random_inputs, run_plan

    root = tmp_path_factory.mktemp("fuzz-plan")
    plan_dir = root / "plan"
    r = cli(["partition", mini_model, "-o", plan_dir, "-s", "split", "-q"])
    assert r.exit_code == 0, r.output
    plan, folder = load_plan(plan_dir)
    feeds = random_inputs(plan.tensors, plan.inputs, 0)
    np.savez(root / "feeds.npz", **feeds)  # type: ignore[arg-type]
    compiled = root / "compiled"
    shutil.copytree(plan_dir, compiled)
    rep = compile_plan_report(plan, compiled, CompileOptions(_fake_toolkit(), "rk3588", {}, worker=_fake_worker(),
                                                             shared_cache=root / "cache-unused"))
    assert not rep.failed
    _PRISTINE.update(plan=plan_dir, compiled=compiled, feeds=root / "feeds.npz",
                     outputs=run_plan(plan, folder, feeds))


def _fake_toolkit() -> Any:
    import sys

    from rkpart.compile.toolkits import Toolkit

    return Toolkit(version="fake", python=Path(sys.executable), managed=False)  # FAKE: fault injection only


def _fake_worker() -> Path:
    return Path(__file__).resolve().parents[1] / "compile" / "fake_worker.py"


def _mutated_case(data: st.DataObject, src: Path) -> tuple[Path, Path, Path, str]:
    work = Path(tempfile.mkdtemp(prefix="rkfuzz-plan-"))
    try:
        return _mutate_into(data, src, work)
    except BaseException:  # hypothesis ends a draw that overruns its data by raising: leave nothing behind
        shutil.rmtree(work, ignore_errors=True)
        raise


def _mutate_into(data: st.DataObject, src: Path, work: Path) -> tuple[Path, Path, Path, str]:
    plan = work / "plan"
    shutil.copytree(src, plan)
    outside = work / "outside"
    outside.mkdir()
    (outside / "secret.onnx").write_bytes(b"not yours")
    os.mkfifo(outside / "fifo")
    what = []
    for _ in range(data.draw(st.integers(1, 2), label="edits")):
        target = data.draw(st.sampled_from(["json", "json", "files", "files", "bytes"]), label="target")
        pj = plan / "plan.json"
        if target == "bytes":
            mutated, w = mutate_bytes(data.draw, pj.read_bytes())
            pj.write_bytes(mutated)
            what.append(f"plan.json bytes: {w}")
            continue
        try:
            d = json.loads(pj.read_text())
            assert isinstance(d, dict) and isinstance(d.get("stages"), list) and isinstance(d.get("tensors"), dict)
            assert all(isinstance(s, dict) for s in d["stages"]) and d["stages"]
            assert all(isinstance(t, dict) and isinstance(t.get("shape"), list) for t in d["tensors"].values())
            assert isinstance(d.get("model"), dict)
            assert isinstance(d.get("inputs"), list) and isinstance(d.get("outputs"), list)
        except (ValueError, AssertionError):
            continue  # an earlier edit broke the structure the structured edits need
        if target == "json":
            what.append(mutate_plan_json(data.draw, d, outside))
            pj.write_text(json.dumps(d))
        else:
            what.append(mutate_plan_files(data.draw, plan, d, outside))
    return work, plan, outside, "; ".join(what)


def _check_outside(work: Path, outside: Path, before: dict[str, str] | None, allowed: set[str], what: str) -> None:
    assert snapshot(outside) == before, f"{what}: something was written outside the plan folder"
    extra = {p.name for p in work.iterdir()} - allowed
    assert not extra, f"{what}: wrote {sorted(extra)} next to the plan folder"


def _run_case(work: Path, plan: Path, what: str) -> Any:
    out = work / "out.npz"
    with _bounded(CASE_TIMEOUT_S, what):
        r = cli(["run", plan, "--inputs", _PRISTINE["feeds"], "--save-outputs", out, "-q"])
    return r, out


@settings(FUZZ, max_examples=400)
@given(data=st.data())
@pytest.mark.slow
@pytest.mark.usefixtures("pristine")
def test_fuzz_plan_folder_run(data: st.DataObject) -> None:
    """``rkpart run`` on a mutated plan folder: a clean refusal, the gate, or the right outputs."""
    work, plan, outside, what = _mutated_case(data, _PRISTINE["plan"])
    try:
        before = snapshot(outside)
        r, out = _run_case(work, plan, what)
        FUZZ_STATS["cases:plan-run"] += 1
        FUZZ_STATS[f"exit:{r.exit_code}"] += 1
        assert r.exception is None or isinstance(r.exception, SystemExit), (
            f"{what}: uncontrolled {type(r.exception).__name__}: {r.exception}")
        assert "Traceback" not in r.stderr, f"{what}: {r.stderr}"
        _check_outside(work, outside, before, {"plan", "outside", "out.npz"}, what)
        if r.exit_code == 0:
            with np.load(out) as z:
                got = {k: z[k] for k in z.files}
            ref = _PRISTINE["outputs"]
            assert set(got) <= set(ref), f"{what}: outputs {sorted(got)} not the model's"
            for k, v in got.items():
                assert np.array_equal(v, ref[k]), f"{what}: exit 0 with a different {k!r} (silent wrong result)"
            return
        assert r.exit_code in PLAN_EXIT_CODES, f"{what}: exit {r.exit_code}: {r.stderr!r}"
        if r.exit_code != 8:  # the gate prints its table, then one error line
            assert len(r.stderr.strip().splitlines()) == 1, f"{what}: {r.stderr!r}"
        assert r.stderr.strip().splitlines()[-1].startswith("rkpart: error:"), f"{what}: {r.stderr!r}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _compile_case(plan: Path, what: str) -> None:
    from rkpart.compile.compile import CompileOptions, compile_plan_report

    with _bounded(CASE_TIMEOUT_S * 2, what):
        p, folder = load_plan(plan)
        compile_plan_report(p, folder, CompileOptions(_fake_toolkit(), "rk3588", {}, worker=_fake_worker(),
                                                      shared_cache=plan.parent / "cache"))


@settings(FUZZ, max_examples=150)
@given(data=st.data())
@pytest.mark.slow
@pytest.mark.usefixtures("pristine")
def test_fuzz_plan_folder_compile(data: st.DataObject, monkeypatch: pytest.MonkeyPatch) -> None:
    """compile on a mutated compiled plan folder: a clean refusal, or objects that match the stages."""
    from rkpart.plan.extract import stage_sha256

    work, plan, outside, what = _mutated_case(data, _PRISTINE["compiled"])
    monkeypatch.setenv("RKPART_CACHE_DIR", str(work / "cache"))
    try:
        before = snapshot(outside)
        try:
            _compile_case(plan, what)
        except UserError as e:
            FUZZ_STATS[f"exit:{e.exit_code}"] += 1
            assert "\n" not in str(e), f"{what}: multi-line error {e}"
        else:
            FUZZ_STATS["exit:0"] += 1
            p, folder = load_plan(plan)
            for s in p.npu_stages:
                art = s.artifact()
                if art is None:
                    continue  # a failure recorded for it (e.g. a planted crash record)
                stage = folder / s.file
                assert stage_sha256(stage) == s.sha256, f"{what}: stage {s.id} compiled from other bytes"
                built = stage  # or the prepared copy compile made of it (a rewrite applied, checked under ORT)
                if s.prepared and s.prepared.get("file"):
                    built = folder / s.prepared["file"]
                    assert built == stage or built.name.startswith(s.sha256[:16]), f"{what}: {s.id}: foreign copy"
                    assert stage_sha256(built) == s.prepared["sha256"], f"{what}: {s.id}: prepared copy edited"
                assert (folder / art.file).read_bytes() == built.read_bytes(), (
                    f"{what}: stage {s.id}: object is not the build of its stage (silent wrong result)")
        FUZZ_STATS["cases:plan-compile"] += 1
        _check_outside(work, outside, before, {"plan", "outside", "cache"}, what)
    finally:
        shutil.rmtree(work, ignore_errors=True)
