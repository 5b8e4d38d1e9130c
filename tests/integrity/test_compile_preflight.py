"""``rkpart compile`` checks its target and RKNN config keys once, before any build (issue 13)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.compile.toolkits import Toolkit, find_toolkit
from rkpart.errors import ToolkitError, UserError
from tests.compile.conftest import FAKE_WORKER
from tests.compile.plans import tiny_plan
from tests.integrity.test_confinement import one_line_error, rkpart


def _real(version: str = "2.3.0") -> Toolkit:
    try:
        return find_toolkit(version)
    except ToolkitError as e:
        pytest.skip(f"rknn-toolkit2 {version} not installed: {e}")


def test_unknown_target_is_refused_before_any_build(tmp_path: Path) -> None:
    import sys

    fake = Toolkit(version="fake", python=Path(sys.executable), managed=False)  # FAKE: never started
    with pytest.raises(UserError, match="unknown target 'rk9999'"):
        compile_plan_report(tiny_plan(tmp_path), tmp_path, CompileOptions(fake, "rk9999", {}, worker=FAKE_WORKER))
    assert not (tmp_path / "rknn").exists()


@pytest.mark.toolkit
def test_bad_target_cli_one_line(tmp_path: Path, split_plan: Path) -> None:
    _real()
    t0 = time.monotonic()
    r = rkpart("compile", split_plan, "--toolkit", "2.3.0", "--target", "rk3598", "--cache-dir", tmp_path, "-q")
    one_line_error(r, 2, "unknown target 'rk3598'")
    assert time.monotonic() - t0 < 60
    assert not (split_plan / "rknn").exists()


@pytest.mark.toolkit
def test_bad_config_key_cli_one_line(tmp_path: Path, split_plan: Path) -> None:
    _real()
    t0 = time.monotonic()
    r = rkpart("compile", split_plan, "--toolkit", "2.3.0", "--config", "optimisation_level=2",
               "--cache-dir", tmp_path, "-q")
    one_line_error(r, 2, "'optimisation_level' is not accepted by RKNN.config", "optimization_level")
    assert time.monotonic() - t0 < 120
    assert not (split_plan / "rknn").exists()
