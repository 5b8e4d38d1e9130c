"""Click command ``rkpart repro``: a thin layer over :func:`rkpart.triage.repro.reproduce`."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from rkpart.cli_util import parse_key_values
from rkpart.errors import UserError
from rkpart.progress import Reporter


def _parse_versions(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    versions = tuple(v.strip() for v in value.split(",") if v.strip())
    if not versions:
        raise click.BadParameter("expected comma-separated toolkit versions, e.g. 2.3.0,2.3.2,2.5.0")
    return versions



@click.command("repro")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--toolkits", "versions", default="2.3.0,2.3.2,2.5.0", show_default=True, callback=_parse_versions,
              help="Comma-separated toolkit versions (or python paths) to build with.")
@click.option("--target", default="rk3588", show_default=True, help="target_platform for RKNN.config.")
@click.option("--fail-regex", default=None,
              help="A build fails iff this regex matches its log (default: same signal / exit code).")
@click.option("--max-time", type=click.FloatRange(min=0, min_open=True), default=1800.0, show_default=True,
              help="Seconds the whole run may take (checked before each reduction build).")
@click.option("--timeout", "build_timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds per build before it is killed [default: none for the matrix, "
                   "5x the reference build (at least 60) for reduction candidates].")
@click.option("--reduce-with", default=None, help="Failing version to reduce against [default: the first failing].")
@click.option("--no-reduce", is_flag=True, help="Only build the matrix.")
@click.option("--opt-level", type=click.IntRange(0, 3), default=None, help="RKNN.config optimization_level.")
@click.option("--config", "config", multiple=True, callback=parse_key_values, metavar="KEY=VALUE",
              help="Any other RKNN.config option (value parsed as JSON when possible).")
@click.option("--out", "-o", "out", type=click.Path(file_okay=False), default="repro", show_default=True,
              help="Artifact folder.")
@click.option("--force", is_flag=True, help="Replace the artifacts in a non-empty --out (keeps the build cache).")
@click.option("--toolkits-dir", type=click.Path(file_okay=False), default=None,
              help="Where toolkit venvs live (default $RKPART_TOOLKITS_DIR or ~/.cache/rkpart/toolkits).")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary on stdout.")
def repro(model: str, versions: tuple[str, ...], target: str, fail_regex: str | None, max_time: float,
          build_timeout: float | None, reduce_with: str | None, no_reduce: bool, opt_level: int | None,
          config: dict[str, Any], out: str, force: bool, toolkits_dir: str | None, quiet: bool,
          as_json: bool) -> None:
    """Find which toolkit versions fail on MODEL and shrink it to a minimal reproducer.

    \b
    Builds MODEL (a model or a plan stage) with each version in its own process, prints the
    version x outcome table, delta-debugs the graph against the first failing version to a
    minimal subgraph that fails the same way, and writes OUT/: reduced.onnx, repro.py (plain
    rknn-toolkit2 API), matrix.json and README.md (bug-report text).
    Exit status: 0 when a reproducer was written (or with --no-reduce, the matrix), 1 when
    no version fails.
    """
    from rkpart.triage.repro import reproduce

    cfg = dict(config)
    if opt_level is not None:
        cfg["optimization_level"] = opt_level
    try:
        with Reporter(quiet=quiet) as progress:
            report = reproduce(model, out, versions, target=target, config=cfg, fail_regex=fail_regex,
                               max_time=max_time, build_timeout=build_timeout, reduce_with=reduce_with,
                               reduce=not no_reduce, toolkits_dir=toolkits_dir, force=force, progress=progress)
    except UserError as e:
        click.echo(f"rkpart: error: {e}", err=True)
        sys.exit(e.exit_code)
    click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True) if as_json else report.summary())
    if not report.original.failing:
        sys.exit(1)


#: commands for rkpart.cli:main (registered by its _register_optional)
COMMANDS = (repro,)
