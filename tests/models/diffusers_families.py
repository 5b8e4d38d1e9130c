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

:data:`LATEST_H1` -- diffusers 0.42 classes of the h1 sweep (every one exports with both exporters):

=============  ==================================  ================================================
family         diffusers class                     what it exercises
=============  ==================================  ================================================
bria_fibo      ``BriaFiboTransformer2DModel``      Flux anatomy; each block's text half re-made from
                                                   its own text-encoder layer (a list input,
                                                   flattened by :func:`_list_inputs`)
bria_fibo2     ``BriaFibo2Transformer2DModel``     noise refiner, a Perceiver whose gist tokens
                                                   (a constant-rooted stream) read the text, then
                                                   blocks with one injection cross-attention;
                                                   complex RoPE made real (:func:`_real_rope_fibo2`)
ernie_image    ``ErnieImageTransformer2DModel``    sequence-first single stream, one adaLN
                                                   modulation shared by every block, text lengths
                                                   as an input (RoPE offset, mask)
glm_image      ``GlmImageTransformer2DModel``      CogView4 anatomy with AR prior codes
                                                   (embedding + drop mask, :func:`_glm_prior_where`)
hidream_image  ``HiDreamImageTransformer2DModel``  dual- then single-stream blocks each reading its
                                                   own Llama layer; top-2 MoE image FFNs (dense
                                                   form, :func:`_dense_moe`)
hunyuanimage   ``HunyuanImageTransformer2DModel``  token-refiner text blocks, then dual- and
                                                   single-stream blocks (no ByT5 glyph stream)
dreamlite      ``DreamLiteTransformer2DModel``     a U-Net's spatial transformer: GroupNorm + conv
                                                   projections around pre-LN blocks, GQA + qk-norm
=============  ==================================  ================================================

:data:`LATEST_H2` -- the sweep continued with classes of diffusers 0.42 (each ``prepare`` asserts the patched
model equal to diffusers' own on the example inputs):

==================  =======================================  ==========================================
family              diffusers class                          what it exercises
==================  =======================================  ==========================================
ideogram4           ``Ideogram4Transformer2DModel``          one packed text + image sequence with a
                                                             role indicator, interleaved 3-axis MRoPE
                                                             (written as ``torch.where`` for
                                                             TorchScript), segment mask
krea2               ``Krea2Transformer2DModel``              text fusion (layer-wise blocks across the
                                                             tapped encoder layers, token refiners),
                                                             then single-stream blocks; sigmoid-gated
                                                             GQA attention
nucleus_moe         ``NucleusMoEImageTransformer2DModel``    a dense block, then expert-choice MoE
                                                             blocks (router, top-k, gather, experts,
                                                             scatter-add, shared expert); image
                                                             queries over image + text keys
omnigen             ``OmniGenTransformer2DModel``            a Phi-3 decoder over text, time token and
                                                             image (causal text, bidirectional image)
qwenimage21         ``QwenImage21Transformer2DModel``        single-stream blocks, one shared
                                                             modulation, block-causal attention as one
                                                             SDPA per segment (static layout)
zimage              ``ZImageTransformer2DModel``             list inputs (built from batch-1 tensors),
                                                             noise and context refiners, then joint
                                                             blocks
joyimage_edit       ``JoyImageEditTransformer3DModel``       dual-stream blocks over reference +
                                                             target items; last text FFN dead
joyimage_edit_plus  ``JoyImageEditPlusTransformer3DModel``   the same over padded patch sequences of
                                                             several images, a key-padding mask
==================  =======================================  ==========================================

:data:`LATEST_H3` -- diffusers 0.42 classes of helper h3's share of the sweep:

======================  ==========================================  ==========================================
family                  diffusers class                             what it exercises
======================  ==========================================  ==========================================
consisid                ``ConsisIDTransformer3DModel``              CogVideoX blocks + the identity branch: a
                                                                    perceiver resampler over face features,
                                                                    perceiver cross-attention after every
                                                                    second block
hunyuanvideo_framepack  ``HunyuanVideoFramepackTransformer3DModel`` HunyuanVideo with 1x / 2x / 4x history
                                                                    latents and an image projection in the
                                                                    stream; the text cut to the mask's length
hunyuanvideo15          ``HunyuanVideo15Transformer3DModel``        token refiner, then dual-stream blocks over
                                                                    masked-packed image + ByT5 + MLLM tokens
helios                  ``HeliosTransformer3DModel``                Wan anatomy with short / mid / long history
                                                                    tokens; cross-attention of the current
                                                                    chunk only (split and concat per block)
kandinsky6              ``Kandinsky6Transformer3DModel``            per-modality text blocks, then fused video
                                                                    + audio blocks with cross-modal attention
kandinsky6_sr           ``Kandinsky6SRTransformer3DModel``          NABLA block-sparse attention (data-dependent
                                                                    block mask) in dense form
                                                                    (:func:`dense_nabla_kandinsky6_sr`)
anyflow                 ``AnyFlowTransformer3DModel``               Wan anatomy, two timesteps (t, r); complex
                                                                    RoPE in real form (:func:`real_rope_anyflow`)
anyflow_far             ``AnyFlowFARTransformer3DModel``            a cached autoregressive step: KV caches as
                                                                    inputs, flex attention as SDPA, real RoPE
                                                                    (:func:`dense_far_step`)
cosmos3                 ``Cosmos3OmniTransformer``                  mixture of transformers over one packed
                                                                    sequence: causal text stream, video stream
                                                                    attending over both, per-stream MLPs, GQA
======================  ==========================================  ==========================================

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


def _consisid() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import ConsisIDTransformer3DModel

    # is_train_face: the identity branch the ConsisID checkpoint has (a perceiver resampler over face features,
    # then a perceiver cross-attention after every cross_attn_interval-th block)
    m = ConsisIDTransformer3DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                                   time_embed_dim=32, text_embed_dim=24, num_layers=4, sample_width=8,
                                   sample_height=8, sample_frames=1, patch_size=2, max_text_seq_length=6,
                                   is_train_face=True, cross_attn_interval=2, cross_attn_dim_head=16,
                                   cross_attn_num_heads=2, LFE_id_dim=24, LFE_vit_dim=16, LFE_depth=2,
                                   LFE_dim_head=8, LFE_num_heads=2, LFE_num_id_token=2, LFE_num_querie=4,
                                   LFE_output_dim=21, LFE_ff_mult=2, LFE_num_scale=2)
    return m, {
        "hidden_states": torch.randn(1, 1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7], dtype=torch.int64),
        "id_cond": torch.randn(1, 24),
        # the per-scale ViT features stacked: the forward iterates over its first dim (a list in the pipeline)
        "id_vit_hidden": torch.randn(2, 1, 5, 16),
    }


def _hunyuanvideo_framepack() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    m = HunyuanVideoFramepackTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                                attention_head_dim=16, num_layers=2, num_single_layers=2,
                                                num_refiner_layers=2, patch_size=2, patch_size_t=1,
                                                guidance_embeds=True, text_embed_dim=24, pooled_projection_dim=16,
                                                rope_axes_dim=(4, 6, 6), has_image_proj=True, image_proj_dim=16,
                                                has_clean_x_embedder=True)
    # the pipeline's vanilla sampling: prefix, 4x / 2x / 1x history, then the window (frame indices 0..8)
    return m, {
        "hidden_states": torch.randn(1, 4, 2, 8, 8),
        "timestep": torch.tensor([700], dtype=torch.int64),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
        "pooled_projections": torch.randn(1, 16),
        "image_embeds": torch.randn(1, 4, 16),
        "indices_latents": torch.tensor([7, 8]),
        "guidance": torch.tensor([6000.0]),
        "latents_clean": torch.randn(1, 4, 2, 8, 8),
        "indices_latents_clean": torch.tensor([0, 6]),
        "latents_history_2x": torch.randn(1, 4, 2, 8, 8),
        "indices_latents_history_2x": torch.tensor([4, 5]),
        "latents_history_4x": torch.randn(1, 4, 3, 8, 8),
        "indices_latents_history_4x": torch.tensor([1, 2, 3]),
    }


