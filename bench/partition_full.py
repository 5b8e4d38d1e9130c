"""Partition the full-size fp16 Anima DiT with ``split`` and measure time and peak memory.

Builds the model (28 blocks, hidden 2048, fp16, external data, ~3.9 GB) with
:func:`tests.models.anima.build_anima_onnx` unless ``--model`` is given, then runs
``partition(strategy="split")`` in a *fresh subprocess* so that its peak RSS
(``wait4`` rusage of that process alone) is the partitioner's, not the builder's.

Prints wall time (load / discover / whole partition), peak RSS, model size (graph +
external data) and the ratio peak RSS / model size; checks that the plan has 84 NPU
stages (3 per block).  Files go under ``--workdir`` (default ``/tmp/rkpart_bench_full``)
and are deleted at the end unless ``--keep``.

Usage: ``.venv/bin/python bench/partition_full.py [--model PATH] [--workdir DIR] [--keep]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

EXPECTED_NPU_STAGES = 84
ROOT = Path(__file__).resolve().parents[1]


def _child(model: Path, out: Path) -> int:
    """Runs in the measured subprocess: timings as one JSON line on stdout."""
    from rkpart.ir import load_model
    from rkpart.partitioner.discovery import discover
    from rkpart.pipeline import partition

    t0 = time.perf_counter()
    mg = load_model(model)
    t1 = time.perf_counter()
    disc = discover(mg)
    t2 = time.perf_counter()
    n_ops, n_blocks = mg.ops.number_of_nodes(), len(disc.blocks)
    del mg, disc
    t3 = time.perf_counter()
    plan = partition(model, out, "split", force=True)
    t4 = time.perf_counter()
    print(json.dumps({
        "load_s": t1 - t0, "discover_s": t2 - t1, "partition_s": t4 - t3, "ops": n_ops, "blocks": n_blocks,
        "npu_stages": len(plan.npu_stages), "host_stages": len(plan.host_stages),
        "stage_weight_bytes": sum(s.weight_bytes for s in plan.stages),
    }))
    return 0


def _size(model: Path) -> int:
    """Graph file plus every external data file in its folder that it references."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    files = {e.value for i in m.graph.initializer for e in i.external_data if e.key == "location"}
    return model.stat().st_size + sum((model.parent / f).stat().st_size for f in files)


def _run_measured(args: list[str]) -> tuple[str, float, float]:
    """Run ``args``; return (stdout, wall seconds, peak RSS in bytes of that process tree's leader)."""
    t = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"child {' '.join(args[:3])}... failed with exit code {proc.returncode}")
    return out, wall, usage.ru_maxrss * 1024.0  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="an existing full-size model (default: build one)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rkpart_bench_full"))
    parser.add_argument("--keep", action="store_true", help="keep the model and plan")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(Path(args.child[0]), Path(args.child[1]))

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    try:
        model = args.model
        if model is None:
            model = work / "anima_full_fp16.onnx"
            code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "  # the example models: tests/models/
                    "from tests.models.anima import AnimaConfig, build_anima_onnx; "
                    f"build_anima_onnx(AnimaConfig.full(), {str(model)!r}, external_data=True)")
            _, wall, rss = _run_measured([sys.executable, "-c", code])
            print(f"built {model} in {wall:.1f} s (builder peak RSS {rss / 2**20:.0f} MiB)")
        size = _size(model)
        out_json, wall, rss = _run_measured([sys.executable, __file__, "--child", str(model), str(work / "plan")])
        r = json.loads(out_json.strip().splitlines()[-1])
        print(f"model        {size / 2**30:.2f} GiB ({r['ops']} ops, {r['blocks']} blocks)")
        print(f"load         {r['load_s']:.1f} s")
        print(f"discover     {r['discover_s']:.2f} s")
        print(f"partition    {r['partition_s']:.1f} s (load + discover + extract + write, split)")
        print(f"process wall {wall:.1f} s")
        print(f"stages       {r['npu_stages']} NPU + {r['host_stages']} host, "
              f"{r['stage_weight_bytes'] / 2**30:.2f} GiB of weights written")
        print(f"peak RSS     {rss / 2**20:.0f} MiB = {rss / size:.3f} x model size")
        if r["npu_stages"] != EXPECTED_NPU_STAGES:
            print(f"FAIL: expected {EXPECTED_NPU_STAGES} NPU stages, got {r['npu_stages']}")
            return 1
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
