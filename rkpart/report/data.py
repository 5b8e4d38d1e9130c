"""The numbers of ``rkpart report``: tables (lists of dicts) computed from a plan, profiles and run reports.

Every table here becomes one CSV file and one HTML table; :mod:`rkpart.report.plots` draws
the same numbers.  Nothing here imports matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkpart.errors import SpecError
from rkpart.io import MAX_JSON_INT
from rkpart.plan.plan import Plan, Stage
from rkpart.profile import records as rec
from rkpart.readers import FileKind
from rkpart.types import LIFECYCLE, NPU, CompilerPlan, JsonMap, JsonObject, seconds_key

Table = list[JsonObject]
#: stacked-bar components, bottom to top
COMPONENTS = (*LIFECYCLE, "host")


@dataclass
class Profile:
    """One profile file (one run): its name in the report and its records."""

    name: str
    path: Path
    records: list[JsonObject]

    @property
    def strategy(self) -> str:
        return str(self.records[0]["plan"].get("strategy", "")) if self.records else ""

    @property
    def settings(self) -> JsonMap:
        return self.records[0].get("settings", {}) if self.records else {}


    @property
    def env(self) -> JsonMap:
        return self.records[0].get("env", {}) if self.records else {}

    @property
    def backend(self) -> str:
        """The NPU stages' executor: ``ort``, ``rknn-sim`` or ``rknnlite``."""
        return str((self.env.get("backend") or {}).get("backend") or self.settings.get("backend") or "")

    @property
    def device(self) -> str:
        """What the timings are timings of, the key a cost model is compared by: the backend's name,
        except a board runner whose NPU was ONNX Runtime standing in (``standin``)."""
        runtime = str((self.env.get("backend") or {}).get("runtime") or "")
        return "standin" if self.backend == "rknnlite" and "stand-in" in runtime else self.backend


@dataclass
class RunResult:
    """``rkpart run --per-stage --json`` output: per-stage and end-to-end errors on one backend."""

    name: str
    data: JsonObject


@dataclass
class ReportData:
    plan: Plan
    folder: Path
    profiles: list[Profile] = field(default_factory=list)
    runs: list[RunResult] = field(default_factory=list)
    cost_rows: Table = field(default_factory=list)  # compare_with_model rows, with a "profile" column
    budget_mib: float | None = None


def load_profile(path: Path, name: str | None = None) -> Profile:
    recs = rec.single_run(rec.read_jsonl(path), where=str(path))
    if not any(r.get("record") == "stage" for r in recs):
        raise SpecError(f"profile {path} has no stage records")
    return Profile(name=name or path.stem, path=path, records=recs)


#: a run report is a few KiB per stage; one larger than this is not one
MAX_RUN_BYTES = 64 << 20
#: a metric of a run report beyond these is not one ``rkpart run`` computes: an error or a
#: value of outputs within float32's range (the NPU stages compute in fp16 / fp32) is under
#: 2^129, a mean square error under 2^258; a cosine is within [-1, 1] up to rounding
MAX_ABS_METRIC = 2.0**129
MAX_MSE = 2.0**258
_COSINE_SLACK = 1e-6
_ABS_METRICS = ("max_abs", "mean_abs", "ref_max_abs", "max_abs_rel")
_COUNTS = ("nan", "inf", "ref_nonfinite", "nonfinite")


