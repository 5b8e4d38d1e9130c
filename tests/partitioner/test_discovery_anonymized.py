"""Discovery must not need names: an anonymised model gives the same blocks and regions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import onnx
import pytest

from rkpart.discovery.structure import discover
from rkpart.ir import load_model
from rkpart.plan.anonymize import anonymize
from tests.partitioner.checks import (
    host_adaln_ops,
    npu_per_block,
    partition_and_check,
    region_sizes,
    region_table,
)
from tests.partitioner.conftest import EXAMPLE


def test_anonymize_leaves_no_names() -> None:
    src = onnx.load(str(EXAMPLE))
    src.metadata_props.add(key="source", value="transformer_blocks.0")
    src.graph.node[0].metadata_props.add(key="pkg.torch.onnx.name_scopes", value="['', 'transformer_blocks.0']")
    anon = anonymize(src)
    g = anon.graph
    io = {i.name for i in g.input} | {o.name for o in g.output}
    assert io == {i.name for i in src.graph.input} | {o.name for o in src.graph.output}
    assert all(re.fullmatch(r"n\d+", n.name) for n in g.node)
    tensors = {t for n in g.node for t in [*n.input, *n.output] if t} | {i.name for i in g.initializer}
    assert all(re.fullmatch(r"t\d+", t) for t in tensors - io)
    assert {i.name for i in g.initializer}.isdisjoint(io)
    assert not anon.metadata_props and not any(n.metadata_props for n in g.node)
    # the input is untouched and the result is still a valid model
    assert src.graph.node[0].name != "n0"
    onnx.checker.check_model(anon)


def test_anonymize_is_deterministic() -> None:
    src = onnx.load(str(EXAMPLE))
    assert anonymize(src).SerializeToString() == anonymize(src).SerializeToString()


def test_anonymized_example_same_discovery(anonymized_example: Path) -> None:
    mg, mg_anon = load_model(EXAMPLE), load_model(anonymized_example)
    d, d_anon = discover(mg), discover(mg_anon)
    assert d.method == "names" and d_anon.method == "structure"
    assert region_table(mg, d) == region_table(mg_anon, d_anon)
    assert region_table(mg, d) == [("attn:self_attention:adaln", "xattn:cross_attention:adaln",
                                    "ffn:ffn:adaln")] * 2
    assert region_sizes(d) == region_sizes(d_anon)
    assert (len(d.prologue), len(d.glue), len(d.epilogue)) == (
        len(d_anon.prologue), len(d_anon.glue), len(d_anon.epilogue))
    # same op sets, not just the same sizes: node order is preserved by anonymisation
    assert [b.ops for b in d.blocks] == [b.ops for b in d_anon.blocks]


@pytest.mark.parametrize(("strategy", "options", "per_block"), [
    ("split", {}, 3),
    ("fused", {}, 1),
    ("split", {"adaln": "npu"}, 3),
])
def test_anonymized_example_plans_reproduce(anonymized_example: Path, tmp_path: Path, strategy: str,
                                            options: dict[str, Any], per_block: int) -> None:
    plan = partition_and_check(anonymized_example, tmp_path / "plan", strategy, **options)
    assert npu_per_block(plan) == {0: per_block, 1: per_block}
    if options.get("adaln") == "npu":
        mg = load_model(anonymized_example)
        assert host_adaln_ops(mg, discover(mg), adaln="npu") == []
