"""Tiny DiTs whose shapes depend on data although their inputs are static (issue 28, item 7).

Each is a 2-block AdaLN DiT with self-attention, cross-attention to a text context and a gated
FFN; they differ in how the text context is made:

=============  ======================================================================  ==========
kind           text context                                                            exporters
=============  ======================================================================  ==========
``nonzero``    ``text[mask]``: the valid tokens gathered through ``NonZero``             both
``if``         ``torch.cond(mask.all(), ...)``: the whole text when every token is       dynamo
               valid, else only the valid ones (an ``If`` whose branches differ in
               shape)
``sequence``   expert-choice gathering of image tokens, scripted: a ``Loop`` of            torchscript
               ``SequenceInsert`` then ``ConcatFromSequence`` (refused even with
               ``--inputs``: rkpart's graph has no sequence types)
=============  ======================================================================  ==========

:func:`cached_export` makes each export once per torch version, exporter and source of this
module under ``$RKPART_TEST_EXPORTS`` (as :mod:`tests.models.diffusers_families`).
"""

from __future__ import annotations

import inspect
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch  # at module level: TorchScript resolves _expert_choice's annotations here

#: kind -> the exporters that export it
KINDS = {"nonzero": ("torchscript", "dynamo"), "if": ("dynamo",), "sequence": ("torchscript",)}
OPSETS = {"torchscript": 17, "dynamo": 18}
DIM, TEXT_DIM, TOKENS, TEXT = 16, 12, 6, 7


def _build(kind: str) -> Any:
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, kv: int) -> None:
            super().__init__()
            self.to_q, self.to_k, self.to_v = nn.Linear(DIM, DIM), nn.Linear(kv, DIM), nn.Linear(kv, DIM)
            self.to_out = nn.ModuleList([nn.Linear(DIM, DIM)])

        def forward(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
            q, k, v = self.to_q(x), self.to_k(ctx), self.to_v(ctx)
            w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(DIM), dim=-1)
            return self.to_out[0](w @ v)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn1 = Attention(DIM)
            self.attn2 = Attention(TEXT_DIM)
            self.ff = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
            self.scale_shift_table = nn.Parameter(torch.randn(6, DIM) / DIM**0.5)

        def forward(self, x: torch.Tensor, ctx: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
            m = (self.scale_shift_table[None] + temb.view(1, 6, DIM)).unbind(1)
            h = F.layer_norm(x, (DIM,), eps=1e-6) * (1 + m[1]) + m[0]
            x = x + m[2] * self.attn1(h, h)
            x = x + self.attn2(F.layer_norm(x, (DIM,), eps=1e-6), ctx)
            h = F.layer_norm(x, (DIM,), eps=1e-6) * (1 + m[4]) + m[3]
            return x + m[5] * self.ff(h)

    class Router(nn.Module):
        """Expert-choice routing: each of 2 experts picks its top-2 tokens (a scripted loop)."""

        def __init__(self) -> None:
            super().__init__()
            self.router = nn.Linear(DIM, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.jit.script(_expert_choice)(x[0], self.router(x[0]))[None]

    class DiT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj_in = nn.Linear(8, DIM)
            self.t1, self.t2 = nn.Linear(16, 32), nn.Linear(32, 6 * DIM)
            self.transformer_blocks = nn.ModuleList([Block() for _ in range(2)])
            self.proj_out = nn.Linear(DIM, 8)
            self.gather = Router() if kind == "sequence" else None

        def context(self, x: torch.Tensor, text: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            if kind == "nonzero":
                return text[0][mask[0]][None]
            if kind == "if":
                return torch.cond(mask.all(), lambda t, m: t.clone(), lambda t, m: t[0][m[0]][None], (text, mask))
            assert self.gather is not None
            return torch.cat([self.gather(x)[..., :TEXT_DIM], text], 1)

        def forward(self, hidden_states: torch.Tensor, text: torch.Tensor, mask: torch.Tensor,
                    timestep: torch.Tensor) -> torch.Tensor:
            x = self.proj_in(hidden_states)
            freqs = torch.exp(-math.log(10000.0) * torch.arange(8, dtype=torch.float32) / 8)
            e = timestep[:, None] * freqs[None]
            temb = self.t2(F.silu(self.t1(torch.cat([torch.cos(e), torch.sin(e)], -1))))
            ctx = self.context(x, text, mask)
            for blk in self.transformer_blocks:
                x = blk(x, ctx, temb)
            return self.proj_out(F.layer_norm(x, (DIM,), eps=1e-6))

    return DiT().eval()


def _expert_choice(x: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Each expert's top-2 tokens, concatenated (scripted: a Loop building a sequence)."""
    picked: list[torch.Tensor] = []
    for e in range(scores.shape[1]):
        idx = torch.topk(scores[:, e], 2).indices
        picked.append(x[idx])
    return torch.cat(picked, 0)


def example_inputs(seed: int = 0, valid: tuple[int, ...] = (1, 1, 0, 1, 0, 1, 1)) -> dict[str, np.ndarray]:
    """Inputs: 6 image tokens, 7 text tokens and a mask with ``valid`` (5 of 7 by default)."""
    rng = np.random.default_rng(seed)
    return {
        "hidden_states": rng.standard_normal((1, TOKENS, 8)).astype(np.float32),
        "text": rng.standard_normal((1, TEXT, TEXT_DIM)).astype(np.float32),
        "mask": np.array([valid], dtype=bool),
        "timestep": np.array([7.0], dtype=np.float32),
    }


def export(kind: str, exporter: str, path: str | Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    model = _build(kind)
    feeds = example_inputs()
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            prog = torch.onnx.export(model, args, input_names=list(feeds), output_names=["sample"], dynamo=True,
                                     optimize=True, verbose=False, opset_version=OPSETS[exporter])
            assert prog is not None
            prog.save(str(path))
        else:
            torch.onnx.export(model, args, str(path), input_names=list(feeds), output_names=["sample"],
                              dynamo=False, do_constant_folding=True, opset_version=OPSETS[exporter])


def cached_export(kind: str, exporter: str) -> Path:
    """The export of ``kind`` by ``exporter``, made once per (torch version, exporter, this module's source)."""
    from tests.models.diffusers_families import cached_file

    return cached_file(f"datadep-{kind}-{exporter}", [torch.__version__, kind, exporter,
                                                      inspect.getsource(sys.modules[__name__])],
                       lambda tmp: export(kind, exporter, tmp))
