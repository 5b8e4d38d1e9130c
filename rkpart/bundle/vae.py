"""The pipeline's VAE decoder in a bundle: ``vae_decoder.onnx`` on the host CPU or a compiled plan of
it on the NPU, as the manifest's ``vae`` graph (issue 49).

``rkpart export`` writes ``vae_decoder.onnx`` beside ``transformer.onnx``: the pipeline's whole
post-loop path, the final loop latent in, the image in ``[0, 1]`` out (docs/pipeline-json.md).  A
bundle made from a plan with a pipeline description carries it so that ``runner.py`` ends with a
PNG:

- ``host``: the ONNX file itself, one host stage run by ONNX Runtime on the board's CPU;
- ``npu``: a plan of it (the ``generic`` strategy, compiled with the model plan's toolkit and
  gated; made by :mod:`rkpart.board`), its NPU stages as ``.rknn`` files and its host stages as
  ``.onnx``, like the model's.

Its files live under ``vae/`` in the bundle; the manifest's ``vae`` record has the same schema as
the model's graph (``inputs``, ``outputs``, ``tensors``, ``stages``), so the runner runs it with the
same code.  This module only copies and describes; it never partitions or compiles.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rkpart.description import PipelineDescription
from rkpart.errors import SpecError, UserError
from rkpart.io import onnx_with_data, regular_file
from rkpart.plan.plan import Plan, Stage, load_plan
from rkpart.plan.verify import artifact_file, stage_onnx
from rkpart.types import NPU, JsonMap, JsonObject, Residency

#: the bundle folder of the decoder's files
VAE_DIR = "vae"
#: where the VAE decoder goes: ``npu`` (a compiled plan), ``host`` (ONNX Runtime), ``none``; ``auto``:
#: ``npu`` when the description has a decoder file beside the model, else ``none``
VAE_MODES = ("auto", "npu", "host", "none")


@dataclass(frozen=True)
class VaeSource:
    """The decoder a bundle carries: ``device`` ``host`` (the ONNX file ``decoder``) or ``npu``
    (``plan``: a compiled plan of ``decoder``)."""

    device: str
    decoder: Path
    plan: Path | None = None
    class_name: str | None = None
    #: the image's shape (pipeline.json ``vae.image_shape``): an exporter may leave the output's dynamic
    image_shape: tuple[int, ...] | None = None


def decoder_file(description: PipelineDescription, model: Path) -> Path | None:
    """The description's ``vae_decoder.onnx`` beside the whole ``model`` (what ``rkpart export``
    wrote), or ``None`` when the description has no VAE or the file is not there."""
    if description.vae is None:
        return None
    p = model.parent / description.vae.file
    if not p.exists():
        return None
    regular_file(p, what="VAE decoder")
    return p


def onnx_io(path: Path) -> tuple[dict[str, tuple[str, list[int]]], dict[str, tuple[str, list[int]]]]:
    """``(inputs, outputs)`` of an ONNX file: name -> (dtype, static shape)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    init = {i.name for i in m.graph.initializer}

    def typed(vi: Any, static: bool) -> tuple[str, list[int]]:
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in t.shape.dim]
        if static and any(d <= 0 for d in dims):
            raise SpecError(f"{path}: input {vi.name!r} has a dynamic or empty shape {dims}; export it again")
        return str(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)), dims

    ins = {i.name: typed(i, True) for i in m.graph.input if i.name not in init}
    outs = {o.name: typed(o, False) for o in m.graph.output}  # -1: a dimension the exporter left dynamic
    return ins, outs


def check_decoder(path: Path, description: PipelineDescription) -> tuple[str, str]:
    """The decoder's input and output names, after checking them against the description: one input
    shaped as the final loop latent, one image output of ``vae.image_shape``.

    Raises
    ------
    SpecError
        The file does not take the loop's latent or does not give the described image.
    """
    assert description.vae is not None
    ins, outs = onnx_io(path)
    if len(ins) != 1 or len(outs) != 1:
        raise SpecError(f"VAE decoder {path} has inputs {list(ins)} and outputs {list(outs)}; rkpart export writes "
                        "one input (the final latent) and one output (the image)")
    (iname, (idt, ishape)), (oname, (_odt, oshape)) = next(iter(ins.items())), next(iter(outs.items()))
    from rkpart.bundle.loop import loop_latent_shape

    final = loop_latent_shape(description)  # Flux.2's latents= is patchified, its final latent tokens
    if tuple(ishape) != final or idt not in ("float32", "float16"):
        raise SpecError(f"VAE decoder {path} takes {idt} {ishape}; the pipeline's final latent is "
                        f"{description.latent.dtype} {list(final)}")
    want = tuple(description.vae.image_shape)
    if len(oshape) != len(want) or any(o not in (-1, w) for o, w in zip(oshape, want, strict=True)):
        raise SpecError(f"VAE decoder {path} gives {oshape}; pipeline.json says the image is {list(want)}")
    return iname, oname


