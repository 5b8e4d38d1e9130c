"""What a cost model must satisfy before anything uses it (issue 31).

A cost-model file is validated whole when it is read (:func:`check_model_document`): every
field that ``partition``, ``report`` and ``profile --against`` later use has the type they
expect, every coefficient is finite and non-negative, and every term is a feature that exists
(a term named ``to_json`` would otherwise be looked up as a method).  A fit is refused when its
samples hold a timing that is not a measurement (NaN, infinite, zero, negative, or beyond any
real run) and when the fitted model predicts zero or a non-finite value for its own samples:
such a model would make ``auto`` choose from predictions of 0 s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from rkpart.cost_model import features as _features
from rkpart.cost_model.features import GLUE_TERMS
from rkpart.errors import SpecError
from rkpart.io import MAX_JSON_INT, bad_number
from rkpart.targets.known_issues import SIGNATURES, TRAIT_NAMES
from rkpart.types import JsonMap

#: the terms a stage component may use (:meth:`rkpart.cost_model.features.Features.value`);
#: ``glue`` uses :data:`rkpart.cost_model.features.GLUE_TERMS`
TERMS = frozenset({"const", "all_macs", "io_bytes",
                   *(f.name for f in fields(_features.Features)
                     if str(f.type).replace(" ", "") in ("int", "float", "int|None", "float|None"))})
#: the parametrised terms (``npu_peak16:R``, ``npu_attx16:R``), where the features define them
_PREFIXES: tuple[str, ...] = tuple(getattr(_features, "PARAM_TERMS", ()))


def _valid_term(name: str, t: str) -> bool:
    if name == "glue":
        return t in GLUE_TERMS
    if t in TERMS:
        return True
    for prefix in _PREFIXES:
        if t.startswith(prefix):
            try:
                return math.isfinite(float(t[len(prefix):])) and float(t[len(prefix):]) >= 0
            except ValueError:
                return False
    return False
#: a measured stage time or size beyond these is not a measurement (11.6 days; 1 PiB)
MAX_SECONDS = 1e6
MAX_BYTES = float(2**50)
#: a percentage error (``median_ape``, ``p90_ape``, ``max_ape``) beyond this (10^4 x) is no error bar
MAX_APE = 1e6


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_numbers(where: str, doc: object) -> None:
    """Refuse any number in ``doc`` (a parsed JSON document) that is NaN, infinite or over
    :data:`~rkpart.io.MAX_JSON_INT` in size, naming where it is: a 1e300 coefficient or error
    summary overflows to inf in the sums made of it (as profile records, issue 31)."""
    bad = bad_number(doc, limit=MAX_JSON_INT)
    if bad is None:
        return
    path, x = bad
    if isinstance(x, float) and not math.isfinite(x):
        raise SpecError(f"{where}: {path or 'the document'} is {x!r}, not a finite number")
    raise SpecError(f"{where}: {path or 'the document'} is {x:g}, over 2^53 in size: beyond any "
                    "figure rkpart writes there")


def _check_summary(where: str, what: str, d: object) -> None:
    """An error summary (:func:`rkpart.cost_model.model.error_summary`): shares in [0, 1], counts
    integers >= 0, percentage errors in [0, :data:`MAX_APE`], each when present."""
    if d is None:
        return
    if not isinstance(d, Mapping):
        raise SpecError(f"{where}: {what} must be an object or null, got {type(d).__name__}")
    for k in ("within_10", "within_20"):
        v = d.get(k)
        if v is not None and not (_number(v) and 0 <= v <= 1):
            raise SpecError(f"{where}: {what}.{k} must be a share in [0, 1] or null, got {v!r}")
    for k in ("median_ape", "p90_ape", "max_ape"):
        v = d.get(k)
        if v is not None and not (_number(v) and 0 <= v <= MAX_APE):
            raise SpecError(f"{where}: {what}.{k} must be a percentage in [0, {MAX_APE:g}] or null, got {v!r}")
    n = d.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise SpecError(f"{where}: {what}.n must be an integer >= 0, got {n!r}")


def _check_fit_error(where: str, name: str, fe: object) -> None:
    if not isinstance(fe, Mapping):
        return  # null; a wrong type is refused by _check_component
    for k in ("held_out", "in_sample", "cross_validation"):
        _check_summary(where, f"component {name}: fit_error.{k}", fe.get(k))


def _check_provenance(where: str, prov: JsonMap) -> None:
    """The provenance fields selection and ``estimate`` read, typed and in range."""
    dof = prov.get("degrees_of_freedom")
    if dof is not None and (isinstance(dof, bool) or not isinstance(dof, int)):
        raise SpecError(f"{where}: provenance.degrees_of_freedom must be an integer or null, got {dof!r}")
    _check_summary(where, "provenance.whole_plan_error", prov.get("whole_plan_error"))
    res = prov.get("latency_resolution")
    if res is not None:
        rel = res.get("relative") if isinstance(res, Mapping) else None
        if not isinstance(res, Mapping) or (rel is not None and not (_number(rel) and 0 < rel <= 1)):
            got = repr(rel if isinstance(res, Mapping) else res)[:60]
            raise SpecError(f"{where}: provenance.latency_resolution must be an object whose 'relative' is a "
                            f"number in (0, 1], got {got}")
    backends = prov.get("backends")
    if backends is not None and not (isinstance(backends, list) and all(isinstance(b, str) for b in backends)):
        raise SpecError(f"{where}: provenance.backends must be a list of strings or null")
    rng = prov.get("fitted_range")
    if rng is None:
        return
    if not isinstance(rng, Mapping):
        raise SpecError(f"{where}: provenance.fitted_range must be an object of feature -> [lowest, highest]")
    for k, v in rng.items():
        if not (isinstance(v, list) and len(v) == 2 and all(_number(x) and x >= 0 for x in v) and v[0] <= v[1]):
            raise SpecError(f"{where}: provenance.fitted_range.{k} must be [lowest, highest], two numbers with "
                            f"0 <= lowest <= highest, got {v!r}"[:300])


def _check_component(where: str, name: str, d: object, table: Mapping[str, tuple[str, str]] | None = None,
                     fixed: Mapping[str, Sequence[str]] | None = None) -> None:
    """One component: known terms with finite coefficients >= 0; with ``table`` (component ->
    (device, unit)) its ``unit`` and ``applies_to`` as rkpart writes them and, for a time, one
    coefficient > 0 (all zero predicts 0 s for every stage); ``fixed``: components whose terms are
    exactly these (``npu_infer``'s three, in order)."""
    if not isinstance(d, Mapping):
        raise SpecError(f"{where}: component {name} must be an object, got {type(d).__name__}")
    terms = d.get("terms")
    if not isinstance(terms, Mapping) or not terms:
        raise SpecError(f"{where}: component {name}: 'terms' must be a non-empty object of term -> coefficient")
    for t, c in terms.items():
        if not isinstance(t, str) or not _valid_term(name, t):
            valid = sorted(GLUE_TERMS if name == "glue" else TERMS)
            if name != "glue":
                valid += [f"{p}R" for p in _PREFIXES]
            raise SpecError(f"{where}: component {name}: unknown term {t!r} (valid: {', '.join(valid)})")
        if not _number(c) or c < 0:
            raise SpecError(f"{where}: component {name}: coefficient of {t} must be a number >= 0 (finite), got {c!r}")
    for key, types, what in (("source", (str,), "a string"), ("note", (str,), "a string"),
                             ("fit_error", (dict, type(None)), "an object or null"),
                             ("unit", (str,), "a string"), ("applies_to", (str,), "a string")):
        if key in d and not isinstance(d[key], types):
            raise SpecError(f"{where}: component {name}: {key!r} must be {what}, got {type(d[key]).__name__}")
    if "samples" in d and (isinstance(d["samples"], bool) or not isinstance(d["samples"], int) or d["samples"] < 0):
        raise SpecError(f"{where}: component {name}: 'samples' must be an integer >= 0, got {d['samples']!r}")
    _check_fit_error(where, name, d.get("fit_error"))
    if fixed is not None and name in fixed and list(terms) != list(fixed[name]):
        raise SpecError(f"{where}: component {name}: terms must be exactly {', '.join(fixed[name])} (in this order), "
                        f"got {', '.join(map(str, terms))[:200]}")
    if table is None or name not in table:
        return
    device, unit = table[name]
    for key, want in (("unit", unit), ("applies_to", device)):
        if key in d and d[key] != want:
            raise SpecError(f"{where}: component {name}: {key} {str(d[key])[:40]!r} is not {want!r}, the "
                            f"{'unit' if key == 'unit' else 'stage device'} rkpart writes for it")
    if unit == "s" and not any(c > 0 for c in terms.values()):
        raise SpecError(f"{where}: component {name}: every coefficient is 0, so it predicts 0 s for every stage; "
                        "a time is > 0: refit the model or use the shipped calibration")


def check_accuracy(where: str, acc: object) -> None:
    """Refuse an accuracy term (a cost model's, or ``drift --accuracy``'s file) of the wrong shape or with NaN."""
    if not isinstance(acc, Mapping):
        raise SpecError(f"{where}: 'accuracy' must be an object, got {type(acc).__name__}")
    if "default_max_ratio" in acc and not (_number(acc["default_max_ratio"]) and acc["default_max_ratio"] > 0):
        raise SpecError(f"{where}: accuracy.default_max_ratio must be a finite number > 0, "
                        f"got {acc['default_max_ratio']!r}")
    if "min_cosine" in acc and not (_number(acc["min_cosine"]) and -1 <= acc["min_cosine"] <= 1):
        raise SpecError(f"{where}: accuracy.min_cosine must be a number in [-1, 1], got {acc['min_cosine']!r}")
    fams = acc.get("families", {})
    if not isinstance(fams, Mapping):
        raise SpecError(f"{where}: accuracy.families must be an object, got {type(fams).__name__}")
    for fam, row in fams.items():
        if not isinstance(row, Mapping):
            raise SpecError(f"{where}: accuracy family {fam!r} must be an object")
        if not (_number(row.get("ratio")) and row["ratio"] > 0):
            raise SpecError(f"{where}: accuracy family {fam!r}: 'ratio' must be a finite number > 0, "
                            f"got {row.get('ratio')!r}")
        for k in ("final_cosine", "final_mse", "final_max_abs"):
            if k in row and not _number(row[k]):
                raise SpecError(f"{where}: accuracy family {fam!r}: {k!r} must be a finite number (a NaN drift run "
                                f"is not a measurement), got {row[k]!r}")
        if "final_cosine" in row and not -1 - 1e-6 <= row["final_cosine"] <= 1 + 1e-6:  # up to rounding
            raise SpecError(f"{where}: accuracy family {fam!r}: 'final_cosine' must be a cosine in [-1, 1], "
                            f"got {row['final_cosine']!r}")
        for k in ("final_mse", "final_max_abs"):
            if k in row and row[k] < 0:
                raise SpecError(f"{where}: accuracy family {fam!r}: {k!r} must be >= 0, got {row[k]!r}")


def _check_known_issues(where: str, issues: object) -> None:
    if not isinstance(issues, list):
        raise SpecError(f"{where}: 'known_issues' must be a list, got {type(issues).__name__}")
    for i, row in enumerate(issues):
        if not isinstance(row, Mapping):
            raise SpecError(f"{where}: known_issues[{i}] must be an object, got {type(row).__name__}")
        if "toolkit" in row and not isinstance(row["toolkit"], str):
            raise SpecError(f"{where}: known_issues[{i}].toolkit must be a string")
        if "when" in row and not isinstance(row["when"], Mapping):
            raise SpecError(f"{where}: known_issues[{i}].when must be an object")
        unknown = sorted(set(row.get("when", {})) - TRAIT_NAMES)
        if unknown:
            raise SpecError(f"{where}: known_issues[{i}].when names {unknown[0]!r}, which is no candidate trait "
                            f"(traits: {', '.join(sorted(TRAIT_NAMES))})")
        for k in ("what", "source", "signature"):
            if k in row and not isinstance(row[k], str):
                raise SpecError(f"{where}: known_issues[{i}].{k} must be a string")
        if row.get("signature") is not None and row["signature"] not in SIGNATURES:
            raise SpecError(f"{where}: known_issues[{i}].signature {row['signature']!r} is no op signature of the "
                            f"known-issue table (signatures: {', '.join(sorted(SIGNATURES))})")


def check_model_document(d: JsonMap, *, where: str, table: Mapping[str, tuple[str, str]] | None = None,
                         fixed: Mapping[str, Sequence[str]] | None = None) -> None:
    """Refuse (one-line :class:`SpecError`) a cost-model document any later use would trip over
    (``table`` / ``fixed``: see :func:`_check_component`)."""
    check_numbers(where, d)
    comps = d.get("components", {})
    if not isinstance(comps, Mapping):
        raise SpecError(f"{where}: 'components' must be an object, got {type(comps).__name__}")
    for name, c in comps.items():
        _check_component(where, str(name), c, table, fixed)
    dm = d.get("device_memory", {})
    if isinstance(dm, Mapping):  # another type is refused by CostModel.from_json
        for tk, c in dm.items():
            _check_component(f"{where}: device_memory[{str(tk)[:40]}]", "device_mem", c, table)
    if not isinstance(d.get("provenance", {}), Mapping):
        raise SpecError(f"{where}: 'provenance' must be an object, got {type(d['provenance']).__name__}")
    _check_provenance(where, d.get("provenance", {}))
    check_accuracy(where, d.get("accuracy", {}))
    _check_known_issues(where, d.get("known_issues", []))


def check_samples(samples: Sequence[Any], units: Mapping[str, str]) -> None:
    """Refuse measured values that are no measurement: NaN, infinite, negative, a zero time, or
    beyond :data:`MAX_SECONDS` / :data:`MAX_BYTES` (``units``: component -> ``"s"`` or ``"bytes"``)."""
    for s in samples:
        for name, v in s.targets.items():
            unit = units.get(name, "s")
            limit = MAX_SECONDS if unit == "s" else MAX_BYTES
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SpecError(f"profile sample {s.label or s.group}: {name} is {v!r}, not a finite number; "
                                "refusing to fit from it")
            if v < 0 or (unit == "s" and v == 0):
                raise SpecError(f"profile sample {s.label or s.group}: {name} is {v:g} {unit}; a measured "
                                f"{'time' if unit == 's' else 'size'} is > 0; refusing to fit from it")
            if v > limit:
                raise SpecError(f"profile sample {s.label or s.group}: {name} is {v:g} {unit}, beyond any real "
                                f"run (limit {limit:g}); refusing to fit from it")


def check_own_predictions(model: Any, samples: Sequence[Any], units: Mapping[str, str]) -> None:
    """Refuse a fitted model whose prediction of one of its own samples is non-finite, or zero
    for a time (``auto`` would take it for a free stage)."""
    for s in samples:
        for name in s.targets:
            comp = model.components.get(name)
            if comp is None or comp.source != "fit":
                continue
            try:
                p = comp.predict(s.features)
            except OverflowError:
                p = math.inf
            if not math.isfinite(p) or (units.get(name) == "s" and p <= 0):
                raise SpecError(f"the fitted {name} predicts {p:g} {units.get(name, 's')} for its own sample "
                                f"{s.label or s.group} (measured {s.targets[name]:g}); refusing to write such a "
                                "model: profile more plans or rounds")


def _beyond(k: str, v: float, passes: int) -> str | None:
    """Why the predicted ``k`` (over ``passes`` passes) is beyond any real run, or ``None``."""
    if "memory" in k or k.endswith("_bytes"):
        return f"over {MAX_BYTES:g} bytes (1 PiB): no device holds that" if v > MAX_BYTES else None
    limit = MAX_SECONDS * max(passes, 1)
    return f"over {MAX_SECONDS:g} s a pass: beyond any real run" if v > limit else None


def check_prediction(candidate: str, residency: str, parts: Mapping[str, float], passes: int = 1) -> None:
    """Refuse predictions ``auto`` cannot choose from: a latency that is not finite and > 0, a
    component or memory that is not finite and >= 0, or one beyond any real run (over
    :data:`MAX_SECONDS` a pass, over :data:`MAX_BYTES`), e.g. from a huge coefficient; ``parts``
    are totals over ``passes`` passes."""
    for k, v in parts.items():
        if not math.isfinite(v) or v < 0 or (k == "latency" and v <= 0):
            need = "a latency must be finite and > 0" if k == "latency" else "a prediction must be finite and >= 0"
            raise SpecError(f"the cost model predicts {k} = {v:g} for candidate {candidate} ({residency}); {need}: "
                            "refit the model or use the shipped calibration")
        why = _beyond(k, v, passes)
        if why is not None:
            raise SpecError(f"the cost model predicts {k} = {v:g} for candidate {candidate} ({residency}), {why}: "
                            "refit the model or use the shipped calibration")


def check_stage_estimate(stage: str, parts: Mapping[str, float | None]) -> None:
    """``rkpart estimate``'s refusal of one stage's predictions (per call): not finite, negative,
    beyond any real run (:data:`MAX_SECONDS`, :data:`MAX_BYTES`), or a stage whose times add up
    to 0 s (no stage runs in no time: errors.md's "non-positive latency")."""
    for k, v in parts.items():
        if v is None:
            continue
        why = "not a finite number >= 0" if not math.isfinite(v) or v < 0 else _beyond(k, v, 1)
        if why is not None:
            raise SpecError(f"the cost model predicts {k} = {v:g} for stage {stage}, {why}: refit the model or use "
                            "the shipped calibration")
    times = [v for k, v in parts.items() if v is not None and "memory" not in k and not k.endswith("_bytes")]
    if times and sum(times) <= 0:
        raise SpecError(f"the cost model predicts 0 s for stage {stage} ({', '.join(k for k in parts)}): a latency "
                        "is > 0; refit the model or use the shipped calibration")


__all__ = ["MAX_APE", "MAX_BYTES", "MAX_SECONDS", "TERMS", "check_accuracy", "check_model_document", "check_numbers",
           "check_own_predictions", "check_prediction", "check_samples", "check_stage_estimate"]
