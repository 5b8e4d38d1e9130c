"""Whole rounds: what a pipeline pays for one image, predicted and fitted as a whole.

A per-stage fit predicts each stage's own calls (``load``, ``init``, ``infer``, ``release``,
``host``, and a host stage's ``setup``: its load + init + release once per round), measured
inside the pipeline's own rounds in process CPU time.  A pipeline pays a little more than
their sum: the Python glue between stages (feeding one stage's outputs to the next, the
profiler's bookkeeping).  One component carries that, fitted on the *round* records of
``rkpart profile`` (``timings.cpu_s``, or for older profiles ``wall_minus_snapshots_s``)
after the per-stage components are fitted:

========== ======= ===========================================================
glue       any     seconds per stage and pass (``const``), per load-to-release
                   cycle of a stage (``cycle``) and per round (``round``)
========== ======= ===========================================================

:func:`predict_round` is the one formula both the fit and ``auto``'s selection use:

* per-stage residency: ``passes x (load + init + infer + release)`` per NPU stage;
* resident: ``load + init + release`` once, ``passes x infer``;
* every host stage: ``setup`` once, ``passes x host``;
* glue: ``const x stages x passes + cycle x cycles + round``.

:func:`whole_plan_cv` is the held-out error on whole rounds: each profiled plan is predicted
by a model (per-stage components and glue) fitted without it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from rkpart.cost_model.features import GLUE_TERMS, Features
from rkpart.cost_model.model import Accuracy, Component, CostModel, Provenance, Sample, error_summary
from rkpart.types import HOST, JsonMap, JsonObject

#: lifecycle components paid once per call of a per-stage stage, once per round of a resident one
LIFE = ("load", "init", "release")


@dataclass(frozen=True)
class RoundSample:
    """One profiled plan's measured round: its stages as run and the median round time."""

    group: str  # the pool (plan + backends + residency), as the stage samples' group
    stages: tuple[tuple[Features, str], ...]  # (features, residency "per-stage"/"resident") in plan order
    passes: int
    seconds: float  # median over measured rounds of wall time minus the profiler's snapshots
    pss_peak_bytes: float | None = None  # median over rounds of the round's peak process PSS
    label: str = ""


def stage_part(model: CostModel, f: Features, residency: str, passes: int) -> float | None:
    """Predicted seconds of one stage over a round, without glue (``None``: a predictor is missing)."""
    pred = model.predict_stage(f)
    if f.device == HOST:
        h = pred.get("host")
        return None if h is None else h * passes
    vals = {k: pred.get(k) for k in (*LIFE, "infer")}
    if any(v is None for v in vals.values()):
        return None
    life = sum(float(vals[k] or 0.0) for k in LIFE)
    calls = passes if residency == "per-stage" else 1
    return life * calls + float(vals["infer"] or 0.0) * passes


def overhead_features(stages: Sequence[tuple[Features, str]], passes: int, *, whole_round: bool = True
                      ) -> np.ndarray:
    """The glue design row of a round: stage passes, load-to-release cycles, rounds (:data:`GLUE_TERMS`)."""
    n = sum(f.value("const") for f, _ in stages)
    cycles = sum(f.value("const") * (passes if f.device != HOST and res == "per-stage" else 1) for f, res in stages)
    return np.array([n * passes, cycles, 1.0 if whole_round else 0.0], dtype=float)


def setup_part(model: CostModel, stages: Sequence[tuple[Features, str]]) -> float:
    """Predicted session setup of the round's host stages (0 when the model has none)."""
    setup = model.components.get("setup")
    return 0.0 if setup is None else sum(setup.predict(f) for f, _ in stages if f.device == HOST)


def overhead(model: CostModel, stages: Sequence[tuple[Features, str]], passes: int, *,
             whole_round: bool = False) -> float:
    """Predicted glue and host setup of ``stages`` over a round (0 when the model has neither);
    ``whole_round``: the stages are a whole round, which pays the per-round glue once (a part of
    a round, e.g. one block's candidate, does not)."""
    glue = model.components.get("glue")
    total = setup_part(model, stages)
    if glue is not None:
        coef = dict(zip(glue.terms, glue.coef, strict=True))
        row = overhead_features(stages, passes, whole_round=whole_round)
        total += float(sum(coef.get(t, 0.0) * v for t, v in zip(GLUE_TERMS, row, strict=True)))
    return total


def predict_round(model: CostModel, stages: Sequence[tuple[Features, str]], passes: int) -> float | None:
    """Predicted seconds of one round of ``stages`` run in order ``passes`` times."""
    parts = [stage_part(model, f, r, passes) for f, r in stages]
    if any(p is None for p in parts):
        return None
    return float(sum(p for p in parts if p is not None)) + overhead(model, stages, passes, whole_round=True)


