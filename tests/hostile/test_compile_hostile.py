"""``rkpart compile`` under hostile conditions (issue 8 items 4 and 5).

- The toolkit worker protocol is JSON files plus an argv list: no pickle, no shell, so a
  hostile stage file name reaches the toolkit as data (real build with rknn-toolkit2 2.3.0).
- A hung worker is killed at its timeout with everything it started, its temp files go.
- ``rkpart compile`` killed with SIGKILL at random points and rerun gives the same final
  output as an uninterrupted compile, reusing the stages finished before the kill.

rknn-toolkit2 itself does not produce byte-identical ``.rknn`` files for identical input
(a few hundred bytes differ between two builds in a row), so the real-toolkit comparison
masks exactly those: the artifact's sha256 in plan.json and the cache metadata's measured
time/RSS.  Everything else (stages, file set, sizes, plan structure) must be equal.
"""

from __future__ import annotations

import ast
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import psutil
import pytest

from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.compile.toolkits import Toolkit
from rkpart.pipeline import partition
from rkpart.plan.extract import stage_sha256
from rkpart.plan.plan import load_plan
from tests.hostile.models import snapshot
from tests.toolkits import get_toolkit, toolkits_dir

ROOT = Path(__file__).resolve().parents[2]
HUNG_WORKER = Path(__file__).with_name("hung_worker.py")
#: modules that start toolkit subprocesses or exchange data with them
PROTOCOL_MODULES = sorted([*(ROOT / "rkpart" / "compile").glob("*.py"), ROOT / "rkpart" / "runtime" / "rknn_sim.py"])


# -- worker protocol: JSON and argv lists only --------------------------------------------------


def _calls(tree: ast.AST) -> Iterator[ast.Call]:
    return (n for n in ast.walk(tree) if isinstance(n, ast.Call))


def _name(f: ast.expr) -> str:
    if isinstance(f, ast.Attribute):
        return f"{_name(f.value)}.{f.attr}"
    return f.id if isinstance(f, ast.Name) else ""


@pytest.mark.parametrize("module", PROTOCOL_MODULES, ids=lambda p: p.name)
def test_protocol_modules_use_no_pickle_and_no_shell(module: Path) -> None:
    tree = ast.parse(module.read_text())
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in n.names] + ([n.module] if isinstance(n, ast.ImportFrom) and n.module else [])
            assert not {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle"} & set(names), (
                f"{module.name}:{n.lineno} imports a pickle-like module")
    for c in _calls(tree):
        name = _name(c.func)
        kw = {k.arg: k.value for k in c.keywords}
        assert name not in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"), (
            f"{module.name}:{c.lineno} runs a shell command string")
        if "shell" in kw:
            assert isinstance(kw["shell"], ast.Constant) and kw["shell"].value is False, (
                f"{module.name}:{c.lineno} uses shell=True")
        if name.split(".")[-1] in ("Popen", "run", "call", "check_call", "check_output") and c.args:
            assert not isinstance(c.args[0], (ast.Constant, ast.JoinedStr, ast.BinOp)), (
                f"{module.name}:{c.lineno}: subprocess command built as a string")
        if name.endswith(("np.load", "numpy.load")):
            ap = kw.get("allow_pickle")
            assert isinstance(ap, ast.Constant) and ap.value is False, (
                f"{module.name}:{c.lineno}: np.load without allow_pickle=False")


@pytest.mark.toolkit
def test_hostile_stage_file_name_is_data_not_shell(tmp_path: Path, mini_model: Path) -> None:
    """A plan whose stage file is named like a shell injection builds normally (real toolkit)."""
    tk = get_toolkit("2.3.0")
    folder = tmp_path / "plan"
    partition(mini_model, folder, "fused")
    plan, _ = load_plan(folder)
    npu = plan.npu_stages[0]
    evil = "stages/$(touch PWNED); `touch PWNED2` 'x\" y.onnx"
    src = folder / npu.file
    shutil.move(src, folder / evil)
    # its weights move to "<file>.data" too (a stage's data file is named after it), and the
    # ONNX file and plan.json say so
    data = src.with_name(src.name + ".data")
    if data.exists():
        shutil.move(data, folder / (evil + ".data"))
        m = onnx.load(str(folder / evil), load_external_data=False)
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = Path(evil).name + ".data"
        (folder / evil).write_bytes(m.SerializeToString())
    doc = json.loads((folder / "plan.json").read_text())
    for s in doc["stages"]:
        if s["id"] == npu.id:
            s["file"] = evil
            s["sha256"] = stage_sha256(folder / evil)
    (folder / "plan.json").write_text(json.dumps(doc))
    plan, _ = load_plan(folder)
    before = set(os.listdir(tmp_path))
    rep = compile_plan_report(plan, folder, CompileOptions(tk))
    assert [o.status for o in rep.outcomes] == ["built"], [o.to_json() for o in rep.outcomes]
    leftovers = [p for p in tmp_path.rglob("PWNED*")] + [p for p in Path.cwd().glob("PWNED*")]
    assert leftovers == []
    assert set(os.listdir(tmp_path)) == before


# -- a hung worker ----------------------------------------------------------------------------


