"""Fit a cost model on real ONNX Runtime profiles of this machine and print its held-out error.

Builds small Anima-style models of several sizes (hidden size x image tokens x heads),
partitions each with several strategies (split, split with AdaLN on the NPU, fused, fused runs
of 2 blocks), profiles every plan with the ORT backend on one thread, ``--infer-repeat`` calls
per pass, ``--reps`` runs per plan interleaved across plans
(`rkpart.profile.lifecycle.profile_plan`), then runs `rkpart fit --statistic min` on all
profiles (leave-one-plan-out cross-validation).  See docs/cost-model.md for the why.

Target (issue 5): >= 80 % of held-out inference-latency predictions within +-10 %.

Usage: ``.venv/bin/python bench/cost_model_fit.py [--work /tmp/rkpart-fit] [--reps 4] [--infer-repeat 5]
[--dev | --quick]``  (check ``uptime`` first: other jobs on the machine distort the times)
Exit code 0 when the target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from rkpart.cli import main as rkpart_main
from rkpart.pipeline import partition
from rkpart.plan.plan import Plan
from rkpart.profile.lifecycle import ProfileOptions, profile_plan
from rkpart.profile.records import write_jsonl
from rkpart.runtime.ort import OrtBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the example models: tests/models/
from tests.models.anima import AnimaConfig, build_anima_onnx

#: (hidden, heads, latent side); image tokens = (side / 2) ** 2: hidden 128..512, tokens 64..1024.
#: Stages run from ~0.05 ms (host AdaLN of the smallest) to ~50 ms (fused x2 of the largest).
#: Longer stages are left out on purpose: on this shared 2-core machine hardly any call of
#: 0.1 s runs without being preempted or slowed by other jobs (measured: the same fused x2
#: stage 71 ms of CPU time, 72..83 ms fastest wall time depending on the minute), so their
#: fastest call is not their own cost.  Head counts vary so that the attention-score work
#: (heads x tokens^2) is not a function of hidden size and tokens alone.
SIZES: tuple[tuple[int, int, int], ...] = (
    (128, 4, 32), (128, 2, 64), (192, 6, 48), (192, 3, 32), (256, 8, 16), (256, 4, 56), (320, 10, 32),
    (320, 5, 48), (384, 12, 16), (384, 6, 32), (448, 14, 32), (512, 8, 32), (512, 16, 16),
)
#: A disjoint grid (no hidden size in common with SIZES), used while choosing the features,
#: the statistic and the measurement settings, so that the final held-out numbers come from
#: profiles those choices never saw.
DEV_SIZES: tuple[tuple[int, int, int], ...] = (
    (160, 5, 40), (224, 7, 56), (288, 9, 40), (352, 11, 40), (416, 13, 40), (480, 15, 24),
)
QUICK_SIZES: tuple[tuple[int, int, int], ...] = ((128, 4, 32), (256, 8, 16), (384, 6, 32))
STRATEGIES: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("split", "split", {}),
    ("split-adaln-npu", "split", {"adaln": "npu"}),
    ("fused", "fused", {}),
    ("fused-x2", "fused", {"blocks_per_stage": 2}),
)


def make_plans(work: Path, sizes: tuple[tuple[int, int, int], ...]) -> list[tuple[str, Plan, Path]]:
    """Build every model and partition it every way: ``(name, plan, folder)``."""
    out: list[tuple[str, Plan, Path]] = []
    for hidden, heads, side in sizes:
        cfg = AnimaConfig.tiny(hidden=hidden, heads=heads, ffn_dim=4 * hidden, latent_height=side, latent_width=side,
                               context_dim=hidden // 2, context_len=32, adaln_lora_dim=hidden // 4)
        name = f"h{hidden}_n{heads}_t{cfg.num_tokens}"
        model = work / "models" / f"{name}.onnx"
        if not model.exists():
            build_anima_onnx(cfg, model)
        for sname, strategy, opts in STRATEGIES:
            folder = work / "plans" / f"{name}_{sname}"
            plan = partition(model, folder, strategy, force=True, **opts)
            out.append((f"{name}_{sname}", plan, folder))
    return out


def make_profiles(work: Path, plans: list[tuple[str, Plan, Path]], *, reps: int, infer_repeat: int,
                  threads: int) -> list[Path]:
    """Profile every plan ``reps`` times, interleaved: one round of every plan, then the next.

    Other jobs on the machine come and go; profiling one plan completely and then the next
    would give the plans measured during a busy spell uniformly slow times, which no feature
    explains.  Interleaved, every plan is measured across the whole run, and `rkpart fit` pools
    the runs of a plan (one file per run) into one sample per stage.  The order of the plans
    rotates from one repetition to the next, so no plan is always measured right after the same
    neighbour.
    """
    # One intra-op thread: on a 2-core machine shared with other jobs, ORT's default pool (one
    # spinning thread per core) makes a stage's time depend on whether its second thread got
    # scheduled (the same stage measured 1 ms and 20 ms).  One thread measures the stage itself.
    backend = OrtBackend(threads=threads)
    out: list[Path] = []
    for rep in range(reps):
        t0 = time.perf_counter()
        shift = rep * len(plans) // reps
        for name, plan, folder in plans[shift:] + plans[:shift]:
            prof = work / "profiles" / f"{name}.r{rep}.jsonl"
            if not prof.exists():
                # resident: inference runs on warm sessions (per-stage would time only first calls
                # of fresh sessions); 1 step x CFG = 2 passes, infer_repeat calls per pass
                recs = profile_plan(plan, folder, ProfileOptions(rounds=1, warmup=0, cfg=True, steps=1,
                                                                 residency="resident", device_pattern=None,
                                                                 sample_interval=0.0, plan=str(folder / "plan.json"),
                                                                 infer_repeat=infer_repeat), backend=backend,
                                                                 host_backend=backend).to_json()
                write_jsonl(prof, recs)
            out.append(prof)
        print(f"repetition {rep + 1}/{reps}: {len(plans)} plans in {time.perf_counter() - t0:.1f} s "
              f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/rkpart-fit"))
    ap.add_argument("--reps", type=int, default=4,
                    help="profile runs per plan, interleaved across plans (one round of 2 CFG passes each)")
    ap.add_argument("--infer-repeat", type=int, default=5, help="inference calls per stage and pass")
    ap.add_argument("--threads", type=int, default=1, help="ORT intra-op threads (0: ORT default)")
    ap.add_argument("--quick", action="store_true", help="3 sizes only")
    ap.add_argument("--dev", action="store_true", help="the development grid (DEV_SIZES) instead of SIZES")
    ap.add_argument("--statistic", choices=["median", "min"], default="min",
                    help="per-stage statistic for `rkpart fit` (min: robust to other jobs on the machine)")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sizes = QUICK_SIZES if args.quick else DEV_SIZES if args.dev else SIZES
    print(f"load average before profiling: {os.getloadavg()[0]:.2f}", flush=True)
    plans = make_plans(args.work, sizes)
    print(f"{len(plans)} plans built in {time.perf_counter() - t0:.0f} s", flush=True)
    profiles = make_profiles(args.work, plans, reps=args.reps, infer_repeat=args.infer_repeat,
                             threads=args.threads)
    print(f"{len(profiles)} profiles in {time.perf_counter() - t0:.0f} s "
          f"(load average {os.getloadavg()[0]:.2f})")
    fit_args = ["fit", *map(str, profiles), "-o", str(args.work / "model.json"), "--statistic", args.statistic]
    res = CliRunner().invoke(rkpart_main, fit_args)
    print(res.output)
    if res.exit_code != 0:
        print(res.exception)
        return 2
    import json

    res_json = CliRunner().invoke(rkpart_main, [*fit_args, "--json"])
    report = json.loads(res_json.stdout)
    share = report["components"]["infer"]["cross_validation"]["within_10"]
    ok = share is not None and share >= 0.8
    print(f"held-out inference predictions within +-10 %: {share * 100:.0f} % (target >= 80 %): "
          f"{'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
