"""A linear, non-negative cost model per component; ``fit / update / predict / save / load``.

Every component is predicted *per stage* as ``sum(coef[t] * feature[t])`` over a few
named terms (:mod:`rkpart.cost_model.features`), with every coefficient ``>= 0`` so that a
term can only add cost (bigger files never load faster).  Components:

========== ======= ===========================================================
load       NPU     seconds of one ``load`` of the stage (read + upload)
init       NPU     seconds of one ``init``
infer      NPU     seconds of one inference pass
release    NPU     seconds of one ``release``
host       host    seconds of one pass of a host stage (AdaLN, residual, ...)
device_mem NPU     bytes of NPU device-mapped memory while the stage is loaded
pss_peak   any     bytes of peak process PSS while the stage runs
glue       any     seconds a round pays beyond the stages' own calls (per stage and pass,
                   per load-to-release cycle, per round: rkpart.cost_model.rounds)
setup      host    seconds of a host stage's session setup, once per round
========== ======= ===========================================================

``setup`` is fitted on the host stages' measured load + init + release of a round (ONNX
Runtime session creation: a per-node cost); ``glue`` on whole measured rounds, not on stage
samples (:mod:`rkpart.cost_model.rounds`).

How stage predictions combine into a block or a pipeline (sums for time, max or sum for
memory depending on residency) is :mod:`rkpart.cost_model.select`'s business: memory of a
fused block is predicted from the fused stage's own weights and activation peak, not as
the max of its parts.

Coefficients are fitted by non-negative least squares on *relative* error (each row is
divided by its target), because what matters is the percentage error on small and large
stages alike.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.cost_model.features import Features
from rkpart.cost_model.fitting import error_summary, nnls_relative
from rkpart.errors import SpecError
from rkpart.readers import FileKind
from rkpart.types import JsonMap, JsonObject

MODEL_FORMAT = "rkpart-cost-model"
#: a cost model file (``fit -o``, ``--cost-model``, ``--base``, ``profile --against``); its schema and
#: bounds are :meth:`CostModel.from_json`'s
COST_MODEL_KIND = FileKind("cost model", "json", 16 << 20, SpecError,
                           check=lambda doc, where: _check_cost_model(doc, where),
                           doc="`estimate`, `partition -s auto`, `report`, `profile --against`, `fit --base`")
MODEL_VERSION = 1
#: the terms of the ``npu_infer`` component (fitted by :mod:`rkpart.cost_model.npu_time`, which
#: imports this module: they live here so the document check needs no import back)
NPU_INFER_TERMS = ("compiled_cycles", "act_macs", "compiled_rw_bytes")

#: component -> (stage device it applies to, unit)
COMPONENTS: dict[str, tuple[str, str]] = {
    "load": ("npu", "s"),
    "init": ("npu", "s"),
    "infer": ("npu", "s"),
    "release": ("npu", "s"),
    "host": ("host", "s"),
    "device_mem": ("npu", "bytes"),
    "pss_peak": ("any", "bytes"),
    "glue": ("any", "s"),
    "setup": ("host", "s"),
    # NPU inference per pass of a *compiled* stage, from its compiler plan (rkpart.cost_model.npu_time)
    "npu_infer": ("npu", "s"),
}

#: terms fitted from profiles when nothing else is asked for
DEFAULT_TERMS: dict[str, tuple[str, ...]] = {
    "load": ("const", "file_bytes"),
    "init": ("const", "file_bytes", "nodes"),
    # one rate for every MatMul MAC (weighted or attention): fitted apart, the attention rate is
    # ill-determined on small stages and attention grows with tokens squared (see docs/cost-model.md)
    "infer": ("const", "all_macs", "mac_bytes", "elementwise_bytes", "nodes", "cpu_elems"),
    "release": ("const", "file_bytes"),
    "host": ("const", "elementwise_elems", "macs", "nodes"),
    "device_mem": ("const", "weight_bytes", "peak_bytes"),
    "pss_peak": ("const", "file_bytes", "peak_bytes"),
    "glue": ("const",),
    # session creation: per node, and per byte of initializers it copies and pre-packs (on the saved
    # selection_regret runs the held-out setup error share rose on all three, 29-34 % -> 31-42 %)
    "setup": ("const", "nodes", "weight_bytes"),
}


@dataclass(frozen=True)
class Sample:
    """One measured stage: its features and the measured value of some components.

    ``group`` names what the sample belongs to (a profiled plan: its runs with the same
    backend and residency, pooled): cross-validation leaves whole groups out, so a held-out
    prediction never saw its own plan.
    """

    features: Features
    targets: Mapping[str, float]
    group: str
    label: str = ""


@dataclass(frozen=True)
class Component:
    """A fitted linear predictor: ``value = sum(coef * feature)`` over ``terms``."""

    name: str
    terms: tuple[str, ...]
    coef: tuple[float, ...]
    source: str = "fit"  # "fit", "calibration" or "prior"
    samples: int = 0
    fit_error: JsonObject | None = None  # in-sample / cross-validated error summary
    note: str = ""

    def predict(self, f: Features) -> float:
        return float(sum(c * f.value(t) for c, t in zip(self.coef, self.terms, strict=True)))

    def to_json(self) -> JsonObject:
        return {
            "terms": {t: _round(c) for t, c in zip(self.terms, self.coef, strict=True)},
            "unit": COMPONENTS[self.name][1],
            "applies_to": COMPONENTS[self.name][0],
            "source": self.source,
            "samples": self.samples,
            "fit_error": self.fit_error,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, name: str, d: JsonMap) -> Component:
        terms = dict(d["terms"])
        for t, c in terms.items():
            if not isinstance(c, (int, float)) or c < 0 or not math.isfinite(c):
                raise SpecError(f"cost model component {name}: coefficient of {t} must be a number >= 0, got {c!r}")
        return cls(name=name, terms=tuple(terms), coef=tuple(float(c) for c in terms.values()),
                   source=str(d.get("source", "fit")), samples=int(d.get("samples", 0)),
                   fit_error=d.get("fit_error"), note=str(d.get("note", "")))


def _round(x: float) -> float:
    # 6 significant digits: stable JSON across platforms without losing meaning
    return float(f"{x:.6g}")


@dataclass(frozen=True)
class ErrorSummary:
    """:func:`error_summary` of predictions against measurements, typed; ``method`` says how
    samples were held out (``None``: in-sample error)."""

    n: int
    within_10: float | None  # share of predictions within +-10 %
    within_20: float | None
    median_ape: float | None  # median |% error|
    method: str | None = None

    def to_json(self) -> JsonObject:
        return {**({} if self.method is None else {"method": self.method}), "n": self.n,
                "within_10": self.within_10, "within_20": self.within_20, "median_ape": self.median_ape}

    @classmethod
    def from_json(cls, d: JsonMap) -> ErrorSummary:
        return cls(n=int(d.get("n") or 0), within_10=d.get("within_10"), within_20=d.get("within_20"),
                   median_ape=d.get("median_ape"),
                   method=None if d.get("method") is None else str(d["method"]))


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


@dataclass(frozen=True)
class FamilyAccuracy:
    """One partition family's row of :class:`Accuracy` (``adaln=npu,residual=npu`` ...)."""

    ratio: float  # predicted error relative to the most accurate family
    source: str = ""
    final_cosine: float | None = None  # from a drift run, when one measured the family
    final_mse: float | None = None
    final_max_abs: float | None = None


