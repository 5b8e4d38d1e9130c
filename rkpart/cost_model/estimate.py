"""What a plan costs on the board for a whole image: device memory and seconds, each figure with
its source (``rkpart estimate``).

Per NPU stage:

* **device memory**: the compiler's own weight + internal memory when the stage is compiled
  (``compiler``: ``artifacts[].compiler``, read from the build log), else the cost model's
  device-memory predictor for the toolkit (``predicted``: fitted on compiler tables of compiled
  stages, :mod:`rkpart.cost_model.device_model`), plus :data:`~rkpart.cost_model.device_model.OTHER_BYTES`;
* **latency per call**: load, init, infer and release from the cost model; inference from the
  compiler's cycles and RW bytes when the stage is compiled and the model has an ``npu_time``
  calibration (:mod:`rkpart.cost_model.npu_time`), else from the cost model's ``infer``.

For the pipeline: the device-memory peak under the plan's residency (resident stages add up, per-
stage ones count their largest), with the bound a budget counts (every predicted stage raised by the
predictor's budget margin: the 95th percentile of its held-out under-prediction at families it was
not fitted on, :func:`~rkpart.cost_model.device_model.budget_margin`), and seconds per image:
``steps x model calls per step`` of every stage, lifecycle included, with error bars, plus the VAE
decode once per image when the plan's pipeline has one. The calls per step are the sampler's
(:func:`calls_per_step`): two for two-pass CFG, one for batched CFG (one call on the ``[uncond,
cond]`` pair, which the model's batch of 2 already costs), one for a guidance-distilled model or
none; a multistep scheduler's order adds no call. With CFG, the same figures for running the two
passes of a step on two NPU cores at once (``--cfg-parallel`` of the bundle runner): both contexts
of every NPU stage resident at once, and the NPU inference sped up by the model's measured speed-up
(``rkpart tune --backend rknnlite --cfg-parallel``) or else the published, unmeasured prior
(:data:`CFG_PARALLEL_SPEEDUP`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rkpart.cost_model.checks import check_stage_estimate
from rkpart.cost_model.device_model import BOUND_QUANTILE, OTHER_BYTES, budget_margin
from rkpart.cost_model.features import Features, stage_features
from rkpart.cost_model.model import CostModel
from rkpart.cost_model.npu_time import (
    CFG_PARALLEL_SPEEDUP,
    COMPILER_ERROR,
    cfg_parallel_speedup,
    compiled_infer_seconds,
)
from rkpart.cost_model.rounds import overhead
from rkpart.cost_model.select import latency_error
from rkpart.errors import UserError
from rkpart.plan.plan import Plan
from rkpart.types import HOST, LIFECYCLE, JsonMap, JsonObject, Residency

ESTIMATE_VERSION = 1


@dataclass(frozen=True)
class StageEstimate:
    """One stage's predicted figures (``None`` where they do not apply)."""

    id: str
    device: str
    residency: str
    device_mem_bytes: int | None
    device_mem_source: str | None
    #: relative error of ``device_mem_bytes`` (against the board)
    device_mem_error: float | None
    load_s: float | None
    init_s: float | None
    infer_s: float | None  # per pass (the host stage's whole time for a host stage)
    release_s: float | None
    infer_source: str
    compiled: bool
    #: the device memory a budget counts: a prediction raised by the predictor's budget margin (the
    #: held-out under-prediction it covers, :func:`rkpart.cost_model.device_model.budget_margin`),
    #: the compiler's figure as it is
    device_mem_bound_bytes: int | None = None

    @property
    def source(self) -> str:
        """``compiler`` when the stage's figures come from its build, else ``predicted``."""
        return "compiler" if self.compiled else "predicted"

    def to_json(self) -> JsonObject:
        return {"id": self.id, "device": self.device, "residency": self.residency,
                "device_mem_bytes": self.device_mem_bytes, "device_mem_source": self.device_mem_source,
                "device_mem_error": _r(self.device_mem_error), "device_mem_bound_bytes": self.device_mem_bound_bytes,
                "load_s": _r(self.load_s), "init_s": _r(self.init_s),
                "infer_s": _r(self.infer_s), "release_s": _r(self.release_s), "infer_source": self.infer_source,
                "source": self.source}


