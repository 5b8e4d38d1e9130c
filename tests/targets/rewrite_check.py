"""What the rewrite tests share: run a model under ONNX Runtime with its graph optimisations off (so
the original and the rewritten model run the same kernels) and rewrite a copy with some table rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from rkpart.targets.rewrites import Rewrite, apply_rewrites


def run_unoptimised(m: onnx.ModelProto, feeds: dict[str, np.ndarray], folder: Path | None = None) -> list[np.ndarray]:
    """``m``'s outputs on ``feeds``; ``folder``: save it there first (a stage with external data,
    which ORT reads relative to the file)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if folder is not None:
        path = folder / ".check.onnx"
        onnx.save(m, str(path))
        return [np.asarray(x) for x in ort.InferenceSession(str(path), so).run(None, feeds)]
    return [np.asarray(x) for x in ort.InferenceSession(m.SerializeToString(), so).run(None, feeds)]


def rewritten(m: onnx.ModelProto, rows: tuple[Rewrite, ...]) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A copy of ``m`` with ``rows`` applied, and what :func:`apply_rewrites` reports (``m`` is left as it is)."""
    r = onnx.ModelProto()
    r.CopyFrom(m)
    return r, apply_rewrites(r, rows)
