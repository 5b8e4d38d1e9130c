"""Placement learned from builds: ``rkpart compile --repartition`` reaches 0 CPU layers alone.

Wan (TorchScript export) with every rewrite turned off (``--no-rewrites``): its RoPE
``ScatterND`` s are built on the CPU by rknn-toolkit2 2.5.0 inside the attention stages.  The
first build records them (learned store), the re-partition moves them to the host, only the
stages that changed are built again, and the plan then has no CPU layer in any NPU stage and
passes the rknn-sim gate.  A later partition of the same model, for the same toolkit and with
the rewrites off, starts from what was learned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.grouping.learned import load_learned
from rkpart.pipeline import PartitionConfig, load, propose
from rkpart.plan.plan import load_plan
from rkpart.runtime.executor import random_inputs, run_model, run_plan
from rkpart.runtime.rknn_sim import RknnSimBackend
from rkpart.validation.metrics import compare
from tests.models.diffusers_families import cached_export, missing_dependencies
from tests.toolkits import get_toolkit

pytestmark = [pytest.mark.toolkit, pytest.mark.slow, pytest.mark.export,
              pytest.mark.skipif(bool(missing_dependencies()), reason=f"not installed: {missing_dependencies()}")]


def _sim_gate(plan: Any, folder: Path, model: Path, version: str) -> None:
    """The rknn-sim gate: the plan with every NPU stage in the simulator reproduces the model under ORT."""
    feeds = random_inputs(plan.tensors, plan.inputs, seed=0)
    ref = run_model(model, feeds, plan.outputs)
    out = run_plan(plan, folder, feeds, backend=RknnSimBackend(version))
    for name in plan.outputs:
        m = compare(out[name], ref[name])
        assert m.cosine >= 0.999 and m.nan == 0 and m.inf == 0, (name, m)


def _ops(folder: Path, file: str) -> list[str]:
    return [n.op_type for n in onnx.load(str(folder / file), load_external_data=False).graph.node]


def test_repartition_reaches_zero_cpu_layers_with_every_rewrite_off(tmp_path: Path) -> None:
    tk = get_toolkit("2.5.0")
    model = cached_export("wan", "torchscript")
    folder = tmp_path / "plan"
    cli = CliRunner()
    r = cli.invoke(main, ["partition", str(model), "-o", str(folder), "-q", "--toolkit", "2.5.0"])
    assert r.exit_code == 0, r.output
    plan, _ = load_plan(folder)
    assert any("ScatterND" in _ops(folder, s.file) for s in plan.npu_stages)  # nothing learned yet
    r = cli.invoke(main, ["compile", str(folder), "--toolkit", str(tk.python), "--no-rewrites", "--repartition",
                          "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    rounds = rep["repartition"]["rounds"]
    assert len(rounds) == 1 and rounds[0]["cpu_layers_before"] >= 4 and rounds[0]["cpu_layers_after"] == 0
    assert all(op.split("/")[-1].startswith("ScatterND") for op in rounds[0]["moved"])
    assert rep["repartition"]["unmovable_cpu_layers"] == []
    assert all(not s["artifact"]["cpu_ops"] for s in rep["stages"])
    # only the stages that changed were built again: the cross-attention and FFN stages are cache hits
    assert rep["cached"] >= 4 and rep["built"] == rounds[0]["stages_built"] <= rep["cached"]

    plan, _ = load_plan(folder)
    assert not any("ScatterND" in _ops(folder, s.file) for s in plan.npu_stages)
    assert any("ScatterND" in _ops(folder, s.file) for s in plan.host_stages)
    moved = plan.extra["capability"]["host_ops"]
    assert {h["op_type"] for h in moved} >= {"ScatterND"}
    assert any("last build" in h["why"] for h in moved)
    # the rknn-sim gate: the re-partitioned plan with every NPU stage in the simulator reproduces the model
    _sim_gate(plan, folder, model, "2.5.0")

    # learned for the toolkit: a new partition without rewrites starts with ScatterND on the host
    learned = load_learned("rk3588", "2.5.0")
    assert any(p.op_type == "ScatterND" for p in learned)
    part = propose(load(model), "split", PartitionConfig(toolkit="2.5.0", rewrites=False))
    assert {h["op_type"] for h in part.partition.extra["capability"]["host_ops"]} >= {"ScatterND"}
    # measured on the CPU standalone (scripts/measure_ops.py) and learned in this plan's build
    assert all("on the CPU" in h["why"] for h in part.partition.extra["capability"]["host_ops"]
               if h["op_type"] == "ScatterND")
    # with the rewrites on, scatternd-interleave removes them: they stay on the NPU
    assert "capability" not in propose(load(model), "split", PartitionConfig(toolkit="2.5.0")).partition.extra



@pytest.mark.parametrize(("exporter", "strategy", "version"), [("torchscript", "split", "2.5.0"),
                                                              ("dynamo", "fused", "2.3.0")])
def test_moe_routing_on_the_host_builds_with_no_cpu_layer(tmp_path: Path, exporter: str, strategy: str,
                                                          version: str) -> None:
    """The MoE family no rewrite was written for: capability and ``--repartition`` leave 0 CPU layers.

    The router softmax's narrow output (4 experts) leaves its stage as a rank-4 view
    (:func:`rkpart.grouping.views.settle_rank4_views`), so the first build has no CPU layer and
    no round runs (before, the build converted it on the CPU, ``Reshape:<tensor>-rs``, and a round
    moved the stage boundary before it)."""
    from rkpart.pipeline import partition
    from tests.models.moe import cached_export as moe_export

    model = moe_export(exporter)
    folder = tmp_path / "plan"
    plan = partition(model, folder, strategy, toolkit=version)
    assert {h["op_type"] for h in plan.extra["capability"]["host_ops"]} >= {"TopK", "ScatterElements"}
    r = CliRunner().invoke(main, ["compile", str(folder), "--toolkit", str(get_toolkit(version).python),
                                  "--repartition", "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert all(not s["artifact"]["cpu_ops"] for s in rep["stages"]), [s["artifact"]["cpu_ops"] for s in rep["stages"]]
    assert rep["repartition"]["unmovable_cpu_layers"] == []
    assert rep["repartition"]["rounds"] == []
    plan, _ = load_plan(folder)
    assert plan.extra["npu_coverage"]["share"] >= 0.99
    assert any(t.startswith("rkpart/rank4/") for s in plan.npu_stages for t in s.outputs)
    _sim_gate(plan, folder, model, version)


def test_a_crashing_stage_is_cut_where_the_crash_fused_and_then_builds(tmp_path: Path, example_model: Path) -> None:
    """The bundled example's fused blocks crash rknn-toolkit2 2.3.2 (known issue exnorm-fusion-segv,
    after fuse_exnorm_mul/add folded the AdaLN modulation into LayerNorm).  ``--repartition`` cuts
    each block in front of the ops those rules fused: every stage builds and the gate passes."""
    tk = get_toolkit("2.3.2")
    folder = tmp_path / "plan"
    cli = CliRunner()
    assert cli.invoke(main, ["partition", str(example_model), "-s", "fused", "-o", str(folder), "-q"]).exit_code == 0
    r = cli.invoke(main, ["compile", str(folder), "--toolkit", str(tk.python), "--repartition", "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    rounds = rep["repartition"]["rounds"]
    assert rounds[0]["failed_before"] == 2 and rounds[-1]["failed_after"] == 0 and rep["failed"] == 0
    plan, _ = load_plan(folder)
    cuts = plan.extra["capability"]["cuts"]
    assert cuts and all("exnorm-fusion-segv" in c["why"] for c in cuts)
    assert {c["before"] for c in cuts} <= set(rounds[0]["cut_before"])
    # cut only in front of the AdaLN modulations (computed operands), not the constant qk-norm scales
    assert all("/norm" in c["before"] for c in cuts)
    assert len(plan.npu_stages) > 2
    _sim_gate(plan, folder, example_model, "2.3.2")


def test_a_crash_on_a_per_token_constant_modulation_is_cut_and_then_builds(tmp_path: Path) -> None:
    """Flux.3 (dynamo export), ``fused``, rknn-toolkit2 2.3.0: 4 of its 6 block stages crash
    (exnorm-fusion-segv) after fuse_exnorm_mul/add folded the context stream's modulation into a
    LayerNorm.  That modulation depends on weights alone, so loading folds it to a (1, 6, 32)
    constant: the ops have one data input.  ``--repartition`` still cuts in front of them (the
    operand varies over the tokens), every stage builds with 0 CPU layers, and the gate passes."""
    tk = get_toolkit("2.3.0")
    model = cached_export("flux3", "dynamo")
    folder = tmp_path / "plan"
    cli = CliRunner()
    assert cli.invoke(main, ["partition", str(model), "-s", "fused", "-o", str(folder), "-q"]).exit_code == 0
    r = cli.invoke(main, ["compile", str(folder), "--toolkit", str(tk.python), "--repartition", "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    rounds = rep["repartition"]["rounds"]
    assert rounds[0]["failed_before"] >= 2 and rounds[-1]["failed_after"] == 0 and rep["failed"] == 0
    assert all(not s["artifact"]["cpu_ops"] for s in rep["stages"]), [s["artifact"]["cpu_ops"] for s in rep["stages"]]
    plan, _ = load_plan(folder)
    assert all("exnorm-fusion-segv" in c["why"] for c in plan.extra["capability"]["cuts"])
    _sim_gate(plan, folder, model, "2.3.0")


def _generic_repartition(model: Path, folder: Path, version: str, *compile_args: str) -> dict[str, Any]:
    """``rkpart partition -s generic`` of ``model`` into ``folder``, then ``rkpart compile --no-rewrites
    --repartition`` with ``version`` (and ``compile_args``); both must succeed: the compile's JSON report."""
    tk = get_toolkit(version)
    cli = CliRunner()
    assert cli.invoke(main, ["partition", str(model), "-s", "generic", "-o", str(folder), "-q"]).exit_code == 0
    r = cli.invoke(main, ["compile", str(folder), "--toolkit", str(tk.python), "--no-rewrites", "--repartition",
                          *compile_args, "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    return dict(json.loads(r.output))


def _rope6(path: Path) -> Path:
    """An attention whose q and k RoPE rotate pairs as Kandinsky 6's 1-D RoPE does: a Reshape to
    rank 6, a Mul by the per-position 2x2 rotations, a ReduceSum over the last axis, a Reshape back.
    rknn-toolkit2 2.5.0 raises in ``swap_reshape`` (``ValueError: Can not reshape from [16, 2, 4,
    1] to [1, 16, 2, 16]``), a failure no cut fixes."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    s, h, d = 16, 2, 16

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    inits = [w("Wq", 32, 32), w("Wk", 32, 32), w("Wo", 32, 32),
             w("fq", s, 1, d // 2, 2, 2), w("fk", s, 1, d // 2, 2, 2),
             *(numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
               (("s6", [1, s, h, d // 2, 1, 2]), ("s4", [1, s, h, d]), ("ax", [-1]), ("s3", [1, s, h * d])))]
    nodes = []
    for t in ("q", "k"):
        nodes += [helper.make_node("MatMul", ["x", f"W{t}"], [f"{t}0"], name=f"{t}_proj"),
                  helper.make_node("Reshape", [f"{t}0", "s6"], [f"{t}6"], name=f"{t}_view6"),
                  helper.make_node("Mul", [f"{t}6", f"f{t}"], [f"{t}m"], name=f"{t}_rot"),
                  helper.make_node("ReduceSum", [f"{t}m", "ax"], [f"{t}s"], name=f"{t}_sum", keepdims=0),
                  helper.make_node("Reshape", [f"{t}s", "s4"], [f"{t}4"], name=f"{t}_view4"),
                  helper.make_node("Transpose", [f"{t}4"], [f"{t}h"], name=f"{t}_heads", perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Transpose", ["kh"], ["kt"], name="k_t", perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["sc"], name="scores"),
              helper.make_node("Softmax", ["sc"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "qh"], ["o4"], name="attend"),
              helper.make_node("Transpose", ["o4"], ["o5"], name="o_t", perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o5", "s3"], ["o3"], name="o_view"),
              helper.make_node("MatMul", ["o3", "Wo"], ["y"], name="o_proj")]
    g = helper.make_graph(nodes, "rope6", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, s, 32])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_failure_no_cut_fixes_is_reduced_and_its_ops_go_to_the_host(tmp_path: Path) -> None:
    """The rank-6 RoPE fails every 2.5.0 build of its stage with a ValueError in a rule that fuses
    nothing.  ``--repartition`` reduces the stage as ``rkpart repro`` does (the same exception
    line, shapes generalised), finds the failing subgraph on q's side, finds its copy on k's side
    by shape classes without another reduction, moves both to the host in one round: every
    stage builds, no CPU layer, the gate passes."""
    model = _rope6(tmp_path / "rope6.onnx")
    folder = tmp_path / "plan"
    rep = _generic_repartition(model, folder, "2.5.0")
    rounds = rep["repartition"]["rounds"]
    assert rounds[0]["failed_before"] == 1 and rounds[0]["cut_before"] == [] and rep["failed"] == 0
    moved = set(rounds[0]["moved"])
    # the stage is reduced once, to one side's 3 ops: k's copy moved in the same round was found by its classes
    assert {"q_sum", "k_sum"} <= moved and not moved & {"q_proj", "k_proj", "scores", "attend", "o_proj"}
    assert all(not s["artifact"]["cpu_ops"] for s in rep["stages"])
    plan, _ = load_plan(folder)
    why = {h["op"]: h["why"] for h in plan.extra["capability"]["host_ops"]}
    assert "fails the build the same way alone" in why["q_sum"] and "Can not reshape" in why["k_sum"]
    assert not (folder / "rknn" / ".tmp").exists()  # the reduction's scratch folder is gone
    _sim_gate(plan, folder, model, "2.5.0")


def _listed_weight_norm(path: Path) -> Path:
    """A projection, a weightless RMSNorm of it gated by a projection of ``c * w`` (``w`` a constant),
    with that ``c * w`` listed right after the norm: 2.5.0's ``replace_rms_norm`` takes the unrelated
    Mul for the norm's weight and its optimiser never returns (RFD4's hang; ``rms-norm-contiguous``
    avoids it, here turned off with every other rewrite)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    inits = [w("W1", 32, 32), w("Wg", 16, 32), w("W2", 32, 32),
             numpy_helper.from_array((np.arange(16) % 5 + 1).astype(np.float32) / 2, "w16"),
             *(numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("two", 2.0), ("eps", 1e-5),
                                                                                 ("one", 1.0)))]
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "W1"], ["h"], name="proj"), mk("Pow", ["h", "two"], ["p"], name="norm_sq"),
             mk("ReduceMean", ["p"], ["m"], axes=[-1], keepdims=1, name="norm_mean"),
             mk("Add", ["m", "eps"], ["a"], name="norm_eps"), mk("Sqrt", ["a"], ["s"], name="norm_sqrt"),
             mk("Div", ["one", "s"], ["r"], name="norm_inv"), mk("Mul", ["h", "r"], ["n"], name="norm"),
             mk("Mul", ["c", "w16"], ["cw"], name="cond_weight"), mk("MatMul", ["cw", "Wg"], ["gl"], name="gate_proj"),
             mk("Sigmoid", ["gl"], ["g"], name="gate_act"), mk("Mul", ["n", "g"], ["y0"], name="gate"),
             mk("MatMul", ["y0", "W2"], ["y"], name="out_proj")]
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "hang", [vi("x", f, [1, 8, 32]), vi("c", f, [1, 8, 16])], [vi("y", f, [1, 8, 32])],
                          inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_stage_whose_build_never_returns_is_rebuilt_with_the_rule_it_stopped_after_off(tmp_path: Path) -> None:
    """A timeout can be the graph's fault: the stage above hangs 2.5.0 after ``replace_rms_norm`` (killed
    at 30 s, its --timeout: no other build has finished to judge it by).  The compile rebuilds it with
    that rule, the last one its log shows rewriting the graph, turned off (``disable_rules``): it builds in
    seconds with no CPU layer, no ``--repartition`` round is needed, and the gate passes.  (Before, the
    round reduced it to 8 ops that went to the host, in ~290 s; a hang no rule fixes is still reduced:
    ``tests/compile/test_hang.py``.)"""
    model = _listed_weight_norm(tmp_path / "hang.onnx")
    folder = tmp_path / "plan"
    rep = _generic_repartition(model, folder, "2.5.0", "--timeout", "30")
    assert rep["repartition"]["rounds"] == [] and rep["failed"] == 0
    [h] = rep["hangs"]
    assert h["why"] == "killed at --timeout 30 s (wall)" and h["resolved_by"].endswith(
        "disable_rules=['replace_rms_norm']"), h
    assert all(not s["artifact"]["cpu_ops"] for s in rep["stages"])
    plan, _ = load_plan(folder)
    assert plan.extra["compile"]["config"] == {}  # the rule is off for that stage's build only
    assert len(plan.npu_stages) == 1 and plan.npu_stages[0].failures == ()
    _sim_gate(plan, folder, model, "2.5.0")


