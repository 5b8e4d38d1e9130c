"""Toolkit environments: lookup, registration of an existing python, atomic installation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rkpart.compile.toolkits import (
    Toolkit,
    find_toolkit,
    find_torch_wheel,
    install_toolkit,
    list_toolkits,
    register_toolkit,
    toolkits_root,
)
from rkpart.errors import ToolkitError


def test_root_from_argument_env_or_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RKPART_TOOLKITS_DIR", str(tmp_path / "env"))
    assert toolkits_root() == tmp_path / "env"
    assert toolkits_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("RKPART_TOOLKITS_DIR")
    assert toolkits_root() == Path.home() / ".cache" / "rkpart" / "toolkits"


def test_missing_version_lists_what_is_installed(tmp_path: Path) -> None:
    want = r"2\.3\.0 is not installed .*installed: none.*rkpart toolkit install 2\.3\.0"
    with pytest.raises(ToolkitError, match=want):
        find_toolkit("2.3.0", tmp_path)
    with pytest.raises(ToolkitError, match="not a toolkit version"):
        find_toolkit("latest", tmp_path)


def test_python_without_toolkit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolkitError, match="has no rknn-toolkit2"):
        register_toolkit(sys.executable, tmp_path)
    assert list_toolkits(tmp_path) == []


def test_half_installed_directories_are_invisible(tmp_path: Path) -> None:
    (tmp_path / "2.3.0" / "venv").mkdir(parents=True)  # no toolkit.json: interrupted install
    (tmp_path / ".2.5.0.install.abc").mkdir()
    assert list_toolkits(tmp_path) == []


def test_torch_wheel_prefers_a_local_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"")
    monkeypatch.setenv("RKPART_WHEELS_DIR", str(tmp_path))
    assert find_torch_wheel("cp311") == str(wheel)
    assert find_torch_wheel("cp312").startswith(("/opt/wheels/", "torch==2.13.0"))


@pytest.mark.toolkit
def test_register_an_existing_python(tmp_path: Path, tk230: Toolkit) -> None:
    tk = register_toolkit(tk230.python, tmp_path / "tks", version="2.3.0")
    assert tk.version == "2.3.0" and not tk.managed
    assert [t.version for t in list_toolkits(tmp_path / "tks")] == ["2.3.0"]
    assert find_toolkit("2.3.0", tmp_path / "tks").python == tk230.python
    assert find_toolkit(str(tk230.python)).version == "2.3.0"  # a python path works directly
    with pytest.raises(ToolkitError, match="already set up"):
        register_toolkit(tk230.python, tmp_path / "tks")
    with pytest.raises(ToolkitError, match=r"has rknn-toolkit2 2\.3\.0, not 2\.5\.0"):
        register_toolkit(tk230.python, tmp_path / "other", version="2.5.0")


@pytest.mark.toolkit
def test_installed_toolkit_is_listed(tk230: Toolkit, toolkits_dir: Path) -> None:
    assert "2.3.0" in [t.version for t in list_toolkits(toolkits_dir)]
    assert tk230.managed and tk230.python.is_file()
    # installing again is a no-op
    assert install_toolkit("2.3.0", toolkits_dir) == tk230


@pytest.mark.slow
def test_failed_install_leaves_nothing_behind(tmp_path: Path) -> None:
    steps: list[str] = []
    with pytest.raises(ToolkitError, match=r"installing rknn-toolkit2==0\.0\.1 failed"):
        install_toolkit("0.0.1", tmp_path, progress=steps.append)
    assert steps[0].startswith("[1/5] creating venv")
    assert [p.name for p in tmp_path.iterdir()] == [".0.0.1.failed-install.log"]
    assert list_toolkits(tmp_path) == []
