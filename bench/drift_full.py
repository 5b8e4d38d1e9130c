"""Drift of split vs fused (vs auto) through the whole Anima DiT: ORT vs the rknn-toolkit2 simulator.

Builds the model with the seeded random weights of ``bench/make_full_model.py`` (full size by
default: 28 blocks, hidden 2048; ``--blocks/--hidden/--resolution`` for a reduced one), writes
the split and fused plans (and auto's with ``--auto``), runs ``rkpart drift`` on them (flow-
matching Euler, ``--steps`` steps, CFG, fixed seed) with the simulator of ``--toolkit``, and
prints the per-step latent table, the last step's per-block rows and the cost model's accuracy
term measured by it (:func:`rkpart.cost_model.drift_accuracy.accuracy_from_drift`).

Usage: ``.venv/bin/python bench/drift_full.py [--steps 4] [--toolkit 2.5.0] [--blocks 28 --hidden 2048]
[--workdir DIR] [--keep]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from _full_model import add_size_args, build, size_label  # type: ignore[import-not-found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_size_args(parser)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-cfg", action="store_true")
    parser.add_argument("--toolkit", default="2.5.0")
    parser.add_argument("--auto", action="store_true", help="also auto's choice")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rkpart_bench_drift"))
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--accuracy", type=Path, default=None, metavar="FILE",
                        help="write the accuracy term with its provenance (rkpart/data/drift_anima_full.json "
                             "is this file for the full-size model)")
    parser.add_argument("--sim-memory", type=int, default=None, metavar="MIB",
                        help="memory bound of the simulator's workers [70%% of the available memory]")
    args = parser.parse_args(argv)

    from rkpart.cost_model.drift_accuracy import accuracy_from_drift, family_of
    from rkpart.pipeline import partition
    from rkpart.profile.drift import drift, render
    from rkpart.runtime.rknn_sim import RknnSimBackend

    work = args.workdir
    try:
        print(size_label(args))
        t0 = time.perf_counter()
        model = build(args, work / "model" / "anima.onnx")
        print(f"built {model} in {time.perf_counter() - t0:.1f} s")
        plans = []
        for strategy in ("split", "fused", *(["auto"] if args.auto else [])):
            folder = work / strategy
            plans.append((strategy, partition(model, folder, strategy, force=True), folder))
        backend = RknnSimBackend(args.toolkit, memory_budget=None if args.sim_memory is None
                                 else args.sim_memory << 20)
        t0 = time.perf_counter()
        rows = drift(plans, backend, steps=args.steps, cfg=not args.no_cfg, progress=print)
        print(f"drift: {time.perf_counter() - t0:.0f} s for {len(plans)} plan(s) x {args.steps} step(s)"
              f"{'' if args.no_cfg else ' x 2 (CFG)'} on ORT and rknn-toolkit2 {args.toolkit} simulator\n")
        print(render(rows, blocks=False))
        last = args.steps - 1
        per_block = [r for r in rows if r.step == last and r.kind == "cond"]
        print(f"\nper block, last step (cond pass):\n{render(per_block)}")
        fams = {label: family_of(plan) for label, plan, _ in plans if label in ("split", "fused")}
        acc = accuracy_from_drift(rows, fams)
        print("\naccuracy term from this table:")
        print(json.dumps(acc, indent=2, sort_keys=True))
        if args.accuracy is not None:
            acc["measured"] = {
                "command": "python bench/drift_full.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "model": (f"{size_label(args).split(' model')[0].lower()} Anima DiT ({args.blocks} blocks, hidden "
                          f"{args.hidden}, {args.resolution} px, {args.dtype}, seeded random weights of "
                          "bench/make_full_model.py)"),
                "backend": f"rknn-toolkit2 {args.toolkit} simulator vs ONNX Runtime",
                "steps": args.steps, "cfg": not args.no_cfg, "plans": fams,
            }
            args.accuracy.write_text(json.dumps(acc, indent=2, sort_keys=True) + "\n")
            print(f"wrote {args.accuracy}")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
