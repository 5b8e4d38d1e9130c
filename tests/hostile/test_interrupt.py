"""Interrupted and concurrent ``rkpart partition`` runs (issue 8, item 4).

Real processes, real SIGKILL: a run killed anywhere leaves the previous complete output (or
none) plus a resumable staging folder; a rerun finishes it, reports resumed stages, and the
result is byte-identical to an uninterrupted run.  Kill points are random but seeded.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rkpart.io import folder_lock
from rkpart.pipeline import partition
from tests.hostile.models import assert_user_error, cli, siblings, snapshot

# outside the fast tier: signals to CLI processes (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

RKPART = [sys.executable, "-m", "rkpart.cli"]


def _start(model: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*RKPART, "partition", str(model), "-o", str(out), "-s", "split", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RKPART, "partition", str(model), "-o", str(out), "-s", "split", *extra],
                          capture_output=True, text=True, timeout=120)


def _kill_at(proc: subprocess.Popen[str], staging: Path, rng: random.Random) -> str:
    """SIGKILL ``proc`` at a random point: after a random delay, or once the staging folder
    holds a random number of files (so kills also land while stages are being written)."""
    if rng.random() < 0.4:
        delay = rng.uniform(0.0, 2.5)
        time.sleep(delay)
        where = f"after {delay:.2f}s"
    else:
        want = rng.randint(1, 24)
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 30:
            n = sum(1 for _ in staging.rglob("*")) if staging.exists() else 0
            if n >= want:
                break
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.05))
        where = f"at ~{want} staged files"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return where


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, bundled: Path) -> dict[str, str]:
    out = tmp_path_factory.mktemp("ref") / "plan"
    partition(bundled, out, "split")
    snap = snapshot(out)
    assert snap is not None
    return snap


@pytest.mark.slow
def test_partition_is_deterministic(tmp_path: Path, bundled: Path, reference: dict[str, str]) -> None:
    """Two independent runs (other folder, other cwd, relative path) give identical bytes."""
    r = subprocess.run([*RKPART, "partition", str(bundled), "-o", "again", "-s", "split", "-q"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert snapshot(tmp_path / "again") == reference


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(6))
def test_sigkill_then_resume_is_byte_identical(
    tmp_path: Path, bundled: Path, reference: dict[str, str], trial: int
) -> None:
    rng = random.Random(8000 + trial)
    out = tmp_path / "plan"
    staging = tmp_path / ".plan.partial"
    where = _kill_at(_start(bundled, out), staging, rng)
    # killed before the final rename: no output at all; after it: the complete output
    state = snapshot(out)
    assert state is None or state == reference, f"killed {where}: corrupt output"
    if trial % 2:  # kill the resumed run too
        where += "; " + _kill_at(_start(bundled, out), staging, rng)
        state = snapshot(out)
        assert state is None or state == reference, f"killed {where}: corrupt output"
    r = _finish(bundled, out, *(["--force"] if state is not None else []))
    assert r.returncode == 0, f"killed {where}; rerun failed: {r.stderr}"
    assert snapshot(out) == reference, f"killed {where}: resumed output differs"
    assert siblings(out) == [], f"killed {where}: left {siblings(out)}"


def _journaled(staging: Path) -> int:
    """Stages the run has recorded as finished (complete lines of its resume journal)."""
    try:
        return (staging / "stages" / "done.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_resume_reports_resumed_stages(tmp_path: Path, bundled: Path, reference: dict[str, str]) -> None:
    """Deterministic variant: kill once at least 6 stage files are staged, then resume."""
    out = tmp_path / "plan"
    staging = tmp_path / ".plan.partial"
    proc = _start(bundled, out)
    while (proc.poll() is None and not (staging / "stages").exists()) or _journaled(staging) < 3:
        assert proc.poll() is None, "finished before it could be killed"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not out.exists()
    done = _journaled(staging)
    r = _finish(bundled, out)
    assert r.returncode == 0, r.stderr
    resumed = [ln for ln in r.stderr.splitlines() if "(resumed)" in ln]
    assert len(resumed) >= done >= 3
    assert snapshot(out) == reference


@pytest.mark.slow
def test_sigkill_during_force_replace_keeps_old_or_new(
    tmp_path: Path, bundled: Path, reference: dict[str, str]
) -> None:
    """Replacing an existing plan with --force: a kill leaves the old plan or the new one."""
    out = tmp_path / "plan"
    partition(bundled, out, "fused")
    old = snapshot(out)
    rng = random.Random(81)
    seen = set()
    for _ in range(4):
        _kill_at(_start(bundled, out, "--force"), tmp_path / ".plan.partial", rng)
        state = snapshot(out)
        assert state in (old, reference), "half-replaced output"
        seen.add("old" if state == old else "new")
        if state == reference:
            break
    r = _finish(bundled, out, "--force")
    assert r.returncode == 0, r.stderr
    assert snapshot(out) == reference
    assert siblings(out) == []


def test_second_concurrent_run_is_refused(tmp_path: Path, bundled: Path) -> None:
    """Another process holds the output's lock: a second run exits 6, writes nothing."""
    out = tmp_path / "plan"
    staging = tmp_path / ".plan.partial"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom rkpart.io import folder_lock\n"
         f"with folder_lock({str(staging)!r}):\n    print('locked', flush=True)\n    time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        before = snapshot(staging)
        r = cli(["partition", bundled, "-o", out, "-s", "fused", "-q"])
        assert_user_error(r, 6, "in use by another rkpart run", str(out))
        assert not out.exists()
        assert snapshot(staging) == before  # the other run's staging folder is untouched
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_two_racing_runs_one_wins(tmp_path: Path, bundled: Path, reference: dict[str, str]) -> None:
    """Two real runs started together: one writes the plan, the other is refused cleanly."""
    out = tmp_path / "plan"
    procs = [_start(bundled, out, "-q"), _start(bundled, out, "-q")]
    results = [(p.wait(timeout=120), p.communicate()[1]) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 6], results
    loser = next(err for rc, err in results if rc == 6)
    assert "Traceback" not in loser
    assert "in use by another rkpart run" in loser or "is not empty" in loser, loser
    assert snapshot(out) == reference


