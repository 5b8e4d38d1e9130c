#!/usr/bin/env python3
"""Export an ONNX model for an RK3588 NPU, partitioned by rkpart.

This is a typical rknn-toolkit2 export script with the four toolkit calls replaced by one
``rkpart.build`` call (the originals are kept as comments).  The ``RKNN.config`` arguments
stay exactly as they were; rkpart cuts the model into parts (one per residual branch for a
DiT, memory-budgeted segments for anything else), builds every NPU part with that config in
an isolated rknn-toolkit2 environment, and writes one ``.rknn`` per part plus ``plan.json``,
which says how to chain them (``rkpart run PLAN`` checks the chain against the whole model).

Install the toolkit once with ``rkpart toolkit install 2.3.0``.

Usage::

    python export_with_rkpart.py model.onnx --out model_rknn/ [--budget-mib 512] [--strategy split]
"""

from __future__ import annotations

import argparse
import sys

# from rknn.api import RKNN
import rkpart

TARGET = "rk3588"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="ONNX model")
    ap.add_argument("--out", default="model_rknn", help="output folder (plan.json, stages/, rknn/)")
    ap.add_argument("--toolkit", default="2.3.0", help="rknn-toolkit2 version to build with")
    ap.add_argument("--strategy", default=None, help="split, fused, generic, ... (default: chosen from the model)")
    ap.add_argument("--budget-mib", type=float, default=None, help="memory budget per part for 'generic'")
    args = ap.parse_args(argv)

    # rknn = RKNN(verbose=False)
    # rknn.config(target_platform=TARGET, optimization_level=3)
    config = dict(target_platform=TARGET, optimization_level=3)

    # ret = rknn.load_onnx(model=args.model)
    # ret = rknn.build(do_quantization=False)
    # ret = rknn.export_rknn(args.out + ".rknn")
    try:
        result = rkpart.build(args.model, args.out, config=config, toolkit=args.toolkit, strategy=args.strategy,
                              budget_mib=args.budget_mib, do_quantization=False, force=True,
                              progress=lambda msg: print(msg, file=sys.stderr))
    except rkpart.UserError as e:  # bad model/config, toolkit missing, a part failed to build
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    # rknn.release()

    print(f"strategy: {result.strategy}")
    for stage_id, path in result.artifacts.items():
        print(f"{stage_id}: {path}")
    print(f"plan: {result.plan_dir / 'plan.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
