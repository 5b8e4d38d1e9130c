"""Tiny, real diffusers pipelines of the family sweep: the oracle for ``rkpart export`` and the board runner.

For every family of :data:`tests.models.diffusers_families.CLASS_OF` for which diffusers ships a pipeline,
:data:`PIPELINES` holds a :class:`TinyPipeline`: real classes (transformer, VAE, scheduler) built from configs
with seeded random weights, nothing downloaded.  The transformer is the family's tiny config from
``diffusers_families`` (widths changed only where the pipeline needs them to agree: the VAE's latent
channels, the text width the call passes); the VAE is the class the pipeline's ``__init__`` names, tiny (8
channels per block) but with the published checkpoint's scaling / shift / mean-std fields; the scheduler is the
class and config the published checkpoint ships (each one's source is a comment beside it).  Text encoders and
tokenizers are ``None`` (``null`` in ``model_index.json``): the call takes ``prompt_embeds=`` and friends
directly.  ``docs/pipelines.md`` tabulates them.

- :func:`cached_pipeline` -- the ``save_pretrained`` folder of a family, made once per source of its builder
  functions and the diffusers / transformers / torch versions, written atomically.
- :func:`call_inputs` -- seeded embeddings (keys: the pipeline's call arguments) and initial ``latents=``.
- :func:`run_diffusers` -- ``DiffusionPipeline.from_pretrained(folder)(...)`` on them, as numpy.

Image size: 64 x 64 pixels for every pipeline (video pipelines: one frame).  Most tiny VAEs downsample 8x like
the published ones (8 x 8 latents, the size of the sweep's tiny configs); ERNIE-Image's Flux.2 VAE with its 2x2
patchifying 16x, LTX's (diffusers' test config) 4x.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import shutil
import types
import typing
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.models import diffusers_families as df

#: pixels of every image pipeline's call (8x VAE: 8 x 8 latents)
SIZE = 64
#: text tokens of the tiny prompt embeddings and their width (the sweep's tiny configs: 6 tokens of 24)
TEXT_LEN, TEXT_DIM, POOLED_DIM = 6, 24, 16


@dataclass(frozen=True)
class TinyPipeline:
    family: str
    pipeline: str  #: the diffusers pipeline class
    components: Callable[[], dict[str, Any]]  #: -> the pipeline's ``__init__`` arguments
    #: the call's conditioning arguments, drawn from ``rng`` (:func:`call_inputs`)
    embeds: Callable[[np.random.Generator], dict[str, np.ndarray]]
    latent_shape: tuple[int, ...]  #: the ``latents=`` argument, as the pipeline takes it
    output_shape: tuple[int, ...]  #: ``output_type="np"``'s array
    cfg: str  #: ``batched`` (one call on [uncond, cond]), ``two-pass``, ``distilled`` (guidance as an input), ``none``
    guidance: float  #: the call's default ``guidance_scale``
    #: further call arguments the tiny size needs: resolution binning off (it resizes to a 1024-pixel bin);
    #: ``negative_prompt=None`` where its default is ``""`` (diffusers refuses it beside ``negative_prompt_embeds``)
    call: dict[str, Any] = field(default_factory=dict)
    height: int = SIZE
    width: int = SIZE
    #: the pipeline takes no ``latents=``: it draws them from ``generator`` (DiT); :func:`call_inputs` returns
    #: that draw and :func:`run_diffusers` passes the generator that makes it
    noise_from_generator: bool = False
    #: the pipeline has no ``output_type="latent"`` (DiT always decodes): :func:`run_diffusers` returns the
    #: final loop latent from the input of ``vae.decode`` times ``scaling_factor``
    latent_from_decoder: bool = False
    #: ``output_type="latent"``'s array when it is not ``latent_shape`` (Flux.2 takes 4-D patchified latents and
    #: returns them packed as tokens)
    final_shape: tuple[int, ...] | None = None
    #: call arguments the pipeline takes as a list of per-prompt tensors (Z-Image's ``prompt_embeds``): the npz
    #: holds them stacked, (batch, tokens, width); :func:`run_diffusers` passes ``list(array)``
    list_args: tuple[str, ...] = ()
    #: -> tiny real text encoders and tokenizers (built offline) replacing the ``None`` ones:
    #: ``cached_pipeline(family, text_encoders=True)``; None: this family has no such folder
    text_encoders: Callable[[], dict[str, Any]] | None = None


# ---- shared builders -------------------------------------------------------------------------------------------

def _transformer(family: str, **overrides: Any) -> Any:
    """The family's tiny transformer (``diffusers_families``), its config changed by ``overrides``, seeded
    weights; parameters diffusers initialises to all zeros (adaLN-Zero gates, output layers) get small seeded
    values as a trained checkpoint has them, so that the output depends on every input (a zero output would
    make a sampler check vacuous)."""
    import torch

    torch.manual_seed(0)
    model, _ = df.ALL[family].build()
    if overrides:
        cfg = {k: v for k, v in model.config.items() if not k.startswith("_")}
        cfg.update(overrides)
        torch.manual_seed(0)
        model = type(model).from_config(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, prm in sorted(model.named_parameters()):
            if prm.dtype.is_floating_point and prm.numel() > 1 and not prm.any():
                prm.copy_(torch.randn(prm.shape, generator=gen) * 0.02)
    return model.eval()


def _vae_kl(latent_channels: int = 4, **published: Any) -> Any:
    """A tiny ``AutoencoderKL``: 4 blocks of 8 channels (an 8x downsampling, as the published VAEs), one layer
    each; ``published`` are the checkpoint's own fields (``scaling_factor``, ``shift_factor``, quant convs)."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                         up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 8, 8, 8),
                         layers_per_block=1, latent_channels=latent_channels, norm_num_groups=4,
                         sample_size=SIZE, **published)


