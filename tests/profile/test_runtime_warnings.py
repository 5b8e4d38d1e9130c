"""Board profiling warns when the board runtime differs from the toolkit that built the stages."""

from __future__ import annotations

import dataclasses

from rkpart.plan.plan import Artifact
from rkpart.profile.run import runtime_warnings


def _compiled(plan, toolkit):
    art = Artifact(kind="rknn", file="rknn/x.rknn", toolkit=toolkit, target="rk3588", config_hash="c",
                   sha256="0" * 64, size_bytes=1)
    for s in plan.npu_stages:
        plan = plan.replace_stage(dataclasses.replace(s, artifacts=(art,)))
    return plan


def test_mismatch_is_warned_on_the_board_only(plans):
    plan = _compiled(plans["split"][0], "2.5.0")
    board = {"backend": "rknnlite", "runtime": "rknn-toolkit-lite2 2.3.0"}
    warnings = runtime_warnings(plan, board)
    assert len(warnings) == 1
    assert "2.5.0" in warnings[0] and "2.3.0" in warnings[0] and "b00.attn" in warnings[0]
    assert runtime_warnings(plan, {"backend": "rknnlite", "runtime": "rknn-toolkit-lite2 2.5.0"}) == []
    # the simulator and ONNX Runtime do not load .rknn files: nothing to warn about
    assert runtime_warnings(plan, {"backend": "ort"}) == []
    assert runtime_warnings(plan, {"backend": "rknn-sim", "runtime": "x 2.3.0"}) == []
