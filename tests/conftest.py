"""Shared fixtures: the bundled example, plans of it, PyTorch exports of non-DiT transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.cli import bundled_example
from rkpart.partitioner.plan import Plan
from rkpart.pipeline import partition


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


@pytest.fixture(scope="session")
def vit_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from tests.api.vit import export_vit

    return export_vit(tmp_path_factory.mktemp("vit") / "vit.onnx")


@pytest.fixture(scope="session")
def postnorm_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from tests.api.vit import export_postnorm

    return export_postnorm(tmp_path_factory.mktemp("postnorm") / "postnorm.onnx")
