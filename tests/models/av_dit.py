"""A tiny audio-video DiT: two streams of different widths that cross-attend each other.

The block anatomy of diffusers' ``LTX2VideoTransformerBlock`` (LTX-2), written out small so
that it exports with both torch exporters in a second:

- a video stream (width ``dv``) and an audio stream (width ``da``), each with an AdaLN-modulated
  self-attention (per-block ``scale_shift_table`` + the timestep embedding, gated residual);
- audio-to-video and video-to-audio cross-attention: both streams are normed and modulated
  ONCE, and both cross-attentions read both modulated streams (query one, key/value the other),
  each adding into its own stream.  A partitioner that gives each branch its own stage and
  each branch's AdaLN its own host stage makes the stages feed each other in a cycle
  (``a2v -> v2a.adaln -> v2a -> a2v.adaln -> a2v``): the shape of issue 28's item 6;
- a gated FFN per stream.

Module names follow diffusers (``transformer_blocks.{i}.attn1.to_q``, ``audio_attn1``,
``audio_to_video_attn``, ``video_to_audio_attn``, ``ff.net.0.proj``, ``audio_ff``), so the
exports look like a real one.  :func:`cached_export` makes each export once per torch version,
exporter and source of this module, under ``$RKPART_TEST_EXPORTS`` (as
:func:`tests.models.diffusers_families.cached_export`).
"""

from __future__ import annotations

import inspect
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

#: exporter -> opset
EXPORTERS = {"torchscript": 17, "dynamo": 18}
BLOCKS = 2


