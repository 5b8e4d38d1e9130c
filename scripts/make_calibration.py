"""Regenerate rkpart/data/rk3588_calibration.json from the seed write-up's published numbers.

The numbers are in :data:`rkpart.cost_model.calibration.WRITEUP`; the features come from a
one-block, full-width Anima model at 512 px (fp16, external data) built in a temporary
folder.  The output is deterministic: running this twice gives the same bytes.

Usage: ``.venv/bin/python scripts/make_calibration.py [--out rkpart/data/rk3588_calibration.json] [--check]``
(``--check`` exits 1 if the file on disk differs from what would be written).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rkpart.auto import enumerate_candidates
from rkpart.cost_model.calibration import calibrate_writeup
from rkpart.cost_model.model import CostModel, default_model_path
from rkpart.discovery.structure import discover
from rkpart.ir import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the example models: tests/models/
from tests.models.anima import AnimaConfig, build_anima_onnx


def build_calibration(workdir: Path) -> CostModel:
    """The calibration model, with features of a one-block 512 px Anima model built in ``workdir``."""
    path = build_anima_onnx(AnimaConfig.full(512).replace(num_blocks=1), workdir / "anima_block_512.onnx",
                            external_data=True)
    mg = load_model(path)
    disc = discover(mg)
    cands = {c.id: c for c in enumerate_candidates(mg, disc, max_run=1, plugins_too=False)[disc.blocks[0].index]}
    return calibrate_writeup(cands["split"], cands["fused"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=default_model_path())
    ap.add_argument("--check", action="store_true", help="compare with the file on disk instead of writing")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rkpart-calib-") as tmp:
        model = build_calibration(Path(tmp))
    text = model.dumps()
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS'}")
        return 0 if same else 1
    model.save(args.out)
    print(f"wrote {args.out}")
    for name, comp in model.components.items():
        print(f"  {name:<10} " + ", ".join(f"{t}={c:.4g}" for t, c in zip(comp.terms, comp.coef, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