@dataclass(frozen=True)
class Accuracy:
    """:attr:`CostModel.accuracy`: the predicted numerical error of each partition family.

    A typed view of the cost-model file's ``accuracy`` object (written by ``rkpart drift
    --accuracy`` or the calibration): the document is kept as written, so :meth:`to_json`
    gives it back unchanged (a cost-model file loads and dumps byte-identical); the
    properties are what selection reads.  Checked on load (:mod:`rkpart.cost_model.checks`).
    """

    doc: JsonMap = field(default_factory=dict)

    @property
    def families(self) -> dict[str, FamilyAccuracy]:
        out = {}
        for k, f in (self.doc.get("families") or {}).items():
            ratio = _num(f.get("ratio"))
            if ratio is None:
                continue
            out[str(k)] = FamilyAccuracy(ratio=ratio, source=str(f.get("source", "")),
                                         final_cosine=_num(f.get("final_cosine")), final_mse=_num(f.get("final_mse")),
                                         final_max_abs=_num(f.get("final_max_abs")))
        return out

    def family(self, key: str) -> FamilyAccuracy | None:
        """The row of family ``key`` (:attr:`rkpart.cost_model.candidates.Candidate.accuracy_key`)."""
        return self.families.get(key)

    @property
    def default_max_ratio(self) -> float | None:
        """The accuracy floor selection applies unless asked for another (``None``: none)."""
        return _num(self.doc.get("default_max_ratio"))

    @property
    def min_cosine(self) -> float | None:
        return _num(self.doc.get("min_cosine"))

    def to_json(self) -> JsonObject:
        return dict(self.doc)

    @classmethod
    def from_json(cls, d: JsonMap) -> Accuracy:
        return cls(dict(d))


