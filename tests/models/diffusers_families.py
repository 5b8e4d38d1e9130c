"""Tiny diffusers DiT families: configs, export to ONNX by both exporters, and an export cache.

The ONE source of the family models the tests and scripts use (``tests/compile``,
``tests/partitioner``, ``scripts/export_families.py``, ``scripts/npu_table.py``).  Every model is
built from a config with random weights (``torch.manual_seed``), never downloaded.  Configs are
the smallest that keep each family's block anatomy.

:data:`FAMILIES` -- the families of issue 18:

==========  ================================  ==================================================
family      diffusers class                   what it exercises
==========  ================================  ==================================================
dit         ``DiTTransformer2DModel``         AdaLN-Zero with a per-block timestep+class embedding
pixart      ``PixArtTransformer2DModel``      shared ``adaln_single``, per-block scale_shift_table,
                                              cross-attention
sd3         ``SD3Transformer2DModel``         dual-stream joint attention; last block
                                              ``context_pre_only`` (different structure)
flux        ``FluxTransformer2DModel``        double-stream blocks + single-stream parallel
                                              attn/MLP blocks, RoPE
sana        ``SanaTransformer2DModel``        linear attention without Softmax, GLU conv FFN
cogvideox   ``CogVideoXTransformer3DModel``   text + video tokens normed apart, one attention
                                              and one FFN over both (two streams, joint FFN)
wan         ``WanTransformer3DModel``         qk RMSNorm across heads, complex RoPE, cross-attention
chroma      ``ChromaTransformer2DModel``      Flux anatomy, modulation from a distilled approximator
lumina2     ``Lumina2Transformer2DModel``     refiner blocks, GQA, caption attention mask; its
                                              complex RoPE is rewritten to the real form before
                                              export (:func:`real_rope_lumina2`)
auraflow    ``AuraFlowTransformer2DModel``    MMDiT blocks then single-stream DiT blocks
hunyuandit  ``HunyuanDiT2DModel``             two text encoders, skip connections, fixed RoPE
cosmos      ``CosmosTransformer3DModel``      Cosmos-Predict2: AdaLN-LoRA, 3-D RoPE
==========  ================================  ==================================================

:data:`VARIANTS` -- anatomy the default tiny configs do not reach (the partitioner's family sweep):

=================  ====================================================================
variant            what it adds to its family
=================  ====================================================================
sd35               SD3.5: ``dual_attention_layers`` (a second self-attention ``attn2``
                   in block 0, beside the joint attention) and RMS qk-norm
hunyuandit_skip    HunyuanDiT with 4 blocks: the last one reads block 0's output through
                   a U-Net-style long skip (``skip_norm`` + ``skip_linear``)
chroma_guidance    Chroma with a 3-layer distilled guidance approximator: residual MLPs
                   that are not transformer blocks
pixart_sigma       PixArt-Σ configuration (``interpolation_scale``, no micro-conditions)
allegro            Allegro (a family the defaults lack: a check of generality)
ltx                LTX-Video (idem; RoPE, cross-attention, attention mask)
=================  ====================================================================

:data:`NEWER` -- issue 28's sweep towards every class of ``diffusers.models.transformers`` (newer DiT
and video families first; :data:`NOT_EXPORTED` lists the classes left out and why):

=============  ==================================  ================================================
family         diffusers class                     what it exercises
=============  ==================================  ================================================
latte          ``LatteTransformer3DModel``         spatial and temporal blocks alternating
hunyuanvideo   ``HunyuanVideoTransformer3DModel``  token-refiner text blocks that all run before the
                                                   visual ones, then dual- and single-stream blocks
skyreels_v2    ``SkyReelsV2Transformer3DModel``    Wan anatomy (qk RMSNorm, RoPE, cross-attention)
cogview4       ``CogView4Transformer2DModel``      joint attention over concatenated text + image,
                                                   per-stream FFNs; last block's text half dead
flux2          ``Flux2Transformer2DModel``         Flux anatomy with a fused qkv+MLP projection in
                                                   the single blocks, shared modulation
wan_vace       ``WanVACETransformer3DModel``       VACE blocks (a control stream) whose hints are
                                                   added to the main blocks' outputs
kandinsky5     ``Kandinsky5Transformer3DModel``    text blocks that all run before the visual ones
chronoedit     ``ChronoEditTransformer3DModel``    Wan anatomy, two frames (temporal RoPE)
sana_video     ``SanaVideoTransformer3DModel``     Sana's linear attention over video, 3-D RoPE
cogview3plus   ``CogView3PlusTransformer2DModel``  joint attention, one FFN over text + image
longcat_image  ``LongCatImageTransformer2DModel``  Flux anatomy (double + single blocks)
ovis_image     ``OvisImageTransformer2DModel``     Flux anatomy without pooled projections
bria           ``BriaTransformer2DModel``          Flux anatomy
flux3          ``Flux3Transformer2DModel``         per-modality parallel blocks (text, then image),
                                                   then single blocks that keep two streams
stable_audio   ``StableAudioDiTModel``             1-D audio DiT, GQA cross-attention
prx            ``PRXTransformer2DModel``           single-stream DiT over text + image tokens
=============  ==================================  ================================================

:data:`LATEST_H5` -- the sweep's audio DiTs, the older non-DiT transformers, a protein denoiser, and two classes
once left out (EasyAnimate, LuminaNext), diffusers 0.42:

====================  ===================================  ==========================================================
family                diffusers class                      what it exercises
====================  ===================================  ==========================================================
ace_step              ``AceStepTransformer1DModel``        1-D music DiT: sliding-window (banded mask) and full
                                                           self-attention alternating, GQA (repeated before export:
                                                           :func:`_repeat_kv_ace_step`), cross-attention, two
                                                           timestep embeddings
longcat_audio         ``LongCatAudioDiTTransformer``       audio DiT: ConvNeXt text blocks (conditioning), global
                                                           AdaLN, masked self- and cross-attention, a long skip over
                                                           all the blocks
minimax_music3        ``MiniMaxMusic3Transformer1DModel``  the timestep as a prepended token, partial RoPE
minimax_rvq           ``MiniMaxMusic3RVQDepthDecoder``     a causal LM decoder (RMSNorm, SwiGLU) over depth steps
prior                 ``PriorTransformer``                 unCLIP prior: one token each for text, projection, time,
                                                           latent; causal + text mask; output one token
t5film                ``T5FilmDecoder``                    spectrogram decoder: FiLM modulation, cross-attention
                                                           over two encoders' outputs (list of pairs: an adapter)
dual_transformer      ``DualTransformer2DModel``           two ``Transformer2DModel`` models side by side over
                                                           one latent, their outputs mixed
transformer_temporal  ``TransformerTemporalModel``         UNet3D's temporal attention: frames as the sequence,
                                                           positions as the batch, two self-attentions per block
rfd4                  ``RFD4ProteinaTransformer``          protein denoiser: attention with a pair-stream bias, a
                                                           pair update (triangle multiplications) between the trunk
                                                           layers, the stream re-masked after every residual add
easyanimate           ``EasyAnimateTransformer3DModel``    MMDiT blocks; RoPE tables made once for the static shape
                                                           (:func:`_static_rope_easyanimate`)
lumina_next           ``LuminaNextDiT2DModel``             self- and cross-attention summed before one output
                                                           projection; complex RoPE rewritten to the real form
                                                           (:func:`real_rope_lumina_next`); zero-initialised
                                                           gates: :func:`_trained_like`
====================  ===================================  ==========================================================

:func:`export_family` writes one export; :func:`cached_export` makes it once per (diffusers and
torch versions, exporter, source of every function the export runs) under
``$RKPART_TEST_EXPORTS`` (default ``~/.cache/rkpart/test-exports``), so a rerun skips the
exporter.  Needs torch, diffusers and onnxscript (:func:`missing_dependencies`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: exporter -> opset passed to :func:`export_family` (0: the exporter's own default, 20 for dynamo in torch 2.13)
EXPORTERS = {"torchscript": 17, "dynamo": 0}


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], tuple[Any, dict[str, Any]]]  # -> (module, example inputs by name)
    #: keyword arguments of ``forward`` fixed at export time (not graph inputs)
    fixed: Callable[[], dict[str, Any]] = dict
    blocks: int = 2  # transformer blocks the config has (for tests)
    #: rewrites the eval-mode module in place before export (same function, exportable form)
    prepare: Callable[[Any, dict[str, Any], dict[str, Any]], None] | None = None


def missing_dependencies() -> list[str]:
    """The exporter dependencies that are not installed (empty: exports can be made)."""
    return [d for d in ("torch", "diffusers", "onnxscript") if importlib.util.find_spec(d) is None]


def _dit(heads: int = 2, head_dim: int = 16, sample: int = 8) -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import DiTTransformer2DModel

    m = DiTTransformer2DModel(num_attention_heads=heads, attention_head_dim=head_dim, in_channels=4, num_layers=2,
                              sample_size=sample, patch_size=2, num_embeds_ada_norm=10, norm_num_groups=4)
    return m, {
        "hidden_states": torch.randn(1, 4, sample, sample),
        "timestep": torch.tensor([7], dtype=torch.int64),
        "class_labels": torch.tensor([3], dtype=torch.int64),
    }


def _pixart(heads: int = 2, head_dim: int = 16, sample: int = 8, text: int = 6) -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import PixArtTransformer2DModel

    m = PixArtTransformer2DModel(num_attention_heads=heads, attention_head_dim=head_dim, in_channels=4,
                                 out_channels=8, num_layers=2, sample_size=sample, patch_size=2,
                                 cross_attention_dim=heads * head_dim, caption_channels=24, norm_num_groups=4,
                                 use_additional_conditions=False)
    return m, {
        "hidden_states": torch.randn(1, 4, sample, sample),
        "encoder_hidden_states": torch.randn(1, text, 24),
        "timestep": torch.tensor([7], dtype=torch.int64),
    }


def _pixart_fixed() -> dict[str, Any]:
    return {"added_cond_kwargs": {"resolution": None, "aspect_ratio": None}}


def _sd3(heads: int = 2, head_dim: int = 16, sample: int = 8, text: int = 6,
         **extra: Any) -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import SD3Transformer2DModel

    m = SD3Transformer2DModel(sample_size=sample, patch_size=2, in_channels=4, num_layers=3,
                              attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=24,
                              caption_projection_dim=heads * head_dim, pooled_projection_dim=16, out_channels=4,
                              pos_embed_max_size=max(16, sample), **extra)
    return m, {
        "hidden_states": torch.randn(1, 4, sample, sample),
        "encoder_hidden_states": torch.randn(1, text, 24),
        "pooled_projections": torch.randn(1, 16),
        "timestep": torch.tensor([7.0]),
    }


def _flux() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import FluxTransformer2DModel

    m = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                               attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                               pooled_projection_dim=16, axes_dims_rope=(4, 6, 6))
    img_ids = torch.zeros(16, 3)
    img_ids[:, 1] = torch.arange(16) // 4
    img_ids[:, 2] = torch.arange(16) % 4
    return m, {
        "hidden_states": torch.randn(1, 16, 16),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "pooled_projections": torch.randn(1, 16),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(6, 3),
    }


def _flux_sized(heads: int, head_dim: int, side: int, text: int) -> tuple[Any, dict[str, Any]]:
    """Flux at a size where memory is megabytes (``side`` x ``side`` image tokens): per-head q/k RMSNorm."""
    import torch
    from diffusers import FluxTransformer2DModel

    rope = (head_dim // 4, 3 * head_dim // 8, 3 * head_dim // 8)
    m = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                               attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=64,
                               pooled_projection_dim=16, axes_dims_rope=rope)
    n = side * side
    img_ids = torch.zeros(n, 3)
    img_ids[:, 1] = torch.arange(n) // side
    img_ids[:, 2] = torch.arange(n) % side
    return m, {
        "hidden_states": torch.randn(1, n, 16),
        "encoder_hidden_states": torch.randn(1, text, 64),
        "pooled_projections": torch.randn(1, 16),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(text, 3),
    }


def _sana() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import SanaTransformer2DModel

    m = SanaTransformer2DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                               num_layers=2, num_cross_attention_heads=2, cross_attention_head_dim=16,
                               cross_attention_dim=32, caption_channels=24, sample_size=8, patch_size=1)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7.0]),
    }


def _cogvideox() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import CogVideoXTransformer3DModel

    m = CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                                    time_embed_dim=32, text_embed_dim=24, num_layers=2, sample_width=8,
                                    sample_height=8, sample_frames=1, patch_size=2, max_text_seq_length=6)
    return m, {
        "hidden_states": torch.randn(1, 1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7], dtype=torch.int64),
    }


def _wan() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import WanTransformer3DModel

    m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                              out_channels=4, text_dim=24, freq_dim=32, ffn_dim=64, num_layers=2,
                              rope_max_seq_len=32)
    return m, {
        "hidden_states": torch.randn(1, 4, 1, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7], dtype=torch.int64),
    }


def _lumina2() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Lumina2Transformer2DModel

    m = Lumina2Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=2,
                                  num_refiner_layers=1, num_attention_heads=2, num_kv_heads=1, multiple_of=16,
                                  axes_dim_rope=(4, 6, 6), axes_lens=(16, 16, 16), cap_feat_dim=24)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([0.7]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
    }


def _chroma(approximator_layers: int = 1) -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import ChromaTransformer2DModel

    m = ChromaTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                 attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                 axes_dims_rope=(4, 6, 6), approximator_num_channels=16,
                                 approximator_hidden_dim=32, approximator_layers=approximator_layers)
    img_ids = torch.zeros(16, 3)
    img_ids[:, 1] = torch.arange(16) // 4
    img_ids[:, 2] = torch.arange(16) % 4
    return m, {
        "hidden_states": torch.randn(1, 16, 16),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(6, 3),
    }


def _auraflow() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import AuraFlowTransformer2DModel

    m = AuraFlowTransformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1,
                                   num_single_dit_layers=2, attention_head_dim=16, num_attention_heads=2,
                                   joint_attention_dim=24, caption_projection_dim=32, out_channels=4,
                                   pos_embed_max_size=16)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7.0]),
    }


def _hunyuandit() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import HunyuanDiT2DModel

    m = HunyuanDiT2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, patch_size=2,
                          sample_size=8, hidden_size=32, num_layers=2, cross_attention_dim=24,
                          cross_attention_dim_t5=24,
                          pooled_projection_dim=16, text_len=6, text_len_t5=6,
                          use_style_cond_and_image_meta_size=False)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([7.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "text_embedding_mask": torch.ones(1, 6, dtype=torch.int64),
        "encoder_hidden_states_t5": torch.randn(1, 6, 24),
        "text_embedding_mask_t5": torch.ones(1, 6, dtype=torch.int64),
    }


def _hunyuandit_fixed() -> dict[str, Any]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    cos, sin = get_2d_rotary_pos_embed(16, ((0, 0), (4, 4)), (4, 4))
    return {"image_rotary_emb": (cos.float(), sin.float())}


def _cosmos() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import CosmosTransformer3DModel

    m = CosmosTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                                 num_layers=2, text_embed_dim=24, adaln_lora_dim=8, max_size=(4, 16, 16),
                                 patch_size=(1, 2, 2), concat_padding_mask=False, extra_pos_embed_type=None)
    return m, {
        "hidden_states": torch.randn(1, 4, 1, 8, 8),
        "timestep": torch.tensor([0.7]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
    }


def _sd35() -> tuple[Any, dict[str, Any]]:
    return _sd3(dual_attention_layers=(0,), qk_norm="rms_norm")


def _hunyuandit_skip() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import HunyuanDiT2DModel

    m = HunyuanDiT2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, patch_size=2,
                          sample_size=8, hidden_size=32, num_layers=4, cross_attention_dim=24,
                          cross_attention_dim_t5=24, pooled_projection_dim=16, text_len=6, text_len_t5=6,
                          use_style_cond_and_image_meta_size=False)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([7.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "text_embedding_mask": torch.ones(1, 6, dtype=torch.int64),
        "encoder_hidden_states_t5": torch.randn(1, 6, 24),
        "text_embedding_mask_t5": torch.ones(1, 6, dtype=torch.int64),
    }


def _chroma_guidance() -> tuple[Any, dict[str, Any]]:
    return _chroma(approximator_layers=3)


def _pixart_sigma() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import PixArtTransformer2DModel

    m = PixArtTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
                                 num_layers=2, sample_size=8, patch_size=2, cross_attention_dim=32,
                                 caption_channels=24, norm_num_groups=4, use_additional_conditions=False,
                                 interpolation_scale=0.5, norm_elementwise_affine=False, norm_eps=1e-6)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7], dtype=torch.int64),
    }


def _allegro() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import AllegroTransformer3DModel

    m = AllegroTransformer3DModel(patch_size=2, patch_size_t=1, num_attention_heads=2, attention_head_dim=16,
                                  in_channels=4, out_channels=4, num_layers=2, cross_attention_dim=32,
                                  caption_channels=24, sample_height=8, sample_width=8, sample_frames=1)
    return m, {
        "hidden_states": torch.randn(1, 4, 1, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7]),
    }


def _ltx() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import LTXVideoTransformer3DModel

    m = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2,
                                   attention_head_dim=16, cross_attention_dim=32, num_layers=2, caption_channels=24)
    return m, {
        "hidden_states": torch.randn(1, 16, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7.0]),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
    }


def _ltx_fixed() -> dict[str, Any]:
    return {"num_frames": 1, "height": 4, "width": 4}


def _latte() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import LatteTransformer3DModel

    m = LatteTransformer3DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
                                num_layers=2, cross_attention_dim=32, sample_size=8, patch_size=2,
                                activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
                                norm_elementwise_affine=False, norm_eps=1e-6, caption_channels=24, video_length=2)
    return m, {
        "hidden_states": torch.randn(1, 4, 2, 8, 8),
        "timestep": torch.tensor([7], dtype=torch.int64),
        "encoder_hidden_states": torch.randn(1, 6, 24),
    }


def _hunyuanvideo() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import HunyuanVideoTransformer3DModel

    m = HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                                       num_layers=2, num_single_layers=2, num_refiner_layers=2, patch_size=2,
                                       patch_size_t=1, guidance_embeds=False, text_embed_dim=24,
                                       pooled_projection_dim=16, rope_axes_dim=(4, 6, 6))
    return m, {
        "hidden_states": torch.randn(1, 4, 1, 8, 8),
        "timestep": torch.tensor([7], dtype=torch.int64),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
        "pooled_projections": torch.randn(1, 16),
    }


def _qwenimage() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import QwenImageTransformer2DModel

    m = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                                    num_attention_heads=2, joint_attention_dim=24, axes_dims_rope=(4, 6, 6))
    return m, {
        "hidden_states": torch.randn(1, 16, 16),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([0.7]),
    }


def _qwenimage_fixed() -> dict[str, Any]:
    return {"img_shapes": [(1, 4, 4)]}


def _skyreels_v2() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import SkyReelsV2Transformer3DModel

    m = SkyReelsV2Transformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                     in_channels=4, out_channels=4, text_dim=24, freq_dim=32, ffn_dim=64,
                                     num_layers=2, rope_max_seq_len=32)
    return m, {
        "hidden_states": torch.randn(1, 4, 1, 8, 8),
        "timestep": torch.tensor([7.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
    }


def _cogview4() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import CogView4Transformer2DModel

    m = CogView4Transformer2DModel(patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=16,
                                   num_attention_heads=2, text_embed_dim=24, time_embed_dim=32, condition_dim=8,
                                   pos_embed_max_size=16, sample_size=8, rope_axes_dim=(16, 16))
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7], dtype=torch.int64),
        "original_size": torch.tensor([[64.0, 64.0]]),
        "target_size": torch.tensor([[64.0, 64.0]]),
        "crop_coords": torch.tensor([[0.0, 0.0]]),
    }


def _flux2() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Flux2Transformer2DModel

    m = Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False)
    img_ids = torch.zeros(1, 16, 4)
    img_ids[..., 1] = torch.arange(16) // 4
    img_ids[..., 2] = torch.arange(16) % 4
    return m, {
        "hidden_states": torch.randn(1, 16, 16),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(1, 6, 4),
    }


def _wan_vace() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import WanVACETransformer3DModel

    m = WanVACETransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                                  out_channels=4, text_dim=24, freq_dim=32, ffn_dim=64, num_layers=4,
                                  rope_max_seq_len=32, vace_layers=[0, 2], vace_in_channels=8)
    return m, {
        "hidden_states": torch.randn(1, 4, 1, 8, 8),
        "timestep": torch.tensor([7.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "control_hidden_states": torch.randn(1, 8, 1, 8, 8),
    }


def _chronoedit() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import ChronoEditTransformer3DModel

    m = ChronoEditTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                     in_channels=4, out_channels=4, text_dim=24, freq_dim=32, ffn_dim=64,
                                     num_layers=2, rope_max_seq_len=32)
    return m, {
        "hidden_states": torch.randn(1, 4, 2, 8, 8),
        "timestep": torch.tensor([7.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
    }


def _sana_video() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import SanaVideoTransformer3DModel

    m = SanaVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                                    num_layers=2, num_cross_attention_heads=2, cross_attention_head_dim=16,
                                    cross_attention_dim=32, caption_channels=24, sample_size=8, patch_size=(1, 2, 2),
                                    rope_max_seq_len=32)
    return m, {
        "hidden_states": torch.randn(1, 4, 2, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7.0]),
    }


def _trained_like(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Small seeded weights for the parameters diffusers initialises to all zeros (adaLN-Zero
    modulation and output layers), as a trained checkpoint has them.

    Kandinsky 5 and PRX zero both the weight and the bias of their modulation ``Linear``: the
    export then holds a ``Gemm`` computing constant zeros, and rknn-toolkit2 2.3.0 and 2.5.0 fail
    in ``fold_constant`` on it (``TypeError: argument of type 'NoneType' is not iterable`` in
    ``check_inputs``; ``rkpart repro``: the one Gemm), a failure of untrained models only.
    """
    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, prm in sorted(model.named_parameters()):
            if prm.dtype.is_floating_point and prm.numel() > 1 and not prm.any():
                prm.copy_(torch.randn(prm.shape, generator=gen) * 0.02)


