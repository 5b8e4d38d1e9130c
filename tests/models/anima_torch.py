"""A small, faithful torch re-implementation of Anima's DiT (diffusers ``CosmosTransformer3DModel``).

Module names mirror diffusers (``patch_embed.proj``, ``time_embed.t_embedder.linear_1``,
``transformer_blocks.{i}.norm1.linear_1``, ``...attn1.to_q``, ``...attn1.norm_q``,
``...attn1.to_out.0``, ``...ff.net.0.proj``, ``...ff.net.2``, ``norm_out``, ``proj_out``) so that
the exported ONNX node names look like a real export.  diffusers itself is not imported: it is
an optional dependency and its ``Attention`` class pulls in far more than we need.

Differences from diffusers, all of which keep the computed function identical for Anima's
configuration: no learnable extra positional embedding (Cosmos-Predict2 has none), no
attention mask, no video fps scaling, and the padding mask is the all-zero mask Anima's
pipelines pass for a full image (concatenated as a 17th input channel).

Shared tensors and the block-0 naming trap
------------------------------------------
As in diffusers, the RoPE tables and the timestep embedding (``temb``,
``embedded_timestep``) are computed ONCE, outside the blocks, and fed to every block.  (The
RoPE tables depend only on static shapes, so the TorchScript exporter folds them into a
Constant per consumer; :mod:`tests.models.anima` keeps them as one shared pair instead.)

``SiLU(embedded_timestep)``, the first step of every AdaLN-LoRA, is computed lazily by the
first AdaLN that needs it -- block 0's ``norm1`` -- and reused by all the others (see
:class:`TimestepCache`).  The exporter names nodes after the module that runs them, so the
graph gets a whole-model tensor named ``/transformer_blocks.0/norm1/activation/Mul_output_0``
that every block and ``norm_out`` read: the trap real exports set for a partitioner that
groups nodes by name prefix.  It is deliberate.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tests.models.anima import AnimaConfig, rope_frequencies, timestep_frequencies

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def torch_dtype(cfg: AnimaConfig) -> torch.dtype:
    return _TORCH_DTYPES[cfg.dtype]


class RMSNorm(nn.Module):
    """diffusers ``RMSNorm`` (affine, no bias): variance in fp32, weight in the model dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            hidden_states = hidden_states.to(self.weight.dtype)
        return hidden_states * self.weight


