"""NPU inference time from the compiler's own plan of a stage, calibrated on the board numbers.

Features of a compiled stage (``artifacts[].compiler`` and the IR):

* ``compiled_cycles``: Σ of the layer table's Total cycles.  Only Conv-type layers carry them
  (NPU cycles = MACs / 512 per core in fp16), so they miss the attention core, norms, GELU,
  Transpose and every elementwise layer;
* ``act_macs``: the attention core's MACs (``Q K^T`` and ``P V``, which ``exSDPAttention`` runs
  and the table gives 0 cycles), from the IR;
* ``compiled_rw_bytes``: Σ of the table's RW column: what every layer, cycled or not, moves.

``infer = a * compiled_cycles / 1 GHz + b * act_macs + c * compiled_rw_bytes`` per pass.

The board numbers are the write-up's: one 512 px block, split (3 stages, 1.559 s per pass) and
fused (1 stage, 1.649 s).  Two numbers identify two coefficients, so one is a prior:
``b = 1 / (512 MACs per cycle x 1 GHz)``, the attention core at the conv layers' own rate.
:func:`calibrate` solves ``a`` and ``c`` on both (zero degrees of freedom);
:func:`leave_fused_out` fixes ``a = 1`` too (the compiler's cycles taken at face value, a lower
bound: published board perf tables put conv layers at 1.2-3.5x their cycles), solves ``c`` on the
split block alone and predicts the fused block's inference, which it was not fitted on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rkpart.cost_model.features import Features
from rkpart.cost_model.fitting import nnls_relative
from rkpart.cost_model.model import NPU_INFER_TERMS, Component, CostModel

#: the NPU clock the cycle counts are taken at (RK3588: 1 GHz)
NPU_HZ = 1e9
#: prior: attention-core MACs per second, at the conv layers' fp16 rate (512 MACs / cycle / core)
ATT_MAC_RATE = 512 * NPU_HZ
TERMS = NPU_INFER_TERMS
#: throughput of two sessions on two NPU cores against one (a Stable Diffusion UNet ported to
#: RK3588 with RKNNLite, published by its author; not measured by rkpart: no board here): the
#: speed-up of running a step's two CFG passes at once (the bundle runner's ``--cfg-parallel``)
CFG_PARALLEL_SPEEDUP = 1.78
CFG_PARALLEL_SOURCE = ("prior: 1.78x throughput of two RKNNLite sessions on two cores (published LCM/UNet port on "
                       "RK3588), unmeasured here; `rkpart tune --backend rknnlite` on a board replaces it")
#: the write-up's board device memory against the compiler's weight + internal memory of the same
#: builds (2.3.0): split's peak 3 % below it, fused 11 % above: the error bar of a compiler figure
COMPILER_ERROR = 0.111


def cfg_parallel_speedup(model: CostModel | None) -> tuple[float, str]:
    """The CFG-parallel speed-up ``model`` predicts with and where it comes from: the one measured
    on a board (:attr:`CostModel.cfg_parallel`, written by ``rkpart tune --backend rknnlite
    --cfg-parallel``) if the model carries one, else the unmeasured prior."""
    if model is not None and model.cfg_parallel is not None:
        return model.cfg_parallel.speedup, model.cfg_parallel.source
    return CFG_PARALLEL_SPEEDUP, CFG_PARALLEL_SOURCE


def _row(f: Features) -> list[float]:
    if f.compiled_cycles is None or f.compiled_rw_bytes is None:
        raise ValueError("stage is not compiled (no compiler cycles/RW)")
    return [float(f.compiled_cycles), float(f.act_macs), float(f.compiled_rw_bytes)]


def _sum(stages: Sequence[Features]) -> list[float]:
    return [sum(v) for v in zip(*(_row(f) for f in stages), strict=True)]


@dataclass(frozen=True)
class Calibration:
    """The ``npu_infer`` component and how it was solved."""

    component: Component
    degrees_of_freedom: int
    note: str


def calibrate(split: Sequence[Features], split_s: float, fused: Sequence[Features], fused_s: float) -> Calibration:
    """``a`` and ``c`` from both write-up configurations (per pass), ``b`` the prior."""
    xs, xf = _sum(split), _sum(fused)
    b = 1.0 / ATT_MAC_RATE
    x = np.array([[xs[0] / NPU_HZ, xs[2]], [xf[0] / NPU_HZ, xf[2]]])
    y = np.array([split_s - b * xs[1], fused_s - b * xf[1]])
    a, c = (float(v) for v in nnls_relative(x, y))
    comp = Component("npu_infer", TERMS, (a / NPU_HZ, b, c), source="calibration", samples=2,
                     note="per pass: compiler cycles (a, at 1 GHz) + attention-core MACs (b, prior: 512 MACs/cycle) "
                          "+ compiler RW bytes (c); a and c solved on the write-up's split and fused block")
    return Calibration(comp, degrees_of_freedom=0, note="2 board numbers, 2 free coefficients (a, c), b a prior")


def leave_fused_out(split: Sequence[Features], split_s: float) -> Calibration:
    """``c`` from the split block alone; ``a = 1`` and ``b`` priors."""
    xs = _sum(split)
    b = 1.0 / ATT_MAC_RATE
    c = max(0.0, (split_s - xs[0] / NPU_HZ - b * xs[1]) / xs[2]) if xs[2] else 0.0
    comp = Component("npu_infer", TERMS, (1.0 / NPU_HZ, b, c), source="calibration", samples=1,
                     note="leave-fused-out: c solved on the split block only; a = 1 (cycles at 1 GHz) and b priors")
    return Calibration(comp, degrees_of_freedom=0, note="1 board number, 1 free coefficient (c), a and b priors")


def predict(comp: Component, stages: Sequence[Features]) -> float:
    """Predicted inference seconds per pass of compiled ``stages`` (summed)."""
    return float(sum(c * v for c, v in zip(comp.coef, _sum(stages), strict=True)))


def compiled_infer_seconds(model: CostModel, f: Features) -> float | None:
    """Inference per pass of a compiled stage from its compiler features (``None``: not compiled, or
    the model has no ``npu_infer`` calibration)."""
    comp = model.components.get("npu_infer")
    if comp is None or f.compiled_cycles is None or f.compiled_rw_bytes is None:
        return None
    return predict(comp, [f])


__all__ = [
    "ATT_MAC_RATE",
    "CFG_PARALLEL_SOURCE",
    "CFG_PARALLEL_SPEEDUP",
    "COMPILER_ERROR",
    "NPU_HZ",
    "TERMS",
    "Calibration",
    "calibrate",
    "cfg_parallel_speedup",
    "compiled_infer_seconds",
    "leave_fused_out",
    "predict",
]
