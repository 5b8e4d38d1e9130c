"""Capability decides the grouping: ops the toolkit runs on the CPU leave NPU stages.

Hand-built graphs (real ONNX Runtime runs the plans):

    x ─ MatMul(W1) ─ h1 ─ Ceil ─ c ─ Mul(0.5) ─ m ─ MatMul(W2) ─ h2 ─ Add ─ y
                     └──────────────────────────────────────────────┘

``Ceil`` is measured on the CPU (rk3588 table): the NPU group is cut into NPU / host / NPU.

    h1 ─ Expand(x2) ─ r ─┬──────────── Max ─ ReduceMean ─ u ─ MatMul(W2) ...
                         └─ Sigmoid ─ s ─┘

with ``Max`` learned as a CPU placement: the minimum cut takes Expand, Sigmoid and ReduceMean
along (one small tensor crosses each way instead of three large ones).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.grouping.capability import pattern_of
from rkpart.grouping.groups import order_groups
from rkpart.ir import OpNode
from rkpart.pipeline import PartitionConfig, Proposal, load, propose, write_plan
from rkpart.targets import get_target
from rkpart.targets.capability import Capability, PlacementPattern
from rkpart.targets.rewrites.npu import MAX_REVERSED
from tests.partitioner.checks import assert_reproduces


def _w(name: str, rows: int, cols: int, seed: int) -> TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).normal(size=(rows, cols)).astype(np.float32), name)


def _save(tmp: Path, name: str, nodes: list[onnx.NodeProto], inits: list[TensorProto]) -> Path:
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p = tmp / f"{name}.onnx"
    onnx.save(m, p)
    return p


@pytest.fixture
def ceil_model(tmp_path: Path) -> Path:
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        helper.make_node("Ceil", ["h1"], ["c"], name="ceil"),
        helper.make_node("Mul", ["c", "half"], ["m"], name="mul"),
        helper.make_node("MatMul", ["m", "W2"], ["h2"], name="mm2"),
        helper.make_node("Add", ["h1", "h2"], ["y"], name="add"),
    ]
    inits = [_w("W1", 16, 16, 1), _w("W2", 16, 16, 2), numpy_helper.from_array(np.float32(0.5), "half")]
    return _save(tmp_path, "ceil", nodes, inits)


@pytest.fixture
def fanin_model(tmp_path: Path) -> Path:
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        helper.make_node("Expand", ["h1", "shape2"], ["r"], name="expand"),
        helper.make_node("Sigmoid", ["r"], ["s"], name="sigmoid"),
        helper.make_node("Max", ["r", "s"], ["mx"], name="max"),
        helper.make_node("ReduceMean", ["mx"], ["u"], name="mean", axes=[0], keepdims=1),
        helper.make_node("MatMul", ["u", "W2"], ["h2"], name="mm2"),
        helper.make_node("Add", ["h1", "h2"], ["y"], name="add"),
    ]
    inits = [_w("W1", 16, 16, 1), _w("W2", 16, 16, 2),
             numpy_helper.from_array(np.array([4, 8, 16], dtype=np.int64), "shape2")]
    return _save(tmp_path, "fanin", nodes, inits)


def _devices(proposal: Proposal) -> list[tuple[str, list[str]]]:
    """Device and op names of each group, in plan order, read from the graph the proposal is of."""
    mg = proposal.graph
    return [(g.device, sorted(mg.op(i).name for i in g.ops)) for g in order_groups(mg, proposal.partition)]


def test_measured_cpu_op_leaves_the_npu_stage_and_the_plan_reproduces(ceil_model: Path, tmp_path: Path) -> None:
    m = load(ceil_model)
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0"))
    assert _devices(part) == [("npu", ["mm1"]), ("host", ["ceil"]), ("npu", ["add", "mm2", "mul"])]
    plan = write_plan(m, part, tmp_path / "plan")
    assert_reproduces(plan, tmp_path / "plan", ceil_model)
    rec = json.loads((tmp_path / "plan" / "plan.json").read_text())["extra"]["capability"]
    assert rec["toolkit"] == "2.5.0" and rec["target"] == "rk3588"
    assert [(h["op"], h["from_stage"]) for h in rec["host_ops"]] == [("ceil", part.partition.groups[0].id)]
    assert "on the CPU" in rec["host_ops"][0]["why"] and "measured" in rec["host_ops"][0]["why"]


def test_capability_off_keeps_the_strategys_grouping(ceil_model: Path) -> None:
    m = load(ceil_model)
    part = propose(m, "generic", PartitionConfig(capability=False))
    assert _devices(part) == [("npu", ["add", "ceil", "mm1", "mm2", "mul"])]
    assert "capability" not in part.partition.extra


def test_default_toolkit_is_the_targets(ceil_model: Path) -> None:
    part = propose(load(ceil_model), "generic", PartitionConfig())
    assert part.partition.extra["capability"]["toolkit"] == get_target("rk3588").default_toolkit


def test_learned_pattern_moves_the_op_with_the_neighbours_of_the_cheapest_cut(
        fanin_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = load(fanin_model)
    i_max = next(i for i in range(m.graph.num_ops) if m.graph.op(i).name == "max")
    pat = pattern_of(m.graph, i_max)
    assert pat == PlacementPattern("Max", "float32", (3, 3), consts=(False, False), dims="nnn;nnn>nnn",
                                   shapes=pat.shapes, around=pat.around)
    assert pat.shapes == "4,8,16;4,8,16>4,8,16"  # the sizes of both inputs and the output
    # nothing learned: everything on the NPU
    assert [d for d, _ in _devices(propose(m, "generic", PartitionConfig(toolkit="2.5.0")))] == ["npu"]
    # learned: the store is read through the user cache (tests have a private one)
    from rkpart.grouping.learned import CpuLayer, learn

    assert learn("rk3588", "2.5.0", [CpuLayer("s", "Max:max", "max", pat)]) == [pat]
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0"))
    assert _devices(part) == [("npu", ["mm1"]), ("host", ["expand", "max", "mean", "sigmoid"]),
                                           ("npu", ["add", "mm2"])]
    why = {h["op"]: h["why"] for h in part.partition.extra["capability"]["host_ops"]}
    assert "learned placement" in why["max"]
    assert "fewest bytes" in why["sigmoid"] and "instead of 3 tensor(s)" in why["sigmoid"]
    plan = write_plan(m, part, tmp_path / "plan")
    assert_reproduces(plan, tmp_path / "plan", fanin_model)
    # another toolkit learned nothing
    assert "capability" not in propose(m, "generic", PartitionConfig(toolkit="2.3.0")).partition.extra
    # learned=False ignores the store
    assert "capability" not in propose(m, "generic", PartitionConfig(toolkit="2.5.0", learned=False)).partition.extra


def test_forced_ops_leave_whatever_the_rewrites_say(ceil_model: Path) -> None:
    m = load(ceil_model)
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0", force_host={"mul": "the last build put it there"}))
    devs = _devices(part)
    assert ("host", ["ceil", "mul"]) in devs and all("mul" not in ops for d, ops in devs if d == "npu")
    why = {h["op"]: h["why"] for h in part.partition.extra["capability"]["host_ops"]}
    assert why["mul"] == "the last build put it there"


def test_an_op_a_rewrite_removes_stays_on_the_npu(tmp_path: Path) -> None:
    """``Reciprocal`` runs on the CPU, but ``reciprocal-to-div`` rewrites it: it stays, unless the
    build applies no rewrite (``rewrites=False``, i.e. ``rkpart compile --no-rewrites``)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        helper.make_node("Abs", ["h1"], ["a"], name="abs"),
        helper.make_node("Add", ["a", "one"], ["a1"], name="add1"),
        helper.make_node("Reciprocal", ["a1"], ["r"], name="recip"),
        helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2"),
    ]
    inits = [_w("W1", 16, 16, 1), _w("W2", 16, 16, 2), numpy_helper.from_array(np.float32(1.0), "one")]
    model = _save(tmp_path, "recip", nodes, inits)
    m = load(model)
    kept = propose(m, "generic", PartitionConfig(toolkit="2.5.0"))
    assert [d for d, _ in _devices(kept)] == ["npu"]
    moved = propose(m, "generic", PartitionConfig(toolkit="2.5.0", rewrites=False))
    assert ("host", ["recip"]) in _devices(moved)


