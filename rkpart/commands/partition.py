"""``rkpart partition``: cut a model into NPU and host stages and write a plan folder."""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import TYPE_CHECKING

import click

from rkpart.cli_args import (
    EXTERNAL_THRESHOLD,
    POSITIVE_MIB,
    STEPS,
    bundled_example,
    device_option,
    force_option,
    json_option,
    lowering_note,
    model_argument,
    out_folder_option,
    parse_key_values,
    quiet_option,
    shape_option,
    toolkit_option,
)
from rkpart.progress import Reporter
from rkpart.types import JsonMap, JsonObject

if TYPE_CHECKING:
    from rkpart.cost_model.select import Selection


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@click.command("partition")
@model_argument()
@out_folder_option(default="build", help="Plan folder to write.")
@click.option("--strategy", "-s", default="split", show_default=True,
              help="split, fused, custom, auto, generic or a plugin strategy (see `rkpart strategies`).")
@device_option("adaln", help="split: where each branch's AdaLN (norm + modulation) runs [default: host].")
@device_option("residual", help="split: where gates and residual adds run [default: host].")
@device_option("modulation", help="Where per-block modulation layers (SiLU+Linear of the timestep) run "
                                  "[default: host for split, npu for fused].")
@click.option("--blocks-per-stage", type=click.IntRange(min=1), default=None,
              help="fused: consecutive blocks per NPU stage [default: 1].")
@click.option("--spec", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="custom: YAML/JSON spec naming the stages (docs/custom-spec.md).")
@click.option("--budget-mib", type=POSITIVE_MIB, default=None,
              help="generic: memory budget per NPU stage, weights + peak activations, in MiB [default: 1024]. "
                   "auto: memory budget of the whole pipeline (device memory, a stage not compiled counted at "
                   "its prediction raised by the memory model's held-out error bound; process memory for a model "
                   "fitted on ONNX Runtime) [default: the target's, 4096 MiB for rk3588].")
@click.option("--no-budget", is_flag=True, help="auto: choose without any memory budget.")
@click.option("--cost-model", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="auto: cost model JSON from `rkpart fit` [default: the shipped RK3588 calibration].")
@click.option("--accuracy", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="auto: accuracy term measured by `rkpart drift --accuracy FILE` (error ratio per partition "
                   "family and the floor); replaces the cost model's.")
@toolkit_option(dest="auto_toolkit",
                help="rknn-toolkit2 version the plan is for: ops it does not run on the NPU (its operator table, "
                     "placements learned from earlier builds) leave NPU stages unless a rewrite removes them; auto: "
                     "its known crashes exclude candidates [default: the target's default toolkit, 2.3.0 for rk3588].")
@click.option("--capability/--no-capability", default=True, show_default=True,
              help="Move ops the toolkit runs on the CPU out of NPU stages (plan.json extra.capability says why).")
@click.option("--steps", type=STEPS, default=None, help="auto: denoising steps [default: 1].")
@click.option("--cfg/--no-cfg", default=None, help="auto: two passes per step (CFG) or one [default: --cfg].")
@click.option("--compile-candidates/--no-compile-candidates", "compile_candidates", default=None,
              help="auto: compile one block per anatomy of every candidate with --toolkit (or take it from the "
                   "build cache), so device memory and NPU time come from the compiler's own tables [default: on "
                   "with --toolkit].")
@click.option("--explain", is_flag=True, help="auto: print every candidate's predictions and the choice per block.")
@click.option("--option", "options", multiple=True, callback=parse_key_values, metavar="KEY=VALUE",
              help="Extra strategy option (repeatable), e.g. for plugins.")
@click.option("--pipeline", "pipeline_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The pipeline description (pipeline.json, from rkpart export) to record in the plan, checked "
                   "against the model's inputs: every later command takes the inputs' roles from it [default: "
                   "pipeline.json beside MODEL, if there is one].")
@shape_option
@click.option("--inputs", "inputs_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Representative model inputs (.npz): shapes that depend on the data (NonZero on a mask, an If) "
                   "are resolved by one ONNX Runtime run on them and the plan is specialised to them.")
@click.option("--simplify/--no-simplify", default=False, show_default=True,
              help="Run onnxsim on NPU stages (kept only if outputs stay equal under ONNX Runtime).")
@click.option("--external-threshold", type=EXTERNAL_THRESHOLD, default=1024, show_default=True,
              help="Weights of at least this many bytes go to each stage's external data file (up to 2 GiB, "
                   "the largest tensor an ONNX file can hold inline).")
@click.option("--weights", type=click.Choice(["copy", "link"]), default="copy", show_default=True,
              help="copy: each stage gets its own weights file. link: no per-stage weights; stages reference the "
                   "model's external data file, reflinked into the plan folder (copied whole where the "
                   "filesystem cannot reflink, e.g. ext4).")
@force_option(help="Replace a non-empty plan folder (only once the new plan is complete; only a folder that "
                   "validates as an rkpart plan and holds nothing else).")
