"""Profile records: construction, environment, JSON Lines I/O, schema validation, aggregation.

A profile file is JSON Lines, one object per line, in run order:

* ``"record": "stage"``: one per stage x round x pass (step and CFG pass);
* ``"record": "round"``: one per round (wall time, whole-run memory, measurement cost);
* ``"record": "summary"``: one at the end: medians and spread over the measured rounds.

Every record repeats ``env``, ``settings`` and ``plan`` so that a single line is
self-describing for the cost model.  The schema is ``rkpart/data/profile_record.schema.json``
and is documented in ``docs/profile.md``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rkpart.errors import SpecError, listed
from rkpart.io import MAX_DEPTH, MAX_INT_DIGITS, MAX_ITEMS, bad_number, bounded_integers
from rkpart.plan.plan import Plan, Stage
from rkpart.readers import FileKind
from rkpart.runtime.base import Backend
from rkpart.types import HOST, LIFECYCLE, NPU, TIME_COMPONENTS, Device, JsonMap, JsonObject, Residency, seconds_key

#: profile files (JSON Lines) are read only up to this size (a 110 000-record profile is ~210 MiB)
MAX_PROFILE_BYTES = 256 << 20
#: a profile (JSON Lines): ``fit``, ``profile --show/--compare``, ``report``; each line is then parsed
#: and checked by :func:`iter_jsonl`
PROFILE_KIND = FileKind("profile", "jsonl", MAX_PROFILE_BYTES, SpecError,
                        doc="`fit`, `profile --show` / `--compare`, `report`: JSON Lines from `rkpart profile`")
#: one line of a profile longer than this is not a record rkpart wrote (the summary of a
#: 1000-stage plan is well under 1 MiB)
MAX_LINE_BYTES = 16 << 20
#: record fields that repeat unchanged from line to line (the run's header, a stage's identity):
#: each distinct value is validated once and shared by every record that holds it
SHARED_FIELDS = ("env", "settings", "plan", "stage")

RECORD_FORMAT = "rkpart-profile"
RECORD_VERSION = 1

#: Timing fields of a stage record, one per lifecycle component (``load`` -> ``load_s``).
LIFECYCLE_KEYS = tuple(seconds_key(c) for c in LIFECYCLE)
#: Rows of the comparison table, in table order: every time component in seconds
#: (``host_s`` is the whole time of host stages; the others cover NPU stages only), then
#: their sum (``net_s``), the measured wall time and the measurement's own cost.
TABLE_TIME_KEYS = (*(seconds_key(c) for c in TIME_COMPONENTS), "net_s", "wall_s", "measurement_s")
TABLE_MEMORY_KEYS = ("device_pss_kib", "pss_peak_kib", "swap_new_kib")


# -- environment ---------------------------------------------------------------------------
def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").replace("\x00", " ").strip() or None
    except OSError:
        return None


def _cpu_model() -> str:
    text = _read_text("/proc/cpuinfo") or ""
    # x86 has "model name"; aarch64 kernels have no model name, only part numbers, so the
    # board's device-tree model is the better description there (see _board).
    for key in ("model name", "Hardware", "Processor", "cpu model"):
        for line in text.splitlines():
            k, sep, v = line.partition(":")
            if sep and k.strip() == key and v.strip():
                return v.strip()
    parts = sorted({ln.partition(":")[2].strip() for ln in text.splitlines() if ln.startswith("CPU part")})
    if parts:
        return f"{platform.machine()} (CPU parts {', '.join(parts)})"
    return platform.processor() or platform.machine()


#: Where RKNPU kernel drivers publish their version (debugfs needs root and a mounted debugfs).
RKNPU_VERSION_FILES = (
    "/sys/kernel/debug/rknpu/version",
    "/proc/debug/rknpu/version",
    "/sys/module/rknpu/version",
)


def _rknpu_driver() -> str | None:
    for p in RKNPU_VERSION_FILES:
        v = _read_text(p)
        if v:
            return v
    return None


def collect_environment(backend: Backend, host_backend: Backend | None = None) -> JsonObject:
    """Versions and machine facts recorded with every measurement.

    Backends contribute through :meth:`Backend.describe` (runtime / toolkit versions); the
    rest is read from the machine where readable, ``None`` otherwise.
    """
    import numpy as np

    import rkpart

    mem = _read_text("/proc/meminfo") or ""
    mem_total = next((int(ln.split()[1]) for ln in mem.splitlines() if ln.startswith("MemTotal:")), None)
    env: JsonObject = {
        "backend": backend.describe(),
        "host_backend": host_backend.describe() if host_backend is not None else None,
        "rkpart": rkpart.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "kernel": platform.release(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "board": _read_text("/proc/device-tree/model"),
        "soc": _read_text("/proc/device-tree/compatible"),
        "mem_total_kib": mem_total,
        "rknpu_driver": _rknpu_driver(),
    }
    return env


def plan_identity(plan: Plan, plan_file: str | None = None) -> JsonObject:
    """What identifies the profiled plan: its JSON's hash, strategy and model."""
    return {
        "file": plan_file,
        "sha256": hashlib.sha256(plan.dumps().encode()).hexdigest(),
        "strategy": str(plan.strategy.get("name", "")),
        "model_sha256": plan.model.get("sha256"),
        "stages": len(plan.stages),
    }


