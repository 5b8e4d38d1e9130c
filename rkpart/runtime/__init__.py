"""Executors for plan stages: ONNX Runtime, the rknn-toolkit2 simulator, the board runtime."""

from __future__ import annotations

from rkpart.errors import UserError
from rkpart.runtime.base import Backend, StageRunner

BACKENDS = ("ort", "rknn-sim", "rknnlite")
#: ``--core-mask`` names (RKNNLite's values: :data:`rkpart.runtime.rknnlite.CORE_MASKS`)
CORE_MASK_CHOICES = ("auto", "0", "1", "2", "0_1", "0_1_2", "all")


def get_backend(name: str, *, toolkit: str | None = None, core_mask: str = "auto", threads: int = 0) -> Backend:
    """The backend called ``name``, the one factory ``run``, ``profile`` and the API share.

    Heavy SDKs are imported only when their backend is asked for.

    Parameters
    ----------
    toolkit
        ``rknn-sim``: the simulator version for stages without an artifact (a compiled stage
        runs in the toolkit that built it). ``rknnlite``: refuse stages another version built.
    core_mask
        ``rknnlite`` only: the NPU cores (:data:`CORE_MASK_CHOICES`).
    threads
        ONNX Runtime's intra-op threads (0: its default); ``ort`` only.

    Raises
    ------
    UserError
        An unknown backend name.
    """
    if name == "ort":
        from rkpart.runtime.ort import OrtBackend

        return OrtBackend(threads=threads)
    if name == "rknn-sim":
        from rkpart.runtime.rknn_sim import RknnSimBackend

        return RknnSimBackend(toolkit)
    if name == "rknnlite":
        from rkpart.runtime.rknnlite import RknnLiteBackend

        return RknnLiteBackend(core_mask=core_mask, toolkit=toolkit)
    raise UserError(f"unknown backend {name!r} (available: {', '.join(BACKENDS)})")


__all__ = ["BACKENDS", "CORE_MASK_CHOICES", "Backend", "StageRunner", "get_backend"]
