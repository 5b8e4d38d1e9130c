"""Disk full during ``partition`` and ``compile`` (issue 13): a real, small tmpfs.

The test mounts a tmpfs of a few hundred kB (root only; skipped otherwise) and runs real
``rkpart`` processes on it: ENOSPC gives one line and a documented exit code, the partition
staging folder is removed, nothing outside is touched, and a disk-full build is not
remembered as a failure, so a rerun with space builds it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostile.models import siblings
from tests.integrity.test_confinement import one_line_error, rkpart

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a tmpfs needs root"),
              pytest.mark.slow]  # a tmpfs mount and CLI processes: outside the fast tier


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _resize(d: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(d)], check=True)


def _fill(d: Path, leave: int) -> Path:
    """Fill ``d`` until ``leave`` bytes are free; returns the filler file."""
    filler = d / "filler"
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def test_partition_disk_full(tmpfs: Path, bundled: Path, tmp_path: Path) -> None:
    out = tmpfs / "plan"
    r = rkpart("partition", bundled, "-o", out, "-q")  # the bundled plan needs ~1.8 MB
    one_line_error(r, 10, "no space left on device")
    assert not out.exists()
    assert siblings(out) == []  # the staging folder does not keep filling the disk
    assert list(tmpfs.iterdir()) == []
    _resize(tmpfs, "8m")
    r = rkpart("partition", bundled, "-o", out, "-q")
    assert r.returncode == 0, r.stderr


def _compile_disk_full(tmpfs: Path, plan_src: Path, toolkit: list[str], cache: Path) -> None:
    plan = tmpfs / "plan"
    shutil.copytree(plan_src, plan)
    filler = _fill(tmpfs, 16 << 10)
    r = rkpart("compile", plan, *toolkit, "--cache-dir", cache, "-q")
    one_line_error(r, 10, "no space left on device")
    assert not list(plan.glob("rknn/objects/*.fail.json")), "a disk-full build was cached as a failure"
    assert not list(cache.glob("objects/*.fail.json"))
    filler.unlink()
    _resize(tmpfs, "64m")
    r = rkpart("compile", plan, *toolkit, "--cache-dir", cache, "-q")
    assert r.returncode == 0, r.stderr
    assert "[cached failure]" not in r.stderr + r.stdout
    data = json.loads((plan / "plan.json").read_text())
    assert all(s["artifacts"] for s in data["stages"] if s["device"] == "npu")


@pytest.mark.toolkit
def test_compile_disk_full_real_toolkit(tmpfs: Path, fused_mini_plan: Path, tmp_path: Path) -> None:
    from rkpart.compile.toolkits import find_toolkit
    from rkpart.errors import ToolkitError

    try:
        find_toolkit("2.3.0")
    except ToolkitError as e:
        pytest.skip(f"rknn-toolkit2 2.3.0 not installed: {e}")
    _compile_disk_full(tmpfs, fused_mini_plan, ["--toolkit", "2.3.0"], tmp_path / "cache")
