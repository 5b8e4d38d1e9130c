"""The two numerical tools every fit of the cost model shares: a non-negative least-squares solve
on relative error, and the summary of predictions against measurements.

Stage components (:mod:`rkpart.cost_model.model`), rounds (:mod:`rkpart.cost_model.rounds`),
device memory (:mod:`rkpart.cost_model.device_model`) and NPU time
(:mod:`rkpart.cost_model.npu_time`) are all fitted with them; they read nothing else of rkpart.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from rkpart.types import JsonObject


def nnls_relative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the squared *relative* error ``(x @ c - y) / y``.

    Columns are scaled to unit norm before solving (features span 1 .. 1e11) and the
    scale is undone afterwards.
    """
    from scipy.optimize import nnls

    if len(y) == 0:
        return np.zeros(x.shape[1])
    w = 1.0 / np.maximum(np.abs(y), 1e-12)
    a = x * w[:, None]
    b = y * w
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    c, _ = nnls(a / norms, b, maxiter=50 * a.shape[1] + 100)
    return np.asarray(c / norms, dtype=float)


def error_summary(pred: Sequence[float], meas: Sequence[float]) -> JsonObject:
    """Share of predictions within +-10 % and +-20 % of the measurement, median |% error|."""
    ape = [abs(p - m) / abs(m) * 100.0 for p, m in zip(pred, meas, strict=True) if m]
    if not ape:
        return {"n": 0, "within_10": None, "within_20": None, "median_ape": None}
    return {
        "n": len(ape),
        "within_10": round(sum(a <= 10.0 for a in ape) / len(ape), 4),
        "within_20": round(sum(a <= 20.0 for a in ape) / len(ape), 4),
        "median_ape": round(statistics.median(ape), 3),
    }


__all__ = ["error_summary", "nnls_relative"]
