"""Anima (Cosmos-Predict2-2B) DiT as a pure-ONNX graph: config + builder.

Anima's denoiser is diffusers' ``CosmosTransformer3DModel`` at the Cosmos-Predict2-2B size.
:class:`AnimaConfig` describes it at any size; :func:`build_anima_onnx` writes the same graph
the TorchScript exporter produces from :mod:`tests.models.anima_torch` (same node names,
same op patterns), without torch, streaming weights tensor by tensor so that the full-size
fp16 model (~3.9 GB) never sits in memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
import onnx.numpy_helper

DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class AnimaConfig:
    """Size and precision of an Anima-style DiT.

    Defaults are the full Cosmos-Predict2-2B-Text2Image transformer at 512 px.
    Image tokens = ``latent_frames/pt * latent_height/ph * latent_width/pw``.
    """

    num_blocks: int = 28
    hidden: int = 2048
    heads: int = 16
    ffn_dim: int = 8192
    context_dim: int = 1024
    context_len: int = 512
    latent_channels: int = 16
    latent_frames: int = 1
    latent_height: int = 64
    latent_width: int = 64
    patch_size: tuple[int, int, int] = (1, 2, 2)
    adaln_lora_dim: int = 256
    #: NTK RoPE scaling (t, h, w) of Cosmos-Predict2-2B-Text2Image.
    rope_scale: tuple[float, float, float] = (1.0, 4.0, 4.0)
    #: RoPE tables are built for positions up to max_size // patch_size.
    max_size: tuple[int, int, int] = (128, 240, 240)
    dtype: str = "float16"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.head_dim < 12 or self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even and >= 12 for 3-D RoPE")
        if self.hidden % 2:
            raise ValueError("hidden must be even (sinusoidal timestep embedding)")
        pt, ph, pw = self.patch_size
        if self.latent_frames % pt or self.latent_height % ph or self.latent_width % pw:
            raise ValueError(f"latent size must be divisible by patch_size {self.patch_size}")
        for name in ("num_blocks", "ffn_dim", "context_dim", "context_len", "latent_channels",
                     "adaln_lora_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    # -- presets ---------------------------------------------------------------------------

    @classmethod
    def tiny(cls, **overrides: object) -> AnimaConfig:
        """2 blocks, hidden 96, 4 heads, 64 image tokens, fp32: the bundled example's size.

        Hidden 96 (not 128) keeps the fp32 TorchScript export of this size under 2 MB.
        """
        base: dict[str, object] = dict(
            num_blocks=2, hidden=96, heads=4, ffn_dim=384, context_dim=64, context_len=16,
            latent_height=16, latent_width=16, adaln_lora_dim=32, dtype="float32",
        )
        base.update(overrides)
        return cls(**base)  # type: ignore[arg-type]

    @classmethod
    def full(cls, resolution: int = 512, **overrides: object) -> AnimaConfig:
        """The real Cosmos-Predict2-2B size; ``resolution`` px -> (resolution/16)^2 tokens."""
        if resolution % 16:
            raise ValueError(f"resolution must be a multiple of 16, got {resolution}")
        base: dict[str, object] = dict(latent_height=resolution // 8, latent_width=resolution // 8)
        base.update(overrides)
        return cls(**base)  # type: ignore[arg-type]

    def replace(self, **changes: object) -> AnimaConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    # -- derived sizes ---------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def grid(self) -> tuple[int, int, int]:
        """Token grid (T, H, W) after patchify."""
        pt, ph, pw = self.patch_size
        return self.latent_frames // pt, self.latent_height // ph, self.latent_width // pw

    @property
    def num_tokens(self) -> int:
        t, h, w = self.grid
        return t * h * w

    @property
    def in_channels(self) -> int:
        """Patch-embed input channels: latent + the padding-mask channel."""
        return self.latent_channels + 1

    @property
    def np_dtype(self) -> type[np.floating]:
        return np.float16 if self.dtype == "float16" else np.float32

    def param_count(self) -> int:
        """Number of weights (the RoPE / timestep tables are not counted)."""
        h, f, c, r = self.hidden, self.ffn_dim, self.context_dim, self.adaln_lora_dim
        pt, ph, pw = self.patch_size
        block = 2 * h * h + 2 * h * h  # attn1 q,k,v,o
        block += 2 * h * h + 2 * c * h  # attn2 q,o + k,v from context
        block += 4 * self.head_dim  # q/k RMSNorm weights
        block += 2 * h * f  # ff
        block += 3 * (h * r + r * 3 * h)  # AdaLN-LoRA
        top = self.in_channels * pt * ph * pw * h  # patch_embed
        top += h * h + h * 3 * h + h  # t_embedder + time_embed.norm
        top += h * r + r * 2 * h  # norm_out
        top += h * pt * ph * pw * self.latent_channels  # proj_out
        return self.num_blocks * block + top


# -- shared numerics (used by the builder and by anima_torch, so both agree bit for bit) -----


def rope_frequencies(cfg: AnimaConfig) -> np.ndarray:
    """Cosmos 3-D RoPE angles, float32 [num_tokens, head_dim] (``CosmosRotaryPosEmbed``)."""
    d = cfg.head_dim
    dim_h = d // 6 * 2
    dim_w = d // 6 * 2
    dim_t = d - dim_h - dim_w
    st, sh, sw = cfg.rope_scale
    h_theta = 10000.0 * sh ** (dim_h / (dim_h - 2))
    w_theta = 10000.0 * sw ** (dim_w / (dim_w - 2))
    t_theta = 10000.0 * st ** (dim_t / (dim_t - 2))
    t, h, w = cfg.grid

    def _freqs(theta: float, dim: int) -> np.ndarray:
        rng = np.arange(0, dim, 2, dtype=np.float32)[: dim // 2] / np.float32(dim)
        return (np.float32(1.0) / np.float32(theta) ** rng).astype(np.float32)

    seq_t = np.arange(t, dtype=np.float32)
    seq_h = np.arange(h, dtype=np.float32)
    seq_w = np.arange(w, dtype=np.float32)
    emb_t = np.outer(seq_t, _freqs(t_theta, dim_t))[:, None, None, :].repeat(h, 1).repeat(w, 2)
    emb_h = np.outer(seq_h, _freqs(h_theta, dim_h))[None, :, None, :].repeat(t, 0).repeat(w, 2)
    emb_w = np.outer(seq_w, _freqs(w_theta, dim_w))[None, None, :, :].repeat(t, 0).repeat(h, 1)
    freqs = np.concatenate([emb_t, emb_h, emb_w] * 2, axis=-1).reshape(t * h * w, d)
    return freqs.astype(np.float32)


def timestep_frequencies(dim: int) -> np.ndarray:
    """``exp(-ln(10000) * i / half)`` for the sinusoidal timestep projection, float32 [dim // 2]."""
    half = dim // 2
    exponent = np.float32(-math.log(10000)) * np.arange(half, dtype=np.float32)
    return np.exp(exponent / np.float32(half)).astype(np.float32)


# -- weights ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightSpec:
    """One parameter: torch name, torch shape ([out, in] for Linear), and init kind."""

    name: str
    shape: tuple[int, ...]
    kind: str  # "linear" (N(0, 1/fan_in)) or "norm" (1 + N(0, 0.1))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def weight_specs(cfg: AnimaConfig) -> list[WeightSpec]:
    """Every parameter of the model, in ``state_dict`` order."""
    h, r = cfg.hidden, cfg.adaln_lora_dim
    pt, ph, pw = cfg.patch_size
    specs = [
        WeightSpec("patch_embed.proj.weight", (h, cfg.in_channels * pt * ph * pw), "linear"),
        WeightSpec("time_embed.t_embedder.linear_1.weight", (h, h), "linear"),
        WeightSpec("time_embed.t_embedder.linear_2.weight", (3 * h, h), "linear"),
        WeightSpec("time_embed.norm.weight", (h,), "norm"),
    ]
    for i in range(cfg.num_blocks):
        p = f"transformer_blocks.{i}"
        for norm, attn, kv in (("norm1", "attn1", h), ("norm2", "attn2", cfg.context_dim)):
            specs += [
                WeightSpec(f"{p}.{norm}.linear_1.weight", (r, h), "linear"),
                WeightSpec(f"{p}.{norm}.linear_2.weight", (3 * h, r), "linear"),
                WeightSpec(f"{p}.{attn}.to_q.weight", (h, h), "linear"),
                WeightSpec(f"{p}.{attn}.to_k.weight", (h, kv), "linear"),
                WeightSpec(f"{p}.{attn}.to_v.weight", (h, kv), "linear"),
                WeightSpec(f"{p}.{attn}.norm_q.weight", (cfg.head_dim,), "norm"),
                WeightSpec(f"{p}.{attn}.norm_k.weight", (cfg.head_dim,), "norm"),
                WeightSpec(f"{p}.{attn}.to_out.0.weight", (h, h), "linear"),
            ]
        specs += [
            WeightSpec(f"{p}.norm3.linear_1.weight", (r, h), "linear"),
            WeightSpec(f"{p}.norm3.linear_2.weight", (3 * h, r), "linear"),
            WeightSpec(f"{p}.ff.net.0.proj.weight", (cfg.ffn_dim, h), "linear"),
            WeightSpec(f"{p}.ff.net.2.weight", (h, cfg.ffn_dim), "linear"),
        ]
    specs += [
        WeightSpec("norm_out.linear_1.weight", (r, h), "linear"),
        WeightSpec("norm_out.linear_2.weight", (2 * h, r), "linear"),
        WeightSpec("proj_out.weight", (pt * ph * pw * cfg.latent_channels, h), "linear"),
    ]
    return specs


def generate_weight(spec: WeightSpec, seed: int) -> np.ndarray:
    """Deterministic float32 values for one parameter (torch layout).

    Each tensor has its own stream keyed by (seed, name), so any single tensor can be
    regenerated without the others: that is what lets the builder stream weights to disk.
    """
    key = int.from_bytes(hashlib.sha256(spec.name.encode()).digest()[:8], "little")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, key])))
    values = rng.standard_normal(spec.shape, dtype=np.float32)
    if spec.kind == "norm":
        return (np.float32(1.0) + np.float32(0.1) * values).astype(np.float32)
    fan_in = spec.shape[-1]
    return (values * np.float32(1.0 / math.sqrt(fan_in))).astype(np.float32)