def _kandinsky5() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Kandinsky5Transformer3DModel

    m = Kandinsky5Transformer3DModel(in_visual_dim=4, in_text_dim=24, in_text_dim2=16, time_dim=32, out_visual_dim=4,
                                     patch_size=(1, 2, 2), model_dim=32, ff_dim=64, num_text_blocks=2,
                                     num_visual_blocks=2, axes_dims=(4, 6, 6))
    return m, {
        "hidden_states": torch.randn(1, 1, 8, 8, 4),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7.0]),
        "pooled_projections": torch.randn(1, 16),
    }


def _kandinsky5_fixed() -> dict[str, Any]:
    import torch

    return {"visual_rope_pos": [torch.arange(1), torch.arange(4), torch.arange(4)],
            "text_rope_pos": torch.arange(6), "scale_factor": (1.0, 1.0, 1.0)}


def _cogview3plus() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import CogView3PlusTransformer2DModel

    m = CogView3PlusTransformer2DModel(patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16,
                                       num_attention_heads=2, out_channels=4, text_embed_dim=24, time_embed_dim=32,
                                       condition_dim=8, pos_embed_max_size=16, sample_size=8)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7], dtype=torch.int64),
        "original_size": torch.tensor([[64.0, 64.0]]),
        "target_size": torch.tensor([[64.0, 64.0]]),
        "crop_coords": torch.tensor([[0.0, 0.0]]),
    }


