"""Blocks without names: on anonymised exports, structure finds the blocks the module names give.

The layouts (:mod:`tests.models.structural`) are the ones a period of region names cannot cut:
dual-stream blocks followed by single-stream ones, alternating spatial and temporal blocks,
text blocks that all run before the visual ones, a perceiver cross-attention between blocks,
and two independent refiners side by side.  Each is exported by both exporters; the named
export is numbered by its module scopes, the anonymised copy (no names, no metadata) by
structure alone, and the two must agree op for op.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.discovery.structure import Discovery, discover
from rkpart.grouping.coverage import MIN_SHARE
from rkpart.ir import load_model
from rkpart.plan.anonymize import anonymize_file
from tests.models.structural import LAYOUTS, cached_export
from tests.partitioner.checks import npu_per_block, partition_and_check

pytestmark = pytest.mark.export

EXPORTERS = ("torchscript", "dynamo")
#: layout -> region names per block, as the module names number them
DIT: tuple[str, ...] = ("attn", "ffn")
EXPECTED: dict[str, list[tuple[str, ...]]] = {
    "dual_single": [("jattn", "ffn", "ffn_txt")] * 3 + [("attn_mlp",)] * 5,
    "spatial_temporal": [("attn", "xattn", "ffn"), DIT] * 3,
    # the visual blocks' cross-attention reads the text stream's last tensor: joint by structure
    "text_first": [("attn_txt", "ffn_txt")] * 2 + [("attn", "jattn", "ffn")] * 3,
    "perceiver": [DIT, DIT, ("xattn",)] * 2,
    "side_refiners": [("attn_txt", "ffn_txt")] * 2 + [DIT] * 5,
    "interleaved": [("attn_txt", "ffn_txt"), DIT] * 2 + [DIT] * 3,
    "hinted": [DIT] * 5,
}
#: (layout, exporter) -> region names where one exporter's graph reads differently.  dynamo: no
#: Cast between a hint projection and the add that injects it, so the projection is one piece
#: with that add, which the next block reads: that block's long skip.  TorchScript exports the
#: hint's ``.to(device)`` as a Cast that splits the projection off: glue between blocks.
EXPORTER_EXPECTED: dict[tuple[str, str], list[tuple[str, ...]]] = {
    ("hinted", "dynamo"): [DIT] * 3 + [("skip", *DIT)] * 2,
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[Path, Path]]:
    """(layout, exporter) -> (named export, anonymised copy), made on first use (the export cached)."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("layouts")
    made: dict[tuple[str, str], tuple[Path, Path]] = {}

    class Lazy(dict[tuple[str, str], tuple[Path, Path]]):
        def __missing__(self, key: tuple[str, str]) -> tuple[Path, Path]:
            layout, exporter = key
            named = cached_export(layout, exporter)
            made[key] = (named, anonymize_file(named, root / f"{layout}-{exporter}-anon.onnx"))
            return made[key]

    return Lazy()


def _names(d: Discovery) -> list[tuple[str, ...]]:
    return [tuple(r.name.rstrip("0123456789") for r in b.regions) for b in d.blocks]


def test_layouts_cover_the_expected_blocks() -> None:
    assert {k: len(v) for k, v in EXPECTED.items()} == LAYOUTS


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_structure_finds_the_named_blocks(exports: dict[tuple[str, str], tuple[Path, Path]], layout: str,
                                          exporter: str) -> None:
    named, anon = exports[layout, exporter]
    d, d_anon = discover(load_model(named)), discover(load_model(anon))
    assert (d.method, d_anon.method) == ("names", "structure")
    expected = EXPORTER_EXPECTED.get((layout, exporter), EXPECTED[layout])
    assert _names(d) == expected
    assert _names(d_anon) == expected
    # the same ops, not just the same counts: anonymisation keeps node order
    assert [b.ops for b in d_anon.blocks] == [b.ops for b in d.blocks]
    assert (d_anon.prologue, d_anon.glue, d_anon.epilogue) == (d.prologue, d.glue, d.epilogue)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["split", "fused"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_unnamed_plans_reproduce(exports: dict[tuple[str, str], tuple[Path, Path]], tmp_path: Path, layout: str,
                                 strategy: str) -> None:
    _, anon = exports[layout, "torchscript"]
    plan = partition_and_check(anon, tmp_path / "plan", strategy)
    cov = plan.extra["npu_coverage"]
    assert cov["share"] >= MIN_SHARE, cov
    assert sorted(npu_per_block(plan)) == list(range(LAYOUTS[layout]))  # every block has NPU stages


@pytest.mark.slow
@pytest.mark.parametrize("anon", [False, True], ids=["named", "anonymised"])
def test_token_matmul_glue_runs_on_the_npu(exports: dict[tuple[str, str], tuple[Path, Path]], tmp_path: Path,
                                           anon: bool) -> None:
    """Hint projections between blocks (glue: TorchScript's Cast splits them off the add that injects
    them) are matmuls over every token: each strategy puts them in NPU stages, ``fused`` inside the
    control block whose output they project, ``split`` as stages of their own; none is left on the host."""
    from rkpart.ir.work import token_macs

    model = exports["hinted", "torchscript"][anon]
    mg = load_model(model)
    d = discover(mg)
    hints = set(token_macs(mg, d.glue))
    assert len(hints) == 2  # the layout's two hint projections are glue, as WanVACE's are
    for strategy, stages in (("split", 2 * 5 + 2), ("fused", 5)):
        plan = partition_and_check(model, tmp_path / strategy, strategy)
        assert plan.extra["npu_coverage"]["share"] == 1.0
        assert len(plan.npu_stages) == stages, [s.id for s in plan.npu_stages]
        tokens = [s.id for s in plan.npu_stages if s.kind == "token-matmul"]
        assert len(tokens) == (2 if strategy == "split" else 0), tokens
