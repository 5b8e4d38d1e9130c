"""Sequences out of a parsed model: ``Loop`` s that build a sequence unrolled, sequences as lists.

rkpart's graph holds tensors only, and a stage boundary must be a tensor.  A scripted export of
expert-choice routing gathers tokens per expert in a ``Loop`` that appends to a sequence
(``SequenceEmpty`` -> ``SequenceInsert`` in the body -> ``ConcatFromSequence`` after it): the
loop's trip count is a value, and the concatenation's shape follows from it.  Once a run on
representative inputs has given the trip count (:mod:`rkpart.runtime.specialise`),
:func:`unroll_sequences` rewrites the model exactly for that count:

* every such ``Loop`` becomes its body ``trips`` times over, each copy's tensors renamed
  (``<name>/iter<k>``), the iteration number a constant, loop-carried tensors threaded from one
  copy to the next, scan outputs stacked along a new first axis;
* a sequence is tracked as the list of tensors it holds: ``SequenceEmpty`` / ``SequenceConstruct``
  start one, ``SequenceInsert`` (appending) extends it, ``SequenceLength`` becomes a constant and
  ``ConcatFromSequence`` a ``Concat`` (of ``Unsqueeze`` d elements with ``new_axis``).

What is not that is refused in one line (:class:`UnrollError`): another sequence op, an insert at
a position, a loop whose condition its body computes, a sequence that leaves the graph, control
flow inside the body.  The caller records the trip count and refuses inputs that would change it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: ops that make, extend or read a sequence (the ones handled here, and the ones refused)
SEQUENCE_OPS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceLength",
                          "ConcatFromSequence", "SequenceAt", "SequenceErase", "SplitToSequence", "SequenceMap"})
_HANDLED = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceLength", "ConcatFromSequence"})


class UnrollError(ValueError):
    """A sequence construct this module does not rewrite (the message is one line)."""


@dataclass(frozen=True)
class LoopTrips:
    """A ``Loop`` that carries a sequence: what its trip count is read from."""

    node: str  # the Loop's key (:func:`node_key`): what ``unroll_sequences``' ``trips`` is keyed by
    trip_count: str  # the tensor holding M ('' when absent)
    cond: str  # the tensor holding the initial condition ('' when absent)
    outputs: tuple[str, ...] = ()  # the Loop's outputs


def node_key(n: onnx.NodeProto, k: int) -> str:
    """A top-level node's name, else ``<op type>_<position>`` (a name nothing else gives it)."""
    return n.name or f"{n.op_type}_{k}"


def sequence_loops(model: onnx.ModelProto) -> list[LoopTrips]:
    """The top-level ``Loop`` s of ``model`` whose carried values or body involve a sequence."""
    out = []
    for k, n in enumerate(model.graph.node):
        if n.op_type != "Loop":
            continue
        body = _body(n)
        if any(b.op_type in SEQUENCE_OPS for b in body.node) or any(
                vi.type.HasField("sequence_type") for vi in [*body.input, *body.output]):
            out.append(LoopTrips(node=node_key(n, k), trip_count=n.input[0] if n.input else "",
                                 cond=n.input[1] if len(n.input) > 1 else "", outputs=tuple(n.output)))
    return out


def has_sequences(model: onnx.ModelProto) -> bool:
    return any(n.op_type in SEQUENCE_OPS for n in model.graph.node) or bool(sequence_loops(model))


