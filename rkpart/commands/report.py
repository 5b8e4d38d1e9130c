"""``rkpart report``: a self-contained HTML page about a plan and its measurements."""

from __future__ import annotations

from pathlib import Path

import click

from rkpart.cli_args import POSITIVE_MIB, OutputFile, quiet_option, user_errors


@click.command("report")
@click.argument("plan", type=click.Path(path_type=Path))
@click.argument("profiles", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=OutputFile(), default=Path("report.html"),
              show_default=True, help="HTML page to write; plots (PNG) and tables (CSV) go to <stem>_files/.")
@click.option("--run", "runs", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="`rkpart run --per-stage --json` output with per-stage errors (repeatable).")
@click.option("--cost-model", default=None, metavar="FILE|shipped",
              help="Compare this cost model's predictions with the profiles ('shipped': the RK3588 calibration).")
@click.option("--budget-mib", type=POSITIVE_MIB, default=None,
              help="Memory budget line in the memory timeline [default: the plan's --budget-mib, if any].")
@click.option("--force", is_flag=True, help="Replace an existing report.")
@quiet_option
@user_errors
def report(plan: Path, profiles: tuple[Path, ...], output: Path, runs: tuple[Path, ...], cost_model: str | None,
           budget_mib: float | None, force: bool, quiet: bool) -> None:
    """Write an HTML report of PLAN and PROFILES (JSON Lines from `rkpart profile`, any plans).

    \b
    The page shows the stage map with NPU coverage, compile outcomes and CPU-fallback ops,
    per-block lifecycle latency per profile side by side, the memory timeline per round,
    per-stage accuracy (--run) and cost-model predictions against measurements (--cost-model).
    It needs no network; the same plots are written as PNG and the tables as CSV.
    """
    from rkpart.progress import Reporter
    from rkpart.report.build import build_report

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        from rkpart.errors import UserError

        raise UserError("rkpart report needs matplotlib: pip install 'rkpart[report]'") from None
    with Reporter(quiet=quiet) as say:
        res = build_report(plan, profiles, output, runs=runs, cost_model=cost_model, budget_mib=budget_mib,
                           force=force, progress=say)
    click.echo(f"report: {res.html}  ({len(res.files)} files in {res.assets})")
