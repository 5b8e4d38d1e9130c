"""Choose a candidate and a residency per block: least predicted latency within a memory budget.

Pipeline latency of one image (``passes = steps x (2 if cfg else 1)``):

* per-stage residency: ``passes x (load + init + infer + release + host)`` per block, and
  only one NPU stage is loaded at a time;
* resident: ``load + init + release`` once, ``passes x (infer + host)``, and the block's
  stages stay loaded for the whole run.

Device memory of the pipeline = the sum over resident blocks + the largest per-stage
stage.  The choice minimises total latency subject to that memory ``<= budget`` and to
the accuracy floor (predicted error ratio ``<= max_error_ratio``), by dynamic programming
over blocks (runs of fused blocks are segments) for every possible per-stage peak.

Precision (``SelectionConfig.precisions``): every candidate with NPU stages also stands as its
int8 twin (:func:`rkpart.cost_model.candidates.with_precisions`), costed from an int8 build's
compiler tables or the stated int8 prior.  Its error ratio is the *measured* drift of its own
accuracy family (``...,precision=int8``, written by ``rkpart drift --accuracy``) and the floor
applies to it like to any candidate; a twin whose precision has no measured drift is excluded.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.cost_model.candidates import INT8_PRIOR, Candidate, mark_exclusions, with_precisions
from rkpart.cost_model.checks import check_prediction
from rkpart.cost_model.device_model import OTHER_BYTES, budget_margin
from rkpart.cost_model.model import CostModel
from rkpart.cost_model.npu_time import (
    CFG_PARALLEL_SOURCE,
    CFG_PARALLEL_SPEEDUP,
    cfg_parallel_speedup,
    compiled_infer_seconds,
)
from rkpart.cost_model.rounds import outside_range, overhead
from rkpart.errors import BudgetError, UserError
from rkpart.targets.known_issues import CrashPattern, crash_patterns
from rkpart.types import JsonObject
from rkpart.units import MIB

RESIDENCIES = ("per-stage", "resident")
LIFE = ("load", "init", "release")


@dataclass(frozen=True)
class SelectionConfig:
    """What ``--strategy auto`` was asked to optimise."""

    budget_mib: float | None = None
    toolkit: str | None = None  # None: the cost model's own toolkit
    steps: int = 1
    cfg: bool = True
    residencies: tuple[str, ...] = RESIDENCIES
    max_error_ratio: float | None = None  # None: the cost model's default floor
    max_run: int = 2  # longest run of fused blocks among the candidates (the pipeline builds them)
    compiled: tuple[str, ...] = ()
    #: a build in ``compiled`` stands for every block of the same anatomy (``auto``'s own
    #: representative builds); off, a build speaks for the blocks it covers only
    share_anatomy: bool = False
    plugins: bool = True  # plugin strategies' partitions are candidates too
    #: where ``budget_mib`` came from ("--budget-mib", or the target's documented default)
    budget_source: str = "given"
    #: plan for the two CFG passes of a step running at once on two NPU cores (the bundle runner's
    #: ``--cfg-parallel``): two contexts of every stage, NPU inference at the prior speed-up
    cfg_parallel: bool = False
    #: the precisions every candidate is considered in (``fp16``, ``int8``; issue 27)
    precisions: tuple[str, ...] = ("fp16",)

    @property
    def passes(self) -> int:
        return self.steps * (2 if self.cfg else 1)


@dataclass(frozen=True)
class Option:
    """A candidate under one residency, with its predictions for the whole pipeline."""

    candidate: Candidate
    residency: str
    load: float
    init: float
    infer: float
    release: float
    host: float
    latency: float
    device_bytes: int  # while the candidate's stages are loaded (max or sum of stages)
    pss_bytes: int | None
    error_ratio: float | None
    excluded: str | None
    glue: float = 0.0  # what the pipeline pays between stages and for host session setup
    #: where ``device_bytes`` comes from: ``compiler`` (the compiled stages' own plan), ``predicted``
    device_source: str = "predicted"

    @property
    def key(self) -> str:
        return f"{self.candidate.id}/{self.residency}"

    def to_json(self) -> JsonObject:
        return {
            "candidate": self.candidate.id, "residency": self.residency, "blocks": list(self.candidate.blocks),
            "npu_stages": len(self.candidate.npu),
            "load_s": _r(self.load), "init_s": _r(self.init), "infer_s": _r(self.infer), "release_s": _r(self.release),
            "host_s": _r(self.host), "glue_s": _r(self.glue), "latency_s": _r(self.latency),
            "device_mib": round(self.device_bytes / MIB, 2), "device_source": self.device_source,
            "pss_peak_mib": None if self.pss_bytes is None else round(self.pss_bytes / MIB, 2),
            "error_ratio": self.error_ratio, "excluded": self.excluded,
            **({"suspected": self.candidate.suspected} if self.candidate.suspected else {}),
            **({} if self.candidate.precision == "fp16" else {"precision": self.candidate.precision,
                                                              "precision_source": self.candidate.precision_source}),
        }


def _r(x: float) -> float:
    return float(f"{x:.6g}")


@dataclass(frozen=True)
class MemoryTerm:
    """Which predictor stands for the memory a budget bounds, and its once-per-process part.

    A model with an NPU ``device_mem`` predictor (the board, the simulator's calibration) is
    budgeted in device-mapped memory.  A model fitted on ONNX Runtime has none: there the
    device *is* the process, and measured process memory (``pss_peak``) is what a budget
    binds; its constant term is the process baseline, counted once per pipeline, not once per
    stage.
    """

    component: str
    baseline_bytes: float
    label: str


def memory_term(model: CostModel) -> MemoryTerm | None:
    """The model's memory predictor for budgets, or ``None`` if it has none."""
    if "device_mem" in model.components or model.device_memory:
        return MemoryTerm("device_mem", 0.0, "NPU device-mapped memory")
    comp = model.components.get("pss_peak")
    if comp is None:
        return None
    base = sum(c for t, c in zip(comp.terms, comp.coef, strict=True) if t == "const")
    backends = model.provenance.backends
    where = f" on {', '.join(map(str, backends))}" if backends else ""
    return MemoryTerm("pss_peak", float(base), f"process memory (peak PSS{where})")


def stage_memory(model: CostModel, f: Any, term: MemoryTerm | None,
                 toolkit: str | None = None) -> tuple[float, float | None, str]:
    """(budgeted memory of one NPU stage without the process baseline, its process PSS, the source
    of the first figure).

    Device memory is the compiler's own weight + internal memory when the stage was compiled
    (``compiler``), else the compiler-fitted predictor of ``toolkit`` or the model's ``device_mem``
    (``predicted``, raised by its budget margin: :func:`~rkpart.cost_model.device_model.budget_margin`).
    A stage never needs less than its weights; process memory never less than
    the weights plus the live activations (tokens x hidden x bytes) and never less than device memory.
    """
    pred = model.predict_stage(f)
    comp = model.memory_component(toolkit)
    dev: float | None = None
    source = "predicted"
    if f.compiled_mem_bytes is not None:
        dev, source = float(f.compiled_mem_bytes + OTHER_BYTES), "compiler"
    elif comp is not None:
        floor = float(f.weight16) if "weight16" in comp.terms else float(f.weight_bytes + f.peak_bytes)
        # a budget binds the bound, not the prediction: raised by the held-out under-prediction the
        # predictor's fit measured at families it never saw (an overflow on the board is the failure)
        dev = max(comp.predict(f), floor) * (1 + (budget_margin(comp.fit_error) or 0.0))
    pss = pred.get("pss_peak")
    if pss is not None:
        pss = max(float(pss), float(f.weight_bytes + f.peak_bytes)
                  + (term.baseline_bytes if term and term.component == "pss_peak" else 0.0), dev or 0.0)
    if term is None:
        return 0.0, pss, source
    if term.component == "device_mem":
        return float(dev or 0.0), pss, source
    return float(pss or 0.0) - term.baseline_bytes, pss, "predicted"


def evaluate(c: Candidate, residency: str, model: CostModel, cfg: SelectionConfig, max_ratio: float) -> Option:
    """Predicted components of ``c`` under ``residency`` over the whole pipeline run."""
    p = cfg.passes
    preds = model.predict(c.npu)
    term = memory_term(model)

    def total(name: str) -> float:
        vals = [pr.get(name) for pr in preds]
        if any(v is None for v in vals):
            raise UserError(f"the cost model has no {name!r} predictor; refit it or use the shipped calibration")
        return float(sum(v for v in vals if v is not None))

    calls = p if residency == "per-stage" else 1
    load, init, release = (total(n) * calls for n in LIFE)
    # a compiled stage's inference from its compiler plan, when the model is calibrated for that
    compiled = [compiled_infer_seconds(model, f) for f in c.npu]
    if c.npu and all(v is not None for v in compiled):
        infer = sum(v for v in compiled if v is not None) * p
    else:
        infer = total("infer") * p
    if cfg.cfg_parallel and cfg.cfg:
        infer /= cfg_parallel_speedup(model)[0]  # measured on a board (tune) or the prior
    host = 0.0
    if c.host is not None:
        hp = model.predict_stage(c.host).get("host")
        if hp is None:
            raise UserError("the cost model has no 'host' predictor; refit it or use the shipped calibration")
        host = hp * p
    stages = [(f, residency) for f in c.npu] + ([(c.host, "resident")] if c.host is not None else [])
    glue = overhead(model, stages, p)
    toolkit = cfg.toolkit or model.provenance.toolkit
    mems = [stage_memory(model, f, term, toolkit) for f in c.npu]
    contexts = 2 if cfg.cfg_parallel and cfg.cfg else 1  # one context per pass and core
    dev = [m * contexts for m, _, _ in mems]
    device = (max(dev, default=0.0) if residency == "per-stage" else sum(dev))
    sources = {src for _, _, src in mems}
    pss_vals = [v for _, v, _ in mems]
    pss_max = None if any(v is None for v in pss_vals) or not pss_vals else max(v for v in pss_vals if v is not None)
    if pss_max is not None and not math.isfinite(pss_max):
        check_prediction(c.id, residency, {"process memory": pss_max}, p)
    pss = None if pss_max is None else int(pss_max)
    fam = model.accuracy.family(c.accuracy_key)
    ratio = None if fam is None else fam.ratio
    if c.precision != "fp16" and c.precision_source == "prior":
        sources = {f"{c.precision}-prior"}
    check_prediction(c.id, residency, {"latency": load + init + infer + release + host + glue, "load": load,
                                       "init": init, "infer": infer, "release": release, "host": host,
                                       "glue": glue, "device memory": device, "process memory": float(pss or 0)},
                     p)
    excluded = c.excluded
    if excluded is None and ratio is None and c.precision != "fp16":
        excluded = (f"accuracy: no measured drift for {c.precision} ({c.accuracy_key}); auto never picks an "
                    f"unmeasured precision: `rkpart drift` an {c.precision} plan of this family with --accuracy")
    elif excluded is None and ratio is not None and ratio > max_ratio and c.precision != "fp16":
        excluded = (f"accuracy: measured {c.precision} drift {ratio:g}x the baseline's latent MSE > bound "
                    f"{max_ratio:g}x (--option max_error_ratio)")
    elif excluded is None and ratio is not None and ratio > max_ratio:
        excluded = f"accuracy: predicted error {ratio:g}x the most accurate partition's > floor {max_ratio:g}x"
    return Option(candidate=c, residency=residency, load=load, init=init, infer=infer, release=release, host=host,
                  latency=load + init + infer + release + host + glue, device_bytes=math.ceil(device), pss_bytes=pss,
                  error_ratio=ratio, excluded=excluded, glue=glue,
                  device_source="+".join(sorted(sources)) if term is not None and term.component == "device_mem"
                  else "predicted")


@dataclass(frozen=True)
class Trade:
    """The capability's move of a chosen candidate's CPU ops to the host, weighed against leaving
    them in the NPU stage for the runtime's own CPU fallback (issue 28).

    Both round-trip: a moved op's tensors cross between host and NPU stages, a fallback layer's
    cross inside the runtime.  ``moved`` is the chosen option; ``fallback`` the same candidate
    proposed without the capability, under the same residency, its CPU ops' time
    (``fallback_cpu_s``, at the cost model's host rate) added.  What the runtime's switch per
    fallback layer costs is not in either figure: it is not measured here (no board).
    """

    ops: tuple[str, ...]  # op types the runtime would run on the CPU inside the stage
    moved: Option
    fallback: Option
    fallback_cpu_s: float

    @property
    def fallback_latency(self) -> float:
        return self.fallback.latency + self.fallback_cpu_s

    def line(self) -> str:
        d = self.moved.latency - self.fallback_latency
        kinds = ", ".join(f"{t} x{n}" for t, n in sorted(_counts(self.ops).items()))
        verdict = ("the fallback is predicted cheaper, but" if d > 0 else "moving is predicted no slower, and")
        return (f"  capability: {len(self.ops)} CPU op(s) ({kinds}) on the host: {self.moved.latency * 1e3:.3f} ms; "
                f"left in the NPU stage to the runtime's CPU fallback: {self.fallback_latency * 1e3:.3f} ms "
                f"({self.fallback.latency * 1e3:.3f} ms + {self.fallback_cpu_s * 1e3:.3f} ms of CPU work, plus a "
                f"per-layer switch not measured here); {verdict} an NPU stage keeps no CPU layer "
                f"(moved: {d * 1e3:+.3f} ms)")

    def to_json(self) -> JsonObject:
        return {"ops": list(self.ops), "moved_s": _r(self.moved.latency), "fallback_s": _r(self.fallback_latency),
                "fallback_cpu_s": _r(self.fallback_cpu_s),
                "fallback_device_mib": round(self.fallback.device_bytes / MIB, 2),
                "moved_device_mib": round(self.moved.device_bytes / MIB, 2)}


def _counts(items: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


@dataclass
class Selection:
    """The choice per block and everything considered, for ``--explain`` / ``--json``."""

    config: SelectionConfig
    options: dict[int, list[Option]]  # by first block
    chosen: list[Option]  # in block order, covering every block once
    device_bytes: int
    latency: float
    model_provenance: JsonObject
    toolkit: str | None
    max_error_ratio: float
    notes: list[str] = field(default_factory=list)
    memory: MemoryTerm | None = None
    #: relative held-out error of a predicted latency (``None``: the model has none)
    latency_error: float | None = None
    #: what ``latency_error`` is: ``"held-out"`` or a calibration's measurement resolution
    latency_error_source: str = "held-out"
    #: block -> keys of the options whose predicted latency is within the error of the choice
    ties: dict[int, list[str]] = field(default_factory=dict)
    degrees_of_freedom: int | None = None
    #: where device-memory figures come from, in words (``compiler`` / ``predicted`` sources)
    memory_source: str = ""
    #: block -> the capability's move weighed against the runtime's CPU fallback (:class:`Trade`),
    #: for the explanation (:func:`rkpart.auto.select` with ``trades``; empty: nothing moved, or not asked)
    trades: dict[int, Trade] = field(default_factory=dict, repr=False)
    #: the CFG-parallel speed-up used and its source (:func:`~rkpart.cost_model.npu_time.cfg_parallel_speedup`)
    cfg_parallel_speedup: tuple[float, str] = (CFG_PARALLEL_SPEEDUP, CFG_PARALLEL_SOURCE)

    @property
    def baseline_bytes(self) -> int:
        return 0 if self.memory is None else math.ceil(self.memory.baseline_bytes)

    def choice_for(self, block: int) -> Option:
        for o in self.chosen:
            if block in o.candidate.blocks:
                return o
        raise KeyError(block)

    def reason(self, o: Option) -> str:
        """Why ``o`` was chosen, excluded or passed over; a known issue it is only suspected of follows."""
        why = self._reason(o)
        return why if o.excluded or not o.candidate.suspected else f"{why}; {o.candidate.suspected}"

    def _reason(self, o: Option) -> str:
        if o.excluded:
            return f"excluded: {o.excluded}"
        ch = self.choice_for(o.candidate.start)
        tie = o.key in self.ties.get(ch.candidate.start, [])
        if o is ch and o.candidate.precision != "fp16":
            return self._precision_reason(o)
        if o is ch:
            if self.ties.get(ch.candidate.start):
                return "chosen: within the model's error of the fastest; least memory, then most accurate"
            return "chosen: least predicted pipeline latency within budget and accuracy floor"
        budget = self.config.budget_mib
        if budget is not None and o.device_bytes + self.baseline_bytes > budget * MIB:
            return f"over budget alone ({(o.device_bytes + self.baseline_bytes) / MIB:.1f} > {budget:g} MiB)"
        # per block: a run of K fused blocks is compared with one block's candidates per block
        mine, theirs = o.latency / len(o.candidate.blocks), ch.latency / len(ch.candidate.blocks)
        d = mine - theirs
        per = " per block" if len(o.candidate.blocks) > 1 or len(ch.candidate.blocks) > 1 else ""
        if tie:
            return (f"tie{per}: {d:+.4g} s ({d / theirs * 100:+.2f} %) is within the model's error "
                    f"(+-{(self.latency_error or 0) * 100:.1f} %); lost on memory, then accuracy")
        if d > 0:
            return f"slower{per}: +{d:.4g} s ({d / theirs * 100:+.2f} %)"
        return f"faster{per}, but {self._binding(o)}"

    def _cover_with(self, o: Option, budget: float | None) -> tuple[float, list[Option], int] | None:
        """The least-latency cover of every block that uses ``o`` (``None``: none fits ``budget``, bytes)."""
        order = sorted(self.options)
        pos, ln = order.index(o.candidate.start), len(o.candidate.blocks)
        segs = [[(n, x) for n, x in seg if (i < pos and i + n <= pos) or i >= pos + ln] if i != pos else [(ln, o)]
                for i, seg in enumerate(_segments(self.options, order))]
        return _solve(segs, budget)

    def _binding(self, o: Option) -> str:
        """Why an option faster per block than the choice was not chosen: the constraint that binds.

        Either the blocks pair up worse with it (a run of fused blocks leaves its neighbours to
        costlier covers: the best cover using it is slower in total), or the memory budget (the
        covers using it that would be faster do not fit)."""
        def cover(c: list[Option]) -> str:
            return ", ".join(f"{x.key} ({'-'.join(map(str, (x.candidate.blocks[0], x.candidate.blocks[-1])))})"
                             if len(x.candidate.blocks) > 1 else f"{x.key} ({x.candidate.start})" for x in c)

        free = self._cover_with(o, None)
        if free is None:
            return "no cover of every block uses it"
        lat, used = free[0], free[2] + self.baseline_bytes
        if abs(lat - self.latency) <= 1e-9 * max(lat, self.latency):
            return (f"the fastest cover of every block using it, {cover(free[1])}, takes the same {lat:.4g} s as the "
                    f"choice (device memory {used / MIB:.1f} MiB against the choice's {self.device_bytes / MIB:.1f} "
                    "MiB): the first cover found of equal latency was kept")
        if lat > self.latency:
            return (f"the blocks pair up worse with it: the fastest cover of every block using it, {cover(free[1])}, "
                    f"takes {lat:.4g} s against the choice's {self.latency:.4g} s "
                    f"({(lat / self.latency - 1) * 100:+.2f} %)")
        budget = self.config.budget_mib
        assert budget is not None  # without a budget the fastest cover is the choice
        fits = self._cover_with(o, budget * MIB - self.baseline_bytes)
        need = f"the fastest cover of every block using it, {cover(free[1])}, needs {used / MIB:.1f} MiB"
        if fits is None:
            return f"no cover of every block using it fits the {budget:g} MiB budget: {need}"
        if abs(fits[0] - self.latency) <= 1e-9 * max(fits[0], self.latency):
            return (f"within the {budget:g} MiB budget the best cover of every block using it, {cover(fits[1])}, "
                    f"takes the same {fits[0]:.4g} s as the choice: the first cover found of equal latency was kept; "
                    f"{need}")
        return (f"within the {budget:g} MiB budget the best cover of every block using it takes {fits[0]:.4g} s "
                f"against the choice's {self.latency:.4g} s; {need}")

    def fp16_twin(self, o: Option) -> Option | None:
        """The fp16 option of the same family, blocks and residency as int8 option ``o``."""
        return next((x for x in self.options.get(o.candidate.start, ()) if x.candidate.precision == "fp16"
                     and x.candidate.family == o.candidate.family and x.candidate.blocks == o.candidate.blocks
                     and x.residency == o.residency), None)

    def _precision_reason(self, o: Option) -> str:
        base = self.fp16_twin(o)
        vs = "" if base is None else (
            f" vs {base.key}: device memory {(o.device_bytes - base.device_bytes) / MIB:+.2f} MiB "
            f"({_pct(base.device_bytes, o.device_bytes)}), latency {o.latency - base.latency:+.4g} s "
            f"({_pct(base.latency, o.latency)})")
        src = "int8 prior" if o.candidate.precision_source == "prior" else "int8 build's compiler tables"
        ratio = "-" if o.error_ratio is None else f"{o.error_ratio:g}x"
        return (f"chosen: {o.candidate.precision}{vs} ({src}); measured drift {ratio} <= bound "
                f"{self.max_error_ratio:g}x")

    def precision_lines(self) -> list[str]:
        """Per block: the precision chosen and why (for ``--explain``; empty when only fp16 was considered)."""
        if tuple(self.config.precisions) == ("fp16",):
            return []
        out = []
        for ch in self.chosen:
            blocks = ",".join(map(str, ch.candidate.blocks))
            if ch.candidate.precision != "fp16":
                out.append(f"precision: block {blocks}: {ch.candidate.precision} ({ch.key}): "
                           f"{self._precision_reason(ch)[len('chosen: '):]}")
                continue
            twins = [x for x in self.options.get(ch.candidate.start, ()) if x.candidate.precision != "fp16"
                     and x.candidate.family == ch.candidate.family and x.candidate.blocks == ch.candidate.blocks
                     and x.residency == ch.residency]
            why = (f"{twins[0].key} excluded: {twins[0].excluded}" if twins and twins[0].excluded
                   else f"{twins[0].key}: {self.reason(twins[0])}" if twins else "no int8 twin")
            out.append(f"precision: block {blocks}: fp16 ({ch.key}): {why}")
        return out

    def to_json(self) -> JsonObject:
        blocks = []
        for start in sorted(self.options):
            blocks.append({
                "block": start,
                "chosen": self.choice_for(start).key,
                "candidates": [{**o.to_json(), "reason": self.reason(o)} for o in self.options[start]],
                **({"capability_trade": self.trades[start].to_json()} if start in self.trades else {}),
            })
        return {
            "budget_mib": self.config.budget_mib, "toolkit": self.toolkit, "steps": self.config.steps,
            "cfg": self.config.cfg, "passes": self.config.passes, "max_error_ratio": self.max_error_ratio,
            "budget_source": self.config.budget_source,
            "memory_term": None if self.memory is None else self.memory.component,
            "latency_error": self.latency_error, "latency_error_source": self.latency_error_source,
            "degrees_of_freedom": self.degrees_of_freedom,
            "ties": {str(k): v for k, v in sorted(self.ties.items())},
            "predicted_latency_s": _r(self.latency), "predicted_device_mib": round(self.device_bytes / MIB, 2),
            "choices": [{"blocks": list(o.candidate.blocks), "candidate": o.candidate.id, "residency": o.residency}
                        for o in self.chosen],
            **({} if tuple(self.config.precisions) == ("fp16",) else {
                "precisions": list(self.config.precisions), "precision": self.precision_lines()}),
            "blocks": blocks, "cost_model": self.model_provenance, "notes": list(self.notes),
        }

    def render(self, blocks: Sequence[int] | None = None) -> str:
        """The explanation: a table per block (``blocks``: which ones; default all)."""
        budget = "none" if self.config.budget_mib is None else f"{self.config.budget_mib:g} MiB"
        if self.config.budget_mib is not None and self.config.budget_source != "given":
            budget += f" ({self.config.budget_source})"
        lines = [f"auto: {self.config.passes} passes ({self.config.steps} steps x "
                 f"{2 if self.config.cfg else 1} CFG), toolkit {self.toolkit or 'any'}, "
                 f"budget {budget}, accuracy floor {self.max_error_ratio:g}x"]
        if self.config.cfg_parallel and self.config.cfg:
            lines.append("cfg-parallel: both CFG passes of a step at once on two NPU cores: every stage's device "
                         f"memory counted twice, NPU inference / {self.cfg_parallel_speedup[0]:g} "
                         f"({self.cfg_parallel_speedup[1]})")
        if self.memory is not None:
            extra = f", plus a process baseline of {self.baseline_bytes / MIB:.1f} MiB" if self.baseline_bytes else ""
            lines.append(f"memory: {self.memory.label} per candidate{extra}")
        if self.memory is not None and self.memory.component == "device_mem":
            lines.append(f"memory figures: {self.memory_source}")
        if self.latency_error is not None:
            lines.append(f"error bars: predicted latencies are +-{self.latency_error * 100:.1f} % "
                         f"({self.latency_error_source}); "
                         "candidates within that of the fastest are a tie, broken by memory, then accuracy")
        else:
            lines.append("error bars: none: the cost model carries no held-out error, so no difference between "
                         "candidates can be called significant")
        if self.degrees_of_freedom == 0:
            lines.append("warning: the calibration has zero degrees of freedom (as many coefficients as measured "
                         "numbers): it reproduces its own data exactly and its error on anything else is unknown")
        w = max([18, *(len(o.candidate.id) for lst in self.options.values() for o in lst)])
        hdr = (f"  {'candidate':<{w}} {'residency':<9} {'load s':>8} {'init s':>8} {'infer s':>8} {'release s':>9} "
               f"{'host s':>7} {'glue s':>7} {'total s':>8} {'/block s':>8} {'dev MiB':>8} {'mem from':>9} "
               f"{'err x':>6}  reason")
        for start in sorted(self.options):
            if blocks is not None and start not in blocks:
                continue
            ch = self.choice_for(start)
            lines.append(f"block {start}: chosen {ch.key}")
            lines.append(hdr)
            for o in self.options[start]:
                mark = "*" if o is ch else " "
                err = "-" if o.error_ratio is None else f"{o.error_ratio:.3g}"
                lines.append(
                    f"{mark} {o.candidate.id:<{w}} {o.residency:<9} {o.load:>8.4f} {o.init:>8.4f} {o.infer:>8.4f} "
                    f"{o.release:>9.4f} {o.host:>7.4f} {o.glue:>7.4f} {o.latency:>8.4f} "
                    f"{o.latency / len(o.candidate.blocks):>8.4f} "
                    f"{o.device_bytes / MIB:>8.1f} {o.device_source:>9} {err:>6}  "
                    f"{self.reason(o)}")
            base = _find(self.options[start], "split", "per-stage")
            for o in self.options[start]:
                if base is not None and o.residency == "per-stage" and o.candidate.id != "split" \
                        and o.candidate.blocks == base.candidate.blocks:
                    lines.append("  " + delta_line(base, o))
            if self.ties.get(start):
                lines.append(f"  tie within the model's error: {', '.join([ch.key, *self.ties[start]])}")
            if start in self.trades:
                lines.append(self.trades[start].line())
        err_bar = "" if self.latency_error is None else f" +- {self.latency * self.latency_error:.4f}"
        what = "device memory" if self.memory is None else self.memory.label
        lines.append(f"predicted pipeline: {self.latency:.4f}{err_bar} s of block time, {what} "
                     f"{self.device_bytes / MIB:.1f} MiB")
        lines += self.precision_lines()
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def _find(opts: Sequence[Option], cid: str, residency: str) -> Option | None:
    return next((o for o in opts if o.candidate.id == cid and o.residency == residency), None)


def _pct(a: float, b: float) -> str:
    return "n/a" if a == 0 else f"{(b - a) / a * 100:+.1f} %"


def delta_line(base: Option, other: Option) -> str:
    """``other`` vs ``base`` per component, in the write-up's terms (NPU inference, host, memory)."""
    return (f"{other.candidate.id} vs {base.candidate.id} (per-stage): load {_pct(base.load, other.load)}, "
            f"init {_pct(base.init, other.init)}, NPU inference {_pct(base.infer, other.infer)}, "
            f"release {_pct(base.release, other.release)}, host AdaLN {_pct(base.host, other.host)}, "
            f"total {_pct(base.latency, other.latency)}, device-mapped memory "
            f"{_pct(base.device_bytes, other.device_bytes)}")


def deltas(base: Option, other: Option) -> dict[str, float | None]:
    """Relative change (fraction) of each component from ``base`` to ``other``."""
    def rel(a: float, b: float) -> float | None:
        return None if a == 0 else (b - a) / a

    return {"load": rel(base.load, other.load), "init": rel(base.init, other.init),
            "infer": rel(base.infer, other.infer), "release": rel(base.release, other.release),
            "host": rel(base.host, other.host), "latency": rel(base.latency, other.latency),
            "device_mem": rel(base.device_bytes, other.device_bytes)}


# -- optimisation ----------------------------------------------------------------------------


def _segments(options: Mapping[int, Sequence[Option]], order: Sequence[int]) -> list[list[tuple[int, Option]]]:
    """Per block position: (segment length, option) pairs of usable options starting there."""
    pos = {b: i for i, b in enumerate(order)}
    out: list[list[tuple[int, Option]]] = [[] for _ in order]
    for start, lst in options.items():
        for o in lst:
            if o.excluded is None:
                out[pos[start]].append((len(o.candidate.blocks), o))
    return out


def _solve(segs: list[list[tuple[int, Option]]], budget: float | None) -> tuple[float, list[Option], int] | None:
    """Least-latency cover of all blocks; ``None`` if none fits ``budget`` (bytes)."""
    n = len(segs)
    peaks = sorted({o.device_bytes for s in segs for _, o in s if o.residency == "per-stage"} | {0})
    best: tuple[float, list[Option], int] | None = None
    unit = MIB  # resident memory is counted in whole MiB, rounded up: never under-estimated
    for peak in peaks:
        if budget is not None and peak > budget:
            break
        cap = None if budget is None else int((budget - peak) // unit)
        size = 1 if cap is None else cap + 1
        dp = np.full((n + 1, size), math.inf)
        # how each (block position, resident MiB) state was reached: index into `moves`
        came = np.full((n + 1, size), -1, dtype=np.int64)
        moves: list[tuple[int, int, Option]] = []  # (from position, memory units, option)
        dp[0, 0] = 0.0
        for i in range(n):
            for ln, o in segs[i]:
                if i + ln > n or (o.residency == "per-stage" and o.device_bytes > peak):
                    continue
                w = 0 if o.residency == "per-stage" or cap is None else math.ceil(o.device_bytes / unit)
                if cap is not None and w > cap:
                    continue
                cand = dp[i, : size - w] + o.latency
                tgt = dp[i + ln, w:]
                better = cand < tgt - 1e-12
                if better.any():
                    tgt[better] = cand[better]
                    came[i + ln, w:][better] = len(moves)
                    moves.append((i, w, o))
        m_end = int(np.argmin(dp[n]))
        if not math.isfinite(dp[n, m_end]):
            continue
        chosen: list[Option] = []
        i, m = n, m_end
        while i > 0:
            pi, w, o = moves[int(came[i, m])]
            chosen.append(o)
            i, m = pi, m - w
        chosen.reverse()
        used = _memory(chosen)
        lat = float(dp[n, m_end])
        if best is None or lat < best[0] - 1e-12 or (abs(lat - best[0]) <= 1e-12 and used < best[2]):
            best = (lat, chosen, used)
    return best


def _memory(chosen: Sequence[Option]) -> int:
    res = sum(o.device_bytes for o in chosen if o.residency == "resident")
    per = max((o.device_bytes for o in chosen if o.residency == "per-stage"), default=0)
    return res + per


def _smallest_feasible(segs: list[list[tuple[int, Option]]]) -> tuple[int, list[Option]] | None:
    """The least device memory any cover of the blocks needs (latency ignored)."""
    n = len(segs)
    peaks = sorted({o.device_bytes for s in segs for _, o in s if o.residency == "per-stage"} | {0})
    best: tuple[int, list[Option]] | None = None
    for peak in peaks:
        empty: list[Option] = []
        dp: list[tuple[float, list[Option]]] = [(0.0, empty)] + [(math.inf, empty)] * n
        for i in range(n):
            if not math.isfinite(dp[i][0]):
                continue
            for ln, o in segs[i]:
                if i + ln > n or (o.residency == "per-stage" and o.device_bytes > peak):
                    continue
                w = o.device_bytes if o.residency == "resident" else 0
                if dp[i][0] + w < dp[i + ln][0]:
                    dp[i + ln] = (dp[i][0] + w, [*dp[i][1], o])
        if math.isfinite(dp[n][0]):
            total = int(dp[n][0]) + peak
            if best is None or total < best[0]:
                best = (total, dp[n][1])
    return best


def choose(
    candidates: Mapping[int, Sequence[Candidate]],
    model: CostModel,
    config: SelectionConfig = SelectionConfig(),
    *,
    notes: Sequence[str] = (),
    anatomy: Mapping[int, str] | None = None,
) -> Selection:
    """Choose a candidate and residency for every block among ``candidates``.

    ``candidates`` maps each block index to the candidates starting there
    (:func:`rkpart.cost_model.candidates.candidates_from`); ``notes`` (e.g. plugin strategies
    that were not considered) are passed on to the :class:`Selection`.

    Raises
    ------
    BudgetError
        No combination fits ``config.budget_mib``; the message names the smallest budget that
        would fit.
    UserError
        Every candidate of some block is excluded (toolkit crash, accuracy floor).
    """
    if config.steps < 1:
        raise UserError(f"steps must be >= 1, got {config.steps}")
    bad = [r for r in config.residencies if r not in RESIDENCIES]
    if bad or not config.residencies:
        raise UserError(f"residency must be among {', '.join(RESIDENCIES)}, got {bad or 'nothing'}")
    toolkit = config.toolkit or model.provenance.toolkit
    floor = model.accuracy.default_max_ratio
    max_ratio = config.max_error_ratio if config.max_error_ratio is not None else (
        math.inf if floor is None else floor)
    notes = list(notes)
    # the target's table first; rows a cost-model file carries beyond it are honoured too
    known = list(crash_patterns())
    known += [p for p in map(CrashPattern.from_json, model.known_issues or ()) if p not in known]
    bad = [p for p in config.precisions if p not in ("fp16", "int8")]
    if bad or not config.precisions:
        raise UserError(f"precisions must be among fp16, int8, got {bad or 'nothing'}")
    candidates = with_precisions(candidates, config.precisions)
    cands = mark_exclusions(candidates, toolkit=toolkit, known_issues=known,
                            compiled=[str(Path(c)) for c in config.compiled], anatomy=anatomy)
    options = {start: [evaluate(c, r, model, config, max_ratio) for c in lst for r in config.residencies]
               for start, lst in cands.items()}
    seen: set[str] = set()
    for lst in cands.values():
        for c in lst:
            far = outside_range(model, c.npu)
            msg = f"{c.id}: predictions extrapolate beyond the fitted range ({'; '.join(far)})" if far else ""
            if msg and msg not in seen:
                seen.add(msg)
                notes.append(msg)
    order = sorted(candidates)
    segs = _segments(options, order)
    for i in range(len(segs)):
        covered = any(i in range(j, j + ln) for j in range(len(segs)) for ln, _ in segs[j])
        if not covered:
            why = "; ".join(sorted({f"{o.candidate.id}: {o.excluded}" for o in options[order[i]]}))
            raise UserError(f"block {order[i]}: every candidate is excluded ({why})")
    term = memory_term(model)
    if config.budget_mib is not None and term is None:
        raise UserError(
            f"the cost model has no memory predictor (device_mem or pss_peak), so it cannot choose within the "
            f"{config.budget_mib:g} MiB budget ({config.budget_source}); refit it from per-stage residency "
            "profiles, which measure memory, or give --no-budget")
    baseline = 0 if term is None else math.ceil(term.baseline_bytes)
    budget = None if config.budget_mib is None else config.budget_mib * MIB - baseline
    best = None if budget is not None and budget < 0 else _solve(segs, budget)
    if best is None:
        smallest = _smallest_feasible(segs)
        if smallest is None:
            raise UserError("no combination of candidates covers every block")
        need, how = smallest
        what = ", ".join(sorted({f"{o.candidate.id}/{o.residency}" for o in how}))
        given = ("--budget-mib" if config.budget_source == "given"
                 else f"the default budget, {config.budget_source}, of")
        mem = "" if term is None else f" of {term.label}"
        raise BudgetError(
            f"no partition fits {given} {config.budget_mib:g} MiB{mem}: the smallest feasible budget is "
            f"{math.ceil((need + baseline) / MIB * 10) / 10:.1f} MiB ({what})"
        )
    lat, chosen, used = best
    err, err_source = _latency_error(model)
    chosen, ties = _break_ties(chosen, options, err, budget)
    used = _memory(chosen)
    lat = sum(o.latency for o in chosen)
    return Selection(config=config, options=options, chosen=chosen, device_bytes=used + baseline, latency=lat,
                     model_provenance={k: model.provenance.doc.get(k)
                                       for k in ("source", "device", "runtime", "toolkit")},
                     toolkit=toolkit, max_error_ratio=max_ratio, notes=notes, memory=term, latency_error=err,
                     latency_error_source=err_source, ties=ties,
                     degrees_of_freedom=model.provenance.degrees_of_freedom,
                     memory_source=describe_memory_source(model, toolkit, options),
                     cfg_parallel_speedup=cfg_parallel_speedup(model))


def describe_memory_source(model: CostModel, toolkit: str | None, options: Mapping[int, Sequence[Option]]) -> str:
    """Where the device-memory figures of a selection come from, in one line for ``--explain``."""
    srcs = {src for lst in options.values() for o in lst for src in o.device_source.split("+")}
    parts = []
    if "compiler" in srcs:
        parts.append("'compiler' = the compiler's own weight + internal memory of the compiled stages "
                     f"(rknn-toolkit2 {toolkit or 'of the build'} verbose build tables)")
    if "int8-prior" in srcs:
        parts.append(f"'int8-prior' = the fp16 figure of the same stages ('compiler' when compiled in fp16, else "
                     f"'predicted') under the {INT8_PRIOR}")
    if "predicted" in srcs:
        comp = model.memory_component(toolkit)
        if comp is not None and toolkit in model.device_memory:
            held = (comp.fit_error or {}).get("held_out") or {}
            err = (f", held-out: {held['within_10'] * 100:.0f} % of {held['n']} stages within +-10 %"
                   if held.get("within_10") is not None else "")
            margin = budget_margin(comp.fit_error)
            err += "" if not margin else f"; budgeted at +{margin * 100:.1f} %, its held-out error bound"
            parts.append(f"'predicted' = the device-memory model fitted on rknn-toolkit2 {toolkit} compiler tables "
                         f"({comp.samples} stages{err}), before compiling")
        elif comp is not None:
            parts.append(f"'predicted' = the cost model's device_mem component ({comp.source}, {comp.samples} "
                         "samples)")
        else:
            parts.append("'predicted' = no device-memory predictor")
    return "; ".join(parts) or "none"


def latency_error(model: CostModel) -> float | None:
    """Relative error of a predicted latency: the model's held-out whole-plan error when it has
    one (``provenance["whole_plan_error"]["median_ape"]``), else the largest held-out median
    error of its fitted time components, else (a calibration, which has no held-out data) the
    smallest difference its measurements resolve (``provenance["latency_resolution"]``);
    ``None`` when it carries none of these."""
    return _latency_error(model)[0]


def _latency_error(model: CostModel) -> tuple[float | None, str]:
    """:func:`latency_error` and what it is (for the explanation)."""
    whole = model.provenance.whole_plan_error
    if whole is not None and whole.median_ape is not None:
        return float(whole.median_ape) / 100.0, "held-out"
    errs = []
    for name in ("load", "init", "infer", "release", "host"):
        c = model.components.get(name)
        cv = (c.fit_error or {}).get("cross_validation") if c is not None else None
        if cv and cv.get("median_ape") is not None:
            errs.append(float(cv["median_ape"]) / 100.0)
    if errs:
        return max(errs), "held-out"
    res = model.provenance.latency_resolution
    if res is not None:
        return res, "the resolution of the calibration's measurements"
    return None, ""


#: most alternative covers of one chosen run compared for a tie (each block's fastest options first)
_MAX_COVERS = 4096


def _covers(ch: Option, options: Mapping[int, Sequence[Option]]) -> list[tuple[Option, ...]]:
    """Every way to cover exactly ``ch``'s blocks: options of the same blocks, and (for a run of
    fused blocks) one single-block option per block."""
    same: list[tuple[Option, ...]] = [(o,) for o in options[ch.candidate.start]
            if o.excluded is None and o.candidate.blocks == ch.candidate.blocks]
    if len(ch.candidate.blocks) == 1:
        return same
    per = [sorted((o for o in options.get(b, ()) if o.excluded is None and o.candidate.blocks == (b,)),
                  key=lambda o: o.latency) for b in ch.candidate.blocks]
    if not all(per):
        return same
    keep = max(len(p) for p in per)
    while keep > 1 and math.prod(min(keep, len(p)) for p in per) > _MAX_COVERS:
        keep -= 1
    return same + list(itertools.product(*(p[:keep] for p in per)))


def _break_ties(chosen: list[Option], options: Mapping[int, Sequence[Option]], err: float | None,
                budget: float | None) -> tuple[list[Option], dict[int, list[str]]]:
    """Within each chosen option's error band, prefer least memory, then least predicted error.

    The alternatives of a chosen option are the other covers of exactly its blocks: options of
    the same blocks and, for a run of fused blocks, one single-block option per block (so a run
    predicted within the error of its blocks' single options is a tie like any other).  A swap is
    made only when the pipeline still fits ``budget``; returns the new choice and, per block, the
    options that tie with it.
    """
    ties: dict[int, list[str]] = {}
    if not err:
        return chosen, ties
    out: list[Option] = []
    for i, ch in enumerate(chosen):
        rest = chosen[i + 1:]
        band = [c for c in _covers(ch, options) if abs(sum(o.latency for o in c) - ch.latency) <= err * ch.latency]

        def rank(c: tuple[Option, ...], before: list[Option] = out, after: list[Option] = rest
                 ) -> tuple[int, int, float, float]:
            ratio = max((o.error_ratio if o.error_ratio is not None else math.inf) for o in c)
            return (_memory([*before, *c, *after]), _memory(c), ratio, sum(o.latency for o in c))

        pick: tuple[Option, ...] = (ch,)
        for c in sorted(band, key=rank):
            if budget is None or _memory([*out, *c, *rest]) <= budget:
                pick = c
                break
        out += pick
        picked = {id(o) for o in pick}
        for c in band:
            for o in c:
                if id(o) not in picked:
                    start = o.candidate.start
                    if o.key not in ties.setdefault(start, []):
                        ties[start].append(o.key)
    return out, {k: v for k, v in ties.items() if v}


__all__ = [
    "MemoryTerm",
    "Option",
    "Selection",
    "SelectionConfig",
    "Trade",
    "choose",
    "delta_line",
    "deltas",
    "evaluate",
    "latency_error",
    "memory_term",
    "stage_memory",
]
