"""Memory-aware admission of parallel builds, and the learned memory model.

The admission tests use a FAKE in-process runner (it sleeps and counts concurrency) because
the question is only which builds the scheduler lets run together."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from rkpart.compile.runner import BuildJob, BuildResult
from rkpart.compile.scheduler import DEFAULT_BASE, DEFAULT_RATIO, MemoryModel, Scheduler
from rkpart.compile.toolkits import Toolkit
from rkpart.units import GIB

TK = Toolkit(version="fake", python=Path("/bin/false"), managed=False)


class FakeRunner:
    """Sleeps instead of building; records the largest set of simultaneously running stages."""

    def __init__(self, sleep: float = 0.15) -> None:
        self.sleep = sleep
        self.running: set[str] = set()
        self.max_together: list[set[str]] = []
        self.lock = threading.Lock()

    def __call__(self, job: BuildJob, **_: Any) -> BuildResult:
        with self.lock:
            self.running.add(job.stage_id)
            self.max_together.append(set(self.running))
        time.sleep(self.sleep)
        with self.lock:
            self.running.discard(job.stage_id)
        return BuildResult(stage_id=job.stage_id, ok=True, kind="ok", message="", toolkit="fake", exit_code=0,
                           signal=None, wall_s=self.sleep, peak_rss_bytes=0, rknn_size=0, log=job.log,
                           last_step=None)


def _job(sid: str, est_gb: float) -> BuildJob:
    return BuildJob(stage_id=sid, onnx=Path(f"{sid}.onnx"), output=Path(f"{sid}.rknn"), log=Path(f"{sid}.log"),
                    config={}, toolkit=TK, est_peak_rss=int(est_gb * GIB))


def _peak_parallel(fake: FakeRunner) -> int:
    return max(len(s) for s in fake.max_together)


def test_jobs_bound_parallelism_when_memory_is_plenty() -> None:
    fake = FakeRunner()
    s = Scheduler(2, available=lambda: 100 * GIB, margin=0, runner=fake, poll_s=0.01)
    res = s.run([_job(f"s{i}", 1) for i in range(5)])
    assert [r.stage_id for r in res] == [f"s{i}" for i in range(5)]  # results in job order
    assert _peak_parallel(fake) == 2


def test_memory_limits_parallelism_below_jobs() -> None:
    # 10 GB available, 2 GB margin, 3 GB per build: only two fit together, although jobs=4.
    fake = FakeRunner()
    s = Scheduler(4, available=lambda: 10 * GIB, margin=2 * GIB, runner=fake, poll_s=0.01)
    s.run([_job(f"s{i}", 3) for i in range(6)])
    assert _peak_parallel(fake) == 2


def test_a_build_too_big_for_the_machine_runs_alone() -> None:
    fake = FakeRunner()
    s = Scheduler(4, available=lambda: 8 * GIB, margin=0, runner=fake, poll_s=0.01)
    s.run([_job("huge", 13), _job("a", 1), _job("b", 1)])
    together = [t for t in fake.max_together if "huge" in t]
    assert together and all(t == {"huge"} for t in together)
    # ...and the small ones may then run together
    assert {"a", "b"} in fake.max_together


def test_small_builds_backfill_next_to_a_big_one() -> None:
    fake = FakeRunner()
    s = Scheduler(3, available=lambda: 10 * GIB, margin=0, runner=fake, poll_s=0.01)
    s.run([_job("small1", 1), _job("big", 8), _job("small2", 1)])
    assert s.admissions[0][0] == "big"  # largest first
    assert {"big", "small1"} in fake.max_together


def test_memory_model_defaults_and_learning(tmp_path: Path) -> None:
    m = MemoryModel(tmp_path / "mem.json")
    assert m.estimate("2.3.0", 100 * 2**20) == int(DEFAULT_BASE + DEFAULT_RATIO * 100 * 2**20)
    # A build of a 100 MB stage peaked at 3 GB: the estimate for 200 MB follows that ratio,
    # with a safety factor, and is below the default's.
    m.observe("2.3.0", 100 * 2**20, 3 * GIB)
    learned = m.estimate("2.3.0", 200 * 2**20)
    assert learned - DEFAULT_BASE > 200 * 2**20 * (3 * GIB - DEFAULT_BASE) / (100 * 2**20)
    assert learned < int(DEFAULT_BASE + DEFAULT_RATIO * 200 * 2**20)
    assert m.estimate("2.5.0", 200 * 2**20) == int(DEFAULT_BASE + DEFAULT_RATIO * 200 * 2**20)
    m.save()
    again = MemoryModel(tmp_path / "mem.json")
    assert again.estimate("2.3.0", 200 * 2**20) == learned


def test_memory_model_merges_concurrent_writers(tmp_path: Path) -> None:
    a, b = MemoryModel(tmp_path / "mem.json"), MemoryModel(tmp_path / "mem.json")
    a.observe("2.3.0", 50 * 2**20, 2 * GIB)
    b.observe("2.5.0", 50 * 2**20, 1 * GIB)
    a.save()
    b.save()
    c = MemoryModel(tmp_path / "mem.json")
    assert c.estimate("2.3.0", 50 * 2**20) != c.estimate("2.5.0", 50 * 2**20)