def record_header(env: JsonMap, settings: JsonMap, plan: JsonMap) -> JsonObject:
    """Fields shared by every record of one run, including a run id derived from them."""
    body = json.dumps({"env": env, "settings": settings, "plan": plan}, sort_keys=True)
    # The run id only groups records of one run; the start time keeps two otherwise
    # identical runs apart.
    import time

    run_id = hashlib.sha256(f"{body}{time.time_ns()}".encode()).hexdigest()[:16]
    return {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "run_id": run_id,
        "env": dict(env),
        "settings": dict(settings),
        "plan": dict(plan),
    }


def stage_identity(stage: Stage, strategy: str, executor: str, host_name: str) -> JsonObject:
    art = stage.artifact("rknn") if executor != host_name else None
    return {
        "id": stage.id,
        "sha256": stage.sha256,
        "block": stage.block,
        "blocks": list(stage.blocks),
        "region": stage.region,
        "kind": stage.kind,
        "strategy": strategy,
        "device": stage.device,
        "executor": executor,
        "file": stage.file,
        "weight_bytes": stage.weight_bytes,
        "io_bytes": stage.io_bytes,
        "artifact": None
        if art is None
        else {
            "kind": art.kind,
            "file": art.file,
            "toolkit": art.toolkit,
            "target": art.target,
            "sha256": art.sha256,
            "size_bytes": art.size_bytes,
            # issue 27: an int8 / hybrid measurement is not an fp16 one (absent for fp16: records unchanged)
            **({"precision": art.precision} if art.precision != "fp16" else {}),
        },
    }


def stage_record(
    header: JsonMap,
    *,
    stage: Stage,
    executor: str,
    round_index: int,
    warmup: bool,
    step: int,
    pass_name: str,
    timings: JsonMap,
    memory: Mapping[str, int | None],
    measurement: Mapping[str, float | int],
) -> JsonObject:
    settings = header["settings"]
    return {
        **header,
        "record": "stage",
        "stage": stage_identity(stage, header["plan"]["strategy"], executor, settings.get("host_backend", "ort")),
        "round": round_index,
        "warmup": warmup,
        "step": step,
        "pass": pass_name,
        # Host stages are host code in the pipeline: always resident (see lifecycle.py).
        "residency": Residency.RESIDENT.value if stage.device == HOST else settings["residency"],
        "timings": dict(timings),
        "memory": dict(memory),
        "measurement": dict(measurement),
    }


def round_record(
    header: JsonMap,
    *,
    round_index: int,
    warmup: bool,
    wall_s: float,
    memory: Mapping[str, int | None],
    measurement: Mapping[str, float | int],
    cpu_s: float | None = None,
) -> JsonObject:
    return {
        **header,
        "record": "round",
        "round": round_index,
        "warmup": warmup,
        # cpu_s: CPU time of the whole process over the round (every thread), for comparisons
        # on a machine shared with other jobs
        "timings": {"wall_s": wall_s, **({} if cpu_s is None else {"cpu_s": cpu_s})},
        "memory": dict(memory),
        "measurement": dict(measurement),
    }


# -- the records a run writes, typed ---------------------------------------------------------
@dataclass(frozen=True)
class RunHeader:
    """The fields every record of one run repeats (:func:`record_header`)."""

    run_id: str
    env: JsonMap  # collect_environment
    settings: JsonMap  # what was measured and how (rounds, cfg, residency ...)
    plan: JsonMap  # plan_identity
    format: str = RECORD_FORMAT
    version: int = RECORD_VERSION

    def to_json(self) -> JsonObject:
        return {"format": self.format, "version": self.version, "run_id": self.run_id, "env": dict(self.env),
                "settings": dict(self.settings), "plan": dict(self.plan)}

    @classmethod
    def from_json(cls, r: JsonMap) -> RunHeader:
        return cls(run_id=str(r["run_id"]), env=dict(r["env"]), settings=dict(r["settings"]), plan=dict(r["plan"]),
                   format=str(r["format"]), version=int(r["version"]))