def test_stale_lock_after_kill_does_not_block(tmp_path: Path, bundled: Path) -> None:
    """The lock is a flock on the folder: it dies with the killed process (no stale lock file)."""
    staging = tmp_path / ".plan.partial"
    with folder_lock(staging):
        pass
    assert os.listdir(staging) == []
    r = cli(["partition", bundled, "-o", tmp_path / "plan", "-s", "fused", "-q"])
    assert r.exit_code == 0, r.output


_WRITER = """
import sys
from rkpart.io import atomic_write_bytes
path = sys.argv[1]
blobs = [bytes([65]) * (8 << 20), bytes([66]) * (6 << 20)]
print("ready", flush=True)
i = 0
while True:
    atomic_write_bytes(path, blobs[i % 2])
    i += 1
"""


def test_atomic_write_survives_sigkill(tmp_path: Path) -> None:
    """A process rewriting a file in a loop is SIGKILLed at random points: the file always
    holds one complete version, and no temp file survives a rerun's sweep of ``.*.tmp``."""
    target = tmp_path / "data.bin"
    rng = random.Random(4)
    good = {b"A" * (8 << 20), b"B" * (6 << 20)}
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if target.exists():
            assert target.read_bytes() in good
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "data.bin"]
    assert all(n.startswith(".data.bin.") and n.endswith(".tmp") for n in leftovers), leftovers


def test_force_replace_is_refused_while_the_plan_is_in_use(tmp_path: Path, mini_model: Path) -> None:
    """``partition --force`` onto a plan folder that another run (e.g. compile) holds is refused
    and leaves both the plan and the other run's lock alone."""
    out = tmp_path / "plan"
    partition(mini_model, out, "fused")
    before = snapshot(out)
    with folder_lock(out):  # what `rkpart compile` holds while it builds
        r = cli(["partition", mini_model, "-o", out, "-s", "split", "--force", "-q"])
        assert_user_error(r, 6, "in use by another rkpart run")
    assert snapshot(out) == before
    assert siblings(out) == []
