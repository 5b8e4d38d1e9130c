"""``rkpart tune``: measure, fit, choose, verify: the closed loop behind ``--strategy auto``.

1. **Partition** the model with every single-strategy candidate ``auto`` chooses from
   (:data:`SINGLE`: the families of :mod:`rkpart.grouping.strategies.families` with runs of up to two blocks).
2. **Profile** each plan on the backend, per-stage and resident, rounds interleaved across the
   plans (:func:`profile_for_fit`).  Blocks of one anatomy
   (:meth:`rkpart.discovery.structure.Block.signature`) are identical, so on models with more
   than :data:`WHOLE_PLAN_BLOCKS` blocks only one representative block per anatomy is run
   (``rkpart profile --block``).
3. **Fit** a cost model on those profiles (:func:`rkpart.cost_model.calibration.fit_profiles`:
   per-stage components, whole-round glue, held-out error per component and per whole plan;
   every call and every round in process CPU time, the median of the in-pipeline calls).
4. **Choose** with ``--strategy auto`` under the memory budget and write that plan.
5. **Verify**: run the chosen plan and every single-strategy plan (each residency), rounds
   interleaved, and report each one's measured round, predicted round and the chosen plan's
   regret against the measured best.  When the chosen plan is byte-identical to a
   single-strategy plan (:func:`identical_twin`), the two are one plan measured twice and the
   regret pools their rounds (:func:`pooled_regret`).

With ``--backend ort`` it runs anywhere; with ``rknnlite`` it is what a board user runs
(after ``rkpart compile``: the backends load the compiled ``.rknn`` artifacts).

7. **Precision** (``--precisions fp16,int8``, ``rknn-sim`` only): before choosing, every
   single-strategy plan also gets its int8 (w8a8) twin: calibrated from the plan's own
   denoising loop (``rkpart calibrate``'s defaults), built with ``--precision int8``, and the
   fp16 plans and the twins run through ``rkpart drift`` in the simulator
   (:func:`measure_precisions`).  The accuracy term it writes (``accuracy.json``: each family's
   final-latent error over the fp16 split plan's) and the twins' compiler tables go to
   ``auto --option precisions=fp16,int8``, which takes int8 for a block only where the measured
   drift is within ``--max-error-ratio``; an int8 choice is calibrated and built before it is
   verified in the simulator.

6. **CFG-parallel** (``--cfg-parallel``, ``rknnlite`` only): bundle auto's plan and time its
   whole denoising loop (:meth:`rkpart.runtime.board_runner.Runner.denoise`) both ways, the two
   CFG passes one after the other and at once on NPU cores 0 and 1, rounds interleaved
   (:func:`measure_cfg_parallel`).  The ratio of the medians replaces the documented prior
   (:data:`rkpart.cost_model.npu_time.CFG_PARALLEL_SPEEDUP`) in the fitted cost model
   (:class:`rkpart.cost_model.model.CfgParallel`), which ``auto --cfg-parallel`` and
   ``rkpart estimate`` then use.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rkpart.cost_model.calibration import FitReport, fit_profiles
from rkpart.cost_model.features import stage_features
from rkpart.cost_model.model import MAX_CFG_PARALLEL_SPEEDUP, MIN_CFG_PARALLEL_SPEEDUP, CfgParallel, CostModel
from rkpart.cost_model.rounds import predict_round, round_time
from rkpart.errors import GateError, UserError
from rkpart.grouping.strategies.families import Family, families
from rkpart.io import atomic_write_bytes
from rkpart.output import claim_work_folder
from rkpart.pipeline import PartitionConfig, load, partition
from rkpart.plan.plan import Plan, load_plan
from rkpart.readers import FileKind
from rkpart.roles import NO_FLAGS, RoleFlags
from rkpart.types import HOST, JsonMap, JsonObject

if TYPE_CHECKING:
    from rkpart.profile.records import ProfileRun, StageRecord

#: the two CFG-parallel latents may differ by this much relative to the largest value (the
#: bundle runner's default ``--max-abs-rel``)
CFG_PARALLEL_MAX_ABS_REL = 0.01
#: models with at most this many blocks are profiled whole; larger ones one block per anatomy
WHOLE_PLAN_BLOCKS = 4
#: every single-strategy plan ``auto`` chooses among (:mod:`rkpart.grouping.strategies.families`)
SINGLE: tuple[Family, ...] = families(max_run=2)


@dataclass(frozen=True)
class TuneConfig:
    backend: str = "ort"
    toolkit: str | None = None
    steps: int = 1
    cfg: bool = True
    budget_mib: float | str | None = None  # None: the target's default; "none": no budget
    rounds: int = 3
    verify_rounds: int = 5
    threads: int = 1
    statistic: str = "median"
    seed: int = 0
    #: time the bundle's denoising loop with and without ``--cfg-parallel`` (``rknnlite`` only)
    cfg_parallel: bool = False
    #: the precisions auto chooses among; with int8 every candidate's int8 twin is built and its
    #: drift measured in the simulator (``rknn-sim`` only)
    precisions: tuple[str, ...] = ("fp16",)
    #: auto's accuracy floor and int8 drift bound (``--option max_error_ratio``); None: auto's default
    max_error_ratio: float | None = None
    #: the pipeline description every plan records (``--pipeline``); None: ``pipeline.json`` beside the model
    pipeline: Path | None = None
    #: the inputs' roles for a model without a description (``--latent-input`` ...; :mod:`rkpart.roles`)
    flags: RoleFlags = NO_FLAGS
    #: the conditioning of the denoising loops (drift, calibration), by diffusers call argument (``--embeds``)
    embeds: Path | None = None

    def __post_init__(self) -> None:
        if self.embeds is not None and "int8" not in self.precisions:
            raise UserError("--embeds gives the conditioning of tune's denoising loops: the int8 calibrations and "
                            "drift of --precisions fp16,int8; without them tune runs no loop")
        if set(self.precisions) - {"fp16", "int8"} or "fp16" not in self.precisions:
            raise UserError(f"--precisions {','.join(self.precisions)}: give fp16 or fp16,int8")
        if "int8" in self.precisions and self.backend != "rknn-sim":
            raise UserError("--precisions int8 measures each candidate's int8 drift in the toolkit's simulator: it "
                            "needs --backend rknn-sim")
        if self.max_error_ratio is not None and not (math.isfinite(self.max_error_ratio)
                                                     and self.max_error_ratio >= 1.0):
            raise UserError(f"--max-error-ratio {self.max_error_ratio:g}: must be a number >= 1 (the fp16 split "
                            "plan's drift is 1)")
        if self.cfg_parallel and self.backend != "rknnlite":
            raise UserError("--cfg-parallel measures two NPU cores at once: it needs --backend rknnlite (a board)")
        if self.cfg_parallel and not self.cfg:
            raise UserError("--cfg-parallel runs a step's two CFG passes at once; it cannot go with --no-cfg")


@dataclass
class VerifyRow:
    plan: str
    residency: str
    measured_s: list[float] = field(default_factory=list)
    predicted_s: float | None = None
    records: list[StageRecord] = field(default_factory=list)  # measured stage records

    @property
    def median_s(self) -> float:
        return float(statistics.median(self.measured_s))

    def to_json(self) -> JsonObject:
        err = None if self.predicted_s is None else (self.predicted_s - self.median_s) / self.median_s * 100.0
        return {"plan": self.plan, "residency": self.residency, "measured_s": round(self.median_s, 6),
                "predicted_s": None if self.predicted_s is None else round(self.predicted_s, 6),
                "prediction_error_pct": None if err is None else round(err, 2)}


def identical_twin(choices: Sequence[JsonMap], folders: Mapping[str, Path]) -> tuple[str, str] | None:
    """The single-strategy plan and residency that ``auto``'s plan (``folders["auto"]``) *is*, or ``None``.

    Identical: one (candidate, residency) for every block, and the same stages in the same order
    on the same devices with byte-identical files (the sha256 both plan.json files record).  Such
    a pair is one plan measured twice; what separates their measured rounds is noise."""
    pairs = {(str(c["candidate"]), str(c["residency"])) for c in choices}
    if len(pairs) != 1 or "auto" not in folders:
        return None
    cand, res = pairs.pop()
    if cand not in folders:
        return None

    def stages(folder: Path) -> list[tuple[str, str, str]]:
        plan, _ = load_plan(folder)
        return [(s.id, s.device, s.sha256) for s in plan.stages]

    return (cand, res) if stages(folders["auto"]) == stages(folders[cand]) else None


def pooled_regret(rows: Sequence[VerifyRow], twin: tuple[str, str] | None) -> tuple[float, str]:
    """Regret of ``auto``'s plan with identical plans counted as one: its measured rounds and its
    twin's (:func:`identical_twin`) pooled into one median, against the best of the other plans;
    and the name of the measured best (``auto/plan`` when it is auto's own plan)."""
    auto = next(r for r in rows if r.plan == "auto")
    twin_row = None if twin is None else next((r for r in rows if (r.plan, r.residency) == twin), None)
    pooled = float(statistics.median(auto.measured_s + (twin_row.measured_s if twin_row is not None else [])))
    others = [r for r in rows if r is not auto and r is not twin_row]
    if not others:
        return 0.0, "auto/plan"
    best = min(others, key=lambda r: r.median_s)
    if pooled <= best.median_s:
        return 0.0, "auto/plan" + ("" if twin is None else f" (= {twin[0]}/{twin[1]})")
    return pooled / best.median_s - 1.0, f"{best.plan}/{best.residency}"


@dataclass
class TuneResult:
    model_file: Path
    auto_plan: Path
    choices: list[JsonObject]
    fit_report: FitReport
    rows: list[VerifyRow]
    #: the single-strategy plan and residency auto's plan is byte-identical to, if any
    twin: tuple[str, str] | None = None
    #: the CFG-parallel speed-up measured on the board (``--cfg-parallel``), recorded in the model
    cfg_parallel: CfgParallel | None = None
    #: the accuracy term measured with ``--precisions fp16,int8`` (:func:`measure_precisions`)
    accuracy: Path | None = None
    #: accuracy family -> its measured drift (ratio, final cosine) from that term
    drift: dict[str, JsonObject] = field(default_factory=dict)

    @property
    def best(self) -> VerifyRow:
        return min(self.rows, key=lambda r: r.median_s)

    @property
    def chosen(self) -> VerifyRow:
        return next(r for r in self.rows if r.plan == "auto")

    @property
    def regret(self) -> float:
        """Auto's regret with an identical twin plan pooled into one plan (:func:`pooled_regret`)."""
        return pooled_regret(self.rows, self.twin)[0]

    @property
    def regret_unpooled(self) -> float:
        """Auto's measured round against the measured best, its identical twin counted as another plan."""
        return (self.chosen.median_s - self.best.median_s) / self.best.median_s

    def to_json(self) -> JsonObject:
        return {"cost_model": str(self.model_file), "auto_plan": str(self.auto_plan), "choices": self.choices,
                "whole_plan_error": self.fit_report.whole_plan.to_json(), "verify": [r.to_json() for r in self.rows],
                "identical_to": None if self.twin is None else "/".join(self.twin),
                "best": pooled_regret(self.rows, self.twin)[1], "regret_pct": round(self.regret * 100.0, 2),
                "regret_unpooled_pct": round(self.regret_unpooled * 100.0, 2),
                **({"cfg_parallel": self.cfg_parallel.to_json()} if self.cfg_parallel is not None else {}),
                **({"accuracy": str(self.accuracy), "drift": self.drift} if self.accuracy is not None else {})}

    def render(self) -> str:
        lines = [f"cost model: {self.model_file}", f"auto plan: {self.auto_plan}",
                 "choices: " + "; ".join(f"blocks {','.join(map(str, c['blocks']))}: {c['candidate']} "
                                         f"({c['residency']})" for c in self.choices)]
        if self.accuracy is not None:
            lines.append(f"measured drift ({self.accuracy}; final latent MSE over the fp16 split plan's): "
                         + "; ".join(f"{f}: {d['ratio']:g}x (cosine {d['final_cosine']:.6f})"
                                     for f, d in sorted(self.drift.items())))
        w = self.fit_report.whole_plan.error
        if w.n and w.median_ape is not None and w.within_10 is not None:
            lines.append(f"fit: whole-plan held-out error: median {w.median_ape:.1f} %, "
                         f"{w.within_10 * 100:.0f} % within +-10 % ({w.n} plans)")
        lines.append(f"  {'plan':<18} {'residency':<9} {'measured s':>11} {'predicted s':>12} {'error':>8}")
        for r in sorted(self.rows, key=lambda r: r.median_s):
            j = r.to_json()
            err = "-" if j["prediction_error_pct"] is None else f"{j['prediction_error_pct']:+.1f} %"
            pred = "-" if r.predicted_s is None else f"{r.predicted_s:.4f}"
            mark = "*" if r.plan == "auto" else " "
            lines.append(f"{mark} {r.plan:<18} {r.residency:<9} {r.median_s:>11.4f} {pred:>12} {err:>8}")
        best = pooled_regret(self.rows, self.twin)[1]
        if self.twin is not None:
            lines.append(f"auto's plan is byte-identical to {self.twin[0]} ({self.twin[1]}): one plan, its rounds "
                         f"pooled (apart: {self.regret_unpooled * 100:+.2f} %)")
        lines.append(f"regret of auto's choice vs the measured best ({best}): {self.regret * 100:+.2f} %")
        if self.cfg_parallel is not None:
            lines.append(f"cfg-parallel speed-up: {self.cfg_parallel.speedup:.3f}x ({self.cfg_parallel.source}); "
                         f"recorded in {self.model_file}")
        return "\n".join(lines) + "\n"


def _profile(plan_dir: Path, out: Path, cfg: TuneConfig, *, residency: str, rounds: int, warmup: int,
             block: int | None, memory: bool) -> ProfileRun:
    """Profile one plan; ``memory``: sample process (and device) memory, else time only."""
    from rkpart.profile.run import ProfileOptions, run_profile

    dev = ProfileOptions.device_pattern if cfg.backend == "rknnlite" else None
    opts = ProfileOptions(plan=str(plan_dir), backend=cfg.backend, output=out, toolkit=cfg.toolkit, rounds=rounds,
                          warmup=warmup, cfg=cfg.cfg, steps=cfg.steps, residency=residency,
                          device_pattern=dev if memory else None, sample_interval=0.05 if memory else 0.0,
                          seed=cfg.seed, threads=cfg.threads, block=block, snapshots=memory)
    return run_profile(opts)


def _round_seconds(run: ProfileRun) -> list[float]:
    out = []
    for r in run.rounds:
        if not r.warmup:
            t = round_time(r.to_json())
            if t is not None:
                out.append(t)
    return out


def predicted_round(model: CostModel, plan: Plan, folder: Path, residency: str, passes: int) -> float | None:
    """The model's prediction of one measured round of ``plan`` under ``residency``
    (``"plan"``: each block as the plan chose; host stages are set up once per round)."""
    chosen = {}
    for c in (plan.strategy.get("options") or {}).get("choices", []):
        for b in c["blocks"]:
            chosen[b] = c["residency"]
    stages = []
    for s in plan.stages:
        res = "resident" if s.device == HOST else residency
        if residency == "plan":
            res = "resident" if s.device == HOST else chosen.get(s.block if s.block is not None else -1, "per-stage")
        stages.append((stage_features(folder, s), res))
    return predict_round(model, stages, passes)


def single_plans(model_path: str | Path, work: Path,
                 pipeline: Path | None = None) -> tuple[dict[str, Path], int, list[int] | None]:
    """Every single-strategy plan of ``model_path`` under ``work/plans`` (each recording the
    pipeline description ``pipeline``, default the one beside the model); the number of blocks and
    the representative block of each anatomy (``None``: small enough to profile whole plans)."""
    disc = load(model_path).discovery()
    blocks = list(disc.blocks)
    anatomies: dict[tuple[str, ...], list[int]] = {}
    for b in blocks:
        anatomies.setdefault(tuple(b.signature), []).append(b.index)
    reps = None if len(blocks) <= WHOLE_PLAN_BLOCKS else [ids[0] for ids in anatomies.values()]
    plans: dict[str, Path] = {}
    for fam in SINGLE:
        if fam.blocks_per_stage > len(blocks):
            continue
        out = work / "plans" / fam.id
        partition(model_path, out, fam.strategy, force=True, config=PartitionConfig(pipeline=pipeline), **fam.options)
        plans[fam.id] = out
    return plans, len(blocks), reps


def profile_for_fit(plans: Mapping[str, Path], nblocks: int, reps: Sequence[int] | None, work: Path,
                    config: TuneConfig, progress: Callable[[str], None] = lambda _: None, *,
                    only_round: int | None = None) -> list[Path]:
    """Profile every plan per-stage and resident (time only), rounds interleaved across plans,
    and once per-stage with memory sampled.

    Round ``i`` of every plan and residency runs before round ``i + 1`` of any (one file per
    round; ``rkpart fit`` pools them), so a busy spell of the machine is spread over all plans
    instead of shifting one plan's every sample.  ``only_round=i``: just round ``i`` (and the
    memory round with ``i == 0``), for a caller interleaving several models.
    """
    profiles: list[Path] = []
    which: list[int | None] = list(reps) if reps else [None]

    def one(name: str, folder: Path, residency: str, block: int | None, *, memory: bool, i: int) -> None:
        tag = f"{name}.{residency}{'' if block is None else f'.b{block}'}"
        f = work / "profiles" / (f"{tag}.memory.jsonl" if memory else f"{tag}.r{i}.jsonl")
        progress(f"profiling {name} ({residency}{'' if block is None else f', block {block}'}"
                 f"{', memory' if memory else f', round {i + 1}/{config.rounds}'})")
        # a run's representative block starts the run; a run cannot start in the last blocks
        span = next((f.blocks_per_stage for f in SINGLE if f.id == name), 1)
        at = block if block is None or block + span <= nblocks else nblocks - span
        # one warm-up round before a plan's first measured round only: later rounds run warm
        _profile(folder, f, config, residency=residency, rounds=1, warmup=0 if memory or i else 1, block=at,
                 memory=memory)
        profiles.append(f)

    # time per residency without memory sampling (the sampler costs CPU a pipeline does not pay)
    for i in range(config.rounds) if only_round is None else [only_round]:
        for name, folder in plans.items():
            for residency in ("per-stage", "resident"):
                for block in which:
                    one(name, folder, residency, block, memory=False, i=i)
    # memory from one per-stage round with it
    if not only_round:
        for name, folder in plans.items():
            for block in which:
                one(name, folder, "per-stage", block, memory=True, i=0)
    return profiles


def choose_and_verify(model_path: str | Path, work: Path, model_file: Path, plans: Mapping[str, Path],
                      config: TuneConfig, progress: Callable[[str], None] = lambda _: None
                      ) -> tuple[Path, list[JsonObject], list[VerifyRow]]:
    """Write ``auto``'s plan with the model in ``model_file``, then run it and every plan of
    ``plans`` under each residency, rounds interleaved; rows carry measured and predicted rounds."""
    auto_dir, choices, rows, folders = choose_auto(model_path, work, model_file, plans, config, progress)
    for i in range(config.verify_rounds):
        verify_round(rows, folders, work, config, i, progress)
    return auto_dir, choices, rows


def choose_auto(model_path: str | Path, work: Path, model_file: Path, plans: Mapping[str, Path],
                config: TuneConfig, progress: Callable[[str], None] = lambda _: None
                ) -> tuple[Path, list[JsonObject], list[VerifyRow], dict[str, Path]]:
    """``auto``'s plan under ``work/plans/auto``, its choices, one row per plan to verify (auto's
    plan, every plan of ``plans`` under each residency) with its predicted round, and the folders."""
    model = CostModel.load(model_file)
    auto_dir = work / "plans" / "auto"
    progress("choosing with the fitted model")
    opts: JsonObject = {"cost_model": str(model_file), "steps": config.steps, "cfg": config.cfg}
    if config.backend != "ort" and config.toolkit is not None:
        # on the toolkit's backends, device memory and NPU time come from the compiler's tables: the
        # profiled plans' builds, and one build per anatomy of every candidate (from the build cache)
        opts.update(toolkit=config.toolkit, compile=True, compiled=[str(p) for p in plans.values()], progress=progress)
    if config.budget_mib is not None:
        opts["budget_mib"] = config.budget_mib
    if "int8" in config.precisions:
        # the int8 twins' builds give their compiler tables; the measured drift bounds the choice
        opts.update(precisions=",".join(config.precisions), accuracy=str(work / ACCURACY_FILE))
        if "compiled" in opts:
            opts["compiled"] += [str(p) for p in sorted((work / "precision").glob("*@int8"))]
    if config.max_error_ratio is not None:
        opts["max_error_ratio"] = config.max_error_ratio
    auto_plan = partition(model_path, auto_dir, "auto", force=True, config=PartitionConfig(pipeline=config.pipeline),
                          **opts)
    if _int8_stages(auto_plan):
        _build_quantized(auto_dir, work / "precision" / "auto.calib", config, progress)
    choices = list((auto_plan.strategy.get("options") or {}).get("choices", []))
    passes = config.steps * (2 if config.cfg else 1)
    rows = [VerifyRow("auto", "plan")] + [VerifyRow(n, r) for n in plans for r in ("per-stage", "resident")]
    folders = {**plans, "auto": auto_dir}
    for row in rows:
        plan, folder = load_plan(folders[row.plan])
        row.predicted_s = predicted_round(model, plan, folder, row.residency, passes)
    return auto_dir, choices, rows, folders


def verify_round(rows: Sequence[VerifyRow], folders: Mapping[str, Path], work: Path, config: TuneConfig, i: int,
                 progress: Callable[[str], None] = lambda _: None) -> None:
    """Round ``i`` of every row (a caller may interleave several models' rounds): one warm-up and
    one measured round each, process CPU time, appended to the rows."""
    # the order rotates: no plan always runs first (after another model's plans) or last
    k = i % len(rows)
    for row in [*rows[k:], *rows[:k]]:
        progress(f"verify round {i + 1}/{config.verify_rounds}: {row.plan} ({row.residency})")
        run = _profile(folders[row.plan], work / "verify" / f"{row.plan}.{row.residency}.{i}.jsonl", config,
                       residency=row.residency, rounds=1, warmup=1, block=None, memory=False)
        row.measured_s += _round_seconds(run)
        row.records += run.stage_records(warmup=False)


def measure_cfg_parallel(bundle: str | Path, *, steps: int, rounds: int, seed: int = 0, rknnlite_api: object = None,
                         progress: Callable[[str], None] = lambda _: None) -> CfgParallel:
    """Time the whole denoising loop of ``bundle`` with the two CFG passes one after the other and
    at once on two NPU cores (:class:`~rkpart.runtime.board_runner.Runner`, ``cfg_parallel``),
    ``rounds`` times each, the order alternating; the speed-up is the ratio of the medians.

    A round is ``denoise(steps)`` and the release of what it kept: what a board user waits for.
    ``rknnlite_api``: the ``RKNNLite`` class (default: rknn-toolkit-lite2's, on the board).  Both
    ways must give the same latent (max abs difference within :data:`CFG_PARALLEL_MAX_ABS_REL`
    of the largest value, the runner's default gate; exactly equal on the stand-ins) and a speed-up in
    [:data:`~rkpart.cost_model.model.MIN_CFG_PARALLEL_SPEEDUP`,
    :data:`~rkpart.cost_model.model.MAX_CFG_PARALLEL_SPEEDUP`] (what a cost model may hold), else
    :class:`~rkpart.errors.GateError` (exit 8) and nothing is recorded; a runner failure is a
    :class:`~rkpart.errors.UserError`.
    """
    import time

    import numpy as np

    from rkpart.runtime.board_runner import BundleError, Runner

    times: dict[bool, list[float]] = {False: [], True: []}
    latents: dict[bool, Any] = {}
    for i in range(rounds):
        for par in (False, True) if i % 2 == 0 else (True, False):
            progress(f"cfg-parallel round {i + 1}/{rounds}: {'both passes at once' if par else 'one after the other'}")
            try:
                with Runner(bundle, rknnlite_api=rknnlite_api, cfg_parallel=par) as r:
                    t0 = time.perf_counter()
                    x = r.denoise(steps, seed=seed)
                    r.close()
                    times[par].append(time.perf_counter() - t0)
            except BundleError as e:
                raise UserError(f"cfg-parallel measurement on {bundle}: {e}") from None
            latents.setdefault(par, x)
    seq_x, par_x = (latents[k].astype(np.float64) for k in (False, True))
    diff = float(np.max(np.abs(par_x - seq_x)))
    scale = float(np.max(np.abs(seq_x)))
    # not bit for bit on the NPU: a sequential 0_1_2 stage splits its convolutions over the
    # cores, each parallel context runs on one; beyond the runner's default gate it is wrong
    if not (math.isfinite(diff) and math.isfinite(scale)) or diff > CFG_PARALLEL_MAX_ABS_REL * scale:
        raise GateError(f"cfg-parallel measurement on {bundle}: the two cores' latent differs from the sequential "
                        f"one (max abs {diff:g}, {CFG_PARALLEL_MAX_ABS_REL:g} x max |latent| {scale:g} allowed); "
                        "the speed-up of a wrong result is not recorded")
    seq, par_ = statistics.median(times[False]), statistics.median(times[True])
    speedup = seq / par_
    if not MIN_CFG_PARALLEL_SPEEDUP <= speedup <= MAX_CFG_PARALLEL_SPEEDUP:
        raise GateError(f"cfg-parallel measurement on {bundle}: speed-up {speedup:g} is outside "
                        f"[{MIN_CFG_PARALLEL_SPEEDUP:g}, {MAX_CFG_PARALLEL_SPEEDUP:g}]; not recorded")
    return CfgParallel(
        speedup=round(speedup, 4),
        source=(f"measured: `rkpart tune --backend rknnlite --cfg-parallel`, {rounds} interleaved rounds of a "
                f"{steps}-step loop each way, median {seq:.4g} s one pass after the other / {par_:.4g} s both at "
                "once on NPU cores 0 and 1"),
        measured={"sequential_s": [round(t, 6) for t in times[False]], "parallel_s": [round(t, 6) for t in times[True]],
                  "steps": steps, "rounds": rounds, "max_abs_diff": diff})


def record_cfg_parallel(model_file: str | Path, measured: CfgParallel) -> CostModel:
    """Put ``measured`` into the cost model at ``model_file`` (in place of the prior) and save it."""
    model = CostModel.load(model_file)
    model.cfg_parallel = measured
    model.save(model_file)
    return model


def _cfg_parallel(work: Path, auto_dir: Path, model_file: Path, config: TuneConfig,
                  progress: Callable[[str], None]) -> CfgParallel:
    from rkpart.bundle.build import BundleOptions, bundle_plan

    bundle = work / "bundle"
    progress(f"bundling auto's plan into {bundle} to time the denoising loop with and without --cfg-parallel")
    f = config.flags
    bundle_plan(auto_dir, bundle, BundleOptions(force=True, seed=config.seed, latent_input=f.latent,
                                                timestep_input=f.timestep, guidance_input=f.guidance,
                                                context_inputs=f.context), progress=progress)
    measured = measure_cfg_parallel(bundle, steps=max(config.steps, 2), rounds=config.verify_rounds,
                                    seed=config.seed, progress=progress)
    record_cfg_parallel(model_file, measured)
    return measured


#: the accuracy term ``--precisions fp16,int8`` measures, in the work folder
ACCURACY_FILE = "accuracy.json"


def _toolkit(config: TuneConfig) -> str:
    """The toolkit the int8 twins are built with: ``--toolkit``, else the target's default."""
    from rkpart.targets import get_target

    return config.toolkit or get_target().default_toolkit


def _int8_stages(plan: Plan) -> bool:
    """Whether ``auto``'s precision spec recorded in ``plan`` builds any stage int8."""
    from rkpart.compile.precision import plan_precision_spec

    spec = plan_precision_spec(plan)
    return spec is not None and "int8" in spec.stages.values()


def _build_quantized(folder: Path, calib: Path, config: TuneConfig, progress: Callable[[str], None]) -> None:
    """Calibrate the plan in ``folder`` from its own denoising loop into ``calib`` (``rkpart
    calibrate``'s defaults) and build it with that calibration: int8 where the plan's precision
    (``auto``'s spec) or ``int8`` as the default of a twin says so."""
    from rkpart.compile.compile import CompileOptions, compile_folder
    from rkpart.compile.precision import plan_precision_spec
    from rkpart.errors import ToolkitError
    from rkpart.profile.calibrate import CalibrationOptions, write_calibration

    plan, _ = load_plan(folder)
    progress(f"calibrating {folder.name} from its denoising loop")
    write_calibration(plan, folder, calib, CalibrationOptions(flags=config.flags, embeds=config.embeds), force=True,
                      progress=progress)
    # auto's plan: its recorded spec says which stages are int8 (compile reads it); a twin: all of them
    spec = plan_precision_spec(plan)
    opts = CompileOptions(toolkit=_toolkit(config), precision="int8" if spec is None else "fp16",
                          calibration=str(calib))
    report = compile_folder(folder, opts, progress)
    if report.failed:
        raise ToolkitError(f"tune: {len(report.failed)} NPU stage(s) of {folder.name} failed to build quantized "
                           f"(first: {report.failed[0].stage_id}); `rkpart compile {folder} --precision int8 "
                           f"--calibration {calib}` shows why")


def measure_precisions(model_path: str | Path, plans: Mapping[str, Path], work: Path, config: TuneConfig,
                       progress: Callable[[str], None] = lambda _: None) -> tuple[Path, dict[str, JsonObject]]:
    """The int8 twin of every split / fused plan of ``plans`` (by :data:`SINGLE` id): the same
    partition of ``model_path`` written again to ``work/precision/<id>@int8`` (through
    :func:`~rkpart.pipeline.partition`, like every plan tune writes), calibrated and built int8;
    then ``rkpart drift`` of the plans and the twins in the simulator.  Writes the accuracy term
    to ``work/accuracy.json`` and returns it with each family's ratio and cosine.

    A drift row with NaN/Inf is refused (:class:`~rkpart.errors.GateError`): a NaN run never
    enters the cost model as a measured accuracy."""
    from rkpart.cost_model.drift_accuracy import accuracy_from_drift, family_of
    from rkpart.profile.drift import drift
    from rkpart.runtime import get_backend

    single = {f.id: f for f in SINGLE}
    loaded: list[tuple[str, Plan, Path]] = []
    families: dict[str, str] = {}
    for name, folder in plans.items():
        fam = single[name]
        if fam.strategy not in ("split", "fused"):  # the accuracy families drift measures
            continue
        twin = work / "precision" / f"{name}@int8"
        partition(model_path, twin, fam.strategy, force=True, config=PartitionConfig(pipeline=config.pipeline),
                  **fam.options)
        _build_quantized(twin, work / "precision" / f"{name}.calib", config, progress)
        for label, f in ((f"{name}:{folder.name}", folder), (f"{name}[int8]:{twin.name}", twin)):
            plan, _ = load_plan(f)
            loaded.append((label, plan, f))
            families[label] = family_of(plan)
    backend = get_backend("rknn-sim", toolkit=_toolkit(config))
    rows = drift(loaded, backend, steps=config.steps, cfg=config.cfg, seed=config.seed, progress=progress,
                 flags=config.flags, embeds=config.embeds)
    acc = accuracy_from_drift(rows, families)
    out = work / ACCURACY_FILE
    atomic_write_bytes(out, (json.dumps(acc, indent=2, sort_keys=True) + "\n").encode())
    measured = {f: {"ratio": v["ratio"], "final_cosine": v["final_cosine"]} for f, v in acc["families"].items()}
    return out, measured


#: the folders of a tune work folder, one file per plan, profile, verify round (and the bundle, the
#: int8 twins and their calibrations)
TUNE_GROWS = ("plans", "profiles", "verify", "bundle", "precision")
_TUNE_FILES = ("cost_model.json", "fit_report.json", "tune_report.json", ACCURACY_FILE)


#: a tune folder's ``tune_report.json`` (how ``tune -o`` knows a folder an older rkpart wrote)
TUNE_REPORT_KIND = FileKind("tune report", "json", 64 << 20, UserError, symlinks=False,
                            doc="a tune folder's `tune_report.json`, read by `tune -o` on an existing folder")


def tune_listing(folder: Path) -> set[str] | str:
    """What a tune work folder written before rkpart's output marker holds
    (:data:`~rkpart.output.Listing`): a tune report rkpart wrote and its model and fit report
    (the folders of :data:`TUNE_GROWS` aside)."""
    try:
        rep = TUNE_REPORT_KIND.load(folder / "tune_report.json", root=folder)
    except UserError as e:
        return f"it has no readable tune report ({e})"
    if not isinstance(rep, dict) or not {"cost_model", "auto_plan", "verify"} <= set(rep):
        return "its tune_report.json is not one rkpart tune wrote"
    return set(_TUNE_FILES)


def tune(model_path: str | Path, workdir: str | Path, config: TuneConfig = TuneConfig(),
         progress: Callable[[str], None] = lambda _: None) -> TuneResult:
    """Run the loop on ``model_path`` in ``workdir`` (plans, profiles, model, auto plan, report)."""
    # rkpart.output: never a symlink or someone else's folder
    work = claim_work_folder(workdir, kind="tune", legacy=tune_listing, grows=TUNE_GROWS, known=_TUNE_FILES)
    plans, nblocks, reps = single_plans(model_path, work, config.pipeline)
    if "int8" in config.precisions or config.cfg_parallel:
        # before minutes of profiling: the loops run later (calibration, drift, the bundle's) must be able to tell
        # the inputs' roles and take --embeds
        from rkpart.profile.drift import check_roles

        first = next(iter(plans.values()))
        check_roles([("", *load_plan(first))], config.flags, config.embeds, config.cfg)
    progress(f"{nblocks} blocks; profiling " + ("whole plans" if reps is None else
                                                 f"blocks {', '.join(map(str, reps))} (one per anatomy)"))
    profiles = profile_for_fit(plans, nblocks, reps, work, config, progress)
    model, report = fit_profiles(profiles, statistic=config.statistic, clock="cpu")
    model_file = work / "cost_model.json"
    model.save(model_file)
    atomic_write_bytes(work / "fit_report.json", (json.dumps(report.to_json(), indent=2) + "\n").encode())
    accuracy, measured = (measure_precisions(model_path, plans, work, config, progress) if "int8" in config.precisions
                          else (None, {}))
    auto_dir, choices, rows = choose_and_verify(model_path, work, model_file, plans, config, progress)
    twin = identical_twin(choices, {**plans, "auto": auto_dir})
    cp = _cfg_parallel(work, auto_dir, model_file, config, progress) if config.cfg_parallel else None
    result = TuneResult(model_file=model_file, auto_plan=auto_dir, choices=choices, fit_report=report, rows=rows,
                        twin=twin, cfg_parallel=cp, accuracy=accuracy, drift=measured)
    atomic_write_bytes(work / "tune_report.json", (json.dumps(result.to_json(), indent=2) + "\n").encode())
    return result


__all__ = ["ACCURACY_FILE", "SINGLE", "WHOLE_PLAN_BLOCKS", "TuneConfig", "TuneResult", "VerifyRow",
           "choose_and_verify", "identical_twin", "measure_cfg_parallel", "measure_precisions", "pooled_regret",
           "predicted_round", "profile_for_fit",
           "record_cfg_parallel", "single_plans", "tune"]
