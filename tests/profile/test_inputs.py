"""`rkpart run` and `rkpart profile` feed a plan the same seeded inputs (one generator)."""

from __future__ import annotations

import numpy as np

from rkpart.plan.plan import Plan, TensorInfo
from rkpart.profile.lifecycle import make_inputs
from rkpart.runtime.executor import random_inputs


def test_profile_inputs_are_the_run_inputs_for_the_same_seed() -> None:
    tensors = {"latent": TensorInfo("latent", "float32", (1, 4, 8)), "ids": TensorInfo("ids", "int64", (1, 16)),
               "mask": TensorInfo("mask", "bool", (1, 16))}
    plan = Plan(model={}, strategy={"name": "x"}, inputs=("latent", "ids", "mask"), outputs=(), tensors=tensors,
                stages=())
    for seed in (0, 7):
        prof, run = make_inputs(plan, seed), random_inputs(plan.tensors, plan.inputs, seed)
        assert prof.keys() == run.keys() == {"latent", "ids", "mask"}
        for k in prof:
            assert prof[k].dtype == run[k].dtype and np.array_equal(prof[k], run[k]), k
    # integers are drawn too (in [0, 4)), not zeros: index-like inputs stay in range
    ids = make_inputs(plan, 0)["ids"]
    assert ids.min() >= 0 and ids.max() < 4 and ids.any()
