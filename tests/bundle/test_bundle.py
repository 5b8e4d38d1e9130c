"""``rkpart bundle`` and the board runner, on x86: NPU stages on the ONNX Runtime stand-in.

The compiled plan is real (rknn-toolkit2 2.3.0 builds the example's six NPU stages in ~10 s);
only the NPU itself is replaced, by ONNX Runtime on the stages' ``.onnx`` files, through the
runner's documented stand-in switch ``RKPART_RUNNER_NPU_STANDIN``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
import pytest
from click.testing import CliRunner

from rkpart.bundle.build import BundleOptions, bundle_plan
from rkpart.cli import main
from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.output import MARKER
from rkpart.pipeline import partition
from rkpart.plan.plan import Plan
from rkpart.runtime.executor import run_plan
from tests.toolkits import get_toolkit

STANDIN = "RKPART_RUNNER_NPU_STANDIN"
#: what the board must never need: rkpart and its x86-only dependencies
FORBIDDEN = {"rkpart", "onnx", "networkx", "click", "yaml", "jsonschema", "scipy", "psutil", "onnxsim",
             "onnx_graphsurgeon", "torch"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> tuple[Plan, Path]:
    tk = get_toolkit("2.3.0")
    folder = tmp_path_factory.mktemp("bundle-plan") / "split"
    plan = partition(example_model, folder, "split")
    rep = compile_plan_report(plan, folder, CompileOptions(tk, "rk3588", {}, jobs=2))
    assert not rep.failed
    return rep.plan, folder


@pytest.fixture(scope="module")
def bundle(compiled: tuple[Plan, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "board"
    bundle_plan(compiled[1], out)
    return out


def load_runner(bundle: Path) -> ModuleType:
    """The bundle's own copy of runner.py, imported as a plain file (as on the board)."""
    spec = importlib.util.spec_from_file_location("bundle_runner", bundle / "runner.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # the bundle stays as bundled
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = writes
    return mod


def run_cli(bundle: Path, *args: str, standin: Path | None, importtime: bool = False) -> subprocess.CompletedProcess:
    # as on the board: no PYTHONDONTWRITEBYTECODE (the bundle must stay as bundled all the same)
    env = {k: v for k, v in os.environ.items() if k not in (STANDIN, "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    if standin is not None:
        env[STANDIN] = str(standin)
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), str(bundle / "runner.py"), *args]
    return subprocess.run(cmd, cwd=bundle, env=env, capture_output=True, text=True, timeout=300)


def imported_top_level(importtime_stderr: str) -> set[str]:
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            mod = line.rsplit("|", 1)[1].strip()
            if mod and mod != "imported package":
                names.add(mod.split(".")[0])
    return names


pytestmark = [pytest.mark.toolkit, pytest.mark.slow]


def test_bundle_holds_what_the_board_needs_with_sha256(bundle: Path, compiled: tuple[Plan, Path]) -> None:
    plan, _ = compiled
    m = json.loads((bundle / "manifest.json").read_text())
    assert (m["format"], m["version"]) == ("rkpart-bundle", 1)
    files = set(m["files"])
    # the manifest, and rkpart's output marker (rkpart.output), are the two files it does not list
    on_disk = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()} - {"manifest.json", MARKER}
    assert files == on_disk
    assert {"runner.py", "ref_inputs.npz", "ref_outputs.npz"} <= files
    assert sum(f.endswith(".rknn") for f in files) == len(plan.npu_stages) == 6
    host_onnx = {s.file for s in plan.host_stages}
    assert host_onnx <= files and not any(s.file in files for s in plan.npu_stages)
    assert all(len(v["sha256"]) == 64 and v["size"] > 0 for v in m["files"].values())
    assert [s["id"] for s in m["stages"]] == [s.id for s in plan.stages]
    assert {s["residency"] for s in m["stages"] if s["device"] == "npu"} == {"per-stage"}
    assert m["toolkit"] == "2.3.0" and m["core_mask"] == "auto"


