"""Image families of the sweep at the width people deploy: published hidden size, heads, head dim, FFN ratio and
text width, one block of each kind, about 1024 image tokens, the published text length, seeded weights.

The tiny configs of :mod:`tests.models.diffusers_families` keep each family's anatomy at hidden 32-128; the
compiler pads, tiles and places layers by shape, so real widths behave differently (issue 50).  Each entry of
:data:`REAL_WIDTH` names the checkpoint it is sized after and where the numbers come from (``source``):
diffusers' own class defaults (``inspect.signature(cls.__init__)``, which for most classes are the published
checkpoint's config), its conversion scripts (``scripts/convert_*_to_diffusers.py`` in huggingface/diffusers)
and pipelines (``max_sequence_length`` defaults).  Only the number of blocks is cut: one of each kind (two where
a family's blocks differ: dual- and single-stream, a last ``context_pre_only`` block, refiners).

A real-width block is 100 MB - 2 GB of float32 weights.  :func:`cached_real_export` exports one family at a
time into the export cache (:func:`tests.models.diffusers_families.export_root`), keyed by the source of every
function the export runs, with the weights in one external data file beside the model (``<model>.data``), so
that a partition links them instead of loading them into protobuf.

``scripts/real_width.py`` partitions, compiles and tabulates them (``docs/real-width.md``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.models import diffusers_families as fams

#: image tokens every config aims at (512 x 512 px for an 8x VAE and 2x2 patches; 1024 px for a 32x VAE)
IMAGE_TOKENS = 1024


@dataclass(frozen=True)
class RealWidth:
    """One family at its published width."""

    name: str  #: the family of the sweep (a key of :data:`tests.models.diffusers_families.CLASS_OF`)
    checkpoint: str  #: the published checkpoint the numbers are taken from
    source: str  #: where each number comes from
    build: Callable[[], tuple[Any, dict[str, Any]]]  #: -> (module, example inputs by name)
    hidden: int
    heads: int
    head_dim: int
    text_len: int  #: text tokens the pipeline passes (0: no text)
    text_width: int  #: width of the text embeddings the transformer reads (0: no text)
    blocks: int  #: transformer blocks of the cut config
    kv_heads: int = 0  #: key/value heads of grouped-query attention (0: as many as ``heads``)
    fixed: Callable[[], dict[str, Any]] = dict
    #: rewrites the eval-mode module in place before export (the family's own, see diffusers_families)
    prepare: Callable[[Any, dict[str, Any], dict[str, Any]], None] | None = None
    #: the note the table carries (what differs from the checkpoint beyond the block count)
    note: str = ""

    @property
    def layout(self) -> str:
        """``heads x head_dim`` as the table prints it (``/ kv`` for grouped-query attention)."""
        return f"{self.heads} x {self.head_dim}" + (f" (KV {self.kv_heads})" if self.kv_heads else "")


def _grid_ids(side: int, text: int, axes: int = 3, batch: bool = False) -> tuple[Any, Any]:
    """Flux-style position ids: (img_ids [side*side, axes], txt_ids [text, axes]), row and column in axes 1, 2."""
    import torch

    n = side * side
    img = torch.zeros(n, axes)
    img[:, 1] = torch.arange(n) // side
    img[:, 2] = torch.arange(n) % side
    txt = torch.zeros(text, axes)
    return (img[None], txt[None]) if batch else (img, txt)


def _dit() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import DiTTransformer2DModel

    # DiT-XL/2 at 512 px (facebook/DiT-XL-2-512): the class defaults, sample_size 64 (convert_dit_to_diffusers.py:
    # image_size // 8), learned sigma (out_channels 8)
    m = DiTTransformer2DModel(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8,
                              num_layers=1, sample_size=64, patch_size=2, num_embeds_ada_norm=1000)
    return m, {
        "hidden_states": torch.randn(1, 4, 64, 64),
        "timestep": torch.tensor([7], dtype=torch.int64),
        "class_labels": torch.tensor([3], dtype=torch.int64),
    }


def _pixart(text: int, sigma: bool) -> Callable[[], tuple[Any, dict[str, Any]]]:
    def build() -> tuple[Any, dict[str, Any]]:
        import torch
        from diffusers import PixArtTransformer2DModel

        # PixArt-XL-2-512x512 / PixArt-Sigma-XL-2-512-MS: the class defaults (16 x 72, cross-attention 1152), T5-XXL
        # captions (4096), sample_size 64; no micro-conditions at 512 px (convert_pixart_alpha_to_diffusers.py,
        # convert_pixart_sigma_to_diffusers.py: interpolation_scale 1 at 512 px for Sigma)
        extra: dict[str, Any] = dict(interpolation_scale=1) if sigma else {}
        m = PixArtTransformer2DModel(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8,
                                     num_layers=1, sample_size=64, patch_size=2, cross_attention_dim=1152,
                                     caption_channels=4096, use_additional_conditions=False, **extra)
        return m, {
            "hidden_states": torch.randn(1, 4, 64, 64),
            "encoder_hidden_states": torch.randn(1, text, 4096),
            "timestep": torch.tensor([7], dtype=torch.int64),
        }
    return build


def _sd3(sd35: bool) -> Callable[[], tuple[Any, dict[str, Any]]]:
    def build() -> tuple[Any, dict[str, Any]]:
        import torch
        from diffusers import SD3Transformer2DModel

        # SD3 Medium (stabilityai/stable-diffusion-3-medium-diffusers transformer/config.json): 24 x 64 heads,
        # caption projection 1536, pos_embed_max_size 192; SD3.5 Medium the same widths with dual attention in the
        # first 13 blocks (here block 0), RMS q/k norms and pos_embed_max_size 384.  Block 1 is the last block,
        # context_pre_only.  Text: 77 CLIP + 256 T5 tokens (StableDiffusion3Pipeline max_sequence_length 256)
        extra: dict[str, Any] = dict(dual_attention_layers=(0,), qk_norm="rms_norm") if sd35 else {}
        m = SD3Transformer2DModel(sample_size=64, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=64,
                                  num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
                                  pooled_projection_dim=2048, out_channels=16,
                                  pos_embed_max_size=384 if sd35 else 192, **extra)
        return m, {
            "hidden_states": torch.randn(1, 16, 64, 64),
            "encoder_hidden_states": torch.randn(1, 333, 4096),
            "pooled_projections": torch.randn(1, 2048),
            "timestep": torch.tensor([7.0]),
        }
    return build


def _flux() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import FluxTransformer2DModel

    # FLUX.1-dev: the class defaults (24 x 128, T5-XXL 4096, CLIP pooled 768, axes (16, 56, 56)) with its guidance
    # embedding; 512 px = 32 x 32 packed latents; FluxPipeline max_sequence_length 512
    m = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=128,
                               num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                               guidance_embeds=True, axes_dims_rope=(16, 56, 56))
    img_ids, txt_ids = _grid_ids(32, 512)
    return m, {
        "hidden_states": torch.randn(1, 1024, 64),
        "encoder_hidden_states": torch.randn(1, 512, 4096),
        "pooled_projections": torch.randn(1, 768),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids,
        "txt_ids": txt_ids,
        "guidance": torch.tensor([3.5]),
    }


def _chroma() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import ChromaTransformer2DModel

    # Chroma1-HD: the class defaults (Flux widths, T5-XXL 4096, distilled guidance approximator 5 x 5120);
    # ChromaPipeline max_sequence_length 512
    m = ChromaTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                 attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                                 axes_dims_rope=(16, 56, 56), approximator_num_channels=64,
                                 approximator_hidden_dim=5120, approximator_layers=5)
    img_ids, txt_ids = _grid_ids(32, 512)
    return m, {
        "hidden_states": torch.randn(1, 1024, 64),
        "encoder_hidden_states": torch.randn(1, 512, 4096),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids,
        "txt_ids": txt_ids,
    }


def _sana() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import SanaTransformer2DModel

    # Sana_1600M_1024px: the class defaults (70 x 32 linear attention, cross-attention 20 x 112, Gemma-2-2B
    # captions 2304, mlp_ratio 2.5; convert_sana_to_diffusers.py); 1024 px / DC-AE f32 = 32 x 32 tokens;
    # SanaPipeline max_sequence_length 300
    m = SanaTransformer2DModel(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32,
                               num_layers=1, num_cross_attention_heads=20, cross_attention_head_dim=112,
                               cross_attention_dim=2240, caption_channels=2304, mlp_ratio=2.5, sample_size=32,
                               patch_size=1)
    return m, {
        "hidden_states": torch.randn(1, 32, 32, 32),
        "encoder_hidden_states": torch.randn(1, 300, 2304),
        "timestep": torch.tensor([7.0]),
    }


def _lumina2() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Lumina2Transformer2DModel

    # Lumina-Image-2.0: the class defaults (hidden 2304, 24 query heads and 8 key/value heads of 96, multiple_of
    # 256) with Gemma-2-2B captions (cap_feat_dim 2304); one noise-refiner, one context-refiner and one main block;
    # Lumina2Pipeline max_sequence_length 256; 512 px = 32 x 32 tokens of 2 x 2 patches
    m = Lumina2Transformer2DModel(sample_size=64, patch_size=2, in_channels=16, hidden_size=2304, num_layers=1,
                                  num_refiner_layers=1, num_attention_heads=24, num_kv_heads=8, multiple_of=256,
                                  axes_dim_rope=(32, 32, 32), axes_lens=(300, 512, 512), cap_feat_dim=2304)
    return m, {
        "hidden_states": torch.randn(1, 16, 64, 64),
        "timestep": torch.tensor([0.7]),
        "encoder_hidden_states": torch.randn(1, 256, 2304),
        "encoder_attention_mask": torch.ones(1, 256, dtype=torch.int64),
    }


def _auraflow() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import AuraFlowTransformer2DModel

    # AuraFlow v0.3: the class defaults (12 heads of 256, hidden 3072, Pile-T5-XL 2048); one MMDiT and one
    # single-stream block; AuraFlowPipeline max_sequence_length 256; 512 px = 32 x 32 tokens
    m = AuraFlowTransformer2DModel(sample_size=64, patch_size=2, in_channels=4, num_mmdit_layers=1,
                                   num_single_dit_layers=1, attention_head_dim=256, num_attention_heads=12,
                                   joint_attention_dim=2048, caption_projection_dim=3072, out_channels=4,
                                   pos_embed_max_size=1024)
    return m, {
        "hidden_states": torch.randn(1, 4, 64, 64),
        "encoder_hidden_states": torch.randn(1, 256, 2048),
        "timestep": torch.tensor([7.0]),
    }


def _hunyuandit() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import HunyuanDiT2DModel

    # HunyuanDiT v1.2 (Tencent-Hunyuan/HunyuanDiT-v1.2-Diffusers; convert_hunyuandit_to_diffusers.py): hidden 1408 =
    # 16 x 88, mlp_ratio 4.3637, BERT 1024 x 77 and mT5 2048 x 256 tokens, pooled 1024, no style / size conditions
    m = HunyuanDiT2DModel(num_attention_heads=16, attention_head_dim=88, in_channels=4, patch_size=2, sample_size=64,
                          hidden_size=1408, num_layers=1, mlp_ratio=4.3637, cross_attention_dim=1024,
                          cross_attention_dim_t5=2048, pooled_projection_dim=1024, text_len=77, text_len_t5=256,
                          use_style_cond_and_image_meta_size=False)
    return m, {
        "hidden_states": torch.randn(1, 4, 64, 64),
        "timestep": torch.tensor([7.0]),
        "encoder_hidden_states": torch.randn(1, 77, 1024),
        "text_embedding_mask": torch.ones(1, 77, dtype=torch.int64),
        "encoder_hidden_states_t5": torch.randn(1, 256, 2048),
        "text_embedding_mask_t5": torch.ones(1, 256, dtype=torch.int64),
    }


def _hunyuandit_fixed() -> dict[str, Any]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    # HunyuanDiTPipeline's table at 512 px: head dim 88, the 32 x 32 grid (base size 512 / 8 / 2 = 32)
    cos, sin = get_2d_rotary_pos_embed(88, ((0, 0), (32, 32)), (32, 32))
    return {"image_rotary_emb": (cos.float(), sin.float())}


def _cosmos() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import CosmosTransformer3DModel

    # Cosmos-Predict2-2B-Text2Image (convert_cosmos_to_diffusers.py, "Cosmos-2.0-Diffusion-2B-Text2Image"): 16 x 128,
    # T5-11B 1024, AdaLN-LoRA 256, rope_scale (1, 4, 4), no extra position embedding; 512 px = 32 x 32 tokens;
    # Cosmos2TextToImagePipeline max_sequence_length 512
    m = CosmosTransformer3DModel(in_channels=16, out_channels=16, num_attention_heads=16, attention_head_dim=128,
                                 num_layers=1, text_embed_dim=1024, adaln_lora_dim=256, max_size=(128, 240, 240),
                                 patch_size=(1, 2, 2), rope_scale=(1.0, 4.0, 4.0), concat_padding_mask=False,
                                 extra_pos_embed_type=None)
    return m, {
        "hidden_states": torch.randn(1, 16, 1, 64, 64),
        "timestep": torch.tensor([0.7]),
        "encoder_hidden_states": torch.randn(1, 512, 1024),
    }


def _cogview(plus: bool) -> Callable[[], tuple[Any, dict[str, Any]]]:
    def build() -> tuple[Any, dict[str, Any]]:
        import torch
        from diffusers import CogView3PlusTransformer2DModel, CogView4Transformer2DModel

        # CogView3-Plus-3B: the class defaults (64 x 40, T5-XXL 4096; CogView3PlusPipeline max_sequence_length 224).
        # CogView4-6B (convert_cogview4_to_diffusers.py: 32 x 128, GLM-4 4096, rope_axes_dim (256, 256)); its
        # pipeline pads the prompt to a multiple of 16, up to 1024: 256 here.  512 px = 32 x 32 tokens
        text = 224 if plus else 256
        if plus:
            m: Any = CogView3PlusTransformer2DModel(patch_size=2, in_channels=16, num_layers=1, attention_head_dim=40,
                                                    num_attention_heads=64, out_channels=16, text_embed_dim=4096,
                                                    time_embed_dim=512, condition_dim=256, pos_embed_max_size=128,
                                                    sample_size=128)
        else:
            m = CogView4Transformer2DModel(patch_size=2, in_channels=16, out_channels=16, num_layers=1,
                                           attention_head_dim=128, num_attention_heads=32, text_embed_dim=4096,
                                           time_embed_dim=512, condition_dim=256, pos_embed_max_size=128,
                                           sample_size=128, rope_axes_dim=(256, 256))
        return m, {
            "hidden_states": torch.randn(1, 16, 64, 64),
            "encoder_hidden_states": torch.randn(1, text, 4096),
            "timestep": torch.tensor([7], dtype=torch.int64),
            "original_size": torch.tensor([[512.0, 512.0]]),
            "target_size": torch.tensor([[512.0, 512.0]]),
            "crop_coords": torch.tensor([[0.0, 0.0]]),
        }
    return build


def _flux_like(cls_name: str, text_width: int, text: int, **extra: Any) -> Callable[[], tuple[Any, dict[str, Any]]]:
    """A Flux-anatomy class (double- and single-stream blocks, 24 x 128, 64 packed channels) at 512 px."""
    def build() -> tuple[Any, dict[str, Any]]:
        import diffusers
        import torch

        m = getattr(diffusers, cls_name)(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                         attention_head_dim=128, num_attention_heads=24, joint_attention_dim=text_width,
                                         axes_dims_rope=(16, 56, 56), **extra)
        img_ids, txt_ids = _grid_ids(32, text)
        return m, {"hidden_states": torch.randn(1, 1024, 64), "encoder_hidden_states": torch.randn(1, text, text_width),
                   "timestep": torch.tensor([0.7]), "img_ids": img_ids, "txt_ids": txt_ids}
    return build


def _flux2_klein() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Flux2Transformer2DModel

    # FLUX.2 [klein] 4B (convert_flux2_to_diffusers.py, "klein-4b": 24 x 128 heads, 5 double + 20 single blocks,
    # Qwen3-4B text features 3 x 2560 = 7680, mlp_ratio 3, no guidance embedding); the 32B [dev] (48 x 128,
    # joint 15360) does not fit a board.  Flux2 VAE latents 128 channels, 512 px = 32 x 32 tokens;
    # Flux2KleinPipeline max_sequence_length 512
    m = Flux2Transformer2DModel(patch_size=1, in_channels=128, num_layers=1, num_single_layers=1,
                                attention_head_dim=128, num_attention_heads=24, joint_attention_dim=7680,
                                timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32),
                                guidance_embeds=False)
    img_ids, txt_ids = _grid_ids(32, 512, axes=4, batch=True)
    return m, {
        "hidden_states": torch.randn(1, 1024, 128),
        "encoder_hidden_states": torch.randn(1, 512, 7680),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids,
        "txt_ids": txt_ids,
    }


def _prx() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import PRXTransformer2DModel

    # PRX (Photoroom): the class defaults (hidden 1792 = 28 x 64, mlp_ratio 3.5, T5Gemma 2304); 512 px = 32 x 32
    # tokens of 2 x 2 patches; PRXPipeline's T5Gemma tokenizer pads to 256
    m = PRXTransformer2DModel(in_channels=16, patch_size=2, context_in_dim=2304, hidden_size=1792, mlp_ratio=3.5,
                              num_heads=28, depth=1, axes_dim=[32, 32])
    return m, {
        "hidden_states": torch.randn(1, 16, 64, 64),
        "timestep": torch.tensor([0.7]),
        "encoder_hidden_states": torch.randn(1, 256, 2304),
    }


#: every real-width config by family name
REAL_WIDTH: dict[str, RealWidth] = {r.name: r for r in (
    RealWidth("dit", "facebook/DiT-XL-2-512", "DiTTransformer2DModel defaults; convert_dit_to_diffusers.py",
              _dit, hidden=1152, heads=16, head_dim=72, text_len=0, text_width=0, blocks=1),
    RealWidth("pixart", "PixArt-alpha/PixArt-XL-2-512x512",
              "PixArtTransformer2DModel defaults; convert_pixart_alpha_to_diffusers.py; PixArtAlphaPipeline "
              "max_sequence_length 120", _pixart(120, sigma=False), hidden=1152, heads=16, head_dim=72, text_len=120,
              text_width=4096, blocks=1, fixed=fams._pixart_fixed),
    RealWidth("pixart_sigma", "PixArt-alpha/PixArt-Sigma-XL-2-512-MS",
              "PixArtTransformer2DModel defaults; convert_pixart_sigma_to_diffusers.py; PixArtSigmaPipeline "
              "max_sequence_length 300", _pixart(300, sigma=True), hidden=1152, heads=16, head_dim=72, text_len=300,
              text_width=4096, blocks=1, fixed=fams._pixart_fixed),
    RealWidth("sd3", "stabilityai/stable-diffusion-3-medium-diffusers",
              "transformer/config.json of the checkpoint (24 x 64, caption projection 1536); "
              "StableDiffusion3Pipeline: 77 CLIP + 256 T5 tokens", _sd3(sd35=False), hidden=1536, heads=24, head_dim=64,
              text_len=333, text_width=4096, blocks=2),
    RealWidth("sd35", "stabilityai/stable-diffusion-3.5-medium",
              "transformer/config.json of the checkpoint (24 x 64, dual_attention_layers 0-12, qk_norm rms_norm)",
              _sd3(sd35=True), hidden=1536, heads=24, head_dim=64, text_len=333, text_width=4096, blocks=2),
    RealWidth("flux", "black-forest-labs/FLUX.1-dev", "FluxTransformer2DModel defaults; FluxPipeline "
              "max_sequence_length 512", _flux, hidden=3072, heads=24, head_dim=128, text_len=512, text_width=4096,
              blocks=2),
    RealWidth("chroma", "lodestones/Chroma1-HD", "ChromaTransformer2DModel defaults; ChromaPipeline "
              "max_sequence_length 512", _chroma, hidden=3072, heads=24, head_dim=128, text_len=512, text_width=4096,
              blocks=2),
    RealWidth("sana", "Efficient-Large-Model/Sana_1600M_1024px_diffusers",
              "SanaTransformer2DModel defaults; convert_sana_to_diffusers.py; SanaPipeline max_sequence_length 300",
              _sana, hidden=2240, heads=70, head_dim=32, text_len=300, text_width=2304, blocks=1,
              note="1024 px (DC-AE f32: 32 x 32 tokens)"),
    RealWidth("lumina2", "Alpha-VLLM/Lumina-Image-2.0", "Lumina2Transformer2DModel defaults (cap_feat_dim: "
              "Gemma-2-2B's 2304); Lumina2Pipeline max_sequence_length 256", _lumina2, hidden=2304, heads=24,
              head_dim=96, kv_heads=8, text_len=256, text_width=2304, blocks=3,
              note="noise refiner, context refiner, 1 main block"),
    RealWidth("auraflow", "fal/AuraFlow-v0.3", "AuraFlowTransformer2DModel defaults; AuraFlowPipeline "
              "max_sequence_length 256", _auraflow, hidden=3072, heads=12, head_dim=256, text_len=256, text_width=2048,
              blocks=2),
    RealWidth("hunyuandit", "Tencent-Hunyuan/HunyuanDiT-v1.2-Diffusers",
              "transformer/config.json of the checkpoint (hidden 1408, 16 x 88, mlp_ratio 4.3637); "
              "convert_hunyuandit_to_diffusers.py", _hunyuandit, hidden=1408, heads=16, head_dim=88, text_len=333,
              text_width=2048, blocks=1, fixed=_hunyuandit_fixed, note="77 BERT (1024) + 256 mT5 (2048) tokens"),
    RealWidth("cosmos", "nvidia/Cosmos-Predict2-2B-Text2Image", "convert_cosmos_to_diffusers.py "
              "(Cosmos-2.0-Diffusion-2B-Text2Image); Cosmos2TextToImagePipeline max_sequence_length 512", _cosmos,
              hidden=2048, heads=16, head_dim=128, text_len=512, text_width=1024, blocks=1,
              note="no padding-mask channel (as the tiny config)"),
    RealWidth("cogview3plus", "THUDM/CogView3-Plus-3B", "CogView3PlusTransformer2DModel defaults; "
              "CogView3PlusPipeline max_sequence_length 224", _cogview(plus=True), hidden=2560, heads=64, head_dim=40,
              text_len=224, text_width=4096, blocks=1),
    RealWidth("cogview4", "THUDM/CogView4-6B", "convert_cogview4_to_diffusers.py (32 x 128, GLM-4 4096)",
              _cogview(plus=False), hidden=4096, heads=32, head_dim=128, text_len=256, text_width=4096, blocks=1,
              note="prompt padded to 256 tokens"),
    RealWidth("flux2", "black-forest-labs/FLUX.2-klein-4B", "convert_flux2_to_diffusers.py (klein 4B); "
              "Flux2KleinPipeline max_sequence_length 512", _flux2_klein, hidden=3072, heads=24, head_dim=128,
              text_len=512, text_width=7680, blocks=2, note="[klein] 4B: the 32B [dev] does not fit a board"),
    RealWidth("longcat_image", "meituan-longcat/LongCat-Image", "LongCatImageTransformer2DModel defaults "
              "(Qwen2.5-VL-7B 3584)", _flux_like("LongCatImageTransformer2DModel", 3584, 512,
                                                  pooled_projection_dim=3584),
              hidden=3072, heads=24, head_dim=128, text_len=512, text_width=3584, blocks=2),
    RealWidth("ovis_image", "AIDC-AI/Ovis-Image-7B", "OvisImageTransformer2DModel defaults (Ovis 2048); "
              "OvisImagePipeline max_sequence_length 256", _flux_like("OvisImageTransformer2DModel", 2048, 256,
                                                                     out_channels=64),
              hidden=3072, heads=24, head_dim=128, text_len=256, text_width=2048, blocks=2),
    RealWidth("bria", "briaai/BRIA-3.2", "BriaTransformer2DModel defaults (T5-XXL 4096); BriaPipeline "
              "max_sequence_length 128", _flux_like("BriaTransformer2DModel", 4096, 128),
              hidden=3072, heads=24, head_dim=128, text_len=128, text_width=4096, blocks=2),
    RealWidth("prx", "Photoroom/prx-512-t2i", "PRXTransformer2DModel defaults (1792 = 28 x 64, T5Gemma 2304)", _prx,
              hidden=1792, heads=28, head_dim=64, text_len=256, text_width=2304, blocks=1, prepare=fams._trained_like),
)}


def _prepare(real: RealWidth, model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Every config's own ``prepare``, after small seeded values for the parameters diffusers initialises to zeros
    (:func:`tests.models.diffusers_families._trained_like`: as a trained checkpoint has them; an all-zero
    modulation would export as a constant Gemm the toolkits fold, or fail on)."""
    fams._trained_like(model, inputs, fixed)
    if real.prepare is not None and real.prepare is not fams._trained_like:
        real.prepare(model, inputs, fixed)


