"""A bundle that ends with a picture: the compiled plan, the pipeline's sampler and its VAE decoder (issue 49).

``rkpart bundle PLAN`` of a plan with a pipeline description (``rkpart export`` -> ``partition``)
brings the pipeline's ``vae_decoder.onnx`` (found beside the plan's whole model, as ``export``
wrote it):

- ``npu`` (the default): partitioned with the ``generic`` strategy under the budget, compiled
  with the toolkit, target and config the model's plan was compiled with (``compile
  --repartition``: ops a build leaves on the CPU move to the host), and gated in the toolkit's
  simulator against the decoder on ONNX Runtime (cosine >= :data:`VAE_MIN_COSINE`), like every plan
  the tables of docs/npu-table/ report.  That plan is made once per decoder (sha256), toolkit,
  target, config and budget, under ``$RKPART_CACHE_DIR/vae`` (else ``~/.cache/rkpart/vae``); its
  ``.rknn`` builds also come from the build cache.
- ``host``: the ONNX file as one host stage (ONNX Runtime on the board's CPU).

This module sits above :mod:`rkpart.pipeline` (it partitions and compiles); the bundle itself
(:mod:`rkpart.bundle`) only copies what it is given.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from rkpart.bundle.build import BundleOptions, BundleResult, bundle_plan
from rkpart.bundle.vae import VAE_MODES, VaeSource, check_decoder, decoder_file
from rkpart.errors import GateError, ToolkitError, UserError
from rkpart.io import atomic_write_bytes, file_sha256, load_json_file
from rkpart.plan.plan import load_plan
from rkpart.progress import Progress
from rkpart.roles import plan_description
from rkpart.types import JsonObject

#: the simulator gate of the VAE decoder's plan (the bundle's own default gate)
VAE_MIN_COSINE = 0.999
#: what keys a cached VAE decoder plan besides its inputs (bump when how it is made changes)
VAE_PLAN_FORMAT = 1


def vae_cache_dir() -> Path:
    """``$RKPART_CACHE_DIR/vae`` or ``~/.cache/rkpart/vae``."""
    env = os.environ.get("RKPART_CACHE_DIR")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "rkpart") / "vae"


def _decoder_digest(decoder: Path) -> str:
    from rkpart.io import onnx_with_data

    h = hashlib.sha256()
    for f in onnx_with_data(decoder.parent, decoder.name, what="VAE decoder", error=UserError):
        h.update(f.name.encode() + b"\0" + file_sha256(f).encode())
    return h.hexdigest()


def vae_plan(decoder: Path, *, toolkit: str, target: str, config: JsonObject, budget_bytes: int,
             toolkits_dir: str | os.PathLike[str] | None = None, cache: Path | None = None,
             progress: Progress = lambda _m: None) -> Path:
    """The compiled, gated plan of ``decoder`` (see the module doc), made once per its key.

    Raises
    ------
    GateError
        The simulator's output differs from ONNX Runtime's beyond the gate (nothing is kept).
    ToolkitError, UserError
        Partitioning or building failed.
    """
    from rkpart import __version__
    from rkpart.compile.compile import CompileOptions
    from rkpart.pipeline import partition
    from rkpart.repartition import compile_repartition
    from rkpart.runtime.validate import RunOptions, validate_plan_run

    key = hashlib.sha256(json.dumps([VAE_PLAN_FORMAT, __version__, _decoder_digest(decoder), toolkit, target, config,
                                     budget_bytes], sort_keys=True).encode()).hexdigest()[:16]
    root = cache or vae_cache_dir()
    final = root / f"{decoder.stem}-{key}"
    record = root / f"{final.name}.json"
    if record.is_file():
        try:  # bounded and a regular file (rkpart.io's reader): a damaged record is no record
            rec = load_json_file(record, what="VAE decoder plan record", max_bytes=1 << 20)
        except (OSError, ValueError, UserError):
            rec = {}
        if isinstance(rec, dict) and rec.get("failed"):
            # the same decoder, toolkit and rkpart failed before: no second half-hour of builds to learn it again
            raise GateError(f"{rec['failed']} (recorded in {record}; delete it to try again)")
        if (final / "plan.json").is_file():
            progress(f"VAE decoder plan: {final} (made before, gate passed)")
            return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{final.name}.{os.getpid()}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        budget_mib = budget_bytes / 2**20
        progress(f"VAE decoder plan: partitioning {decoder.name} (generic, {budget_mib:.0f} MiB per stage)")
        partition(decoder, tmp, "generic", budget_mib=budget_mib, toolkit=toolkit, progress=progress)
        opts = CompileOptions(toolkit=toolkit, target=target, config=config, jobs=2, toolkits_dir=toolkits_dir)
        report, _rounds, stuck = compile_repartition(tmp, opts, progress)
        if report.failed:
            failed = ", ".join(o.stage_id for o in report.failed)
            raise ToolkitError(f"the VAE decoder's plan did not build ({failed}); bundle it with --vae host")
        if stuck:
            progress(f"VAE decoder plan: CPU layers no repartition can move: {', '.join(stuck)}")
        progress(f"VAE decoder plan: gate in the rknn-toolkit2 {toolkit} simulator")
        rep = validate_plan_run(tmp, RunOptions(backend="rknn-sim", toolkit=toolkit, model=decoder,
                                                min_cosine=VAE_MIN_COSINE), progress)
        if rep.failures:
            raise GateError(f"the VAE decoder's plan fails its simulator gate ({'; '.join(rep.failures)}); bundle it "
                            "with --vae host")
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "plan.json").is_file():
                raise
        atomic_write_bytes(record, (json.dumps({"decoder": str(decoder), "toolkit": toolkit, "target": target,
                                                "budget_bytes": budget_bytes, "gate": rep.to_json().get("outputs"),
                                                "stuck_cpu_layers": list(stuck)}, indent=1, default=str)
                                    + "\n").encode())
    except GateError as e:  # a build failure may be the machine's (memory, a timeout): tried again next time
        atomic_write_bytes(record, (json.dumps({"decoder": str(decoder), "toolkit": toolkit, "target": target,
                                                "failed": str(e), "kind": "gate"}, indent=1) + "\n").encode())
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def vae_source(plan_path: str | os.PathLike[str], mode: str = "auto", *, model: str | os.PathLike[str] | None = None,
               budget_bytes: int | None = None, vae_plan_folder: str | os.PathLike[str] | None = None,
               toolkits_dir: str | os.PathLike[str] | None = None,
               progress: Progress = lambda _m: None) -> VaeSource | None:
    """The VAE decoder a bundle of the plan at ``plan_path`` carries (``mode``: :data:`VAE_MODES`).

    ``auto``: on the NPU when the plan has a pipeline description and its ``vae_decoder.onnx`` is
    beside the whole model (on the host when the plan records no compile, or the decoder's NPU plan
    does not build or fails the gate), else none (said).  ``vae_plan_folder``: a compiled plan of the decoder
    made by hand (``npu`` only), used instead of making one.

    Raises
    ------
    UserError
        ``npu`` / ``host`` without a description or without the decoder file; a plan of the
        decoder that is not compiled or not of that decoder.
    """
    from rkpart.runtime.executor import find_model
    from rkpart.targets import get_target

    if mode not in VAE_MODES:
        raise UserError(f"--vae {mode!r} is not one of {', '.join(VAE_MODES)}")
    if mode == "none":
        return None
    plan, folder = load_plan(plan_path)
    d = plan_description(plan, folder)
    if d is None:
        if mode == "auto":
            return None
        raise UserError(f"--vae {mode}: the plan has no pipeline description (rkpart export, then rkpart partition "
                        "records its pipeline.json), so there is no VAE decoder to bring")
    if d.vae is None:
        if mode == "auto":
            progress("no VAE decoder: the pipeline description has none; the loop ends at the latent")
            return None
        raise UserError(f"--vae {mode}: the plan's pipeline.json has no VAE (vae: null)")
    whole = find_model(plan, Path(folder), None if model is None else Path(model))
    dec = decoder_file(d, whole)
    if dec is None:
        if mode == "auto":
            progress(f"no VAE decoder: {whole.parent / d.vae.file} does not exist; the loop ends at the latent")
            return None
        raise UserError(f"--vae {mode}: no {d.vae.file} beside the model {whole} (rkpart export writes it there)")
    check_decoder(dec, d)
    if mode == "host":
        return VaeSource("host", dec, None, d.vae.class_name, tuple(d.vae.image_shape))
    compiled = plan.extra.get("compile") or {}
    if vae_plan_folder is not None:
        vp, vfolder = load_plan(vae_plan_folder)
        if vp.model.get("sha256") != file_sha256(dec):
            raise UserError(f"--vae-plan {vae_plan_folder} is not a plan of {dec} (its model's sha256 differs)")
        if any(s.artifact("rknn") is None for s in vp.npu_stages):
            raise UserError(f"--vae-plan {vae_plan_folder} is not compiled; run `rkpart compile` on it first")
        return VaeSource("npu", dec, Path(vfolder), d.vae.class_name, tuple(d.vae.image_shape))
    if not compiled.get("toolkit"):
        if mode == "auto":  # no toolkit to build the decoder with (a plan with no NPU stage is not compiled)
            progress("VAE decoder on the host CPU: the plan records no compile (no toolkit to build it with)")
            return VaeSource("host", dec, None, d.vae.class_name, tuple(d.vae.image_shape))
        raise UserError("--vae npu: the plan records no compile (toolkit, target); compile it first, or bundle "
                        "with --vae host")
    target = str(compiled.get("target") or "rk3588")
    budget = budget_bytes if budget_bytes is not None else get_target(target).default_budget_bytes()
    try:
        folder_vae = vae_plan(dec, toolkit=str(compiled["toolkit"]), target=target,
                              config=dict(compiled.get("config") or {}), budget_bytes=int(budget),
                              toolkits_dir=toolkits_dir, progress=progress)
    except (GateError, ToolkitError) as e:
        if mode != "auto":
            raise
        # auto: a decoder the NPU cannot run right still gives the picture, on the board's CPU
        progress(f"VAE decoder on the host CPU instead of the NPU: {e}")
        return VaeSource("host", dec, None, d.vae.class_name, tuple(d.vae.image_shape))
    return VaeSource("npu", dec, folder_vae, d.vae.class_name, tuple(d.vae.image_shape))


def bundle_pipeline(plan_path: str | os.PathLike[str], out: str | os.PathLike[str],
                    opts: BundleOptions | None = None, *, vae: str = "auto",
                    vae_plan_folder: str | os.PathLike[str] | None = None,
                    toolkits_dir: str | os.PathLike[str] | None = None, inputs: Any = None,
                    progress: Progress = lambda _m: None) -> BundleResult:
    """``rkpart bundle``: :func:`rkpart.bundle.build.bundle_plan` with the pipeline's VAE decoder
    (:func:`vae_source`) when the plan has a pipeline description."""
    from rkpart.bundle.loop import check_sampler
    from rkpart.targets import get_target

    opts = opts or BundleOptions()
    plan, folder = load_plan(plan_path)
    d = plan_description(plan, folder)
    if d is not None:  # before any decoder build: a sampler the board cannot run is refused first
        check_sampler(d)
    compiled = plan.extra.get("compile") or {}
    # a VAE stage fits the generic strategy's per-stage budget, and never more than the run's
    stage_budget = get_target(compiled.get("target")).default_budget_bytes()
    if opts.budget_bytes is not None:
        stage_budget = min(stage_budget, opts.budget_bytes)
    src = vae_source(plan_path, vae, model=opts.model, budget_bytes=stage_budget, vae_plan_folder=vae_plan_folder,
                     toolkits_dir=toolkits_dir, progress=progress)
    return bundle_plan(plan_path, out, replace(opts, vae=src), inputs=inputs, progress=progress)


__all__ = ["VAE_MIN_COSINE", "bundle_pipeline", "vae_cache_dir", "vae_plan", "vae_source"]
