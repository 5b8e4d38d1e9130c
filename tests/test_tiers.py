"""The test tiers police themselves: a test in the wrong tier fails (tests/conftest.py's rules).

Runs pytest on a throw-away copy of tests/conftest.py and tests/toolkits.py, so the rules are
checked as a session sees them, without adding a wrong test to this suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two pytest sessions in subprocesses

TESTS = Path(__file__).resolve().parent

CASES = '''
import pytest
from tests.toolkits import get_toolkit


def test_unmarked_fixture(tk230):
    pass


def test_unmarked_export(vit_onnx):
    pass
'''

RUNTIME = '''
import pytest
from tests.toolkits import get_toolkit


def test_unmarked_call():
    get_toolkit("2.3.0")


@pytest.mark.toolkit
def test_marked_call():
    get_toolkit("2.3.0")  # not among the allowed versions here: skipped
'''


def _pytest(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    tests = tmp_path / "tests"
    tests.mkdir(exist_ok=True)
    for name in ("__init__.py", "conftest.py", "toolkits.py"):
        shutil.copy(TESTS / name, tests / name)
    (tests / "test_cases.py").write_text(body)
    env = {**os.environ, "RKPART_TEST_TOOLKIT_VERSIONS": "none", "RKPART_TEST_TOOLKITS_DIR": str(tmp_path / "tk"),
           "PYTHONPATH": str(TESTS.parent)}  # this checkout's rkpart; "tests" is the copy (cwd comes first)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_tier_fixture_without_its_marker_fails_collection(tmp_path: Path) -> None:
    r = _pytest(tmp_path, CASES)
    assert r.returncode == 4, r.stdout + r.stderr  # pytest's usage error: nothing ran
    err = r.stderr + r.stdout
    assert "test_cases.py::test_unmarked_fixture uses tk230 but is not marked @pytest.mark.toolkit" in err
    assert "test_cases.py::test_unmarked_export uses vit_onnx but is not marked @pytest.mark.export" in err


def test_getting_a_toolkit_without_the_marker_fails_the_test(tmp_path: Path) -> None:
    r = _pytest(tmp_path, RUNTIME)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "test_unmarked_call uses rknn-toolkit2 2.3.0 but is not marked @pytest.mark.toolkit" in r.stdout
    assert "1 failed, 1 skipped" in r.stdout
    assert "rknn-toolkit2 2.3.0 not in RKPART_TEST_TOOLKIT_VERSIONS" in r.stdout
