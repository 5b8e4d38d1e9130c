"""Toolkit workers forked from a zygote that imported rknn-toolkit2 once (rkpart.compile.zygote).

A worker started as its own interpreter paid the toolkit's import (~3.5 s of CPU, 5-15 s of wall
on this 2-core machine) before every build and simulator session.  These tests check what the
fork must keep: a real build through the zygote, its isolation (a worker's crash ends only the
worker), and that nothing outlives rkpart when it is SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from rkpart.compile import zygote
from rkpart.compile.compiler_plan import parse_layer_rows
from rkpart.compile.runner import WORKER, BuildJob, run_build, spawn_worker, worker_env
from rkpart.compile.toolkits import Toolkit
from tests.toolkits import get_toolkit

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]


def _model(path: Path) -> Path:
    w = numpy_helper.from_array(np.random.default_rng(0).random((64, 64), dtype=np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 16, 64])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1, 16, 64])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    save(m, path)
    return path


def _gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _session(tk: Toolkit, tmp: Path) -> subprocess.Popen[bytes] | zygote.ZygoteChild:
    for d in ("home", "tmp"):
        (tmp / d).mkdir(exist_ok=True)
    return spawn_worker(tk.python, WORKER, ["simulate"], cwd=tmp, env=worker_env(tmp / "home", tmp / "tmp"),
                        stderr=os.open(os.devnull, os.O_WRONLY), pipes=True)


def test_builds_fork_from_one_zygote_and_match_a_fresh_interpreter(tmp_path: Path) -> None:
    tk = get_toolkit("2.5.0")
    onnx = _model(tmp_path / "m.onnx")
    tables = {}
    for mode in ("0", "1", "1"):  # a fresh interpreter, then two forks of the same zygote
        os.environ["RKPART_ZYGOTE"] = mode
        try:
            r = run_build(BuildJob(f"s{len(tables)}", onnx, tmp_path / f"{len(tables)}.rknn",
                                   tmp_path / f"{len(tables)}.log", {"target_platform": "rk3588"}, tk))
        finally:
            os.environ.pop("RKPART_ZYGOTE")
        assert r.ok, r.message
        # the compiler's own plan of the stage (layers, targets, memory), the same however the worker started
        tables[len(tables)] = parse_layer_rows(r.log.read_text())
    assert tables[0] == tables[1] == tables[2] and tables[0]
    z = zygote.zygote_for(tk.python, WORKER, worker_env(tmp_path, tmp_path))
    assert z is not None and z.alive


def test_a_crashing_worker_ends_alone_and_the_next_one_forks(tmp_path: Path) -> None:
    tk = get_toolkit("2.5.0")
    first = _session(tk, tmp_path)
    assert isinstance(first, zygote.ZygoteChild)
    z = zygote.zygote_for(tk.python, WORKER, {})
    assert z is not None and psutil.Process(first.pid).ppid() == z._proc.pid
    assert os.getpgid(first.pid) == first.pid  # a session of its own: a timeout kills its whole group
    os.kill(first.pid, signal.SIGSEGV)  # fault injection: the native compiler's segfault
    assert first.wait(30) == -signal.SIGSEGV
    assert z.alive
    second = _session(tk, tmp_path)
    assert second.stdin is not None and second.stdout is not None
    second.stdin.write(b'{"op": "release"}\n')
    second.stdin.flush()
    assert json.loads(second.stdout.readline())["ok"] is True
    assert second.wait(30) == 0


def test_nothing_outlives_a_sigkilled_rkpart(tmp_path: Path) -> None:
    tk = get_toolkit("2.5.0")
    script = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from rkpart.compile import zygote
        from rkpart.compile.runner import WORKER, spawn_worker, worker_env
        tmp = Path({str(tmp_path)!r})
        (tmp / "home").mkdir(); (tmp / "tmp").mkdir()
        child = spawn_worker(Path({str(tk.python)!r}), WORKER, ["simulate"], cwd=tmp,
                             env=worker_env(tmp / "home", tmp / "tmp"), pipes=True)
        z = zygote.zygote_for(Path({str(tk.python)!r}), WORKER, {{}})
        print(child.pid, z._proc.pid, z._home, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).parents[2])
    assert r.returncode == -signal.SIGKILL, r.stderr
    worker, zyg, folder = r.stdout.split()
    assert _gone(int(worker)) and _gone(int(zyg))
    deadline = time.monotonic() + 10
    while Path(folder).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(folder).exists()


def test_off_starts_each_worker_as_its_own_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tk = get_toolkit("2.5.0")
    monkeypatch.setenv("RKPART_ZYGOTE", "0")
    child = _session(tk, tmp_path)
    assert isinstance(child, subprocess.Popen)
    assert psutil.Process(child.pid).ppid() == os.getpid()
    assert child.stdin is not None
    child.stdin.close()
    assert child.wait(60) == 0


def test_a_forked_build_past_its_timeout_is_killed_and_the_zygote_serves_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeout path through a fork: the worker's whole group is killed, its exit is the zygote's
    report (the zygote, not rkpart, is its parent), and the next build forks from the same zygote."""
    tk = get_toolkit("2.5.0")
    rng = np.random.default_rng(1)
    nodes, inits, x = [], [], "x"
    for k in range(24):  # ~50 MB of fp32 weights: seconds of build even forked from a warm zygote
        inits.append(numpy_helper.from_array(rng.random((1024, 1024), dtype=np.float32), f"W{k}"))
        nodes += [helper.make_node("MatMul", [x, f"W{k}"], [f"m{k}"]), helper.make_node("Relu", [f"m{k}"], [f"r{k}"])]
        x = f"r{k}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 64, 1024])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 1, 64, 1024])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    save(m, tmp_path / "big.onnx")
    small = _model(tmp_path / "m.onnx")
    warm = run_build(BuildJob("warm", small, tmp_path / "warm.rknn", tmp_path / "warm.log",
                              {"target_platform": "rk3588"}, tk))  # the zygote is up before the clock starts
    assert warm.ok, warm.message
    z = zygote.zygote_for(tk.python, WORKER, {})
    assert z is not None
    seen: list[int] = []
    orig = zygote.Zygote.spawn

    def spawn(self: zygote.Zygote, *a: object, **kw: object) -> zygote.ZygoteChild:
        child = orig(self, *a, **kw)  # type: ignore[arg-type]
        seen.append(child.pid)
        return child

    monkeypatch.setattr(zygote.Zygote, "spawn", spawn)  # records the fork's pid; the fork is real
    t0 = time.monotonic()
    r = run_build(BuildJob("big", tmp_path / "big.onnx", tmp_path / "big.rknn", tmp_path / "big.log",
                           {"target_platform": "rk3588"}, tk, timeout=1.0))
    wall = time.monotonic() - t0
    assert r.kind == "timeout" and r.message.startswith("timed out after 1 s (build killed)"), r.message
    assert wall < 20, wall
    assert len(seen) == 1 and _gone(seen[0]) and not (tmp_path / "big.rknn").exists()
    assert z.alive
    again = run_build(BuildJob("again", small, tmp_path / "again.rknn", tmp_path / "again.log",
                               {"target_platform": "rk3588"}, tk))
    assert again.ok and zygote.zygote_for(tk.python, WORKER, {}) is z
