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

:data:`LATEST_H4` -- issue 28's sweep, diffusers 0.42 classes (``WanAnimate2Transformer3DModel``:
:data:`NOT_EXPORTED`):

===============  =========================================  ===================================================
family           diffusers class                            what it exercises
===============  =========================================  ===================================================
ltx2             ``LTX2VideoTransformer3DModel``            video and audio streams in every block: self- and
                                                            text cross-attention each, audio-to-video and
                                                            video-to-audio cross-attention, FFN each
minimax_h3       ``MiniMaxH3Transformer3DModel``            token-refiner text blocks, then blocks over one
                                                            packed text + video + audio sequence (index_copy,
                                                            per-row AdaLN rows by index_select)
motif_video      ``MotifVideoTransformer3DModel``           dual-stream blocks with a text cross-attention
                                                            off the joint attention, single-stream encoder
                                                            blocks (cross-attention inside), decoder blocks
wan_animate      ``WanAnimateTransformer3DModel``           Wan I2V blocks, pose latents, a face motion
                                                            encoder and face-adapter cross-attention blocks
                                                            between the blocks (QR factor precomputed)
stable_audio3    ``StableAudio3DiTModel``                   differential self- and cross-attention, memory
                                                            tokens, partial RoPE
sana_wm          ``SanaWMTransformer3DModel``               camera-conditioned (UCPE) self-attention, gated
                                                            delta-net linear and softmax alternating, Plucker
                                                            embedding added per block; camera transforms as
                                                            inputs, real-form RoPE (:func:`_sana_wm_real_rope`)
sana_wm_refiner  ``SanaWMLTX2RefinerTransformer3DModel``    video-only LTX-2 blocks over one AR block,
                                                            self-attention over KV-cache inputs (sink, history)
===============  =========================================  ===================================================

