"""Absurd but finite numbers in the files rkpart and the board runner read (issue 31, third pass).

What broke before these bounds, found by mutating real files of the bundled example:

- cost model: a 1e308 coefficient made ``estimate`` print ``inf +- inf s`` (exit 0) or exit 1 with
  ``OverflowError``; a 1e300 device-memory constant made ``auto`` name a 300-digit "smallest
  feasible budget"; a 1e15 coefficient predicted 10^21 s a pass and was accepted; a string
  ``within_10`` / ``p90_ape`` / ``whole_plan_error.median_ape`` and a ``fitted_range`` of
  ``[0, 1e-320]`` were tracebacks (``ZeroDivisionError`` in ``auto``); a ``cfg_parallel.speedup`` of
  1e-320 printed "inf s per image";
- an accuracy term took a final cosine of 1e20 or a negative MSE;
- a run report (``report --run``) took a cosine of 1e300 and infinities, and a string or a 41-digit
  end-to-end metric was a traceback; a ``null`` (NaN) cosine was drawn as the smallest error;
- the bundle manifest's gate took ``min_cosine`` -1e300 and ``max_abs_rel`` 1e300 (every run
  "gate: PASS"); its ``denoise`` record's string guidance / shift / timestep scale was a
  traceback, a shift of 1e-320 or a timestep scale of 1e300 a NaN latent after the whole loop;
- a calibration manifest's ``steps: Infinity`` was an ``OverflowError``; a 1e300 max |activation|
  with no finding printed "fp16 range: ok ... largest |x| 1e+300".

Real commands (``CliRunner``) on the bundled example; the runner is a real bundle's own runner.py.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rkpart.cost_model.model import default_model_path
from rkpart.report import plots
from tests.hostile.models import FUZZ_STATS, assert_option_refused, assert_user_error, cli, fast_sample

Doc = dict[str, Any]


def _at(d: Doc, path: tuple[str, ...], value: Any) -> None:
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value


def _shipped() -> Doc:
    d: Doc = json.loads(default_model_path().read_text())
    return d


# -- cost models: estimate and auto ----------------------------------------------------------------

_DM = ("device_memory", "2.3.0")  # the toolkit the shipped calibration names: what both commands use
MODEL_CASES: dict[str, Callable[[Doc], None]] = {
    "coef-1e300": lambda d: _at(d, ("components", "infer", "terms", "all_macs"), 1e300),
    "coef-1e308-load": lambda d: _at(d, ("components", "load", "terms", "const"), 1e308),
    "coef-neg-1e300": lambda d: _at(d, ("components", "host", "terms", "const"), -1e300),
    "coef-41-digits": lambda d: _at(d, ("components", "infer", "terms", "all_macs"), 10**40),
    # under 2^53, but 10^21 s a pass: beyond any run
    "coef-1e15-infer": lambda d: _at(d, ("components", "infer", "terms", "all_macs"), 1e15),
    "coef-1e15-host": lambda d: _at(d, ("components", "host", "terms", "const"), 1e15),
    "device-mem-const-1e300": lambda d: _at(d, (*_DM, "terms", "const"), 1e300),
    "device-mem-const-2e15": lambda d: _at(d, (*_DM, "terms", "const"), 2e15),
    "device-mem-peak-1e308": lambda d: _at(d, (*_DM, "terms", "npu_peak16:4"), 1e308),
    "held-out-within-str": lambda d: _at(d, (*_DM, "fit_error", "held_out", "within_10"), "x"),
    "held-out-within-2": lambda d: _at(d, (*_DM, "fit_error", "held_out", "within_10"), 2.0),
    "held-out-p90-str": lambda d: _at(d, (*_DM, "fit_error", "held_out", "p90_ape"), "x"),
    "held-out-p90-1e300": lambda d: _at(d, (*_DM, "fit_error", "held_out", "p90_ape"), 1e300),
    "held-out-n-str": lambda d: _at(d, (*_DM, "fit_error", "held_out", "n"), "x"),
    "in-sample-ape-neg": lambda d: _at(d, ("components", "infer", "fit_error", "in_sample", "median_ape"), -5.0),
    "held-out-str": lambda d: _at(d, (*_DM, "fit_error", "held_out"), "x"),
    "whole-plan-ape-str": lambda d: _at(d, ("provenance", "whole_plan_error"), {"n": 3, "median_ape": "x"}),
    "whole-plan-ape-1e300": lambda d: _at(d, ("provenance", "whole_plan_error"), {"n": 3, "median_ape": 1e300}),
    "fitted-range-str": lambda d: _at(d, ("provenance", "fitted_range"), {"macs": [0, "x"]}),
    "fitted-range-reversed": lambda d: _at(d, ("provenance", "fitted_range"), {"macs": [10, 1]}),
    "latency-resolution-1e308": lambda d: _at(d, ("provenance", "latency_resolution", "relative"), 1e308),
    "latency-resolution-5": lambda d: _at(d, ("provenance", "latency_resolution", "relative"), 5),
    "dof-float": lambda d: _at(d, ("provenance", "degrees_of_freedom"), 1e300),
    "backends-int": lambda d: _at(d, ("provenance", "backends"), 5),
    "cfg-parallel-tiny": lambda d: _at(d, ("cfg_parallel",), {"speedup": 1e-320, "source": "x", "measured": {}}),
    "accuracy-ratio-1e300": lambda d: d["accuracy"]["families"][sorted(d["accuracy"]["families"])[0]]
    .__setitem__("ratio", 1e300),
    "accuracy-cosine-1e20": lambda d: d["accuracy"]["families"][sorted(d["accuracy"]["families"])[0]]
    .__setitem__("final_cosine", 1e20),
    "provenance-deep-1e300": lambda d: _at(d, ("provenance", "npu_infer", "leave_fused_out", "error_pct"), 1e300),
}


def _model_file(tmp: Path, case: str) -> Path:
    d = _shipped()
    MODEL_CASES[case](d)
    p = tmp / "model.json"
    p.write_text(json.dumps(d))
    return p


def _sane(msg: str) -> None:
    """The one line neither prints an overflowed figure nor contradicts itself."""
    assert "smallest feasible budget" not in msg
    for word in (" inf ", "= inf", "nan "):
        assert word not in msg.lower(), msg


@pytest.mark.parametrize("case", fast_sample(list(MODEL_CASES), 4))
def test_estimate_refuses_a_cost_model_with_absurd_numbers(case: str, split_plan: Path, tmp_path: Path) -> None:
    r = cli(["estimate", split_plan, "--cost-model", _model_file(tmp_path, case)])
    _sane(assert_user_error(r, 5))
    assert r.stdout == ""
    FUZZ_STATS["cases:numbers-files-cost-model"] += 1


@pytest.mark.parametrize("case", fast_sample(list(MODEL_CASES), 7))  # auto loads the model first: ~0.35 s a case
def test_auto_refuses_a_cost_model_with_absurd_numbers(case: str, example_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "auto"
    r = cli(["partition", example_model, "-s", "auto", "--cost-model", _model_file(tmp_path, case), "-o", out, "-q"])
    _sane(assert_user_error(r, 5))
    assert not out.exists()
    FUZZ_STATS["cases:numbers-files-cost-model"] += 1


@pytest.mark.slow  # builds a shared profile (ONNX Runtime) and a report with its plots
@pytest.mark.parametrize("case", ["coef-1e15-infer", "coef-1e15-host", "coef-1e300"])
def test_profile_against_and_report_refuse_predictions_beyond_any_run(case: str, split_plan: Path, profile: Path,
                                                                      tmp_path: Path) -> None:
    """``profile --against`` printed "3145728000000000000000.0000 s +1046211561961731859421331456.0 %"."""
    model = _model_file(tmp_path, case)
    r = cli(["profile", "--show", profile, "--against", model])
    _sane(assert_user_error(r, 5))
    r = cli(["report", split_plan, profile, "--cost-model", model, "-o", tmp_path / "r.html", "-q"])
    _sane(assert_user_error(r, 5))
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "r_files").exists()
    FUZZ_STATS["cases:numbers-files-cost-model"] += 2


def test_tiny_finite_coefficients_still_estimate(split_plan: Path, tmp_path: Path) -> None:
    """1e-320 (a subnormal) is a number >= 0 like any other: the model predicts, nothing overflows."""
    d = _shipped()
    for comp in (*d["components"].values(), *d["device_memory"].values()):
        comp["terms"] = {t: 1e-320 for t in comp["terms"]}
    p = tmp_path / "model.json"
    p.write_text(json.dumps(d))
    r = cli(["estimate", split_plan, "--cost-model", p, "--json"])
    assert r.exit_code == 0, r.output
    est = json.loads(r.stdout)
    secs = est["pipeline"]["seconds_per_image"]
    assert math.isfinite(secs) and 0 <= secs < 1.0


def test_a_fitted_range_ending_at_zero_is_no_division_by_zero(example_model: Path, tmp_path: Path) -> None:
    """``fitted_range`` ``[0, 1e-320]`` (a feature the fit only saw at 0): ``auto`` divided by its
    end (``ZeroDivisionError``); now a candidate past it is noted as extrapolated."""
    d = _shipped()
    d["provenance"]["fitted_range"] = {"macs": [0, 1e-320]}
    p = tmp_path / "model.json"
    p.write_text(json.dumps(d))
    r = cli(["partition", example_model, "-s", "auto", "--cost-model", p, "-o", tmp_path / "auto", "--explain"])
    assert r.exit_code == 0, r.output
    assert "beyond the fitted range" in r.stdout


def test_the_shipped_calibration_passes_its_own_bounds(split_plan: Path) -> None:
    r = cli(["estimate", split_plan])
    assert r.exit_code == 0, r.output
    assert "inf" not in r.stdout.split() and "nan" not in r.stdout.lower().split()


# -- accuracy terms (`partition -s auto --accuracy`) ------------------------------------------------


def _accuracy() -> Doc:
    d: Doc = json.loads((default_model_path().parent / "drift_anima_full.json").read_text())
    return d


def _fam(d: Doc) -> Doc:
    row: Doc = d["families"][sorted(d["families"])[0]]
    return row


ACCURACY_CASES: dict[str, Callable[[Doc], None]] = {
    "final-cosine-1.5": lambda d: _fam(d).__setitem__("final_cosine", 1.5),
    "final-cosine-1e20": lambda d: _fam(d).__setitem__("final_cosine", 1e20),
    "final-mse-negative": lambda d: _fam(d).__setitem__("final_mse", -1.0),
    "final-max-abs-1e300": lambda d: _fam(d).__setitem__("final_max_abs", 1e300),
    "ratio-1e300": lambda d: _fam(d).__setitem__("ratio", 1e300),
    "default-max-ratio-1e300": lambda d: d.__setitem__("default_max_ratio", 1e300),
    "min-cosine-1e300": lambda d: d.__setitem__("min_cosine", 1e300),
}


@pytest.mark.parametrize("case", fast_sample(list(ACCURACY_CASES), 7))
def test_auto_refuses_an_accuracy_term_with_absurd_numbers(case: str, example_model: Path, tmp_path: Path) -> None:
    acc = _accuracy()
    ACCURACY_CASES[case](acc)
    f = tmp_path / "acc.json"
    f.write_text(json.dumps(acc))
    out = tmp_path / "auto"
    r = cli(["partition", example_model, "-s", "auto", "--accuracy", f, "-o", out, "-q"])
    assert_user_error(r, 2, "accuracy term")
    assert not out.exists()
    FUZZ_STATS["cases:numbers-files-accuracy"] += 1


def test_a_cosine_rounded_past_one_is_still_an_accuracy_term(example_model: Path, tmp_path: Path) -> None:
    """A measured cosine of identical latents comes out as 1.0000000000000002: that is a cosine."""
    acc = _accuracy()
    _fam(acc)["final_cosine"] = 1.0000000000000002
    f = tmp_path / "acc.json"
    f.write_text(json.dumps(acc))
    r = cli(["partition", example_model, "-s", "auto", "--accuracy", f, "-o", tmp_path / "auto", "-q"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(("base_mse", "other_mse"), [(0.0, 1.0), (1e-30, 1e-12), (1.0, 1e-9)])
def test_drift_writes_no_accuracy_table_auto_would_refuse(base_mse: float, other_mse: float) -> None:
    """A baseline MSE of 0 (floored at 1e-30) made ratios of 10^30 that ``--accuracy`` then refused;
    a ratio under 5e-5 was rounded to 0.0, no ratio > 0."""
    from rkpart.cost_model.checks import check_accuracy, check_numbers
    from rkpart.cost_model.drift_accuracy import BASELINE, accuracy_from_drift
    from rkpart.errors import UserError
    from rkpart.profile.drift import LATENT, DriftRow

    rows = [DriftRow("split:a", 0, LATENT, None, 0.9999, 0.1, base_mse),
            DriftRow("fused:b", 0, LATENT, None, 0.9999, 0.1, other_mse)]
    fams = {"split:a": BASELINE, "fused:b": "adaln=npu,residual=npu"}
    ratio = max(other_mse, 1e-30) / max(base_mse, 1e-30)
    if ratio > 2**53:
        with pytest.raises(UserError, match="over 2\\^53"):
            accuracy_from_drift(rows, fams)
    else:
        acc = accuracy_from_drift(rows, fams)
        check_numbers("t", acc)
        check_accuracy("t", acc)
        assert acc["families"]["adaln=npu,residual=npu"]["ratio"] == pytest.approx(ratio, rel=1e-3)
    FUZZ_STATS["cases:numbers-files-accuracy"] += 1


# -- run reports (`report --run`) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_report(split_plan: Path) -> Doc:
    r = cli(["run", split_plan, "--per-stage", "--json"])
    assert r.exit_code == 0, r.output
    d: Doc = json.loads(r.stdout)
    return d


def _first_stage(d: Doc) -> Doc:
    sid = sorted(d["per_stage"])[0]
    m: Doc = d["per_stage"][sid][sorted(d["per_stage"][sid])[0]]
    return m


def _end_to_end(d: Doc) -> Doc:
    m: Doc = d["end_to_end"][sorted(d["end_to_end"])[0]]
    return m


RUN_CASES: dict[str, tuple[Callable[[Doc], Doc], str, Any]] = {
    "stage-cosine-1.5": (_first_stage, "cosine", 1.5),
    "stage-cosine-1e300": (_first_stage, "cosine", 1e300),
    "stage-cosine-inf": (_first_stage, "cosine", math.inf),
    "stage-max-abs-negative": (_first_stage, "max_abs", -1.0),
    "stage-max-abs-1e300": (_first_stage, "max_abs", 1e300),
    "stage-max-abs-41-digits": (_first_stage, "max_abs", 10**40),
    "stage-mse-1e300": (_first_stage, "mse", 1e300),
    "stage-nan-count-1.5": (_first_stage, "nan", 1.5),
    "stage-nan-count-negative": (_first_stage, "nan", -1),
    "end-cosine-str": (_end_to_end, "cosine", "x"),
    "end-max-abs-str": (_end_to_end, "max_abs", "x"),
    "end-max-abs-41-digits": (_end_to_end, "max_abs", 10**40),
    "end-mse-str": (_end_to_end, "mse", "x"),
    "end-cosine--1e300": (_end_to_end, "cosine", -1e300),
}


@pytest.mark.parametrize("case", fast_sample(list(RUN_CASES), 4))
def test_report_refuses_a_run_report_with_absurd_metrics(case: str, split_plan: Path, run_report: Doc,
                                                        tmp_path: Path) -> None:
    where, key, value = RUN_CASES[case]
    d = copy.deepcopy(run_report)
    where(d)[key] = value
    f = tmp_path / "run.json"
    f.write_text(json.dumps(d))
    r = cli(["report", split_plan, "--run", f, "-o", tmp_path / "r.html", "-q"])
    assert_user_error(r, 5, key)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    FUZZ_STATS["cases:numbers-files-run"] += 1


@pytest.mark.parametrize("value", [None, math.nan])
def test_a_nan_metric_is_drawn_as_the_worst_error_never_the_best(value: float | None) -> None:
    """``rkpart run --json`` writes a NaN metric as ``null``: the accuracy plot drew it as 1e-12."""
    rows = [{"run": "r", "stage": "a", "tensor": "t", "cosine": 0.999, "max_abs": 0.5},
            {"run": "r", "stage": "b", "tensor": "t", "cosine": value, "max_abs": value},
            {"run": "r", "stage": "c", "tensor": "t", "cosine": 1.0, "max_abs": 0.0}]
    one_minus, mx, bad = plots.accuracy_bars(rows)["r"]
    assert bad == [False, True, False]
    assert one_minus[1] == max(one_minus) == 2.0 and one_minus[1] > one_minus[0] > one_minus[2]
    assert mx[1] == max(mx) > mx[0] > mx[2]
    FUZZ_STATS["cases:numbers-files-run"] += 1


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations): a whole report with its plots
def test_report_takes_a_run_report_whose_outputs_were_nan(split_plan: Path, run_report: Doc,
                                                          tmp_path: Path) -> None:
    d = copy.deepcopy(run_report)
    m = _first_stage(d)
    m.update({"cosine": None, "max_abs": None, "mean_abs": None, "mse": None, "nan": 4})
    f = tmp_path / "run.json"
    f.write_text(json.dumps(d))
    r = cli(["report", split_plan, "--run", f, "-o", tmp_path / "r.html", "-q"])
    assert r.exit_code == 0, r.output
    assert r.stderr.strip() == ""


@pytest.mark.slow  # builds a shared profile (ONNX Runtime)
@pytest.mark.parametrize("budget", [1e300, math.inf, -1.0, 0, "x", True])
def test_report_refuses_a_plan_recording_an_absurd_budget(budget: Any, split_plan: Path, profile: Path,
                                                          tmp_path: Path) -> None:
    """The memory timeline drew the plan's budget line and the page said "the budget of inf MiB"."""
    plan = tmp_path / "plan"
    shutil.copytree(split_plan, plan)
    doc = json.loads((plan / "plan.json").read_text())
    doc["strategy"].setdefault("options", {})["budget_mib"] = budget
    (plan / "plan.json").write_text(json.dumps(doc))
    r = cli(["report", plan, profile, "-o", tmp_path / "r.html", "-q"])
    assert_user_error(r, 5, "budget_mib")
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "r_files").exists()
    FUZZ_STATS["cases:numbers-files-plan"] += 1


