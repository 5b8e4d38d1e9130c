"""The build cache and the memory model (issue 13 items 5 and 7).

Builds run through the real runner, scheduler and cache with ``tests/compile/fake_worker.py``
as the "toolkit": a fake that injects the faults a real rknn-toolkit2 does not produce on
demand (SIGTERM from outside, a build that reports disk full).  The disk-full test with a
real file system is in ``test_disk_full.py``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rkpart.compile.cache import measured_stage_bytes
from rkpart.compile.compile import CompileOptions, CompileReport, compile_plan_report
from rkpart.compile.scheduler import MEMORY_FILE, MemoryModel
from rkpart.compile.toolkits import Toolkit
from rkpart.plan.plan import Plan, load_plan
from tests.compile.conftest import FAKE_WORKER
from tests.compile.plans import tiny_plan

# outside the fast tier: compiles through the fake-toolkit runner process (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow


@pytest.fixture
def fake_toolkit() -> Toolkit:
    """FAKE: rkpart's own python running tests/compile/fake_worker.py (fault injection)."""
    import sys

    return Toolkit(version="fake", python=Path(sys.executable), managed=False)


def _compile(plan: Plan, folder: Path, tk: Toolkit, config: dict[str, Any] | None = None, **kw: Any) -> CompileReport:
    return compile_plan_report(plan, folder, CompileOptions(tk, "rk3588", config or {}, worker=FAKE_WORKER, **kw))


def _status(rep: CompileReport) -> dict[str, str]:
    return {o.stage_id: o.status for o in rep.outcomes}


def _flip_same_size(p: Path) -> None:
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(bytes(raw))


def test_corrupted_object_of_the_same_size_is_rebuilt(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    plan = tiny_plan(tmp_path)
    first = _compile(plan, tmp_path, fake_toolkit)
    art = first.plan.stage("ffn").artifact()
    assert art is not None
    obj = tmp_path / art.file
    good = obj.read_bytes()
    _flip_same_size(obj)
    second = _compile(first.plan, tmp_path, fake_toolkit)
    assert _status(second)["ffn"] == "built"
    assert obj.read_bytes() == good
    assert {k for k, v in _status(second).items() if v == "cached"} == {"erf", "conv"}


def test_corrupted_object_in_the_shared_cache_is_not_imported(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    shared = tmp_path / "shared"
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first = _compile(tiny_plan(a), a, fake_toolkit, shared_cache=shared)
    art = first.plan.stage("conv").artifact()
    assert art is not None
    shared_obj = shared / "objects" / Path(art.file).name
    assert shared_obj.is_file()
    # the plan folder holds a hard link of the shared object: break it first, then corrupt
    shutil.rmtree(a)
    _flip_same_size(shared_obj)
    second = _compile(tiny_plan(b), b, fake_toolkit, shared_cache=shared)
    assert _status(second)["conv"] == "built"
    assert _status(second)["ffn"] == "cached"


def test_sigterm_from_outside_is_not_remembered(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    """FAKE fault: the worker is killed by SIGTERM (as by a user or a service manager)."""
    plan = tiny_plan(tmp_path)
    first = _compile(plan, tmp_path, fake_toolkit, config={"fake_signal": "SIGTERM"})
    assert set(_status(first).values()) == {"failed"}
    f = first.plan.stage("ffn").failures[0]
    assert f.kind == "resource" and "SIGTERM" in f.message
    assert not list((tmp_path / "rknn" / "objects").glob("*.fail.json"))
    second = _compile(plan, tmp_path, fake_toolkit, config={"fake_signal": "SIGTERM"})
    assert "[cached failure]" not in json.dumps([o.to_json() for o in second.outcomes])
    assert all(o.wall_s > 0 for o in second.outcomes)  # built again, not read from the cache


def test_disk_full_reported_by_the_build_is_not_remembered(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    """FAKE fault: the build prints the toolkit's ENOSPC traceback and fails."""
    plan = tiny_plan(tmp_path)
    cfg = {"fake_fail": True, "fake_log": ["OSError: [Errno 28] No space left on device: '/tmp/x.rknn'"]}
    first = _compile(plan, tmp_path, fake_toolkit, config=cfg)
    f = first.plan.stage("ffn").failures[0]
    assert f.kind == "resource" and "no space left" in f.message
    assert not list((tmp_path / "rknn" / "objects").glob("*.fail.json"))


def test_deterministic_crash_is_still_remembered(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    plan = tiny_plan(tmp_path)
    cfg = {"fake_crash_stage": "erf"}
    _compile(plan, tmp_path, fake_toolkit, config=cfg)
    assert len(list((tmp_path / "rknn" / "objects").glob("*.fail.json"))) == 1
    second = _compile(plan, tmp_path, fake_toolkit, config=cfg)
    erf = next(o for o in second.outcomes if o.stage_id == "erf")
    assert erf.status == "failed" and erf.wall_s == 0  # from the cache


def test_memory_model_learns_measured_sizes_not_plan_fields(tmp_path: Path, fake_toolkit: Toolkit,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 7: a plan whose weight_bytes claim 1 TB does not teach the model a tiny ratio."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("RKPART_CACHE_DIR", str(cache))
    folder = tmp_path / "plan"
    folder.mkdir()
    plan = tiny_plan(folder)
    lying = dataclasses.replace(plan, stages=tuple(
        dataclasses.replace(s, weight_bytes=1 << 40, io_bytes=1 << 40) for s in plan.stages))
    lying.save(folder)
    plan, _ = load_plan(folder)
    _compile(plan, folder, fake_toolkit, config={"fake_alloc_mb": 20})
    data = json.loads((cache / MEMORY_FILE).read_text())
    sizes = sorted(b for b, _p in data["observations"]["fake"])
    want = sorted(measured_stage_bytes(folder / s.file) for s in plan.npu_stages)
    assert sizes == want
    m = MemoryModel(cache / MEMORY_FILE)
    assert m.estimate("fake", 277 << 20) == MemoryModel(None).estimate("fake", 277 << 20)
