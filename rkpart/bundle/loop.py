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

import numpy as np

from rkpart.description import PipelineDescription
from rkpart.errors import SpecError, UserError
from rkpart.plan.plan import Plan
from rkpart.roles import (
    DEFAULT_GUIDANCE,
    TIMESTEP_SCALE,
    RoleFlags,
    half_shape,
    loop_inputs,
    plan_description,
    resolve_roles,
)
from rkpart.runtime.board_runner import PIPELINE_FEATURES
from rkpart.types import JsonObject

#: how the runner draws the loop's inputs: rkpart drift's rule, written out for the board
SEEDING = ("numpy.random.default_rng(seed): the latent, then each context input in order, standard normal, "
           "cast to the input's dtype (one row of each under cfg_mode batched); the unconditional pass gets zeros; "
           "the fixed inputs come from the 'fixed' file")
#: the bundle file holding the loop's fixed inputs (masks, id grids, RoPE tables, integer inputs)
LOOP_INPUTS = "loop_inputs.npz"


def loop_bundle(plan: Plan, folder: str | Path | None = None, *, latent: str | None = None,
                timestep: str | None = None, context: Sequence[str] = (), guidance_input: str | None = None,
                guidance: float | None = None, shift: float = 1.0, cfg_parallel: bool = False,
                progress: Callable[[str], None] | None = None) -> tuple[JsonObject, dict[str, np.ndarray]]:
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
    base: JsonObject = {"scheduler": {"name": "flow-euler", "shift": float(shift),
                                          "timestep_scale": TIMESTEP_SCALE, "timestep_offset": 0.0},
                            "guidance": float(g), "seeding": SEEDING, "cfg_parallel": bool(cfg_parallel)}
    flags = RoleFlags(latent, timestep, guidance_input, tuple(context))
    if latent is not None and timestep is not None and latent == timestep:
        raise UserError(f"{latent!r} cannot be both the latent and the timestep")
    try:
        roles = resolve_roles(plan, description, flags, progress=progress)
        lp = loop_inputs(plan, roles, guidance=g, implemented=None)  # check_features below: the board's own
        if description is not None:
            check_features(description)
    except SpecError as e:
        return {"error": str(e), **base}, {}
    base["scheduler"].update(timestep_scale=lp.timestep_scale, timestep_offset=lp.timestep_offset)
    if description is not None:
        base["pipeline"] = pipeline_record(description, plan, roles.latent)
    rec = {"latent": roles.latent, "timestep": roles.timestep, "context": list(roles.context),
           "output": roles.output, "mapped_by": roles.source, "roles": dict(roles.roles),
           "guidance_input": roles.guidance, "guidance_input_scale": lp.guidance_input_scale, "cfg_mode": lp.mode,
           "output_sign": lp.sign, "learned_sigma": lp.learned_sigma, "channels_axis": lp.channels_axis,
           **({"fixed": {"file": LOOP_INPUTS, "inputs": sorted(lp.fixed)}} if lp.fixed else {}), **base}
    return rec, dict(lp.fixed)


#: the sigma / timestep rules of pipeline.json (rkpart export's names) -> board_sampling's rule of the
#: same schedule (docs/samplers.md); (sigmas, timesteps) -> rule, ``None``: set_timesteps(n, mu=...)
SCHEDULE_RULES: dict[tuple[str | None, str | None], str | None] = {
    (None, None): None,
    ("linspace(1, 1/n, n)", None): "linspace(1, 1/n, n)",
    ("linspace(1, 0, n+1)[:-1]", None): "linspace(1, 0, n+1)[:-1]",
    ("int(linspace(T, 1, n)) / T", "int(linspace(T, 1, n))"): "timesteps=linspace(N, 1, n).int, sigmas=timesteps/N",
}


def schedule_rule(description: PipelineDescription) -> str | None:
    """board_sampling's name of the custom schedule the pipeline passes to ``set_timesteps``.

    Raises
    ------
    UserError
        A rule the board's sampler does not reproduce (naming it).
    """
    from rkpart.runtime import board_sampling as bs

    s = description.scheduler
    key = (s.sigmas, s.timesteps)
    if key in SCHEDULE_RULES:
        return SCHEDULE_RULES[key]
    if s.timesteps is None and s.sigmas in bs.SCHEDULE_RULES:
        return s.sigmas
    raise UserError(f"the pipeline passes set_timesteps(sigmas={s.sigmas!r}, timesteps={s.timesteps!r}); the board's "
                    f"sampler knows the rules {', '.join(repr(k) for k in bs.SCHEDULE_RULES)} (docs/samplers.md)")


#: features of pipeline.json beyond version 1 as first published (:data:`rkpart.description.FEATURES`) the
#: board's pipeline loop (``pipeline_record`` -> runner.py) implements: the runner's own list, since the runner
#: refuses a loop record naming one it does not know (each is checked against diffusers by
#: scripts/check_images.py)
BOARD_FEATURES: frozenset[str] = PIPELINE_FEATURES


