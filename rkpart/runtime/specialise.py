"""Shapes that depend on data, observed in one ONNX Runtime run on representative inputs.

A model with static inputs can still have tensors whose shape only the data decides: text
context gathered from a boolean mask through ``NonZero``, an ``If`` on the mask whose
branches differ in shape, a sequence op's ``ConcatFromSequence``.  Shape inference leaves
them symbolic and :func:`rkpart.ir.load.load_model` refuses the model
(:class:`~rkpart.ir.load.DataDependentShapeError`).  :func:`load_specialised` runs the model
on the user's inputs with those tensors added as graph outputs, and loads it again
specialised to what came out (``data_shapes``).  An ``If`` among the data-dependent ops is
replaced by the branch its condition took (the plan runs only on inputs equal, where the
condition depends on them, to the ones it was made on: :meth:`Plan.check_specialised
<rkpart.plan.plan.Plan.check_specialised>`), so no stage has to hold control flow.

Weights are never read twice: the scratch model is the parsed graph *without* its external
data (ONNX Runtime reads that from the model's folder itself), and the source file is never
written.  A model with inline weights is serialised once for the session.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from rkpart.errors import InvalidModelError, UserError
from rkpart.io import input_digest
from rkpart.ir import ModelGraph, load_model
from rkpart.ir.load import DataDependentShapeError, _reads, graph_of, parse_model
from rkpart.ir.tensors import TensorType
from rkpart.ir.unroll import SEQUENCE_OPS, UnrollError, has_sequences, sequence_loops, unroll_sequences

#: runs in all: each one resolves what the last one's specialised graph still left symbolic
#: (an inlined ``If`` branch may hold a ``NonZero`` of its own)
_MAX_ROUNDS = 4


def load_specialised(model: str | os.PathLike[str], feeds: Mapping[str, np.ndarray] | None, *,
                     input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> ModelGraph:
    """:func:`~rkpart.ir.load.load_model`, with shapes the data decides taken from runs on ``feeds``.

    A model whose shapes all follow from its input shapes loads as usual (``feeds`` unused, no
    run).  Otherwise, with ``feeds``, the unresolved tensors are observed under ONNX Runtime,
    an ``If`` among the data-dependent ops is replaced by the branch it took, and the model is
    loaded again specialised to the shapes seen.  The graph's ``specialised`` records, per
    data-dependent op, the op, its node name, the tensor and its shape (and for an ``If`` the
    branch), and the sha256 of each model input it depends on.  Without ``feeds`` the
    :class:`DataDependentShapeError` naming the op and ``--inputs`` propagates.
    """
    path = Path(model)
    try:
        return load_model(path, input_shapes=input_shapes)
    except DataDependentShapeError as e:
        if feeds is None:
            raise
        err = e
    proto = parse_model(path)
    _check_feeds(proto, feeds)
    original = onnx.ModelProto()
    original.CopyFrom(proto)  # an If's condition is read here (pruned once inlined)
    shapes: dict[str, TensorType] = {}
    seen: dict[str, tuple[str, str, str]] = {}  # tensor -> (op, node, tensor), first seen first
    branches: dict[str, str] = {}  # If output -> branch taken
    trips: dict[str, int] = {}  # sequence Loop -> the trip count the inputs gave it
    trip_deps: set[str] = set()
    mg: ModelGraph | None = None
    if has_sequences(proto):
        for src in err.sources:
            seen.setdefault(src[2], src)
        trips, trip_deps = _unroll(proto, path, feeds, original)
        try:
            mg = graph_of(proto, path, input_shapes=input_shapes)
        except DataDependentShapeError as again:
            err = again
    rounds = 0
    while mg is None:
        if rounds == _MAX_ROUNDS:
            raise InvalidModelError(f"{path}: shapes still depend on the data after {_MAX_ROUNDS} runs on --inputs: "
                                    f"{err}")
        rounds += 1
        for src in err.sources:
            seen.setdefault(src[2], src)
        ifs = [n for n in proto.graph.node if n.op_type == "If" and any(o in err.tensors for o in n.output)]
        got = observe(proto, path.parent, feeds, [*err.tensors, *(n.input[0] for n in ifs)])
        shapes.update({t: v for t in err.tensors if isinstance(v := got[t], tuple)})
        for n in ifs:
            branch = "then_branch" if bool(np.asarray(got.pop(n.input[0] + _VALUE)).reshape(-1)[0]) else "else_branch"
            for o in n.output:
                branches[o] = branch
            _inline(proto, n, branch)
        try:
            mg = graph_of(proto, path, input_shapes=input_shapes, data_shapes=shapes)
        except DataDependentShapeError as again:
            err = again
    unrolled_outputs = {o for lp in sequence_loops(original) for o in lp.outputs}
    records = []
    for op, node, tensor in seen.values():
        shape = mg.tensor_types[tensor][1] if tensor in mg.tensor_types else shapes[tensor][1]
        if 0 in shape:
            # a zero-sized tensor: no NPU build holds one, and the plan would be made for nothing
            raise InvalidModelError(f"{path}: on these --inputs {op} node {node!r} gives {tensor!r} the empty shape "
                                    f"{list(shape)}; rkpart does not specialise a plan to an empty tensor: use "
                                    "--inputs for which it holds values")
        rec: dict[str, object] = {"op": op, "node": node, "tensor": tensor, "shape": list(shape)}
        if tensor in branches:
            rec["branch"] = branches[tensor]
        if op in SEQUENCE_OPS or tensor in unrolled_outputs:
            # unrolled: the shapes follow from the trip counts alone, and they from these inputs
            rec["trips"] = dict(sorted(trips.items()))
            rec["inputs"] = {n: input_digest(feeds[n]) for n in mg.inputs if n in trip_deps}
            records.append(rec)
            continue
        deps = set(_input_deps(mg, tensor))
        if tensor in branches:  # the branch is what the condition chose: its inputs count too
            deps |= _proto_deps(original, tensor)
        rec["inputs"] = {n: input_digest(feeds[n]) for n in mg.inputs if n in deps}
        records.append(rec)
    return dataclasses.replace(mg, specialised=tuple(records))


def _unroll(proto: onnx.ModelProto, path: Path, feeds: Mapping[str, np.ndarray],
            original: onnx.ModelProto) -> tuple[dict[str, int], set[str]]:
    """Unroll ``proto``'s sequence loops (:mod:`rkpart.ir.unroll`) for the trip counts a run on
    ``feeds`` gives them; returns the trip counts and the model inputs they depend on."""
    loops = sequence_loops(proto)
    for lp in loops:
        if not lp.trip_count:
            raise InvalidModelError(f"{path}: Loop node {lp.node!r} builds a sequence without a trip count; "
                                    "rkpart unrolls only loops that run a counted number of times")
    names = [t for lp in loops for t in (lp.trip_count, lp.cond) if t]
    got = observe(proto, path.parent, feeds, names, values=names) if names else {}
    trips: dict[str, int] = {}
    deps: set[str] = set()
    for lp in loops:
        m = int(np.asarray(got[lp.trip_count + _VALUE]).reshape(-1)[0])
        go = True if not lp.cond else bool(np.asarray(got[lp.cond + _VALUE]).reshape(-1)[0])
        trips[lp.node] = max(0, m) if go else 0
        for t in (lp.trip_count, lp.cond):
            if t:
                deps |= _proto_deps(original, t)
    try:
        unroll_sequences(proto, trips)
    except UnrollError as e:
        raise InvalidModelError(f"{path}: {e}") from None
    return trips, deps


#: suffix of the observed *value* of an ``If`` condition in :func:`observe`'s result
_VALUE = "\0value"


def observe(proto: onnx.ModelProto, folder: Path, feeds: Mapping[str, np.ndarray],
            tensors: Sequence[str], values: Sequence[str] = ()) -> dict[str, TensorType | np.ndarray]:
    """Run ``proto`` (its external data in ``folder``) on ``feeds`` with ``tensors`` as extra outputs.

    Returns each tensor's (dtype, shape); a tensor that is an ``If`` condition, or one of
    ``values``, also gives its value under ``name + _VALUE``.
    """
    from rkpart.runtime.ort import make_session, ort_errors

    m = onnx.ModelProto()
    m.CopyFrom(proto)
    g = m.graph
    have = {o.name for o in g.output}
    names = list(dict.fromkeys(tensors))
    for t in names:
        if t not in have and t not in {i.name for i in g.input}:
            g.output.append(onnx.ValueInfoProto(name=t))
    inits = {t.name for t in g.initializer}
    feed = {vi.name: np.asarray(feeds[vi.name]) for vi in g.input if vi.name not in inits}
    with ort_errors("whole model on --inputs"):
        sess = make_session(m.SerializeToString(), external_folder=folder)
        out = sess.run(names, feed)
    res: dict[str, TensorType | np.ndarray] = {}
    conds = {n.input[0] for n in g.node if n.op_type == "If"} | set(values)
    for n, a in zip(names, out, strict=True):
        arr = np.asarray(a)
        res[n] = (arr.dtype.name, tuple(int(d) for d in arr.shape))
        if n in conds:
            res[n + _VALUE] = arr
    return res


def observe_shapes(model: str | Path, feeds: Mapping[str, np.ndarray], tensors: Sequence[str]) -> dict[str, TensorType]:
    """The dtype and shape of each of ``tensors`` when ``model`` runs on ``feeds``."""
    proto = parse_model(model)
    _check_feeds(proto, feeds)
    got = observe(proto, Path(model).parent, feeds, tensors)
    return {t: v for t, v in got.items() if isinstance(v, tuple)}


def _check_feeds(proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """One-line :class:`UserError` for a missing model input or one of the wrong dtype or shape."""
    g = proto.graph
    inits = {t.name for t in g.initializer}
    real = [vi for vi in g.input if vi.name not in inits]
    for vi in real:
        if vi.name not in feeds:
            raise UserError(f"--inputs has no array {vi.name!r} (model inputs: {', '.join(v.name for v in real)})")
        a = np.asarray(feeds[vi.name])
        tt = vi.type.tensor_type
        want = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        if a.dtype != want or len(a.shape) != len(dims) or any(
                d is not None and d != s for d, s in zip(dims, a.shape, strict=True)):
            raise UserError(f"--inputs: input {vi.name!r} is {a.dtype}{list(a.shape)}, the model wants "
                            f"{np.dtype(want)}{[d if d is not None else '?' for d in dims]}")


def _inline(proto: onnx.ModelProto, node: onnx.NodeProto, branch: str) -> None:
    """Replace the ``If`` ``node`` of ``proto`` by the nodes of its ``branch``, in place.

    ONNX names are unique across a model and its subgraphs, so the branch's nodes can join
    the outer graph as they are; an ``Identity`` per output gives each ``If`` output its
    producer.  The condition's producer stays (it may have other readers; the load prunes it
    otherwise).
    """
    body = next(helper.get_attribute_value(a) for a in node.attribute if a.name == branch)
    g = proto.graph
    at = list(g.node).index(node)
    new = list(body.node) + [helper.make_node("Identity", [o.name], [t], name=f"{node.name or 'If'}/{branch}/{k}")
                             for k, (o, t) in enumerate(zip(body.output, node.output, strict=True)) if t]
    nodes = list(g.node)
    nodes[at:at + 1] = new
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(body.initializer)


def _input_deps(mg: ModelGraph, tensor: str) -> list[str]:
    """The model inputs ``tensor`` is computed from (all of them if it is not found)."""
    p = mg.producer.get(tensor)
    if p is None:
        return list(mg.inputs)
    ops = (mg.ancestors([p]) | {p}) if p in mg.ops else {p}
    # an If/Loop body's reads of outer tensors too (the op's own proto, copied)
    read = set().union(*(_reads(mg.node_proto(i)) if mg.op(i).op_type in ("If", "Loop", "Scan")
                         else set(mg.op(i).inputs) for i in ops))
    return [n for n in mg.inputs if n in read]


def _proto_deps(proto: onnx.ModelProto, tensor: str) -> set[str]:
    """The model inputs ``tensor`` of ``proto`` is computed from (subgraph reads included)."""
    g = proto.graph
    producer = {t: n for n in g.node for t in n.output if t}
    inputs = {i.name for i in g.input}
    out: set[str] = set()
    todo, done = [tensor], set()
    while todo:
        t = todo.pop()
        if t in done:
            continue
        done.add(t)
        if t in inputs:
            out.add(t)
        n = producer.get(t)
        if n is not None:
            todo.extend(_reads(n))
    return out


__all__ = ["load_specialised", "observe", "observe_shapes"]