def test_runner_cli_gates_on_standin_and_imports_only_its_dependencies(bundle: Path, compiled: tuple[Plan, Path],
                                                                       tmp_path: Path) -> None:
    plan, folder = compiled
    saved = tmp_path / "out.npz"
    baseline = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True)
    p = run_cli(bundle, "--inputs", "ref_inputs.npz", "--reference", "ref_outputs.npz", "--passes", "2",
                "--save-outputs", str(saved), "--json", standin=folder, importtime=True)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout)
    assert report["passed"] and report["npu_standin"] == str(folder)
    assert report["outputs"]["sample"]["cosine"] > 0.999999
    assert "ONNX Runtime stand-in" in p.stderr
    # imports: nothing beyond the standard library, numpy and onnxruntime (rknnlite is not
    # importable here, and the stand-in never asks for it)
    mods = imported_top_level(p.stderr) - imported_top_level(baseline.stderr)
    assert not (mods & FORBIDDEN), mods & FORBIDDEN
    # "org" is pickle's probe for Jython's org.python.core (stdlib behaviour)
    assert {m for m in mods if m not in sys.stdlib_module_names} <= {"numpy", "onnxruntime", "org"}
    # the outputs equal the plan's, run stage by stage by rkpart itself on the same inputs
    with np.load(bundle / "ref_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    want = run_plan(plan, folder, feeds)
    with np.load(saved) as z:
        got = {k: z[k] for k in z.files}
    assert set(got) == set(want) == set(plan.outputs)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k


def test_runner_without_the_board_runtime_says_so(bundle: Path) -> None:
    try:
        import rknnlite  # noqa: F401

        pytest.skip("rknn-toolkit-lite2 is installed here")
    except ImportError:
        pass
    p = run_cli(bundle, standin=None)
    assert p.returncode == 7
    assert p.stderr.strip().splitlines() == [
        p.stderr.strip().splitlines()[0]] and "needs rknn-toolkit-lite2 on the board" in p.stderr
    assert "Traceback" not in p.stderr


def test_tampered_bundle_is_refused_in_one_line(bundle: Path, compiled: tuple[Plan, Path], tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    rknn = sorted((copy / "rknn").iterdir())[0]
    rknn.write_bytes(rknn.read_bytes()[:-1] + b"\0")
    p = run_cli(copy, standin=compiled[1])
    assert p.returncode == 2 and "differs from the manifest" in p.stderr and "Traceback" not in p.stderr


def test_gate_failure_exits_8(bundle: Path, compiled: tuple[Plan, Path], tmp_path: Path) -> None:
    with np.load(bundle / "ref_outputs.npz") as z:
        wrong = {k: -z[k] for k in z.files}
    np.savez(tmp_path / "wrong.npz", **wrong)
    p = run_cli(bundle, "--inputs", "ref_inputs.npz", "--reference", str(tmp_path / "wrong.npz"), standin=compiled[1])
    assert p.returncode == 8 and "gate: FAIL" in p.stdout


@pytest.mark.parametrize("residency", ["per-stage", "resident"])
def test_residency_decides_when_npu_sessions_live(bundle: Path, compiled: tuple[Plan, Path], residency: str) -> None:
    mod = load_runner(bundle)
    with np.load(bundle / "ref_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    npu = [s.id for s in compiled[0].npu_stages]
    host = [s.id for s in compiled[0].host_stages]
    with mod.Runner(bundle, residency=residency, npu_standin=compiled[1]) as r:
        opened = list(r.open_timings)
        passes = []
        for _ in range(3):  # a denoising loop
            r.run(feeds)
            passes.append(list(r.timings))
    closed = r.close_timings

    def phases(timings: list[tuple[str, str, float]], sid: str) -> list[str]:
        return [p for s, p, _t in timings if s == sid]

    for sid in npu:
        if residency == "per-stage":
            assert phases(opened, sid) == [] and phases(closed, sid) == []
            assert all(phases(t, sid) == ["load", "init", "infer", "release"] for t in passes)
        else:
            assert phases(opened, sid) == ["load", "init"] and phases(closed, sid) == ["release"]
            assert all(phases(t, sid) == ["infer"] for t in passes)
    for sid in host:  # host stages stay resident either way: set up on first use
        assert phases(passes[0], sid) == ["load", "init", "infer"]
        assert all(phases(t, sid) == ["infer"] for t in passes[1:])


class RecordingRknnLiteFake:
    """FAKE RKNNLite (no NPU on x86): records the calls, answers with ONNX Runtime on the stage's .onnx.

    Used only to observe what the runner passes to the board runtime (core mask, call order);
    outputs come from the real stage graphs so the pass completes.
    """

    calls: ClassVar[list[tuple[str, Any]]] = []
    sources: ClassVar[dict[str, Path]] = {}
    ort_session: Any = None

    def __init__(self, verbose: bool = False) -> None:
        self.sess: Any = None

    def load_rknn(self, path: str) -> int:
        self.calls.append(("load_rknn", Path(path).name))
        self.path = Path(path)
        return 0

    def init_runtime(self, core_mask: int = 0) -> int:
        self.calls.append(("init_runtime", core_mask))
        src = self.sources[self.path.name]
        self.sess = self.ort_session(str(src))
        return 0

    def inference(self, inputs: list[np.ndarray], data_format: Any = None) -> list[np.ndarray]:
        self.calls.append(("inference", len(inputs)))
        names = [i.name for i in self.sess.get_inputs()]
        return list(self.sess.run(None, dict(zip(names, inputs, strict=True))))

    def release(self) -> None:
        self.calls.append(("release", None))


def test_core_mask_and_call_order_reach_rknnlite(bundle: Path, compiled: tuple[Plan, Path]) -> None:
    mod = load_runner(bundle)
    m = json.loads((bundle / "manifest.json").read_text())
    fake = RecordingRknnLiteFake
    fake.calls = []
    fake.sources = {Path(s["file"]).name: compiled[1] / s["source"] for s in m["stages"] if s["device"] == "npu"}
    fake.ort_session = staticmethod(mod.ort_session)
    with np.load(bundle / "ref_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    with mod.Runner(bundle, core_mask="0_1_2", rknnlite_api=fake) as r:
        out = r.run(feeds)
    with np.load(bundle / "ref_outputs.npz") as z:
        ref = z["sample"]
    assert mod.compare(out["sample"], ref)["cosine"] > 0.999999
    assert [c for c in fake.calls if c[0] == "init_runtime"] == [("init_runtime", 7)] * 6
    # per-stage: one NPU context at a time
    assert [c[0] for c in fake.calls] == ["load_rknn", "init_runtime", "inference", "release"] * 6


def test_bundle_is_byte_identical_when_repeated(compiled: tuple[Plan, Path], bundle: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    bundle_plan(compiled[1], again)
    a = {p.relative_to(bundle): p.read_bytes() for p in bundle.rglob("*") if p.is_file()}
    b = {p.relative_to(again): p.read_bytes() for p in again.rglob("*") if p.is_file()}
    assert a == b


def test_rkpart_run_rknnlite_uses_the_runner(compiled: tuple[Plan, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STANDIN, str(compiled[1]))
    r = CliRunner().invoke(main, ["run", str(compiled[1]), "--backend", "rknnlite", "--core-mask", "0_1", "-q",
                                  "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["backend"] == "rknnlite" and rep["passed"]
    assert rep["end_to_end"]["sample"]["cosine"] > 0.999999


def test_cli_bundle_refuses_non_empty_folder(compiled: tuple[Plan, Path], bundle: Path) -> None:
    r = CliRunner().invoke(main, ["bundle", str(compiled[1]), "-o", str(bundle), "-q"])
    assert r.exit_code == 6 and "not empty" in r.output
    r = CliRunner().invoke(main, ["bundle", str(compiled[1]), "-o", str(bundle), "-q", "--force",
                                  "--residency", "resident", "--core-mask", "0_1_2"])
    assert r.exit_code == 0, r.output
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["core_mask"] == "0_1_2" and {s["residency"] for s in m["stages"]} == {"resident"}
    bundle_plan(compiled[1], bundle, BundleOptions(force=True))  # back to the module's default for other tests


def test_runner_in_a_venv_with_only_numpy_and_onnxruntime(bundle: Path, compiled: tuple[Plan, Path],
                                                          tmp_path: Path) -> None:
    """docs/board.md step 2 minus the board wheel: a fresh venv with numpy and onnxruntime only."""
    from importlib import metadata

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pins = [f"numpy=={metadata.version('numpy')}", f"onnxruntime=={metadata.version('onnxruntime')}"]
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", *pins], capture_output=True, text=True, timeout=600)
    if pip.returncode != 0:
        pytest.skip(f"cannot install {pins} into a fresh venv here: {pip.stderr.strip().splitlines()[-1:]}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env[STANDIN] = str(compiled[1])
    p = subprocess.run([str(py), str(bundle / "runner.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "gate: PASS" in p.stdout


def test_bundle_refuses_a_host_stage_edited_since_partition(compiled: tuple[Plan, Path], tmp_path: Path) -> None:
    import shutil

    plan, folder = compiled
    copy = tmp_path / "plan"
    shutil.copytree(folder, copy)
    host = next(s for s in plan.host_stages)
    import onnx

    f = copy / host.file
    m = onnx.load(str(f))
    m.doc_string = "edited after partition"  # still a valid model: only the recorded sha256 tells
    onnx.save(m, str(f))
    out = tmp_path / "board"
    r = CliRunner().invoke(main, ["bundle", str(copy), "-o", str(out), "-q"])
    assert r.exit_code == 5 and r.output.count("\n") == 1, r.output
    assert f"stage {host.id}" in r.output and "does not match the sha256 in plan.json" in r.output
    assert not out.exists()


def test_bundle_of_a_weights_link_plan_carries_the_shared_weights(tmp_path: Path) -> None:
    """Host stages of a ``--weights link`` plan read the shared file under stages/weights/: the
    bundle must carry it at the same relative path, and the runner must reproduce the plan."""
    from tests.models.anima import AnimaConfig, build_anima_onnx

    model = build_anima_onnx(AnimaConfig.tiny(num_blocks=1, dtype="float32"), tmp_path / "m" / "anima.onnx",
                             external_data=True)
    folder = tmp_path / "link"
    plan = partition(model, folder, "split", weights="link")
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit("2.3.0"), "rk3588", {}, jobs=2))
    assert not rep.failed
    out = tmp_path / "board"
    bundle_plan(folder, out)
    shared = {p.relative_to(folder).as_posix() for p in (folder / "stages" / "weights").iterdir()}
    m = json.loads((out / "manifest.json").read_text())
    assert shared and shared <= set(m["files"])
    p = run_cli(out, standin=folder)
    assert p.returncode == 0 and "gate: PASS" in p.stdout, p.stdout + p.stderr
