"""Plugins through entry points: a throwaway package registers a strategy and a recogniser.

Subprocesses run the real ``rkpart`` console script with the plugin site on PYTHONPATH, so
entry points are scanned afresh, exactly as after ``pip install``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rkpart.plan.plan import load_plan
from rkpart.runtime.executor import random_inputs, run_model, run_plan
from rkpart.validation.metrics import compare

RKPART = [sys.executable, "-m", "rkpart.cli"]


def rkpart(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RKPART, *map(str, args)], env=env, capture_output=True, text=True, timeout=300)


def _rows(out: str) -> dict[str, list[dict[str, str]]]:
    rows: dict[str, list[dict[str, str]]] = {}
    for r in json.loads(out):
        rows.setdefault(r["name"], []).append(r)
    return rows


@pytest.mark.slow
def test_strategies_lists_plugin_broken_duplicate_and_shadowed(plugin_env: dict[str, str]) -> None:
    res = rkpart(plugin_env, "strategies")
    assert res.returncode == 0, res.stderr
    lines = {ln.split()[0] + " " + ln.split()[1]: ln for ln in res.stdout.splitlines()}
    assert "rkpart-demo-plugin==0.1.0 (rkpart_demo_plugin:HalvesStrategy)" in lines["halves plugin"]
    assert "two NPU stages" in lines["halves plugin"]
    assert "RuntimeError: this plugin is broken on purpose" in lines["kaputt BROKEN"]
    assert "rkpart-broken-plugin==0.1.0" in lines["kaputt BROKEN"]
    assert "also provided by rkpart-demo-plugin==0.1.0" in lines["halves DUPLICATE"]
    assert "taken by a built-in" in lines["split SHADOWED"]
    for builtin in ("split", "fused", "custom", "generic"):  # and whatever else is built in
        assert f"{builtin} built-in" in lines

    rows = _rows(rkpart(plugin_env, "strategies", "--json").stdout)
    assert [r["status"] for r in rows["halves"]] == ["plugin", "duplicate"]
    assert rows["kaputt"][0]["status"] == "broken"
    assert [r["status"] for r in rows["split"]] == ["built-in", "shadowed"]


@pytest.mark.export
def test_partition_uses_the_plugin_strategy(plugin_env: dict[str, str], vit_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "halves"
    res = rkpart(plugin_env, "partition", vit_onnx, "--strategy", "halves", "-o", out, "-q")
    assert res.returncode == 0, res.stderr
    plan, folder = load_plan(out)
    assert plan.strategy["name"] == "halves"
    assert [s.id for s in plan.stages] == ["front", "back"]
    feeds = random_inputs(plan.tensors, plan.inputs, seed=1)
    got = run_plan(plan, folder, feeds)
    ref = run_model(vit_onnx, feeds)
    assert compare(got["logits"], ref["logits"]).cosine >= 0.999999

    # without the plugin on the path the same command fails with the list of what exists
    bare = {k: v for k, v in plugin_env.items() if k != "PYTHONPATH"}
    res = rkpart(bare, "partition", vit_onnx, "--strategy", "halves", "-o", tmp_path / "x", "-q")
    assert res.returncode == 2
    assert "unknown strategy 'halves' (available: split, fused, custom, generic" in res.stderr


@pytest.mark.export
def test_broken_plugin_is_not_fatal(plugin_env: dict[str, str], vit_onnx: Path, tmp_path: Path) -> None:
    res = rkpart(plugin_env, "partition", vit_onnx, "--strategy", "generic", "--budget-mib", "0.3",
                 "-o", tmp_path / "g", "-q")
    assert res.returncode == 0, res.stderr
    assert load_plan(tmp_path / "g")[0].strategy["name"] == "generic"

    res = rkpart(plugin_env, "partition", vit_onnx, "--strategy", "kaputt", "-o", tmp_path / "k")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        "rkpart: error: strategy plugin 'kaputt' failed to load: RuntimeError: this plugin is broken on purpose "
        "[rkpart-broken-plugin==0.1.0 (rkpart_broken_plugin:Strategy)]")
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "k").exists()


@pytest.mark.slow
def test_recognizers_lists_plugins_with_stage_and_origin(plugin_env: dict[str, str]) -> None:
    res = rkpart(plugin_env, "recognizers")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "vit_names" in text and "(before) ViT regions named attn / mlp" in text
    assert "[rkpart-demo-plugin==0.1.0 (rkpart_demo_plugin:recognizer)]" in text
    assert "BROKEN" in text and "this plugin is broken on purpose" in text
    rows = _rows(rkpart(plugin_env, "recognizers", "--json").stdout)
    assert rows["scopes"][0] | {"summary": ""} == {"name": "scopes", "status": "built-in", "summary": "",
                                                   "origin": "rkpart (rkpart.discovery.recognizers)", "stage": "after"}
    assert rows["vit_names"][0]["stage"] == "before"
    assert rows["kaputt"][0]["status"] == "broken"


@pytest.mark.export
def test_plugin_recognizer_names_the_regions(plugin_env: dict[str, str], vit_onnx: Path, tmp_path: Path) -> None:
    res = rkpart(plugin_env, "inspect", vit_onnx, "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["method"] == "recognizer:vit_names"
    assert [r["name"] for r in info["blocks"][0]["regions"]] == ["attn", "mlp"]
    res = rkpart(plugin_env, "partition", vit_onnx, "-s", "split", "-o", tmp_path / "s", "-q")
    assert res.returncode == 0, res.stderr
    ids = [s.id for s in load_plan(tmp_path / "s")[0].npu_stages]
    assert ids[:2] == ["b00.attn", "b00.mlp"]
    # without the plugin: the built-in names
    bare = {k: v for k, v in plugin_env.items() if k != "PYTHONPATH"}
    info = json.loads(rkpart(bare, "inspect", vit_onnx, "--json").stdout)
    assert [r["name"] for r in info["blocks"][0]["regions"]] == ["attn", "ffn"]


def test_in_process_plugin_set(plugins_on_path: Path) -> None:
    from rkpart.discovery.recognizers import plugins as recognizer_plugins
    from rkpart.grouping.strategies import available, plugins

    ps = plugins()
    assert list(ps.loaded) == ["halves"]
    assert ps.origin["halves"] == "rkpart-demo-plugin==0.1.0 (rkpart_demo_plugin:HalvesStrategy)"
    assert {e.name: e.status for e in ps.entries} == {"halves": "duplicate", "kaputt": "broken", "split": "shadowed"}
    assert [e.status for e in ps.entries if e.name == "halves"] == ["loaded", "duplicate"]
    from rkpart.grouping.strategies import BUILTIN

    assert list(available()) == [*(s.name for s in BUILTIN), "halves"]
    assert available()["split"].__module__ == "rkpart.grouping.strategies.split"
    rs = recognizer_plugins()
    assert list(rs.loaded) == ["vit_names"]
    assert rs.broken["kaputt"].startswith("RuntimeError: this plugin is broken on purpose")


def test_load_failures_of_every_kind_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Objects of the wrong type, misnamed ones and import errors: each broken, none raised."""
    from rkpart.plugins import load_plugins
    from tests.plugins.conftest import install, write_package

    site = tmp_path / "site"
    site.mkdir()
    eps = {
        "rkpart.strategies": {"misnamed": "rkpart_odd_plugin:Named", "number": "rkpart_odd_plugin:not_a_class",
                              "missing_attr": "rkpart_odd_plugin:does_not_exist",
                              "missing_module": "rkpart_no_such_module:X"},
        "rkpart.recognizers": {"no_recognize": "rkpart_odd_plugin:no_recognize"},
    }
    source = '''
        from rkpart.grouping.strategies.split import SplitStrategy
        class Named(SplitStrategy):
            name = "other_name"
        class NoRecognize:
            name = "no_recognize"
        not_a_class = 42
        no_recognize = NoRecognize()
        '''
    pkg = write_package(tmp_path, "rkpart-odd-plugin", "rkpart_odd_plugin", source, eps)
    install(pkg, site, "rkpart-odd-plugin", "rkpart_odd_plugin", eps)
    monkeypatch.syspath_prepend(str(site))
    load_plugins.cache_clear()
    try:
        from rkpart.discovery.recognizers import plugins as recognizer_plugins
        from rkpart.grouping.strategies import plugins

        broken = plugins().broken
        rbroken = recognizer_plugins().broken
    finally:
        load_plugins.cache_clear()
        sys.modules.pop("rkpart_odd_plugin", None)
    assert broken["misnamed"].startswith("entry point name 'misnamed' differs from the object's name 'other_name'")
    assert broken["number"].startswith("42 is not a subclass of rkpart.strategies.base.Strategy")
    assert broken["missing_attr"].startswith("AttributeError:")
    assert broken["missing_module"].startswith("ModuleNotFoundError: No module named 'rkpart_no_such_module'")
    assert rbroken["no_recognize"].startswith("<rkpart_odd_plugin.NoRecognize object")
    assert all("\n" not in v for v in [*broken.values(), *rbroken.values()])


