"""Every command that reads a model or a plan refuses hostile ones the same way (issue 8:
"applies to every command"): documented exit code, no traceback, nothing written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.hostile.models import snapshot

# outside the fast tier: every command in a fresh process (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

RKPART = [sys.executable, "-m", "rkpart.cli"]


def _run(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RKPART, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def noise(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("noise") / "noise.onnx"
    p.write_bytes(np.random.default_rng(5).bytes(3000))
    return p


@pytest.fixture(scope="module")
def evil_plan(tmp_path_factory: pytest.TempPathFactory, mini_model: Path) -> Path:
    from rkpart.pipeline import partition

    out = tmp_path_factory.mktemp("evil") / "plan"
    partition(mini_model, out, "fused")
    doc = json.loads((out / "plan.json").read_text())
    doc["stages"][1]["file"] = "../../../etc/passwd"
    (out / "plan.json").write_text(json.dumps(doc))
    return out


@pytest.fixture(scope="module")
def fake_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FAKE toolkits folder: entries for 2.3.0 / 2.3.2 / 2.5.0 whose python is rkpart's own.

    ``repro`` looks its toolkits up before it reads the model; with these entries it gets to the
    model without real toolkits installed, and nothing is ever built with them.
    """
    root = tmp_path_factory.mktemp("fake-registry")
    for v in ("2.3.0", "2.3.2", "2.5.0"):
        (root / v).mkdir()
        (root / v / "toolkit.json").write_text(json.dumps({"version": v, "python": sys.executable, "managed": False}))
    return root


@pytest.mark.parametrize("args", [("inspect",), ("partition", "-o", "out"), ("repro",)])
def test_model_commands_refuse_noise(tmp_path: Path, noise: Path, fake_registry: Path, args: tuple[str, ...]) -> None:
    extra = ("--toolkits-dir", fake_registry) if args[0] == "repro" else ()
    r = _run(args[0], noise, *args[1:], *extra, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr and "not an ONNX model" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [("run",), ("compile", "--toolkit", "2.3.0"), ("profile", "-o", "prof.jsonl"),
                                  ("bundle", "-o", "board"), ("report", "-o", "report.html")])
def test_plan_commands_refuse_escaping_paths(tmp_path: Path, evil_plan: Path, args: tuple[str, ...]) -> None:
    folder = tmp_path / "plan"
    shutil.copytree(evil_plan, folder)
    before = snapshot(folder)
    r = _run(args[0], folder, *args[1:], cwd=tmp_path)
    assert r.returncode == 5, r.stderr
    assert "Traceback" not in r.stderr and "leaves the plan folder" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]
