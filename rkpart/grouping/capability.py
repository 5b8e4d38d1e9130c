"""Capability decides the grouping: an op the target runs on the CPU never stays inside an NPU stage.

Every strategy's partition goes through :func:`place_by_capability` before it is written
(:func:`rkpart.grouping.propose.propose`), so the rule holds for the built-in strategies, ``auto`` and
plugins alike, for families no rewrite was written for.  For each NPU group:

1. **Ask the capability** (:class:`rkpart.targets.capability.Capability`) why each op may not
   be there: not loadable, measured on the CPU, or a pattern an earlier build put on the CPU.
2. **Let the rewrites rescue it**: the ``npu`` rewrites the build would apply (and the opset
   lowering) are applied to the group as one model; an op they remove stays, one they leave
   goes.  So a rewrite that does not match an exporter's spelling costs nothing but a host op.
3. **Choose its neighbours**: of the group's ops without matmul work, those are taken along
   that make the fewest, smallest tensors cross between NPU and host (a minimum cut: RoPE's
   slices and products go with its ``ScatterND`` when one tensor then crosses each way
   instead of three).
4. **Cut the rest acyclically**: the group's remaining ops are split by how many host ops lie
   upstream of them inside the group (level ``k``), so the pieces run ``npu 0, host 0, npu 1,
   host 1 ...``; the group was convex, so no path leaves it and comes back, and the new
   pieces cannot form a cycle with any other stage.  A piece with no matmul work left between
   host ops joins the host (an NPU stage of its own would only add a round trip).

Every op moved is recorded with why (:class:`HostOp`, the plan's ``extra.capability``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import networkx as nx
import onnx
from onnx import TensorProto

from rkpart.errors import UserError
from rkpart.grouping.groups import Group, Partition
from rkpart.ir import ModelGraph
from rkpart.ir.consts import tensor_value
from rkpart.ir.infer import inferred_value_infos
from rkpart.ir.standalone import subgraph_model
from rkpart.ir.tensors import np_dtype_name
from rkpart.ir.work import op_macs
from rkpart.progress import Progress
from rkpart.targets.capability import (
    TOOLKIT_DTYPES,
    Capability,
    PlacementPattern,
    around_class,
    attrs_class,
    dims_class,
    shapes_class,
)
from rkpart.types import JsonObject

#: capability passes over the groups the previous pass left (each one only moves ops to the host)
_MAX_PASSES = 8
#: the cut capacity of a tensor no NPU stage can take or give (finite: when every cut crosses one,
#: the next capability pass moves what it leaves behind)
_NO_CROSS = 1 << 50
#: a computed constant above this many bytes is given to the rewrite probe as a placeholder
#: (no rewrite pattern reads a weight's values; the probe must not load gigabytes)
_PROBE_CONST_BYTES = 1 << 16
#: a larger computed constant is given as the constant ops computing it (as the stage holds it, so a rewrite
#: that reads its structure matches as at compile: CogView4's ScatterND indices, 134 MB of int64 expanded from
#: four small aranges) when at most this many ops compute it from constants of at most _PROBE_CONST_BYTES each
_PROBE_CLOSURE_OPS = 64


@dataclass(frozen=True)
class HostOp:
    """One op the capability moved out of an NPU stage, and why."""

    op: int
    name: str
    op_type: str
    stage: str  # the NPU group it left
    why: str

    def to_json(self) -> JsonObject:
        return {"op": self.name, "op_type": self.op_type, "from_stage": self.stage, "why": self.why}


def host_op_key(mg: ModelGraph, i: int) -> str:
    """How a :class:`HostOp` record names op ``i`` (``op``): its node name, else its index."""
    return mg.op(i).name or str(i)


def pattern_of(mg: ModelGraph, i: int) -> PlacementPattern:
    """The shape class of op ``i`` a placement is learned and matched by."""
    n = mg.op(i)
    shapes = [mg.shape(t) if t else None for t in n.inputs]
    ranks = [-1 if s is None else len(s) for s in shapes]
    first = next((t for t in n.inputs if t), "")
    dtype = (mg.dtype(first) or "") if first else ""
    consts = tuple(bool(t) and mg.is_const_tensor(t) for t in n.inputs)
    out_shapes = [mg.shape(t) if t else None for t in n.outputs]
    return PlacementPattern(op_type=n.op_type, dtype=dtype, ranks=tuple(ranks), domain=n.domain or "",
                            consts=consts, dims=dims_class(shapes, out_shapes), form=_form(mg, i),
                            shapes=shapes_class(shapes, out_shapes), attrs=attrs_class(n.attrs),
                            around=_around(mg, i))


def _around(mg: ModelGraph, i: int) -> str:
    """:attr:`PlacementPattern.around` of op ``i``: who produces its data inputs and who reads its outputs
    (``*`` where ``mg`` ends: a stage's input or output)."""
    n = mg.op(i)
    producers = []
    for t in n.inputs:
        if not t or mg.is_const_tensor(t):
            continue
        p = mg.producer.get(t)
        producers.append("*" if p is None else mg.op(p).op_type)
    outs = set(mg.outputs)
    readers = [mg.op(c).op_type for t in n.outputs if t for c in mg.consumers.get(t, ())]
    readers += ["*" for t in n.outputs if t in outs]
    return around_class(producers, readers)


def _form(mg: ModelGraph, i: int) -> str:
    """:attr:`PlacementPattern.form` of op ``i``: ``reverse`` for a ``Slice`` with a negative constant step."""
    n = mg.op(i)
    reverse = n.op_type == "Slice" and len(n.inputs) > 4 and bool(n.inputs[4]) and mg.is_const_tensor(n.inputs[4]) \
        and bool((tensor_value(mg.constant(n.inputs[4])) < 0).any())
    return "reverse" if reverse else ""


def _model_op(name: str, names: set[str]) -> str:
    """The op of the model a forced name stands for: ``name`` itself, or, for a node an NPU rewrite made
    (rkpart's rewrites name theirs ``<op they replaced>/<tag>``), the op it replaced.

    Measured: on tiny Helios (dynamo, split, 2.3.0) ``scatternd-interleave``'s rank-5 Reshape
    ``node_ScatterND_558/Reshape`` runs on the CPU; the op to move is ``node_ScatterND_558``, which the
    model has (the Reshape exists only in the rewritten stage)."""
    n = name
    while n not in names and "/" in n.strip("/"):
        n = n.rsplit("/", 1)[0]
    return n if n in names else name


def flag_ops(mg: ModelGraph, part: Partition, cap: Capability,
             force: Mapping[str, str] | None = None) -> dict[int, str]:
    """Op index -> why it must leave its NPU group, after the rewrites had their chance.

    ``force`` maps op names to a reason that holds whatever the rewrites do: the layers the last
    build of this very plan put on the CPU (``rkpart compile --repartition``), where the
    rewrites were already applied and did not remove them.
    """
    names = {mg.op(i).name for g in part.groups for i in g.ops if mg.op(i).name}
    force = {_model_op(k, names): v for k, v in (force or {}).items()}
    out: dict[int, str] = {}
    for g in part.groups:
        if g.device != "npu":
            continue
        flagged: dict[int, str] = {}
        forced: dict[int, str] = {}
        for i in sorted(g.ops):
            n = mg.op(i)
            if n.name and n.name in force:
                forced[i] = force[n.name]
                continue
            dtypes = {d for d in (mg.dtype(t) for t in (*n.inputs, *n.outputs) if t) if d is not None}
            why = cap.reason(n, pattern_of(mg, i), dtypes)
            if why is not None:
                flagged[i] = why
        if flagged:
            kept = _survive_rewrites(mg, g, flagged, cap)
            flagged = {i: w for i, w in flagged.items() if i in kept}
        out.update(flagged)
        out.update(forced)
    return out


def left_after_rewrites(mg: ModelGraph, g: Group, ops: Iterable[int], cap: Capability) -> set[int]:
    """The ops of ``ops`` (in NPU group ``g``) that the build's lowering and ``npu`` rewrites leave in
    place: of what the toolkit runs on the CPU, what stays there once ``rkpart compile`` has rewritten
    the stage."""
    return _survive_rewrites(mg, g, dict.fromkeys(ops, ""), cap)


def _survive_rewrites(mg: ModelGraph, g: Group, flagged: Mapping[int, str], cap: Capability) -> set[int]:
    """The ``flagged`` ops of ``g`` the build's lowering and ``npu`` rewrites would leave in place.

    The group is made one in-memory model (weights referenced, not read) and the rewrites are
    applied to it as ``rkpart compile`` applies them to the stage.  A probe that cannot be made
    (a lowering the converter refuses) rescues nothing: every flagged op leaves.
    """
    from rkpart.targets.opset import lower_model, model_opset
    from rkpart.targets.rewrites import apply_rewrites, rewrites_for

    rows = rewrites_for(cap.toolkit, "npu") if cap.rewrites else ()
    types = {mg.op(i).op_type for i in flagged}
    needs_lowering = mg.opset > cap.caps.max_opset
    in_group = {mg.op(i).op_type for i in g.ops}
    if not needs_lowering and not any(r.op_type in in_group for r in rows):
        return set(flagged)
    sub = mg.subgraph(g.ops)
    try:
        model = subgraph_model(mg, sub, {t: _probe_value(mg, t) for t in sorted(sub.const_tensors)},
                               name="capability-probe")
        _closures_for_placeholders(mg, model)
        if needs_lowering:
            model, _ = lower_model(model, cap.caps.max_opset, cap.toolkit)
        if model_opset(model) <= cap.caps.max_opset:
            apply_rewrites(model, rows)
    except (UserError, ValueError, onnx.checker.ValidationError):
        return set(flagged)
    named = {(n.name, n.op_type) for n in model.graph.node if n.name}
    count = {t: sum(1 for n in model.graph.node if n.op_type == t) for t in types}
    kept = set()
    for i in flagged:
        n = mg.op(i)
        # an unnamed op cannot be followed through the rewrite: it stays flagged unless its op
        # type is gone altogether
        if (n.name and (n.name, n.op_type) in named) or (not n.name and count[n.op_type]):
            kept.add(i)
    return kept - _retyped(mg, model, kept, cap)


def _retyped(mg: ModelGraph, model: onnx.ModelProto, kept: set[int], cap: Capability) -> set[int]:
    """The ops of ``kept`` flagged for an element type the toolkit has none of that the rewrites gave
    one it has (bfloat16-widen), and that the capability then lets stay (asked again, with the new
    types)."""
    foreign = {i for i in kept if mg.op(i).name
               and {mg.dtype(t) for t in (*mg.op(i).inputs, *mg.op(i).outputs) if t} - TOOLKIT_DTYPES - {None}}
    if not foreign:
        return set()
    try:
        infos = inferred_value_infos(model)
    except Exception:  # noqa: BLE001 - no types after the rewrite: nothing is known to be rescued
        return set()
    g = model.graph
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.input, *g.output, *infos)}
    elem.update({t.name: t.data_type for t in g.initializer})
    by_name = {n.name: n for n in g.node if n.name}
    out = set()
    for i in foreign:
        node = by_name[mg.op(i).name]
        tensors = [t for t in (*node.input, *node.output) if t]
        if any(t not in elem for t in tensors):
            continue
        dtypes = {np_dtype_name(elem[t]) for t in tensors}
        first = next((t for t in node.input if t), "")
        pattern = replace(pattern_of(mg, i), dtype=np_dtype_name(elem[first]) if first else "")
        if cap.reason(mg.op(i), pattern, dtypes) is None:
            out.add(i)
    return out


