"""``rkpart tune --backend rknn-sim --precisions fp16,int8``: the int8 twins are built and measured (issue 27 part 6).

The bundled example's split and fused plans: :func:`rkpart.tune.measure_precisions` calibrates
and builds each one's int8 twin with rknn-toolkit2 2.3.0 (the target's default) and measures
all four in the simulator; :func:`rkpart.tune.choose_auto` then chooses with that accuracy term
under a bound above and below the twins' measured drift (the shipped cost model, int8 figures
from the prior), and an int8 choice is calibrated and built before it is verified.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from rkpart.compile.precision import plan_precision
from rkpart.cost_model.model import default_model_path
from rkpart.plan.plan import Plan, load_plan
from rkpart.tune import ACCURACY_FILE, TuneConfig, choose_auto, measure_precisions

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]

SPLIT8, FUSED8 = "adaln=host,residual=host,precision=int8", "adaln=npu,residual=npu,precision=int8"


@pytest.fixture(scope="module")
def measured(plans: dict[str, tuple[Plan, Path]], tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> tuple[Path, dict[str, Path], dict[str, dict[str, float]]]:
    request.getfixturevalue("tk230")
    work = tmp_path_factory.mktemp("tune-precision")
    singles = {}
    for name in ("split", "fused"):
        singles[name] = work / "plans" / name
        shutil.copytree(plans[name][1], singles[name])
    config = TuneConfig(backend="rknn-sim", steps=1, precisions=("fp16", "int8"))
    from rkpart.cli_args import bundled_example

    _acc_file, drift = measure_precisions(bundled_example(), singles, work, config)
    return work, singles, drift


def test_every_plan_gets_a_built_int8_twin_and_a_measured_drift(
        measured: tuple[Path, dict[str, Path], dict[str, dict[str, float]]]) -> None:
    work, singles, drift = measured
    for name in singles:
        twin, _ = load_plan(work / "precision" / f"{name}@int8")
        assert plan_precision(twin) == "int8"  # every NPU stage built w8a8
        assert all(a.calibration_dataset for s in twin.npu_stages if (a := s.artifact("rknn")) is not None)
    acc = json.loads((work / ACCURACY_FILE).read_text())
    assert set(acc["families"]) == {"adaln=host,residual=host", "adaln=npu,residual=npu", SPLIT8, FUSED8}
    assert drift[SPLIT8]["ratio"] == acc["families"][SPLIT8]["ratio"]
    for fam, fp16 in ((SPLIT8, "adaln=host,residual=host"), (FUSED8, "adaln=npu,residual=npu")):
        d = acc["families"][fam]
        assert math.isfinite(d["ratio"]) and d["ratio"] > acc["families"][fp16]["ratio"]  # int8 drifts more
        assert d["final_cosine"] < acc["families"][fp16]["final_cosine"]
    # int8 never widens the default bound: without --max-error-ratio auto refuses every twin
    assert acc["default_max_ratio"] < min(acc["families"][f]["ratio"] for f in (SPLIT8, FUSED8))


def _choose(work: Path, singles: dict[str, Path], bound: float, out: str) -> tuple[Plan, Path]:
    from rkpart.cli_args import bundled_example

    config = TuneConfig(backend="rknn-sim", steps=1, precisions=("fp16", "int8"), max_error_ratio=bound)
    shutil.rmtree(work / "plans" / "auto", ignore_errors=True)
    auto_dir, _choices, rows, _folders = choose_auto(bundled_example(), work, default_model_path(), singles, config)
    assert rows[0].plan == "auto" and rows[0].predicted_s is not None
    shutil.copytree(auto_dir, work / out)
    return load_plan(work / out)


def test_auto_takes_int8_only_within_the_measured_bound_and_builds_it(
        measured: tuple[Path, dict[str, Path], dict[str, dict[str, float]]]) -> None:
    work, singles, drift = measured
    above = 2 * max(drift[SPLIT8]["ratio"], drift[FUSED8]["ratio"])
    plan, _ = _choose(work, singles, above, "auto-above")
    spec = plan.strategy["options"]["precision"]["stages"]
    assert spec and set(spec.values()) == {"int8"}
    # the choice was calibrated and built before verification: its chosen stages are int8 artifacts
    built = {s.id: a.precision for s in plan.npu_stages if (a := s.artifact("rknn")) is not None}
    assert {sid: built[sid] for sid in spec} == spec
    below = 0.5 * min(drift[SPLIT8]["ratio"], drift[FUSED8]["ratio"])
    plan, _ = _choose(work, singles, below, "auto-below")
    assert "int8" not in plan.strategy["options"]["precision"]["stages"].values()
    assert not any(s.artifact("rknn") for s in plan.npu_stages)  # fp16: nothing to build before verifying
