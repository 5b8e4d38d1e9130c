"""Export tiny DiT families from ``diffusers`` to ONNX (random weights, static shapes).

The configs live in ``tests/models/diffusers_families.py`` (the one source the tests use too); the
export itself is the product's (``rkpart.export.export_module``: the patch registry, each patch
checked against the unpatched model).  This is its command line.

Usage: ``.venv/bin/python scripts/export_families.py OUT_DIR [--family NAME ...] [--dynamo]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the example models: tests/models/

from tests.models.diffusers_families import ALL, FAMILIES, export_family


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--family", action="append", choices=sorted(ALL),
                        help="family or variant to export (repeatable; default: every family)")
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