@quiet_option
@json_option(help="Print the plan summary as JSON.")
def partition(model: Path | None, out: Path, strategy: str, adaln: str | None, residual: str | None,
              modulation: str | None, blocks_per_stage: int | None, spec: Path | None, budget_mib: float | None,
              no_budget: bool, cost_model: Path | None, accuracy: Path | None, auto_toolkit: str | None,
              capability: bool, steps: int | None, cfg: bool | None, compile_candidates: bool | None, explain: bool,
              options: JsonObject, pipeline_file: Path | None,
              shapes: dict[str, tuple[int, ...]], inputs_file: Path | None, simplify: bool, external_threshold: int,
              weights: str, force: bool,
              quiet: bool, as_json: bool) -> None:
    """Cut MODEL into NPU and host stages and write a plan folder.

    Without MODEL, the bundled tiny Anima-style example is used.
    """
    from rkpart.auto import AutoStrategy
    from rkpart.grouping.strategies.base import Strategy
    from rkpart.pipeline import PartitionConfig, PartitionOptions, check_options, run_partition

    flags = {"adaln": adaln, "residual": residual, "modulation": modulation, "blocks_per_stage": blocks_per_stage,
             "spec": spec, "budget_mib": budget_mib, "cost_model": cost_model, "accuracy": accuracy,
             "toolkit": auto_toolkit if strategy == "auto" else None,
             "steps": steps, "cfg": cfg}
    opts: JsonObject = {**options, **{k: v for k, v in flags.items() if v is not None}}
    check_options(strategy, opts)  # the pipeline's one rule for strategy options (UserError, exit 2)
    from rkpart.output import claim_output_folder

    claim_output_folder(out, inputs=[model or bundled_example(), spec, cost_model, accuracy, inputs_file])
    if no_budget:
        if budget_mib is not None or strategy != "auto":
            raise click.UsageError("--no-budget applies to --strategy auto only, without --budget-mib")
        opts["budget_mib"] = "none"
    if explain and strategy != "auto":
        raise click.UsageError("--explain applies to --strategy auto only")
    # the auto strategy reports its Selection here (for --explain); the last is the plan's: a proposal made again
    # (rank-4 views) works on the new graph the views make
    selections: list[Selection] = []
    if compile_candidates is not None and (strategy != "auto" or auto_toolkit is None):
        raise click.UsageError("--compile-candidates/--no-compile-candidates apply to --strategy auto with --toolkit")
    say = Reporter(quiet=quiet)
    chosen: str | Strategy = strategy
    if strategy == "auto" and not capability:
        opts["capability"] = False
    if strategy == "auto":
        # only --explain reads the selection (its capability trades propose every family again)
        chosen = AutoStrategy(report=selections.append if explain else None, progress=say)
        if auto_toolkit is not None and compile_candidates is not False:
            opts["compile"] = True
    if model is None:
        model = bundled_example()
        say(f"no model given: using the bundled example {model.name}")
    config = PartitionConfig(options=opts, force=force, external_threshold=external_threshold, simplify=simplify,
                             progress=say, weights="link" if weights == "link" else "copy", toolkit=auto_toolkit,
                             capability=capability, pipeline=pipeline_file)
    with say:
        plan = run_partition(PartitionOptions(model, out, chosen, config, shapes or None, inputs_file))
    if not plan.npu_stages:  # even with --quiet: a plan for the NPU that uses no NPU is rarely what was meant
        click.echo(f"rkpart: warning: the plan has no NPU stage; strategy {strategy} put the whole model on the host",
                   err=True)
    if as_json:
        summary = plan.summary_json()
        click.echo(json.dumps({
            **({"auto": selections[-1].to_json()} if explain and selections else {}),
            "plan": str(out / "plan.json"),
            **{k: summary[k] for k in ("strategy", "blocks", "npu_stages", "host_stages")},
            **({"npu_coverage": plan.extra["npu_coverage"]} if "npu_coverage" in plan.extra else {}),
            **({"pipeline": plan.extra["pipeline"]} if "pipeline" in plan.extra else {}),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "stages": summary["stages"],
        }, indent=2))
        return
    if explain and selections:
        click.echo(selections[-1].render(), nl=False)
    if not quiet:
        click.echo(plan.render_stages())
    click.echo(plan.render_summary(out / "plan.json"))
    if "npu_coverage" in plan.extra:  # the report's words (rkpart.report.coverage): each figure with its unit
        from rkpart.report.coverage import coverage_figures, describe_coverage

        click.echo(describe_coverage(coverage_figures(plan)))
    for line in capability_lines(plan.extra.get("capability")):
        click.echo(line)
    if "pipeline" in plan.extra:
        rec = plan.extra["pipeline"]
        click.echo(f"pipeline description: {rec['pipeline']} ({out / rec['file']}): the inputs' roles come from it")
    note = lowering_note(int(plan.model.get("opset") or 0))
    if note:
        click.echo(f"note: {note} (when compiled)")
    click.echo(f"peak RSS: {peak_rss_mib():.1f} MiB")


def capability_lines(cap: JsonMap | None, limit: int = 12) -> list[str]:
    """What ``rkpart partition`` says of the ops its capability moved to the host (plan ``extra.capability``)."""
    if not cap or not cap.get("host_ops"):
        return []
    ops = cap["host_ops"]
    lines = [f"capability (rknn-toolkit2 {cap['toolkit']}): {len(ops)} op(s) moved out of NPU stages to the host:"]
    for h in ops[:limit]:
        lines.append(f"  {h['op_type']} {h['op']} (from {h['from_stage']}): {h['why']}")
    if len(ops) > limit:
        lines.append(f"  ... and {len(ops) - limit} more (plan.json extra.capability)")
    return lines
