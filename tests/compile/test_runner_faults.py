"""Build failures in words, with a FAKE worker that injects the faults a real toolkit produces
only on some graphs or machines (segfault, OOM kill, MemoryError, hang)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from rkpart.compile.runner import BuildJob, BuildResult, run_build
from rkpart.compile.toolkits import Toolkit
from tests.compile.conftest import FAKE_WORKER

# outside the fast tier: runner subprocesses with injected faults (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

RECORDED_STEPS = [
    "D fuse_ops ...",
    "D fuse_ops results:",
    "D     convert_layernorm_to_exnorm: remove node = ['ln'], add node = ['ln#1']",
    "D     fuse_exnorm_mul: remove node = ['lm'], add node = []",
    "I rknn building ...",
]


def _build(tmp_path: Path, tk: Toolkit, timeout: float | None = None, **cfg: Any) -> BuildResult:
    onnx = tmp_path / "s.onnx"
    onnx.write_bytes(b"not really onnx")
    job = BuildJob(stage_id="s", onnx=onnx, output=tmp_path / "out" / "s.rknn", log=tmp_path / "s.log",
                   config=cfg, toolkit=tk, timeout=timeout, worker=FAKE_WORKER)
    return run_build(job, tmp_parent=tmp_path / "tmp")


def test_success_moves_output_and_records_size(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    r = _build(tmp_path, fake_toolkit)
    assert r.ok and r.kind == "ok" and r.exit_code == 0 and r.signal is None
    assert (tmp_path / "out" / "s.rknn").read_bytes() == b"not really onnx"
    assert r.rknn_size == len(b"not really onnx")
    assert list((tmp_path / "tmp").iterdir()) == []  # work dir removed


def test_segfault_is_reported_with_signal_and_last_step(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    r = _build(tmp_path, fake_toolkit, fake_log=RECORDED_STEPS, fake_signal="SIGSEGV")
    assert not r.ok and r.kind == "crash"
    assert r.signal == "SIGSEGV" and r.exit_code == 139
    assert r.message == "compiler crashed: SIGSEGV (exit 139) in rknn-toolkit2 fake, last step fuse_exnorm_mul"
    assert not (tmp_path / "out" / "s.rknn").exists()


def test_sigkill_is_reported_as_out_of_memory(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    r = _build(tmp_path, fake_toolkit, fake_alloc_mb=64, fake_signal="SIGKILL")
    assert r.kind == "oom" and r.signal == "SIGKILL" and r.exit_code == 137
    assert r.message.startswith("out of memory: killed by SIGKILL at ")
    assert "OOM killer" in r.message


def test_memoryerror_is_reported_as_out_of_memory(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    r = _build(tmp_path, fake_toolkit, fake_memoryerror=True)
    assert r.kind == "oom" and r.exit_code == 4
    assert r.message.startswith("out of memory: MemoryError")


def test_toolkit_error_is_reported_with_its_message(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    r = _build(tmp_path, fake_toolkit, fake_fail=True, fake_log=RECORDED_STEPS)
    assert r.kind == "error"
    assert r.message == ("build failed: build returned -1 (exit 3) in rknn-toolkit2 fake, "
                         "last step fuse_exnorm_mul")


#: how rknn-toolkit2 2.3.0 reports an exception inside an optimiser rule: the traceback folded into the message
FOLDED = ("ValueError: Traceback (most recent call last):\n"
          '  File "rknn/api/rknn_log.py", line 344, in rknn.api.rknn_log.error_catch_decorator.error_catch_wrapper\n'
          '  File "rknn/api/rules/reduce.py", line 1332, in rknn.api.rules.reduce._p_remove_parallel_node\n'
          "ValueError: 'x_rs#2' is not in list\n")


def test_a_traceback_in_the_toolkit_error_is_reported_as_one_line(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    r = _build(tmp_path, fake_toolkit, fake_fail=FOLDED, fake_log=RECORDED_STEPS)
    assert r.message == ("build failed: ValueError: 'x_rs#2' is not in list (in "
                         "rknn.api.rules.reduce._p_remove_parallel_node) (exit 3) in rknn-toolkit2 fake, "
                         "last step fuse_exnorm_mul")


def test_peak_rss_covers_the_allocation(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    r = _build(tmp_path, fake_toolkit, fake_alloc_mb=200, fake_sleep=0.6)
    assert r.ok
    assert r.peak_rss_bytes >= 200 * 2**20


@pytest.mark.slow
def test_timeout_kills_the_whole_process_group_and_cleans_up(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    pidfile = tmp_path / "child.pid"
    t0 = time.monotonic()
    r = _build(tmp_path, fake_toolkit, timeout=1.0, fake_sleep=60, fake_child=str(pidfile))
    assert time.monotonic() - t0 < 10
    assert r.kind == "timeout"
    assert r.message.startswith("timed out after 1 s (build killed) in rknn-toolkit2 fake")
    child = int(pidfile.read_text())
    # the grandchild was in the build's process group: it must be gone (or a zombie of init)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not any(p.name.endswith(".part") for p in (tmp_path / "out").iterdir())
    assert os.path.exists(r.log)