def test_capability_reason_sources() -> None:
    caps = get_target("rk3588").caps("2.5.0")
    pat = PlacementPattern("Relu", "float32", (3,))
    cap = Capability("rk3588", caps, frozenset({pat}))
    custom = OpNode.of(0, helper.make_node("Foo", ["a"], ["b"], domain="com.example"), "")
    assert "cannot load" in (cap.reason(custom, PlacementPattern("Foo", "float32", (3,), "com.example")) or "")
    relu = OpNode.of(1, helper.make_node("Relu", ["a"], ["b"]), "")
    assert "learned" in (cap.reason(relu, pat) or "")
    assert cap.reason(relu, PlacementPattern("Relu", "float32", (4,))) is None  # another shape class
    assert PlacementPattern.from_json(pat.to_json()) == pat
    assert pat.key() == "Relu/float32/3"
    assert PlacementPattern("Gather", "float32", (2, 1), consts=(True, False)).key() == "Gather/float32/c2,1"
    assert PlacementPattern("Relu", "float32", (3,), dims="1nn>1nn").key() == "Relu/float32/3/1nn>1nn"


def test_a_learned_reshape_moves_its_own_layout_not_every_reshape_of_its_ranks(tmp_path: Path) -> None:
    """PriorTransformer's attention-mask Reshape ``[H, 1, S] -> [1, H, 1, S]`` runs on the CPU on 2.5.0;
    the head split ``[1, S, C] -> [1, S, H, D]`` has the same op, type and ranks and runs on the NPU.
    What one build learns of the first must not take the second off the NPU (it did, for every model)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),  # [1, 8, 16]
        helper.make_node("Reshape", ["h", "heads"], ["q"], name="head_split"),  # [1, 8, 2, 8]
        helper.make_node("Reshape", ["q", "flat"], ["q2"], name="head_merge"),  # [1, 8, 16]
        helper.make_node("MatMul", ["q2", "W2"], ["h2"], name="mm2"),
        helper.make_node("Reshape", ["mask", "mshape"], ["m4"], name="mask_view"),  # [2, 1, 8] -> [1, 2, 1, 8]
        helper.make_node("ReduceSum", ["m4", "raxes"], ["ms"], name="msum", keepdims=0),  # [1]
        helper.make_node("Add", ["h2", "ms"], ["y"], name="add"),
    ]
    inits = [_w("W1", 16, 16, 1), _w("W2", 16, 16, 2),
             numpy_helper.from_array(np.array([1, 8, 2, 8], dtype=np.int64), "heads"),
             numpy_helper.from_array(np.array([1, 8, 16], dtype=np.int64), "flat"),
             numpy_helper.from_array(np.array([1, 2, 1, 8], dtype=np.int64), "mshape"),
             numpy_helper.from_array(np.array([1, 2, 3], dtype=np.int64), "raxes")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16]),
                                       helper.make_tensor_value_info("mask", TensorProto.FLOAT, [2, 1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], initializer=inits)
    path = tmp_path / "masked.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    m = load(path)
    ix = {m.graph.op(i).name: i for i in range(m.graph.num_ops)}
    mask_pat, split_pat = pattern_of(m.graph, ix["mask_view"]), pattern_of(m.graph, ix["head_split"])
    assert (mask_pat.op_type, mask_pat.dtype, mask_pat.ranks, mask_pat.consts) == \
        (split_pat.op_type, split_pat.dtype, split_pat.ranks, split_pat.consts)
    assert (mask_pat.dims, split_pat.dims) == ("n1n;n>1n1n", "1nn;n>1nnn")
    from rkpart.grouping.learned import CpuLayer, learn

    learn("rk3588", "2.5.0", [CpuLayer("s", "Reshape:mask_view", "mask_view", mask_pat)])
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0"))
    host = {h["op"] for h in part.partition.extra["capability"]["host_ops"]}
    assert "mask_view" in host and not host & {"head_split", "head_merge"}
    npu = [ops for d, ops in _devices(part) if d == "npu"]
    assert any({"head_split", "head_merge", "mm1", "mm2"} <= set(ops) for ops in npu)


def test_cut_before_fused_ops_splits_the_stage_acyclically(tmp_path: Path) -> None:
    """   x ─ MatMul ─ h ─ LayerNorm ─ n ─ Mul(scale) ─ Add(shift) ─ MatMul ─ y
              └─ MatMul ─ scale, MatMul ─ shift (the modulation, computed)

    A build that crashed after fusing Mul/Add into the LayerNorm: the stage is cut in front of
    the Mul (the Add, right after it, joins the Mul's piece); a constant-operand Mul is not cut."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("MatMul", ["x", "Ws"], ["scale"], name="mm_scale"),
        helper.make_node("MatMul", ["x", "Wb"], ["shift"], name="mm_shift"),
        helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], name="ln", axis=-1),
        helper.make_node("Mul", ["n", "scale"], ["m"], name="mod_mul"),
        helper.make_node("Add", ["m", "shift"], ["a"], name="mod_add"),
        helper.make_node("Mul", ["a", "half"], ["c"], name="const_mul"),
        helper.make_node("MatMul", ["c", "W2"], ["y"], name="mm2"),
    ]
    inits = [_w("W1", 16, 16, 1), _w("Ws", 16, 16, 2), _w("Wb", 16, 16, 3), _w("W2", 16, 16, 4),
             numpy_helper.from_array(np.ones(16, np.float32), "g"),
             numpy_helper.from_array(np.zeros(16, np.float32), "b"),
             numpy_helper.from_array(np.float32(0.5), "half")]
    model = _save(tmp_path, "adaln", nodes, inits)
    m = load(model)
    why = "the build crashed after fusing it"
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0", cut_before={n: why for n in
                                                 ("mod_mul", "mod_add", "const_mul", "no_such_op")}))
    assert _devices(part) == [("npu", ["ln", "mm1", "mm_scale", "mm_shift"]),
                                     ("npu", ["const_mul", "mm2", "mod_add", "mod_mul"])]
    assert [c["before"] for c in part.partition.extra["capability"]["cuts"]] == ["mod_mul", "mod_add"]
    plan = write_plan(m, part, tmp_path / "plan")
    assert_reproduces(plan, tmp_path / "plan", model)


