"""A FAKE ``RKNNLite`` (rknn-toolkit-lite2): it stands in for the board, which x86 does not have.

It records every call the bundle runner makes (the constructor, ``load_rknn``,
``init_runtime`` with its core mask, ``inference``, ``release``), which thread made it, and
how many contexts were alive (initialised, not yet released) at once.  Outputs come from
ONNX Runtime on the stage's ``.onnx`` file in the plan folder, so a whole denoising loop
completes with real numbers.  Its method signatures are those of the real
``rknnlite/api/rknn_lite.py``; ``tests/bundle/test_rknnlite_api.py`` checks that against the
aarch64 wheel.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True)
class Call:
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    context: int  # which FakeRKNNLite object (in creation order)
    thread: str
    alive: int  # contexts alive right after the call


@dataclass
class Recorder:
    """What one fake session saw; ``sources`` maps a ``.rknn`` file name to its stage ``.onnx``."""

    sources: dict[str, Path]
    ort_session: Any
    calls: list[Call] = field(default_factory=list)
    alive: set[int] = field(default_factory=set)
    max_alive: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    created: int = 0

    def note(self, ctx: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with self.lock:
            if method == "init_runtime":
                self.alive.add(ctx)
            elif method == "release":
                self.alive.discard(ctx)
            self.max_alive = max(self.max_alive, len(self.alive))
            self.calls.append(Call(method, args, kwargs, ctx, threading.current_thread().name, len(self.alive)))

    def of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]


class FakeRKNNLite:
    """FAKE RKNNLite: same constants and method signatures as rknn-toolkit-lite2 2.3.2's."""

    NPU_CORE_AUTO = 0
    NPU_CORE_0 = 1
    NPU_CORE_1 = 2
    NPU_CORE_2 = 4
    NPU_CORE_0_1 = 3
    NPU_CORE_0_1_2 = 7
    NPU_CORE_ALL = 0xffff

    recorder: ClassVar[Recorder]

    def __init__(self, verbose=False, verbose_file=None):  # the real signatures, unannotated
        rec = self.recorder
        with rec.lock:
            self.ctx = rec.created
            rec.created += 1
        self.path: Path | None = None
        self.sess: Any = None
        rec.note(self.ctx, "__init__", (), {"verbose": verbose, "verbose_file": verbose_file})

    def load_rknn(self, path):
        self.recorder.note(self.ctx, "load_rknn", (path,), {})
        self.path = Path(path)
        return 0 if self.path.is_file() else -1

    def init_runtime(self, target=None, device_id=None, async_mode=False, core_mask=NPU_CORE_AUTO):
        assert self.path is not None, "init_runtime before load_rknn"
        self.sess = self.recorder.ort_session(str(self.recorder.sources[self.path.name]))
        self.core_mask = core_mask
        self.recorder.note(self.ctx, "init_runtime", (), {"target": target, "device_id": device_id,
                                                          "async_mode": async_mode, "core_mask": core_mask})
        return 0

    def inference(self, inputs, data_type=None, data_format=None, inputs_pass_through=None,
                  get_frame_id=False):
        self.recorder.note(self.ctx, "inference", (), {"inputs": len(inputs), "data_type": data_type,
                                                       "data_format": data_format, "file": self.path.name
                                                       if self.path else None})
        if self.sess is None:
            return None  # as the real one: "Runtime environment is not inited"
        names = [i.name for i in self.sess.get_inputs()]
        return [np.asarray(o, dtype=np.float32) for o in  # the NPU returns float32
                self.sess.run(None, dict(zip(names, inputs, strict=True)))]

    def release(self):
        self.sess = None
        self.recorder.note(self.ctx, "release", (), {})


def fake_for(bundle: Path, plan_folder: Path, ort_session: Any) -> type[FakeRKNNLite]:
    """A fresh FakeRKNNLite class recording into its own :class:`Recorder` (``cls.recorder``)."""
    import json

    m = json.loads((bundle / "manifest.json").read_text())
    sources = {Path(s["file"]).name: plan_folder / s["source"] for s in m["stages"] if s["device"] == "npu"}
    return type("FakeRKNNLite", (FakeRKNNLite,), {"recorder": Recorder(sources, ort_session)})
