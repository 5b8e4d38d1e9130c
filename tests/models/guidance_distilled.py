"""A tiny guidance-distilled model: Flux with ``guidance_embeds=True`` (seeded random weights, the
real diffusers class), whose ``timestep`` and ``guidance`` inputs have the same shape and dtype,
and the ``pipeline.json`` ``FluxPipeline`` would have for it (hand-written to the contract,
docs/pipeline-json.md, until ``rkpart export`` writes it).

:func:`flux_guidance_export` caches the TorchScript export (made by :func:`rkpart.export.export_module`)
like every test model (:func:`tests.models.diffusers_families.cached_file`)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from tests.description.docs import base_doc, flux_guidance_inputs, flux_ids, write
from tests.models.diffusers_families import cached_file

TOKENS, TEXT = 16, 6


def _build() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    m = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                               attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                               pooled_projection_dim=16, axes_dims_rope=(4, 6, 6), guidance_embeds=True).eval()
    ids = flux_ids(TOKENS, TEXT)
    return m, {
        "hidden_states": torch.randn(1, TOKENS, 16),
        "encoder_hidden_states": torch.randn(1, TEXT, 24),
        "pooled_projections": torch.randn(1, 16),
        "timestep": torch.tensor([0.7]),
        "img_ids": torch.from_numpy(ids["img_ids"]),
        "txt_ids": torch.from_numpy(ids["txt_ids"]),
        "guidance": torch.tensor([3.5]),
    }


def _export(path: Path) -> None:
    from rkpart.export import OnnxOptions, export_module

    model, inputs = _build()
    export_module(model, inputs, path, exporter="torchscript", options=OnnxOptions(opset=17, check=False))


def flux_guidance_export() -> Path:
    """The cached TorchScript export (~4 s to make)."""
    import diffusers
    import torch

    from rkpart.export import source_key

    return cached_file("flux_guidance-torchscript", [diffusers.__version__, torch.__version__,
                                                     *(inspect.getsource(f) for f in (_build, _export, flux_ids)),
                                                     *source_key("FluxTransformer2DModel", "torchscript")],
                       _export)


def flux_guidance_description(folder: Path, **changes: Any) -> Path:
    """``folder/pipeline.json`` (and ``inputs.npz``) for :func:`flux_guidance_export`: distilled
    guidance 3.5 fed to ``guidance``, timestep ``t / 1000``, the pipeline's id grids."""
    doc = base_doc(flux_guidance_inputs(TOKENS, 16, TEXT, 24, 16))
    doc.update(changes)
    return write(folder, doc, flux_ids(TOKENS, TEXT))