def unroll_sequences(model: onnx.ModelProto, trips: Mapping[str, int]) -> None:
    """Rewrite ``model`` in place without sequences, each sequence ``Loop`` run ``trips[node]`` times."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    g = model.graph
    seqs: dict[str, list[str]] = {}
    out_nodes: list[onnx.NodeProto] = []
    consts: list[onnx.TensorProto] = []
    for k, n in enumerate(g.node):
        name = node_key(n, k)
        if n.op_type == "Loop" and name in trips:
            out_nodes += _unroll_loop(n, name, int(trips[name]), seqs, opset, consts, g)
        elif n.op_type in SEQUENCE_OPS:
            out_nodes += _sequence_op(n, name, seqs, opset, consts)
        else:
            if any(t in seqs for t in n.input):
                raise UnrollError(f"{n.op_type} node {name!r} reads a sequence: only ConcatFromSequence and "
                                  "SequenceLength can (rkpart's graph holds tensors only)")
            out_nodes.append(n)
    for o in g.output:
        if o.name in seqs:
            raise UnrollError(f"model output {o.name!r} is a sequence (rkpart's graph holds tensors only)")
    del g.node[:]
    g.node.extend(out_nodes)
    g.initializer.extend(consts)
    # the sequences' value_info goes (their tensors are gone); the rest is inferred again on load
    keep = [vi for vi in g.value_info if vi.name not in seqs and not vi.type.HasField("sequence_type")]
    del g.value_info[:]
    g.value_info.extend(keep)


def _body(loop: onnx.NodeProto) -> onnx.GraphProto:
    return next(helper.get_attribute_value(a) for a in loop.attribute if a.name == "body")


def _const(name: str, value: np.ndarray, consts: list[onnx.TensorProto]) -> str:
    consts.append(numpy_helper.from_array(value, name))
    return name


def _unsqueeze(src: str, dst: str, axis: int, node: str, opset: int,
               consts: list[onnx.TensorProto]) -> onnx.NodeProto:
    if opset >= 13:
        axes = _const(f"{dst}/axes", np.array([axis], dtype=np.int64), consts)
        return helper.make_node("Unsqueeze", [src, axes], [dst], name=node)
    return helper.make_node("Unsqueeze", [src], [dst], name=node, axes=[axis])


def _sequence_op(n: onnx.NodeProto, name: str, seqs: dict[str, list[str]], opset: int,
                 consts: list[onnx.TensorProto], rename: Mapping[str, str] | None = None) -> list[onnx.NodeProto]:
    """``n``, a sequence op, as the tensor ops it amounts to; sequences tracked in ``seqs``."""
    ren = rename or {}
    ins = [ren.get(t, t) for t in n.input]
    outs = [ren.get(t, t) for t in n.output]
    if n.op_type not in _HANDLED:
        raise UnrollError(f"{n.op_type} node {name!r}: a sequence op rkpart does not rewrite (it handles "
                          f"{', '.join(sorted(_HANDLED))})")
    if n.op_type == "SequenceEmpty":
        seqs[outs[0]] = []
        return []
    if n.op_type == "SequenceConstruct":
        seqs[outs[0]] = [t for t in ins if t]
        return []
    if ins[0] not in seqs:
        raise UnrollError(f"{n.op_type} node {name!r} reads {n.input[0]!r}, a sequence not made by "
                          "SequenceEmpty / SequenceConstruct / SequenceInsert")
    held = seqs[ins[0]]
    if n.op_type == "SequenceInsert":
        if len(ins) > 2 and ins[2]:
            raise UnrollError(f"SequenceInsert node {name!r} inserts at a position: only appending is rewritten")
        seqs[outs[0]] = [*held, ins[1]]
        return []
    if n.op_type == "SequenceLength":
        return [helper.make_node("Constant", [], [outs[0]], name=name,
                                 value=numpy_helper.from_array(np.array(len(held), dtype=np.int64)))]
    # ConcatFromSequence
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    axis, new_axis = int(attrs.get("axis", 0)), int(attrs.get("new_axis", 0))
    if not held:
        raise UnrollError(f"ConcatFromSequence node {name!r} concatenates an empty sequence on these inputs")
    nodes: list[onnx.NodeProto] = []
    parts = held
    if new_axis:
        parts = [f"{outs[0]}/part{j}" for j in range(len(held))]
        nodes += [_unsqueeze(t, p, axis, f"{name}/unsqueeze{j}", opset, consts)
                  for j, (t, p) in enumerate(zip(held, parts, strict=True))]
    nodes.append(helper.make_node("Concat", parts, [outs[0]], name=name, axis=axis))
    return nodes


def _cond_is_kept(body: onnx.GraphProto, outer_cond: str) -> bool:
    """Whether the body's condition output is its condition input (or the loop's), unchanged."""
    cin, cout = body.input[1].name, body.output[0].name
    if cout in (cin, outer_cond):
        return True
    prod = next((b for b in body.node if cout in b.output), None)
    if prod is None:
        return False
    if prod.op_type == "Identity":
        return prod.input[0] in (cin, outer_cond) and bool(prod.input[0])
    if prod.op_type == "Constant":
        v = numpy_helper.to_array(helper.get_attribute_value(prod.attribute[0]))
        return v.size == 1 and bool(v.reshape(-1)[0])
    return False


def _unroll_loop(n: onnx.NodeProto, name: str, trips: int, seqs: dict[str, list[str]], opset: int,
                 consts: list[onnx.TensorProto], g: onnx.GraphProto) -> list[onnx.NodeProto]:
    body = _body(n)
    ins = list(n.input)
    outer_cond = ins[1] if len(ins) > 1 else ""
    if not _cond_is_kept(body, outer_cond):
        raise UnrollError(f"Loop node {name!r}: its body computes its condition (only a loop that runs its trip "
                          "count is unrolled)")
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for b in body.node for a in b.attribute):
        raise UnrollError(f"Loop node {name!r}: control flow inside its body is not unrolled")
    carried_n = len(ins) - 2
    carried = [ins[2 + j] for j in range(carried_n)]
    scan_n = len(body.output) - 1 - carried_n
    scans: list[list[str]] = [[] for _ in range(scan_n)]
    g.initializer.extend(body.initializer)  # names are unique across a model and its subgraphs
    nodes: list[onnx.NodeProto] = []
    local = {vi.name for vi in body.input} | {t for b in body.node for t in b.output}
    for k in range(trips):
        ren = {t: f"{t}/iter{k}" for t in local}
        it = _const(f"{name}/iter{k}/i", np.array(k, dtype=np.int64), consts)
        ren[body.input[0].name] = it
        ren[body.input[1].name] = outer_cond
        for j in range(carried_n):
            ren[body.input[2 + j].name] = carried[j]
        for j, b in enumerate(body.node):
            bname = f"{b.name or f'{name}/{b.op_type}_{j}'}/iter{k}"
            if b.op_type in SEQUENCE_OPS:
                nodes += _sequence_op(b, bname, seqs, opset, consts, ren)
                continue
            if any(ren.get(t, t) in seqs for t in b.input):
                raise UnrollError(f"{b.op_type} node {b.name!r} in Loop {name!r} reads a sequence")
            c = onnx.NodeProto()
            c.CopyFrom(b)
            c.name = bname
            del c.input[:]
            c.input.extend([ren.get(t, t) if t else "" for t in b.input])
            del c.output[:]
            c.output.extend([ren.get(t, t) if t else "" for t in b.output])
            nodes.append(c)
        carried = [ren.get(body.output[1 + j].name, body.output[1 + j].name) for j in range(carried_n)]
        for j in range(scan_n):
            scans[j].append(ren.get(body.output[1 + carried_n + j].name, body.output[1 + carried_n + j].name))
    outs = list(n.output)
    for j in range(carried_n):
        dst = outs[j] if j < len(outs) else ""
        if not dst:
            continue
        if carried[j] in seqs:
            seqs[dst] = seqs[carried[j]]
        else:
            nodes.append(helper.make_node("Identity", [carried[j]], [dst], name=f"{name}/out{j}"))
    for j in range(scan_n):
        dst = outs[carried_n + j] if carried_n + j < len(outs) else ""
        if not dst:
            continue
        if not scans[j]:
            raise UnrollError(f"Loop node {name!r} runs 0 times on these inputs: its scan output {dst!r} is empty")
        parts = [f"{dst}/part{k}" for k in range(len(scans[j]))]
        nodes += [_unsqueeze(t, p, 0, f"{name}/scan{j}/{k}", opset, consts)
                  for k, (t, p) in enumerate(zip(scans[j], parts, strict=True))]
        nodes.append(helper.make_node("Concat", parts, [dst], name=f"{name}/scan{j}", axis=0))
    return nodes


__all__ = ["SEQUENCE_OPS", "LoopTrips", "UnrollError", "has_sequences", "node_key", "sequence_loops",
           "unroll_sequences"]