@pytest.mark.slow
def test_plugin_set_is_deterministic(plugin_env: dict[str, str]) -> None:
    a = rkpart(plugin_env, "strategies", "--json").stdout
    b = rkpart(plugin_env, "strategies", "--json").stdout
    assert a == b
    assert np.all([r["origin"] for r in json.loads(a)])


def test_the_documented_plugin_imports_still_work() -> None:
    """Every ``from rkpart... import ...`` of docs/plugins.md, and the adapter it names by its path
    (``rkpart.strategies.base.propose_with``), imports the object rkpart itself uses: plugins written
    against the paths before rkpart's middle moved (discovery/, grouping/, plan/) keep working."""
    import importlib
    import re

    from rkpart.discovery import recognizers
    from rkpart.grouping import strategies
    from rkpart.grouping.strategies import base

    text = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    imports = re.findall(r"^\s*from (rkpart[\w.]*) import ([\w, ]+)$", text, flags=re.M)
    assert {m for m, _ in imports} >= {"rkpart", "rkpart.recognizers"}
    for module, names in imports:
        for name in (n.strip() for n in names.split(",")):
            assert getattr(importlib.import_module(module), name) is not None, f"from {module} import {name}"
    import rkpart.recognizers
    import rkpart.strategies
    import rkpart.strategies.base

    assert "rkpart.strategies.base.propose_with" in text
    assert rkpart.strategies.base.propose_with is base.propose_with
    assert rkpart.strategies.base.Strategy is rkpart.Strategy is base.Strategy
    assert rkpart.strategies.get_strategy is strategies.get_strategy
    for name in ("relabel", "structural", "discovery_from_blocks", "ScopeRecognizer"):
        assert getattr(rkpart.recognizers, name) is getattr(recognizers, name)

