"""Shared by the full-size benchmarks: build the Anima DiT at full or reduced size, and partition it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the example models: tests/models/


def add_size_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--blocks", type=int, default=28, help="transformer blocks [28: full size]")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size [2048: full size]")
    parser.add_argument("--resolution", type=int, default=512, help="image size in px [512]")
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")


def size_label(args: argparse.Namespace) -> str:
    full = args.blocks == 28 and args.hidden == 2048 and args.resolution == 512
    return (f"{'FULL-SIZE' if full else 'REDUCED'} model: {args.blocks} block(s), hidden {args.hidden}, "
            f"{args.resolution} px, {args.dtype}")


def build(args: argparse.Namespace, path: Path) -> Path:
    """The model ``make_full_model.py`` writes (seeded random weights, external data), at ``args``' size."""
    from tests.models.anima import AnimaConfig, build_anima_onnx

    over: dict[str, Any] = {"num_blocks": args.blocks, "dtype": args.dtype}
    if args.hidden != 2048:
        over.update(hidden=args.hidden, ffn_dim=4 * args.hidden, heads=max(1, args.hidden // 128),
                    context_dim=min(1024, args.hidden), adaln_lora_dim=min(256, args.hidden // 2))
    cfg = AnimaConfig.full(resolution=args.resolution, **over)
    path.parent.mkdir(parents=True, exist_ok=True)
    return build_anima_onnx(cfg, path, seed=args.seed, external_data=True)


def onnx_bytes(folder: Path, rel: str) -> int:
    """A stage's ONNX file plus its own data file."""
    p = folder / rel
    data = p.with_name(p.name + ".data")
    return p.stat().st_size + (data.stat().st_size if data.is_file() else 0)
