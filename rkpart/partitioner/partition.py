"""What a strategy proposes: groups of ops, each on one device, and their execution order.

Plain frozen dataclasses, as torch.fx's ``Partition``: a :class:`Partition` says *which* ops
form a stage and where it runs; :func:`order_groups` puts the stages in an order the
dependencies allow (cycle-checked) and merges adjacent host work.  Strategies build
partitions (:mod:`rkpart.strategies`), :mod:`rkpart.partitioner.write` turns them into plan
folders, and the cost model compares them.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
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
    #: facts the plan records under ``extra`` (e.g. ``capability``: the ops moved to the host, why)
    extra: Mapping[str, Any] = field(default_factory=dict)


def block_id(b: Block) -> str:
    """The stage-id prefix of block ``b`` (``b03``)."""
    return f"b{b.index:02d}"


def order_groups(mg: ModelGraph, part: Partition, *, merge_host: bool = True) -> list[Group]:
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
    cycle = stage_cycle(mg, {i: part.groups[gi].id for i, gi in owner.items()})
    if cycle is not None:
        if part.strategy == "custom":
            raise SpecError(f"stages depend on each other in a cycle: {cycle}; change the grouping")
        # the built-in strategies keep their stages acyclic by construction (GroupBuilder)
        raise InternalError(f"strategy {part.strategy} made stages that depend on each other in a cycle: {cycle}")
    q = _quotient(mg, owner)
    first = {gi: min(grp.ops) for gi, grp in enumerate(part.groups)}
    order = list(nx.lexicographical_topological_sort(q, key=lambda gi: first[gi]))
    out: list[Group] = []
    for gi in order:
        g: Group = part.groups[gi]
        if merge_host and out and g.device == "host" and out[-1].device == "host":
            prev = out[-1]
            kinds = prev.kind.split("+")
            kinds += [k for k in g.kind.split("+") if k not in kinds]
            out[-1] = Group(
                id=prev.id, device="host", ops=prev.ops | g.ops, region=prev.region if prev.region == g.region
                else "host", kind="+".join(kinds),
                # named after the NPU stage it prepares: attribute it to that one's block
                block=g.block if g.block is not None else prev.block,
                blocks=tuple(sorted(set(prev.blocks) | set(g.blocks))),
            )
        else:
            out.append(Group(g.id, g.device, g.ops, g.region, g.kind, g.block, g.blocks))
    # host ids get readable, unique names
    final: list[Group] = []
    for idx, og in enumerate(out):
        gid = og.id
        if og.device == "host":
            nxt = next((h.id for h in out[idx + 1:] if h.device == "npu"), None)
            gid = "prologue" if idx == 0 else (f"{nxt}.pre" if nxt else "epilogue")
        final.append(Group(gid, og.device, og.ops, og.region, og.kind, og.block, og.blocks))
    ids = [g.id for g in final]
    if len(set(ids)) != len(ids):
        seen: dict[str, int] = {}
        renamed: list[Group] = []
        for og in final:
            n = seen.get(og.id, 0)
            seen[og.id] = n + 1
            renamed.append(og if n == 0 else Group(f"{og.id}.{n}", og.device, og.ops, og.region, og.kind,
                                                          og.block, og.blocks))
        final = renamed
    return final


def _quotient(mg: ModelGraph, owner: Mapping[int, Hashable]) -> nx.DiGraph:
    """The stage graph: one node per group, an edge where a tensor crosses from one to another."""
    q = nx.DiGraph()
    # sorted, not a set's order: which cycle find_cycle reports (and so the message) must not
    # depend on the process's string hash seed
    q.add_nodes_from(sorted(set(owner.values()), key=str))
    for a, b in mg.ops.edges:
        ga, gb = owner[a], owner[b]
        if ga != gb:
            q.add_edge(ga, gb)
    return q


def stage_cycle(mg: ModelGraph, owner: Mapping[int, Hashable]) -> str | None:
    """``None`` when the groups ``owner`` assigns ops to can run in some order, else the cycle.

    The cycle is told stage by stage with the tensor that crosses each step
    (``b00.block -(t)-> glue -(u)-> b00.block``), so the offending tensor is named.
    """
    q = _quotient(mg, owner)
    if nx.is_directed_acyclic_graph(q):  # the usual case, and much cheaper than looking for a cycle
        return None
    try:
        cyc = nx.find_cycle(q)
    except nx.NetworkXNoCycle:
        return None
    steps = [str(cyc[0][0])]
    for ga, gb in cyc:
        tensor = next((t for a, b in mg.ops.edges if owner[a] == ga and owner[b] == gb
                       for t in mg.op(a).outputs if t in mg.op(b).inputs), "?")
        steps.append(f"-({tensor})-> {gb}")
    return " ".join(steps)


def convex_hull(mg: ModelGraph, ops: Iterable[int]) -> set[int]:
    """Ops outside ``ops`` that lie on a path from one op of ``ops`` to another.

    A stage holding ``ops`` needs exactly these to be in it too (or its own outputs come
    back to it through another stage: a cycle).  Op indices are a topological order, so
    only the span between the first and last op is walked.
    """
    members = set(ops)
    if not members:
        return set()
    lo, hi = min(members), max(members)
    span = [i for i in range(lo, hi + 1) if i in mg.ops]
    below = set(members)  # members and their descendants within the span
    for i in span:
        if i not in below and any(p in below for p in mg.ops.predecessors(i)):
            below.add(i)
    above = set(members)  # members and their ancestors within the span
    for i in reversed(span):
        if i not in above and any(s in above for s in mg.ops.successors(i)):
            above.add(i)
    return (below & above) - members


__all__ = ["Group", "Partition", "block_id", "convex_hull", "order_groups", "stage_cycle"]
