"""Models for the public-API tests: PyTorch exports of non-DiT transformers (built once)."""

from __future__ import annotations

from pathlib import Path

import pytest


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
