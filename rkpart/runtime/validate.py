"""``rkpart run``: execute a plan, compare with the whole model (and a reference), gate it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.errors import UserError
from rkpart.io import regular_file
from rkpart.plan.plan import Plan, load_plan
from rkpart.progress import Progress, advance, silent
from rkpart.roles import pass_inputs
from rkpart.runtime import get_backend
from rkpart.runtime.executor import ResidencyChoice, find_model, load_inputs, run_model, run_plan
from rkpart.runtime.ort import OrtRunner
from rkpart.types import NPU, JsonObject
from rkpart.validation.metrics import Gate, Metrics, compare


@dataclass
class RunReport:
    backend: str
    end_to_end: dict[str, Metrics]
    against_reference: dict[str, Metrics] = field(default_factory=dict)
    per_stage: dict[str, dict[str, Metrics]] = field(default_factory=dict)
    gate: Gate = field(default_factory=Gate)
    failures: list[str] = field(default_factory=list)
    reference_model: str | None = None  # None: the whole model was not loaded (gated against saved outputs)
    reference_outputs: str | None = None  # the --reference .npz

    def to_json(self) -> JsonObject:
        return {
            "backend": self.backend,
            "reference_model": self.reference_model,
            "reference_outputs": self.reference_outputs,
            "gate": {"min_cosine": self.gate.min_cosine, "max_abs_rel": self.gate.max_abs_rel},
            "end_to_end": {k: m.to_json() for k, m in self.end_to_end.items()},
            "against_reference": {k: m.to_json() for k, m in self.against_reference.items()},
            "per_stage": {s: {k: m.to_json() for k, m in d.items()} for s, d in self.per_stage.items()},
            "passed": not self.failures,
            "failures": self.failures,
        }

    def render(self) -> str:
        lines = [f"{'':<24} {'tensor':<28} {'cosine':>12} {'max abs':>10} {'mean abs':>10} {'MSE':>10} NaN/Inf"]

        def row(label: str, name: str, m: Metrics) -> str:
            return (f"{label:<24} {name[:28]:<28} {m.cosine:>12.8f} {m.max_abs:>10.3g} {m.mean_abs:>10.3g} "
                    f"{m.mse:>10.3g} {m.nan}/{m.inf}")

        for sid, d in self.per_stage.items():
            for k, m in d.items():
                lines.append(row(f"stage {sid}", k, m))
        for k, m in self.end_to_end.items():
            lines.append(row("end-to-end vs ONNX RT", k, m))
        for k, m in self.against_reference.items():
            lines.append(row("end-to-end vs reference", k, m))
        lines.append("gate: PASS" if not self.failures else "gate: FAIL (" + "; ".join(self.failures) + ")")
        return "\n".join(lines)


@dataclass(frozen=True)
class RunOptions:
    """Everything ``rkpart run PLAN`` was asked to do."""

    inputs: Path | None = None  # .npz of model inputs; None: seeded random inputs
    seed: int = 0
    backend: str = "ort"  # executor of NPU stages
    toolkit: str | None = None  # rknn-toolkit2 version for backend rknn-sim
    #: whole model to compare against; None: the plan's source model, or none when ``reference`` is given
    model: Path | None = None
    reference: Path | None = None  # .npz of reference outputs (and the inputs they came from) to gate against
    min_cosine: float | None = None  # None: 0.999999 for ort, 0.999 otherwise
    max_abs_rel: float | None = None  # None: 1e-5 for ort, off otherwise
    per_stage: bool = False  # also compare each NPU stage with ONNX Runtime
    save_outputs: Path | None = None
    residency: ResidencyChoice = None
    core_mask: str | None = None  # NPU cores for backend rknnlite; None: auto


def validate_plan_run(plan_path: Path, options: RunOptions | None = None,
                      progress: Progress = silent, **kwargs: Any) -> RunReport:
    """Run the plan at ``plan_path`` as ``options`` say (or as keyword arguments, the same
    fields) and gate it against the whole model and the reference.

    With a ``reference`` and no ``model`` the plan is gated against the reference alone and the whole
    model is never loaded (ONNX Runtime may refuse it whole, or it may not fit the memory, when its
    stages load): the plan runs on ``inputs``, else on the reference's own arrays named as the plan's
    inputs (the inputs its outputs came from)."""
    opts = dataclasses.replace(options or RunOptions(), **kwargs)
    inputs, seed, backend, model = opts.inputs, opts.seed, opts.backend, opts.model
    reference, per_stage, save_outputs = opts.reference, opts.per_stage, opts.save_outputs
    min_cosine, max_abs_rel = opts.min_cosine, opts.max_abs_rel
    if opts.core_mask is not None and backend != "rknnlite":
        raise UserError(f"--core-mask applies to --backend rknnlite only, not {backend}")
    if save_outputs:
        from rkpart.output import check_file_target

        check_file_target(save_outputs, force=True, what="--save-outputs")  # before the run
    plan, folder = load_plan(plan_path)
    for p, what in ((inputs, "inputs"), (reference, "reference")):
        if p is not None:
            regular_file(p, what=what)
    whole = reference is None or model is not None  # compare with the whole model under ONNX Runtime
    refd = _reference_outputs(reference, plan) if reference is not None else {}
    # masks all-valid, id grids and integer inputs their values, never noise (rkpart.roles)
    feeds = (load_inputs(inputs, plan) if inputs else _reference_inputs(reference, plan) if reference and not whole
             else pass_inputs(plan, folder, seed))
    gate = Gate(
        min_cosine=min_cosine if min_cosine is not None else (0.999999 if backend == "ort" else 0.999),
        max_abs_rel=max_abs_rel if max_abs_rel is not None else (1e-5 if backend == "ort" else None),
    )
    ref: dict[str, np.ndarray] = {}
    if whole:
        model = find_model(plan, folder, model)
        progress(f"reference: whole model {model} on ONNX Runtime")
        ref = run_model(model, feeds, plan.outputs, load_hint=" to compare the plan with (its stages load on their "
                        "own: gate the plan against saved outputs instead, `rkpart run PLAN --reference OUTPUTS.npz`, "
                        "with the inputs in that file or --inputs)")
    else:
        progress(f"reference: the saved outputs in {reference} (the whole model is not loaded)")
    be = get_backend(backend, toolkit=opts.toolkit, core_mask=opts.core_mask or "auto")
    stage_metrics: dict[str, dict[str, Metrics]] = {}
    env_before: dict[str, np.ndarray] = dict(feeds)

    def on_stage(i: int, sid: str, out: dict[str, np.ndarray]) -> None:
        stage = plan.stages[i]
        progress(f"[{i + 1}/{len(plan.stages)}] {sid} ({stage.device})")
        advance(progress, i + 1, len(plan.stages))
        if per_stage and stage.device == NPU:
            r = OrtRunner(stage, folder)
            r.load()
            r.init()
            ort_out = r.infer(env_before)
            r.release()
            stage_metrics[sid] = {k: compare(out[k], ort_out[k]) for k in stage.outputs}
        env_before.update(out)

    try:
        outs = run_plan(plan, folder, feeds, backend=be, on_stage=on_stage, residency=opts.residency)
    finally:
        be.close()
    if save_outputs:
        from rkpart.output import mark_npz, output_file

        with output_file(save_outputs, force=True, what="--save-outputs") as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **outs)  # type: ignore[arg-type]
            mark_npz(tmp)  # how `--force` knows the file for one rkpart wrote
    e2e = {k: compare(outs[k], ref[k]) for k in plan.outputs} if whole else {}
    against = {k: compare(outs[k], refd[k].astype(outs[k].dtype)) for k in plan.outputs} if reference else {}
    failures = []
    for label, d in (("vs ONNX Runtime", e2e), ("vs reference", against)):
        for k, m in d.items():
            failures += [f"{k} {label}: {f}" for f in gate.failures(m)]
    return RunReport(backend=backend, end_to_end=e2e, against_reference=against, per_stage=stage_metrics,
                     gate=gate, failures=failures, reference_model=str(model) if whole else None,
                     reference_outputs=str(reference) if reference is not None else None)


def _reference_outputs(reference: Path, plan: Plan) -> dict[str, np.ndarray]:
    """The plan's outputs as the ``--reference`` file holds them, checked before anything runs."""
    from rkpart.readers import read_npz

    refd = read_npz(reference, what="reference", names=plan.outputs)
    for k in plan.outputs:
        if k not in refd:
            raise UserError(f"reference {reference} has no array {k!r} (the plan's outputs: {', '.join(plan.outputs)})")
        want = tuple(plan.tensors[k].shape)
        if tuple(refd[k].shape) != want or refd[k].dtype.kind not in "biuf":
            raise UserError(f"reference {reference}: {k!r} is {refd[k].dtype}{list(refd[k].shape)}, the plan's output "
                            f"{plan.tensors[k].dtype}{list(want)}")
    return refd


def _reference_inputs(reference: Path, plan: Plan) -> dict[str, np.ndarray]:
    """The plan's inputs from the ``--reference`` file (the inputs its outputs came from)."""
    from rkpart.readers import read_npz

    held = read_npz(reference, what="reference", names=plan.inputs)
    missing = [n for n in plan.inputs if n not in held]
    if missing:
        raise UserError(f"reference {reference} holds no input {missing[0]!r}: without the whole model the plan runs "
                        "on the inputs its reference outputs came from; save them in that file (one array per model "
                        f"input: {', '.join(plan.inputs)}) or pass --inputs FILE.npz (or --model to compare with the "
                        "whole model on other inputs)")
    return load_inputs(reference, plan)
