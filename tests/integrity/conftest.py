"""Fixtures for the integrity tests (issue 13): small real models and plans, no toolkit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.hostile.conftest import bundled, fused_mini_plan, mini_model  # noqa: F401 - shared fixtures
from tests.hostile.models import cli, mini_dit
from tests.triage.conftest import adaln_chain, fake_toolkits_dir  # noqa: F401 - shared fixtures


@pytest.fixture(scope="session")
def ext_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mini DiT with its weights in an external data file; read-only."""
    return mini_dit(tmp_path_factory.mktemp("ext") / "mini.onnx", external_data=True)


@pytest.fixture
def ext_copy(tmp_path: Path, ext_model: Path) -> Path:
    """A private copy of ``ext_model`` (and its data files) a test may change."""
    d = tmp_path / "model"
    shutil.copytree(ext_model.parent, d)
    return d / ext_model.name


@pytest.fixture(scope="session")
def split_plan(tmp_path_factory: pytest.TempPathFactory, ext_model: Path) -> Path:
    """A split plan of ``ext_model`` (stages with external data); read-only: copy it first."""
    out = tmp_path_factory.mktemp("split-ext") / "plan"
    r = cli(["partition", ext_model, "-o", out, "-s", "split", "-q"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def plan_copy(tmp_path: Path, split_plan: Path) -> Path:
    d = tmp_path / "plan"
    shutil.copytree(split_plan, d)
    return d