@dataclass(frozen=True)
class Provenance:
    """:attr:`CostModel.provenance`: where a model's numbers come from.

    An open record (the calibration, ``rkpart fit`` and the device model each write their own
    fields), kept as written so that :meth:`to_json` gives the file's object back unchanged;
    the properties are the fields the rest of rkpart reads, typed.  :meth:`replace` gives a
    copy with fields set (``None`` as a value removes the field).
    """

    doc: JsonMap = field(default_factory=dict)

    def _text(self, key: str) -> str | None:
        v = self.doc.get(key)
        return None if v is None else str(v)

    @property
    def device(self) -> str | None:
        return self._text("device")

    @property
    def toolkit(self) -> str | None:
        """The rknn-toolkit2 version the numbers were measured with (``None``: not recorded)."""
        return self._text("toolkit")

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends the profiles were measured on (``rkpart fit``; empty: not recorded)."""
        return tuple(str(b) for b in self.doc.get("backends") or ())

    @property
    def clock(self) -> str | None:
        return self._text("clock")

    @property
    def degrees_of_freedom(self) -> int | None:
        v = self.doc.get("degrees_of_freedom")
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def whole_plan_error(self) -> ErrorSummary | None:
        """The held-out error of predicted whole rounds (``rkpart fit``)."""
        v = self.doc.get("whole_plan_error")
        return ErrorSummary.from_json(v) if isinstance(v, Mapping) else None

    @property
    def latency_resolution(self) -> float | None:
        """The smallest relative latency difference the calibration's measurements resolve."""
        v = self.doc.get("latency_resolution")
        r = _num(v.get("relative")) if isinstance(v, Mapping) else None
        return r if r is not None and r > 0 else None

    @property
    def fitted_range(self) -> dict[str, tuple[int, int]]:
        """Per stage-size feature, the (lowest, highest) value the fit saw (``rkpart fit``)."""
        return {str(k): (int(lo), int(hi)) for k, (lo, hi) in (self.doc.get("fitted_range") or {}).items()}

    def replace(self, **fields: Any) -> Provenance:
        doc = {**self.doc, **fields}
        return Provenance({k: v for k, v in doc.items() if not (k in fields and v is None)})

    def with_fit(self, samples: int, groups: Sequence[str]) -> Provenance:
        """One more ``fits`` entry (:meth:`CostModel.update`)."""
        return Provenance({**self.doc, "fits": [*self.doc.get("fits", []), {"samples": samples,
                                                                          "groups": list(groups)}]})

    def to_json(self) -> JsonObject:
        return dict(self.doc)

    @classmethod
    def from_json(cls, d: JsonMap) -> Provenance:
        return cls(dict(d))