@pytest.mark.slow
def test_hung_worker_is_killed_and_its_files_cleaned(tmp_path: Path, mini_model: Path) -> None:
    """FAKE worker (tests/hostile/hung_worker.py): leaves scratch files, starts a grandchild,
    hangs.  compile must kill the whole process group at the timeout, remove every file the
    worker wrote, write no artifact, and record the timeout in the plan."""
    folder = tmp_path / "plan"
    partition(mini_model, folder, "fused")
    plan, _ = load_plan(folder)
    before = snapshot(folder)
    record = tmp_path / "record.json"
    tk = Toolkit(version="fake", python=Path(sys.executable), managed=False)
    t0 = time.monotonic()
    rep = compile_plan_report(plan, folder, CompileOptions(tk, config={"fake_record": str(record)}, timeout=1.5,
                                                           worker=HUNG_WORKER))
    took = time.monotonic() - t0
    assert took < 20, f"compile took {took:.1f}s: the hung worker was not killed at its timeout"
    (o,) = rep.outcomes
    assert o.status == "failed" and "timed out after 1.5 s" in o.failures[-1].message
    info = json.loads(record.read_text())
    child = info["grandchild"]
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert [p for p in info["touched"] if os.path.exists(p)] == []
    assert not (folder / "rknn" / ".tmp").exists()
    assert not list(folder.rglob("*.rknn")) and not list(folder.rglob("*.part"))
    saved, _ = load_plan(folder)
    assert saved.stage(o.stage_id).failures and not saved.stage(o.stage_id).artifacts
    # besides plan.json, only the build log and the cache's record of the failure were added
    after = snapshot(folder) or {}
    added = sorted(set(after) - set(before or {}))
    assert all(a.startswith(("rknn/logs", "rknn/objects", "rknn/failures", "rknn")) for a in added), added


# -- SIGKILL of `rkpart compile` and resume -----------------------------------------------------


def _compile_cmd(folder: Path) -> list[str]:
    # --no-cache: what is under test is resuming from the plan folder's own rknn/, not the user-level cache
    return [sys.executable, "-m", "rkpart.cli", "compile", str(folder), "--toolkit", "2.3.0", "--no-cache"]


def _normalised(folder: Path) -> dict[str, Any]:
    """Everything compile wrote, with the toolkit's non-reproducible bytes masked."""
    snap = snapshot(folder) or {}
    plan = json.loads((folder / "plan.json").read_text())
    for s in plan["stages"]:
        for a in s["artifacts"]:
            a["sha256"] = "<toolkit output, not reproducible>"
    out: dict[str, Any] = {"plan": plan}
    for rel, digest in snap.items():
        p = folder / rel
        if rel == "plan.json" or rel.startswith("rknn/logs/"):
            out[rel] = "present"  # logs carry timestamps
        elif rel.startswith("rknn/objects/") and rel.endswith(".json"):
            meta = json.loads(p.read_text())
            for k in ("sha256", "wall_s", "cpu_s", "peak_rss_bytes"):  # measured, not reproducible
                meta.pop(k, None)
            out[rel] = meta
        elif rel.startswith("rknn/objects/") and rel.endswith(".rknn"):
            out[rel] = p.stat().st_size
        else:
            out[rel] = digest
    return out


def _orphans(folder: Path) -> list[int]:
    """Toolkit workers still running for this plan folder (their request lies in it)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "worker_main.py" in cmd and str(folder) in cmd:
            found.append(p.info["pid"])
    return found


@pytest.mark.toolkit
@pytest.mark.slow
def test_sigkill_compile_then_resume(tmp_path: Path, mini_model: Path) -> None:
    get_toolkit("2.3.0")
    base = tmp_path / "base"
    partition(mini_model, base, "split")
    ref = tmp_path / "ref"
    shutil.copytree(base, ref)
    env = {**os.environ, "RKPART_TOOLKITS_DIR": str(toolkits_dir())}
    r = subprocess.run(_compile_cmd(ref), capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    reference = _normalised(ref)
    n_npu = len(load_plan(ref)[0].npu_stages)

    rng = random.Random(8)
    for trial in range(2):
        work = tmp_path / f"t{trial}"
        shutil.copytree(base, work)
        original = snapshot(work)
        proc = subprocess.Popen(_compile_cmd(work), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        # kill once a random number of stages (0..n-1) are finished, plus a random delay
        want = rng.randint(0, n_npu - 1)
        while proc.poll() is None and len(list((work / "rknn" / "objects").glob("*.json"))
                                          if (work / "rknn" / "objects").exists() else []) < want:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 3.0))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        # plan.json: the original or a complete compiled plan, never half of one
        plan, _ = load_plan(work)
        assert (work / "plan.json").read_bytes() == (base / "plan.json").read_bytes() or all(
            s.artifacts for s in plan.npu_stages)
        done_before = {p.name: p.read_bytes() for p in (work / "rknn" / "objects").glob("*.rknn")} \
            if (work / "rknn" / "objects").exists() else {}
        # workers die with the compile that started them (PR_SET_PDEATHSIG), not minutes later
        deadline = time.monotonic() + 5
        while _orphans(work) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _orphans(work), "a toolkit worker outlived the killed compile"
        r = subprocess.run(_compile_cmd(work), capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("cached") >= len(done_before), r.stdout
        for name, data in done_before.items():  # finished stages were reused, not rebuilt
            assert (work / "rknn" / "objects" / name).read_bytes() == data
        assert _normalised(work) == reference, f"trial {trial}: kill after {want} stages"
        assert original is not None