def check_features(description: PipelineDescription) -> None:
    """Refuse a description using a feature the board's loop does not implement, naming it (the bundle is
    written without a loop, and ``runner.py --steps`` refuses with this line).

    Raises
    ------
    SpecError
        One feature or more of :func:`rkpart.description.features` is not in :data:`BOARD_FEATURES`.
    """
    from rkpart.description import features

    missing = sorted(features(description) - BOARD_FEATURES)
    if missing:
        raise SpecError(f"the pipeline's description uses {', '.join(missing)}, which the board's loop does not "
                        "implement (docs/pipeline-json.md, Features)")


def check_sampler(description: PipelineDescription) -> None:
    """Refuse a scheduler the board's sampler does not reproduce exactly, naming every option.

    Raises
    ------
    UserError
        The class is not implemented, or config options are not reproduced (``key=value`` each).
    """
    from rkpart.runtime import board_sampling as bs
    from rkpart.runtime.board_runner import json_numbers

    cls = description.scheduler.class_name
    refused = bs.unsupported(cls, json_numbers(dict(description.scheduler.config)))
    if refused == [cls]:
        raise UserError(f"the pipeline's scheduler {cls} is not implemented on the board (implemented: "
                        f"{', '.join(bs.SCHEDULERS)}; docs/samplers.md)")
    if refused:
        raise UserError(f"the pipeline's scheduler {cls} has options the board's sampler does not reproduce: "
                        f"{', '.join(refused)} (docs/samplers.md)")


def loop_latent_shape(description: PipelineDescription) -> tuple[int, ...]:
    """The shape of the loop's latent, and so of the final latent ``pipe(..., output_type="latent")``
    returns and ``vae_decoder.onnx`` takes: ``latents=``'s, or as tokens under ``latent.init`` ``tokens``
    (Flux.2: ``(B, C, *positions)`` -> ``(B, prod(positions), C)``)."""
    shape = tuple(description.latent.shape)
    if description.latent.init == "tokens":
        return (shape[0], int(np.prod(shape[2:])), shape[1])
    return shape


def pipeline_record(description: PipelineDescription, plan: Plan, latent: str) -> JsonObject:
    """The loop record's ``pipeline``: what ``runner.py`` needs of ``pipeline.json`` to run the
    pipeline's own loop (its sampler, schedule, timestep rule, latent and call arguments).

    Raises
    ------
    UserError
        The scheduler or its schedule is one the board's sampler does not reproduce, or the call's
        ``latents=`` is not the model's latent input.
    """
    from rkpart.description import features

    d = description
    check_sampler(d)
    rule = schedule_rule(d)
    batched = d.cfg.mode == "batched"
    lat_in = tuple(plan.tensors[latent].shape)
    loop_shape = half_shape(lat_in) if batched else lat_in
    shape = loop_latent_shape(d)
    # the model input may hold the loop latent with an axis of one the pipeline adds (Z-Image's frame axis)
    if tuple(n for n in shape if n != 1) != tuple(n for n in loop_shape if n != 1):
        raise UserError(f"the pipeline's latents= is {list(d.latent.shape)}, its transformer's latent input "
                        f"{list(lat_in)}: the pipeline reshapes between them, which the board's loop does not")
    fixed_roles = ("latent", "timestep", "guidance")
    embeds: JsonObject = {}
    for i in d.inputs:
        if i.value is None and i.role not in fixed_roles and (i.argument or i.negative_argument):
            embeds[i.name] = {"argument": i.argument, "negative_argument": i.negative_argument,
                              **({"negative_fill": i.negative_fill} if i.negative_fill is not None else {}),
                              **({"append_valid": i.append_valid} if i.append_valid else {})}
    s = d.scheduler
    return {
        "class": d.pipeline_class, "transformer": d.transformer.class_name,
        "features": sorted(features(d)),
        "sampler": {"class": s.class_name, "config": dict(s.config), "rule": rule, "mu": s.mu,
                    **({"mu_rule": s.mu_rule, "image_seq_len": s.image_seq_len} if s.mu_rule is not None else {})},
        "timestep": {"scale": d.timestep.scale, "offset": d.timestep.offset},
        "latent": {"shape": list(d.latent.shape), "dtype": d.latent.dtype, "init": d.latent.init,
                   "packing": d.latent.packing},
        "prediction": d.output.prediction,
        "embeds": embeds,
        "cfg": {"combine": d.cfg.combine, "renorm": d.cfg.renorm, "batch_order": d.cfg.batch_order,
                "channels": d.cfg.channels},
        "num_frames": d.image.num_frames,
        "guidance_scale": d.cfg.guidance_scale, "scale_argument": d.cfg.scale_argument,
    }


def loop_record(plan: Plan, folder: str | Path | None = None, *, latent: str | None = None,
                timestep: str | None = None, context: Sequence[str] = (), guidance_input: str | None = None,
                guidance: float | None = None, shift: float = 1.0, cfg_parallel: bool = False) -> JsonObject:
    """The manifest's ``denoise`` record alone (:func:`loop_bundle`)."""
    return loop_bundle(plan, folder, latent=latent, timestep=timestep, context=context,
                       guidance_input=guidance_input, guidance=guidance, shift=shift, cfg_parallel=cfg_parallel)[0]


__all__ = ["BOARD_FEATURES", "LOOP_INPUTS", "SCHEDULE_RULES", "SEEDING", "check_features", "check_sampler",
           "loop_bundle", "loop_latent_shape", "loop_record", "pipeline_record", "schedule_rule"]