#: a measured CFG-parallel speed-up outside [MIN, MAX] is no measurement of two cores against one
#: (below 0.1 the two passes at once would be ten times slower than one after the other; a
#: 1e-320 speed-up predicted an infinite time per image)
MIN_CFG_PARALLEL_SPEEDUP = 0.1
MAX_CFG_PARALLEL_SPEEDUP = 3.0


@dataclass(frozen=True)
class CfgParallel:
    """The measured throughput of a step's two CFG passes on two NPU cores at once against one
    after the other (``rkpart tune --backend rknnlite --cfg-parallel``), replacing the prior
    :data:`rkpart.cost_model.npu_time.CFG_PARALLEL_SPEEDUP`."""

    speedup: float
    source: str
    #: what was timed: ``sequential_s`` / ``parallel_s`` (seconds per loop, each round), ``steps``, ...
    measured: JsonObject = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return {"speedup": self.speedup, "source": self.source, "measured": self.measured}

    @classmethod
    def from_json(cls, d: object, *, where: str) -> CfgParallel:
        if not isinstance(d, Mapping):
            raise SpecError(f"{where}: 'cfg_parallel' must be an object, got {type(d).__name__}")
        x, src, meas = d.get("speedup"), d.get("source"), d.get("measured", {})
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not (
                math.isfinite(x) and MIN_CFG_PARALLEL_SPEEDUP <= x <= MAX_CFG_PARALLEL_SPEEDUP):
            raise SpecError(f"{where}: cfg_parallel.speedup must be a number in [{MIN_CFG_PARALLEL_SPEEDUP:g}, "
                            f"{MAX_CFG_PARALLEL_SPEEDUP:g}], got {x!r}")
        if not isinstance(src, str):
            raise SpecError(f"{where}: cfg_parallel.source must be a string")
        if not isinstance(meas, Mapping):
            raise SpecError(f"{where}: cfg_parallel.measured must be an object")
        return cls(speedup=float(x), source=src, measured=dict(meas))


def _applies(component: str, f: Features) -> bool:
    dev = COMPONENTS[component][0]
    return dev == "any" or f.device == dev


