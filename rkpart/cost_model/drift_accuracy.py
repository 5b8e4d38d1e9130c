"""The cost model's accuracy term from a measured drift table (``rkpart drift``).

The shipped calibration's accuracy term is the write-up's per-block MSE ratio (fused 19.5x
split) with a hand-set floor of 4x.  A drift table measures what matters instead: the latent
after the whole denoising loop (every block, every step, CFG) on the NPU backend against
ONNX Runtime.  :func:`accuracy_from_drift` turns one into the ``accuracy`` dict a
:class:`~rkpart.cost_model.model.CostModel` carries, which selection
(:func:`rkpart.cost_model.select.choose`) reads unchanged:

- ``families[key].ratio``: the family's final latent MSE over the baseline family's;
- ``default_max_ratio`` (the floor): the largest ratio among families whose final latent cosine
  is at least ``min_cosine``; a family that drifts further is excluded by selection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rkpart.cost_model.model import Accuracy, CostModel
from rkpart.errors import GateError, UserError
from rkpart.plan.plan import Plan
from rkpart.profile.drift import LATENT, DriftRow, nonfinite_rows
from rkpart.types import JsonObject

BASELINE = "adaln=host,residual=host"
#: final-latent cosine a partition family must keep to be selectable
DEFAULT_MIN_COSINE = 0.999
_EPS = 1e-30


def family_of(plan: Plan) -> str:
    """The accuracy family (``Candidate.accuracy_key``) of a split or fused plan; a plan compiled
    int8 / hybrid (issue 27) is a family of its own (``...,precision=int8``), never the fp16 one."""
    from rkpart.compile.precision import plan_precision

    name = plan.strategy.get("name")
    opts = plan.strategy.get("options", {})
    prec = plan_precision(plan)
    suffix = "" if prec == "fp16" else f",precision={prec}"
    if name == "fused":
        return "adaln=npu,residual=npu" + suffix
    if name == "split":
        return f"adaln={opts.get('adaln') or 'host'},residual={opts.get('residual') or 'host'}" + suffix
    raise UserError(f"no accuracy family for a {name!r} plan: measure split and fused plans")


def _round_ratio(v: float) -> float:
    return round(v, 4) if v >= 1e-3 else float(f"{v:.4g}")


def accuracy_from_drift(rows: Sequence[DriftRow], families: Mapping[str, str], *, baseline: str = BASELINE,
                        min_cosine: float = DEFAULT_MIN_COSINE) -> JsonObject:
    """The ``accuracy`` term from ``rows`` (``families``: plan label -> accuracy family).

    Refused (:class:`~rkpart.errors.GateError`) when any row holds NaN/Inf: a NaN run would
    otherwise enter the cost model as a measured accuracy.
    """
    bad = nonfinite_rows(rows)
    if bad:
        r = bad[0]
        raise GateError(f"refusing to build an accuracy table from a drift run with NaN/Inf values: {len(bad)} "
                        f"row(s), first plan {r.plan} step {r.step} {r.kind}"
                        + (f" block {r.block}" if r.block is not None else ""))
    final: dict[str, DriftRow] = {}
    for r in rows:
        if r.kind == LATENT and r.plan in families and (r.plan not in final or r.step > final[r.plan].step):
            final[r.plan] = r
    # two plans of one family (fused one and two blocks per stage, both ``adaln=npu,residual=npu``): the family
    # stands for either, so it takes the one that drifted more, never the luck of the order
    by_family: dict[str, DriftRow] = {}
    for label, r in final.items():
        if families[label] not in by_family or r.mse > by_family[families[label]].mse:
            by_family[families[label]] = r
    if baseline not in by_family:
        raise UserError(f"the drift table has no plan of the baseline family {baseline} (a default split plan)")
    base = max(by_family[baseline].mse, _EPS)
    steps = by_family[baseline].step + 1
    # 4 decimals, or 4 significant digits below 0.001 (rounded to 0.0 the ratio was no ratio > 0)
    ratios = {f: _round_ratio(max(r.mse, _EPS) / base) if f != baseline else 1.0 for f, r in by_family.items()}
    fams = {f: {"ratio": ratios[f], "final_cosine": r.cosine, "final_mse": r.mse, "final_max_abs": r.max_abs,
                "source": f"drift: latent after {r.step + 1} step(s), plan {r.plan}"}
            for f, r in sorted(by_family.items())}
    # precision variants are measured side by side; ``auto --option precisions=fp16,int8`` reads
    # their rows, but their ratios (int8: ~2000x fp16's latent MSE on the bundled example) must not
    # widen the default bound: int8 is chosen only under a bound the user sets (max_error_ratio)
    ok = [ratios[f] for f, r in by_family.items() if r.cosine >= min_cosine and ",precision=" not in f]
    acc = {
        "metric": f"latent MSE after {steps} denoising step(s) relative to {baseline} (rkpart drift)",
        "default_max_ratio": max([1.0, *ok]),
        "min_cosine": min_cosine,
        "families": fams,
    }
    from rkpart.cost_model.checks import check_accuracy, check_numbers
    from rkpart.errors import SpecError

    try:  # what `partition --accuracy` refuses to read is not written (a ratio over 2^53: a baseline MSE of 0)
        check_numbers("the accuracy table", acc)
        check_accuracy("the accuracy table", acc)
    except SpecError as e:
        raise UserError(f"{e}; this drift run measures no accuracy ratio (is the baseline's latent MSE 0?)") from None
    return acc


def is_accuracy_table(path: Path) -> bool:
    """Whether ``path`` holds an accuracy table ``rkpart drift --accuracy`` wrote (its keys; what
    ``--force`` may replace)."""
    import json

    from rkpart.output import head_bytes

    try:
        doc = json.loads(head_bytes(path, 1 << 20))
    except ValueError:
        return False
    return (isinstance(doc, dict) and {"metric", "families", "default_max_ratio", "min_cosine"} <= set(doc)
            and str(doc["metric"]).startswith("latent MSE after"))


def with_drift(model: CostModel, rows: Sequence[DriftRow], families: Mapping[str, str], **kw: Any) -> CostModel:
    """``model`` with its accuracy term measured by ``rows`` (see :func:`accuracy_from_drift`)."""
    return dataclasses.replace(model, accuracy=Accuracy(accuracy_from_drift(rows, families, **kw)))


__all__ = ["BASELINE", "DEFAULT_MIN_COSINE", "accuracy_from_drift", "family_of", "is_accuracy_table", "with_drift"]