# -- the bundle's runner: manifest gate and denoise record ------------------------------------------


def _copy(bundle: Path, tmp: Path) -> Path:
    d = tmp / "b"
    shutil.copytree(bundle, d, symlinks=True)
    return d


def _loop(m: Doc) -> Doc:
    d: Doc = m["denoise"]
    return d


def _sched(m: Doc) -> Doc:
    d: Doc = m["denoise"].setdefault("scheduler", {})
    return d


MANIFEST_CASES: dict[str, tuple[Callable[[Doc], Doc], str, Any]] = {
    "gate-min-cosine--1e300": (lambda m: m.setdefault("gate", {}), "min_cosine", -1e300),
    "gate-min-cosine-2": (lambda m: m.setdefault("gate", {}), "min_cosine", 2.0),
    "gate-max-abs-rel-1e300": (lambda m: m.setdefault("gate", {}), "max_abs_rel", 1e300),
    "gate-max-abs-rel-negative": (lambda m: m.setdefault("gate", {}), "max_abs_rel", -1.0),
    "guidance-1e300": (_loop, "guidance", 1e300),
    "guidance-str": (_loop, "guidance", "4"),
    "shift-1e-320": (_sched, "shift", 1e-320),
    "shift-1e300": (_sched, "shift", 1e300),
    "shift-str": (_sched, "shift", "x"),
    "timestep-scale-1e300": (_sched, "timestep_scale", 1e300),
    "timestep-scale-zero": (_sched, "timestep_scale", 0),
    "timestep-scale-str": (_sched, "timestep_scale", "x"),
    "scheduler-list": (_loop, "scheduler", []),
    "context-unknown": (_loop, "context", ["no-such-tensor"]),
    "latent-unknown": (_loop, "latent", "no-such-tensor"),
}


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("runner: error: "), lines
    return lines[0]


