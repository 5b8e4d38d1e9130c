"""Tiny diffusers family exports for the compile tests, cached across runs.

Cached under ``$RKPART_TEST_EXPORTS`` (default ``~/.cache/rkpart/test-exports``), keyed by the
diffusers and torch versions, the exporter, and the source of the family's config and of the
export function, so a rerun skips the exporter and any change makes a new export.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: exporter -> opset passed to export_family (0: the exporter's own default, 20 for dynamo in torch 2.13)
EXPORTERS = {"torchscript": 17, "dynamo": 0}


def _families() -> ModuleType:
    for dep in ("torch", "diffusers", "onnxscript"):
        if importlib.util.find_spec(dep) is None:
            pytest.skip(f"{dep} not installed")
    spec = importlib.util.spec_from_file_location("_rkpart_export_families", ROOT / "scripts" / "export_families.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def cached_export(name: str, exporter: str) -> Path:
    """The family's export, made once per (diffusers, torch, family config, exporter)."""
    import diffusers
    import torch

    fams = _families()
    fam = fams.FAMILIES[name]
    funcs = [fam.build, fams.export_family, fams._opset, fams._decompose_rms_norm, fams._Wrapper]
    if inspect.isfunction(fam.fixed):
        funcs.append(fam.fixed)
    key = hashlib.sha256("\0".join([diffusers.__version__, torch.__version__, exporter,
                                    *(inspect.getsource(f) for f in funcs)]).encode())
    root = Path(os.environ.get("RKPART_TEST_EXPORTS", Path.home() / ".cache" / "rkpart" / "test-exports"))
    path = root / f"{name}-{exporter}-{key.hexdigest()[:16]}.onnx"
    if not path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fams.export_family(name, tmp, dynamo=exporter == "dynamo", opset=EXPORTERS[exporter])
        os.replace(tmp, path)
    return path
