"""MoE routing goes to the host, the experts' matmuls stay on the NPU (issue 28, capability first).

A tiny top-2 token-choice MoE DiT (:mod:`tests.models.moe`), exported by both torch exporters,
named and anonymised.  No rewrite exists for ``TopK`` or ``ScatterElements``; the capability
(rknn-toolkit2 2.5.0's measured placement) moves them, with the ops worth taking along, out of
the FFN stages.  Every plan reproduces the model under ONNX Runtime, all block matmul work is
on the NPU, and each expert's weights are in one stage only.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from rkpart.pipeline import PartitionConfig, load, propose, write_plan
from rkpart.plan.anonymize import anonymize_file
from tests.models.diffusers_families import missing_dependencies
from tests.models.moe import BLOCKS, EXPERTS, cached_export
from tests.partitioner.checks import assert_reproduces

pytestmark = [pytest.mark.export, pytest.mark.skipif(bool(missing_dependencies()),
                                                     reason=f"not installed: {missing_dependencies()}")]
ROUTING = {"TopK", "ScatterElements"}


@pytest.mark.parametrize("named", [True, False], ids=["named", "anonymised"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_routing_on_the_host_experts_on_the_npu(tmp_path: Path, exporter: str, named: bool) -> None:
    model = cached_export(exporter)
    if not named:
        model = anonymize_file(model, tmp_path / "anon.onnx")
    m = load(model)
    assert len(m.discovery().blocks) == BLOCKS
    for strategy in ("split", "fused"):
        part = propose(m, strategy, PartitionConfig(toolkit="2.5.0"))
        moved = part.partition.extra["capability"]["host_ops"]
        assert {h["op_type"] for h in moved} >= ROUTING
        assert sum(h["op_type"] == "TopK" for h in moved) == BLOCKS
        assert all("measured" in h["why"] for h in moved if h["op_type"] in ROUTING)
        out = tmp_path / strategy
        plan = write_plan(m, part, out)
        assert_reproduces(plan, out, model)
        assert plan.extra["npu_coverage"]["share"] >= 0.99
        owner: dict[str, list[str]] = {}
        for s in plan.stages:
            g = onnx.load(str(out / s.file), load_external_data=False).graph
            ops = {n.op_type for n in g.node}
            if s.device == "npu":
                assert not ops & ROUTING, (s.id, ops & ROUTING)
            for init in g.initializer:
                if len(init.dims) == 2 and min(init.dims) > 4:  # the experts' (and attention's) weight matrices
                    owner.setdefault(init.name, []).append(s.id)
        assert owner and all(len(v) == 1 for v in owner.values()), {k: v for k, v in owner.items() if len(v) > 1}
        # every expert's up and down projection of every block sits in an NPU stage
        npu = {s.id for s in plan.npu_stages}
        expert_mats = [k for k, v in owner.items() if v[0] in npu]
        assert len(expert_mats) >= BLOCKS * EXPERTS * 2


def test_auto_scores_candidates_with_the_routing_on_the_host(tmp_path: Path) -> None:
    """``auto`` applies the capability to every candidate before the cost model scores it: the plan
    it assembles has no routing op in an NPU stage (the final pass has nothing left to move)."""
    from rkpart.auto import AutoStrategy

    model = cached_export("torchscript")
    m = load(model)
    part = propose(m, AutoStrategy(), PartitionConfig(toolkit="2.5.0", options={"toolkit": "2.5.0"}))
    out = tmp_path / "auto"
    plan = write_plan(m, part, out)
    assert_reproduces(plan, out, model)
    for s in plan.npu_stages:
        ops = {n.op_type for n in onnx.load(str(out / s.file), load_external_data=False).graph.node}
        assert not ops & ROUTING, (s.id, ops & ROUTING)
    assert plan.extra["npu_coverage"]["share"] >= 0.99
    # the moves made in the chosen candidates are recorded as for any strategy, one TopK per block
    moved = plan.extra["capability"]["host_ops"]
    assert sum(h["op_type"] == "TopK" for h in moved) == BLOCKS
    assert all(h["from_stage"] and h["why"] for h in moved)
    host_names = {part.graph.op(i).name for g in part.partition.groups if g.device == "host" for i in g.ops}
    assert {h["op"] for h in moved} <= host_names
    # without the capability the candidates keep the routing inside the FFN / block stages
    off = propose(m, AutoStrategy(), PartitionConfig(options={"toolkit": "2.5.0", "capability": False},
                                                     capability=False))
    held = {off.graph.op(i).op_type for g in off.partition.groups if g.device == "npu" for i in g.ops}
    assert held & ROUTING
    assert "capability" not in off.partition.extra


def test_auto_weighs_the_move_against_the_runtime_fallback(tmp_path: Path) -> None:
    """``auto --explain`` shows, per block whose choice had ops moved, the move's predicted time
    against the same candidate with the routing left to the runtime's CPU fallback inside the stage."""
    from rkpart.auto import AutoStrategy

    model = cached_export("torchscript")
    m = load(model)
    seen = []
    strat = AutoStrategy(report=seen.append)
    part = propose(m, strat, PartitionConfig(toolkit="2.5.0", options={"toolkit": "2.5.0"}))
    sel = seen[-1]  # the proposal the plan is made of (the views made it again on a new graph: part.graph)
    assert sorted(sel.trades) == [b.index for b in m.discovery().blocks]
    for start, t in sel.trades.items():
        assert t.moved is sel.choice_for(start)
        assert {"TopK", "ScatterElements"} <= set(t.ops)
        assert t.fallback.candidate.id == t.moved.candidate.id and t.fallback.residency == t.moved.residency
        assert t.fallback_cpu_s > 0 and t.fallback_latency > t.fallback.latency
        # the fallback candidate holds the routing in an NPU stage, the moved one does not
        held = {part.graph.op(i).op_type for g in t.fallback.candidate.groups if g.device == "npu" for i in g.ops}
        assert "TopK" in held
    text = sel.render()
    assert text.count("capability:") == len(sel.trades) and "runtime's CPU fallback" in text
    js = sel.to_json()
    trades = [b["capability_trade"] for b in js["blocks"] if "capability_trade" in b]
    assert len(trades) == len(sel.trades) and all(t["fallback_s"] > 0 for t in trades)