@dataclass(frozen=True)
class Estimate:
    """A plan's predicted device memory and time per image."""

    stages: tuple[StageEstimate, ...]
    toolkit: str | None
    steps: int
    cfg: bool
    device_mem_bytes: int
    device_mem_error: float | None
    seconds_per_image: float
    seconds_error: float | None
    seconds_source: str
    lifecycle_s: float
    npu_infer_s: float
    host_s: float
    cfg_parallel: JsonMap | None
    model: str
    #: model calls per denoising step, and where that number comes from
    calls_per_step: int = 2
    calls_source: str = "--cfg"
    #: the VAE decode, once per image: seconds (included in ``seconds_per_image``), where and from what
    vae_s: float | None = None
    vae_source: str | None = None
    #: the peak from the stages' :attr:`StageEstimate.device_mem_bound_bytes`, and the margin the
    #: predicted ones were raised by (``None``: no stage predicted, or the predictor carries none)
    device_mem_bound_bytes: int | None = None
    device_mem_margin: float | None = None
    #: the worst held-out under-prediction of the memory model (a fraction, <= 0) the margin does not
    #: cover: what the bound is honest about (``None``: no stage predicted, or not recorded)
    device_mem_worst_under: float | None = None

    @property
    def passes(self) -> int:
        return self.steps * self.calls_per_step

    def to_json(self) -> JsonObject:
        return {
            "format": "rkpart-estimate", "version": ESTIMATE_VERSION, "toolkit": self.toolkit, "cost_model": self.model,
            "stages": [s.to_json() for s in self.stages],
            "pipeline": {
                "steps": self.steps, "cfg": self.cfg, "calls_per_step": self.calls_per_step,
                "calls_source": self.calls_source, "passes": self.passes,
                "vae_decode_s": _r(self.vae_s), "vae_source": self.vae_source,
                "device_mem_bytes": self.device_mem_bytes, "device_mem_error": _r(self.device_mem_error),
                "device_mem_bound_bytes": self.device_mem_bound_bytes, "device_mem_margin": _r(self.device_mem_margin),
                "device_mem_worst_under": _r(self.device_mem_worst_under),
                "seconds_per_image": _r(self.seconds_per_image), "seconds_error": _r(self.seconds_error),
                "seconds_source": self.seconds_source, "lifecycle_s": _r(self.lifecycle_s),
                "npu_infer_s": _r(self.npu_infer_s), "host_s": _r(self.host_s),
                "cfg_parallel": None if self.cfg_parallel is None else dict(self.cfg_parallel),
            },
        }

    def render(self) -> str:
        mib = float(1 << 20)
        rows: list[tuple[str, ...]] = [("stage", "device", "residency", "dev MiB", "mem from", "load s", "init s",
                                        "infer s", "release s", "infer from")]
        for s in self.stages:
            rows.append((s.id, s.device, s.residency,
                         "-" if s.device_mem_bytes is None else f"{s.device_mem_bytes / mib:.1f}",
                         s.device_mem_source or "-", *(_f(v) for v in (s.load_s, s.init_s, s.infer_s, s.release_s)),
                         s.infer_source))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        pm = "" if self.device_mem_error is None else f" (+-{self.device_mem_error * 100:.0f} %)"
        ps = "" if self.seconds_error is None else f" +- {self.seconds_per_image * self.seconds_error:.1f}"
        lines.append(f"device memory peak under the plan's residency: {self.device_mem_bytes / mib:.1f} MiB{pm}")
        if self.device_mem_bound_bytes is not None and self.device_mem_margin is not None:
            worst = ("" if self.device_mem_worst_under is None or self.device_mem_worst_under >= 0 else
                     f"; the worst held out was {self.device_mem_worst_under * 100:.1f} %")
            lines.append(f"device memory bound for budgets: {self.device_mem_bound_bytes / mib:.1f} MiB (predicted "
                         f"stages +{self.device_mem_margin * 100:.1f} %: covers {BOUND_QUANTILE:.0%} of the memory "
                         f"model's under-predictions at families it was not fitted on{worst}; docs/cost-model.md)")
        calls = (f"{self.calls_per_step} CFG" if self.calls_source in ("--cfg", "--no-cfg") else
                 f"{self.calls_per_step} model call{'s' if self.calls_per_step != 1 else ''} per step "
                 f"({self.calls_source})")
        vae = "" if self.vae_s is None else f", VAE decode {self.vae_s:.2f} s ({self.vae_source})"
        lines.append(f"seconds per image ({self.steps} steps x {calls} = {self.passes} passes): "
                     f"{self.seconds_per_image:.2f}{ps} s (lifecycle {self.lifecycle_s:.2f} s, NPU inference "
                     f"{self.npu_infer_s:.2f} s, host {self.host_s:.2f} s{vae}; {self.seconds_source})")
        if self.cfg_parallel is not None:
            cp = self.cfg_parallel
            lines.append(f"with --cfg-parallel (two NPU cores): {cp['seconds_per_image']:.2f} s per image, "
                         f"device memory {cp['device_mem_bytes'] / mib:.1f} MiB (both contexts); {cp['source']}")
        lines.append(f"cost model: {self.model}; toolkit: {self.toolkit or 'none named'}")
        return "\n".join(lines) + "\n"


