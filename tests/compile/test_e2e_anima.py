"""End to end on the bundled example: partition -> compile with real toolkits -> simulator run.

This is the issue's "must show": the ``split`` and ``fused`` plans of the bundled Anima-style
model compile with 2.3.0 and 2.5.0 and match ONNX Runtime on the whole model in the
simulator (cosine >= 0.999); 2.3.2 segfaults on every ``fused`` block (reported per stage,
rkpart exits in a controlled way) while the ``split`` plan, AdaLN on the host, compiles.
About a minute per (toolkit, strategy) on two cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.compile.toolkits import Toolkit
from rkpart.plan.plan import Plan
from rkpart.runtime.executor import random_inputs, run_model, run_plan
from rkpart.runtime.rknn_sim import RknnSimBackend
from rkpart.validation.metrics import compare
from tests.toolkits import get_toolkit

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]

MODEL = Path(__file__).parents[2] / "rkpart" / "data" / "anima_tiny.onnx"


def _partition(folder: Path, strategy: str) -> Plan:
    if not MODEL.is_file():
        pytest.skip("bundled example rkpart/data/anima_tiny.onnx is missing")
    from rkpart.pipeline import partition

    return partition(MODEL, folder, strategy)


@pytest.mark.parametrize("version", ["2.3.0", "2.5.0"])
@pytest.mark.parametrize("strategy", ["split", "fused"])
def test_plan_compiles_and_matches_onnxruntime_in_the_simulator(tmp_path: Path, strategy: str,
                                                                 version: str) -> None:
    tk: Toolkit = get_toolkit(version)
    plan = _partition(tmp_path / "plan", strategy)
    rep = compile_plan_report(plan, tmp_path / "plan", CompileOptions(tk, "rk3588", {}, jobs=2))
    assert not rep.failed, [f.message for o in rep.failed for f in o.failures]
    assert all(s.artifact() is not None for s in rep.plan.npu_stages)
    feeds = random_inputs(plan.tensors, plan.inputs, seed=0)
    ref = run_model(MODEL, feeds, plan.outputs)
    out = run_plan(rep.plan, tmp_path / "plan", feeds, backend=RknnSimBackend(version))
    for name in plan.outputs:
        m = compare(out[name], ref[name])
        assert m.cosine >= 0.999, (name, m)
        assert m.nan == 0 and m.inf == 0


def test_232_segfaults_on_fused_blocks_but_compiles_split(tmp_path: Path) -> None:
    tk = get_toolkit("2.3.2")
    fused = _partition(tmp_path / "fused", "fused")
    rep = compile_plan_report(fused, tmp_path / "fused", CompileOptions(tk, "rk3588", {}, jobs=2))
    assert rep.failed and len(rep.failed) == len(fused.npu_stages)
    for o in rep.failed:
        assert o.failures[0].message.startswith("compiler crashed: SIGSEGV (exit 139) in rknn-toolkit2 2.3.2")
    split = _partition(tmp_path / "split", "split")
    rep = compile_plan_report(split, tmp_path / "split", CompileOptions(tk, "rk3588", {}, jobs=2))
    assert not rep.failed and len(rep.built) == len(split.npu_stages)
