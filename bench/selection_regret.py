"""Does ``--strategy auto`` pick what is measured fastest, on sizes its cost model never saw?

1. Fit: small Anima-style models (2 blocks; hidden 128..256, image tokens 64..256) are
   partitioned every way ``auto`` chooses from (split, split with AdaLN on the NPU, fused,
   fused x2) and profiled on ONNX Runtime, one thread, per-stage and resident
   (:func:`rkpart.tune.profile_for_fit`), rounds interleaved across every plan and size; one
   cost model is fitted on all of them (per-stage components + whole-round glue, median of the
   in-pipeline calls, process CPU time).
2. Evaluate on sizes outside that range: image tokens up to 4x beyond it (1024), hidden up to
   1.5x beyond it (384), 2 and 4 blocks.  Per model, ``auto`` chooses with the fitted model and
   its plan is run next to every single-strategy plan under each residency, rounds
   interleaved across every plan of every model (the order rotating), timed in process CPU
   time (:func:`rkpart.tune.choose_auto`, :func:`rkpart.tune.verify_round`).
   One fitted size (``REFERENCE``) has its plans run again after each evaluation round: its
   rounds then against its rounds in the fit phase show how far the machine drifted between
   the two phases (inside the fitted range, the model is not what changed).
3. Print per model auto's choice, the measured best, the regret (auto / best - 1), the
   whole-plan prediction error of every plan, and the share of per-stage NPU inference
   predictions within +-10 % (from the same runs' stage records: median CPU time of the
   stage's calls); and how well the measurement repeats itself (identical stages of one plan;
   auto's plan vs the identical single-strategy plan, measured apart).

When auto's plan is byte-identical to a single-strategy plan (same stage files by sha256, same
residency: :func:`rkpart.tune.identical_twin`), the two are one plan measured twice: the regret pools their
rounds (:func:`rkpart.tune.pooled_regret`) instead of counting the noise between two measurements of one plan as
regret.  The unpooled figure is printed too.

Targets (issue 11): median regret <= 2 %, worst <= 5 %; >= 90 % of whole-plan predictions within
+-10 %; >= 95 % of per-stage inference predictions within +-10 % (incl. 4x tokens).

Usage: ``.venv/bin/python bench/selection_regret.py [--work /tmp/rkpart-regret] [--verify-rounds 9] [--quick]
[--statistic median|min]``
Exit code 0 when every target is met, 1 otherwise.  Check ``uptime`` first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the example models: tests/models/
from rkpart.cost_model.calibration import fit_profiles
from rkpart.cost_model.features import stage_features
from rkpart.cost_model.model import CostModel
from rkpart.cost_model.rounds import round_time
from rkpart.plan.plan import load_plan
from rkpart.profile.records import read_jsonl
from rkpart.tune import (
    TuneConfig,
    VerifyRow,
    choose_auto,
    identical_twin,
    pooled_regret,
    predicted_round,
    profile_for_fit,
    single_plans,
    verify_round,
)
from tests.models.anima import AnimaConfig, build_anima_onnx

#: (hidden, heads, latent side, blocks); image tokens = (side / 2) ** 2
FIT = [(128, 4, 16, 2), (128, 4, 32, 2), (256, 4, 16, 2), (256, 4, 32, 2), (192, 4, 24, 2)]
EVAL = [(256, 4, 64, 2), (384, 6, 32, 2), (192, 4, 48, 4), (320, 5, 40, 2), (128, 4, 64, 4), (384, 6, 64, 4)]
QUICK_FIT = [(128, 4, 16, 2), (256, 4, 32, 2), (192, 4, 24, 2)]
#: a fitted size whose plans are run again between the evaluation rounds: inside the fitted range,
#: so what separates its rounds in the evaluation phase from its rounds in the fit phase is the
#: machine (other jobs), not the model
REFERENCE = (192, 4, 24, 2)
QUICK_EVAL = [(256, 4, 64, 2), (384, 6, 32, 2)]


def build(root: Path, hidden: int, heads: int, side: int, blocks: int) -> Path:
    cfg = AnimaConfig.tiny(num_blocks=blocks, hidden=hidden, heads=heads, ffn_dim=4 * hidden, latent_height=side,
                           latent_width=side)
    path = root / f"anima_h{hidden}_t{(side // 2) ** 2}_b{blocks}.onnx"
    if not path.exists():
        build_anima_onnx(cfg, path)
    return path


def stage_infer_errors(model: CostModel, folders: dict[str, Path], rows: list[Any]) -> tuple[list[float], list[float]]:
    """Per NPU stage of every verified plan and residency: |predicted - measured| / measured
    inference, measured as the median process CPU time of the stage's calls in those pipeline
    rounds (what a pipeline pays; rounds interleaved across plans).  Second: the repeatability
    of the measurement itself, |a / b - 1| for every pair of stages of one run with identical
    features (block 0's and block 1's attention stage, ...)."""
    errors: list[float] = []
    repeat: list[float] = []
    for row in rows:
        if row.plan == "auto":
            continue
        folder = folders[row.plan]
        plan, _ = load_plan(folder)
        calls: dict[str, list[float]] = {}
        for r in row.records:
            if r["stage"]["device"] != "host" and r["timings"].get("infer_cpu_s") is not None:
                calls.setdefault(r["stage"]["id"], []).append(float(r["timings"]["infer_cpu_s"]))
        by_features: dict[Any, list[float]] = {}
        for s in plan.npu_stages:
            if s.id not in calls:
                continue
            f = stage_features(folder, s)
            meas = statistics.median(calls[s.id])
            pred = model.predict_stage(f).get("infer")
            if pred is not None and meas > 0:
                errors.append(abs(pred - meas) / meas)
            by_features.setdefault(f, []).append(meas)
        for ms in by_features.values():
            repeat += [abs(a / b - 1.0) for a, b in itertools.pairwise(ms)]
    return errors, repeat


def fit_phase_rounds(profiles: Path, name: str, residency: str) -> list[float]:
    """The measured rounds of one plan and residency in the fit phase (its time-only profiles)."""
    out: list[float] = []
    for f in sorted(profiles.glob(f"{name}.{residency}.r*.jsonl")):
        for r in read_jsonl(f):
            if r.get("record") == "round" and not r.get("warmup"):
                t = round_time(r)
                if t is not None:
                    out.append(t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/rkpart-regret"))
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds per fit profile")
    ap.add_argument("--verify-rounds", type=int, default=9, help="interleaved rounds per plan in the evaluation")
    ap.add_argument("--quick", action="store_true", help="3 fit sizes, 2 evaluation sizes")
    ap.add_argument("--statistic", choices=("median", "min"), default="median",
                    help="what a stage sample is: the median CPU time of its calls (what a pipeline pays) or the least")
    args = ap.parse_args(argv)
    t0 = time.time()
    work: Path = args.work
    (work / "models").mkdir(parents=True, exist_ok=True)
    cfg = TuneConfig(rounds=args.rounds, verify_rounds=args.verify_rounds, threads=1, statistic=args.statistic)
    profiles: list[Path] = []
    fits = []
    for spec in (QUICK_FIT if args.quick else FIT):
        path = build(work / "models", *spec)
        sub = work / "fit" / path.stem
        fits.append((path, sub, *single_plans(path, sub)))
    # round i of every model's every plan before round i + 1 of any: a busy spell of the shared
    # machine is spread over all fit sizes instead of biasing one
    for i in range(cfg.rounds):
        for _path, sub, plans, n, reps in fits:
            profiles += profile_for_fit(plans, n, reps, sub, cfg, only_round=i)
        print(f"fit: profiled round {i + 1}/{cfg.rounds}", file=sys.stderr)
    model, report = fit_profiles(profiles, statistic=args.statistic, clock="cpu")
    model_file = model.save(work / "cost_model.json")
    whole = report.whole_plan.error
    print(f"fit on {len(profiles)} profiles: held-out whole-plan error median {whole.median_ape} %, "
          f"{(whole.within_10 or 0) * 100:.0f} % within +-10 %; fitted range {report.to_json()['fitted_range']}")
    regrets: list[float] = []
    raw_regrets: list[float] = []
    plan_errors: list[float] = []
    stage_errors: list[float] = []
    stage_errors_4x: list[float] = []
    stage_repeat: list[float] = []
    plan_repeat: list[float] = []
    results: list[dict[str, Any]] = []
    print(f"{'model':<24} {'auto chose':<34} {'measured best (twins pooled)':<34} {'regret':>7} "
          f"{'unpooled':>10} {'plan err':>10}")
    evals = []
    for spec in (QUICK_EVAL if args.quick else EVAL):
        path = build(work / "models", *spec)
        sub = work / "eval" / path.stem
        plans, _, _ = single_plans(path, sub)
        _, choices, rows, folders = choose_auto(path, sub, model_file, plans, cfg)
        evals.append((spec, path, sub, plans, choices, rows, folders))
    # round i of every model's every plan before round i + 1 of any (as the fit): a busy spell
    # of the shared machine is spread over all models instead of shifting one model's every plan
    # the in-range reference: the fitted size's own plans, run again after each evaluation round
    ref_path, rsub, rplans, _, _ = next(f for f in fits if f[0].stem == build(work / "models", *REFERENCE).stem)
    ref_rows = [VerifyRow(n, r) for n in rplans for r in ("per-stage", "resident")]
    for row in ref_rows:
        rplan, rfolder = load_plan(rplans[row.plan])
        row.predicted_s = predicted_round(model, rplan, rfolder, row.residency, cfg.steps * (2 if cfg.cfg else 1))
    for i in range(cfg.verify_rounds):
        for _spec, _path, sub, _plans, _choices, rows, folders in evals:
            verify_round(rows, folders, sub, cfg, i)
        verify_round(ref_rows, dict(rplans), work / "reference", cfg, i)
        print(f"verify: round {i + 1}/{cfg.verify_rounds}", file=sys.stderr)
    for spec, path, _sub, plans, choices, rows, folders in evals:
        best = min(rows, key=lambda r: r.median_s)
        auto = next(r for r in rows if r.plan == "auto")
        raw_regret = auto.median_s / best.median_s - 1.0
        raw_regrets.append(raw_regret)
        twin = identical_twin(choices, folders)
        regret, best_name = pooled_regret(rows, twin)
        regrets.append(regret)
        for r in rows:
            if r.predicted_s is not None:
                plan_errors.append(abs(r.predicted_s - r.median_s) / r.median_s)
        errs, rep = stage_infer_errors(model, plans, rows)
        stage_errors += errs
        stage_repeat += rep
        if (spec[2] // 2) ** 2 >= 4 * 256:  # 4x the largest fitted token count
            stage_errors_4x += errs
        # the same plan twice: auto's plan and the byte-identical single-strategy plan, if it is one
        twin_row = None if twin is None else next((r for r in rows if (r.plan, r.residency) == twin), None)
        if twin_row is not None:
            plan_repeat.append(abs(auto.median_s / twin_row.median_s - 1.0))
        chose = "; ".join(sorted({f"{c['candidate']}/{c['residency']}" for c in choices}))
        aerr = "-" if auto.predicted_s is None else f"{(auto.predicted_s / auto.median_s - 1) * 100:+.1f} %"
        print(f"{path.stem:<24} {chose:<34} {best_name:<34} {regret * 100:>6.2f}% {raw_regret * 100:>9.2f}% "
              f"{aerr:>10}")
        results.append({"model": path.stem, "choices": choices, "identical_to": None if twin is None else
                        "/".join(twin), "best": best_name, "regret": regret,
                        "best_unpooled": f"{best.plan}/{best.residency}", "regret_unpooled": raw_regret,
                        "rows": [r.to_json() for r in rows]})

    def within(xs: list[float]) -> float:
        return sum(x <= 0.10 for x in xs) / len(xs) if xs else 0.0

    med, worst = statistics.median(regrets), max(regrets)
    wp, st, st4 = within(plan_errors), within(stage_errors), within(stage_errors_4x)
    print(f"regret: median {med * 100:.2f} % (target <= 2 %), worst {worst * 100:.2f} % (target <= 5 %); "
          "auto's plan and a byte-identical single-strategy plan (same stage files, same residency) are one "
          "plan: their rounds are pooled")
    print(f"regret unpooled (auto's plan vs its identical twin counted as two plans): median "
          f"{statistics.median(raw_regrets) * 100:.2f} %, worst {max(raw_regrets) * 100:.2f} %")
    print(f"whole-plan predictions within +-10 %: {wp * 100:.0f} % of {len(plan_errors)} (target >= 90 %)")
    print(f"per-stage NPU inference within +-10 %: {st * 100:.0f} % of {len(stage_errors)} (target >= 95 %); "
          f"at 4x the fitted tokens: {st4 * 100:.0f} % of {len(stage_errors_4x)}")
    rs = sorted(stage_repeat)
    rmed = statistics.median(rs) * 100 if rs else 0.0
    print(f"measurement repeatability: identical stages of one plan differ by median {rmed:.1f} %, "
          f"{within(rs) * 100:.0f} % of {len(rs)} pairs within +-10 %; "
          f"auto's plan vs the identical single-strategy plan: "
          + (", ".join(f"{x * 100:.1f} %" for x in plan_repeat) or "no identical pair"))
    drift = [r.median_s / statistics.median(fr) for r in ref_rows
             if (fr := fit_phase_rounds(rsub / "profiles", r.plan, r.residency))]
    ref_err = [r.predicted_s / r.median_s - 1.0 for r in ref_rows if r.predicted_s is not None]
    print(f"machine drift: the fitted size {ref_path.stem}'s {len(ref_rows)} plans, re-run between the evaluation "
          f"rounds, took {statistics.median(drift):.2f}x (range {min(drift):.2f}-{max(drift):.2f}) their fit-phase "
          f"rounds; their whole-plan predictions: median {statistics.median(ref_err) * 100:+.1f} %, "
          f"{within([abs(e) for e in ref_err]) * 100:.0f} % within +-10 % (inside the fitted range: what is off "
          "there is the machine, not the extrapolation)")
    print(f"({time.time() - t0:.0f} s)")
    (work / "results.json").write_text(json.dumps({"regret_median": med, "regret_worst": worst,
                                                   "regret_unpooled_median": statistics.median(raw_regrets),
                                                   "regret_unpooled_worst": max(raw_regrets),
                                                   "whole_plan_within_10": wp, "stage_infer_within_10": st,
                                                   "stage_infer_within_10_at_4x": st4,
                                                   "identical_stages_within_10": within(stage_repeat),
                                                   "identical_plans_differ": plan_repeat,
                                                   "reference_eval_over_fit_phase": drift,
                                                   "reference_whole_plan_error": ref_err, "models": results},
                                                  indent=2) + "\n")
    ok = med <= 0.02 and worst <= 0.05 and wp >= 0.90 and st >= 0.95 and st4 >= 0.95
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
