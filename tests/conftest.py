"""Shared fixtures: the bundled example and partitioned plans of it (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.cli import bundled_example
from rkpart.partitioner.api import partition
from rkpart.partitioner.plan import Plan


@pytest.fixture(scope="session")
def example_model() -> Path:
    return bundled_example()


@pytest.fixture(scope="session")
def plans(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> dict[str, tuple[Plan, Path]]:
    """Plans of the bundled example by name: split, split_npu (AdaLN on NPU), fused."""
    root = tmp_path_factory.mktemp("plans")
    out: dict[str, tuple[Plan, Path]] = {}
    for name, strategy, opts in (
        ("split", "split", {}),
        ("split_npu", "split", {"adaln": "npu"}),
        ("fused", "fused", {}),
    ):
        folder = root / name
        out[name] = (partition(example_model, folder, strategy, **opts), folder)
    return out
