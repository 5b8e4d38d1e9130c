"""Regenerate the bundled example model ``rkpart/data/anima_tiny.onnx``.

The file is a real TorchScript export (``torch.onnx.export(..., dynamo=False)``, opset 17)
of :class:`tests.models.anima_torch.AnimaTransformer` at :meth:`AnimaConfig.tiny` size with
seed 0: 2 blocks, hidden 96, 4 heads, FFN 384, context 16 x 64, 64 image tokens, fp32,
weights inline.  Rerunning it gives the same bytes (checked with ``--check``).

Usage: ``.venv/bin/python scripts/make_example.py [--out PATH] [--check]``
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the example models: tests/models/
from tests.models.anima import AnimaConfig
from tests.models.anima_torch import export_torchscript

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "rkpart" / "data" / "anima_tiny.onnx"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true",
                        help="export to a temp file and fail if it differs from --out")
    args = parser.parse_args(argv)
    cfg = AnimaConfig.tiny()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = export_torchscript(cfg, Path(tmp) / "anima_tiny.onnx", seed=0).read_bytes()
        same = args.out.exists() and args.out.read_bytes() == fresh
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from a fresh export'}")
        return 0 if same else 1
    export_torchscript(cfg, args.out, seed=0)
    data = args.out.read_bytes()
    print(f"wrote {args.out} ({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
