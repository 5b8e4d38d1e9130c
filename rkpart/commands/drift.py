"""Click command ``rkpart drift``: a denoising loop through each plan on ONNX Runtime and in
the rknn-toolkit2 simulator, compared per step and per block (:mod:`rkpart.profile.drift`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from rkpart.cli_args import (
    GUIDANCE,
    SEED,
    SHIFT,
    SIM_MEMORY_MIB,
    STEPS,
    OutputFile,
    build_options,
    embeds_option,
    emit,
    json_option,
    quiet_option,
    role_options,
    toolkit_option,
    toolkits_dir_option,
    user_errors,
)
from rkpart.progress import Reporter
from rkpart.types import JsonObject

if TYPE_CHECKING:
    from rkpart.roles import RoleFlags


@click.command("drift")
@click.argument("plans", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--steps", type=STEPS, default=4, show_default=True, help="Denoising steps.")
@click.option("--cfg/--no-cfg", default=None,
              help="Classifier-free guidance: a conditional and an unconditional pass per step [default: as the "
                   "plan's pipeline.json says (none for guidance-distilled models); --cfg without one].")
@click.option("--guidance", type=GUIDANCE, default=None,
              help="CFG scale, or the guidance fed to a guidance-distilled model [default: the pipeline.json's, "
                   "4.0 without one].")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the latent and the conditioning.")
@click.option("--shift", type=SHIFT, default=1.0, show_default=True,
              help="Sigma shift of the flow-matching schedule: shift*s/(1+(shift-1)*s) (1: equal steps).")
@toolkit_option(required=True, help="rknn-toolkit2 version whose simulator runs the NPU stages (e.g. 2.5.0).")
@build_options
@toolkits_dir_option
@click.option("--blocks/--no-blocks", "show_blocks", default=True, show_default=True,
              help="Print per-block rows too (the latent rows are always printed).")
@click.option("--sim-memory", "sim_memory_mib", type=SIM_MEMORY_MIB, default=None, metavar="MIB",
              help="Memory the simulator's workers may hold together, in MiB; over it, idle stages are "
                   "evicted and rebuilt when next used, up to 16 TiB [default: 70% of the available memory].")
@role_options
@embeds_option
@click.option("--accuracy", "accuracy_out", type=OutputFile(), default=None,
              help="Write the cost model's accuracy term measured by this table (JSON) to this file.")
@click.option("--force", is_flag=True, help="Replace the --accuracy file if it is an accuracy table rkpart wrote.")
@quiet_option
@json_option(help="Print the table as JSON.")
@user_errors
def drift(plans: tuple[str, ...], steps: int, cfg: bool | None, guidance: float | None, seed: int, shift: float,
          toolkit: str, target: str,
          rknn_config: JsonObject, toolkits_dir: str | None, show_blocks: bool, sim_memory_mib: int | None,
          role_flags: RoleFlags, embeds: Path | None, accuracy_out: Path | None, force: bool, quiet: bool,
          as_json: bool) -> None:
    """Measure how far PLANS (split, fused, auto's choice, int8 / hybrid builds of one plan...)
    drift from ONNX Runtime over a flow-matching denoising loop in the rknn-toolkit2 simulator:
    cosine, max-abs and MSE of the latent per step and of each block's output.  A plan compiled
    int8 or hybrid is labelled so (split[int8]:DIR) and is its own accuracy family.

    The NPU stages share one simulator worker per toolkit (bounded by --sim-memory); CFG's two
    passes run stage by stage, so a stage evicted to fit is rebuilt once per step.

    The roles of the inputs come from each plan's pipeline.json (recorded by rkpart partition),
    else from --latent-input/--timestep-input/--guidance-input/--context-input, else from
    shapes (said, and a tie refused).  Masks get all-valid, id grids their pipeline values;
    --embeds gives the conditioning.  A NaN/Inf row names the first stage output that was not
    finite and the inputs it read."""
    from rkpart.compile.precision import plan_precision
    from rkpart.errors import GateError
    from rkpart.plan.plan import load_plan
    from rkpart.profile.drift import check_roles, nonfinite_rows, render
    from rkpart.profile.drift import drift as run_drift
    from rkpart.runtime.rknn_sim import RknnSimBackend

    if accuracy_out is not None:  # before the run: minutes of simulation must not end in "cannot write"
        from rkpart.cost_model.drift_accuracy import is_accuracy_table
        from rkpart.output import claim_output_file

        accuracy_out = claim_output_file(accuracy_out, what="accuracy table", force=force, owned=is_accuracy_table,
                                         inputs=plans)
    loaded = []
    for p in plans:
        plan, folder = load_plan(p)
        prec = plan_precision(plan)  # precision variants of one plan side by side (issue 27)
        loaded.append((f"{plan.strategy['name']}{'' if prec == 'fp16' else f'[{prec}]'}:{folder.name}", plan, folder))
    check_roles(loaded, role_flags, embeds, cfg)  # one line now, not after the simulator is set up
    backend = RknnSimBackend(toolkit, target=target, config=rknn_config, toolkits_dir=toolkits_dir,
                             memory_budget=None if sim_memory_mib is None else sim_memory_mib << 20)
    with Reporter(quiet=quiet) as say:
        rows = run_drift(loaded, backend, steps=steps, cfg=cfg, guidance=guidance, seed=seed, progress=say,
                         shift=shift, flags=role_flags, embeds=embeds)
    emit(as_json, lambda: {"steps": steps, "cfg": cfg, "guidance": guidance, "seed": seed, "shift": shift,
                           **({"embeds": str(embeds)} if embeds is not None else {}),
                           "rows": [r.to_json() for r in rows]}, lambda: render(rows, blocks=show_blocks))
    bad = nonfinite_rows(rows)
    if bad:  # printed above, but a NaN run is a failure, never zero drift
        r = bad[0]
        raise GateError(f"{len(bad)} drift row(s) hold NaN/Inf values (first: plan {r.plan}, step {r.step}, {r.kind}"
                        + (f", block {r.block}" if r.block is not None else "") + ")"
                        + (f"; cause: {r.cause}" if r.cause else ""))
    if accuracy_out is not None:
        from rkpart.cost_model.drift_accuracy import accuracy_from_drift, family_of
        from rkpart.output import write_output_file

        acc = accuracy_from_drift(rows, {label: family_of(plan) for label, plan, _ in loaded})
        write_output_file(accuracy_out, (json.dumps(acc, indent=2, sort_keys=True) + "\n").encode(), force=True,
                          what="accuracy table")
