"""No cyclic plans, ever: stages that feed each other are re-cut or merged during proposal.

The real case is a two-stream block whose streams cross-attend (:mod:`tests.models.av_dit`, the
anatomy of LTX-2): ``split`` gives each cross-attention its own stage, and each reads what the
other's stream computes, so the stages fed each other in a cycle and ``rkpart inspect`` died.
The property test checks :func:`~rkpart.grouping.groups.acyclic` on random DAGs and
random groupings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from rkpart.cli import main
from rkpart.discovery.structure import Discovery
from rkpart.errors import SpecError
from rkpart.grouping.groups import Group, Partition, acyclic, order_groups, stage_cycle
from rkpart.grouping.strategies.base import Strategy
from rkpart.ir import ModelGraph, load_model
from rkpart.pipeline import partition
from rkpart.types import Device
from tests.partitioner.checks import assert_reproduces

EXPORTERS = ("torchscript", "dynamo")


@pytest.fixture(scope="module")
def av_exports() -> dict[str, Path]:
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from tests.models.av_dit import cached_export

    return {e: cached_export(e) for e in EXPORTERS}


class EveryRegionAlone(Strategy):
    """A plugin-style strategy that builds its Partition by hand (no GroupBuilder): every region's
    core on the NPU, its AdaLN on the host, everything else one host group."""

    name = "every-region-alone"

    def propose(self, mg: ModelGraph, disc: Discovery | None, **options: Any) -> Partition:
        assert disc is not None
        groups: list[Group] = []
        seen: set[int] = set()
        for b in disc.blocks:
            for r in b.regions:
                parts: tuple[tuple[frozenset[int], Device], ...] = ((r.core, "npu"), (r.pre, "host"))
                for part, dev in parts:
                    ops = frozenset(part - seen)
                    if ops:
                        groups.append(Group(f"b{b.index}.{r.name}.{dev}", dev, ops, r.name, r.name, b.index))
                        seen |= ops
        rest = frozenset(i for i in mg.ops.nodes if i not in seen)
        groups.append(Group("rest", "host", rest, "host", "host"))
        return Partition(self.name, {}, tuple(groups))


STRATEGIES: list[tuple[str | Strategy, dict[str, Any]]] = [
    ("split", {}), ("split", {"adaln": "npu"}), ("split", {"residual": "npu"}),
    ("split", {"adaln": "npu", "modulation": "npu"}), ("fused", {}), ("fused", {"blocks_per_stage": 2}),
    ("fused", {"modulation": "host"}), ("generic", {}), ("auto", {}), (EveryRegionAlone(), {}),
]


@pytest.mark.export
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(("strategy", "options"), STRATEGIES,
                         ids=[f"{s if isinstance(s, str) else s.name}-{o}" for s, o in STRATEGIES])
def test_cross_attending_streams_partition_acyclic_and_reproduce(av_exports: dict[str, Path], tmp_path: Path,
                                                                  exporter: str, strategy: str | Strategy,
                                                                  options: dict[str, Any]) -> None:
    from tests.models.av_dit import example_inputs

    model = av_exports[exporter]
    plan = partition(model, tmp_path / "p", strategy, **options)
    assert plan.npu_stages
    assert_reproduces(plan, tmp_path / "p", model, example_inputs(seed=3))
    notes = [n for n in plan.extra["notes"] if "cycle" in n]
    if strategy == "split" and not options:
        # the AdaLNs on the host (split's default; each stream read through its own AdaLN, as SD3's
        # context_pre_only block): the two cross-attentions are stages of their own, no cycle to merge
        assert not notes, notes
        assert {"b00.jattn", "b00.jattn2", "b01.jattn", "b01.jattn2"} <= {s.id for s in plan.npu_stages}


@pytest.mark.export
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_inspect_and_custom_on_cross_attending_streams(av_exports: dict[str, Path], tmp_path: Path,
                                                       exporter: str) -> None:
    from tests.models.av_dit import example_inputs

    model = av_exports[exporter]
    r = CliRunner().invoke(main, ["inspect", str(model)])
    assert r.exit_code == 0, r.output
    assert "2 blocks" in r.output and "split 100.0 %" in r.output
    # a custom spec whose rest is split: the rest's cycles are resolved, the spec's stage kept as asked
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\nrest: split\nstages: [{id: f1, block: 1, regions: [ffn], include: [adaln]}]\n")
    plan = partition(model, tmp_path / "p", "custom", spec=str(spec))
    assert "f1" in [s.id for s in plan.npu_stages]
    assert_reproduces(plan, tmp_path / "p", model, example_inputs(seed=4))


def test_a_cycle_through_a_spec_stage_stays_the_specs_error(example_model: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\nstages: [{id: af, block: 0, regions: [attn, ffn]}]\n")
    with pytest.raises(SpecError, match=r"cycle: .*af"):
        partition(example_model, tmp_path / "p", "custom", spec=str(spec))
    assert not (tmp_path / "p").exists()


# -- property: random DAGs, random groupings ---------------------------------------------------

@st.composite
def dag_and_grouping(draw: st.DrawFn) -> tuple[onnx.ModelProto, list[int], list[str]]:
    n = draw(st.integers(2, 24))
    tensors = ["x"]
    nodes = []
    for i in range(n):
        a = draw(st.sampled_from(tensors))
        if draw(st.booleans()):
            nodes.append(helper.make_node("Relu", [a], [f"t{i}"], name=f"n{i}"))
        else:
            b = draw(st.sampled_from(tensors))
            nodes.append(helper.make_node("Add", [a, b], [f"t{i}"], name=f"n{i}"))
        tensors.append(f"t{i}")
    used = {t for nd in nodes for t in nd.input}
    outs = [t for t in tensors[1:] if t not in used]
    vi = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 4]) for t in outs]
    g = helper.make_graph(nodes, "dag", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])], vi)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    k = draw(st.integers(1, 6))
    owner = draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n))
    devices = draw(st.lists(st.sampled_from(["npu", "host"]), min_size=k, max_size=k))
    return m, owner, devices


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag_and_grouping())
def test_acyclic_on_random_groupings(tmp_path_factory: pytest.TempPathFactory,
                                     case: tuple[onnx.ModelProto, list[int], list[str]]) -> None:
    m, owner, devices = case
    path = tmp_path_factory.mktemp("dag") / "m.onnx"
    onnx.save(m, str(path))
    mg = load_model(path)
    by_name = {nd.name: i for i, nd in enumerate(mg.nodes)}
    ops = {by_name[f"n{j}"]: g for j, g in enumerate(owner)}
    groups = tuple(Group(f"g{g}", devices[g], frozenset(i for i, o in ops.items() if o == g), "r", "k")  # type: ignore[arg-type]
                   for g in sorted(set(owner)))
    part = Partition("random", {}, groups)
    out = acyclic(mg, part)
    # every op in exactly one group; the stage graph acyclic; NPU work still on the NPU
    seen = [i for g in out.groups for i in g.ops]
    assert sorted(seen) == sorted(mg.ops.nodes)
    assert all(g.ops for g in out.groups)
    owner_out = {i: g.id for g in out.groups for i in g.ops}
    assert stage_cycle(mg, owner_out) is None
    on_npu = {i for g in groups if g.device == "npu" for i in g.ops}
    assert on_npu <= {i for g in out.groups if g.device == "npu" for i in g.ops}
    assert len({g.id for g in out.groups}) == len(out.groups)
    order_groups(mg, out)  # orders without complaint
    # unchanged when it was acyclic already; deterministic when not
    if stage_cycle(mg, {i: g.id for g in groups for i in g.ops}) is None:
        assert out is part
    else:
        assert out.notes and acyclic(mg, part) == out
    # a pinned group (a custom spec's stage) comes out as it went in, or the cycle is the spec's error
    pin = groups[0]
    try:
        kept = acyclic(mg, part, pinned=(pin.id,))
    except SpecError as e:
        assert "cycle" in str(e)
    else:
        assert pin in kept.groups
        assert stage_cycle(mg, {i: g.id for g in kept.groups for i in g.ops}) is None


def test_two_npu_groups_that_feed_each_other_are_merged_and_said_so(tmp_path: Path) -> None:
    """a -> b -> c with a and c in one NPU group and b in another: one NPU stage of the three, and a note
    naming both (the cross-attending streams of the AV model did this until their AdaLNs went to the host)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"), helper.make_node("Relu", ["a"], ["b"], name="b"),
             helper.make_node("Relu", ["b"], ["c"], name="c")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    mg = load_model(tmp_path / "m.onnx")
    idx = {nd.name: i for i, nd in enumerate(mg.nodes)}
    part = Partition("hand", {}, (Group("outer", "npu", frozenset({idx["a"], idx["c"]}), "r", "k"),
                                  Group("inner", "npu", frozenset({idx["b"]}), "r", "k")))
    out = acyclic(mg, part)
    assert [(g.id, g.ops) for g in out.groups] == [("outer", frozenset(idx.values()))]
    [note] = out.notes
    assert "outer" in note and "inner" in note and "merged into outer" in note and "cycle" in note


def test_acyclic_partition_is_returned_as_is(example_model: Path) -> None:
    from rkpart.discovery.structure import discover
    from rkpart.grouping.strategies import get_strategy

    mg = load_model(example_model)
    part = get_strategy("split").propose(mg, discover(mg))
    assert acyclic(mg, part) is part
    assert not any("cycle" in n for n in part.notes)
