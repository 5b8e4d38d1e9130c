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
                                              export (``real_rope_lumina2``)
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
                                                   flattened by ``list_inputs``)
bria_fibo2     ``BriaFibo2Transformer2DModel``     noise refiner, a Perceiver whose gist tokens
                                                   (a constant-rooted stream) read the text, then
                                                   blocks with one injection cross-attention;
                                                   complex RoPE made real (``real_rope_fibo2``)
ernie_image    ``ErnieImageTransformer2DModel``    sequence-first single stream, one adaLN
                                                   modulation shared by every block, text lengths
                                                   as an input (RoPE offset, mask)
glm_image      ``GlmImageTransformer2DModel``      CogView4 anatomy with AR prior codes
                                                   (embedding + drop mask, ``prior_drop_where_glm``)
hidream_image  ``HiDreamImageTransformer2DModel``  dual- then single-stream blocks each reading its
                                                   own Llama layer; top-2 MoE image FFNs (dense
                                                   form, ``dense_moe_hidream``)
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
                                                                    (``dense_nabla_kandinsky6_sr``)
anyflow                 ``AnyFlowTransformer3DModel``               Wan anatomy, two timesteps (t, r); complex
                                                                    RoPE in real form (``real_rope_anyflow``)
anyflow_far             ``AnyFlowFARTransformer3DModel``            a cached autoregressive step: KV caches as
                                                                    inputs, flex attention as SDPA, real RoPE
                                                                    (``real_rope_sdpa_far``)
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
                                                            inputs, real-form RoPE (``real_rope_sana_wm``)
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
                                                           ``repeat_kv_ace_step``), cross-attention, two
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
                                                           (``static_rope_easyanimate``)
lumina_next           ``LuminaNextDiT2DModel``             self- and cross-attention summed before one output
                                                           projection; complex RoPE rewritten to the real form
                                                           (``real_rope_lumina_next``); zero-initialised
                                                           gates: :func:`_trained_like`
====================  ===================================  ==========================================================

The patches that make 20 of these classes exportable are the product's (:data:`rkpart.export.PATCHES`,
keyed by diffusers class; ``docs/export.md``), applied by :func:`rkpart.export.export_module`; this module
keeps the configs and fixture-only preparation: :func:`_trained_like` (zero-initialised modulation made
non-zero, so a random-weight model is not degenerate) and DreamLite's GQA processor (which its U-Net installs).

:func:`export_family` writes one export through :func:`rkpart.export.export_module`; :func:`cached_export`
makes it once per (diffusers and torch versions, exporter, source of every function the export runs, the
product's modules included: :func:`rkpart.export.source_key`) under
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


def _anyflow_far_fixed() -> dict[str, Any]:
    # the step's layout: three chunks of one frame, two of them cached (the registry's kv_cache_inputs adapter)
    return {"chunk_partition": [1, 1, 1], "num_cached_chunks": 2}


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


def _zimage() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import ZImageTransformer2DModel

    m = ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2,
                                 n_refiner_layers=2, n_heads=2, n_kv_heads=2, cap_feat_dim=24, axes_dims=[4, 6, 6],
                                 axes_lens=[64, 16, 16])
    # batch-1 tensors; the registry's list_forward adapter hands the forward its per-sample lists (the pipeline's
    # unbind(0)): 6 caption
    # tokens and 16 image tokens, each padded to 32 by the model (SEQ_MULTI_OF)
    return m, {
        "x": torch.randn(1, 16, 1, 8, 8),
        "t": torch.tensor([0.3]),
        "cap_feats": torch.randn(1, 6, 24),
    }


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


def _sana_wm_refiner() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import SanaWMLTX2RefinerTransformer3DModel

    m = SanaWMLTX2RefinerTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16,
                                            cross_attention_dim=32, audio_in_channels=8, audio_out_channels=8,
                                            audio_num_attention_heads=2, audio_attention_head_dim=16,
                                            audio_cross_attention_dim=32, num_layers=2, caption_channels=24)
    # a denoising step of one AR block (2 latent frames of 4 x 4) against the KV cache of 1 sink frame and
    # 1 frame of refined history, per layer (layers, batch, tokens, inner dim): the cache is state the
    # previous forwards wrote, so it enters as graph inputs (the registry's kv_cache_inputs adapter)
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