def fit_overhead(model: CostModel, rounds: Sequence[RoundSample]) -> dict[str, Component]:
    """The glue component, fitted on what the stage components (and host setup) leave of each round."""
    rows, ys, ws = [], [], []
    for r in rounds:
        base = predict_round_without_overhead(model, r)
        if base is None:
            continue
        rows.append(overhead_features(r.stages, r.passes))
        ys.append(max(r.seconds - base - setup_part(model, r.stages), 0.0))
        ws.append(1.0 / r.seconds)
    if not rows:
        return {}
    # fit on absolute seconds, each round weighted by 1/measured (relative error of the round)
    x, y, w = np.array(rows), np.array(ys), np.array(ws)
    from scipy.optimize import nnls

    a = x * w[:, None]
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    c, _ = nnls(a / norms, y * w, maxiter=500)
    c = c / norms
    return {"glue": Component("glue", GLUE_TERMS, tuple(float(v) for v in c), source="fit", samples=len(ys),
                              note="what the pipeline pays beyond the stages' own calls: per stage and pass "
                                   "(const), per load-to-release cycle (cycle), per round (round)")}


def predict_round_without_overhead(model: CostModel, r: RoundSample) -> float | None:
    parts = [stage_part(model, f, res, r.passes) for f, res in r.stages]
    if any(p is None for p in parts):
        return None
    return float(sum(p for p in parts if p is not None))


def refit_with_rounds(samples: Sequence[Sample], rounds: Sequence[RoundSample],
                      base: CostModel | None = None) -> CostModel:
    """Per-stage components from ``samples``, then glue and setup from ``rounds``."""
    model = CostModel(components=dict(base.components) if base else {},
                      provenance=base.provenance if base else Provenance(),
                      accuracy=base.accuracy if base else Accuracy(),
                      known_issues=list(base.known_issues) if base else [])
    model.components.pop("glue", None)
    if any("setup" in s.targets for s in samples):
        model.components.pop("setup", None)
    model.update(samples)
    model.components.update(fit_overhead(model, rounds))
    return model


def whole_plan_cv(samples: Sequence[Sample], rounds: Sequence[RoundSample],
                  base: CostModel | None = None) -> JsonObject:
    """Held-out error of whole-round predictions: leave one profiled plan out (>= 3 plans)."""
    groups = sorted({r.group for r in rounds})
    pred: list[float] = []
    meas: list[float] = []
    rows: list[JsonObject] = []
    if len(groups) < 3:
        return {"method": "none (fewer than 3 profiled plans)", **error_summary([], []), "plans": []}
    for g in groups:
        train = [s for s in samples if s.group != g]
        model = refit_with_rounds(train, [r for r in rounds if r.group != g], base)
        for r in rounds:
            if r.group != g:
                continue
            p = predict_round(model, r.stages, r.passes)
            if p is None:
                continue
            pred.append(p)
            meas.append(r.seconds)
            rows.append({"plan": r.label, "measured_s": round(r.seconds, 6), "predicted_s": round(p, 6),
                         "error_pct": round((p - r.seconds) / r.seconds * 100.0, 2)})
    return {"method": "leave-one-plan-out", **error_summary(pred, meas), "plans": rows}


def fitted_range(samples: Iterable[Sample]) -> dict[str, list[int]]:
    """Per feature that sizes an NPU stage, the range the fit saw (tokens x hidden: ``in_bytes``;
    hidden squared: ``weight_bytes``; both: ``macs``)."""
    out: dict[str, list[int]] = {}
    for s in samples:
        if s.features.device == HOST:
            continue
        for k in ("in_bytes", "weight_bytes", "macs"):
            v = int(s.features.value(k))
            lo, hi = out.get(k, [v, v])
            out[k] = [min(lo, v), max(hi, v)]
    return out


def outside_range(model: CostModel, features: Iterable[Features], slack: float = 0.0) -> list[str]:
    """Which of a candidate's stage sizes lie outside the model's fitted range (plain words)."""
    rng = model.provenance.fitted_range
    words = {"in_bytes": "boundary activations (tokens x hidden)", "weight_bytes": "weights", "macs": "MACs"}
    out = []
    for k, (lo, hi) in rng.items():
        vals = [int(f.value(k)) for f in features if f.device != HOST]
        if not vals:
            continue
        if max(vals) > hi * (1 + slack) or min(vals) < lo * (1 - slack):
            ratio = max(vals) / max(hi, 1) if max(vals) > hi else min(vals) / max(lo, 1)
            out.append(f"{words.get(k, k)} {ratio:.2g}x the fitted range")
    return out


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def round_time(r: JsonMap) -> float | None:
    """What a measured round cost: its CPU time when recorded (robust on a machine shared with
    other jobs), else its wall time minus the profiler's snapshots."""
    tim = r.get("timings") or {}
    if tim.get("cpu_s") is not None:
        return float(tim["cpu_s"])
    m = r.get("measurement") or {}
    w = m.get("wall_minus_snapshots_s", tim.get("wall_s"))
    return None if w is None else float(w)


def round_seconds(round_records: Iterable[JsonMap]) -> tuple[float | None, float | None]:
    """Median over measured round records of (wall minus snapshots, peak PSS in bytes)."""
    secs, pss = [], []
    for r in round_records:
        if r.get("warmup"):
            continue
        w = round_time(r)
        if w is not None:
            secs.append(float(w))
        p = (r.get("memory") or {}).get("pss_peak_kib")
        if p is not None:
            pss.append(float(p) * 1024)
    return (median(secs) if secs else None, median(pss) if pss else None)


__all__ = ["GLUE_TERMS", "RoundSample", "fit_overhead", "fitted_range", "outside_range",
           "overhead", "predict_round", "refit_with_rounds", "round_seconds", "round_time", "stage_part",
           "whole_plan_cv"]