@dataclass(frozen=True)
class StageLine:
    """A ``"record": "stage"`` line as the profiler writes it (:func:`stage_record`); the cost
    model reads it as a :class:`StageRecord` (:meth:`typed`).  ``timings``, ``memory`` and
    ``measurement`` keep the schema's keys (``load_s``, ``pss_peak_kib`` ...)."""

    header: RunHeader
    stage: JsonMap  # stage_identity
    round: int
    warmup: bool
    step: int
    pass_name: str
    residency: Residency
    timings: JsonMap
    memory: Mapping[str, int | None]
    measurement: Mapping[str, float | int]

    @property
    def stage_id(self) -> str:
        return str(self.stage["id"])

    @property
    def device(self) -> Device:
        return HOST if self.stage["device"] == HOST else NPU

    def to_json(self) -> JsonObject:
        return {**self.header.to_json(), "record": "stage", "stage": dict(self.stage), "round": self.round,
                "warmup": self.warmup, "step": self.step, "pass": self.pass_name, "residency": self.residency.value,
                "timings": dict(self.timings), "memory": dict(self.memory), "measurement": dict(self.measurement)}

    @classmethod
    def from_json(cls, r: JsonMap) -> StageLine:
        return cls(header=RunHeader.from_json(r), stage=dict(r["stage"]), round=int(r["round"]),
                   warmup=bool(r["warmup"]), step=int(r["step"]), pass_name=str(r["pass"]),
                   residency=Residency(r["residency"]), timings=dict(r["timings"]), memory=dict(r["memory"]),
                   measurement=dict(r["measurement"]))

    def typed(self) -> StageRecord:
        return StageRecord.from_json(self.to_json())


@dataclass(frozen=True)
class RoundLine:
    """A ``"record": "round"`` line (:func:`round_record`): one round's wall time, memory and
    the measurement's own cost."""

    header: RunHeader
    round: int
    warmup: bool
    wall_s: float
    memory: Mapping[str, int | None]
    measurement: Mapping[str, float | int]
    cpu_s: float | None = None  # process CPU time of the round (every thread), when recorded

    def to_json(self) -> JsonObject:
        return {**self.header.to_json(), "record": "round", "round": self.round, "warmup": self.warmup,
                "timings": {"wall_s": self.wall_s, **({} if self.cpu_s is None else {"cpu_s": self.cpu_s})},
                "memory": dict(self.memory), "measurement": dict(self.measurement)}

    @classmethod
    def from_json(cls, r: JsonMap) -> RoundLine:
        tim = r["timings"]
        return cls(header=RunHeader.from_json(r), round=int(r["round"]), warmup=bool(r["warmup"]),
                   wall_s=float(tim["wall_s"]), memory=dict(r["memory"]), measurement=dict(r["measurement"]),
                   cpu_s=None if tim.get("cpu_s") is None else float(tim["cpu_s"]))


@dataclass(frozen=True)
class SummaryLine:
    """The closing ``"record": "summary"`` line (:func:`summary_record`)."""

    header: RunHeader
    rounds_measured: tuple[int, ...]
    warmup_rounds: tuple[int, ...]
    passes_per_round: int
    totals: Mapping[str, JsonMap]  # table key -> spread (median, min, max, spread, n)
    stages: tuple[JsonMap, ...]  # per stage: id and the spread of every lifecycle key
    baseline: JsonMap | None = None  # the whole model's time next to the plan's (``baseline=True``)

    def to_json(self) -> JsonObject:
        return {**self.header.to_json(), "record": "summary", "rounds_measured": list(self.rounds_measured),
                "warmup_rounds": list(self.warmup_rounds), "passes_per_round": self.passes_per_round,
                "totals": {k: dict(v) for k, v in self.totals.items()}, "stages": [dict(s) for s in self.stages],
                **({} if self.baseline is None else {"baseline": dict(self.baseline)})}

    @classmethod
    def from_json(cls, r: JsonMap) -> SummaryLine:
        return cls(header=RunHeader.from_json(r), rounds_measured=tuple(int(x) for x in r["rounds_measured"]),
                   warmup_rounds=tuple(int(x) for x in r["warmup_rounds"]),
                   passes_per_round=int(r["passes_per_round"]), totals=dict(r["totals"]),
                   stages=tuple(dict(s) for s in r["stages"]),
                   baseline=None if r.get("baseline") is None else dict(r["baseline"]))


ProfileLine = StageLine | RoundLine | SummaryLine
_LINES: dict[str, type[StageLine] | type[RoundLine] | type[SummaryLine]] = {
    "stage": StageLine, "round": RoundLine, "summary": SummaryLine}


