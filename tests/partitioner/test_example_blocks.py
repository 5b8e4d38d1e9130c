"""Discovery on the bundled example: identical blocks, shared work in the prologue."""

from __future__ import annotations

from rkpart.discovery.structure import discover
from rkpart.ir import load_model


def _parts(b):
    return [(r.name, r.kind, r.adaln, len(r.pre), len(r.core), len(r.gate), len(r.mod)) for r in b.regions]


def test_blocks_are_identical_and_shared_work_is_prologue(example_model):
    mg = load_model(example_model)
    d = discover(mg)
    assert d.method == "names" and d.streams == 1
    assert [b.scope for b in d.blocks] == ["transformer_blocks.0", "transformer_blocks.1"]
    assert [r.kind for r in d.blocks[0].regions] == ["self_attention", "cross_attention", "ffn"]
    assert _parts(d.blocks[0]) == _parts(d.blocks[1])
    assert len(d.blocks[0].mod) == len(d.blocks[1].mod)
    names = {mg.nodes[i].name for i in d.prologue}
    # the patch embedding feeds only block 0 but computes the stream: prologue
    assert "/patch_embed/proj/MatMul" in names
    # the timestep SiLU is named after block 0 (computed there first, reused by all): shared
    assert "/transformer_blocks.0/norm1/activation/Mul" in names
    for b in d.blocks:
        assert not any("/patch_embed/" in mg.nodes[i].name for i in b.ops)
