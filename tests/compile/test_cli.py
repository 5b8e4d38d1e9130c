"""The compile and toolkit commands through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rkpart.commands.compile import compile_cmd, toolkit
from rkpart.compile.toolkits import Toolkit
from rkpart.errors import ToolkitError
from tests.compile.plans import adaln_crash_plan, tiny_plan


def test_toolkit_list_empty(tmp_path: Path) -> None:
    r = CliRunner().invoke(toolkit, ["list", "--toolkits-dir", str(tmp_path)])
    assert r.exit_code == 0 and "no toolkits in" in r.output


def test_compile_with_missing_toolkit_is_one_line(tmp_path: Path) -> None:
    tiny_plan(tmp_path / "p")
    r = CliRunner().invoke(compile_cmd, [str(tmp_path / "p"), "--toolkit", "2.3.0", "--toolkits-dir",
                                         str(tmp_path / "none")])
    assert r.exit_code == ToolkitError.exit_code
    assert r.output.count("\n") == 1 and r.output.startswith("rkpart: error: rknn-toolkit2 2.3.0 is not installed")


def test_bad_config_option_syntax(tmp_path: Path) -> None:
    tiny_plan(tmp_path / "p")
    r = CliRunner().invoke(compile_cmd, [str(tmp_path / "p"), "--toolkit", "2.3.0", "--config", "nokey"])
    assert r.exit_code == 2 and "expected key=value" in r.output


@pytest.mark.toolkit
def test_compile_json_and_rerun(tmp_path: Path, tk230: Toolkit, toolkits_dir: Path) -> None:
    tiny_plan(tmp_path)
    args = [str(tmp_path / "plan.json"), "--toolkit", "2.3.0", "--toolkits-dir", str(toolkits_dir),
            "--jobs", "2", "--opt-level", "3", "--json", "--quiet"]
    r = CliRunner().invoke(compile_cmd, args)
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert (data["built"], data["cached"], data["failed"]) == (3, 0, 0)
    assert data["stages"][1]["artifact"]["cpu_ops"] == ["Erf:ef"]
    r2 = CliRunner().invoke(compile_cmd, args[:-2])
    assert r2.exit_code == 0
    assert "3 NPU stage(s): 0 built, 3 cached, 0 failed" in r2.output
    assert "Erf:ef" in r2.output  # CPU ops column


@pytest.mark.toolkit
def test_compile_reports_a_segfault_and_exits_non_zero(tmp_path: Path, tk232: Toolkit,
                                                       toolkits_dir: Path) -> None:
    adaln_crash_plan(tmp_path)
    r = CliRunner().invoke(compile_cmd, [str(tmp_path), "--toolkit", "2.3.2", "--toolkits-dir", str(toolkits_dir)])
    assert r.exit_code == ToolkitError.exit_code
    assert "adaln: compiler crashed: SIGSEGV (exit 139) in rknn-toolkit2 2.3.2" in r.output
    assert "ffn    built" in r.output
    assert "building adaln" in r.output  # progress lines (stderr is mixed in by CliRunner)


@pytest.mark.toolkit
def test_compile_with_a_relative_plan_path(tmp_path: Path, tk230: Toolkit, toolkits_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # workers run in a disposable cwd: the plan folder must reach them as an absolute path
    tiny_plan(tmp_path / "rel")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(compile_cmd, ["rel", "--toolkit", "2.3.0", "--toolkits-dir", str(toolkits_dir),
                                         "--quiet", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["built"] >= 1 and summary["failed"] == 0, summary