def _probe_value(mg: ModelGraph, t: str) -> TensorProto:
    """Constant ``t`` for the rewrite probe: an initializer as it is (external data not read), a
    small computed constant evaluated, a large one a placeholder of the right type and shape."""
    init = mg.initializers.get(t)
    if init is not None:
        return init
    shape, dtype = mg.shape(t), mg.dtype(t)
    if mg.nbytes(t) <= _PROBE_CONST_BYTES or shape is None or dtype is None:
        return mg.constant(t)
    out = TensorProto(name=t, dims=list(shape), data_type=mg.value_info(t).type.tensor_type.elem_type)
    out.data_location = TensorProto.EXTERNAL
    entry = out.external_data.add()
    entry.key, entry.value = "location", "rkpart-capability-probe-placeholder"
    return out


def _closures_for_placeholders(mg: ModelGraph, model: onnx.ModelProto) -> None:
    """Each placeholder of a computed constant in ``model`` (the probe) replaced by the constant ops computing it,
    where :data:`_PROBE_CLOSURE_OPS` ops compute it from small constants (read: a few KB of aranges or shapes)."""
    g = model.graph
    placeholders = [t for t in g.initializer if t.data_location == TensorProto.EXTERNAL
                    and t.name not in mg.initializers and mg.is_const_tensor(t.name)]
    ops: set[int] = set()
    for t in placeholders:
        closure = mg.const_closure([t.name])
        made = {o for i in closure for o in mg.const_node(i).output if o}
        leaves = {x for i in closure for x in mg.const_node(i).input if x and x not in made}
        if len(closure) > _PROBE_CLOSURE_OPS or any(max(mg.nbytes(x), mg.weight_bytes(x)) > _PROBE_CONST_BYTES
                                                    for x in leaves):
            continue
        g.initializer.remove(t)
        ops.update(closure)
    if not ops:
        return
    nodes = [mg.const_node(i) for i in sorted(ops)]
    made = {o for n in nodes for o in n.output if o}
    have = {t.name for t in g.initializer}
    for x in sorted({x for n in nodes for x in n.input if x and x not in made and x not in have}):
        g.initializer.append(mg.constant(x))  # small (checked above): read, external data included
    data = list(g.node)
    del g.node[:]
    g.node.extend([*nodes, *data])


