"""Find the transformer blocks of a DiT graph and, inside each, its residual branches.

The algorithm works on graph structure; exporter names only number the blocks.

1. **Residual adds.**  ``Add(s, b)`` with ``s``, ``b`` and the output of one shape, where
   ``s`` is an ancestor of ``b`` and ``s`` has another consumer: the skip connection of
   ``x = x + f(x)``.  (RoPE's ``q*cos + rot(q)*sin`` and AdaLN's ``+ shift`` are not: neither
   operand is an ancestor of the other.)  Ancestry is the tensor's, not its producer's: one
   ``Split`` that makes AdaLN's shift and scale is an ancestor of ``norm(x) * (1 + scale)``,
   the shift tensor is not.
2. **Streams.**  Residual adds link when one's output reaches the next one's skip through
   data-movement ops only (reshapes, and the concat / slice with which Flux single blocks
   join and split the image and text streams).  Runs of one-to-one links are the residual
   streams: one for a DiT, two (image and text) for dual-stream blocks, and another one
   after they merge.  Streams running side by side form a *phase*; a text stream is one
   computed without the model's first (latent) input.
3. **Branches.**  A branch is everything stream-dependent that feeds ``b`` without going
   back through a stream tensor.  Branches that share ops (joint attention of two streams)
   form one region.
4. **Side ops** (not stream-dependent: timestep embedding, modulation, RoPE tables,
   context projections) belong to the one branch or block they feed, or else are shared
   (prologue).  This is why a computation that TorchScript names after block 0 but every
   block reads still ends up shared.  Whatever a stream start is computed from (patch
   embedding, context embedder) is prologue too.
5. **Blocks.**  Regions are grouped into blocks by the exporter's module scopes
   (``/transformer_blocks.3/...`` or dynamo ``name_scopes`` / ``namespace`` metadata) when
   those number the regions consistently, else by structure: in each stream system (the
   streams of a phase that share residual units), a block closes after its MLP unit (an
   FFN, or attention with an MLP beside it), a piece ending with another piece's layout
   starts with a block of its own, and MLP-less units are cut at the period of their names
   (:func:`_segment`).
6. **Inside a branch.**  ``pre`` (normalisation + modulation, i.e. AdaLN) is what lies
   between the skip tensor and the first weighted ops; ``gate`` is a trailing ``Mul`` by a
   side value; ``core`` is the rest.  A core with a MatMul of two activations is attention
   -- Softmax is neither necessary (linear attention) nor sufficient (a softmax gate):
   cross-attention when an operand comes from outside the streams, joint when the core
   reads another stream, parallel (``attn_mlp``) when a weighted op runs beside the
   attention from the same norm (Flux single blocks).  A core with two or more weighted
   ops and no such MatMul is an FFN.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain, pairwise, permutations

import networkx as nx

from rkpart.errors import DiscoveryError
from rkpart.ir import ModelGraph
from rkpart.ir.ops import ATTENTION_OPS, LINK_OPS, NORM_OPS, PASS_THROUGH_OPS, WEIGHTED_OPS
from rkpart.ir.reach import Reach, bits, unbits


@dataclass(frozen=True)
class Branch:
    """One residual branch ``x -> x + f(x)``; op sets are indices into ``ModelGraph.nodes``."""

    add: int
    skip: str
    stream: int  # index of the stream (chain) the add belongs to
    pre: frozenset[int]  # normalisation + modulation (AdaLN) ops
    core: frozenset[int]
    gate: frozenset[int]
    core_in: tuple[str, ...]  # stream-side inputs of the core (after AdaLN)
    #: tensors of other streams the branch reads through an AdaLN of theirs, in its pre (a stream that
    #: has no branch in the region: :func:`_ending_streams_pre`)
    reads: tuple[str, ...] = ()

    @property
    def ops(self) -> frozenset[int]:
        return self.pre | self.core | self.gate


@dataclass(frozen=True)
class Region:
    """A branch, or several branches sharing their core (joint attention)."""

    name: str  # attn, xattn, jattn, ffn, ffn_txt, ...
    kind: str  # self_attention, cross_attention, joint_attention, ffn, other
    branches: tuple[Branch, ...]
    adaln: str  # "adaln" (norm + modulation), "norm" (plain), "none"
    side: frozenset[int] = frozenset()  # side ops private to this region's core
    mod: frozenset[int] = frozenset()  # side ops private to this region's pre/gate (modulation)

    @property
    def pre(self) -> frozenset[int]:
        return frozenset().union(*(b.pre for b in self.branches))

    @property
    def core(self) -> frozenset[int]:
        # joint attention: one stream's branch holds the other stream's AdaLN in its "core"
        cores = frozenset().union(*(b.core for b in self.branches)) | self.side
        return cores - self.pre - self.gate

    @property
    def gate(self) -> frozenset[int]:
        return frozenset().union(*(b.gate for b in self.branches))

    @property
    def adds(self) -> frozenset[int]:
        return frozenset(b.add for b in self.branches)

    @property
    def ops(self) -> frozenset[int]:
        return self.pre | self.core | self.gate | self.adds | self.mod


@dataclass(frozen=True)
class Block:
    index: int
    regions: tuple[Region, ...]
    mod: frozenset[int]  # side ops shared by several regions of this block (e.g. AdaLN-Zero linear)
    scope: str = ""  # e.g. "transformer_blocks.3" when names gave it

    @property
    def ops(self) -> frozenset[int]:
        return frozenset().union(*(r.ops for r in self.regions)) | self.mod

    @property
    def signature(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)


@dataclass(frozen=True)
class Discovery:
    blocks: tuple[Block, ...]
    prologue: frozenset[int]  # shared side ops and everything before the streams
    glue: frozenset[int]  # stream-dependent ops between blocks that belong to none (concat, ...)
    epilogue: frozenset[int]
    streams: int
    method: str  # "names" or "structure"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> list[dict[str, object]]:
        return [
            {
                "index": b.index,
                "scope": b.scope,
                "regions": [
                    {"name": r.name, "kind": r.kind, "adaln": r.adaln, "gated": bool(r.gate)}
                    for r in b.regions
                ],
            }
            for b in self.blocks
        ]

    def describe_regions(self) -> str:
        """Each block's own regions in one phrase: ``attn, ffn per block`` when all blocks have the
        same, else per run of blocks with the same (``blocks 0-1: attn, ffn; blocks 2-3: attn_txt,
        ffn_txt; ...``), never one block's regions said of all."""
        runs: list[tuple[int, int, str]] = []  # (first block, last block, regions)
        for b in self.blocks:
            names = ", ".join(r.name for r in b.regions) or "no regions"
            if runs and runs[-1][2] == names and runs[-1][1] + 1 == b.index:
                runs[-1] = (runs[-1][0], b.index, names)
            else:
                runs.append((b.index, b.index, names))
        if len({r[2] for r in runs}) == 1:
            return f"{runs[0][2]} per block"
        return "; ".join(f"block {a}: {names}" if a == z else f"blocks {a}-{z}: {names}" for a, z, names in runs)


# ---------------------------------------------------------------------------------------------