def _vae_dc(latent_channels: int = 4, **published: Any) -> Any:
    """A tiny ``AutoencoderDC`` (Sana's DC-AE): diffusers' test config (tests/pipelines/sana/test_sana.py
    ``get_dummy_components``) with 4 blocks, an 8x downsampling (the published f32c32 is 32x: 6 blocks)."""
    import torch
    from diffusers import AutoencoderDC

    torch.manual_seed(0)
    blocks = ("ResBlock", "ResBlock", "EfficientViTBlock", "EfficientViTBlock")
    return AutoencoderDC(in_channels=3, latent_channels=latent_channels, attention_head_dim=2,
                         encoder_block_types=blocks, decoder_block_types=blocks,
                         encoder_block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
                         encoder_qkv_multiscales=((), (), (5,), (5,)), decoder_qkv_multiscales=((), (), (5,), (5,)),
                         encoder_layers_per_block=(1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
                         downsample_block_type="conv", upsample_block_type="interpolate",
                         decoder_norm_types="rms_norm", decoder_act_fns="silu", **published)


def _t5_tokenizer(max_length: int) -> Any:
    """A T5 tokenizer built offline: a sentencepiece-style Unigram model (``tokenizers``) over a small vocabulary
    (T5's ids for ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2; a few words, then every letter, digit and punctuation
    mark alone and after "▁", so that any ASCII prompt tokenizes), the metaspace pre-tokenizer and decoder, and
    ``</s>`` appended as T5 does.  It round-trips through ``save_pretrained`` / ``from_pretrained``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    words = ["a", "an", "the", "of", "on", "in", "at", "with", "and", "cat", "dog", "photo", "red", "blue", "green",
             "small", "big", "house", "tree", "sky"]
    chars = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-")
    pieces = ["▁" + w for w in words] + ["▁" + c for c in chars if c not in words] + chars
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [(p, -3.0 - 0.01 * i) for i, p in enumerate(pieces)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    return T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                           extra_ids=0, model_max_length=max_length)


def _t5_encoder(vocab_size: int, d_model: int) -> Any:
    """A tiny ``T5EncoderModel`` (T5 v1.1's gated-GELU FFN, relative attention), seeded weights."""
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    cfg = T5Config(vocab_size=vocab_size, d_model=d_model, d_kv=8, d_ff=2 * d_model, num_layers=2, num_heads=3,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                   feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False, pad_token_id=0,
                   eos_token_id=1, decoder_start_token_id=0)
    return T5EncoderModel(cfg).eval()


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _masks(n: int = TEXT_LEN, dtype: type = np.int64, extra: int = 0) -> dict[str, np.ndarray]:
    """A prompt that fills all but the last token and a negative prompt of 2 tokens (as a tokenizer pads ``""``
    and a short prompt to the same length): the two passes' masks differ.  ``extra``: tokens past the prompt's
    end kept valid (Chroma keeps the first padding token)."""
    pos = np.zeros((1, n), dtype=dtype)
    pos[0, :min(n, n - 1 + extra)] = 1
    neg = np.zeros((1, n), dtype=dtype)
    neg[0, :2 + extra] = 1
    return {"prompt_attention_mask": pos, "negative_prompt_attention_mask": neg}


def _text(rng: np.random.Generator, *, negative: bool = True, masks: bool = False, pooled: int = 0,
          n: int = TEXT_LEN, dim: int = TEXT_DIM, mask_dtype: type = np.int64, mask_extra: int = 0,
          layers: int = 0, mask_name: str = "prompt_attention_mask") -> dict[str, np.ndarray]:
    """``prompt_embeds`` (1, n, dim) (``layers``: (1, n, layers, dim), one per tapped text-encoder layer), and as
    asked its negative, pooled embeddings and masks (named ``mask_name`` and ``negative_`` + it)."""
    out = {"prompt_embeds": _normal(rng, 1, n, layers, dim) if layers else _normal(rng, 1, n, dim)}
    if pooled:
        out["pooled_prompt_embeds"] = _normal(rng, 1, pooled)
    if negative:
        out["negative_prompt_embeds"] = _normal(rng, 1, n, layers, dim) if layers else _normal(rng, 1, n, dim)
        if pooled:
            out["negative_pooled_prompt_embeds"] = _normal(rng, 1, pooled)
    if masks:
        m = _masks(n, mask_dtype, mask_extra)
        out[mask_name] = m["prompt_attention_mask"]
        if negative:
            out["negative_" + mask_name] = m["negative_prompt_attention_mask"]
    return out


def _hunyuandit_text(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """HunyuanDiT's two encoders: CLIP/BERT (``prompt_embeds``) and mT5 (``prompt_embeds_2``), each with masks."""
    first, second = _text(rng, masks=True), _text(rng, masks=True)
    return {**first, **{k.replace("embeds", "embeds_2").replace("mask", "mask_2"): v for k, v in second.items()}}


def _chroma_text(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Chroma's masks as its ``_get_t5_prompt_embeds`` makes them: float, the prompt's tokens and the first
    padding token valid."""
    return _text(rng, masks=True, mask_dtype=np.float32, mask_extra=1)


def _hidream_text(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """HiDream's T5 embeddings, its Llama layers (one per block the transformer reads, stacked first: (layers,
    batch, tokens, width)) and CLIP's pooled embeddings, each with its negative."""
    out: dict[str, np.ndarray] = {}
    for sign in ("", "negative_"):
        out[sign + "prompt_embeds_t5"] = _normal(rng, 1, TEXT_LEN, TEXT_DIM)
        out[sign + "prompt_embeds_llama3"] = _normal(rng, 4, 1, 5, 20)
        out[sign + "pooled_prompt_embeds"] = _normal(rng, 1, POOLED_DIM)
    return out


def _kandinsky5_text(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Kandinsky 5's Qwen2.5-VL embeddings with their cumulative lengths (int32 ``[0, tokens]``) and CLIP's pooled
    embeddings, each with its negative (a shorter negative prompt: 2 tokens)."""
    out: dict[str, np.ndarray] = {}
    for sign, n in (("", TEXT_LEN), ("negative_", 2)):
        out[sign + "prompt_embeds_qwen"] = _normal(rng, 1, n, TEXT_DIM)
        out[sign + "prompt_embeds_clip"] = _normal(rng, 1, POOLED_DIM)
        out[sign + "prompt_cu_seqlens"] = np.array([0, n], dtype=np.int32)
    return out


# ---- the families ----------------------------------------------------------------------------------------------

def _pixart_sigma() -> dict[str, Any]:
    from diffusers import DPMSolverMultistepScheduler

    return {
        "transformer": _transformer("pixart_sigma"),
        # PixArt-Σ ships the SDXL VAE (scripts/convert_pixart_sigma_to_diffusers.py: pixart_sigma_sdxlvae_T5_diffusers)
        "vae": _vae_kl(scaling_factor=0.13025, force_upcast=True),
        # scripts/convert_pixart_sigma_to_diffusers.py: DPMSolverMultistepScheduler() (dpmsolver++, order 2, epsilon)
        "scheduler": DPMSolverMultistepScheduler(),
        "tokenizer": None, "text_encoder": None,
    }


def _pixart_sigma_text() -> dict[str, Any]:
    # PixArt-Σ's T5-XXL (4096 wide, max_sequence_length 300) as a 2-layer T5 of the transformer's caption width
    tokenizer = _t5_tokenizer(300)
    return {"tokenizer": tokenizer, "text_encoder": _t5_encoder(len(tokenizer), TEXT_DIM)}


def _flux() -> dict[str, Any]:
    return {
        # FLUX.1-dev: guidance-distilled (guidance_embeds=True; the sweep's tiny config is schnell-like)
        "transformer": _transformer("flux", guidance_embeds=True),
        # FLUX.1 VAE: 16 latent channels (here 4: the tiny transformer's in_channels 16 = 4 x 2x2 packing),
        # scaling 0.3611, shift 0.1159, no quant convs (diffusers' single_file_utils flux VAE config)
        "vae": _flux_vae(),
        # FLUX.1-dev scheduler_config.json: dynamic shifting from the image's token count
        "scheduler": _flux_dynamic_shift(),
        "text_encoder": None, "tokenizer": None, "text_encoder_2": None, "tokenizer_2": None,
    }


def _sd3_components(family: str) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer(family),
        # SD3 VAE: 16 latent channels (here 4, the tiny transformer's), scaling 1.5305, shift 0.0609, no quant convs
        "vae": _vae_kl(scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False),
        # stable-diffusion-3-medium-diffusers scheduler_config.json: FlowMatchEulerDiscreteScheduler, shift 3.0
        # (SD3.5 large / medium ship the same)
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        "text_encoder": None, "tokenizer": None, "text_encoder_2": None, "tokenizer_2": None,
        "text_encoder_3": None, "tokenizer_3": None,
    }


def _sd3() -> dict[str, Any]:
    return _sd3_components("sd3")


def _sd35() -> dict[str, Any]:
    return _sd3_components("sd35")


def _sana() -> dict[str, Any]:
    from diffusers import DPMSolverMultistepScheduler

    return {
        "transformer": _transformer("sana"),
        # DC-AE f32c32: scaling 0.41407 (diffusers' Sana tests and docs)
        "vae": _vae_dc(scaling_factor=0.41407),
        # scripts/convert_sana_to_diffusers.py, "flow-dpm_solver" (the default): flow_shift 3.0 below 4096 pixels
        "scheduler": DPMSolverMultistepScheduler(flow_shift=3.0, use_flow_sigmas=True,
                                                 prediction_type="flow_prediction"),
        "tokenizer": None, "text_encoder": None,
    }


def _dit() -> dict[str, Any]:
    from diffusers import DDIMScheduler

    return {
        # DiT-XL-2: 1000 ImageNet classes (the pipeline's null class is label 1000), learned sigma (8 channels out)
        "transformer": _transformer("dit", num_embeds_ada_norm=1000, out_channels=8),
        "vae": _vae_kl(scaling_factor=0.18215),  # sd-vae-ft-ema / mse (scripts/convert_dit_to_diffusers.py)
        # scripts/convert_dit_to_diffusers.py
        "scheduler": DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", prediction_type="epsilon",
                                   clip_sample=False),
        "id2label": None,
    }


def _pixart() -> dict[str, Any]:
    from diffusers import DPMSolverMultistepScheduler

    return {
        "transformer": _transformer("pixart"),
        # PixArt-α ships sd-vae-ft-ema (scripts/convert_pixart_alpha_to_diffusers.py)
        "vae": _vae_kl(scaling_factor=0.18215),
        "scheduler": DPMSolverMultistepScheduler(),  # scripts/convert_pixart_alpha_to_diffusers.py
        "tokenizer": None, "text_encoder": None,
    }


def _flux_vae() -> Any:
    """FLUX.1's VAE fields (16 latent channels there, 4 here: the tiny packed transformers take 16 = 4 x 2x2)."""
    return _vae_kl(scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False)


def _flux_dynamic_shift() -> Any:
    """FLUX.1-dev's scheduler_config.json (the values FluxPipeline's ``scheduler.config.get`` falls back to)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                           base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                           max_image_seq_len=4096)


def _chroma_components(family: str) -> dict[str, Any]:
    return {
        "transformer": _transformer(family),
        "vae": _flux_vae(),  # Chroma is built on FLUX.1-schnell: its VAE
        # Chroma1-HD's scheduler_config.json as recalled (Flux's dynamic shifting): not verifiable offline;
        # ChromaPipeline reads base/max shift and seq lens with Flux's fallbacks
        "scheduler": _flux_dynamic_shift(),
        "text_encoder": None, "tokenizer": None,
    }


def _chroma() -> dict[str, Any]:
    return _chroma_components("chroma")


def _chroma_guidance() -> dict[str, Any]:
    return _chroma_components("chroma_guidance")


def _lumina2() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("lumina2"),
        "vae": _flux_vae(),  # Lumina-Image-2.0 uses FLUX.1's VAE
        # Lumina-Image-2.0's scheduler_config.json as recalled (shift 6.0): not verifiable offline
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=6.0),
        "text_encoder": None, "tokenizer": None,
    }


def _auraflow() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("auraflow"),
        "vae": _vae_kl(scaling_factor=0.13025),  # AuraFlow uses the SDXL VAE
        # AuraFlow v0.3's scheduler_config.json as recalled (shift 1.73): not verifiable offline
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.73),
        "text_encoder": None, "tokenizer": None,
    }


def _hunyuandit_components(family: str) -> dict[str, Any]:
    from diffusers import DDPMScheduler

    return {
        "transformer": _transformer(family),  # learn_sigma: 8 output channels
        "vae": _vae_kl(scaling_factor=0.13025),  # sdxl-vae-fp16-fix
        # HunyuanDiT-v1.2-Diffusers' scheduler_config.json (the same values in xDiT's and kohya's HunyuanDiT code)
        "scheduler": DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.018,
                                   beta_schedule="scaled_linear", prediction_type="v_prediction",
                                   variance_type="fixed_small", clip_sample=False, steps_offset=1,
                                   timestep_spacing="leading"),
        "text_encoder": None, "tokenizer": None, "text_encoder_2": None, "tokenizer_2": None,
        "safety_checker": None, "feature_extractor": None, "requires_safety_checker": False,
    }


def _hunyuandit() -> dict[str, Any]:
    return _hunyuandit_components("hunyuandit")


def _hunyuandit_skip() -> dict[str, Any]:
    return _hunyuandit_components("hunyuandit_skip")


def _cogview_vae() -> Any:
    # scripts/convert_cogview3_to_diffusers.py / convert_cogview4_to_diffusers.py: 16 channels (here 4),
    # scaling 1.0, shift 0.0, no quant convs
    return _vae_kl(scaling_factor=1.0, shift_factor=0.0, force_upcast=True, use_quant_conv=False,
                   use_post_quant_conv=False, mid_block_add_attention=False)


def _cogview4() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("cogview4"),
        "vae": _cogview_vae(),
        # scripts/convert_cogview4_to_diffusers.py
        "scheduler": FlowMatchEulerDiscreteScheduler(base_shift=0.25, max_shift=0.75, base_image_seq_len=256,
                                                     use_dynamic_shifting=True, time_shift_type="linear"),
        "text_encoder": None, "tokenizer": None,
    }


def _cogview3plus() -> dict[str, Any]:
    from diffusers import CogVideoXDDIMScheduler

    return {
        "transformer": _transformer("cogview3plus"),
        "vae": _cogview_vae(),
        # scripts/convert_cogview3_to_diffusers.py
        "scheduler": CogVideoXDDIMScheduler(snr_shift_scale=4.0, beta_end=0.012, beta_schedule="scaled_linear",
                                            beta_start=0.00085, clip_sample=False, num_train_timesteps=1000,
                                            prediction_type="v_prediction", rescale_betas_zero_snr=True,
                                            set_alpha_to_one=True, timestep_spacing="trailing"),
        "text_encoder": None, "tokenizer": None,
    }


def _flux_like(family: str, **extra: Any) -> dict[str, Any]:
    """Flux-anatomy families whose pipelines keep Flux's VAE and dynamic shifting (their published configs as
    recalled: not verifiable offline)."""
    return {"transformer": _transformer(family), "vae": _flux_vae(), "scheduler": _flux_dynamic_shift(),
            "text_encoder": None, "tokenizer": None, **extra}


def _ovis_image() -> dict[str, Any]:
    return _flux_like("ovis_image")


def _bria() -> dict[str, Any]:
    return _flux_like("bria")


def _lumina_next() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("lumina_next"),
        # scripts/convert_lumina_to_diffusers.py: the SDXL VAE, FlowMatchEulerDiscreteScheduler()
        "vae": _vae_kl(scaling_factor=0.13025),
        "scheduler": FlowMatchEulerDiscreteScheduler(),
        "text_encoder": None, "tokenizer": None,
    }


#: Wan 2.1's VAE per-channel latent mean and std (diffusers' AutoencoderKLWan and AutoencoderKLQwenImage
#: defaults, the published values); a tiny VAE with fewer channels keeps the first ones
_WAN_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517, -0.3632,
             -0.1922, -0.9497, 0.2503, -0.2921]
_WAN_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579, 1.6382,
            1.1253, 2.8251, 1.916]


def _vae_wan(z_dim: int = 4) -> Any:
    """A tiny ``AutoencoderKLWan`` (8x spatial, 4x temporal as Wan 2.1's), Wan's latent mean / std."""
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    return AutoencoderKLWan(base_dim=8, z_dim=z_dim, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                            temperal_downsample=[False, True, True], latents_mean=_WAN_MEAN[:z_dim],
                            latents_std=_WAN_STD[:z_dim])


def _vae_qwen(z_dim: int = 4) -> Any:
    """A tiny ``AutoencoderKLQwenImage`` (8x spatial), its published latent mean / std (Wan 2.1's)."""
    import torch
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(0)
    return AutoencoderKLQwenImage(base_dim=8, z_dim=z_dim, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                  temperal_downsample=[False, True, True], latents_mean=_WAN_MEAN[:z_dim],
                                  latents_std=_WAN_STD[:z_dim])


def _vae_flux2(latent_channels: int = 4) -> Any:
    """A tiny ``AutoencoderKLFlux2`` (8x, latents patchified 2x2 and batch-normalised).  Its batch norm's running
    mean / variance get seeded values (a trained VAE's are not 0 / 1): the pipelines de-normalise with them."""
    import torch
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                             block_out_channels=(8, 8, 8, 8), layers_per_block=1, latent_channels=latent_channels,
                             norm_num_groups=4, sample_size=SIZE)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        vae.bn.running_mean.copy_(torch.randn(vae.bn.running_mean.shape, generator=gen) * 0.5)
        vae.bn.running_var.copy_(torch.rand(vae.bn.running_var.shape, generator=gen) * 1.5 + 0.5)
    return vae


def _zimage() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("zimage"),
        # Z-Image uses FLUX.1's VAE: 16 latent channels (the tiny transformer's in_channels, unpacked)
        "vae": _vae_kl(16, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                       use_post_quant_conv=False),
        # Z-Image-Turbo's scheduler_config.json as recalled (shift 3.0, no dynamic shifting): not verifiable offline
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        "text_encoder": None, "tokenizer": None,
    }


def _prx() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("prx"),
        "vae": _flux_vae(),  # scripts/convert_prx_to_diffusers.py: the "flux" variant's VAE
        # scripts/convert_prx_to_diffusers.py: FlowMatchEulerDiscreteScheduler, shift 3.0 (its --shift default)
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        "text_encoder": None, "tokenizer": None,
    }


def _cosmos() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("cosmos"),
        "vae": _vae_wan(),  # Cosmos-Predict2 uses Wan 2.1's VAE
        # scripts/convert_cosmos_to_diffusers.py (Cosmos-Predict2): FlowMatchEulerDiscreteScheduler(use_karras_sigmas)
        "scheduler": FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True),
        "text_encoder": None, "tokenizer": None, "safety_checker": None,
    }


