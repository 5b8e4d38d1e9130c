"""Memory-aware parallel builds.

One rknn-toolkit2 build can take 13 GB of RAM (see docs/compile.md), so ``--jobs N`` is an
upper bound, not a promise: another build starts only while the estimated peak RSS of the
running builds plus the next one fits the memory that is available to them.  A build that
does not fit even alone still runs, but alone.

Estimates come from :class:`MemoryModel`: ``base + ratio * stage_bytes`` per toolkit version,
with a conservative default ratio, corrected by the peaks observed in earlier builds (stored
as JSON in the cache directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from rkpart.compile.runner import BuildJob, BuildResult, run_build
from rkpart.errors import UserError
from rkpart.io import atomic_write_bytes, default_cache_dir  # noqa: F401 (default_cache_dir: here before io)
from rkpart.readers import FileKind
from rkpart.types import JsonObject
from rkpart.units import GIB, MIB

#: what importing the toolkit and building a tiny graph costs (measured ~0.5-0.7 GB)
DEFAULT_BASE = 1 * GIB
#: peak RSS per byte of stage (weights + I/O); the reference builds peaked at 25-50x
DEFAULT_RATIO = 60.0
#: learned ratios are scaled up by this before use
LEARN_SAFETY = 1.3
#: memory kept free for everything else on the machine
DEFAULT_MARGIN = 2 * GIB
_SMALL = 16 * MIB  # below this, a stage's peak is dominated by the base cost
MEMORY_FILE = "build-memory.json"
_MAX_OBS = 200  # per toolkit


#: the build memory model (``$RKPART_CACHE_DIR/build-memory.json``); a damaged one is read as empty
MEMORY_KIND = FileKind("build memory file", "json", 16 << 20, UserError, symlinks=False,
                       doc="`$RKPART_CACHE_DIR/build-memory.json`, read by `compile` (damaged: read as empty)")


class MemoryModel:
    """Peak-RSS estimates per (toolkit, stage bytes), learned from observed builds."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._obs: dict[str, list[tuple[int, int]]] = {}
        if path is not None and path.is_file():
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError, UserError):
                data = MEMORY_KIND.load(path)
                self._obs = {k: [(int(b), int(p)) for b, p in v] for k, v in data["observations"].items()}

    def estimate(self, toolkit: str, stage_bytes: int) -> int:
        """Estimated peak RSS (bytes) of building a stage of ``stage_bytes`` with ``toolkit``."""
        obs = self._obs.get(toolkit, [])
        small = [p for b, p in obs if b < _SMALL]
        base = max([DEFAULT_BASE, *small]) if small else DEFAULT_BASE
        big = [(p - base) / b for b, p in obs if b >= _SMALL]
        ratio = max(big) * LEARN_SAFETY if big else DEFAULT_RATIO
        return int(base + ratio * stage_bytes)

    def observe(self, toolkit: str, stage_bytes: int, peak_rss: int) -> None:
        """Record one finished build (successful or not: a crash at the peak still counts)."""
        if peak_rss <= 0:
            return
        lst = self._obs.setdefault(toolkit, [])
        lst.append((int(stage_bytes), int(peak_rss)))
        del lst[:-_MAX_OBS]

    def save(self) -> None:
        """Merge into the file (other runs may have added observations) and write atomically."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_name(self.path.name + ".lock")
        with open(lock, "a") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX)
            on_disk = MemoryModel(self.path)._obs
            merged: dict[str, list[tuple[int, int]]] = {}
            for k in sorted(set(on_disk) | set(self._obs)):
                seen = list(dict.fromkeys([*on_disk.get(k, []), *self._obs.get(k, [])]))
                merged[k] = seen[-_MAX_OBS:]
            data = {"observations": {k: [list(x) for x in v] for k, v in merged.items()}}
            atomic_write_bytes(self.path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def available_memory() -> int:
    """Memory the kernel can give new processes without swapping (bytes)."""
    return int(psutil.virtual_memory().available)


@dataclass
class _Running:
    job: BuildJob
    thread: threading.Thread
    rss: int = 0


#: what :meth:`Scheduler.run` calls with each build event (a dict), not a line of text
Events = Callable[[JsonObject], None]


class Scheduler:
    """Runs build jobs with at most ``jobs`` in parallel, admitted by estimated memory.

    Parameters
    ----------
    jobs
        Upper bound on parallel builds.
    available
        Returns the machine's available memory in bytes (``psutil`` by default; tests pass
        a fixed figure).
    margin
        Bytes kept free for everything else.
    runner
        The function that runs one build (``run_build``).
    """

    def __init__(self, jobs: int = 1, *, available: Callable[[], int] = available_memory,
                 margin: int = DEFAULT_MARGIN, runner: Callable[..., BuildResult] = run_build,
                 tmp_parent: Path | None = None, poll_s: float = 0.1) -> None:
        self.jobs = max(1, int(jobs))
        self.available = available
        self.margin = margin
        self.runner = runner
        self.tmp_parent = tmp_parent
        self.poll_s = poll_s
        #: (start time, estimated peaks of builds running then) per admitted job: for tests/report
        self.admissions: list[tuple[str, list[int]]] = []

    def fits(self, running: Sequence[_Running], job: BuildJob) -> bool:
        """Whether ``job`` may start next to ``running``."""
        if not running:
            return True
        if len(running) >= self.jobs:
            return False
        # Running builds already occupy part of "used"; count them by their estimate instead
        # of their current RSS, because they have not necessarily reached their peak yet.
        budget = self.available() + sum(r.rss for r in running) - self.margin
        return sum(r.job.est_peak_rss for r in running) + job.est_peak_rss <= budget

    def run(self, jobs: Sequence[BuildJob], progress: Events | None = None) -> list[BuildResult]:
        """Run every job; results come back in the order of ``jobs``."""
        say = progress or (lambda _e: None)
        # Largest first: a big build can then start on an empty machine, and small ones
        # backfill around it, so nothing waits forever behind a stream of small builds.
        pending = sorted(jobs, key=lambda j: -j.est_peak_rss)
        results: dict[str, BuildResult] = {}
        running: list[_Running] = []
        lock = threading.Lock()
        t0 = time.monotonic()
        n_total = len(jobs)
        started = 0
        cancel = threading.Event()
        crashed: list[BaseException] = []  # an error in a build thread, re-raised here
        try:
            while pending or running:
                with lock:
                    running = [r for r in running if r.thread.is_alive()]
                    if crashed:
                        raise crashed[0]
                for j in list(pending):
                    with lock:
                        ok = self.fits(running, j)
                    if not ok:
                        continue
                    pending.remove(j)
                    started += 1
                    self.admissions.append((j.stage_id, [r.job.est_peak_rss for r in running]))
                    slot = _Running(job=j, thread=threading.Thread(target=lambda: None))

                    def work(slot: _Running = slot) -> None:
                        def sample(rss: int) -> None:
                            slot.rss = rss

                        try:
                            res = self.runner(slot.job, on_sample=sample, tmp_parent=self.tmp_parent,
                                              cancel=cancel)
                            with lock:
                                results[slot.job.stage_id] = res
                            say({"event": "done", "stage": slot.job.stage_id, "result": res,
                                 "done": len(results), "total": n_total,
                                 "elapsed": time.monotonic() - t0})
                        except KeyboardInterrupt:
                            return
                        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which re-raises it
                            with lock:
                                crashed.append(e)
                            cancel.set()

                    slot.thread = threading.Thread(target=work, name=f"build-{j.stage_id}", daemon=True)
                    with lock:
                        running.append(slot)
                    say({"event": "start", "stage": j.stage_id, "n": started, "total": n_total,
                         "elapsed": time.monotonic() - t0, "est_peak_rss": j.est_peak_rss,
                         "running": len(running)})
                    slot.thread.start()
                if running:
                    time.sleep(self.poll_s)
        except BaseException:
            # Ctrl-C or a bug: stop the compilers still running, then let the error through.
            cancel.set()
            raise
        finally:
            for r in running:
                r.thread.join()
        if crashed:
            raise crashed[0]
        return [results[j.stage_id] for j in jobs]


def memory_in_use() -> int:
    """Bytes of RAM in use on the machine (for progress lines)."""
    vm = psutil.virtual_memory()
    return int(vm.total - vm.available)
