"""Non-DiT transformers exported from PyTorch: generic under a budget, split/fused on their blocks."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import rkpart
from rkpart.plan.plan import Plan
from rkpart.runtime.executor import random_inputs, run_model
from rkpart.validation.metrics import compare
from tests.strategies.footprint import footprint

pytestmark = pytest.mark.export


def _reproduces(plan: Plan, folder: Path, model: Path) -> float:
    from tests.api.vit import example_input  # torch: imported by the test, not at collection

    feeds = example_input()
    got = rkpart.run_plan(plan, folder, feeds)
    return compare(got["logits"], run_model(model, feeds)["logits"]).cosine


@pytest.mark.parametrize("budget_mib", [0.15, 0.3, 0.5])
def test_vit_generic_segments_fit_the_budget(vit_onnx: Path, tmp_path: Path, budget_mib: float) -> None:
    plan = rkpart.partition(vit_onnx, tmp_path / "p", "generic", budget_mib=budget_mib)
    budget = int(budget_mib * 2**20)
    mg = rkpart.load_model(vit_onnx)
    weights = sum(mg.weight_bytes(t) for t in mg.initializers)
    assert len(plan.npu_stages) == len(plan.stages) >= 2 and weights > budget
    names = {n.name: i for i, n in enumerate(mg.nodes)}
    for s in plan.stages:
        stage = onnx.load(str(tmp_path / "p" / s.file), load_external_data=False)
        ops = [names[n.name] for n in stage.graph.node if names[n.name] in mg.ops]
        w, act = footprint(mg, ops)
        assert s.weight_bytes == w  # what extraction wrote = what the model counted
        assert w + act <= budget, (s.id, w, act, budget)
    assert _reproduces(plan, tmp_path / "p", vit_onnx) >= 0.999999


def test_vit_generic_cuts_between_layers(vit_onnx: Path, tmp_path: Path) -> None:
    # room for about two layers per segment: three segments; the cheapest cuts pass a single
    # tensor: the 16 patch tokens before the class token is prepended (smaller than the
    # 17-token stream), then the residual stream after layer 1
    plan = rkpart.partition(vit_onnx, tmp_path / "p", "generic", budget_mib=0.3)
    mg = rkpart.load_model(vit_onnx)
    assert [s.inputs for s in plan.stages[1:]] == [(s.inputs[0],) for s in plan.stages[1:]]
    crossing = [(mg.nodes[mg.producer[s.inputs[0]]].name, plan.tensors[s.inputs[0]].shape) for s in plan.stages[1:]]
    assert crossing == [("/Transpose", (1, 16, 64)), ("/layers.1/Add_1", (1, 17, 64))]


@pytest.mark.parametrize("strategy", ["split", "fused"])
def test_vit_blocks_with_split_and_fused(vit_onnx: Path, tmp_path: Path, strategy: str) -> None:
    mg = rkpart.load_model(vit_onnx)
    disc = rkpart.discover(mg, recognizers=[])  # the built-in residual-chain analysis alone
    assert len(disc.blocks) == 4
    assert [r.kind for r in disc.blocks[0].regions] == ["self_attention", "ffn"]
    plan = rkpart.partition(vit_onnx, tmp_path / "p", strategy)
    assert len(plan.npu_stages) == (8 if strategy == "split" else 4)
    assert _reproduces(plan, tmp_path / "p", vit_onnx) >= 0.999999


@pytest.mark.parametrize("strategy", ["split", "fused", "generic"])
def test_postnorm_encoder_blocks_come_from_the_scope_recognizer(postnorm_onnx: Path, tmp_path: Path,
                                                                strategy: str) -> None:
    mg = rkpart.load_model(postnorm_onnx)
    with pytest.raises(rkpart.UserError, match="no transformer blocks found"):
        rkpart.discover(mg, recognizers=[])
    disc = rkpart.discover(mg)
    assert disc.method == "recognizer:scopes"
    assert [b.scope for b in disc.blocks] == [f"layers.{i}" for i in range(4)]
    # the budget is generic's option; split and fused refuse options they do not read
    options = {"budget_mib": 0.3} if strategy == "generic" else {}
    plan = rkpart.partition(postnorm_onnx, tmp_path / "p", strategy, **options)
    assert len(plan.npu_stages) >= 2
    feeds = random_inputs(plan.tensors, plan.inputs, seed=3)
    got = rkpart.run_plan(plan, tmp_path / "p", feeds)
    assert compare(got["logits"], run_model(postnorm_onnx, feeds)["logits"]).cosine >= 0.999999


def test_scope_recognizer_with_regions(postnorm_onnx: Path, tmp_path: Path) -> None:
    bert = rkpart.ScopeRecognizer("post", r"/layers\.(\d+)/", r"^(attn|mlp)/", stage="before")
    mg = rkpart.load_model(postnorm_onnx)
    disc = rkpart.discover(mg, recognizers=[bert])
    assert disc.method == "recognizer:post"
    b = disc.blocks[0]
    assert [r.name for r in b.regions] == ["attn", "mlp"]
    # the residual adds and post-norm LayerNorms belong to the block but to no region
    assert sorted(mg.nodes[i].op_type for i in b.mod) == ["Add", "Add", "LayerNormalization", "LayerNormalization"]
