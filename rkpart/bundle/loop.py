"""What a bundle's runner needs for a whole denoising loop: the roles of the model's inputs.

``runner.py --steps N`` cannot import rkpart, so ``rkpart bundle`` writes down in the manifest
(``denoise``) what ``rkpart drift`` decides from the plan: which input is the latent, which the
timestep, which the conditioning (drift's shape rule, :func:`rkpart.profile.drift.roles`, unless
flags name them), the velocity output, and the scheduler's parameters.  The runner then draws
and steps exactly as drift does, so its final latent equals drift's ONNX Runtime reference.

A model the rule cannot map still bundles (one pass still runs); its record holds the reason,
and the runner refuses ``--steps`` with it, naming the flags.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rkpart.errors import SpecError, UserError
from rkpart.plan.plan import Plan
from rkpart.runtime.board_runner import LOOP_FLAGS

#: how the runner draws the loop's inputs: rkpart drift's rule, written out for the board
SEEDING = ("numpy.random.default_rng(seed): the latent, then each context input in order, standard normal, "
           "cast to the input's dtype; the unconditional pass gets zeros")
DEFAULT_GUIDANCE = 4.0
TIMESTEP_SCALE = 1000.0


def loop_record(plan: Plan, *, latent: str | None = None, timestep: str | None = None,
                context: Sequence[str] = (), guidance: float = DEFAULT_GUIDANCE, shift: float = 1.0,
                cfg_parallel: bool = False) -> dict[str, Any]:
    """The manifest's ``denoise`` record for ``plan``.

    Flags (``latent``, ``timestep``, ``context``) override the shape rule one by one; inputs
    they leave out are conditioning.  A record the rule and the flags cannot complete is
    ``{"error": reason}``.

    Raises
    ------
    UserError
        A flag names something that is not a model input, or one input twice.
    """
    named = [n for n in (latent, timestep, *context) if n is not None]
    for n in named:
        if n not in plan.inputs:
            raise UserError(f"{n!r} is not an input of the model (its inputs: {', '.join(plan.inputs)})")
    if len(set(named)) != len(named):
        raise UserError("--latent-input, --timestep-input and --context-input must name different inputs")
    if not shift > 0:
        raise UserError(f"--shift must be positive, got {shift:g}")
    base: dict[str, Any] = {"scheduler": {"name": "flow-euler", "shift": float(shift),
                                          "timestep_scale": TIMESTEP_SCALE},
                            "guidance": float(guidance), "seeding": SEEDING, "cfg_parallel": bool(cfg_parallel)}
    from rkpart.profile.drift import roles

    try:
        guess = roles(plan)
        rule_error = None
    except SpecError as e:
        guess, rule_error = None, str(e)
    if len(plan.outputs) != 1:
        return {"error": f"the loop needs one output (the velocity); this model has {len(plan.outputs)}", **base}
    lat = latent or (guess.latent if guess else None)
    ts = timestep or (guess.timestep if guess else None)
    if lat is None or ts is None:
        return {"error": f"{rule_error}; {LOOP_FLAGS} name them", **base}
    if lat == ts:
        raise UserError(f"{lat!r} cannot be both the latent and the timestep")
    out = plan.outputs[0]
    if plan.tensors[lat].shape != plan.tensors[out].shape:
        return {"error": f"the latent {lat!r} {list(plan.tensors[lat].shape)} does not have the output's shape "
                         f"{list(plan.tensors[out].shape)}", **base}
    ctx = list(context) or [n for n in plan.inputs if n not in (lat, ts)]
    left = [n for n in plan.inputs if n not in (lat, ts, *ctx)]
    if left:
        raise UserError(f"model input {left[0]!r} has no role in the loop; add it with --context-input")
    by = "flags" if named else "shape (rkpart drift's rule)"
    return {"latent": lat, "timestep": ts, "context": ctx, "output": out, "mapped_by": by, **base}


__all__ = ["loop_record"]
