"""Plans and bundles of the tiny pipelines' exports, shared by the modules of tests/board (one session)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def board_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("board")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread (diffusers' reference): on the shared 2-core machine the default pool made tiny runs
    10-30x slower (tests/models/test_pipelines.py)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
