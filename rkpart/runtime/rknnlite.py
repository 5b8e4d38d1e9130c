"""Board backend: runs compiled ``.rknn`` stages with rknn-toolkit-lite2 on an RK3588.

The NPU calls are those of the bundle runner (:mod:`rkpart.runtime.board_runner`, the one file a
board bundle ships), so ``rkpart run/profile --backend rknnlite`` and ``python runner.py``
drive the NPU with the same code.  Each lifecycle method is one RKNNLite call, so the
profiler times exactly what the write-up timed (``load_rknn`` / ``init_runtime`` /
``inference`` / ``release``).  ``rknnlite`` exists only for aarch64 and is imported lazily,
in :meth:`RknnLiteBackend.__init__`, so nothing else in rkpart needs the board's libraries.

With ``RKPART_RUNNER_NPU_STANDIN=PLAN_FOLDER`` set, NPU stages run on an ONNX Runtime
stand-in (the stage ``.onnx`` files) instead: for checking the board path on a machine
without an NPU, as the bundle runner does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rkpart.errors import SpecError, ToolkitError
from rkpart.plan.plan import Stage
from rkpart.plan.verify import artifact_file
from rkpart.runtime import board_runner as board
from rkpart.runtime.base import Backend, Feeds, StageRunner
from rkpart.types import JsonObject

#: ``--core-mask`` names and RKNNLite's values (rknn_api.h ``rknn_core_mask``).
CORE_MASKS = board.CORE_MASKS


def _import_rknnlite() -> Any:
    try:
        return board.import_rknnlite()
    except board.BundleError as e:
        raise ToolkitError(str(e)) from None


class RknnLiteRunner(StageRunner):
    def __init__(self, stage: Stage, folder: Path, api: object, core_mask: int, standin: Path | None = None) -> None:
        super().__init__(stage, folder)
        self._session: Any
        if standin is not None:
            try:
                src = board.standin_file(standin, stage.file, stage.sha256)
            except board.BundleError as e:
                raise SpecError(str(e)) from None
            self._session = board.OrtSession(src, stage.inputs, stage.outputs)
            return
        art = stage.artifact("rknn")
        if art is None:
            raise SpecError(f"stage {stage.id} has no compiled .rknn artifact; run `rkpart compile` first")
        path = artifact_file(folder, stage, art)  # confined, regular, sha256 as recorded
        # an int8 / hybrid build takes float32 where the plan passes fp16 (board.npu_inputs)
        self._session = board.RknnLiteSession(path, core_mask, api, stage.id, art.precision)

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except board.BundleError as e:
            raise ToolkitError(str(e)) from None

    def _load_impl(self) -> None:
        self._call(self._session.load)

    def _init_impl(self) -> None:
        self._call(self._session.init)

    def _infer_impl(self, feeds: Feeds) -> Feeds:
        outs = self._call(self._session.infer, [feeds[n] for n in self.stage.inputs])
        return dict(zip(self.stage.outputs, outs, strict=True))

    def _release_impl(self) -> None:
        self._session.release()


class RknnLiteBackend(Backend):
    """Runs NPU stages with RKNNLite; host stages go to the host backend (ORT)."""

    name = "rknnlite"
    devices = ("npu",)

    def __init__(self, core_mask: str = "auto", toolkit: str | None = None) -> None:
        if core_mask not in CORE_MASKS:
            raise SpecError(f"core mask {core_mask!r} is not one of {', '.join(CORE_MASKS)}")
        standin = os.environ.get(board.STANDIN_ENV)
        #: ONNX Runtime stand-in for the NPU (a plan folder), never used on a board
        self.standin = Path(standin) if standin else None
        self._api = None if self.standin is not None else _import_rknnlite()
        self.core_mask = core_mask
        self.toolkit = toolkit

    def runner(self, stage: Stage, folder: Path) -> StageRunner:
        if self.toolkit is not None:
            art = stage.artifact("rknn")
            if art is not None and art.toolkit != self.toolkit:
                raise SpecError(
                    f"stage {stage.id} was built with toolkit {art.toolkit}, not --toolkit {self.toolkit}"
                )
        return RknnLiteRunner(stage, folder, self._api, CORE_MASKS[self.core_mask], self.standin)

    def describe(self) -> JsonObject:
        from importlib import metadata

        try:
            lite = metadata.version("rknn-toolkit-lite2")
        except metadata.PackageNotFoundError:
            lite = None
        d = {
            "backend": self.name,
            "runtime": f"rknn-toolkit-lite2 {lite}" if lite else "rknn-toolkit-lite2",
            "toolkit": self.toolkit,
            "core_mask": self.core_mask,
        }
        if self.standin is not None:
            d["runtime"] = f"ONNX Runtime stand-in for the NPU ({board.STANDIN_ENV})"
        return d