def _flux_ids() -> tuple[Any, Any]:
    import torch

    img_ids = torch.zeros(16, 3)
    img_ids[:, 1] = torch.arange(16) // 4
    img_ids[:, 2] = torch.arange(16) % 4
    return img_ids, torch.zeros(6, 3)


def _longcat_image() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import LongCatImageTransformer2DModel

    m = LongCatImageTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                       pooled_projection_dim=24, axes_dims_rope=[4, 6, 6])
    img_ids, txt_ids = _flux_ids()
    return m, {"hidden_states": torch.randn(1, 16, 16), "encoder_hidden_states": torch.randn(1, 6, 24),
               "timestep": torch.tensor([0.7]), "img_ids": img_ids, "txt_ids": txt_ids}


def _ovis_image() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import OvisImageTransformer2DModel

    m = OvisImageTransformer2DModel(patch_size=1, in_channels=16, out_channels=16, num_layers=2, num_single_layers=2,
                                    attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                    axes_dims_rope=(4, 6, 6))
    img_ids, txt_ids = _flux_ids()
    return m, {"hidden_states": torch.randn(1, 16, 16), "encoder_hidden_states": torch.randn(1, 6, 24),
               "timestep": torch.tensor([0.7]), "img_ids": img_ids, "txt_ids": txt_ids}


