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
@click.option("--cfg/--no-cfg", default=True, show_default=True,
              help="Two passes per step (classifier-free guidance) or one.")
@click.option("--cost-model", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Cost model JSON from `rkpart fit` [default: the shipped RK3588 calibration].")
@json_option(help="Print the estimate as JSON (keys: stages[].id, stages[].device_mem_bytes, stages[].source, "
                  "pipeline.device_mem_bytes, pipeline.seconds_per_image, ...).")
@user_errors
def estimate(plan: Path, toolkit: str | None, steps: int, cfg: bool, cost_model: Path | None,
             as_json: bool) -> None:
    """Predict PLAN's NPU device memory and seconds per image on the board.

    Per stage: device memory (the compiler's own weight + internal memory when the stage is
    compiled, else predicted before compiling) and latency per call, each with its source.  For
    the pipeline: the device-memory peak under the plan's residency and seconds per image (steps x
    CFG passes, lifecycle included) with error bars; with CFG also for --cfg-parallel (two NPU cores).
    """
    from rkpart.cost_model.estimate import estimate_plan
    from rkpart.cost_model.model import load_model_or_default
    from rkpart.plan.plan import load_plan

    p, folder = load_plan(plan)
    model = load_model_or_default(cost_model)
    label = "shipped RK3588 calibration" if cost_model is None else str(cost_model)
    est = estimate_plan(p, folder, model, toolkit=toolkit, steps=steps, cfg=cfg, model_label=label)
    emit(as_json, est.to_json, est.render)
