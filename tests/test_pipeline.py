"""rkpart.pipeline: load once, propose, write; partition() is exactly those steps."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from rkpart import pipeline
from rkpart.discovery import recognizers
from rkpart.discovery.structure import Discovery
from rkpart.errors import UserError
from rkpart.ir import ModelGraph
from rkpart.pipeline import PartitionConfig, PartitionOptions, load, partition, propose, run_partition, write_plan


def test_partition_is_load_propose_write(example_model: Path, tmp_path: Path) -> None:
    whole = partition(example_model, tmp_path / "a", "split")
    model = load(example_model)
    steps = write_plan(model, propose(model, "split"), tmp_path / "b")
    assert steps == whole
    assert (tmp_path / "a" / "plan.json").read_bytes() == (tmp_path / "b" / "plan.json").read_bytes()


def test_the_cli_path_takes_one_frozen_options_object(example_model: Path, tmp_path: Path) -> None:
    said: list[str] = []
    opts = PartitionOptions(example_model, tmp_path / "a", "fused",
                            PartitionConfig(options={"blocks_per_stage": 2}, progress=said.append))
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.strategy = "split"  # type: ignore[misc]
    plan = run_partition(opts)
    assert plan == partition(example_model, tmp_path / "b", "fused", blocks_per_stage=2)
    assert (tmp_path / "a" / "plan.json").read_bytes() == (tmp_path / "b" / "plan.json").read_bytes()
    assert said and said[0] == f"loading {example_model}"


def test_partition_refuses_a_setting_given_twice_or_where_it_no_longer_goes(example_model: Path,
                                                                             tmp_path: Path) -> None:
    # each refused before the model is read: nothing is written
    with pytest.raises(TypeError, match=r"takes force, weights as keyword\(s\), not in config"):
        partition(example_model, tmp_path / "a", config=PartitionConfig(force=True, weights="link"))
    with pytest.raises(TypeError, match=r"toolkit both as a keyword and in config"):
        partition(example_model, tmp_path / "a", toolkit="2.5.0", config=PartitionConfig(toolkit="2.3.0"))
    with pytest.raises(TypeError, match=r"takes simplify in config=PartitionConfig\(\.\.\.\)"):
        partition(example_model, tmp_path / "a", simplify=True)
    assert not (tmp_path / "a").exists()


def test_one_discovery_serves_every_proposal(example_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[ModelGraph] = []
    real = recognizers.discover

    def counting(mg: ModelGraph) -> Discovery:  # counts calls, returns the real discovery
        calls.append(mg)
        return real(mg)

    monkeypatch.setattr(recognizers, "discover", counting)
    model = load(example_model)
    split = propose(model, "split")
    fused = propose(model, "fused")
    auto = propose(model, "auto", PartitionConfig(options={"max_run": 1}))
    assert len(calls) == 1
    assert {split.partition.strategy, fused.partition.strategy, auto.partition.strategy} == {"split", "fused", "auto"}


def test_toolkit_capabilities_are_noted_before_anything_is_built(tmp_path: Path) -> None:
    # x -> Ceil -> Relu -> y: Ceil runs on the CPU inside an RK3588 .rknn (measured with 2.3.0)
    g = helper.make_graph([helper.make_node("Ceil", ["x"], ["t"], name="ceil"),
                           helper.make_node("Relu", ["t"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "ceil.onnx")
    model = load(tmp_path / "ceil.onnx")
    said: list[str] = []
    # capability first: Ceil leaves the NPU stage (said as it happens, recorded with why)
    part = propose(model, "generic", PartitionConfig(toolkit="2.3.0", progress=said.append)).partition
    assert any(n.startswith("capability: 1 op(s) moved out of NPU stages to the host (Ceil)") for n in part.notes)
    assert any(line.startswith("capability: Ceil ceil (seg00) -> host: rknn-toolkit2 2.3.0 runs Ceil on the CPU")
               for line in said)
    assert [(h["op"], h["from_stage"]) for h in part.extra["capability"]["host_ops"]] == [("ceil", "seg00")]
    assert propose(model, "generic").partition.extra == part.extra  # no toolkit: the target's default, 2.3.0
    # with the capability off, the grouping is the strategy's and the note says what the toolkit will do
    said.clear()
    kept = propose(model, "generic", PartitionConfig(toolkit="2.3.0", progress=said.append, capability=False))
    note = "target rk3588: NPU stage seg00 holds op(s) rknn-toolkit2 2.3.0 does not run on the NPU: Ceil (cpu)"
    assert kept.partition.notes[-1] == note
    assert f"warning: {note}" in said


@pytest.mark.parametrize("capability", [pytest.param(True, marks=pytest.mark.slow), False])  # True: a rewrite probe
def test_no_warning_for_an_op_the_builds_rewrite_takes_onto_the_npu(tmp_path: Path, capability: bool) -> None:
    """The IsNaN guard of a masked softmax runs on the CPU as exported, but ``rkpart compile``'s nan-guard
    rewrite removes it (2.3.0 and 2.5.0): the stage holds nothing the toolkit will run on the CPU, so
    partition warns of nothing; a Ceil beside it, which no rewrite removes, is still warned of."""
    from tests.compile.test_rewrites_npu import sdpa_bool_mask

    g = sdpa_bool_mask()
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(m, tmp_path / "sdpa.onnx")
    for toolkit in ("2.3.0", "2.5.0"):
        said: list[str] = []
        model = load(tmp_path / "sdpa.onnx")
        proposal = propose(model, "generic", PartitionConfig(toolkit=toolkit, progress=said.append,
                                                             capability=capability))
        part = proposal.partition
        assert not [ln for ln in said if ln.startswith("warning:")], said
        assert not any("does not run on the NPU" in n for n in part.notes)
        npu_ops = {proposal.graph.op(i).op_type for g in part.groups if g.device == "npu" for i in g.ops}
        assert "IsNaN" in npu_ops  # it stays in the NPU stage: the build rewrites it there
    g.node.append(helper.make_node("Ceil", ["y"], ["yc"], name="ceil"))
    g.output[0].name = "yc"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "c.onnx")
    said = []
    propose(load(tmp_path / "c.onnx"), "generic", PartitionConfig(toolkit="2.3.0", progress=said.append,
                                                                  capability=False))
    assert said == ["warning: target rk3588: NPU stage seg00 holds op(s) rknn-toolkit2 2.3.0 does not run on the NPU: "
                    "Ceil (cpu)"]


def test_options_that_do_not_fit_the_strategy_are_refused() -> None:
    with pytest.raises(UserError, match="strategy custom needs option 'spec'"):
        pipeline.check_options("custom", {})
    with pytest.raises(UserError, match="option 'cost_model' does not apply to strategy split but to auto"):
        pipeline.check_options("split", {"cost_model": "m.json", "steps": 2})
    with pytest.raises(UserError, match="option 'steps' does not apply to strategy fused but to auto"):
        pipeline.check_options("fused", {"steps": 2})
    pipeline.check_options("auto", {"cost_model": "m.json", "steps": 2})


def test_opset_above_the_toolkit_is_a_lowering_note_and_rewritten_ops_are_not_flagged(tmp_path: Path) -> None:
    # opset 20 (dynamo's default): compile lowers it; Reciprocal: compile rewrites it onto the NPU
    g = helper.make_graph([helper.make_node("Reciprocal", ["x"], ["t"], name="rec"),
                           helper.make_node("Relu", ["t"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    onnx.save(m, tmp_path / "rec.onnx")
    part = propose(load(tmp_path / "rec.onnx"), "generic", PartitionConfig(toolkit="2.5.0")).partition
    assert part.notes[-1] == "target rk3588: stages will be lowered from opset 20 to 19 for rknn-toolkit2 2.5.0 " \
                             "when compiled"
    assert not any("Reciprocal" in n for n in part.notes)


def test_auto_takes_a_measured_accuracy_term_from_the_cli(example_model: Path, tmp_path: Path) -> None:
    """``--accuracy FILE`` (what ``rkpart drift --accuracy`` writes) replaces the cost model's term:
    a fused family that drifted past the cosine floor is excluded, one that kept it is not."""
    import json

    from click.testing import CliRunner

    from rkpart.cli import main
    from rkpart.cost_model.drift_accuracy import accuracy_from_drift
    from rkpart.profile.drift import LATENT, DriftRow

    fams = {"split": "adaln=host,residual=host", "fused": "adaln=npu,residual=npu"}

    def term(fused_cos: float) -> Path:
        rows = [DriftRow("split", 3, LATENT, None, 0.99999, 1e-3, 8e-8),
                DriftRow("fused", 3, LATENT, None, fused_cos, 1e-2, 8e-6)]
        p = tmp_path / f"acc-{fused_cos}.json"
        p.write_text(json.dumps(accuracy_from_drift(rows, fams)))
        return p

    def explained(acc: Path) -> dict:
        r = CliRunner().invoke(main, ["partition", str(example_model), "--strategy", "auto", "--accuracy", str(acc),
                                      "--explain", "--json", "-q", "--out", str(tmp_path / acc.stem)])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    def fused_excluded(d: dict) -> list[bool]:
        return [str(c.get("excluded") or "").startswith("accuracy")
                for b in d["auto"]["blocks"] for c in b["candidates"] if c["candidate"].startswith("fused")]

    drifting, keeping = explained(term(0.995)), explained(term(0.9995))
    assert fused_excluded(drifting) and all(fused_excluded(drifting))
    assert fused_excluded(keeping) and not any(fused_excluded(keeping))
    recorded = load_plan_json(tmp_path / "acc-0.995")["strategy"]["options"]
    assert recorded["accuracy"].endswith("acc-0.995.json") and len(recorded["accuracy_sha256"]) == 64

    bad = tmp_path / "bad.json"
    bad.write_text('{"families": {}}')
    r = CliRunner().invoke(main, ["partition", str(example_model), "--strategy", "auto", "--accuracy", str(bad),
                                  "-q", "--out", str(tmp_path / "bad")])
    assert r.exit_code != 0 and r.output.count("\n") == 1 and "not an accuracy term" in r.output
    assert not (tmp_path / "bad").exists()
    r = CliRunner().invoke(main, ["partition", str(example_model), "--strategy", "split", "--accuracy", str(bad),
                                  "-q", "--out", str(tmp_path / "s")])
    assert r.exit_code == 2 and r.output == ("rkpart: error: option 'accuracy' does not apply to strategy split but to "
                                             "auto (it takes: adaln, residual, modulation)\n")


def load_plan_json(folder: Path) -> dict:
    import json

    return json.loads((folder / "plan.json").read_text())
