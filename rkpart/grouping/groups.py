"""What a strategy proposes: groups of ops, each on one device, and their execution order.

Plain frozen dataclasses, as torch.fx's ``Partition``: a :class:`Partition` says *which* ops
form a stage and where it runs; :func:`order_groups` puts the stages in an order the
dependencies allow (cycle-checked) and merges adjacent host work.  Strategies build
partitions (:mod:`rkpart.grouping.strategies`), :mod:`rkpart.plan.write` turns them into plan
folders, and the cost model compares them.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import networkx as nx
import numpy as np

from rkpart.discovery.structure import Block
from rkpart.errors import InternalError, SpecError
from rkpart.ir import ModelGraph
from rkpart.types import Device, JsonMap


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
    options: JsonMap
    groups: tuple[Group, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: facts the plan records under ``extra`` (e.g. ``capability``: the ops moved to the host, why)
    extra: JsonMap = field(default_factory=dict)


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


def acyclic(mg: ModelGraph, part: Partition, *, pinned: Iterable[str] = ()) -> Partition:
    """``part``, or a copy whose groups that fed each other are re-cut or merged (:func:`break_cycles`).

    Every strategy's partition passes through here during proposal (:class:`GroupBuilder
    <rkpart.grouping.strategies.base.GroupBuilder>` and :func:`rkpart.grouping.propose.propose`), so whatever the
    family's anatomy, the stages can run in some order.  What changed is told in the notes.
    """
    groups, notes = break_cycles(mg, part.groups, pinned=pinned)
    if not notes:
        return part
    return replace(part, groups=groups, notes=(*part.notes, *notes))


def break_cycles(mg: ModelGraph, groups: Sequence[Group], *,
                 pinned: Iterable[str] = ()) -> tuple[tuple[Group, ...], list[str]]:
    """Groups like ``groups`` whose stage graph is acyclic, and a note per change.

    Stages that feed each other (``a2v -> v2a.adaln -> v2a -> a2v.adaln -> a2v`` on a block
    whose two streams cross-attend) are resolved one strongly connected component of the
    stage graph at a time, smallest change first, as torch.fx's ``CapabilityBasedPartitioner``
    only accepts merges that leave the graph acyclic:

    1. a host group on the cycle is cut op by op (host work has no stage boundary cost of its
       own: :func:`order_groups` joins the host ops that end up adjacent again);
    2. what still cycles goes through NPU groups: the two adjacent NPU groups on the shortest
       cycle with the fewest ops between them are merged, with every op on a path from one to
       the other (:func:`convex_hull`); a merged group is convex, so no cycle passes through it.
       One NPU group on a cycle of host ops takes those ops in.  NPU work stays on the NPU.

    Repeats until the stage graph is a DAG; each step removes a group, so it ends.  The result
    depends only on the graph and the groups' order (no hash-seed dependence).

    ``pinned`` names groups that must not change (a custom spec's stages): a cycle that only
    changing one of them would break raises :class:`SpecError`.
    """
    fixed = set(pinned)
    slots = _Slots(groups)
    n_ops = max(mg.ops.nodes, default=-1) + 1
    owner = np.full(n_ops, -1, dtype=np.int64)
    for si, g in enumerate(groups):
        owner[list(g.ops)] = si
    edges = np.array(sorted(mg.ops.edges), dtype=np.int64).reshape(-1, 2)
    notes: list[str] = []
    origin: str | None = None  # the cycle as first seen, before host groups on it were cut

    def quotient() -> nx.DiGraph:
        q = nx.DiGraph()
        q.add_nodes_from(slots.live())
        if len(edges):
            pairs = owner[edges]
            pairs = pairs[pairs[:, 0] != pairs[:, 1]]
            q.add_edges_from((int(x), int(y)) for x, y in np.unique(pairs, axis=0).tolist())
        return q

    def cycle_text(cyc: list[int]) -> str:
        steps = [slots[cyc[0]].id]
        src, dst = owner[edges[:, 0]], owner[edges[:, 1]]
        for a, b in zip(cyc, [*cyc[1:], cyc[0]], strict=True):
            hits = edges[(src == a) & (dst == b)].tolist()
            t = next((t for x, y in hits for t in mg.op(x).outputs if t in mg.op(y).inputs), "?")
            steps.append(f"-({t})-> {slots[b].id}")
        return " ".join(steps)

    while True:
        q = quotient()
        if nx.is_directed_acyclic_graph(q):
            break
        first = {si: min(slots[si].ops) for si in slots.live()}
        sccs = [c for c in nx.strongly_connected_components(q) if len(c) > 1]
        scc = min(sccs, key=lambda c: min(first[s] for s in c))
        cyc = _shortest_cycle(q.subgraph(scc), sorted(scc, key=first.__getitem__))
        text = cycle_text(cyc)
        cut = [s for s in sorted(scc)
               if slots[s].device == "host" and len(slots[s].ops) > 1 and slots[s].id not in fixed]
        if cut:
            names = ", ".join(slots[s].id for s in cut)
            for s in cut:
                g = slots.pop(s)
                for i in sorted(g.ops):
                    owner[i] = slots.add(replace(g, id=f"{g.id}@{i}", ops=frozenset({i})))
            notes.append(f"host stage(s) {names} cut op by op: they sat on a cycle {text}")
            origin = origin or text
            continue
        if not _merge_on_cycle(mg, slots, owner, cyc, fixed, text, notes):
            raise SpecError(f"stages depend on each other in a cycle: {origin or text}; change the grouping")
        origin = None
    return tuple(slots[s] for s in slots.live()), notes


class _Slots:
    """:func:`break_cycles`' groups by position: removed ones leave a hole, new ones go last."""

    def __init__(self, groups: Sequence[Group]) -> None:
        self._items: list[Group | None] = list(groups)

    def __getitem__(self, si: int) -> Group:
        g = self._items[si]
        assert g is not None, si
        return g

    def __setitem__(self, si: int, g: Group | None) -> None:
        self._items[si] = g

    def pop(self, si: int) -> Group:
        g = self[si]
        self._items[si] = None
        return g

    def add(self, g: Group) -> int:
        self._items.append(g)
        return len(self._items) - 1

    def live(self) -> list[int]:
        return [si for si, g in enumerate(self._items) if g is not None]


def _shortest_cycle(q: nx.DiGraph, nodes: list[int]) -> list[int]:
    """The shortest cycle of the strongly connected ``q``: through the earliest node among ties."""
    best: list[int] | None = None
    rank = {s: k for k, s in enumerate(nodes)}
    for s in nodes:
        for t in sorted(q.predecessors(s), key=rank.__getitem__):
            path: list[int] = nx.shortest_path(q, s, t)
            if best is None or len(path) < len(best):
                best = path
    assert best is not None
    return best


def _merge_on_cycle(mg: ModelGraph, slots: _Slots, owner: np.ndarray, cyc: list[int],
                    fixed: set[str], text: str, notes: list[str]) -> bool:
    """Merge the cheapest adjacent NPU pair on ``cyc`` (with the ops between); False if none may be."""
    npus = [s for s in cyc if slots[s].device == "npu"]
    cands: list[tuple[int, ...]]
    if len(npus) == 1:
        cands = [(npus[0],)]
    else:
        pairs: list[tuple[int, ...]] = [(npus[k], npus[(k + 1) % len(npus)]) for k in range(len(npus))]
        pairs = pairs[:1] if len(npus) == 2 else pairs
        size = {p: (sum(len(slots[s].ops) for s in p), k) for k, p in enumerate(pairs)}
        cands = sorted(pairs, key=size.__getitem__)
    for cand in cands:
        if any(slots[s].id in fixed for s in cand):
            continue
        take = set(cand)
        ops: set[int] = set().union(*(slots[s].ops for s in take))
        while True:
            hull = convex_hull(mg, ops)
            more = {int(owner[i]) for i in hull if slots[int(owner[i])].device == "npu"} - take
            if not more:
                break
            take |= more
            ops |= set().union(*(slots[s].ops for s in more))
        if len(take) == 1 and not hull:
            continue  # convex already: the cycle runs through a group that may not change
        touched = {int(owner[i]) for i in hull}
        if any(slots[s].id in fixed for s in touched | take):
            continue
        members = [slots[s] for s in sorted(take, key=lambda s: min(slots[s].ops))]
        head = members[0]
        regions = list(dict.fromkeys(g.region for g in members))
        kinds = list(dict.fromkeys(k for g in members for k in g.kind.split("+")))
        blocks = sorted({b for g in members for b in (g.blocks or ((g.block,) if g.block is not None else ()))})
        merged = Group(id=head.id, device="npu", ops=frozenset(ops | hull), region="+".join(regions),
                       kind="+".join(kinds), block=head.block, blocks=tuple(blocks))
        for s in touched:
            rest = slots[s].ops - hull
            slots[s] = replace(slots[s], ops=rest) if rest else None
        for s in take:
            slots[s] = None
        si = min(take)
        slots[si] = merged
        owner[list(merged.ops)] = si
        between = f", with {len(hull)} op(s) between them" if hull else ""
        notes.append(f"NPU stage(s) {', '.join(g.id for g in members)} merged into {merged.id}{between}: "
                     f"they fed each other in a cycle {text}")
        return True
    return False


__all__ = ["Group", "Partition", "acyclic", "block_id", "break_cycles", "convex_hull", "order_groups",
           "stage_cycle"]
