"""Click commands: ``rkpart toolkit install|list`` and ``rkpart compile``.

Thin layer: options (groups shared with other commands, from :mod:`rkpart.cli_args`) become
one :class:`rkpart.compile.compile.CompileOptions` for :func:`rkpart.compile.compile.compile_folder`,
or arguments of :mod:`rkpart.compile.toolkits`; the commands only format output and choose
exit codes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from rkpart.cli_args import (
    FiniteFloat,
    build_options,
    emit,
    json_option,
    quiet_option,
    toolkit_option,
    toolkits_dir_option,
    user_errors,
)
from rkpart.compile.hang import HANG_FACTOR, HANG_FLOOR_S
from rkpart.errors import ResourceError, ToolkitError
from rkpart.progress import Reporter
from rkpart.targets.rewrites import SKIPPABLE_REWRITES
from rkpart.types import JsonMap, JsonObject
from rkpart.units import MIB, human_bytes

if TYPE_CHECKING:  # the compiler is imported when a command runs, not with the CLI
    from rkpart.compile.compile import CompileReport
    from rkpart.repartition import RepartitionRound
    from rkpart.types import CompilerPlan


@click.group("toolkit")
def toolkit() -> None:
    """Install and list rknn-toolkit2 environments."""


@toolkit.command("install")
@click.argument("version")
@toolkits_dir_option
@click.option("--python", "python", type=click.Path(dir_okay=False), default=None,
              help="Register this existing python (with rknn-toolkit2 installed) instead of creating a venv.")
@click.option("--force", is_flag=True, help="Replace an existing installation.")
@user_errors
def install_cmd(version: str, toolkits_dir: str | None, python: str | None, force: bool) -> None:
    """Install rknn-toolkit2 VERSION into its own venv (or register --python)."""
    from rkpart.compile.toolkits import install_toolkit, register_toolkit

    if python:
        tk = register_toolkit(python, toolkits_dir, version=version, force=force)
        click.echo(f"registered {tk.describe()}")
        return
    with Reporter() as say:
        tk = install_toolkit(version, toolkits_dir, force=force, progress=say)
    click.echo(tk.describe())


@toolkit.command("list")
@toolkits_dir_option
@json_option()
def list_cmd(toolkits_dir: str | None, as_json: bool) -> None:
    """List installed or registered toolkits."""
    from rkpart.compile.toolkits import list_toolkits, toolkits_root

    tks = list_toolkits(toolkits_dir)
    if as_json:
        click.echo(json.dumps([{"version": t.version, "python": str(t.python), "managed": t.managed}
                               for t in tks], indent=2))
        return
    if not tks:
        click.echo(f"no toolkits in {toolkits_root(toolkits_dir)}; run `rkpart toolkit install 2.3.0`")
        return
    for t in tks:
        click.echo(f"{t.version:<8} {'venv' if t.managed else 'python'}  {t.python}")


@click.command("compile")
@click.argument("plan", type=click.Path(exists=True))
@toolkit_option(required=True, dest="toolkit_v", help="Toolkit version (e.g. 2.3.0) or a python path.")
@build_options
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Upper bound on parallel builds (memory is checked before each start).")
@click.option("--timeout", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Seconds per build before it is killed [default: 900 + 2 per MiB of the stage's weights].")
@click.option("--hang-factor", type=FiniteFloat(min=0), default=HANG_FACTOR, show_default=True, metavar="X",
              help="Stop a build as a hang once its process tree used X times the CPU time the builds that finished "
                   "before it predict for its size (and at least --hang-floor), then retry it with the optimiser "
                   "rule its log stopped after turned off and, failing that, reduce it to the ops that hang it "
                   "(they move to the host); 0: only --timeout stops a build.")
@click.option("--hang-floor", type=FiniteFloat(min=0), default=HANG_FLOOR_S, show_default=True, metavar="SECONDS",
              help="CPU seconds no build is stopped as a hang before.")
@click.option("--fallback-toolkit", default=None, help="Retry failed stages with this toolkit version.")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Build cache shared between plans, in addition to the plan's rknn/ folder "
                   "[default: $RKPART_CACHE_DIR/rknn or ~/.cache/rkpart/rknn; see `rkpart cache info`].")
@click.option("--no-cache", is_flag=True, help="Neither reuse nor fill the shared build cache.")
@click.option("--stage", "stage_ids", multiple=True, metavar="ID",
              help="Build only this NPU stage (repeatable); the others keep their artifacts.")
@click.option("--retry-failed", is_flag=True, help="Rebuild stages whose crash the cache remembers.")
@click.option("--rewrites/--no-rewrites", default=True, show_default=True,
              help="Apply rkpart's NPU rewrites (patterns the toolkit would put on the CPU or store padded, and "
                   "constants a stage holds twice stored once; each kept only if exact under ONNX Runtime; a "
                   "stage whose build fails with them is rebuilt without the one at fault). Opset lowering "
                   "happens either way.")
@click.option("--skip-rewrite", "skip_rewrites", multiple=True, metavar="NAME",
              type=click.Choice(SKIPPABLE_REWRITES),
              help="Leave out this NPU rewrite and apply the others (repeatable): to weigh what one rewrite costs "
                   "or saves, e.g. device memory. Names: docs/compile.md's rewrite table.")
@click.option("--weigh-rewrites/--no-weigh-rewrites", default=True, show_default=True,
              help="A rewrite that changes only a layout (heads-table-layout, rope-halves) is kept in a stage only "
                   "when the compiler's figures say it helps: the first stage of each anatomy is built once more "
                   "without it (cached), fewer CPU layers win, then less device memory. --no-weigh-rewrites "
                   "applies it wherever it matches.")
@click.option("--repartition", is_flag=True,
              help="After the build, move every op it put on the CPU inside an NPU stage to the host and cut every "
                   "stage whose build crashed in front of the ops the optimiser fused before the crash (a failure no "
                   "cut fixes, or a build that never returns, is reduced to the ops that cause it, which move to "
                   "the host): partition "
                   "the plan's model again (same strategy and options) into PLAN and build again, only the stages "
                   "that changed (the rest come from the build cache); repeat until no NPU stage has a CPU layer "
                   "or failed, or nothing more can move.")
@click.option("--strict-npu", is_flag=True,
              help="Fail a stage that still has layers placed on the CPU (exit status 7, like any failed stage).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: builds are subprocesses of this machine. ray: builds are Ray tasks on a cluster "
                   "(needs rkpart[ray] on every node; docs/compile.md).")
@click.option("--address", default=None, metavar="ADDR",
              help="ray: cluster address (auto, HOST:6379, ray://HOST:10001) [default: $RAY_ADDRESS, else a "
                   "local one-node Ray].")
@click.option("--precision", type=click.Choice(["fp16", "int8", "hybrid"]), default="fp16", show_default=True,
              help="fp16, int8 (w8a8: int8 weights and activations, from --calibration) or hybrid (int8 with "
                   "the layers accuracy_analysis measures worst kept in float16) for every NPU stage "
                   "--precision-spec does not name.")
@click.option("--calibration", type=click.Path(file_okay=False), default=None, metavar="CALIB",
              help="Calibration folder from `rkpart calibrate` (needed by int8 and hybrid; with fp16 it only "
                   "runs the fp16 range check).")
@click.option("--quantized-algorithm", type=click.Choice(["normal", "mmse", "kl_divergence"]), default="normal",
              show_default=True, help="rknn-toolkit2's quantized_algorithm for int8 and hybrid stages.")
@click.option("--precision-spec", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="YAML/JSON choosing the precision per stage id, region or kind "
                   "(stages: {b00.ffn: int8}, regions: {attn: fp16}, kinds: {...}, default: ...).")
@toolkits_dir_option
@quiet_option
@json_option(help="Print a machine-readable summary on stdout.")
@user_errors
def compile_cmd(plan: str, toolkit_v: str, target: str, rknn_config: JsonObject, jobs: int,
                timeout: float | None, hang_factor: float, hang_floor: float, fallback_toolkit: str | None,
                cache_dir: str | None, no_cache: bool,
                stage_ids: tuple[str, ...], retry_failed: bool, rewrites: bool, skip_rewrites: tuple[str, ...],
                weigh_rewrites: bool, repartition: bool, strict_npu: bool,
                executor: str, address: str | None, precision: str, calibration: str | None,
                quantized_algorithm: str, precision_spec: str | None, toolkits_dir: str | None, quiet: bool,
                as_json: bool) -> None:
    """Build every NPU stage of PLAN into an .rknn file with rknn-toolkit2."""
    from rkpart.compile.compile import CompileOptions

    if no_cache and cache_dir:
        raise click.UsageError("--no-cache and --cache-dir contradict each other")
    if skip_rewrites and not rewrites:
        raise click.UsageError("--skip-rewrite leaves one rewrite out of the others: it cannot go with --no-rewrites")
    if address and executor != "ray":
        raise click.UsageError("--address applies to --executor ray only")
    if repartition and (no_cache or stage_ids):
        raise click.UsageError("--repartition rebuilds the stages that change and takes the others from the build "
                               "cache: it cannot be combined with --no-cache or --stage")
    opts = CompileOptions(toolkit=toolkit_v, target=target, config=rknn_config, jobs=jobs, timeout=timeout,
                          fallback_toolkit=fallback_toolkit, toolkits_dir=toolkits_dir, shared_cache=cache_dir,
                          retry_failed=retry_failed, cache=not no_cache, stages=stage_ids,
                          rewrites=rewrites, skip_rewrites=frozenset(skip_rewrites), weigh_rewrites=weigh_rewrites,
                          strict_npu=strict_npu,
                          executor=executor, address=address,
                          precision=precision, calibration=calibration, quantized_algorithm=quantized_algorithm,
                          precision_spec=precision_spec, hang_factor=hang_factor, hang_floor=hang_floor)
    rounds: list[RepartitionRound] = []
    stuck: list[str] = []
    with Reporter(quiet=quiet) as progress:
        if repartition:
            from rkpart.repartition import compile_repartition

            report, rounds, stuck = compile_repartition(plan, opts, progress)
        else:  # a stage that never returns is reduced as --repartition reduces it (rkpart.compile.hang)
            from rkpart.repartition import compile_reducing_hangs

            report, rounds = compile_reducing_hangs(plan, opts, progress)
    emit(as_json, lambda: {**report.to_json(), **({"repartition": _rounds_json(rounds, stuck)} if repartition else
                                                  {"hang_reduction": _rounds_json(rounds, stuck)} if rounds else {})},
         lambda: "\n".join([format_summary(report), *_plan_precision_line(report), *(r.describe() for r in rounds),
                            *([f"CPU layers no repartition can move: {', '.join(stuck)}"] if stuck else [])]))
    if report.failed:
        disk = [o for o in report.failed if o.failures and "no space left on device" in o.failures[-1].message]
        if disk:  # the machine, not the graph: its own exit code (and nothing was cached)
            raise ResourceError(f"stage {disk[0].stage_id}: no space left on device while building; "
                                "free some space and rerun")
        sys.exit(ToolkitError.exit_code)


def _plan_precision_line(report: CompileReport) -> list[str]:
    """A line saying the precisions came from the spec ``--strategy auto`` recorded in the plan."""
    prec = report.settings.get("precision") or {}
    if not prec.get("spec"):
        return []
    quantized = sorted(f"{sid} {p}" for sid, p in (prec.get("stages") or {}).items() if p != "fp16")
    return [f"precision: as --strategy auto chose it (plan.json strategy.options.precision): {', '.join(quantized)}"]


def _rounds_json(rounds: list[RepartitionRound], stuck: list[str]) -> JsonObject:
    return {"rounds": [{"round": r.round, "moved": list(r.moved), "cpu_layers_before": r.cpu_layers_before,
                        "cpu_layers_after": r.cpu_layers_after, "cut_before": list(r.cut_before),
                        "failed_before": r.failed_before, "failed_after": r.failed_after,
                        "stages_built": r.stages_built, "kept_best": r.kept_best, "undone": r.undone,
                        "checked": list(r.checked)} for r in rounds],
            "unmovable_cpu_layers": stuck}


def format_summary(report: CompileReport) -> str:
    """The summary table printed after a compile."""
    from rkpart.compile.runner import one_line
    from rkpart.compile.weigh import WEIGHED_OUT
    rows = [("stage", "status", "toolkit", "precision", "time s", "peak RSS", ".rknn", "weight MiB", "internal MiB",
             "cycles", "CPU ops")]
    for o in report.outcomes:
        a = o.artifact
        status = o.status + (" (fallback)" if a is not None and a.fallback_reason else "")
        rows.append((
            o.stage_id,
            status,
            a.toolkit if a else o.toolkit,
            a.precision if a else "-",
            f"{o.wall_s:.1f}" if o.status == "built" else "-",
            human_bytes(o.peak_rss_bytes) if o.peak_rss_bytes else "-",
            human_bytes(a.size_bytes) if a else "-",
            *_compiler_columns(a.compiler if a else None),
            (", ".join(a.cpu_ops) or "none") if a else "-",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    for o in report.outcomes:
        if o.failures:  # one line per stage: its last failure, and how many builds failed before it
            f = o.failures[-1]
            more = f" ({len(o.failures)} failed builds; all in plan.json)" if len(o.failures) > 1 else ""
            lines.append(f"{o.stage_id}: {one_line(f.message)}{more} (log: {f.log})")
        dropped: dict[str, list[str]] = {}  # rewrites dropped for one reason share a line
        for name, why in getattr(o, "dropped_rewrites", {}).items():
            dropped.setdefault(one_line(why), []).append(name)
        for why, names in dropped.items():
            if why == one_line(WEIGHED_OUT):
                continue  # said below, with the figures
            lines.append(f"{o.stage_id}: NPU rewrite{'s' if len(names) > 1 else ''} {', '.join(names)} dropped: {why}")
        v = getattr(o, "weighed", None)
        if v is not None and v.with_rewrites is not None:
            lines.append(f"{o.stage_id}: weighed {', '.join(v.rewrites)}: {v.why}")
        if o.artifact is not None and o.artifact.float16_layers:
            lines.append(f"{o.stage_id}: hybrid kept {len(o.artifact.float16_layers)} layer(s) in float16: "
                         + ", ".join(o.artifact.float16_layers))
    lines += range_check_lines(report.settings)
    per_block = report.cpu_ops_per_block()
    if per_block:
        left = sum(len(v) for v in per_block.values())
        counts = ", ".join(f"{k} {len(v)}" for k, v in per_block.items())
        lines.append(f"CPU-fallback ops left in NPU stages: {left} ({counts})")
    plans = [o.artifact.compiler for o in report.outcomes if o.artifact is not None and o.artifact.compiler]
    mems = [p.device_mem_bytes for p in plans if p.device_mem_bytes is not None]
    if mems:
        lines.append(f"compiler's plan (weight + internal memory): largest stage {max(mems) / MIB:.1f} MiB, "
                     f"all stages resident {sum(mems) / MIB:.1f} MiB ({len(mems)} of {len(report.outcomes)} "
                     "stage(s) report it)")
    n = len(report.outcomes)
    lines.append(f"{n} NPU stage(s): {len(report.built)} built, {len(report.cached)} cached, "
                 f"{len(report.failed)} failed in {report.wall_s:.1f} s")
    return "\n".join(lines)


def _compiler_columns(plan: CompilerPlan | None) -> tuple[str, str, str]:
    """Weight MiB, internal MiB and Σ Total cycles of a build's compiler plan ("-" where the log had none)."""
    if plan is None:
        return ("-", "-", "-")

    def m(v: int | None) -> str:
        return "-" if v is None else f"{v / MIB:.1f}"

    cycles = "-" if plan.cycles_total is None else f"{plan.cycles_total:.3g}"
    return (m(plan.weight_bytes), m(plan.internal_bytes), cycles)


