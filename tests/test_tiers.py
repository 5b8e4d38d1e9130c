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


WORKERS = '''
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def worker():
    return os.environ["PYTEST_XDIST_WORKER"]


@pytest.mark.parametrize("i", range(8))
def test_case(i, worker):
    (Path(os.environ["OUT"]) / f"{i}-{worker}").touch()
'''


def _pytest(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    tests = tmp_path / "tests"
    tests.mkdir(exist_ok=True)
    for name in ("__init__.py", "conftest.py", "toolkits.py"):
        shutil.copy(TESTS / name, tests / name)
    (tests / "test_cases.py").write_text(body)
    env = {**os.environ, "RKPART_TEST_TOOLKIT_VERSIONS": "none", "RKPART_TEST_TOOLKITS_DIR": str(tmp_path / "tk"),
           "PYTHONPATH": str(TESTS.parent),  # this checkout's rkpart; "tests" is the copy (cwd comes first)
           "OUT": str(tmp_path)}  # where WORKERS' tests record the worker that ran them
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args, "tests"],
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


def test_spread_modules_exist() -> None:
    from tests.conftest import _SPREAD

    assert _SPREAD
    for module in _SPREAD:
        assert (TESTS.parent / module).is_file(), module  # a renamed module would silently stay whole


def _workers_used(tmp_path: Path, body: str) -> set[str]:
    """Runs the copied suite with scripts/test.sh's options on two workers; the workers WORKERS' 8 tests ran on."""
    r = _pytest(tmp_path, body, "-n", "2", "--dist", "loadscope")
    assert r.returncode == 0, r.stdout + r.stderr
    ran = sorted(p.name for p in tmp_path.iterdir() if "-gw" in p.name)
    assert len(ran) == 8, ran
    return {name.split("-")[1] for name in ran}


def test_under_xdist_a_module_runs_whole_on_one_worker(tmp_path: Path) -> None:
    # its module fixture is built once, not once per worker
    assert len(_workers_used(tmp_path, WORKERS)) == 1


def test_under_xdist_a_spread_module_runs_on_every_worker(tmp_path: Path) -> None:
    (tmp_path / "tests" / "docs").mkdir(parents=True)
    (tmp_path / "tests" / "docs" / "__init__.py").touch()
    (tmp_path / "tests" / "docs" / "test_docs_run.py").write_text(WORKERS)  # a module named in _SPREAD
    assert _workers_used(tmp_path, "") == {"gw0", "gw1"}
