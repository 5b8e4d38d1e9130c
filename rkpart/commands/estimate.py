"""``rkpart estimate``: a plan's device memory and seconds per image, each figure with its source."""

from __future__ import annotations

from pathlib import Path

import click

from rkpart.cli_args import STEPS, emit, json_option, toolkit_option, user_errors


@click.command("estimate")
@click.argument("plan", type=click.Path(exists=True, path_type=Path))
@toolkit_option(help="Toolkit whose device-memory model predicts uncompiled stages [default: the plan's compile "
                     "toolkit, else the cost model's].")
@click.option("--steps", type=STEPS, default=30, show_default=True,
              help="Denoising steps per image.")
@click.option("--cfg/--no-cfg", default=None,
              help="Two model calls per step (classifier-free guidance) or one [default: the sampler's calls per "
                   "step from the plan's pipeline.json (two-pass CFG 2; batched CFG, distilled guidance, none 1), "
                   "else --cfg].")
@click.option("--cost-model", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Cost model JSON from `rkpart fit` [default: the shipped RK3588 calibration].")
@json_option(help="Print the estimate as JSON (keys: stages[].id, stages[].device_mem_bytes, stages[].source, "
                  "pipeline.device_mem_bytes, pipeline.seconds_per_image, ...).")
@user_errors
def estimate(plan: Path, toolkit: str | None, steps: int, cfg: bool | None, cost_model: Path | None,
             as_json: bool) -> None:
    """Predict PLAN's NPU device memory and seconds per image on the board.

    Per stage: device memory (the compiler's own weight + internal memory when the stage is
    compiled, else predicted before compiling) and latency per call, each with its source.  For
    the pipeline: the device-memory peak under the plan's residency, the bound a budget counts
    (predicted stages raised by the memory model's held-out error bound), and seconds per image
    (steps x model calls per step, lifecycle included, plus the VAE decode when the plan's
    pipeline.json has one beside the model) with error bars; with two calls per step also for
    --cfg-parallel (two NPU cores).
    """
    from rkpart.bundle.vae import decoder_file
    from rkpart.cost_model.estimate import calls_per_step, estimate_plan
    from rkpart.cost_model.model import load_model_or_default
    from rkpart.errors import UserError
    from rkpart.plan.plan import load_plan
    from rkpart.roles import plan_description
    from rkpart.runtime.executor import find_model

    p, folder = load_plan(plan)
    model = load_model_or_default(cost_model)
    label = "shipped RK3588 calibration" if cost_model is None else str(cost_model)
    d = plan_description(p, folder)
    calls = calls_per_step(d.cfg.mode) if d is not None and cfg is None else None
    decoder = None
    if d is not None:
        try:
            decoder = decoder_file(d, find_model(p, Path(folder)))
        except UserError:  # the whole model moved: its decoder is not found either; the loop still is estimated
            decoder = None
    est = estimate_plan(p, folder, model, toolkit=toolkit, steps=steps, cfg=True if cfg is None else cfg,
                        model_label=label, calls=calls, vae_decoder=decoder)
    emit(as_json, est.to_json, est.render)