def place_by_capability(mg: ModelGraph, part: Partition,
                        flagged: Mapping[int, str]) -> tuple[Partition, tuple[HostOp, ...]]:
    """``part`` with the ``flagged`` ops (and the neighbours worth taking along) out of NPU groups.

    Returns the new partition (groups without flagged ops unchanged, in place) and every op that
    moved, with why.  ``part`` itself is not changed.
    """
    if not flagged:
        return part, ()
    groups: list[Group] = []
    moved: list[HostOp] = []
    used = {g.id for g in part.groups}
    for g in part.groups:
        mine = {i: w for i, w in flagged.items() if i in g.ops}
        if g.device != "npu" or not mine:
            groups.append(g)
            continue
        why = dict(mine)
        # a group without matmul work (``generic`` over elementwise ops) has nothing to anchor a cut
        # to the NPU: only the flagged ops leave, and its pieces stay
        has_work = any(op_macs(mg, i) for i in g.ops)
        host = _absorb(mg, g.ops, set(mine), why) if has_work else set(mine)
        sunk: dict[int, int] = {}
        while True:
            npu_levels, host_levels = _levels(mg, g.ops, host, sunk)
            idle = [lvl for lvl, ops in npu_levels.items() if has_work and not any(op_macs(mg, i) for i in ops)]
            if not idle:
                break
            if _sink(mg, g.ops, npu_levels, host_levels, idle, sunk):
                continue
            for lvl in idle:
                for i in npu_levels[lvl]:
                    why[i] = "no matmul work left between the host ops around it (an NPU stage of its own " \
                             "would only add a round trip)"
                host |= npu_levels[lvl]
        for k, lvl in enumerate(sorted(npu_levels)):
            groups.append(replace(g, id=g.id if k == 0 else _fresh(f"{g.id}.{k}", used),
                                  ops=frozenset(npu_levels[lvl])))
        for lvl in sorted(host_levels):
            groups.append(replace(g, id=_fresh(f"{g.id}.host{lvl}", used), device="host",
                                  ops=frozenset(host_levels[lvl]), kind="cpu-op"))
        moved += [HostOp(i, host_op_key(mg, i), mg.op(i).op_type, g.id, why[i]) for i in sorted(host)]
    note = (f"capability: {len(moved)} op(s) moved out of NPU stages to the host "
            f"({', '.join(sorted({h.op_type for h in moved}))}); plan.json extra.capability says why")
    return Partition(part.strategy, part.options, tuple(groups), (*part.notes, note), part.extra), tuple(moved)