def _build(dv: int = 32, da: int = 16, heads: int = 2, blocks: int = BLOCKS) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, qdim: int, kvdim: int, inner: int) -> None:
            super().__init__()
            self.heads = heads
            self.to_q = nn.Linear(qdim, inner)
            self.to_k = nn.Linear(kvdim, inner)
            self.to_v = nn.Linear(kvdim, inner)
            self.to_out = nn.ModuleList([nn.Linear(inner, qdim)])

        def forward(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
            b, n, _ = x.shape
            q, k, v = self.to_q(x), self.to_k(ctx), self.to_v(ctx)
            q = q.view(b, n, self.heads, -1).transpose(1, 2)
            k = k.view(b, ctx.shape[1], self.heads, -1).transpose(1, 2)
            v = v.view(b, ctx.shape[1], self.heads, -1).transpose(1, 2)
            w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
            o = (w @ v).transpose(1, 2).reshape(b, n, -1)
            return self.to_out[0](o)

    class FeedForward(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            proj = nn.Module()
            proj.proj = nn.Linear(dim, 4 * dim)
            self.net = nn.ModuleList([proj, nn.Identity(), nn.Linear(4 * dim, dim)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            up: nn.Linear = self.net[0].proj  # type: ignore[assignment]
            return self.net[2](F.gelu(up(x), approximate="tanh"))

    def mod(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale) + shift

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            inner_v, inner_a = dv, da
            self.attn1 = Attention(dv, dv, inner_v)
            self.audio_attn1 = Attention(da, da, inner_a)
            self.audio_to_video_attn = Attention(dv, da, inner_a)
            self.video_to_audio_attn = Attention(da, dv, inner_a)
            self.ff = FeedForward(dv)
            self.audio_ff = FeedForward(da)
            self.scale_shift_table = nn.Parameter(torch.randn(9, dv) / dv**0.5)
            self.audio_scale_shift_table = nn.Parameter(torch.randn(9, da) / da**0.5)

        def forward(self, v: torch.Tensor, a: torch.Tensor, temb_v: torch.Tensor,
                    temb_a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            mv = (self.scale_shift_table[None] + temb_v.view(v.shape[0], 9, -1)).unbind(1)
            ma = (self.audio_scale_shift_table[None] + temb_a.view(a.shape[0], 9, -1)).unbind(1)
            x = mod(v, mv[0], mv[1])
            v = v + mv[2] * self.attn1(x, x)
            y = mod(a, ma[0], ma[1])
            a = a + ma[2] * self.audio_attn1(y, y)
            # the cross-modal exchange: both streams modulated once, read by both attentions
            vn = mod(v, mv[3], mv[4])
            an = mod(a, ma[3], ma[4])
            v = v + mv[5] * self.audio_to_video_attn(vn, an)
            a = a + ma[5] * self.video_to_audio_attn(an, vn)
            v = v + mv[8] * self.ff(mod(v, mv[6], mv[7]))
            a = a + ma[8] * self.audio_ff(mod(a, ma[6], ma[7]))
            return v, a

    class TimeEmbed(nn.Module):
        def __init__(self, out: int) -> None:
            super().__init__()
            self.linear_1 = nn.Linear(32, 64)
            self.linear_2 = nn.Linear(64, out)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            half = 16
            freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
            e = t[:, None].float() * freqs[None]
            e = torch.cat([torch.cos(e), torch.sin(e)], dim=-1)
            return self.linear_2(F.silu(self.linear_1(e)))

    class AVTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj_in = nn.Linear(8, dv)
            self.audio_proj_in = nn.Linear(4, da)
            self.time_embed = TimeEmbed(9 * dv)
            self.audio_time_embed = TimeEmbed(9 * da)
            self.transformer_blocks = nn.ModuleList([Block() for _ in range(blocks)])
            self.proj_out = nn.Linear(dv, 8)
            self.audio_proj_out = nn.Linear(da, 4)

        def forward(self, hidden_states: torch.Tensor, audio_hidden_states: torch.Tensor,
                    timestep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            v = self.proj_in(hidden_states)
            a = self.audio_proj_in(audio_hidden_states)
            tv = self.time_embed(timestep)
            ta = self.audio_time_embed(timestep)
            for blk in self.transformer_blocks:
                v, a = blk(v, a, tv, ta)
            v = F.layer_norm(v, v.shape[-1:], eps=1e-6)
            a = F.layer_norm(a, a.shape[-1:], eps=1e-6)
            return self.proj_out(v), self.audio_proj_out(a)

    return AVTransformer().eval()


def example_inputs(seed: int = 0, video: int = 12, audio: int = 5) -> dict[str, np.ndarray]:
    """Inputs of the export: 12 video tokens of 8 channels, 5 audio tokens of 4, one timestep."""
    rng = np.random.default_rng(seed)
    return {
        "hidden_states": rng.standard_normal((1, video, 8)).astype(np.float32),
        "audio_hidden_states": rng.standard_normal((1, audio, 4)).astype(np.float32),
        "timestep": np.array([7.0], dtype=np.float32),
    }


def export(path: str | Path, exporter: str, seed: int = 0) -> None:
    """Export the tiny two-stream model (static shapes) to ``path`` with ``exporter``."""
    import torch

    torch.manual_seed(seed)
    model = _build()
    args = tuple(torch.from_numpy(v) for v in example_inputs().values())
    names = list(example_inputs())
    outs = ["sample", "audio_sample"]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            prog = torch.onnx.export(model, args, input_names=names, output_names=outs, dynamo=True,
                                     optimize=True, verbose=False, opset_version=EXPORTERS[exporter])
            assert prog is not None
            prog.save(str(path))
        else:
            torch.onnx.export(model, args, str(path), input_names=names, output_names=outs, dynamo=False,
                              do_constant_folding=True, opset_version=EXPORTERS[exporter])


def cached_export(exporter: str) -> Path:
    """The export by ``exporter``, made once per (torch version, exporter, this module's source)."""
    import torch

    from tests.models.diffusers_families import cached_file

    return cached_file(f"av_dit-{exporter}", [torch.__version__, exporter, inspect.getsource(sys.modules[__name__])],
                       lambda tmp: export(tmp, exporter))
