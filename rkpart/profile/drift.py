"""Drift through the whole model: a denoising loop on ONNX Runtime vs on the NPU backend.

``rkpart drift PLAN [PLAN ...] --steps N --cfg`` runs a simple flow-matching sampler (Euler,
``sigma`` from 1 to 0 in ``N`` equal steps, optionally shifted, fixed seed) through each plan twice: once with every
stage on ONNX Runtime (the reference, in the model's own precision) and once with the NPU
stages on the backend (the rknn-toolkit2 simulator).  Each run follows its *own* trajectory,
so errors accumulate over blocks and steps the way they would on the board.  Per step it
reports cosine, max-abs and MSE of the latent after the Euler update, and per block the same
metrics of the block's NPU stage outputs (the cond pass; with CFG the uncond pass too).

The plan's inputs are recognised by shape: the latent is the input shaped like the model's
output, the timestep the smallest input, everything else conditioning (seeded normal values;
zeros for the unconditional CFG pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.errors import SpecError
from rkpart.plan.plan import Plan
from rkpart.runtime.base import Backend
from rkpart.runtime.board_runner import flow_sigmas
from rkpart.runtime.executor import PlanExecutor
from rkpart.runtime.rknn_sim import RknnSimBackend
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

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan, "step": self.step, "kind": self.kind, "block": self.block,
                "cosine": self.cosine, "max_abs": self.max_abs, "mse": self.mse, "nonfinite": self.nonfinite}


@dataclass(frozen=True)
class Roles:
    """Which plan input is the latent, which the timestep, which conditioning."""

    latent: str
    output: str
    timestep: str
    context: tuple[str, ...]


def roles(plan: Plan) -> Roles:
    """Recognise the latent / timestep / conditioning inputs by shape (see the module doc)."""
    if len(plan.outputs) != 1:
        raise SpecError(f"drift needs a model with one output (the velocity); this one has {len(plan.outputs)}")
    out = plan.tensors[plan.outputs[0]]
    latents = [t for t in plan.inputs if plan.tensors[t].shape == out.shape]
    if not latents:
        raise SpecError(f"no model input has the output's shape {list(out.shape)}: cannot tell the latent")
    rest = [t for t in plan.inputs if t != latents[0]]
    if not rest:
        raise SpecError("no timestep input besides the latent")
    timestep = min(rest, key=lambda t: (math.prod(plan.tensors[t].shape), t))
    return Roles(latents[0], plan.outputs[0], timestep, tuple(t for t in rest if t != timestep))


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


def denoise_steps(plan: Plan, folder: Path, *, backend: Backend | None, steps: int, cfg: bool,
                  guidance: float = 4.0, seed: int = 0, timestep_scale: float = 1000.0,
                  shift: float = 1.0) -> Generator[StepResult, None, None]:
    """The flow-matching Euler loop through ``plan`` (``backend`` for NPU stages; ``None``: ORT),
    one step at a time: only the current step's block outputs are held.

    The bundle runner's ``Runner.denoise`` is the same loop (same sigmas, seeding and CFG
    combine; ``rkpart bundle`` records the roles of :func:`roles` in its manifest)."""
    r = roles(plan)
    rng = np.random.default_rng(seed)
    lat = plan.tensors[r.latent]
    x = rng.standard_normal(lat.shape).astype(lat.dtype)
    cond = {t: rng.standard_normal(plan.tensors[t].shape).astype(plan.tensors[t].dtype) for t in r.context}
    uncond = {t: np.zeros_like(v) for t, v in cond.items()}
    ts = plan.tensors[r.timestep]
    ends = block_outputs(plan)
    sigmas = flow_sigmas(steps, shift)
    # the ORT reference loads one NPU stage at a time (each serves every pass of a step back to
    # back): resident, a full-size plan's sessions hold several times its weights (OOM at 24 GiB
    # with 28 blocks).  The simulator's pool bounds its own memory.
    with PlanExecutor(plan, folder, backend=backend, residency="per-stage" if backend is None else "resident") as ex:
        for i in range(steps):
            t = np.full(ts.shape, sigmas[i] * timestep_scale, dtype=ts.dtype)
            kinds = ("cond", "uncond") if cfg else ("cond",)
            blocks: dict[tuple[str, int], dict[str, np.ndarray]] = {}

            def on_stage(p: int, _i: int, sid: str, outs: dict[str, np.ndarray],
                         kinds: tuple[str, ...] = kinds,
                         blocks: dict[tuple[str, int], dict[str, np.ndarray]] = blocks) -> None:
                if sid in ends:
                    blocks.setdefault((kinds[p], ends[sid]), {}).update({k: np.array(v) for k, v in outs.items()})

            # CFG's two passes run stage-major (each stage serves both back to back): a stage the
            # simulator had to evict is rebuilt once per step, not once per pass
            feeds = [{r.latent: x, r.timestep: t, **(cond if k == "cond" else uncond)} for k in kinds]
            outs = ex.run_passes(feeds, on_stage=on_stage)
            v = np.asarray(outs[0][r.output], dtype=np.float32)
            if cfg:
                vu = np.asarray(outs[1][r.output], dtype=np.float32)
                v = vu + guidance * (v - vu)
            x = (x.astype(np.float32) + (sigmas[i + 1] - sigmas[i]) * v).astype(lat.dtype)
            yield x.copy(), blocks


def denoise(plan: Plan, folder: Path, *, backend: Backend | None, steps: int, cfg: bool, guidance: float = 4.0,
            seed: int = 0, timestep_scale: float = 1000.0, shift: float = 1.0) -> Trajectory:
    """:func:`denoise_steps` run to the end, every step kept."""
    traj = Trajectory([], {})
    for step, (x, blocks) in enumerate(denoise_steps(plan, folder, backend=backend, steps=steps, cfg=cfg,
                                                     guidance=guidance, seed=seed, timestep_scale=timestep_scale,
                                                     shift=shift)):
        traj.latents.append(x)
        traj.blocks.update({(step, kind, block): outs for (kind, block), outs in blocks.items()})
    return traj


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


def drift(plans: Sequence[tuple[str, Plan, Path]], backend: Backend, *, steps: int, cfg: bool,
          guidance: float = 4.0, seed: int = 0, progress: Callable[[str], None] | None = None,
          shift: float = 1.0) -> list[DriftRow]:
    """Reference (ORT) vs ``backend`` trajectories of every ``(label, plan, folder)``.

    The two runs of a plan go in lockstep, step by step, and each step is compared and dropped:
    memory holds one step's block outputs, not whole trajectories (at full size those are GBs
    per run, and holding them next to the simulator's workers was OOM-killed at 24 GiB).
    """
    say = progress or (lambda _m: None)
    rows: list[DriftRow] = []
    for label, plan, folder in plans:
        say(f"{label}: {steps} step(s){' with CFG' if cfg else ''}, reference on ONNX Runtime in lockstep "
            f"with the NPU stages on {backend.name}")
        pool = backend.pool if isinstance(backend, RknnSimBackend) else None
        if pool is not None:
            pool.reset_stats()
        kw: dict[str, Any] = {"steps": steps, "cfg": cfg, "guidance": guidance, "seed": seed, "shift": shift}
        ref_run = denoise_steps(plan, folder, backend=None, **kw)
        got_run = denoise_steps(plan, folder, backend=backend, **kw)
        try:
            for step in range(steps):
                ref = next(ref_run)
                got = next(got_run)
                rows += compare_step(label, step, ref, got)
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


__all__ = ["LATENT", "DriftRow", "Roles", "Trajectory", "block_outputs", "compare_trajectories", "denoise", "drift",
           "nonfinite_rows", "render", "roles"]
