"""``auto`` chooses int8 from a real measured drift table and real int8 builds (issue 27 part 6).

The bundled example: split and fused plans, the fused one calibrated and built int8 with
rknn-toolkit2 2.5.0, ``rkpart drift`` of the three in the simulator with ``--accuracy``; then
``partition --strategy auto --toolkit 2.5.0 --option precisions=fp16,int8`` (which calibrates
and builds its own int8 representative stages) just above and just below the measured int8
ratio, and ``compile PLAN --calibration CALIB`` of the int8 choice.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.plan.plan import Plan, load_plan

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]

FUSED8 = "adaln=npu,residual=npu,precision=int8"


def _ok(*args: str) -> str:
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def measured(plans: dict[str, tuple[Plan, Path]], tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> tuple[Path, dict[str, Any]]:
    """The accuracy term ``rkpart drift split/ fused/ fused-int8/ --accuracy`` writes, and its path."""
    request.getfixturevalue("tk250")
    root = tmp_path_factory.mktemp("auto-precision")
    split, fused, fused8 = root / "split", root / "fused", root / "fused8"
    shutil.copytree(plans["split"][1], split)
    shutil.copytree(plans["fused"][1], fused)
    shutil.copytree(plans["fused"][1], fused8)
    _ok("calibrate", str(fused8), "-o", str(root / "calib"), "-q")
    _ok("compile", str(fused8), "--toolkit", "2.5.0", "-q", "--precision", "int8", "--calibration",
        str(root / "calib"))
    acc = root / "acc.json"
    _ok("drift", str(split), str(fused), str(fused8), "--steps", "2", "--cfg", "--toolkit", "2.5.0", "--no-blocks",
        "--accuracy", str(acc), "-q")
    return acc, json.loads(acc.read_text())


def _auto(acc: Path, out: Path, bound: float, work: Path) -> tuple[Plan, dict[str, Any]]:
    text = _ok("partition", "--strategy", "auto", "--toolkit", "2.5.0", "--accuracy", str(acc), "--steps", "2",
               "--option", "precisions=fp16,int8", "--option", f"max_error_ratio={bound}",
               "--option", f"compile_dir={work}", "--explain", "--json", "--out", str(out), "--force", "-q")
    return load_plan(out)[0], json.loads(text)


def test_auto_picks_int8_only_within_the_measured_bound(measured: tuple[Path, dict[str, Any]],
                                                         tmp_path: Path) -> None:
    acc, term = measured
    ratio = term["families"][FUSED8]["ratio"]
    assert ratio > term["default_max_ratio"] >= 1  # int8 drifts more than any fp16 family, and never widens the floor
    work = tmp_path / "work"  # kept between both runs: the second takes every build from the cache

    plan, js = _auto(acc, tmp_path / "in", ratio * 1.05, work)
    (choice,) = js["auto"]["choices"]
    assert choice["candidate"] == "fused-x2@int8"
    (stage,) = plan.npu_stages
    assert plan.strategy["options"]["precision"] == {"stages": {stage.id: "int8"}}
    row = next(c for b in js["auto"]["blocks"] for c in b["candidates"]
               if c["candidate"] == "fused-x2@int8" and c["residency"] == choice["residency"])
    base = next(c for b in js["auto"]["blocks"] for c in b["candidates"]
                if c["candidate"] == "fused-x2" and c["residency"] == choice["residency"])
    # the int8 figures are an int8 build's own compiler tables (auto calibrated and built it itself)
    assert row["precision_source"] == "compiler" and row["device_source"] == "compiler"
    assert row["device_mib"] < base["device_mib"] and row["error_ratio"] == ratio
    assert "measured drift" in row["reason"] and "int8 build's compiler tables" in row["reason"]
    assert (work / "fused-x2.calib" / "calibration.json").is_file()

    # a plain `compile --calibration` builds what auto chose
    _ok("calibrate", str(tmp_path / "in"), "-o", str(tmp_path / "calib"), "-q")
    _ok("compile", str(tmp_path / "in"), "--toolkit", "2.5.0", "-q", "--calibration", str(tmp_path / "calib"))
    built = load_plan(tmp_path / "in")[0].npu_stages[0].artifact()
    assert built is not None and built.precision == "int8"

    plan, js = _auto(acc, tmp_path / "out", ratio * 0.95, work)
    (choice,) = js["auto"]["choices"]
    assert choice["candidate"] == "fused-x2" and plan.strategy["options"]["precision"] == {"stages": {}}
    assert any("bound" in ln and "fp16" in ln for ln in js["auto"]["precision"])
