"""Tiny ``save_pretrained`` pipelines for the export tests, until ``tests/models/pipelines.py`` lands.

Real diffusers classes with seeded random weights (never downloaded); no text encoders or tokenizers
(``null`` in ``model_index.json``): the export gives ``prompt_embeds`` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def _vae(latent_channels: int = 4, **extra: Any) -> Any:
    from diffusers import AutoencoderKL

    # two levels: a vae_scale_factor of 2 keeps the images small
    return AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         latent_channels=latent_channels, norm_num_groups=4, sample_size=16, **extra)


def _pixart_sigma() -> Any:
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    t = PixArtTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
                                 num_layers=2, sample_size=8, patch_size=2, cross_attention_dim=32,
                                 caption_channels=24, norm_num_groups=4, use_additional_conditions=False,
                                 interpolation_scale=0.5)
    return PixArtSigmaPipeline(tokenizer=None, text_encoder=None, vae=_vae(), transformer=t,
                               scheduler=DPMSolverMultistepScheduler())


def _flux() -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    t = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                               attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                               pooled_projection_dim=16, axes_dims_rope=(4, 6, 6), guidance_embeds=True)
    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                            base_image_seq_len=256, max_image_seq_len=4096)
    return FluxPipeline(scheduler=sched, vae=_vae(4, shift_factor=0.1159, scaling_factor=0.3611),
                        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None, transformer=t)


def _sd3() -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    t = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16,
                              num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=32,
                              pooled_projection_dim=16, out_channels=4, pos_embed_max_size=32)
    return StableDiffusion3Pipeline(transformer=t, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                                    vae=_vae(4, shift_factor=0.0609, scaling_factor=1.5305),
                                    text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                                    text_encoder_3=None, tokenizer_3=None)


PIPELINES: dict[str, Callable[[], Any]] = {"pixart_sigma": _pixart_sigma, "flux": _flux, "sd3": _sd3}


def save_pipeline(name: str, dest: Path, seed: int = 0) -> Path:
    import torch

    torch.manual_seed(seed)
    pipe = PIPELINES[name]()
    pipe.save_pretrained(dest)
    return dest
