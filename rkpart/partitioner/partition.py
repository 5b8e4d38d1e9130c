"""What a strategy proposes: groups of ops, each on one device, and their execution order.

Plain frozen dataclasses, as torch.fx's ``Partition``: a :class:`Partition` says *which* ops
form a stage and where it runs; :func:`order_groups` puts the stages in an order the
dependencies allow (cycle-checked) and merges adjacent host work.  Strategies build
partitions (:mod:`rkpart.strategies`), :mod:`rkpart.partitioner.write` turns them into plan
folders, and the cost model compares them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from rkpart.errors import InternalError, SpecError
from rkpart.ir import ModelGraph
from rkpart.partitioner.discovery import Block
from rkpart.types import Device


@dataclass(frozen=True)
class Group:
    """A proposed stage: a set of op indices on one device."""

    id: str
    device: Device
    ops: frozenset[int]
    region: str
    kind: str
    block: int | None = None
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Partition:
    strategy: str
    options: Mapping[str, Any]
    groups: tuple[Group, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)


def block_id(b: Block) -> str:
    """The stage-id prefix of block ``b`` (``b03``)."""
    return f"b{b.index:02d}"


@dataclass(frozen=True)
class OrderedGroup:
    id: str
    device: Device
    ops: frozenset[int]
    region: str
    kind: str
    block: int | None
    blocks: tuple[int, ...]


def order_groups(mg: ModelGraph, part: Partition, *, merge_host: bool = True) -> list[OrderedGroup]:
    """Execution order of the partition's groups; adjacent host groups merged.

    Raises :class:`SpecError` if the grouping is cyclic (two stages need each other's
    outputs), which only a custom spec can cause.
    """
    owner: dict[int, int] = {}
    for gi, grp in enumerate(part.groups):
        for i in grp.ops:
            if i in owner:
                raise InternalError(f"op {i} assigned to {part.groups[owner[i]].id} and {grp.id}")
            owner[i] = gi
    missing = [i for i in mg.ops.nodes if i not in owner]
    if missing:
        raise InternalError(f"strategy {part.strategy} left {len(missing)} ops unassigned (e.g. {missing[0]})")
    q = nx.DiGraph()
    q.add_nodes_from(range(len(part.groups)))
    for a, b in mg.ops.edges:
        ga, gb = owner[a], owner[b]
        if ga != gb:
            q.add_edge(ga, gb)
    first = {gi: min(grp.ops) for gi, grp in enumerate(part.groups)}
    try:
        order = list(nx.lexicographical_topological_sort(q, key=lambda gi: first[gi]))
    except nx.NetworkXUnfeasible:
        cyc = nx.find_cycle(q)
        names = " -> ".join(part.groups[a].id for a, _ in cyc)
        raise SpecError(f"stages depend on each other in a cycle: {names}; change the grouping") from None
    out: list[OrderedGroup] = []
    for gi in order:
        g: Group | OrderedGroup = part.groups[gi]
        if merge_host and out and g.device == "host" and out[-1].device == "host":
            prev = out[-1]
            kinds = prev.kind.split("+")
            kinds += [k for k in g.kind.split("+") if k not in kinds]
            out[-1] = OrderedGroup(
                id=prev.id, device="host", ops=prev.ops | g.ops, region=prev.region if prev.region == g.region
                else "host", kind="+".join(kinds),
                # named after the NPU stage it prepares: attribute it to that one's block
                block=g.block if g.block is not None else prev.block,
                blocks=tuple(sorted(set(prev.blocks) | set(g.blocks))),
            )
        else:
            out.append(OrderedGroup(g.id, g.device, g.ops, g.region, g.kind, g.block, g.blocks))
    # host ids get readable, unique names
    final: list[OrderedGroup] = []
    for idx, og in enumerate(out):
        gid = og.id
        if og.device == "host":
            nxt = next((h.id for h in out[idx + 1:] if h.device == "npu"), None)
            gid = "prologue" if idx == 0 else (f"{nxt}.pre" if nxt else "epilogue")
        final.append(OrderedGroup(gid, og.device, og.ops, og.region, og.kind, og.block, og.blocks))
    ids = [g.id for g in final]
    if len(set(ids)) != len(ids):
        seen: dict[str, int] = {}
        renamed: list[OrderedGroup] = []
        for og in final:
            n = seen.get(og.id, 0)
            seen[og.id] = n + 1
            renamed.append(og if n == 0 else OrderedGroup(f"{og.id}.{n}", og.device, og.ops, og.region, og.kind,
                                                          og.block, og.blocks))
        final = renamed
    return final


__all__ = ["Group", "OrderedGroup", "Partition", "block_id", "order_groups"]
