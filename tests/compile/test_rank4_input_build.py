"""rknn-toolkit2 2.3.0 and a rank-5 stage input: a CPU Reshape, unless the plan hands over a rank-4 view.

The same patch embedding (``tests/partitioner/test_rank4_inputs.py``) built as one model with its
rank-5 input has 1 CPU layer (``Reshape:x_rs``, inserted by the toolkit); its rkpart plan, whose
NPU stage reads the rank-4 view, builds with none, and the simulator reproduces the model.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.pipeline import partition
from rkpart.runtime.executor import random_inputs, run_model, run_plan
from rkpart.runtime.rknn_sim import RknnSimBackend
from rkpart.validation.metrics import compare
from tests.compile.test_rewrites_npu import _cpu_layers
from tests.partitioner.test_rank4_inputs import patch_embed_model
from tests.toolkits import get_toolkit

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]


def test_a_rank4_view_takes_the_input_reshape_off_the_cpu(tmp_path: Path) -> None:
    model = patch_embed_model(tmp_path / "m.onnx")
    before, _ = _cpu_layers(tmp_path / "whole", onnx.load(str(model)).graph, "2.3.0", 17, rewrites=False)
    assert before == ("Reshape:x_rs",), before
    folder = tmp_path / "plan"
    plan = partition(model, folder, "generic")
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit("2.3.0"), "rk3588", {}, cache=False))
    assert not rep.failed and [o.cpu_ops for o in rep.outcomes] == [()]
    feeds = random_inputs(plan.tensors, plan.inputs, seed=0)
    out = run_plan(rep.plan, folder, feeds, backend=RknnSimBackend("2.3.0"))
    m = compare(out["y"], run_model(model, feeds, plan.outputs)["y"])
    assert m.cosine >= 0.999 and m.nan == 0, m