def export_real(name: str, path: str | Path, *, exporter: str = "torchscript", seed: int = 0) -> dict[str, np.ndarray]:
    """Export real-width family ``name`` to ``path`` (static shapes, float32) through the product's
    :func:`rkpart.export.export_module` (its patch registry, as :func:`tests.models.diffusers_families.export_family`),
    every weight in ``<path>.data``; returns the example inputs.  Not run under ONNX Runtime here (``check=False``:
    a real-width block is seconds of ORT per input set; the plans' gates run it stage by stage)."""
    import torch

    from rkpart.export import OnnxOptions, export_module

    real = REAL_WIDTH[name]
    torch.manual_seed(seed)
    model, inputs = real.build()
    model = model.eval()
    fixed = real.fixed()
    _prepare(real, model, inputs, fixed)
    # threshold 0: the weights always in one external file, so a partition links them instead of loading them
    export_module(model, inputs, path, fixed=fixed, exporter=exporter,
                  options=OnnxOptions(opset=fams.EXPORTERS[exporter] or None, check=False, variants=[],
                                      external_data_threshold=0))
    return real_inputs(name, seed)


def real_inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """The example inputs :func:`export_real` exports family ``name`` with (same seed, same prepare, same patches)."""
    import torch

    from rkpart.export import apply_patches

    real = REAL_WIDTH[name]
    torch.manual_seed(seed)
    model, inputs = real.build()
    fixed = real.fixed()
    _prepare(real, model.eval(), inputs, fixed)
    apply_patches(model, inputs, fixed, exporter="dynamo", variants=[])
    return {k: v.numpy() for k, v in inputs.items()}


