"""Numerical comparison of two tensors: the gate the write-up applied by hand.

cosine similarity, max abs, mean abs, MSE and NaN/Inf counts, computed in float64.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rkpart.errors import GateError


@dataclass(frozen=True)
class Metrics:
    cosine: float
    max_abs: float
    mean_abs: float
    mse: float
    nan: int
    inf: int
    ref_max_abs: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def compare(actual: np.ndarray, reference: np.ndarray) -> Metrics:
    """Compare ``actual`` to ``reference`` (shapes must match)."""
    if actual.shape != reference.shape:
        raise GateError(f"shape mismatch: got {actual.shape}, reference {reference.shape}")
    a = np.asarray(actual, dtype=np.float64).ravel()
    r = np.asarray(reference, dtype=np.float64).ravel()
    nan = int(np.isnan(a).sum())
    inf = int(np.isinf(a).sum())
    finite = np.isfinite(a) & np.isfinite(r)
    a_f, r_f = a[finite], r[finite]
    d = a_f - r_f
    na, nr = float(np.linalg.norm(a_f)), float(np.linalg.norm(r_f))
    if na == 0.0 and nr == 0.0:
        cos = 1.0
    elif na == 0.0 or nr == 0.0:
        cos = 0.0
    else:
        cos = float(np.dot(a_f, r_f) / (na * nr))
    return Metrics(
        cosine=cos,
        max_abs=float(np.abs(d).max()) if d.size else 0.0,
        mean_abs=float(np.abs(d).mean()) if d.size else 0.0,
        mse=float((d * d).mean()) if d.size else 0.0,
        nan=nan,
        inf=inf,
        ref_max_abs=float(np.abs(r_f).max()) if r_f.size else 0.0,
    )


@dataclass(frozen=True)
class Gate:
    """Thresholds; ``max_abs_rel`` is relative to the reference's max |value|."""

    min_cosine: float = 0.999
    max_abs_rel: float | None = None
    max_abs: float | None = None
    allow_nonfinite: bool = False

    def failures(self, m: Metrics) -> list[str]:
        out = []
        if not m.cosine >= self.min_cosine:
            out.append(f"cosine {m.cosine:.8f} < {self.min_cosine}")
        if self.max_abs is not None and not m.max_abs <= self.max_abs:
            out.append(f"max abs {m.max_abs:.3g} > {self.max_abs:.3g}")
        if self.max_abs_rel is not None and not m.max_abs <= self.max_abs_rel * m.ref_max_abs:
            out.append(f"max abs {m.max_abs:.3g} > {self.max_abs_rel:g} x max|ref| ({m.ref_max_abs:.3g})")
        if not self.allow_nonfinite and (m.nan or m.inf):
            out.append(f"{m.nan} NaN / {m.inf} Inf")
        return out