def _krea2() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("krea2"),
        "vae": _vae_qwen(),  # the pipeline's type hint: AutoencoderKLQwenImage
        # not verifiable offline: Krea2Pipeline computes mu from the image (max_image_seq_len fallback 6400)
        "scheduler": FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
        "text_encoder": None, "tokenizer": None,
    }


def _nucleus_moe() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("nucleus_moe"),
        "vae": _vae_qwen(),
        # not verifiable offline: the pipeline computes mu with Flux's fallbacks
        "scheduler": FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
        "text_encoder": None, "processor": None,
    }


def _flux2() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        # FLUX.2-dev: guidance-distilled (guidance_embeds, the sweep's tiny config has none)
        "transformer": _transformer("flux2", guidance_embeds=True),
        "vae": _vae_flux2(),
        # scripts/convert_flux2_to_diffusers.py loads FLUX.1's scheduler config; Flux2Pipeline computes its own mu
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True),
        "text_encoder": None, "tokenizer": None,
    }


def _ernie_image() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        # in/out 16 channels: the 4 latent channels of the tiny VAE patchified 2x2 (the sweep's config takes 4)
        "transformer": _transformer("ernie_image", in_channels=16, out_channels=16),
        "vae": _vae_flux2(),
        # not verifiable offline: ErnieImagePipeline passes its own sigmas linspace(1, 0, n + 1)
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        "text_encoder": None, "tokenizer": None, "pe": None, "pe_tokenizer": None,
    }