class CosmosPatchEmbed(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, patch_size: tuple[int, int, int]) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Linear(in_channels * patch_size[0] * patch_size[1] * patch_size[2], out_channels,
                              bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = hidden_states.shape
        p_t, p_h, p_w = self.patch_size
        hidden_states = hidden_states.reshape(b, c, t // p_t, p_t, h // p_h, p_h, w // p_w, p_w)
        hidden_states = hidden_states.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7)
        return self.proj(hidden_states)


class Timesteps(nn.Module):
    """diffusers ``Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0)``.

    The frequency table comes from :func:`tests.models.anima.timestep_frequencies` (numpy)
    rather than ``torch.exp``: the two differ by an ulp, which timesteps near 1000 amplify to
    ~1e-4 in the sin/cos, and sharing the table lets tests compare to the ONNX builder tightly.
    """

    def __init__(self, num_channels: int) -> None:
        super().__init__()
        self.num_channels = num_channels

    def forward(self, timesteps: torch.Tensor) -> torch.Tensor:
        half = self.num_channels // 2
        emb = torch.from_numpy(timestep_frequencies(self.num_channels))
        emb = timesteps[:, None].float() * emb[None, :]
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
        return torch.cat([emb[:, half:], emb[:, :half]], dim=-1)


class CosmosTimestepEmbedding(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features, out_features, bias=False)
        self.activation = nn.SiLU()
        self.linear_2 = nn.Linear(out_features, 3 * out_features, bias=False)

    def forward(self, timesteps: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.activation(self.linear_1(timesteps)))


class CosmosEmbedding(nn.Module):
    """Shared timestep embedding: ``temb`` [B, 3*hidden] and ``embedded_timestep`` [B, hidden]."""

    def __init__(self, embedding_dim: int, condition_dim: int) -> None:
        super().__init__()
        self.time_proj = Timesteps(embedding_dim)
        self.t_embedder = CosmosTimestepEmbedding(embedding_dim, condition_dim)
        self.norm = RMSNorm(embedding_dim, eps=1e-6)

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        timesteps_proj = self.time_proj(timestep).type_as(hidden_states)
        temb = self.t_embedder(timesteps_proj)
        embedded_timestep = self.norm(timesteps_proj)
        return temb, embedded_timestep


class CosmosAdaLayerNormZero(nn.Module):
    """Affine-free LayerNorm + AdaLN-LoRA modulation producing (shift, scale, gate)."""

    def __init__(self, in_features: int, hidden_features: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(in_features, elementwise_affine=False, eps=1e-6)
        self.activation = nn.SiLU()
        self.linear_1 = nn.Linear(in_features, hidden_features, bias=False)
        self.linear_2 = nn.Linear(hidden_features, 3 * in_features, bias=False)

    def forward(self, hidden_states: torch.Tensor, timestep: TimestepCache,
                temb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedded_timestep = self.linear_2(self.linear_1(timestep.silu(self.activation)))
        embedded_timestep = embedded_timestep + temb
        shift, scale, gate = embedded_timestep.chunk(3, dim=-1)
        hidden_states = self.norm(hidden_states)
        shift, scale, gate = (x.unsqueeze(1) for x in (shift, scale, gate))
        hidden_states = hidden_states * (1 + scale) + shift
        return hidden_states, gate


class CosmosAdaLayerNorm(nn.Module):
    """Final-layer AdaLN (shift, scale only; adds the first 2*hidden of ``temb``)."""

    def __init__(self, in_features: int, hidden_features: int) -> None:
        super().__init__()
        self.embedding_dim = in_features
        self.activation = nn.SiLU()
        self.norm = nn.LayerNorm(in_features, elementwise_affine=False, eps=1e-6)
        self.linear_1 = nn.Linear(in_features, hidden_features, bias=False)
        self.linear_2 = nn.Linear(hidden_features, 2 * in_features, bias=False)

    def forward(self, hidden_states: torch.Tensor, timestep: TimestepCache, temb: torch.Tensor) -> torch.Tensor:
        embedded_timestep = self.linear_2(self.linear_1(timestep.silu(self.activation)))
        embedded_timestep = embedded_timestep + temb[..., : 2 * self.embedding_dim]
        shift, scale = embedded_timestep.chunk(2, dim=-1)
        hidden_states = self.norm(hidden_states)
        shift, scale = (x.unsqueeze(1) for x in (shift, scale))
        return hidden_states * (1 + scale) + shift


def _apply_rotary_emb(x: torch.Tensor, image_rotary_emb: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """diffusers ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-2)``."""
    cos, sin = image_rotary_emb
    cos = cos[None, None, :, :]
    sin = sin[None, None, :, :]
    x_real, x_imag = x.reshape(*x.shape[:-1], 2, -1).unbind(-2)
    x_rotated = torch.cat([-x_imag, x_real], dim=-1)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


class TimestepCache:
    """``embedded_timestep`` and its SiLU, computed lazily by the first AdaLN that needs it.

    Every AdaLN-LoRA (3 per block, plus ``norm_out``) starts with ``SiLU(embedded_timestep)``,
    and the input is the same for all of them, so the SiLU is computed once per forward pass
    and reused -- the kind of saving real inference ports make.  Because the first caller is
    block 0's ``norm1``, the TorchScript exporter scopes the shared SiLU as
    ``/transformer_blocks.0/norm1/activation/{Sigmoid,Mul}``, and every other block and the
    final layer read ``/transformer_blocks.0/norm1/activation/Mul_output_0``: a tensor shared
    by all blocks whose name says "block 0".  This is deliberate; it reproduces the trap of
    real exports for the partitioner (a name-prefix grouping would wrongly put a whole-model
    dependency inside block 0).
    """

    def __init__(self, embedded_timestep: torch.Tensor) -> None:
        self.embedded_timestep = embedded_timestep
        self._silu: torch.Tensor | None = None

    def silu(self, activation: nn.Module) -> torch.Tensor:
        if self._silu is None:
            self._silu = activation(self.embedded_timestep)
        return self._silu


class Attention(nn.Module):
    """diffusers ``Attention`` with ``CosmosAttnProcessor2_0`` (qk RMSNorm, optional RoPE)."""

    def __init__(self, query_dim: int, cross_attention_dim: int | None, heads: int, dim_head: int) -> None:
        super().__init__()
        inner = heads * dim_head
        kv_dim = cross_attention_dim if cross_attention_dim is not None else query_dim
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(kv_dim, inner, bias=False)
        self.to_v = nn.Linear(kv_dim, inner, bias=False)
        # diffusers' Attention default eps (1e-5) for the q/k RMSNorm.
        self.norm_q = RMSNorm(dim_head, eps=1e-5)
        self.norm_k = RMSNorm(dim_head, eps=1e-5)
        self.to_out = nn.ModuleList([nn.Linear(inner, query_dim, bias=False), nn.Dropout(0.0)])

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        query = self.to_q(hidden_states)
        key = self.to_k(encoder_hidden_states)
        value = self.to_v(encoder_hidden_states)
        query = query.unflatten(2, (self.heads, -1)).transpose(1, 2)
        key = key.unflatten(2, (self.heads, -1)).transpose(1, 2)
        value = value.unflatten(2, (self.heads, -1)).transpose(1, 2)
        query = self.norm_q(query)
        key = self.norm_k(key)
        if image_rotary_emb is not None:
            query = _apply_rotary_emb(query, image_rotary_emb)
            key = _apply_rotary_emb(key, image_rotary_emb)
        hidden_states = F.scaled_dot_product_attention(query, key, value, dropout_p=0.0, is_causal=False)
        hidden_states = hidden_states.transpose(1, 2).flatten(2, 3).type_as(query)
        hidden_states = self.to_out[0](hidden_states)
        return self.to_out[1](hidden_states)


class GELU(nn.Module):
    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(hidden_states), approximate="none")


class FeedForward(nn.Module):
    def __init__(self, dim: int, inner_dim: int) -> None:
        super().__init__()
        self.net = nn.ModuleList([GELU(dim, inner_dim), nn.Dropout(0.0), nn.Linear(inner_dim, dim, bias=False)])

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for module in self.net:
            hidden_states = module(hidden_states)
        return hidden_states


class CosmosTransformerBlock(nn.Module):
    def __init__(self, cfg: AnimaConfig) -> None:
        super().__init__()
        h = cfg.hidden
        self.norm1 = CosmosAdaLayerNormZero(h, cfg.adaln_lora_dim)
        self.attn1 = Attention(h, None, cfg.heads, cfg.head_dim)
        self.norm2 = CosmosAdaLayerNormZero(h, cfg.adaln_lora_dim)
        self.attn2 = Attention(h, cfg.context_dim, cfg.heads, cfg.head_dim)
        self.norm3 = CosmosAdaLayerNormZero(h, cfg.adaln_lora_dim)
        self.ff = FeedForward(h, cfg.ffn_dim)

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                embedded_timestep: TimestepCache, temb: torch.Tensor,
                image_rotary_emb: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        norm_hidden_states, gate = self.norm1(hidden_states, embedded_timestep, temb)
        attn_output = self.attn1(norm_hidden_states, image_rotary_emb=image_rotary_emb)
        hidden_states = hidden_states + gate * attn_output

        norm_hidden_states, gate = self.norm2(hidden_states, embedded_timestep, temb)
        attn_output = self.attn2(norm_hidden_states, encoder_hidden_states=encoder_hidden_states)
        hidden_states = hidden_states + gate * attn_output

        norm_hidden_states, gate = self.norm3(hidden_states, embedded_timestep, temb)
        ff_output = self.ff(norm_hidden_states)
        return hidden_states + gate * ff_output


class CosmosRotaryPosEmbed(nn.Module):
    """Cosmos 3-D RoPE: cos/sin tables [num_tokens, head_dim], float32.

    The angles come from :func:`tests.models.anima.rope_frequencies`, a numpy transcription
    of diffusers' ``CosmosRotaryPosEmbed.forward`` (NTK-scaled thetas, [t, h, w] * 2 layout),
    shared with the ONNX builder.  With static shapes the exporter folds them to constants.
    """

    def __init__(self, cfg: AnimaConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.from_numpy(rope_frequencies(self.cfg))
        return torch.cos(freqs), torch.sin(freqs)


class AnimaTransformer(nn.Module):
    """Anima / Cosmos-Predict2 DiT.

    Inputs: ``hidden_states`` [1, C, T, H, W] (latent), ``timestep`` [1] float32,
    ``encoder_hidden_states`` [1, context_len, context_dim].  Output: [1, C, T, H, W].
    """

    def __init__(self, cfg: AnimaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.patch_embed = CosmosPatchEmbed(cfg.in_channels, h, cfg.patch_size)
        self.rope = CosmosRotaryPosEmbed(cfg)
        self.time_embed = CosmosEmbedding(h, h)
        self.transformer_blocks = nn.ModuleList([CosmosTransformerBlock(cfg) for _ in range(cfg.num_blocks)])
        self.norm_out = CosmosAdaLayerNorm(h, cfg.adaln_lora_dim)
        pt, ph, pw = cfg.patch_size
        self.proj_out = nn.Linear(h, pt * ph * pw * cfg.latent_channels, bias=False)

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor,
                encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        b, _c, t, h, w = hidden_states.shape
        # Anima passes an all-zero padding mask for a full image; concat it as channel 17.
        padding_mask = hidden_states.new_zeros(b, 1, t, h, w)
        hidden_states = torch.cat([hidden_states, padding_mask], dim=1)

        image_rotary_emb = self.rope()

        p_t, p_h, p_w = self.cfg.patch_size
        post_t, post_h, post_w = t // p_t, h // p_h, w // p_w
        hidden_states = self.patch_embed(hidden_states).flatten(1, 3)

        temb, embedded = self.time_embed(hidden_states, timestep)
        embedded_timestep = TimestepCache(embedded)

        for block in self.transformer_blocks:
            hidden_states = block(hidden_states, encoder_hidden_states, embedded_timestep, temb,
                                  image_rotary_emb)

        hidden_states = self.norm_out(hidden_states, embedded_timestep, temb)
        hidden_states = self.proj_out(hidden_states)
        hidden_states = hidden_states.unflatten(2, (p_h, p_w, p_t, -1))
        hidden_states = hidden_states.unflatten(1, (post_t, post_h, post_w))
        # Not the inverse of patchify, as in diffusers: the channel order of proj_out is (p_h, p_w, p_t, C).
        hidden_states = hidden_states.permute(0, 7, 1, 6, 2, 4, 3, 5)
        return hidden_states.flatten(6, 7).flatten(4, 5).flatten(2, 3)


# -- construction and export -------------------------------------------------------------------


def make_model(cfg: AnimaConfig, seed: int = 0) -> AnimaTransformer:
    """Build the module with the same seeded weights :func:`tests.models.anima.build_anima_onnx` writes."""
    from tests.models.anima import generate_weight, weight_specs

    model = AnimaTransformer(cfg)
    state = {spec.name: torch.from_numpy(generate_weight(spec, seed)) for spec in weight_specs(cfg)}
    missing, unexpected = model.load_state_dict(state, strict=True)
    assert not missing and not unexpected
    return model.to(torch_dtype(cfg)).eval()


def example_inputs(cfg: AnimaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs keyed by ONNX input name (timestep stays float32, as in diffusers)."""
    rng = np.random.default_rng(seed)
    dt = cfg.np_dtype
    return {
        "hidden_states": rng.standard_normal(
            (1, cfg.latent_channels, cfg.latent_frames, cfg.latent_height, cfg.latent_width)
        ).astype(dt),
        "timestep": np.array([rng.uniform(0.0, 1000.0)], dtype=np.float32),
        "encoder_hidden_states": rng.standard_normal((1, cfg.context_len, cfg.context_dim)).astype(dt),
    }


INPUT_NAMES = ["hidden_states", "timestep", "encoder_hidden_states"]
OUTPUT_NAMES = ["sample"]


def _export(cfg: AnimaConfig, path: str | Path, seed: int, *, dynamo: bool) -> Path:
    from rkpart.io import atomic_writer

    path = Path(path)
    model = make_model(cfg, seed)
    args = tuple(torch.from_numpy(v) for v in example_inputs(cfg, seed).values())
    with torch.no_grad(), atomic_writer(path) as tmp, warnings.catch_warnings():
        # Expected noise: from_numpy constants (intended, see Timesteps) and the legacy-exporter notice.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        if dynamo:
            program = torch.onnx.export(model, args, input_names=INPUT_NAMES, output_names=OUTPUT_NAMES,
                                        dynamo=True, optimize=True, verbose=False)
            assert program is not None
            program.save(str(tmp))
        else:
            torch.onnx.export(model, args, str(tmp), input_names=INPUT_NAMES, output_names=OUTPUT_NAMES,
                              opset_version=17, dynamo=False, do_constant_folding=True)
    return path


def export_torchscript(cfg: AnimaConfig, path: str | Path, seed: int = 0) -> Path:
    """Export with the TorchScript exporter (``dynamo=False``, opset 17, static shapes, batch 1)."""
    return _export(cfg, path, seed, dynamo=False)


def export_dynamo(cfg: AnimaConfig, path: str | Path, seed: int = 0) -> Path:
    """Export with the dynamo exporter (``torch.export`` + onnxscript), static shapes, batch 1."""
    return _export(cfg, path, seed, dynamo=True)