def _r(v: float | None) -> float | None:
    return None if v is None else float(f"{v:.6g}")


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def _residencies(plan: Plan) -> dict[str, str]:
    from rkpart.runtime.executor import plan_residency

    return {k: str(v) for k, v in plan_residency(plan, default=Residency.PER_STAGE).items()}


def _check_toolkit(version: str, model: CostModel) -> None:
    """Refuse a ``--toolkit`` that is no rknn-toolkit2 version rkpart knows: not one the target
    documents, the cost model has a memory predictor for, or is installed (the estimate would use
    another toolkit's memory model under its label)."""
    from rkpart.compile.toolkits import list_toolkits
    from rkpart.targets import get_target

    known = set(get_target().toolkits) | set(model.device_memory) | {t.version for t in list_toolkits(None)}
    if version not in known:
        raise UserError(f"--toolkit {version[:40]!r} is no rknn-toolkit2 version rkpart knows (known: "
                        f"{', '.join(sorted(known))})")


def calls_per_step(cfg_mode: str) -> tuple[int, str]:
    """Model calls per denoising step of a pipeline whose ``pipeline.json`` CFG mode is ``cfg_mode``,
    and why (the sampler's order never adds a call: a multistep scheduler reuses earlier outputs)."""
    if cfg_mode == "two-pass":
        return 2, "two-pass CFG: a conditional and an unconditional call; pipeline.json"
    if cfg_mode == "batched":
        return 1, "batched CFG: one call on the [uncond, cond] pair, batch 2; pipeline.json"
    if cfg_mode == "distilled":
        return 1, "guidance-distilled: one call, the guidance an input; pipeline.json"
    return 1, "no CFG: one call; pipeline.json"


def vae_decode_seconds(decoder: Path, model: CostModel) -> tuple[float, str]:
    """Seconds of one decode of ``decoder`` (``vae_decoder.onnx``) on the board's CPU, from the cost
    model's host predictor (the bundle runs it there with ``--vae host``, and falls back there)."""
    import onnx

    from rkpart.cost_model.features import model_features

    f = model_features(onnx.load_model(str(decoder), load_external_data=False), device=HOST, path=decoder)
    host = model.predict_stage(f).get("host")
    if host is None:
        raise UserError("the cost model has no 'host' predictor; use the shipped calibration or refit it")
    return float(host), f"{decoder.name} on the host CPU, predicted"