def _hidream_image() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("hidream_image"),
        "vae": _flux_vae(),  # HiDream-I1 uses FLUX.1's VAE
        # HiDream-I1-Full's scheduler_config.json as recalled (FlowMatchEuler, shift 3.0): not verifiable offline
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        "text_encoder": None, "tokenizer": None, "text_encoder_2": None, "tokenizer_2": None,
        "text_encoder_3": None, "tokenizer_3": None, "text_encoder_4": None, "tokenizer_4": None,
    }


def _qwenimage21() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("qwenimage21"),
        "vae": _vae_qwen(),
        "scheduler": FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),  # not verifiable offline
        "text_encoder": None, "processor": None,
    }


def _bria_fibo2() -> dict[str, Any]:
    return {
        "transformer": _transformer("bria_fibo2", in_channels=16),  # the 4 latent channels patchified 2x2
        "vae": _vae_flux2(),
        "scheduler": _flux_dynamic_shift(),  # not verifiable offline: the pipeline reads base/max shift and lens
        "text_encoder": None, "processor": None,
    }


def _kandinsky5() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer("kandinsky5"),
        "vae": _flux_vae(),  # Kandinsky 5 image uses FLUX.1's VAE
        # not verifiable offline: Kandinsky-5 image's scheduler_config.json (shift 3.0 recalled)
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        "text_encoder": None, "tokenizer": None, "text_encoder_2": None, "tokenizer_2": None,
    }