@dataclass
class CostModel:
    """Per-component linear predictors plus provenance.

    Examples
    --------
    >>> m = CostModel.load(default_model_path())  # doctest: +SKIP
    >>> m.predict([features])[0]["infer"]          # doctest: +SKIP
    1.5589
    """

    components: dict[str, Component] = field(default_factory=dict)
    provenance: Provenance = field(default_factory=Provenance)
    #: predicted numerical error of a partition family relative to the most accurate one
    accuracy: Accuracy = field(default_factory=Accuracy)
    #: toolkit versions known to crash on some candidate families
    known_issues: list[JsonObject] = field(default_factory=list)
    #: per toolkit version, a ``device_mem`` predictor fitted on the compiler's own weight + internal
    #: memory of compiled stages (:mod:`rkpart.cost_model.device_model`); used before a stage is compiled
    device_memory: dict[str, Component] = field(default_factory=dict)
    #: the CFG-parallel speed-up measured on a board (``None``: the documented prior applies;
    #: :func:`rkpart.cost_model.npu_time.cfg_parallel_speedup`)
    cfg_parallel: CfgParallel | None = None

    def memory_component(self, toolkit: str | None) -> Component | None:
        """The device-memory predictor for ``toolkit``: its compiler-fitted model when the cost model
        has one, else the model's own ``device_mem`` component (``None``: neither)."""
        if toolkit is not None and toolkit in self.device_memory:
            return self.device_memory[toolkit]
        return self.components.get("device_mem")

    # -- prediction ----------------------------------------------------------------------
    def predict_stage(self, f: Features) -> dict[str, float | None]:
        """Every component that applies to ``f``'s device (``None``: no predictor for it)."""
        out: dict[str, float | None] = {}
        for name in COMPONENTS:
            # glue is a round's, not a stage's (rounds.overhead); npu_infer needs a compiled stage (npu_time)
            if not _applies(name, f) or name in ("glue", "npu_infer"):
                continue
            comp = self.components.get(name)
            out[name] = None if comp is None else comp.predict(f)
        return out

    def predict(self, candidates: Iterable[Features]) -> list[dict[str, float | None]]:
        """Per-stage predictions for several stages (TVM-style ``predict(candidates)``)."""
        return [self.predict_stage(f) for f in candidates]

    # -- fitting -------------------------------------------------------------------------
    def fit(self, samples: Sequence[Sample], terms: Mapping[str, Sequence[str]] | None = None) -> CostModel:
        """Fit every component that has samples, from scratch; returns ``self``."""
        self.components = {}
        return self.update(samples, terms)

    def update(self, samples: Sequence[Sample], terms: Mapping[str, Sequence[str]] | None = None) -> CostModel:
        """Refit the components the samples measure; others (e.g. calibration) are kept."""
        terms = {**DEFAULT_TERMS, **(terms or {})}
        for name in COMPONENTS:
            rows = [s for s in samples if name in s.targets and _applies(name, s.features)]
            if not rows:
                continue
            ts = tuple(terms[name])
            coef = _fit_rows(rows, name, ts)
            comp = Component(name=name, terms=ts, coef=tuple(float(c) for c in coef), source="fit",
                             samples=len(rows))
            pred = [comp.predict(s.features) for s in rows]
            cv = cross_validate(rows, name, ts)
            comp = Component(name=name, terms=ts, coef=comp.coef, source="fit", samples=len(rows),
                             fit_error={"in_sample": error_summary(pred, [s.targets[name] for s in rows]),
                                        "cross_validation": cv})
            self.components[name] = comp
        groups = sorted({s.group for s in samples})
        self.provenance = self.provenance.with_fit(len(samples), groups)
        return self

    # -- (de)serialisation ---------------------------------------------------------------
    def to_json(self) -> JsonObject:
        return {
            "format": MODEL_FORMAT,
            "version": MODEL_VERSION,
            "provenance": self.provenance.to_json(),
            "components": {k: self.components[k].to_json() for k in COMPONENTS if k in self.components},
            "accuracy": self.accuracy.to_json(),
            "known_issues": self.known_issues,
            **({"device_memory": {k: self.device_memory[k].to_json() for k in sorted(self.device_memory)}}
               if self.device_memory else {}),
            **({"cfg_parallel": self.cfg_parallel.to_json()} if self.cfg_parallel is not None else {}),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model as JSON, atomically, onto a missing or regular file only (:mod:`rkpart.output`)."""
        from rkpart.output import write_output_file

        write_output_file(path, self.dumps().encode(), force=True, what="cost model")
        return Path(path)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.dumps().encode()).hexdigest()

    @classmethod
    def from_json(cls, d: JsonMap, *, where: str = "cost model") -> CostModel:
        if d.get("format") != MODEL_FORMAT or d.get("version") != MODEL_VERSION:
            raise SpecError(f"{where}: not an rkpart cost model (expected format {MODEL_FORMAT!r} "
                            f"version {MODEL_VERSION})")
        from rkpart.cost_model.checks import check_model_document

        # the whole file, before any field is used: units and stage devices as rkpart writes them,
        # npu_infer's terms complete (issue 51)
        check_model_document(d, where=where, table=COMPONENTS, fixed={"npu_infer": NPU_INFER_TERMS})
        comps = d.get("components", {})
        unknown = sorted(set(comps) - set(COMPONENTS))
        if unknown:
            raise SpecError(f"{where}: unknown component {unknown[0]!r} (valid: {', '.join(COMPONENTS)})")
        try:
            components = {k: Component.from_json(k, v) for k, v in comps.items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SpecError(f"{where}: malformed component: {e}") from None
        dm = d.get("device_memory", {})
        if not isinstance(dm, Mapping):
            raise SpecError(f"{where}: device_memory must map toolkit versions to device_mem predictors")
        try:
            device_memory = {str(k): Component.from_json("device_mem", v) for k, v in dm.items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SpecError(f"{where}: malformed device_memory predictor: {e}") from None
        cp = None if d.get("cfg_parallel") is None else CfgParallel.from_json(d["cfg_parallel"], where=where)
        return cls(components=components, provenance=Provenance.from_json(d.get("provenance", {})),
                   accuracy=Accuracy.from_json(d.get("accuracy", {})), known_issues=list(d.get("known_issues", [])),
                   device_memory=device_memory, cfg_parallel=cp)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostModel:
        """Read a model saved by :meth:`save`; :class:`SpecError` if it is not one."""
        p = Path(path)
        return _check_cost_model(COST_MODEL_KIND.parse(COST_MODEL_KIND.read(p), str(p)), str(p))


def _check_cost_model(data: Any, where: str) -> CostModel:
    """:data:`COST_MODEL_KIND`'s check: the document is a cost model :meth:`CostModel.from_json` takes."""
    if not isinstance(data, dict):
        raise SpecError(f"cost model {where} is not a JSON object")
    return CostModel.from_json(data, where=where)


def _fit_rows(rows: Sequence[Sample], name: str, terms: Sequence[str]) -> np.ndarray:
    x = np.array([[s.features.value(t) for t in terms] for s in rows], dtype=float)
    y = np.array([s.targets[name] for s in rows], dtype=float)
    return nnls_relative(x, y)


def cross_validate(rows: Sequence[Sample], name: str, terms: Sequence[str], *, folds: int = 0) -> JsonObject:
    """Held-out error of ``name``: leave-one-group-out when there are >= 3 groups.

    With fewer groups (one profiled plan), leave-one-sample-out.  ``folds > 0`` asks for
    k-fold over groups instead (groups assigned round-robin in sorted order: deterministic).
    """
    groups = sorted({s.group for s in rows})
    if len(groups) >= 3:
        if folds and folds < len(groups):
            fold_of = {g: i % folds for i, g in enumerate(groups)}
        else:
            fold_of = {g: i for i, g in enumerate(groups)}
        keys = [fold_of[s.group] for s in rows]
        method = f"{len(set(keys))}-fold by plan" if folds else "leave-one-plan-out"
    else:
        keys = list(range(len(rows)))
        method = "leave-one-sample-out"
    pred: list[float] = []
    meas: list[float] = []
    for k in sorted(set(keys)):
        train = [s for s, kk in zip(rows, keys, strict=True) if kk != k]
        test = [s for s, kk in zip(rows, keys, strict=True) if kk == k]
        if not train:
            continue
        coef = _fit_rows(train, name, terms)
        comp = Component(name=name, terms=tuple(terms), coef=tuple(float(c) for c in coef))
        pred += [comp.predict(s.features) for s in test]
        meas += [s.targets[name] for s in test]
    return {"method": method, **error_summary(pred, meas)}


def default_model_path() -> Path:
    """The shipped RK3588 calibration (``rkpart/data/rk3588_calibration.json``)."""
    from importlib import resources

    return Path(str(resources.files("rkpart") / "data" / "rk3588_calibration.json"))


def load_model_or_default(path: str | os.PathLike[str] | None) -> CostModel:
    """``CostModel.load(path)``, or the shipped calibration when ``path`` is ``None``."""
    return CostModel.load(default_model_path() if path is None else path)


__all__ = ["COMPONENTS", "DEFAULT_TERMS", "MAX_CFG_PARALLEL_SPEEDUP", "MIN_CFG_PARALLEL_SPEEDUP", "Accuracy",
           "Component", "CostModel", "ErrorSummary", "FamilyAccuracy", "Provenance", "Sample", "cross_validate",
           "default_model_path", "error_summary", "load_model_or_default", "nnls_relative"]
