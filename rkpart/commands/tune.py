"""Click command ``rkpart tune``: measure, fit, choose and verify on one backend (:mod:`rkpart.tune`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from rkpart.cli_args import (
    POSITIVE_MIB,
    ROUNDS,
    STEPS,
    FiniteFloat,
    OutputFolder,
    embeds_option,
    emit,
    json_option,
    quiet_option,
    role_options,
    threads_type,
    toolkit_option,
    user_errors,
)
from rkpart.progress import Reporter
from rkpart.runtime import BACKENDS

if TYPE_CHECKING:
    from rkpart.roles import RoleFlags


@click.command("tune")
@click.argument("model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--backend", type=click.Choice(BACKENDS), default="ort", show_default=True,
              help="ort: ONNX Runtime on this machine; rknn-sim: toolkit simulator; rknnlite: the board.")
@toolkit_option(help="rknn-toolkit2 version (rknn-sim / rknnlite).")
@click.option("-o", "--out", "workdir", type=OutputFolder(), default=Path("tune"),
              show_default=True, help="Folder for the plans, profiles, fitted model and report.")
@click.option("--steps", type=STEPS, default=1, show_default=True, help="Denoising steps per round.")
@click.option("--cfg/--no-cfg", default=True, show_default=True, help="Two passes per step (CFG) or one.")
@click.option("--budget-mib", type=POSITIVE_MIB, default=None,
              help="Memory budget of the whole pipeline [default: the target's, 4096 MiB for rk3588].")
@click.option("--rounds", type=ROUNDS, default=3, show_default=True,
              help="Measured rounds per profile of the fit.")
@click.option("--verify-rounds", type=ROUNDS, default=5, show_default=True,
              help="Interleaved rounds of every plan in the verification.")
@click.option("--threads", type=threads_type(), default=1, show_default=True,
              help="ONNX Runtime intra-op threads (0: its default; at most 4 per core).")
@click.option("--cfg-parallel/--no-cfg-parallel", default=False, show_default=True,
              help="rknnlite: also bundle auto's plan and time its denoising loop with the CFG passes one after "
                   "the other and at once on NPU cores 0 and 1; the measured speed-up replaces the 1.78x prior "
                   "in the fitted cost model.")
@click.option("--precisions", type=click.Choice(["fp16", "fp16,int8"]), default="fp16", show_default=True,
              help="fp16,int8 (--backend rknn-sim): also calibrate and build every candidate plan in int8 (w8a8), "
                   "measure each one's drift in the simulator (accuracy.json in the work folder) and let auto take "
                   "int8 for a block where that drift is within --max-error-ratio.")
@click.option("--max-error-ratio", type=FiniteFloat(min=1), default=None, metavar="R",
              help="auto's accuracy bound: a plan's final-latent error over the fp16 split plan's (1 = split's "
                   "own drift) [default: auto's floor, the largest fp16 ratio that keeps cosine >= 0.999].")
@click.option("--pipeline", "pipeline_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The pipeline description every plan records (rkpart partition --pipeline) [default: "
                   "pipeline.json beside MODEL, if there is one].")
@role_options
@embeds_option
@quiet_option
@json_option(help="Print the report as JSON.")
@user_errors
def tune(model: Path, backend: str, toolkit: str | None, workdir: Path, steps: int, cfg: bool,
         budget_mib: float | None, rounds: int, verify_rounds: int, threads: int, cfg_parallel: bool,
         precisions: str, max_error_ratio: float | None, pipeline_file: Path | None, role_flags: RoleFlags,
         embeds: Path | None, quiet: bool, as_json: bool) -> None:
    """Partition MODEL every way auto chooses from, profile, fit, choose, and verify the choice.

    Prints every plan's measured and predicted round and the regret of auto's choice against
    the measured best.  The denoising loops it runs (calibration, drift, the bundle's loop) take
    the inputs' roles from the pipeline.json every plan records, else from the role flags;
    --embeds gives them the conditioning.
    """
    from rkpart.output import claim_output_folder
    from rkpart.tune import TuneConfig
    from rkpart.tune import tune as run_tune

    claim_output_folder(workdir, what="work folder", inputs=[model])

    say = Reporter(quiet=quiet)
    config = TuneConfig(backend=backend, toolkit=toolkit, steps=steps, cfg=cfg, budget_mib=budget_mib,
                        rounds=rounds, verify_rounds=verify_rounds, threads=threads, cfg_parallel=cfg_parallel,
                        precisions=tuple(precisions.split(",")), max_error_ratio=max_error_ratio,
                        pipeline=pipeline_file, flags=role_flags, embeds=embeds)
    with say:
        result = run_tune(model, workdir, config, progress=say)
    emit(as_json, result.to_json, result.render)