def _bria() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import BriaTransformer2DModel

    m = BriaTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
                               num_attention_heads=2, joint_attention_dim=24, axes_dims_rope=[4, 6, 6])
    img_ids, txt_ids = _flux_ids()
    return m, {"hidden_states": torch.randn(1, 16, 16), "encoder_hidden_states": torch.randn(1, 6, 24),
               "timestep": torch.tensor([0.7]), "img_ids": img_ids, "txt_ids": txt_ids}


def _stable_audio() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import StableAudioDiTModel

    m = StableAudioDiTModel(sample_size=16, in_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
                            num_key_value_attention_heads=1, out_channels=4, cross_attention_dim=24,
                            time_proj_dim=16, global_states_input_dim=24, cross_attention_input_dim=24)
    return m, {
        "hidden_states": torch.randn(1, 4, 16),
        "timestep": torch.tensor([7.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "global_hidden_states": torch.randn(1, 1, 24),
    }


def _stable_audio_fixed() -> dict[str, Any]:
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    cos, sin = get_1d_rotary_pos_embed(8, 17, use_real=True, repeat_interleave_real=False)
    return {"rotary_embedding": (cos.float(), sin.float())}


def _prx() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import PRXTransformer2DModel

    m = PRXTransformer2DModel(in_channels=4, patch_size=2, context_in_dim=24, hidden_size=32, mlp_ratio=2.0,
                              num_heads=2, depth=2, axes_dim=[8, 8])
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([0.7]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
    }


def _flux3() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Flux3Transformer2DModel

    m = Flux3Transformer2DModel(in_channels=16, cond_in_channels=16, num_layers=2, num_single_layers=2,
                                attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                timestep_channels=32, axes_dims_rope=(4, 4, 4, 4))
    img_ids = torch.zeros(16, 4)
    img_ids[..., 1] = torch.arange(16) // 4
    img_ids[..., 2] = torch.arange(16) % 4
    return m, {
        "hidden_states": torch.randn(1, 16, 16),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(6, 4),
    }


def _tuple_out(model: Any, call: Callable[..., Any]) -> Any:
    """``model`` behind a ``forward(**tensors, return_dict=False) -> (sample,)`` adapter: for classes whose
    forward returns a bare tensor or takes a list of (tensor, mask) pairs (``call(model, **tensors)`` makes the
    one call the pipeline makes); the computation is the model's own, its modules keep their names under ``model.``."""
    import torch

    class TupleOut(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, return_dict: bool = False, **tensors: torch.Tensor) -> tuple[torch.Tensor]:
            return (call(self.model, **tensors),)

    return TupleOut()


def _ace_step() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import AceStepTransformer1DModel

    # 8 frames of 4 latent channels after patchify (16 before); sliding-window self-attention in block 0
    # (window 2: a banded mask), full self-attention in block 1; GQA (2 query heads, 1 key/value head)
    m = AceStepTransformer1DModel(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=16, in_channels=12, audio_acoustic_hidden_dim=4,
                                  patch_size=2, sliding_window=2, encoder_hidden_size=24)
    return m, {
        "hidden_states": torch.randn(1, 16, 4),
        "timestep": torch.tensor([0.7]),
        "timestep_r": torch.tensor([0.7]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "context_latents": torch.randn(1, 16, 8),
    }


def _longcat_audio() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import LongCatAudioDiTTransformer

    m = LongCatAudioDiTTransformer(dit_dim=32, dit_depth=2, dit_heads=2, dit_text_dim=24, latent_dim=4, ff_mult=2.0)
    return m, {
        "hidden_states": torch.randn(1, 16, 4),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.bool),
        "timestep": torch.tensor([0.7]),
        "attention_mask": torch.ones(1, 16, dtype=torch.bool),
        "latent_cond": torch.randn(1, 16, 4),
    }


def _minimax_music3() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import MiniMaxMusic3Transformer1DModel

    m = MiniMaxMusic3Transformer1DModel(in_channels=4, condition_dim=24, num_layers=2, num_attention_heads=2,
                                        attention_head_dim=16, ff_inner_dim=64, rotary_dim=8,
                                        fourier_embedding_dim=32)
    return m, {
        "hidden_states": torch.randn(1, 4, 16),
        "timestep": torch.tensor([0.7]),
        "encoder_hidden_states": torch.randn(1, 16, 24),
    }


def _minimax_rvq() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import MiniMaxMusic3RVQDepthDecoder

    m = MiniMaxMusic3RVQDepthDecoder(hidden_size=32, num_layers=2, num_attention_heads=2, intermediate_size=64,
                                     audio_vocab_size=16, num_codebooks=8, max_position_embeddings=16)
    # forward returns the hidden states bare: the adapter makes them the usual 1-tuple; 8 depth steps (the global
    # hidden state and 7 codes), causal self-attention
    return _tuple_out(m, lambda model, **t: model(**t)), {"inputs_embeds": torch.randn(1, 8, 32)}


def _prior() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import PriorTransformer

    m = PriorTransformer(num_attention_heads=2, attention_head_dim=16, num_layers=2, embedding_dim=24,
                         num_embeddings=6, additional_embeddings=4)
    return m, {
        "hidden_states": torch.randn(1, 24),
        "timestep": torch.tensor([7], dtype=torch.int64),
        "proj_embedding": torch.randn(1, 24),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "attention_mask": torch.ones(1, 6, dtype=torch.bool),
    }


def _t5film() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import T5FilmDecoder

    m = T5FilmDecoder(input_dims=8, targets_length=16, d_model=32, num_layers=2, num_heads=2, d_kv=16, d_ff=64)

    def call(model: Any, decoder_input_tokens: Any, decoder_noise_time: Any, notes_encoding: Any, notes_mask: Any,
             continuous_encoding: Any, continuous_mask: Any) -> Any:
        # the spectrogram-diffusion pipeline's decode: [(notes encoder out, mask), (continuous encoder out, mask)]
        return model(encodings_and_masks=[(notes_encoding, notes_mask), (continuous_encoding, continuous_mask)],
                     decoder_input_tokens=decoder_input_tokens, decoder_noise_time=decoder_noise_time)

    return _tuple_out(m, call), {
        "decoder_input_tokens": torch.randn(1, 16, 8),
        "decoder_noise_time": torch.tensor([0.7]),
        "notes_encoding": torch.randn(1, 6, 32),
        "notes_mask": torch.ones(1, 6, dtype=torch.bool),
        "continuous_encoding": torch.randn(1, 16, 32),
        "continuous_mask": torch.ones(1, 16, dtype=torch.bool),
    }


def _dual_transformer() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers.models.transformers.dual_transformer_2d import DualTransformer2DModel

    m = DualTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=8, num_layers=2,
                               norm_num_groups=4, cross_attention_dim=24)
    m.condition_lengths = [6, 8]  # Versatile Diffusion sets [77, 257] (text, image); the tiny text and image lengths
    return m, {
        "hidden_states": torch.randn(1, 8, 4, 4),
        "encoder_hidden_states": torch.randn(1, 14, 24),
    }


def _transformer_temporal() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers.models.transformers.transformer_temporal import TransformerTemporalModel

    # as UNet3DConditionModel's temp_attentions: frames of a video as the batch, attention over 4 frames at each of
    # the 4 x 4 positions, two self-attentions per block (double_self_attention), no text
    m = TransformerTemporalModel(num_attention_heads=2, attention_head_dim=16, in_channels=8, num_layers=2,
                                 norm_num_groups=4)
    return m, {"hidden_states": torch.randn(4, 8, 4, 4)}


def _transformer_temporal_fixed() -> dict[str, Any]:
    return {"num_frames": 4}


def _rfd4() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import RFD4ProteinaTransformer

    m = RFD4ProteinaTransformer(nlayers=2, token_dim=32, nheads=2, dim_cond=16, pair_repr_dim=16, latent_dim=4,
                                token_type_emb_dim=8, cath_emb_dim=4, t_emb_dim=16, seq_sep_dim=8, xt_pair_dist_dim=8,
                                tri_mult_c=16, feats_seq=("xt_bb_ca", "xt_local_latents", "token_type"),
                                feats_cond_seq=("time_emb_bb_ca", "time_emb_local_latents"),
                                feats_pair_repr=("xt_bb_ca_pair_dists",))
    # the features that need no annotations the pipeline's preprocessor makes (hbond, rasa, ...): the trunk is the same
    return m, {
        "bb_ca": torch.randn(1, 8, 3),
        "local_latents": torch.randn(1, 8, 4),
        "bb_ca_time": torch.tensor([0.7]),
        "local_latents_time": torch.tensor([0.7]),
        "padding_mask": torch.ones(1, 8, dtype=torch.bool),
        "token_type": torch.zeros(1, 8, dtype=torch.int64),
    }


def _rfd4_fixed() -> dict[str, Any]:
    import torch

    return {"conditioning": {"is_in_context_conditioning": torch.zeros(1, 8, dtype=torch.bool),
                             "supports_local_latent": torch.ones(1, 8, dtype=torch.bool)}}


def _easyanimate() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import EasyAnimateTransformer3DModel

    # EasyAnimate V5.1: every block MMDiT (mmdit_layers >= num_layers), one text encoder
    m = EasyAnimateTransformer3DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                                      patch_size=2, sample_width=8, sample_height=8, num_layers=2, mmdit_layers=2,
                                      time_embed_dim=32, text_embed_dim=24)
    return m, {
        "hidden_states": torch.randn(1, 4, 1, 8, 8),
        "timestep": torch.tensor([7.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
    }


def _lumina_next() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import LuminaNextDiT2DModel

    m = LuminaNextDiT2DModel(sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=2,
                             num_attention_heads=2, num_kv_heads=1, multiple_of=16, cross_attention_dim=24)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([0.7]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "encoder_mask": torch.ones(1, 6, dtype=torch.int64),
    }


def _lumina_next_fixed() -> dict[str, Any]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed_lumina

    # the pipeline's table (head_dim, 384, 384) cut to the tiny grid: complex64 [8, 8, head_dim / 2]
    return {"image_rotary_emb": get_2d_rotary_pos_embed_lumina(16, 8, 8), "cross_attention_kwargs": {}}


def real_rope_lumina_next(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """LuminaNext's complex RoPE rewritten to the real (cos/sin) form, asserted equal to diffusers' own.

    The pipeline passes a complex64 table (``get_2d_rotary_pos_embed_lumina``) that
    ``LuminaAttnProcessor2_0`` multiplies with q/k viewed as complex pairs: TorchScript cannot
    export complex tensors ("ScalarType ComplexFloat") and dynamo fails to convert the complex
    product (``aten.unsqueeze`` of the complex view).  The same rotation of interleaved pairs is
    ``x * cos + rot(x) * sin`` with each frequency's cos/sin repeated per pair (diffusers'
    ``apply_rotary_emb(use_real=True)``).  The table is a fixed argument: it is replaced by the
    real ``[H, W, head_dim, 2]`` (cos, sin) table, which the patch embedder crops and flattens as
    it did the complex one, and every attention gets a processor (a subclass: same projections,
    qk norms, GQA, masks and scales) that applies it.  The patched model's output on the example
    inputs must equal the unpatched model's.
    """
    import torch
    import torch.nn.functional as F
    from diffusers.models.attention_processor import LuminaAttnProcessor2_0
    from diffusers.models.embeddings import apply_rotary_emb

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
    table = fixed["image_rotary_emb"]
    fixed["image_rotary_emb"] = torch.stack((table.real.repeat_interleave(2, dim=-1),
                                             table.imag.repeat_interleave(2, dim=-1)), dim=-1).float()

    class RealRopeLuminaProcessor(LuminaAttnProcessor2_0):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, query_rotary_emb: Any = None,
                     key_rotary_emb: Any = None, base_sequence_length: int | None = None) -> torch.Tensor:
            batch_size, sequence_length, _ = hidden_states.shape
            query = attn.to_q(hidden_states)
            key = attn.to_k(encoder_hidden_states)
            value = attn.to_v(encoder_hidden_states)
            head_dim = query.shape[-1] // attn.heads
            dtype = query.dtype
            kv_heads = key.shape[-1] // head_dim
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            query = query.view(batch_size, -1, attn.heads, head_dim)
            key = key.view(batch_size, -1, kv_heads, head_dim)
            value = value.view(batch_size, -1, kv_heads, head_dim)
            if query_rotary_emb is not None:  # the one change: [1, S, D, 2] real (cos, sin) instead of complex
                query = apply_rotary_emb(query, (query_rotary_emb[0, ..., 0], query_rotary_emb[0, ..., 1]),
                                         use_real=True, sequence_dim=1)
            if key_rotary_emb is not None:
                key = apply_rotary_emb(key, (key_rotary_emb[0, ..., 0], key_rotary_emb[0, ..., 1]),
                                       use_real=True, sequence_dim=1)
            query, key = query.to(dtype), key.to(dtype)
            if key_rotary_emb is None:
                softmax_scale = None
            elif base_sequence_length is not None:
                softmax_scale = math.sqrt(math.log(sequence_length, base_sequence_length)) * attn.scale
            else:
                softmax_scale = attn.scale
            n_rep = attn.heads // kv_heads
            if n_rep >= 1:
                key = key.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
                value = value.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
            attention_mask = attention_mask.bool().view(batch_size, 1, 1, -1)
            attention_mask = attention_mask.expand(-1, attn.heads, sequence_length, -1)
            query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
            hidden_states = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           scale=softmax_scale)
            return hidden_states.transpose(1, 2).to(dtype)

    for module in model.modules():
        if type(getattr(module, "processor", None)) is LuminaAttnProcessor2_0:
            module.set_processor(RealRopeLuminaProcessor())
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


def _static_rope_easyanimate(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """EasyAnimate's RoPE tables made once for the static example shape (same tables, now constants).

    ``EasyAnimateRotaryPosEmbed`` crops its position grid with ``int(round(th / h * w))`` of the
    latent's sizes, which TorchScript traces as tensors ("type Tensor doesn't define __round__").
    The tables depend only on the shape, so they are computed here from the embedder itself and
    returned as they are; the output must equal the unpatched model's.
    """
    import torch

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
        cos, sin = model.rope_embedding(inputs["hidden_states"])

    class StaticRope(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cos", cos.float().contiguous(), persistent=False)
            self.register_buffer("sin", sin.float().contiguous(), persistent=False)

        def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.cos, self.sin

    model.rope_embedding = StaticRope()
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=0, atol=0)


def _repeat_kv_ace_step(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """ACE-Step's grouped-query attention with the key/value heads repeated before attention.

    ``AceStepAttnProcessor2_0`` calls ``scaled_dot_product_attention(enable_gqa=True)``, which the
    TorchScript exporter refuses ("conversion of scaled_dot_product_attention not implemented if
    enable_gqa is True").  GQA is the same attention with each key/value head repeated for its
    ``heads // kv_heads`` query heads (``repeat_interleave`` on the head axis, as SDPA does), so
    every attention gets a processor (a subclass: same projections, qk RMSNorm, RoPE on
    self-attention, masks and scale; the native, non-flash path) doing that; the output must equal
    the unpatched model's.
    """
    import torch
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.ace_step_transformer import AceStepAttnProcessor2_0

    class RepeatKVProcessor(AceStepAttnProcessor2_0):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None,
                     attention_mask: Any = None, image_rotary_emb: Any = None) -> torch.Tensor:
            is_cross = attn.is_cross_attention and encoder_hidden_states is not None
            kv_input = encoder_hidden_states if is_cross else hidden_states
            query = attn.norm_q(attn.to_q(hidden_states).unflatten(-1, (attn.heads, attn.head_dim)))
            key = attn.norm_k(attn.to_k(kv_input).unflatten(-1, (attn.kv_heads, attn.head_dim)))
            value = attn.to_v(kv_input).unflatten(-1, (attn.kv_heads, attn.head_dim))
            if not is_cross and image_rotary_emb is not None:
                query = apply_rotary_emb(query, image_rotary_emb, use_real=True, use_real_unbind_dim=-2,
                                         sequence_dim=1)
                key = apply_rotary_emb(key, image_rotary_emb, use_real=True, use_real_unbind_dim=-2, sequence_dim=1)
            n_rep = attn.heads // attn.kv_heads  # the one change: GQA's key/value heads repeated here
            key, value = key.repeat_interleave(n_rep, dim=2), value.repeat_interleave(n_rep, dim=2)
            hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                                  scale=attn.scaling, backend=self._attention_backend)
            hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
            return attn.to_out[1](attn.to_out[0](hidden_states))

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
    for module in model.modules():
        if type(getattr(module, "processor", None)) is AceStepAttnProcessor2_0:
            module.set_processor(RepeatKVProcessor())
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


def _trained_like_lumina_next(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """:func:`_trained_like` (LuminaNext's zero-initialised cross-attention ``gate``: ``tanh(0)`` would
    multiply every cross-attention by exactly 0, a constant subgraph rknn-toolkit2 2.5.0's
    ``fold_constant`` fails on), then :func:`real_rope_lumina_next`."""
    _trained_like(model, inputs, fixed)
    real_rope_lumina_next(model, inputs, fixed)


def _lumina2_processor() -> Any:
    """diffusers' ``Lumina2AttnProcessor2_0`` with the RoPE in the real form (a subclass: same
    projections, norms, GQA and masking; ``image_rotary_emb`` is a ``(cos, sin)`` pair of
    ``[S, D]`` tables applied by diffusers' ``apply_rotary_emb(use_real=True)``)."""
    import math

    import torch
    import torch.nn.functional as F
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.transformer_lumina2 import Lumina2AttnProcessor2_0

    class RealRopeLumina2Processor(Lumina2AttnProcessor2_0):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, image_rotary_emb: Any = None,
                     base_sequence_length: int | None = None) -> torch.Tensor:
            batch_size, sequence_length, _ = hidden_states.shape
            query = attn.to_q(hidden_states)
            key = attn.to_k(encoder_hidden_states)
            value = attn.to_v(encoder_hidden_states)
            head_dim = query.shape[-1] // attn.heads
            dtype = query.dtype
            kv_heads = key.shape[-1] // head_dim
            query = query.view(batch_size, -1, attn.heads, head_dim)
            key = key.view(batch_size, -1, kv_heads, head_dim)
            value = value.view(batch_size, -1, kv_heads, head_dim)
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            if image_rotary_emb is not None:  # the one change: real cos/sin instead of complex products
                query = apply_rotary_emb(query, image_rotary_emb, use_real=True, sequence_dim=1)
                key = apply_rotary_emb(key, image_rotary_emb, use_real=True, sequence_dim=1)
            query, key = query.to(dtype), key.to(dtype)
            if base_sequence_length is not None:
                softmax_scale = math.sqrt(math.log(sequence_length, base_sequence_length)) * attn.scale
            else:
                softmax_scale = attn.scale
            n_rep = attn.heads // kv_heads
            if n_rep >= 1:
                key = key.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
                value = value.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
            if attention_mask is not None:
                attention_mask = attention_mask.bool().view(batch_size, 1, 1, -1)
            query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
            hidden_states = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           scale=softmax_scale)
            hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
            hidden_states = hidden_states.type_as(query)
            hidden_states = attn.to_out[0](hidden_states)
            return attn.to_out[1](hidden_states)

    return RealRopeLumina2Processor()