def test_cut_before_a_per_token_constant_but_not_a_per_channel_one(tmp_path: Path) -> None:
    """   x ─ MatMul ─ LayerNorm ─ Mul(C[1, 8, 16]) ─ Add(B[1, 8, 16]) ─ Mul(g[16]) ─ MatMul ─ y

    Flux.3's context modulation is computed from weights alone and folded at load into a constant
    with a row per token: a norm's gamma cannot hold it, and 2.3.0 crashes after fusing it
    (exnorm-fusion-segv).  Such a Mul is cut before (its Add joins it); a per-channel scale is not."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], name="ln", axis=-1),
        helper.make_node("Mul", ["n", "C"], ["m"], name="tok_mul"),
        helper.make_node("Add", ["m", "B"], ["a"], name="tok_add"),
        helper.make_node("Mul", ["a", "gc"], ["c"], name="chan_mul"),
        helper.make_node("MatMul", ["c", "W2"], ["y"], name="mm2"),
    ]
    inits = [_w("W1", 16, 16, 1), _w("W2", 16, 16, 4),
             numpy_helper.from_array(np.ones(16, np.float32), "g"),
             numpy_helper.from_array(np.zeros(16, np.float32), "b"),
             numpy_helper.from_array(rng.normal(size=(1, 8, 16)).astype(np.float32), "C"),
             numpy_helper.from_array(rng.normal(size=(1, 8, 16)).astype(np.float32), "B"),
             numpy_helper.from_array(rng.normal(size=(1, 1, 16)).astype(np.float32), "gc")]
    model = _save(tmp_path, "tokmod", nodes, inits)
    m = load(model)
    why = "the build crashed after fusing it"
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0", cut_before={n: why for n in
                                                 ("tok_mul", "tok_add", "chan_mul")}))
    assert _devices(part) == [("npu", ["ln", "mm1"]), ("npu", ["chan_mul", "mm2", "tok_add", "tok_mul"])]
    assert [c["before"] for c in part.partition.extra["capability"]["cuts"]] == ["tok_mul", "tok_add"]
    plan = write_plan(m, part, tmp_path / "plan")
    assert_reproduces(plan, tmp_path / "plan", model)


def test_fused_nodes_reads_the_rules_of_the_log() -> None:
    from rkpart.targets.known_issues import EXNORM_FUSION_SEGV, fused_nodes

    log = ("D     fuse_exnorm_mul: remove node = ['/b0/norm1/Mul_3'], add node = ['/b0/norm1/ln']\n"
           "D     fuse_exmatmul_add: remove node = ['/b0/attn/Add', '/b0/attn/MatMul#1']\n"
           "D     fuse_exnorm_add: remove node = ['/b0/norm1/Add_3']\n")
    assert fused_nodes(log, EXNORM_FUSION_SEGV.fusion_rules) == [("fuse_exnorm_mul", "/b0/norm1/Mul_3"),
                                                                 ("fuse_exnorm_add", "/b0/norm1/Add_3")]
    assert fused_nodes(log) == [("fuse_exnorm_add", "/b0/norm1/Add_3")]  # no known issue: the last fusion
    assert fused_nodes("no rules here") == []


def test_a_cut_of_a_piece_the_capability_made_gets_ids_of_its_own(tmp_path: Path) -> None:
    """   x ─ MatMul ─┬─ Add ─ Ceil ─ Mul ─ MatMul ─ y
        x ─ MatMul ─┘

    The capability cuts ``seg00`` into ``seg00`` / host (Ceil) / ``seg00.1``; a crash cut in front of
    the Add then splits ``seg00`` again and must not reuse ``seg00.1`` (two groups of one id read
    as one stage: a false cycle)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        helper.make_node("MatMul", ["x", "Wb"], ["hb"], name="mmb"),
        helper.make_node("Add", ["h1", "hb"], ["s"], name="add"),
        helper.make_node("Ceil", ["s"], ["c"], name="ceil"),
        helper.make_node("Mul", ["c", "half"], ["m"], name="mul"),
        helper.make_node("MatMul", ["m", "W2"], ["y"], name="mm2"),
    ]
    inits = [_w("W1", 16, 16, 1), _w("Wb", 16, 16, 3), _w("W2", 16, 16, 2),
             numpy_helper.from_array(np.float32(0.5), "half")]
    model = _save(tmp_path, "cutcut", nodes, inits)
    m = load(model)
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0", cut_before={"add": "crashed after fusing it"}))
    ids = [g.id for g in part.partition.groups]
    assert len(ids) == len(set(ids)), ids
    assert _devices(part) == [("npu", ["mm1", "mmb"]), ("npu", ["add"]), ("host", ["ceil"]),
                                     ("npu", ["mm2", "mul"])]
    plan = write_plan(m, part, tmp_path / "plan")
    assert_reproduces(plan, tmp_path / "plan", model)