def _wan() -> dict[str, Any]:
    from diffusers import UniPCMultistepScheduler

    return {
        "transformer": _transformer("wan"),
        "vae": _vae_wan(),
        # scripts/convert_wan_to_diffusers.py, text-to-video: UniPC, flow prediction, flow_shift 3.0
        "scheduler": UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                             num_train_timesteps=1000, flow_shift=3.0),
        "text_encoder": None, "tokenizer": None, "transformer_2": None,
    }


def _cogvideox() -> dict[str, Any]:
    import torch
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler

    torch.manual_seed(0)
    # diffusers' test config (tests/pipelines/cogvideo/test_cogvideox.py), CogVideoX-2b's scaling factor
    vae = AutoencoderKLCogVideoX(in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
                                 up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
                                 latent_channels=4, layers_per_block=1, norm_num_groups=2,
                                 temporal_compression_ratio=4, scaling_factor=1.15258426)
    return {
        "transformer": _transformer("cogvideox"),
        "vae": vae,
        # scripts/convert_cogvideox_to_diffusers.py, CogVideoX-2b (snr_shift_scale 3.0)
        "scheduler": CogVideoXDDIMScheduler(snr_shift_scale=3.0, beta_end=0.012, beta_schedule="scaled_linear",
                                            beta_start=0.00085, clip_sample=False, num_train_timesteps=1000,
                                            prediction_type="v_prediction", rescale_betas_zero_snr=True,
                                            set_alpha_to_one=True, timestep_spacing="trailing"),
        "text_encoder": None, "tokenizer": None,
    }


def _ltx() -> dict[str, Any]:
    import torch
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler

    torch.manual_seed(0)
    # diffusers' test config (tests/pipelines/ltx/test_ltx.py)
    vae = AutoencoderKLLTXVideo(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                                decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
                                decoder_layers_per_block=(1, 1, 1, 1, 1),
                                spatio_temporal_scaling=(True, True, False, False),
                                decoder_spatio_temporal_scaling=(True, True, False, False),
                                decoder_inject_noise=(False, False, False, False, False),
                                upsample_residual=(False, False, False, False), upsample_factor=(1, 1, 1, 1),
                                timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
                                decoder_causal=False)
    return {
        "transformer": _transformer("ltx"),
        "vae": vae,
        # scripts/convert_ltx_to_diffusers.py, LTX-Video 0.9.0 / 0.9.1 (LTXPipeline)
        "scheduler": FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                                     base_image_seq_len=1024, max_image_seq_len=4096,
                                                     shift_terminal=0.1),
        "text_encoder": None, "tokenizer": None,
    }


_L = SIZE // 8  # latent side

