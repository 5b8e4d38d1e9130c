"""Strategy options: unknown or inapplicable ones are refused before the model is loaded; NPU-less plans warn;
the strategy-authoring API is public and a Strategy instance can be partitioned with directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import rkpart
from rkpart.cli import main
from rkpart.errors import UserError
from rkpart.pipeline import partition


@pytest.mark.parametrize("strategy,options,message", [
    ("split", {"adlan": "npu"},
     "unknown option 'adlan' for strategy split; did you mean 'adaln'? (it takes: adaln, residual, modulation)"),
    ("split", {"foo": 1}, "unknown option 'foo' for strategy split (it takes: adaln, residual, modulation)"),
    ("fused", {"adaln": "npu"},
     "option 'adaln' does not apply to strategy fused but to split (it takes: blocks_per_stage, modulation)"),
    ("split", {"budget_mib": 100}, "option 'budget_mib' does not apply to strategy split but to auto, generic"),
    ("generic", {"budget_mb": 100}, "unknown option 'budget_mb' for strategy generic; did you mean 'budget_mib'?"),
])
def test_bad_options_are_refused_before_loading(tmp_path: Path, strategy: str, options: dict[str, Any],
                                                message: str) -> None:
    missing = tmp_path / "not-even-there.onnx"  # refused before the model is read
    with pytest.raises(UserError) as e:
        partition(missing, tmp_path / "out", strategy, **options)
    assert str(e.value).startswith(message)
    assert not (tmp_path / "out").exists()


def test_cli_one_line_and_exit_2(example_model: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["partition", str(example_model), "-o", str(tmp_path / "o"), "-s", "fused",
                                  "--adaln", "npu"])
    assert r.exit_code == 2
    assert r.output == ("rkpart: error: option 'adaln' does not apply to strategy fused but to split "
                        "(it takes: blocks_per_stage, modulation)\n")


def test_custom_spec_rest_options_are_checked(example_model: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\nrest: fused\nrest_options: {adaln: npu}\nstages:\n  - id: b00\n    blocks: [0]\n")
    with pytest.raises(UserError, match="rest_options for fused: unknown option 'adaln' for strategy fused"):
        partition(example_model, tmp_path / "o", "custom", spec=spec)


def test_npu_less_plan_warns_even_when_quiet(example_model: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["partition", str(example_model), "-o", str(tmp_path / "o"), "-s", "generic",
                                  "--option", "device=host", "-q"])
    assert r.exit_code == 0
    assert "rkpart: warning: the plan has no NPU stage; strategy generic put the whole model on the host" in r.output
    plan, _ = rkpart.load_plan(tmp_path / "o")
    assert not plan.npu_stages
    assert any("put no stage on the NPU" in n for n in plan.extra.get("notes", ()))
    quiet_ok = CliRunner().invoke(main, ["partition", str(example_model), "-o", str(tmp_path / "p"), "-q"])
    assert "warning" not in quiet_ok.output


class Halves(rkpart.Strategy):
    name = "halves"
    needs_blocks = False
    accepts = ("share",)

    def propose(self, mg: Any, disc: Any, **options: Any) -> rkpart.Partition:
        order = sorted(mg.ops.nodes)
        mid = int(len(order) * float(options.get("share", 0.5)))
        gb = rkpart.GroupBuilder()
        gb.add("front", set(order[:mid]), device="npu", region="half", kind="half")
        gb.add_host_rest(mg, disc)
        return gb.build(self.name, dict(options))


def test_strategy_instance_with_the_public_authoring_api(example_model: Path, tmp_path: Path) -> None:
    plan = rkpart.partition(example_model, str(tmp_path / "h"), strategy=Halves(), share=0.25)
    assert plan.strategy == {"name": "halves", "options": {"share": 0.25}}
    # the front quarter reads the rank-5 latent: the host prologue hands it over as a rank-4 view
    assert [(s.id, s.device) for s in plan.stages] == [("prologue", "host"), ("front", "npu"), ("epilogue", "host")]
    assert any(t.startswith("rkpart/rank4/") for t in plan.stage("front").inputs)
    with pytest.raises(UserError, match="did you mean 'share'"):
        rkpart.partition(example_model, tmp_path / "h2", strategy=Halves(), shares=0.25)
    assert isinstance(plan, rkpart.Plan) and rkpart.Group.__name__ == "Group"
