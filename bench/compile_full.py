"""Compile the full-size split (84 NPU stages) and fused (28) plans under the memory-aware scheduler.

Builds the model of ``bench/make_full_model.py`` (``--blocks/--hidden/--resolution`` for a
reduced one: the full size takes hours on 2 cores and up to 13.4 GB per build on 2.3.2),
partitions it with split and fused, and runs ``rkpart compile`` on each plan with every
``--toolkits`` version (``-j`` parallel builds, admitted by the scheduler's memory estimates,
which learn from these builds).  Prints, per plan and toolkit: wall time, builds ok/failed,
then per stage: build wall time, peak RSS, CPU-fallback ops, and the ``.rknn`` size against
the stage's ONNX size (graph + its data file).

Usage: ``.venv/bin/python bench/compile_full.py [--toolkits 2.5.0,2.3.0] [-j 2] [--blocks 28 --hidden 2048]
[--workdir DIR] [--keep]``
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from _full_model import add_size_args, build, onnx_bytes, size_label  # type: ignore[import-not-found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_size_args(parser)
    parser.add_argument("--toolkits", default="2.5.0,2.3.0")
    parser.add_argument("--strategies", default="split,fused")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rkpart_bench_compile"))
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)

    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from rkpart.pipeline import partition

    work = args.workdir
    failed = 0
    try:
        print(size_label(args))
        model = build(args, work / "model" / "anima.onnx")
        for strategy in args.strategies.split(","):
            folder = work / strategy
            plan = partition(model, folder, strategy, force=True)
            for version in args.toolkits.split(","):
                t0 = time.perf_counter()
                rep = compile_plan_report(plan, folder, CompileOptions(version, "rk3588", {}, jobs=args.jobs,
                                                                       timeout=args.timeout))
                wall = time.perf_counter() - t0
                ok = sum(o.artifact is not None for o in rep.outcomes)
                failed += len(rep.outcomes) - ok
                peak = max((o.peak_rss_bytes for o in rep.outcomes), default=0)
                print(f"\n{strategy} plan, rknn-toolkit2 {version}, -j {args.jobs}: {len(rep.outcomes)} NPU stages, "
                      f"{ok} built ({len(rep.cached)} cached), {len(rep.failed)} failed, wall {wall:.0f} s, "
                      f"largest build peak RSS {peak / 2**20:.0f} MiB")
                print(f"  {'stage':<18}{'status':<8}{'wall s':>8}{'peak MiB':>10}{'ONNX MiB':>10}{'rknn MiB':>10}"
                      f"{'x ONNX':>8}  CPU ops")
                stages = {s.id: s for s in rep.plan.stages}
                tot_onnx = tot_rknn = 0
                for o in rep.outcomes:
                    size = onnx_bytes(folder, stages[o.stage_id].file)
                    rk = o.artifact.size_bytes if o.artifact else 0
                    tot_onnx += size
                    tot_rknn += rk
                    cpu = ",".join(o.artifact.cpu_ops) if o.artifact else (o.failures[-1].message[:60] if o.failures
                                                                           else "")
                    print(f"  {o.stage_id:<18}{o.status:<8}{o.wall_s:>8.1f}{o.peak_rss_bytes / 2**20:>10.0f}"
                          f"{size / 2**20:>10.2f}{rk / 2**20:>10.2f}{rk / size if size else 0:>8.2f}  {cpu or '-'}")
                print(f"  total ONNX {tot_onnx / 2**20:.1f} MiB, rknn {tot_rknn / 2**20:.1f} MiB "
                      f"({tot_rknn / max(tot_onnx, 1):.2f}x)")
        return 1 if failed else 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
