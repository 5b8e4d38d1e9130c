"""What a strategy is: an object with a ``name`` that proposes a :class:`Partition`.

A strategy only decides *grouping* (which ops form one stage, and on which device); it
never writes files and never mutates the graph or the discovery it is given.  Turning a
partition into stage files and a plan is :mod:`rkpart.plan.write`'s job, judging
which partition is cheapest is the cost model's, and :mod:`rkpart.pipeline` runs the steps.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Generic, TypeVar

import networkx as nx

from rkpart.discovery.structure import Discovery, is_noop
from rkpart.errors import UserError
from rkpart.grouping.groups import Group, Partition, acyclic, block_id, convex_hull
from rkpart.grouping.views import hand_over_rank4_views
from rkpart.ir import ModelGraph
from rkpart.ir.work import token_macs
from rkpart.types import Device, JsonMap, JsonObject

#: a strategy's options type
OptionsT = TypeVar("OptionsT")


class Strategy(abc.ABC, Generic[OptionsT]):
    """Base class of partition strategies (built-in and plugins).

    A strategy declares its options as a frozen dataclass, ``Options``, with a classmethod
    ``from_mapping(options) -> Options`` that converts and checks the mapping the CLI's
    ``--option KEY=VALUE`` and the API's keywords give; :meth:`options_from` builds it once and
    :meth:`propose` receives it.  A plugin that declares no ``Options`` keeps the keyword
    protocol: :func:`propose_with` calls its ``propose(mg, disc, **options)``.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: False for strategies that work on any graph (no block discovery needed)
    needs_blocks: ClassVar[bool] = True
    #: the option names :meth:`propose` reads; others are refused before it is called
    #: (:func:`check_strategy_options`).  ``None``: not declared, nothing is checked.
    accepts: ClassVar[tuple[str, ...] | None] = None
    #: the options :meth:`propose` cannot do without (refused when missing, before loading)
    requires: ClassVar[tuple[str, ...]] = ()

    #: the frozen options dataclass :meth:`propose` takes (``None``: the keyword protocol, above)
    Options: ClassVar[Any] = None

    def options_from(self, options: JsonMap) -> Any:
        """``options`` as this strategy's :attr:`Options`, converted and checked (a plugin without
        ``Options``: the mapping, read-only).  Raises :class:`~rkpart.errors.UserError`."""
        if self.Options is None:
            return MappingProxyType(dict(options))
        return self.Options.from_mapping(options)

    @abc.abstractmethod
    def propose(self, mg: ModelGraph, disc: Discovery | None, opts: OptionsT) -> Partition:
        """Return a new partition of every non-constant op of ``mg``."""


def propose_with(strategy: Strategy[Any], mg: ModelGraph, disc: Discovery | None,
                 options: JsonMap | None = None, *, built: Any = None) -> Partition:
    """``strategy``'s partition with ``options`` (a mapping, built into its ``Options`` here) or
    with options ``built`` by :meth:`Strategy.options_from`; the one way rkpart calls a strategy.
    A plugin without ``Options`` is called the keyword way, ``propose(mg, disc, **options)``."""
    opts = built if built is not None else strategy.options_from(options or {})
    if strategy.Options is None:
        return strategy.propose(mg, disc, **opts)  # the keyword protocol
    return strategy.propose(mg, disc, opts)


def option(options: JsonMap, key: str, default: object, choices: tuple[Any, ...] | None = None) -> Any:
    v = options.get(key, default)
    if v is None:
        v = default
    if choices is not None and v not in choices:
        raise UserError(f"option {key}={v!r} is not one of {', '.join(map(str, choices))}")
    return v