# -- ONNX builder -------------------------------------------------------------------------------

OPSET = 17
IR_VERSION = 8
INPUT_NAMES = ("hidden_states", "timestep", "encoder_hidden_states")
OUTPUT_NAME = "sample"
#: Above this many weight bytes ``external_data=None`` writes a side file (protobuf caps at 2 GiB).
AUTO_EXTERNAL_BYTES = 1 << 30
#: External tensors start on page boundaries so the data file can be mmapped tensor by tensor.
_ALIGN = 4096

_ONNX_DTYPE = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16}


class _WeightSink:
    """Turns arrays into initializers: inline ``raw_data``, or appended to an external file."""

    def __init__(self, data_file: BinaryIO | None, location: str) -> None:
        self._file = data_file
        self._location = location
        self._offset = 0

    def tensor(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        array = np.ascontiguousarray(array)
        proto = onnx.TensorProto()
        proto.name = name
        proto.data_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
        proto.dims.extend(array.shape)
        if self._file is None:
            proto.raw_data = array.tobytes()
            return proto
        pad = -self._offset % _ALIGN
        if pad:
            self._file.write(b"\0" * pad)
            self._offset += pad
        # Written straight from the array buffer: the bytes never exist twice in memory.
        self._file.write(array.data)
        proto.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self._location), ("offset", str(self._offset)),
                           ("length", str(array.nbytes))):
            entry = proto.external_data.add()
            entry.key, entry.value = key, value
        self._offset += array.nbytes
        return proto


