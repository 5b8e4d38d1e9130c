"""The test tiers police themselves: a test in the wrong tier fails (tests/conftest.py's rules).

Runs pytest on a throw-away copy of tests/conftest.py and tests/toolkits.py, so the rules are
checked as a session sees them, without adding a wrong test to this suite.  And README's tier block
(written by ``scripts/tiers.py``) states the fast tier's collected count and a measured run.
"""

from __future__ import annotations

import importlib.util
import json
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


#: run with a stand-in toolkit environment installed (a marker naming this python, no rknn-toolkit2)
ENVIRONMENT = '''
import os

import pytest

from rkpart.compile.toolkits import find_toolkit, list_toolkits
from rkpart.errors import ToolkitError


def test_unmarked_default_folder():
    find_toolkit("2.3.0")


def test_unmarked_named_folder():
    find_toolkit("2.3.0", os.environ["INSTALLED"])


def test_unmarked_sees_no_toolkit():
    assert list_toolkits() == []
    with pytest.raises(ToolkitError, match="2.5.0 is not installed"):
        find_toolkit("2.5.0")


@pytest.mark.toolkit
def test_marked():
    assert find_toolkit("2.3.0").version == "2.3.0"
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


def _pytest(tmp_path: Path, body: str, *args: str, **env_vars: str) -> subprocess.CompletedProcess[str]:
    tests = tmp_path / "tests"
    tests.mkdir(exist_ok=True)
    for name in ("__init__.py", "conftest.py", "toolkits.py"):
        shutil.copy(TESTS / name, tests / name)
    (tests / "test_cases.py").write_text(body)
    env = {**os.environ, "RKPART_TEST_TOOLKIT_VERSIONS": "none", "RKPART_TEST_TOOLKITS_DIR": str(tmp_path / "tk"),
           "PYTHONPATH": str(TESTS.parent),  # this checkout's rkpart; "tests" is the copy (cwd comes first)
           "OUT": str(tmp_path),  # where WORKERS' tests record the worker that ran them
           **env_vars}
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


def test_an_unmarked_test_reading_an_installed_toolkit_fails(tmp_path: Path) -> None:
    installed = tmp_path / "installed"
    (installed / "2.3.0").mkdir(parents=True)
    # a stand-in environment: the marker rkpart reads to resolve a toolkit, naming this python
    (installed / "2.3.0" / "toolkit.json").write_text(json.dumps({"version": "2.3.0", "python": sys.executable}))
    r = _pytest(tmp_path, ENVIRONMENT, RKPART_TOOLKITS_DIR=str(installed), INSTALLED=str(installed))
    assert r.returncode == 1, r.stdout + r.stderr
    why = f"uses the rknn-toolkit2 environment {installed / '2.3.0'} but is not marked @pytest.mark.toolkit"
    assert f"test_unmarked_default_folder {why}" in r.stdout  # its default folder is an empty one
    assert f"test_unmarked_named_folder {why}" in r.stdout
    assert "2 failed, 2 passed" in r.stdout  # the unmarked test that installs nothing and the marked one pass


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


def _tiers():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("tiers", TESTS.parent / "scripts" / "tiers.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_tier_block_states_the_collected_count_and_a_measured_run(tmp_path: Path) -> None:
    tiers = _tiers()
    text = (TESTS.parent / "README.md").read_text()
    block = tiers.block(text)
    stated = tiers.COUNT.search(block)
    assert stated is not None, block
    collected = tiers.collect_count(tiers.hermetic_env(tmp_path / "home"))
    assert int(stated.group("tests")) == collected, (
        f"README says the fast tier holds {stated.group('tests')} tests, pytest collects {collected}: "
        "run `python scripts/tiers.py` (or `--count`)")
    run = tiers.timing(text)
    assert run is not None, block  # written by a run of the script, not by hand
    assert float(run.group("cpu")) > 0 and float(run.group("wall")) > 0
    assert block == tiers.render(collected, run.group(0))  # the script's words, nothing edited in
