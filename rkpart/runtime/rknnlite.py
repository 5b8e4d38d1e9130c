"""Board backend: runs compiled ``.rknn`` stages with rknn-toolkit-lite2 on an RK3588.

Kept thin on purpose: each lifecycle method is one RKNNLite call, so the profiler times
exactly what the write-up timed (``load_rknn`` / ``init_runtime`` / ``inference`` /
``release``).  ``rknnlite`` exists only for aarch64 and is imported lazily, in
:meth:`RknnLiteBackend.__init__`, so nothing else in rkpart needs the board's libraries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rkpart.errors import SpecError, ToolkitError
from rkpart.partitioner.plan import Stage
from rkpart.partitioner.verify import artifact_file
from rkpart.runtime.base import Backend, Feeds, StageRunner

#: ``--core-mask`` names and RKNNLite's values (rknn_api.h ``rknn_core_mask``).
CORE_MASKS = {
    "auto": 0,
    "0": 1,
    "1": 2,
    "2": 4,
    "0_1": 3,
    "0_1_2": 7,
    "all": 0xFFFF,
}


def _import_rknnlite() -> Any:
    try:
        from rknnlite.api import RKNNLite
    except ImportError as e:
        raise ToolkitError(
            f"the rknnlite backend needs rknn-toolkit-lite2 on the board (pip install rknn-toolkit-lite2): {e}"
        ) from None
    return RKNNLite


class RknnLiteRunner(StageRunner):
    def __init__(self, stage: Stage, folder: Path, api: Any, core_mask: int) -> None:
        super().__init__(stage, folder)
        art = stage.artifact("rknn")
        if art is None:
            raise SpecError(f"stage {stage.id} has no compiled .rknn artifact; run `rkpart compile` first")
        self._path = artifact_file(folder, stage, art)  # confined, regular, sha256 as recorded
        self._api = api
        self._core_mask = core_mask
        self._rknn: Any = None

    def _load_impl(self) -> None:
        self._rknn = self._api(verbose=False)
        ret = self._rknn.load_rknn(str(self._path))
        if ret != 0:
            raise ToolkitError(f"stage {self.stage.id}: load_rknn({self._path}) returned {ret}")

    def _init_impl(self) -> None:
        ret = self._rknn.init_runtime(core_mask=self._core_mask)
        if ret != 0:
            raise ToolkitError(
                f"stage {self.stage.id}: init_runtime returned {ret} "
                "(an 'Invalid RKNN model version' log line means the board runtime is older than the toolkit)"
            )

    def _infer_impl(self, feeds: Feeds) -> Feeds:
        arrays = [np.ascontiguousarray(feeds[n]) for n in self.stage.inputs]
        # 4-D inputs are given as NCHW like the ONNX graph; the runtime converts them itself.
        fmt = ["nchw" if a.ndim == 4 else None for a in arrays]
        outs = self._rknn.inference(inputs=arrays, data_format=fmt if any(fmt) else None)
        if outs is None:
            raise ToolkitError(f"stage {self.stage.id}: inference returned no outputs")
        return dict(zip(self.stage.outputs, outs, strict=True))

    def _release_impl(self) -> None:
        if self._rknn is not None:
            self._rknn.release()
            self._rknn = None


class RknnLiteBackend(Backend):
    """Runs NPU stages with RKNNLite; host stages go to the host backend (ORT)."""

    name = "rknnlite"
    devices = ("npu",)

    def __init__(self, core_mask: str = "auto", toolkit: str | None = None) -> None:
        if core_mask not in CORE_MASKS:
            raise SpecError(f"core mask {core_mask!r} is not one of {', '.join(CORE_MASKS)}")
        self._api = _import_rknnlite()
        self.core_mask = core_mask
        self.toolkit = toolkit

    def runner(self, stage: Stage, folder: Path) -> StageRunner:
        if self.toolkit is not None:
            art = stage.artifact("rknn")
            if art is not None and art.toolkit != self.toolkit:
                raise SpecError(
                    f"stage {stage.id} was built with toolkit {art.toolkit}, not --toolkit {self.toolkit}"
                )
        return RknnLiteRunner(stage, folder, self._api, CORE_MASKS[self.core_mask])

    def describe(self) -> dict[str, Any]:
        from importlib import metadata

        try:
            lite = metadata.version("rknn-toolkit-lite2")
        except metadata.PackageNotFoundError:
            lite = None
        return {
            "backend": self.name,
            "runtime": f"rknn-toolkit-lite2 {lite}" if lite else "rknn-toolkit-lite2",
            "toolkit": self.toolkit,
            "core_mask": self.core_mask,
        }