def cut_before(mg: ModelGraph, part: Partition, names: Mapping[str, str]) -> tuple[Partition, list[dict[str, str]]]:
    """``part`` with every NPU group that holds an op named in ``names`` cut in front of that op.

    The workaround for a build that crashed after an optimiser fusion (``rkpart compile
    --repartition``): an op the fusion folded into its producer starts a new NPU stage, so the
    rule cannot fire, whatever the spelling of the pattern.  Only ops whose fused operand varies
    over the tokens are cut before (:func:`_fused_operand_varies`: computed, or a constant that is
    not one value per channel); an op whose data
    predecessor is itself a cut op joins that op's piece (``Mul`` then ``Add`` of one AdaLN
    modulation make one cut).  Pieces are ordered by how many cuts lie upstream of them inside
    the group, so the result is acyclic for the same reason as :func:`place_by_capability`'s.
    Returns the partition and one record per cut (``before``, ``stage``, ``why``).
    """
    groups: list[Group] = []
    cuts: list[dict[str, str]] = []
    used = {g.id for g in part.groups}
    for g in part.groups:
        here = {i for i in g.ops if mg.op(i).name in names and _fused_operand_varies(mg, i)}
        if g.device != "npu" or not here:
            groups.append(g)
            continue
        def into_cut(q: int, i: int, cut: set[int] = here) -> bool:
            return i in cut and q not in cut

        pieces: dict[int, set[int]] = {}
        for i, lvl in _level(mg, g.ops, into_cut).items():
            pieces.setdefault(lvl, set()).add(i)
        for k, lvl in enumerate(sorted(pieces)):
            groups.append(replace(g, id=g.id if k == 0 else _fresh(f"{g.id}.{k}", used), ops=frozenset(pieces[lvl])))
        cuts += [{"before": mg.op(i).name, "stage": g.id, "why": names[mg.op(i).name]} for i in sorted(here)]
    if not cuts:
        return part, []
    note = f"capability: {len(cuts)} NPU stage cut(s) in front of ops a crashing build fused; plan.json " \
           "extra.capability says why"
    return Partition(part.strategy, part.options, tuple(groups), (*part.notes, note), part.extra), cuts


