"""A tiny DiT whose FFN is a top-2 mixture of experts (token choice), exported by real torch exporters.

The routing is the export-friendly dense form many MoE DiTs use (HiDream's ``MoEGate`` and
its relatives): router logits -> softmax -> ``TopK`` -> renormalised weights ``ScatterElements``-d
into a dense ``[tokens, experts]`` gate matrix; every expert runs on every token and the gates
weigh their outputs.  So the graph has ``TopK`` and ``ScatterElements`` (both placed on the CPU
by rknn-toolkit2 2.3.0 and 2.5.0, ``scripts/measure_ops.py``) inside every FFN, between the
router's matmul and the experts' matmuls: what capability-driven grouping must move to the host
while the experts stay on the NPU, each expert's weights in one stage only.

Blocks are AdaLN-Zero DiT blocks (``transformer_blocks.{i}``: norm1 + modulation, self-attention,
norm2, MoE FFN, gated residuals), as in diffusers' DiT family.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

import numpy as np

DIM, HEADS, TOKENS, CHANNELS, EXPERTS, TOP_K, BLOCKS = 32, 2, 16, 8, 4, 2, 2


def build(seed: int = 0) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(seed)

    class Expert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(DIM, 2 * DIM)
            self.down = nn.Linear(2 * DIM, DIM)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(F.gelu(self.up(x), approximate="tanh"))

    class MoE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(DIM, EXPERTS, bias=False)
            self.experts = nn.ModuleList([Expert() for _ in range(EXPERTS)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            probs = self.gate(x).softmax(-1)
            w, idx = torch.topk(probs, TOP_K, dim=-1)
            w = w / w.sum(-1, keepdim=True)
            gates = torch.zeros_like(probs).scatter(-1, idx, w)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                out = out + gates[..., e:e + 1] * expert(x)
            return out

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.to_q, self.to_k, self.to_v = (nn.Linear(DIM, DIM) for _ in range(3))
            self.to_out = nn.ModuleList([nn.Linear(DIM, DIM)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (f(x).view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
            o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, DIM)
            return self.to_out[0](o)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(DIM, elementwise_affine=False, eps=1e-6)
            self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(DIM, 6 * DIM))
            self.attn1 = Attention()
            self.norm2 = nn.LayerNorm(DIM, elementwise_affine=False, eps=1e-6)
            self.ff = MoE()

        def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
            s1, b1, g1, s2, b2, g2 = self.adaLN_modulation(temb)[:, None].chunk(6, dim=-1)
            x = x + g1 * self.attn1(self.norm1(x) * (1 + s1) + b1)
            return x + g2 * self.ff(self.norm2(x) * (1 + s2) + b2)

    class MoEDiT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj_in = nn.Linear(CHANNELS, DIM)
            self.time_embed = nn.Sequential(nn.Linear(DIM, DIM), nn.SiLU(), nn.Linear(DIM, DIM))
            self.transformer_blocks = nn.ModuleList([Block() for _ in range(BLOCKS)])
            self.norm_out = nn.LayerNorm(DIM, elementwise_affine=False, eps=1e-6)
            self.proj_out = nn.Linear(DIM, CHANNELS)

        def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
            half = DIM // 2
            freqs = torch.exp(-np.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
            args = timestep[:, None] * freqs[None]
            temb = self.time_embed(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))
            x = self.proj_in(hidden_states)
            for block in self.transformer_blocks:
                x = block(x, temb)
            return self.proj_out(self.norm_out(x))

    return MoEDiT().eval()


def example_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"hidden_states": rng.normal(size=(1, TOKENS, CHANNELS)).astype(np.float32),
            "timestep": np.array([500.0], dtype=np.float32)}


def export(path: str | Path, *, dynamo: bool) -> Path:
    import torch

    model = build()
    inputs = {k: torch.from_numpy(v) for k, v in example_inputs().items()}
    path = Path(path)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            prog = torch.onnx.export(model, tuple(inputs.values()), input_names=list(inputs),
                                     output_names=["sample"], dynamo=True, optimize=True, verbose=False,
                                     opset_version=18)
            assert prog is not None
            prog.save(str(path))
        else:
            torch.onnx.export(model, tuple(inputs.values()), str(path), input_names=list(inputs),
                              output_names=["sample"], dynamo=False, do_constant_folding=True, opset_version=17)
    return path


def cached_export(exporter: str) -> Path:
    """The export by ``exporter`` ("torchscript" or "dynamo"), made once per torch version and source."""
    import torch

    from tests.models.diffusers_families import cached_file

    return cached_file(f"moe-{exporter}", [torch.__version__, exporter, inspect.getsource(build),
                                           inspect.getsource(export)],
                       lambda tmp: export(tmp, dynamo=exporter == "dynamo"))
