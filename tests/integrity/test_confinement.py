"""One confinement check for every file a plan names (issue 13 items 4 and 6, and the
missing/garbage/folder stage and tampered-plan traceback cases).

``rkpart run`` (ONNX Runtime, no toolkit) and ``rkpart compile`` (real rknn-toolkit2; every
case here is refused before a build starts) see the same stage files.  Each case runs as a
subprocess with a timeout, so a FIFO that blocks an open fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from tests.hostile.models import snapshot

# outside the fast tier: each case runs the CLI in a fresh process (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

RKPART = [sys.executable, "-m", "rkpart.cli"]
TIMEOUT = 120


def rkpart(*args: object, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([*RKPART, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def one_line_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert r.returncode == code, f"exit {r.returncode}, wanted {code}: {r.stderr!r}"
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("rkpart: error:")]
    assert len(errs) == 1, r.stderr
    for n in needles:  # "a|b": either
        assert any(alt.lower() in errs[0].lower() for alt in n.split("|")), errs[0]
    return errs[0]


def _plan(folder: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((folder / "plan.json").read_text())


def _npu_with_data(folder: Path) -> tuple[Path, Path]:
    for s in _plan(folder)["stages"]:
        if s["device"] == "npu":
            p = folder / s["file"]
            d = p.with_name(p.name + ".data")
            if d.is_file():
                return p, d
    raise AssertionError("no NPU stage with external data")


def _set_location(onnx_path: Path, loc: str) -> None:
    m = onnx.load(str(onnx_path), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = loc
    onnx_path.write_bytes(m.SerializeToString())


def absolute_data(plan: Path, outside: Path) -> None:
    p, d = _npu_with_data(plan)
    shutil.copy(d, outside / "stolen.data")
    _set_location(p, str(outside / "stolen.data"))


def dotdot_data(plan: Path, outside: Path) -> None:
    p, d = _npu_with_data(plan)
    shutil.copy(d, outside / "stolen.data")
    _set_location(p, os.path.relpath(outside / "stolen.data", p.parent))


def symlinked_data(plan: Path, outside: Path) -> None:
    _p, d = _npu_with_data(plan)
    shutil.copy(d, outside / "same.data")  # same bytes: the sha256 alone would pass
    d.unlink()
    os.symlink(outside / "same.data", d)


def fifo_data(plan: Path, outside: Path) -> None:
    _p, d = _npu_with_data(plan)
    d.unlink()
    os.mkfifo(d)


def devzero_data(plan: Path, outside: Path) -> None:
    _p, d = _npu_with_data(plan)
    d.unlink()
    os.symlink("/dev/zero", d)


def fifo_onnx(plan: Path, outside: Path) -> None:
    p, _d = _npu_with_data(plan)
    p.unlink()
    os.mkfifo(p)


def devzero_onnx(plan: Path, outside: Path) -> None:
    p, _d = _npu_with_data(plan)
    p.unlink()
    os.symlink("/dev/zero", p)


def missing_onnx(plan: Path, outside: Path) -> None:
    _npu_with_data(plan)[0].unlink()


def garbage_onnx(plan: Path, outside: Path) -> None:
    _npu_with_data(plan)[0].write_bytes(b"\x08\x07garbage" * 100)


def folder_onnx(plan: Path, outside: Path) -> None:
    p = _npu_with_data(plan)[0]
    p.unlink()
    p.mkdir()


def swapped_stages(plan: Path, outside: Path) -> None:
    npu = [plan / s["file"] for s in _plan(plan)["stages"] if s["device"] == "npu"]
    a, b = npu[0], npu[1]
    tmp = a.with_name("swap.tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    for x, y in ((a, b),):
        xd, yd = x.with_name(x.name + ".data"), y.with_name(y.name + ".data")
        if xd.exists() and yd.exists():
            xd.rename(tmp)
            yd.rename(xd)
            tmp.rename(yd)


def edited_weights(plan: Path, outside: Path) -> None:
    _p, d = _npu_with_data(plan)
    raw = bytearray(d.read_bytes())
    raw[0] ^= 0x40
    d.write_bytes(bytes(raw))


CASES: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "absolute-data": (absolute_data, "leaves the plan folder"),
    "dotdot-data": (dotdot_data, "leaves the plan folder"),
    "symlinked-data": (symlinked_data, "leaves the plan folder"),
    "fifo-data": (fifo_data, "FIFO"),
    "devzero-data": (devzero_data, "leaves the plan folder"),
    "fifo-onnx": (fifo_onnx, "FIFO"),
    "devzero-onnx": (devzero_onnx, "leaves the plan folder"),
    "missing-onnx": (missing_onnx, "missing"),
    "garbage-onnx": (garbage_onnx, "not an ONNX model"),
    "folder-onnx": (folder_onnx, "folder"),
    "swapped-stages": (swapped_stages, "sha256|own data file"),
    "edited-weights": (edited_weights, "sha256"),
}


@pytest.fixture
def tampered(request: pytest.FixtureRequest, tmp_path: Path, split_plan: Path) -> tuple[Path, Path, str]:
    plan = tmp_path / "plan"
    shutil.copytree(split_plan, plan)
    outside = tmp_path / "outside"
    outside.mkdir()
    fn, needle = CASES[request.param]
    fn(plan, outside)
    return plan, outside, needle


@pytest.mark.parametrize("tampered", list(CASES), indirect=True)
def test_run_refuses_tampered_stage_files(tampered: tuple[Path, Path, str]) -> None:
    plan, outside, needle = tampered
    before = snapshot(outside)
    one_line_error(rkpart("run", plan, "-q"), 5, needle)
    assert snapshot(outside) == before


@pytest.mark.toolkit
@pytest.mark.parametrize("tampered", list(CASES), indirect=True)
def test_compile_refuses_tampered_stage_files(tampered: tuple[Path, Path, str], tmp_path: Path) -> None:
    from rkpart.compile.toolkits import find_toolkit
    from rkpart.errors import ToolkitError

    try:
        find_toolkit("2.3.0")
    except ToolkitError as e:
        pytest.skip(f"rknn-toolkit2 2.3.0 not installed: {e}")
    plan, outside, needle = tampered
    before = snapshot(outside)
    r = rkpart("compile", plan, "--toolkit", "2.3.0", "--cache-dir", tmp_path / "cache", "-q")
    one_line_error(r, 5, needle)
    assert snapshot(outside) == before
    assert not list((plan / "rknn").glob("objects/*.rknn")) if (plan / "rknn").exists() else True


def test_run_does_not_open_a_recorded_model_path_outside(tmp_path: Path, split_plan: Path) -> None:
    """Item 6: ``model.path`` pointing at /etc/passwd is not read; the rule is documented."""
    plan = tmp_path / "plan"
    shutil.copytree(split_plan, plan)
    d = _plan(plan)
    d["model"]["path"] = "/etc/passwd"
    (plan / "plan.json").write_text(json.dumps(d))
    msg = one_line_error(rkpart("run", plan, "-q"), 2, "--model")
    assert "sha256" in msg


def test_run_fifo_as_model_or_inputs(tmp_path: Path, split_plan: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one_line_error(rkpart("run", split_plan, "--model", fifo, "-q", timeout=60), 2, "FIFO")
    one_line_error(rkpart("run", split_plan, "--inputs", fifo, "-q", timeout=60), 2, "FIFO")


def test_run_untampered_plan_passes(split_plan: Path) -> None:
    r = rkpart("run", split_plan, "-q")
    assert r.returncode == 0, r.stderr
