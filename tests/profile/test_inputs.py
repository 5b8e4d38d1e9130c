"""`rkpart run`, `rkpart profile` and the bundle's reference feed a plan the same seeded inputs (one
generator, :func:`rkpart.roles.pass_inputs`): floats drawn, masks all-valid, id grids and integer
inputs their neutral value, never noise."""

from __future__ import annotations

import numpy as np

from rkpart.ir.tensors import random_feeds
from rkpart.plan.plan import Plan, TensorInfo
from rkpart.profile.lifecycle import make_inputs
from rkpart.roles import pass_inputs


def test_profile_inputs_are_the_run_inputs_for_the_same_seed() -> None:
    tensors = {"latent": TensorInfo("latent", "float32", (1, 4, 8)), "ids": TensorInfo("ids", "int64", (1, 16)),
               "mask": TensorInfo("mask", "bool", (1, 16)), "img_ids": TensorInfo("img_ids", "float32", (16, 3)),
               "attn_mask": TensorInfo("attn_mask", "float32", (1, 16)),
               "labels": TensorInfo("labels", "int64", (1,)), "ctx": TensorInfo("ctx", "float32", (1, 6, 8))}
    plan = Plan(model={}, strategy={"name": "x"}, inputs=tuple(tensors), outputs=(), tensors=tensors, stages=())
    for seed in (0, 7):
        prof, run = make_inputs(plan, seed), pass_inputs(plan, None, seed)
        assert prof.keys() == run.keys() == set(tensors)
        for k in prof:
            assert prof[k].dtype == run[k].dtype and np.array_equal(prof[k], run[k]), k
        # the floats are the values rkpart always drew for this seed (a float-only model's run is unchanged)
        drawn = random_feeds(((n, t.dtype, t.shape) for n, t in tensors.items()), seed)
        assert np.array_equal(prof["latent"], drawn["latent"]) and np.array_equal(prof["ctx"], drawn["ctx"])
        # no noise in a mask, an id grid or an integer input
        assert prof["mask"].dtype == bool and prof["mask"].all()
        assert np.array_equal(prof["attn_mask"], np.ones((1, 16), np.float32))
        assert not prof["ids"].any() and not prof["img_ids"].any() and not prof["labels"].any()
