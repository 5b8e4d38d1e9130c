"""A stand-in for the board's ``RKNNLite`` that runs each ``.rknn`` stage in rknn-toolkit2's simulator.

The simulator cannot run a ``.rknn`` file (``load_rknn`` + ``init_runtime()`` is refused), so, as
``rkpart run --backend rknn-sim`` does, each stage is built from its ``.onnx`` with the toolkit and
build config of its artifact (:class:`rkpart.runtime.rknn_sim.RknnSimBackend`).  This class maps a
bundle's ``.rknn`` file back to that stage by its sha256 (the artifact's), so the bundle's own runner
drives the simulator through the calls it makes on the board: ``load_rknn`` (the simulator's
``load``), ``init_runtime`` (``init``: the build), ``inference``, ``release``.  It is named as what
it is: not the board, the toolkit's simulator behind the board's API.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from rkpart.plan.plan import Stage, load_plan


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class SimRKNNLite:
    """RKNNLite's constants and call signatures; each instance is one stage in the simulator."""

    NPU_CORE_AUTO = 0
    NPU_CORE_0 = 1
    NPU_CORE_1 = 2
    NPU_CORE_2 = 4
    NPU_CORE_0_1 = 3
    NPU_CORE_0_1_2 = 7
    NPU_CORE_ALL = 0xFFFF

    #: .rknn sha256 -> (stage, plan folder); set by :func:`sim_rknnlite`
    stages: ClassVar[dict[str, tuple[Stage, Path]]] = {}
    backend: ClassVar[Any] = None
    #: calls made, for the tests: (method, "<plan folder name>:<stage id>")
    calls: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, verbose=False, verbose_file=None):  # the real signature, unannotated
        self._runner: Any = None
        self._stage: Stage | None = None
        self._key = "?"

    def load_rknn(self, path):
        got = self.stages.get(_sha256(Path(path)))
        if got is None:
            return -1
        self._stage, folder = got
        self._key = f"{folder.name}:{self._stage.id}"
        self._runner = self.backend.runner(self._stage, folder)
        self._runner.load()
        self.calls.append(("load_rknn", self._key))
        return 0

    def init_runtime(self, target=None, device_id=None, async_mode=False, core_mask=NPU_CORE_AUTO):
        assert self._runner is not None and self._stage is not None, "init_runtime before load_rknn"
        self._runner.init()
        self.calls.append(("init_runtime", self._key))
        return 0

    def inference(self, inputs, data_type=None, data_format=None, inputs_pass_through=None, get_frame_id=False):
        assert self._stage is not None
        feeds = {n: np.asarray(a) for n, a in zip(self._stage.inputs, inputs, strict=True)}
        out = self._runner.infer(feeds)
        self.calls.append(("inference", self._key))
        return [np.asarray(out[n], dtype=np.float32) for n in self._stage.outputs]

    def release(self):
        if self._runner is not None:
            self._runner.release()
            self.calls.append(("release", self._key))
            self._runner = None


def sim_rknnlite(plans: list[Path], backend: Any) -> type[SimRKNNLite]:
    """An ``RKNNLite`` class whose stages are those of the compiled ``plans``, in ``backend`` (an
    :class:`~rkpart.runtime.rknn_sim.RknnSimBackend`)."""
    from rkpart.plan.verify import artifact_file

    stages: dict[str, tuple[Stage, Path]] = {}
    for p in plans:
        plan, folder = load_plan(p)
        for s in plan.npu_stages:
            art = s.artifact("rknn")
            assert art is not None, f"{s.id} of {p} is not compiled"
            stages[_sha256(artifact_file(Path(folder), s, art))] = (s, Path(folder))
    return type("SimRKNNLite", (SimRKNNLite,), {"stages": stages, "backend": backend, "calls": []})
