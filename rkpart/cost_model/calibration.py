"""Turning measurements into a model: profile records -> samples, and the RK3588 calibration.

Two sources:

* **Profiles** (``rkpart profile ... -o X.jsonl``): :func:`samples_from_records` makes one
  :class:`~rkpart.cost_model.model.Sample` per stage and run, with the median over measured
  rounds of each lifecycle component (per call), and features from the plan's stage files.
* **The write-up** (``/work/shared/seed``): two measured configurations of one 512 px Anima
  block (3-model split vs fused 1-model) on a ROCK 5C.  Two data points cannot fit free
  linear models, so :func:`calibrate_writeup` fixes the *structure* (which terms, which
  coefficients are priors) and solves the remaining ones exactly; see docs/cost-model.md.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rkpart.cost_model.candidates import Candidate
from rkpart.cost_model.checks import check_own_predictions, check_samples
from rkpart.cost_model.features import Features, combine, stage_features
from rkpart.cost_model.model import (
    Accuracy,
    Component,
    CostModel,
    ErrorSummary,
    Provenance,
    Sample,
    error_summary,
    nnls_relative,
)
from rkpart.cost_model.rounds import RoundSample, fit_overhead, fitted_range, round_seconds, whole_plan_cv
from rkpart.errors import SpecError
from rkpart.plan.plan import Plan, load_plan
from rkpart.profile.records import StageRecord, read_jsonl, stage_records
from rkpart.targets.known_issues import crash_patterns
from rkpart.types import HOST, LIFECYCLE, JsonMap, JsonObject, seconds_key
from rkpart.units import KIB

#: the lifecycle calls that are not inference (a host stage's setup is their sum per round)
LIFE_CALLS = ("load", "init", "release")

#: The write-up's published numbers (seed/*.txt sections 4-6): one 512 px block, 3 rounds of
#: 2-pass CFG, per-stage residency, RKNN runtime 2.3.0 / driver 0.9.8, toolkit 2.3.0.
#: Times are totals over the 2 passes of one round.
WRITEUP: dict[str, dict[str, float]] = {
    "split": {"load_s": 0.4863, "init_s": 0.4464, "infer_s": 3.1177, "release_s": 0.1694, "host_s": 0.1658,
              "device_pss_kib": 127144, "pss_peak_kib": 648282, "mse_vs_pytorch": 1.0841e-06},
    "fused": {"load_s": 0.4814, "init_s": 0.4240, "infer_s": 3.2972, "release_s": 0.1623, "host_s": 0.0,
              "device_pss_kib": 223704, "pss_peak_kib": 694882, "mse_vs_pytorch": 2.1100e-05},
}
WRITEUP_PASSES = 2

WRITEUP_PROVENANCE: JsonObject = {
    "source": "seed write-up 'Can Partitioned DiT Blocks Be Recombined?' (shared/seed), sections 4-6",
    "device": "Radxa ROCK 5C 8GB (RK3588S2), RKNN target rk3588",
    "runtime": "RKNN runtime API 2.3.0, RKNPU driver 0.9.8",
    "toolkit": "2.3.0",
    "records": "published medians of 3 rounds x 2 CFG passes, one 512 px Anima DiT block: "
               "3-model split (AdaLN + residual on host) and fused 1-model",
    "features_from": "AnimaConfig.full(512).replace(num_blocks=1), fp16 (tests.models.anima)",
    "limits": "one block shape (hidden 2048, 1024 image tokens, 512 text tokens), one resolution, "
              "one board; two data points per component, so the structure of each predictor is assumed "
              "(docs/cost-model.md) and only its free coefficients are solved",
}

#: the write-up's two measures of the fused-vs-split time difference of one block (section 5)
WRITEUP_WALL_DELTA = (4.4981 - 4.7379) / 4.7379


def writeup_resolution() -> JsonObject:
    """The smallest relative latency difference the write-up's measurements resolve.

    A calibration has no held-out data, so its error is taken from the measurement itself: the
    write-up measured the fused-vs-split difference of one block twice, as the sum of its
    components (-0.47 %) and as wall time (-5.06 %, with the split run's memory snapshots in it).
    The two disagree by 4.6 points, so differences below that are not resolved, and selection
    treats candidates predicted within it of each other as a tie (broken by memory, then accuracy).
    """
    keys = ("load_s", "init_s", "infer_s", "release_s", "host_s")  # the write-up's "net component sum"
    comp, base = (sum(WRITEUP[c][k] for k in keys) for c in ("fused", "split"))
    rel = abs(WRITEUP_WALL_DELTA - (comp - base) / base)
    return {"relative": round(rel, 4),
            "source": "seed write-up section 5: one block's fused-vs-split difference measured as the component "
                      f"sum ({(comp - base) / base * 100:+.2f} %) and as wall time ({WRITEUP_WALL_DELTA * 100:+.2f} %) "
                      f"disagrees by {rel * 100:.1f} points"}


#: the per-block MSE ratio the write-up measured on the board (fused vs split, one 512 px block)
WRITEUP_BLOCK_MSE_RATIO = round(WRITEUP["fused"]["mse_vs_pytorch"] / WRITEUP["split"]["mse_vs_pytorch"], 3)
#: the drift table shipped with rkpart: ``bench/drift_full.py --accuracy`` on the full-size model
DRIFT_FILE = "drift_anima_full.json"
#: families the drift table does not run, and whose error they are taken to share
_ASSUMED_LIKE_FUSED = {
    "adaln=npu,residual=host": "reference/rknn.md: split with AdaLN inside had the same error as fused in the "
                               "simulator (MSE 1.7e-7 vs 6.9e-10)",
    "adaln=host,residual=npu": "reference/rknn.md attributes fused's error to the fp16 residual stream",
}


def shipped_drift() -> JsonObject:
    """The accuracy term measured by the drift table shipped in ``rkpart/data`` (see :data:`DRIFT_FILE`)."""
    from importlib import resources

    return dict(json.loads((resources.files("rkpart") / "data" / DRIFT_FILE).read_text()))


def accuracy_table() -> JsonObject:
    """The calibration's accuracy term: the shipped drift table's measured families (latent MSE after
    the whole model, every step, CFG, relative to the default split) and floor; the families it does
    not run take fused's measured ratio."""
    acc = shipped_drift()
    fams = dict(acc["families"])
    fused = fams["adaln=npu,residual=npu"]
    for key, why in _ASSUMED_LIKE_FUSED.items():
        fams.setdefault(key, {"ratio": fused["ratio"],
                              "source": f"assumed like fused, not run by the drift table: {why}"})
    out = {k: v for k, v in acc.items() if k != "families"}
    out["families"] = dict(sorted(fams.items()))
    out["writeup_block_mse_ratio"] = WRITEUP_BLOCK_MSE_RATIO
    return out


# -- write-up calibration --------------------------------------------------------------------


def _fit_sum(cases: Sequence[tuple[Features, float]], terms: Sequence[str]) -> tuple[float, ...]:
    x = np.array([[f.value(t) for t in terms] for f, _ in cases], dtype=float)
    y = np.array([v for _, v in cases], dtype=float)
    return tuple(float(c) for c in nnls_relative(x, y))


def _fit_max(
    cases: Sequence[tuple[Sequence[Features], float]],
    terms: Sequence[str],
    fixed: Mapping[str, float],
) -> tuple[float, ...]:
    """Coefficients for ``y = max over stages (sum coef * feature)``, some coefficients fixed.

    Which stage is the max depends on the coefficients, so this alternates: assume the
    argmax stages, solve the linear problem for the free coefficients, recompute the argmax,
    until it no longer changes.
    """
    free = [t for t in terms if t not in fixed]

    def value(f: Features, coef: Mapping[str, float]) -> float:
        return sum(coef[t] * f.value(t) for t in terms)

    coef = {t: fixed.get(t, 0.0) for t in terms}
    def arg_max(stages: Sequence[Features], score: Callable[[Features], float]) -> int:
        return max(range(len(stages)), key=lambda i: score(stages[i]))

    argmax = [arg_max(st, lambda f: float(f.weight_bytes)) for st, _ in cases]
    for _ in range(20):
        x = np.array([[st[i].value(t) for t in free] for (st, _), i in zip(cases, argmax, strict=True)])
        y = np.array([v - sum(fixed[t] * st[i].value(t) for t in fixed)
                      for (st, v), i in zip(cases, argmax, strict=True)])
        sol = nnls_relative(x, y)
        coef.update({t: float(c) for t, c in zip(free, sol, strict=True)})
        new = [arg_max(st, lambda f: value(f, coef)) for st, _ in cases]
        if new == argmax:
            break
        argmax = new
    return tuple(coef[t] for t in terms)


#: the shipped device-memory predictors (``bench/device_memory.py --ship``)
DEVICE_MEMORY_FILE = "device_memory.json"


def shipped_device_memory() -> JsonObject | None:
    """``rkpart/data/device_memory.json``: per toolkit a ``device_mem`` predictor fitted on compiler
    tables, and the write-up block's compiled features (``None`` when it is not shipped)."""
    from importlib import resources

    f = resources.files("rkpart") / "data" / DEVICE_MEMORY_FILE
    if not f.is_file():
        return None
    return dict(json.loads(f.read_text()))


def _compiled_block(doc: JsonMap, which: str) -> list[Features]:
    return [Features.from_json(d) for d in doc["writeup_block"][which]]


def npu_time_check(doc: JsonMap) -> JsonObject:
    """The NPU-time calibration from the write-up block's compiled tables, and the leave-fused-out
    check: fitted on split alone, the predicted fused inference against the board's +5.8 %."""
    from rkpart.cost_model.npu_time import calibrate, leave_fused_out, predict

    split, fused = _compiled_block(doc, "split"), _compiled_block(doc, "fused")
    sp, fu = (WRITEUP[k]["infer_s"] / WRITEUP_PASSES for k in ("split", "fused"))
    full = calibrate(split, sp, fused, fu)
    loo = leave_fused_out(split, sp)
    pred = predict(loo.component, fused)
    return {"component": full.component, "leave_fused_out": {
        "coefficients": dict(zip(loo.component.terms, loo.component.coef, strict=True)),
        "predicted_fused_s": round(pred, 4), "measured_fused_s": round(fu, 4),
        "predicted_ratio": round(pred / sp, 4), "measured_ratio": round(fu / sp, 4),
        "error_pct": round((pred / fu - 1) * 100, 2), "note": loo.note},
        "note": full.note}


def calibrate_writeup(split: Candidate, fused: Candidate) -> CostModel:
    """The RK3588 model from the write-up's two configurations of one block.

    ``split``/``fused`` are the candidates of the same full-size block (features only).
    Structure (docs/cost-model.md):

    * load / init / release per stage = ``a * file_bytes + b``: a per-byte cost and a per-call
      overhead, solved from the two configurations (3 stages vs 1, 127 vs 140 MB);
    * inference per stage = ``c * MACs + e * NPU elementwise elements``: the fused block does the
      same MACs plus AdaLN / gates / residuals as fp16 elementwise work on the NPU, which is
      what makes it 5.8 % slower; a per-call inference overhead is not identifiable from two
      points and is taken as 0;
    * host per pass = ``h * elements touched`` by the host AdaLN / residual ops;
    * device memory per stage = ``1.0 * weight_bytes + m * peak activation bytes + m0``
      (weights resident once, a prior), the largest loaded stage counting under per-stage
      residency;
    * peak process PSS per stage = ``p * file_bytes + p0``, max over stages.
    """
    passes = WRITEUP_PASSES
    sp, fu = WRITEUP["split"], WRITEUP["fused"]
    s_npu, f_npu = combine(split.npu), combine(fused.npu)
    comps: dict[str, Component] = {}
    life_terms = ("const", "file_bytes")
    for name in ("load", "init", "release"):
        key = seconds_key(name)
        coef = _fit_sum([(s_npu, sp[key] / passes), (f_npu, fu[key] / passes)], life_terms)
        comps[name] = Component(name, life_terms, coef, source="calibration", samples=2,
                                note="per call: per-byte cost of the model file plus a fixed per-stage overhead")
    infer_terms = ("all_macs", "elementwise_elems")
    coef = _fit_sum([(s_npu, sp["infer_s"] / passes), (f_npu, fu["infer_s"] / passes)], infer_terms)
    comps["infer"] = Component("infer", infer_terms, coef, source="calibration", samples=2,
                               note="per pass: MACs plus fp16 elementwise work on the NPU (AdaLN, gates, residuals, "
                                    "softmax, GELU); per-call overhead assumed 0")
    if split.host is None:
        raise SpecError("calibration needs the split candidate's host AdaLN/residual ops")
    host_terms = ("elementwise_elems",)
    coef = _fit_sum([(split.host, sp["host_s"] / passes)], host_terms)
    comps["host"] = Component("host", host_terms, coef, source="calibration", samples=1,
                              note="per pass: elements touched by host AdaLN/residual ops; per-call overhead assumed 0")
    shipped_mem = shipped_device_memory()
    device_memory: dict[str, Component] = {}
    if shipped_mem is not None:
        # device memory: the compiler's weight + internal memory, predicted before compiling by the
        # model fitted on compiled stages (bench/device_memory.py); the write-up's board figures check it
        device_memory = {tk: Component.from_json("device_mem", c) for tk, c in shipped_mem["toolkits"].items()}
        tk = str(WRITEUP_PROVENANCE["toolkit"])
        comps["device_mem"] = device_memory[tk]
    else:
        dev_terms = ("const", "weight_bytes", "peak_bytes")
        coef = _fit_max([(split.npu, sp["device_pss_kib"] * KIB), (fused.npu, fu["device_pss_kib"] * KIB)],
                        dev_terms, fixed={"weight_bytes": 1.0})
        comps["device_mem"] = Component("device_mem", dev_terms, coef, source="calibration", samples=2,
                                        note="weights resident once (prior, coefficient fixed at 1) + activation "
                                             "peak + per-context overhead; max over stages loaded one at a time")
    pss_terms = ("const", "file_bytes", "peak_bytes")
    coef = _fit_max([(split.npu, sp["pss_peak_kib"] * KIB), (fused.npu, fu["pss_peak_kib"] * KIB)], pss_terms,
                    fixed={"peak_bytes": 1.0})
    comps["pss_peak"] = Component("pss_peak", pss_terms, coef, source="calibration", samples=2,
                                  note="process baseline + share of the loaded model file + the activation peak "
                                       "(prior, coefficient fixed at 1: activations live in the process too); max "
                                       "over stages")
    # 2 numbers per component from the two configurations, 1 for the host (split only); device memory
    # fitted on compiler tables is not solved from the write-up (its board figures check it instead)
    solved = {k: c for k, c in comps.items() if c.source == "calibration"}
    data_points = 2 * (len(solved) - 1) + 1
    fixed = 1 + (0 if shipped_mem is not None else 1)  # pss_peak's peak_bytes (and device_mem's weight_bytes) fixed
    free = sum(len(c.terms) for c in solved.values()) - fixed
    provenance = {**WRITEUP_PROVENANCE, "coefficients": free, "data_points": data_points,
                  "degrees_of_freedom": data_points - free, "latency_resolution": writeup_resolution()}
    if shipped_mem is not None:
        check = npu_time_check(shipped_mem)
        comps["npu_infer"] = check["component"]
        provenance["npu_infer"] = {"degrees_of_freedom": 0, "note": check["note"],
                                   "leave_fused_out": check["leave_fused_out"]}
        provenance["device_memory"] = writeup_memory_check(shipped_mem, comps["device_mem"], split, fused)
    model = CostModel(components=comps, provenance=Provenance(provenance), accuracy=Accuracy(accuracy_table()),
                      known_issues=[p.to_json() for p in crash_patterns()], device_memory=device_memory)
    # in-sample error of every component, recorded as provenance
    for name, comp in comps.items():
        if comp.source != "calibration" or name == "npu_infer":
            continue  # fitted on compiler tables: its own (held-out) error stays
        comps[name] = Component(comp.name, comp.terms, tuple(float(f"{c:.6g}") for c in comp.coef), comp.source,
                                comp.samples, _writeup_error(model, name, split, fused), comp.note)
    model.components = comps
    return model


def writeup_memory_check(doc: JsonMap, comp: Component, split: Candidate, fused: Candidate
                         ) -> JsonObject:
    """The write-up's board device memory (split's peak, fused) against the compiler's own figure of
    the same block (2.3.0 builds) and against the prediction before compiling."""
    out: JsonObject = {"source": "board: write-up section 6 (device-mapped PSS); compiler: rknn-toolkit2 "
                                     f"{doc['writeup_block']['toolkit']} builds of the same block"}
    for which, cand in (("split", split), ("fused", fused)):
        board = WRITEUP[which]["device_pss_kib"] * KIB
        compiled = max(f.compiled_mem_bytes or 0 for f in _compiled_block(doc, which))
        predicted = max(comp.predict(f) for f in cand.npu)
        out[which] = {"board_mib": round(board / 2**20, 2), "compiler_mib": round(compiled / 2**20, 2),
                      "predicted_mib": round(predicted / 2**20, 2),
                      "compiler_error_pct": round((compiled / board - 1) * 100, 2),
                      "predicted_error_pct": round((predicted / board - 1) * 100, 2)}
    return out


def _writeup_error(model: CostModel, name: str, split: Candidate, fused: Candidate) -> JsonObject:
    comp = model.components[name]
    key = {"device_mem": "device_pss_kib", "pss_peak": "pss_peak_kib"}.get(name) or seconds_key(name)
    pred, meas = [], []
    for cand, which in ((split, "split"), (fused, "fused")):
        m = WRITEUP[which][key]
        if name in ("device_mem", "pss_peak"):
            p = max(comp.predict(f) for f in cand.npu) / KIB
        elif name == "host":
            if cand.host is None:
                continue
            p = comp.predict(cand.host) * WRITEUP_PASSES
        else:
            p = sum(comp.predict(f) for f in cand.npu) * WRITEUP_PASSES
        pred.append(p)
        meas.append(m)
    return {"in_sample": error_summary(pred, meas), "note": "exact by construction: as many data points as "
            "free coefficients; no held-out error exists for this calibration"}


# -- profile records -> samples ------------------------------------------------------------

PlanResolver = Callable[[StageRecord], tuple[Plan, Path]]


def resolve_plan(record: StageRecord, *, near: Path | None = None) -> tuple[Plan, Path]:
    """The plan a profile record was measured on, from the path the record names.

    Relative paths are tried as given, then relative to ``near`` (the profile's folder).
    """
    f = record.plan_file
    if not f:
        raise SpecError("profile record names no plan file; profile with `rkpart profile PLAN` so that it does")
    for cand in (Path(f), *([near / f] if near is not None else [])):
        if cand.exists():
            return load_plan(cand)
    raise SpecError(f"the plan {f!r} of profile run {record.run_id} is not found "
                    f"(it is needed for the stage features)")


def samples_from_records(
    records: Iterable[StageRecord],
    *,
    near: Path | None = None,
    resolver: PlanResolver | None = None,
    statistic: str = "median",
    clock: str = "wall",
) -> list[Sample]:
    """One sample per (run, stage): medians over the measured calls, per call.

    ``statistic="min"`` takes the fastest call instead of the median: on a machine shared
    with other jobs the slower calls measure the other jobs, and the fastest one is the
    stage's own cost.  Records made with ``--infer-repeat K`` contribute each of their K
    inference calls (``timings.infer_calls_s``).

    ``clock="cpu"``: inference (NPU ``infer``, ``host``) as the process CPU time of the call
    (``timings.infer_cpu_s``), the measure whole rounds use (``timings.cpu_s``): on a machine
    shared with other jobs wall time measures them too.

    Time targets are per call (``load``, ``init``, ``release``: per time the call happened;
    ``infer`` / ``host``: per pass).  Memory targets (``device_mem``, ``pss_peak``) are taken
    only from per-stage residency runs, where one NPU stage is loaded at a time.
    """
    if statistic not in ("median", "min"):
        raise ValueError(f"statistic must be 'median' or 'min', got {statistic!r}")
    # Runs of the same plan with the same backends and residency are pooled into one sample
    # per stage (e.g. rounds interleaved with other plans' runs, one file each); the pool is
    # named after its first run id and is one group for cross-validation, so that a held-out
    # plan is never also in the training set through another of its runs.
    pools, first_run = _pool_runs(records)
    out: list[Sample] = []
    feature_cache: dict[tuple[str, str], Features] = {}
    for pool in sorted(pools, key=lambda k: first_run[k]):
        recs = pools[pool]
        run_id = first_run[pool]
        plan, folder = (resolver or (lambda rec: resolve_plan(rec, near=near)))(recs[0])
        stages = {s.id: s for s in plan.stages}
        residency = recs[0].run_residency
        per_stage: dict[str, dict[tuple[str, int], dict[str, list[float]]]] = {}
        # times from runs that read no memory when the pool has any (the sampler thread and the
        # snapshots cost CPU time a pipeline does not pay); memory from every run
        timed_only = any(not r.sampled for r in recs)
        for r in recs:
            s = stages.get(r.stage_id)
            if s is None or s.sha256 != r.stage_sha256:
                raise SpecError(f"profile run {run_id}: stage {r.stage_id} is not in plan {folder} as profiled "
                                "(the plan changed after profiling)")
            d = per_stage.setdefault(r.stage_id, {}).setdefault((r.run_id, r.round), {})
            # `--infer-repeat K`: the record's infer_s is the median of K calls; every call
            # counts for the statistic, so that "min" is the fastest call, not the fastest median
            for comp in LIFECYCLE:
                if not (timed_only and r.sampled):
                    d.setdefault(comp, []).extend(r.calls(comp, clock))
            for k, kib in (("device_pss_peak_kib", r.device_pss_peak_kib), ("pss_peak_kib", r.pss_peak_kib)):
                if kib is not None:
                    d.setdefault(k, []).append(float(kib))
        for sid in sorted(per_stage, key=lambda x: [s.id for s in plan.stages].index(x)):
            s = stages[sid]
            key = (str(folder), sid)
            if key not in feature_cache:
                feature_cache[key] = stage_features(folder, s)
            feats = feature_cache[key]
            rounds = per_stage[sid]
            targets: dict[str, float] = {}

            def med(k: str, agg: Callable[[list[float]], float],
                    rounds: dict[tuple[str, int], dict[str, list[float]]] = rounds) -> float | None:
                # times: the median over every call of every measured round (robust to the odd
                # slow call on a busy machine); memory: the median over rounds of each round's max
                if agg is max:
                    vals = [max(d[k]) for d in rounds.values() if d.get(k)]
                else:
                    vals = [v for d in rounds.values() for v in d.get(k, [])]
                    if vals and statistic == "min":
                        return min(vals)
                return statistics.median(vals) if vals else None

            mean = statistics.median
            if s.device == HOST:
                v = med("infer", mean)
                if v is not None:
                    targets["host"] = v
                # a host stage is set up once per round (load + init at first use, release at
                # the end): its per-round sum is the setup target
                setups = [sum(sum(d.get(c, [])) for c in LIFE_CALLS) for d in rounds.values()
                          if any(d.get(c) for c in LIFE_CALLS)]
                if setups:
                    targets["setup"] = min(setups) if statistic == "min" else statistics.median(setups)
            else:
                for comp in LIFECYCLE:
                    v = med(comp, mean)
                    if v is not None:
                        targets[comp] = v
                if residency == "per-stage":
                    v = med("device_pss_peak_kib", max)
                    if v is not None and v > 0:
                        targets["device_mem"] = v * KIB
            if residency == "per-stage":
                v = med("pss_peak_kib", max)
                if v is not None:
                    targets["pss_peak"] = v * KIB
            if targets:
                label = f"{plan.strategy['name']}:{sid}"
                out.append(Sample(features=feats, targets=targets, group=run_id, label=label))
    return out


def round_samples(
    raw: Iterable[JsonMap],
    records: Sequence[StageRecord],
    *,
    resolver: PlanResolver,
) -> list[RoundSample]:
    """One :class:`~rkpart.cost_model.rounds.RoundSample` per pool of runs (as the stage samples'
    groups): the plan's stages in order with the residency each ran under, the passes of a
    round, and the median measured round.  Runs with ``--infer-repeat`` > 1 are left out (their
    rounds hold the repeated calls)."""
    raw = list(raw)
    repeat = {str(r["run_id"]): int((r.get("settings") or {}).get("infer_repeat", 1)) for r in raw
              if r.get("record") == "round"}
    pools, first_run = _pool_runs(records)
    out: list[RoundSample] = []
    cache: dict[tuple[str, str], Features] = {}
    for pk in sorted(pools, key=lambda k: first_run[k]):
        recs = pools[pk]
        runs = {r.run_id for r in recs}
        if any(repeat.get(run, 1) != 1 for run in runs):
            continue
        plan, folder = resolver(recs[0])
        residency = {r.stage_id: r.residency.value for r in recs}
        one = recs[0]
        passes = len({(r.step, r.pass_name) for r in recs if r.run_id == one.run_id and r.round == one.round})
        stages = []
        for st in plan.stages:
            if st.id not in residency:
                continue
            key = (str(folder), st.id)
            if key not in cache:
                cache[key] = stage_features(folder, st)
            stages.append((cache[key], residency[st.id]))
        mine = [r for r in raw if r.get("record") == "round" and str(r["run_id"]) in runs]
        _, pss = round_seconds(mine)
        # the round's time from runs that read no memory, when there are any (as the stage times)
        clean = {r.run_id for r in recs if not r.sampled}
        secs, _ = round_seconds([r for r in mine if str(r["run_id"]) in clean] if clean else mine)
        if secs is None or not stages:
            continue
        out.append(RoundSample(group=first_run[pk], stages=tuple(stages), passes=passes, seconds=secs,
                               pss_peak_bytes=pss, label=f"{plan.strategy['name']}:{folder.name}"))
    return out


def _pool_key(r: StageRecord) -> str:
    host = None if r.host_backend is None else dict(r.host_backend)
    return json.dumps([r.plan_sha256, dict(r.backend), host, r.run_residency], sort_keys=True)



def _pool_runs(records: Iterable[StageRecord]) -> tuple[dict[str, list[StageRecord]], dict[str, str]]:
    """Measured (non-warm-up) records pooled per plan run configuration (:func:`_pool_key`), and
    each pool's first run id, which names it and orders the pools deterministically."""
    pools: dict[str, list[StageRecord]] = {}
    first_run: dict[str, str] = {}
    for r in records:
        if not r.warmup:
            pk = _pool_key(r)
            pools.setdefault(pk, []).append(r)
            first_run[pk] = min(first_run.get(pk, r.run_id), r.run_id)
    return pools, first_run

def environment_of(records: Iterable[StageRecord]) -> JsonObject:
    """Device and runtime of the records (for the fitted model's provenance)."""
    backends: set[str] = set()
    runtimes: set[str] = set()
    machines: set[str] = set()
    runs: set[str] = set()
    for r in records:
        env = r.env
        be = r.backend
        backends.add(str(be.get("backend")))
        runtimes.add(str(be.get("runtime") or be.get("toolkit") or ""))
        machines.add(" / ".join(str(x) for x in (env.get("board") or env.get("cpu_model"), env.get("machine"))))
        runs.add(r.run_id)
    return {"backends": sorted(backends), "runtimes": sorted(x for x in runtimes if x),
            "devices": sorted(machines), "runs": len(runs)}


def fit_profiles(
    paths: Sequence[str | os.PathLike[str]],
    *,
    base: str | os.PathLike[str] | None = None,
    folds: int = 0,
    statistic: str = "median",
    mix_backends: bool = False,
    clock: str = "wall",
) -> tuple[CostModel, FitReport]:
    """Fit a model from profile files; returns it and the error report ``rkpart fit`` prints.

    With ``base``, the components the profiles measure are refitted and the rest (e.g. NPU
    device memory, which an ONNX Runtime profile cannot measure) are kept from ``base``.
    """
    from rkpart.cost_model.model import COMPONENTS, DEFAULT_TERMS, cross_validate
    records: list[StageRecord] = []
    raw: list[JsonObject] = []
    near_of: dict[str, Path] = {}
    for p in paths:
        lines = read_jsonl(p)
        raw += [r for r in lines if r.get("record") == "round"]
        recs = stage_records(lines)
        records += recs
        for r in recs:
            near_of.setdefault(r.run_id, Path(p).parent)
    # all files at once: runs of one plan in several files are pooled (samples_from_records)
    def resolver(rec: StageRecord) -> tuple[Plan, Path]:
        return resolve_plan(rec, near=near_of.get(rec.run_id))

    samples = samples_from_records(records, statistic=statistic, resolver=resolver, clock=clock)
    if not samples:
        raise SpecError("the profiles hold no measured stage records to fit")
    units = {k: u for k, (_, u) in COMPONENTS.items()}
    check_samples(samples, units)  # NaN, zero or absurd timings: not measurements (cost_model.checks)
    rounds = round_samples(raw, records, resolver=resolver)
    model = CostModel.load(base) if base is not None else CostModel()
    base_model = CostModel.load(base) if base is not None else None
    env = environment_of(records)
    mixed = None
    if base is not None:
        base_backends = model_backends(model)
        measured = {n for s in samples for n in s.targets}
        kept = sorted(n for n in model.components if n not in measured and n not in ("glue", "setup"))
        if kept and base_backends != set(env["backends"]):
            if not mix_backends:
                where = ", ".join(sorted(base_backends)) or "an unknown device"
                raise SpecError(
                    f"--base {Path(base).name} was measured on {where} and the profiles on "
                    f"{', '.join(env['backends'])}: its {', '.join(kept)} would be mixed with these timings; "
                    "give --mix-backends to do that on purpose (it is recorded in the model)")
            mixed = {"kept_from_base": kept, "base_backends": sorted(base_backends),
                     "profile_backends": env["backends"]}
    model.components.pop("glue", None)
    if any("setup" in s.targets for s in samples):
        model.components.pop("setup", None)
    model.update(samples)
    model.components.update(fit_overhead(model, rounds))
    check_own_predictions(model, samples, units)
    whole = whole_plan_cv(samples, rounds, base_model)
    model.provenance = Provenance({
        **({"base": model.provenance.to_json()} if base is not None else {}),
        "source": "rkpart fit",
        "profiles": [Path(p).name for p in paths],
        "device": ", ".join(env["devices"]),
        "runtime": ", ".join(env["runtimes"]),
        "backends": env["backends"],
        "runs": env["runs"],
        "samples": len(samples),
        "statistic": statistic,
        "clock": clock,
        "toolkit": model.provenance.toolkit if base is not None else None,
        **({"mixed_backends": mixed} if mixed else {}),
        "fitted_range": fitted_range(samples),
        "whole_plan_error": {k: whole[k] for k in ("method", "n", "within_10", "within_20", "median_ape")},
    })
    comps: dict[str, ComponentFit] = {}
    for name in COMPONENTS:
        c = model.components.get(name)
        if c is None or c.source != "fit":
            continue
        cv = c.fit_error["cross_validation"] if c.fit_error else None
        if folds:
            rows = [s for s in samples if name in s.targets]
            cv = cross_validate(rows, name, DEFAULT_TERMS[name], folds=folds)
        ins = c.fit_error["in_sample"] if c.fit_error else None
        comps[name] = ComponentFit(terms=dict(zip(c.terms, c.coef, strict=True)),
                                   cross_validation=None if cv is None else ErrorSummary.from_json(cv),
                                   in_sample=None if ins is None else ErrorSummary.from_json(ins))
    method = next((str(v.cross_validation.method) for v in comps.values() if v.cross_validation), "none")
    report = FitReport(samples=len(samples), runs=int(env["runs"]), plans=len({s.group for s in samples}),
                       backends=tuple(env["backends"]), statistic=statistic, method=method, components=comps,
                       whole_plan=WholePlanFit.from_json(whole),
                       fitted_range=model.provenance.fitted_range)
    return model, report


@dataclass(frozen=True)
class ComponentFit:
    """One fitted component in a :class:`FitReport`: its coefficients and errors."""

    terms: Mapping[str, float]  # term -> coefficient
    cross_validation: ErrorSummary | None  # held-out error (None: fitted on whole rounds)
    in_sample: ErrorSummary | None

    def to_json(self) -> JsonObject:
        return {"terms": dict(self.terms),
                "cross_validation": None if self.cross_validation is None else self.cross_validation.to_json(),
                "in_sample": None if self.in_sample is None else self.in_sample.to_json()}


@dataclass(frozen=True)
class WholePlanFit:
    """Predicted whole rounds against measured ones (:func:`~rkpart.cost_model.rounds.whole_plan_cv`)."""

    error: ErrorSummary
    plans: tuple[JsonMap, ...]  # per held-out plan: plan, measured_s, predicted_s ...

    def to_json(self) -> JsonObject:
        return {**self.error.to_json(), "plans": [dict(p) for p in self.plans]}

    @classmethod
    def from_json(cls, d: JsonMap) -> WholePlanFit:
        return cls(error=ErrorSummary.from_json(d), plans=tuple(dict(p) for p in d.get("plans", ())))


@dataclass(frozen=True)
class FitReport:
    """What :func:`fit_profiles` reports beside the model: ``rkpart fit``'s table, ``--json`` and
    ``rkpart tune``'s ``fit_report.json`` (:meth:`to_json`)."""

    samples: int  # stage samples fitted
    runs: int  # profile runs they came from
    plans: int  # profiled plans (runs of one plan pooled)
    backends: tuple[str, ...]
    statistic: str  # "median" or "min" of each stage's calls
    method: str  # how samples were held out ("leave-one-plan-out", "k-fold by plan", "none")
    components: Mapping[str, ComponentFit]  # in COMPONENTS order
    whole_plan: WholePlanFit
    fitted_range: Mapping[str, tuple[int, int]]  # feature -> (lowest, highest) the fit saw

    def to_json(self) -> JsonObject:
        return {"samples": self.samples, "runs": self.runs, "plans": self.plans, "backends": list(self.backends),
                "statistic": self.statistic, "method": self.method,
                "components": {k: v.to_json() for k, v in self.components.items()},
                "whole_plan": self.whole_plan.to_json(),
                "fitted_range": {k: list(v) for k, v in self.fitted_range.items()}}


@dataclass(frozen=True)
class FitOptions:
    """Everything ``rkpart fit`` was asked to do (see :func:`fit_profiles` for the fields)."""

    profiles: tuple[Path, ...]
    output: Path
    base: Path | None = None
    folds: int = 0
    statistic: str = "median"
    mix_backends: bool = False
    clock: str = "wall"


def run_fit(opts: FitOptions) -> tuple[CostModel, FitReport]:
    """Fit a model from ``opts.profiles``, write it atomically to ``opts.output``; the model and its error report."""
    model, report = fit_profiles(opts.profiles, base=opts.base, folds=opts.folds, statistic=opts.statistic,
                                 mix_backends=opts.mix_backends, clock=opts.clock)
    from rkpart.cost_model.checks import check_model_document

    # what `estimate`, `auto` and `report` would refuse to read is not written (a 1e300 coefficient)
    check_model_document(json.loads(model.dumps()), where=f"the model fitted for {opts.output}")
    model.save(opts.output)
    return model, report


def model_backends(model: CostModel) -> set[str]:
    """The backends a model's numbers were measured on (the shipped calibration: the board)."""
    prov = model.provenance
    if prov.backends:
        return set(prov.backends)
    return {"rknnlite"} if "rk3588" in (prov.device or "").lower() else set()


def compare_with_model(
    records: Sequence[StageRecord],
    model: CostModel,
    *,
    near: Path | None = None,
    resolver: PlanResolver | None = None,
) -> list[JsonObject]:
    """Predicted vs measured, per stage and component, for a profiled plan.

    For ``rkpart profile ... --against MODEL.json``: one row per (stage, component) with
    ``measured``, ``predicted`` and ``error_pct``, then one ``stage == "total"`` row per
    component summing the stages (per call / per pass, as in :func:`samples_from_records`).
    Render with :func:`render_comparison`.
    """
    from rkpart.cost_model.checks import check_stage_estimate

    samples = samples_from_records(records, near=near, resolver=resolver)
    rows: list[JsonObject] = []
    totals: dict[str, list[float]] = {}
    memory = {"device_mem": "device memory", "pss_peak": "process memory"}
    for s in samples:
        pred = model.predict_stage(s.features)
        for comp, meas in s.targets.items():
            p = pred.get(comp)
            if p is None:
                continue
            # as estimate and auto: 10^21 s a pass is no prediction to print next to a measurement
            check_stage_estimate(s.label.partition(":")[2] or s.label, {memory.get(comp, comp): p})
            rows.append({"stage": s.label.partition(":")[2], "component": comp, "measured": meas, "predicted": p,
                         "error_pct": None if not meas else (p - meas) / meas * 100.0})
            if comp not in ("device_mem", "pss_peak"):
                t = totals.setdefault(comp, [0.0, 0.0])
                t[0] += meas
                t[1] += p
    for comp, (meas, p) in totals.items():
        rows.append({"stage": "total", "component": comp, "measured": meas, "predicted": p,
                     "error_pct": None if not meas else (p - meas) / meas * 100.0})
    return rows


def render_comparison(rows: Sequence[JsonMap]) -> str:
    """Text table of :func:`compare_with_model` rows."""
    out = [f"{'stage':<28} {'component':<11} {'measured':>12} {'predicted':>12} {'error':>9}"]
    for r in rows:
        unit = 1 / 2**20 if r["component"] in ("device_mem", "pss_peak") else 1.0
        suffix = " MiB" if unit != 1.0 else " s"
        err = "-" if r["error_pct"] is None else f"{r['error_pct']:+.1f} %"
        out.append(f"{r['stage']:<28} {r['component']:<11} {r['measured'] * unit:>10.4f}{suffix:<2} "
                   f"{r['predicted'] * unit:>10.4f}{suffix:<2} {err:>9}")
    return "\n".join(out) + "\n"


__all__ = ["DRIFT_FILE", "WRITEUP", "WRITEUP_BLOCK_MSE_RATIO", "WRITEUP_PROVENANCE", "ComponentFit", "FitOptions",
           "FitReport", "WholePlanFit", "accuracy_table",
           "calibrate_writeup", "compare_with_model", "environment_of", "fit_profiles", "model_backends",
           "render_comparison", "resolve_plan", "round_samples", "run_fit", "samples_from_records", "shipped_drift"]
