"""The public API in rkpart/__init__.py: light to import, complete, usable end to end."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import rkpart
from rkpart.validation.metrics import compare


def test_import_is_light() -> None:
    code = ("import sys, rkpart; heavy = ('onnx', 'onnxruntime', 'numpy', 'networkx', 'torch', 'rknn', 'click');"
            "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def _first_importable(targets: tuple[str, ...]) -> object:
    """The object the first importable ``module:attribute`` candidate names (what the loader should return)."""
    for target in targets:
        mod_name, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError):
            continue
    raise AssertionError(f"none of {targets} imports in this installation")


def test_all_names_exactly_the_supported_surface() -> None:
    assert sorted(rkpart.__all__) == sorted(["__version__", *rkpart._LAZY])
    for name, targets in rkpart._LAZY.items():
        # the real implementation, not the stub the loader returns for a piece that does not import
        assert getattr(rkpart, name) is _first_importable(targets), name
    assert set(rkpart.__all__) <= set(dir(rkpart))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = rkpart.nope


def test_names_resolve_to_the_implementations() -> None:
    from rkpart.compile.compile import compile_plan
    from rkpart.discovery.recognizers import discover
    from rkpart.pipeline import partition
    from rkpart.profile.lifecycle import profile_plan

    assert rkpart.partition is partition
    assert rkpart.compile_plan is compile_plan
    assert rkpart.profile_plan is profile_plan
    assert rkpart.discover is discover
    # the compile subpackage being imported does not replace the function (and vice versa)
    importlib.import_module("rkpart.compile.toolkits")
    assert rkpart.compile_plan is compile_plan


def test_missing_piece_fails_only_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rkpart._LAZY, "not_written_yet", ("rkpart.no_such_module:thing",))
    fn = rkpart.not_written_yet
    monkeypatch.delitem(vars(rkpart), "not_written_yet", raising=False)
    with pytest.raises(NotImplementedError, match=r"rkpart.not_written_yet is not available .*no_such_module"):
        fn()


def test_pipeline_through_the_public_api(example_model: Path, tmp_path: Path) -> None:
    mg = rkpart.load_model(example_model)
    disc = rkpart.discover(mg)
    assert isinstance(mg, rkpart.ModelGraph) and isinstance(disc, rkpart.Discovery)
    assert [r.name for r in disc.blocks[0].regions] == ["attn", "xattn", "ffn"]
    plan = rkpart.partition(example_model, tmp_path / "p", strategy="split")
    assert isinstance(plan, rkpart.Plan) and all(isinstance(s, rkpart.Stage) for s in plan.stages)
    again, folder = rkpart.load_plan(tmp_path / "p")
    assert again == plan
    from rkpart.runtime.executor import random_inputs, run_model

    feeds = random_inputs(plan.tensors, plan.inputs)
    got = rkpart.run_plan(plan, folder, feeds, backend=rkpart.get_backend("ort"))
    ref = run_model(example_model, feeds)
    assert compare(got["sample"], ref["sample"]).cosine >= 0.999999


def test_extension_points_are_public() -> None:
    from rkpart.grouping.strategies.generic import GenericStrategy

    assert issubclass(GenericStrategy, rkpart.Strategy)
    assert isinstance(rkpart.ScopeRecognizer("x"), rkpart.Recognizer)
    assert issubclass(rkpart.errors.BudgetError, rkpart.UserError)
