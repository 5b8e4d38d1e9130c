"""A plan's NPU coverage figures, each with its unit, worded the same by ``rkpart partition`` and the report.

Three figures count different things, so each is named with what it counts:

``matmul``   the blocks' (and the glue's) token-wise matmul work, in MACs, that NPU stages hold
             (``plan.json`` ``extra.npu_coverage``, :mod:`rkpart.grouping.coverage`)
``weights``  the weight bytes of all stages that NPU stages hold (host stages keep the prologue's
             embeddings, AdaLN modulation and epilogue: often most of a tiny model's bytes)
``ops``      the ops (graph nodes) of all stages that NPU stages hold

A split plan of the bundled example holds 100 % of the matmul work, 69 % of the weight bytes and
59 % of the ops: none of them is "the" coverage.
"""

from __future__ import annotations

from rkpart.plan.plan import Plan
from rkpart.types import NPU

#: figure -> what its share is a share of (the words both the CLI and the page print)
UNITS = {
    "matmul": "of the blocks' matmul work (MACs)",
    "weights": "of the weight bytes",
    "ops": "of the ops",
}


def coverage_figures(plan: Plan) -> dict[str, float]:
    """The shares of :data:`UNITS` in NPU stages (``matmul`` only when the plan records it)."""
    out: dict[str, float] = {}
    cov = (plan.extra or {}).get("npu_coverage")
    if isinstance(cov, dict) and isinstance(cov.get("share"), (int, float)):
        out["matmul"] = float(cov["share"])
    weights = sum(s.weight_bytes for s in plan.stages)
    ops = sum(s.num_nodes for s in plan.stages)
    out["weights"] = sum(s.weight_bytes for s in plan.stages if s.device == NPU) / weights if weights else 0.0
    out["ops"] = sum(s.num_nodes for s in plan.stages if s.device == NPU) / ops if ops else 0.0
    return out


def describe_coverage(figures: dict[str, float]) -> str:
    """``on the NPU: 100.0 % of the blocks' matmul work (MACs), 68.7 % of the weight bytes, 58.9 % of the ops``."""
    return "on the NPU: " + ", ".join(f"{figures[k] * 100:.1f} % {unit}" for k, unit in UNITS.items() if k in figures)


__all__ = ["UNITS", "coverage_figures", "describe_coverage"]
