"""Numerical comparison of two tensors: the gate the write-up applied by hand.

cosine similarity, max abs, mean abs, MSE and NaN/Inf counts, computed in float64.

A non-finite value is never skipped: one NaN or Inf in either tensor makes the cosine and the
errors NaN (or Inf), and every gate fails on it (issue 31: a stage returning NaN must not look
like zero drift).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from rkpart.errors import GateError
from rkpart.types import JsonObject


@dataclass(frozen=True)
class Metrics:
    cosine: float
    max_abs: float
    mean_abs: float
    mse: float
    nan: int
    inf: int
    ref_max_abs: float
    ref_nonfinite: int = 0  # NaN/Inf values in the reference

    @property
    def finite(self) -> bool:
        """No NaN or Inf on either side (else the other fields are NaN)."""
        return not (self.nan or self.inf or self.ref_nonfinite)

    def to_json(self) -> JsonObject:
        return asdict(self)


def compare(actual: np.ndarray, reference: np.ndarray) -> Metrics:
    """Compare ``actual`` to ``reference`` (shapes must match)."""
    if actual.shape != reference.shape:
        raise GateError(f"shape mismatch: got {actual.shape}, reference {reference.shape}")
    a = np.asarray(actual, dtype=np.float64).ravel()
    r = np.asarray(reference, dtype=np.float64).ravel()
    nan = int(np.isnan(a).sum())
    inf = int(np.isinf(a).sum())
    ref_nonfinite = int(r.size - np.isfinite(r).sum())
    if nan or inf or ref_nonfinite:
        # no partial answer over the finite values: it would read as agreement
        return Metrics(cosine=float("nan"), max_abs=float("nan"), mean_abs=float("nan"), mse=float("nan"),
                       nan=nan, inf=inf, ref_max_abs=float(np.abs(r).max()) if r.size else 0.0,
                       ref_nonfinite=ref_nonfinite)
    d = a - r
    na, nr = float(np.linalg.norm(a)), float(np.linalg.norm(r))
    if na == 0.0 and nr == 0.0:
        cos = 1.0
    elif na == 0.0 or nr == 0.0:
        cos = 0.0
    else:
        cos = float(np.dot(a, r) / (na * nr))
    return Metrics(
        cosine=cos,
        max_abs=float(np.abs(d).max()) if d.size else 0.0,
        mean_abs=float(np.abs(d).mean()) if d.size else 0.0,
        mse=float((d * d).mean()) if d.size else 0.0,
        nan=nan,
        inf=inf,
        ref_max_abs=float(np.abs(r).max()) if r.size else 0.0,
    )


@dataclass(frozen=True)
class Gate:
    """Thresholds; ``max_abs_rel`` is relative to the reference's max |value|."""

    min_cosine: float = 0.999
    max_abs_rel: float | None = None
    max_abs: float | None = None

    def failures(self, m: Metrics) -> list[str]:
        out = []
        if not m.finite:  # the other metrics are NaN: say why, once
            if m.nan or m.inf:
                out.append(f"{m.nan} NaN / {m.inf} Inf")
            if m.ref_nonfinite:
                out.append(f"the reference holds {m.ref_nonfinite} NaN/Inf values")
            return out
        if not m.cosine >= self.min_cosine:
            out.append(f"cosine {m.cosine:.8f} < {self.min_cosine}")
        if self.max_abs is not None and not m.max_abs <= self.max_abs:
            out.append(f"max abs {m.max_abs:.3g} > {self.max_abs:.3g}")
        if self.max_abs_rel is not None and not m.max_abs <= self.max_abs_rel * m.ref_max_abs:
            out.append(f"max abs {m.max_abs:.3g} > {self.max_abs_rel:g} x max|ref| ({m.ref_max_abs:.3g})")
        return out
