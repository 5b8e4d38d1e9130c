"""Click command ``rkpart repro``: options become one :class:`rkpart.triage.repro.ReproOptions`
for :func:`rkpart.triage.repro.reproduce`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from rkpart.cli_args import (
    FiniteFloat,
    build_options,
    emit,
    force_option,
    json_option,
    out_folder_option,
    quiet_option,
    toolkits_dir_option,
    user_errors,
)
from rkpart.progress import Reporter
from rkpart.types import JsonObject


def _parse_versions(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    versions = tuple(v.strip() for v in value.split(",") if v.strip())
    if not versions:
        raise click.BadParameter("expected comma-separated toolkit versions, e.g. 2.3.0,2.3.2,2.5.0")
    return versions



@click.command("repro")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--toolkits", "versions", default="2.3.0,2.3.2,2.5.0", show_default=True, callback=_parse_versions,
              help="Comma-separated toolkit versions (or python paths) to build with.")
@build_options
@click.option("--fail-regex", default=None,
              help="A build fails iff this regex matches its log (default: same signal / exit code).")
@click.option("--max-time", type=FiniteFloat(min=0, min_open=True), default=1800.0, show_default=True,
              help="Seconds the whole run may take (checked before each reduction build).")
@click.option("--timeout", "build_timeout", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Seconds per build before it is killed [default: none for the matrix, "
                   "5x the reference build (at least 60) for reduction candidates].")
@click.option("--reduce-with", default=None, help="Failing version to reduce against [default: the first failing].")
@click.option("--no-reduce", is_flag=True, help="Only build the matrix.")
@out_folder_option(default="repro", help="Artifact folder.")
@force_option(help="Replace the artifacts in a non-empty --out (keeps the build cache; only a folder holding "
                   "nothing but what rkpart repro writes).")
@toolkits_dir_option
@quiet_option
@json_option(help="Print a machine-readable summary on stdout.")
@user_errors
def repro(model: str, versions: tuple[str, ...], target: str, rknn_config: JsonObject, fail_regex: str | None,
          max_time: float, build_timeout: float | None, reduce_with: str | None, no_reduce: bool, out: Path,
          force: bool, toolkits_dir: str | None, quiet: bool, as_json: bool) -> None:
    """Find which toolkit versions fail on MODEL and shrink it to a minimal reproducer.

    \b
    Builds MODEL (a model or a plan stage) with each version in its own process, prints the
    version x outcome table, delta-debugs the graph against the first failing version to a
    minimal subgraph that fails the same way, and writes OUT/: reduced.onnx, repro.py (plain
    rknn-toolkit2 API), matrix.json and README.md (bug-report text).
    Exit status: 0 when a reproducer was written (or with --no-reduce, the matrix), 1 when
    no version fails.
    """
    from rkpart.output import claim_output_folder
    from rkpart.triage.repro import ReproOptions, reproduce

    claim_output_folder(out, what="repro folder", inputs=[model])

    opts = ReproOptions(versions=versions, target=target, config=rknn_config, fail_regex=fail_regex,
                        max_time=max_time, build_timeout=build_timeout, reduce_with=reduce_with,
                        reduce=not no_reduce, toolkits_dir=toolkits_dir, force=force)
    with Reporter(quiet=quiet) as progress:
        report = reproduce(model, out, opts, progress)
    emit(as_json, report.to_json, report.summary, sort_keys=True)
    if not report.original.failing:
        sys.exit(1)


#: commands for rkpart.cli:main (registered by its _register_optional)
COMMANDS = (repro,)
