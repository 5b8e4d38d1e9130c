"""Hand-built tiny transformers with block layouts diffusers' tiny configs do not give.

Each is a small ``torch.nn.Module`` with real topology (pre-norm residual units, AdaLN where the
layout has it, softmax attention) whose module names number the blocks the way diffusers does
(``transformer_blocks.3``, ``single_transformer_blocks.0``, ...), so the named export says how
many blocks there are and the anonymised copy must find the same ones from structure alone.

:data:`LAYOUTS` -- name -> (builder, blocks):

===================  ===========================================================================
layout               what it exercises
===================  ===========================================================================
dual_single          3 dual-stream blocks (joint attention, two FFNs) then 5 single-stream ones
                     (Flux-like; the streams are concatenated between)
spatial_temporal     alternating spatial blocks (attn, xattn, ffn over the tokens of one frame)
                     and temporal blocks (attn, ffn over one token's frames), 3 of each
text_first           2 text-only blocks that all run before 3 visual blocks, which
                     cross-attend to the refined text
perceiver            4 transformer blocks with a perceiver cross-attention unit (a module of its
                     own, ``perceiver_blocks.k``) after every second one
side_refiners        two independent refiners (2 blocks over the text, 2 over the image) side
                     by side, then 3 joint blocks over their concatenation (Lumina2-like)
interleaved          the same, with the two refiners' blocks alternating in op order
hinted               2 control blocks over a control stream, each followed by a hint projection
                     (``control_blocks.k.proj_hint``, outside its residual unit), then 3 blocks;
                     the hints are added to the stream after the first two (WanVACE-like): the
                     projections are glue between blocks, token-wise matmul work
===================  ===========================================================================
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

D, HEADS, TXT, IMG, FRAMES = 32, 2, 6, 8, 3


def _modules() -> dict[str, Any]:  # one namespace of small modules, built lazily (torch is optional)
    import torch
    from torch import nn

    class Attention(nn.Module):
        """Multi-head softmax attention; ``ctx`` given: cross-attention over it."""

        def __init__(self, ctx_dim: int | None = None) -> None:
            super().__init__()
            self.to_q = nn.Linear(D, D)
            self.to_k = nn.Linear(ctx_dim or D, D)
            self.to_v = nn.Linear(ctx_dim or D, D)
            self.to_out = nn.Linear(D, D)

        def forward(self, x: torch.Tensor, ctx: torch.Tensor | None = None) -> torch.Tensor:
            c = x if ctx is None else ctx
            b, n, _ = x.shape
            m = c.shape[1]
            q = self.to_q(x).view(b, n, HEADS, -1).transpose(1, 2)
            k = self.to_k(c).view(b, m, HEADS, -1).transpose(1, 2)
            v = self.to_v(c).view(b, m, HEADS, -1).transpose(1, 2)
            w = torch.softmax(q @ k.transpose(-1, -2) * (D // HEADS) ** -0.5, dim=-1)
            return self.to_out((w @ v).transpose(1, 2).reshape(b, n, D))

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj_in = nn.Linear(D, 2 * D)
            self.proj_out = nn.Linear(2 * D, D)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj_out(torch.nn.functional.gelu(self.proj_in(x), approximate="tanh"))

    class AdaNorm(nn.Module):
        """LayerNorm modulated by the timestep embedding: ``norm(x) * (1 + scale) + shift``, and a gate."""

        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(D, elementwise_affine=False)
            self.linear = nn.Linear(D, 3 * D)

        def forward(self, x: torch.Tensor, temb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            shift, scale, gate = self.linear(torch.nn.functional.silu(temb)).unsqueeze(1).chunk(3, dim=-1)
            return self.norm(x) * (1 + scale) + shift, gate

    class Block(nn.Module):
        """Pre-norm DiT block: AdaLN attn, optional plain-norm cross-attention, AdaLN FFN."""

        def __init__(self, cross: bool = False, modulated: bool = True) -> None:
            super().__init__()
            self.modulated = modulated
            self.norm1 = AdaNorm() if modulated else nn.LayerNorm(D)
            self.attn = Attention()
            self.norm2 = nn.LayerNorm(D) if cross else None
            self.attn2 = Attention() if cross else None
            self.norm3 = AdaNorm() if modulated else nn.LayerNorm(D)
            self.ff = FeedForward()

        def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None,
                    ctx: torch.Tensor | None = None) -> torch.Tensor:
            if self.modulated:
                h, g = self.norm1(x, temb)
                x = x + g * self.attn(h)
            else:
                x = x + self.attn(self.norm1(x))
            if self.attn2 is not None and self.norm2 is not None:
                x = x + self.attn2(self.norm2(x), ctx)
            if self.modulated:
                h, g = self.norm3(x, temb)
                return x + g * self.ff(h)
            return x + self.ff(self.norm3(x))

    class DualBlock(nn.Module):
        """MMDiT block: joint attention over image and text, one FFN per stream."""

        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm1_context = AdaNorm(), AdaNorm()
            self.attn = Attention()
            self.add_q, self.add_k, self.add_v, self.add_out = (nn.Linear(D, D) for _ in range(4))
            self.norm2, self.norm2_context = AdaNorm(), AdaNorm()
            self.ff, self.ff_context = FeedForward(), FeedForward()

        def forward(self, x: torch.Tensor, c: torch.Tensor, temb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h, g = self.norm1(x, temb)
            hc, gc = self.norm1_context(c, temb)
            a = self.attn
            b, n, m = x.shape[0], x.shape[1], c.shape[1]

            def heads(t: torch.Tensor) -> torch.Tensor:
                return t.view(b, t.shape[1], HEADS, -1).transpose(1, 2)

            q = torch.cat([heads(a.to_q(h)), heads(self.add_q(hc))], dim=2)
            k = torch.cat([heads(a.to_k(h)), heads(self.add_k(hc))], dim=2)
            v = torch.cat([heads(a.to_v(h)), heads(self.add_v(hc))], dim=2)
            w = torch.softmax(q @ k.transpose(-1, -2) * (D // HEADS) ** -0.5, dim=-1)
            o = (w @ v).transpose(1, 2).reshape(b, n + m, D)
            x = x + g * a.to_out(o[:, :n])
            c = c + gc * self.add_out(o[:, n:])
            h, g = self.norm2(x, temb)
            hc, gc = self.norm2_context(c, temb)
            return x + g * self.ff(h), c + gc * self.ff_context(hc)

    class SingleBlock(nn.Module):
        """Flux single-stream block: attention and an MLP in parallel from one AdaLN."""

        def __init__(self) -> None:
            super().__init__()
            self.norm = AdaNorm()
            self.attn = Attention()
            self.proj_mlp = nn.Linear(D, 2 * D)
            self.proj_out = nn.Linear(3 * D, D)

        def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
            h, g = self.norm(x, temb)
            mlp = torch.nn.functional.gelu(self.proj_mlp(h), approximate="tanh")
            return x + g * self.proj_out(torch.cat([self.attn(h), mlp], dim=-1))

    class Perceiver(nn.Module):
        """A perceiver cross-attention unit: the stream attends to a reference's tokens (no FFN)."""

        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(D)
            self.norm_ref = nn.LayerNorm(D)
            self.attn = Attention()

        def forward(self, x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
            return x + self.attn(self.norm(x), self.norm_ref(ref))

    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.x_embedder = nn.Linear(D // 2, D)
            self.context_embedder = nn.Linear(D // 2, D)
            self.time_embedder = nn.Sequential(nn.Linear(1, D), nn.SiLU(), nn.Linear(D, D))
            self.proj_out = nn.Linear(D, D // 2)

    class DualSingle(Embed):
        def __init__(self, dual: int = 3, single: int = 5) -> None:
            super().__init__()
            self.transformer_blocks = nn.ModuleList(DualBlock() for _ in range(dual))
            self.single_transformer_blocks = nn.ModuleList(SingleBlock() for _ in range(single))

        def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                    timestep: torch.Tensor) -> torch.Tensor:
            x, c = self.x_embedder(hidden_states), self.context_embedder(encoder_hidden_states)
            temb = self.time_embedder(timestep)
            for blk in self.transformer_blocks:
                x, c = blk(x, c, temb)
            s = torch.cat([c, x], dim=1)
            for single in self.single_transformer_blocks:
                s = single(s, temb)
            return self.proj_out(s[:, c.shape[1]:])

    class SpatialTemporal(Embed):
        def __init__(self, pairs: int = 3) -> None:
            super().__init__()
            self.transformer_blocks = nn.ModuleList(Block(cross=True) for _ in range(pairs))
            self.temporal_transformer_blocks = nn.ModuleList(Block() for _ in range(pairs))

        def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                    timestep: torch.Tensor) -> torch.Tensor:
            b, t, s, _ = hidden_states.shape
            x = self.x_embedder(hidden_states).reshape(b * t, s, D)
            ctx = self.context_embedder(encoder_hidden_states).repeat_interleave(t, dim=0)
            temb = self.time_embedder(timestep)  # [1, D]: the modulation broadcasts over frames and tokens
            for spatial, temporal in zip(self.transformer_blocks, self.temporal_transformer_blocks, strict=True):
                x = spatial(x, temb, ctx)
                x = x.reshape(b, t, s, D).permute(0, 2, 1, 3).reshape(b * s, t, D)
                x = temporal(x, temb)
                x = x.reshape(b, s, t, D).permute(0, 2, 1, 3).reshape(b * t, s, D)
            return self.proj_out(x).reshape(b, t, s, D // 2)

    class TextFirst(Embed):
        def __init__(self, text: int = 2, visual: int = 3) -> None:
            super().__init__()
            self.context_refiner = nn.ModuleList(Block(modulated=False) for _ in range(text))
            self.transformer_blocks = nn.ModuleList(Block(cross=True) for _ in range(visual))

        def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                    timestep: torch.Tensor) -> torch.Tensor:
            c = self.context_embedder(encoder_hidden_states)
            for blk in self.context_refiner:
                c = blk(c)
            x, temb = self.x_embedder(hidden_states), self.time_embedder(timestep)
            for blk in self.transformer_blocks:
                x = blk(x, temb, c)
            return self.proj_out(x)

    class PerceiverLayout(Embed):
        def __init__(self, blocks: int = 4, every: int = 2) -> None:
            super().__init__()
            self.every = every
            self.transformer_blocks = nn.ModuleList(Block() for _ in range(blocks))
            self.perceiver_blocks = nn.ModuleList(Perceiver() for _ in range(blocks // every))

        def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                    timestep: torch.Tensor) -> torch.Tensor:
            x, ref = self.x_embedder(hidden_states), self.context_embedder(encoder_hidden_states)
            temb = self.time_embedder(timestep)
            for i, blk in enumerate(self.transformer_blocks):
                x = blk(x, temb)
                if i % self.every == self.every - 1:
                    x = self.perceiver_blocks[i // self.every](x, ref)
            return self.proj_out(x)

    class SideRefiners(Embed):
        def __init__(self, refiners: int = 2, joint: int = 3, interleaved: bool = False) -> None:
            super().__init__()
            self.interleaved = interleaved
            self.context_refiner = nn.ModuleList(Block(modulated=False) for _ in range(refiners))
            self.noise_refiner = nn.ModuleList(Block() for _ in range(refiners))
            self.layers = nn.ModuleList(Block() for _ in range(joint))

        def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                    timestep: torch.Tensor) -> torch.Tensor:
            c, x = self.context_embedder(encoder_hidden_states), self.x_embedder(hidden_states)
            temb = self.time_embedder(timestep)
            if self.interleaved:  # one loop over both lists: their blocks alternate in op order
                for ctx_blk, noise_blk in zip(self.context_refiner, self.noise_refiner, strict=True):
                    c, x = ctx_blk(c), noise_blk(x, temb)
            else:
                for blk in self.context_refiner:
                    c = blk(c)
                for blk in self.noise_refiner:
                    x = blk(x, temb)
            s = torch.cat([c, x], dim=1)
            for blk in self.layers:
                s = blk(s, temb)
            return self.proj_out(s[:, c.shape[1]:])

    class ControlBlock(Block):
        """A block over the control stream, and the projection of its output into a hint."""

        def __init__(self) -> None:
            super().__init__()
            self.proj_hint = nn.Linear(D, D)

    class Hinted(Embed):
        def __init__(self, control: int = 2, blocks: int = 3) -> None:
            super().__init__()
            self.control_embedder = nn.Linear(D // 2, D)
            self.control_blocks = nn.ModuleList(ControlBlock() for _ in range(control))
            self.transformer_blocks = nn.ModuleList(Block() for _ in range(blocks))

        def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                    timestep: torch.Tensor) -> torch.Tensor:
            x, temb = self.x_embedder(hidden_states), self.time_embedder(timestep)
            c = self.control_embedder(hidden_states) + x
            hints = []
            for blk in self.control_blocks:
                c = blk(c, temb)
                hints.append(blk.proj_hint(c))
            for i, blk in enumerate(self.transformer_blocks):
                x = blk(x, temb)
                if i < len(hints):  # as WanVACE adds its hints (TorchScript exports the .to as a Cast)
                    x = x + hints[i].to(x.device) * 0.5
            return self.proj_out(x)

    return {"dual_single": DualSingle, "spatial_temporal": SpatialTemporal, "text_first": TextFirst,
            "perceiver": PerceiverLayout, "side_refiners": SideRefiners,
            "interleaved": lambda: SideRefiners(interleaved=True), "hinted": Hinted}


def _inputs(layout: str) -> dict[str, Any]:
    import torch

    img = torch.randn(1, FRAMES, IMG, D // 2) if layout == "spatial_temporal" else torch.randn(1, IMG, D // 2)
    return {"hidden_states": img, "encoder_hidden_states": torch.randn(1, TXT, D // 2),
            "timestep": torch.tensor([[0.7]])}


#: layout -> transformer blocks the module has (perceiver units and refiners count: each is a module of its own)
LAYOUTS: dict[str, int] = {"dual_single": 8, "spatial_temporal": 6, "text_first": 5, "perceiver": 6,
                           "side_refiners": 7, "interleaved": 7, "hinted": 5}


def build(layout: str, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """The module of ``layout`` (seeded random weights, eval mode) and its example inputs."""
    import torch

    torch.manual_seed(seed)
    model: Any = _modules()[layout]().eval()
    return model, _inputs(layout)


def export(layout: str, path: Path, *, dynamo: bool = False) -> dict[str, Any]:
    """Export ``layout`` to ``path`` (static shapes); returns the example inputs as numpy arrays."""
    import warnings

    import torch

    model, inputs = build(layout)
    names = list(inputs)
    args = tuple(inputs.values())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            prog = torch.onnx.export(model, args, input_names=names, output_names=["sample"], dynamo=True,
                                     optimize=True, verbose=False)
            assert prog is not None
            prog.save(str(path))
        else:
            torch.onnx.export(model, args, str(path), input_names=names, output_names=["sample"], dynamo=False,
                              do_constant_folding=True, opset_version=17)
    return {k: v.numpy() for k, v in inputs.items()}


def cached_export(layout: str, exporter: str) -> Path:
    """The export of ``layout`` by ``exporter`` ("torchscript" or "dynamo"), made once per (torch version,
    exporter, this module's source)."""
    import torch

    from tests.models.diffusers_families import cached_file

    return cached_file(f"structural-{layout}-{exporter}", [torch.__version__, layout, exporter,
                                                            inspect.getsource(sys.modules[__name__])],
                       lambda tmp: export(layout, tmp, dynamo=exporter == "dynamo"))


__all__ = ["LAYOUTS", "build", "cached_export", "export"]
