"""What a per-stage pass pays for fresh memory, with and without keeping freed memory (issue 11).

A per-stage plan creates a stage's ORT session, runs it once and releases it, every pass.  For
a fused Anima block at 1024 image tokens (hidden 256 and 384, fp32, one intra-op thread) this
bench runs that cycle ``--sessions`` times in one process and times each fresh session's first
``run`` (process CPU time), with glibc's defaults and ORT's CPU arena
(``RKPART_KEEP_FREED_MEMORY=0``) and with :func:`rkpart.runtime.malloc.keep_freed_memory` (the
default: glibc keeps freed memory, sessions have no arena).  ``mallopt`` is process-wide, so
every measurement is its own child process; the two settings alternate (``--procs`` children
each), and the medians are over every session but each process's first (the first session of
a process faults its pages in under both settings).  Also printed: minor page faults of those
first calls, the whole load-run-release cycle, and each process's peak RSS (``ru_maxrss``)
after the first session and at its end, so memory kept is seen not to grow with the number of
cycles.

Usage: ``.venv/bin/python bench/fresh_session.py [--work /tmp/rkpart-fresh] [--procs 6]
[--sessions 8]``.  Exit code 0 when keeping freed memory makes the first call at least 5 %
cheaper at every size and peak RSS at the end is within 10 % of the one after the first cycle.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the example models: tests/models/

#: (hidden, heads, latent side): 1024 image tokens
SIZES = [(256, 4, 64), (384, 6, 64)]


def fused_block(work: Path, hidden: int, heads: int, side: int) -> Path:
    """Block 0's stage of the fused plan of a 1-block Anima-style model."""
    from rkpart.pipeline import partition
    from rkpart.plan.plan import load_plan
    from rkpart.types import HOST
    from tests.models.anima import AnimaConfig, build_anima_onnx

    src = work / f"anima_h{hidden}_t{(side // 2) ** 2}.onnx"
    if not src.exists():
        build_anima_onnx(AnimaConfig.tiny(num_blocks=1, hidden=hidden, heads=heads, ffn_dim=4 * hidden,
                                          latent_height=side, latent_width=side), src)
    out = work / f"{src.stem}.fused"
    if not (out / "plan.json").exists():
        partition(src, out, "fused", force=True)
    plan, _ = load_plan(out)
    stage = next(s for s in plan.stages if s.device != HOST and s.block == 0)
    return out / stage.file


def child(stage: Path, sessions: int) -> dict[str, Any]:
    """``sessions`` load-run-release cycles of ``stage`` in this process."""
    import numpy as np

    from rkpart.runtime.malloc import in_effect
    from rkpart.runtime.ort import make_session

    sess = make_session(str(stage), threads=1)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([int(d) for d in i.shape]).astype(np.float32) for i in sess.get_inputs()}
    del sess
    first: list[float] = []
    cycle: list[float] = []
    faults: list[int] = []
    rss: list[int] = []
    for _ in range(sessions):
        c0 = time.process_time()
        sess = make_session(str(stage), threads=1)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.process_time()
        sess.run(None, feeds)
        first.append(time.process_time() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        del sess
        cycle.append(time.process_time() - c0)
        rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return {"keep": in_effect(), "first_s": first, "cycle_s": cycle, "minflt": faults, "maxrss_kib": rss}


def run_child(stage: Path, sessions: int, keep: bool) -> dict[str, Any]:
    env = {**os.environ, "RKPART_KEEP_FREED_MEMORY": "1" if keep else "0"}
    out = subprocess.run([sys.executable, __file__, "--child", str(stage), "--sessions", str(sessions)],
                         env=env, check=True, capture_output=True, text=True)
    r: dict[str, Any] = json.loads(out.stdout)
    if r["keep"] != keep:
        raise SystemExit(f"child did not apply the switch (wanted keep={keep}, got {r['keep']})")
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/rkpart-fresh"))
    ap.add_argument("--procs", type=int, default=6, help="child processes per setting (alternating)")
    ap.add_argument("--sessions", type=int, default=8, help="load-run-release cycles per child process")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.sessions)))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    ok = True
    print(f"{'block':<16} {'setting':<18} {'first call CPU ms':>18} {'minor faults':>13} {'cycle CPU ms':>13} "
          f"{'peak RSS MiB (1st / end)':>25}")
    for hidden, heads, side in SIZES:
        stage = fused_block(args.work, hidden, heads, side)
        res: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for i in range(2 * args.procs):
            keep = bool(i % 2) if (i // 2) % 2 == 0 else not bool(i % 2)  # ABBA: neither always goes first
            res[keep].append(run_child(stage, args.sessions, keep))
        med: dict[bool, float] = {}
        growth = 0.0
        for keep in (False, True):
            rs = res[keep]
            first = [x for r in rs for x in r["first_s"][1:]]
            med[keep] = statistics.median(first)
            rss1 = statistics.median(r["maxrss_kib"][0] for r in rs) / 1024
            rss_end = statistics.median(r["maxrss_kib"][-1] for r in rs) / 1024
            growth = max(growth, rss_end / rss1 - 1.0)
            name = "keep freed memory" if keep else "defaults + arena"
            print(f"h{hidden} t{(side // 2) ** 2:<10} {name:<18} {med[keep] * 1e3:>18.2f} "
                  f"{statistics.median(f for r in rs for f in r['minflt'][1:]):>13.0f} "
                  f"{statistics.median(x for r in rs for x in r['cycle_s'][1:]) * 1e3:>13.2f} "
                  f"{rss1:>12.0f} / {rss_end:<10.0f}")
        ratio = med[True] / med[False]
        print(f"h{hidden} t{(side // 2) ** 2}: first call with / without = {ratio:.3f}; "
              f"peak RSS growth over {args.sessions} cycles {growth * 100:+.1f} %")
        ok = ok and ratio <= 0.95 and growth <= 0.10
    print(f"({time.time() - t0:.0f} s, load average {os.getloadavg()[0]:.1f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
