"""Shared assertions for partitioner tests: a plan must reproduce its whole model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.discovery.structure import Discovery
from rkpart.grouping.strategies.base import propose_with
from rkpart.ir import ModelGraph
from rkpart.pipeline import partition
from rkpart.plan.plan import Plan
from rkpart.runtime.executor import random_inputs, run_model, run_plan
from rkpart.validation.metrics import compare

MIN_COSINE = 0.999999
MAX_ABS_REL = 1e-5


def assert_reproduces(plan: Plan, folder: Path, model: Path, feeds: dict[str, np.ndarray] | None = None) -> None:
    """Run ``plan`` stage by stage with ONNX Runtime; every output must match the whole model."""
    if feeds is None:
        feeds = random_inputs(plan.tensors, plan.inputs, seed=0)
    ref = run_model(model, feeds)
    got = run_plan(plan, folder, feeds)
    for name in plan.outputs:
        m = compare(got[name], ref[name])
        assert m.nan == 0 and m.inf == 0, f"{name}: {m}"
        assert m.cosine >= MIN_COSINE, f"{name}: cosine {m.cosine}"
        assert m.max_abs <= MAX_ABS_REL * m.ref_max_abs, f"{name}: max abs {m.max_abs} vs {m.ref_max_abs}"


def partition_and_check(model: Path, out: Path, strategy: str, *, feeds: dict[str, np.ndarray] | None = None,
                        **options: Any) -> Plan:
    plan = partition(model, out, strategy, **options)
    assert_reproduces(plan, out, model, feeds)
    return plan


def npu_per_block(plan: Plan) -> Counter[int]:
    """NPU stage count per block index."""
    c: Counter[int] = Counter()
    for s in plan.npu_stages:
        for b in s.blocks or ((s.block,) if s.block is not None else ()):
            c[b] += 1
    return c


def region_table(mg: ModelGraph, disc: Discovery) -> list[tuple[str, ...]]:
    """Per block: ``name:kind`` of its regions (what must survive anonymisation)."""
    return [tuple(f"{r.name}:{r.kind}:{r.adaln}" for r in b.regions) for b in disc.blocks]


def region_sizes(disc: Discovery) -> list[tuple[tuple[int, int, int, int, int], ...]]:
    """Per block and region: sizes of pre / core / gate / adds / mod op sets."""
    return [tuple((len(r.pre), len(r.core), len(r.gate), len(r.adds), len(r.mod)) for r in b.regions)
            for b in disc.blocks]


def host_adaln_ops(mg: ModelGraph, disc: Discovery, **options: Any) -> list[int]:
    """``pre`` (AdaLN) ops of any region that the split strategy leaves on the host."""
    from rkpart.grouping.groups import order_groups
    from rkpart.grouping.strategies import get_strategy

    groups = order_groups(mg, propose_with(get_strategy("split"), mg, disc, options))
    on_npu = {i for g in groups if g.device == "npu" for i in g.ops}
    return sorted(i for b in disc.blocks for r in b.regions for i in r.pre if i not in on_npu)
