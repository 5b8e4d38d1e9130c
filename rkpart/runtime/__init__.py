"""Executors for plan stages: ONNX Runtime, the rknn-toolkit2 simulator, the board runtime."""

from __future__ import annotations

from rkpart.errors import UserError
from rkpart.runtime.base import Backend, StageRunner

BACKENDS = ("ort", "rknn-sim", "rknnlite")


def get_backend(name: str, *, toolkit: str | None = None, **kwargs: object) -> Backend:
    """A backend by name; heavy SDKs are imported only when their backend is asked for."""
    if name == "ort":
        from rkpart.runtime.ort import OrtBackend

        return OrtBackend()
    if name == "rknn-sim":
        if not toolkit:
            raise UserError("--backend rknn-sim needs --toolkit VERSION (see `rkpart toolkit list`)")
        from rkpart.runtime.rknn_sim import RknnSimBackend

        return RknnSimBackend(toolkit, **kwargs)  # type: ignore[arg-type]
    if name == "rknnlite":
        from rkpart.runtime.rknnlite import RknnLiteBackend

        return RknnLiteBackend(**kwargs)  # type: ignore[arg-type]
    raise UserError(f"unknown backend {name!r} (available: {', '.join(BACKENDS)})")


__all__ = ["BACKENDS", "Backend", "StageRunner", "get_backend"]
