"""A counting wrapper around the REAL ONNX Runtime backend (not a fake: every call runs ORT).

It records which stage ids had a session created (``init``), were run (``infer``) and were
released, so tests can assert how often sessions are created under a residency policy and
which stages a command executed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rkpart.plan.plan import Stage
from rkpart.runtime.base import Backend, Feeds, StageRunner
from rkpart.runtime.ort import OrtBackend


class Counts:
    def __init__(self) -> None:
        self.init: Counter[str] = Counter()
        self.infer: Counter[str] = Counter()
        self.release: Counter[str] = Counter()

    @property
    def live(self) -> set[str]:
        return {k for k in self.init if self.init[k] > self.release[k]}


class _Counting(StageRunner):
    def __init__(self, inner: StageRunner, counts: Counts) -> None:
        super().__init__(inner.stage, inner.folder)
        self.inner = inner
        self.counts = counts

    def _load_impl(self) -> None:
        self.inner.load()

    def _init_impl(self) -> None:
        self.inner.init()
        self.counts.init[self.stage.id] += 1

    def _infer_impl(self, feeds: Feeds) -> Feeds:
        self.counts.infer[self.stage.id] += 1
        return self.inner.infer(feeds)

    def _release_impl(self) -> None:
        if self.inner._state in ("ready",):  # a released runner was initialised
            self.counts.release[self.stage.id] += 1
        self.inner.release()


class CountingOrt(Backend):
    """Real :class:`OrtBackend`, every runner wrapped in a counter."""

    def __init__(self, name: str = "ort", devices: tuple[str, ...] = ("npu", "host")) -> None:
        self.inner = OrtBackend(threads=1)
        self.name = name
        self.devices = devices
        self.counts = Counts()

    def runner(self, stage: Stage, folder: Path) -> StageRunner:
        return _Counting(self.inner.runner(stage, folder), self.counts)

    def fused_runner(self, stages: Sequence[Stage], folder: Path) -> StageRunner | None:
        r = self.inner.fused_runner(stages, folder)
        return None if r is None else _Counting(r, self.counts)