@dataclass(frozen=True)
class ProfileRun:
    """One profile run, what :func:`rkpart.profile_plan` returns: its lines in run order (stage
    lines, a round line after each round's, one summary line last).

    :meth:`to_json` gives the JSON Lines file's objects (:func:`write_jsonl`), :meth:`from_json`
    reads them back (``ProfileRun.from_json(read_jsonl(path))``, one run: :func:`single_run`).
    """

    lines: tuple[ProfileLine, ...]

    def __post_init__(self) -> None:
        if not self.lines or not isinstance(self.lines[-1], SummaryLine):
            raise ValueError("a profile run ends with its summary line")

    @property
    def header(self) -> RunHeader:
        return self.lines[0].header

    @property
    def run_id(self) -> str:
        return self.header.run_id

    @property
    def stages(self) -> tuple[StageLine, ...]:
        return tuple(x for x in self.lines if isinstance(x, StageLine))

    @property
    def rounds(self) -> tuple[RoundLine, ...]:
        return tuple(x for x in self.lines if isinstance(x, RoundLine))

    @property
    def summary(self) -> SummaryLine:
        last = self.lines[-1]
        assert isinstance(last, SummaryLine)
        return last

    def stage_records(self, *, warmup: bool = True) -> list[StageRecord]:
        """The stage lines as the cost model reads them (``warmup=False``: measured rounds only)."""
        return [x.typed() for x in self.stages if warmup or not x.warmup]

    def to_json(self) -> list[JsonObject]:
        return [x.to_json() for x in self.lines]

    @classmethod
    def from_json(cls, records: Iterable[JsonMap]) -> ProfileRun:
        return cls(tuple(_LINES[str(r["record"])].from_json(r) for r in records))


# -- typed view ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StageRecord:
    """A ``"record": "stage"`` line, typed: one stage in one pass of one round.

    This is what leaves the profiler for the cost model (:mod:`rkpart.cost_model.calibration`):
    times are keyed by the lifecycle component names of :mod:`rkpart.types` (``"load"``, not
    the file's ``"load_s"``).  The JSON Lines file keeps its schema; :meth:`from_json` reads a
    validated line.
    """

    run_id: str
    plan_file: str | None  # the plan the run measured, as given to `rkpart profile`
    plan_sha256: str
    strategy: str
    run_residency: str  # the run's --residency setting
    backend: JsonMap  # env.backend: runtime / toolkit / threads of the NPU-stage executor
    host_backend: JsonMap | None  # env.host_backend
    env: JsonMap  # the whole machine and version record (provenance)
    stage_id: str
    stage_sha256: str
    device: Device
    round: int
    warmup: bool
    step: int
    pass_name: str
    residency: Residency  # how this stage's session lived in this record
    seconds: Mapping[str, float]  # lifecycle component -> seconds, only those this record measured
    infer_calls: tuple[float, ...] = ()  # every inference call with --infer-repeat > 1
    infer_cpu: float | None = None  # process CPU time of the inference call (one call: infer_repeat 1)
    #: process CPU time of the load / init / release calls this record measured (newer profiles)
    cpu: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    #: memory was read during the run (snapshots around calls or a sampler thread): its times
    #: include that work's CPU and are second choice for timing
    sampled: bool = True
    device_pss_peak_kib: int | None = None
    pss_peak_kib: int | None = None

    @classmethod
    def from_json(cls, r: JsonMap) -> StageRecord:
        st, tim, mem, env = r["stage"], r["timings"], r["memory"], r.get("env", {})
        return cls(
            run_id=str(r["run_id"]),
            plan_file=r["plan"].get("file"),
            plan_sha256=str(r["plan"]["sha256"]),
            strategy=str(r["plan"].get("strategy", "")),
            run_residency=str(r["settings"].get("residency")),
            backend=MappingProxyType(dict(env.get("backend") or {})),
            host_backend=None if env.get("host_backend") is None else MappingProxyType(dict(env["host_backend"])),
            env=MappingProxyType(dict(env)),
            stage_id=str(st["id"]),
            stage_sha256=str(st["sha256"]),
            device=HOST if st["device"] == HOST else NPU,
            round=int(r["round"]),
            warmup=bool(r["warmup"]),
            step=int(r["step"]),
            pass_name=str(r["pass"]),
            residency=Residency(r["residency"]),
            seconds=MappingProxyType({c: float(tim[seconds_key(c)]) for c in LIFECYCLE
                                      if tim.get(seconds_key(c)) is not None}),
            infer_calls=tuple(float(x) for x in tim.get("infer_calls_s") or ()),
            infer_cpu=None if tim.get("infer_cpu_s") is None else float(tim["infer_cpu_s"]),
            cpu=MappingProxyType({c: float(tim[f"{c}_cpu_s"]) for c in LIFECYCLE
                                  if c != "infer" and tim.get(f"{c}_cpu_s") is not None}),
            sampled=bool(r["settings"].get("snapshots", True)) or bool(r["settings"].get("sample_interval_s") or 0),
            device_pss_peak_kib=mem.get("device_pss_peak_kib"),
            pss_peak_kib=mem.get("pss_peak_kib"),
        )

    def calls(self, component: str, clock: str = "wall") -> list[float]:
        """Every measured call of ``component`` in this record (the K calls of ``--infer-repeat K``).

        ``clock="cpu"``: process CPU time of the call (inference: one call per record, i.e.
        ``--infer-repeat 1``; load / init / release when the profile recorded it); records
        without it give their wall time.
        """
        if component == "infer" and clock == "cpu" and self.infer_cpu is not None and not self.infer_calls:
            return [self.infer_cpu]
        if clock == "cpu" and component in self.cpu:
            return [self.cpu[component]]
        if component == "infer" and self.infer_calls:
            return list(self.infer_calls)
        v = self.seconds.get(component)
        return [] if v is None else [v]


