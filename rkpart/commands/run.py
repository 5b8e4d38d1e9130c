"""``rkpart run``: execute a plan stage by stage and gate it against the whole model."""

from __future__ import annotations

from pathlib import Path

import click

from rkpart.cli_args import (
    OutputFile,
    emit,
    inputs_options,
    json_option,
    quiet_option,
    residency_option,
    tolerance_options,
    toolkit_option,
)
from rkpart.progress import Reporter


@click.command("run")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@inputs_options
@click.option("--backend", type=click.Choice(["ort", "rknn-sim", "rknnlite"]), default="ort", show_default=True,
              help="Executor for NPU stages (rknnlite: the board, with the bundle runner's NPU code); "
                   "host stages always run on ONNX Runtime.")
@toolkit_option(help="rknn-toolkit2 version for --backend rknn-sim stages without an artifact "
                      "[default: the version that built each stage's artifact]; rknnlite: refuse artifacts of "
                      "another version.")
@click.option("--core-mask", type=click.Choice(["auto", "0", "1", "2", "0_1", "0_1_2", "all"]), default=None,
              help="rknnlite: NPU cores for RKNNLite.init_runtime [default: auto].")
@click.option("--model", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Whole model to compare against [default: the plan's source model, found at its recorded "
                   "path or next to the plan folder and used only if its sha256 matches the plan's; none with "
                   "--reference].")
@tolerance_options
@click.option("--per-stage", is_flag=True, help="Also compare every NPU stage with ONNX Runtime on the same inputs.")
@click.option("--save-outputs", type=OutputFile(), default=None,
              help="Write the plan's outputs to this .npz.")
@click.option("--force", is_flag=True, help="Replace the --save-outputs file if it is one rkpart wrote.")
@residency_option(help="Stage sessions: kept until the end (resident), released after use (per-stage), or as the "
                      "plan chose per block (auto strategy; resident where it chose nothing).")
@json_option(help="Machine-readable report.")
@quiet_option
def run(plan_path: Path, inputs: Path | None, seed: int, backend: str, toolkit: str | None, core_mask: str | None,
        model: Path | None,
        reference: Path | None, min_cosine: float | None, max_abs_rel: float | None, per_stage: bool,
        save_outputs: Path | None, force: bool, residency: str, as_json: bool, quiet: bool) -> None:
    """Execute PLAN stage by stage and gate it against the whole model (or --reference's saved outputs)."""
    from rkpart.runtime.validate import RunOptions, validate_plan_run

    if save_outputs is not None:
        from rkpart.output import claim_output_file, npz_is_rkparts

        claim_output_file(save_outputs, what="--save-outputs", force=force, owned=npz_is_rkparts,
                          inputs=[p for p in (plan_path, inputs, reference, model) if p is not None])
    opts = RunOptions(inputs=inputs, seed=seed, backend=backend, toolkit=toolkit, model=model, reference=reference,
                      min_cosine=min_cosine, max_abs_rel=max_abs_rel, per_stage=per_stage, save_outputs=save_outputs,
                      residency=residency, core_mask=core_mask)
    with Reporter(quiet=quiet) as say:
        report = validate_plan_run(plan_path, opts, say)
    emit(as_json, report.to_json, report.render)
    if report.failures:
        from rkpart.errors import GateError

        raise GateError("numerical gate failed: " + "; ".join(report.failures))
