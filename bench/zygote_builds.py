"""What forking toolkit workers from a zygote saves (rkpart.compile.zygote), side by side in one run.

``rkpart compile`` of the bundled example's split plan (6 NPU stages) and ``rkpart run --backend
rknn-sim --per-stage`` of it, each as a whole process with an empty build cache, ``RKPART_ZYGOTE=1``
(the default: one toolkit import per process) and ``RKPART_ZYGOTE=0`` (the old way: one toolkit
python and one ``import rknn.api`` per build and per simulator session) interleaved, alternating
which goes first.  CPU is the process's and every descendant's (the zygote, and the workers it
reaped, are waited for before the command exits).  Prints the medians and the ratio zygote / old
per command; target: the zygote compile takes at most 0.6x the old way's CPU.  Exit 0 when met.

Usage: ``.venv/bin/python bench/zygote_builds.py [--toolkit 2.5.0] [--reps 5] [--work /tmp/rkpart-zygote-bench]``
(``RKPART_TOOLKITS_DIR`` as for the tests; check ``uptime`` first).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RKPART = [sys.executable, "-m", "rkpart"]
TARGET = 0.6


def _timed(cmd: list[str], zygote: str) -> tuple[float, float]:
    env = {**os.environ, "RKPART_ZYGOTE": zygote}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toolkit", default="2.5.0")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rkpart-zygote-bench"))
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    plan = a.work / "split"
    subprocess.run([*RKPART, "partition", "--strategy", "split", "--out", str(plan), "--force", "-q"], cwd=ROOT,
                   check=True)
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for rep in range(a.reps):
        for z in (("1", "0") if rep % 2 == 0 else ("0", "1")):
            work = a.work / f"r{rep}-{z}"
            shutil.copytree(plan, work)
            cmds = {"compile": [*RKPART, "compile", str(work), "--toolkit", a.toolkit, "-j", "1", "-q",
                                "--cache-dir", str(work / "cache")],
                    "simulate": [*RKPART, "run", str(work), "--backend", "rknn-sim", "--toolkit", a.toolkit,
                                 "--per-stage"]}
            for name, cmd in cmds.items():
                rows.setdefault((name, z), []).append(_timed(cmd, z))
            shutil.rmtree(work)
            print(f"rep {rep + 1}/{a.reps} RKPART_ZYGOTE={z} done", file=sys.stderr, flush=True)
    ok = True
    print(f"{'command':10s} {'zygote wall/cpu s':>20s} {'old wall/cpu s':>18s} {'cpu ratio':>10s}")
    for name in ("compile", "simulate"):
        zw, zc = (statistics.median(x[i] for x in rows[(name, "1")]) for i in (0, 1))
        ow, oc = (statistics.median(x[i] for x in rows[(name, "0")]) for i in (0, 1))
        print(f"{name:10s} {zw:9.1f} / {zc:8.1f} {ow:8.1f} / {oc:8.1f} {zc / oc:9.2f}x")
        if name == "compile":
            ok = zc / oc <= TARGET
    print(f"target: compile CPU <= {TARGET}x the old way: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