@pytest.fixture
def bf16_model(tmp_path: Path) -> Path:
    """Kandinsky 5's attention spelling: q cast to bfloat16 and back between two projections."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        helper.make_node("Cast", ["h1"], ["b"], name="to_bf16", to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["b"], ["f"], name="to_f32", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["f", "W2"], ["h2"], name="mm2"),
        helper.make_node("Add", ["h1", "h2"], ["y"], name="add"),
    ]
    return _save(tmp_path, "bf16", nodes, [_w("W1", 16, 16, 1), _w("W2", 16, 16, 2)])


def test_an_element_type_no_build_holds_leaves_the_npu_stage(bf16_model: Path, tmp_path: Path) -> None:
    """Without the rewrites (``--no-rewrites``) the bfloat16 casts go to the host; with them
    bfloat16-widen computes the island in float32, so the group stays whole."""
    m = load(bf16_model)
    whole = propose(m, "generic", PartitionConfig(toolkit="2.5.0"))
    assert _devices(whole) == [("npu", ["add", "mm1", "mm2", "to_bf16", "to_f32"])]
    assert_reproduces(write_plan(m, whole, tmp_path / "whole"), tmp_path / "whole", bf16_model)
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0", rewrites=False))
    assert _devices(part) == [("npu", ["mm1"]), ("host", ["to_bf16", "to_f32"]), ("npu", ["add", "mm2"])]
    plan = write_plan(m, part, tmp_path / "plan")
    assert_reproduces(plan, tmp_path / "plan", bf16_model)
    rec = json.loads((tmp_path / "plan" / "plan.json").read_text())["extra"]["capability"]
    assert {h["op"] for h in rec["host_ops"]} == {"to_bf16", "to_f32"}
    assert all("no bfloat16 type" in h["why"] for h in rec["host_ops"])
    caps = get_target("rk3588").caps("2.5.0")
    relu = OpNode.of(0, helper.make_node("Relu", ["a"], ["b"]), "")
    assert Capability("rk3588", caps).reason(relu, PlacementPattern("Relu", "float32", (3,)), {"float32"}) is None


@pytest.mark.toolkit
@pytest.mark.slow
def test_bf16_stage_fails_to_build_and_the_capabilitys_plan_builds(bf16_model: Path, tmp_path: Path) -> None:
    """The fact the rule states, measured: with the casts in the NPU stage the 2.5.0 build fails;
    with the capability's plan every NPU stage builds."""
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from tests.toolkits import get_toolkit

    tk = get_toolkit("2.5.0")
    m = load(bf16_model)
    # without the rewrites: the casts in the NPU stage fail the build, the capability's plan builds;
    # with them (bfloat16-widen) the one NPU stage holding the casts builds
    for capability, rewrites, failed in ((False, False, 1), (True, False, 0), (True, True, 0)):
        folder = tmp_path / f"cap-{capability}-{rewrites}"
        cfg = PartitionConfig(toolkit="2.5.0", capability=capability, rewrites=rewrites)
        plan = write_plan(m, propose(m, "generic", cfg), folder)
        rep = compile_plan_report(plan, folder, CompileOptions(tk, "rk3588", {}, jobs=1, cache=False,
                                                               rewrites=rewrites))
        assert len(rep.failed) == failed, [f.message for o in rep.failed for f in o.failures]


