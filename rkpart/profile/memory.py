"""Memory sampling: process PSS, NPU device-mapped PSS and swap, with its own cost measured.

Two sources feed one time-ordered list of :class:`MemorySample`:

* :class:`Sampler`, a background thread reading ``smaps_rollup`` (process PSS), ``smaps``
  (device PSS, if enabled) and ``/proc/meminfo`` (swap) every ``interval`` seconds, so
  that a peak *inside* a long ``inference`` call is seen;
* :meth:`Sampler.snapshot`, a synchronous read the lifecycle takes between calls (after
  ``init``, after ``inference``, ...), so that short stages are measured even when no tick
  falls inside them.

The write-up's wall time was distorted by its own snapshots.  Here every read is timed:
``cost_s`` on each sample, and :attr:`Sampler.snapshot_s` / :attr:`Sampler.thread_s` give
the totals spent in the main thread and in the sampling thread, which the records report
separately from the lifecycle timings.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rkpart.profile import smaps


@dataclass(frozen=True)
class MemorySample:
    """One reading.  ``t`` is ``time.perf_counter()`` at the start of the read."""

    t: float
    pss_kib: int
    rss_kib: int
    device_pss_kib: int | None  # None when device sampling is off
    swap_used_kib: int
    cost_s: float  # time the read itself took
    sync: bool  # True for a main-thread snapshot, False for a sampler tick


@dataclass(frozen=True)
class Peaks:
    """Maxima over the samples of a set of time intervals."""

    pss_kib: int | None
    device_pss_kib: int | None
    swap_used_kib: int | None
    samples: int


def read_sample(
    pid: int | None = None, *, device_pattern: re.Pattern[str] | None = None, sync: bool = False
) -> MemorySample:
    """Read process PSS, device PSS (if ``device_pattern`` is given) and swap once."""
    t0 = time.perf_counter()
    pid = pid or os.getpid()
    if device_pattern is not None:
        # One full smaps read gives both numbers; reading smaps_rollup as well would double
        # the cost for nothing.
        tot = smaps.read_smaps_totals(pid, device_pattern)
        pss, rss = tot.pss_kib, tot.rss_kib
        dev: int | None = tot.device_pss_kib
    else:
        roll = smaps.read_rollup_kib(pid)
        pss, rss, dev = roll.get("Pss", 0), roll.get("Rss", 0), None
    swap = smaps.swap_used_kib(smaps.read_meminfo())
    t1 = time.perf_counter()
    return MemorySample(t0, pss, rss, dev, swap, t1 - t0, sync)


class Sampler:
    """Background sampler of this process's memory.

    Parameters
    ----------
    interval
        Seconds between ticks of the background thread; ``0`` disables the thread (only
        :meth:`snapshot` readings are taken).
    device_pattern
        Regex of device mapping pathnames (see :data:`smaps.DEFAULT_DEVICE_PATTERN`), or
        ``None`` to skip device PSS (then ``smaps_rollup`` is read, which is cheaper).
    pid
        Process to sample; default this one.

    Examples
    --------
    >>> with Sampler(interval=0.01) as s:
    ...     _ = s.snapshot()
    >>> s.peaks([(0.0, float("inf"))]).pss_kib > 0
    True
    """

    def __init__(
        self,
        interval: float = 0.05,
        *,
        device_pattern: str | re.Pattern[str] | None = smaps.DEFAULT_DEVICE_PATTERN,
        pid: int | None = None,
    ) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0, got {interval}")
        self.interval = interval
        self.pattern = None if device_pattern is None else smaps.compile_pattern(device_pattern)
        self.pid = pid or os.getpid()
        self._samples: list[MemorySample] = []
        self._times: list[float] = []  # start times of _samples, for bisection
        self._max_cost = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.snapshot_s = 0.0  # time spent in main-thread snapshots
        self.snapshots = 0
        self.thread_s = 0.0  # time spent reading in the sampling thread
        self.ticks = 0
        self.baseline_swap_kib = 0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> Sampler:
        first = self.snapshot()
        self.baseline_swap_kib = first.swap_used_kib
        if self.interval > 0:
            self._thread = threading.Thread(target=self._run, name="rkpart-memory-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                s = read_sample(self.pid, device_pattern=self.pattern)
            except OSError:
                # The process may be exiting; a missed tick is not worth failing a profile.
                continue
            with self._lock:
                self._insert(s)
                self.thread_s += s.cost_s
                self.ticks += 1

    # -- readings --------------------------------------------------------------------------
    def snapshot(self) -> MemorySample:
        """Take a synchronous reading now (its cost is added to :attr:`snapshot_s`)."""
        s = read_sample(self.pid, device_pattern=self.pattern, sync=True)
        with self._lock:
            self._insert(s)
            self.snapshot_s += s.cost_s
            self.snapshots += 1
        return s

    def _insert(self, s: MemorySample) -> None:
        # Ticks and snapshots come from two threads; keep the list ordered by start time.
        i = bisect.bisect_right(self._times, s.t)
        self._samples.insert(i, s)
        self._times.insert(i, s.t)
        self._max_cost = max(self._max_cost, s.cost_s)

    @property
    def samples(self) -> list[MemorySample]:
        with self._lock:
            return list(self._samples)

    def peaks(self, intervals: Iterable[tuple[float, float]]) -> Peaks:
        """Maxima over samples that *end* inside any of ``intervals`` (perf_counter times).

        A read started just before an interval and finished inside it still saw memory of
        that interval, hence the end time.
        """
        chosen: dict[int, MemorySample] = {}
        with self._lock:
            for a, b in intervals:
                lo = bisect.bisect_left(self._times, a - self._max_cost)
                hi = bisect.bisect_right(self._times, b)
                for i in range(lo, hi):
                    s = self._samples[i]
                    if a <= s.t + s.cost_s <= b:
                        chosen[i] = s
        return _peaks(list(chosen.values()))

    def all_peaks(self) -> Peaks:
        with self._lock:
            return _peaks(list(self._samples))

    def new_swap_kib(self, peak_swap_used: int | None) -> int:
        """Swap used beyond what was used when the sampler started (never negative)."""
        if peak_swap_used is None:
            return 0
        return max(0, peak_swap_used - self.baseline_swap_kib)


def _peaks(samples: Sequence[MemorySample]) -> Peaks:
    if not samples:
        return Peaks(None, None, None, 0)
    devs = [s.device_pss_kib for s in samples if s.device_pss_kib is not None]
    return Peaks(
        pss_kib=max(s.pss_kib for s in samples),
        device_pss_kib=max(devs) if devs else None,
        swap_used_kib=max(s.swap_used_kib for s in samples),
        samples=len(samples),
    )
