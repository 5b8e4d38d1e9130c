"""A small Vision Transformer and a post-norm (BERT-style) encoder, written in plain torch.

No torchvision / transformers: the point is a real PyTorch export of a non-DiT architecture.
``export_vit`` gives a pre-norm ViT (residual stream ``x = x + f(LN(x))``, which the built-in
discovery understands); ``export_postnorm`` gives a post-norm encoder (``x = LN(x + f(x))``),
whose residual adds do not chain, so only a recogniser finds its blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the export extra; without it the importing module is skipped
nn = torch.nn


@dataclass(frozen=True)
class VitConfig:
    image: int = 32
    patch: int = 8
    channels: int = 3
    dim: int = 64
    heads: int = 4
    mlp: int = 128
    depth: int = 4
    classes: int = 10


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        out = att.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class PreNormLayer(nn.Module):
    def __init__(self, cfg: VitConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg.dim, cfg.heads)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.mlp = Mlp(cfg.dim, cfg.mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PostNormLayer(PreNormLayer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.mlp(x))


class Vit(nn.Module):
    def __init__(self, cfg: VitConfig, post_norm: bool = False) -> None:
        super().__init__()
        n = (cfg.image // cfg.patch) ** 2
        self.patch_embed = nn.Conv2d(cfg.channels, cfg.dim, cfg.patch, cfg.patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, cfg.dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, cfg.dim) * 0.02)
        layer = PostNormLayer if post_norm else PreNormLayer
        self.layers = nn.ModuleList(layer(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


def _export(model: nn.Module, cfg: VitConfig, path: Path) -> Path:
    model.eval()
    x = torch.zeros(1, cfg.channels, cfg.image, cfg.image)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(model, (x,), str(path), input_names=["pixel_values"], output_names=["logits"],
                      opset_version=17, dynamo=False)
    return path


def export_vit(path: Path, cfg: VitConfig = VitConfig(), seed: int = 0) -> Path:
    """Export a seeded random-init pre-norm ViT to ``path`` (TorchScript exporter, opset 17)."""
    torch.manual_seed(seed)
    return _export(Vit(cfg), cfg, path)


def export_postnorm(path: Path, cfg: VitConfig = VitConfig(), seed: int = 0) -> Path:
    """Export a seeded random-init post-norm (BERT-style) encoder."""
    torch.manual_seed(seed)
    return _export(Vit(cfg, post_norm=True), cfg, path)


def example_input(cfg: VitConfig = VitConfig(), seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"pixel_values": rng.standard_normal((1, cfg.channels, cfg.image, cfg.image)).astype(np.float32)}
