"""The same Anima architecture exported by the TorchScript and the dynamo exporter.

TorchScript names nodes after module paths (``/transformer_blocks.3/attn1/to_q/MatMul``);
dynamo names them ``node_linear_6`` and keeps the module path in ``namespace`` /
``pkg.torch.onnx.name_scopes`` metadata.  Both must be numbered "by names" and give the
same blocks and regions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rkpart.discovery.structure import discover
from rkpart.ir import load_model
from rkpart.ir.load import _scope_of
from tests.models.anima import AnimaConfig
from tests.partitioner.checks import host_adaln_ops, npu_per_block, partition_and_check, region_table

pytestmark = pytest.mark.export

EXPORTERS = ("torchscript", "dynamo")


def _feeds() -> dict[str, np.ndarray]:
    from tests.models.anima_torch import example_inputs

    return example_inputs(AnimaConfig.tiny(), seed=1)


def test_dynamo_metadata_gives_block_scopes(anima_exports: dict[str, Path]) -> None:
    import onnx

    m = onnx.load(str(anima_exports["dynamo"]), load_external_data=False)
    q = [n for n in m.graph.node
         if "transformer_blocks.1.attn1.to_q" in {p.key: p.value for p in n.metadata_props}
         .get("pkg.torch.onnx.name_scopes", "")]
    assert q, "dynamo export carries no name_scopes metadata"
    assert not q[0].name.startswith("/transformer_blocks")  # names alone say nothing
    scope = _scope_of(q[0])
    assert scope.startswith("/transformer_blocks.1/") and "to_q" in scope


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_blocks_numbered_by_names(anima_exports: dict[str, Path], exporter: str) -> None:
    mg = load_model(anima_exports[exporter])
    d = discover(mg)
    assert d.method == "names"
    assert [b.scope for b in d.blocks] == ["transformer_blocks.0", "transformer_blocks.1"]
    assert region_table(mg, d) == [("attn:self_attention:adaln", "xattn:cross_attention:adaln",
                                    "ffn:ffn:adaln")] * 2
    # the shared SiLU(embedded_timestep) is named after block 0 but read by every block
    # and by norm_out: it must be in the prologue, never in block 0
    shared = [i for i in range(len(mg.nodes)) if "transformer_blocks.0" in mg.op(i).scope
              and "norm1" in mg.op(i).scope and mg.nodes[i].op_type == "Sigmoid"]
    assert shared and all(i in d.prologue for i in shared)
    # block 0 and block 1 have the same op counts per part (nothing leaked into block 0)
    sizes = [[(len(r.pre), len(r.core), len(r.gate), len(r.mod), len(r.side)) for r in b.regions]
             for b in d.blocks]
    assert sizes[0] == sizes[1]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(("strategy", "options", "per_block"), [
    ("split", {}, 3),
    ("fused", {}, 1),
    ("split", {"adaln": "npu"}, 3),
])
def test_plans_reproduce(anima_exports: dict[str, Path], tmp_path: Path, exporter: str, strategy: str,
                         options: dict[str, Any], per_block: int) -> None:
    model = anima_exports[exporter]
    plan = partition_and_check(model, tmp_path / "plan", strategy, feeds=_feeds(), **options)
    assert npu_per_block(plan) == {0: per_block, 1: per_block}
    if strategy == "split":
        mg = load_model(model)
        d = discover(mg)
        left = host_adaln_ops(mg, d, **options)
        if options.get("adaln") == "npu":
            assert left == []  # every region's AdaLN is inside its NPU stage
        else:
            assert len(left) == sum(len(r.pre) for b in d.blocks for r in b.regions) > 0


def test_dynamo_namespace_alone_numbers_blocks(anima_exports: dict[str, Path], tmp_path: Path) -> None:
    """Older dynamo exports carry only ``namespace`` (``transformer_blocks.0: Block/...``)."""
    import onnx

    m = onnx.load(str(anima_exports["dynamo"]))
    for n in m.graph.node:
        keep = [(p.key, p.value) for p in n.metadata_props if p.key == "namespace"]
        del n.metadata_props[:]
        for k, v in keep:
            n.metadata_props.add(key=k, value=v)
    onnx.save(m, str(tmp_path / "ns_only.onnx"))
    mg = load_model(tmp_path / "ns_only.onnx")
    d = discover(mg)
    assert d.method == "names"
    assert [b.scope for b in d.blocks] == ["transformer_blocks.0", "transformer_blocks.1"]
    ref = discover(load_model(anima_exports["dynamo"]))
    assert [b.ops for b in d.blocks] == [b.ops for b in ref.blocks]