def _fused_operand_varies(mg: ModelGraph, i: int) -> bool:
    """Op ``i`` has a data input besides the one the fusion folds it onto (an AdaLN modulation
    computed from the conditioning), or a constant operand that is not a per-channel vector: one
    with more than one element along an axis before the last, such as Flux.3's context modulation
    that the model computes from its weights alone, folded at load to a (1, 6, 32) constant.  A
    norm's gamma/beta is per channel; fusing either of the others is what crashes (exnorm-fusion-segv).
    A per-channel constant (a qk-norm scale) is an ordinary norm affine and is not cut before."""
    dyn = mg.dyn_inputs(i)
    if len(dyn) >= 2:
        return True
    if not dyn:
        return False
    return any(any(d != 1 for d in (mg.shape(t) or ())[:-1]) for t in mg.op(i).inputs if t and t not in dyn)


def _fresh(gid: str, used: set[str]) -> str:
    """``gid``, or ``gid`` with a letter appended, not in ``used`` (which it joins): group ids stay
    unique when a piece of a cut group is cut again (``b05.block.1`` from the capability, then
    from a crash cut)."""
    out, n = gid, 0
    while out in used:
        n += 1
        out = f"{gid}{chr(ord('a') + n - 1)}" if n <= 26 else f"{gid}_{n}"
    used.add(out)
    return out


def _crossing(mg: ModelGraph, ops: frozenset[int], host: set[int]) -> str:
    """The tensors that cross between ``host`` and the rest of ``ops`` (each once), for messages."""
    total = n = 0
    for i in ops:
        for t in mg.op(i).outputs:
            if not t:
                continue
            readers = {c for c in mg.consumers.get(t, ()) if c in ops}
            if any((c in host) != (i in host) for c in readers):
                total += mg.nbytes(t)
                n += 1
    return f"{n} tensor(s), {total} bytes"


