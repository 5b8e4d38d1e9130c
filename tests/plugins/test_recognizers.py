"""How discovery consults recognisers: order, fallbacks, and recognisers that misbehave."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.discovery.recognizers import ScopeRecognizer, discover, discovery_from_blocks, relabel, structural
from rkpart.discovery.structure import Discovery
from rkpart.errors import DiscoveryError, UserError
from rkpart.ir import ModelGraph, load_model


class Fixed:
    """A recogniser returning whatever it was given (or raising it)."""

    def __init__(self, name: str, result: object, stage: str = "before") -> None:
        self.name, self.result, self.stage, self.calls = name, result, stage, 0

    def recognize(self, mg: ModelGraph) -> Discovery | None:
        self.calls += 1
        if isinstance(self.result, BaseException):
            raise self.result
        if callable(self.result):
            return self.result(mg)
        return self.result  # type: ignore[return-value]


@pytest.fixture(scope="module")
def dit(example_model: Path) -> ModelGraph:
    return load_model(example_model)


def test_before_recognizer_wins_over_structure(dit: ModelGraph) -> None:
    rename = Fixed("names", lambda mg: relabel(structural(mg), {"xattn": "cross"}, method="recognizer:names"))
    disc = discover(dit, recognizers=[rename])
    assert disc.method == "recognizer:names"
    assert [r.name for r in disc.blocks[0].regions] == ["attn", "cross", "ffn"]
    assert structural(dit).blocks[0].regions[1].core == disc.blocks[0].regions[1].core


@pytest.mark.export
def test_after_recognizer_only_when_structure_finds_nothing(dit: ModelGraph, postnorm_onnx: Path) -> None:
    late = Fixed("late", None, stage="after")
    assert discover(dit, recognizers=[late]).method == "names"
    assert late.calls == 0
    post = load_model(postnorm_onnx)
    assert discover(post, recognizers=[late, ScopeRecognizer("scopes")]).method == "recognizer:scopes"
    assert late.calls == 1
    with pytest.raises(DiscoveryError, match=r"no transformer blocks found .*\(recognisers tried: late\)"):
        discover(post, recognizers=[late])


def test_misbehaving_recognizers_are_skipped_with_a_note(dit: ModelGraph) -> None:
    notes: list[str] = []
    recs = [Fixed("a_raises", ZeroDivisionError("oops")), Fixed("b_wrong_type", {"blocks": []})]
    assert discover(dit, recognizers=recs, notes=notes).method == "names"
    assert notes == ["recogniser 'a_raises' raised ZeroDivisionError: oops; skipped",
                     "recogniser 'b_wrong_type' returned dict, not a Discovery; skipped"]
    # a deliberate user error is not swallowed
    with pytest.raises(UserError, match="model too odd"):
        discover(dit, recognizers=[Fixed("strict", UserError("model too odd"))])


def test_invalid_discoveries_are_refused(dit: ModelGraph) -> None:
    ops = sorted(dit.ops.nodes)
    with pytest.raises(DiscoveryError, match=r"op \d+ \(.*\) is in both block 0 region a and block 1 region b"):
        discovery_from_blocks(dit, [{"a": ops[:5]}, {"b": ops[3:8]}], method="x")
    with pytest.raises(DiscoveryError, match="names op 999999, which is not a non-constant op"):
        discovery_from_blocks(dit, [{"a": [999999]}], method="x")
    bad = Fixed("bad", lambda mg: Discovery(blocks=(), prologue=frozenset(), glue=frozenset(),
                                            epilogue=frozenset(), streams=0, method="bad"))
    with pytest.raises(DiscoveryError, match="recogniser 'bad': discovery has no blocks"):
        discover(dit, recognizers=[bad])


def test_discovery_from_blocks_places_the_rest_by_position(dit: ModelGraph) -> None:
    ops = sorted(dit.ops.nodes)
    disc = discovery_from_blocks(dit, [{"first": ops[10:20]}, {"second": ops[30:40]}], method="manual",
                                 block_ops=[ops[20:25], []], kinds={"first": "ffn"})
    assert disc.prologue == frozenset(ops[:10])
    assert disc.glue == frozenset(ops[25:30])
    assert disc.epilogue == frozenset(ops[40:])
    assert disc.blocks[0].mod == frozenset(ops[20:25])
    assert [r.kind for b in disc.blocks for r in b.regions] == ["ffn", "other"]


def test_scope_recognizer_declines_models_without_numbered_scopes(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    assert ScopeRecognizer("scopes").recognize(load_model(tmp_path / "m.onnx")) is None
    with pytest.raises(ValueError, match="stage must be one of before, after"):
        ScopeRecognizer("x", stage="sometimes")
