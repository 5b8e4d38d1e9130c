"""``rkpart fit``: fit a cost model from profile records and print its held-out error."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from rkpart.cli_args import FOLDS, emit, json_option, output_file_option
from rkpart.cost_model.model import COMPONENTS

if TYPE_CHECKING:
    from rkpart.cost_model.calibration import FitReport
    from rkpart.cost_model.model import ErrorSummary


@click.command("fit")
@click.argument("profiles", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@output_file_option(required=True, help="Cost model JSON to write.")
@click.option("--base", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Start from this model (e.g. the shipped calibration) and refit only what the profiles "
                   "measure [default: fit from scratch].")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it is a cost model rkpart wrote.")
@click.option("--mix-backends", is_flag=True,
              help="Allow --base measured on another backend than the profiles (e.g. RK3588 memory with ONNX "
                   "Runtime timings); recorded in the model's provenance.")
@click.option("--folds", type=FOLDS, default=0, show_default=True,
              help="k-fold over profiled plans instead of leave-one-plan-out (0).")
@click.option("--statistic", type=click.Choice(["median", "min"]), default="median", show_default=True,
              help="Per stage, the median of the measured calls, or the fastest (for a machine busy with "
                   "other jobs).")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="Inference as wall time, or as process CPU time (profiles record both; CPU time on a "
                   "machine shared with other jobs).")
@json_option(help="Print the error report as JSON.")
def fit(profiles: tuple[Path, ...], output: Path, base: Path | None, force: bool, mix_backends: bool, folds: int,
        statistic: str, clock: str, as_json: bool) -> None:
    """Fit a cost model from PROFILES (JSON Lines from `rkpart profile`) and write it to OUTPUT.

    Prints, per component, the share of held-out predictions within +-10 % and +-20 % and
    the median absolute percentage error (leave-one-plan-out cross-validation; several runs
    of the same plan are pooled into one sample per stage).
    """
    from rkpart.cost_model.calibration import FitOptions, run_fit
    from rkpart.cost_model.model import MODEL_FORMAT
    from rkpart.output import claim_output_file, json_format_is

    claim_output_file(output, what="cost model", force=force, owned=json_format_is(MODEL_FORMAT),
                      inputs=[*profiles, *([base] if base is not None else [])])
    _, report = run_fit(FitOptions(profiles, output, base=base, folds=folds, statistic=statistic,
                                   mix_backends=mix_backends, clock=clock))
    emit(as_json, report.to_json, lambda: render_report(report))
    click.echo(f"wrote {output}", err=True)


def render_report(report: FitReport) -> str:
    """``rkpart fit``'s table: held-out error per component, the whole plan, the fitted range."""
    lines = [f"{report.samples} stage samples from {report.runs} profile runs of {report.plans} plans "
             f"({', '.join(report.backends)}, statistic {report.statistic}); "
             f"held-out error ({report.method}):",
             f"  {'component':<11} {'n':>4} {'within 10%':>10} {'within 20%':>10} {'median |err|':>12}  terms"]

    def row(name: str, cv: ErrorSummary, terms: object) -> str:
        w10 = "-" if cv.within_10 is None else f"{cv.within_10 * 100:.0f} %"
        w20 = "-" if cv.within_20 is None else f"{cv.within_20 * 100:.0f} %"
        med = "-" if cv.median_ape is None else f"{cv.median_ape:.1f} %"
        return f"  {name:<11} {cv.n:>4} {w10:>10} {w20:>10} {med:>12}  {terms}"

    for name in COMPONENTS:
        c = report.components.get(name)
        if c is None:
            continue
        terms = dict(c.terms)
        if c.cross_validation is None:
            lines.append(f"  {name:<11} {'':>4} {'':>10} {'':>10} {'':>12}  {terms} (fitted on whole rounds)")
            continue
        lines.append(row(name, c.cross_validation, terms))
    whole = report.whole_plan.error
    lines.append(row("whole plan", whole, f"({whole.method}: predicted rounds vs measured)"))
    if report.fitted_range:
        lines.append("fitted range (predictions outside it are extrapolations): " + ", ".join(
            f"{k} {lo:.3g}..{hi:.3g}" for k, (lo, hi) in sorted(report.fitted_range.items())))
    return "\n".join(lines)