def stage_entry(plan: Plan, folder: Path, s: Stage, staging: Path, prefix: str, residency: str,
                copy: Callable[[Path, Path], None]) -> JsonObject:
    """The manifest entry of one stage of ``plan`` and its files copied into ``staging`` (under
    ``prefix``): an NPU stage's ``.rknn`` (source: its ``.onnx`` in the plan folder, for the stand-in),
    a host stage's ``.onnx`` and every data file it names."""
    entry: JsonObject = {"id": s.id, "device": s.device, "inputs": list(s.inputs), "outputs": list(s.outputs),
                             "block": s.block, "region": s.region}
    if s.device == NPU:
        art = s.artifact("rknn")
        if art is None:
            raise SpecError(f"NPU stage {s.id} of {folder} has no .rknn artifact; run `rkpart compile` first")
        src = artifact_file(folder, s, art)  # confined, regular, sha256 as compile recorded it
        name = Path(s.file).name
        rel = f"{prefix}rknn/{name[: -len('.onnx')] if name.endswith('.onnx') else name}.rknn"
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        copy(src, staging / rel)
        entry.update(file=rel, residency=residency, source=s.file, source_sha256=s.sha256, toolkit=art.toolkit,
                     target=art.target, cpu_ops=list(art.cpu_ops))
        if art.precision != "fp16":
            entry["precision"] = art.precision
        return entry
    stage_onnx(folder, s)  # confined, regular, sha256 as partition recorded it
    for f in onnx_with_data(folder, s.file, what=f"stage {s.id} file"):
        frel = prefix + f.resolve().relative_to(folder.resolve()).as_posix()
        if not (staging / frel).exists():
            (staging / frel).parent.mkdir(parents=True, exist_ok=True)
            copy(f, staging / frel)
    entry.update(file=prefix + s.file, residency=Residency.RESIDENT.value)
    return entry


def vae_section(src: VaeSource, staging: Path, *, residency: str | None, copy: Callable[[Path, Path], None],
                progress: Callable[[str], None]) -> tuple[JsonObject, dict[str, int]]:
    """The manifest's ``vae`` record for ``src``, its files written under ``staging/vae/``, and the
    device bytes of each of its NPU stages (for the bundle's budget)."""
    from rkpart.bundle.cores import core_masks
    from rkpart.bundle.device import stage_memory

    prefix = f"{VAE_DIR}/"
    if src.device == "host":
        files = onnx_with_data(src.decoder.parent, src.decoder.name, what="VAE decoder", error=UserError)
        for f in files:
            dst = staging / prefix / f.relative_to(src.decoder.parent).as_posix()
            dst.parent.mkdir(parents=True, exist_ok=True)
            copy(f, dst)
        ins, outs = onnx_io(src.decoder)
        outs = {n: (dt, list(src.image_shape) if -1 in shape and src.image_shape else shape)
                for n, (dt, shape) in outs.items()}
        tensors = {n: {"dtype": dt, "shape": shape} for n, (dt, shape) in {**ins, **outs}.items()}
        stage = {"id": "vae", "device": "host", "inputs": list(ins), "outputs": list(outs), "block": None,
                 "region": "vae", "file": prefix + src.decoder.name, "residency": Residency.RESIDENT.value}
        progress(f"VAE decoder {src.decoder.name}: on the host CPU (ONNX Runtime)")
        return {"device": "host", "class": src.class_name, "source": src.decoder.name,
                "inputs": [{"name": n, "dtype": dt, "shape": s} for n, (dt, s) in ins.items()],
                "outputs": [{"name": n, "dtype": dt, "shape": s} for n, (dt, s) in outs.items()],
                "tensors": tensors, "stages": [stage]}, {}
    if src.plan is None:
        raise UserError("the VAE decoder on the NPU needs its compiled plan")
    plan, folder = load_plan(src.plan)
    folder = Path(folder)
    masks = core_masks(plan, folder, None)
    stages = []
    per: dict[str, int] = {}
    for s in plan.stages:
        entry = stage_entry(plan, folder, s, staging, prefix, residency or Residency.PER_STAGE.value, copy)
        if s.device == NPU:
            cm = masks[s.id]
            per[s.id] = stage_memory(folder, s).bytes
            entry.update(core_mask=cm.mask, core_mask_reason=cm.reason, device_bytes=per[s.id])
        stages.append(entry)
    progress(f"VAE decoder {src.decoder.name}: {len(plan.npu_stages)} NPU + {len(plan.host_stages)} host stages "
             f"(plan {folder})")
    compiled = plan.extra.get("compile", {})
    return {"device": "npu", "class": src.class_name, "source": src.decoder.name, "plan": os.fspath(folder),
            "toolkit": compiled.get("toolkit"), "strategy": plan.strategy.get("name"),
            "inputs": [plan.tensors[n].to_json() for n in plan.inputs],
            "outputs": [plan.tensors[n].to_json() for n in plan.outputs],
            "tensors": {k: {"dtype": t.dtype, "shape": list(t.shape)} for k, t in sorted(plan.tensors.items())},
            "stages": stages}, per


def vae_run_bytes(section: JsonMap | None) -> int:
    """Device bytes the decoder holds at most (resident stages + its largest per-stage one)."""
    if not section:
        return 0
    npu = [s for s in section["stages"] if s["device"] == NPU]
    resident = sum(int(s.get("device_bytes") or 0) for s in npu if s.get("residency") == "resident")
    return resident + max((int(s.get("device_bytes") or 0) for s in npu if s.get("residency") != "resident"),
                          default=0)


__all__ = ["VAE_DIR", "VAE_MODES", "VaeSource", "check_decoder", "decoder_file", "onnx_io", "stage_entry",
           "vae_run_bytes", "vae_section"]