def real_rope_lumina2(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Lumina2's RoPE rewritten to the real (cos/sin) form, asserted equal to diffusers' own.

    diffusers rotates q/k viewed as complex pairs by complex frequencies (``torch.polar``,
    ``view_as_complex``): TorchScript cannot export complex tensors ("ScalarType ComplexDouble")
    and ``torch.export`` fails on the embedder's data-dependent caption lengths
    (``mask.sum().tolist()``).  The same rotation of interleaved pairs is
    ``x * cos + rot(x) * sin`` with each frequency's cos/sin repeated per pair (diffusers'
    ``apply_rotary_emb(use_real=True)``).  Positions depend only on static shapes and the
    caption length, so the tables are computed here once from the embedder's own frequencies for
    the example caption mask (all ones: every caption token valid) and become constants.  The
    patched model's output on the example inputs must equal the unpatched model's (fp32 real
    arithmetic vs diffusers' complex128 products: within 1e-5).
    """
    import torch
    from diffusers.models.transformers.transformer_lumina2 import Lumina2AttnProcessor2_0

    mask = inputs["encoder_attention_mask"]
    assert bool(mask.all()), "the real-form RoPE tables are made for full captions (an all-ones mask)"
    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
        rope = model.rope_embedder
        _, cap, img, joint, cap_lens, seq_lens = rope(inputs["hidden_states"], mask)

    def real(freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # every batch row has the same positions (equal caption lengths): [S, D/2] complex -> [S, D] cos, sin
        f = freqs[0]
        return (f.real.repeat_interleave(2, dim=-1).float().contiguous(),
                f.imag.repeat_interleave(2, dim=-1).float().contiguous())

    tables = {"cap": real(cap), "img": real(img), "joint": real(joint)}

    class StaticRealRope(torch.nn.Module):
        """The embedder's outputs for static shapes: patchified latents and real RoPE tables."""

        def __init__(self) -> None:
            super().__init__()
            self.patch_size = rope.patch_size
            for kind, (cos, sin) in tables.items():
                self.register_buffer(f"{kind}_cos", cos, persistent=False)
                self.register_buffer(f"{kind}_sin", sin, persistent=False)

        def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> tuple[Any, ...]:
            b, c, h, w = hidden_states.shape
            p = self.patch_size
            hidden_states = (hidden_states.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
                             .flatten(3).flatten(1, 2))
            pairs = [(getattr(self, f"{k}_cos"), getattr(self, f"{k}_sin")) for k in ("cap", "img", "joint")]
            return hidden_states, *pairs, list(cap_lens), list(seq_lens)

    model.rope_embedder = StaticRealRope()
    for module in model.modules():
        if type(getattr(module, "processor", None)) is Lumina2AttnProcessor2_0:
            module.set_processor(_lumina2_processor())
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("dit", _dit),
    Family("pixart", _pixart, _pixart_fixed),
    Family("sd3", _sd3, blocks=3),
    Family("flux", _flux, blocks=4),
    Family("sana", _sana),
    Family("cogvideox", _cogvideox),
    Family("wan", _wan),
    Family("chroma", _chroma, blocks=4),
    Family("lumina2", _lumina2, blocks=4, prepare=real_rope_lumina2),  # 2 refiner blocks + 2 blocks
    Family("auraflow", _auraflow, blocks=3),
    Family("hunyuandit", _hunyuandit, _hunyuandit_fixed),
    Family("cosmos", _cosmos),
)}
VARIANTS: dict[str, Family] = {f.name: f for f in (
    Family("sd35", _sd35, blocks=3),
    Family("hunyuandit_skip", _hunyuandit_skip, _hunyuandit_fixed, blocks=4),
    Family("chroma_guidance", _chroma_guidance, blocks=4),
    Family("pixart_sigma", _pixart_sigma, _pixart_fixed),
    Family("allegro", _allegro),
    Family("ltx", _ltx, _ltx_fixed),
)}
#: newer families of the issue-28 sweep (every class of ``diffusers.models.transformers`` whose forward
#: exports with at least one exporter), newer DiT / video families first
NEWER: dict[str, Family] = {f.name: f for f in (
    Family("latte", _latte, blocks=4),  # 2 spatial + 2 temporal blocks, alternating
    Family("hunyuanvideo", _hunyuanvideo, blocks=6),  # 2 token-refiner + 2 dual-stream + 2 single-stream
    Family("skyreels_v2", _skyreels_v2),
    Family("cogview4", _cogview4),
    Family("flux2", _flux2, blocks=4),
    Family("wan_vace", _wan_vace, blocks=6),  # 4 blocks + 2 VACE blocks (vace_layers) whose hints join them
    # 2 text blocks run before 2 visual; zero-initialised modulation: _trained_like
    Family("kandinsky5", _kandinsky5, _kandinsky5_fixed, blocks=4, prepare=_trained_like),
    Family("chronoedit", _chronoedit),
    Family("sana_video", _sana_video),
    Family("cogview3plus", _cogview3plus),
    Family("longcat_image", _longcat_image, blocks=4),
    Family("ovis_image", _ovis_image, blocks=4),
    Family("bria", _bria, blocks=4),
    # per-modality blocks (text, then image: parallel attn + MLP) run apart, then two-stream single blocks
    Family("flux3", _flux3, blocks=6),
    Family("stable_audio", _stable_audio, _stable_audio_fixed),
    Family("prx", _prx, prepare=_trained_like),  # zero-initialised modulation: _trained_like
)}
#: issue 28's sweep, diffusers 0.42: the audio DiTs (ACE-Step, LongCat-AudioDiT, MiniMax Music 3 and its RVQ depth
#: decoder), the older non-DiT transformers (Prior, T5 FiLM decoder, dual and temporal transformers), RFD4 Proteina
LATEST_H5: dict[str, Family] = {f.name: f for f in (
    Family("ace_step", _ace_step, prepare=_repeat_kv_ace_step),  # block 0 sliding-window self-attention, block 1 full
    Family("longcat_audio", _longcat_audio, prepare=_trained_like),  # zero-initialised modulation
    Family("minimax_music3", _minimax_music3),
    Family("minimax_rvq", _minimax_rvq),
    Family("prior", _prior),
    Family("t5film", _t5film),
    Family("dual_transformer", _dual_transformer, blocks=4),  # two Transformer2DModels of 2 blocks side by side
    Family("transformer_temporal", _transformer_temporal, _transformer_temporal_fixed),
    Family("rfd4", _rfd4, _rfd4_fixed, blocks=3),  # 2 trunk layers + the pair update between them
    Family("easyanimate", _easyanimate, prepare=_static_rope_easyanimate),
    Family("lumina_next", _lumina_next, _lumina_next_fixed, prepare=_trained_like_lumina_next),
)}
#: classes of ``diffusers.models.transformers`` not in the sweep, and why (diffusers 0.42 / torch 2.13)
NOT_EXPORTED: dict[str, str] = {
    "MochiTransformer3DModel": "exports, but the masked text pooling leaves shapes dynamic (rkpart exit 3)",
    "ZImageTransformer2DModel": "forward takes lists of per-sample tensors (x, cap_feats): not wrapped yet",
    "QwenImageTransformer2DModel": "complex RoPE: TorchScript has no aten::view_as_complex, dynamo fails to "
                                   "convert the complex product (config kept: _qwenimage)",
}
#: families at a size where memory is megabytes, not kilobytes (hidden 512, 256 image tokens, 1024 for
#: ``*_1k``): the device-memory bench predicts them (``bench/device_memory.py``); not in the family sweep.
#: ``sd35_m`` and ``flux_m`` normalise q and k per head (RMSNorm), the others have no q/k norms
SIZED: dict[str, Family] = {f.name: f for f in (
    Family("dit_m", lambda: _dit(heads=8, head_dim=64, sample=32)),
    Family("dit_m1k", lambda: _dit(heads=8, head_dim=64, sample=64)),
    Family("pixart_m", lambda: _pixart(heads=8, head_dim=64, sample=32, text=64), _pixart_fixed),
    Family("sd3_m", lambda: _sd3(heads=8, head_dim=64, sample=32, text=64), blocks=3),
    Family("sd35_m", lambda: _sd3(heads=8, head_dim=64, sample=32, text=64, qk_norm="rms_norm"), blocks=3),
    Family("flux_m", lambda: _flux_sized(heads=8, head_dim=64, side=16, text=64)),
)}
#: every family and variant by name
ALL: dict[str, Family] = {**FAMILIES, **VARIANTS, **NEWER, **LATEST_H5, **SIZED}


