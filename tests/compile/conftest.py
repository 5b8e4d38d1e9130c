"""Fixtures for compile tests: real toolkit installations (via rkpart's installer) and fakes.

Toolkits are installed into ``$RKPART_TEST_TOOLKITS_DIR`` (default ``~/.cache/rkpart/toolkits``)
once per session and reused across sessions; a test needing a version that cannot be
installed is skipped with the installer's reason.  ``$RKPART_TEST_TOOLKIT_VERSIONS``
(default ``2.3.0,2.3.2,2.5.0``) limits which versions the session may install.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rkpart.compile.toolkits import Toolkit, install_toolkit
from rkpart.errors import ToolkitError

FAKE_WORKER = Path(__file__).with_name("fake_worker.py")
INSTALL_TIMES: dict[str, float] = {}


def _toolkits_dir() -> Path:
    env = os.environ.get("RKPART_TEST_TOOLKITS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rkpart" / "toolkits"


def _allowed() -> set[str]:
    return {v.strip() for v in os.environ.get("RKPART_TEST_TOOLKIT_VERSIONS", "2.3.0,2.3.2,2.5.0").split(",")}


_installed: dict[str, Toolkit | str] = {}


def get_toolkit(version: str) -> Toolkit:
    """Install (once) and return a toolkit, or skip the calling test with the reason."""
    if version not in _allowed():
        pytest.skip(f"rknn-toolkit2 {version} not in RKPART_TEST_TOOLKIT_VERSIONS")
    if version not in _installed:
        t0 = time.monotonic()
        try:
            _installed[version] = install_toolkit(version, _toolkits_dir())
        except ToolkitError as e:
            _installed[version] = str(e)
        INSTALL_TIMES[version] = time.monotonic() - t0
    got = _installed[version]
    if isinstance(got, str):
        pytest.skip(f"cannot install rknn-toolkit2 {version}: {got}")
    return got


@pytest.fixture(scope="session")
def toolkits_dir() -> Path:
    return _toolkits_dir()


@pytest.fixture(scope="session")
def tk230() -> Toolkit:
    return get_toolkit("2.3.0")


@pytest.fixture(scope="session")
def tk232() -> Toolkit:
    return get_toolkit("2.3.2")


@pytest.fixture(scope="session")
def tk250() -> Toolkit:
    return get_toolkit("2.5.0")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The memory model lives in the user's cache dir; tests must not read or grow it.
    monkeypatch.setenv("RKPART_CACHE_DIR", str(tmp_path_factory.mktemp("rkpart-cache")))
    yield


@pytest.fixture
def fake_toolkit() -> Toolkit:
    """A "toolkit" that is rkpart's own python running tests/compile/fake_worker.py."""
    return Toolkit(version="fake", python=Path(sys.executable), managed=False)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if INSTALL_TIMES:
        parts = ", ".join(f"{v}: {t:.0f} s" for v, t in sorted(INSTALL_TIMES.items()))
        terminalreporter.write_line(f"rknn-toolkit2 installation (0 s = already installed): {parts}")
