"""Click command ``rkpart profile``: profile a plan, or compare two profiles.

Thin layer: options (shared groups from :mod:`rkpart.cli_args`) become one frozen
:class:`rkpart.profile.run.ProfileOptions` passed to :func:`rkpart.profile.run.run_profile`;
the command only prints progress (stderr) and the tables (stdout) and picks the exit code.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from rkpart.cli_args import (
    ROUNDS,
    SAMPLE_INTERVAL,
    STEPS,
    WARMUP,
    output_file_option,
    quiet_option,
    residency_option,
    seed_option,
    threads_type,
    toolkit_option,
    user_errors,
)
from rkpart.profile.run import ProfileOptions, run_profile
from rkpart.profile.smaps import DEFAULT_DEVICE_PATTERN
from rkpart.progress import Reporter
from rkpart.runtime import BACKENDS, CORE_MASK_CHOICES
from rkpart.types import JsonObject


def _check_regex(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        re.compile(value)
    except re.error as e:
        raise click.BadParameter(f"{value!r} is not a regular expression: {e}") from None
    return value


@click.command("profile")
@click.argument("plan", required=False, type=click.Path(exists=True))
@click.option("--backend", type=click.Choice(BACKENDS), default="ort", show_default=True,
              help="ort: ONNX Runtime anywhere; rknn-sim: toolkit simulator (x86); rknnlite: the board.")
@toolkit_option(help="rknn-toolkit2 version (rknn-sim: simulator to use; "
                     "rknnlite: refuse artifacts built by another version).")
@click.option("--rounds", type=ROUNDS, default=3, show_default=True, help="Measured rounds.")
@click.option("--warmup", type=WARMUP, default=1, show_default=True,
              help="Rounds run first and excluded from the summary (recorded with warmup=true).")
@click.option("--cfg/--no-cfg", default=True, show_default=True,
              help="Two passes per step (conditional + unconditional) or one.")
@click.option("--steps", type=STEPS, default=1, show_default=True, help="Denoising steps per round.")
@residency_option(help="per-stage: load/init/infer/release every stage each pass; resident: load once per round; "
                      "plan: as the plan chose per block (auto strategy), per-stage where it chose nothing.")
@click.option("--device-pattern", default=DEFAULT_DEVICE_PATTERN, callback=_check_regex, show_default=True,
              help="Regex of smaps pathnames counted as NPU device memory.")
@click.option("--no-device-pss", is_flag=True, help="Do not read device PSS (reads smaps_rollup only).")
@click.option("--core-mask", type=click.Choice(CORE_MASK_CHOICES), default="auto", show_default=True,
              help="NPU cores for rknnlite (RKNNLite.NPU_CORE_*).")
@click.option("--interval", "sample_interval", type=SAMPLE_INTERVAL, default=0.05, show_default=True,
              help="Seconds between background memory samples (0: snapshots only).")
@seed_option
@click.option("--infer-repeat", type=ROUNDS, default=1, show_default=True,
              help="Inference calls per stage and pass; infer_s is their median, every call is recorded "
                   "(for a machine busy with other jobs).")
@click.option("--threads", type=threads_type(), default=0, show_default=True,
              help="ONNX Runtime intra-op threads for ort and host stages (0: ORT default, one per core; "
                   "1: a stage's own cost on a shared machine; at most 4 per core).")
@output_file_option(help="Where to write the JSON Lines records (required with PLAN).")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it is a profile rkpart wrote.")
@click.option("--compare", nargs=2, type=click.Path(exists=True, dir_okay=False), default=None,
              metavar="A.jsonl B.jsonl", help="Print the write-up's tables for two profiles side by side.")
@click.option("--show", type=click.Path(exists=True, dir_okay=False), default=None, metavar="A.jsonl",
              help="Print the tables of one profile.")
@click.option("--block", type=int, default=None,
              help="With PLAN: run only this block's stages (inputs from one run of the stages before it); "
                   "with --show/--compare: report only this block.")
@click.option("--baseline", is_flag=True,
              help="Also time the whole model every round and report the plan's overhead against it.")
@click.option("--model", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Whole model for --baseline [default: the plan's source model, if it is found].")
@click.option("--no-snapshots", is_flag=True,
              help="No synchronous memory snapshots around calls (the sampler thread still runs).")
@click.option("--against", type=click.Path(exists=True, dir_okay=False), default=None, metavar="MODEL.json",
              help="Also print the cost model's prediction error per stage and component for this profile, "
                   "when it was measured on a backend the model was (else a note says why not).")
@quiet_option
@user_errors
def profile(
    plan: str | None,
    backend: str,
    toolkit: str | None,
    rounds: int,
    warmup: int,
    cfg: bool,
    steps: int,
    residency: str,
    device_pattern: str | None,
    no_device_pss: bool,
    core_mask: str,
    sample_interval: float,
    seed: int,
    infer_repeat: int,
    threads: int,
    output: Path | None,
    force: bool,
    compare: tuple[str, str] | None,
    show: str | None,
    block: int | None,
    baseline: bool,
    model: str | None,
    no_snapshots: bool,
    against: str | None,
    quiet: bool,
) -> None:
    """Profile PLAN's lifecycle latency and memory, or compare two profiles.

    \b
    rkpart profile build/plan.json --backend ort --rounds 3 -o split.jsonl
    rkpart profile --compare split.jsonl fused.jsonl
    rkpart profile --show split.jsonl --against rk3588.json
    """
    from rkpart.profile import records as rec
    from rkpart.profile.report import render_compare, render_single

    if against is not None and compare is not None:
        raise click.UsageError("--against goes with PLAN or --show A, not --compare")
    modes = sum(x is not None for x in (plan, compare, show))
    if modes != 1:
        raise click.UsageError("give exactly one of PLAN, --compare A B or --show A")
    if compare is not None:
        a_path, b_path = compare
        a = rec.single_run(rec.read_jsonl(a_path), where=a_path)
        b = rec.single_run(rec.read_jsonl(b_path), where=b_path)
        click.echo(render_compare(a, b, names=(a_path, b_path), block=block), nl=False)
        return
    if show is not None:
        recs = rec.single_run(rec.read_jsonl(show), where=show)
        click.echo(render_single(recs, name=show, block=block), nl=False)
        _against(against, recs, Path(show))
        return
    assert plan is not None
    if baseline and block is not None:
        raise click.UsageError("--baseline times the whole model; use it without --block")
    if output is None:
        raise click.UsageError("-o/--output OUT.jsonl is required when profiling a plan")
    from rkpart.output import claim_output_file, json_format_is

    claim_output_file(output, what="profile output", force=force,
                      owned=json_format_is(rec.RECORD_FORMAT, first_line=True),
                      inputs=[p for p in (plan, model, against) if p is not None])
    opts = ProfileOptions(
        plan=plan, backend=backend, output=Path(output), toolkit=toolkit, rounds=rounds, warmup=warmup,
        cfg=cfg, steps=steps, residency=residency, device_pattern=None if no_device_pss else device_pattern,
        core_mask=core_mask, sample_interval=sample_interval, seed=seed, infer_repeat=infer_repeat,
        threads=threads, block=block, baseline=baseline, model=model, snapshots=not no_snapshots,
    )
    with Reporter(quiet=quiet) as say:
        run = run_profile(opts, progress=say, warn=lambda w: click.echo(f"rkpart: warning: {w}", err=True))
    records = run.to_json()  # the lines written to OUTPUT
    click.echo(render_single(records, name=str(output), block=block), nl=False)
    click.echo(f"wrote {len(run.lines)} records to {output}", err=True)
    _against(against, records, Path(output))


def _against(model_path: str | None, records: list[JsonObject], path: Path) -> None:
    """Predicted vs measured per component (``--against``), only when the profile was measured on
    the device the model is for (as the report): an x86 ONNX Runtime profile against the board's
    calibration would print the devices' difference as the model's error."""
    if model_path is None:
        return
    from rkpart.cost_model.calibration import render_comparison
    from rkpart.report.data import Profile, cost_model_rows

    comparison = cost_model_rows([Profile(name=str(path), path=path, records=records)], model_path)
    if not comparison.compared:
        click.echo(f"rkpart: note: not compared: {comparison.not_compared[0]}; compare with a model fitted on "
                   f"profiles of this device (rkpart fit {path} -o model.json)", err=True)
        return
    click.echo(f"predicted by {model_path} vs measured:")
    click.echo(render_comparison([{k: v for k, v in r.items() if k != "profile"} for r in comparison.rows]),
               nl=False)