def _decompose_rms_norm(model: Any) -> None:
    """Replace ``torch.nn.RMSNorm`` (``aten::rms_norm``: no TorchScript symbolic below opset 23)
    by the decomposed form every exporter understands, keeping the weights."""
    import torch

    class DecomposedRMSNorm(torch.nn.Module):
        def __init__(self, src: torch.nn.RMSNorm) -> None:
            super().__init__()
            self.eps = src.eps if src.eps is not None else torch.finfo(torch.float32).eps
            self.weight = src.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return y * self.weight if self.weight is not None else y

    for _name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, torch.nn.RMSNorm):
                setattr(mod, child_name, DecomposedRMSNorm(child))


class _Wrapper:
    """Positional inputs -> the model's ``sample`` tensor (exporters want a plain signature)."""

    @staticmethod
    def make(model: Any, names: list[str], fixed: dict[str, Any]) -> Any:
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: torch.Tensor) -> torch.Tensor:
                out = self.model(**dict(zip(names, args, strict=True)), **fixed, return_dict=False)
                return out[0]

        return Wrapped().eval()


def export_family(name: str, path: str | Path, *, dynamo: bool = False, seed: int = 0,
                  opset: int | None = None) -> dict[str, np.ndarray]:
    """Export family or variant ``name`` to ``path`` (static shapes); returns the example inputs.

    ``opset`` defaults to 17 (TorchScript) and 18 (dynamo); ``opset=0`` takes the exporter's own
    default (what a user gets from a bare ``torch.onnx.export``: opset 20 for dynamo in torch 2.13).

    Raises ``KeyError`` for an unknown family and whatever the exporter raises when it fails.
    """
    import torch

    fam = ALL[name]
    torch.manual_seed(seed)
    model, inputs = fam.build()
    model = model.eval()
    fixed = fam.fixed()
    if fam.prepare is not None:
        fam.prepare(model, inputs, fixed)
    if not dynamo:
        _decompose_rms_norm(model)
    names = list(inputs)
    wrapped = _Wrapper.make(model, names, fixed)
    args = tuple(inputs.values())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            prog = torch.onnx.export(wrapped, args, input_names=names, output_names=["sample"], dynamo=True,
                                     optimize=True, verbose=False,
                                     opset_version=_opset(opset, 18))
            assert prog is not None
            prog.save(str(path))
        else:
            torch.onnx.export(wrapped, args, str(path), input_names=names, output_names=["sample"],
                              dynamo=False, do_constant_folding=True, opset_version=_opset(opset, 17))
    return {k: v.numpy() for k, v in inputs.items()}