def _absorb(mg: ModelGraph, ops: frozenset[int], host: set[int], why: dict[int, str]) -> set[int]:
    """``host`` and the ops without matmul work that cross the fewest, smallest tensors with it.

    A minimum cut of the group: ops with matmul work are tied to the NPU side, the ops that
    must leave to the host side, and each tensor is a hyperedge of capacity ``bytes + 1`` (the
    ``+ 1``: of two cuts with the same bytes, the one with fewer tensors).  Of the minimum
    cuts, the one with the smallest host side is taken: an op that could run on either side
    stays on the NPU.  Deterministic (ops and tensors are added in model order).
    """
    free = sorted(i for i in ops if i not in host and not op_macs(mg, i))
    if not free:
        return set(host)
    big = float("inf")
    g = nx.DiGraph()
    src, dst = ("side", "npu"), ("side", "host")
    g.add_node(src)
    g.add_node(dst)
    for i in sorted(ops):
        if i in host:
            g.add_edge(("op", i), dst, capacity=big)
        elif op_macs(mg, i):
            g.add_edge(src, ("op", i), capacity=big)
    for i in sorted(ops):
        for t in mg.op(i).outputs:
            readers = sorted({c for c in mg.consumers.get(t, ()) if c in ops}) if t else []
            if not readers:
                continue
            # one node per direction: the tensor costs its bytes once if its producer is on the
            # NPU side and any reader on the host side ("out"), or the other way round ("in")
            # a tensor of a type no build holds (bfloat16) cannot be a stage's input or output: the
            # cut goes elsewhere when it can (the island stays whole, and widened, on one side)
            dt = mg.dtype(t)
            cap = mg.nbytes(t) + 1 if dt is None or dt in TOOLKIT_DTYPES else _NO_CROSS
            g.add_edge(("op", i), ("out", t), capacity=cap)
            g.add_edge(("in", t), ("op", i), capacity=cap)
            for c in readers:
                g.add_edge(("out", t), ("op", c), capacity=big)
                g.add_edge(("op", c), ("in", t), capacity=big)
    before = _crossing(mg, ops, host)
    residual = nx.algorithms.flow.edmonds_karp(g, src, dst)
    # the smallest host side of the minimum cuts: what can still reach the sink in the residual graph
    reach: set[tuple[str, Any]] = {dst}
    stack = [dst]
    while stack:
        v = stack.pop()
        for u in residual.predecessors(v):
            e = residual[u][v]
            if u not in reach and e["capacity"] - e["flow"] > 0:
                reach.add(u)
                stack.append(u)
    taken: set[int] = {int(n[1]) for n in reach if n[0] == "op"} - host
    if not taken:
        return set(host)
    after = _crossing(mg, ops, host | taken)
    label = ", ".join(mg.op_label(i) for i in sorted(host)[:3]) + (" ..." if len(host) > 3 else "")
    for j in sorted(taken):
        why[j] = (f"taken along with {label}: the cut that crosses the fewest bytes between NPU and host "
                  f"({after} instead of {before})")
    return set(host) | taken


def _levels(mg: ModelGraph, ops: frozenset[int], host: set[int], sunk: Mapping[int, int] | None = None,
            ) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    """The group's ops by the number of host ops upstream of them inside the group.

    NPU op at level ``k``: ``k`` host ops on the longest in-group path to it.  Host op at level
    ``k``: ``k`` host ops strictly upstream.  Executing ``npu 0, host 0, npu 1, host 1 ...``
    respects every edge (an edge never goes to a lower level; from host ``k`` only to ``k+1``).
    ``sunk``: NPU ops run at a later level than their earliest (:func:`_sink`).
    """
    npu: dict[int, set[int]] = {}
    hst: dict[int, set[int]] = {}
    for i, lvl in _level(mg, ops, lambda p, _i: p in host).items():
        if i not in host and sunk and i in sunk:
            lvl = max(lvl, sunk[i])
        (hst if i in host else npu).setdefault(lvl, set()).add(i)
    return npu, hst


def _sink(mg: ModelGraph, ops: frozenset[int], npu_levels: Mapping[int, set[int]],
          host_levels: Mapping[int, set[int]], idle: list[int], sunk: dict[int, int]) -> bool:
    """Run the ops of the ``idle`` NPU levels (no matmul work) as late as their readers in the
    group allow, when that is a level with work; whether any moved.

    An op is at its earliest level; one that only feeds a later NPU piece can run there instead
    (Sana-WM's camera attention: the casts and pads of the queries wait behind one host ``Einsum``,
    the keys' behind two, so the queries' piece had no matmul and went to the host, cutting the
    bfloat16 island it began).  It stays no later than any NPU reader's level and no later than
    any host reader's (host ``k`` runs after NPU ``k``): no edge goes to a lower level.
    """
    level = {i: k for k, s in npu_levels.items() for i in s}
    hlevel = {i: k for k, s in host_levels.items() for i in s}
    work = {k for k, s in npu_levels.items() if any(op_macs(mg, i) for i in s)}
    moved = False
    for lvl in sorted(idle, reverse=True):
        for i in sorted(npu_levels[lvl], reverse=True):  # readers first (model order is topological)
            latest = min((level[c] if c in level else hlevel[c]
                          for t in mg.op(i).outputs if t for c in mg.consumers.get(t, ()) if c in ops),
                         default=None)
            if latest is None or latest <= level[i] or latest not in work:
                continue
            level[i] = sunk[i] = latest
            moved = True
    return moved


