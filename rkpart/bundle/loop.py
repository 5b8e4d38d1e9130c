"""What a bundle's runner needs for a whole denoising loop: the roles of the model's inputs and
the values of the fixed ones.

``runner.py --steps N`` cannot import rkpart, so ``rkpart bundle`` writes down in the manifest
(``denoise``) what ``rkpart drift`` decides from the plan (:mod:`rkpart.roles`): which input is
the latent, the timestep, the guidance and the conditioning (from the plan's pipeline
description, else the flags, else the shape rule, which refuses a tie), the role of every input,
how sigma becomes the timestep, and the scheduler's parameters.  The fixed inputs (masks,
id grids, RoPE tables, integer inputs) go to ``loop_inputs.npz`` with the values drift feeds
them.  The runner then draws and steps exactly as drift does, so its final latent equals
drift's ONNX Runtime reference.

A model whose roles cannot be told still bundles (one pass still runs); its record holds the
reason, and the runner refuses ``--steps`` with it, naming the flags.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.errors import SpecError, UserError
from rkpart.partitioner.plan import Plan
from rkpart.roles import DEFAULT_GUIDANCE, TIMESTEP_SCALE, RoleFlags, loop_inputs, plan_description, resolve_roles

#: how the runner draws the loop's inputs: rkpart drift's rule, written out for the board
SEEDING = ("numpy.random.default_rng(seed): the latent, then each context input in order, standard normal, "
           "cast to the input's dtype (one row of each under cfg_mode batched); the unconditional pass gets zeros; "
           "the fixed inputs come from the 'fixed' file")
#: the bundle file holding the loop's fixed inputs (masks, id grids, RoPE tables, integer inputs)
LOOP_INPUTS = "loop_inputs.npz"


def loop_bundle(plan: Plan, folder: str | Path | None = None, *, latent: str | None = None,
                timestep: str | None = None, context: Sequence[str] = (), guidance_input: str | None = None,
                guidance: float | None = None, shift: float = 1.0, cfg_parallel: bool = False,
                progress: Callable[[str], None] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The manifest's ``denoise`` record for ``plan`` and the arrays of its fixed inputs.

    Roles come from the plan's description in ``folder``, else from the flags (``latent``,
    ``timestep``, ``guidance_input``, ``context``), else from the shape rule.  A record that
    cannot be completed is ``{"error": reason}`` (and no arrays).

    Raises
    ------
    UserError
        A flag names something that is not a model input, or one input twice.
    """
    if not shift > 0:
        raise UserError(f"--shift must be positive, got {shift:g}")
    description = plan_description(plan, folder) if folder is not None else None
    g = guidance if guidance is not None else (
        description.cfg.guidance_scale if description is not None and description.cfg.guidance_scale is not None
        else DEFAULT_GUIDANCE)
    base: dict[str, Any] = {"scheduler": {"name": "flow-euler", "shift": float(shift),
                                          "timestep_scale": TIMESTEP_SCALE, "timestep_offset": 0.0},
                            "guidance": float(g), "seeding": SEEDING, "cfg_parallel": bool(cfg_parallel)}
    flags = RoleFlags(latent, timestep, guidance_input, tuple(context))
    if latent is not None and timestep is not None and latent == timestep:
        raise UserError(f"{latent!r} cannot be both the latent and the timestep")
    try:
        roles = resolve_roles(plan, description, flags, progress=progress)
        lp = loop_inputs(plan, roles, guidance=g)
    except SpecError as e:
        return {"error": str(e), **base}, {}
    base["scheduler"].update(timestep_scale=lp.timestep_scale, timestep_offset=lp.timestep_offset)
    rec = {"latent": roles.latent, "timestep": roles.timestep, "context": list(roles.context),
           "output": roles.output, "mapped_by": roles.source, "roles": dict(roles.roles),
           "guidance_input": roles.guidance, "guidance_input_scale": lp.guidance_input_scale, "cfg_mode": lp.mode,
           "output_sign": lp.sign, "learned_sigma": lp.learned_sigma, "channels_axis": lp.channels_axis,
           **({"fixed": {"file": LOOP_INPUTS, "inputs": sorted(lp.fixed)}} if lp.fixed else {}), **base}
    return rec, dict(lp.fixed)


def loop_record(plan: Plan, folder: str | Path | None = None, *, latent: str | None = None,
                timestep: str | None = None, context: Sequence[str] = (), guidance_input: str | None = None,
                guidance: float | None = None, shift: float = 1.0, cfg_parallel: bool = False) -> dict[str, Any]:
    """The manifest's ``denoise`` record alone (:func:`loop_bundle`)."""
    return loop_bundle(plan, folder, latent=latent, timestep=timestep, context=context,
                       guidance_input=guidance_input, guidance=guidance, shift=shift, cfg_parallel=cfg_parallel)[0]


__all__ = ["LOOP_INPUTS", "SEEDING", "loop_bundle", "loop_record"]
