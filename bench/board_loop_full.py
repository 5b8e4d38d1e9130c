"""The bundle's denoising loop at full width: ``runner.py --steps`` on the ONNX Runtime stand-in vs ``rkpart drift``.

Builds the model of ``bench/make_full_model.py`` (``--blocks/--hidden/--resolution`` for a
reduced one; the full size compiles 84 NPU stages, about 15 min on 2 idle cores), partitions it
with split, compiles it with rknn-toolkit2 ``--toolkit`` (without the build cache, so the build
logs that set the default core masks are in the plan folder), bundles it, runs the bundle's
``runner.py --steps N --guidance 4.5`` on the stand-in one pass after the other and with
``--cfg-parallel``, and compares the final latents with ``rkpart drift``'s ONNX Runtime
reference for the same seed and steps.  Prints the device memory the manifest records, the
core masks, the per-step wall times and the max abs differences.

Usage: ``.venv/bin/python bench/board_loop_full.py [--steps 2] [--blocks 28] [--toolkit 2.3.0]
[--workdir DIR] [--keep]``
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

import numpy as np
from _full_model import add_size_args, build, size_label  # type: ignore[import-not-found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_size_args(parser)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--guidance", type=float, default=4.5)
    parser.add_argument("--toolkit", default="2.3.0")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rkpart_bench_board_loop"))
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)

    from rkpart.bundle.build import BundleOptions, bundle_plan
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from rkpart.pipeline import partition
    from rkpart.profile.drift import denoise

    work = args.workdir
    try:
        print(size_label(args), flush=True)
        t0 = time.perf_counter()
        model = build(args, work / "model" / "anima.onnx")
        plan = partition(model, work / "split", "split", force=True)
        print(f"model + split plan: {time.perf_counter() - t0:.0f} s", flush=True)
        t0 = time.perf_counter()
        rep = compile_plan_report(plan, work / "split", CompileOptions(args.toolkit, "rk3588", {}, jobs=args.jobs,
                                                                       cache=False))
        if rep.failed:
            print(f"compile failed: {rep.failed}", file=sys.stderr)
            return 1
        print(f"compile ({len(plan.npu_stages)} NPU stages, {args.toolkit}): {time.perf_counter() - t0:.0f} s",
              flush=True)
        t0 = time.perf_counter()
        m = bundle_plan(work / "split", work / "board", BundleOptions(force=True)).manifest
        dm = m["device_memory"]
        print(f"bundle: {time.perf_counter() - t0:.0f} s; device memory {dm['run_bytes'] / 2**20:.1f} MiB, "
              f"{dm['cfg_parallel_run_bytes'] / 2**20:.1f} MiB with --cfg-parallel (from {', '.join(dm['source'])})")
        masks: dict[str, list[str]] = {}
        for s in m["stages"]:
            if s["device"] == "npu":
                masks.setdefault(s["core_mask"], []).append(s["id"])
        print("core masks: " + "; ".join(f"{k}: {len(v)} stages ({v[0]}, ...)" for k, v in sorted(masks.items())))
        t0 = time.perf_counter()
        ref = denoise(rep.plan, work / "split", backend=None, steps=args.steps, cfg=True, guidance=args.guidance,
                      seed=0).latents[-1]
        print(f"drift reference ({args.steps} steps, CFG): {time.perf_counter() - t0:.0f} s", flush=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["RKPART_RUNNER_NPU_STANDIN"] = str(work / "split")
        latents = {}
        for mode, extra in (("one pass after the other", []), ("--cfg-parallel", ["--cfg-parallel"])):
            out = work / f"latent{len(latents)}.npy"
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, str(work / "board" / "runner.py"), "--steps", str(args.steps),
                                "--guidance", str(args.guidance), "--latent-out", str(out), "--json", *extra],
                               capture_output=True, text=True, env=env)
            if p.returncode != 0:
                print(p.stderr, file=sys.stderr)
                return 1
            r = json.loads(p.stdout)
            latents[mode] = x = np.load(out)
            walls = ", ".join(f"{s['wall_s']:.1f}" for s in r["per_step"])
            print(f"runner.py, {mode}: {time.perf_counter() - t0:.0f} s, steps {walls} s; {x.dtype} {x.shape}; "
                  "max abs vs drift "
                  f"{float(np.max(np.abs(x.astype(np.float64) - ref))):.3g}", flush=True)
        a, b = latents.values()
        print(f"--cfg-parallel latent identical to the sequential one: {a.tobytes() == b.tobytes()}")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
