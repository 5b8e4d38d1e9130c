"""Fixtures: an Anima-shaped model at full width and 512 px (2 blocks, fp16, external data)."""

from __future__ import annotations

import pytest

from rkpart.discovery.structure import Discovery, discover
from rkpart.ir import ModelGraph, load_model
from tests.models.anima import AnimaConfig, build_anima_onnx


@pytest.fixture(scope="session")
def anima512(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelGraph, Discovery]:
    """Two full-size Anima blocks at 512 px (1024 image tokens): features are per block, so two
    blocks are enough to show per-block choices and runs of fused blocks (~20 s to build)."""
    path = tmp_path_factory.mktemp("anima512") / "anima_512_2blocks.onnx"
    build_anima_onnx(AnimaConfig.full(512).replace(num_blocks=2), path, external_data=True)
    mg = load_model(path)
    return mg, discover(mg)