@pytest.mark.parametrize("inside", ["casts", "bf16-matmul"])
def test_a_bfloat16_tensor_never_crosses_into_an_npu_stage(inside: str, tmp_path: Path) -> None:
    """A bfloat16 island whose inside op runs on the CPU (``Ceil``): bfloat16-widen rescues the rest
    of the island in the whole group, the ``Ceil`` leaves.  ``casts``: the cheapest cut would send
    the bfloat16 tensor across (half the bytes of float32), but no stage can take one, so the cut
    takes the casts along instead.  ``bf16-matmul``: a bfloat16 MatMul (matmul work: tied to the
    NPU) makes the ``Ceil``'s input, every cut crosses a bfloat16 tensor, and the capability, asked
    again on the groups the move left, sends the MatMul after it (no widening applies to a piece
    whose bfloat16 tensor crosses)."""
    bf = TensorProto.BFLOAT16
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
             helper.make_node("Cast", ["h1"], ["b"], name="to_bf16", to=bf)]
    inits = [_w("W1", 16, 16, 1), _w("W2", 16, 16, 2)]
    if inside == "bf16-matmul":
        wb = helper.make_tensor("Wb", bf, [16, 16], np.ones((16, 16), np.uint16).tobytes(), raw=True)
        inits.append(wb)
        nodes.append(helper.make_node("MatMul", ["b", "Wb"], ["b2"], name="mm_bf16"))
    nodes += [helper.make_node("Ceil", ["b2" if inside == "bf16-matmul" else "b"], ["c"], name="ceil"),
              helper.make_node("Cast", ["c"], ["f"], name="to_f32", to=TensorProto.FLOAT),
              helper.make_node("MatMul", ["f", "W2"], ["h2"], name="mm2"),
              helper.make_node("Add", ["h1", "h2"], ["y"], name="add")]
    model = _save(tmp_path, "island", nodes, inits)
    m = load(model)
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0"))
    devices = _devices(part)
    npu = {op for dev, ops in devices if dev == "npu" for op in ops}
    island = {"to_bf16", "ceil", "to_f32"} | ({"mm_bf16"} if inside == "bf16-matmul" else set())
    assert island.isdisjoint(npu) and {"mm1", "mm2"} <= npu, devices
    plan = write_plan(m, part, tmp_path / "plan")
    assert_reproduces(plan, tmp_path / "plan", model)
    moved = {h["op"] for h in json.loads((tmp_path / "plan" / "plan.json").read_text())["extra"]["capability"]
             ["host_ops"]}
    assert island <= moved


