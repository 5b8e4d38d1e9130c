"""A stage runner as a context manager, and its check of a feed against the plan's boundary types.

``with backend.runner(stage, folder).expect(plan.tensors) as r`` is loaded and initialised on entry
and released on exit, whatever the block raised; its first inference refuses an input whose dtype
or shape is not what plan.json declares, naming both, before the backend sees it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rkpart.errors import InternalError, SpecError
from rkpart.runtime.ort import OrtBackend
from tests.runtime.plans import D, T, host_run_plan


@pytest.mark.slow  # two ONNX Runtime sessions (about a second)
def test_a_runner_is_ready_inside_its_block_and_released_after(tmp_path: Path) -> None:
    plan = host_run_plan(tmp_path)
    x = np.ones((T, D), np.float32)
    with OrtBackend().runner(plan.stage("scale"), tmp_path).expect(plan.tensors) as r:
        out = r.infer({"x": x})
        assert out["s"].shape == (T, D) and r._state == "ready"
    assert r._state == "released"
    with pytest.raises(InternalError, match=r"infer\(\) called in state 'released'"):
        r.infer({"x": x})
    with pytest.raises(RuntimeError, match="inside"), OrtBackend().runner(plan.stage("scale"), tmp_path) as r2:
        raise RuntimeError("inside")
    assert r2._state == "released"


@pytest.mark.parametrize(("feed", "got"), [(np.ones((T, D), np.float64), "float64"),
                                           (np.ones((T, 3), np.float32), r"float32\[32, 3\]")])
def test_the_first_inference_checks_the_feed_against_the_plan(tmp_path: Path, feed: np.ndarray, got: str) -> None:
    plan = host_run_plan(tmp_path)
    want = rf"stage scale input 'x': dtype and shape {got}.*plan.json declares float32\[{T}, {D}\]"
    with OrtBackend().runner(plan.stage("scale"), tmp_path).expect(plan.tensors) as r, \
            pytest.raises(SpecError, match=want):
        r.infer({"x": feed})
    # without the plan's types the backend is the judge, as before (ONNX Runtime refuses the float64 feed)
    with OrtBackend().runner(plan.stage("scale"), tmp_path) as r, pytest.raises(Exception, match=r"double|shape|dim"):
        r.infer({"x": feed})
