"""``rkpart bundle``: write the board folder of a compiled plan."""

from __future__ import annotations

import json
from pathlib import Path

import click

from rkpart.cli_args import SEED, FiniteFloat, json_option, quiet_option, residency_option, user_errors
from rkpart.runtime.board_runner import CORE_MASKS, DEFAULT_MAX_ABS_REL


@click.command("bundle")
@click.argument("plan", type=click.Path(path_type=Path))
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Bundle folder to write (copy it to the board).")
@residency_option(help="NPU stage sessions on the board: released after each use (per-stage), kept for the whole "
                      "loop (resident), or as the plan chose per block (auto strategy; per-stage where it chose "
                      "nothing).")
@click.option("--core-mask", type=click.Choice(tuple(CORE_MASKS)), default="auto", show_default=True,
              help="NPU cores for RKNNLite.init_runtime.")
@click.option("--model", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Whole model for the reference outputs [default: the plan's source model].")
@click.option("--inputs", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=".npz of reference inputs [default: seeded random inputs].")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the random reference inputs.")
@click.option("--min-cosine", type=FiniteFloat(-1, 1), default=0.999, show_default=True,
              help="The runner's default gate: minimum cosine against the reference outputs.")
@click.option("--max-abs-rel", type=FiniteFloat(min=0), default=DEFAULT_MAX_ABS_REL, show_default=True,
              help="The runner's default gate: max abs error / max |reference| (fp16 on the NPU: ~6e-4 on the "
                   "example; weights off by 1 % fail it).")
@click.option("--force", is_flag=True, help="Replace an existing bundle folder.")
@quiet_option
@json_option(help="Print the manifest summary as JSON.")
@user_errors
def bundle(plan: Path, out: Path, residency: str, core_mask: str, model: Path | None, inputs: Path | None,
           seed: int, min_cosine: float, max_abs_rel: float | None, force: bool, quiet: bool, as_json: bool) -> None:
    """Write a self-contained board folder for the compiled PLAN.

    \b
    On the board (numpy, onnxruntime and rknn-toolkit-lite2 installed):
      python OUT/runner.py                 # runs ref_inputs.npz, gates against ref_outputs.npz
    """
    from rkpart.bundle.build import bundle_plan
    from rkpart.partitioner.plan import load_plan
    from rkpart.progress import Reporter
    from rkpart.runtime.executor import load_inputs

    feeds = load_inputs(inputs, load_plan(plan)[0]) if inputs is not None else None
    with Reporter(quiet=quiet) as say:
        res = bundle_plan(plan, out, residency=None if residency == "plan" else residency, core_mask=core_mask,
                          model=model, inputs=feeds, seed=seed,
                          min_cosine=min_cosine, max_abs_rel=max_abs_rel, force=force, progress=say)
    m = res.manifest
    summary = {"bundle": str(out), "files": len(m["files"]), "size_bytes": res.size_bytes,
               "npu_stages": m["plan"]["npu_stages"], "host_stages": m["plan"]["host_stages"],
               "residency": m["residency"], "core_mask": m["core_mask"], "toolkit": m["toolkit"]}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"bundle: {out}  {summary['npu_stages']} NPU + {summary['host_stages']} host stages, "
               f"{summary['files']} files, {res.size_bytes / 2**20:.1f} MiB, residency {'/'.join(m['residency'])}, "
               f"core mask {core_mask}, toolkit {m['toolkit']}")
    click.echo(f"on the board: python {out / 'runner.py'}")