def test_the_cut_keeps_a_widened_island_whole_on_the_npu(tmp_path: Path) -> None:
    """``Ceil`` (on the CPU) in float32 right before a bfloat16 island with matmul work: crossing the
    island's bfloat16 input would be cheaper (half the bytes), but would leave its MatMul in a piece
    whose bfloat16 tensor crosses, where no widening applies, and send it to the host.  The cut
    crosses the float32 tensor: the island stays on the NPU, whole, and widened."""
    bf = TensorProto.BFLOAT16
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
             helper.make_node("Ceil", ["h1"], ["c"], name="ceil"),
             helper.make_node("Cast", ["c"], ["b"], name="to_bf16", to=bf),
             helper.make_node("MatMul", ["b", "Wb"], ["b2"], name="mm_bf16"),
             helper.make_node("Cast", ["b2"], ["f"], name="to_f32", to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["f", "W2"], ["h2"], name="mm2"),
             helper.make_node("Add", ["h1", "h2"], ["y"], name="add")]
    wb = helper.make_tensor("Wb", bf, [16, 16], np.full((16, 16), 0x3C00, np.uint16).tobytes(), raw=True)
    model = _save(tmp_path, "island", nodes, [_w("W1", 16, 16, 1), _w("W2", 16, 16, 2), wb])
    m = load(model)
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0"))
    devices = _devices(part)
    host = {op for dev, ops in devices if dev == "host" for op in ops}
    assert host == {"ceil"}, devices
    plan = write_plan(m, part, tmp_path / "plan")
    assert_reproduces(plan, tmp_path / "plan", model)


