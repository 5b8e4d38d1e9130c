"""``rkpart.build``: the drop-in for an RKNN export script, and the example script in docs/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rkpart
from rkpart.dropin import choose_strategy
from rkpart.plan.plan import load_plan

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "export_with_rkpart.py"

pytestmark = pytest.mark.export  # every test builds from torch exports of a ViT / post-norm encoder


def test_default_strategy_is_split_for_dit_and_generic_otherwise(example_model: Path, vit_onnx: Path,
                                                                 postnorm_onnx: Path) -> None:
    assert choose_strategy(example_model) == ("split", "2 DiT blocks with AdaLN found")
    assert choose_strategy(vit_onnx) == ("generic", "4 blocks found, none with AdaLN")
    assert choose_strategy(postnorm_onnx) == ("generic", "4 blocks found, none with AdaLN")


@pytest.mark.parametrize(("config", "kwargs", "message"), [
    ({"mean_values": [[0, 0, 0]], "std_values": [[255, 255, 255]]}, {},
     "config std_values=[[255, 255, 255]] normalises the model inputs"),
    ({}, {"do_quantization": True}, "do_quantization=True needs dataset="),
    ({}, {"toolkit": "9.9.9"}, "rknn-toolkit2 9.9.9 is not installed"),
])
def test_refusals_are_one_line_user_errors(vit_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           config: dict[str, Any], kwargs: dict[str, Any],
                                           message: str) -> None:
    monkeypatch.setenv("RKPART_TOOLKITS_DIR", str(tmp_path / "no-toolkits"))
    with pytest.raises(rkpart.UserError) as e:
        rkpart.build(vit_onnx, tmp_path / "out", config={"target_platform": "rk3588", **config}, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)
    if "toolkit" not in kwargs:
        assert not (tmp_path / "out").exists()  # refused before anything was written


def test_identity_normalisation_is_accepted(vit_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # identity mean/std pass the config check and get as far as looking for the toolkit
    monkeypatch.setenv("RKPART_TOOLKITS_DIR", str(tmp_path / "no-toolkits"))
    with pytest.raises(rkpart.UserError, match=r"rknn-toolkit2 2\.3\.0 is not installed"):
        rkpart.build(vit_onnx, tmp_path / "out", config={"mean_values": [[0, 0, 0]], "std_values": [[1, 1, 1]]},
                     budget_mib=0.3)
    plan, _ = load_plan(tmp_path / "out")
    assert plan.strategy["name"] == "generic" and len(plan.npu_stages) == 3


@pytest.mark.toolkit
@pytest.mark.slow
def test_example_export_script_builds_every_part(vit_onnx: Path, tmp_path: Path) -> None:
    from tests.toolkits import get_toolkit, toolkits_dir

    get_toolkit("2.3.0")  # installs it once (about a minute) or skips with the installer's reason
    env = {**os.environ, "RKPART_TOOLKITS_DIR": str(toolkits_dir()), "RKPART_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "vit_rknn"
    res = subprocess.run([sys.executable, str(EXAMPLE), str(vit_onnx), "--out", str(out), "--budget-mib", "0.3"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert lines[0] == "strategy: generic (4 blocks found, none with AdaLN)"
    plan, folder = load_plan(out)
    assert [ln.split(":")[0] for ln in lines[1:-1]] == [s.id for s in plan.npu_stages] == ["seg00", "seg01", "seg02"]
    for s, line in zip(plan.npu_stages, lines[1:-1], strict=True):
        art = s.artifact("rknn")
        assert art is not None and art.toolkit == "2.3.0" and art.target == "rk3588"
        path = Path(line.split(": ", 1)[1])
        assert path == folder / art.file and path.stat().st_size == art.size_bytes > 0
    from rkpart.compile.cache import config_hash

    # built with the script's RKNN.config arguments (optimization_level=3 is the default)
    assert {s.artifact("rknn").config_hash for s in plan.npu_stages} == {  # type: ignore[union-attr]
        config_hash({"target_platform": "rk3588", "optimization_level": 3})}

    # the parts, chained on the toolkit's simulator, still compute the model (fp16 on the NPU)
    run = subprocess.run([sys.executable, "-m", "rkpart.cli", "run", str(out), "--backend", "rknn-sim",
                          "--toolkit", "2.3.0", "-q"], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gate: PASS" in run.stdout