:func:`export_family` writes one export; :func:`cached_export` makes it once per (diffusers and
torch versions, exporter, source of every function the export runs) under
``$RKPART_TEST_EXPORTS`` (default ``~/.cache/rkpart/test-exports``), so a rerun skips the
exporter.  Needs torch, diffusers and onnxscript (:func:`missing_dependencies`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
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


# --- LATEST_H4: diffusers 0.42 classes (LTX-2, MiniMax-H3, Motif-Video, Wan-Animate, Stable Audio 3) ---


def _ltx2() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import LTX2VideoTransformer3DModel

    m = LTX2VideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16,
                                    cross_attention_dim=32, audio_in_channels=8, audio_out_channels=8,
                                    audio_num_attention_heads=2, audio_attention_head_dim=16,
                                    audio_cross_attention_dim=32, num_layers=2, caption_channels=24)
    # the pipeline precomputes the RoPE coordinates once (rope.prepare_video_coords / prepare_audio_coords)
    video_coords = m.rope.prepare_video_coords(1, 1, 4, 4, torch.device("cpu"), fps=24.0)
    audio_coords = m.audio_rope.prepare_audio_coords(1, 6, torch.device("cpu"))
    return m, {
        "hidden_states": torch.randn(1, 16, 8),
        "audio_hidden_states": torch.randn(1, 6, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "audio_encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([700.0]),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
        "audio_encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
        "video_coords": video_coords.float(),
        "audio_coords": audio_coords.float(),
    }


def _ltx2_fixed() -> dict[str, Any]:
    return {"num_frames": 1, "height": 4, "width": 4, "fps": 24.0, "audio_num_frames": 6}


def _minimax_h3() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import MiniMaxH3Transformer3DModel

    m = MiniMaxH3Transformer3DModel(num_attention_heads=2, attention_head_dim=16, hidden_size=32, num_layers=2,
                                    num_refiner_layers=2, ffn_dim=64, in_channels=4, audio_in_channels=8,
                                    patch_size=(1, 2, 2), text_dim=24, freq_dim=32, time_embed_hidden_dim=32,
                                    time_embed_dim=32, rope_freq_dim=2)
    return m, {
        "hidden_states": torch.randn(1, 16, 16),  # one 4 x 4 latent frame, patchified
        "audio_hidden_states": torch.randn(1, 4, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([0.7]),
    }


def _minimax_h3_fixed() -> dict[str, Any]:
    """The packed layout (6 text rows, 16 video rows, 4 audio rows): the caller builds it from the static
    shapes once per resolution, so its index tensors are constants, not graph inputs."""
    import torch

    text, video, audio = 6, 16, 4
    seq = text + video + audio
    pos = torch.zeros(seq, 3, dtype=torch.int64)
    pos[text:text + video, 1] = torch.arange(video) // 4
    pos[text:text + video, 2] = torch.arange(video) % 4
    pos[text + video:, 0] = torch.arange(audio)
    return {
        "timestep_indices": torch.zeros(seq, dtype=torch.int64),
        "token_tags": torch.tensor([1] * text + [0] * video + [2] * audio),
        "position_ids": pos,
        "video_indices": torch.arange(text, text + video),
        "audio_indices": torch.arange(text + video, seq),
        "text_indices": torch.arange(text),
    }


def _motif_video() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import MotifVideoTransformer3DModel

    m = MotifVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                                     num_layers=2, num_single_layers=4, num_decoder_layers=2, mlp_ratio=2.0,
                                     patch_size=2, patch_size_t=1, text_embed_dim=24, rope_axes_dim=(4, 6, 6),
                                     enable_text_cross_attention_dual=True, enable_text_cross_attention_single=True)
    return m, {
        "hidden_states": torch.randn(1, 4, 2, 8, 8),
        "timestep": torch.tensor([700.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
    }


def _wan_animate() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import WanAnimateTransformer3DModel

    m = WanAnimateTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                     in_channels=12, latent_channels=4, out_channels=4, text_dim=24, freq_dim=32,
                                     ffn_dim=64, num_layers=4, image_dim=16, added_kv_proj_dim=32,
                                     rope_max_seq_len=32, motion_encoder_channel_sizes={"8": 8, "4": 8},
                                     motion_encoder_size=8, motion_style_dim=16, motion_dim=4, motion_encoder_dim=16,
                                     face_encoder_hidden_dim=16, face_encoder_num_heads=2,
                                     inject_face_latents_blocks=2)
    return m, {
        "hidden_states": torch.randn(1, 12, 3, 8, 8),
        "timestep": torch.tensor([7.0]),
        # the I2V cross-attention splits text from image tokens at a hard-coded text length of 512
        "encoder_hidden_states": torch.randn(1, 512, 24),
        "encoder_hidden_states_image": torch.randn(1, 4, 16),
        "pose_hidden_states": torch.randn(1, 4, 2, 8, 8),
        "face_pixel_values": torch.randn(1, 3, 5, 8, 8),
    }


def _static_motion_qr(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Wan-Animate's motion encoder with the QR factor of its weight computed once (asserted equal).

    ``WanAnimateMotionEncoder`` orthogonalises a parameter on every call (``torch.linalg.qr(weight)``):
    neither exporter converts ``aten::linalg_qr`` (TorchScript: "not supported", dynamo: a
    ConversionError on the node).  The factor depends only on the weights, so it is computed here and
    held as a buffer.  TorchScript has no ``aten::diag_embed`` either: ``diag_embed(f) @ Q.T`` (row ``j``
    of ``Q.T`` scaled by ``f[j]``) is written as the broadcast product ``f[..., None] * Q.T``, summed
    over ``j`` as diffusers sums it.  Every other step of the forward is diffusers' own.
    """
    import types

    import torch

    enc = model.motion_encoder
    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
        q = torch.linalg.qr((enc.motion_synthesis_weight + 1e-8).to(torch.float32))[0]
    enc.register_buffer("motion_q", q.contiguous(), persistent=False)

    def forward(self: Any, face_image: torch.Tensor, channel_dim: int = 1) -> torch.Tensor:
        face_image = self.conv_in(face_image, channel_dim)
        for block in self.res_blocks:
            face_image = block(face_image, channel_dim)
        face_image = self.conv_out(face_image, channel_dim)
        motion_feat = face_image.squeeze(-1).squeeze(-1)
        for linear_layer in self.motion_network:
            motion_feat = linear_layer(motion_feat, channel_dim=channel_dim)
        original_motion_dtype = motion_feat.dtype
        motion_feat = motion_feat.to(torch.float32)
        # diag_embed(feat) @ Q.T scales row j of Q.T by feat[j]: the same products, broadcast
        motion_decomposition = motion_feat.unsqueeze(-1) * self.motion_q.T
        return torch.sum(motion_decomposition, dim=1).to(dtype=original_motion_dtype)

    enc.forward = types.MethodType(forward, enc)
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


def _sana_wm() -> tuple[Any, dict[str, Any]]:
    import numpy as np
    import torch
    from diffusers import SanaWMTransformer3DModel
    from diffusers.pipelines.sana_wm.cam_utils import prepare_camera

    # 4 blocks: gated-delta-net linear attention and softmax attention alternating (softmax_every_n=2)
    m = SanaWMTransformer3DModel(in_channels=4, num_layers=4, hidden_size=32, num_attention_heads=2,
                                 softmax_every_n=2, linear_head_dim=16, caption_channels=24,
                                 chunk_plucker_post_attn_blocks=4, mlp_ratio=2.0)
    # the pipeline's camera inputs for 9 pixel frames (2 latent frames of 4 x 4) moving along x
    c2w = np.tile(np.eye(4, dtype=np.float32), (9, 1, 1))
    c2w[:, 0, 3] = np.linspace(0.0, 1.0, 9)
    cam = prepare_camera(c2w, np.tile(np.array([[50.0, 50.0, 32.0, 32.0]], dtype=np.float32), (9, 1)),
                         target_size=(64, 64), vae_stride=(8, 16, 16))
    return m, {
        "hidden_states": torch.randn(1, 4, 2, 4, 4),
        "timestep": torch.full((1, 1, 2), 700.0),
        "encoder_hidden_states": torch.randn(1, 1, 6, 24),
        "mask": torch.ones(1, 6, dtype=torch.int64),
        "camera_conditions": cam["raymap"].unsqueeze(0),
        "chunk_plucker": cam["chunk_plucker"].unsqueeze(0),
    }


def _sana_wm_real_rope(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """SANA-WM with its camera transforms and RoPE precomputed, the RoPE in the real form (asserted equal).

    The forward derives UCPE ray matrices from the raw camera conditions (``torch.rad2deg``, no
    TorchScript symbolic) and rotates by complex RoPE frequencies (``view_as_complex``; dynamo cannot
    convert the complex table).  The forward also takes them precomputed (``cam_pos_embeds`` with
    ``absmap``, ``P``, ``P_inv``; ``pos_embeds``), as a pipeline reusing them across steps passes them:
    ``P`` and ``P_inv`` (per video) become graph inputs, the RoPE table (static shapes) a constant
    held as stacked ``(cos, sin)``.  diffusers' ``_apply_rotary_emb`` and ``_apply_ucpe_transform``
    are wrapped to apply a stacked table in the real form (``re*c - im*s, re*s + im*c`` per pair; the
    inverse rotation negates ``s``) and to call the originals on complex tables, so other models are
    unaffected.
    """
    import types

    import torch
    from diffusers.models.transformers import transformer_sana_wm as tsw

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
    cam = inputs.pop("camera_conditions")
    _, _, f, h, w = inputs["hidden_states"].shape
    raymats, absmap = tsw._process_camera_conditions_ucpe(cam, cam.shape[0], (f, h, w), model.patch_size)
    p = raymats.reshape(cam.shape[0], -1, 4, 4)
    inputs["cam_p"], inputs["cam_p_inv"] = p, tsw._invert_SE3(p)
    freqs = model.rope((f, h, w), device=torch.device("cpu"))
    fixed["pos_embeds"] = torch.stack([freqs.real, freqs.imag]).float().unsqueeze(1)  # (2, 1, 1, N, D/2)
    fixed["camera_conditions"] = cam  # only tested for None and for its batch size once P is given
    fixed["cam_absmap"] = absmap.permute(0, 4, 1, 2, 3)
    rotary, ucpe = tsw._apply_rotary_emb, tsw._apply_ucpe_transform

    def pairs(x: torch.Tensor, table: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        cos, sin = table[0], -table[1] if inverse else table[1]
        x = x.to(torch.float32).unflatten(-1, (-1, 2))
        re, im = x[..., 0], x[..., 1]
        return torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).flatten(-2, -1)

    def real_rotary(hidden_states: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        if freqs.is_complex():
            return rotary(hidden_states, freqs)
        return pairs(hidden_states.permute(0, 1, 3, 2), freqs).permute(0, 1, 3, 2).type_as(hidden_states)

    def real_ucpe(feats: torch.Tensor, matrix: torch.Tensor, rotary_emb: Any = None,
                  inverse_rope: bool = False) -> torch.Tensor:
        if rotary_emb is None or rotary_emb.is_complex():
            return ucpe(feats, matrix, rotary_emb, inverse_rope)
        batch, num_heads, seq_len, head_dim = feats.shape
        projected, rotated = feats.split(head_dim // 2, dim=-1)
        projected = torch.einsum("bnij,bhnkj->bhnki", matrix,
                                 projected.reshape(batch, num_heads, seq_len, -1, matrix.shape[-1]))
        projected = projected.reshape(batch, num_heads, seq_len, head_dim // 2)
        return torch.cat([projected, pairs(rotated, rotary_emb, inverse_rope).type_as(rotated)], dim=-1)

    tsw._apply_rotary_emb, tsw._apply_ucpe_transform = real_rotary, real_ucpe
    forward = model.forward

    def forward_precomputed(self: Any, hidden_states: Any, timestep: Any, encoder_hidden_states: Any, mask: Any,
                            chunk_plucker: Any, cam_p: Any, cam_p_inv: Any, pos_embeds: Any, camera_conditions: Any,
                            cam_absmap: Any, return_dict: bool = True) -> Any:
        return forward(hidden_states, timestep, encoder_hidden_states, mask=mask, chunk_plucker=chunk_plucker,
                       camera_conditions=camera_conditions, pos_embeds=pos_embeds, return_dict=return_dict,
                       cam_pos_embeds={"absmap": cam_absmap, "P": cam_p, "P_inv": cam_p_inv})

    model.forward = types.MethodType(forward_precomputed, model)
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-4, atol=1e-5)


def _sana_wm_refiner() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import SanaWMLTX2RefinerTransformer3DModel

    m = SanaWMLTX2RefinerTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16,
                                            cross_attention_dim=32, audio_in_channels=8, audio_out_channels=8,
                                            audio_num_attention_heads=2, audio_attention_head_dim=16,
                                            audio_cross_attention_dim=32, num_layers=2, caption_channels=24)
    # a denoising step of one AR block (2 latent frames of 4 x 4) against the KV cache of 1 sink frame and
    # 1 frame of refined history, per layer (layers, batch, tokens, inner dim): the cache is state the
    # previous forwards wrote, so it enters as graph inputs (_refiner_kv_cache)
    return m, {
        "hidden_states": torch.randn(1, 32, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.full((1, 32), 700.0),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
        "sink_k_pre": torch.randn(2, 1, 16, 32),
        "sink_v": torch.randn(2, 1, 16, 32),
        "history_k": torch.randn(2, 1, 16, 32),
        "history_v": torch.randn(2, 1, 16, 32),
    }


def _refiner_kv_cache(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """The SANA-WM refiner's ``kv_cache_mode="inject"`` step with its cache as tensors.

    The refiner reads the sink and history K/V of every layer from a ``SanaWMRefinerKVCache`` object
    and takes the active block's RoPE as a ``(cos, sin)`` tuple.  ``forward`` is wrapped to build the
    cache from stacked ``(layers, batch, tokens, inner)`` inputs; the RoPE tables (the active block at
    frames 2-3, the sink shifted to sit just before the one history frame, as the pipeline places it)
    depend only on static positions and become constants, made by the model's own
    ``build_rotary_emb_for_absolute_positions``.
    """
    import types

    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMRefinerKVCache

    rope = model.build_rotary_emb_for_absolute_positions
    fixed["video_rotary_emb"] = rope(batch_size=1, frame_positions=[2, 3], height=4, width=4, device="cpu",
                                     fps=24.0)
    sink_pe = rope(batch_size=1, frame_positions=[0], height=4, width=4, device="cpu", fps=24.0)
    forward = model.forward

    def forward_with_cache(self: Any, hidden_states: Any, encoder_hidden_states: Any, timestep: Any,
                           encoder_attention_mask: Any, sink_k_pre: Any, sink_v: Any, history_k: Any, history_v: Any,
                           video_rotary_emb: Any, return_dict: bool = True) -> Any:
        cache = SanaWMRefinerKVCache(len(self.transformer_blocks))
        cache.sink_pe = sink_pe
        for i in range(len(self.transformer_blocks)):
            cache.get(i).store_sink(sink_k_pre[i], sink_v[i])
            cache.get(i).store_history(history_k[i], history_v[i])
        return forward(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, timestep=timestep,
                       video_rotary_emb=video_rotary_emb, encoder_attention_mask=encoder_attention_mask,
                       kv_cache=cache, kv_cache_mode="inject", return_dict=return_dict)

    model.forward = types.MethodType(forward_with_cache, model)


def _stable_audio3() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import StableAudio3DiTModel

    m = StableAudio3DiTModel(io_channels=4, embed_dim=32, depth=2, num_heads=2, cond_token_dim=24, global_cond_dim=24,
                             local_add_cond_dim=8, timestep_features_dim=16, ff_mult=2.0, num_memory_tokens=4)
    return m, {
        "hidden_states": torch.randn(1, 4, 16),
        "timestep": torch.tensor([0.7]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "global_hidden_states": torch.randn(1, 24),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
    }


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
#: issue 28's sweep, diffusers 0.42 classes: LTX2VideoTransformer3DModel, MiniMaxH3Transformer3DModel,
#: MotifVideoTransformer3DModel, WanAnimateTransformer3DModel, StableAudio3DiTModel, SanaWMTransformer3DModel,
#: SanaWMLTX2RefinerTransformer3DModel (WanAnimate2Transformer3DModel: :data:`NOT_EXPORTED`)
LATEST_H4: dict[str, Family] = {f.name: f for f in (
    Family("ltx2", _ltx2, _ltx2_fixed),  # video + audio streams in every block, a2v / v2a cross-attention
    # 2 token-refiner text blocks run before the 2 blocks over the packed text + video + audio sequence
    Family("minimax_h3", _minimax_h3, _minimax_h3_fixed, blocks=4),
    # 2 dual-stream blocks, 2 single-stream encoder blocks, 2 single-stream decoder blocks (all but the decoder
    # with text cross-attention)
    Family("motif_video", _motif_video, blocks=6),
    # 4 blocks and the face adapter's cross-attention after blocks 0 and 2 (face_adapter.N: blocks of their own,
    # as their module names make them); the motion encoder's QR factor computed once
    Family("wan_animate", _wan_animate, blocks=6, prepare=_static_motion_qr),
    Family("stable_audio3", _stable_audio3, prepare=_trained_like),  # zero-initialised in/out convs
    # 4 blocks: gated-delta-net linear and softmax camera (UCPE) self-attention alternating; camera transforms and
    # RoPE precomputed, RoPE in the real form (_sana_wm_real_rope)
    Family("sana_wm", _sana_wm, blocks=4, prepare=_sana_wm_real_rope),
    # LTX-2 blocks run video-only over one AR block, self-attention over [sink, history, block] K/V
    Family("sana_wm_refiner", _sana_wm_refiner, prepare=_refiner_kv_cache),
)}
#: classes of ``diffusers.models.transformers`` not in the sweep, and why (diffusers 0.42 / torch 2.13)
NOT_EXPORTED: dict[str, str] = {
    "MochiTransformer3DModel": "exports, but the masked text pooling leaves shapes dynamic (rkpart exit 3)",
    "ZImageTransformer2DModel": "forward takes lists of per-sample tensors (x, cap_feats): not wrapped yet",
    "EasyAnimateTransformer3DModel": "TorchScript: int(round(tensor)) in the RoPE grid crop (not tried with dynamo)",
    "LuminaNextDiT2DModel": "the tiny config's eager forward fails (TypeError in attn1 with the given RoPE)",
    "QwenImageTransformer2DModel": "complex RoPE: TorchScript has no aten::view_as_complex, dynamo fails to "
                                   "convert the complex product (config kept: _qwenimage)",
    "WanAnimate2Transformer3DModel": "the denoising pass (kv_cache_mode='cached') is flex attention over a compiled "
                                     "BlockMask: TorchScript refuses to jit.trace a dynamo-optimized function, "
                                     "torch.export fails with 'unhashable type: non-nested SymInt'; lists, a KV-cache "
                                     "object and complex float64 RoPE in the forward besides",
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
ALL: dict[str, Family] = {**FAMILIES, **VARIANTS, **NEWER, **LATEST_H4, **SIZED}


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
