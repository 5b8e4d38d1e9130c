"""The sampler, and a stage with a known allocation whose PSS the records must show."""

from __future__ import annotations

import mmap
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rkpart.profile import records as rec
from rkpart.profile.memory import Sampler
from tests.profile.plans import big_intermediate_plan

# outside the fast tier: measures a 64 MiB allocation in a fresh process (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

MIB = 1024  # KiB


def test_sampler_thread_sees_a_transient_allocation_and_measures_itself() -> None:
    with Sampler(interval=0.005, device_pattern=None) as s:
        base = s.snapshot().pss_kib
        t0 = time.perf_counter()
        # 64 MiB mapped by us, every page written, unmapped after: not from malloc, which keeps
        # freed memory in the process once an ONNX Runtime session was made in it
        # (rkpart.runtime.malloc; a test before this one on the same worker may have made one)
        block = mmap.mmap(-1, 64 * 2**20)
        for off in range(0, len(block), mmap.PAGESIZE):
            block[off] = 1
        # until the thread has sampled it a few times (0.2 s at the 5 ms interval on an idle machine;
        # a loaded one schedules the thread less often)
        ticks, deadline = s.ticks, time.perf_counter() + 10
        while s.ticks - ticks < 8 and time.perf_counter() < deadline:
            time.sleep(0.02)
        block.close()
        t1 = time.perf_counter()
        after = s.snapshot().pss_kib
    peaks = s.peaks([(t0, t1)])
    assert peaks.samples >= 5
    assert peaks.pss_kib is not None and peaks.pss_kib - base >= 60 * MIB
    assert after - base < 32 * MIB  # gone again: the peak came from the thread, not the snapshots
    assert s.ticks >= 5 and s.thread_s > 0 and s.snapshots == 3 and s.snapshot_s > 0
    assert peaks.device_pss_kib is None  # device sampling was off


def test_device_pattern_reads_full_smaps_and_reports_zero_without_npu() -> None:
    with Sampler(interval=0) as s:
        smp = s.snapshot()
    assert smp.device_pss_kib == 0 and smp.sync and smp.cost_s > 0
    assert s.ticks == 0  # interval 0: no thread


def test_stage_with_64_mib_intermediate_shows_it_in_its_record(tmp_path: Path) -> None:
    # ORT keeps the Expand output's arena block until the session is released, so the
    # snapshot after inference sees it even if no sampler tick falls inside the 50 ms run.
    # A fresh process (the real CLI) so that no memory freed by earlier tests is reused for
    # the intermediate, which would hide part of it from PSS.
    big_intermediate_plan(tmp_path / "plan", rows=4096)  # 4096 x 4096 float32 = 64 MiB
    out = tmp_path / "big.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "rkpart.cli", "profile", str(tmp_path / "plan"), "--rounds", "2", "--warmup", "0",
         "--no-cfg", "--interval", "0.01", "-q", "-o", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    recs = rec.read_jsonl(out)
    stage_recs = [r for r in recs if r["record"] == "stage"]
    assert len(stage_recs) == 2
    for r in stage_recs:
        mem = r["memory"]
        assert mem["pss_peak_kib"] - mem["pss_before_kib"] >= 64 * MIB
        # The snapshot after inference may come after the allocator handed a few pages of the
        # stage's own inputs back (CI once saw 63.95 MiB): the arena block must still be there,
        # so most of the 64 MiB, and far more than a run without it (under 1 MiB).
        assert mem["pss_after_infer_kib"] - mem["pss_before_kib"] >= 60 * MIB
    for r in (r for r in recs if r["record"] == "round"):
        assert r["memory"]["pss_peak_kib"] >= stage_recs[0]["memory"]["pss_before_kib"] + 64 * MIB
