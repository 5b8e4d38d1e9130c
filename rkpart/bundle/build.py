"""``rkpart bundle``: a compiled plan as a self-contained folder for the board.

The folder holds the ``.rknn`` files of the NPU stages, the ``.onnx`` files (and external
data) of the host stages, reference inputs/outputs computed by ONNX Runtime on the whole
model, ``manifest.json`` (versioned, with the sha256 of every file) and ``runner.py``, a
copy of :mod:`rkpart.runtime.board_runner` that needs only NumPy, ONNX Runtime and
rknn-toolkit-lite2.  Written like a plan (:mod:`rkpart.output`): into ``.<out>.partial`` and swapped in at the end.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rkpart.errors import OutputExistsError, SpecError, UserError
from rkpart.io import (
    atomic_write_bytes,
    atomic_writer,
    file_sha256,
    onnx_with_data,
)
from rkpart.output import MARKER, check_folder_target, staged_folder
from rkpart.plan.plan import Plan, Stage, load_plan
from rkpart.plan.verify import artifact_file, stage_onnx
from rkpart.progress import Progress, advance
from rkpart.runtime import board_runner as runner_mod
from rkpart.types import NPU, RESIDENCIES, JsonMap, JsonObject, Residency

if TYPE_CHECKING:
    from rkpart.bundle.vae import VaeSource

REF_INPUTS = "ref_inputs.npz"
#: the bundle's copy of rkpart.runtime.board_sampling (the pipeline's sampler), beside runner.py
SAMPLING_FILE = runner_mod.SAMPLING_FILE
REF_OUTPUTS = "ref_outputs.npz"
RUNNER_FILE = "runner.py"
#: the output kind in the folder's rkpart marker (rkpart.output)
BUNDLE_KIND = "bundle"
#: default gate of a bundle run on the NPU (fp16), as for the toolkit simulator
DEFAULT_MIN_COSINE = 0.999
#: and its bound on max |error| / max |reference| (the runner's own default when a manifest has none)
DEFAULT_MAX_ABS_REL = runner_mod.DEFAULT_MAX_ABS_REL



@dataclass(frozen=True)
class BundleResult:
    folder: Path
    manifest: JsonObject

    @property
    def files(self) -> dict[str, JsonObject]:
        return dict(self.manifest["files"])

    @property
    def size_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.manifest["files"].values())


def stage_residency(plan: Plan, override: str | None = None) -> dict[str, str]:
    """Residency of every NPU stage in the bundle: ``override``, else the plan's choice, else per-stage.

    The ``auto`` strategy records a residency per block (:func:`~rkpart.runtime.executor.plan_residency`);
    other plans run per-stage on the board, the policy the write-up measured on an 8 GB board.
    """
    from rkpart.runtime.executor import plan_residency

    if override is not None and override not in RESIDENCIES:
        raise UserError(f"residency {override!r} is not one of {', '.join(RESIDENCIES)}")
    chosen = plan_residency(plan, default=Residency.PER_STAGE)
    return {s.id: override or chosen[s.id].value for s in plan.npu_stages}


def bundle_listing(folder: Path) -> set[str] | str:
    """What a bundle written before rkpart's output marker holds (:data:`~rkpart.output.Listing`):
    its ``manifest.json``, valid for the runner, and the files it lists, each still of the size
    and sha256 recorded (a runner.py or a stage a user edited is theirs now)."""
    try:
        m = runner_mod.read_manifest(folder)
    except runner_mod.BundleError as e:
        return f"its {runner_mod.MANIFEST} is not a valid bundle manifest ({e})"
    for rel, rec in sorted(m["files"].items()):
        p = folder / rel
        if p.is_file() and not p.is_symlink() and (
                p.stat().st_size != rec["size"] or file_sha256(p) != rec["sha256"]):
            return f"{rel} changed since rkpart wrote it (its size or sha256 is not the manifest's)"
    return {runner_mod.MANIFEST, *m["files"]}


def _prepare_out(out: Path, force: bool, plan_folder: Path) -> None:
    if out.resolve() == plan_folder.resolve() or out.resolve() in plan_folder.resolve().parents:
        raise OutputExistsError(f"output folder {out} contains the plan; choose another folder")
    check_folder_target(out, kind=BUNDLE_KIND, force=force, legacy=bundle_listing)


def _stage_name(stage: Stage) -> str:
    name = Path(stage.file).name
    return name[: -len(".onnx")] if name.endswith(".onnx") else name


@dataclass(frozen=True)
class BundleOptions:
    """How :func:`bundle_plan` writes a board folder (``rkpart bundle``'s options; see there)."""

    residency: str | None = None
    core_mask: str | None = None
    model: str | os.PathLike[str] | None = None
    seed: int = 0
    min_cosine: float = DEFAULT_MIN_COSINE
    max_abs_rel: float | None = DEFAULT_MAX_ABS_REL
    force: bool = False
    latent_input: str | None = None
    timestep_input: str | None = None
    context_inputs: Sequence[str] = ()
    guidance_input: str | None = None
    #: the loop's default CFG / distilled guidance scale; None: the plan's description's, else 4.0
    guidance: float | None = None
    shift: float = 1.0
    cfg_parallel: bool = False
    budget_bytes: int | None = None
    #: the pipeline's VAE decoder (host ONNX or a compiled plan; rkpart.board makes it); None: none
    vae: VaeSource | None = None


def bundle_plan(
    plan_path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    opts: BundleOptions = BundleOptions(),
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    progress: Progress = lambda _m: None,
) -> BundleResult:
    """Write the board folder ``out`` for the compiled plan at ``plan_path``.

    Every NPU stage needs an ``.rknn`` artifact (``rkpart compile``).  ``inputs`` (default:
    seeded random inputs, ``opts.seed``) are run through the whole model with ONNX Runtime to
    give ``ref_outputs.npz``; the runner's gate defaults to ``min_cosine``/``max_abs_rel``.

    ``core_mask`` is a mask for every NPU stage or a per-stage spec
    (:func:`rkpart.bundle.cores.parse_spec`); stages it does not name get the compile log's
    default (:mod:`rkpart.bundle.cores`).  The loop's inputs (``runner.py --steps``) take their
    roles from the plan's pipeline description, else from ``latent_input`` / ``timestep_input`` /
    ``guidance_input`` / ``context_inputs``, else from ``rkpart drift``'s shape rule
    (:mod:`rkpart.bundle.loop`); the reference inputs are :func:`rkpart.roles.pass_inputs`.
    ``cfg_parallel`` makes the runner's loop run both CFG passes at once by default; it is
    refused (:class:`~rkpart.errors.BudgetError`) when the two contexts per NPU stage exceed
    ``budget_bytes`` (default: the target's pipeline budget; :mod:`rkpart.bundle.device`).
    """
    from rkpart.bundle.cores import core_masks
    from rkpart.bundle.device import check_cfg_parallel, run_bytes, stage_memory
    from rkpart.bundle.loop import loop_bundle
    from rkpart.roles import pass_inputs
    from rkpart.runtime.executor import find_model, run_model
    from rkpart.targets import get_target

    o = opts
    plan, folder = load_plan(plan_path)
    missing = [s.id for s in plan.npu_stages if s.artifact("rknn") is None]
    if missing:
        raise SpecError(f"NPU stage {missing[0]} has no .rknn artifact ({len(missing)} of {len(plan.npu_stages)} "
                        "uncompiled); run `rkpart compile` first")
    res = stage_residency(plan, o.residency)
    masks = core_masks(plan, folder, o.core_mask)
    for sid, why in sorted({(sid, m.reason) for sid, m in masks.items() if m.reason.startswith("no layer table")}):
        progress(f"core mask of {sid}: {why}")
    loop, loop_fixed = loop_bundle(plan, folder, latent=o.latent_input, timestep=o.timestep_input,
                                   context=o.context_inputs, guidance_input=o.guidance_input, guidance=o.guidance,
                                   shift=o.shift, cfg_parallel=o.cfg_parallel, progress=progress)
    if "error" in loop:
        progress(f"no denoising loop in this bundle (runner.py --steps): {loop['error']}")
    mem = {s.id: stage_memory(folder, s) for s in plan.npu_stages}
    compiled_target = plan.extra.get("compile", {}).get("target")
    budget = o.budget_bytes if o.budget_bytes is not None else get_target(compiled_target).pipeline_budget_bytes()
    per_bytes = {sid: m.bytes for sid, m in mem.items()}
    if o.cfg_parallel:
        check_cfg_parallel(plan, per_bytes, res, budget)
    device = {"budget_bytes": budget, "source": sorted({m.source for m in mem.values()}),
              "run_bytes": run_bytes(per_bytes, res, cfg_parallel=False),
              "cfg_parallel_run_bytes": run_bytes(per_bytes, res, cfg_parallel=True)}
    if o.vae is not None and "error" not in loop and "pipeline" not in loop:
        raise UserError("a VAE decoder goes with the pipeline's own loop; this plan has no pipeline description")
    extra = {"core_masks": masks, "device_bytes": per_bytes, "loop": loop, "loop_fixed": loop_fixed, "device": device,
             "core_mask": o.core_mask if o.core_mask in runner_mod.CORE_MASKS else "auto"}
    if plan.specialised:  # its reference inputs must be ones the board runner will accept
        if inputs is None:
            rec = plan.specialised[0]
            raise UserError(f"the plan is specialised to the inputs it was partitioned on ({rec['op']} node "
                            f"{rec['node']!r}); pass those with --inputs")
        plan.check_specialised(inputs)
    whole = find_model(plan, folder, None if o.model is None else Path(o.model))
    out = Path(os.path.abspath(out))
    _prepare_out(out, o.force, folder)

    # masks all-valid, id grids and integer inputs their values, never noise (rkpart.roles)
    feeds = dict(inputs) if inputs is not None else pass_inputs(plan, folder, o.seed)
    progress(f"reference: whole model {whole} on ONNX Runtime")
    ref = run_model(whole, feeds, plan.outputs)

    with staged_folder(out, kind=BUNDLE_KIND, force=o.force, legacy=bundle_listing) as staging:
        manifest = _write(plan, folder, staging, res, feeds, ref, o, inputs is None, progress, extra)
    progress(f"wrote bundle {out}: {len(plan.npu_stages)} NPU + {len(plan.host_stages)} host stages")
    return BundleResult(folder=out, manifest=manifest)


def _copy(src: Path, dst: Path) -> None:
    with atomic_writer(dst) as tmp:
        shutil.copyfile(src, tmp)


def _savez(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """An ``.npz`` that ``np.load`` reads, byte-identical for equal arrays (``np.savez`` stamps the time)."""
    import zipfile

    with atomic_writer(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for k in sorted(arrays):
            info = zipfile.ZipInfo(f"{k}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with z.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(arrays[k]), allow_pickle=False)


def _emulate_bfloat16(src: Path, dst: Path) -> bool:
    """Write ``src`` (a host stage) to ``dst`` with its bfloat16 islands emulated in float32, when it
    has any; whether it did.  The board's ONNX Runtime has no CPU kernel for bfloat16 ``Mul``,
    ``MatMul``, ``Softmax`` or ``Sqrt`` (Sana-WM's camera attention on the host): the copy computes
    each such op in float32 and rounds its result to bfloat16, as ``rkpart run`` does
    (:func:`rkpart.targets.rewrites.precision.emulate_bfloat16`).  Its external data stays where
    it was copied: a bfloat16 weight stored there is cast where it is read."""
    import onnx

    from rkpart.targets.rewrites.precision import emulate_bfloat16

    m = onnx.load(str(src), load_external_data=False)
    if not emulate_bfloat16(m):
        return False
    with atomic_writer(dst) as tmp:
        tmp.write_bytes(m.SerializeToString(deterministic=True))
    return True


def _write(plan: Plan, folder: Path, staging: Path, residency: Mapping[str, str],
           feeds: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], opts: BundleOptions, seeded: bool,
           progress: Progress, extra: JsonMap) -> JsonObject:
    """The bundle's files in ``staging`` and its manifest; ``seeded``: ``feeds`` are ``opts.seed``'s
    random inputs (recorded), not given ones."""
    core_mask = str(extra["core_mask"])
    stages: list[JsonObject] = []
    for i, s in enumerate(plan.stages):
        entry: JsonObject = {"id": s.id, "device": s.device, "inputs": list(s.inputs),
                                 "outputs": list(s.outputs), "block": s.block, "region": s.region}
        if s.device == NPU:
            art = s.artifact("rknn")
            assert art is not None
            src = artifact_file(folder, s, art)  # confined, regular, sha256 as compile recorded it
            rel = f"rknn/{_stage_name(s)}.rknn"
            _copy(src, staging / rel)
            entry.update(file=rel, residency=residency[s.id], source=s.file, source_sha256=s.sha256,
                         toolkit=art.toolkit, target=art.target, cpu_ops=list(art.cpu_ops))
            cm = extra["core_masks"][s.id]
            entry.update(core_mask=cm.mask, core_mask_reason=cm.reason, device_bytes=extra["device_bytes"][s.id])
            if art.precision != "fp16":  # issue 27: the runner feeds such a stage float32 (runtime/int8_io.py)
                entry["precision"] = art.precision
        else:
            src = stage_onnx(folder, s)  # confined, regular, sha256 as partition recorded it
            rel = s.file
            # the .onnx and every data file it names (its own .data, or a --weights link plan's
            # shared file under stages/weights/, copied once), at the same relative paths
            for f in onnx_with_data(folder, s.file, what=f"stage {s.id} file"):
                frel = f.resolve().relative_to(folder.resolve()).as_posix()
                if not (staging / frel).exists():
                    _copy(f, staging / frel)
            if _emulate_bfloat16(src, staging / rel):
                entry["bfloat16"] = "emulated"
            entry.update(file=rel, residency=Residency.RESIDENT.value)
        progress(f"[{i + 1}/{len(plan.stages)}] {s.id} ({s.device}) -> {rel}")
        advance(progress, i + 1, len(plan.stages))
        stages.append(entry)
    _savez(staging / REF_INPUTS, feeds)
    _savez(staging / REF_OUTPUTS, ref)
    if extra["loop_fixed"]:
        from rkpart.bundle.loop import LOOP_INPUTS

        _savez(staging / LOOP_INPUTS, extra["loop_fixed"])
    _copy(Path(runner_mod.__file__), staging / RUNNER_FILE)
    if "pipeline" in extra["loop"]:
        from rkpart.runtime import board_sampling

        _copy(Path(board_sampling.__file__), staging / SAMPLING_FILE)
    vae_rec = None
    if opts.vae is not None:
        from rkpart.bundle.vae import vae_run_bytes, vae_section

        vae_rec, vae_bytes = vae_section(opts.vae, staging, residency=opts.residency, copy=_copy, progress=progress)
        device = extra["device"]
        need = vae_run_bytes(vae_rec)
        device.update(vae_bytes=need, run_bytes=max(device["run_bytes"], need),
                      cfg_parallel_run_bytes=max(device["cfg_parallel_run_bytes"], need))
        if vae_bytes:
            device["source"] = sorted({*device["source"], "VAE decoder plan"})
        if need > device["budget_bytes"]:
            from rkpart.errors import BudgetError

            raise BudgetError(f"the VAE decoder holds {need / 2**20:.1f} MiB of device memory, over the budget of "
                              f"{device['budget_bytes'] / 2**20:.1f} MiB; bundle it with --vae host, or partition it "
                              "into smaller stages")
    files = {}
    for p in sorted(staging.rglob("*")):
        if p.is_file() and p.name not in (runner_mod.MANIFEST, MARKER):
            rel = p.relative_to(staging).as_posix()
            files[rel] = {"sha256": file_sha256(p), "size": p.stat().st_size}
    compiled = plan.extra.get("compile", {})
    manifest: JsonObject = {
        "format": runner_mod.BUNDLE_FORMAT,
        "version": runner_mod.BUNDLE_VERSION,
        "model": {k: plan.model[k] for k in ("file", "sha256", "opset") if k in plan.model},
        "plan": {"strategy": plan.strategy.get("name"), "npu_stages": len(plan.npu_stages),
                 "host_stages": len(plan.host_stages)},
        "toolkit": compiled.get("toolkit"),
        "target": compiled.get("target"),
        "core_mask": core_mask,
        "residency": sorted(set(residency.values())) or [Residency.PER_STAGE.value],
        "inputs": [plan.tensors[n].to_json() for n in plan.inputs],
        "outputs": [plan.tensors[n].to_json() for n in plan.outputs],
        "tensors": {k: {"dtype": t.dtype, "shape": list(t.shape)} for k, t in sorted(plan.tensors.items())},
        "stages": stages,
        **({"specialised": [dict(r) for r in plan.specialised]} if plan.specialised else {}),
        "reference": {"inputs": REF_INPUTS, "outputs": REF_OUTPUTS, "seed": opts.seed if seeded else None,
                      "computed_by": "onnxruntime (CPU), whole model"},
        "gate": {"min_cosine": opts.min_cosine, "max_abs_rel": opts.max_abs_rel},
        "requires": ["numpy", "onnxruntime", "rknn-toolkit-lite2"],
        "files": files,
    }
    manifest["denoise"] = extra["loop"]
    if vae_rec is not None:
        manifest["vae"] = vae_rec
    manifest["device_memory"] = extra["device"]
    atomic_write_bytes(staging / runner_mod.MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest


__all__ = ["BundleOptions", "BundleResult", "bundle_plan", "stage_residency"]
