"""Click command ``rkpart calibrate``: calibration data for quantized builds, made by running
the plan's own denoising loop on ONNX Runtime (:mod:`rkpart.profile.calibrate`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from rkpart.cli_args import (
    SEED,
    STEPS,
    OutputFolder,
    embeds_option,
    emit,
    force_option,
    json_option,
    quiet_option,
    role_options,
    user_errors,
)
from rkpart.progress import Reporter

if TYPE_CHECKING:
    from rkpart.roles import RoleFlags


@click.command("calibrate")
@click.argument("plan", type=click.Path(exists=True))
@click.option("-o", "--output", "out", type=OutputFolder(), required=True,
              help="Calibration folder to write (dataset.txt per NPU stage, samples/, calibration.json).")
@click.option("--steps", type=STEPS, default=4, show_default=True,
              help="Denoising steps per run of the loop.")
@click.option("--cfg/--no-cfg", default=None,
              help="Classifier-free guidance: sample the conditional and the unconditional pass [default: as the "
                   "plan's pipeline.json says (none for guidance-distilled models); --cfg without one].")
@click.option("--samples", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="Samples per NPU stage, spread evenly over the steps and passes (rknn-toolkit2 advises "
                   "20-100); only distinct samples count: more seeded runs of the loop are made until every stage "
                   "has them (at most 2 x samples / steps runs).")
@click.option("--inputs", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=".npz with one array per model input (or K samples stacked on a leading axis): calibrate "
                   "on these instead of the denoising loop (a plan without one needs this).")
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Seed of the loop's latent and conditioning (run r uses seed + r).")
@role_options
@embeds_option
@force_option(help="Replace an existing calibration folder.")
@quiet_option
@json_option(help="Print the manifest summary as JSON.")
@user_errors
def calibrate(plan: str, out: Path, steps: int, cfg: bool | None, samples: int, inputs: Path | None, seed: int,
              role_flags: RoleFlags, embeds: Path | None, force: bool, quiet: bool, as_json: bool) -> None:
    """Record calibration samples of every NPU stage of PLAN for `rkpart compile --precision int8`,
    and check every stage's activations against fp16's range (the "fp16 range" lines).

    The loop's roles come from the plan's pipeline.json, else the role flags, else shapes;
    --embeds gives it the conditioning the pipeline really has.

    The same plan and inputs give byte-identical files."""
    from rkpart.compile.calibration import render
    from rkpart.output import claim_output_folder
    from rkpart.plan.plan import load_plan
    from rkpart.profile.calibrate import CalibrationOptions, write_calibration

    claim_output_folder(out, what="calibration folder", inputs=[plan, inputs])
    p, folder = load_plan(plan)
    with Reporter(quiet=quiet) as say:
        opts = CalibrationOptions(steps=steps, cfg=cfg, samples=samples, seed=seed, flags=role_flags, embeds=embeds)
        cal = write_calibration(p, folder, out, opts, inputs=inputs, force=force, progress=say)
    emit(as_json, lambda: {"folder": str(cal.folder), "sha256": cal.sha256, "plan_sha256": cal.plan_sha256,
                           "source": cal.source, "stages": [s.to_json() for s in cal.stages.values()],
                           "fp16_range": [f.to_json() for f in cal.findings]}, lambda: render(cal))