def stage_records(records: Iterable[JsonMap]) -> list[StageRecord]:
    """The stage records among ``records`` (read with :func:`read_jsonl`), typed, in order."""
    return [StageRecord.from_json(r) for r in records if r.get("record") == "stage"]


# -- aggregation ---------------------------------------------------------------------------
def _in_block(r: JsonMap, block: int | None) -> bool:
    if block is None:
        return True
    st = r["stage"]
    return bool(st["block"] == block or block in st.get("blocks", ()))


def _add(a: float | None, b: float | None) -> float | None:
    if b is None:
        return a
    return b if a is None else a + b


def _max(a: int | None, b: int | None) -> int | None:
    if b is None:
        return a
    return b if a is None else max(a, b)


def round_totals(records: Iterable[JsonMap], block: int | None = None) -> dict[int, JsonObject]:
    """Per measured round: the table's components summed over stages and passes.

    With ``block=None`` (whole plan) the measured wall time, measurement cost and memory
    come from the round records; for one block they come from that block's stage records
    (wall = sum of the stage records' ``wall_s``, memory = maxima over them).
    """
    recs = list(records)
    out: dict[int, JsonObject] = {}
    for r in recs:
        if r.get("record") != "stage" or r.get("warmup") or not _in_block(r, block):
            continue
        t = out.setdefault(r["round"], _empty_round())
        tim, mem = r["timings"], r["memory"]
        if r["stage"]["device"] == HOST:
            for k in LIFECYCLE_KEYS:
                t["host_s"] = _add(t["host_s"], tim.get(k))
        else:
            for k in LIFECYCLE_KEYS:
                t[k] = _add(t[k], tim.get(k))
        if block is not None:
            t["wall_s"] = _add(t["wall_s"], tim.get("wall_s"))
            t["measurement_s"] = _add(t["measurement_s"], r["measurement"].get("snapshot_s"))
            t["device_pss_kib"] = _max(t["device_pss_kib"], mem.get("device_pss_peak_kib"))
            t["pss_peak_kib"] = _max(t["pss_peak_kib"], mem.get("pss_peak_kib"))
            t["swap_new_kib"] = _max(t["swap_new_kib"], mem.get("swap_new_kib"))
    if block is None:
        for r in recs:
            if r.get("record") != "round" or r.get("warmup") or r["round"] not in out:
                continue
            t = out[r["round"]]
            t["wall_s"] = r["timings"]["wall_s"]
            t["measurement_s"] = r["measurement"].get("snapshot_s")
            t["device_pss_kib"] = r["memory"].get("device_pss_peak_kib")
            t["pss_peak_kib"] = r["memory"].get("pss_peak_kib")
            t["swap_new_kib"] = r["memory"].get("swap_new_kib")
    for t in out.values():
        parts = [t[k] for k in (*LIFECYCLE_KEYS, "host_s")]
        t["net_s"] = sum(p for p in parts if p is not None)
        for k in (*LIFECYCLE_KEYS, "host_s"):
            if t[k] is None:
                t[k] = 0.0
    return dict(sorted(out.items()))


def _empty_round() -> JsonObject:
    return {k: None for k in (*TABLE_TIME_KEYS, *TABLE_MEMORY_KEYS)}