def test_an_op_that_only_feeds_a_later_piece_waits_for_it_instead_of_leaving(tmp_path: Path) -> None:
    """The query side waits behind one host op, the key side behind two: the query's ``Relu`` is
    at level 1 and the score MatMul at level 2, so level 1 holds no matmul work.  The ``Relu`` only
    feeds level 2, so it runs there, with the MatMul, instead of going to the host (Sana-WM's
    camera attention: the queries' casts waited behind one CPU ``Einsum``, the keys' behind two)."""
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
             helper.make_node("Ceil", ["h1"], ["a"], name="ceil1"),
             helper.make_node("Ceil", ["a"], ["b"], name="ceil2"),
             helper.make_node("Relu", ["a"], ["q"], name="relu"),
             helper.make_node("Transpose", ["b"], ["bt"], name="kt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "bt"], ["s"], name="scores"),
             helper.make_node("MatMul", ["s", "W2"], ["h2"], name="mm2"),
             helper.make_node("Add", ["h1", "h2"], ["y"], name="add")]
    model = _save(tmp_path, "late", nodes, [_w("W1", 16, 16, 1), _w("W2", 8, 16, 2)])
    m = load(model)
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0"))
    devices = _devices(part)
    host = {op for dev, ops in devices if dev == "host" for op in ops}
    assert host == {"ceil1", "ceil2"}, devices
    assert any({"relu", "scores"} <= set(ops) for dev, ops in devices if dev == "npu"), devices
    plan = write_plan(m, part, tmp_path / "plan")
    assert_reproduces(plan, tmp_path / "plan", model)


@pytest.mark.parametrize("width", [16, MAX_REVERSED + 8])
def test_a_learned_reversing_slice_does_not_take_forward_slices_off_the_npu(tmp_path: Path, width: int) -> None:
    """``torch.flip`` exports as a Slice with step -1, which 2.5.0 runs on the CPU (Sana-WM's camera
    maths); a forward Slice of the same ranks, types and unit dims runs on the NPU.  A class learned
    from the flip took Sana-WM's attention's forward Slice off the NPU, cutting its bfloat16 island:
    the reversal is a form of the class of its own.  A flip ``slice-reverse`` rewrites (at most
    MAX_REVERSED pieces) stays on the NPU, learned or not; a longer one goes to the host."""
    def c(name: str, v: list[int]) -> TensorProto:
        return numpy_helper.from_array(np.array(v, dtype=np.int64), name)

    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),  # [1, 8, width]
        helper.make_node("Slice", ["h", "s0", "e0", "ax", "back"], ["r"], name="flip"),
        helper.make_node("Slice", ["h", "s1", "e1", "ax", "fwd"], ["f"], name="forward"),
        helper.make_node("Add", ["r", "f"], ["rf"], name="mix"),
        helper.make_node("MatMul", ["rf", "W2"], ["y"], name="mm2"),
    ]
    inits = [_w("W1", 16, width, 1), _w("W2", width, 16, 2), c("s0", [-1]), c("e0", [-(2 ** 62)]), c("ax", [2]),
             c("back", [-1]), c("s1", [0]), c("e1", [width]), c("fwd", [1])]
    path = _save(tmp_path, "flip", nodes, inits)
    m = load(path)
    ix = {m.graph.op(i).name: i for i in range(m.graph.num_ops)}
    flip, fwd = pattern_of(m.graph, ix["flip"]), pattern_of(m.graph, ix["forward"])
    assert (flip.form, fwd.form) == ("reverse", "")
    assert (flip.op_type, flip.dtype, flip.ranks, flip.consts, flip.dims) == \
        (fwd.op_type, fwd.dtype, fwd.ranks, fwd.consts, fwd.dims)
    from rkpart.grouping.learned import CpuLayer, learn, load_learned

    learn("rk3588", "2.5.0", [CpuLayer("s", "Slice:flip", "flip", flip)])
    assert load_learned("rk3588", "2.5.0") == {flip}  # the form survives the store
    part = propose(m, "generic", PartitionConfig(toolkit="2.5.0"))
    host = {h["op"] for h in part.partition.extra.get("capability", {}).get("host_ops", [])}
    assert "forward" not in host
    assert ("flip" in host) == (width > MAX_REVERSED)
    plan = write_plan(m, part, tmp_path / "plan")
    assert_reproduces(plan, tmp_path / "plan", path)


