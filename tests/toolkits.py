"""Real rknn-toolkit2 installations for tests (one place for every test directory).

Toolkits are installed with rkpart's own installer into ``$RKPART_TEST_TOOLKITS_DIR`` (default
``~/.cache/rkpart/toolkits``) once per session and reused across sessions; a test needing a
version that cannot be installed is skipped with the installer's reason.
``$RKPART_TEST_TOOLKIT_VERSIONS`` (default ``2.3.0,2.3.2,2.5.0``) limits which versions the
session may use.  A test that gets a toolkit must be marked ``toolkit`` (checked: the fast tier
``-m "not slow and not toolkit and not export"`` must never build with a real toolkit).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rkpart.compile.toolkits import Toolkit, install_toolkit
from rkpart.errors import ToolkitError

VERSIONS = ("2.3.0", "2.3.2", "2.5.0")
#: fixtures that hand a test a real toolkit: a test using one must carry the ``toolkit`` marker
FIXTURES = frozenset({"tk230", "tk232", "tk250", "real_toolkits"})
#: seconds each version took to install (0 = already installed), printed in the terminal summary
INSTALL_TIMES: dict[str, float] = {}
#: the test being set up or run (set by tests/conftest.py), for the marker check in get_toolkit
CURRENT: dict[str, pytest.Item] = {}

_installed: dict[str, Toolkit | str] = {}


def toolkits_dir() -> Path:
    env = os.environ.get("RKPART_TEST_TOOLKITS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rkpart" / "toolkits"


def _allowed() -> set[str]:
    return {v.strip() for v in os.environ.get("RKPART_TEST_TOOLKIT_VERSIONS", ",".join(VERSIONS)).split(",")}


def get_toolkit(version: str) -> Toolkit:
    """Install (once) and return a real toolkit, or skip the calling test with the reason."""
    item = CURRENT.get("item")
    if item is not None and item.get_closest_marker("toolkit") is None:
        pytest.fail(f"{item.nodeid} uses rknn-toolkit2 {version} but is not marked @pytest.mark.toolkit",
                    pytrace=False)
    if version not in _allowed():
        pytest.skip(f"rknn-toolkit2 {version} not in RKPART_TEST_TOOLKIT_VERSIONS")
    if version not in _installed:
        t0 = time.monotonic()
        try:
            _installed[version] = install_toolkit(version, toolkits_dir())
        except ToolkitError as e:
            _installed[version] = str(e)
        INSTALL_TIMES[version] = time.monotonic() - t0
    got = _installed[version]
    if isinstance(got, str):
        pytest.skip(f"cannot install rknn-toolkit2 {version}: {got}")
    return got