def range_check_lines(settings: JsonMap) -> list[str]:
    """The fp16 range check of a compile given --calibration (nothing without one)."""
    if "fp16_range" not in settings:
        return []
    from rkpart.compile.calibration import RangeFinding

    found = [RangeFinding.from_json(f) for f in settings["fp16_range"]]
    if not found:
        return [f"fp16 range: ok ({settings.get('fp16_range_checked', 0)} activation tensors of the calibration "
                "loop, none near fp16's limits)"]
    return [f.describe() for f in found]


@click.group("cache")
def cache() -> None:
    """Show or prune the user-level build cache (every .rknn built here, reused by any plan)."""


_cache_dir = click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                          help="The cache [default: $RKPART_CACHE_DIR/rknn or ~/.cache/rkpart/rknn].")


def _root(cache_dir: str | None) -> Path:
    from rkpart.compile.user_cache import user_cache_dir

    return Path(cache_dir) if cache_dir else user_cache_dir()


@cache.command("info")
@_cache_dir
@json_option()
def cache_info(cache_dir: str | None, as_json: bool) -> None:
    """Where the build cache is, how many builds it holds and their size per toolkit."""
    from rkpart.compile.user_cache import info

    d = info(_root(cache_dir))
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return
    click.echo(f"build cache: {d['path']}{'' if d['exists'] else ' (empty: nothing built yet)'}")
    click.echo(f"{d['entries']} build(s), {human_bytes(d['bytes'])}; {d['failures']} remembered failure(s); "
               f"{d['verdicts']} weighed-rewrite verdict(s)")
    for v, t in d["toolkits"].items():
        click.echo(f"  rknn-toolkit2 {v:<8} {t['entries']:>5} build(s)  {human_bytes(t['bytes'])}")