PIPELINES: dict[str, TinyPipeline] = {p.family: p for p in (
    TinyPipeline("pixart_sigma", "PixArtSigmaPipeline", _pixart_sigma,
                 lambda rng: _text(rng, masks=True), (1, 4, _L, _L), (1, SIZE, SIZE, 3), "batched", 4.5,
                 {"use_resolution_binning": False, "negative_prompt": None}, text_encoders=_pixart_sigma_text),
    TinyPipeline("flux", "FluxPipeline", _flux, lambda rng: _text(rng, negative=False, pooled=POOLED_DIM),
                 (1, (_L // 2) ** 2, 16), (1, SIZE, SIZE, 3), "distilled", 3.5),
    TinyPipeline("sd3", "StableDiffusion3Pipeline", _sd3, lambda rng: _text(rng, pooled=POOLED_DIM),
                 (1, 4, _L, _L), (1, SIZE, SIZE, 3), "batched", 7.0),
    TinyPipeline("sana", "SanaPipeline", _sana, lambda rng: _text(rng, masks=True), (1, 4, _L, _L),
                 (1, SIZE, SIZE, 3), "batched", 4.5, {"use_resolution_binning": False, "negative_prompt": None}),
    TinyPipeline("dit", "DiTPipeline", _dit, lambda rng: {"class_labels": rng.integers(0, 1000, 1)},
                 (1, 4, _L, _L), (1, SIZE, SIZE, 3), "batched", 4.0, noise_from_generator=True,
                 latent_from_decoder=True),
    TinyPipeline("pixart", "PixArtAlphaPipeline", _pixart, lambda rng: _text(rng, masks=True), (1, 4, _L, _L),
                 (1, SIZE, SIZE, 3), "batched", 4.5, {"use_resolution_binning": False, "negative_prompt": None}),
    TinyPipeline("sd35", "StableDiffusion3Pipeline", _sd35, lambda rng: _text(rng, pooled=POOLED_DIM),
                 (1, 4, _L, _L), (1, SIZE, SIZE, 3), "batched", 7.0),
    TinyPipeline("chroma", "ChromaPipeline", _chroma, _chroma_text,
                 (1, (_L // 2) ** 2, 16), (1, SIZE, SIZE, 3), "two-pass", 5.0),
    TinyPipeline("chroma_guidance", "ChromaPipeline", _chroma_guidance, _chroma_text,
                 (1, (_L // 2) ** 2, 16), (1, SIZE, SIZE, 3), "two-pass", 5.0),
    TinyPipeline("lumina2", "Lumina2Pipeline", _lumina2, lambda rng: _text(rng, masks=True), (1, 4, _L, _L),
                 (1, SIZE, SIZE, 3), "two-pass", 4.0),
    TinyPipeline("auraflow", "AuraFlowPipeline", _auraflow, lambda rng: _text(rng, masks=True), (1, 4, _L, _L),
                 (1, SIZE, SIZE, 3), "batched", 3.5),
    TinyPipeline("hunyuandit", "HunyuanDiTPipeline", _hunyuandit, lambda rng: _hunyuandit_text(rng),
                 (1, 4, _L, _L), (1, SIZE, SIZE, 3), "batched", 5.0, {"use_resolution_binning": False}),
    TinyPipeline("hunyuandit_skip", "HunyuanDiTPipeline", _hunyuandit_skip, lambda rng: _hunyuandit_text(rng),
                 (1, 4, _L, _L), (1, SIZE, SIZE, 3), "batched", 5.0, {"use_resolution_binning": False}),
    TinyPipeline("cogview4", "CogView4Pipeline", _cogview4, lambda rng: _text(rng), (1, 4, _L, _L),
                 (1, SIZE, SIZE, 3), "two-pass", 5.0),
    TinyPipeline("cogview3plus", "CogView3PlusPipeline", _cogview3plus, lambda rng: _text(rng), (1, 4, _L, _L),
                 (1, SIZE, SIZE, 3), "batched", 5.0),
    TinyPipeline("ovis_image", "OvisImagePipeline", _ovis_image, lambda rng: _text(rng),
                 (1, (_L // 2) ** 2, 16), (1, SIZE, SIZE, 3), "two-pass", 5.0, {"negative_prompt": None}),
    TinyPipeline("bria", "BriaPipeline", _bria, lambda rng: _text(rng),
                 (1, (_L // 2) ** 2, 16), (1, SIZE, SIZE, 3), "batched", 5.0),
    TinyPipeline("zimage", "ZImagePipeline", _zimage, lambda rng: _text(rng), (1, 16, _L, _L),
                 (1, SIZE, SIZE, 3), "batched", 5.0, list_args=("prompt_embeds", "negative_prompt_embeds")),
    TinyPipeline("prx", "PRXPipeline", _prx, lambda rng: _text(rng), (1, 4, _L, _L), (1, SIZE, SIZE, 3),
                 "batched", 4.0, {"use_resolution_binning": False, "negative_prompt": None}),
    TinyPipeline("krea2", "Krea2Pipeline", _krea2,
                 lambda rng: _text(rng, masks=True, layers=3, dim=32, mask_name="prompt_embeds_mask",
                                   mask_dtype=np.bool_),
                 (1, (_L // 2) ** 2, 16), (1, SIZE, SIZE, 3), "two-pass", 4.5),
    TinyPipeline("nucleus_moe", "NucleusMoEImagePipeline", _nucleus_moe,
                 lambda rng: _text(rng, masks=True, mask_name="prompt_embeds_mask"),
                 (1, (_L // 2) ** 2, 16), (1, SIZE, SIZE, 3), "two-pass", 4.0),
    TinyPipeline("flux2", "Flux2Pipeline", _flux2, lambda rng: _text(rng, negative=False),
                 (1, 16, _L // 2, _L // 2), (1, SIZE, SIZE, 3), "distilled", 4.0,
                 final_shape=(1, (_L // 2) ** 2, 16)),
    TinyPipeline("ernie_image", "ErnieImagePipeline", _ernie_image, lambda rng: _text(rng),
                 (1, 16, _L // 2, _L // 2), (1, SIZE, SIZE, 3), "batched", 4.0,
                 {"negative_prompt": None, "use_pe": False}),
    # video pipelines, one frame (1 latent frame): the output is (batch, frames, height, width, 3)
    TinyPipeline("wan", "WanPipeline", _wan, lambda rng: _text(rng), (1, 4, 1, _L, _L), (1, 1, SIZE, SIZE, 3),
                 "two-pass", 5.0, {"num_frames": 1}),
    TinyPipeline("cogvideox", "CogVideoXPipeline", _cogvideox, lambda rng: _text(rng), (1, 1, 4, _L, _L),
                 (1, 1, SIZE, SIZE, 3), "batched", 6, {"num_frames": 1}),
    TinyPipeline("ltx", "LTXPipeline", _ltx, lambda rng: _text(rng, masks=True), (1, (SIZE // 4) ** 2, 8),
                 (1, 1, SIZE, SIZE, 3), "batched", 3, {"num_frames": 1}),
    TinyPipeline("lumina_next", "LuminaPipeline", _lumina_next, lambda rng: _text(rng, masks=True),
                 (1, 4, _L, _L), (1, SIZE, SIZE, 3), "batched", 4.0),
)}


# ---- cache, inputs, oracle -------------------------------------------------------------------------------------

def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _sources(start: Callable[..., Any]) -> list[str]:
    """The source of ``start`` and of every function of this module or ``diffusers_families`` it reaches by
    name (transitively): what a pipeline folder is made of, so that the cache key changes when any of it does."""
    modules = [globals(), vars(df)]
    seen: dict[str, str] = {}
    todo: list[Callable[..., Any]] = [start]
    while todo:
        fn = todo.pop()
        key = f"{fn.__module__}.{fn.__qualname__}"
        if key in seen:
            continue
        seen[key] = inspect.getsource(fn)
        for code in _code_objects(fn.__code__):
            for name in code.co_names:
                for mod in modules:
                    obj = mod.get(name)
                    if inspect.isfunction(obj) and obj.__module__ in (__name__, df.__name__):
                        todo.append(obj)
    # the family's builder in diffusers_families (reached through df.ALL, not by name)
    return [seen[k] for k in sorted(seen)]


def _key(spec: TinyPipeline, text_encoders: bool) -> str:
    import diffusers
    import torch
    import transformers

    parts = [diffusers.__version__, torch.__version__, transformers.__version__, spec.pipeline,
             *_sources(spec.components), inspect.getsource(df.ALL[spec.family].build),
             inspect.getsource(_build)]
    if text_encoders:
        assert spec.text_encoders is not None
        parts += ["text encoders", *_sources(spec.text_encoders)]
    return hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:16]


def _build(spec: TinyPipeline, out: Path, text_encoders: bool = False) -> None:
    import diffusers
    from diffusers.utils import logging as diffusers_logging

    components = spec.components()
    if text_encoders:
        assert spec.text_encoders is not None
        components.update(spec.text_encoders())
    pipe = getattr(diffusers, spec.pipeline)(**components)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if text_encoders:
            from transformers.utils import logging

            logging.disable_progress_bar()  # "Writing model shards"
        level = diffusers_logging.get_verbosity()
        diffusers_logging.set_verbosity_error()  # "self.text_encoder=None ... cannot be saved" (null: intended)
        try:
            pipe.save_pretrained(out, safe_serialization=True)
        finally:
            diffusers_logging.set_verbosity(level)


def pipeline_root() -> Path:
    """Where :func:`cached_pipeline` keeps folders: ``<export root>/pipelines`` (``$RKPART_TEST_EXPORTS``)."""
    return df.export_root() / "pipelines"


def cached_pipeline(family: str, *, text_encoders: bool = False) -> Path:
    """The ``save_pretrained`` folder of family ``family``'s tiny pipeline (:data:`PIPELINES`), made once per
    source of its builder functions and library versions.  Built in a private temporary folder then renamed:
    a failed or concurrent build never leaves a half-written folder under the final name.

    ``text_encoders``: the folder with tiny real text encoders and tokenizers (``<family>-te-<hash>``; only
    the families in :data:`WITH_TEXT_ENCODERS`), for ``rkpart encode``; same transformer, VAE and scheduler.
    """
    spec = PIPELINES[family]
    if text_encoders and spec.text_encoders is None:
        raise KeyError(f"{family}: no tiny text encoders (families with them: {', '.join(WITH_TEXT_ENCODERS)})")
    root = pipeline_root()
    path = root / f"{family}{'-te' if text_encoders else ''}-{_key(spec, text_encoders)}"
    if (path / "model_index.json").is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{path.name}.{os.getpid()}.part"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _build(spec, tmp, text_encoders)
        try:
            os.replace(tmp, path)
        except OSError:
            if not (path / "model_index.json").is_file():  # not a concurrent build's: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def call_inputs(family: str, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Seeded conditioning for family ``family``'s pipeline call and its initial noise.

    Returns ``(embeds, latents)``: ``embeds`` keyed by the call's argument names (``prompt_embeds``,
    ``negative_prompt_embeds``, ``pooled_prompt_embeds``, ``prompt_attention_mask``, ...; float32 embeddings,
    int64 masks), ``latents`` the ``latents=`` argument (float32, :attr:`TinyPipeline.latent_shape`).
    """
    spec = PIPELINES[family]
    rng = np.random.default_rng(seed)
    embeds = spec.embeds(rng)
    latents = _generator_noise(spec.latent_shape, seed) if spec.noise_from_generator else _normal(
        rng, *spec.latent_shape)
    return embeds, latents


def _generator_noise(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The noise a pipeline without ``latents=`` draws first from ``torch.Generator().manual_seed(seed)``
    (``randn_tensor`` on the CPU)."""
    import torch

    return np.asarray(torch.randn(shape, generator=torch.Generator().manual_seed(seed)).numpy(), dtype=np.float32)


def _family_of(folder: Path) -> TinyPipeline:
    """The spec of a cached folder: by its name (``<family>-<hash>``), else the only family of its class."""
    name = folder.name.rsplit("-", 1)[0].removesuffix("-te")
    if name in PIPELINES:
        return PIPELINES[name]
    cls = json.loads((folder / "model_index.json").read_text())["_class_name"]
    matches = [p for p in PIPELINES.values() if p.pipeline == cls]
    if len(matches) != 1:
        raise KeyError(f"{folder}: not one tiny pipeline of class {cls}")
    return matches[0]


def null_components(folder: str | Path) -> dict[str, None]:
    """``{name: None}`` for every component ``model_index.json`` records as ``[null, null]``.

    ``DiffusionPipeline.from_pretrained`` loads a null component as ``None`` only when the pipeline lists it
    in ``_optional_components`` (PixArt, Sana: their text encoder and tokenizer); for the others (Flux, SD3:
    ``text_encoder``, ``tokenizer``, ...) it raises ``ValueError: Pipeline ... expected [...], but only
    {...} were passed`` unless the call passes them, as ``from_pretrained(folder, text_encoder=None, ...)``.
    """
    index = json.loads((Path(folder) / "model_index.json").read_text())
    return {k: None for k, v in index.items()
            if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[0] is None}


def load(folder: str | Path) -> Any:
    """``DiffusionPipeline.from_pretrained(folder, **null_components(folder))`` on the CPU, float32, no progress
    bar."""
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()  # "cannot initialize with low cpu memory usage", progress bars
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe = DiffusionPipeline.from_pretrained(str(folder), **null_components(folder))
    finally:
        logging.set_verbosity(level)
        logging.enable_progress_bar()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_diffusers(folder: str | Path, embeds: dict[str, np.ndarray], latents: np.ndarray, steps: int,
                  guidance: float | None = None, output_type: str = "latent", *, pipe: Any = None,
                  seed: int = 0) -> np.ndarray:
    """What diffusers' own pipeline returns for these inputs: ``pipe(**embeds, latents=latents,
    num_inference_steps=steps, guidance_scale=guidance, output_type=output_type)``, as float32 numpy.

    ``guidance`` None: the pipeline's default.  The height and width are the tiny pipeline's (64 x 64), and
    the few call arguments the tiny size needs (:attr:`TinyPipeline.call`) are passed; everything else is the
    pipeline's default.  ``output_type="latent"`` returns the final latent as the pipeline returns it (packed
    for Flux-style pipelines), ``"np"`` the image NHWC in [0, 1].  ``torch.Generator().manual_seed(seed)`` is
    passed for schedulers that draw noise during the loop (DDPM); a pipeline without ``latents=`` (DiT) draws
    its initial noise from it, and ``latents`` must then be that draw (:func:`call_inputs` with the same seed),
    else ValueError.  ``pipe``: an already loaded pipeline of ``folder`` (saves a load).
    """
    import torch

    folder = Path(folder)
    spec = _family_of(folder)
    if pipe is None:
        pipe = load(folder)
    kwargs: dict[str, Any] = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in embeds.items()}
    for k in spec.list_args:
        kwargs[k] = list(kwargs[k])
    kwargs.update(spec.call)
    if guidance is not None:
        kwargs["guidance_scale"] = guidance
    if spec.noise_from_generator:
        if not np.array_equal(latents, _generator_noise(spec.latent_shape, seed)):
            raise ValueError(f"{spec.pipeline} takes no latents=: its noise is the first draw of the generator; "
                             f"pass the latents call_inputs({spec.family!r}, seed) returns and the same seed")
    else:
        kwargs.update(latents=torch.from_numpy(np.ascontiguousarray(latents)), height=spec.height,
                      width=spec.width)
    if output_type == "latent" and spec.latent_from_decoder:
        return _decoded_latent(pipe, steps, seed, kwargs)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = pipe(num_inference_steps=steps, output_type=output_type, return_dict=False,
                   generator=torch.Generator().manual_seed(seed), **kwargs)[0]
    if isinstance(out, torch.Tensor):
        return np.asarray(out.float().numpy(), dtype=np.float32)
    return np.asarray(out, dtype=np.float32)

#: the families :func:`cached_pipeline` can build with tiny real text encoders and tokenizers
WITH_TEXT_ENCODERS = [f for f, p in PIPELINES.items() if p.text_encoders is not None]

#: families of the sweep for which diffusers 0.42.1 ships no pipeline driving the class (nothing to compare to)
NO_PIPELINE: dict[str, str] = {
    "flux3": "Flux3Transformer2DModel: no pipeline in diffusers 0.42.1",
    "dreamlite": "DreamLiteTransformer2DModel: no pipeline in diffusers 0.42.1",
    "minimax_h3": "MiniMaxH3Transformer3DModel: its pipelines are modular (blocks), no DiffusionPipeline class",
    "sana_wm_refiner": "SanaWMLTX2RefinerTransformer3DModel: a component of SanaWMPipeline's refiner stage, no "
                       "pipeline of its own",
    "minimax_music3": "MiniMaxMusic3Transformer1DModel: no pipeline in diffusers 0.42.1",
    "minimax_rvq": "MiniMaxMusic3RVQDepthDecoder: no pipeline in diffusers 0.42.1",
    "t5film": "T5FilmDecoder: SpectrogramDiffusionPipeline was removed from diffusers (deprecated pipelines)",
    "dual_transformer": "DualTransformer2DModel: VersatileDiffusion's, removed from diffusers (deprecated)",
    "transformer_temporal": "TransformerTemporalModel: a part of UNet3DConditionModel, not a pipeline's denoiser",
}
#: families whose diffusers pipeline exists but has no tiny pipeline here yet, and why
NOT_BUILT: dict[str, str] = {
    "hidream_image": "HiDreamImagePipeline rescales every call to the area of 1024 x 1024 pixels (its "
                     "default_sample_size 128 is set in __init__, not configurable): no tiny image size",
    "qwenimage21": "QwenImage21Pipeline calls its processor's apply_chat_template even when prompt_embeds are "
                   "given: it needs a Qwen3-VL processor (not built yet)",
    "cosmos": "Cosmos2TextToImagePipeline refuses to run without its safety checker (the cosmos_guardrail package "
              "and its models); a stand-in checker would be a fake",
    "bria_fibo": "BriaFiboPipeline takes no prompt_embeds: it needs its SmolLM3 text encoder (not built yet)",
    "ideogram4": "Ideogram4Pipeline takes no prompt_embeds: it needs its text encoder (not built yet)",
    "bria_fibo2": "BriaFibo2Pipeline with the sweep's tiny transformer (patch 2 over the Flux.2 VAE's 2x2-patchified "
                  "latents) fails in attention (permute of a 3-D tensor): the tiny config is not made consistent "
                  "with the pipeline yet",
    "kandinsky5": "Kandinsky5T2IPipeline with the sweep's tiny transformer: the RoPE table the pipeline builds does "
                  "not match the query (98 against 8 at dim 3): not resolved yet",
    "longcat_image": "LongCatImagePipeline cannot run from embeddings: encode_prompt takes len(prompt) even when "
                     "prompt_embeds is given, and check_inputs refuses a prompt beside prompt_embeds; it needs its "
                     "text encoder (a tiny Qwen2.5-VL + Qwen2 tokenizer + Qwen2-VL processor: not built yet)",
}
NOT_BUILT.update({f: "not built yet" for f in df.CLASS_OF
                  if f not in PIPELINES and f not in NO_PIPELINE and f not in NOT_BUILT})


def _decoded_latent(pipe: Any, steps: int, seed: int, kwargs: dict[str, Any]) -> np.ndarray:
    """The final loop latent of a pipeline with no ``output_type="latent"``: the input of ``vae.decode`` (an
    instance attribute set for this call, diffusers' code unchanged) times the VAE's ``scaling_factor``."""
    import torch

    seen: list[torch.Tensor] = []
    decode = pipe.vae.decode

    def capture(z: torch.Tensor, *args: Any, **kw: Any) -> Any:
        seen.append(z.detach().clone())
        return decode(z, *args, **kw)

    pipe.vae.decode = capture
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe(num_inference_steps=steps, output_type="np", return_dict=False,
                 generator=torch.Generator().manual_seed(seed), **kwargs)
    finally:
        del pipe.vae.decode
    (z,) = seen
    return np.asarray((z * pipe.vae.config.scaling_factor).float().numpy(), dtype=np.float32)


def transformer_calls(folder: str | Path, steps: int = 2, *, pipe: Any = None) -> list[int]:
    """The batch size of every transformer call of a ``steps``-step run with the default guidance: what the CFG
    column of docs/pipelines.md says (batched: one call of 2 a step; two-pass: two calls of 1; distilled or
    none: one call of 1)."""
    import torch

    folder = Path(folder)
    spec = _family_of(folder)
    if pipe is None:
        pipe = load(folder)
    batches: list[int] = []

    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # the first tensor argument's batch; a list input (Z-Image) holds one tensor per batch row
        x = next(v for v in (*args, *kwargs.values()) if isinstance(v, (torch.Tensor, list)))
        batches.append(len(x) if isinstance(x, list) else int(x.shape[0]))

    handle = pipe.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        embeds, latents = call_inputs(spec.family)
        run_diffusers(folder, embeds, latents, steps, output_type="latent", pipe=pipe)
    finally:
        handle.remove()
    return batches


#: what :func:`transformer_calls` gives per step for each CFG mode: (calls, batch of each call)
CFG_CALLS = {"batched": [2], "two-pass": [1, 1], "distilled": [1], "none": [1]}


def _scheduler_summary(folder: Path) -> str:
    """The scheduler class and the fields of its saved config that differ from the class's defaults."""
    import diffusers

    cfg = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
    cls = getattr(diffusers, cfg["_class_name"])
    default = cls().config
    diff = {k: v for k, v in sorted(cfg.items()) if not k.startswith("_") and default.get(k, None) != v}
    args = ", ".join(f"{k}={v}" for k, v in diff.items())
    return f"`{cfg['_class_name']}({args})`"


def _vae_summary(folder: Path) -> str:
    cfg = json.loads((folder / "vae" / "config.json").read_text())
    fields = [f"{k} {cfg[k]}" for k in ("scaling_factor", "shift_factor") if cfg.get(k) not in (None, 1.0, 0.0)]
    if cfg.get("latents_mean") is not None:
        fields.append("latents_mean/std")
    if "batch_norm_eps" in cfg:
        fields.append("batch-norm stats")
    return f"`{cfg['_class_name']}`" + (f" ({', '.join(fields)})" if fields else "")


def _text_encoders(pipeline: str) -> str:
    """The text encoders the pipeline's ``__init__`` names (type hints), which the tiny folders leave null."""
    import diffusers

    sig = inspect.signature(getattr(diffusers, pipeline).__init__)
    names = []
    for p in sig.parameters.values():
        if re.fullmatch(r"text_encoder(_\d)?|vision_language_encoder", p.name):
            hints = [h for h in typing.get_args(p.annotation) if h is not type(None)] or [p.annotation]
            names.append(" / ".join(getattr(h, "__name__", str(h).split(".")[-1]) for h in hints))
    return ", ".join(names) or "none"


def table() -> str:
    """docs/pipelines.md's table, from the cached folders and :data:`PIPELINES` (the test compares)."""
    rows = ["| family | pipeline | transformer | VAE | scheduler (config fields off the class default) | CFG | "
            "default guidance | the real pipeline's text encoders | call arguments (`call_inputs`) | latents= |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for family, spec in PIPELINES.items():
        folder = cached_pipeline(family)
        tcfg = json.loads((folder / "transformer" / "config.json").read_text())
        embeds, latents = call_inputs(family)
        args = ", ".join(f"`{k}` {tuple(v.shape)}" for k, v in embeds.items())
        rows.append(f"| {family} | `{spec.pipeline}` | `{tcfg['_class_name']}` | {_vae_summary(folder)} | "
                    f"{_scheduler_summary(folder)} | {spec.cfg} | {spec.guidance} | {_text_encoders(spec.pipeline)} "
                    f"| {args} | {tuple(latents.shape)} |")
    rows += ["", "| family | diffusers class | why no tiny pipeline |", "| --- | --- | --- |"]
    for family, why in sorted({**NO_PIPELINE, **NOT_BUILT}.items()):
        kind = "no pipeline" if family in NO_PIPELINE else "not built"
        rows.append(f"| {family} | `{df.CLASS_OF[family]}` | {kind}: {why} |")
    return "\n".join(rows) + "\n"
