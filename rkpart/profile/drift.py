"""Drift through the whole model: a denoising loop on ONNX Runtime vs on the NPU backend.

``rkpart drift PLAN [PLAN ...] --steps N --cfg`` runs a simple flow-matching sampler (Euler,
``sigma`` from 1 to 0 in ``N`` equal steps, optionally shifted, fixed seed) through each plan twice: once with every
stage on ONNX Runtime (the reference, in the model's own precision) and once with the NPU
stages on the backend (the rknn-toolkit2 simulator).  Each run follows its *own* trajectory,
so errors accumulate over blocks and steps the way they would on the board.  Per step it
reports cosine, max-abs and MSE of the latent after the Euler update, and per block the same
metrics of the block's NPU stage outputs (the cond pass; with CFG the uncond pass too).

The roles of the plan's inputs come from its pipeline description (``pipeline.json``), else
from flags, else from the shape rule, which says it guessed and refuses a tie
(:mod:`rkpart.roles`).  The loop feeds what :func:`rkpart.roles.loop_inputs` gives: conditioning
from ``--embeds`` or seeded normal values (zeros for the unconditional CFG pass), masks and id
grids their pipeline values (all-valid masks), never noise.  A guidance-distilled model runs one
pass per step with the guidance fed to its guidance input.

A row with NaN/Inf says why: :class:`NonFiniteWatch` finds the first stage output that is not
finite and the inputs that stage read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.description import PipelineDescription
from rkpart.plan.plan import Plan
from rkpart.roles import NO_FLAGS, InputRoles, LoopInputs, RoleFlags, loop_inputs, resolve_roles
from rkpart.runtime.base import Backend
from rkpart.runtime.board_runner import flow_sigmas
from rkpart.runtime.executor import PlanExecutor
from rkpart.runtime.rknn_sim import RknnSimBackend
from rkpart.types import JsonObject
from rkpart.validation.metrics import compare

LATENT = "latent"  # the ``block`` column of a per-step latent row


@dataclass(frozen=True)
class DriftRow:
    """One comparison: plan label, step (0-based), pass (``cond``/``uncond``/``latent``), block."""

    plan: str
    step: int
    kind: str
    block: int | None
    cosine: float
    max_abs: float
    mse: float
    #: NaN/Inf values on either side; when non-zero the metrics above are NaN (rkpart.validation.metrics)
    nonfinite: int = 0
    #: why a row holds NaN/Inf: the first stage output that was not finite and the inputs it read
    cause: str | None = None

    def to_json(self) -> JsonObject:
        return {"plan": self.plan, "step": self.step, "kind": self.kind, "block": self.block,
                "cosine": self.cosine, "max_abs": self.max_abs, "mse": self.mse, "nonfinite": self.nonfinite,
                **({"cause": self.cause} if self.cause is not None else {})}


def roles(plan: Plan, description: PipelineDescription | None = None, flags: RoleFlags = NO_FLAGS,
          progress: Callable[[str], None] | None = None) -> InputRoles:
    """The roles of ``plan``'s inputs (:func:`rkpart.roles.resolve_roles`: the description, the
    flags, or the shape rule, which refuses a tie)."""
    return resolve_roles(plan, description, flags, progress=progress)


def block_outputs(plan: Plan) -> dict[str, int]:
    """NPU stage id -> the (last) block it computes: a block's rows compare what its NPU
    stages output (for a fused plan, the block's output; for split, attention, cross-attention
    and FFN outputs together), with everything before them drifted as well."""
    return {s.id: (s.blocks[-1] if s.blocks else s.block) for s in plan.npu_stages  # type: ignore[misc]
            if s.blocks or s.block is not None}


@dataclass
class Trajectory:
    latents: list[np.ndarray]  # after each step
    blocks: dict[tuple[int, str, int], dict[str, np.ndarray]]  # (step, pass, block) -> outputs


#: one step of a run: the latent after the Euler update, and per (pass, block) the block's outputs
StepResult = tuple[np.ndarray, dict[tuple[str, int], dict[str, np.ndarray]]]


class NonFiniteWatch:
    """Finds the first stage output of a run that holds NaN/Inf, and what that stage read.

    Every tensor of the current pass is summarised (dtype, NaN/Inf count, range) as it is made,
    the model inputs first, so the stage that first gives a non-finite value can name its inputs
    and their ranges: an all-zero mask, an input already NaN, or a range that overflows fp16."""

    def __init__(self, label: str, plan: Plan, roles: InputRoles) -> None:
        self.label, self.plan, self.roles = label, plan, roles
        self.first: str | None = None
        self._seen: list[dict[str, tuple[str, int, float, float]]] = []

    @staticmethod
    def _summary(a: np.ndarray) -> tuple[str, int, float, float]:
        a = np.asarray(a)
        if a.size == 0 or a.dtype.kind not in "biuf":
            return str(a.dtype), 0, 0.0, 0.0
        if a.dtype.kind == "f":
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            fin = a[np.isfinite(a)] if bad else a
            lo, hi = (float(fin.min()), float(fin.max())) if fin.size else (math.nan, math.nan)
            return str(a.dtype), bad, lo, hi
        return str(a.dtype), 0, float(a.min()), float(a.max())

    def start_step(self, feeds: Sequence[dict[str, np.ndarray]]) -> None:
        """The model inputs of every pass of the step about to run."""
        self._seen = [] if self.first is not None else [{n: self._summary(v) for n, v in f.items()} for f in feeds]

    def stage(self, step: int, p: int, kind: str, sid: str, outs: dict[str, np.ndarray]) -> None:
        if self.first is not None:
            return
        seen = self._seen[p]
        got = {n: self._summary(v) for n, v in outs.items()}
        bad = [(n, s) for n, s in got.items() if s[1]]
        if bad:
            stage = next(s for s in self.plan.stages if s.id == sid)
            reads = []
            for n in stage.inputs:
                dt, nf, lo, hi = seen.get(n, ("?", 0, math.nan, math.nan))
                role = self.roles.roles.get(n)
                what = f"{n}{f' ({role})' if role else ''} {dt} "
                what += f"{nf} NaN/Inf" if nf else f"[{lo:.4g}, {hi:.4g}]"
                if role == "attention_mask" and lo == hi == 0:
                    what += " all masked"
                reads.append(what)
            name, (_dt, nf, _lo, _hi) = bad[0]
            self.first = (f"{self.label}, step {step}, {kind} pass: stage {sid} output {name!r} is the first with "
                          f"NaN/Inf ({nf} values), reading {'; '.join(reads)}")
        seen.update(got)


def denoise_steps(plan: Plan, folder: Path, *, backend: Backend | None, steps: int, cfg: bool,
                  guidance: float | None = None, seed: int = 0, shift: float = 1.0,
                  inputs: LoopInputs | None = None,
                  watch: NonFiniteWatch | None = None) -> Generator[StepResult, None, None]:
    """The flow-matching Euler loop through ``plan`` (``backend`` for NPU stages; ``None``: ORT),
    one step at a time: only the current step's block outputs are held.

    ``inputs`` is what each input is fed (:func:`rkpart.roles.loop_inputs`: the roles, the
    conditioning of ``--embeds``, the timestep scale); default: drawn from ``seed`` with the roles
    of the plan's description, else the shape rule.  ``guidance`` defaults to the description's,
    else 4.0.  ``watch`` hears every stage output.

    The bundle runner's ``Runner.denoise`` is the same loop (same sigmas, seeding and CFG
    combine; ``rkpart bundle`` records the roles and fixed inputs in its manifest)."""
    lp = _loop_inputs(plan, folder, seed, guidance) if inputs is None else inputs
    g = lp.guidance_scale if guidance is None else guidance
    x = lp.x0.copy()
    ends = block_outputs(plan)
    sigmas = flow_sigmas(steps, shift)
    kinds = lp.kinds(cfg)
    # the ORT reference loads one NPU stage at a time (each serves every pass of a step back to
    # back): resident, a full-size plan's sessions hold several times its weights (OOM at 24 GiB
    # with 28 blocks).  The simulator's pool bounds its own memory.
    with PlanExecutor(plan, folder, backend=backend, residency="per-stage" if backend is None else "resident") as ex:
        for i in range(steps):
            blocks: dict[tuple[str, int], dict[str, np.ndarray]] = {}
            feeds = lp.feeds(x, float(sigmas[i]), g, cfg)
            if watch is not None:
                watch.start_step(feeds)

            def on_stage(p: int, _i: int, sid: str, outs: dict[str, np.ndarray], step: int = i,
                         blocks: dict[tuple[str, int], dict[str, np.ndarray]] = blocks) -> None:
                if watch is not None:
                    watch.stage(step, p, kinds[p], sid, outs)
                if sid in ends:
                    blocks.setdefault((kinds[p], ends[sid]), {}).update({k: np.array(v) for k, v in outs.items()})

            # CFG's two passes run stage-major (each stage serves both back to back): a stage the
            # simulator had to evict is rebuilt once per step, not once per pass
            outs = ex.run_passes(feeds, on_stage=on_stage)
            v = lp.velocity(outs, g, cfg)
            with np.errstate(over="ignore", invalid="ignore"):
                x = (x.astype(np.float32) + (sigmas[i + 1] - sigmas[i]) * v).astype(lp.x0.dtype)
            yield x.copy(), blocks


def _loop_inputs(plan: Plan, folder: Path, seed: int, guidance: float | None) -> LoopInputs:
    """The loop's inputs drawn from ``seed``, with the roles of the plan's description, else the shape rule."""
    from rkpart.roles import plan_description

    return loop_inputs(plan, resolve_roles(plan, plan_description(plan, folder)), seed=seed, guidance=guidance)


def denoise(plan: Plan, folder: Path, *, backend: Backend | None, steps: int, cfg: bool,
            guidance: float | None = None, seed: int = 0, shift: float = 1.0,
            inputs: LoopInputs | None = None) -> Trajectory:
    """:func:`denoise_steps` run to the end, every step kept."""
    traj = Trajectory([], {})
    for step, (x, blocks) in enumerate(denoise_steps(plan, folder, backend=backend, steps=steps, cfg=cfg,
                                                     guidance=guidance, seed=seed, shift=shift, inputs=inputs)):
        traj.latents.append(x)
        traj.blocks.update({(step, kind, block): outs for (kind, block), outs in blocks.items()})
    return traj


def effective_cfg(roles: InputRoles, cfg: bool | None, say: Callable[[str], None] | None = None) -> bool:
    """Whether a step runs the unconditional pass too: ``cfg`` when given, else as the pipeline
    does (its description's ``cfg.mode``; without one, CFG).  A guidance-distilled or CFG-less
    pipeline has no unconditional pass: ``--cfg`` on one is said and ignored."""
    from rkpart.roles import loop_mode

    mode = loop_mode(roles)
    if mode in ("distilled", "none"):
        if cfg and say is not None:
            say(f"the pipeline's guidance is {mode}: one pass per step, no unconditional pass (--cfg ignored)")
        return False
    return True if cfg is None else cfg


def check_roles(plans: Sequence[tuple[str, Plan, Path]], flags: RoleFlags = NO_FLAGS,
                embeds: str | Path | None = None, cfg: bool | None = True) -> None:
    """Refuse, before any run, a plan whose roles cannot be told or an ``--embeds`` file that
    does not fit it (what :func:`drift` would refuse after setting up its backend)."""
    from rkpart.roles import load_embeds, plan_description

    for _label, plan, folder in plans:
        r = resolve_roles(plan, plan_description(plan, folder), flags)
        if embeds is not None:
            load_embeds(embeds, r, plan, cfg=effective_cfg(r, cfg))
        loop_inputs(plan, r)  # ids without values, a latent the loop cannot step


def _nonfinite(m: Any) -> int:
    return int(m.nan + m.inf + m.ref_nonfinite)


def nonfinite_rows(rows: Sequence[DriftRow]) -> list[DriftRow]:
    """The rows that hold NaN/Inf values (a drift run with any is a failed run, not zero drift)."""
    return [r for r in rows if r.nonfinite or not (math.isfinite(r.cosine) and math.isfinite(r.mse)
                                                   and math.isfinite(r.max_abs))]


def compare_step(label: str, step: int, ref: StepResult, got: StepResult) -> list[DriftRow]:
    """One step: per pass and block the block outputs (all tensors concatenated), then the latent."""
    rows = []
    for kind, block in sorted(ref[1]):
        ga, ra = got[1][(kind, block)], ref[1][(kind, block)]
        m = compare(np.concatenate([ga[n].ravel() for n in sorted(ra)]),
                    np.concatenate([ra[n].ravel() for n in sorted(ra)]))
        rows.append(DriftRow(label, step, kind, block, m.cosine, m.max_abs, m.mse, _nonfinite(m)))
    m = compare(got[0], ref[0])
    rows.append(DriftRow(label, step, LATENT, None, m.cosine, m.max_abs, m.mse, _nonfinite(m)))
    return rows


def compare_trajectories(label: str, ref: Trajectory, got: Trajectory) -> list[DriftRow]:
    """:func:`compare_step` for every step of two whole trajectories."""
    def step_of(t: Trajectory, step: int) -> StepResult:
        return t.latents[step], {(k, b): o for (s, k, b), o in t.blocks.items() if s == step}

    return [row for step in range(len(ref.latents))
            for row in compare_step(label, step, step_of(ref, step), step_of(got, step))]


def drift(plans: Sequence[tuple[str, Plan, Path]], backend: Backend, *, steps: int, cfg: bool | None = True,
          guidance: float | None = None, seed: int = 0, progress: Callable[[str], None] | None = None,
          shift: float = 1.0, flags: RoleFlags = NO_FLAGS, embeds: str | Path | None = None) -> list[DriftRow]:
    """Reference (ORT) vs ``backend`` trajectories of every ``(label, plan, folder)``.

    The two runs of a plan go in lockstep, step by step, and each step is compared and dropped:
    memory holds one step's block outputs, not whole trajectories (at full size those are GBs
    per run, and holding them next to the simulator's workers was OOM-killed at 24 GiB).

    Roles come from each plan's description, else ``flags``, else the shape rule; ``embeds`` is
    an ``--embeds`` ``.npz`` (:func:`rkpart.roles.load_embeds`).  ``cfg`` ``None``: as the
    pipeline runs (CFG unless its guidance is distilled or it has none).  A row with NaN/Inf
    carries its ``cause``.
    """
    from rkpart.roles import load_embeds, plan_description

    say = progress or (lambda _m: None)
    rows: list[DriftRow] = []
    for label, plan, folder in plans:
        def said(m: str, lb: str = label) -> None:
            say(f"{lb}: {m}")

        r = resolve_roles(plan, plan_description(plan, folder), flags, progress=said)
        use_cfg = effective_cfg(r, cfg, say=said)
        pair = load_embeds(embeds, r, plan, cfg=use_cfg) if embeds is not None else None
        lp = loop_inputs(plan, r, seed=seed, embeds=pair, guidance=guidance)
        say(f"{label}: {steps} step(s), {'/'.join(lp.kinds(use_cfg))} pass(es) per step ({lp.mode}), "
            f"conditioning from {lp.conditioning}, reference on ONNX Runtime in lockstep with the NPU stages on "
            f"{backend.name}")
        pool = backend.pool if isinstance(backend, RknnSimBackend) else None
        if pool is not None:
            pool.reset_stats()
        kw: JsonObject = {"steps": steps, "cfg": use_cfg, "guidance": guidance, "seed": seed, "shift": shift,
                              "inputs": lp}
        ref_watch = NonFiniteWatch("ONNX Runtime reference", plan, r)
        got_watch = NonFiniteWatch(f"NPU stages on {backend.name}", plan, r)
        ref_run = denoise_steps(plan, folder, backend=None, watch=ref_watch, **kw)
        got_run = denoise_steps(plan, folder, backend=backend, watch=got_watch, **kw)
        try:
            for step in range(steps):
                ref = next(ref_run)
                got = next(got_run)
                new = compare_step(label, step, ref, got)
                cause = ref_watch.first or got_watch.first
                rows += [dataclasses.replace(row, cause=cause) if cause and row in nonfinite_rows([row]) else row
                         for row in new]
                say(f"{label}: step {step + 1}/{steps} compared")
                del ref, got
        finally:
            ref_run.close()
            got_run.close()
            backend.close()  # the simulator's workers: the next plan starts from a clean slate
        if pool is not None:
            stats = pool.stats
            say(f"{label}: simulator workers {stats['workers']}, builds {stats['builds']} "
                f"(rebuilds {stats['rebuilds']} after {stats['evictions']} evictions), "
                f"peak worker RSS {stats['peak_rss'] / 2**20:.0f} MiB (budget {(pool.budget or 0) / 2**20:.0f} MiB, "
                f"largest stage {pool.learned[1] / 2**20:.0f} MiB)")
    return rows


def render(rows: Sequence[DriftRow], *, blocks: bool = True) -> str:
    """The drift table: one line per row (block rows only with ``blocks``)."""
    lines = [f"{'plan':<24} {'step':>4} {'pass':<7} {'block':>5} {'cosine':>10} {'max abs':>10} {'MSE':>10} "
             f"{'NaN/Inf':>8}"]
    for r in rows:
        if r.kind != LATENT and not blocks:
            continue
        b = "" if r.block is None else str(r.block)
        lines.append(f"{r.plan[:24]:<24} {r.step:>4} {r.kind:<7} {b:>5} {r.cosine:>10.6f} {r.max_abs:>10.3g} "
                     f"{r.mse:>10.3g} {r.nonfinite:>8}")
    return "\n".join(lines)


__all__ = ["LATENT", "DriftRow", "NonFiniteWatch", "Trajectory", "block_outputs", "check_roles",
           "compare_trajectories", "denoise",
           "denoise_steps", "drift", "effective_cfg", "nonfinite_rows", "render", "roles"]
