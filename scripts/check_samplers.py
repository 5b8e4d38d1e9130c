"""The whole grid of the board's samplers against diffusers' real schedulers (torch needed).

``tests/runtime/test_board_sampling.py`` runs a sample of this grid; this runs every case of
``tests/runtime/sampling_oracle.py`` (the published configs of the sweep's pipelines and the option
variations) at every step count and seed asked, and prints one line per case: the worst loop error
and whether the schedules were equal.  Exit 1 if any case fails.

Usage: ``.venv/bin/python scripts/check_samplers.py [--steps 1,2,3,...] [--seeds N] [--case NAME ...]``
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/runtime/sampling_oracle.py

from tests.runtime.sampling_oracle import PUBLISHED, VARIATIONS, loop_error, max_rel, schedule_mismatches

DEFAULT_STEPS = "1,2,3,4,5,8,10,14,15,16,20,25,28,30,40,50"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", default=DEFAULT_STEPS, help=f"step counts [default: {DEFAULT_STEPS}]")
    parser.add_argument("--seeds", type=int, default=2, help="seeds of model, latent and noise per count [2]")
    parser.add_argument("--case", action="append", help="only these cases (repeatable; default: all)")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")]
    cases = [c for c in PUBLISHED + VARIATIONS if not args.case or c.name in args.case]
    if args.case and len(cases) != len(set(args.case)):
        known = ", ".join(c.name for c in PUBLISHED + VARIATIONS)
        print(f"check_samplers: error: unknown case in {args.case} (known: {known})", file=sys.stderr)
        return 2
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    failed = 0
    start = time.process_time()
    print(f"{'case':24} {'class':34} {'worst rel':>10} {'min cosine':>14} {'refused':>8}  schedule")
    for case in cases:
        worst, min_cos, refused, bad = 0.0, 1.0, 0, []
        for n in steps:
            bad += [f"{n} steps: {m[:120]}" for m in schedule_mismatches(case, n)]
            for seed in range(args.seeds):
                r = loop_error(case, n, seed)
                if r.both_refused:
                    refused += 1
                    continue
                if not r.ok(max_rel(case)):
                    bad.append(f"{n} steps, seed {seed}: {r}")
                if r.max_rel == r.max_rel:  # not NaN
                    worst, min_cos = max(worst, r.max_rel), min(min_cos, r.cosine)
        failed += bool(bad)
        print(f"{case.name:24} {case.cls:34} {worst:10.2e} {min_cos:14.12f} {refused:8d}  "
              f"{'FAIL' if bad else 'equal'}", flush=True)
        for b in bad[:5]:
            print(f"    {b}")
    print(f"{len(cases)} cases x {len(steps)} step counts x {args.seeds} seeds: {failed} failed "
          f"({time.process_time() - start:.0f} s CPU)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