def _level(mg: ModelGraph, ops: frozenset[int], step: Callable[[int, int], bool]) -> dict[int, int]:
    """Op -> the largest number of ``step``-ing edges on an in-group path to it.

    ``step(p, i)``: whether the edge ``p -> i`` goes one level up.  Levels never fall along an
    edge, so running the group's pieces level by level respects every edge; the group is convex,
    so no path leaves it and comes back, and the pieces cannot form a cycle with other stages.
    """
    level: dict[int, int] = {}
    for i in sorted(ops):  # model order is topological
        level[i] = max((level[p] + step(p, i) for p in mg.ops.predecessors(i) if p in level), default=0)
    return level


def apply_capability(mg: ModelGraph, part: Partition, cap: Capability, force_host: Mapping[str, str] | None = None,
                     progress: Progress | None = None) -> Partition:
    """``part`` with every op ``cap`` does not run on the NPU moved to the host (with the
    neighbours of the cheapest cut), the moves recorded in ``extra.capability``."""
    out, moved = part, list[HostOp]()
    # again on the groups the moves left: a rewrite that rescued an op in the whole group (the
    # bfloat16 island widened) may no longer apply to a piece of it (the island cut by a move)
    for _ in range(_MAX_PASSES):
        flagged = flag_ops(mg, out, cap, force_host)
        if not flagged:
            break
        out, more = place_by_capability(mg, out, flagged)
        if not more:
            break
        moved += more
    if not moved:
        return part
    if progress is not None:
        for h in moved:
            progress(f"capability: {h.op_type} {h.name} ({h.stage}) -> host: {h.why}")
    return replace(out, extra={**out.extra, "capability": {**cap.to_json(), "host_ops": [h.to_json() for h in moved]}})


def capability_notes(mg: ModelGraph, part: Partition, target: str, toolkit: str | None) -> list[str]:
    """What ``toolkit`` will not do with ``part``: load its opset, run each NPU stage's ops on the NPU.

    Nothing is checked without a ``toolkit``, or for a target rkpart has no capability table
    for (the toolkit itself still decides when it builds).
    """
    from rkpart.targets import TARGETS, get_target
    from rkpart.targets.opset import lowering_note
    from rkpart.targets.rewrites import rewrites_for

    if toolkit is None or target.lower() not in TARGETS:
        return []
    caps = get_target(target).caps(toolkit)
    notes = []
    # compile lowers the opset and rewrites some ops onto the NPU (rkpart.targets.opset / rewrites)
    lowering = lowering_note(mg.opset, {caps.version: caps.max_opset})
    if lowering:
        notes.append(f"target {target}: {lowering} when compiled")
    rewritten = {r.op_type for r in rewrites_for(caps.version, "npu") if r.every_node}
    for g in part.groups:
        if g.device != "npu":
            continue
        off = caps.off_npu(mg.op(i) for i in sorted(g.ops) if mg.op(i).op_type not in rewritten)
        if off:
            # only what stays on the CPU once the build's rewrites ran (nan-guard takes IsNaN's guard onto the NPU)
            left = left_after_rewrites(mg, g, (n.index for n, _ in off), Capability(target.lower(), caps))
            off = [(n, rule) for n, rule in off if n.index in left]
        if off:
            ops = ", ".join(sorted({f"{n.op_type} ({rule.support})" for n, rule in off}))
            notes.append(f"target {target}: NPU stage {g.id} holds op(s) rknn-toolkit2 {caps.version} does not "
                         f"run on the NPU: {ops}")
    return notes


__all__ = ["HostOp", "apply_capability", "capability_notes", "cut_before", "flag_ops", "host_op_key", "pattern_of",
           "place_by_capability"]