def _opset(opset: int | None, default: int) -> int | None:
    """``opset``, ``default`` when it is None, None (the exporter's default) when it is 0."""
    if opset == 0:
        return None
    return opset or default


def block_count(name: str) -> int:
    """Transformer blocks in the config of family or variant ``name``."""
    return ALL[name].blocks


def export_root() -> Path:
    """Where :func:`cached_export` keeps exports (``$RKPART_TEST_EXPORTS``)."""
    return Path(os.environ.get("RKPART_TEST_EXPORTS", Path.home() / ".cache" / "rkpart" / "test-exports"))


def cached_export(name: str, exporter: str) -> Path:
    """The export of family or variant ``name`` by ``exporter`` (a key of :data:`EXPORTERS`), made
    once per (diffusers and torch versions, exporter, source of every function the export runs)
    by :func:`cached_file`.
    """
    import diffusers
    import torch

    fam = ALL[name]
    funcs: list[Any] = [fam.build, export_family, _opset, _decompose_rms_norm, _Wrapper]
    funcs += [f for f in (fam.fixed, fam.prepare) if inspect.isfunction(f)]
    if fam.prepare is real_rope_lumina2:
        funcs.append(_lumina2_processor)
    if fam.build in (_minimax_rvq, _t5film):
        funcs.append(_tuple_out)
    if fam.prepare is _trained_like_lumina_next:
        funcs += [_trained_like, real_rope_lumina_next]
    base = {_chroma_guidance: _chroma, _sd35: _sd3}.get(fam.build)
    if base is not None:
        funcs.append(base)  # the variant only calls it
    return cached_file(f"{name}-{exporter}", [diffusers.__version__, torch.__version__, exporter,
                                               *(inspect.getsource(f) for f in funcs)],
                       lambda tmp: export_family(name, tmp, dynamo=exporter == "dynamo", opset=EXPORTERS[exporter]))


def cached_file(stem: str, key: list[str], make: Callable[[Path], object]) -> Path:
    """``<export root>/<stem>-<16 hex digits of sha256(key)>.onnx``, written by ``make(path)`` when absent.

    ``make`` writes to a private temporary name that is then renamed, so a failed or concurrent
    export never leaves a half-written file under the final name.  An external data file the
    exporter writes beside it keeps the name the model gives it.  Every test-model module
    (:mod:`tests.models.av_dit`, ``moe``, ``data_dependent``, ``structural``) caches through this.
    """
    root = export_root()
    path = root / f"{stem}-{hashlib.sha256(chr(0).join(key).encode()).hexdigest()[:16]}.onnx"
    if not path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                make(tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path