@pytest.mark.parametrize("case", list(MANIFEST_CASES))
def test_runner_refuses_a_manifest_with_absurd_numbers(case: str, host_bundle: Path, runner_mod: ModuleType,
                                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(host_bundle, tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    where, key, value = MANIFEST_CASES[case]
    where(m)[key] = value
    (d / "manifest.json").write_text(json.dumps(m))
    latent = tmp_path / "latent.npy"
    for args in ([], ["--steps", "2", "--latent-out", str(latent)]):
        rc = runner_mod.main(["--bundle", str(d), *args])
        msg = _one_line(capsys.readouterr().err)
        assert rc == 2, msg
        assert key in msg
    assert not latent.exists()
    with pytest.raises(runner_mod.BundleError):
        runner_mod.Runner(d)
    FUZZ_STATS["cases:numbers-files-runner"] += 3


RUNNER_OPTION_CASES: dict[str, list[str]] = {
    "min-cosine-2": ["--min-cosine", "2"], "min-cosine--1e300": ["--min-cosine=-1e300"],
    "max-abs-rel-1e300": ["--max-abs-rel", "1e300"], "max-abs-rel-negative": ["--max-abs-rel", "-1"],
    "guidance-1e300": ["--steps", "1", "--guidance", "1e300"], "shift-1e-320": ["--steps", "1", "--shift", "1e-320"],
    "shift-1e300": ["--steps", "1", "--shift", "1e300"],
}


@pytest.mark.parametrize("case", list(RUNNER_OPTION_CASES))
def test_runner_refuses_absurd_gate_and_loop_options(case: str, host_bundle: Path, runner_mod: ModuleType,
                                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    latent = tmp_path / "latent.npy"
    rc = runner_mod.main(["--bundle", str(host_bundle), *RUNNER_OPTION_CASES[case], "--latent-out", str(latent)])
    msg = _one_line(capsys.readouterr().err)
    assert rc == 2, msg
    assert not latent.exists()
    FUZZ_STATS["cases:numbers-files-runner"] += 1


def test_runner_loop_in_range_still_runs(host_bundle: Path, runner_mod: ModuleType, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    latent = tmp_path / "latent.npy"
    rc = runner_mod.main(["--bundle", str(host_bundle), "--steps", "2", "--guidance", "1000", "--shift", "0.001",
                          "--latent-out", str(latent)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert latent.is_file()


OPTION_CASES: dict[str, list[str]] = {
    "drift-guidance-1e300": ["drift", "{plan}", "--toolkit", "2.5.0", "--guidance", "1e300"],
    "drift-shift-1e-320": ["drift", "{plan}", "--toolkit", "2.5.0", "--shift", "1e-320"],
    "bundle-guidance-1e300": ["bundle", "{plan}", "-o", "{tmp}/b", "--guidance", "1e300"],
    "bundle-shift-1e-320": ["bundle", "{plan}", "-o", "{tmp}/b", "--shift", "1e-320"],
    "bundle-max-abs-rel-1e300": ["bundle", "{plan}", "-o", "{tmp}/b", "--max-abs-rel", "1e300"],
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_what_the_runner_refuses_rkpart_refuses_when_writing_it(case: str, split_plan: Path, tmp_path: Path) -> None:
    """``bundle`` writes its --guidance / --shift / --max-abs-rel into the manifest: the same ranges."""
    out = tmp_path / "out"
    out.mkdir()
    args = [a.format(plan=split_plan, tmp=out) for a in OPTION_CASES[case]]
    assert_option_refused(args, out)
    FUZZ_STATS["cases:numbers-files-options"] += 1


# -- calibration manifests (`compile --calibration`) ------------------------------------------------


@pytest.fixture(scope="module")
def calibration(split_plan: Path) -> Path:
    out = split_plan.parent / "split.calib"
    r = cli(["calibrate", split_plan, "-o", out, "--samples", "2", "--steps", "1", "-q"])
    assert r.exit_code == 0, r.output
    return out


def _stage(m: Doc) -> Doc:
    s: Doc = m["stages"][0]
    return s


def _fp16(m: Doc) -> Doc:
    d: Doc = m["stages"][0]["fp16_range"]
    return d


def _range(m: Doc) -> Doc:
    d: Doc = m["stages"][0]["ranges"][0]
    return d


_OVERFLOW = {"stage": "s", "tensor": "t", "kind": "overflow", "absmax": 40000.0, "margin": 65504.0 / 40000.0}
CALIBRATION_CASES: dict[str, tuple[Callable[[Doc], Doc], str, Any]] = {
    "steps-inf": (lambda m: m, "steps", math.inf),
    "steps-1e300": (lambda m: m, "steps", 1e300),
    "samples-41-digits": (lambda m: m, "samples", 10**40),
    "seed-negative": (lambda m: m, "seed", -1),
    "cfg-number": (lambda m: m, "cfg", 1),
    "stage-samples-inf": (_stage, "samples", math.inf),
    "activations-1e300": (_fp16, "activations", 1e300),
    "absmax-1e300": (_fp16, "absmax", 1e300),
    "absmax-nan": (_fp16, "absmax", math.nan),
    "absmax-past-fp16-no-finding": (_fp16, "absmax", 1e38),
    "range-min-1e300": (_range, "min", -1e300),
    "range-max-inf": (_range, "max", math.inf),
    "range-min-over-max": (_range, "min", 1e30),
    "range-absmax-not-max": (_range, "absmax", 1e38),
    "finding-margin-inf": (_fp16, "findings", [{**_OVERFLOW, "margin": math.inf}]),
    "finding-margin-contradicts": (_fp16, "findings", [{**_OVERFLOW, "absmax": 1e38}]),
    "finding-kind-unknown": (_fp16, "findings", [{**_OVERFLOW, "kind": "fine"}]),
    "finding-underflow-share-2": (_fp16, "findings", [{**_OVERFLOW, "kind": "underflow", "margin": 2.0}]),
}


@pytest.mark.parametrize("case", fast_sample(list(CALIBRATION_CASES), 6))
def test_compile_refuses_a_calibration_with_absurd_numbers(case: str, split_plan: Path, calibration: Path,
                                                           tmp_path: Path) -> None:
    cal = tmp_path / "cal"
    shutil.copytree(calibration, cal)
    m = json.loads((cal / "calibration.json").read_text())
    where, key, value = CALIBRATION_CASES[case]
    where(m)[key] = value
    (cal / "calibration.json").write_text(json.dumps(m))
    plan = tmp_path / "plan"
    shutil.copytree(split_plan, plan)
    before = sorted(p.relative_to(plan).as_posix() for p in plan.rglob("*"))
    # refused before any toolkit runs: no build, nothing written into the plan
    r = cli(["compile", plan, "--toolkit", "2.5.0", "--precision", "int8", "--calibration", cal, "-q"])
    assert_user_error(r, 2, "calibration.json")
    assert sorted(p.relative_to(plan).as_posix() for p in plan.rglob("*")) == before
    FUZZ_STATS["cases:numbers-files-calibration"] += 1


def test_the_calibration_rkpart_wrote_passes_its_own_bounds(calibration: Path) -> None:
    from rkpart.compile.calibration import load_calibration, render

    text = render(load_calibration(calibration))
    assert "fp16 range" in text and "inf" not in text.split()
