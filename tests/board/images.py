"""From a tiny diffusers pipeline to the board runner's image, and diffusers' own image of the same call.

Shared by ``tests/board/test_images.py`` (a sample of families covering every sampler class) and
``scripts/check_images.py`` (every family ``rkpart export`` takes).  For one family:

- :func:`compiled_plan`: ``rkpart export`` of its tiny pipeline (cached by source,
  :func:`tests.export.exports.cached_pipeline_export`), partitioned (``fused``) and compiled by a real
  rknn-toolkit2 (its ``.rknn`` builds come from the user-level build cache after the first time);
- :func:`make_board`: ``rkpart bundle`` of it with the VAE decoder (``host`` or ``npu``: the decoder's
  plan is cached by :func:`rkpart.board.vae_plan`);
- :func:`reference`: diffusers' own pipeline on seeded embeddings and ``latents=`` (the oracle);
- :func:`run_board`: the bundle's own ``runner.py`` (imported from the bundle, as on the board) on the
  same embeddings and latents, NPU stages on the ONNX Runtime stand-in or in the simulator
  (:mod:`tests.board.sim_rknnlite`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from tests.export.loop import cosine as cosine  # the export oracle's metrics, re-exported: one definition
from tests.export.loop import psnr as psnr
from tests.models import pipelines as tp

#: steps of every oracle run (issue 49: >= 20)
STEPS = 20
#: what the runner must give: the latent's cosine with diffusers', the image's PSNR over 8-bit pixels
MIN_COSINE, MIN_PSNR = 0.9999, 35.0
#: image families of the sweep with a tiny pipeline
IMAGE_FAMILIES = tuple(f for f, p in tp.PIPELINES.items() if len(p.output_shape) == 4)
#: video families (one frame here): the runner writes each frame as a PNG, compared as diffusers' ``frames``
VIDEO_FAMILIES = tuple(f for f, p in tp.PIPELINES.items() if len(p.output_shape) == 5)
#: ``rkpart export`` options a family needs (docs/export.md: LTX's TorchScript export does not load in ONNX
#: Runtime, a Concat axis out of range)
EXPORT_OPTIONS: dict[str, dict[str, str]] = {"ltx": {"exporter": "dynamo"}}


@dataclass(frozen=True)
class Reference:
    """diffusers' own call: its inputs and what it returned."""

    embeds: dict[str, np.ndarray]
    latents: np.ndarray
    latent: np.ndarray  #: ``output_type="latent"``
    image: np.ndarray  #: ``output_type="np"``, NHWC in [0, 1]
    #: what a stochastic scheduler (HunyuanDiT's DDPM) drew from diffusers' generator while stepping, in order
    step_noise: list[np.ndarray] | None = None


def compiled_plan(family: str, root: Path, toolkit: Any = None, strategy: str = "fused", **opts: Any) -> Path:
    """The plan of ``family``'s export in ``root`` (made once per ``root``), compiled by ``toolkit``.

    ``fused``: one NPU stage per block (2 to 4 builds for a tiny transformer; the whole tiny Flux as one
    ``generic`` stage crashes 2.5.0's compiler, a known issue).  ``toolkit`` None: ``generic`` with
    ``device="host"`` (every stage on ONNX Runtime, nothing to compile: the runner's loop without an NPU
    stage)."""
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from rkpart.pipeline import partition
    from tests.export.exports import cached_pipeline_export

    if toolkit is None:
        strategy, opts = "generic", {**opts, "device": "host"}
    tag = "-".join([strategy, *(f"{k}{v}" for k, v in sorted(opts.items()))])
    folder = root / f"{family}-{tag}-plan"
    if (folder / "plan.json").is_file():
        return folder
    export = cached_pipeline_export(family, **EXPORT_OPTIONS.get(family, {}))
    plan = partition(export / "transformer.onnx", folder, strategy, **opts)
    if toolkit is not None:
        rep = compile_plan_report(plan, folder, CompileOptions(toolkit, "rk3588", {}, jobs=2))
        assert not rep.failed, rep.failed
    return folder


def make_board(plan: Path, out: Path, vae: str = "host", **opts: Any) -> Path:
    """``rkpart bundle`` of ``plan`` into ``out`` with the VAE decoder ``vae`` (once per ``out``)."""
    from rkpart.board import bundle_pipeline
    from rkpart.bundle.build import BundleOptions

    if not (out / "manifest.json").is_file():
        bundle_pipeline(plan, out, BundleOptions(**opts), vae=vae)
    return out


def reference(family: str, *, seed: int = 3, steps: int = STEPS, guidance: float | None = None) -> Reference:
    """diffusers' own pipeline of ``family`` (tiny, seeded) on seeded inputs, both output types."""
    import torch

    torch.set_num_threads(1)  # tiny models: more threads only wait for each other on a shared machine
    src = tp.cached_pipeline(family)
    embeds, latents = tp.call_inputs(family, seed=seed)
    pipe = tp.load(src)
    # a pipeline without latents= (DiT) draws them from the generator call_inputs drew them with
    gen = seed if tp.PIPELINES[family].noise_from_generator else 0
    with _observed_step_noise(pipe) as draws:
        latent = tp.run_diffusers(src, embeds, latents, steps, guidance, "latent", pipe=pipe, seed=gen)
    image = tp.run_diffusers(src, embeds, latents, steps, guidance, "np", pipe=pipe, seed=gen)
    return Reference(embeds, latents, latent, image, draws or None)


@contextlib.contextmanager
def _observed_step_noise(pipe: Any) -> Iterator[list[np.ndarray]]:
    """The noise ``pipe``'s scheduler draws while stepping (``randn_tensor`` of its own module: DDPM's
    variance noise), recorded as diffusers returns it and passed through unchanged: the board's sampler
    is then given the same draws (``--step-noise``), so a stochastic sampler is compared by its math."""
    module = sys.modules[type(pipe.scheduler).__module__]
    draws: list[np.ndarray] = []
    original = getattr(module, "randn_tensor", None)
    if original is None:  # a deterministic scheduler draws nothing
        yield draws
        return

    def observed(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        draws.append(out.detach().float().numpy().copy())
        return out

    module.randn_tensor = observed
    try:
        yield draws
    finally:
        module.randn_tensor = original


def bundle_runner(bundle: Path) -> ModuleType:
    """The bundle's own ``runner.py``, imported as a plain file (as on the board: not rkpart's module)."""
    spec = importlib.util.spec_from_file_location(f"board_runner_{abs(hash(str(bundle)))}", bundle / "runner.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # the bundle stays as bundled
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = writes
    return mod


def run_board(bundle: Path, ref: Reference, *, steps: int = STEPS, guidance: float | None = None,
              standin: list[Path] | None = None, rknnlite_api: Any = None,
              residency: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(final latent, image NHWC in [0, 1] as 8-bit pixels / 255)`` of the bundle's runner on ``ref``'s
    embeddings and latents (a video's frames NFHWC, as diffusers' ``frames``): NPU stages on the ONNX
    Runtime stand-in (``standin``: the plan folders) or through ``rknnlite_api`` (the simulator)."""
    mod = bundle_runner(bundle)
    with mod.Runner(bundle, npu_standin=standin, rknnlite_api=rknnlite_api, residency=residency) as r:
        x = r.denoise(steps, guidance=guidance, call=mod.CallInputs(ref.embeds, ref.latents, ref.step_noise))
    image = r.decode(x)
    pixels = np.stack(mod.image_pixels(image)).astype(np.float32) / 255.0
    return x, pixels


