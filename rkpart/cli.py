"""Command line: a thin click layer over the library.

Options become typed values in callbacks (``click.BadParameter`` on bad input); commands
call one library function and turn :class:`rkpart.errors.UserError` into one line on
stderr and the error's exit code.  Internal errors keep their traceback.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from rkpart import __version__
from rkpart.cli_args import (
    POSITIVE_MIB,
    device_option,
    emit,
    force_option,
    inputs_options,
    json_option,
    model_argument,
    out_folder_option,
    parse_key_values,
    quiet_option,
    report_user_error,
    residency_option,
    shape_option,
    tolerance_options,
    toolkit_option,
)
from rkpart.errors import INTERRUPTED_EXIT, RkpartError, UserError, os_error
from rkpart.progress import Reporter
from rkpart.units import mib


class RkpartGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as e:
            report_user_error(e)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("rkpart: interrupted", err=True)
            ctx.exit(INTERRUPTED_EXIT)
        except BrokenPipeError:
            ctx.exit(0)
        except OSError as e:
            err = os_error(e, "rkpart")
            if err is None:
                raise
            report_user_error(err)
            ctx.exit(err.exit_code)
        except MemoryError:
            click.echo("rkpart: error: out of memory", err=True)
            ctx.exit(71)
        except RkpartError as e:
            click.echo(f"rkpart: internal error: {e}", err=True)
            raise


@click.group(cls=RkpartGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="rkpart")
def main() -> None:
    """Partition Diffusion Transformer ONNX graphs for Rockchip NPUs (RK3588).

    \b
    Typical flow:
      rkpart inspect MODEL.onnx                       # blocks and regions found
      rkpart partition MODEL.onnx --strategy split --out build/
      rkpart run build/                               # ONNX Runtime vs the whole model
      rkpart compile build/ --toolkit 2.3.0 --target rk3588
      rkpart run build/ --backend rknn-sim --toolkit 2.3.0
    """


# ---------------------------------------------------------------------------------------------
# option parsing helpers


def bundled_example() -> Path:
    """Path of the bundled tiny Anima-style example model."""
    from importlib import resources

    p = Path(str(resources.files("rkpart") / "data" / "anima_tiny.onnx"))
    if not p.is_file():
        raise UserError(f"the bundled example model is missing from the installation ({p})")
    return p


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---------------------------------------------------------------------------------------------


def lowering_note(opset: int) -> str | None:
    """"stages will be lowered from opset 20 to 19 for rknn-toolkit2 ..." for the target's documented
    and the installed toolkits, or ``None`` when every one of them loads ``opset``."""
    from rkpart.compile.toolkits import list_toolkits
    from rkpart.targets import get_target
    from rkpart.targets.opset import lowering_note as note

    target = get_target()
    versions = set(target.toolkits) | {t.version for t in list_toolkits(None)}
    return note(opset, {v: target.caps(v).max_opset for v in versions})


@main.command()
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
                   "auto: memory budget of the whole pipeline (device memory; process memory for a model "
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
@click.option("--steps", type=click.IntRange(min=1), default=None, help="auto: denoising steps [default: 1].")
@click.option("--cfg/--no-cfg", default=None, help="auto: two passes per step (CFG) or one [default: --cfg].")
@click.option("--compile-candidates/--no-compile-candidates", "compile_candidates", default=None,
              help="auto: compile one block per anatomy of every candidate with --toolkit (or take it from the "
                   "build cache), so device memory and NPU time come from the compiler's own tables [default: on "
                   "with --toolkit].")
@click.option("--explain", is_flag=True, help="auto: print every candidate's predictions and the choice per block.")
@click.option("--option", "options", multiple=True, callback=parse_key_values, metavar="KEY=VALUE",
              help="Extra strategy option (repeatable), e.g. for plugins.")
@shape_option
@click.option("--inputs", "inputs_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Representative model inputs (.npz): shapes that depend on the data (NonZero on a mask, an If) "
                   "are resolved by one ONNX Runtime run on them and the plan is specialised to them.")
@click.option("--simplify/--no-simplify", default=False, show_default=True,
              help="Run onnxsim on NPU stages (kept only if outputs stay equal under ONNX Runtime).")
@click.option("--external-threshold", type=click.IntRange(min=0), default=1024, show_default=True,
              help="Weights of at least this many bytes go to each stage's external data file.")
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
              options: dict[str, Any],
              shapes: dict[str, tuple[int, ...]], inputs_file: Path | None, simplify: bool, external_threshold: int,
              weights: str, force: bool, quiet: bool, as_json: bool) -> None:
    """Cut MODEL into NPU and host stages and write a plan folder.

    Without MODEL, the bundled tiny Anima-style example is used.
    """
    from rkpart.pipeline import PartitionConfig, PartitionOptions, check_options, run_partition

    flags = {"adaln": adaln, "residual": residual, "modulation": modulation, "blocks_per_stage": blocks_per_stage,
             "spec": spec, "budget_mib": budget_mib, "cost_model": cost_model, "accuracy": accuracy,
             "toolkit": auto_toolkit if strategy == "auto" else None,
             "steps": steps, "cfg": cfg}
    opts: dict[str, Any] = {**options, **{k: v for k, v in flags.items() if v is not None}}
    check_options(strategy, opts)  # the pipeline's one rule for strategy options (UserError, exit 2)
    if no_budget:
        if budget_mib is not None or strategy != "auto":
            raise click.UsageError("--no-budget applies to --strategy auto only, without --budget-mib")
        opts["budget_mib"] = "none"
    if explain and strategy != "auto":
        raise click.UsageError("--explain applies to --strategy auto only")
    selections: list[Any] = []  # the auto strategy reports its Selection here (for --explain)
    if compile_candidates is not None and (strategy != "auto" or auto_toolkit is None):
        raise click.UsageError("--compile-candidates/--no-compile-candidates apply to --strategy auto with --toolkit")
    say = Reporter(quiet=quiet)
    if strategy == "auto":
        opts["report"] = selections.append
        if auto_toolkit is not None and compile_candidates is not False:
            opts["compile"] = True
            opts["progress"] = say
    if model is None:
        model = bundled_example()
        say(f"no model given: using the bundled example {model.name}")
    config = PartitionConfig(options=opts, force=force, external_threshold=external_threshold, simplify=simplify,
                             progress=say, weights="link" if weights == "link" else "copy", toolkit=auto_toolkit,
                             capability=capability)
    with say:
        plan = run_partition(PartitionOptions(model, out, strategy, config, shapes or None, inputs_file))
    if not plan.npu_stages:  # even with --quiet: a plan for the NPU that uses no NPU is rarely what was meant
        click.echo(f"rkpart: warning: the plan has no NPU stage; strategy {strategy} put the whole model on the host",
                   err=True)
    if as_json:
        summary = plan.summary_json()
        click.echo(json.dumps({
            **({"auto": selections[0].to_json()} if explain and selections else {}),
            "plan": str(out / "plan.json"),
            **{k: summary[k] for k in ("strategy", "blocks", "npu_stages", "host_stages")},
            **({"npu_coverage": plan.extra["npu_coverage"]} if "npu_coverage" in plan.extra else {}),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "stages": summary["stages"],
        }, indent=2))
        return
    if explain and selections:
        click.echo(selections[0].render(), nl=False)
    if not quiet:
        click.echo(plan.render_stages())
    click.echo(plan.render_summary(out / "plan.json"))
    if "npu_coverage" in plan.extra:
        click.echo(f"block matmul work on the NPU: {plan.extra['npu_coverage']['share']:.1%}")
    for line in capability_lines(plan.extra.get("capability")):
        click.echo(line)
    note = lowering_note(int(plan.model.get("opset") or 0))
    if note:
        click.echo(f"note: {note} (when compiled)")
    click.echo(f"peak RSS: {peak_rss_mib():.1f} MiB")


def capability_lines(cap: Any, limit: int = 12) -> list[str]:
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


@main.command()
@model_argument()
@shape_option
@click.option("--inputs", "inputs_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Representative model inputs (.npz): shapes that depend on the data (NonZero on a mask, an If) "
                   "are resolved by one ONNX Runtime run on them and the graph is specialised to them.")
@json_option()
def inspect(model: Path | None, shapes: dict[str, tuple[int, ...]], inputs_file: Path | None, as_json: bool) -> None:
    """Show the blocks and regions found in MODEL (nothing is written)."""
    from rkpart.ir import describe
    from rkpart.pipeline import inspect_model, strategy_coverage

    if model is None:
        model = bundled_example()
    mg, disc = inspect_model(model, shapes or None, inputs=inputs_file)
    info = describe(mg)
    coverage = {name: c.to_json() for name, c in strategy_coverage(mg, disc).items()}
    if as_json:
        blocks = disc.summary()
        for b, summary in zip(disc.blocks, blocks, strict=True):
            # tensor names to cut at (custom spec `cut`): the residual stream into and out of
            # every region, and what enters its core after the AdaLN
            regions: list[dict[str, Any]] = summary["regions"]  # type: ignore[assignment]
            for r, rs in zip(b.regions, regions, strict=True):
                rs["input"] = [br.skip for br in r.branches]
                rs["core_inputs"] = sorted({t for br in r.branches for t in br.core_in})
                rs["output"] = [mg.op(br.add).outputs[0] for br in r.branches]
            summary["input"] = regions[0]["input"] if regions else []
            summary["output"] = regions[-1]["output"] if regions else []
        click.echo(json.dumps({**info, "streams": disc.streams, "method": disc.method,
                               "prologue_ops": len(disc.prologue), "epilogue_ops": len(disc.epilogue),
                               "glue_ops": len(disc.glue), "blocks": blocks,
                               "npu_coverage": coverage,
                               "lowering": lowering_note(int(info["opset"] or 0))}, indent=2))
        return
    click.echo(f"{info['file']}: opset {info['opset']}, {info['nodes']} nodes ({info['const_nodes']} constant), "
               f"weights {mib(info['weight_bytes'])} MiB")
    for kind in ("inputs", "outputs"):
        for t in info[kind]:
            click.echo(f"  {kind[:-1]:<6} {t['name']} {t['dtype']} {t['shape']}")
    click.echo(f"{len(disc.blocks)} blocks, {disc.streams} residual stream(s), numbered by {disc.method}; "
               f"prologue {len(disc.prologue)} ops, glue {len(disc.glue)}, epilogue {len(disc.epilogue)}")
    for b in disc.blocks:
        regs = ", ".join(
            f"{r.name}[{r.kind}; adaln={r.adaln}{'; gated' if r.gate else ''}; "
            f"{len(r.pre)}+{len(r.core)}+{len(r.gate) + len(r.adds)} ops]"
            for r in b.regions
        )
        scope = f" ({b.scope})" if b.scope else ""
        n_mod = len(b.mod) + sum(len(r.mod) for r in b.regions)
        click.echo(f"  block {b.index:>2}{scope}: {regs}; modulation {n_mod} ops")
    click.echo("block matmul work on the NPU: " + ", ".join(
        f"{name} {c['share']:.1%}" for name, c in coverage.items()))
    for n in disc.notes:
        click.echo(f"note: {n}")
    note = lowering_note(int(info["opset"] or 0))
    if note:
        click.echo(f"note: {note} (when compiled)")


@main.command()
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
                   "path or next to the plan folder and used only if its sha256 matches the plan's].")
@tolerance_options
@click.option("--per-stage", is_flag=True, help="Also compare every NPU stage with ONNX Runtime on the same inputs.")
@click.option("--save-outputs", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the plan's outputs to this .npz.")
@residency_option(help="Stage sessions: kept until the end (resident), released after use (per-stage), or as the "
                      "plan chose per block (auto strategy; resident where it chose nothing).")
@json_option(help="Machine-readable report.")
@quiet_option
def run(plan_path: Path, inputs: Path | None, seed: int, backend: str, toolkit: str | None, core_mask: str | None,
        model: Path | None,
        reference: Path | None, min_cosine: float | None, max_abs_rel: float | None, per_stage: bool,
        save_outputs: Path | None, residency: str, as_json: bool, quiet: bool) -> None:
    """Execute PLAN stage by stage and gate it against the whole model."""
    from rkpart.runtime.validate import RunOptions, validate_plan_run

    opts = RunOptions(inputs=inputs, seed=seed, backend=backend, toolkit=toolkit, model=model, reference=reference,
                      min_cosine=min_cosine, max_abs_rel=max_abs_rel, per_stage=per_stage, save_outputs=save_outputs,
                      residency=residency, core_mask=core_mask)
    with Reporter(quiet=quiet) as say:
        report = validate_plan_run(plan_path, opts, say)
    emit(as_json, report.to_json, report.render)
    if report.failures:
        from rkpart.errors import GateError

        raise GateError("numerical gate failed: " + "; ".join(report.failures))


@main.command()
@json_option()
def strategies(as_json: bool) -> None:
    """List partition strategies: built-in and installed plugins, and where each came from.

    Plugins that failed to load are listed as BROKEN with the error (and skipped); a second
    plugin with a taken name is listed as DUPLICATE or SHADOWED.
    """
    from rkpart.pipeline import BUILTIN
    from rkpart.plugins import describe, render
    from rkpart.strategies import plugins

    rows = describe(((s.name, s.summary, f"rkpart ({s.__module__})") for s in BUILTIN), plugins())
    emit(as_json, lambda: rows, lambda: render(rows))


@main.command()
@click.argument("dest", type=click.Path(path_type=str), default="anima_tiny.onnx")
@force_option(help="Overwrite DEST.")
def example(dest: str, force: bool) -> None:
    """Copy the bundled tiny Anima-style example model to DEST.

    DEST is a file name, or a folder (an existing one, or any path ending in /) that gets
    anima_tiny.onnx; prints the path written.  The example is a 2-block DiT with the
    Anima / Cosmos-Predict2 block anatomy, for trying every command without a real model.
    """
    from rkpart.output import output_file

    path = Path(dest)
    if dest.endswith(("/", os.sep)) or (path.is_dir() and not path.is_symlink()):
        path = path / "anima_tiny.onnx"
    # a regular file or nothing: never a device node, FIFO, socket, folder or symlink (rkpart.output)
    with output_file(path, force=force, what="example destination") as tmp:
        shutil.copyfile(bundled_example(), tmp)
    click.echo(str(path))


def _register_optional() -> None:
    """The commands of :mod:`rkpart.commands`."""
    import importlib

    for mod, names in (
        ("rkpart.commands.compile", ("toolkit", "compile_cmd", "cache")),
        ("rkpart.commands.profile", ("profile",)),
        ("rkpart.commands.fit", ("fit",)),
        ("rkpart.commands.tune", ("tune",)),
        ("rkpart.commands.repro", ("repro",)),
        ("rkpart.commands.recognizers", ("recognizers",)),
        ("rkpart.commands.bundle", ("bundle",)),
        ("rkpart.commands.report", ("report",)),
        ("rkpart.commands.drift", ("drift",)),
        ("rkpart.commands.estimate", ("estimate",)),
        ("rkpart.commands.calibrate", ("calibrate",)),
    ):
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:
                continue
            raise
        for n in names:
            cmd = getattr(module, n, None)
            if isinstance(cmd, click.Command):
                main.add_command(cmd)


_register_optional()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