def estimate_plan(plan: Plan, folder: str | Path, model: CostModel, *, toolkit: str | None = None, steps: int = 30,
                  cfg: bool = True, model_label: str = "cost model",
                  residency: Mapping[str, str] | None = None, calls: tuple[int, str] | None = None,
                  vae_decoder: Path | None = None) -> Estimate:
    """The :class:`Estimate` of ``plan`` (its stage files in ``folder``) under ``model``.

    ``residency`` maps stage ids to ``per-stage``/``resident`` (default: what the plan chose,
    per-stage elsewhere, as the bundle runs it).  ``calls``: model calls per step and their source
    (:func:`calls_per_step`; default 2 with ``cfg``, else 1).  ``vae_decoder``: the pipeline's
    ``vae_decoder.onnx``, decoded once per image.
    """
    if steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    folder = Path(folder)
    if toolkit is not None:
        _check_toolkit(toolkit, model)
    tk = toolkit or (plan.extra.get("compile") or {}).get("toolkit") or model.provenance.toolkit
    res = dict(residency) if residency is not None else _residencies(plan)
    per_step, calls_src = calls if calls is not None else ((2, "--cfg") if cfg else (1, "--no-cfg"))
    passes = steps * per_step
    mem_comp = model.memory_component(tk)
    held = ((mem_comp.fit_error or {}).get("held_out") or {}) if mem_comp is not None else {}
    pred_err = held.get("p90_ape")
    margin = budget_margin(mem_comp.fit_error) if mem_comp is not None else None
    out: list[StageEstimate] = []
    feats: list[tuple[Features, str]] = []
    for s in plan.stages:
        f = stage_features(folder, s)
        r = Residency.RESIDENT.value if s.device == HOST else res.get(s.id, Residency.PER_STAGE.value)
        feats.append((f, r))
        pred = model.predict_stage(f)
        if s.device == HOST:
            host = pred.get("host")
            if host is None:
                raise UserError("the cost model has no 'host' predictor; use the shipped calibration or refit it")
            check_stage_estimate(s.id, {"host": host})
            out.append(StageEstimate(id=s.id, device=s.device, residency=r, device_mem_bytes=None,
                                     device_mem_source=None, device_mem_error=None, load_s=None, init_s=None,
                                     infer_s=host, release_s=None, infer_source="predicted", compiled=False))
            continue
        missing = [c for c in LIFECYCLE if pred.get(c) is None]
        if missing:
            raise UserError(f"the cost model has no {missing[0]!r} predictor for NPU stages; use the shipped "
                            "calibration or refit it")
        art = s.artifact("rknn")
        compiled = art is not None and art.compiler is not None and art.compiler.device_mem_bytes is not None
        mem: float
        merr: float | None
        bound: float | None = None
        if compiled:
            mem, msrc, merr = float((f.compiled_mem_bytes or 0) + OTHER_BYTES), "compiler", COMPILER_ERROR
        elif mem_comp is not None:
            mem = max(mem_comp.predict(f), float(f.weight16))
            bound = None if margin is None else mem * (1 + margin)
            msrc = "predicted"
            merr = None if pred_err is None else math.hypot(float(pred_err) / 100.0, COMPILER_ERROR)
        else:
            mem, msrc, merr = 0.0, "none", None
        infer = pred["infer"]
        isrc = "predicted"
        from_compiler = compiled_infer_seconds(model, f)
        if from_compiler is not None:
            infer, isrc = from_compiler, "compiler"
        check_stage_estimate(s.id, {"load": pred["load"], "init": pred["init"], "infer": infer,
                                    "release": pred["release"], "device memory": mem})
        out.append(StageEstimate(id=s.id, device=s.device, residency=r, device_mem_bytes=math.ceil(mem),
                                 device_mem_source=msrc, device_mem_error=merr, load_s=pred["load"],
                                 init_s=pred["init"], infer_s=infer, release_s=pred["release"], infer_source=isrc,
                                 compiled=bool(compiled),
                                 device_mem_bound_bytes=math.ceil(mem if bound is None else bound)))
    npu = [e for e in out if e.device != HOST]
    resident = [e.device_mem_bytes or 0 for e in npu if e.residency == Residency.RESIDENT.value]
    per_stage = [e.device_mem_bytes or 0 for e in npu if e.residency != Residency.RESIDENT.value]
    peak = sum(resident) + max(per_stage, default=0)
    bounds = [(e.residency, e.device_mem_bound_bytes or 0) for e in npu]
    bound_peak = (sum(b for r, b in bounds if r == Residency.RESIDENT.value)
                  + max((b for r, b in bounds if r != Residency.RESIDENT.value), default=0))
    predicted = any(e.device_mem_source == "predicted" for e in npu)
    errs = [e.device_mem_error for e in npu if e.device_mem_error is not None]
    mem_err = max(errs) if errs and len(errs) == len(npu) else None
    life = infer_total = host_total = 0.0
    for e in out:
        if e.device == HOST:
            host_total += (e.infer_s or 0.0) * passes
            continue
        cycles = passes if e.residency != Residency.RESIDENT.value else 1
        life += ((e.load_s or 0.0) + (e.init_s or 0.0) + (e.release_s or 0.0)) * cycles
        infer_total += (e.infer_s or 0.0) * passes
    glue = overhead(model, feats, passes, whole_round=True)
    vae_s, vae_src = vae_decode_seconds(vae_decoder, model) if vae_decoder is not None else (None, None)
    seconds = life + infer_total + host_total + glue + (vae_s or 0.0)
    err = latency_error(model)
    srcs = sorted({e.infer_source for e in npu})
    sec_src = f"NPU inference from {' and '.join(srcs) or 'nothing'}; lifecycle and host from the cost model"
    cp = None
    if per_step == 2:
        # both passes of a step at once: one context per pass and core, so every NPU stage twice
        speedup, source = cfg_parallel_speedup(model)  # measured on a board (tune) or the prior
        cp = {"seconds_per_image": _r(life + infer_total / speedup + host_total + glue + (vae_s or 0.0)),
              "device_mem_bytes": 2 * peak, "speedup": speedup, "source": source}
    return Estimate(stages=tuple(out), toolkit=tk, steps=steps, cfg=cfg, device_mem_bytes=int(peak),
                    device_mem_error=mem_err, seconds_per_image=seconds, seconds_error=err, seconds_source=sec_src,
                    lifecycle_s=life, npu_infer_s=infer_total, host_s=host_total, cfg_parallel=cp, model=model_label,
                    calls_per_step=per_step, calls_source=calls_src, vae_s=vae_s, vae_source=vae_src,
                    device_mem_bound_bytes=int(bound_peak) if predicted and margin is not None else None,
                    device_mem_margin=margin if predicted else None,
                    device_mem_worst_under=_worst_under(held) if predicted and margin is not None else None)


def _worst_under(held: object) -> float | None:
    """``held_out.worst_under`` of a predictor's fit error (a percentage, <= 0) as a fraction."""
    v = held.get("worst_under") if isinstance(held, Mapping) else None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return min(float(v), 0.0) / 100
    return None


__all__ = ["CFG_PARALLEL_SPEEDUP", "Estimate", "StageEstimate", "calls_per_step", "estimate_plan", "vae_decode_seconds"]
