"""NPU coverage figures and cycle-free grouping, on the bundled example (fast tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rkpart.discovery.recognizers import discover
from rkpart.errors import InternalError, SpecError
from rkpart.grouping.coverage import MIN_SHARE, strategy_coverage
from rkpart.grouping.groups import Group, Partition, convex_hull, order_groups
from rkpart.grouping.strategies.base import GroupBuilder
from rkpart.ir import ModelGraph, load_model
from rkpart.ir.work import GEMV_ROWS, output_rows, token_macs
from rkpart.pipeline import partition


def test_token_macs_leave_out_modulation_gemvs(example_model: Path) -> None:
    mg = load_model(example_model)
    d = discover(mg)
    b = d.blocks[0]
    counted = token_macs(mg, b.ops)
    mod = set(b.mod) | {i for r in b.regions for i in r.mod}
    mod_mm = [i for i in mod if mg.nodes[i].op_type in ("MatMul", "Gemm")]
    assert mod_mm, "the example's blocks have their own AdaLN modulation linears"
    assert all(output_rows(mg, i) <= GEMV_ROWS and i not in counted for i in mod_mm)
    # every token-wise projection of the attention core is counted
    core_mm = [i for i in b.regions[0].core if mg.nodes[i].op_type == "MatMul"]
    assert core_mm and all(i in counted and counted[i] > 0 for i in core_mm)


def test_split_and_fused_cover_every_block_matmul(example_model: Path, tmp_path: Path) -> None:
    mg = load_model(example_model)
    cov = strategy_coverage(mg, discover(mg))
    assert {k: c.share for k, c in cov.items()} == {"split": 1.0, "fused": 1.0}
    partition(example_model, tmp_path / "p", "split")
    extra = json.loads((tmp_path / "p" / "plan.json").read_text())["extra"]
    assert extra["npu_coverage"]["share"] == 1.0
    assert extra["npu_coverage"]["npu_macs"] == extra["npu_coverage"]["block_macs"] > 0


def test_partition_warns_when_block_matmuls_run_on_the_host(example_model: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"version": 1, "rest": "host", "stages": [{"id": "only0", "blocks": [0]}]}))
    messages: list[str] = []
    plan = partition(example_model, tmp_path / "p", "custom", spec=spec, progress=messages.append)
    share = plan.extra["npu_coverage"]["share"]
    assert 0.3 < share < MIN_SHARE  # block 0 of 2 on the NPU
    warning = [m for m in messages if "matmul work is in NPU stages" in m]
    assert len(warning) == 1 and warning[0].startswith("warning: custom: only ")
    assert any("matmul work" in n for n in plan.extra["notes"])


def test_builder_absorbs_the_ops_between_an_npu_groups_ops(example_model: Path) -> None:
    """An op left out of the middle of a stage would make a cycle through the host: it joins."""
    mg = load_model(example_model)
    d = discover(mg)
    block = d.blocks[0]
    ops = set(block.ops)
    core = sorted(block.regions[0].core)
    hole = core[len(core) // 2]
    assert hole in convex_hull(mg, ops - {hole})
    gb = GroupBuilder()
    gb.add("b00", ops - {hole}, device="npu", region="block", kind="block", block=0, blocks=(0,))
    gb.add_host_rest(mg, d)
    part = gb.build("test", {})
    (g,) = [g for g in part.groups if g.id == "b00"]
    assert hole in g.ops and g.ops == frozenset(ops)
    order_groups(mg, part)  # acyclic


def _cyclic(mg_path: Path, strategy: str) -> tuple[ModelGraph, Partition]:
    mg = load_model(mg_path)
    d = discover(mg)
    ops = set(d.blocks[0].ops)
    core = sorted(d.blocks[0].regions[0].core)
    hole = core[len(core) // 2]
    rest = frozenset(i for i in mg.ops.nodes if i not in ops) | {hole}
    groups = (Group("b00", "npu", frozenset(ops - {hole}), "block", "block", 0, (0,)),
              Group("host", "host", rest, "host", "host"))
    return mg, Partition(strategy, {}, groups)


def test_a_cycle_names_its_tensors_and_blames_the_right_party(example_model: Path) -> None:
    mg, part = _cyclic(example_model, "custom")
    with pytest.raises(SpecError, match=r"cycle: (b00|host) -\([^)?]+\)-> (host|b00) -\([^)?]+\)-> \1"):
        order_groups(mg, part)
    mg, part = _cyclic(example_model, "split")
    with pytest.raises(InternalError, match="strategy split made stages") as e:
        order_groups(mg, part)
    assert e.value.exit_code != SpecError.exit_code
