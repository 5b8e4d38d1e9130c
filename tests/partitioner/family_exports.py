"""The family sweep's exports: ``scripts/export_families.py`` families plus variants whose
anatomy the default tiny configs do not reach, cached like :mod:`tests.compile.exports`.

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

Cached under ``$RKPART_TEST_EXPORTS`` (default ``~/.cache/rkpart/test-exports``, shared with
the compile tests), keyed by the diffusers and torch versions, the exporter and the source
of every function the export runs, so a rerun skips the exporter.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.compile import exports

#: exporter -> opset passed to export_family (0: the exporter's own default)
EXPORTERS = exports.EXPORTERS


def _sd35() -> tuple[Any, dict[str, Any]]:
    import torch
    from diffusers import SD3Transformer2DModel

    m = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=16,
                              num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=32,
                              pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16,
                              dual_attention_layers=(0,), qk_norm="rms_norm")
    return m, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 6, 24),
        "pooled_projections": torch.randn(1, 16),
        "timestep": torch.tensor([7.0]),
    }


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
    import torch
    from diffusers import ChromaTransformer2DModel

    m = ChromaTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                 attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                 axes_dims_rope=(4, 6, 6), approximator_num_channels=16,
                                 approximator_hidden_dim=32, approximator_layers=3)
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


#: variant -> (build, blocks in its config)
VARIANTS: dict[str, tuple[Any, int]] = {
    "sd35": (_sd35, 3),
    "hunyuandit_skip": (_hunyuandit_skip, 4),
    "chroma_guidance": (_chroma_guidance, 4),
    "pixart_sigma": (_pixart_sigma, 2),
    "allegro": (_allegro, 2),
    "ltx": (_ltx, 2),
}
#: variants that reuse a family's fixed forward arguments
_FIXED_FROM = {"hunyuandit_skip": "hunyuandit", "pixart_sigma": "pixart"}
_FIXED: dict[str, Any] = {"ltx": _ltx_fixed}


def _module() -> ModuleType:
    fams = exports._families()
    for name, (build, blocks) in VARIANTS.items():
        if name not in fams.FAMILIES:
            base = fams.FAMILIES.get(_FIXED_FROM.get(name, ""))
            fixed = base.fixed if base is not None else _FIXED.get(name, dict)
            fams.FAMILIES[name] = fams.Family(name, build, fixed, blocks=blocks)
    return fams


def block_count(name: str) -> int:
    """Transformer blocks in the config of family or variant ``name``."""
    return int(_module().FAMILIES[name].blocks)


def cached_export(name: str, exporter: str) -> Path:
    """The export of family or variant ``name``, made once per (versions, sources, exporter)."""
    import diffusers
    import torch

    fams = _module()
    fam = fams.FAMILIES[name]
    funcs = [fam.build, fams.export_family, fams._opset, fams._decompose_rms_norm, fams._Wrapper]
    if inspect.isfunction(fam.fixed):
        funcs.append(fam.fixed)
    key = hashlib.sha256("\0".join([diffusers.__version__, torch.__version__, exporter,
                                    *(inspect.getsource(f) for f in funcs)]).encode())
    root = Path(os.environ.get("RKPART_TEST_EXPORTS", Path.home() / ".cache" / "rkpart" / "test-exports"))
    path = root / f"{name}-{exporter}-{key.hexdigest()[:16]}.onnx"
    if not path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fams.export_family(name, tmp, dynamo=exporter == "dynamo", opset=EXPORTERS[exporter])
        os.replace(tmp, path)
    return path