class _GraphBuilder:
    """Appends nodes named the way the TorchScript exporter names them.

    A node in module scope ``/a/b`` of type ``Op`` is ``/a/b/Op``, then ``/a/b/Op_1``, ...; its
    outputs are ``<node name>_output_<i>``.  Weights are initializers named after the torch
    parameter; Linear weights are stored transposed ([in, out]) because that is what MatMul
    consumes (the exporter does the same transpose but names the result ``onnx::MatMul_<n>``).
    """

    def __init__(self, cfg: AnimaConfig, seed: int, sink: _WeightSink, decomposed_layernorm: bool) -> None:
        self.cfg = cfg
        self.seed = seed
        self.sink = sink
        self.decomposed_layernorm = decomposed_layernorm
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counts: dict[tuple[str, str], int] = {}
        self._specs = {spec.name: spec for spec in weight_specs(cfg)}
        self.dtype = cfg.np_dtype
        self.onnx_dtype = _ONNX_DTYPE[cfg.dtype]

    # -- primitives ------------------------------------------------------------------------

    def op(self, scope: str, op_type: str, inputs: list[str], n_out: int = 1, *,
           output: str | None = None, **attrs: Any) -> list[str]:
        key = (scope, op_type)
        k = self._counts.get(key, 0)
        self._counts[key] = k + 1
        name = f"{scope}/{op_type}" + (f"_{k}" if k else "")
        outputs = [f"{name}_output_{i}" for i in range(n_out)]
        if output is not None:
            outputs = [output]
        self.nodes.append(onnx.helper.make_node(op_type, inputs, outputs, name=name, **attrs))
        return outputs

    def op1(self, scope: str, op_type: str, inputs: list[str], **attrs: Any) -> str:
        return self.op(scope, op_type, inputs, **attrs)[0]

    def const(self, scope: str, value: np.ndarray | float | list[int], dtype: Any = None) -> str:
        if isinstance(value, list):
            array = np.asarray(value, dtype=np.int64)
        elif isinstance(value, np.ndarray):
            array = value
        else:
            array = np.asarray(value, dtype=dtype if dtype is not None else self.dtype)
        tensor = onnx.numpy_helper.from_array(np.ascontiguousarray(array))
        return self.op1(scope, "Constant", [], value=tensor)

    def initializer(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(self.sink.tensor(name, array))
        return name

    def weight(self, name: str, *, linear: bool = True) -> str:
        values = generate_weight(self._specs[name], self.seed)
        if linear:
            values = values.T
        return self.initializer(name, values.astype(self.dtype))

    def linear(self, scope: str, x: str, param: str) -> str:
        return self.op1(scope, "MatMul", [x, self.weight(param)])

    def cast(self, scope: str, x: str, to: int) -> str:
        return self.op1(scope, "Cast", [x], to=to)

    # -- layers (one per torch module) -------------------------------------------------------

    def rms_norm(self, scope: str, x: str, param: str, eps: float) -> str:
        f32 = onnx.TensorProto.FLOAT
        xf = self.cast(scope, x, f32)
        sq = self.op1(scope, "Pow", [xf, self.const(scope, 2.0, np.float32)])
        var = self.op1(scope, "ReduceMean", [sq], axes=[-1], keepdims=1)
        var = self.op1(scope, "Add", [var, self.const(scope, eps, np.float32)])
        rstd = self.op1(scope, "Div", [self.const(scope, 1.0, np.float32), self.op1(scope, "Sqrt", [var])])
        y = self.op1(scope, "Mul", [xf, rstd])
        if self.onnx_dtype != f32:
            y = self.cast(scope, y, self.onnx_dtype)
        return self.op1(scope, "Mul", [y, self.weight(param, linear=False)])

    def layer_norm(self, scope: str, x: str) -> str:
        """Affine-free LayerNorm, eps 1e-6, over the last axis."""
        eps = 1e-6
        if not self.decomposed_layernorm:
            h = self.cfg.hidden
            scale = self.const(scope, np.ones(h, dtype=self.dtype))
            bias = self.const(scope, np.zeros(h, dtype=self.dtype))
            return self.op1(scope, "LayerNormalization", [x, scale, bias], axis=-1, epsilon=eps)
        # The opset-13 pattern the TorchScript exporter emits for layer_norm.
        mean = self.op1(scope, "ReduceMean", [x], axes=[-1], keepdims=1)
        centred = self.op1(scope, "Sub", [x, mean])
        sq = self.op1(scope, "Pow", [centred, self.const(scope, 2.0)])
        var = self.op1(scope, "ReduceMean", [sq], axes=[-1], keepdims=1)
        var = self.op1(scope, "Add", [var, self.const(scope, eps)])
        return self.op1(scope, "Div", [centred, self.op1(scope, "Sqrt", [var])])

    def chunk(self, scope: str, x: str, parts: int, size: int) -> list[str]:
        """``x.chunk(parts, -1)`` as Slices (what the exporter emits for chunk of a static dim)."""
        axes = self.const(scope, [-1])
        out = []
        for i in range(parts):
            starts, ends = self.const(scope, [i * size]), self.const(scope, [(i + 1) * size])
            out.append(self.op1(scope, "Slice", [x, starts, ends, axes]))
        return out

    def modulate(self, scope: str, x: str, shift: str, scale: str) -> str:
        """``norm(x) * (1 + scale) + shift`` with [1, h] shift/scale unsqueezed to [1, 1, h]."""
        normed = self.layer_norm(f"{scope}/norm", x)
        shift = self.op1(scope, "Unsqueeze", [shift, self.const(scope, [1])])
        scale = self.op1(scope, "Unsqueeze", [scale, self.const(scope, [1])])
        scale = self.op1(scope, "Add", [scale, self.const(scope, 1.0)])
        return self.op1(scope, "Add", [self.op1(scope, "Mul", [normed, scale]), shift])

    def ada_norm_zero(self, scope: str, x: str, silu: str, temb: str) -> tuple[str, str]:
        prm = scope.lstrip("/").replace("/", ".")
        emb = self.linear(f"{scope}/linear_1", silu, f"{prm}.linear_1.weight")
        emb = self.linear(f"{scope}/linear_2", emb, f"{prm}.linear_2.weight")
        emb = self.op1(scope, "Add", [emb, temb])
        shift, scale, gate = self.chunk(scope, emb, 3, self.cfg.hidden)
        out = self.modulate(scope, x, shift, scale)
        gate = self.op1(scope, "Unsqueeze", [gate, self.const(scope, [1])])
        return out, gate

    def rotary(self, scope: str, x: str, cos: str, sin: str) -> str:
        """``apply_rotary_emb(use_real_unbind_dim=-2)``: x*cos + cat(-x2, x1)*sin, in fp32."""
        half = self.cfg.head_dim // 2
        axes = self.const(scope, [-1])
        x1 = self.op1(scope, "Slice", [x, self.const(scope, [0]), self.const(scope, [half]), axes])
        x2 = self.op1(scope, "Slice", [x, self.const(scope, [half]), self.const(scope, [2 * half]), axes])
        rotated = self.op1(scope, "Concat", [self.op1(scope, "Neg", [x2]), x1], axis=-1)
        f32 = onnx.TensorProto.FLOAT
        a = self.op1(scope, "Mul", [self.cast(scope, x, f32), cos])
        b = self.op1(scope, "Mul", [self.cast(scope, rotated, f32), sin])
        return self.cast(scope, self.op1(scope, "Add", [a, b]), self.onnx_dtype)

    def attention(self, scope: str, x: str, context: str | None, rope: tuple[str, str] | None) -> str:
        cfg = self.cfg
        prm = scope.lstrip("/").replace("/", ".")
        kv_in = x if context is None else context
        q = self.linear(f"{scope}/to_q", x, f"{prm}.to_q.weight")
        k = self.linear(f"{scope}/to_k", kv_in, f"{prm}.to_k.weight")
        v = self.linear(f"{scope}/to_v", kv_in, f"{prm}.to_v.weight")
        n_q = cfg.num_tokens
        n_kv = cfg.num_tokens if context is None else cfg.context_len

        def heads(t: str, n: int) -> str:
            t = self.op1(scope, "Reshape", [t, self.const(scope, [1, n, cfg.heads, cfg.head_dim])])
            return self.op1(scope, "Transpose", [t], perm=[0, 2, 1, 3])

        q, k, v = heads(q, n_q), heads(k, n_kv), heads(v, n_kv)
        q = self.rms_norm(f"{scope}/norm_q", q, f"{prm}.norm_q.weight", 1e-5)
        k = self.rms_norm(f"{scope}/norm_k", k, f"{prm}.norm_k.weight", 1e-5)
        if rope is not None:
            q = self.rotary(scope, q, *rope)
            k = self.rotary(scope, k, *rope)
        # scaled_dot_product_attention as the exporter decomposes it: sqrt(scale) on q and k^T.
        root_scale = math.sqrt(1.0 / math.sqrt(cfg.head_dim))
        kt = self.op1(scope, "Transpose", [k], perm=[0, 1, 3, 2])
        q = self.op1(scope, "Mul", [q, self.const(scope, root_scale)])
        kt = self.op1(scope, "Mul", [kt, self.const(scope, root_scale)])
        scores = self.op1(scope, "MatMul", [q, kt])
        probs = self.op1(scope, "Softmax", [scores], axis=-1)
        out = self.op1(scope, "MatMul", [probs, v])
        out = self.op1(scope, "Transpose", [out], perm=[0, 2, 1, 3])
        out = self.op1(scope, "Reshape", [out, self.const(scope, [1, n_q, cfg.hidden])])
        return self.linear(f"{scope}/to_out.0", out, f"{prm}.to_out.0.weight")

    def feed_forward(self, scope: str, x: str) -> str:
        prm = scope.lstrip("/").replace("/", ".")
        act = f"{scope}/net.0"
        h = self.linear(f"{act}/proj", x, f"{prm}.net.0.proj.weight")
        # Exact GELU in the exporter's Erf form: x * (erf(x / sqrt 2) + 1) * 0.5.
        e = self.op1(act, "Erf", [self.op1(act, "Div", [h, self.const(act, math.sqrt(2.0))])])
        e = self.op1(act, "Add", [e, self.const(act, 1.0)])
        h = self.op1(act, "Mul", [self.op1(act, "Mul", [h, e]), self.const(act, 0.5)])
        return self.linear(f"{scope}/net.2", h, f"{prm}.net.2.weight")

    def block(self, i: int, x: str, context: str, silu: str, temb: str, rope: tuple[str, str]) -> str:
        s = f"/transformer_blocks.{i}"
        normed, gate = self.ada_norm_zero(f"{s}/norm1", x, silu, temb)
        x = self.op1(s, "Add", [x, self.op1(s, "Mul", [gate, self.attention(f"{s}/attn1", normed, None, rope)])])
        normed, gate = self.ada_norm_zero(f"{s}/norm2", x, silu, temb)
        x = self.op1(s, "Add", [x, self.op1(s, "Mul", [gate, self.attention(f"{s}/attn2", normed, context, None)])])
        normed, gate = self.ada_norm_zero(f"{s}/norm3", x, silu, temb)
        return self.op1(s, "Add", [x, self.op1(s, "Mul", [gate, self.feed_forward(f"{s}/ff", normed)])])

    # -- whole model ---------------------------------------------------------------------------

    def build(self) -> onnx.GraphProto:
        cfg = self.cfg
        h = cfg.hidden
        t, hh, ww = cfg.grid
        pt, ph, pw = cfg.patch_size
        f32 = onnx.TensorProto.FLOAT
        latent_shape = [1, cfg.latent_channels, cfg.latent_frames, cfg.latent_height, cfg.latent_width]

        # Padding mask: Anima passes all zeros for a full image; it is channel 17 of the patch input.
        zeros = self.const("", np.zeros([1, 1, *latent_shape[2:]], dtype=self.dtype))
        x = self.op1("", "Concat", ["hidden_states", zeros], axis=1)
        pe = "/patch_embed"
        x = self.op1(pe, "Reshape", [x, self.const(pe, [1, cfg.in_channels, t, pt, hh, ph, ww, pw])])
        x = self.op1(pe, "Transpose", [x], perm=[0, 2, 4, 6, 1, 3, 5, 7])
        x = self.op1(pe, "Reshape", [x, self.const(pe, [1, t, hh, ww, cfg.in_channels * pt * ph * pw])])
        x = self.linear(f"{pe}/proj", x, "patch_embed.proj.weight")
        x = self.op1("", "Reshape", [x, self.const("", [1, cfg.num_tokens, h])])

        # RoPE tables: computed once, shared by every block's self-attention.
        freqs = rope_frequencies(cfg)
        rope = (self.initializer("/rope/Cos_output_0", np.cos(freqs).astype(np.float32)),
                self.initializer("/rope/Sin_output_0", np.sin(freqs).astype(np.float32)))

        # Timestep embedding (shared): temb [1, 3h] and embedded_timestep [1, h].
        tp = "/time_embed/time_proj"
        ts = self.op1(tp, "Unsqueeze", ["timestep", self.const(tp, [1])])
        ts = self.cast(tp, ts, f32)
        ts = self.op1(tp, "Mul", [ts, self.const(tp, timestep_frequencies(h)[None, :])])
        sincos = self.op1(tp, "Concat", [self.op1(tp, "Sin", [ts]), self.op1(tp, "Cos", [ts])], axis=-1)
        half = h // 2
        axes = self.const(tp, [-1])
        hi = self.op1(tp, "Slice", [sincos, self.const(tp, [half]), self.const(tp, [h]), axes])
        lo = self.op1(tp, "Slice", [sincos, self.const(tp, [0]), self.const(tp, [half]), axes])
        proj = self.op1(tp, "Concat", [hi, lo], axis=-1)
        if self.onnx_dtype != f32:
            proj = self.cast("/time_embed", proj, self.onnx_dtype)
        te = "/time_embed/t_embedder"
        temb = self.linear(f"{te}/linear_1", proj, "time_embed.t_embedder.linear_1.weight")
        temb = self.op1(f"{te}/activation", "Mul", [temb, self.op1(f"{te}/activation", "Sigmoid", [temb])])
        temb = self.linear(f"{te}/linear_2", temb, "time_embed.t_embedder.linear_2.weight")
        embedded = self.rms_norm("/time_embed/norm", proj, "time_embed.norm.weight", 1e-6)

        # SiLU(embedded_timestep) is computed once, lazily, by the first AdaLN (block 0's norm1),
        # exactly as anima_torch.TimestepCache does: all blocks read a block-0-named tensor.
        act = "/transformer_blocks.0/norm1/activation"
        silu = self.op1(act, "Mul", [embedded, self.op1(act, "Sigmoid", [embedded])])

        for i in range(cfg.num_blocks):
            x = self.block(i, x, "encoder_hidden_states", silu, temb, rope)

        no = "/norm_out"
        emb = self.linear(f"{no}/linear_1", silu, "norm_out.linear_1.weight")
        emb = self.linear(f"{no}/linear_2", emb, "norm_out.linear_2.weight")
        temb2 = self.op1(no, "Slice", [temb, self.const(no, [0]), self.const(no, [2 * h]), self.const(no, [-1])])
        emb = self.op1(no, "Add", [emb, temb2])
        shift, scale = self.chunk(no, emb, 2, h)
        x = self.modulate(no, x, shift, scale)
        x = self.linear("/proj_out", x, "proj_out.weight")

        # Unpatchify (diffusers' order: proj_out channels are (p_h, p_w, p_t, C)).
        x = self.op1("", "Reshape", [x, self.const("", [1, t, hh, ww, ph, pw, pt, cfg.latent_channels])])
        x = self.op1("", "Transpose", [x], perm=[0, 7, 1, 6, 2, 4, 3, 5])
        self.op("", "Reshape", [x, self.const("", latent_shape)], output=OUTPUT_NAME)

        inputs = [
            onnx.helper.make_tensor_value_info("hidden_states", self.onnx_dtype, latent_shape),
            onnx.helper.make_tensor_value_info("timestep", f32, [1]),
            onnx.helper.make_tensor_value_info("encoder_hidden_states", self.onnx_dtype,
                                               [1, cfg.context_len, cfg.context_dim]),
        ]
        outputs = [onnx.helper.make_tensor_value_info(OUTPUT_NAME, self.onnx_dtype, latent_shape)]
        return onnx.helper.make_graph(self.nodes, "anima_dit", inputs, outputs, self.initializers)


def weight_bytes(cfg: AnimaConfig) -> int:
    """Bytes of weights the builder writes (parameters in ``cfg.dtype`` + fp32 RoPE tables)."""
    itemsize = np.dtype(cfg.np_dtype).itemsize
    return cfg.param_count() * itemsize + 2 * cfg.num_tokens * cfg.head_dim * 4


def build_anima_onnx(cfg: AnimaConfig, path: str | os.PathLike[str], *, seed: int = 0,
                     external_data: bool | None = None, decomposed_layernorm: bool = False) -> Path:
    """Write an Anima-style DiT as ONNX (opset 17, static shapes, batch 1).

    Parameters
    ----------
    cfg
        Model size and dtype (:meth:`AnimaConfig.tiny`, :meth:`AnimaConfig.full`).
    path
        Output ``.onnx`` file.  With external data the weights go to ``<path>.data`` next to it.
    seed
        Weight seed; the same (cfg, seed) gives byte-identical files.
    external_data
        ``True``/``False`` to force; ``None`` chooses external above 1 GiB of weights.
    decomposed_layernorm
        Emit the affine-free LayerNorms as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div instead of
        ``LayerNormalization``.

    Returns
    -------
    Path
        ``path``.

    Weights are generated and written one tensor at a time, so peak memory is one tensor
    (plus the small graph), not the whole model.  Both files are written atomically.
    """
    from rkpart.io import atomic_writer

    path = Path(path)
    if external_data is None:
        external_data = weight_bytes(cfg) > AUTO_EXTERNAL_BYTES
    data_path = path.with_name(path.name + ".data")
    with contextlib.ExitStack() as stack:
        data_file: BinaryIO | None = None
        if external_data:
            data_tmp = stack.enter_context(atomic_writer(data_path))
            data_file = stack.enter_context(open(data_tmp, "wb"))
        sink = _WeightSink(data_file, data_path.name)
        graph = _GraphBuilder(cfg, seed, sink, decomposed_layernorm).build()
        if data_file is not None:
            data_file.close()
        model = onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)],
            producer_name="tests.models.anima", producer_version="1",
        )
        model.ir_version = IR_VERSION
        model.doc_string = f"Anima-style DiT {cfg} seed={seed}"
        with atomic_writer(path) as tmp:
            tmp.write_bytes(model.SerializeToString(deterministic=True))
    if not external_data:
        with contextlib.suppress(FileNotFoundError):
            data_path.unlink()  # a stale side file from an earlier external build
    return path
