"""The CFG-parallel speed-up a cost model carries (``rkpart tune --backend rknnlite --cfg-parallel``).

A model without one uses the documented prior; one with a measured speed-up uses that, in
``auto --cfg-parallel`` and ``rkpart estimate``; a model file whose speed-up is no measurement
(NaN, zero, above two cores' worth) is refused in one line.  The measurement itself runs on the
FAKE RKNNLite in ``tests/bundle/test_denoise.py``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from rkpart.cost_model.estimate import estimate_plan
from rkpart.cost_model.model import CfgParallel, CostModel, default_model_path
from rkpart.cost_model.npu_time import CFG_PARALLEL_SOURCE, CFG_PARALLEL_SPEEDUP, cfg_parallel_speedup
from rkpart.errors import SpecError
from tests.hostile.models import assert_user_error, cli


def _with(tmp_path: Path, cp: object) -> Path:
    doc = json.loads(default_model_path().read_text())
    doc["cfg_parallel"] = cp
    p = tmp_path / "model.json"
    p.write_text(json.dumps(doc))
    return p


def test_a_model_without_a_measurement_uses_the_prior_and_the_shipped_file_is_unchanged(tmp_path: Path) -> None:
    m = CostModel.load(default_model_path())
    assert m.cfg_parallel is None
    assert cfg_parallel_speedup(m) == (CFG_PARALLEL_SPEEDUP, CFG_PARALLEL_SOURCE)
    assert m.dumps() == default_model_path().read_text()  # no new key in the shipped file


def test_a_measured_speedup_round_trips_and_replaces_the_prior_in_estimate(tmp_path: Path,
                                                                          plans: dict) -> None:
    measured = CfgParallel(speedup=1.41, source="measured: test",
                           measured={"sequential_s": [2.0], "parallel_s": [1.42]})
    m = CostModel.load(default_model_path())
    m.cfg_parallel = measured
    p = tmp_path / "m.json"
    m.save(p)
    back = CostModel.load(p)
    assert back.cfg_parallel == measured
    assert cfg_parallel_speedup(back) == (1.41, "measured: test")
    plan, folder = plans["split"]
    prior = estimate_plan(plan, folder, CostModel.load(default_model_path()), steps=2)
    got = estimate_plan(plan, folder, back, steps=2)
    assert prior.cfg_parallel is not None and got.cfg_parallel is not None
    assert got.cfg_parallel["speedup"] == 1.41 and prior.cfg_parallel["speedup"] == CFG_PARALLEL_SPEEDUP
    # the NPU inference is divided by the speed-up: a smaller one gives a slower image
    assert got.cfg_parallel["seconds_per_image"] > prior.cfg_parallel["seconds_per_image"]
    assert got.seconds_per_image == prior.seconds_per_image  # the sequential figure does not use it


@pytest.mark.parametrize("bad", [{"speedup": math.nan, "source": "x"}, {"speedup": 0, "source": "x"},
                                 {"speedup": 4.0, "source": "x"}, {"speedup": "2", "source": "x"},
                                 {"speedup": True, "source": "x"}, {"speedup": 1.5}, [1.5],
                                 {"speedup": 1.5, "source": "x", "measured": []}])
def test_a_speedup_that_is_no_measurement_is_refused_in_one_line(bad: object, tmp_path: Path,
                                                                 plans: dict) -> None:
    p = _with(tmp_path, bad)
    with pytest.raises(SpecError, match="cfg_parallel"):
        CostModel.load(p)
    r = cli(["estimate", plans["split"][1], "--cost-model", p])
    assert_user_error(r, 5, "cfg_parallel")


@pytest.mark.parametrize(("argv", "named"), [
    (["--cfg-parallel"], "--cfg-parallel"), (["--cfg-parallel", "--backend", "rknn-sim"], "--cfg-parallel"),
    (["--cfg-parallel", "--backend", "rknnlite", "--no-cfg"], "--cfg-parallel"),
    # int8's cost is its drift, measured in the toolkit's simulator: refused on the other backends
    (["--precisions", "fp16,int8"], "--precisions int8"),
    (["--precisions", "fp16,int8", "--backend", "rknnlite"], "--precisions int8"),
])
def test_tune_refuses_a_measurement_its_backend_cannot_make(argv: list[str], named: str, tmp_path: Path) -> None:
    from rkpart.cli_args import bundled_example

    model = tmp_path / "m.onnx"
    shutil.copyfile(bundled_example(), model)
    r = cli(["tune", model, "-o", tmp_path / "work", "-q", *argv])
    assert_user_error(r, 2, named)
    assert not (tmp_path / "work").exists()  # refused before anything is written


def test_tune_int8_twin_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    """``work/precision/split@int8`` planted as a symlink to a folder of the user's: the twin is
    written like every plan tune writes (``partition``), so it is refused and the folder untouched."""
    from rkpart.cli_args import bundled_example
    from rkpart.errors import OutputExistsError
    from rkpart.tune import TuneConfig, measure_precisions

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    work = tmp_path / "work"
    (work / "precision").mkdir(parents=True)
    (work / "precision" / "split@int8").symlink_to(theirs)
    config = TuneConfig(backend="rknn-sim", precisions=("fp16", "int8"))
    with pytest.raises(OutputExistsError, match="symlink"):
        measure_precisions(bundled_example(), {"split": tmp_path / "unused"}, work, config)
    assert [p.name for p in theirs.iterdir()] == ["keep.txt"] and (theirs / "keep.txt").read_text() == "mine"
