"""``rkpart bundle``: write the board folder of a compiled plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from rkpart.cli_args import (
    GUIDANCE,
    POSITIVE_MIB,
    SEED,
    SHIFT,
    FiniteFloat,
    OutputFolder,
    json_option,
    quiet_option,
    residency_option,
    role_options,
    user_errors,
)
from rkpart.runtime.board_runner import CORE_MASKS, DEFAULT_MAX_ABS_REL

if TYPE_CHECKING:
    from rkpart.roles import RoleFlags


@click.command("bundle")
@click.argument("plan", type=click.Path(path_type=Path))
@click.option("--out", "-o", type=OutputFolder(), required=True,
              help="Bundle folder to write (copy it to the board).")
@residency_option(help="NPU stage sessions on the board: released after each use (per-stage), kept for the whole "
                      "loop (resident), or as the plan chose per block (auto strategy; per-stage where it chose "
                      "nothing).")
@click.option("--core-mask", default=None, metavar="SPEC",
              help=f"NPU cores for RKNNLite.init_runtime: one mask for every NPU stage ({', '.join(CORE_MASKS)}) "
                   "or per stage, comma-separated STAGE=MASK items (shell wildcards: '*.ffn=0_1_2,auto'; a bare "
                   "mask for the stages no item names) [default: 0_1_2 for stages whose NPU compute layers all "
                   "split across cores (Conv/Add/Mul and fused forms, from the compiler's layer table), auto for "
                   "the rest and for stages without one].")
@click.option("--model", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Whole model for the reference outputs [default: the plan's source model].")
@click.option("--inputs", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=".npz of reference inputs [default: seeded random inputs].")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the random reference inputs.")
@click.option("--min-cosine", type=FiniteFloat(-1, 1), default=0.999, show_default=True,
              help="The runner's default gate: minimum cosine against the reference outputs.")
@click.option("--max-abs-rel", type=FiniteFloat(min=0, max=1000), default=DEFAULT_MAX_ABS_REL, show_default=True,
              help="The runner's default gate: max abs error / max |reference| (fp16 on the NPU: ~6e-4 on the "
                   "example; weights off by 1 % fail it).")
@role_options
@click.option("--guidance", type=GUIDANCE, default=None,
              help="The loop's default CFG scale (or distilled guidance) [default: the plan's pipeline.json's, 4.0 "
                   "without one].")
@click.option("--shift", type=SHIFT, default=1.0, show_default=True,
              help="The loop's default sigma shift (flow-matching Euler, as rkpart drift).")
@click.option("--cfg-parallel", is_flag=True,
              help="The loop runs the cond and uncond pass of each step at once on NPU cores 0 and 1 (two "
                   "contexts of every NPU stage); refused when those exceed --budget-mib.")
@click.option("--budget-mib", type=POSITIVE_MIB, default=None,
              help="Device memory budget of the run on the board [default: the target's pipeline budget, "
                   "4096 MiB on rk3588].")
@click.option("--vae", type=click.Choice(["auto", "npu", "host", "none"]), default="auto", show_default=True,
              help="The pipeline's VAE decoder (vae_decoder.onnx beside the plan's model, from rkpart export), so the "
                   "runner writes a PNG: npu (partitioned with generic under the budget, compiled with the plan's "
                   "toolkit and gated in its simulator; made once, cached), host (ONNX Runtime on the board's CPU), "
                   "none; auto: npu when the plan has a pipeline.json and the decoder is there, else none.")
@click.option("--vae-plan", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A compiled plan of vae_decoder.onnx made by hand (rkpart partition + compile) to bundle "
                   "instead of making one (--vae npu).")
@click.option("--force", is_flag=True, help="Replace an existing bundle folder.")
@quiet_option
@json_option(help="Print the manifest summary as JSON.")
@user_errors
def bundle(plan: Path, out: Path, residency: str, core_mask: str | None, model: Path | None, inputs: Path | None,
           seed: int, min_cosine: float, max_abs_rel: float | None, role_flags: RoleFlags, guidance: float | None,
           shift: float, cfg_parallel: bool, budget_mib: float | None, vae: str, vae_plan: Path | None, force: bool,
           quiet: bool, as_json: bool) -> None:
    """Write a self-contained board folder for the compiled PLAN.

    \b
    On the board (numpy, onnxruntime and rknn-toolkit-lite2 installed):
      python OUT/runner.py                 # runs ref_inputs.npz, gates against ref_outputs.npz
      python OUT/runner.py --steps 30 --guidance 4.5 [--cfg-parallel]   # a whole denoising loop

    The loop's inputs take their roles from the plan's pipeline.json (rkpart partition records
    it), else from the role flags, else from shapes (a tie leaves the bundle without a loop).
    With a pipeline.json the bundle carries the pipeline's own sampler (its scheduler and config;
    one the board does not reproduce is refused, naming the option) and its VAE decoder (--vae),
    and the runner ends with a PNG:

    \b
      python OUT/runner.py --embeds E.npz --steps 20 --image-out image.png
    """
    from rkpart.board import bundle_pipeline
    from rkpart.bundle.build import BundleOptions
    from rkpart.output import claim_output_folder
    from rkpart.plan.plan import load_plan
    from rkpart.progress import Reporter
    from rkpart.runtime.executor import load_inputs

    claim_output_folder(out, what="bundle folder", inputs=[plan, model, inputs, vae_plan])
    feeds = load_inputs(inputs, load_plan(plan)[0]) if inputs is not None else None
    with Reporter(quiet=quiet) as say:
        opts = BundleOptions(residency=None if residency == "plan" else residency, core_mask=core_mask, model=model,
                             seed=seed, min_cosine=min_cosine, max_abs_rel=max_abs_rel, force=force,
                             latent_input=role_flags.latent, timestep_input=role_flags.timestep,
                             guidance_input=role_flags.guidance, context_inputs=role_flags.context,
                             guidance=guidance, shift=shift, cfg_parallel=cfg_parallel,
                             budget_bytes=None if budget_mib is None else int(budget_mib * 2**20))
        if vae_plan is not None and vae not in ("auto", "npu"):
            raise click.UsageError(f"--vae-plan is a plan of the decoder for the NPU; it does not go with --vae {vae}")
        res = bundle_pipeline(plan, out, opts, vae="npu" if vae_plan is not None else vae, vae_plan_folder=vae_plan,
                              inputs=feeds, progress=say)
    m = res.manifest
    summary = {"bundle": str(out), "files": len(m["files"]), "size_bytes": res.size_bytes,
               "npu_stages": m["plan"]["npu_stages"], "host_stages": m["plan"]["host_stages"],
               "residency": m["residency"], "core_mask": m["core_mask"], "toolkit": m["toolkit"],
               "core_masks": {s["id"]: s["core_mask"] for s in m["stages"] if s["device"] == "npu"},
               "denoise": m["denoise"], "device_memory": m["device_memory"],
               "vae": None if m.get("vae") is None else {
                   "device": m["vae"]["device"], "class": m["vae"].get("class"),
                   "npu_stages": sum(s["device"] == "npu" for s in m["vae"]["stages"]),
                   "host_stages": sum(s["device"] == "host" for s in m["vae"]["stages"]),
                   "plan": m["vae"].get("plan")}}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"bundle: {out}  {summary['npu_stages']} NPU + {summary['host_stages']} host stages, "
               f"{summary['files']} files, {res.size_bytes / 2**20:.1f} MiB, residency {'/'.join(m['residency'])}, "
               f"toolkit {m['toolkit']}")
    by_mask: dict[str, list[str]] = {}
    for sid, mask in summary["core_masks"].items():
        by_mask.setdefault(mask, []).append(sid)
    click.echo("core masks: " + "; ".join(f"{mask}: {', '.join(ids)}" for mask, ids in sorted(by_mask.items())))
    d, dm = m["denoise"], m["device_memory"]
    if "error" in d:
        click.echo(f"denoising loop: not available ({d['error']})")
    else:
        guided = f", guidance {d['guidance_input']}" if d.get("guidance_input") else ""
        fixed = f", fixed {', '.join(d['fixed']['inputs'])}" if d.get("fixed") else ""
        click.echo(f"denoising loop: latent {d['latent']}, timestep {d['timestep']}{guided}, conditioning "
                   f"{', '.join(d['context']) or 'none'}{fixed} ({d['mapped_by']}; {d['cfg_mode']}); cfg-parallel "
                   f"{'on' if d['cfg_parallel'] else 'off'}")
    p = d.get("pipeline") if "error" not in d else None
    if p is not None:
        smp = p["sampler"]
        click.echo(f"pipeline: {p['class']}; sampler {smp['class']}" + (f" ({smp['rule']})" if smp.get("rule") else "")
                   + "; --embeds keys: " + (", ".join(sorted({a for e in p["embeds"].values() for a in
                                                                 (e["argument"], e["negative_argument"]) if a}))
                                             or "none"))
    v = summary["vae"]
    if v is not None:
        where = (f"on the NPU ({v['npu_stages']} NPU + {v['host_stages']} host stages; plan {v['plan']})"
                 if v["device"] == "npu" else "on the host CPU")
        click.echo(f"VAE decoder: {v['class']} {where}")
    click.echo(f"device memory: {dm['run_bytes'] / 2**20:.1f} MiB, {dm['cfg_parallel_run_bytes'] / 2**20:.1f} MiB "
               f"with --cfg-parallel (budget {dm['budget_bytes'] / 2**20:.1f} MiB; from {', '.join(dm['source'])})")
    if v is not None and v["device"] == "npu":
        click.echo(f"check it here (NPU stages on ONNX Runtime): RKPART_RUNNER_NPU_STANDIN={plan}:{v['plan']} "
                   f"python {out / 'runner.py'} --steps 20")
    click.echo(f"on the board: python {out / 'runner.py'}" + (" --embeds E.npz --steps 20 --image-out image.png"
                                                               if v is not None else ""))