def discover(mg: ModelGraph, *, min_blocks: int = 1) -> Discovery:
    """Find blocks and regions in ``mg``: steps 1-6 of the module docstring, in order.

    Parameters
    ----------
    mg:
        A loaded model (:func:`rkpart.ir.load_model`).
    min_blocks:
        Fewer blocks than this is an error.

    Returns
    -------
    Discovery
        Blocks (each with its regions' op sets), prologue, glue and epilogue op sets.

    Raises
    ------
    DiscoveryError
        No chain of residual adds, or fewer than ``min_blocks`` blocks.
    """
    reach = Reach(mg)
    adds = _residual_adds(mg, reach)  # 1
    st = _streams(mg, reach, adds)  # 2
    dep = _stream_dependent(mg, reach, st)
    before = _stream_ancestry(mg, reach, st, dep)
    branches = [_branch(mg, reach, a, st.skip_of[a], st.stream_of[a], dep, st.stream_producers,  # 3
                        st.entry_of.get(a))
                for a in sorted(st.stream_of)]
    regions_ops = _ending_streams_pre(mg, reach, _merge_overlapping(branches), st.stream_tensors, dep)
    side = [i for i in reach.order if not dep >> i & 1 and not before >> i & 1]  # 4
    feeds = _side_feeds(mg, side, regions_ops)
    region_list = _name_regions(mg, regions_ops, dep, st.stream_tensors, st.txt, st.phases, reach)  # 5
    grouping, method, scopes = _group_blocks(mg, region_list, st.phases)
    blocks, prologue = _assemble_blocks(side, feeds, region_list, grouping, scopes, set(unbits(before)))
    if len(blocks) < min_blocks:
        raise DiscoveryError(f"{mg.path.name}: found {len(blocks)} blocks, expected at least {min_blocks}")
    glue, epilogue = _leftovers(mg, reach, blocks, prologue, dep)
    blocks, glue = _adopt_skip_projections(mg, blocks, glue)
    notes = []
    if method == "structure":
        notes.append("blocks numbered by structure (exporter names carry no block scopes)")
    return Discovery(
        blocks=tuple(blocks),
        prologue=frozenset(prologue),
        glue=frozenset(glue),
        epilogue=frozenset(epilogue),
        streams=len(st.chains),
        method=method,
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class _Streams:
    """The residual streams (step 2): chains of residual adds and the tensors they carry."""

    chains: list[list[int]]
    stream_of: dict[int, int]  # residual add -> its chain
    skip_of: dict[int, str]  # residual add -> its skip tensor
    stream_tensors: dict[str, int]  # every chain's skip inputs and outputs -> its chain
    stream_producers: set[int]
    txt: set[int]  # text streams
    phases: list[int]  # phase of each chain
    #: residual add -> the stream tensor its branch starts from when that is not its skip
    #: (the previous add's output, for post-norm residuals that share one skip)
    entry_of: dict[int, str] = field(default_factory=dict)


def _streams(mg: ModelGraph, reach: Reach, adds: dict[int, str]) -> _Streams:
    all_chains, links = _chains(mg, reach, adds)
    linked = {a for a, bs in links.items() if bs} | {b for bs in links.values() for b in bs}
    # a lone residual-looking add is noise unless it is part of a stream system (a Flux
    # single block is one add between a concat and a slice)
    chains = [c for c in all_chains if len(c) >= 2 or (any(a in linked for a in c) and len(all_chains) > 1)]
    chains = _without_long_skips(mg, reach, adds, chains)
    if any(_attends(mg, reach, c, adds) for c in chains):
        # a residual MLP stack that is no part of the streams (Chroma's distilled guidance
        # approximator) computes conditioning, not tokens: prologue, not blocks
        def joined(c: list[int]) -> bool:  # linked to another chain
            own = set(c)
            return any((a in own) != (b in own) for a, bs in links.items() for b in bs)

        chains = [c for c in chains if joined(c) or _attends(mg, reach, c, adds)]
    if not chains:
        raise DiscoveryError(
            f"{mg.path.name}: no transformer blocks found (no chain of residual adds x + f(x)); "
            "use --strategy generic (no DiT knowledge) or --strategy custom with a spec that names the cut tensors"
        )
    stream_of = {a: si for si, c in enumerate(chains) for a in c}
    skip_of = {a: adds[a] for a in stream_of}
    entry_of: dict[int, str] = {}
    for c in chains:
        for a, b in pairwise(c):
            if skip_of[a] == adds[b]:  # post-norm: b's branch starts from a's output
                entry_of[b] = mg.op(a).outputs[0]
            elif adds[b] == mg.op(a).outputs[0] and not reach.is_ancestor(a, _other_operand(mg, b, adds[b])):
                # parallel: b's branch reads what a's did (SD3.5's attn2 beside the joint attention)
                entry_of[b] = entry_of.get(a, skip_of[a])
    stream_tensors: dict[str, int] = {}
    for a in stream_of:
        stream_tensors[skip_of[a]] = stream_of[a]
        stream_tensors[mg.op(a).outputs[0]] = stream_of[a]
    return _Streams(
        chains=chains, stream_of=stream_of, skip_of=skip_of, stream_tensors=stream_tensors,
        stream_producers={mg.producer[t] for t in stream_tensors if t in mg.producer},
        txt=_text_streams(mg, reach, chains, skip_of), phases=_phases(chains, reach), entry_of=entry_of,
    )


def _without_long_skips(mg: ModelGraph, reach: Reach, adds: dict[int, str],
                        chains: list[list[int]]) -> list[list[int]]:
    """``chains`` without those made only of long skips: adds ``x + g(x)`` whose ``g`` holds a whole
    other chain that starts from ``x``.

    A model nested in a model (DualTransformer2D: each ``Transformer2DModel`` is
    ``proj_out(blocks(proj_in(norm(x)))) + x``, and the two outputs mixed are added to ``x``
    again) chains its outer adds into a "stream" of their own, whose units would be the
    models' input and output projections.  They are glue around the blocks, not blocks.
    """
    def encloses(a: int, c: list[int]) -> bool:
        skip = _noop_root(mg, adds[a])
        po = mg.producer.get(_other_operand_tensor(mg, a, adds[a]))
        return po is not None and all(b == po or reach.is_ancestor(b, po) for b in c) and \
            _tensor_feeds(mg, reach, skip, c[0], a)

    def long_skip(a: int, own: list[int]) -> bool:
        return any(c is not own and encloses(a, c) for c in chains)

    kept = [c for c in chains if not all(long_skip(a, c) for a in c)]
    return kept or chains


def _other_operand_tensor(mg: ModelGraph, add: int, skip: str) -> str:
    n = mg.op(add)
    return n.inputs[1] if n.inputs[0] == skip else n.inputs[0]


def _adopt_skip_projections(mg: ModelGraph, blocks: list[Block], glue: set[int]) -> tuple[list[Block], set[int]]:
    """Weighted glue between blocks is a long-skip projection: the block that reads it owns it.

    A U-Net-style long skip (HunyuanDiT's later blocks ``skip_linear(skip_norm(cat(skip,
    x)))``) is computed between one block's last residual and the next one's first: glue by
    structure, but matrix work that belongs on the NPU with the block consuming it.  Such a
    piece becomes the block's first region, ``skip`` (kind ``long_skip``).
    """
    # no-op casts on the stream join unrelated pieces (TorchScript casts a block's input once
    # and the long skip reads that cast): they stay glue, the NPU stage absorbs those it needs
    pieces = nx.weakly_connected_components(mg.ops.subgraph(i for i in glue if not is_noop(mg, i)))
    block_of = {i: bi for bi, b in enumerate(blocks) for i in b.ops}
    adopt: dict[int, set[int]] = {}
    for piece in pieces:
        if not any(mg.op(i).op_type in WEIGHTED_OPS for i in piece):
            continue
        readers: set[int] = set()
        stack = [c for i in piece for c in mg.ops.successors(i) if c not in piece]
        while stack:
            c = stack.pop()
            if c in block_of:
                readers.add(block_of[c])
            elif c in glue and is_noop(mg, c):
                stack.extend(mg.ops.successors(c))
        if readers:
            own = set(piece)
            # glue computed only for this piece (its norm, the concat it reads) goes with it
            for i in sorted(glue - own, reverse=True):
                succ = list(mg.ops.successors(i))
                if succ and all(c in own for c in succ) and i not in mg.outputs:
                    own.add(i)
            adopt.setdefault(min(readers), set()).update(own)
    if not adopt:
        return blocks, glue
    out = []
    for bi, b in enumerate(blocks):
        if bi in adopt:
            skip = Region(name="skip", kind="long_skip", branches=(), adaln="none", side=frozenset(adopt[bi]))
            b = Block(index=b.index, regions=(skip, *b.regions), mod=b.mod, scope=b.scope)
        out.append(b)
    return out, glue - set().union(*adopt.values())


def _other_operand(mg: ModelGraph, add: int, skip: str) -> int:
    """The producer of ``add``'s non-skip operand."""
    return mg.producer[_other_operand_tensor(mg, add, skip)]


def _attends(mg: ModelGraph, reach: Reach, chain: list[int], adds: dict[int, str]) -> bool:
    """Whether any branch of ``chain`` holds attention (a MatMul of two activations or an attention op)."""
    p = mg.producer.get(_noop_root(mg, adds[chain[0]]))
    before = 0 if p is None else reach.anc[p] | (1 << p)
    ops = 0
    for a in chain:
        ops |= reach.anc[a]
    for i in unbits(ops & ~before):
        t = mg.op(i).op_type
        if t in ATTENTION_OPS or (t in ("MatMul", "Einsum") and len(mg.dyn_inputs(i)) >= 2):
            return True
    return False


def _stream_dependent(mg: ModelGraph, reach: Reach, st: _Streams) -> int:
    """Bitset of stream-dependent ops: the stream starts' readers and their descendants."""
    readers = [c for t in (_noop_root(mg, st.skip_of[c[0]]) for c in st.chains) for c in mg.consumers.get(t, [])
               if c not in mg.const_ops]
    # a stream that starts at learned queries: its first unit depends on them from its score product on
    for ch in st.chains:
        a = ch[0]
        if mg.is_const_tensor(st.skip_of[a]):
            readers += _learned_query_scores(mg, reach, a, _other_operand_tensor(mg, a, st.skip_of[a]))
    return bits(chain.from_iterable(nx.bfs_layers(mg.ops, readers)))


def _stream_ancestry(mg: ModelGraph, reach: Reach, st: _Streams, dep: int) -> int:
    """Bitset of what the stream starts are computed from (patch embedding, context embedder).

    That is prologue, even when only the first branch reads it.
    """
    before = 0
    for t in (_noop_root(mg, st.skip_of[c[0]]) for c in st.chains):
        p = mg.producer.get(t)
        # a stream that starts from other streams (a concat of image and text) is computed
        # by the blocks before it, not by the prologue
        if p is not None and p not in mg.const_ops and not dep >> p & 1:
            before |= reach.anc[p] | (1 << p)
    return before & ~dep


def _side_feeds(
    mg: ModelGraph, side: list[int], regions_ops: list[tuple[tuple[Branch, ...], frozenset[int]]]
) -> dict[int, set[tuple[int, str]]]:
    """Which (region, part) each side op feeds, by reverse topological propagation.

    ``(-1, "out")``: a model output; ``(-1, "x")``: glue, epilogue or anything not in a region.
    """
    unit_of_op: dict[int, int] = {}
    part_of_op: dict[int, str] = {}
    # In joint attention one stream's branch holds the other stream's AdaLN in its "core":
    # what a branch calls pre / gate / add wins over what another branch calls core.
    rank = {"core": 0, "pre": 1, "gate": 2, "add": 3}
    for ri, (brs, _ops) in enumerate(regions_ops):
        for b in brs:
            for part, ops in (("core", b.core), ("pre", b.pre), ("gate", b.gate), ("add", {b.add})):
                for i in ops:
                    if i not in part_of_op or rank[part] > rank[part_of_op[i]]:
                        unit_of_op[i], part_of_op[i] = ri, part
    feeds: dict[int, set[tuple[int, str]]] = {}
    side_set = set(side)
    model_outputs = set(mg.outputs)
    for i in reversed(side):
        f: set[tuple[int, str]] = set()
        for t in mg.op(i).outputs:
            if t in model_outputs:
                f.add((-1, "out"))
            for c in mg.consumers.get(t, []):
                if c in mg.const_ops:
                    continue
                if c in side_set:
                    f |= feeds.get(c, set())
                elif c in unit_of_op:
                    f.add((unit_of_op[c], part_of_op[c]))
                else:
                    f.add((-1, "x"))  # glue, epilogue, outputs
        feeds[i] = f
    return feeds


def _assemble_blocks(
    side: list[int],
    feeds: dict[int, set[tuple[int, str]]],
    region_list: list[_RegionInfo],
    grouping: list[list[int]],
    scopes: list[str],
    prologue: set[int],
) -> tuple[list[Block], set[int]]:
    """Blocks from the grouped regions, each side op given to the one region or block it feeds.

    A side op feeding one region's core is that region's ``side``; its pre / gate, the
    region's ``mod``; several regions of one block, the block's ``mod``; anything else, the
    prologue (returned, extended).
    """
    region_block = {ri: bi for bi, members in enumerate(grouping) for ri in members}
    region_side: dict[int, set[int]] = {ri: set() for ri in range(len(region_list))}
    region_mod: dict[int, set[int]] = {ri: set() for ri in range(len(region_list))}
    block_mod: dict[int, set[int]] = {bi: set() for bi in range(len(grouping))}
    for i in side:
        f = feeds[i]
        units = {u for u, _ in f}
        if not f or -1 in units:
            prologue.add(i)
            continue
        blocks_fed = {region_block[u] for u in units}
        if len(units) == 1:
            (u,) = units
            parts = {p for _, p in f}
            if parts == {"core"}:
                region_side[u].add(i)
            else:
                region_mod[u].add(i)
        elif len(blocks_fed) == 1:
            block_mod[blocks_fed.pop()].add(i)
        else:
            prologue.add(i)
    blocks: list[Block] = []
    for bi, members in enumerate(grouping):
        regs = []
        for ri in members:
            r = region_list[ri]
            regs.append(Region(
                name=r.name, kind=r.kind, branches=r.branches, adaln=r.adaln,
                side=frozenset(region_side[ri]), mod=frozenset(region_mod[ri]),
            ))
        blocks.append(Block(index=bi, regions=tuple(_unique_names(regs)), mod=frozenset(block_mod[bi]),
                            scope=scopes[bi]))
    return blocks, prologue


def _leftovers(
    mg: ModelGraph, reach: Reach, blocks: list[Block], prologue: set[int], dep: int
) -> tuple[set[int], set[int]]:
    """Ops in no block, after step 5: stream-dependent ones with a block after them are glue,
    the others epilogue; the rest joins the prologue (extended in place)."""
    in_blocks = frozenset().union(*(b.ops for b in blocks))
    glue: set[int] = set()
    epilogue: set[int] = set()
    # ops with a block op downstream: the blocks' ancestors, one traversal of the reversed graph
    feeds_block = set(chain.from_iterable(nx.bfs_layers(mg.ops.reverse(copy=False), sorted(in_blocks))))
    for i in reach.order:
        if i in in_blocks or i in prologue:
            continue
        if dep >> i & 1:
            if i in feeds_block:
                glue.add(i)
            else:
                epilogue.add(i)
        else:
            prologue.add(i)
    return glue, epilogue


def _text_streams(mg: ModelGraph, reach: Reach, chains: list[list[int]], skip_of: dict[int, str]) -> set[int]:
    """Chains computed without the first model input that any chain uses: the text streams.

    diffusers puts the latent first; a dual-stream model's text stream starts from the
    context embedder alone, while the image stream (and a merged stream after it) depends
    on the latent.  Input names survive anonymisation, so this does too.
    """
    uses: list[set[int]] = []
    for c in chains:
        start = skip_of[c[0]]
        p = mg.producer.get(start)
        got = set()
        for k, name in enumerate(mg.inputs):
            if name == start or (p is not None and any(
                    u == p or reach.is_ancestor(u, p) for u in mg.consumers.get(name, [])
                    if u not in mg.const_ops)):
                got.add(k)
        uses.append(got)
    if len(chains) < 2:
        return set()
    primary = min((min(u) for u in uses if u), default=None)
    return {si for si, u in enumerate(uses) if primary is not None and primary not in u}


def _phases(chains: list[list[int]], reach: Reach) -> list[int]:
    """Phase of each chain: chains running side by side (image + text) share one; a stream
    that starts from where others end (Flux single blocks) is the next phase.

    Chain ``b`` comes after chain ``a`` when ``b``'s first add depends on ``a``'s last one
    (not on op order: TorchScript may emit a whole image-stream block before its text side).
    """
    order = sorted(range(len(chains)), key=lambda si: chains[si][0])
    phase = [0] * len(chains)
    for k, sb in enumerate(order):
        first = chains[sb][0]
        phase[sb] = max((phase[sa] + 1 for sa in order[:k] if reach.is_ancestor(chains[sa][-1], first)),
                        default=0)
    return phase


def _residual_adds(mg: ModelGraph, reach: Reach) -> dict[int, str]:
    """Residual ``Add`` ops -> their skip tensor."""
    out: dict[int, str] = {}
    for i in reach.order:
        n = mg.op(i)
        if n.op_type != "Add" or len(n.inputs) != 2:
            continue
        a, b = n.inputs
        if mg.is_const_tensor(a) != mg.is_const_tensor(b):
            # a stream that starts at learned queries (a Perceiver's latents, folded to a constant
            # with their norm): ``q + xattn(norm(q), text)`` is its first residual unit
            skip, other = (a, b) if mg.is_const_tensor(a) else (b, a)
            if mg.shape(skip) == mg.shape(other) == mg.shape(n.outputs[0]) is not None \
                    and len(_real_consumers(mg, n.outputs[0])) >= 2 and _learned_query_scores(mg, reach, i, other):
                out[i] = skip
            continue
        if mg.is_const_tensor(a):
            continue
        sa, sb, so = mg.shape(a), mg.shape(b), mg.shape(n.outputs[0])
        if sa is None or sa != sb or sa != so:
            continue
        for skip, other in ((a, b), (b, a)):
            pb = mg.producer.get(other)
            if pb is None:
                continue
            # the stream may reach the add through no-op casts (TorchScript's float32 -> float32
            # ``.to()``): the skip is the tensor they relabel, the fork is after them
            root = _noop_root(mg, skip)
            ps = mg.producer.get(root)
            readers = _real_consumers(mg, root)
            if ps is None:
                ok = root in mg.inputs and _tensor_feeds(mg, reach, root, pb, i)
            else:
                # the skip *tensor* must feed the branch, not just the op making it: one Split
                # makes AdaLN's shift and scale, and ``norm(x) * (1 + scale) + shift`` is no
                # residual (dynamo's one Split of a modulation that several blocks read)
                ok = ps not in mg.const_ops and _tensor_feeds(mg, reach, root, pb, i)
            if ok and len(readers) >= 2:
                out[i] = skip
                break
        else:
            # a parallel branch added after another one: ``(x + f(x)) + g(x)`` (SD3.5's dual
            # attention ``attn2``): the skip is the first residual's output, g reads its skip
            for skip, other in ((a, b), (b, a)):
                pa, pb = mg.producer.get(skip), mg.producer.get(other)
                if pa is None or pb is None or pa not in out or reach.is_ancestor(pa, pb):
                    continue
                x_t = _noop_root(mg, out[pa])
                x = mg.producer.get(x_t)
                if x is not None and x not in mg.const_ops and _tensor_feeds(mg, reach, x_t, pb, pa):
                    out[i] = skip
                    break
    return out


def _learned_query_scores(mg: ModelGraph, reach: Reach, add: int, other: str, limit: int = 256) -> list[int]:
    """The score MatMuls of an attention from learned queries that feeds only ``add``'s ``other``
    operand: one operand constant and laid out in heads (rank 3 or more; a weight is 2-D), a
    ``Softmax`` reading the product, and everything the product reaches on its way an ancestor of
    ``add``.  A constant added to a projection (a position embedding) has no such product."""
    p = mg.producer.get(other)
    if p is None or p in mg.const_ops:
        return []
    out = []
    for i in sorted(unbits(reach.anc[p] | 1 << p)):
        n = mg.op(i)
        if n.op_type not in ("MatMul", "Einsum") or len(n.inputs) != 2:
            continue
        consts = [t for t in n.inputs if mg.is_const_tensor(t)]
        shape = mg.shape(consts[0]) if len(consts) == 1 else None
        if shape is None or len(shape) < 3:
            continue
        if not _softmax_reads(mg, n.outputs[0]):
            continue
        seen, todo, inside = {i}, [i], True
        while todo and inside and len(seen) < limit:
            for t in mg.op(todo.pop()).outputs:
                for c in mg.consumers.get(t, []):
                    if c in seen or c == add or c in mg.const_ops:
                        continue
                    if not reach.is_ancestor(c, add):
                        inside = False
                    seen.add(c)
                    todo.append(c)
        if inside and not todo:
            out.append(i)
    return out


def _softmax_reads(mg: ModelGraph, t: str, depth: int = 3) -> bool:
    """Whether a ``Softmax`` reads ``t``, directly or through up to ``depth`` scaling, masking and
    reshaping ops (``softmax(q k^T * scale + mask)``)."""
    for c in _real_consumers(mg, t):
        op = mg.op(c).op_type
        if op == "Softmax":
            return True
        if depth and (op in ("Mul", "Div", "Add", "Sub", "Where") or op in PASS_THROUGH_OPS) \
                and any(_softmax_reads(mg, o, depth - 1) for o in mg.op(c).outputs if o):
            return True
    return False


def _tensor_feeds(mg: ModelGraph, reach: Reach, t: str, op: int, not_via: int) -> bool:
    """Whether tensor ``t`` is an input of ``op`` or of one of its ancestors, other than ``not_via``.

    Asked of the tensor, not of its producer: an op with several outputs (``Split``) is an
    ancestor of everything any one of its outputs feeds.
    """
    return any(c == op or reach.is_ancestor(c, op) for c in mg.consumers.get(t, [])
               if c != not_via and c not in mg.const_ops)


def is_noop(mg: ModelGraph, i: int) -> bool:
    """``Identity``, or a ``Cast`` to the dtype its input already has (float32 -> float32)."""
    n = mg.op(i)
    if n.op_type == "Identity":
        return True
    if n.op_type != "Cast" or not n.inputs:
        return False
    return mg.dtype(n.inputs[0]) is not None and mg.dtype(n.inputs[0]) == mg.dtype(n.outputs[0])


def _noop_root(mg: ModelGraph, t: str) -> str:
    """``t`` with the no-op ops that produce it walked back."""
    for _ in range(64):
        p = mg.producer.get(t)
        if p is None or p in mg.const_ops or not is_noop(mg, p):
            return t
        t = mg.op(p).inputs[0]
    return t


def _real_consumers(mg: ModelGraph, t: str) -> list[int]:
    """Non-constant consumers of ``t``, looking through no-op ops to what reads their outputs."""
    out: list[int] = []
    stack = [t]
    seen: set[str] = set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        for c in mg.consumers.get(x, []):
            if c in mg.const_ops:
                continue
            if is_noop(mg, c):
                stack.extend(o for o in mg.op(c).outputs if o)
            elif c not in out:
                out.append(c)
    return out


def _links(mg: ModelGraph, reach: Reach, adds: dict[int, str]) -> dict[int, set[int]]:
    """``a -> {b}`` when add ``a``'s output reaches add ``b``'s skip through data-movement ops only."""
    by_skip: dict[str, int] = {}
    for a, s in adds.items():
        by_skip.setdefault(s, a)
    succ: dict[int, set[int]] = {a: set() for a in adds}
    # post-norm residuals (AuraFlow): ``x + ffn(norm(x + attn(x)))`` -- both adds skip from
    # ``x``; the first add's output feeds the second one's branch: the stream goes on from it.
    # Not through other residual adds: a long skip over all the blocks (LongCat-Audio:
    # ``blocks(x) + x``) shares block 0's skip, and its branch is every block
    same_skip: dict[str, list[int]] = {}
    for a in sorted(adds):
        same_skip.setdefault(adds[a], []).append(a)
    for group in same_skip.values():
        for a, b in pairwise(group):
            n = mg.op(b)
            other = n.inputs[1] if n.inputs[0] == adds[b] else n.inputs[0]
            po = mg.producer.get(other)
            if po is not None and (po == a or reach.is_ancestor(a, po)) and not any(
                    c not in (a, b) and reach.is_ancestor(a, c) and (c == po or reach.is_ancestor(c, po))
                    for c in adds):
                succ[a].add(b)
    for a in adds:
        if succ[a]:
            continue
        frontier = [mg.op(a).outputs[0]]
        seen: set[str] = set()
        while frontier and len(seen) < 16:
            t = frontier.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in by_skip and by_skip[t] != a:
                succ[a].add(by_skip[t])
                continue  # the stream goes on from b; what follows is b's business
            for c in mg.consumers.get(t, []):
                if c not in mg.const_ops and (mg.op(c).op_type in LINK_OPS or _injects(mg, reach, c, t, a, adds)):
                    frontier.extend(o for o in mg.op(c).outputs if o)
    return succ


def _injects(mg: ModelGraph, reach: Reach, c: int, t: str, a: int, adds: dict[int, str]) -> bool:
    """Whether ``c`` adds to or scales the stream tensor ``t`` by something the stream did not make
    (Sana-WM's ``x + plucker_proj(plucker_emb)`` between the attention and the cross-attention, a
    padding mask re-applied after an add): the stream goes on through it, same shape."""
    n = mg.op(c)
    if n.op_type not in ("Add", "Mul") or c in adds or len(n.inputs) != 2 or n.inputs[0] == n.inputs[1]:
        return False
    other = n.inputs[1] if n.inputs[0] == t else n.inputs[0]
    if mg.shape(n.outputs[0]) != mg.shape(t):
        return False
    p = mg.producer.get(other)
    return p is None or p in mg.const_ops or not (p == a or reach.is_ancestor(a, p))


def _chains(mg: ModelGraph, reach: Reach, adds: dict[int, str]) -> tuple[list[list[int]], dict[int, set[int]]]:
    """Residual streams: maximal runs of adds linked one-to-one.

    Where streams merge or fork (two streams concatenated into one), a chain ends; the
    links between chains are returned too, so that a short chain that is part of a larger
    stream system (one Flux single block) is not mistaken for noise.
    """
    succ = _links(mg, reach, adds)
    pred: dict[int, set[int]] = {a: set() for a in adds}
    for a, bs in succ.items():
        for b in bs:
            pred[b].add(a)
    # a stream split into token ranges, one range updated, the ranges joined again (Helios: the
    # cross-attention reads the current chunk only, the history tokens go around it): a -> {b, c},
    # b -> c, nothing else reaching b or c.  The stream runs a -> b -> c, one chain, not three.
    for a in sorted(adds):
        if len(succ[a]) != 2:
            continue
        for b, c in permutations(sorted(succ[a])):
            if succ[b] == {c} and pred[b] == {a} and pred[c] == {a, b}:
                succ[a].discard(c)
                pred[c].discard(a)
                break

    def one_to_one(a: int) -> int | None:
        if len(succ[a]) == 1:
            (nxt,) = succ[a]
            if len(pred[nxt]) == 1:
                return nxt
        return None

    has_prev = {n for a in adds if (n := one_to_one(a)) is not None}
    chains = []
    for a in sorted(adds):
        if a in has_prev:
            continue
        chain = [a]
        while (n := one_to_one(chain[-1])) is not None and n not in chain:
            chain.append(n)
        chains.append(chain)
    chains.sort(key=lambda c: c[0])
    return chains, succ


def _branch(
    mg: ModelGraph, reach: Reach, add: int, skip: str, stream: int, dep: int, stream_producers: set[int],
    entry_tensor: str | None = None,
) -> Branch:
    n = mg.op(add)
    b = n.inputs[1] if n.inputs[0] == skip else n.inputs[0]
    pb = mg.producer[b]
    # ops in the branch: stream-dependent ancestors of b (and b's producer), stopping at stream
    # tensors (their producers and everything above them belong to earlier branches), and at what
    # an earlier residual add of the chain computed: a unit that reads a tensor inside the unit
    # before it (Motif-Video's text cross-attention queries the joint attention's output) does
    # not take that unit in
    stop = 0
    for sp in stream_producers:
        if sp == add:
            continue
        if reach.is_ancestor(sp, add) or sp == pb:
            stop |= reach.anc[sp] | (1 << sp)
    ops_bits = (reach.anc[pb] | (1 << pb)) & dep & ~stop
    ops = unbits(ops_bits)

    # gate: trailing Mul by a non-stream-dependent value, through reshape-like ops
    gate: set[int] = set()
    cur = pb
    while True:
        node = mg.op(cur)
        if node.op_type in PASS_THROUGH_OPS:
            dyn = mg.dyn_inputs(cur)
            if len(dyn) == 1 and dyn[0] in mg.producer and mg.producer[dyn[0]] in ops:
                gate.add(cur)
                cur = mg.producer[dyn[0]]
                continue
            break
        if node.op_type == "Mul":
            dyn = mg.dyn_inputs(cur)
            side_in = [t for t in dyn if t in mg.producer and not dep >> mg.producer[t] & 1]
            stream_in = [t for t in dyn if t in mg.producer and dep >> mg.producer[t] & 1]
            if len(side_in) == 1 and len(stream_in) == 1:
                gate.add(cur)
        break
    if not any(mg.op(g).op_type == "Mul" for g in gate):
        gate = set()

    rest = ops - gate
    # pre: common stream-dependent ancestors of the first weighted ops
    weighted = [i for i in rest if mg.op(i).op_type in WEIGHTED_OPS or mg.op(i).op_type in ATTENTION_OPS]
    # only this branch's own stream: in joint attention the other stream's projections are
    # weighted ops of this branch too, but its AdaLN is not ours
    entry = [c for c in mg.consumers.get(entry_tensor or _noop_root(mg, skip), []) if c in ops]
    entry += [c for c in _real_consumers(mg, entry_tensor or _noop_root(mg, skip)) if c in ops and c not in entry]
    weighted = [i for i in weighted if any(e == i or reach.is_ancestor(e, i) for e in entry)]
    first = [i for i in weighted if not any(reach.is_ancestor(w, i) for w in weighted if w != i)]
    pre: set[int] = set()
    core_in: tuple[str, ...] = (entry_tensor or skip,)
    if first:
        common = -1
        for f in first:
            common &= reach.anc[f]
        pre_bits = common & ops_bits & ~bits(gate)
        pre = set(unbits(pre_bits))
        # the pre part must be entered from the skip tensor only, and leave through one tensor
        outs = sorted({
            t for i in pre for t in mg.op(i).outputs
            if any(c in rest and c not in pre for c in mg.consumers.get(t, []))
        })
        if pre and len(outs) == 1:
            core_in = (outs[0],)
        else:
            pre = set()
    core = frozenset(rest - pre)
    return Branch(add=add, skip=skip, stream=stream, pre=frozenset(pre), core=core,
                  gate=frozenset(gate), core_in=core_in)


def _merge_overlapping(branches: list[Branch]) -> list[tuple[tuple[Branch, ...], frozenset[int]]]:
    """Regions: branches whose cores or gates share ops (joint attention) form one.

    Branches that share only their normalisation (SD3.5's dual attention: ``attn`` and
    ``attn2`` modulate one LayerNorm of the block input differently) stay apart; the shared
    norm is the first one's ``pre``.
    """
    groups: list[tuple[list[Branch], set[int]]] = []
    claimed: set[int] = set()
    for b in sorted(branches, key=lambda x: x.add):
        if b.pre & claimed:
            b = Branch(add=b.add, skip=b.skip, stream=b.stream, pre=b.pre - claimed, core=b.core, gate=b.gate,
                       core_in=b.core_in, reads=b.reads)
        body = set(b.core | b.gate)
        hit = [g for g in groups if g[1] & body]
        claimed |= b.pre
        if not hit:
            groups.append(([b], body))
            continue
        base = hit[0]
        base[0].append(b)
        base[1].update(body)
        for g in hit[1:]:
            base[0].extend(g[0])
            base[1].update(g[1])
            groups.remove(g)
    return [(tuple(sorted(g[0], key=lambda x: x.add)), frozenset().union(*(x.ops for x in g[0])))
            for g in groups]


def _ending_streams_pre(mg: ModelGraph, reach: Reach, regions: list[tuple[tuple[Branch, ...], frozenset[int]]],
                        stream_tensors: dict[str, int], dep: int) -> list[tuple[tuple[Branch, ...], frozenset[int]]]:
    """Regions whose core reads a stream that has no branch in them, through an AdaLN of that stream:
    that AdaLN is the region's ``pre``, as a branch of the stream would have it.

    A stream can end inside a region: SD3's last block is ``context_pre_only``, so its joint attention
    reads the text stream through ``norm1_context`` (an ``AdaLayerNormContinuous``: its own modulation
    GEMV, LayerNorm, ``* (1 + scale) + shift``) and adds no text residual.  Without a text branch the
    image branch held that AdaLN in its core, and ``split`` put it and its modulation GEMV in the NPU
    stage whatever ``--adaln`` / ``--modulation`` said.  The same holds for a cross-modal attention that
    reads the other stream through that stream's AdaLN (LTX-2, AV-DiT, Kandinsky 6, RFD4): the other
    stream has branches, but none in this region.  Only a *modulated* norm is taken (a plain norm of
    another stream, read by a cross-attention's keys, stays in the core as before); it must leave
    through one tensor, as a branch's own ``pre`` must.
    """
    out: list[tuple[tuple[Branch, ...], frozenset[int]]] = []
    for brs, ops in regions:
        own = {b.stream for b in brs}
        new = list(brs)
        for k, b in enumerate(brs):
            foreign = sorted({t for i in b.core for t in mg.op(i).inputs
                              if t in stream_tensors and stream_tensors[t] not in own})
            for t in foreign:
                pre, out_t = _pre_from(mg, reach, b.core - b.pre, t, b.gate)
                if pre and out_t is not None and _adaln_kind(mg, pre, dep) == "adaln":
                    b = Branch(add=b.add, skip=b.skip, stream=b.stream, pre=b.pre | pre, core=b.core - pre,
                               gate=b.gate, core_in=(*b.core_in, out_t), reads=(*b.reads, t))
            new[k] = b
        out.append((tuple(new), ops))
    return out


def _pre_from(mg: ModelGraph, reach: Reach, ops: frozenset[int], entry_tensor: str,
              gate: frozenset[int]) -> tuple[frozenset[int], str | None]:
    """The ops of ``ops`` between ``entry_tensor`` and the first weighted ops it reaches (their common
    ancestors), and the one tensor they leave through (``None``: not one)."""
    entry = [c for c in mg.consumers.get(entry_tensor, []) if c in ops]
    entry += [c for c in _real_consumers(mg, entry_tensor) if c in ops and c not in entry]
    weighted = [i for i in ops if (mg.op(i).op_type in WEIGHTED_OPS or mg.op(i).op_type in ATTENTION_OPS)
                and any(e == i or reach.is_ancestor(e, i) for e in entry)]
    first = [i for i in weighted if not any(reach.is_ancestor(w, i) for w in weighted if w != i)]
    if not first:
        return frozenset(), None
    common = -1
    for f in first:
        common &= reach.anc[f]
    pre = frozenset(unbits(common & bits(ops) & ~bits(gate)))
    outs = sorted({t for i in pre for t in mg.op(i).outputs
                   if any(c in ops and c not in pre for c in mg.consumers.get(t, []))})
    return (pre, outs[0]) if pre and len(outs) == 1 else (frozenset(), None)


@dataclass(frozen=True)
class _RegionInfo:
    name: str
    kind: str
    branches: tuple[Branch, ...]
    adaln: str
    first_add: int
    signature: tuple[object, ...]
    phase: int
    #: the unit holds the block's MLP (an FFN, or attention with an MLP beside it): it closes a block
    closes: bool = False
    #: the streams the unit's attention reads besides its own (joint by structure: a video stream's
    #: cross-attention to the audio stream beside it, LTX-2 / Kandinsky 6)
    reads: frozenset[int] = frozenset()

    @property
    def streams(self) -> frozenset[int]:
        return frozenset(b.stream for b in self.branches)

    @property
    def spans(self) -> frozenset[int]:
        """The streams the unit writes or attends over."""
        return self.streams | self.reads


def _score_matmuls(mg: ModelGraph, core: frozenset[int]) -> list[int]:
    """MatMuls of two activations: attention scores / values (softmax or linear attention)."""
    return [i for i in sorted(core) if mg.op(i).op_type in ("MatMul", "Einsum") and len(mg.dyn_inputs(i)) >= 2]


def _attention_kind(mg: ModelGraph, core: frozenset[int], dep: int, reach: Reach | None = None) -> str | None:
    """``self_attention``, ``cross_attention`` or ``None``.

    Attention is a MatMul of two activations (Softmax is neither necessary -- linear
    attention -- nor sufficient -- a softmax gate); it is cross-attention when one operand
    comes from outside the streams (the text context).  With ``reach``, only a *projected*
    outside operand is a context: keys and values are a learned projection of the text, while a
    transform applied to the queries and keys from a model input through no weights (Sana-WM's
    per-token camera matrices, a rotation built from positions) is no second sequence.
    """
    for i in sorted(core):
        if mg.op(i).op_type in ATTENTION_OPS:
            return "self_attention"
    weighted = 0
    if reach is not None:
        weighted = bits(j for j in range(len(mg.ops)) if mg.op(j).op_type in WEIGHTED_OPS
                        and any(mg.is_const_tensor(t) for t in mg.op(j).inputs if t))

    def context(p: int | None) -> bool:
        if p is not None and dep >> p & 1:
            return False
        return reach is None or (p is not None and bool((reach.anc[p] | 1 << p) & weighted))

    found = None
    for i in _score_matmuls(mg, core):
        if any(context(mg.producer.get(t)) for t in mg.dyn_inputs(i)):
            return "cross_attention"
        found = "self_attention"
    return found


def _streams_behind(mg: ModelGraph, t: str, via: frozenset[int], stream_tensors: dict[str, int],
                    limit: int = 4096) -> set[int]:
    """The streams whose tensors ``t`` is computed from through ``via`` (other units' cores) and
    no-op ops alone, each path stopping at the first stream tensor it meets (at most ``limit`` ops)."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [t]
    while stack and len(seen) < limit:
        x = stack.pop()
        if x in stream_tensors:
            found.add(stream_tensors[x])
            continue
        p = mg.producer.get(x)
        if p is None or p in seen or not (p in via or is_noop(mg, p)):
            continue
        seen.add(p)
        stack.extend(u for u in mg.op(p).inputs if u)
    return found


def _has_parallel_ffn(mg: ModelGraph, reach: Reach | None, core: frozenset[int]) -> bool:
    """A weighted op neither feeding nor fed by the attention: an MLP in parallel (Flux single).

    Not an output gate: a projection whose product first meets the attention in an elementwise
    ``Mul`` (``attn * sigmoid(x W_g)``, Krea 2's ``to_gate``) scales the attention, it is no MLP
    beside it; a parallel MLP joins it through a ``Concat`` (Flux) or a sum.
    """
    scores = _score_matmuls(mg, core)
    if not scores or reach is None:
        return False
    score_bits = bits(scores)
    for w in sorted(core):
        if mg.op(w).op_type not in WEIGHTED_OPS or w in scores:
            continue
        if not any(reach.is_ancestor(w, s) or reach.is_ancestor(s, w) for s in scores) \
                and not _gates_attention(mg, reach, core, w, score_bits):
            return True
    return False


def _gates_attention(mg: ModelGraph, reach: Reach, core: frozenset[int], w: int, score_bits: int) -> bool:
    """The ops of ``core`` where ``w``'s product and the attention (the score MatMuls, a bitset)
    first meet are all elementwise ``Mul``: ``w`` computes a gate of the attention's output."""
    both = {m for m in core if reach.anc[m] >> w & 1 and reach.anc[m] & score_bits}
    first = [m for m in both if not any(p in both for p in mg.ops.predecessors(m))]
    return bool(first) and all(mg.op(m).op_type == "Mul" for m in first)


def _adaln_kind(mg: ModelGraph, pre: frozenset[int], dep: int) -> str:
    if not pre:
        return "none"
    types = {mg.op(i).op_type for i in pre}
    has_norm = bool(types & NORM_OPS) or {"Pow", "Sqrt"} <= types or "Div" in types
    modulated = any(
        mg.op(i).op_type in ("Mul", "Add")
        and any(mg.producer.get(t) is not None and not dep >> mg.producer[t] & 1 for t in mg.dyn_inputs(i))
        for i in pre
    )
    if has_norm and modulated:
        return "adaln"
    return "norm" if has_norm else "none"


def _name_regions(
    mg: ModelGraph,
    regions: list[tuple[tuple[Branch, ...], frozenset[int]]],
    dep: int,
    stream_tensors: dict[str, int],
    txt: set[int],
    phases: list[int],
    reach: Reach | None = None,
) -> list[_RegionInfo]:
    out = []
    owned = frozenset().union(*(b.core for brs, _ops in regions for b in brs))
    for brs, _ops in regions:
        core = frozenset().union(*(b.core for b in brs))
        streams = {b.stream for b in brs}
        # a core reading another stream's tensor attends over both (SD3's last block, whose
        # text stream is context_pre_only, has no text residual but still joint attention)
        touched = set(streams)
        att = _attention_kind(mg, core, dep, reach)
        for i in core:
            for t in mg.op(i).inputs:
                if t in stream_tensors:
                    touched.add(stream_tensors[t])
                elif att:
                    # or through ops another unit owns: the K/V projection of another stream that an
                    # earlier unit reading the same tensor took into its core (ConsisID's two perceiver
                    # cross-attentions to the face tokens), or no-op casts (Kandinsky 6)
                    touched |= _streams_behind(mg, t, owned - core, stream_tensors)
        # and a stream that ends here, read through its own AdaLN (:func:`_ending_streams_pre`)
        touched |= {stream_tensors[t] for b in brs for t in b.reads}
        if len(touched) > 1 and att:
            kind, name = "joint_attention", "jattn"
        elif att == "cross_attention":
            kind, name = "cross_attention", "xattn"
        elif att and _has_parallel_ffn(mg, reach, core):
            kind, name = "parallel_attention", "attn_mlp"
        elif att:
            kind, name = "self_attention", "attn"
        elif sum(mg.op(i).op_type in WEIGHTED_OPS for i in core) >= 2:
            kind, name = "ffn", "ffn"
        else:
            kind, name = "other", "branch"
        if kind != "joint_attention" and streams and streams <= txt:
            name += "_txt"
        pre = frozenset().union(*(b.pre for b in brs))
        sig = (name, tuple(sorted(Counter(mg.op(i).op_type for i in core).items())))
        closes = kind in ("ffn", "parallel_attention") or (
            kind == "joint_attention" and _has_parallel_ffn(mg, reach, core))
        out.append(_RegionInfo(name=name, kind=kind, branches=brs, adaln=_adaln_kind(mg, pre, dep),
                               first_add=min(b.add for b in brs), signature=sig,
                               phase=min(phases[s] for s in streams), closes=closes,
                               reads=frozenset(touched - streams) if att else frozenset()))
    out.sort(key=lambda r: r.first_add)
    return out


_SCOPE_RE = re.compile(r"(?:^|[/.])([A-Za-z_][A-Za-z0-9_]*)[./](\d+)(?=[/.]|$)")


def _scope_keys(scope: str) -> list[tuple[str, int, str]]:
    """Each numbered module of ``scope``, outermost first: ``(list name, index, path before it)``.

    The path keeps two lists of one name apart (Bria-Fibo 2's ``perceiver.layers.0`` and
    ``layers.0``: the same name and index, other modules)."""
    return [(m.group(1), int(m.group(2)), re.sub(r"[/.]+", ".", scope[:m.start(1)]).strip("."))
            for m in _SCOPE_RE.finditer(scope)]


def _module_chain(scope: str) -> list[tuple[str, int, str]]:
    """:func:`_scope_keys` with each numbered module once: dynamo writes the path again at every
    level (``model.transformer_blocks.0.model.transformer_blocks.0.ff.model...``)."""
    out: list[tuple[str, int, str]] = []
    seen: set[tuple[str, int]] = set()
    for k in _scope_keys(scope):
        if k[:2] not in seen:
            seen.add(k[:2])
            out.append(k)
    return out


def _group_blocks(
    mg: ModelGraph, regions: list[_RegionInfo], phases: list[int]
) -> tuple[list[list[int]], str, list[str]]:
    by_names = _group_by_names(mg, regions)
    if by_names is not None:
        return by_names[0], "names", by_names[1]
    groups = _group_by_structure(regions)
    return groups, "structure", ["" for _ in groups]


def _group_by_names(mg: ModelGraph, regions: list[_RegionInfo]) -> tuple[list[list[int]], list[str]] | None:
    # each region's numbered modules: the outermost one most of its ops are in, and the deeper
    # ones all of those ops share (a FeedForward's net.0 and net.2 share none)
    paths: list[list[tuple[str, int, str]]] = []
    for r in regions:
        chains = [ks for b in r.branches for i in sorted(b.core | b.pre) if (ks := _module_chain(mg.op(i).scope))]
        if not chains:
            return None
        top = Counter(ks[0] for ks in chains).most_common(1)[0][0]
        inside = [ks for ks in chains if ks[0] == top]
        depth = min(len(ks) for ks in inside)
        while depth > 1 and any(ks[:depth] != inside[0][:depth] for ks in inside):
            depth -= 1
        paths.append(inside[0][:depth])
    # consecutive regions in the same outermost module form a block, split further where that module
    # holds a list of blocks of its own (_nested_blocks); keys must not come back later
    groups: list[list[int]] = []
    group_keys: list[tuple[str, int, str]] = []
    for run in _runs(list(range(len(regions))), lambda r: paths[r][0]):
        for sub, key in _nested_blocks(run, paths, 0):
            if key in group_keys:
                return None
            groups.append(sub)
            group_keys.append(key)
    if len(groups) < 2 and len(regions) > 2:
        return None
    # one label per block: lists of one name under other modules are told apart by their path
    labels = [f"{name}.{n}" for name, n, _path in group_keys]
    for gi, (name, n, path) in enumerate(group_keys):
        if path and labels.count(labels[gi]) > 1:
            labels[gi] = f"{path}.{name}.{n}"
    return groups, labels


def _runs(items: list[int], key: Callable[[int], object]) -> list[list[int]]:
    """``items`` cut into runs of consecutive equal ``key(item)``."""
    out: list[list[int]] = []
    for it in items:
        if out and key(out[-1][-1]) == key(it):
            out[-1].append(it)
        else:
            out.append([it])
    return out


def _nested_blocks(group: list[int], paths: list[list[tuple[str, int, str]]],
                   level: int) -> list[tuple[list[int], tuple[str, int, str]]]:
    """``group`` (regions sharing their module at ``level``) as blocks, with each block's module.

    A module whose regions fall into runs of two or more per numbered module one level down is a
    model nested in the model (DualTransformer2D: ``transformers.1.transformer_blocks.0``): those
    are its blocks.  A list of single units inside a block (T5's ``layer.0`` self-attention,
    ``layer.1`` cross-attention, ``layer.2`` FFN) is not.
    """
    key = paths[group[0]][level]
    if any(len(paths[r]) <= level + 1 for r in group):
        return [(group, key)]
    runs = _runs(group, lambda r: paths[r][level + 1])
    distinct = len({paths[run[0]][level + 1] for run in runs}) == len(runs)  # none comes back
    if len(runs) < 2 or any(len(run) < 2 for run in runs) or not distinct:
        return [(group, key)]
    return [b for run in runs for b in _nested_blocks(run, paths, level + 1)]


def _group_by_structure(regions: list[_RegionInfo]) -> list[list[int]]:
    """Blocks from the residual units alone, in each *stream system* apart.

    A stream system is a set of streams of one phase that share residual units (the image
    and text streams of joint attention), or whose units attend over each other (a video and
    an audio stream that cross-attend in every block); streams that share none (Lumina2's caption and
    noise refiners, text blocks that run before the visual ones) are separate systems even
    when their units interleave in op order.  In each system the units, in order, are cut
    into blocks by :func:`_segment`; the blocks of all systems are then ordered by their
    first unit, as the names would number them.
    """
    parent: dict[int, int] = {}

    def find(s: int) -> int:
        while parent.setdefault(s, s) != s:
            s = parent[s]
        return s

    for r in regions:
        first, *rest = sorted(r.spans)
        for s in rest:
            parent[find(s)] = find(first)
    systems: dict[tuple[int, int], list[int]] = {}
    for ri, r in enumerate(regions):
        systems.setdefault((r.phase, find(min(b.stream for b in r.branches))), []).append(ri)
    groups = [g for members in systems.values() for g in _segment(regions, members)]
    return sorted(groups, key=lambda g: g[0])


def _segment(regions: list[_RegionInfo], members: list[int]) -> list[list[int]]:
    """Cut one stream system's residual units (in order) into blocks.

    1. A transformer block's last residual update on each of its streams is its MLP: an
       FFN unit, or an attention unit with the MLP beside it (Flux single-stream blocks).
       A block closes after such a unit, unless the next one is the MLP of another stream
       that a unit of this block joined (the text FFN after the image FFN of a dual-stream
       block).  This finds blocks of different kinds side by side -- spatial and temporal
       blocks alternating, text-only blocks before the visual ones -- because it does not
       ask the blocks to repeat.
    2. A piece that ends with the whole layout of another piece starts with a unit of its
       own: a module between blocks that has no MLP (a perceiver cross-attention after
       every few blocks) is a block of its own, as its module name would make it.
    3. Units without any MLP are cut at the period of their names (:func:`_by_period`);
       so is a system whose first unit is an FFN, where step 1 has no block start to go by.
    """
    first = regions[members[0]]
    if first.kind == "ffn" or not any(regions[k].closes for k in members):
        return _by_period(regions, members)
    pieces: list[list[int]] = [[]]
    closed: frozenset[int] = frozenset()  # streams whose MLP the current piece has had
    joined: frozenset[int] = frozenset()  # streams a multi-stream unit of the current piece spans
    for k in members:
        r = regions[k]
        if closed and not (r.closes and not r.streams & closed and r.streams <= joined):
            pieces.append([])
            closed = joined = frozenset()
        pieces[-1].append(k)
        if len(r.spans) > 1:
            joined |= r.spans
        if r.closes:
            closed |= r.streams
    layouts = {tuple(regions[k].name for k in p) for p in pieces}
    out: list[list[int]] = []
    for p in pieces:
        if not any(regions[k].closes for k in p):  # the trailing units after the last MLP
            out.extend(_by_period(regions, p))
            continue
        names = tuple(regions[k].name for k in p)
        cut = next((c for c in range(1, len(p)) if names[c:] in layouts), 0)
        if cut:
            out.extend(_by_period(regions, p[:cut]))
        out.append(p[cut:])
    return out


def _by_period(regions: list[_RegionInfo], members: list[int]) -> list[list[int]]:
    """Blocks from the period of the unit names.

    Names, not full signatures: SD3's last block (text stream ``context_pre_only``) has a
    different attention core and no text FFN, yet starts a period like the others.
    """
    names = [regions[k].name for k in members]
    p = _period(names)
    if p == len(names) and names.count(names[0]) > 1:
        # no period (SD3.5: block 0 alone has a second attention): a block starts at
        # each unit named like the first one
        starts = [k for k, nm in enumerate(names) if nm == names[0]] + [len(names)]
        return [members[a:b] for a, b in pairwise(starts)]
    return [members[k:k + p] for k in range(0, len(members), p)]


def _period(names: list[str]) -> int:
    """Smallest period p at which ``names`` repeat (the last period may be cut short)."""
    n = len(names)
    for p in range(1, n):
        if names[0] not in names[1:p] and all(names[k] == names[k + p] for k in range(n - p)) \
                and set(names[:p]) >= set(names):
            return p
    for p in range(1, n):
        # tolerate one deviating block (>= 90% agreement) when every kind is in one period
        ok = sum(names[k] == names[k + p] for k in range(n - p))
        if ok >= 0.9 * (n - p) and set(names[:p]) >= set(names[: min(n, 2 * p)]):
            return p
    return max(n, 1)


def _unique_names(regions: list[Region]) -> list[Region]:
    seen: Counter[str] = Counter()
    out = []
    for r in regions:
        seen[r.name] += 1
        if seen[r.name] > 1:
            r = Region(name=f"{r.name}{seen[r.name]}", kind=r.kind, branches=r.branches, adaln=r.adaln,
                       side=r.side, mod=r.mod)
        out.append(r)
    return out
