"""Compile never loses a stage to an NPU rewrite (issue 18): a stage whose build fails with its
rewrites is rebuilt without them, then with one dropped at a time, and plan.json and the report
say which rewrite was dropped and why.

The crash is real: ``nan-guard`` as first written (its fill not broadcast to the mask's shape,
``broadcast_fill=False``) makes rknn-toolkit2 2.5.0 segfault in ``convert_exmatmul_to_conv`` on
Lumina2's caption-refiner attention (tiny real export, TorchScript).  That form is put back in
the table for the test, alongside ``tile-broadcast`` which the same stage also matches: the
retry must drop only the crash form and keep ``tile-broadcast``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import onnx
import pytest

import rkpart.targets.rewrites as rw
from rkpart.commands.compile import format_summary
from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.pipeline import partition
from rkpart.plan.plan import load_plan
from rkpart.targets.rewrites.npu import nan_guard
from tests.models.diffusers_families import cached_export, missing_dependencies
from tests.toolkits import get_toolkit

pytestmark = [pytest.mark.toolkit, pytest.mark.slow, pytest.mark.export,
              pytest.mark.skipif(bool(missing_dependencies()), reason=f"not installed: {missing_dependencies()}")]

CRASH_FORM = "nan-guard-unbroadcast"


def _caption_plan(tmp_path: Path) -> tuple[Path, str]:
    folder = tmp_path / "plan"
    plan = partition(cached_export("lumina2", "torchscript"), folder, "split")
    ids = [s.id for s in plan.npu_stages
           if "IsNaN" in {n.op_type for n in onnx.load(str(folder / s.file), load_external_data=False).graph.node}]
    # the caption refiner's attention, then the joint blocks' (their key mask hides the caption slots past
    # the caption's length since the export takes the mask as a graph input)
    assert ids == ["b00.attn_txt", "b02.attn", "b03.attn"], ids
    return folder, ids[0]


def test_a_rewrite_the_toolkit_crashes_on_is_dropped_and_the_stage_builds(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    table = tuple(dataclasses.replace(r, name=CRASH_FORM, apply=functools.partial(nan_guard, broadcast_fill=False))
                  if r.name == "nan-guard" else r for r in rw.REWRITES)
    monkeypatch.setattr(rw, "REWRITES", table)
    folder, sid = _caption_plan(tmp_path)
    plan, _ = load_plan(folder)
    said: list[str] = []
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit("2.5.0"), "rk3588", {}, cache=False,
                                                           stages=[sid]), progress=said.append)
    (o,) = rep.outcomes
    assert o.status == "built" and o.artifact is not None
    assert "IsNaN:" in " ".join(o.cpu_ops)  # built without the guard's rewrite: the IsNaN is back on the CPU
    assert set(o.dropped_rewrites) == {CRASH_FORM}
    assert "SIGSEGV" in o.dropped_rewrites[CRASH_FORM] and "2.5.0" in o.dropped_rewrites[CRASH_FORM]
    # recorded in plan.json: the other rewrite of the stage is kept (one dropped at a time)
    stage = next(s for s in json.loads((folder / "plan.json").read_text())["stages"] if s["id"] == sid)
    kept = stage["prepared"]["rewrites"]
    assert kept.pop("dedupe-constants") > 0 and kept == {"tile-broadcast": 2}
    assert set(stage["prepared"]["dropped_rewrites"]) == {CRASH_FORM}
    assert stage["failures"] == []
    # reported, and the crashed build's log is kept beside the retries'
    assert any(m.startswith(f"[rewrite dropped] {sid}: {CRASH_FORM}: ") for m in said)
    assert f"{sid}: NPU rewrite {CRASH_FORM} dropped: " in format_summary(rep)
    logs = sorted(p.name for p in (folder / "rknn" / "logs").iterdir())
    assert f"{sid}.2.5.0.log" in logs and len(logs) == 3  # with both, without both, without the crash form
    assert "convert_exmatmul_to_conv" in (folder / "rknn" / "logs" / f"{sid}.2.5.0.log").read_text(errors="replace")


@pytest.mark.parametrize("version", ["2.5.0", "2.3.0"])
def test_nan_guard_builds_the_caption_refiner_with_the_guard_on_the_npu(tmp_path: Path, version: str) -> None:
    """The table's nan-guard (fill broadcast to the mask's shape): no crash, no rewrite dropped, no IsNaN
    on the CPU (the mask's int64 Reshape and Cast are the partitioner's to move)."""
    folder, sid = _caption_plan(tmp_path)
    plan, _ = load_plan(folder)
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit(version), "rk3588", {}, cache=False,
                                                           stages=[sid]))
    (o,) = rep.outcomes
    assert o.status == "built" and not o.dropped_rewrites, o.failures
    assert not any(op.startswith("IsNaN:") for op in o.cpu_ops), o.cpu_ops
    assert rep.plan.stage(sid).prepared["rewrites"]["nan-guard"] == 1  # type: ignore[index]
