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
from rkpart.compile.learned import load_learned
from rkpart.partitioner.plan import load_plan
from rkpart.pipeline import PartitionConfig, load, propose
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
    assert {h["op_type"] for h in part.extra["capability"]["host_ops"]} >= {"ScatterND"}
    # measured on the CPU standalone (scripts/measure_ops.py) and learned in this plan's build
    assert all("on the CPU" in h["why"] for h in part.extra["capability"]["host_ops"]
               if h["op_type"] == "ScatterND")
    # with the rewrites on, scatternd-interleave removes them: they stay on the NPU
    assert "capability" not in propose(load(model), "split", PartitionConfig(toolkit="2.5.0")).extra



@pytest.mark.parametrize(("exporter", "strategy", "version"), [("torchscript", "split", "2.5.0"),
                                                              ("dynamo", "fused", "2.3.0")])
def test_moe_routing_on_the_host_builds_with_no_cpu_layer(tmp_path: Path, exporter: str, strategy: str,
                                                          version: str) -> None:
    """The MoE family no rewrite was written for: capability and ``--repartition`` leave 0 CPU layers.

    The first build converts the router softmax's narrow output (4 experts) on the CPU
    (``Reshape:<tensor>-rs``); the re-partition moves the stage boundary before it."""
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
    plan, _ = load_plan(folder)
    assert plan.extra["npu_coverage"]["share"] >= 0.99
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
