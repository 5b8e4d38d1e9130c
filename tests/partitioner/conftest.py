"""Fixtures for partitioner tests: real exports, built once per session under a tmp dir.

Exports need torch (and diffusers for the families); tests that use them are marked
``export`` and skip cleanly when the exporters are not importable.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from types import ModuleType

import pytest

from rkpart.plan.anonymize import anonymize_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "rkpart" / "data" / "anima_tiny.onnx"


def _need(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - an exporter that fails to import is a reason to skip, whatever it raises
        pytest.skip(f"{module} not importable: {type(e).__name__}: {e}")


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="session")
def anonymized_example(export_dir: Path) -> Path:
    return anonymize_file(EXAMPLE, export_dir / "anima_tiny_anon.onnx")


@pytest.fixture(scope="session")
def anima_exports(export_dir: Path) -> dict[str, Path]:
    """The tiny Anima architecture exported by the TorchScript and by the dynamo exporter."""
    _need("torch")
    from tests.models.anima import AnimaConfig
    from tests.models.anima_torch import export_dynamo, export_torchscript

    cfg = AnimaConfig.tiny()
    out = {"torchscript": export_torchscript(cfg, export_dir / "anima_ts.onnx")}
    _need("onnxscript")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["dynamo"] = export_dynamo(cfg, export_dir / "anima_dynamo.onnx")
    return out


@pytest.fixture(scope="session")
def families() -> ModuleType:
    _need("torch")
    _need("diffusers")
    from tests.models import diffusers_families

    return diffusers_families


@pytest.fixture(scope="session")
def family_cache(export_dir: Path) -> dict[tuple[str, bool], Path]:
    return {}


def export_family_cached(families: ModuleType, cache: dict[tuple[str, bool], Path], export_dir: Path,
                         name: str, dynamo: bool = False) -> Path:
    """Export ``name`` once per session (TorchScript or dynamo)."""
    key = (name, dynamo)
    if key not in cache:
        path = export_dir / f"{name}{'_dynamo' if dynamo else ''}.onnx"
        families.export_family(name, path, dynamo=dynamo)
        cache[key] = path
    return cache[key]
