"""Compile every NPU stage of a plan into an ``.rknn`` file.

Recipe: resolve the toolkit(s) -> lock the plan folder -> key every NPU stage by content ->
take what the caches have -> build the rest in isolated, memory-scheduled subprocesses ->
retry failures with the fallback toolkit -> write a new plan with artifacts and failures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rkpart.compile.cache import ArtifactCache, build_key, config_hash, measured_stage_bytes, normalise_config
from rkpart.compile.compiler_plan import artifact_compiler_plan, compiler_meta
from rkpart.compile.hang import HANG_FACTOR, HANG_FLOOR_S, HangStop, Peer, PeerWatch, hang_rules
from rkpart.compile.placement import CONSTANT_OUTPUTS, missing_outputs
from rkpart.compile.placement import cpu_ops as parse_cpu_ops
from rkpart.compile.precision import (
    PrecisionSpec,
    StagePrecision,
    link_dataset,
    load_precision_spec,
    plan_precision_spec,
    resolve,
)
from rkpart.compile.preflight import check_config, check_target
from rkpart.compile.prepare import PreparedRecord, prepare_identity, prepare_stage
from rkpart.compile.runner import WORKER, BuildJob, BuildResult, one_line, read_log
from rkpart.compile.scheduler import (
    DEFAULT_MARGIN,
    MEMORY_FILE,
    MemoryModel,
    Scheduler,
    available_memory,
    memory_in_use,
)
from rkpart.compile.toolkits import Toolkit, find_toolkit
from rkpart.compile.user_cache import touch, user_cache_dir
from rkpart.compile.weigh import (
    WEIGH_MIN_BYTES,
    WEIGHED_OUT,
    Figures,
    Verdict,
    VerdictStore,
    judge,
    load_graph,
    verdict_key,
)
from rkpart.errors import ToolkitError, UserError, os_error
from rkpart.grouping.learned import CpuLayer, NpuOp, contradict, learn, load_learned, npu_ops, trace_cpu_layers
from rkpart.io import default_cache_dir, file_sha256, folder_lock
from rkpart.ir.anatomy import model_anatomy
from rkpart.plan.plan import Artifact, Plan, Stage, load_plan
from rkpart.plan.verify import stage_onnx
from rkpart.progress import Progress, advance
from rkpart.targets import rewrites as rewrite_table
from rkpart.types import BuildFailure, JsonMap, JsonObject, PlanExtra
from rkpart.units import human_bytes

if TYPE_CHECKING:
    from rkpart.compile.calibration import Calibration

RKNN_DIR = "rknn"
#: the rows a verdict may name (rkpart.compile.weigh)
WEIGHABLE = tuple(r.name for r in rewrite_table.REWRITES if r.weighed)
LOG_DIR = "logs"
#: a stage whose build fails with up to this many NPU rewrites is rebuilt dropping one at a time
BISECT_MAX = 4
#: how many times a stage is rebuilt with the optimiser rules its failed build named turned off
RULE_RETRIES = 4
#: how many times a stage whose build did not return is rebuilt with the rule its log stopped after turned off
#: (each such build may take the stage's whole budget or --timeout again)
HANG_RULE_RETRIES = 1
#: rknn-toolkit2's hint after an optimiser rule failed: "You can add disable_rules=['fuse_x'] in rknn.config()"
_RULE_HINT = re.compile(r"disable_rules=\[([^\]]*)\]")


def named_rules(log_text: str) -> tuple[str, ...]:
    """The optimiser rules a failed build's log suggests turning off (``disable_rules=[...]`` hints),
    in the order named."""
    out: list[str] = []
    for m in _RULE_HINT.finditer(log_text):
        for name in re.findall(r"['\"]([A-Za-z0-9_]+)['\"]", m.group(1)):
            if name not in out:
                out.append(name)
    return tuple(out)


def _hang_rules(text: str, failure: BuildFailure) -> tuple[str, ...]:
    """The rules a build that did not return is rebuilt without: those of the known issue its log matches
    (:attr:`~rkpart.targets.known_issues.KnownIssue.fusion_rules`), else the last rule it shows rewriting
    the graph (:func:`rkpart.compile.hang.hang_rules`)."""
    from rkpart.targets.known_issues import match_log

    issue = match_log(text, signal=failure.signal, toolkit=failure.toolkit, kind=failure.kind,
                      exit_code=failure.exit_code)
    return hang_rules(text, issue.fusion_rules if issue is not None else ())


@dataclass(frozen=True)
class _StrictFailure(BuildFailure):
    """A stage that built but kept CPU layers, failed by ``--strict-npu`` (its layers kept)."""

    cpu_ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class StageOutcome:
    """What compile did with one NPU stage."""

    stage_id: str
    status: str  # "built", "cached", "failed"
    toolkit: str
    artifact: Artifact | None
    failures: tuple[BuildFailure, ...] = ()
    wall_s: float = 0.0
    peak_rss_bytes: int = 0
    log: str | None = None
    blocks: tuple[int, ...] = ()  # blocks the stage covers (for the per-block report)
    #: NPU rewrites left out of the built stage -> why (failed the ORT check, or the build failed with it)
    dropped_rewrites: Mapping[str, str] = field(default_factory=dict)
    cpu_s: float = 0.0  # CPU seconds of the build's process tree (0: not built here, or not measured)
    #: the verdict on the rewrites weighed for memory (rkpart.compile.weigh), when one matched the stage
    weighed: Verdict | None = None

    @property
    def cpu_ops(self) -> tuple[str, ...]:
        """Layers the toolkit placed on the CPU (kept in the failure when --strict-npu failed it)."""
        if self.artifact is not None:
            return self.artifact.cpu_ops
        return next((f.cpu_ops for f in self.failures if isinstance(f, _StrictFailure)), ())

    def to_json(self) -> JsonObject:
        return {
            "stage": self.stage_id,
            "status": self.status,
            "toolkit": self.toolkit,
            "artifact": self.artifact.to_json() if self.artifact else None,
            "failures": [f.to_json() for f in self.failures],
            "wall_s": round(self.wall_s, 2),
            "cpu_s": round(self.cpu_s, 2),
            "peak_rss_bytes": self.peak_rss_bytes,
            "log": self.log,
            "dropped_rewrites": dict(self.dropped_rewrites),
            "weighed": None if self.weighed is None else self.weighed.to_json(),
        }


@dataclass(frozen=True)
class CompileReport:
    """The new plan plus per-stage outcomes (for the CLI summary and ``--json``)."""

    plan: Plan
    outcomes: tuple[StageOutcome, ...]
    wall_s: float
    settings: JsonObject = field(default_factory=dict)
    #: builds stopped as hangs, far past their peers (:mod:`rkpart.compile.hang`), oldest first
    hangs: tuple[HangStop, ...] = ()

    @property
    def failed(self) -> tuple[StageOutcome, ...]:
        return tuple(o for o in self.outcomes if o.status == "failed")

    @property
    def built(self) -> tuple[StageOutcome, ...]:
        return tuple(o for o in self.outcomes if o.status == "built")

    @property
    def cached(self) -> tuple[StageOutcome, ...]:
        return tuple(o for o in self.outcomes if o.status == "cached")

    def to_json(self) -> JsonObject:
        return {
            "settings": self.settings,
            "stages": [o.to_json() for o in self.outcomes],
            "built": len(self.built),
            "cached": len(self.cached),
            "failed": len(self.failed),
            "cpu_ops_per_block": self.cpu_ops_per_block(),
            "hangs": [h.to_json() for h in self.hangs],
            "wall_s": round(self.wall_s, 2),
        }

    def cpu_ops_per_block(self) -> dict[str, list[str]]:
        """CPU-fallback layers left in NPU stages, per block ("block N"; "other" for stages of no block)."""
        out: dict[str, list[str]] = {}
        for o in self.outcomes:
            keys = [f"block {b}" for b in o.blocks] or ["other"]
            for k in keys:
                out.setdefault(k, []).extend(o.cpu_ops)
        return {k: out[k] for k in sorted(out, key=lambda k: (k == "other", int(k.split()[1]) if k != "other"
                                                               else 0))}



#: seconds every build may take whatever its size, when ``--timeout`` is not given
BUILD_TIMEOUT_BASE = 900.0
#: and per MiB of the stage's weights (full-size Anima stages of 100-200 MiB build in ~2.3 min)
BUILD_TIMEOUT_PER_MIB = 2.0


def default_build_timeout(size_bytes: int) -> float:
    """Seconds a build of a stage of ``size_bytes`` may take when ``--timeout`` is not given.

    A toolkit can loop forever in its optimiser (2.5.0 in ``swap_reshape_branch_elements`` on a
    rank-6 RoPE after ``rope-pair-matrix``; RFD4's whole-block stages): with no limit, ``rkpart
    compile`` never returned.  The default is several times what the measured builds take
    (``BUILD_TIMEOUT_BASE`` + ``BUILD_TIMEOUT_PER_MIB`` per MiB); a build killed by it is a
    ``timeout`` failure, retried without the NPU rewrites like any failure with them.
    """
    return BUILD_TIMEOUT_BASE + BUILD_TIMEOUT_PER_MIB * max(0, int(size_bytes)) / (1 << 20)

@dataclass(frozen=True)
class CompileOptions:
    """How to build a plan's NPU stages: ``rkpart compile PLAN``'s options, and what
    :func:`compile_plan_report` reads (see :func:`compile_plan` for the first six fields)."""

    toolkit: str | Toolkit  # version installed with `rkpart toolkit install`, a python path, or a Toolkit
    target: str = "rk3588"
    config: JsonMap = field(default_factory=dict)  # RKNN.config options besides target_platform
    jobs: int = 1
    timeout: float | None = None
    fallback_toolkit: str | Toolkit | None = None
    toolkits_dir: str | os.PathLike[str] | None = None
    shared_cache: str | os.PathLike[str] | None = None  # cache dir shared between plans [default: the user's]
    retry_failed: bool = False
    cache: bool = True  # False: neither read nor fill the user-level build cache
    stages: Sequence[str] = ()  # build only these NPU stages (ids); others keep their artifacts
    rewrites: bool = True  # apply the NPU rewrites of rkpart.targets.rewrites (opset lowering always happens)
    skip_rewrites: frozenset[str] = frozenset()  # NPU rewrites left out (by name), the others applied
    #: build a stage that a memory-only rewrite matched once more without it (one build per anatomy, cached)
    #: and keep the rewrite only where the compiler's figures say it helps (rkpart.compile.weigh)
    weigh_rewrites: bool = True
    strict_npu: bool = False  # a stage with ops left on the CPU fails
    executor: str = "local"  # "local" (subprocesses here) or "ray" (Ray tasks, rkpart.compile.ray_executor)
    address: str | None = None  # Ray cluster address for executor "ray"
    precision: str = "fp16"  # fp16, int8 (w8a8) or hybrid: every NPU stage not named by precision_spec
    calibration: str | os.PathLike[str] | None = None  # calibration folder (rkpart calibrate); int8 / hybrid
    quantized_algorithm: str = "normal"  # normal, mmse, kl_divergence
    precision_spec: str | os.PathLike[str] | None = None  # YAML/JSON: stage ids / regions / kinds -> precision
    memory_margin: int = DEFAULT_MARGIN  # bytes of RAM the scheduler keeps free
    worker: Path = WORKER  # the build worker script; replaced only by test fakes
    learn: bool = True  # record CPU layers in the learned-placement store (rkpart.grouping.learned)
    #: a build past this many times the CPU time its peers predict is stopped as a hang (0: only ``timeout``)
    hang_factor: float = HANG_FACTOR
    hang_floor: float = HANG_FLOOR_S  # ... and never before this many CPU seconds (rkpart.compile.hang)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))


def compile_folder(plan_path: str | os.PathLike[str], options: CompileOptions,
                   progress: Progress | None = None) -> CompileReport:
    """Load the plan at ``plan_path`` (folder or ``plan.json``) and build it as ``options`` say."""
    plan, folder = load_plan(plan_path)
    report = compile_plan_report(plan, folder, options, progress)
    if options.learn:
        learn_placements(report, Path(folder), options.target, progress)
    return report


def _built_file(report: CompileReport, folder: Path, stage_id: str) -> Path | None:
    """The file the toolkit built for ``stage_id`` (the prepared copy when rkpart lowered or rewrote the
    stage: its surviving ops keep their names), ``None`` when it is gone."""
    stages = {s.id: s for s in report.plan.stages}
    if stage_id not in stages:
        return None
    st = stages[stage_id]
    path = folder / ((st.prepared or {}).get("file") or st.file)
    return path if path.is_file() else None


def _stage_file(report: CompileReport, folder: Path, stage_id: str) -> Path | None:
    """The plan's own file of ``stage_id`` (weights external: read as a graph cheaply), ``None`` when gone."""
    st = next((s for s in report.plan.stages if s.id == stage_id), None)
    path = folder / st.file if st is not None else None
    return path if path is not None and path.is_file() else None


def traced_layers(report: CompileReport, folder: Path) -> list[CpuLayer]:
    """The CPU layers of every NPU stage ``report`` built or took from the cache, traced to the ops of
    the file the toolkit built, their patterns read from the plan's own stage file where it holds the op
    (:func:`rkpart.grouping.learned.trace_cpu_layers`)."""
    out: list[CpuLayer] = []
    for o in report.outcomes:
        a = o.artifact
        path = _built_file(report, folder, o.stage_id) if a is not None and a.cpu_ops else None
        if a is None or path is None:
            continue
        try:
            out += trace_cpu_layers(o.stage_id, path, a.cpu_ops, like=_stage_file(report, folder, o.stage_id))
        except UserError:  # a stage file that no longer loads teaches nothing
            continue
    return out


def learn_placements(report: CompileReport, folder: Path, target: str,
                     progress: Progress | None = None) -> list[CpuLayer]:
    """Record the CPU layers of ``report``'s NPU stages in the learned-placement store
    (:mod:`rkpart.grouping.learned`), and the ops of learned patterns its builds ran on the NPU
    (which contradicts those patterns); returns the CPU layers, traced to their ops, for a caller
    that acts on them too (``rkpart compile --repartition``)."""
    layers = traced_layers(report, folder)
    by_toolkit: dict[str, list[CpuLayer]] = {}
    toolkit_of = {o.stage_id: o.artifact.toolkit for o in report.outcomes if o.artifact is not None}
    for x in layers:
        by_toolkit.setdefault(toolkit_of[x.stage], []).append(x)
    for version, rows in sorted(by_toolkit.items()):
        for p in learn(target, version, rows):
            if progress is not None:
                progress(f"learned: rknn-toolkit2 {version} places {p.describe()} on the CPU (the next partition "
                         "for it moves such ops of these shapes to the host unless a rewrite removes them)")
    for version in sorted(set(toolkit_of.values())):
        known = load_learned(target, version)
        if not known:
            continue
        seen: list[NpuOp] = []
        for o in report.outcomes:
            path = _built_file(report, folder, o.stage_id) if toolkit_of.get(o.stage_id) == version else None
            if path is None:
                continue
            try:
                own = _stage_file(report, folder, o.stage_id)
                seen += npu_ops(o.stage_id, path, [x for x in layers if x.stage == o.stage_id], known,
                                screen=own, like=own)
            except UserError:
                continue
        for p in contradict(target, version, seen):
            if progress is not None:
                where = next(f"{x.stage}: {x.op}" for x in seen if x.pattern == p)
                progress(f"learned placement dropped: rknn-toolkit2 {version} ran {p.describe()} on the NPU "
                         f"({where}); later partitions keep such ops in NPU stages")
    return layers


@dataclass
class _Pending:
    stage: Stage
    onnx: Path
    key: str
    job: BuildJob | None = None


def compile_plan(plan: Plan, folder: str | os.PathLike[str], toolkit: str | Toolkit, target: str = "rk3588",
                 config: JsonMap | None = None, jobs: int = 1, timeout: float | None = None,
                 fallback_toolkit: str | Toolkit | None = None, progress: Progress | None = None,
                 **options: Any) -> Plan:
    """Build every NPU stage of ``plan`` and return the plan with artifacts and failures.

    ``plan.json`` in ``folder`` is rewritten atomically.  Build failures do not raise: they are
    recorded in each stage's ``failures`` (see :func:`compile_plan_report` for the outcomes).

    Parameters
    ----------
    plan, folder
        The plan and the folder its relative paths refer to.
    toolkit
        Toolkit version (``2.3.0``) installed with ``rkpart toolkit install``, a python path,
        or a resolved :class:`Toolkit`.
    target
        ``target_platform`` for ``RKNN.config``.
    config
        Further ``RKNN.config`` options (``optimization_level``, ``single_core_mode``, ...).
    jobs
        Upper bound on parallel builds; memory is the real limit (see ``scheduler``).
    timeout
        Seconds per build before its process group is killed [default: :func:`default_build_timeout`
        of the stage's size].
    fallback_toolkit
        Version that retries the stages the first toolkit failed on.
    progress
        Called with one human-readable line per event.

    Raises
    ------
    ToolkitError
        A toolkit is not installed.
    OutputExistsError
        Another rkpart run holds the folder.
    """
    opts = CompileOptions(toolkit, target, dict(config or {}), jobs, timeout, fallback_toolkit, **options)
    return compile_plan_report(plan, folder, opts, progress).plan


def compile_plan_report(plan: Plan, folder: str | os.PathLike[str], opts: CompileOptions,
                        progress: Progress | None = None, *,
                        available: Callable[[], int] = available_memory) -> CompileReport:
    """:func:`compile_plan`, returning the per-stage outcomes as well; ``opts`` says how.

    ``opts.shared_cache`` is a cache dir shared between plans (default: the user-level build cache,
    :mod:`rkpart.compile.user_cache`; ``cache=False`` uses none); ``stages`` limits the build
    to those NPU stage ids (the others keep their artifacts); ``retry_failed`` rebuilds stages
    whose crash is remembered by the cache; ``opts.worker`` and ``available`` (free memory in bytes,
    read by the scheduler) are replaced only by test fakes.
    ``executor="ray"`` runs the builds as Ray tasks on the cluster at ``address``
    (:mod:`rkpart.compile.ray_executor`); results land in the plan exactly as local builds.
    ``precision`` / ``precision_spec`` / ``calibration`` / ``quantized_algorithm``: int8 and
    hybrid builds (:mod:`rkpart.compile.precision`); a ``calibration`` also runs the fp16 range
    check, whose findings land in ``settings["fp16_range"]``.
    """
    say = progress or (lambda _m: None)
    folder = Path(folder)
    t0 = time.monotonic()
    chosen = _select_stages(plan, opts.stages or None)
    target, toolkits_dir, shared_cache = opts.target, opts.toolkits_dir, opts.shared_cache
    # the user's own files first: a bad calibration or --precision-spec is refused naming it,
    # toolkit installed or not
    from rkpart.compile.calibration import load_calibration

    cal = load_calibration(opts.calibration) if opts.calibration is not None else None
    if cal is not None:
        cal.check_plan(plan)
    # --precision-spec, else the one `--strategy auto` recorded in the plan (the stages it chose int8 for)
    spec = (load_precision_spec(opts.precision_spec, plan) if opts.precision_spec is not None
            else plan_precision_spec(plan))
    # for int8 / hybrid stages every calibration sample is read and verified before any toolkit work:
    # a bad or tampered one is refused at once, toolkit installed or not
    resolved = resolve(plan, chosen, precision=opts.precision, spec=spec, calibration=opts.calibration,
                       algorithm=opts.quantized_algorithm, target=opts.target)
    tk = _resolve(opts.toolkit, toolkits_dir)
    assert tk is not None
    fb = _resolve(opts.fallback_toolkit, toolkits_dir)
    full_config = {**dict(opts.config or {}), "target_platform": target}
    # once, before any build: a bad target or option would otherwise fail every stage
    check_target(target)
    check_config(full_config, [t for t in (tk, fb) if t is not None], opts.worker)
    chash = config_hash(full_config)
    settings: JsonObject = {"toolkit": tk.version, "target": target, "config": normalise_config(full_config),
                "config_hash": chash, "fallback_toolkit": fb.version if fb else None, "rewrites": opts.rewrites,
                "strict_npu": opts.strict_npu}
    if opts.skip_rewrites:
        settings["skip_rewrites"] = sorted(opts.skip_rewrites)
    if opts.rewrites and not opts.weigh_rewrites:
        settings["weigh_rewrites"] = False
    precisions = _precisions(plan, chosen, opts, spec, cal, resolved, full_config,
                             [t for t in (tk, fb) if t is not None], settings)
    if opts.executor == "ray" and any(sp.quantized for sp in precisions.values()):
        # a Ray node gets the stage's files, not its calibration dataset: it would build fp16
        raise UserError("--precision int8 / hybrid builds run with --executor local only (Ray tasks do not "
                        "carry the calibration data yet)")
    with folder_lock(folder):
        # build dirs of a compile that was killed (SIGKILL skips its cleanup); the lock
        # guarantees no live compile is using them
        import shutil

        shutil.rmtree(folder / RKNN_DIR / ".tmp", ignore_errors=True)
        _check_writable(folder / RKNN_DIR)
        local = ArtifactCache(folder / RKNN_DIR)
        shared_root = Path(shared_cache) if shared_cache else user_cache_dir() if opts.cache else None
        shared = ArtifactCache(shared_root) if shared_root is not None else None
        if shared_root is not None:
            from rkpart.compile.user_cache import mark_cache

            mark_cache(shared_root)  # `cache prune` deletes only in a folder that carries it
        mem_path = (Path(shared_cache) if shared_cache else default_cache_dir()) / MEMORY_FILE
        model = MemoryModel(mem_path)
        ctx = _Context(folder=folder, target=target, config=full_config, chash=chash, cache=local,
                       shared=shared, model=model, timeout=opts.timeout, jobs=opts.jobs,
                       retry_failed=opts.retry_failed, margin=opts.memory_margin, available=available,
                       worker=opts.worker, say=say, t0=t0,
                       rewrites=opts.rewrites, skip_rewrites=frozenset(opts.skip_rewrites), precisions=precisions,
                       hangs=PeerWatch(say, opts.hang_factor, opts.hang_floor),
                       verdicts=VerdictStore([folder / RKNN_DIR, *([shared_root] if shared_root is not None else [])])
                       if opts.rewrites and opts.weigh_rewrites else None)
        if opts.executor == "ray":
            from rkpart.compile.ray_executor import RayRunner

            ctx.runner = RayRunner(opts.address, toolkits_dir=toolkits_dir, say=say)
        elif opts.executor != "local":
            raise UserError(f"unknown executor {opts.executor!r}: choose local or ray")
        outcomes = ctx.compile_round(chosen, tk, fallback_reason=None)
        if fb is not None:
            retry = [s for s in chosen if outcomes[s.id].status == "failed"]
            if retry:
                say(f"retrying {len(retry)} failed stage(s) with rknn-toolkit2 {fb.version}")
                second = ctx.compile_round(retry, fb, fallback_reason={
                    s.id: outcomes[s.id].failures[-1].message for s in retry})
                for s in retry:
                    o2 = second[s.id]
                    outcomes[s.id] = dataclasses.replace(o2, failures=outcomes[s.id].failures + o2.failures)
        if opts.strict_npu:
            for s in chosen:
                o = outcomes[s.id]
                if o.artifact is not None and o.artifact.cpu_ops:
                    ops = o.artifact.cpu_ops
                    fail = _StrictFailure(toolkit=o.toolkit, kind="error", last_step="placement",
                                          message=f"--strict-npu: {len(ops)} op(s) placed on the CPU: "
                                                  f"{', '.join(ops[:5])}{' ...' if len(ops) > 5 else ''}",
                                          log=o.log, cpu_ops=ops)
                    outcomes[s.id] = dataclasses.replace(o, status="failed", artifact=None,
                                                         failures=(*o.failures, fail))
        model.save()
        weighed: dict[str, Verdict] = {}
        for sid, v in ctx.weighed.items():  # the verdict and both builds' figures, in plan.json
            rec = ctx.prepared.get(sid)
            if rec is not None and v.with_rewrites is not None:
                ctx.prepared[sid] = dataclasses.replace(rec, weighed=v.to_json())
                weighed[sid] = v
        new_plan = _apply(plan, outcomes, settings, ctx.prepared)
        new_plan.save(folder)
    ordered = tuple(dataclasses.replace(outcomes[s.id], blocks=s.blocks or ((s.block,) if s.block is not None
                                                                            else ()),
                                        dropped_rewrites=dict(_dropped(ctx.prepared.get(s.id))),
                                        weighed=weighed.get(s.id))
                    for s in chosen)
    return CompileReport(plan=new_plan, outcomes=ordered, wall_s=time.monotonic() - t0, settings=settings,
                         hangs=_resolved(ctx.hangs.stops, outcomes, ctx.disabled_rules, ctx.prepared))


def _resolved(stops: Sequence[HangStop], outcomes: Mapping[str, StageOutcome],
              rules: Mapping[str, tuple[str, ...]], prepared: Mapping[str, PreparedRecord | None]
              ) -> tuple[HangStop, ...]:
    """``stops`` with how each stage was built in the end (``None``: it was not: still failed)."""
    out = []
    for h in stops:
        o = outcomes.get(h.stage)
        how = None
        if o is not None and o.artifact is not None:
            dropped = sorted(_dropped(prepared.get(h.stage)))
            how = (f"rknn-toolkit2 {o.artifact.toolkit}, disable_rules={list(rules[h.stage])}" if rules.get(h.stage)
                   else f"rknn-toolkit2 {o.artifact.toolkit} without NPU rewrite(s) {', '.join(dropped)}" if dropped
                   else f"rknn-toolkit2 {o.artifact.toolkit}" + (" (fallback)" if o.artifact.fallback_reason else ""))
        out.append(dataclasses.replace(h, resolved_by=how))
    return tuple(out)


def _precisions(plan: Plan, chosen: tuple[Stage, ...], opts: CompileOptions, spec: PrecisionSpec | None,
                cal: Calibration | None, out: dict[str, StagePrecision], config: JsonMap,
                toolkits: list[Toolkit], settings: JsonObject) -> dict[str, StagePrecision]:
    """Checks ``out`` (each chosen stage's precision under ``spec``, resolved by the caller before any
    toolkit work) against the toolkits (a toolkit without the quantization options cannot quantize);
    records it, and ``cal``'s fp16 range findings, in ``settings``."""
    precision, spec_path = opts.precision, opts.precision_spec
    algorithm, target, worker = opts.quantized_algorithm, opts.target, opts.worker
    quantized = {sid: sp for sid, sp in out.items() if sp.quantized}
    if quantized:
        sp0 = next(iter(quantized.values()))
        # the toolkit must take the quantization options (a toolkit without them cannot quantize)
        check_config(sp0.config(config, target), toolkits, worker)
        settings["precision"] = {"default": precision, "quantized_algorithm": algorithm,
                                 **({"spec": "plan (strategy auto)"} if spec_path is None and spec else {}),
                                 "calibration_sha256": sp0.calibration_sha256,
                                 "stages": {sid: sp.precision for sid, sp in out.items()}}
    if cal is not None:
        ids = {s.id for s in chosen}
        settings["fp16_range"] = [f.to_json() for f in cal.findings if f.stage in ids]
        settings["fp16_range_checked"] = sum(sc.activations for sid, sc in cal.stages.items() if sid in ids)
    return out


def _check_writable(folder: Path) -> None:
    """Fail before any build when the plan folder cannot take the results (read-only, full)."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        err = os_error(e, f"plan folder {folder.parent}")
        if err is None:
            raise
        raise err from None


def _select_stages(plan: Plan, ids: Sequence[str] | None) -> tuple[Stage, ...]:
    """The NPU stages to build: all, or those named (an unknown or host stage id is a user error)."""
    if not ids:
        return plan.npu_stages
    import difflib

    npu = {s.id: s for s in plan.npu_stages}
    for i in ids:
        if i not in npu:
            what = "a host stage" if any(s.id == i for s in plan.stages) else "not a stage of this plan"
            near = difflib.get_close_matches(i, list(npu), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f" (NPU stages: {', '.join(npu)})"
            raise UserError(f"--stage {i!r} is {what}{hint}")
    want = set(ids)
    return tuple(s for s in plan.npu_stages if s.id in want)


def _resolve(spec: str | Toolkit | None, toolkits_dir: str | os.PathLike[str] | None) -> Toolkit | None:
    if spec is None or isinstance(spec, Toolkit):
        return spec
    return find_toolkit(spec, toolkits_dir)


def _dropped(rec: PreparedRecord | None) -> Mapping[str, str]:
    return {} if rec is None else rec.dropped_rewrites


def _apply(plan: Plan, outcomes: Mapping[str, StageOutcome], settings: JsonMap,
           prepared: Mapping[str, PreparedRecord | None] | None = None) -> Plan:
    stages = []
    for s in plan.stages:
        o = outcomes.get(s.id)
        if o is None:
            stages.append(s)
            continue
        # A plan describes one compile: rknn artifacts of earlier settings are dropped.
        kept = tuple(a for a in s.artifacts if a.kind != "rknn")
        arts = (*kept, o.artifact) if o.artifact else kept
        prep = (prepared or {}).get(s.id)
        stages.append(dataclasses.replace(s, artifacts=arts, failures=o.failures,
                                          prepared=None if prep is None else prep.to_json()))
    extra: PlanExtra = {**plan.extra, "compile": dict(settings)}
    return dataclasses.replace(plan, stages=tuple(stages), extra=extra)


@dataclass
class _Context:
    folder: Path
    target: str
    config: JsonObject
    chash: str
    cache: ArtifactCache
    shared: ArtifactCache | None
    model: MemoryModel
    timeout: float | None
    jobs: int
    retry_failed: bool
    margin: int
    available: Callable[[], int]
    worker: Path
    say: Progress
    t0: float
    rewrites: bool = True
    skip_rewrites: frozenset[str] = frozenset()
    #: stage id -> what prepare_stage did for the last toolkit that saw it (None: nothing)
    prepared: dict[str, PreparedRecord | None] = field(default_factory=dict)
    #: runs one build (Ray's RayRunner); None: local subprocesses under the memory scheduler
    runner: Callable[..., BuildResult] | None = None
    #: stage id -> how it is built (fp16 when missing)
    precisions: dict[str, StagePrecision] = field(default_factory=dict)
    #: stage id -> its calibration dataset linked into the plan folder (relative; int8 / hybrid)
    datasets: dict[str, str] = field(default_factory=dict)
    #: stage id -> the optimiser rules its builds turn off (``disable_rules``): named by a failed build
    disabled_rules: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: the peers of every build and the builds stopped as hangs (rkpart.compile.hang)
    hangs: PeerWatch = field(default_factory=lambda: PeerWatch(lambda _m: None, 0.0))
    #: the verdicts on memory-only rewrites (rkpart.compile.weigh); None: not weighed (--no-weigh-rewrites)
    verdicts: VerdictStore | None = None
    #: stage id -> the weighed rewrites its verdict leaves out (every build of the stage leaves them out)
    weigh_drops: dict[str, dict[str, str]] = field(default_factory=dict)
    #: stage id -> the verdict of its anatomy
    weighed: dict[str, Verdict] = field(default_factory=dict)

    def compile_round(self, stages: Sequence[Stage], tk: Toolkit,
                      fallback_reason: Mapping[str, str] | None) -> dict[str, StageOutcome]:
        """Build ``stages`` with ``tk``; a stage whose build fails with NPU rewrites is rebuilt without them.

        Memory-only rewrites are weighed (:mod:`rkpart.compile.weigh`): the first stage of each anatomy
        with no verdict in the cache is built with every rewrite, then once more without those, and the
        compiler's figures decide; the other stages of that anatomy wait for the verdict and are built once."""
        for s in stages:  # a verdict is the toolkit's: the fallback toolkit's round weighs again
            self.weigh_drops.pop(s.id, None)
            self.weighed.pop(s.id, None)
        weigh, held = self._plan_weighing(stages, tk)
        first = [s for s in stages if s.id not in held]
        outcomes = self._round(first, tk, fallback_reason)
        if weigh:
            self._weigh(weigh, {s.id: s for s in first}, tk, fallback_reason, outcomes)
        later = [s for s in stages if s.id in held]
        if later:
            for s in later:
                self._apply_verdict(s.id, held[s.id], cached=False)
            outcomes.update(self._round(later, tk, fallback_reason))
        return outcomes

    def _round(self, stages: Sequence[Stage], tk: Toolkit,
               fallback_reason: Mapping[str, str] | None) -> dict[str, StageOutcome]:
        outcomes = self._build_round(stages, tk, fallback_reason, {})
        self._retry_without_named_rules(stages, tk, fallback_reason, outcomes)
        if self.rewrites:
            self._retry_without_rewrites(stages, tk, fallback_reason, outcomes)
        return outcomes

    def _verdict_key(self, s: Stage, tk: Toolkit, candidates: Sequence[str]) -> str | None:
        """The key of ``s``'s weighing with ``tk`` (``None``: no candidate may match it)."""
        head = load_graph(stage_onnx(self.folder, s))
        if head is None:
            return None
        ops = {n.op_type for n in head.graph.node}
        rows = [r for r in rewrite_table.weighed_rewrites_for(tk.version, self.skip_rewrites) if r.name in candidates]
        if not any(r.may_match(head, ops) for r in rows):
            return None
        sp = self.precisions.get(s.id) or StagePrecision("fp16")
        return verdict_key(model_anatomy(head), tk.version, self.target, sp.config(self.config, self.target),
                           candidates, sorted(self.skip_rewrites), sp.key_extra(),
                           prepare_identity())

    def _plan_weighing(self, stages: Sequence[Stage], tk: Toolkit) -> tuple[dict[str, str], dict[str, str]]:
        """(stage id -> verdict key of the stages to weigh after their first build, one per anatomy;
        stage id -> verdict key of the stages that wait for it).  A stage whose anatomy has a verdict in
        the cache gets it now (:meth:`_apply_verdict`)."""
        if self.verdicts is None:
            return {}, {}
        candidates = [r.name for r in rewrite_table.weighed_rewrites_for(tk.version, self.skip_rewrites)]
        if not candidates:
            return {}, {}
        weigh: dict[str, str] = {}
        held: dict[str, str] = {}
        first_of: dict[str, str] = {}
        for s in stages:
            key = self._verdict_key(s, tk, candidates)
            if key is None:
                continue
            if self.verdicts.get(key) is not None:
                self._apply_verdict(s.id, key, cached=True)
            elif key in first_of:
                held[s.id] = key
            else:
                first_of[key] = s.id
                weigh[s.id] = key
        return weigh, held

    def _apply_verdict(self, sid: str, key: str, cached: bool) -> None:
        """Build ``sid`` as the verdict of its anatomy (``key``) says: without the rewrites it left out."""
        assert self.verdicts is not None
        v = self.verdicts.get(key)
        if v is None or not v.rewrites:  # its anatomy was not weighed (its first build failed), or nothing matched
            return
        if not set(v.rewrites) <= set(WEIGHABLE):  # not a verdict this table could give: weighed again next time
            return
        self.weighed[sid] = v
        if not v.kept:
            self.weigh_drops[sid] = dict.fromkeys(v.rewrites, WEIGHED_OUT)
        if cached:
            self.say(f"[weighed] {sid}: {', '.join(v.rewrites)} {'kept' if v.kept else 'left out'} "
                     f"(the verdict on its anatomy, from the build cache)")

    def _weigh(self, weigh: Mapping[str, str], by_id: Mapping[str, Stage], tk: Toolkit,
               fallback_reason: Mapping[str, str] | None, outcomes: dict[str, StageOutcome]) -> None:
        """Build each stage of ``weigh`` (one per anatomy) once more without the weighed rewrites it matched,
        judge the two builds (:func:`rkpart.compile.weigh.judge`), keep the better one as the stage's and
        store the verdict for its anatomy."""
        assert self.verdicts is not None
        candidates = {r.name for r in rewrite_table.weighed_rewrites_for(tk.version, self.skip_rewrites)}
        todo: dict[str, tuple[str, ...]] = {}
        for sid, key in weigh.items():
            o, rec = outcomes.get(sid), self.prepared.get(sid)
            if o is None or o.artifact is None:
                continue  # its build failed: no figure to weigh against; its anatomy's others build as they are
            if rec is not None and candidates & set(rec.dropped_rewrites):
                continue  # one was dropped already (its check or its build failed): nothing to weigh
            applied = tuple(sorted(candidates & set(rec.rewrites if rec is not None else {})))
            if not applied:
                self.verdicts.put(key, Verdict((), True, None, None, "no rewrite to weigh matched"))
                continue
            plan = o.artifact.compiler
            if plan is not None and plan.device_mem_bytes is not None and plan.device_mem_bytes < WEIGH_MIN_BYTES:
                self.verdicts.put(key, Verdict((), True, None, None, "not weighed: a small stage"))
                continue
            todo[sid] = applied
        if not todo:
            return
        for sid, names in todo.items():
            self.say(f"[weighing] {sid}: building it once more without {', '.join(names)} (it changes only a "
                     "layout: the compiler's figures decide whether it stays)")
        before = {sid: (outcomes[sid], self.prepared.get(sid)) for sid in todo}
        got = self._build_round([by_id[sid] for sid in todo], tk, fallback_reason,
                                {sid: dict.fromkeys(names, WEIGHED_OUT) for sid, names in todo.items()})
        for sid, names in todo.items():
            o, rec = before[sid]
            o2 = got.get(sid)
            assert o.artifact is not None
            with_fig = Figures.of(o.artifact.cpu_ops, o.artifact.compiler)
            if o2 is None or o2.artifact is None:
                fail = o2.failures[-1] if o2 is not None and o2.failures else None
                v = judge(names, with_fig, None, one_line(fail.message) if fail is not None else "not built")
                if fail is None or fail.deterministic:
                    self.verdicts.put(weigh[sid], v)
            else:
                v = judge(names, with_fig, Figures.of(o2.artifact.cpu_ops, o2.artifact.compiler))
                self.verdicts.put(weigh[sid], v)
            self.weighed[sid] = v
            if v.kept:
                outcomes[sid], self.prepared[sid] = o, rec
            else:
                assert o2 is not None
                outcomes[sid] = o2
                self.weigh_drops[sid] = dict.fromkeys(names, WEIGHED_OUT)
            self.say(f"[weighed] {sid}: {', '.join(names)} {v.why}")

    def _retry_without_named_rules(self, stages: Sequence[Stage], tk: Toolkit,
                                   fallback_reason: Mapping[str, str] | None,
                                   outcomes: dict[str, StageOutcome]) -> None:
        """A build that failed in an optimiser rule its log names ("You can add disable_rules=[...] in
        rknn.config()") is rebuilt with that rule off, and again while each new failure names another
        (at most :data:`RULE_RETRIES` times).  Measured: BRIA-FIBO 2's perceiver cross-attention, whose
        query is a constant, fails 2.5.0's two SDPA fusion rules in turn and builds, 0 CPU layers,
        with both off (before, a ``--repartition`` round cut the stage)."""
        by_id = {s.id: s for s in stages}
        first = {sid: o for sid, o in outcomes.items() if o.status == "failed"}
        hang_retries: dict[str, int] = {}
        for _ in range(RULE_RETRIES):
            again = []
            for sid, o in outcomes.items():
                if o.status != "failed" or sid not in by_id or not o.failures or not o.failures[-1].log:
                    continue
                path = self.folder / str(o.failures[-1].log)
                text = read_log(path, self.folder) if os.path.lexists(path) else ""
                f = o.failures[-1]
                hung = f.kind == "timeout" and hang_retries.get(sid, 0) < HANG_RULE_RETRIES
                named = named_rules(text) if f.kind != "timeout" else _hang_rules(text, f) if hung else ()
                new = [r for r in named if r not in self.disabled_rules.get(sid, ())]
                if new:
                    self.disabled_rules[sid] = (*self.disabled_rules.get(sid, ()), *new)
                    why = (f"did not return after {', '.join(new)} rewrote the graph" if f.kind == "timeout"
                           else f"failed in {', '.join(new)} and named it")
                    if f.kind == "timeout":
                        hang_retries[sid] = hang_retries.get(sid, 0) + 1
                    self.say(f"[rules disabled] {sid}: {', '.join(self.disabled_rules[sid])} (the rknn-toolkit2 "
                             f"{tk.version} build {why}): rebuilding")
                    again.append(by_id[sid])
            if not again:
                break
            got = self._build_round(again, tk, fallback_reason, {})
            for sid, o2 in got.items():
                outcomes[sid] = o2 if o2.status != "failed" else dataclasses.replace(
                    o2, failures=outcomes[sid].failures + o2.failures)
        for sid in [sid for sid in first if sid in self.disabled_rules and outcomes[sid].status == "failed"]:
            # turning the named rules off did not make it build: the stage stays as its first build left
            # it (that failure is what the rewrites' retry and --repartition's reduction then work on)
            self.say(f"[rules disabled] {sid}: still fails with {', '.join(self.disabled_rules.pop(sid))} off: "
                     f"{one_line(outcomes[sid].failures[-1].message)}")
            outcomes[sid] = first[sid]

    def _retry_without_rewrites(self, stages: Sequence[Stage], tk: Toolkit,
                                fallback_reason: Mapping[str, str] | None,
                                outcomes: dict[str, StageOutcome]) -> None:
        """A rewrite must never cost a stage: rebuild each failed stage that had NPU rewrites without
        them; when that builds and it had 2 to :data:`BISECT_MAX` of them, drop one at a time to
        keep the others (the first single drop that builds wins).  The dropped rewrites and why
        land in the stage's ``prepared`` record (plan.json) and in the report."""
        first: dict[str, tuple[list[str], str]] = {}  # stage id -> (NPU rewrites applied, failure message)
        # in table order, not the record's: a record read back from the prepare cache lists them sorted, and
        # the bisection below must try the same drops in the same order on every run (a rerun builds nothing)
        # a rewrite the stage cannot build without (bfloat16-widen) is kept: only the others are tried out
        npu_rows = [r.name for r in rewrite_table.compile_rewrites_for() if not r.needed]
        for s in stages:
            o, rec = outcomes[s.id], self.prepared.get(s.id)
            applied = [n for n in npu_rows if n in (rec.rewrites if rec else {})]
            if o.status == "failed" and applied and o.failures and o.failures[-1].last_step != "prepare":
                first[s.id] = (applied, o.failures[-1].message)
        if not first:
            return
        by_id = {s.id: s for s in stages}

        def why(sid: str) -> str:
            return f"the rknn-toolkit2 {tk.version} build with it failed: {first[sid][1]}"

        self.say(f"rebuilding {len(first)} failed stage(s) without their NPU rewrites: "
                 + "; ".join(f"{sid} ({', '.join(a)})" for sid, (a, _) in first.items()))
        drops = {sid: {n: why(sid) for n in applied} for sid, (applied, _) in first.items()}
        second = self._build_round([by_id[sid] for sid in first], tk, fallback_reason, drops)
        best: dict[str, tuple[StageOutcome, PreparedRecord | None]] = {}
        for sid, o2 in second.items():
            if o2.status == "failed":  # not the rewrites: the stage fails either way
                outcomes[sid] = dataclasses.replace(o2, failures=outcomes[sid].failures + o2.failures)
            else:
                best[sid] = (o2, self.prepared.get(sid))
        # bisect: which one rewrite does the toolkit fail on (the others are kept)
        search = {sid: list(first[sid][0]) for sid in best if 1 < len(first[sid][0]) <= BISECT_MAX}
        for i in range(BISECT_MAX):
            trying = {sid: names[i] for sid, names in search.items() if i < len(names)}
            if not trying:
                break
            got = self._build_round([by_id[sid] for sid in trying], tk, fallback_reason,
                                    {sid: {n: why(sid)} for sid, n in trying.items()})
            for sid, o3 in got.items():
                if o3.status != "failed":
                    best[sid] = (o3, self.prepared.get(sid))
                    del search[sid]
        for sid, (o_best, rec) in best.items():
            self.prepared[sid] = rec
            outcomes[sid] = o_best
            for name, reason in _dropped(rec).items():
                self.say(f"[rewrite dropped] {sid}: {name}: {reason}")

    def _build_round(self, stages: Sequence[Stage], tk: Toolkit, fallback_reason: Mapping[str, str] | None,
                     drops: Mapping[str, Mapping[str, str]]) -> dict[str, StageOutcome]:
        outcomes: dict[str, StageOutcome] = {}
        todo: list[_Pending] = []
        for s in stages:
            onnx = stage_onnx(self.folder, s)
            reason = fallback_reason.get(s.id) if fallback_reason else None
            drop = {**self.weigh_drops.get(s.id, {}), **drops.get(s.id, {})}
            try:
                prep = prepare_stage(onnx, s.sha256, self.folder / RKNN_DIR, tk.version, self.target,
                                     rewrites=self.rewrites, drop=drop, skip=self.skip_rewrites)
            except ToolkitError as e:
                pfail = BuildFailure(toolkit=tk.version, kind="error", message=str(e), last_step="prepare")
                outcomes[s.id] = StageOutcome(stage_id=s.id, status="failed", toolkit=tk.version, artifact=None,
                                              failures=(pfail,))
                self.say(f"FAILED {s.id}: {e}")
                continue
            self.prepared[s.id] = prep.record
            if prep.record is not None:
                self.say(f"[prepared] {s.id}: {prep.record.describe()}")
            onnx = prep.onnx
            sp = self.precisions.get(s.id) or StagePrecision("fp16")
            config = sp.config(self.config, self.target)
            if self.disabled_rules.get(s.id):
                config = {**config, "disable_rules": list(self.disabled_rules[s.id])}
            quantize = None
            if sp.quantized:
                assert sp.dataset is not None and sp.calibration_sha256 is not None
                linked = link_dataset(sp.dataset, self.folder / RKNN_DIR)
                self.datasets[s.id] = linked.relative_to(self.folder).as_posix()
                quantize = sp.request(linked)
            key = build_key(onnx, tk.version, self.target, config, sp.key_extra())
            meta = self.cache.get(key)
            if meta is None and self.shared is not None:
                meta = self.cache.import_from(self.shared, key)
                if meta is not None:
                    touch(self.shared.meta_path(key))  # last use, for `rkpart cache prune --max-size`
            if meta is not None and _fewer_outputs(meta, len(s.outputs)):
                meta = None  # an earlier rkpart kept an .rknn with merged outputs: build it again (and fail)
            if meta is not None:
                outcomes[s.id] = StageOutcome(stage_id=s.id, status="cached", toolkit=tk.version,
                                              artifact=self._artifact(key, meta, reason, self.datasets.get(s.id)),
                                              log=meta.get("log"))
                cpu = meta.get("cpu_s")  # recorded when it was built: a peer of the builds that follow
                if isinstance(cpu, (int, float)) and not isinstance(cpu, bool):
                    self.hangs.add(tk.version, Peer(s.id, float(cpu), s.num_nodes, measured_stage_bytes(onnx)))
                self.say(f"[cached] {s.id}  rknn-toolkit2 {tk.version}")
                continue
            fail = None if self.retry_failed else self.cache.get_failure(key)
            if fail is not None:
                outcomes[s.id] = StageOutcome(stage_id=s.id, status="failed", toolkit=tk.version,
                                              artifact=None, failures=(fail,), log=fail.log)
                self.say(f"[cached failure] {s.id}: {one_line(fail.message)} (--retry-failed rebuilds it)")
                continue
            # measured, never read from plan.json: the memory model learns from this figure,
            # and a tampered weight_bytes must not lower every later estimate
            size = measured_stage_bytes(onnx)
            without = "".join(f".without-{n}" for n in sorted(drop))  # keeps the first log
            without += f".rules-off-{len(self.disabled_rules[s.id])}" if self.disabled_rules.get(s.id) else ""
            log = self.folder / RKNN_DIR / LOG_DIR / f"{s.id}.{tk.version}{without}.log"
            timeout = self.timeout if self.timeout is not None else default_build_timeout(size)
            job = BuildJob(stage_id=s.id, onnx=onnx, output=self.cache.rknn_path(key), log=log,
                           config=config, toolkit=tk, timeout=timeout,
                           est_peak_rss=self.model.estimate(tk.version, size), size_bytes=size,
                           worker=self.worker, quantize=quantize,
                           watch=self.hangs.watch(tk.version, s.id, s.num_nodes, size, timeout))
            todo.append(_Pending(stage=s, onnx=onnx, key=key, job=job))
        if not todo:
            return outcomes
        by_id = {p.stage.id: p for p in todo}
        lock = threading.Lock()

        def on_event(ev: JsonObject) -> None:
            if ev["event"] == "start":
                self.say(f"[{ev['n']}/{ev['total']}] building {ev['stage']}  rknn-toolkit2 {tk.version}  "
                         f"elapsed {time.monotonic() - self.t0:.0f} s  memory in use {human_bytes(memory_in_use())}  "
                         f"(estimated peak {human_bytes(ev['est_peak_rss'])}, {ev['running']} running)")
                return
            res: BuildResult = ev["result"]
            p = by_id[res.stage_id]
            o = self._finish(p, res, tk, fallback_reason.get(p.stage.id) if fallback_reason else None)
            with lock:
                outcomes[res.stage_id] = o
            status = "ok" if res.ok else "FAILED"
            detail = f"{res.wall_s:.1f} s, peak {human_bytes(res.peak_rss_bytes)}" if res.ok else res.message
            self.say(f"done {ev['done']}/{ev['total']}: {status} {res.stage_id}: {detail}  "
                     f"elapsed {time.monotonic() - self.t0:.0f} s")
            advance(self.say, ev["done"], ev["total"])

        if self.runner is None:
            sched = Scheduler(self.jobs, available=self.available, margin=self.margin,
                              tmp_parent=self.folder / RKNN_DIR / ".tmp")
        else:  # the cluster admits builds by its ``memory`` resource; keep about one per CPU in flight
            slots = getattr(self.runner, "slots", lambda: len(todo))()
            sched = Scheduler(max(self.jobs, slots), available=lambda: 1 << 62, margin=0, runner=self.runner,
                              tmp_parent=self.folder / RKNN_DIR / ".tmp")
        try:
            sched.run([p.job for p in todo if p.job is not None], progress=on_event)
        finally:
            with contextlib.suppress(OSError):
                (self.folder / RKNN_DIR / ".tmp").rmdir()
        return outcomes

    @staticmethod
    def _failure(p: _Pending, res: BuildResult, tk: Toolkit, rel_log: str, text: str) -> BuildFailure | None:
        """Why the build ``res`` of ``p`` gives no artifact (``text``: its log, read when it built), or ``None``."""
        if not res.ok:
            fail = res.failure(rel_log)
            from rkpart.targets.known_issues import match_signature

            sig = match_signature(res)
            if sig is not None:
                # name the known toolkit bug, so the report says what it is and what to do
                fail = dataclasses.replace(fail, signature=sig.id, message=f"{fail.message} ({sig.describe()})")
            return fail
        lost = missing_outputs(text, list(p.stage.outputs))
        if lost is None:
            return None
        # an .rknn that returns fewer tensors than the stage declares breaks every runner: a failure
        names = f"{', '.join(lost[:3])}{' ...' if len(lost) > 3 else ''}"
        why = (f"rknn-toolkit2 {tk.version} computed {names} as constants and removed them (a product "
               "with all-zero weights, as an untrained model has)" if CONSTANT_OUTPUTS in text else
               f"rknn-toolkit2 {tk.version} built one output for tensors it found equal ({names}; "
               "rkpart partition merges outputs of equal value first: partition the model again)")
        return BuildFailure(toolkit=tk.version, kind="error", last_step=res.last_step, log=rel_log,
                            message=f"build failed: the .rknn has {len(p.stage.outputs) - len(lost)} outputs, "
                                    f"the stage declares {len(p.stage.outputs)}: {why}")

    def _finish(self, p: _Pending, res: BuildResult, tk: Toolkit, reason: str | None) -> StageOutcome:
        rel_log = os.path.relpath(res.log, self.folder)
        self.model.observe(tk.version, p.job.size_bytes if p.job else 0, res.peak_rss_bytes)
        rknn = self.cache.rknn_path(p.key)
        text = res.log.read_text(errors="replace") if res.ok else ""
        fail = self._failure(p, res, tk, rel_log, text)
        if res.kind == "timeout" and res.stopped is None and p.job is not None and p.job.timeout is not None:
            self.hangs.timed_out(tk.version, p.stage.id, res.cpu_s, res.wall_s, p.job.timeout)
        if fail is not None:
            if fail.deterministic:
                self.cache.put_failure(p.key, fail)
            if res.ok:  # it built, with too few outputs: no artifact
                rknn.unlink(missing_ok=True)
            return StageOutcome(stage_id=p.stage.id, status="failed", toolkit=tk.version, artifact=None,
                                failures=(fail,), wall_s=res.wall_s, peak_rss_bytes=res.peak_rss_bytes,
                                log=rel_log, cpu_s=res.cpu_s)
        meta = {
            "toolkit": tk.version,
            "target": self.target,
            "config": normalise_config(self.config),
            "config_hash": self.chash,
            "sha256": file_sha256(rknn),
            "size_bytes": rknn.stat().st_size,
            "cpu_ops": list(parse_cpu_ops(text)),
            **compiler_meta(text),
            "stage_sha256": p.stage.sha256,
            "wall_s": round(res.wall_s, 2),
            "cpu_s": round(res.cpu_s, 2),
            "peak_rss_bytes": res.peak_rss_bytes,
            "log": rel_log,
        }
        if self.disabled_rules.get(p.stage.id) and p.job is not None:  # the settings it was built with
            meta.update(config=normalise_config(p.job.config), config_hash=config_hash(p.job.config))
        sp = self.precisions.get(p.stage.id)
        if sp is not None and sp.quantized and p.job is not None:
            meta.update(config=normalise_config(p.job.config), config_hash=config_hash(p.job.config),
                        precision=sp.precision, quantized_algorithm=sp.algorithm,
                        calibration_sha256=sp.calibration_sha256,
                        float16_layers=[str(x) for x in res.extra.get("float16_layers") or ()])
        self.cache.put_meta(p.key, meta)
        if self.shared is not None:
            self.cache.export_to(self.shared, p.key)
        if p.job is not None:  # a peer of the builds still running and of those that follow
            self.hangs.add(tk.version, Peer(p.stage.id, res.cpu_s, p.stage.num_nodes, p.job.size_bytes))
        return StageOutcome(stage_id=p.stage.id, status="built", toolkit=tk.version,
                            artifact=self._artifact(p.key, meta, reason, self.datasets.get(p.stage.id)),
                            wall_s=res.wall_s, cpu_s=res.cpu_s,
                            peak_rss_bytes=res.peak_rss_bytes, log=rel_log)

    def _artifact(self, key: str, meta: JsonMap, reason: str | None,
                  dataset: str | None = None) -> Artifact:
        quantized = meta.get("precision", "fp16") != "fp16"
        return Artifact(kind="rknn", file=f"{RKNN_DIR}/objects/{key}.rknn", toolkit=str(meta["toolkit"]),
                        target=str(meta["target"]), config_hash=str(meta["config_hash"]),
                        sha256=str(meta["sha256"]), size_bytes=int(meta["size_bytes"]),
                        cpu_ops=tuple(meta.get("cpu_ops", ())), fallback_reason=reason,
                        precision=str(meta.get("precision", "fp16")),
                        quantized_algorithm=meta.get("quantized_algorithm") if quantized else None,
                        calibration_sha256=meta.get("calibration_sha256") if quantized else None,
                        calibration_dataset=dataset if quantized else None,
                        float16_layers=tuple(str(x) for x in meta.get("float16_layers") or ()),
                        compiler=artifact_compiler_plan(self.folder, key, meta))


def _fewer_outputs(meta: JsonMap, declared: int) -> bool:
    """Whether a cache entry's compiler plan counts fewer ``OutputOperator`` layers than the stage's
    ``declared`` outputs (:func:`rkpart.compile.placement.missing_outputs`)."""
    raw = meta.get("compiler")
    by_op = raw.get("by_op") if isinstance(raw, Mapping) else None
    n = by_op.get("OutputOperator") if isinstance(by_op, Mapping) else None
    return isinstance(n, int) and not isinstance(n, bool) and 0 < n < declared