def test_a_round_that_makes_the_plan_worse_is_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """T5FiLM (TorchScript, ``split``, 2.5.0) as the partition made it before stage inputs got rank-4
    views (fault injected: no view, neither ``narrow_npu_inputs`` nor ``narrow_crossings`` finds
    anything): its encoder-decoder mask, ``[2, 16, 22]``, is converted on the CPU at every stage
    boundary it crosses (a rank-3 tensor whose last dim is not a multiple of 8).  Each round moves
    the op reading it to the host and the conversion follows the boundary: more stages, no fewer
    CPU layers.  The best round's plan (the first) is written again at the end, its stages taken
    from the build cache, and the layers that stay are reported."""
    import rkpart.grouping.propose

    monkeypatch.setattr(rkpart.grouping.propose, "narrow_npu_inputs", lambda mg, part: [])
    monkeypatch.setattr(rkpart.grouping.propose, "narrow_crossings", lambda mg, part: [])
    tk = get_toolkit("2.5.0")
    model = cached_export("t5film", "torchscript")
    folder = tmp_path / "plan"
    cli = CliRunner()
    assert cli.invoke(main, ["partition", str(model), "-s", "split", "-o", str(folder), "-q"]).exit_code == 0
    first, _ = load_plan(folder)
    r = cli.invoke(main, ["compile", str(folder), "--toolkit", str(tk.python), "--repartition", "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    rounds = rep["repartition"]["rounds"]
    assert rounds[0]["cpu_layers_before"] == 2 and any(x["cpu_layers_after"] > 2 for x in rounds[:-1])
    assert rounds[-1]["kept_best"] and rounds[-1]["stages_built"] == 0 and rounds[-1]["cpu_layers_after"] == 2
    plan, _ = load_plan(folder)
    assert [s.id for s in plan.stages] == [s.id for s in first.stages]
    assert len(rep["repartition"]["unmovable_cpu_layers"]) == 2


def test_a_narrow_host_tensor_reaches_the_npu_as_a_rank4_view(tmp_path: Path) -> None:
    """The same T5FiLM plan as partitioned now: the mask reaches each cross-attention stage as
    ``[1, 2, 16, 22]`` and is reshaped back inside it; every stage builds on 2.5.0 with no CPU
    layer from the first build on (no round), and the simulator gate passes."""
    tk = get_toolkit("2.5.0")
    model = cached_export("t5film", "torchscript")
    folder = tmp_path / "plan"
    cli = CliRunner()
    assert cli.invoke(main, ["partition", str(model), "-s", "split", "-o", str(folder), "-q"]).exit_code == 0
    r = cli.invoke(main, ["compile", str(folder), "--toolkit", str(tk.python), "--repartition", "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["repartition"]["rounds"] == [] and rep["failed"] == 0, rep["repartition"]
    assert not any(rep["cpu_ops_per_block"].values()), rep["cpu_ops_per_block"]
    plan, _ = load_plan(folder)
    xattn = [s for s in plan.npu_stages if s.region == "xattn"]
    assert len(xattn) == 2 and all(
        any(plan.tensors[t].shape == (1, 2, 16, 22) for t in s.inputs) for s in xattn), [s.inputs for s in xattn]
    _sim_gate(plan, folder, model, "2.5.0")
