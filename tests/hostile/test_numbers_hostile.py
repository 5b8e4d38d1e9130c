"""Wrong results are never accepted and every file is validated whole (issue 31): NaN is never a
perfect score, a cost model or profile that is not a measurement is refused in one line, and
options have ranges a user could mean.

Real commands (``CliRunner``) on the bundled example and real profiles of it (ONNX Runtime).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rkpart.cost_model.drift_accuracy import accuracy_from_drift
from rkpart.cost_model.model import default_model_path
from rkpart.errors import GateError
from rkpart.profile.drift import LATENT, compare_step, nonfinite_rows, render
from rkpart.report import plots
from tests.hostile.models import FUZZ_STATS, assert_option_refused, assert_user_error, cli


def _records(p: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def _write_records(p: Path, recs: list[dict[str, Any]]) -> Path:
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


# -- fit on timings that are not measurements ---------------------------------------------------

TIMING_FIELDS = ("infer_s", "init_s", "load_s")
BAD_TIMINGS: list[tuple[str, float]] = [("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf), ("zero", 0.0),
                                        ("negative", -1e-3), ("1e300", 1e300)]


def _mutated_profile(profile: Path, tmp: Path, field: str | None, value: float) -> Path:
    recs = _records(profile)
    for r in recs:
        if r.get("record") != "stage":
            continue
        for k, v in r["timings"].items():
            if v is not None and (field is None or k == field or k == field.replace("_s", "_cpu_s")):
                r["timings"][k] = value
    return _write_records(tmp / "bad.jsonl", recs)


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("value", [v[0] for v in BAD_TIMINGS])
@pytest.mark.parametrize("field", ["all", *(pytest.param(f, marks=pytest.mark.slow) for f in TIMING_FIELDS)])
def test_fit_refuses_timings_that_are_not_measurements(field: str, value: str, profile: Path,
                                                       tmp_path: Path) -> None:
    v = dict(BAD_TIMINGS)[value]
    bad = _mutated_profile(profile, tmp_path, None if field == "all" else field, v)
    out = tmp_path / "model.json"
    r = cli(["fit", bad, "-o", out])
    # the profile schema refuses a negative time, rkpart's reader a NaN/Inf, fit the rest: all exit 5
    assert_user_error(r, 5)
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    FUZZ_STATS["cases:numbers-fit"] += 1


@pytest.mark.slow  # builds the shared profile (ONNX Runtime)
def test_fit_on_good_timings_still_writes_a_model(profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.json"
    r = cli(["fit", profile, "-o", out])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert all(c >= 0 and math.isfinite(c) for comp in doc["components"].values() for c in comp["terms"].values())


# -- cost-model files validated whole -----------------------------------------------------------


def _shipped() -> dict[str, Any]:
    d: dict[str, Any] = json.loads(default_model_path().read_text())
    return d


def _at(d: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def _huge_memory(d: dict[str, Any]) -> None:
    """A 1e308 constant in every device-memory predictor (the model's own and each toolkit's)."""
    for c in (d["components"]["device_mem"], *d.get("device_memory", {}).values()):
        c["terms"]["const"] = 1e308


def _zero_times(d: dict[str, Any]) -> None:
    for c in d["components"].values():
        if c.get("unit") == "s":
            c["terms"] = {k: 0 for k in c["terms"]}


MODEL_CASES: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    *((f"term-{t}", lambda d, t=t: _at(d, ("components", "infer", "terms", t), 1.0))
      for t in ("to_json", "__class__", "value", "device", "op_counts", "nonexistent", "")),
    *((f"coef-{n}", lambda d, v=v: _at(d, ("components", "infer", "terms", "all_macs"), v))
      for n, v in (("str", "1"), ("none", None), ("neg", -1.0), ("list", [1]), ("bool", True),
                   ("nan", math.nan), ("inf", math.inf))),
    *((f"terms-{n}", lambda d, v=v: _at(d, ("components", "infer", "terms"), v))
      for n, v in (("list", []), ("str", "x"), ("empty", {}), ("none", None))),
    *((f"component-{n}", lambda d, v=v: _at(d, ("components", "infer"), v)) for n, v in (("str", "x"), ("list", []))),
    *((f"components-{n}", lambda d, v=v: _at(d, ("components",), v)) for n, v in (("list", []), ("str", "x"))),
    ("component-unknown", lambda d: _at(d, ("components", "gpu"), {"terms": {"const": 1}})),
    *((f"fit_error-{n}", lambda d, v=v: _at(d, ("components", "infer", "fit_error"), v))
      for n, v in (("str", "x"), ("int", 5), ("list", []))),
    *((f"samples-{n}", lambda d, v=v: _at(d, ("components", "infer", "samples"), v))
      for n, v in (("str", "x"), ("neg", -1), ("float", 1.5))),
    ("source-int", lambda d: _at(d, ("components", "infer", "source"), 5)),
    ("note-list", lambda d: _at(d, ("components", "infer", "note"), [])),
    *((f"provenance-{n}", lambda d, v=v: _at(d, ("provenance",), v)) for n, v in (("list", []), ("str", "x"),
                                                                               ("int", 5))),
    *((f"accuracy-{n}", lambda d, v=v: _at(d, ("accuracy",), v)) for n, v in (("list", []), ("str", "x"))),
    ("accuracy-families-list", lambda d: _at(d, ("accuracy", "families"), [])),
    *((f"accuracy-max-ratio-{n}", lambda d, v=v: _at(d, ("accuracy", "default_max_ratio"), v))
      for n, v in (("str", "x"), ("nan", math.nan), ("zero", 0), ("neg", -1))),
    *((f"accuracy-ratio-{n}", lambda d, v=v: d["accuracy"]["families"][sorted(d["accuracy"]["families"])[0]]
       .__setitem__("ratio", v)) for n, v in (("str", "1"), ("nan", math.nan), ("neg", -1), ("none", None))),
    ("accuracy-final-cosine-nan",
     lambda d: d["accuracy"]["families"][sorted(d["accuracy"]["families"])[0]].__setitem__("final_cosine", math.nan)),
    ("accuracy-min-cosine-2", lambda d: _at(d, ("accuracy", "min_cosine"), 2)),
    *((f"known-issues-{n}", lambda d, v=v: _at(d, ("known_issues",), v))
      for n, v in (("dict", {}), ("str", "x"), ("ints", [5]), ("toolkit-int", [{"toolkit": 5}]),
                   ("when-str", [{"toolkit": "2.3.2", "when": "x"}]), ("what-list", [{"what": []}]),
                   ("when-no-trait", [{"toolkit": "2.3.2", "when": {"adaln_on_gpu": True}}]))),
    # numbers that parse but predict nonsense: refused when auto evaluates the candidates
    ("coef-1e308-infer", lambda d: _at(d, ("components", "infer", "terms", "all_macs"), 1e308)),
    ("coef-1e308-load", lambda d: _at(d, ("components", "load", "terms", "const"), 1e308)),
    ("coef-1e308-device-mem", _huge_memory),
    ("all-time-terms-zero", _zero_times),
]


def _model_file(tmp: Path, case: str) -> Path:
    d = _shipped()
    dict(MODEL_CASES)[case](d)
    p = tmp / "model.json"
    p.write_text(json.dumps(d))  # NaN/Infinity as Python's json writes them
    return p


#: every third file-level case and every prediction case in the fast tier, the rest with the slow ones
_FAST_MODEL_CASES = {c[0] for i, c in enumerate(MODEL_CASES) if i % 3 == 0 or i >= len(MODEL_CASES) - 4}


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("case", [c[0] if c[0] in _FAST_MODEL_CASES else pytest.param(c[0], marks=pytest.mark.slow)
                                  for c in MODEL_CASES])
def test_partition_auto_refuses_a_bad_cost_model_in_one_line(case: str, example_model: Path,
                                                              tmp_path: Path) -> None:
    model = _model_file(tmp_path, case)
    out = tmp_path / "auto"
    r = cli(["partition", example_model, "-s", "auto", "--cost-model", model, "-o", out, "-q"])
    msg = assert_user_error(r, 5)
    assert "smallest feasible budget" not in msg
    assert not out.exists()
    FUZZ_STATS["cases:numbers-cost-model"] += 1


#: the file-level cases (not the predictions) through the other readers of a cost model
READER_CASES = ["term-to_json", "coef-str", "provenance-list", "accuracy-list", "known-issues-dict", "fit_error-str",
                "components-list"]


@pytest.mark.slow  # reads the shared profile (an ONNX Runtime profiling run)
@pytest.mark.parametrize("case", READER_CASES)
def test_report_and_profile_against_refuse_a_bad_cost_model(case: str, split_plan: Path, profile: Path,
                                                            tmp_path: Path) -> None:
    model = _model_file(tmp_path, case)
    r = cli(["profile", "--show", profile, "--against", model])
    assert_user_error(r, 5)
    r = cli(["report", split_plan, profile, "--cost-model", model, "-o", tmp_path / "r.html", "-q"])
    assert_user_error(r, 5)
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "r_files").exists()
    FUZZ_STATS["cases:numbers-cost-model"] += 2


# -- drift: NaN is never zero drift --------------------------------------------------------------


def _step(values: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[tuple[str, int], dict[str, np.ndarray]]]:
    return values["latent"], {("cond", 0): {"out": values["block"]}}


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["latent-got", "latent-ref", "block-got", "block-ref"])
def test_drift_rows_carry_non_finite_counts_and_refuse_an_accuracy_table(where: str, bad: str) -> None:
    rng = np.random.default_rng(0)
    ref = {"latent": rng.standard_normal((1, 4, 4)).astype(np.float32),
           "block": rng.standard_normal((1, 8)).astype(np.float32)}
    got = {k: v.copy() for k, v in ref.items()}
    clean = {k: v.copy() for k, v in ref.items()}
    side = got if where.endswith("got") else ref
    side[where.split("-")[0]].flat[3] = float(bad)
    rows = compare_step("split", 0, _step(ref), _step(got)) + compare_step("fused", 0, _step(clean), _step(clean))
    hit = [r for r in rows if r.plan == "split" and (r.kind == LATENT) == where.startswith("latent")]
    assert hit and hit[0].nonfinite == 1 and math.isnan(hit[0].cosine)  # never cosine 1, MSE 0
    assert nonfinite_rows(rows) == hit
    assert "nan" in render(rows).lower()
    with pytest.raises(GateError, match="NaN/Inf"):
        accuracy_from_drift(rows, {"split": "adaln=host,residual=host", "fused": "adaln=npu,residual=npu"})
    FUZZ_STATS["cases:numbers-drift"] += 1


# -- options with ranges a user could mean -------------------------------------------------------

OPTION_CASES: list[tuple[str, list[str]]] = [
    *((f"profile-seed{v}", ["profile", "{plan}", "--seed", v, "-o", "{tmp}/p.jsonl"]) for v in ("-1", "2**40", "x")),
    *((f"profile-threads{v}", ["profile", "{plan}", "--threads", v, "-o", "{tmp}/p.jsonl"]) for v in ("10000", "-1")),
    *((f"drift-seed{v}", ["drift", "{plan}", "--toolkit", "2.5.0", "--seed", v]) for v in ("-1", "99999999999")),
    *((f"drift-guidance{v}", ["drift", "{plan}", "--toolkit", "2.5.0", "--guidance", v])
      for v in ("nan", "inf", "-inf")),
    *((f"bundle-seed{v}", ["bundle", "{plan}", "-o", "{tmp}/b", "--seed", v]) for v in ("-1",)),
    *((f"bundle-max-abs-rel{v}", ["bundle", "{plan}", "-o", "{tmp}/b", "--max-abs-rel", v]) for v in ("nan", "inf")),
    *((f"bundle-min-cosine{v}", ["bundle", "{plan}", "-o", "{tmp}/b", "--min-cosine", v]) for v in ("nan",)),
    *((f"partition-budget{v}", ["partition", "-s", "auto", "--budget-mib", v, "-o", "{tmp}/a"])
      for v in ("inf", "nan", "-1", "0", "1e400")),
    *((f"generic-budget{v}", ["partition", "-s", "generic", "--budget-mib", v, "-o", "{tmp}/g"])
      for v in ("inf", "nan")),
    *((f"tune-budget{v}", ["tune", "{model}", "--budget-mib", v, "-o", "{tmp}/t"]) for v in ("inf", "nan")),
    *((f"tune-threads{v}", ["tune", "{model}", "--threads", v, "-o", "{tmp}/t"]) for v in ("10000",)),
    *((f"tune-max-error-ratio{v}", ["tune", "{model}", "--max-error-ratio", v, "-o", "{tmp}/t"])
      for v in ("nan", "inf", "0.5", "-1")),
    *((f"report-budget{v}", ["report", "{plan}", "--budget-mib", v, "-o", "{tmp}/r.html"]) for v in ("inf", "nan")),
    *((f"compile-timeout{v}", ["compile", "{plan}", "--toolkit", "2.3.0", "--timeout", v]) for v in ("nan", "inf")),
    *((f"prune-older{v}", ["cache", "prune", "--older-than", v, "--cache-dir", "{tmp}/c"]) for v in ("nan", "inf")),
]
#: sizes for ``cache prune --max-size``: refused by rkpart (one line, exit 2), not by click
SIZE_CASES = ["nanG", "infG", "-1G", "1e30T", "inf", "nan", "12X", ""]


@pytest.mark.parametrize("case", [c[0] for c in OPTION_CASES])
def test_absurd_numbers_are_refused_before_any_work(case: str, split_plan: Path, example_model: Path,
                                                    tmp_path: Path) -> None:
    args = [a.format(plan=split_plan, tmp=tmp_path, model=example_model) for a in dict(OPTION_CASES)[case]]
    assert_option_refused(args, tmp_path)
    FUZZ_STATS["cases:numbers-options"] += 1


@pytest.mark.parametrize("size", SIZE_CASES)
def test_cache_prune_max_size_must_be_a_finite_size(size: str, tmp_path: Path) -> None:
    r = cli(["cache", "prune", "--max-size", size, "--cache-dir", tmp_path / "c"])
    assert_user_error(r, 2, "size")
    FUZZ_STATS["cases:numbers-options"] += 1


# -- report: user strings are not mathtext; many rounds are summarised --------------------------

#: one case in the fast tier (matplotlib raised on it before), the others with the slow ones
MATHTEXT_NAMES = ["$\\undefinedmacro{x}$", *(pytest.param(n, marks=pytest.mark.slow)
                                             for n in ("p$x^2$", "$\\frac{a}{$", "a$b"))]


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("name", MATHTEXT_NAMES)
def test_report_draws_names_with_dollar_signs_literally(name: str, split_plan: Path, profile: Path,
                                                        tmp_path: Path) -> None:
    prof = tmp_path / f"{name}.jsonl"
    prof.write_bytes(profile.read_bytes())
    r = cli(["report", split_plan, prof, "-o", tmp_path / "r.html", "-q"])
    assert r.exit_code == 0, r.output
    assert name.replace("&", "&amp;").split("$")[0] in (tmp_path / "r.html").read_text()
    FUZZ_STATS["cases:numbers-report"] += 1


@pytest.mark.slow  # draws memory plots of many rounds
@pytest.mark.parametrize("rounds", [1, 5000, *(pytest.param(n, marks=pytest.mark.slow)
                                             for n in (plots.MAX_ROUNDS_DRAWN, plots.MAX_ROUNDS_DRAWN + 1))])
def test_memory_plot_summarises_many_rounds(rounds: int) -> None:
    keys = [("p", i) for i in range(rounds)] + [("q", 0)]
    drawn, notes = plots._summarised_rounds(keys)
    per_p = [k for k in drawn if k[0] == "p"]
    if rounds > plots.MAX_ROUNDS_DRAWN:
        assert per_p == [("p", 0), ("p", rounds // 2), ("p", rounds - 1)]
        assert f"of {rounds} measured rounds" in notes["p"]
    else:
        assert per_p == [("p", i) for i in range(rounds)] and "p" not in notes
    assert ("q", 0) in drawn
    rows = [{"profile": p, "round": rnd, "warmup": False, "t_start_s": 0.0, "t_end_s": 0.01, "pss_peak_kib": 1024,
             "device_pss_kib": 0} for p, rnd in keys]
    t0 = time.monotonic()
    png = plots.memory(rows, None)
    assert png is not None and png.startswith(b"\x89PNG")
    assert time.monotonic() - t0 < 30
    FUZZ_STATS["cases:numbers-report"] += 1


@pytest.mark.parametrize(("key", "value"), [("final_cosine", math.nan), ("final_mse", math.inf),
                                            ("final_max_abs", -math.inf), ("ratio", math.nan)])
def test_partition_refuses_an_accuracy_table_from_a_nan_run(key: str, value: float, example_model: Path,
                                                           tmp_path: Path) -> None:
    acc = json.loads((default_model_path().parent / "drift_anima_full.json").read_text())
    fam = sorted(acc["families"])[0]
    acc["families"][fam][key] = value
    f = tmp_path / "acc.json"
    f.write_text(json.dumps(acc))
    r = cli(["partition", example_model, "-s", "auto", "--accuracy", f, "-o", tmp_path / "auto", "-q"])
    assert_user_error(r, 2, "accuracy term")
    assert not (tmp_path / "auto").exists()
    FUZZ_STATS["cases:numbers-drift"] += 1


def test_run_json_is_strict_json_when_the_outputs_are_nan(tmp_path: Path) -> None:
    """A model whose outputs are NaN (Log of negative values): the gate fails with its documented
    exit code, and ``--json`` is still strict JSON (NaN metrics are ``null``, never a bare NaN)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Log", ["h"], ["y"], name="log")],
        "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])],
        initializer=[numpy_helper.from_array(np.eye(8, dtype=np.float32), "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "nan.onnx")
    plan = tmp_path / "plan"
    assert cli(["partition", tmp_path / "nan.onnx", "-s", "generic", "-o", plan, "-q"]).exit_code == 0
    r = cli(["run", plan, "--json"])
    assert r.exit_code == GateError.exit_code, r.output
    out = r.stdout

    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in --json output")

    d = json.loads(out, parse_constant=refuse)
    assert ": NaN" not in out and "Infinity," not in out
    assert None in [v for r in d.get("tensors", d.get("rows", [])) for v in (r.get("metrics") or r).values()] \
        or "null" in out  # the metrics that are not numbers are null
