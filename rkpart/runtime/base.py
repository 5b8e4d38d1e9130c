"""The backend interface every executor implements (ONNX Runtime, toolkit simulator, board).

Modelled on Polygraphy's runners: a :class:`Backend` hands out one :class:`StageRunner` per
stage, and the runner goes through the same lifecycle the RKNN runtime has on the board,
``load -> init -> infer* -> release``.  The profiler times exactly these calls, so every
backend must do its real work in the matching method (file reading in ``load``, context or
session creation in ``init``).  As a context manager a runner is loaded and initialised on entry
and released on exit; given the plan's boundary types (:meth:`StageRunner.expect`) it checks the
inputs of its first inference against them, as Polygraphy checks a feed against a model's input
metadata.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

import numpy as np

from rkpart.errors import InternalError, SpecError
from rkpart.plan.plan import Stage, TensorInfo
from rkpart.types import JsonObject

Feeds = dict[str, np.ndarray]


class StageRunner(abc.ABC):
    """Runs one stage. Subclasses implement the ``_*_impl`` methods; the base checks order."""

    def __init__(self, stage: Stage, folder: Path) -> None:
        self.stage = stage
        self.folder = folder
        self._state = "new"
        #: the stage inputs' types the first inference is checked against (:meth:`expect`)
        self._expected: Mapping[str, TensorInfo] | None = None

    def __enter__(self) -> Self:
        """The runner loaded and initialised (what the board's runtime is before its first inference)."""
        try:
            if self._state == "new":
                self.load()
            if self._state == "loaded":
                self.init()
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def expect(self, tensors: Mapping[str, TensorInfo]) -> Self:
        """Check the first inference's inputs against ``tensors`` (the plan's boundary types: each
        input an array of the declared dtype and shape); returns the runner."""
        self._expected = {n: tensors[n] for n in self.stage.inputs if n in tensors}
        return self

    # Lifecycle, checked here so every backend behaves the same.
    def load(self) -> None:
        self._expect("new", "load")
        self._load_impl()
        self._state = "loaded"

    def init(self) -> None:
        self._expect("loaded", "init")
        self._init_impl()
        self._state = "ready"

    def infer(self, feeds: Feeds) -> Feeds:
        # Called once per stage and pass: kept to one dict build each way (a plan of small
        # stages spends a measurable share of its time here).
        out = self._infer_impl(self._inputs_from(feeds))
        return {n: out[n] for n in self.stage.outputs}

    def infer_into(self, env: dict[str, np.ndarray]) -> None:
        """:meth:`infer` on ``env`` with the outputs stored back into ``env`` (the executor's hot path).

        Backends may override it with a leaner call; it must behave exactly like this.
        """
        env.update(self.infer(env))

    def release(self) -> None:
        if self._state == "released":
            return
        self._release_impl()
        self._state = "released"

    def _inputs_from(self, env: Mapping[str, np.ndarray]) -> Feeds:
        """The stage's inputs picked from ``env``, once the runner is ready (for :meth:`infer` and
        leaner :meth:`infer_into` overrides alike)."""
        if self._state != "ready":
            self._expect("ready", "infer")
        try:
            feeds = {n: env[n] for n in self.stage.inputs}
        except KeyError as e:
            raise InternalError(f"stage {self.stage.id}: missing input {e.args[0]!r}") from None
        if self._expected is not None:  # once: the shapes of a stage's inputs do not change between passes
            self._check(feeds, self._expected)
            self._expected = None
        return feeds

    def _check(self, feeds: Feeds, expected: Mapping[str, TensorInfo]) -> None:
        for n, info in expected.items():
            a = feeds[n]
            if not isinstance(a, np.ndarray) or tuple(a.shape) != tuple(info.shape) or a.dtype.name != info.dtype:
                got = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
                raise SpecError(f"stage {self.stage.id} input {n!r}: dtype and shape {got}, plan.json declares "
                                f"{info.dtype}{list(info.shape)}")

    def _expect(self, state: str, call: str) -> None:
        if self._state != state:
            raise InternalError(f"stage {self.stage.id}: {call}() called in state {self._state!r}")

    @abc.abstractmethod
    def _load_impl(self) -> None: ...

    @abc.abstractmethod
    def _init_impl(self) -> None: ...

    @abc.abstractmethod
    def _infer_impl(self, feeds: Feeds) -> Feeds: ...

    @abc.abstractmethod
    def _release_impl(self) -> None: ...


class Backend(abc.ABC):
    """Creates runners for the stages of one plan folder."""

    name: str = ""
    #: devices this backend executes; other stages go to the host backend (ORT)
    devices: tuple[str, ...] = ("npu", "host")

    @abc.abstractmethod
    def runner(self, stage: Stage, folder: Path) -> StageRunner: ...

    def fused_runner(self, stages: Sequence[Stage], folder: Path) -> StageRunner | None:
        """One runner for consecutive ``stages`` (one session), or ``None`` if not supported.

        Its stage is :func:`rkpart.runtime.ort.fused_stage` of ``stages``: it reads what they
        read from outside the run and returns every output of every member.
        """
        return None

    def describe(self) -> JsonObject:
        """Versions and machine facts recorded with measurements."""
        return {"backend": self.name}

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Free anything shared between runners (worker processes, ...)."""