def check_strategy_options(strategy: Strategy, options: JsonMap, *,
                  known: Mapping[str, tuple[str, ...]] | None = None) -> None:
    """Refuse options ``strategy`` does not read, naming the closest one it does, and missing
    options it requires.  The one rule for strategy options: the CLI, the Python API and a
    custom spec's ``rest_options`` all check through it.

    ``known`` maps other strategies' names to their options, so that an option of another
    strategy (``adaln`` given to ``fused``) is reported as not applying rather than unknown.
    """
    missing = [k for k in strategy.requires if options.get(k) is None]
    if missing:
        raise UserError(f"strategy {strategy.name} needs option {missing[0]!r}")
    if strategy.accepts is None:
        return
    import difflib

    takes = f"(it takes: {', '.join(strategy.accepts) or 'no options'})"
    for key in sorted(options):
        if key in strategy.accepts:
            continue
        owners = sorted(n for n, opts in (known or {}).items() if key in opts and n != strategy.name)
        if owners:
            raise UserError(f"option {key!r} does not apply to strategy {strategy.name} but to "
                            f"{', '.join(owners)} {takes}")
        near = difflib.get_close_matches(key, strategy.accepts, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise UserError(f"unknown option {key!r} for strategy {strategy.name}{hint} {takes}")


class GroupBuilder:
    """Collects ops into named groups; later assignments of an op never override earlier ones."""

    def __init__(self) -> None:
        self._groups: dict[str, JsonObject] = {}
        self._owner: dict[int, str] = {}
        self._notes: list[str] = []

    def add(self, gid: str, ops: frozenset[int] | set[int], *, device: Device, region: str, kind: str,
            block: int | None = None, blocks: tuple[int, ...] = ()) -> None:
        ops = {i for i in ops if i not in self._owner}
        if not ops:
            return
        g = self._groups.setdefault(gid, {"device": device, "region": region, "kinds": [], "ops": set(),
                                          "block": block, "blocks": blocks})
        if kind not in g["kinds"]:
            g["kinds"].append(kind)
        g["ops"].update(ops)
        for i in ops:
            self._owner[i] = gid

    def add_host_rest(self, mg: ModelGraph, disc: Discovery | None, *, close: bool = True) -> None:
        """Prologue, glue and epilogue on the host, each glue op its own group (merged later).

        With ``close`` (the built-in strategies), token-wise matmul work in the glue becomes NPU
        stages first (:meth:`add_token_glue`), and unassigned ops that lie between two ops of
        one NPU group -- a no-op ``Cast`` or ``Identity`` on the residual stream inside a
        block, a skip projection -- join that group, and a trailing no-op joins the group
        that produces its input: host work in the middle of an NPU stage would make the
        stages depend on each other in a cycle.  :meth:`build` then makes the stage graph
        acyclic (:func:`~rkpart.grouping.groups.acyclic`), so a strategy never hands on a
        cyclic partition.  With ``close``,
        input index work leaves the NPU groups first (:meth:`hoist_index_work`).
        """
        if close:
            self._mg = mg
            self.hoist_index_work(mg)
            if disc is not None:
                self.add_token_glue(mg, disc)
            self._close_npu_groups(mg)
        if disc is not None:
            self.add("prologue", set(disc.prologue), device="host", region="prologue", kind="prologue")
            for i in sorted(disc.glue):
                self.add(f"glue.{i:06d}", {i}, device="host", region="glue", kind="glue")
            self.add("epilogue", set(disc.epilogue), device="host", region="epilogue", kind="epilogue")
        rest = {i for i in mg.ops.nodes if i not in self._owner}
        for i in sorted(rest):
            self.add(f"host.{i:06d}", {i}, device="host", region="host", kind="host")

    def add_token_glue(self, mg: ModelGraph, disc: Discovery) -> None:
        """Token-wise matmul work in the glue becomes an NPU stage, one per connected piece of glue.

        Glue is what lies between blocks and belongs to none: a concat, a cast, an injected
        add.  Some of it is matrix work over every token: WanVACE's hint projections
        (``vace_blocks.N.proj_out``, added to the stream after block N) read as glue since
        streams go on through an injected add.  Such work is not conditioning; on the host it
        would be a full-width matmul per block on the CPU.  Each connected piece of glue (no-op
        casts do not connect pieces) that holds any (:func:`~rkpart.ir.work.token_macs`) gets an
        NPU group ``glue.<first op>.tokens`` of those ops, or joins the one NPU group that
        computes all they read (``fused``: the VACE block whose output it projects), so it is
        not a stage of one matmul; :meth:`_close_npu_groups` adds what lies between them, and
        the rest of the piece stays on the host.
        """
        free = [i for i in disc.glue if i not in self._owner and not is_noop(mg, i)]
        for piece in sorted(nx.weakly_connected_components(mg.ops.subgraph(free)), key=min):
            tok = set(token_macs(mg, piece))
            if not tok:
                continue
            feeders = {self._owner.get(p) for p in self._producers_through_noops(mg, tok)} - {None}
            gid = feeders.pop() if len(feeders) == 1 else None
            if gid is not None and self._groups[gid]["device"] == "npu" and not (
                    self._producers_through_noops(mg, tok) - self._groups[gid]["ops"]):
                g = self._groups[gid]
                self.add(gid, tok, device="npu", region=g["region"], kind=g["kinds"][0])
            else:
                self.add(f"glue.{min(piece):06d}.tokens", tok, device="npu", region="glue", kind="token-matmul")

    @staticmethod
    def _producers_through_noops(mg: ModelGraph, ops: set[int]) -> set[int]:
        """The ops outside ``ops`` that produce what ``ops`` read, seen through no-op casts."""
        out: set[int] = set()
        stack = [p for i in ops for p in mg.ops.predecessors(i) if p not in ops]
        while stack:
            p = stack.pop()
            if p in out or p in ops:
                continue
            if is_noop(mg, p):
                stack.extend(mg.ops.predecessors(p))
            else:
                out.add(p)
        return out

    def hoist_index_work(self, mg: ModelGraph) -> None:
        """Move input index work (:meth:`ModelGraph.input_index_ops`) out of NPU groups into the prologue.

        A label's embedding ``Gather`` or a mask's ``Cast``/``Reshape`` computes on ``int64`` or
        boolean model inputs; the NPU computes in fp16 and rknn-toolkit2 runs such layers on
        the CPU inside the ``.rknn`` (measured: DiT's class-label ``Gather``, Lumina2's caption
        mask, 2.3.0 and 2.5.0), an NPU -> CPU -> NPU round trip per block.  On the host they
        run once, up front, beside the other conditioning (timestep embedding); only their
        results (a float embedding row, a boolean mask) enter the NPU stages.  The work stays
        in the plan's host stages, so it is reproduced and costed like any host op.  Index
        work depends on nothing but model inputs, so the move cannot make stages depend on
        each other in a cycle.
        """
        index = mg.input_index_ops()
        moved: set[int] = set()
        for gid, g in list(self._groups.items()):
            hit = g["ops"] & index if g["device"] == "npu" else set()
            if not hit:
                continue
            g["ops"] -= hit
            moved |= hit
            for i in hit:
                del self._owner[i]
            if not g["ops"]:
                del self._groups[gid]
        if moved:
            self.add("prologue", moved, device="host", region="prologue", kind="prologue")
            types = sorted({mg.op(i).op_type for i in moved})
            self._notes.append(f"{len(moved)} op(s) computing on integer model inputs ({', '.join(types)}) "
                               "moved from NPU stages to the host prologue")
        self.hand_over_rank4_views(mg)

    def hand_over_rank4_views(self, mg: ModelGraph) -> None:
        """A tensor read through a rank-4 view is handed to the NPU groups that read it as the view
        (:func:`rkpart.grouping.views.hand_over_rank4_views`: the Reshapes back join the NPU groups
        that read them, the first one goes to the host)."""
        hand_over_rank4_views(self, mg)

    # -- what the rank-4 view rule moves (rkpart.grouping.views.ViewGroups) -------------------
    def owner_of(self, op: int) -> str | None:
        return self._owner.get(op)

    def is_npu(self, gid: str) -> bool:
        return bool(self._groups[gid]["device"] == "npu")

    def move(self, op: int, gid: str) -> None:
        """Op ``op`` into group ``gid`` (which holds other ops), out of the group that held it."""
        g = self._groups[gid]
        self._drop(op)
        self.add(gid, {op}, device=g["device"], region=g["region"], kind=g["kinds"][0])

    def move_to_host(self, op: int, *, prologue: bool) -> None:
        """Op ``op`` into the host prologue, or a host group of its own (merged with the host work
        around it when the plan is ordered)."""
        self._drop(op)
        if prologue:
            self.add("prologue", {op}, device="host", region="prologue", kind="prologue")
        else:
            self.add(f"host.{op:06d}", {op}, device="host", region="host", kind="host")

    def _drop(self, i: int) -> None:
        """Take op ``i`` out of the group that holds it (the group goes when it is left empty)."""
        old = self._owner.pop(i, None)
        if old is not None:
            self._groups[old]["ops"].discard(i)
            if not self._groups[old]["ops"]:
                del self._groups[old]

    def _close_npu_groups(self, mg: ModelGraph) -> None:
        for gid, g in list(self._groups.items()):
            if g["device"] != "npu":
                continue
            members: set[int] = g["ops"]
            between = {i for i in convex_hull(mg, members) if i not in self._owner}
            if between:
                self.add(gid, between, device="npu", region=g["region"], kind=g["kinds"][0])
        for i in sorted(mg.ops.nodes):
            if i in self._owner or not is_noop(mg, i):
                continue
            preds = list(mg.ops.predecessors(i))
            if len(preds) == 1 and preds[0] in self._owner:
                gid = self._owner[preds[0]]
                g = self._groups[gid]
                if g["device"] == "npu":
                    self.add(gid, {i}, device="npu", region=g["region"], kind=g["kinds"][0])

    def build(self, strategy: str, options: JsonMap, notes: tuple[str, ...] = (), *,
              mg: ModelGraph | None = None, pinned: tuple[str, ...] = ()) -> Partition:
        """The partition of the groups added so far, made acyclic when the graph is known.

        Groups that feed each other are re-cut or merged (:func:`acyclic`, which notes what it
        did); ``pinned`` groups never change, and a cycle through them is a ``SpecError``.
        """
        mg = mg if mg is not None else getattr(self, "_mg", None)
        groups = tuple(
            Group(id=gid, device=g["device"], ops=frozenset(g["ops"]), region=g["region"],
                  kind="+".join(g["kinds"]), block=g["block"], blocks=tuple(g["blocks"]))
            for gid, g in self._groups.items()
        )
        part = Partition(strategy=strategy, options=dict(options), groups=groups, notes=(*notes, *self._notes))
        return acyclic(mg, part, pinned=pinned) if mg is not None else part


__all__ = ["Group", "GroupBuilder", "Partition", "Strategy", "block_id", "check_strategy_options", "option",
           "propose_with"]