def test_auto_records_the_moves_of_ops_without_names(tmp_path: Path) -> None:
    """An export whose nodes carry no names at all: a move is recorded by the op's index (what
    :func:`~rkpart.grouping.capability.host_op_key` names it), and ``auto``'s candidates match
    their host groups by that same key, so the routing moved out of every block is still in the plan."""
    from rkpart.auto import AutoStrategy

    proto = onnx.load(str(cached_export("torchscript")))
    for n in proto.graph.node:
        n.name = ""
    model = tmp_path / "unnamed.onnx"
    onnx.save(proto, str(model))
    m = load(model)
    part = propose(m, AutoStrategy(), PartitionConfig(toolkit="2.5.0", options={"toolkit": "2.5.0"}))
    moved = part.partition.extra["capability"]["host_ops"]
    assert sum(h["op_type"] == "TopK" for h in moved) == BLOCKS
    host = {i for g in part.partition.groups if g.device == "host" for i in g.ops}
    for h in moved:
        assert h["op"].isdigit() and int(h["op"]) in host, h
        assert part.graph.op(int(h["op"])).op_type == h["op_type"]
    out = tmp_path / "auto"
    assert_reproduces(write_plan(m, part, out), out, model)


def test_auto_explain_on_the_command_line_reads_the_plans_proposal(tmp_path: Path) -> None:
    """The router softmax's narrow output makes the proposal run again on a graph with rank-4 views;
    ``--explain`` renders the last proposal's selection (the first one's graph is changed in place:
    rendering it raised KeyError on a view's tensor)."""
    from click.testing import CliRunner

    from rkpart.cli import main

    r = CliRunner().invoke(main, ["partition", str(cached_export("torchscript")), "-s", "auto", "--explain",
                                  "--toolkit", "2.5.0", "--no-compile-candidates", "-o", str(tmp_path / "p"), "-q"])
    assert r.exit_code == 0, r.output
    assert r.output.count("capability:") == 2 and "runtime's CPU fallback" in r.output
