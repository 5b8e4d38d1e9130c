"""Time `rkpart repro` on a fused block stage of the bundled example with real toolkits.

Partitions ``rkpart/data/anima_tiny.onnx`` with ``fused``, runs ``reproduce`` on the first
block stage with 2.3.0, 2.3.2 and 2.5.0, and prints the matrix, the reduction statistics and
the wall time of each step.

Target (issue 6): a reproducer of at most 10 nodes that crashes 2.3.2 and builds with 2.3.0
and 2.5.0, in under 10 minutes on two cores.

Usage: ``.venv/bin/python bench/triage_repro.py [--work /tmp/rkpart-triage] [--max-time 600]``
Exit code 0 when the target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from rkpart.pipeline import partition
from rkpart.triage.repro import reproduce

MODEL = Path(__file__).parents[1] / "rkpart" / "data" / "anima_tiny.onnx"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/rkpart-triage"))
    ap.add_argument("--max-time", type=float, default=600.0)
    ap.add_argument("--toolkits", default="2.3.0,2.3.2,2.5.0")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    t0 = time.monotonic()
    plan = partition(MODEL, args.work / "plan", "fused")
    stage = next(s for s in plan.npu_stages if s.region == "block")
    t1 = time.monotonic()
    rep = reproduce(args.work / "plan" / stage.file, args.work / "repro", args.toolkits.split(","),
                    max_time=args.max_time, progress=lambda m: print(f"  {m}", file=sys.stderr))
    t2 = time.monotonic()
    print(rep.summary())
    print(f"partition {t1 - t0:.1f} s, repro {t2 - t1:.1f} s")
    ok = (rep.reduced is not None and rep.reduction is not None and rep.reduction.candidate.num_nodes <= 10
          and rep.reduced.failing == ("2.3.2",) and t2 - t1 < 600)
    print("target met" if ok else "target NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
