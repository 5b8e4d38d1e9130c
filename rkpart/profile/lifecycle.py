"""Run a plan the way the pipeline does and time every lifecycle call.

One *round* is one pipeline run: ``steps`` denoising steps, each with one (``cfg=False``)
or two (``cfg=True``: conditional, then unconditional) passes through every stage in plan
order.  Stage outputs flow to later stages by tensor name.

Residency policies (``residency``):

``"per-stage"``
    For every stage and pass: ``load -> init -> infer -> release``, as the write-up did to
    stay inside 8 GB.  Every record holds all four timings.
``"resident"``
    At the start of the round every non-host stage is loaded and initialised once (in
    plan order); all passes only infer; at the end of the round every stage is released.
    The record of a stage's *first* pass of the round (step 0, conditional) holds its
    ``load_s``/``init_s``; the record of its *last* pass holds ``release_s``; the other
    fields of those records and of the records in between are ``null`` (not performed in
    that pass).  Summing a field over a round's records gives the round's total either way.

Host stages (``device == "host"``: AdaLN, residual adds, ...) are host code in the real
pipeline, loaded once, so they are *always* handled like ``resident`` within a round
(set up at first use, released at the end of the round), whatever ``residency`` says; they
run on the host backend (ONNX Runtime) and the report shows them as "Host AdaLN & Residual".

Repeated inference (``infer_repeat=K``, default 1): every pass calls ``infer`` K times in a
row on the same inputs and records the median as ``infer_s`` and every call in
``infer_calls_s``.  On a machine shared with other jobs a single call of a few milliseconds
is often stretched by a preemption; the median of K back-to-back calls is not, unless more
than half of them are.  The median (not the minimum) is recorded because it is still the
time of a typical call (the first call of a fresh session, which allocates its buffers, is
one of the K and is outvoted); the minimum stays available from ``infer_calls_s``.  Host
stages are repeated the same way (their calls are short, so this is cheap).

Memory is read by a :class:`~rkpart.profile.memory.Sampler` thread and by synchronous
snapshots after ``init``, after ``infer`` and after ``release``; the time those reads take
is reported in ``measurement`` fields and never counted in the lifecycle timings.  With
``snapshots=False`` no synchronous snapshot is taken (memory then comes from the sampler
thread alone, ``null`` where none of its ticks fell inside a call): the round's wall time
is then the pipeline's own.

One block (``block=N``): only the stages of block N run (from its first to its last stage
in plan order).  Their inputs come from ONE run of the stages before them on the host
backend (ONNX Runtime), made before the first round and reused by every round and pass
(a second run only for the unconditional pass, and only if those stages read a conditioning
input).  So one block of the full-size model profiles in seconds.

Baseline (``baseline=True``): after every round the whole model (ONNX Runtime, one session
created once) runs the same passes on the same inputs; the summary record's ``baseline``
holds the whole model's time per round next to the plan's inference time (all stages'
``infer_s``) and net round time (wall minus measurement), and their ratios: the overhead
of running the model as a partitioned plan.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.errors import SpecError
from rkpart.plan.plan import Plan, Stage, stage_order_ok
from rkpart.profile import records as rec
from rkpart.profile.memory import MemorySample, Sampler
from rkpart.profile.smaps import DEFAULT_DEVICE_PATTERN
from rkpart.progress import Progress
from rkpart.runtime.base import Backend, Feeds, StageRunner
from rkpart.runtime.executor import PlanExecutor, find_model, plan_residency
from rkpart.runtime.malloc import give_back, measuring_memory
from rkpart.types import HOST, RESIDENCIES, JsonMap, JsonObject, Residency

COND, UNCOND = "cond", "uncond"

#: Inputs that carry the text conditioning; the unconditional pass gets zeros for them.
UNCOND_INPUT_PATTERN = re.compile(r"encoder_hidden_states|context", re.IGNORECASE)



@dataclass
class _Op:
    """Timings and memory of one stage in one pass of one round (becomes one record)."""

    stage: Stage
    step: int
    pass_name: str
    executor: str
    residency: Residency = Residency.RESIDENT
    load_s: float | None = None
    init_s: float | None = None
    infer_s: float | None = None
    release_s: float | None = None
    infer_calls_s: list[float] = field(default_factory=list)  # every call, with infer_repeat > 1
    infer_cpu_s: float | None = None  # process CPU time of the inference call(s) (all threads)
    cpu_s: dict[str, float] = field(default_factory=dict)  # load / init / release: process CPU time
    spans: list[tuple[float, float]] = field(default_factory=list)  # call start .. snapshot end
    pss_before_kib: int | None = None
    pss_after_infer_kib: int | None = None
    device_pss_kib: int | None = None
    snapshot_s: float = 0.0
    snapshots: int = 0


def make_inputs(plan: Plan, seed: int = 0, folder: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """Seeded plan inputs, the same ``rkpart run`` uses (:func:`rkpart.roles.pass_inputs`: masks
    all-valid, id grids and integer inputs their values, never noise); ``folder``: the plan's,
    for its pipeline description."""
    from rkpart.roles import pass_inputs

    return pass_inputs(plan, folder, seed)


def unconditional_inputs(inputs: Mapping[str, np.ndarray],
                         embeddings: Sequence[str] | None = None) -> tuple[dict[str, np.ndarray], list[str]]:
    """Inputs of the unconditional pass and the names that were changed.

    ``embeddings`` (the text and pooled embeddings of the plan's pipeline description) are
    replaced by zeros, like an empty prompt's embedding; without a description, the inputs whose
    name matches :data:`UNCOND_INPUT_PATTERN` (``encoder_hidden_states``, ``context``, ...).  If
    none, the unconditional pass reuses the conditional inputs unchanged (it then costs the same,
    which is what the profile measures).
    """
    names = sorted(n for n in inputs if (n in embeddings if embeddings is not None
                                         else UNCOND_INPUT_PATTERN.search(n)))
    out = dict(inputs)
    for n in names:
        out[n] = np.zeros_like(inputs[n])
    return out, names


@dataclass(frozen=True)
class ProfileOptions:
    """What to measure and how: ``rkpart profile PLAN``'s options, and what :func:`profile_plan` reads.

    ``plan`` is the plan's path (:func:`rkpart.profile.run.run_profile` loads it; recorded as the
    plan's file), ``output`` where ``run_profile`` writes the records; ``backend``, ``toolkit``,
    ``core_mask`` and ``threads`` choose the backend when ``profile_plan`` is given none.  The rest
    is documented on :func:`profile_plan`.
    """

    plan: str = ""
    backend: str = "ort"
    output: Path | None = None
    toolkit: str | None = None
    rounds: int = 3
    warmup: int = 1
    cfg: bool = True
    steps: int = 1
    residency: str = "per-stage"
    device_pattern: str | None = DEFAULT_DEVICE_PATTERN
    core_mask: str = "auto"
    sample_interval: float = 0.05
    seed: int = 0
    infer_repeat: int = 1
    threads: int = 0
    block: int | None = None
    baseline: bool = False
    model: str | Path | None = None
    snapshots: bool = True


def profile_plan(
    plan: Plan,
    folder: str | os.PathLike[str],
    opts: ProfileOptions = ProfileOptions(),
    backend: Backend | None = None,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    host_backend: Backend | None = None,
    progress: Progress | None = None,
) -> rec.ProfileRun:
    """Profile ``plan`` and return its records (stage lines, round lines, one summary line).

    Parameters
    ----------
    plan, folder
        The plan and the folder its stage files are relative to.
    opts
        What to measure (:class:`ProfileOptions`; ``opts.plan`` is recorded as the plan's file):

        ``rounds``, ``warmup``: measured rounds, and rounds run before them whose records carry
        ``"warmup": true`` and are left out of the summary.  ``cfg``, ``steps``: two passes per
        step (conditional, unconditional) or one; number of steps.  ``residency``:
        ``"per-stage"``, ``"resident"`` (see the module docstring) or ``"plan"``: what the plan
        chose per block (``auto`` strategy), ``per-stage`` where it chose nothing.  ``seed``:
        of the random inputs.  ``device_pattern``: regex of NPU device mapping pathnames, or
        ``None`` to skip device PSS.  ``sample_interval``: seconds between background memory
        samples (``0``: snapshots only).  ``infer_repeat``: inference calls per stage and pass;
        ``infer_s`` is their median and ``infer_calls_s`` lists them (see the module
        docstring).  ``block``: run and record only this block's stages.  ``baseline``,
        ``model``: also time the whole model every round (``model``: its path; default the
        plan's source model, found like ``rkpart run`` does); not with ``block``.
        ``snapshots``: take synchronous memory snapshots around every call (their cost is
        reported apart).
    backend
        Runs every non-host stage; default :func:`rkpart.runtime.get_backend` of
        ``opts.backend``.  Stages with ``device == "host"`` run on ``host_backend`` (default:
        ONNX Runtime).
    inputs
        Plan inputs of the conditional pass; default :func:`make_inputs` with ``opts.seed``.  The
        unconditional pass zeroes the text and pooled embeddings the plan's pipeline description
        names (without one, the inputs named like them: :func:`unconditional_inputs`).
    progress
        Called with one line of text per stage and pass.

    Returns
    -------
    rkpart.profile.records.ProfileRun
        The run's lines in run order; ``.to_json()`` gives the records of the JSON Lines file,
        valid against ``profile_record.schema.json``; ``.stage_records()`` what the cost model reads.

    Raises
    ------
    ValueError
        On bad arguments.
    SpecError
        When a stage reads a tensor no earlier stage or plan input provides, or ``block``
        names a block the plan has no stage of.
    UserError
        When ``baseline`` is asked and the whole model cannot be found.
    """
    rounds, warmup, cfg, steps, residency = opts.rounds, opts.warmup, opts.cfg, opts.steps, opts.residency
    infer_repeat, block, baseline, snapshots = opts.infer_repeat, opts.block, opts.baseline, opts.snapshots
    device_pattern, sample_interval = opts.device_pattern, opts.sample_interval
    if residency not in (*RESIDENCIES, "plan"):
        raise ValueError(f"residency must be one of {', '.join(RESIDENCIES)} or plan; got {residency!r}")
    if rounds < 1 or warmup < 0 or steps < 1 or infer_repeat < 1:
        raise ValueError(f"need rounds >= 1, warmup >= 0, steps >= 1, infer_repeat >= 1; "
                         f"got {rounds}, {warmup}, {steps}, {infer_repeat}")
    if baseline and block is not None:
        raise ValueError("the baseline times the whole model; it cannot be combined with one block")
    problem = stage_order_ok(plan.stages, plan.inputs)
    if problem:
        raise SpecError(f"plan cannot run in order: {problem}")
    folder = Path(folder)
    if backend is None:
        from rkpart.runtime import get_backend

        backend = get_backend(opts.backend, toolkit=opts.toolkit, core_mask=opts.core_mask, threads=opts.threads)
    if host_backend is None:
        from rkpart.runtime.ort import OrtBackend

        host_backend = OrtBackend()
    say = progress or (lambda _msg: None)
    per_stage = plan_residency(plan, Residency.PER_STAGE if residency == "plan" else residency)
    whole = _Baseline(find_model(plan, folder, opts.model), host_backend, infer_repeat) if baseline else None

    from rkpart.description import EMBEDDING_ROLES
    from rkpart.roles import plan_description

    described = plan_description(plan, folder)
    cond = dict(inputs) if inputs is not None else make_inputs(plan, opts.seed, folder)
    missing = [n for n in plan.inputs if n not in cond]
    if missing:
        raise SpecError(f"no value for plan input {missing[0]!r}")
    passes: dict[str, dict[str, np.ndarray]] = {COND: cond}
    uncond_names: list[str] = []
    if cfg:
        passes[UNCOND], uncond_names = unconditional_inputs(
            cond, None if described is None else [i.name for i in described.with_role(*EMBEDDING_ROLES)])
    stages = plan.stages
    if block is not None:
        stages, passes = _block_inputs(plan, folder, block, passes, uncond_names, host_backend, say)

    npu_policies = {per_stage[s.id] for s in stages if s.device != HOST}
    settings = {
        "backend": backend.name,
        "host_backend": host_backend.name,
        "rounds": rounds,
        "warmup": warmup,
        "cfg": cfg,
        "steps": steps,
        "residency": (Residency.PER_STAGE if Residency.PER_STAGE in npu_policies else Residency.RESIDENT).value,
        "residency_source": "plan" if residency == "plan" else "option",
        "seed": opts.seed,
        "inputs": "given" if inputs is not None else "random",
        "uncond_inputs": uncond_names,
        "device_pattern": device_pattern,
        "sample_interval_s": sample_interval,
        "infer_repeat": infer_repeat,
        "block": block,
        "baseline": baseline,
        "snapshots": snapshots,
    }
    header = rec.record_header(
        env=rec.collect_environment(backend, host_backend),
        settings=settings,
        plan=rec.plan_identity(plan, opts.plan or None),
    )

    records: list[JsonObject] = []
    total = warmup + rounds
    whole_s: list[float] = []
    try:
        # memory measured: sessions keep ORT's arena, so a snapshot sees a stage's intermediates
        measuring = measuring_memory() if snapshots or sample_interval > 0 else contextlib.nullcontext()
        with Sampler(sample_interval, device_pattern=device_pattern) as sampler, measuring:
            for r in range(total):
                is_warm = r < warmup
                label = f"round {r + 1}/{total}" + (" (warm-up)" if is_warm else "")
                runner = _RoundRunner(plan, folder, backend, host_backend, sampler, per_stage, say, label, opts,
                                      stages=stages)
                ops, round_info = runner.run(steps, passes)
                for op in ops:
                    records.append(_stage_record(header, op, r, is_warm, sampler))
                records.append(_round_record(header, r, is_warm, round_info, sampler))
                if whole is not None:
                    t = whole.round(steps, passes)
                    say(f"{label}: whole model {t:.4f}s")
                    if not is_warm:
                        whole_s.append(t)
    finally:
        if whole is not None:
            whole.close()
    summary = rec.summary_record(header, records)
    if whole is not None:
        summary["baseline"] = whole.summary(records, whole_s)
    records.append(summary)
    return rec.ProfileRun.from_json(records)


class _Baseline:
    """The whole model on ONNX Runtime, one session for the whole profile (``baseline=True``)."""

    def __init__(self, model: Path, host_backend: Backend, infer_repeat: int) -> None:
        from rkpart.runtime.ort import make_session

        self.model = model
        self.repeat = infer_repeat
        t0 = time.perf_counter()
        self.sess: Any = make_session(str(model), threads=int(getattr(host_backend, "threads", 0)))
        self.session_s = time.perf_counter() - t0
        self.names = [o.name for o in self.sess.get_outputs()]
        self.inputs = [i.name for i in self.sess.get_inputs()]

    def round(self, steps: int, passes: Mapping[str, Mapping[str, np.ndarray]]) -> float:
        """Seconds of one round: per pass the median of ``infer_repeat`` calls (as ``infer_s``)."""
        total = 0.0
        for _ in range(steps):
            for values in passes.values():
                feeds = {n: values[n] for n in self.inputs}
                calls = []
                for _ in range(self.repeat):
                    t0 = time.perf_counter()
                    self.sess.run(self.names, feeds)
                    calls.append(time.perf_counter() - t0)
                total += statistics.median(calls)
        return total

    def summary(self, records: list[JsonObject], whole_s: list[float]) -> JsonObject:
        infer: dict[int, float] = {}
        net: dict[int, float] = {}
        for r in records:
            if r["warmup"]:
                continue
            if r["record"] == "stage":
                infer[r["round"]] = infer.get(r["round"], 0.0) + (r["timings"]["infer_s"] or 0.0)
            elif r["record"] == "round":
                net[r["round"]] = r["measurement"]["wall_minus_snapshots_s"]
        whole = rec.spread(whole_s)
        plan_infer = rec.spread(list(infer.values()))
        plan_net = rec.spread(list(net.values()))

        def ratio(a: JsonObject) -> float | None:
            return a["median"] / whole["median"] if a["median"] is not None and whole["median"] else None

        return {
            "model": str(self.model),
            "session_s": self.session_s,
            "whole_s": whole,
            "plan_infer_s": plan_infer,
            "plan_net_s": plan_net,
            "infer_ratio": ratio(plan_infer),
            "net_ratio": ratio(plan_net),
        }

    def close(self) -> None:
        self.sess = None


def _block_inputs(
    plan: Plan,
    folder: Path,
    block: int,
    passes: Mapping[str, dict[str, np.ndarray]],
    uncond_names: list[str],
    host_backend: Backend,
    say: Progress,
) -> tuple[tuple[Stage, ...], dict[str, dict[str, np.ndarray]]]:
    """Block ``block``'s stages and, per pass, every value they read (one run of the stages before)."""
    idx = [i for i, s in enumerate(plan.stages) if s.block == block or block in s.blocks]
    if not idx:
        known = sorted({b for s in plan.stages for b in (*s.blocks, *(() if s.block is None else (s.block,)))})
        raise SpecError(f"plan has no stage of block {block} (blocks: {', '.join(map(str, known)) or 'none'})")
    span = plan.stages[idx[0]: idx[-1] + 1]
    before = plan.stages[: idx[0]]
    produced: set[str] = set()
    needed: list[str] = []
    for s in span:
        needed += [n for n in s.inputs if n not in produced and n not in needed]
        produced.update(s.outputs)
    reads_uncond = any(n in uncond_names for s in before for n in s.inputs)
    out: dict[str, dict[str, np.ndarray]] = {}
    cached: dict[str, np.ndarray] | None = None
    for p, values in passes.items():
        if cached is None or (p == UNCOND and reads_uncond):
            t0 = time.perf_counter()
            # ORT for every stage, each released after use: the inputs, not the speed, matter here
            with PlanExecutor(plan, folder, backend=host_backend, host=host_backend, residency=Residency.PER_STAGE,
                              stages=before) as ex:
                cached = ex.run(values, keep=True)
            say(f"block {block}: inputs from {len(before)} preceding stage(s) ({p}) in "
                f"{time.perf_counter() - t0:.2f}s")
        env = {**cached, **{n: values[n] for n in values if n in needed}}
        lacking = [n for n in needed if n not in env]
        if lacking:
            raise SpecError(f"block {block} reads {lacking[0]!r}, which no stage before it produces")
        out[p] = {n: env[n] for n in needed}
    return tuple(span), out


class _RoundRunner:
    """Executes one round; kept as an object so the bookkeeping is not a dozen locals."""

    def __init__(
        self,
        plan: Plan,
        folder: Path,
        backend: Backend,
        host_backend: Backend,
        sampler: Sampler,
        residency: str | Mapping[str, Residency],
        say: Progress,
        label: str,
        opts: ProfileOptions = ProfileOptions(),
        *,
        stages: tuple[Stage, ...] | None = None,
    ) -> None:
        """``opts``: its ``infer_repeat`` and ``snapshots`` are read."""
        self.plan = plan
        self.folder = folder
        self.backend = backend
        self.host_backend = host_backend
        self.sampler = sampler
        self.stages = plan.stages if stages is None else stages
        self.residency = (plan_residency(plan, residency) if isinstance(residency, str) else dict(residency))
        self.say = say
        self.label = label
        self.infer_repeat = opts.infer_repeat
        self.snapshots = opts.snapshots
        self.last: MemorySample | None = None
        self.live: dict[str, StageRunner] = {}

    def _is_host(self, stage: Stage) -> bool:
        # Host stages always run on the host backend, even when the backend under test
        # could run them, so that "host" means the same thing in every profile.
        return stage.device == HOST

    def _resident(self, stage: Stage) -> bool:
        return self._is_host(stage) or self.residency.get(stage.id) != Residency.PER_STAGE

    def _backend_for(self, stage: Stage) -> Backend:
        return self.host_backend if self._is_host(stage) else self.backend

    def _snap(self, op: _Op, t_call: float) -> MemorySample | None:
        if not self.snapshots:
            op.spans.append((t_call, time.perf_counter()))
            return None
        s = self.sampler.snapshot()
        op.snapshot_s += s.cost_s
        op.snapshots += 1
        op.spans.append((t_call, s.t + s.cost_s))
        self.last = s
        return s

    def _call(self, op: _Op, what: str, fn: Callable[[], Any], *, snap: bool) -> Any:
        if op.pss_before_kib is None and self.last is not None:
            op.pss_before_kib = self.last.pss_kib
        c0 = time.process_time()
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        cpu = time.process_time() - c0
        if what == "infer":
            op.infer_cpu_s = (op.infer_cpu_s or 0.0) + cpu
        else:
            op.cpu_s[what] = op.cpu_s.get(what, 0.0) + cpu
        setattr(op, f"{what}_s", (getattr(op, f"{what}_s") or 0.0) + (t1 - t0))
        if snap:
            s = self._snap(op, t0)
            if what == "infer" and s is not None:
                op.pss_after_infer_kib = s.pss_kib
                op.device_pss_kib = s.device_pss_kib
        else:
            op.spans.append((t0, t1))
        return out

    def _infer(self, op: _Op, runner: StageRunner, values: Feeds) -> Feeds:
        """``infer_repeat`` back-to-back calls; ``infer_s`` is their median (one call: itself)."""
        if self.infer_repeat == 1:
            one: Feeds = self._call(op, "infer", lambda: runner.infer(values), snap=True)
            return one
        if op.pss_before_kib is None and self.last is not None:
            op.pss_before_kib = self.last.pss_kib
        t_first = time.perf_counter()
        out: Feeds = {}
        for _ in range(self.infer_repeat):
            t0 = time.perf_counter()
            out = runner.infer(values)
            op.infer_calls_s.append(time.perf_counter() - t0)
        op.infer_s = (op.infer_s or 0.0) + statistics.median(op.infer_calls_s)
        # one memory snapshot after the last call; the span covers all K calls
        s = self._snap(op, t_first)
        if s is not None:
            op.pss_after_infer_kib = s.pss_kib
            op.device_pss_kib = s.device_pss_kib
        return out

    def _setup(self, op: _Op) -> StageRunner:
        runner = self._backend_for(op.stage).runner(op.stage, self.folder)
        try:
            self._call(op, "load", runner.load, snap=False)
            self._call(op, "init", runner.init, snap=True)
        except BaseException:
            runner.release()
            raise
        return runner

    def run(self, steps: int, passes: Mapping[str, Mapping[str, np.ndarray]]) -> tuple[list[_Op], JsonObject]:
        t_start = time.perf_counter()
        c_start = time.process_time()
        snap0_s, snaps0, thread0, ticks0 = (
            self.sampler.snapshot_s,
            self.sampler.snapshots,
            self.sampler.thread_s,
            self.sampler.ticks,
        )
        if self.snapshots:
            self.last = self.sampler.snapshot()
        ops: dict[tuple[str, int, str], _Op] = {}
        order = [(step, p) for step in range(steps) for p in passes]
        for step, p in order:
            for stage in self.stages:
                ops[(stage.id, step, p)] = _Op(
                    stage, step, p, self._backend_for(stage).name,
                    Residency.RESIDENT if self._resident(stage) else Residency.PER_STAGE)
        first, last = order[0], order[-1]
        try:
            for stage in self.stages:
                if not self._is_host(stage) and self._resident(stage):
                    self.live[stage.id] = self._setup(ops[(stage.id, *first)])
            for step, p in order:
                values: dict[str, np.ndarray] = dict(passes[p])
                for stage in self.stages:
                    op = ops[(stage.id, step, p)]
                    values.update(self._run_stage(op, values))
                    self.say(f"{self.label} step {step} {p}: {stage.id} ({op.executor}) {_fmt(op)}")
        finally:
            # Release everything still alive even when a stage failed, so a failed profile
            # does not leave NPU contexts behind.
            held = list(self.live.items())
            self.live.clear()
            for sid, runner in held:
                self._call(ops[(sid, *last)], "release", runner.release, snap=False)
        if held:
            # One reading after the end-of-round releases, charged to the last released stage.
            self._snap(ops[(held[-1][0], *last)], time.perf_counter())
        t_end = time.perf_counter()
        info = {
            "t0": t_start,
            "t1": t_end,
            "cpu_s": time.process_time() - c_start,
            "snapshot_s": self.sampler.snapshot_s - snap0_s,
            "snapshots": self.sampler.snapshots - snaps0,
            "sampler_s": self.sampler.thread_s - thread0,
            "ticks": self.sampler.ticks - ticks0,
        }
        return list(ops.values()), info

    def _run_stage(self, op: _Op, values: Feeds) -> Feeds:
        stage = op.stage
        if self._resident(stage):
            live = self.live.get(stage.id)
            if live is None:  # host stages are set up at first use
                live = self.live[stage.id] = self._setup(op)
            return self._infer(op, live, values)
        runner = self._setup(op)
        try:
            out = self._infer(op, runner, values)
        except BaseException:
            runner.release()
            raise
        self._call(op, "release", runner.release, snap=True)
        if self.snapshots:
            # a memory profile: the next stage's peak is its own, not the memory this one's
            # session left to the process (rkpart.runtime.malloc keeps it for reuse)
            give_back()
        return out


def _fmt(op: _Op) -> str:
    parts = [f"{k} {v:.4f}s" for k, v in (("load", op.load_s), ("init", op.init_s),
                                           ("infer", op.infer_s), ("release", op.release_s)) if v is not None]
    return ", ".join(parts)


def _stage_record(header: JsonMap, op: _Op, rnd: int, warm: bool, sampler: Sampler) -> JsonObject:
    peaks = sampler.peaks(op.spans)
    timings: JsonObject = {
        "load_s": op.load_s,
        "init_s": op.init_s,
        "infer_s": op.infer_s,
        "release_s": op.release_s,
        "wall_s": sum(b - a for a, b in op.spans),
    }
    if op.infer_cpu_s is not None:
        timings["infer_cpu_s"] = op.infer_cpu_s
    for what, cpu in sorted(op.cpu_s.items()):
        timings[f"{what}_cpu_s"] = cpu
    if op.infer_calls_s:
        timings["infer_calls_s"] = list(op.infer_calls_s)
        timings["infer_spread_s"] = max(op.infer_calls_s) - min(op.infer_calls_s)
    return rec.stage_record(
        header,
        stage=op.stage,
        executor=op.executor,
        round_index=rnd,
        warmup=warm,
        step=op.step,
        pass_name=op.pass_name,
        timings=timings,
        memory={
            "pss_before_kib": op.pss_before_kib,
            "pss_peak_kib": peaks.pss_kib,
            "pss_after_infer_kib": op.pss_after_infer_kib,
            "device_pss_kib": op.device_pss_kib,
            "device_pss_peak_kib": peaks.device_pss_kib,
            "swap_new_kib": sampler.new_swap_kib(peaks.swap_used_kib),
            "samples": peaks.samples,
        },
        measurement={"snapshot_s": op.snapshot_s, "snapshots": op.snapshots},
    ) | {"residency": op.residency.value}


def _round_record(
    header: JsonMap, rnd: int, warm: bool, info: JsonMap, sampler: Sampler
) -> JsonObject:
    peaks = sampler.peaks([(info["t0"], info["t1"])])
    wall = info["t1"] - info["t0"]
    return rec.round_record(
        header,
        round_index=rnd,
        warmup=warm,
        wall_s=wall,
        cpu_s=info.get("cpu_s"),
        memory={
            "pss_peak_kib": peaks.pss_kib,
            "device_pss_peak_kib": peaks.device_pss_kib,
            "swap_new_kib": sampler.new_swap_kib(peaks.swap_used_kib),
            "samples": peaks.samples,
        },
        measurement={
            "snapshot_s": info["snapshot_s"],
            "snapshots": info["snapshots"],
            "sampler_s": info["sampler_s"],
            "ticks": info["ticks"],
            "wall_minus_snapshots_s": wall - info["snapshot_s"],
        },
    )
