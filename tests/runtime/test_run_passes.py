"""``PlanExecutor.run_passes``: independent passes run stage-major (CFG's two passes) give exactly
what :meth:`PlanExecutor.run` gives for each, and load a per-stage stage once for all of them.

Real ONNX Runtime; :mod:`tests.runtime.counting` only counts its calls.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rkpart.plan.plan import Plan
from rkpart.runtime.executor import PlanExecutor, random_inputs
from tests.runtime.counting import CountingOrt


@pytest.mark.parametrize("residency", ["resident", "per-stage"])
def test_passes_equal_one_run_each(plans: dict[str, tuple[Plan, Path]], residency: str) -> None:
    plan, folder = plans["split"]
    feeds = [random_inputs(plan.tensors, plan.inputs, seed=s) for s in (1, 2)]
    with PlanExecutor(plan, folder, residency=residency) as ex:
        one = [ex.run(f) for f in feeds]
    seen: list[tuple[int, str]] = []
    npu = CountingOrt("npu-ort", ("npu",))
    with PlanExecutor(plan, folder, backend=npu, residency=residency) as ex:
        both = ex.run_passes(feeds, on_stage=lambda p, _i, sid, _o: seen.append((p, sid)))
    for a, b in zip(one, both, strict=True):
        assert a.keys() == b.keys()
        assert all(np.array_equal(a[k], b[k]) for k in a)
    out = plan.outputs[0]
    assert not np.array_equal(both[0][out], both[1][out])  # two different passes
    # stage-major: each stage serves pass 0 then pass 1 before the next stage runs
    order = [sid for p, sid in seen if p == 0]
    assert seen == [(p, sid) for sid in order for p in (0, 1)]
    npu_ids = [s.id for s in plan.npu_stages]
    assert all(npu.counts.init[s] == 1 and npu.counts.infer[s] == 2 for s in npu_ids)  # once for both passes