def spread(values: Sequence[float | int | None]) -> JsonObject:
    """Median, min, max and ``spread = max - min`` of the non-null values (``None`` if none)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "spread": None, "n": 0}
    return {
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "spread": max(vals) - min(vals),
        "n": len(vals),
    }


def aggregate(records: Iterable[JsonMap], block: int | None = None) -> dict[str, JsonObject]:
    """Median and spread over measured rounds of every table component (see :func:`round_totals`)."""
    per_round = round_totals(records, block)
    return {k: spread([t[k] for t in per_round.values()]) for k in (*TABLE_TIME_KEYS, *TABLE_MEMORY_KEYS)}


def passes_per_round(records: Iterable[JsonMap]) -> int:
    """Steps x passes of the run (the table's "Inference (xN)")."""
    for r in records:
        s = r.get("settings")
        if s:
            return int(s["steps"]) * (2 if s["cfg"] else 1)
    return 0


def summary_record(header: JsonMap, records: Sequence[JsonMap]) -> JsonObject:
    """The closing record: rounds used, plan totals and per-stage medians over measured rounds."""
    rounds = sorted({r["round"] for r in records if r.get("record") == "round"})
    warm = sorted({r["round"] for r in records if r.get("record") == "round" and r["warmup"]})
    stages: dict[str, dict[int, JsonObject]] = {}
    for r in records:
        if r.get("record") != "stage" or r["warmup"]:
            continue
        per = stages.setdefault(r["stage"]["id"], {}).setdefault(
            r["round"], {**{k: None for k in LIFECYCLE_KEYS}, "device_pss_kib": None, "pss_peak_kib": None}
        )
        for k in LIFECYCLE_KEYS:
            per[k] = _add(per[k], r["timings"].get(k))
        per["device_pss_kib"] = _max(per["device_pss_kib"], r["memory"].get("device_pss_peak_kib"))
        per["pss_peak_kib"] = _max(per["pss_peak_kib"], r["memory"].get("pss_peak_kib"))
    return {
        **header,
        "record": "summary",
        "rounds_measured": [r for r in rounds if r not in warm],
        "warmup_rounds": warm,
        "passes_per_round": passes_per_round([header]),
        "totals": aggregate(records),
        "stages": [
            {
                "id": sid,
                **{
                    k: spread([v[k] for v in per_round.values()])
                    for k in (*LIFECYCLE_KEYS, "device_pss_kib", "pss_peak_kib")
                },
            }
            for sid, per_round in stages.items()
        ],
    }


# -- schema and I/O ------------------------------------------------------------------------
@cache
def record_schema() -> JsonObject:
    """The JSON Schema of profile records (``rkpart/data/profile_record.schema.json``)."""
    text = resources.files("rkpart").joinpath("data/profile_record.schema.json").read_text()
    return dict(json.loads(text))


def _inline_refs(node: Any, defs: JsonMap, depth: int = 0) -> Any:
    """``node`` with every local ``{"$ref": "#/$defs/X"}`` replaced by X itself (the schema has no
    recursion): resolving references dominated validation, ~7 ms a record, minutes for a
    100 000-record profile."""
    if depth > 32:
        raise ValueError("profile record schema: $defs nested too deeply (recursive?)")
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and len(node) == 1:
            return _inline_refs(defs[ref[len("#/$defs/"):]], defs, depth + 1)
        return {k: _inline_refs(v, defs, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline_refs(v, defs, depth + 1) for v in node]
    return node


@cache
def _validator() -> Any:
    import jsonschema

    schema = record_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(_checked_schema())


@cache
def _checked_schema() -> JsonObject:
    """The schema records are validated against: :func:`record_schema` inlined, every number
    (a KiB figure, a round, a ratio) at most :data:`~rkpart.io.MAX_JSON_INT` in size (1e308 KiB
    is no measurement); seconds are bounded by the schema itself (10^6 s, as ``fit``)."""
    schema = record_schema()
    return dict(bounded_integers(_inline_refs(schema, schema.get("$defs", {})), numbers=True))


def _without_shared(schema: JsonMap) -> JsonObject:
    """The (inlined) record schema with :data:`SHARED_FIELDS` accepted as they are, still
    required: for records whose shared fields were validated on an earlier line.  Only the
    record level is loosened (the top and each record kind's ``then``), nothing nested."""
    def loosen(node: JsonMap) -> JsonObject:
        out = dict(node)
        if isinstance(out.get("properties"), dict):
            out["properties"] = {k: (True if k in SHARED_FIELDS else v) for k, v in out["properties"].items()}
        return out

    out = loosen(schema)
    out["allOf"] = [{**c, "then": loosen(c["then"])} if isinstance(c, dict) and isinstance(c.get("then"), dict)
                    else c for c in schema.get("allOf", [])]
    return out


@cache
def _light_validator() -> Any:
    full = _validator()
    return type(full)(_without_shared(full.schema))


def validate_record(record: JsonMap, *, where: str = "record", shared_checked: bool = False) -> None:
    """Raise :class:`SpecError` (one line) if ``record`` does not match the schema.

    ``shared_checked``: its :data:`SHARED_FIELDS` were validated already (:func:`iter_jsonl`).
    """
    v = _light_validator() if shared_checked else _validator()
    err = next(iter(sorted(v.iter_errors(record), key=lambda e: list(e.path))), None)
    if err is not None:
        path = "/".join(str(p) for p in err.absolute_path) or "(top)"
        raise SpecError(f"{where}: invalid profile record at {path}: {err.message}")


def validate_records(records: Iterable[JsonMap], *, where: str = "profile") -> None:
    """Validate every record; the error names the line (1-based)."""
    for i, r in enumerate(records, 1):
        validate_record(r, where=f"{where} line {i}")


def dumps_jsonl(records: Iterable[JsonMap]) -> str:
    """One compact JSON object per line, keys sorted (stable, diff-friendly)."""
    return "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records)


def write_jsonl(path: str | os.PathLike[str], records: Sequence[JsonMap]) -> Path:
    """Validate and atomically write ``records`` to ``path``."""
    from rkpart.output import write_output_file

    validate_records(records, where=str(path))
    # onto a missing or regular file only: never through a symlink, onto a FIFO or a device
    write_output_file(path, dumps_jsonl(records).encode(), force=True, what="profile output")
    return Path(path)


def read_jsonl(path: str | os.PathLike[str], *, validate: bool = True) -> list[JsonObject]:
    """Read a profile file whole (:func:`iter_jsonl`); :class:`SpecError` if it is missing,
    not JSON Lines or invalid."""
    return list(iter_jsonl(path, validate=validate))


def iter_jsonl(path: str | os.PathLike[str], *, validate: bool = True,
               max_bytes: int = MAX_PROFILE_BYTES) -> Iterator[JsonObject]:
    """The records of a profile file, one line at a time, each checked before it is yielded.

    Bounded: a regular file only (never a FIFO or device), at most ``max_bytes`` read in all
    and :data:`MAX_LINE_BYTES` per line, JSON depth and integer limits, the record schema and
    finite numbers.  Each distinct value of a :data:`SHARED_FIELDS` field (the run's header, a
    stage's identity) is validated once and then shared by the records that repeat it: on a
    110 000-record profile that is what keeps reading to seconds and the records to a fraction
    of their size as separate objects.  Yielded records must be treated as read-only.
    """
    p = Path(path)
    shared: JsonObject = {}
    n = read = 0
    kind = PROFILE_KIND if max_bytes == MAX_PROFILE_BYTES else dataclasses.replace(
        PROFILE_KIND, max_bytes=max_bytes, register=False, family=PROFILE_KIND.name)
    with kind.open(p) as f:
        for i, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            read += len(raw)
            if read > max_bytes:
                raise SpecError(f"profile {p} is too large (over {max_bytes} bytes)")
            if len(raw) > MAX_LINE_BYTES:
                raise SpecError(f"{p} line {i} is longer than {MAX_LINE_BYTES} bytes; not a profile record")
            if not raw.strip():
                continue
            obj = _parse_line(raw, where=f"{p} line {i}")
            if validate:
                _check_record(obj, where=f"{p} line {i}", shared=shared)
            n += 1
            yield obj
    if not n:
        raise SpecError(f"{p} holds no profile records")


def _parse_line(raw: bytes, *, where: str) -> Any:
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise SpecError(f"cannot read {where}: {e}") from None
    try:
        return json.loads(text, parse_int=_parse_int)
    except RecursionError:
        raise SpecError(f"{where} is not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError and the integer limit
        raise SpecError(f"{where} is not valid JSON: {str(e).splitlines()[0]}") from None


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer with {len(text.lstrip('-'))} digits (more than {MAX_INT_DIGITS})")
    return int(text)


#: schema keywords :func:`_signature` stands for (anything else: every record is validated)
_SCHEMA_WORDS = frozenset({"$schema", "$id", "$defs", "$ref", "$comment", "title", "description", "default",
                           "examples", "type", "properties", "required", "additionalProperties", "items",
                           "prefixItems", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "const",
                           "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern",
                           "minLength", "maxLength", "minItems", "maxItems", "dependentRequired"})


@cache
def _thresholds() -> tuple[float, ...] | None:
    """Every number the checked schema compares with (``minimum``, ``const``, ...), or ``None``
    if it uses a keyword a record's :func:`_signature` does not stand for.

    Read from :func:`_checked_schema`, the bounds :func:`~rkpart.io.bounded_integers` added
    included: a record whose integer is over 2^53 does not look like one whose integer is 5."""
    found: set[float] = set()
    stack: list[Any] = [_checked_schema()]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        for k, v in node.items():
            if k not in _SCHEMA_WORDS:
                return None
            if k in ("properties", "$defs"):
                stack.extend(v.values())
            elif k in ("allOf", "anyOf", "oneOf", "prefixItems"):
                stack.extend(v)
            elif k in ("items", "additionalProperties", "not", "if", "then", "else"):
                stack.append(v)
            elif k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                found.add(float(v))
            elif k in ("const", "enum"):
                found.update(float(x) for x in (v if k == "enum" else [v])
                             if isinstance(x, (int, float)) and not isinstance(x, bool))
    return tuple(sorted(found))


def _signature(rec: JsonMap, th: tuple[float, ...], *, where: str) -> tuple[Any, ...]:
    """What the record schema can tell apart in ``rec``: its keys, list lengths, strings and
    booleans verbatim, and for each number its type, whether it is whole and which side of
    every schema threshold (``th``) it lies on.  Two records with one signature are both valid
    or both invalid, so a profile's 100 000 look-alike lines are validated once.

    The same walk refuses what JSON allows but a profile must not hold: nesting deeper than
    :data:`~rkpart.io.MAX_DEPTH`, more than :data:`~rkpart.io.MAX_ITEMS` values, NaN or Inf.
    """
    out: list[Any] = []
    stack: list[tuple[Any, int]] = [(rec, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict):
            out.append(("d", *x))
            if d > MAX_DEPTH:
                raise SpecError(f"{where}: nested deeper than {MAX_DEPTH} levels")
            stack.extend((v, d + 1) for v in reversed(list(x.values())))
        elif isinstance(x, list):
            out.append(("l", len(x)))
            if d > MAX_DEPTH:
                raise SpecError(f"{where}: nested deeper than {MAX_DEPTH} levels")
            stack.extend((v, d + 1) for v in reversed(x))
        elif isinstance(x, bool) or x is None or isinstance(x, str):
            out.append(x)
        elif isinstance(x, float) and not math.isfinite(x):
            raise SpecError(f"{where}: {_nonfinite_field(rec)} is not a finite number (a profile holds measurements)")
        elif isinstance(x, (int, float)):
            out.append((type(x).__name__, float(x).is_integer(), *((x > t) - (x < t) for t in th)))
        else:
            out.append(("?", type(x).__name__))
        if len(out) > MAX_ITEMS:
            raise SpecError(f"{where}: more than {MAX_ITEMS} values; refusing it")
    return tuple(out)


def _check_record(obj: Any, *, where: str, shared: dict[Any, Any]) -> None:
    """Validate one parsed line.  A shared field equal to one validated on an earlier line is
    swapped for that line's object and not walked again; new ones are remembered once the
    whole record passed.  A record that looks, to the schema, like one validated before
    (:func:`_signature`) is not validated again."""
    known: list[str] = []
    fresh: list[tuple[Any, Any]] = []
    if isinstance(obj, dict):
        for k in SHARED_FIELDS:
            v = obj.get(k)
            if isinstance(v, dict):
                # the last value seen for this field (and stage id) first: its repr (which, unlike
                # ==, tells 1, 1.0 and True apart) is far cheaper than the canonical text
                sid = v.get("id") if k == "stage" else None
                hint = (k, sid if isinstance(sid, str) else None)
                text = repr(v)
                last = shared.get(hint)
                if last is not None and last[0] == text:
                    obj[k] = last[1]
                    known.append(k)
                    continue
                key = k + json.dumps(v, sort_keys=True)
                if key in shared:
                    obj[k] = shared[key]
                    shared[hint] = (text, shared[key])
                    known.append(k)
                else:
                    fresh.append((key, v))
                    fresh.append((hint, (text, v)))
    rest = {k: v for k, v in obj.items() if k not in known} if known else obj
    th = _thresholds()
    walked = _signature(rest, th or (), where=where)
    sig = None if th is None or not isinstance(obj, dict) else ("\0sig", tuple(known), walked)
    if sig is None or sig not in shared:
        validate_record(obj, where=where,
                        shared_checked=bool(known) and all(k in known for k in SHARED_FIELDS if k in obj))
    if sig is not None:
        shared[sig] = True
    shared.update(fresh)


def _nonfinite_field(obj: object) -> str | None:
    """The dotted path of the first NaN/Inf number in ``obj`` (JSON accepts ``NaN``), else ``None``."""
    bad = bad_number(obj)
    return (bad[0] or "the record") if bad is not None else None


def single_run(records: Sequence[JsonMap], *, where: str, run_id: str | None = None) -> list[JsonObject]:
    """The records of one run; a file with several runs needs ``run_id``."""
    ids = list(dict.fromkeys(r["run_id"] for r in records))
    if run_id is None:
        if len(ids) > 1:
            raise SpecError(f"{where} holds {len(ids)} runs ({listed(ids)}); choose one with --run")
        run_id = ids[0]
    elif run_id not in ids:
        raise SpecError(f"{where} has no run {run_id!r}; its {len(ids)} runs: {listed(ids)}")
    return [dict(r) for r in records if r["run_id"] == run_id]
