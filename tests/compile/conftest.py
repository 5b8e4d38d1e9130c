"""Fixtures for compile tests: a FAKE toolkit (rkpart's own python running fake_worker.py).

Real toolkits (``tk230``, ``tk232``, ``tk250``, ``toolkits_dir``) come from tests/conftest.py and
tests/toolkits.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rkpart.compile.toolkits import Toolkit

FAKE_WORKER = Path(__file__).with_name("fake_worker.py")


@pytest.fixture
def fake_toolkit() -> Toolkit:
    """A "toolkit" that is rkpart's own python running tests/compile/fake_worker.py."""
    return Toolkit(version="fake", python=Path(sys.executable), managed=False)
