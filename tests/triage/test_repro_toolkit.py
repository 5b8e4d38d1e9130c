"""The issue's "must show", with the real rknn-toolkit2 2.3.0 / 2.3.2 / 2.5.0.

Starting from a block stage of the bundled example's ``fused`` plan (150 ops; 2.3.2
segfaults on it, 2.3.0 and 2.5.0 build it), ``rkpart repro`` reduces it to a handful of ops
that still segfault 2.3.2 and writes a standalone script that does so on its own.  And the
fused plan compiles completely with ``--toolkit 2.3.2 --fallback-toolkit 2.3.0``.

The repro run is a session fixture (about 3 minutes on two cores: 6 matrix builds and ~25
reduction builds of a few seconds each); the tests read its artifact folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.compile.toolkits import Toolkit
from rkpart.plan.plan import Plan, load_plan
from rkpart.targets.known_issues import match_log
from tests.toolkits import toolkits_dir

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]

MODEL = Path(__file__).parents[2] / "rkpart" / "data" / "anima_tiny.onnx"
VERSIONS = "2.3.0,2.3.2,2.5.0"


def _fused_plan(folder: Path) -> Plan:
    if not MODEL.is_file():
        pytest.skip("bundled example rkpart/data/anima_tiny.onnx is missing")
    from rkpart.pipeline import partition

    return partition(MODEL, folder, "fused")


@pytest.fixture(scope="session")
def repro_run(real_toolkits: dict[str, Toolkit], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    plan_dir = tmp_path_factory.mktemp("fused")
    plan = _fused_plan(plan_dir)
    block = next(s for s in plan.npu_stages if s.region == "block")
    out = tmp_path_factory.mktemp("repro") / "artifact"
    res = CliRunner().invoke(main, ["repro", str(plan_dir / block.file), "--toolkits", VERSIONS, "--max-time", "900",
                                    "-o", str(out), "--toolkits-dir", str(toolkits_dir()), "-q"])
    return {"exit_code": res.exit_code, "output": res.output, "out": out, "stage": block,
            "matrix": json.loads((out / "matrix.json").read_text()) if (out / "matrix.json").is_file() else None}


def _rows(matrix: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["version"]: r for r in matrix["rows"]}


def test_the_fused_block_stage_crashes_232_only(repro_run: dict[str, Any]) -> None:
    assert repro_run["exit_code"] == 0, repro_run["output"]
    assert repro_run["stage"].num_nodes > 100
    rows = _rows(repro_run["matrix"]["original"])
    assert rows["2.3.2"]["signal"] == "SIGSEGV" and rows["2.3.2"]["exit_code"] == 139
    assert rows["2.3.2"]["signature"] == "exnorm-fusion-segv"
    assert rows["2.3.0"]["kind"] == "ok" and rows["2.5.0"]["kind"] == "ok"
    for r in rows.values():  # the table's columns are measured
        assert r["wall_s"] > 0 and r["peak_rss_bytes"] > 0 and r["last_step"]
    # the printed table, like the write-up's
    assert "2.3.2    SIGSEGV (exit 139)" in repro_run["output"]


def test_reproducer_has_at_most_10_nodes_and_fails_only_with_232(repro_run: dict[str, Any]) -> None:
    out: Path = repro_run["out"]
    model = onnx.load(out / "reduced.onnx")
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert len(ops) <= 10, ops
    assert "LayerNormalization" in ops  # the AdaLN norm whose modulation gets fused
    m = repro_run["matrix"]
    rows = _rows(m["reduced"])
    assert rows["2.3.2"]["kind"] == "crash" and rows["2.3.2"]["signal"] == "SIGSEGV"
    assert rows["2.3.2"]["signature"] == "exnorm-fusion-segv"
    assert rows["2.3.0"]["kind"] == "ok" and rows["2.5.0"]["kind"] == "ok"
    assert m["reduced"]["verdict"] == "regression: builds with 2.3.0, fails with 2.3.2; fixed in 2.5.0"
    assert m["reduction"]["reduced_nodes"] == len(ops) and m["reduction"]["complete"]
    readme = (out / "README.md").read_text()
    assert f"# rknn-toolkit2 2.3.2: SIGSEGV (exit 139) in RKNN.build() on a {len(ops)}-node ONNX graph" in readme
    assert "Known issue `exnorm-fusion-segv`" in readme


def _run_script(script: Path, toolkit: Toolkit, tmp: Path) -> subprocess.CompletedProcess[str]:
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = str(home)  # device probes would write ~/.android
    return subprocess.run([str(toolkit.python), str(script)], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_generated_script_reproduces_the_crash_on_its_own(repro_run: dict[str, Any], real_toolkits: dict[str, Toolkit],
                                                          tmp_path: Path) -> None:
    # Only the script, in an empty folder: the model is embedded.
    script = tmp_path / "repro.py"
    shutil.copy(repro_run["out"] / "repro.py", script)
    crashed = _run_script(script, real_toolkits["2.3.2"], tmp_path)
    assert crashed.returncode == -signal.SIGSEGV, crashed.stderr[-2000:]  # exit status 139 in a shell
    assert "fuse_exnorm" in crashed.stdout + crashed.stderr
    built = _run_script(script, real_toolkits["2.3.0"], tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    assert "repro: build OK" in built.stdout


def test_fused_plan_compiles_with_fallback_and_says_why(real_toolkits: dict[str, Toolkit], tmp_path: Path) -> None:
    plan = _fused_plan(tmp_path / "plan")
    res = CliRunner().invoke(main, ["compile", str(tmp_path / "plan"), "--toolkit", "2.3.2", "--fallback-toolkit",
                                    "2.3.0", "--toolkits-dir", str(toolkits_dir()), "-q"])
    assert res.exit_code == 0, res.output
    compiled, folder = load_plan(tmp_path / "plan")
    assert len(compiled.npu_stages) == len(plan.npu_stages) >= 2
    for s in compiled.npu_stages:
        art = s.artifact()
        assert art is not None and (folder / art.file).is_file(), s.id  # every stage built
        # ... by the fallback, and the plan says why: the 2.3.2 crash
        assert art.toolkit == "2.3.0"
        assert art.fallback_reason is not None
        assert art.fallback_reason.startswith("compiler crashed: SIGSEGV (exit 139) in rknn-toolkit2 2.3.2")
        first = s.failures[0]
        assert first.toolkit == "2.3.2" and first.signal == "SIGSEGV"
        # the recorded log names the known issue
        log = (folder / first.log).read_text(errors="replace")
        sig = match_log(log, signal=first.signal, toolkit=first.toolkit)
        assert sig is not None and sig.id == "exnorm-fusion-segv"
    assert "(fallback)" in res.output