def _sana_wm_refiner_fixed() -> dict[str, Any]:
    # the active block at frames 2-3, the sink shifted to sit just before the one history frame, as the pipeline
    # places it (the registry's kv_cache_inputs adapter makes the RoPE tables of these positions once)
    return {"rope_layout": {"frame_positions": [2, 3], "sink_frame_positions": [0], "height": 4, "width": 4,
                            "fps": 24.0}}


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


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("dit", _dit),
    Family("pixart", _pixart, _pixart_fixed),
    Family("sd3", _sd3, blocks=3),
    Family("flux", _flux, blocks=4),
    Family("sana", _sana),
    Family("cogvideox", _cogvideox),
    Family("wan", _wan),
    Family("chroma", _chroma, blocks=4),
    Family("lumina2", _lumina2, blocks=4),  # 2 refiner blocks + 2 blocks
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
    # per-block text-encoder layers (a list input, flattened by the registry's list_inputs adapter) projected by
    # caption_projection.i
    Family("bria_fibo", _bria_fibo, blocks=4),
    # Z-Image-like: 2 noise-refiner blocks, a 2-layer Perceiver (gist tokens read the text), 3 blocks over gist +
    # image tokens, the middle one an injection block (cross-attention); complex RoPE made real (rkpart.export registry)
    Family("bria_fibo2", _bria_fibo2, blocks=7),
    # sequence-first single-stream blocks sharing one adaLN modulation; zero-initialised: _trained_like
    Family("ernie_image", _ernie_image, prepare=_trained_like),
    # CogView4 anatomy (joint attention over text + image, one FFN applied to each stream); AR prior codes
    Family("glm_image", _glm_image, _glm_image_fixed),
    # dual-stream then single-stream blocks, each reading its own Llama layer; top-2 MoE FFNs on the image
    # stream (dense form, rkpart.export registry)
    Family("hidream_image", _hidream_image, blocks=4),
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
    Family("ideogram4", _ideogram4),  # packed text + image sequence, DiT blocks
    # text fusion: 2 layer-wise blocks (attention across tapped encoder layers, per token), 2 token refiners;
    # then 2 single-stream blocks over text + image
    Family("krea2", _krea2, blocks=6),
    # one dense block, then 2 expert-choice MoE blocks; image queries attend to image + text keys
    Family("nucleus_moe", _nucleus_moe, _nucleus_moe_fixed, blocks=3),
    # a Phi-3 decoder over [text tokens, time token, image tokens] (causal text, bidirectional image)
    Family("omnigen", _omnigen, _omnigen_fixed),
    # single-stream blocks over [text, target image] with one shared modulation; block-causal attention (a causal
    # text segment, then the image over everything); text tokens modulated from t = 0
    Family("qwenimage21", _qwenimage21, _qwenimage21_fixed),
    # 2 noise-refiner blocks (image, modulated), 2 context-refiner blocks (caption, unmodulated), then 2 joint blocks
    Family("zimage", _zimage, blocks=6),
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
    Family("kandinsky6_sr", _kandinsky6_sr),  # NABLA flex attention, dense
    Family("anyflow", _anyflow),  # complex RoPE rewritten to the real form
    # one cached autoregressive step: KV caches as inputs, real-form RoPE, flex attention (no mask) as SDPA
    Family("anyflow_far", _anyflow_far, _anyflow_far_fixed),
    # text (causal) and video streams in one packed sequence; lists adapted to one video, GQA's K/V repeated
    Family("cosmos3", _cosmos3, _cosmos3_fixed),
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
    Family("wan_animate", _wan_animate, blocks=6),
    Family("stable_audio3", _stable_audio3, prepare=_trained_like),  # zero-initialised in/out convs
    # 4 blocks: gated-delta-net linear and softmax camera (UCPE) self-attention alternating; camera transforms and
    # RoPE precomputed, RoPE in the real form (rkpart.export registry); zero-initialised conv_k: _trained_like
    Family("sana_wm", _sana_wm, blocks=4, prepare=_trained_like),
    # LTX-2 blocks run video-only over one AR block, self-attention over [sink, history, block] K/V
    Family("sana_wm_refiner", _sana_wm_refiner, _sana_wm_refiner_fixed),
)}
#: issue 28's sweep, diffusers 0.42: the audio DiTs (ACE-Step, LongCat-AudioDiT, MiniMax Music 3 and its RVQ depth
#: decoder), the older non-DiT transformers (Prior, T5 FiLM decoder, dual and temporal transformers), RFD4 Proteina
LATEST_H5: dict[str, Family] = {f.name: f for f in (
    Family("ace_step", _ace_step),  # block 0 sliding-window self-attention, block 1 full
    Family("longcat_audio", _longcat_audio, prepare=_trained_like),  # zero-initialised modulation
    Family("minimax_music3", _minimax_music3),
    Family("minimax_rvq", _minimax_rvq),
    Family("prior", _prior),
    Family("t5film", _t5film),
    Family("dual_transformer", _dual_transformer, blocks=4),  # two Transformer2DModels of 2 blocks side by side
    Family("transformer_temporal", _transformer_temporal, _transformer_temporal_fixed),
    Family("rfd4", _rfd4, _rfd4_fixed, blocks=3),  # 2 trunk layers + the pair update between them
    Family("easyanimate", _easyanimate),
    Family("lumina_next", _lumina_next, _lumina_next_fixed, prepare=_trained_like),
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


def _prepared(name: str, seed: int) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Family ``name``'s model (eval mode, seeded weights, fixture ``prepare`` applied), inputs and fixed
    arguments, before the product's patches."""
    import torch

    fam = ALL[name]
    torch.manual_seed(seed)
    model, inputs = fam.build()
    model = model.eval()
    fixed = fam.fixed()
    if fam.prepare is not None:
        fam.prepare(model, inputs, fixed)
    return model, inputs, fixed


def export_family(name: str, path: str | Path, *, dynamo: bool = False, seed: int = 0,
                  opset: int | None = None) -> dict[str, np.ndarray]:
    """Export family or variant ``name`` to ``path`` (static shapes) through the product's
    :func:`rkpart.export.export_module` (its patch registry; each patch checked against the unpatched
    model on the example inputs and on a second attention mask); returns the example inputs.

    ``opset`` defaults to 17 (TorchScript) and 18 (dynamo); ``opset=0`` takes the exporter's own
    default (what a user gets from a bare ``torch.onnx.export``: opset 20 for dynamo in torch 2.13).
    The export is not run under ONNX Runtime here (``check=False``): the sweep keeps exports ONNX
    Runtime refuses (``ORT_REFUSES``) and checks the others itself.

    Raises ``KeyError`` for an unknown family and :class:`rkpart.errors.ExportError` when the export fails.
    """
    from rkpart.export import OnnxOptions, export_module

    model, inputs, fixed = _prepared(name, seed)
    res = export_module(model, inputs, path, fixed=fixed, exporter="dynamo" if dynamo else "torchscript",
                        options=OnnxOptions(opset=_opset(opset, 18 if dynamo else 17), check=False))
    del res
    return example_inputs(name, seed)


def example_inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """The example inputs :func:`export_family` exports family ``name`` with (same seed, same patches: a
    list input flattened, camera transforms precomputed, ...)."""
    from rkpart.export import apply_patches

    model, inputs, fixed = _prepared(name, seed)
    apply_patches(model, inputs, fixed, exporter="dynamo", variants=[])
    return {k: v.numpy() for k, v in inputs.items()}


def torch_outputs(name: str, feeds: dict[str, np.ndarray], seed: int = 0) -> np.ndarray:
    """What the torch model family ``name`` (as :func:`export_family` exports it: same seed, same
    patches, TorchScript's RMSNorm decomposition left out) computes on ``feeds``: the reference for
    exports ONNX Runtime refuses as a whole."""
    import torch

    from rkpart.export import apply_patches

    model, inputs, fixed = _prepared(name, seed)
    apply_patches(model, inputs, fixed, exporter="dynamo", variants=[])
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(np.asarray(feeds[k])) for k in inputs}, **fixed, return_dict=False)[0]
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
    once per (diffusers and torch versions, exporter, source of every function the export runs: the
    fixture's and the product's, :func:`rkpart.export.source_key`) by :func:`cached_file`.
    """
    import diffusers
    import torch

    from rkpart.export import source_key

    fam = ALL[name]
    funcs: list[Any] = [fam.build, export_family, _prepared, _opset]
    funcs += [f for f in (fam.fixed, fam.prepare) if inspect.isfunction(f)]
    if fam.build in (_minimax_rvq, _t5film):
        funcs.append(_tuple_out)
    base = {_chroma_guidance: _chroma, _sd35: _sd3}.get(fam.build)
    if base is not None:
        funcs.append(base)  # the variant only calls it
    return cached_file(f"{name}-{exporter}", [diffusers.__version__, torch.__version__, exporter,
                                               *(inspect.getsource(f) for f in funcs),
                                               *source_key(CLASS_OF.get(name, ""), exporter)],
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