@cache.command("prune")
@_cache_dir
@click.option("--max-size", default=None, metavar="SIZE",
              help="Keep the most recently used builds that fit in SIZE (e.g. 20G, 500M).")
@click.option("--older-than", type=FiniteFloat(min=0), default=None, metavar="DAYS",
              help="Remove builds (and weighed-rewrite verdicts) not used for DAYS days.")
@click.option("--toolkit", "toolkits", multiple=True, metavar="VERSION", help="Remove the builds of VERSION.")
@click.option("--failures", is_flag=True, help="Forget remembered build failures (crashes are retried next time).")
@click.option("--all", "everything", is_flag=True, help="Remove everything (builds, failures and verdicts).")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@user_errors
def cache_prune(cache_dir: str | None, max_size: str | None, older_than: float | None, toolkits: tuple[str, ...],
                failures: bool, everything: bool, dry_run: bool) -> None:
    """Remove builds from the cache (plans keep their own copies in their rknn/ folders)."""
    from rkpart.compile.user_cache import parse_size, prune, prune_verdicts

    root = _root(cache_dir)
    gone = prune(root, max_bytes=None if max_size is None else parse_size(max_size), older_than_days=older_than,
                 toolkits=toolkits, failures=failures, everything=everything, dry_run=dry_run)
    n_verdicts = prune_verdicts(root, older_than_days=older_than, everything=everything, dry_run=dry_run)
    builds = [e for e in gone if not e.failure]
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {len(builds)} build(s) ({human_bytes(sum(e.size_bytes for e in builds))}), "
               f"{len(gone) - len(builds)} remembered failure(s) and {n_verdicts} weighed-rewrite verdict(s) "
               f"from {root}")


#: commands for rkpart.cli:main
COMMANDS = (toolkit, compile_cmd, cache)