def _attention(tmp: Path, name: str, masked: bool) -> Path:
    """x ─ MatMul(Wq) ─ q ─ MatMul(q, kᵀ) ─ s [─ Add(mask)] ─ Softmax ─ p ─ MatMul(p, v) ─ MatMul(Wo) ─ y:
    the two forms of Lumina-Image-2.0's and Ovis-Image's attention Softmax, same sizes."""
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q"),
             helper.make_node("Transpose", ["q"], ["kt"], perm=[0, 2, 1], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores")]
    inits = [_w("Wq", 16, 16, 3), _w("Wo", 16, 16, 4)]
    if masked:
        nodes.append(helper.make_node("Add", ["s", "mask"], ["sm"], name="mask"))
        inits.append(numpy_helper.from_array(np.triu(np.full((8, 8), -1e4, np.float32), 1)[None], "mask"))
    nodes += [helper.make_node("Softmax", ["sm" if masked else "s"], ["p"], axis=-1, name="softmax"),
              helper.make_node("MatMul", ["p", "q"], ["o"], name="pv"),
              helper.make_node("MatMul", ["o", "Wo"], ["y"], name="out")]
    return _save(tmp, name, nodes, inits)


def test_a_learned_placement_holds_for_the_ops_neighbours_not_only_its_sizes(tmp_path: Path) -> None:
    """Issue 50: a Softmax a build ran on the CPU behind a mask's Add (Lumina-Image-2.0 at real width: the
    compiler fused no attention) does not move a Softmax of the same sizes read straight from the scores'
    MatMul (Ovis-Image, on the NPU); it moves the same masked form in another model.  Learned from a stage
    whose input the Softmax reads (the Add in another stage: ``*``), it stands for any producer."""
    from rkpart.grouping.learned import CpuLayer, learn

    masked, plain, other = (load(_attention(tmp_path, n, m)) for n, m in (("a", True), ("b", False), ("c", True)))
    sm = next(i for i in range(masked.graph.num_ops) if masked.graph.op(i).name == "softmax")
    pat = pattern_of(masked.graph, sm)
    assert pat.around == "Add>MatMul" and pat.shapes == "1,8,8>1,8,8"
    smb = next(i for i in range(plain.graph.num_ops) if plain.graph.op(i).name == "softmax")
    assert pattern_of(plain.graph, smb).around == "MatMul>MatMul"
    learn("rk3588", "2.5.0", [CpuLayer("s", "Softmax:softmax", "softmax", pat)])
    cfg = PartitionConfig(toolkit="2.5.0")
    assert all(d == "npu" for d, _ in _devices(propose(plain, "generic", cfg)))
    moved = propose(other, "generic", cfg).partition.extra["capability"]["host_ops"]
    assert "learned placement" in {h["op"]: h["why"] for h in moved}["softmax"]
    # what a stage that begins at the Softmax teaches: its producer is the stage's input
    from dataclasses import replace

    from rkpart.targets.capability import find_learned

    edge = replace(pat, around="*>MatMul")
    assert find_learned({edge}, pat) == edge and find_learned({edge}, pattern_of(plain.graph, smb)) == edge
    assert find_learned({pat}, pattern_of(plain.graph, smb)) is None


@pytest.mark.parametrize(("learned", "seen", "match"), [
    ("Add>MatMul", "Add>MatMul", True),
    ("Add>MatMul", "MatMul>MatMul", False),
    ("*>MatMul", "Mul>MatMul", True),            # learned at a stage's input
    ("Add>MatMul", "*>MatMul", True),            # seen in a stage (contradicting evidence), its input the edge
    ("Add,*>Mul", "Add,Add>Mul", True),
    ("Add,*>Mul", "Mul,Add>Mul", False),         # a known producer still decides
    ("Add>*", "Add>MatMul,Where", True),         # its output a stage output: any readers
    ("Add>IsNaN,*", "Add>IsNaN,Where", True),
    ("Add>IsNaN,*", "Add>MatMul,Where", False),  # the readers the stage saw are all there
    ("Add>MatMul", "Add>MatMul,Where", False),
    ("Add>MatMul", "Add,Add>MatMul", False),     # another number of data inputs
])
def test_neighbours_match_with_stage_edges_as_wildcards(learned: str, seen: str, match: bool) -> None:
    from dataclasses import replace

    from rkpart.targets.capability import find_learned

    base = PlacementPattern("Softmax", "float32", (3,), consts=(False,), dims="nnn>nnn", shapes="1,8,8>1,8,8")
    got = find_learned([replace(base, around=learned)], replace(base, around=seen))
    assert (got is not None) is match
    assert find_learned([replace(base, around=learned, shapes="1,8,9>1,8,9")], replace(base, around=seen)) is None