def cached_real_export(name: str, exporter: str = "torchscript") -> Path:
    """The export of real-width family ``name`` (made once per diffusers and torch versions, exporter and source of
    every function the export runs), under :func:`tests.models.diffusers_families.export_root`.

    The model and its ``.data`` file are written under a private name, the data moved into place first and the
    model last: a model under the final name always has its data beside it."""
    import diffusers
    import torch

    from rkpart.export import source_key

    real = REAL_WIDTH[name]
    funcs: list[Any] = [real.build, real.fixed, export_real, real_inputs, _prepare, fams._trained_like]
    funcs += [f for f in (real.prepare,) if f is not None and inspect.isfunction(f)]
    shape = {f.name: getattr(real, f.name) for f in dataclasses.fields(real) if not callable(getattr(real, f.name))}
    key = [diffusers.__version__, torch.__version__, exporter, repr(sorted(shape.items())),
           *(inspect.getsource(f) for f in funcs if f is not dict), *source_key(fams.CLASS_OF[name], exporter)]
    root = fams.export_root() / "real-width"
    path = root / f"{name}-{exporter}-{hashlib.sha256(chr(0).join(key).encode()).hexdigest()[:16]}.onnx"
    data = path.with_name(path.name + ".data")
    if path.is_file() and data.is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=root))
    try:
        tmp = staging / path.name
        export_real(name, tmp, exporter=exporter)
        os.replace(staging / data.name, data)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
