"""A pass holds only live tensors: the executor drops every intermediate after the last unit that
reads it (a full-size pass otherwise kept all 169 stages' outputs, ~10 GB at 1024 tokens, and the
28-block drift run was OOM-killed), and the results are unchanged.  Real ONNX Runtime; the
wrapper below only records how many tensors each stage call sees."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rkpart.plan.plan import Plan
from rkpart.runtime.executor import PlanExecutor, random_inputs
from tests.runtime.counting import CountingOrt


class EnvSizes(CountingOrt):
    """The real ORT backend; each runner also records the size of the pass's tensor map it is given."""

    def __init__(self) -> None:
        super().__init__("npu-ort", ("npu", "host"))
        self.sizes: list[int] = []

    def runner(self, stage, folder):  # type: ignore[no-untyped-def]
        r = super().runner(stage, folder)
        sizes, inner_into = self.sizes, r.infer_into

        def infer_into(env: dict[str, np.ndarray]) -> None:
            sizes.append(len(env))
            inner_into(env)

        r.infer_into = infer_into  # type: ignore[method-assign]
        return r


@pytest.mark.parametrize("name", ["split", "fused"])
def test_a_pass_holds_only_live_tensors_and_gives_the_same_result(plans: dict[str, tuple[Plan, Path]],
                                                                  name: str) -> None:
    plan, folder = plans[name]
    feeds = [random_inputs(plan.tensors, plan.inputs, seed=s) for s in (1, 2)]
    with PlanExecutor(plan, folder, residency="resident") as ex:
        kept = ex.run_passes(feeds, keep=True)
        outs = ex.run_passes(feeds)
    for k, o in zip(kept, outs, strict=True):
        assert o.keys() == set(plan.outputs)
        assert all(np.array_equal(o[t], k[t]) for t in plan.outputs)

    # every tensor dropped after unit k is read by no later unit and is not a model output
    reads = [{t for m in u.members for t in m.inputs} for u in ex.units]
    dropped = [t for d in ex._drop for t in d]
    assert len(dropped) == len(set(dropped))
    for k, d in enumerate(ex._drop):
        later = set().union(*reads[k + 1:])
        assert not (set(d) & later) and not (set(d) & set(plan.outputs))

    # the tensor map a stage sees is bounded by what is live, not by everything produced so far
    probe = EnvSizes()
    with PlanExecutor(plan, folder, backend=probe, host=probe, residency="resident", fuse_host=False) as ex2:
        ex2.run_passes(feeds[:1])
    produced = len(plan.inputs) + sum(len(s.outputs) for s in plan.stages)
    live_max = max(probe.sizes)
    assert len(probe.sizes) == len(plan.stages)
    assert live_max < produced
    assert probe.sizes[-1] < produced - len(plan.stages) // 2  # the last stage no longer sees the early ones
