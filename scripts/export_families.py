"""Export tiny DiT families from ``diffusers`` to ONNX: test sources for block discovery.

Every model is built from a config with random weights (``torch.manual_seed``), never
downloaded.  Configs are the smallest that keep each family's block anatomy:

========  ================================  ==================================================
family    diffusers class                   what it exercises
========  ================================  ==================================================
dit       ``DiTTransformer2DModel``         AdaLN-Zero with a per-block timestep+class embedding
pixart    ``PixArtTransformer2DModel``      shared ``adaln_single``, per-block scale_shift_table,
                                            cross-attention
sd3       ``SD3Transformer2DModel``         dual-stream joint attention; last block
                                            ``context_pre_only`` (different structure)
flux      ``FluxTransformer2DModel``        double-stream blocks + single-stream parallel
                                            attn/MLP blocks, RoPE
sana      ``SanaTransformer2DModel``        linear attention without Softmax, GLU conv FFN
cogvideox ``CogVideoXTransformer3DModel``   text + video tokens normed apart, one attention
                                            and one FFN over both (two streams, joint FFN)
wan       ``WanTransformer3DModel``         qk RMSNorm across heads, complex RoPE, cross-attention
chroma    ``ChromaTransformer2DModel``      Flux anatomy, modulation from a distilled approximator
lumina2   ``Lumina2Transformer2DModel``     refiner blocks, GQA, attention mask guards
auraflow  ``AuraFlowTransformer2DModel``    MMDiT blocks then single-stream DiT blocks
hunyuandit ``HunyuanDiT2DModel``           two text encoders, skip connections, fixed RoPE
cosmos    ``CosmosTransformer3DModel``      Cosmos-Predict2: AdaLN-LoRA, 3-D RoPE
========  ================================  ==================================================

Usage: ``.venv/bin/python scripts/export_families.py OUT_DIR [--family NAME ...] [--dynamo]``
Library use (tests): :func:`export_family`.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], tuple[Any, dict[str, Any]]]  # -> (module, example inputs by name)
    #: keyword arguments of ``forward`` fixed at export time (not graph inputs)
    fixed: Callable[[], dict[str, Any]] = dict
    blocks: int = 2  # transformer blocks the config has (for tests)


def _dit() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import DiTTransformer2DModel

    m = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, num_layers=2,
                              sample_size=8, patch_size=2, num_embeds_ada_norm=10, norm_num_groups=4)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([7], dtype=torch.int64),
        "class_labels": torch.tensor([3], dtype=torch.int64),
    }


def _pixart() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import PixArtTransformer2DModel

    m = PixArtTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
                                 num_layers=2, sample_size=8, patch_size=2, cross_attention_dim=32,
                                 caption_channels=24, norm_num_groups=4, use_additional_conditions=False)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "timestep": torch.tensor([7], dtype=torch.int64),
    }


def _pixart_fixed() -> dict[str, Any]:
    return {"added_cond_kwargs": {"resolution": None, "aspect_ratio": None}}


def _sd3() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import SD3Transformer2DModel

    m = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=16,
                              num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=32,
                              pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16)
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
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


def _chroma() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import ChromaTransformer2DModel

    m = ChromaTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                 attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                 axes_dims_rope=(4, 6, 6), approximator_num_channels=16,
                                 approximator_hidden_dim=32, approximator_layers=1)
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


FAMILIES: dict[str, Family] = {
    "dit": Family("dit", _dit),
    "pixart": Family("pixart", _pixart, _pixart_fixed),
    "sd3": Family("sd3", _sd3, blocks=3),
    "flux": Family("flux", _flux, blocks=4),
    "sana": Family("sana", _sana),
    "cogvideox": Family("cogvideox", _cogvideox),
    "wan": Family("wan", _wan),
    "chroma": Family("chroma", _chroma, blocks=4),
    "lumina2": Family("lumina2", _lumina2),
    "auraflow": Family("auraflow", _auraflow, blocks=3),
    "hunyuandit": Family("hunyuandit", _hunyuandit, _hunyuandit_fixed),
    "cosmos": Family("cosmos", _cosmos),
}


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
    """Export family ``name`` to ``path`` (static shapes); returns the example inputs.

    ``opset`` defaults to 17 (TorchScript) and 18 (dynamo); ``opset=0`` takes the exporter's own
    default (what a user gets from a bare ``torch.onnx.export``: opset 20 for dynamo in torch 2.13).

    Raises ``KeyError`` for an unknown family and whatever the exporter raises when it fails.
    """
    import torch

    fam = FAMILIES[name]
    torch.manual_seed(seed)
    model, inputs = fam.build()
    model = model.eval()
    if not dynamo:
        _decompose_rms_norm(model)
    names = list(inputs)
    wrapped = _Wrapper.make(model, names, fam.fixed())
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES))
    parser.add_argument("--dynamo", action="store_true", help="use the dynamo exporter")
    args = parser.parse_args(argv)
    for name in args.family or sorted(FAMILIES):
        suffix = "_dynamo" if args.dynamo else ""
        path = args.out / f"{name}{suffix}.onnx"
        export_family(name, path, dynamo=args.dynamo)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