def _metric_problem(k: str, v: object) -> str | None:
    """Why ``v`` is no value of the run-report metric ``k`` (``None``: it is one).

    NaN is kept where ``rkpart run`` writes it (the metrics of outputs holding NaN/Inf): the
    report shows it as a failure, never as agreement; infinity and absurd sizes are refused."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"must be a number, got {type(v).__name__}"
    if k in _COUNTS:
        ok = isinstance(v, int) and 0 <= v <= MAX_JSON_INT
        return None if ok else f"must be a count (an integer in [0, 2^53]), got {v!r}"
    if v != v:  # NaN
        return None
    if not math.isfinite(v):
        return f"must be a finite number or NaN, got {v!r}"
    if k == "cosine" and not -1 - _COSINE_SLACK <= v <= 1 + _COSINE_SLACK:
        return f"must be a cosine in [-1, 1], got {v!r}"
    if k in _ABS_METRICS and not 0 <= v <= MAX_ABS_METRIC:
        return f"must be a number in [0, 2^129], got {v!r}"
    if k == "mse" and not 0 <= v <= MAX_MSE:
        return f"must be a number in [0, 2^258], got {v!r}"
    if abs(v) > MAX_MSE:
        return f"is {v!r}, beyond any metric of a run"
    return None


def _check_metrics(path: Path, where: str, tensors: object) -> None:
    if not isinstance(tensors, dict) or not all(isinstance(m, dict) for m in tensors.values()):
        raise SpecError(f"{path}: {where} must map tensor names to metrics")
    for t, m in tensors.items():
        for k, v in m.items():
            why = _metric_problem(str(k), v)
            if why is not None:
                raise SpecError(f"{path}: {where}[{t!r}].{k} {why}")


#: ``report --run FILE``: ``rkpart run --per-stage --json``'s output
RUN_REPORT_KIND = FileKind("run report", "json", MAX_RUN_BYTES, SpecError,
                           doc="`report --run`: the output of `rkpart run --per-stage --json`")


def load_run(path: Path) -> RunResult:
    """A ``rkpart run --per-stage --json`` output, read whole and bounded (a regular file, size,
    depth and integer limits) and checked against the shape the report uses: every metric a
    number in its range (a cosine in [-1, 1], an error >= 0, a count an integer), or NaN where
    the run met NaN/Inf."""
    d = RUN_REPORT_KIND.load(path)
    if not isinstance(d, dict) or "end_to_end" not in d or "per_stage" not in d:
        raise SpecError(f"{path} is not the output of `rkpart run --per-stage --json`")
    for key in ("end_to_end", "per_stage"):
        if not isinstance(d[key], dict):
            raise SpecError(f"{path}: {key!r} must be an object")
    _check_metrics(path, "end_to_end", d["end_to_end"])
    for sid, tensors in d["per_stage"].items():
        _check_metrics(path, f"per_stage[{sid!r}]", tensors)
    if "backend" in d and not isinstance(d["backend"], str):
        raise SpecError(f"{path}: 'backend' must be a string, got {type(d['backend']).__name__}")
    return RunResult(name=path.stem, data=d)


#: what each backend's timings are (the report's words)
BACKEND_WORDS = {
    "ort": "ONNX Runtime on the host CPU: the stages' .onnx files, no NPU",
    "rknn-sim": "the rknn-toolkit2 simulator on the host CPU: no NPU timing",
    "rknnlite": "the board's NPU (RKNN runtime)",
    "standin": "ONNX Runtime standing in for the board's NPU: no NPU",
}


def measured_on(p: Profile) -> JsonObject:
    """Backend, machine and toolkit of a profile, as its records give them (one row of the
    report's "What was measured" table)."""
    env, be = p.env, (p.env.get("backend") or {})
    machine = " ".join(str(x) for x in (env.get("board"), env.get("soc")) if x) or ", ".join(
        str(x) for x in (env.get("machine"), env.get("cpu_model")) if x)
    arts = sorted({str(st["artifact"]["toolkit"]) for r in p.records if r.get("record") == "stage"
                   for st in (r.get("stage") or {},) if isinstance(st.get("artifact"), Mapping)
                   and st["artifact"].get("toolkit")})
    if p.device in ("ort", "standin"):
        toolkit = "none (no .rknn ran)"
    elif arts:
        toolkit = "rknn-toolkit2 " + ", ".join(arts) + " (.rknn builds)"
    else:
        toolkit = str(be.get("toolkit") or "not recorded")
    host = (env.get("host_backend") or {}).get("backend") if isinstance(env.get("host_backend"), Mapping) else None
    return {"profile": p.name, "backend": p.backend, "runtime": str(be.get("runtime") or ""),
            "what": BACKEND_WORDS.get(p.device, p.device), "machine": machine or "not recorded",
            "toolkit": toolkit, "host_backend": host or "", "residency": p.settings.get("residency"),
            "rounds": p.settings.get("rounds")}


def measured_table(profiles: Sequence[Profile]) -> Table:
    return [measured_on(p) for p in profiles]


def block_of(s: Stage) -> str:
    """The stage-map row of a stage: ``b03`` (its first block) or ``shared``."""
    blocks = s.blocks or ((s.block,) if s.block is not None else ())
    return f"b{min(blocks):02d}" if blocks else "shared"


# -- stage map -----------------------------------------------------------------------------------
def stage_table(plan: Plan) -> Table:
    rows = []
    for i, s in enumerate(plan.stages):
        art = s.artifact("rknn")
        rows.append({
            "index": i, "stage": s.id, "device": s.device, "row": block_of(s),
            "blocks": " ".join(map(str, s.blocks or ((s.block,) if s.block is not None else ()))),
            "region": s.region, "kind": s.kind, "nodes": s.num_nodes, "weight_bytes": s.weight_bytes,
            "io_bytes": s.io_bytes, "rknn_toolkit": art.toolkit if art else "",
            "cpu_ops": " ".join(art.cpu_ops) if art else "",
        })
    return rows


def coverage_table(plan: Plan) -> Table:
    """NPU coverage per stage-map row and overall, each share named by its unit
    (:mod:`rkpart.report.coverage`): of the ops, of the weight bytes and, overall, of the blocks'
    matmul work (the figure ``rkpart partition`` prints first)."""
    from rkpart.report.coverage import coverage_figures

    rows: dict[str, JsonObject] = {}
    for s in plan.stages:
        for key in (block_of(s), "all"):
            r = rows.setdefault(key, {"row": key, "stages": 0, "npu_stages": 0, "ops": 0, "npu_ops": 0,
                                      "weight_bytes": 0, "npu_weight_bytes": 0})
            r["stages"] += 1
            r["ops"] += s.num_nodes
            r["weight_bytes"] += s.weight_bytes
            if s.device == NPU:
                r["npu_stages"] += 1
                r["npu_ops"] += s.num_nodes
                r["npu_weight_bytes"] += s.weight_bytes
    for r in rows.values():
        r["npu_ops_share"] = round(r["npu_ops"] / r["ops"], 4) if r["ops"] else 0.0
        r["npu_weight_share"] = round(r["npu_weight_bytes"] / r["weight_bytes"], 4) if r["weight_bytes"] else 0.0
        r["npu_matmul_share"] = ""  # recorded for the whole plan only
    matmul = coverage_figures(plan).get("matmul")
    rows["all"]["npu_matmul_share"] = "" if matmul is None else round(matmul, 4)
    order = sorted(k for k in rows if k not in ("all", "shared"))
    return [rows[k] for k in (*order, *(["shared"] if "shared" in rows else []), "all")]


# -- compile outcomes ----------------------------------------------------------------------------
def _compiler_columns(cp: CompilerPlan | None) -> JsonObject:
    """The compiler's own plan of a build (empty cells where the log had no figure: never 0)."""
    def v(x: int | None) -> Any:
        return "" if x is None else x

    if cp is None:
        return {k: "" for k in ("weight_bytes", "internal_bytes", "cycles_total", "rw_bytes", "uncycled_ops")}
    return {"weight_bytes": v(cp.weight_bytes), "internal_bytes": v(cp.internal_bytes),
            "cycles_total": v(cp.cycles_total), "rw_bytes": v(cp.rw_bytes), "uncycled_ops": " ".join(cp.uncycled_ops)}
def fp16_range_summary(plan: Plan) -> str:
    """The fp16 range check of the plan's last compile (``--calibration``), in words; empty without one."""
    settings = (plan.extra or {}).get("compile") or {}
    if "fp16_range" not in settings:
        return ""
    from rkpart.compile.calibration import RangeFinding

    found = [RangeFinding.from_json(f) for f in settings["fp16_range"]]
    if not found:
        return (f"fp16 range: ok ({settings.get('fp16_range_checked', 0)} activation tensors of the calibration "
                "loop, none near fp16's limits).")
    return " ".join(f.describe() + "." for f in found)


def compile_table(plan: Plan) -> Table:
    settings = (plan.extra or {}).get("compile") or {}
    ranges: dict[str, list[str]] = {}
    for f in settings.get("fp16_range") or ():
        ranges.setdefault(str(f.get("stage")), []).append(f"{f.get('kind')} {f.get('tensor')} ({f.get('margin'):.3g})")
    rows = []
    for s in plan.npu_stages:
        art = s.artifact("rknn")
        status = ("built (fallback)" if art.fallback_reason else "built") if art else (
            "failed" if s.failures else "not compiled")
        rows.append({
            "stage": s.id, "status": status, "toolkit": art.toolkit if art else "",
            "target": art.target if art else "", "rknn_bytes": art.size_bytes if art else "",
            **_compiler_columns(art.compiler if art else None),
            "cpu_ops": " ".join(art.cpu_ops) if art else "",
            "precision": art.precision if art else "",
            "float16_layers": " ".join(art.float16_layers) if art else "",
            "fp16_range": "; ".join(ranges.get(s.id, ())) if "fp16_range" in settings else "not checked",
            "fallback_reason": (art.fallback_reason or "") if art else "",
            "failures": " | ".join(f"{f.toolkit}: {f.message}" for f in s.failures),
        })
    return rows


# -- lifecycle per block ---------------------------------------------------------------------------
def profile_blocks(p: Profile) -> list[int]:
    blocks: set[int] = set()
    for r in p.records:
        if r.get("record") == "stage":
            st = r["stage"]
            blocks.update(st.get("blocks") or ((st["block"],) if st.get("block") is not None else ()))
    return sorted(blocks)


def lifecycle_table(profiles: Sequence[Profile]) -> Table:
    """Median per round over measured rounds, per profile and block: load/init/infer/release (NPU) and host."""
    rows = []
    for p in profiles:
        for b in profile_blocks(p):
            agg = rec.aggregate(p.records, block=b)
            row: JsonObject = {"profile": p.name, "strategy": p.strategy, "block": b}
            for c in COMPONENTS:
                row[seconds_key(c)] = agg[seconds_key(c)]["median"] or 0.0
            row["total_s"] = sum(row[seconds_key(c)] for c in COMPONENTS)
            rows.append(row)
    return rows


# -- memory timeline -----------------------------------------------------------------------------
def memory_table(profiles: Sequence[Profile]) -> Table:
    """One row per stage record in run order: time into its round, process PSS and device memory."""
    rows = []
    for p in profiles:
        t: dict[int, float] = {}
        for r in p.records:
            if r.get("record") != "stage":
                continue
            rnd = int(r["round"])
            start = t.get(rnd, 0.0)
            wall = r["timings"].get("wall_s") or sum(r["timings"].get(seconds_key(c)) or 0.0 for c in LIFECYCLE)
            t[rnd] = start + wall
            mem = r["memory"]
            rows.append({
                "profile": p.name, "round": rnd, "warmup": bool(r["warmup"]), "step": r["step"], "pass": r["pass"],
                "stage": r["stage"]["id"], "device": r["stage"]["device"], "t_start_s": round(start, 6),
                "t_end_s": round(start + wall, 6), "pss_peak_kib": mem.get("pss_peak_kib"),
                "device_pss_kib": mem.get("device_pss_peak_kib") if mem.get("device_pss_peak_kib") is not None
                else mem.get("device_pss_kib"),
            })
    return rows


# -- accuracy ------------------------------------------------------------------------------------
def accuracy_table(runs: Sequence[RunResult]) -> Table:
    rows = []
    for run in runs:
        backend = run.data.get("backend", "")
        for sid, tensors in run.data.get("per_stage", {}).items():
            for t, m in tensors.items():
                rows.append({"run": run.name, "backend": backend, "stage": sid, "tensor": t,
                             "cosine": m.get("cosine"), "max_abs": m.get("max_abs")})
        for t, m in run.data.get("end_to_end", {}).items():
            rows.append({"run": run.name, "backend": backend, "stage": "end-to-end", "tensor": t,
                         "cosine": m.get("cosine"), "max_abs": m.get("max_abs")})
    return rows


@dataclass(frozen=True)
class CostComparison:
    """Predicted against measured, only for the profiles measured on the device the model is for."""

    model: str  # what the model is, in words: its devices and backends
    backends: tuple[str, ...]  # the backends its numbers were measured on (empty: not recorded)
    rows: Table  # compare_with_model rows of the compared profiles, with a "profile" column
    compared: tuple[str, ...]
    not_compared: tuple[str, ...]  # one sentence per other profile: why it is not compared


def cost_model_rows(profiles: Sequence[Profile], model_path: str | None) -> CostComparison:
    """Predicted vs measured per stage and component (``rkpart profile --against``), for each profile
    measured on a backend the model was measured on: a board calibration against board profiles, an
    ONNX Runtime fit against ONNX Runtime profiles.  Every profile's predictions are still computed,
    so a model predicting absurd numbers is refused whatever the devices."""
    from rkpart.cost_model.calibration import compare_with_model, model_backends
    from rkpart.cost_model.model import load_model_or_default

    model = load_model_or_default(None if model_path in (None, "shipped") else model_path)
    backends = tuple(sorted(model_backends(model)))
    prov = model.provenance.doc
    where = prov.get("device") or ", ".join(str(d) for d in prov.get("devices") or ()) or "an unrecorded device"
    name = "the shipped calibration" if model_path in (None, "shipped") else Path(str(model_path)).name
    words = (f"{name}: measured on {', '.join(backends) or 'an unrecorded backend'} ({where}"
             + (f"; rknn-toolkit2 {prov['toolkit']}" if prov.get("toolkit") else "") + ")")
    rows: Table = []
    compared, skipped = [], []
    for p in profiles:
        got = [{"profile": p.name, **r} for r in compare_with_model(rec.stage_records(p.records), model,
                                                                      near=p.path.parent)]
        if p.device in backends:
            rows += got
            compared.append(p.name)
        else:
            skipped.append(f"{p.name} (measured on {p.device}: {BACKEND_WORDS.get(p.device, p.device)}) is not "
                           f"compared with {name}, which is for {', '.join(backends) or 'another device'}: "
                           "their difference would be the devices', not the model's error")
    return CostComparison(model=words, backends=backends, rows=rows, compared=tuple(compared),
                          not_compared=tuple(skipped))


def budget_of(plan: Plan) -> float | None:
    """The plan's ``--budget-mib`` (``None``: it had none), what ``partition`` accepts: a finite
    number > 0, at most 2^53 MiB (a plan claiming 1e300 or inf drew "the budget of inf MiB")."""
    b = (plan.strategy.get("options") or {}).get("budget_mib")
    if b is None:
        return None
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or not 0 < b <= MAX_JSON_INT:
        raise SpecError(f"plan.json: strategy.options.budget_mib must be a finite number of MiB in (0, 2^53], "
                        f"got {repr(b)[:40]}")
    return float(b)