def _hunyuanvideo15() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel

    m = HunyuanVideo15Transformer3DModel(in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                                         num_layers=2, num_refiner_layers=2, patch_size=1, patch_size_t=1,
                                         text_embed_dim=24, text_embed_2_dim=16, image_embed_dim=16,
                                         rope_axes_dim=(4, 6, 6))
    return m, {
        "hidden_states": torch.randn(1, 9, 1, 4, 4),
        "timestep": torch.tensor([700.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
        "encoder_hidden_states_2": torch.randn(1, 4, 16),
        "encoder_attention_mask_2": torch.ones(1, 4, dtype=torch.int64),
        "image_embeds": torch.randn(1, 3, 16),
    }


def _helios() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import HeliosTransformer3DModel

    m = HeliosTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                                 out_channels=4, text_dim=24, freq_dim=32, ffn_dim=64, num_layers=2,
                                 rope_dim=(4, 6, 6))
    # the pipeline's frame indices ([1, T] each): long / mid / short history, then the chunk being denoised
    return m, {
        "hidden_states": torch.randn(1, 4, 2, 8, 8),
        "timestep": torch.tensor([700.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "indices_hidden_states": torch.tensor([[7, 8]]),
        "indices_latents_history_short": torch.tensor([[5, 6]]),
        "indices_latents_history_mid": torch.tensor([[3, 4]]),
        "indices_latents_history_long": torch.tensor([[0, 1, 2, 2]]),
        "latents_history_short": torch.randn(1, 4, 2, 8, 8),
        "latents_history_mid": torch.randn(1, 4, 2, 8, 8),
        "latents_history_long": torch.randn(1, 4, 4, 8, 8),
    }


def _kandinsky6() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Kandinsky6Transformer3DModel

    # the released checkpoints' flags (ca_rope, cross_gates, fix_modulation); video and audio denoised together
    m = Kandinsky6Transformer3DModel(in_visual_dim=4, out_visual_dim=4, in_text_dim=24, in_text_dim2=16, time_dim=32,
                                     patch_size=(1, 2, 2), model_dim=32, ff_dim=64, num_text_blocks=2,
                                     num_visual_blocks=2, axes_dims=(4, 6, 6), in_audio_dim=8, out_audio_dim=8,
                                     text_token_padding=True, ca_rope=True, cross_gates=True, fix_modulation=True)
    return m, {
        "hidden_states": torch.randn(1, 1, 8, 8, 9),  # noisy latent, conditioning latent, conditioning mask
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "pooled_projections": torch.randn(1, 16),
        "timestep": torch.tensor([700.0]),
        "audio_hidden_states": torch.randn(1, 5, 8),
    }


def _kandinsky6_sr() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Kandinsky6SRTransformer3DModel

    # NABLA attention needs a token grid divisible by 8: three 8x8 frames, one 64-token tile each; a sliding-tile
    # prior of the tile itself only (the default window would cover every tile of so small a grid), so that the
    # data-dependent block selection decides
    m = Kandinsky6SRTransformer3DModel(in_visual_dim=4, out_visual_dim=4, time_dim=32, patch_size=(1, 1, 1),
                                       model_dim=32, ff_dim=64, num_visual_blocks=2, axes_dims=(4, 6, 6),
                                       nabla_window=(1, 1, 1))
    return m, {
        "hidden_states": torch.randn(1, 3, 8, 8, 9),
        "timestep": torch.tensor([700.0]),
    }


def dense_nabla_kandinsky6_sr(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Kandinsky 6 SR's NABLA attention in dense form, asserted equal to diffusers' own.

    diffusers runs the self-attention through flex attention with a ``BlockMask`` it builds from
    the queries' and keys' block means (``nabla_block_mask``: softmax of the block means, the
    blocks whose sorted cumulative share passes the threshold, or'ed with the sliding-tile prior):
    TorchScript fails in flex attention's vmap ("Unsupported value kind: Tensor") and the dynamo
    exporter cannot convert the ``BlockMask``'s ``argsort`` (``aten::sort.stable``).  Flex
    attention over a block mask of full blocks is ordinary attention with that block mask
    expanded to tokens: the same selection (sort, cumsum, threshold, put back in block order) is
    computed here and the dense boolean mask goes to ``scaled_dot_product_attention``.  The
    patched model's output on the example inputs must equal the unpatched model's (within 1e-5).
    """
    import math

    import torch
    import torch.nn.functional as F
    from diffusers.models.transformers.transformer_kandinsky6_sr import (
        Kandinsky6SRAttnProcessor,
        apply_rotary,
    )

    block = 64  # nabla_block_mask's default block_size, as the processor calls it

    class DenseNablaProcessor(Kandinsky6SRAttnProcessor):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, rotary_emb: torch.Tensor,
                     sparse_params: dict[str, Any]) -> torch.Tensor:
            query = attn.to_query(hidden_states).unflatten(-1, (attn.num_heads, -1))
            key = attn.to_key(hidden_states).unflatten(-1, (attn.num_heads, -1))
            value = attn.to_value(hidden_states).unflatten(-1, (attn.num_heads, -1))
            query = attn.query_norm(query.float()).type_as(query)
            key = attn.key_norm(key.float()).type_as(key)
            q, k, v = (t.transpose(1, 2) for t in (apply_rotary(query, rotary_emb), apply_rotary(key, rotary_emb),
                                                   value))
            b, h, s, d = q.shape
            qa = q.reshape(b, h, s // block, block, d).mean(-2)
            ka = k.reshape(b, h, s // block, block, d).mean(-2).transpose(-2, -1)
            attn_map = torch.softmax((qa @ ka) / math.sqrt(d), dim=-1)
            vals, inds = attn_map.sort(-1)
            picked = (vals.cumsum(-1) >= 1 - sparse_params["threshold"]).int()
            mask = torch.zeros_like(picked).scatter(-1, inds, picked)  # back to block order
            mask = torch.logical_or(mask, sparse_params["sta_mask"])
            dense = mask.repeat_interleave(block, dim=-1).repeat_interleave(block, dim=-2)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
            return attn.out_layer(out.transpose(1, 2).flatten(2, 3))

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
    for module in model.modules():
        if type(getattr(module, "processor", None)) is Kandinsky6SRAttnProcessor:
            module.set_processor(DenseNablaProcessor())
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


def _anyflow() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import AnyFlowTransformer3DModel

    m = AnyFlowTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                                  out_channels=4, text_dim=24, freq_dim=32, ffn_dim=64, num_layers=2,
                                  rope_max_seq_len=32)
    # (B, F, C, H, W) latents; per-frame source and target timesteps t and r
    return m, {
        "hidden_states": torch.randn(1, 2, 4, 8, 8),
        "timestep": torch.tensor([[700.0, 700.0]]),
        "r_timestep": torch.tensor([[500.0, 500.0]]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
    }


def _anyflow_far() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import AnyFlowFARTransformer3DModel

    # an autoregressive step of the pipeline: chunks of 1 frame, 2 already denoised and cached (the older one in
    # the FAR-compressed cache: full_chunk_limit=2), the third being denoised; 8x8 latents: 16 full tokens and 4
    # compressed tokens a frame
    m = AnyFlowFARTransformer3DModel(patch_size=(1, 2, 2), compressed_patch_size=(1, 4, 4), full_chunk_limit=2,
                                     num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                                     text_dim=24, freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=32,
                                     chunk_partition=(1, 1, 1))
    return m, {
        "hidden_states": torch.randn(1, 1, 4, 8, 8),
        "timestep": torch.tensor([[700.0]]),
        "r_timestep": torch.tensor([[500.0]]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        # the pipeline's per-layer KV caches, stacked over layers: [layer, k/v, batch, heads, tokens, head_dim]
        "full_cache": torch.randn(2, 2, 1, 2, 32, 16),
        "compressed_cache": torch.randn(2, 2, 1, 2, 8, 16),
    }


def dense_far_step(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """AnyFlow FAR's cached autoregressive step in an exportable form, asserted equal to diffusers' own.

    Three rewrites of the same function: (1) the forward takes the KV caches (a dict of dicts of
    tensors per layer, and a ``kv_cache_flag`` dict the forward mutates) as two stacked tensors and
    returns the prediction only; (2) the complex RoPE (``view_as_complex``, complex128: neither
    exporter converts it) becomes the real ``x * cos + rot(x) * sin`` with tables computed once
    from the model's own frequencies for this step's static layout; (3) the causal self-attention
    the processor runs through flex attention without a mask (the step reads the caches; queries,
    keys and values zero-padded to a multiple of 128 tokens, the padding keys taking part in the
    softmax, as diffusers computes it) runs through ``scaled_dot_product_attention`` on the same
    padded tensors.  The patched model's output must equal the unpatched model's (within 1e-5).
    """
    import math

    import torch
    import torch.nn.functional as F
    from diffusers.models.transformers.transformer_anyflow_far import AnyFlowCausalAttnProcessor

    partition, cached = [1, 1, 1], 2
    forward = model.forward

    def step(*, full_cache: torch.Tensor, compressed_cache: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor]:
        kv_cache = [{"full_cache": full_cache[i], "compressed_cache": compressed_cache[i]}
                    for i in range(full_cache.shape[0])]
        out = forward(chunk_partition=partition, kv_cache=kv_cache,
                      kv_cache_flag={"num_cached_chunks": cached, "is_cache_step": False}, **kwargs)
        return (out[0],)

    model.forward = step
    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]

    # the step's RoPE tables: the layout _forward_inference gives the rope module
    _, _, _, height, width = inputs["hidden_states"].shape
    cfg = model.config
    limit = cfg.full_chunk_limit
    compressed = sum(partition[:len(partition) - limit]) if len(partition) >= limit else 0
    full, small = cfg.patch_size, cfg.compressed_patch_size
    far_cfg = {"total_frames": sum(partition), "num_compressed_frames": compressed,
               "full_frame_shape": (height // full[1], width // full[2]),
               "compressed_frame_shape": (height // small[1], width // small[2])}
    freqs = model.rope(far_cfg=far_cfg, device=torch.device("cpu"))["key"]  # [1, 1, S, D/2] complex
    table = torch.stack([freqs.real.repeat_interleave(2, dim=-1), freqs.imag.repeat_interleave(2, dim=-1)],
                        dim=-1).float().contiguous()  # [1, 1, S, D, 2]: cos, sin

    class StaticRealRope(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", table, persistent=False)

        def forward(self, far_cfg: Any, device: Any, clean_hidden_states: Any = None) -> dict[str, torch.Tensor]:
            return {"query": self.table, "key": self.table}

    def rotate(x: torch.Tensor, tab: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
        return (x.float() * tab[..., 0] + rot.float() * tab[..., 1]).type_as(x)

    class DenseCausalProcessor(AnyFlowCausalAttnProcessor):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None,
                     attention_mask: Any = None, rotary_emb: Any = None, kv_cache: Any = None,
                     kv_cache_flag: Any = None) -> torch.Tensor:
            query = attn.to_q(hidden_states)
            key = attn.to_k(hidden_states)
            value = attn.to_v(hidden_states)
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            query = query.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            key = key.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            value = value.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            nc, nf = kv_cache_flag["num_cached_compressed_tokens"], kv_cache_flag["num_cached_full_tokens"]
            key = torch.cat([kv_cache["compressed_cache"][0, :, :, :nc], kv_cache["full_cache"][0, :, :, :nf], key],
                            dim=2)
            value = torch.cat([kv_cache["compressed_cache"][1, :, :, :nc], kv_cache["full_cache"][1, :, :, :nf],
                               value], dim=2)
            query = rotate(query, rotary_emb["query"])
            key = rotate(key, rotary_emb["key"])
            seq_len, head_dim = query.shape[2], query.shape[3]
            pad = int(math.ceil(seq_len / 128.0) * 128.0 - seq_len)
            if pad > 0:
                query, key, value = (torch.cat([t, t.new_zeros(t.shape[0], t.shape[1], pad, head_dim)], dim=2)
                                     for t in (query, key, value))
            assert head_dim >= 16, "the processor's head padding to 16 is not reproduced"
            out = F.scaled_dot_product_attention(query, key, value)[:, :, :seq_len]
            out = out.transpose(1, 2).flatten(2, 3).type_as(query)
            return attn.to_out[1](attn.to_out[0](out))

    model.rope = StaticRealRope()
    for module in model.modules():
        if type(getattr(module, "processor", None)) is AnyFlowCausalAttnProcessor:
            module.set_processor(DenseCausalProcessor())
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


def _cosmos3() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Cosmos3OmniTransformer

    # a packed sequence (no batch dim): 4 causal text tokens (the "understanding" stream), then one video of 2
    # latent frames of 2x2 patches (the "generation" stream), frame 0 the image condition, frame 1 noisy
    m = Cosmos3OmniTransformer(head_dim=16, hidden_size=32, intermediate_size=64, latent_channel=4,
                               latent_patch_size=2, num_attention_heads=2, num_hidden_layers=2, num_key_value_heads=1,
                               patch_latent_dim=16, vocab_size=64, rope_axes_dim=(2, 3, 3))
    text = torch.arange(4, dtype=torch.float32)
    t, hw = torch.arange(2).repeat_interleave(4).float() + 20.0, torch.arange(4)
    vision = torch.stack([t, (hw // 2).repeat(2).float(), (hw % 2).repeat(2).float()])
    return m, {
        "input_ids": torch.tensor([5, 17, 33, 2]),
        "text_indexes": torch.arange(4),
        "position_ids": torch.cat([text.expand(3, 4), vision], dim=1),
        "vision_tokens": torch.randn(1, 4, 2, 4, 4),
        "vision_sequence_indexes": torch.arange(4, 12),
        "vision_mse_loss_indexes": torch.arange(8, 12),
        "vision_timesteps": torch.full((4,), 700.0),
    }


def _cosmos3_fixed() -> dict[str, Any]:
    import torch

    return {"und_len": 4, "sequence_length": 12, "vision_token_shapes": [(2, 2, 2)],
            "vision_noisy_frame_indexes": [torch.tensor([1])]}


def _cosmos3_one_video(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """The forward takes a list of videos and returns lists of predictions: one video in, its prediction out.

    And grouped-query attention with its key/value heads repeated (``scaled_dot_product_attention(
    enable_gqa=True)`` has no TorchScript conversion): the processor's own computation otherwise,
    asserted equal to diffusers' (within 1e-5).
    """
    import torch
    import torch.nn.functional as F
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor, _rotate_half

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        rep = q.shape[1] // k.shape[1]  # [tokens, heads, head_dim] -> [1, heads, tokens, head_dim]
        q, k, v = (t.transpose(0, 1).unsqueeze(0)
                   for t in (q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)[0].transpose(0, 1).flatten(-2, -1)

    class RepeatedKVProcessor(Cosmos3AttnProcessor):
        def __call__(self, attn: Any, und_seq: torch.Tensor, gen_seq: torch.Tensor,
                     rotary_emb: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
            q_und = attn.to_q(und_seq).view(-1, attn.num_attention_heads, attn.head_dim)
            k_und = attn.to_k(und_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
            v_und = attn.to_v(und_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
            q_gen = attn.add_q_proj(gen_seq).view(-1, attn.num_attention_heads, attn.head_dim)
            k_gen = attn.add_k_proj(gen_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
            v_gen = attn.add_v_proj(gen_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
            q_und, k_und = attn.norm_q(q_und), attn.norm_k(k_und)
            k_und_for_gen = attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None else k_und
            q_gen, k_gen = attn.norm_added_q(q_gen), attn.norm_added_k(k_gen)
            cos_und, sin_und, cos_gen, sin_gen = (t.unsqueeze(1) for t in rotary_emb)
            q_und = q_und * cos_und + _rotate_half(q_und) * sin_und
            k_und = k_und * cos_und + _rotate_half(k_und) * sin_und
            k_und_for_gen = k_und_for_gen * cos_und + _rotate_half(k_und_for_gen) * sin_und
            q_gen = q_gen * cos_gen + _rotate_half(q_gen) * sin_gen
            k_gen = k_gen * cos_gen + _rotate_half(k_gen) * sin_gen
            causal_out = sdpa(q_und, k_und, v_und, True)
            full_out = sdpa(q_gen, torch.cat([k_und_for_gen, k_gen], dim=0), torch.cat([v_und, v_gen], dim=0), False)
            return attn.to_out(causal_out), attn.to_add_out(full_out)

    forward = model.forward

    def one_video(*, vision_tokens: Any, **kwargs: Any) -> tuple[Any]:
        return (forward(vision_tokens=[vision_tokens], **kwargs)[0][0],)

    model.forward = one_video
    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
    for module in model.modules():
        if type(getattr(module, "processor", None)) is Cosmos3AttnProcessor:
            module.set_processor(RepeatedKVProcessor())
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)

def real_rope_anyflow(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """AnyFlow's RoPE rewritten to the real (cos/sin) form, asserted equal to diffusers' own.

    diffusers rotates q/k viewed as complex pairs by complex frequencies (``view_as_complex``,
    complex128): TorchScript cannot export complex tensors ("ScalarType ComplexDouble") and the
    dynamo exporter fails to convert the complex frequency table (``split_with_sizes`` of complex).
    The same rotation of interleaved pairs is ``x * cos + rot(x) * sin`` with each frequency's
    cos/sin repeated per pair.  The positions depend only on the static latent shape, so the
    tables are computed once from the model's own frequencies and become constants.  The patched
    model's output on the example inputs must equal the unpatched model's (within 1e-5).
    """
    import torch
    from diffusers.models.transformers.transformer_anyflow import AnyFlowAttnProcessor

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
    _, frames, _, height, width = inputs["hidden_states"].shape
    p = model.config.patch_size
    layout = {"total_frames": frames, "full_frame_shape": (height // p[1], width // p[2])}
    freqs = model.rope(layout_cfg=layout, device=torch.device("cpu"))["query"]  # [1, 1, S, D/2] complex
    cos = freqs.real.repeat_interleave(2, dim=-1).float().contiguous()
    sin = freqs.imag.repeat_interleave(2, dim=-1).float().contiguous()

    class StaticRealRope(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        def forward(self, layout_cfg: Any, device: Any) -> dict[str, Any]:
            return {"query": (self.cos, self.sin), "key": (self.cos, self.sin)}

    def rotate(x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
        return (x.float() * table[0] + rot.float() * table[1]).type_as(x)

    class RealRopeAnyFlowProcessor(AnyFlowAttnProcessor):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None,
                     attention_mask: Any = None, rotary_emb: Any = None) -> torch.Tensor:
            from diffusers.models.attention_dispatch import dispatch_attention_fn

            if encoder_hidden_states is None:
                encoder_hidden_states = hidden_states
            query = attn.to_q(hidden_states)
            key = attn.to_k(encoder_hidden_states)
            value = attn.to_v(encoder_hidden_states)
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            query = query.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            key = key.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            value = value.unflatten(2, (attn.heads, -1)).transpose(1, 2)
            if rotary_emb is not None:  # the one change: real cos/sin instead of complex products
                query = rotate(query, rotary_emb["query"])
                key = rotate(key, rotary_emb["key"])
            hidden_states = dispatch_attention_fn(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                                  attn_mask=attention_mask, dropout_p=0.0, is_causal=False)
            hidden_states = hidden_states.flatten(2, 3).type_as(query)
            hidden_states = attn.to_out[0](hidden_states)
            return attn.to_out[1](hidden_states)

    model.rope = StaticRealRope()
    for module in model.modules():
        if type(getattr(module, "processor", None)) is AnyFlowAttnProcessor:
            module.set_processor(RealRopeAnyFlowProcessor())
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


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


def _bria_fibo() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import BriaFiboTransformer2DModel

    m = BriaFiboTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                   axes_dims_rope=[4, 6, 6], text_encoder_dim=24)
    img_ids, txt_ids = _flux_ids()
    return m, {"hidden_states": torch.randn(1, 16, 16), "encoder_hidden_states": torch.randn(1, 6, 24),
               # one text-encoder layer per block (2 dual + 2 single), each projected by its caption_projection
               "text_encoder_layers": [torch.randn(1, 6, 24) for _ in range(4)],
               "timestep": torch.tensor([0.7]), "img_ids": img_ids, "txt_ids": txt_ids}


def _list_inputs(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Every list-of-tensors input ``x`` becomes graph inputs ``x_0``, ``x_1``, ... that ``forward``
    gathers back into the list (an instance-level ``forward``: module names and computation unchanged)."""
    lists = {k: len(v) for k, v in inputs.items() if isinstance(v, list)}
    for k in lists:
        for i, t in enumerate(inputs.pop(k)):
            inputs[f"{k}_{i}"] = t
    forward = model.forward

    def gathered(**kwargs: Any) -> Any:
        for k, n in lists.items():
            kwargs[k] = [kwargs.pop(f"{k}_{i}") for i in range(n)]
        return forward(**kwargs)

    model.forward = gathered


def _ernie_image() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import ErnieImageTransformer2DModel

    m = ErnieImageTransformer2DModel(hidden_size=32, num_attention_heads=2, num_layers=2, ffn_hidden_size=64,
                                     in_channels=4, out_channels=4, patch_size=2, text_in_dim=24,
                                     rope_axes_dim=(4, 6, 6))
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([7.0]),
        "text_bth": torch.randn(1, 6, 24),
        "text_lens": torch.tensor([6], dtype=torch.int64),  # the caption's length: text RoPE offset and mask
    }


def _glm_image() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import GlmImageTransformer2DModel

    m = GlmImageTransformer2DModel(patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=16,
                                   num_attention_heads=2, text_embed_dim=24, time_embed_dim=32, condition_dim=8,
                                   prior_vq_quantizer_codebook_size=64)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        # the AR prior's VQ codes, one per image token, and the (classifier-free) drop mask the pipeline passes
        "prior_token_id": torch.randint(0, 64, (1, 16)),
        "prior_token_drop": torch.zeros(1, 16, dtype=torch.bool),
        "timestep": torch.tensor([7.0]),
        "target_size": torch.tensor([[64.0, 64.0]]),
        "crop_coords": torch.tensor([[0.0, 0.0]]),
    }


def _glm_image_fixed() -> dict[str, Any]:
    """The model's own RoPE tables for the 4 x 4 grid: TorchScript exports ``GlmImageRotaryPosEmbed``'s
    ``torch.outer(int64 positions, float frequencies)`` as an int64 product, so ``Cos`` gets an int64
    input (ONNX shape inference rejects the model)."""
    import torch
    from diffusers.models.transformers.transformer_glm_image import GlmImageRotaryPosEmbed

    return {"image_rotary_emb": GlmImageRotaryPosEmbed(16, 2, theta=10000.0)(torch.zeros(1, 4, 8, 8))}


def _glm_prior_where(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """GLM-Image's prior-code dropping as a ``where``, asserted equal to diffusers' own (both masks).

    ``prior_embedding[prior_token_drop] *= 0.0`` (boolean-mask indexing) exports a ``NonZero``
    whose output shape depends on the mask's values (rkpart: exit 3).  ``where(drop, 0 * e, e)`` is
    the same tensor.  ``forward`` is diffusers' with that one line changed (no KV cache: text-to-image).
    """
    import torch

    def forward(hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, prior_token_id: torch.Tensor,
                prior_token_drop: torch.Tensor, timestep: torch.Tensor, target_size: torch.Tensor,
                crop_coords: torch.Tensor, image_rotary_emb: Any = None, return_dict: bool = True) -> Any:
        self = model
        batch_size, _, height, width = hidden_states.shape
        if image_rotary_emb is None:
            image_rotary_emb = self.rope(hidden_states)
        p = self.config.patch_size
        hidden_states = self.image_projector(hidden_states)
        encoder_hidden_states = self.glyph_projector(encoder_hidden_states)
        prior_embedding = self.prior_token_embedding(prior_token_id)
        prior_embedding = torch.where(prior_token_drop[..., None], prior_embedding * 0.0, prior_embedding)  # the change
        hidden_states = hidden_states + self.prior_projector(prior_embedding)
        temb = self.time_condition_embed(timestep, target_size, crop_coords, hidden_states.dtype)
        for block in self.transformer_blocks:
            hidden_states, encoder_hidden_states = block(hidden_states, encoder_hidden_states, temb,
                                                         image_rotary_emb, None, None, kv_cache=None)
        hidden_states = self.proj_out(self.norm_out(hidden_states, temb))
        hidden_states = hidden_states.reshape(batch_size, height // p, width // p, -1, p, p)
        return (hidden_states.permute(0, 3, 1, 4, 2, 5).flatten(4, 5).flatten(2, 3),)

    with torch.no_grad():
        for drop in (False, True):
            args = {**inputs, **fixed, "prior_token_drop": torch.full_like(inputs["prior_token_drop"], drop)}
            torch.testing.assert_close(forward(**args, return_dict=False)[0], model(**args, return_dict=False)[0],
                                       rtol=0, atol=0)
    model.forward = forward



def _hidream_image() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import HiDreamImageTransformer2DModel

    m = HiDreamImageTransformer2DModel(patch_size=2, in_channels=4, out_channels=4, num_layers=2, num_single_layers=2,
                                       attention_head_dim=16, num_attention_heads=2, caption_channels=[24, 20],
                                       text_emb_dim=16, num_routed_experts=4, num_activated_experts=2,
                                       axes_dims_rope=(8, 4, 4), max_resolution=(8, 8), llama_layers=[0, 1, 2, 3])
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timesteps": torch.tensor([7.0]),
        "encoder_hidden_states_t5": torch.randn(1, 6, 24),
        # the Llama layers the blocks read, one per block (llama_layers), stacked
        "encoder_hidden_states_llama3": torch.randn(4, 1, 5, 20),
        "pooled_embeds": torch.randn(1, 16),
    }


def _dense_moe(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """HiDream's MoE FFNs in the dense form, asserted equal to diffusers' own.

    ``MOEFeedForwardSwiGLU.moe_infer`` groups tokens by expert with ``bincount().cpu().numpy()``
    (data-dependent: dynamo cannot export it, TorchScript would bake one input's grouping in).  The
    same sum is every expert on every token weighed by its gate, 0 where the router did not pick it
    (the top-k weights scattered into a dense ``[tokens, experts]`` matrix, as :mod:`tests.models.moe`).
    """
    import torch
    from diffusers.models.transformers.transformer_hidream_image import MOEFeedForwardSwiGLU

    def dense(self: Any, x: torch.Tensor) -> torch.Tensor:
        topk_idx, topk_weight, _ = self.gate(x)
        flat = x.view(-1, x.shape[-1])
        gates = torch.zeros(flat.shape[0], len(self.experts), dtype=x.dtype).scatter(1, topk_idx, topk_weight)
        y = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            y = y + gates[:, e:e + 1] * expert(flat)
        return y.view(*x.shape) + self.shared_experts(x)

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
        for module in model.modules():
            if isinstance(module, MOEFeedForwardSwiGLU):
                module.forward = dense.__get__(module)
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


def _hunyuanimage() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import HunyuanImageTransformer2DModel

    m = HunyuanImageTransformer2DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                                       num_layers=2, num_single_layers=2, num_refiner_layers=2, patch_size=(2, 2),
                                       text_embed_dim=24, rope_axes_dim=(8, 8))
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([7.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "encoder_attention_mask": torch.ones(1, 6, dtype=torch.int64),
    }


def _dreamlite() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import DreamLiteTransformer2DModel

    # the DreamLite U-Net's defaults: RMS qk-norm, one KV head (GQA), ff_mult 6, conv proj_in/proj_out
    m = DreamLiteTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=32, num_layers=2,
                                    cross_attention_dim=24, norm_num_groups=8, qk_norm="rms_norm", ff_mult=6,
                                    num_kv_heads=1)
    return m, {"hidden_states": torch.randn(1, 32, 4, 4), "encoder_hidden_states": torch.randn(1, 6, 24)}


def _dreamlite_gqa(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """The GQA-aware processor ``DreamLiteUNetModel.__init__`` installs on every ``Attention`` (the stock
    ``AttnProcessor2_0`` cannot reshape one KV head to two query heads)."""
    from diffusers.models.attention_processor import Attention
    from diffusers.models.unets.unet_dreamlite import DreamLiteAttnProcessor2_0

    for module in model.modules():
        if isinstance(module, Attention):
            module.set_processor(DreamLiteAttnProcessor2_0())


def _bria_fibo2() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import BriaFibo2Transformer2DModel

    # 2 noise-refiner blocks, a 2-layer Perceiver squeezing the text into 4 gist tokens, then 3 blocks of which the
    # middle one is an injection block (cross-attention to its own text bundle)
    m = BriaFibo2Transformer2DModel(in_channels=4, patch_size=2, dim=32, n_layers=3, n_refiner_layers=2, n_heads=2,
                                    cap_feat_dim=24, injection_layer_ids=(1,), perceiver_num_layers=2,
                                    min_num_gist_tokens=4, max_num_gist_tokens=4, gist_step=4, gist_min_text_len=2,
                                    gist_max_text_len=16, axes_dims=(4, 6, 6), axes_lens=(8, 8, 8))
    with torch.no_grad():  # the injection gate is zero-initialised (tanh(0) * x: a constant-zero stage output that
        for block in m.layers:  # rknn-toolkit2 2.5.0's fold_constant refuses); a trained checkpoint's is not
            if block.cross_attention is not None:
                block.cross_attn_gate.fill_(0.5)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([0.7]),
        # the Perceiver's text bundle, then one per injection block
        "encoder_hidden_states": torch.randn(1, 2, 6, 24),
    }


def _real_rope_fibo2(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Fibo 2's complex RoPE in the real form, asserted equal to diffusers' own.

    diffusers multiplies q/k viewed as complex pairs (``view_as_complex``) by complex tables
    (``torch.polar``) that the (non-module) ``RopeEmbedder`` gathers by position: TorchScript has no
    ``aten::view_as_complex`` and dynamo cannot convert the complex product (as QwenImage).  The same
    product of interleaved pairs is ``(a c - b s, a s + b c)``: the embedder here gathers the same
    tables viewed as real ``[..., 2]`` (cos, sin) pairs, and the processor (diffusers' with only its
    ``apply_rotary_emb`` changed) rotates with them.
    """
    import torch
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers.transformer_bria_fibo2 import BriaFibo2Attention, BriaFibo2AttnProcessor

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
    rope = model.rope_embedder
    tables = [torch.view_as_real(t) for t in rope.precompute_freqs_cis(rope.axes_dims, rope.axes_lens, rope.theta)]

    class RealRopeEmbedder:
        def __call__(self, ids: torch.Tensor) -> torch.Tensor:  # [S, axes] -> [S, D/2, 2] (cos, sin)
            return torch.cat([tables[i][ids[:, i]] for i in range(len(tables))], dim=-2)

    class RealRopeFibo2Processor(BriaFibo2AttnProcessor):
        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                     attention_mask: torch.Tensor | None = None, freqs_cis: torch.Tensor | None = None) -> torch.Tensor:
            query = attn.to_q(hidden_states)
            if encoder_hidden_states is None:
                encoder_hidden_states = hidden_states
            key = attn.to_k(encoder_hidden_states)
            value = attn.to_v(encoder_hidden_states)
            query = attn.norm_q(query.unflatten(-1, (attn.heads, -1)))
            key = attn.norm_k(key.unflatten(-1, (attn.heads, -1)))
            value = value.unflatten(-1, (attn.heads, -1))

            def apply_rotary_emb(x_in: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:  # the one change
                x = x_in.float().reshape(*x_in.shape[:-1], -1, 2)
                a, b = x[..., 0], x[..., 1]
                c, s = freqs[..., 0].unsqueeze(2), freqs[..., 1].unsqueeze(2)
                return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(3).type_as(x_in)

            if freqs_cis is not None:
                query = apply_rotary_emb(query, freqs_cis)
                key = apply_rotary_emb(key, freqs_cis)
            if attention_mask is not None and attention_mask.ndim == 2:
                attention_mask = attention_mask[:, None, None, :]
            hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                                  is_causal=False, backend=self._attention_backend,
                                                  parallel_config=self._parallel_config)
            return attn.to_out[0](hidden_states.flatten(2, 3))

    model.rope_embedder = RealRopeEmbedder()
    for module in model.modules():
        if isinstance(module, BriaFibo2Attention):
            module.set_processor(RealRopeFibo2Processor())
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


# --- LATEST_H2 builders (diffusers 0.42) ---


def _ideogram4() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Ideogram4Transformer2DModel

    m = Ideogram4Transformer2DModel(in_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2,
                                    intermediate_size=64, adaln_dim=32, llm_features_dim=24, rope_theta=10000,
                                    mrope_section=(4, 2, 2))
    # the pipeline's packed [text][image] sequence: 6 text tokens (positions i, i, i), 4 x 4 image tokens
    # (t, h, w) + 65536, one segment; the image slots of hidden_states and the text slots of the features
    # are masked inside the model by the indicator
    text, side = 6, 4
    h = torch.arange(side).repeat_interleave(side)
    w = torch.arange(side).repeat(side)
    image_pos = torch.stack([torch.zeros_like(h), h, w], dim=1) + 65536
    text_pos = torch.arange(text).unsqueeze(1).expand(text, 3)
    indicator = torch.cat([torch.full((text,), 3), torch.full((side * side,), 2)])
    n = text + side * side
    return m, {
        "hidden_states": torch.randn(1, n, 16),
        "timestep": torch.tensor([0.3]),
        "encoder_hidden_states": torch.randn(1, n, 24),
        "position_ids": torch.cat([text_pos, image_pos]).unsqueeze(0).long(),
        "segment_ids": torch.ones(1, n, dtype=torch.int64),
        "indicator": indicator.unsqueeze(0).long(),
    }


def _ideogram4_rope(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Ideogram4's MRoPE interleave as two ``torch.where`` with constant masks, asserted equal to diffusers'.

    diffusers writes the h and w frequencies into every third slot in place
    (``freqs_t[..., idx] = freqs[axis][..., idx]``); TorchScript exports that index_put as a
    ScatterND whose constant-folded data leaves an ``Expand`` with an empty input name (ONNX
    checker and ONNX Runtime: "input 0 is marked single but has an empty string").  Selecting
    each slot from its axis with ``torch.where`` is the same function (no arithmetic).
    """
    import torch

    rope = model.rotary_emb
    masks = []
    for axis, offset in ((1, 1), (2, 2)):
        mask = torch.zeros(rope.inv_freq.numel(), dtype=torch.bool)
        mask[offset:rope.mrope_section[axis] * 3:3] = True
        masks.append(mask)

    def forward(position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch_size = position_ids.shape[0]
        pos = position_ids.permute(2, 0, 1).to(dtype=torch.float32)
        inv_freq = rope.inv_freq.to(dtype=torch.float32)[None, None, :, None].expand(3, batch_size, -1, 1)
        freqs = (inv_freq @ pos.unsqueeze(2)).transpose(2, 3)  # (3, B, L, F)
        freqs_t = torch.where(masks[0], freqs[1], freqs[0])
        freqs_t = torch.where(masks[1], freqs[2], freqs_t)
        emb = torch.cat((freqs_t, freqs_t), dim=-1)
        return emb.cos().float(), emb.sin().float()

    with torch.no_grad():
        reference = rope(inputs["position_ids"])
        patched = forward(inputs["position_ids"])
    for a, b in zip(reference, patched, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    rope.forward = forward


def _krea2() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import Krea2Transformer2DModel

    m = Krea2Transformer2DModel(in_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2,
                                num_key_value_heads=1, intermediate_size=64, timestep_embed_dim=32,
                                text_hidden_dim=32, num_text_layers=3, text_num_attention_heads=2,
                                text_num_key_value_heads=2, text_intermediate_size=64, num_layerwise_text_blocks=2,
                                num_refiner_text_blocks=2, axes_dims_rope=(4, 6, 6))
    # the pipeline's rotary ids: text rows at the origin, image rows (0, h, w); a bool text mask (2 padded tokens)
    text, side = 6, 4
    image_ids = torch.zeros(side * side, 3)
    image_ids[:, 1] = torch.arange(side * side) // side
    image_ids[:, 2] = torch.arange(side * side) % side
    return m, {
        "hidden_states": torch.randn(1, side * side, 16),
        "encoder_hidden_states": torch.randn(1, text, 3, 32),
        "timestep": torch.tensor([0.7]),
        "position_ids": torch.cat([torch.zeros(text, 3), image_ids]),
        "encoder_attention_mask": torch.tensor([[True] * (text - 2) + [False] * 2]),
    }


def _krea2_rms_norm(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Krea2's RMSNorms (``F.rms_norm`` with weight ``1 + w``: ``aten::rms_norm``, no TorchScript symbolic
    below opset 23) in the decomposed form :func:`_decompose_rms_norm` gives ``torch.nn.RMSNorm``; the
    output is asserted equal to diffusers' own (within 1e-5)."""
    import torch
    from diffusers.models.transformers.transformer_krea2 import Krea2RMSNorm

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]

    def decomposed(norm: Krea2RMSNorm) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            y = x.float()
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + norm.eps)
            return (y * (norm.weight + 1.0)).to(x.dtype)
        return forward

    for module in model.modules():
        if isinstance(module, Krea2RMSNorm):
            module.forward = decomposed(module)
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


def _nucleus_moe() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import NucleusMoEImageTransformer2DModel

    # block 0 dense (SwiGLU, mlp_ratio 6: inner 128), blocks 1-2 expert-choice MoE (4 experts, capacity 4 of 16
    # tokens, a shared expert); GQA 2 query heads over 1 kv head
    m = NucleusMoEImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=3,
                                          attention_head_dim=16, num_attention_heads=2, num_key_value_heads=1,
                                          joint_attention_dim=24, axes_dims_rope=(4, 6, 6), mlp_ratio=6.0,
                                          moe_enabled=True, dense_moe_strategy="leave_first_block_dense",
                                          num_experts=4, moe_intermediate_dim=32, capacity_factors=1.0)
    with torch.no_grad():  # the packed expert weights are torch.empty (a checkpoint fills them)
        for name, prm in m.named_parameters():
            if name.endswith(("gate_up_proj", "down_proj")):
                prm.copy_(torch.randn(prm.shape) * 0.1)
    return m, {
        "hidden_states": torch.randn(1, 16, 16),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "encoder_hidden_states_mask": torch.tensor([[True] * 4 + [False] * 2]),
        "timestep": torch.tensor([0.7]),
    }


def _nucleus_moe_fixed() -> dict[str, Any]:
    return {"img_shapes": [(1, 4, 4)]}


def _nucleus_moe_prepare(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """NucleusMoE's complex RoPE in the real (cos/sin) form and its experts split statically, asserted
    equal to diffusers' own.

    diffusers rotates q/k viewed as complex pairs (``view_as_complex``) by complex tables
    (``torch.polar``): TorchScript has no ``aten::view_as_complex`` and the dynamo exporter
    cannot convert the complex product (as for QwenImage, whose RoPE this is).  The tables depend
    only on ``img_shapes`` and the text length, so they become constants; the same rotation of
    interleaved pairs is ``x * cos + rot(x) * sin`` with each frequency repeated per pair.

    The experts' loop splits the routed tokens by ``num_tokens_per_expert.tolist()``: TorchScript
    makes a SplitToSequence / ConcatFromSequence whose shapes depend on values (rkpart exit 3) and
    the dynamo exporter fails on the unbacked sizes ("should have been constant, but got u0 + u1 +
    u2 + u3").  Expert-choice routing gives every expert the same count (``bs * capacity``), so
    the split is by that static size.
    """
    import torch
    import torch.nn.functional as F
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers.transformer_nucleusmoe_image import NucleusMoEAttnProcessor2_0, SwiGLUExperts

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
        text = inputs["encoder_hidden_states"].shape[1]
        img, txt = model.pos_embed(fixed["img_shapes"], max_txt_seq_len=text)

    def real(freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [S, D/2] complex -> [S, D] cos, sin
        return (freqs.real.repeat_interleave(2, dim=-1).float().contiguous(),
                freqs.imag.repeat_interleave(2, dim=-1).float().contiguous())

    tables = (real(img), real(txt))

    def rotate(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:  # x: [B, S, H, D]
        cos, sin = (t[None, :, None, :] for t in cos_sin)
        x_real, x_imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
        rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
        return (x.float() * cos + rotated * sin).type_as(x)

    class RealRopeProcessor(NucleusMoEAttnProcessor2_0):
        """diffusers' processor (no cached text keys) with the rotation in the real form."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                     attention_mask: torch.Tensor | None = None, image_rotary_emb: Any = None,
                     **_: Any) -> torch.Tensor:
            head_dim = attn.inner_dim // attn.heads
            num_kv_heads = attn.inner_kv_dim // head_dim
            num_kv_groups = attn.heads // num_kv_heads
            img_query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))
            img_key = attn.to_k(hidden_states).unflatten(-1, (num_kv_heads, -1))
            img_value = attn.to_v(hidden_states).unflatten(-1, (num_kv_heads, -1))
            img_query = attn.norm_q(img_query)
            img_key = attn.norm_k(img_key)
            img_query, img_key = rotate(img_query, tables[0]), rotate(img_key, tables[0])
            txt_key = attn.add_k_proj(encoder_hidden_states).unflatten(-1, (num_kv_heads, -1))
            txt_value = attn.add_v_proj(encoder_hidden_states).unflatten(-1, (num_kv_heads, -1))
            txt_key = rotate(attn.norm_added_k(txt_key), tables[1])
            joint_key = torch.cat([img_key, txt_key], dim=1)
            joint_value = torch.cat([img_value, txt_value], dim=1)
            if num_kv_groups > 1:
                joint_key = joint_key.repeat_interleave(num_kv_groups, dim=2)
                joint_value = joint_value.repeat_interleave(num_kv_groups, dim=2)
            out = dispatch_attention_fn(img_query, joint_key, joint_value, attn_mask=attention_mask, dropout_p=0.0,
                                        is_causal=False)
            out = out.flatten(2, 3).to(img_query.dtype)
            return attn.to_out[0](out)

    def static_experts(experts: SwiGLUExperts) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
            # expert-choice routing gives every expert the same count (torch.full(bs * capacity)), no padding
            outs = []
            for e, x_e in enumerate(x.split(x.shape[0] // experts.num_experts)):
                gate, up = torch.matmul(x_e, experts.gate_up_proj[e]).chunk(2, dim=-1)
                outs.append(torch.matmul(F.silu(gate) * up, experts.down_proj[e]))
            return torch.cat(outs, dim=0)
        return forward

    model.pos_embed.forward = lambda *args, **kwargs: None
    for module in model.modules():
        if isinstance(module, SwiGLUExperts):
            module.forward = static_experts(module)
    for module in model.modules():
        if type(getattr(module, "processor", None)) is NucleusMoEAttnProcessor2_0:
            module.set_processor(RealRopeProcessor())
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


def _omnigen() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import OmniGenTransformer2DModel

    m = OmniGenTransformer2DModel(in_channels=4, patch_size=2, hidden_size=32, num_attention_heads=2,
                                  num_key_value_heads=2, intermediate_size=64, num_layers=2, pad_token_id=0,
                                  vocab_size=64, rope_scaling={"short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
                                  pos_embed_max_size=16, time_step_dim=32)
    # text-to-image: [6 text tokens, the time token, 16 image tokens] at positions 0..22
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([0.7]),
        "input_ids": torch.randint(1, 64, (1, 6)),
        "position_ids": torch.arange(23).unsqueeze(0),
    }


def _omnigen_fixed() -> dict[str, Any]:
    import torch

    # no input images; the processor's 0/1 mask (causal over text and time token, image rows see everything) is
    # the static layout's, a constant (as a graph input, random values overflow (1 - mask) * finfo.min to NaN)
    text, n = 6, 23
    mask = torch.zeros(n, n)
    mask[: text + 1, : text + 1] = torch.tril(torch.ones(text + 1, text + 1))
    mask[text + 1:] = 1.0
    return {"input_img_latents": [], "input_image_sizes": {}, "attention_mask": mask.unsqueeze(0)}


def _omnigen_rope(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """OmniGen's SuScaled RoPE with its short/long factor choice made once, asserted equal to diffusers'.

    diffusers picks the factors by ``torch.max(position_ids) + 1 > original_max_position_embeddings``,
    a branch on input values: the dynamo exporter fails ("Could not guard on data-dependent
    expression"), TorchScript bakes the traced branch in.  The processor's positions run 0 .. the
    sequence length - 1, so the choice follows from the static length; it is made here from the
    example positions (as TorchScript's trace does) and the rest is diffusers' computation.
    """
    import math

    import torch

    rope = model.rope
    long = int(inputs["position_ids"].max()) + 1 > rope.original_max_position_embeddings
    factors = torch.tensor(rope.long_factor if long else rope.short_factor, dtype=torch.float32)
    scale = rope.max_position_embeddings / rope.original_max_position_embeddings
    scaling = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(rope.original_max_position_embeddings))

    with torch.no_grad():
        reference = rope(inputs["hidden_states"], inputs["position_ids"])

    def forward(hidden_states: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = 1.0 / (factors * rope.base ** (torch.arange(0, rope.dim, 2, dtype=torch.int64).float() / rope.dim))
        inv_freq_expanded = inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
        freqs = (inv_freq_expanded @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)[0]
        return emb.cos() * scaling, emb.sin() * scaling

    with torch.no_grad():
        patched = forward(inputs["hidden_states"], inputs["position_ids"])
    for a, b in zip(reference, patched, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    rope.forward = forward


def _qwenimage21() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import QwenImage21Transformer2DModel

    m = QwenImage21Transformer2DModel(patch_size=1, in_channels=16, out_channels=16, num_layers=2,
                                      attention_head_dim=16, num_attention_heads=2, context_in_dim=24, mlp_ratio=2,
                                      axes_dims_rope=(4, 6, 6))
    return m, {
        "hidden_states": torch.randn(1, 16, 16),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([0.7]),
        "encoder_hidden_states_mask": torch.tensor([[True] * 4 + [False] * 2]),
    }


def _qwenimage21_fixed() -> dict[str, Any]:
    import torch

    # text-to-image: 6 text slots, then one slot per 2 x 2 group of the 4 x 4 target latents (the pipeline's
    # append_target_slots); the layout is static, as img_shapes
    return {"img_shapes": [[(1, 4, 4)]], "img_mask": torch.tensor([[False] * 6 + [True] * 4])}


def _qwenimage21_real_rope(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Qwen-Image 2.1's complex RoPE in the real (cos/sin) form, asserted equal to diffusers' own.

    diffusers rotates q/k right after their RMSNorms as complex pairs (``view_as_complex``) by a
    complex table (``torch.polar``): TorchScript has no ``aten::view_as_complex`` (as for
    QwenImage).  The table depends only on the static layout (``img_shapes``, ``img_mask``), so it
    is computed once; each attention's ``norm_q`` / ``norm_k`` becomes the norm followed by the same
    rotation in the real form, and the processor gets no complex table.  The layout's token
    metadata is made constant too (see below): the forward is diffusers' for the static layout.
    """
    import math

    import torch
    from diffusers.models.transformers.transformer_qwenimage21 import (
        QwenImage21Attention,
        QwenImage21AttnProcessor,
        _qwenimage21_prefix_segments,
    )

    with torch.no_grad():
        reference = model(**inputs, **fixed, return_dict=False)[0]
        img_mask = fixed["img_mask"]
        pad_mask = torch.repeat_interleave(img_mask[0], torch.where(img_mask, 4, 1)[0])
        freqs = model.pos_embed(fixed["img_shapes"][0], pad_mask, device=torch.device("cpu"))  # [S, D/2] complex
    cos = freqs.real.repeat_interleave(2, dim=-1).float()[None, :, None, :].contiguous()
    sin = freqs.imag.repeat_interleave(2, dim=-1).float()[None, :, None, :].contiguous()

    class NormThenRope(torch.nn.Module):
        def __init__(self, norm: torch.nn.Module) -> None:
            super().__init__()
            self.norm = norm
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, S, H, D]
            x = self.norm(x)
            x_real, x_imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
            rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
            return (x.float() * self.cos + rotated * self.sin).type_as(x)

    # the layout metadata diffusers derives from img_mask in every forward (repeat_interleave by mask-dependent
    # repeats, boolean-mask scatter, nonzero, tolist): TorchScript leaves a NonZero whose shape depends on values
    # (rkpart exit 3), torch.export fails ("Could not guard on data-dependent expression", build_token_metadata);
    # computed once here as constant indices, the forward below is diffusers' without KV cache or flex attention
    repeats = torch.where(img_mask, 4, 1)[0]
    gather = torch.repeat_interleave(torch.arange(repeats.numel()), repeats)  # repeat_interleave as a gather
    image_pos = pad_mask.nonzero(as_tuple=True)[0]
    image_ids, target_mask = model.build_token_metadata(pad_mask, fixed["img_shapes"][0])
    text_pos = (~pad_mask).nonzero(as_tuple=True)[0]
    prefix_len = int((~target_mask).sum())
    segments = _qwenimage21_prefix_segments(image_ids, prefix_len)
    target_tokens = math.prod(fixed["img_shapes"][0][-1])
    # the text slots of the encoder sequence as indices (a bool index leaves a NonZero of a constant in the
    # TorchScript export, which rkpart does not fold: exit 3)
    vlm_text = (~img_mask[0][: inputs["encoder_hidden_states"].shape[1]]).nonzero(as_tuple=True)[0]

    def forward(hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, timestep: torch.Tensor,
                encoder_hidden_states_mask: torch.Tensor | None = None, return_dict: bool = False,
                **_: Any) -> tuple[torch.Tensor]:
        batch_size = hidden_states.shape[0]
        hidden_states = model.img_in(hidden_states)
        encoder_hidden_states = model.txt_in(encoder_hidden_states)
        joint = torch.cat([encoder_hidden_states,
                           encoder_hidden_states.new_zeros(batch_size, target_tokens // 4,
                                                           encoder_hidden_states.shape[2])], dim=1)
        joint = joint[:, gather]
        joint[:, image_pos] = hidden_states
        timestep = timestep.to(hidden_states.dtype)
        modulation_mask = None
        if model.config.causal_condition:
            timestep = torch.cat([timestep, timestep.new_zeros(1)], dim=0)
            modulation_mask = target_mask
        temb = model.time_text_embed(timestep, hidden_states)
        modulation = model.modulation(temb)
        key_valid = None
        if encoder_hidden_states_mask is not None:
            key_valid = torch.ones(batch_size, pad_mask.shape[0], dtype=torch.bool)
            key_valid[:, text_pos] = encoder_hidden_states_mask.bool()[:, vlm_text]
        for block in model.transformer_blocks:
            joint = block(hidden_states=joint, modulation=modulation, rotary_emb=None, attention_mask=None,
                          target_token_mask=modulation_mask, segments=segments, key_valid=key_valid)
        joint = model.norm_out(joint, temb, modulation_mask)
        return (model.proj_out(joint),)

    for module in model.modules():
        if isinstance(module, QwenImage21Attention):
            assert type(module.processor) is QwenImage21AttnProcessor
            module.norm_q, module.norm_k = NormThenRope(module.norm_q), NormThenRope(module.norm_k)
    model.forward = forward
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


def _zimage() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import ZImageTransformer2DModel

    m = ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2,
                                 n_refiner_layers=2, n_heads=2, n_kv_heads=2, cap_feat_dim=24, axes_dims=[4, 6, 6],
                                 axes_lens=[64, 16, 16])
    # batch-1 tensors; _zimage_lists hands the forward its per-sample lists (the pipeline's unbind(0)): 6 caption
    # tokens and 16 image tokens, each padded to 32 by the model (SEQ_MULTI_OF)
    return m, {
        "x": torch.randn(1, 16, 1, 8, 8),
        "t": torch.tensor([0.3]),
        "cap_feats": torch.randn(1, 6, 24),
    }


def _zimage_lists(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Z-Image's forward on batch-1 tensors (lists of per-sample tensors built inside), with its complex
    RoPE in the real (cos/sin) form; asserted equal to diffusers' own.

    The forward takes ``x`` and ``cap_feats`` as lists of per-sample tensors and returns a list: the
    pipeline passes ``list(latents.unbind(0))``; here the forward unbinds the batch-1 inputs and
    stacks the one output.  The RoPE table is complex (``torch.polar``) and q/k are rotated as
    complex pairs (``view_as_complex``: no TorchScript symbolic); the table, a function of the
    static positions, is carried as real ``[..., D/2, 2]`` (real, imaginary) pairs through the
    same splits, pads and concatenations, and the processor rotates in the real form.
    """
    import torch
    import torch.nn.functional as F
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers import transformer_z_image as zimage
    from diffusers.models.transformers.transformer_z_image import ZSingleStreamAttnProcessor

    original = model.forward
    with torch.no_grad():
        reference = torch.stack(original([inputs["x"][0]], inputs["t"], [inputs["cap_feats"][0]], **fixed,
                                         return_dict=False)[0])

    rope = model.rope_embedder
    tables = [torch.stack([f.real, f.imag], dim=-1).float()  # per axis [len, d/2, 2]: no complex op is traced
              for f in rope.precompute_freqs_cis(rope.axes_dims, rope.axes_lens, theta=rope.theta)]

    def real_rope(ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([table[ids[:, i]] for i, table in enumerate(tables)], dim=-2)

    class RealRopeProcessor(ZSingleStreamAttnProcessor):
        """diffusers' processor with the rotation by real (cos, sin) pairs ``[B, S, D/2, 2]``."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                     attention_mask: torch.Tensor | None = None, freqs_cis: torch.Tensor | None = None
                     ) -> torch.Tensor:
            query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))
            key = attn.to_k(hidden_states).unflatten(-1, (attn.heads, -1))
            value = attn.to_v(hidden_states).unflatten(-1, (attn.heads, -1))
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)

            def rotate(x: torch.Tensor) -> torch.Tensor:
                # each frequency's cos / sin repeated per pair: [B, S, D/2, 2] -> [B, S, 1, D] (a repeat_interleave
                # here gets ranks from uninitialised memory in TorchScript's shape inference: SDPA's key Transpose
                # then has 6 axes and the ONNX peephole pass asserts or segfaults)
                cos = freqs_cis[..., :1].expand(*freqs_cis.shape).flatten(-2).unsqueeze(2)
                sin = freqs_cis[..., 1:].expand(*freqs_cis.shape).flatten(-2).unsqueeze(2)
                x_real, x_imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
                rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
                return (x.float() * cos + rotated * sin).type_as(x)

            if freqs_cis is not None:
                query, key = rotate(query), rotate(key)
            if attention_mask is not None and attention_mask.ndim == 2:
                attention_mask = attention_mask[:, None, None, :]
            out = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False)
            out = out.flatten(2, 3).to(query.dtype)
            return attn.to_out[0](out)

    def pad_sequence(seqs: list[torch.Tensor], batch_first: bool = False, padding_value: float = 0.0,
                     **_: Any) -> torch.Tensor:
        assert batch_first
        longest = max(len(q) for q in seqs)
        return torch.stack([F.pad(q, (0, 0) * (q.dim() - 1) + (0, longest - len(q)), value=padding_value)
                            for q in seqs])

    def forward(x: torch.Tensor, t: torch.Tensor, cap_feats: torch.Tensor, return_dict: bool = False,
                **kwargs: Any) -> tuple[torch.Tensor]:
        # torch's pad_sequence (aten::pad_sequence: no TorchScript symbolic) as F.pad + stack while the forward runs
        saved, zimage.pad_sequence = zimage.pad_sequence, pad_sequence
        try:
            out = original(list(x.unbind(0)), t, list(cap_feats.unbind(0)), return_dict=False, **kwargs)[0]
        finally:
            zimage.pad_sequence = saved
        return (torch.stack(out),)

    model.rope_embedder = real_rope
    for module in model.modules():
        if type(getattr(module, "processor", None)) is ZSingleStreamAttnProcessor:
            module.set_processor(RealRopeProcessor())
    model.forward = forward
    with torch.no_grad():
        patched = model(**inputs, **fixed, return_dict=False)[0]
    torch.testing.assert_close(patched, reference, rtol=1e-5, atol=1e-5)


def _joyimage_edit() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import JoyImageEditTransformer3DModel

    m = JoyImageEditTransformer3DModel(patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2,
                                       text_dim=24, mlp_width_ratio=2.0, num_layers=2, rope_dim_list=[4, 6, 6])
    # reference-image editing: (B, num_items = 2, C, T, H, W), the reference latents then the noisy target
    return m, {
        "hidden_states": torch.randn(1, 2, 16, 1, 8, 8),
        "timestep": torch.tensor([700.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
    }


def _joyimage_edit_plus() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import JoyImageEditPlusTransformer3DModel

    m = JoyImageEditPlusTransformer3DModel(patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2,
                                           text_dim=24, mlp_width_ratio=2.0, num_layers=2, rope_dim_list=[4, 6, 6])
    # [B, max_patches, C, pt, ph, pw]: the 4 x 4-patch target and a 2 x 2-patch reference (_joyimage_edit_plus_fixed),
    # padded to 24 patches; the tokenizer's text mask
    return m, {
        "hidden_states": torch.randn(1, 24, 16, 1, 2, 2),
        "timestep": torch.tensor([700.0]),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "encoder_hidden_states_mask": torch.tensor([[1, 1, 1, 1, 0, 0]]),
    }


def _joyimage_edit_plus_fixed() -> dict[str, Any]:
    return {"shape_list": [[(1, 4, 4), (1, 2, 2)]]}


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

    Its zero-initialised parameters (the linear attention's causal key convolution ``conv_k``, the
    Plucker embedding's projection) get small seeded values first (:func:`_trained_like`): with
    ``conv_k`` all zeros the keys are constants, and rknn-toolkit2's constant folding removed stage
    outputs computed from them (2.3.0 and 2.5.0: "These outputs ... of model are constants, remove
    it from RKNN model"; an ``.rknn`` with 12 of the stage's 18 outputs), as no trained model has it.
    """
    import types

    import torch
    from diffusers.models.transformers import transformer_sana_wm as tsw

    _trained_like(model, inputs, fixed)
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
#: diffusers 0.42 classes added by the h1 sweep: BriaFibo, BriaFibo2, DreamLite, ErnieImage, GlmImage, HiDreamImage,
#: HunyuanImage
LATEST_H1: dict[str, Family] = {f.name: f for f in (
    # per-block text-encoder layers (a list input, flattened by _list_inputs) projected by caption_projection.i
    Family("bria_fibo", _bria_fibo, blocks=4, prepare=_list_inputs),
    # Z-Image-like: 2 noise-refiner blocks, a 2-layer Perceiver (gist tokens read the text), 3 blocks over gist +
    # image tokens, the middle one an injection block (cross-attention); complex RoPE made real: _real_rope_fibo2
    Family("bria_fibo2", _bria_fibo2, blocks=7, prepare=_real_rope_fibo2),
    # sequence-first single-stream blocks sharing one adaLN modulation; zero-initialised: _trained_like
    Family("ernie_image", _ernie_image, prepare=_trained_like),
    # CogView4 anatomy (joint attention over text + image, one FFN applied to each stream); AR prior codes
    Family("glm_image", _glm_image, _glm_image_fixed, prepare=_glm_prior_where),
    # dual-stream then single-stream blocks, each reading its own Llama layer; top-2 MoE FFNs on the image
    # stream (dense form: _dense_moe)
    Family("hidream_image", _hidream_image, blocks=4, prepare=_dense_moe),
    # HunyuanVideo anatomy over images: 2 token-refiner text blocks, then dual- and single-stream blocks; no
    # ByT5 glyph stream (text_embed_2_dim): its valid-tokens-first reordering is boolean-mask indexing
    Family("hunyuanimage", _hunyuanimage, blocks=6),
    # the DreamLite U-Net's spatial transformer (GroupNorm, conv proj_in/out around self-attn, cross-attn, GEGLU FFN
    # blocks; GQA with qk RMSNorm through the U-Net's processor: _dreamlite_gqa)
    Family("dreamlite", _dreamlite, prepare=_dreamlite_gqa),
)}
#: issue 28's sweep, continued (diffusers 0.42): Ideogram4, Krea2, NucleusMoEImage, OmniGen, QwenImage21, ZImage,
#: JoyImageEdit and JoyImageEditPlus
LATEST_H2: dict[str, Family] = {f.name: f for f in (
    Family("ideogram4", _ideogram4, prepare=_ideogram4_rope),  # packed text + image sequence, DiT blocks
    # text fusion: 2 layer-wise blocks (attention across tapped encoder layers, per token), 2 token refiners;
    # then 2 single-stream blocks over text + image
    Family("krea2", _krea2, blocks=6, prepare=_krea2_rms_norm),
    # one dense block, then 2 expert-choice MoE blocks; image queries attend to image + text keys
    Family("nucleus_moe", _nucleus_moe, _nucleus_moe_fixed, blocks=3, prepare=_nucleus_moe_prepare),
    # a Phi-3 decoder over [text tokens, time token, image tokens] (causal text, bidirectional image)
    Family("omnigen", _omnigen, _omnigen_fixed, prepare=_omnigen_rope),
    # single-stream blocks over [text, target image] with one shared modulation; block-causal attention (a causal
    # text segment, then the image over everything); text tokens modulated from t = 0
    Family("qwenimage21", _qwenimage21, _qwenimage21_fixed, prepare=_qwenimage21_real_rope),
    # 2 noise-refiner blocks (image, modulated), 2 context-refiner blocks (caption, unmodulated), then 2 joint blocks
    Family("zimage", _zimage, blocks=6, prepare=_zimage_lists),
    Family("joyimage_edit", _joyimage_edit),  # dual-stream (MMDiT) blocks, reference + target items
    # the same blocks over padded patch sequences (several images), a text + padding key mask
    Family("joyimage_edit_plus", _joyimage_edit_plus, _joyimage_edit_plus_fixed),
)}
#: helper h3's classes of the sweep (diffusers 0.42): ConsisID, HunyuanVideo FramePack and 1.5, Helios, ...
LATEST_H3: dict[str, Family] = {f.name: f for f in (
    Family("consisid", _consisid, blocks=8),
    Family("hunyuanvideo_framepack", _hunyuanvideo_framepack, blocks=6),
    Family("hunyuanvideo15", _hunyuanvideo15, blocks=4),
    Family("helios", _helios),
    Family("kandinsky6", _kandinsky6, blocks=6),
    Family("kandinsky6_sr", _kandinsky6_sr, prepare=dense_nabla_kandinsky6_sr),  # NABLA flex attention, dense
    Family("anyflow", _anyflow, prepare=real_rope_anyflow),  # complex RoPE rewritten to the real form
    # one cached autoregressive step: KV caches as inputs, real-form RoPE, flex attention (no mask) as SDPA
    Family("anyflow_far", _anyflow_far, prepare=dense_far_step),
    # text (causal) and video streams in one packed sequence; lists adapted to one video, GQA's K/V repeated
    Family("cosmos3", _cosmos3, _cosmos3_fixed, prepare=_cosmos3_one_video),
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
    "QwenImageTransformer2DModel": "complex RoPE: TorchScript has no aten::view_as_complex, dynamo fails to "
                                   "convert the complex product (config kept: _qwenimage)",
    "Transformer2DModel": "the legacy class DiTTransformer2DModel and PixArtTransformer2DModel were split out of (its "
                          "patched-input path, the same BasicTransformerBlock: dit, pixart); its continuous-input path "
                          "is a U-Net's spatial transformer (as dreamlite)",
    "WanAnimate2Transformer3DModel": "the denoising pass (kv_cache_mode='cached') is flex attention over a compiled "
                                     "BlockMask: TorchScript refuses to jit.trace a dynamo-optimized function, "
                                     "torch.export fails with 'unhashable type: non-nested SymInt'; lists, a KV-cache "
                                     "object and complex float64 RoPE in the forward besides",
}
#: the diffusers class of every family of the sweep (``tests/models/test_diffusers_families.py`` checks that
#: every class of ``diffusers.models.transformers`` is one of these or in :data:`NOT_EXPORTED`)
CLASS_OF: dict[str, str] = {
    "dit": "DiTTransformer2DModel",
    "pixart": "PixArtTransformer2DModel",
    "sd3": "SD3Transformer2DModel",
    "flux": "FluxTransformer2DModel",
    "sana": "SanaTransformer2DModel",
    "cogvideox": "CogVideoXTransformer3DModel",
    "wan": "WanTransformer3DModel",
    "chroma": "ChromaTransformer2DModel",
    "lumina2": "Lumina2Transformer2DModel",
    "auraflow": "AuraFlowTransformer2DModel",
    "hunyuandit": "HunyuanDiT2DModel",
    "cosmos": "CosmosTransformer3DModel",
    "sd35": "SD3Transformer2DModel",
    "hunyuandit_skip": "HunyuanDiT2DModel",
    "chroma_guidance": "ChromaTransformer2DModel",
    "pixart_sigma": "PixArtTransformer2DModel",
    "allegro": "AllegroTransformer3DModel",
    "ltx": "LTXVideoTransformer3DModel",
    "latte": "LatteTransformer3DModel",
    "hunyuanvideo": "HunyuanVideoTransformer3DModel",
    "skyreels_v2": "SkyReelsV2Transformer3DModel",
    "cogview4": "CogView4Transformer2DModel",
    "flux2": "Flux2Transformer2DModel",
    "wan_vace": "WanVACETransformer3DModel",
    "kandinsky5": "Kandinsky5Transformer3DModel",
    "chronoedit": "ChronoEditTransformer3DModel",
    "sana_video": "SanaVideoTransformer3DModel",
    "cogview3plus": "CogView3PlusTransformer2DModel",
    "longcat_image": "LongCatImageTransformer2DModel",
    "ovis_image": "OvisImageTransformer2DModel",
    "bria": "BriaTransformer2DModel",
    "flux3": "Flux3Transformer2DModel",
    "stable_audio": "StableAudioDiTModel",
    "prx": "PRXTransformer2DModel",
    "bria_fibo": "BriaFiboTransformer2DModel",
    "bria_fibo2": "BriaFibo2Transformer2DModel",
    "ernie_image": "ErnieImageTransformer2DModel",
    "glm_image": "GlmImageTransformer2DModel",
    "hidream_image": "HiDreamImageTransformer2DModel",
    "hunyuanimage": "HunyuanImageTransformer2DModel",
    "dreamlite": "DreamLiteTransformer2DModel",
    "ideogram4": "Ideogram4Transformer2DModel",
    "krea2": "Krea2Transformer2DModel",
    "nucleus_moe": "NucleusMoEImageTransformer2DModel",
    "omnigen": "OmniGenTransformer2DModel",
    "qwenimage21": "QwenImage21Transformer2DModel",
    "zimage": "ZImageTransformer2DModel",
    "joyimage_edit": "JoyImageEditTransformer3DModel",
    "joyimage_edit_plus": "JoyImageEditPlusTransformer3DModel",
    "consisid": "ConsisIDTransformer3DModel",
    "hunyuanvideo_framepack": "HunyuanVideoFramepackTransformer3DModel",
    "hunyuanvideo15": "HunyuanVideo15Transformer3DModel",
    "helios": "HeliosTransformer3DModel",
    "kandinsky6": "Kandinsky6Transformer3DModel",
    "kandinsky6_sr": "Kandinsky6SRTransformer3DModel",
    "anyflow": "AnyFlowTransformer3DModel",
    "anyflow_far": "AnyFlowFARTransformer3DModel",
    "cosmos3": "Cosmos3OmniTransformer",
    "ltx2": "LTX2VideoTransformer3DModel",
    "minimax_h3": "MiniMaxH3Transformer3DModel",
    "motif_video": "MotifVideoTransformer3DModel",
    "wan_animate": "WanAnimateTransformer3DModel",
    "stable_audio3": "StableAudio3DiTModel",
    "sana_wm": "SanaWMTransformer3DModel",
    "sana_wm_refiner": "SanaWMLTX2RefinerTransformer3DModel",
    "ace_step": "AceStepTransformer1DModel",
    "longcat_audio": "LongCatAudioDiTTransformer",
    "minimax_music3": "MiniMaxMusic3Transformer1DModel",
    "minimax_rvq": "MiniMaxMusic3RVQDepthDecoder",
    "prior": "PriorTransformer",
    "t5film": "T5FilmDecoder",
    "dual_transformer": "DualTransformer2DModel",
    "transformer_temporal": "TransformerTemporalModel",
    "rfd4": "RFD4ProteinaTransformer",
    "easyanimate": "EasyAnimateTransformer3DModel",
    "lumina_next": "LuminaNextDiT2DModel",
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
#: the classes added to the sweep for diffusers 0.42 (issue 28), in the batches they were added in
LATEST: dict[str, Family] = {**LATEST_H1, **LATEST_H2, **LATEST_H3, **LATEST_H4, **LATEST_H5}
ALL: dict[str, Family] = {**FAMILIES, **VARIANTS, **NEWER, **LATEST, **SIZED}


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


def example_inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """The example inputs :func:`export_family` exports family ``name`` with (same seed, same prepare)."""
    import torch

    fam = ALL[name]
    torch.manual_seed(seed)
    model, inputs = fam.build()
    if fam.prepare is not None:
        fam.prepare(model.eval(), inputs, fam.fixed())
    return {k: v.numpy() for k, v in inputs.items()}


def torch_outputs(name: str, feeds: dict[str, np.ndarray], seed: int = 0) -> np.ndarray:
    """What the torch model family ``name`` (as :func:`export_family` exports it: same seed, same
    prepare, and TorchScript's RMSNorm decomposition left out) computes on ``feeds``: the reference for
    exports ONNX Runtime refuses as a whole."""
    import torch

    fam = ALL[name]
    torch.manual_seed(seed)
    model, inputs = fam.build()
    model = model.eval()
    fixed = fam.fixed()
    if fam.prepare is not None:
        fam.prepare(model, inputs, fixed)
    wrapped = _Wrapper.make(model, list(inputs), fixed)
    with torch.no_grad():
        out = wrapped(*(torch.from_numpy(np.asarray(feeds[k])) for k in inputs))
    return np.asarray(out.float().numpy())


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
    if fam.prepare is _sana_wm_real_rope:
        funcs.append(_trained_like)
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
