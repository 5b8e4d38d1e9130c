"""Crash workarounds: rewrites of patterns a toolkit's compiler crashes on, fails on or hangs in (issue 18).

Not placements: each avoids a failure recorded in :mod:`rkpart.targets.known_issues` or measured
with ``rkpart repro``.  All exact but ``layernorm-scale-fold``, which rounds the scale into the
norm's weight and bias.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkpart.ir.consts import constant_tensor
from rkpart.ir.edit import GraphEdit, attr
from rkpart.ir.ops import DEFAULT_DOMAINS


def layernorm_scale_fold(view: GraphEdit) -> int:
    """``Mul(T(LayerNorm(x; g, b)), c)``, ``c`` a constant scalar and ``T`` a chain of Reshape /
    Transpose that only feeds the Mul -> ``T(LayerNorm(x; g*c, b*c))`` (a scalar commutes with
    reshapes and transposes; the LayerNorm gets its own scaled copies of ``g`` and ``b``).

    The form dynamo writes for SDPA after a LayerNorm qk-norm (HunyuanDiT's cross-attention:
    ``k^T * sqrt(scale)``).  Not exact: ``(y * g + b) * c`` becomes ``y * (g * c) + b * c``, the
    scale rounded into the weight and bias (checked by the prepared-stage gate)."""
    graph = view.graph
    prod, uses, outputs = view.wiring()
    view.new_names()
    inits = {t.name: t for t in graph.initializer}
    count = 0
    for i in list(view.matches("Mul")):
        mul = graph.node[i]
        for k in (0, 1):
            c = view.const_array(mul.input[1 - k])
            if c is not None and c.size == 1 and c.ndim <= 1:
                break
        else:
            continue
        x = mul.input[k]
        while (x in prod and prod[x].op_type in ("Reshape", "Transpose") and uses.get(x, 0) == 1
               and x not in outputs):
            x = prod[x].input[0]
        ln = prod.get(x)
        if (ln is None or ln.op_type != "LayerNormalization" or uses.get(x, 0) != 1 or x in outputs
                or any(o for o in ln.output[1:]) or not all(a in inits for a in ln.input[1:] if a)
                # scale and bias are read: not when their bytes are not loaded (the partitioner's probe)
                or any(inits[a].data_location == onnx.TensorProto.EXTERNAL for a in ln.input[1:] if a)):
            continue
        for j, name in enumerate(ln.input[1:], start=1):
            if name:
                t = numpy_helper.to_array(inits[name])
                scaled = view.fresh(f"{name}_x_scale")
                graph.initializer.append(numpy_helper.from_array((t * c.reshape(())).astype(t.dtype), scaled))
                ln.input[j] = scaled
        # the Mul's input becomes its output: rename the producer's result, drop the Mul
        src, out = mul.input[k], mul.output[0]
        producer = prod[src]
        producer.output[list(producer.output).index(src)] = out
        del graph.node[i]
        prod[out] = producer
        count += 1
    return count


def strided_slices_concat(view: GraphEdit) -> int:
    """``Concat(x[.., s:s+L], x[.., s+P:s+P+L], ..., axis)``: k >= 2 constant Slices of one tensor
    along the Concat's axis, equal length ``L``, equally spaced (period ``P >= L``), in order ->
    ``Reshape(Slice(Reshape(Slice(x, s-o:s-o+k*P), [.., k, P, ..]), o:o+L), [.., k*L, ..])``, the
    offset ``o`` (0 when it fits) keeping the window of k periods inside the axis.

    Chroma's modulation picks such pieces of the approximator's output
    (``mod[:, 6:12]`` and ``mod[:, 18:24]``)."""
    graph = view.graph
    shapes = view.static_shapes()
    view.new_names()
    prod, uses, outputs = view.wiring()
    count = 0
    for i in list(view.matches("Concat")):
        cat = graph.node[i]
        found = [prod.get(x) for x in cat.input]
        slices = [s for s in found if s is not None and s.op_type == "Slice" and len(s.input) >= 4]
        if len(slices) < 2 or len(slices) != len(found):
            continue
        src = slices[0].input[0]
        shape = shapes.get(src)
        if shape is None or any(s.input[0] != src for s in slices):
            continue
        rank = len(shape)
        axis = int(attr(cat, "axis", 0)) % rank  # type: ignore[call-overload]
        spans = []
        for s in slices:
            st, en, ax = (view.const_array(s.input[j]) for j in (1, 2, 3))
            step = view.const_array(s.input[4]) if len(s.input) > 4 and s.input[4] else np.array([1])
            if any(a is None or a.size != 1 for a in (st, en, ax, step)):
                break
            assert st is not None and en is not None and ax is not None and step is not None
            dim = shape[axis]
            # ONNX Slice bounds (step 1): negative from the end, clamped to [0, dim] (x[:, -6:] is INT64_MAX)
            b, e = (min(max(v + dim if v < 0 else v, 0), dim) for v in (int(st.ravel()[0]), int(en.ravel()[0])))
            if int(ax.ravel()[0]) % rank != axis or int(step.ravel()[0]) != 1 or not b < e:
                break
            spans.append((b, e))
        else:
            if all(spans[j][0] == spans[j - 1][1] for j in range(1, len(spans))):
                _contiguous(view, i, slices, (spans[0][0], spans[-1][1]), axis, shape[axis])
                _drop_unread(graph, slices, uses, outputs)
                count += 1
                continue
            k, length = len(spans), spans[0][1] - spans[0][0]
            period = spans[1][0] - spans[0][0]
            # the k periods are read from a window [start - off, start - off + k*P) inside the axis
            off = max(0, spans[0][0] + k * period - shape[axis])
            if (period < length or any(e - b != length for b, e in spans)
                    or any(spans[j][0] != spans[0][0] + j * period for j in range(k))
                    or off > period - length or off > spans[0][0]):
                continue
            base = cat.name or cat.output[0]

            def ints(tag: str, v: list[int], base: str = base) -> str:
                return _ints(view, f"{base}/{tag}", v)

            span, periods, picked = (view.fresh(f"{base}/{t}") for t in ("span", "periods", "picked"))
            start = spans[0][0] - off
            new = [
                helper.make_node("Slice", [src, ints("span_start", [start]), ints("span_end", [start + k * period]),
                                           ints("span_axis", [axis])], [span], name=f"{base}/Slice_span"),
                helper.make_node("Reshape", [span, ints("periods_shape", [*shape[:axis], k, period,
                                                                          *shape[axis + 1:]])],
                                 [periods], name=f"{base}/Reshape_periods"),
                helper.make_node("Slice", [periods, ints("pick_start", [off]), ints("pick_end", [off + length]),
                                           ints("pick_axis", [axis + 1])], [picked], name=f"{base}/Slice_pick"),
                helper.make_node("Reshape", [picked, ints("out_shape", [*shape[:axis], k * length,
                                                                        *shape[axis + 1:]])],
                                 [cat.output[0]], name=f"{base}/Reshape_out"),
            ]
            view.replace(i, new)
            _drop_unread(graph, slices, uses, outputs)
            count += 1
    return count


def _contiguous(view: GraphEdit, i: int, slices: list[onnx.NodeProto], span: tuple[int, int], axis: int,
                dim: int) -> None:
    """``Concat(x[.., a:b], x[.., b:c], ...)`` (pieces adjacent, in order) -> ``x[.., a:c]``, or
    ``Identity(x)`` when that is all of ``x`` (HunyuanVideo's single-stream blocks split the joint
    sequence into image and text tokens, ``x[:, :-T]`` and ``x[:, -T:]``, and concatenate them again)."""
    cat, src = view.graph.node[i], slices[0].input[0]
    base = cat.name or cat.output[0]
    if span == (0, dim):
        new = [helper.make_node("Identity", [src], [cat.output[0]], name=f"{base}/Identity")]
    else:
        bounds = [_ints(view, f"{base}/span_{tag}", [v]) for tag, v in (("start", span[0]), ("end", span[1]),
                                                                         ("axis", axis))]
        new = [helper.make_node("Slice", [src, *bounds], [cat.output[0]], name=f"{base}/Slice_span")]
    view.replace(i, new)


def _ints(view: GraphEdit, name: str, v: list[int]) -> str:
    """A fresh int64 initializer named after ``name`` holding ``v``; its name."""
    fresh = view.fresh(name)
    view.graph.initializer.append(numpy_helper.from_array(np.array(v, dtype=np.int64), fresh))
    return fresh


def _drop_unread(graph: onnx.GraphProto, slices: list[onnx.NodeProto], uses: Mapping[str, int],
                 outputs: Collection[str]) -> None:
    """The Slices nothing but the replaced Concat read go (they precede it: indices >= its own are untouched)."""
    for s in slices:
        if uses.get(s.output[0], 0) == 1 and s.output[0] not in outputs and s in graph.node:
            graph.node.remove(s)


def single_output_split(view: GraphEdit) -> int:
    """``Split(x)`` with one output (dynamo's ``split_with_sizes`` of one piece the size of the
    axis) -> ``Identity(x)``: a Split into one piece is the whole tensor.

    Sana-WM's chunked linear attention splits a rank-5 tensor so and gathers one index of it; 2.3.0
    fails on the Gather's inserted reshape (``KeyError: 'select_10-rs'``) and 2.3.2 in its
    ``swap_reshape_gather`` rule ("Can not reshape"); with the Identity both build."""
    return view.replace_each("Split", lambda n: [helper.make_node("Identity", [n.input[0]], [n.output[0]],
                                                                  name=n.name)]
                             if len(n.output) == 1 and n.input and n.output[0] else None)


def _batched_constants(graph: onnx.GraphProto, min_rank: int = 3) -> set[str]:
    """Names of the graph's constants of rank >= ``min_rank`` (initializers and ``Constant`` outputs)."""
    out = {t.name for t in graph.initializer if len(t.dims) >= min_rank}
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in DEFAULT_DOMAINS and n.output:
            t = constant_tensor(n)
            if t is not None and len(t.dims) >= min_rank:
                out.add(n.output[0])
    return out


def _shared_constants(graph: onnx.GraphProto, op_type: str, min_rank: int,
                      slots: int | None = None) -> dict[str, list[tuple[int, int]]]:
    """Constant of rank >= ``min_rank`` -> (node index, input slot) of each ``op_type`` node reading it
    (in its first ``slots`` inputs), for those read by two or more such nodes."""
    batched = _batched_constants(graph, min_rank)
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, n in enumerate(graph.node):
        if n.op_type == op_type and n.domain in DEFAULT_DOMAINS:
            for slot, x in enumerate(n.input[:slots]):
                if x in batched:
                    readers.setdefault(x, []).append((k, slot))
    return {x: w for x, w in readers.items() if len({k for k, _ in w}) > 1}


def _shared_matmul_operands(graph: onnx.GraphProto) -> dict[str, list[tuple[int, int]]]:
    """Constant batched operand -> (node index, input slot) of each MatMul reading it, for those read by
    two or more."""
    return _shared_constants(graph, "MatMul", 3, slots=2)


def may_share_matmul_constants(head: onnx.ModelProto) -> bool:
    """Whether :func:`matmul_constant_per_reader` may change ``head`` (read without external data)."""
    return bool(_shared_matmul_operands(head.graph))


def _own_identity_per_reader(view: GraphEdit, shared: dict[str, list[tuple[int, int]]]) -> int:
    """Every reader of each shared constant after the first reads it through an Identity of its own,
    placed right before that reader (all of the reader's slots reading it)."""
    if not shared:
        return 0
    graph = view.graph
    view.new_names()
    before: dict[int, list[onnx.NodeProto]] = {}
    count = 0
    for x, where in shared.items():
        first = where[0][0]
        own_of: dict[int, str] = {}
        for k, slot in where:
            if k == first:
                continue
            node = graph.node[k]
            if k not in own_of:
                own_of[k] = view.fresh(f"{x}/for_{node.name or node.output[0]}")
                before.setdefault(k, []).append(helper.make_node("Identity", [x], [own_of[k]], name=own_of[k]))
                count += 1
            node.input[slot] = own_of[k]
    view.set_nodes([m for k, n in enumerate(graph.node) for m in (*before.get(k, []), n)])
    return count


def matmul_constant_per_reader(view: GraphEdit) -> int:
    """A constant batched operand (rank >= 3) that several MatMuls read: every MatMul after the
    first reads it through an Identity of its own.  The same values, no copy in the graph.

    Sana-WM's chunked linear attention starts its state from one ``zeros`` tensor that four
    MatMuls read; 2.3.0 and 2.3.2 fail in ``_p_replace_inner_dim_shuffle_to_gather`` ("Can not
    reshape from [2, 16, 16] to [2, 16]").  Run after ``dedupe-constants``, which would merge
    copies again.  2-D operands (a linear layer's weight) are left shared."""
    return _own_identity_per_reader(view, _shared_matmul_operands(view.graph))


#: the rank from which a constant several Concats read fails 2.3.x (Sana-WM's rank-5 zeros state)
WIDE_CONCAT_CONSTANT = 5


def _shared_concat_constants(graph: onnx.GraphProto) -> dict[str, list[tuple[int, int]]]:
    return _shared_constants(graph, "Concat", WIDE_CONCAT_CONSTANT)


def may_share_concat_constants(head: onnx.ModelProto) -> bool:
    """Whether :func:`concat_constant_per_reader` may change ``head`` (read without external data)."""
    return bool(_shared_concat_constants(head.graph))


def concat_constant_per_reader(view: GraphEdit) -> int:
    """A constant of rank > 4 that several Concats read: every Concat after the first reads it
    through an Identity of its own (the same values, no copy in the graph).

    Sana-WM's dynamo linear attention prepends one ``zeros`` state ``[1, 2, 1, 16, 16]`` to five
    chunk stacks: 2.3.0's and 2.3.2's constant folding then fail (ONNX Runtime in the toolkit:
    "Can't merge shape info" on a Concat of that block); with an Identity per Concat the stage
    builds, and the other shared constants need nothing.  Run after ``dedupe-constants``."""
    return _own_identity_per_reader(view, _shared_concat_constants(view.graph))


#: readers of one rank > 4 tensor from which 2.3.0's parallel-node rule fails (two build)
WIDE_READERS = 3


def _widely_read(view: GraphEdit) -> dict[str, list[int]]:
    """Computed tensors (and stage inputs) of rank > 4 -> indices of the nodes reading them, for those
    read by :data:`WIDE_READERS` nodes or more."""
    shapes = view.static_shapes()
    consts = {t.name for t in view.graph.initializer} | {
        n.output[0] for n in view.graph.node if n.op_type == "Constant" and n.output}
    out: dict[str, list[int]] = {}
    for t, ks in view.reader_indices().items():
        nodes = sorted(set(ks))
        if t and t not in consts and len(shapes.get(t, ())) > 4 and len(nodes) >= WIDE_READERS:
            out[t] = nodes
    return out


def may_read_wide_tensors(head: onnx.ModelProto) -> bool:
    """Whether :func:`wide_tensor_per_reader` may change ``head``: some tensor is read by
    :data:`WIDE_READERS` nodes or more (its rank is only known after shape inference)."""
    uses: dict[str, int] = {}
    for n in head.graph.node:
        for t in set(n.input):
            uses[t] = uses.get(t, 0) + 1
    return any(v >= WIDE_READERS for t, v in uses.items() if t)


def wide_tensor_per_reader(view: GraphEdit) -> int:
    """A computed tensor of rank > 4 read by three nodes or more: every reader after the first reads
    it through an Identity of its own, placed right after the tensor's producer.  The same values,
    no copy.

    2.3.0 lowers a rank-5 operand to rank 4 with a reshape per reader (``x_rs``, ``x_rs#1``, ...)
    and its ``_p_remove_parallel_node`` rule then fails on the third (``ValueError: 'x_rs#2' is not
    in list``).  Sana-WM's TorchScript linear attention broadcasts its gate ``[1, 2, 2, 1, 16]``
    over three rank-5 products; ``rkpart repro`` reduces the stage to 41 ops that fail so; with the
    Identities the reduction and the stage build (two readers build as they are; a Reshape per reader
    fails the same way; 2.3.2 and 2.5.0 build the reduction as it is).  Where the Identities stand
    matters to 2.3.0: placed each before its reader, the reduction still fails."""
    wide = _widely_read(view)
    if not wide:
        return 0
    view.new_names()
    graph = view.graph
    made = view.producer_indices()
    after: dict[int, list[onnx.NodeProto]] = {}  # -1: before every node (x is an input of the stage)
    count = 0
    for x, ks in wide.items():
        for k in ks[1:]:
            reader = graph.node[k]
            own = view.fresh(f"{x}/for_{reader.name or reader.output[0]}")
            after.setdefault(made.get(x, -1), []).append(helper.make_node("Identity", [x], [own], name=own))
            for slot, t in enumerate(reader.input):
                if t == x:
                    reader.input[slot] = own
            count += 1
    view.set_nodes([*after.get(-1, []), *(m for k, n in enumerate(graph.node) for m in (n, *after.get(k, [])))])
    return count


def scalar_gather_slice(view: GraphEdit) -> int:
    """``Gather(x, i, axis)`` with ``x`` an input of the stage of rank <= 4 and ``i`` a constant
    scalar -> ``Reshape(Slice(x, i, i + 1, axis), shape)``, the shape ``x``'s without ``axis``
    (exact: one index picked, its axis dropped).

    Sana-WM-refiner's attention picks its layer of the KV cache inputs (``sink_v[0]`` of
    ``[2, 1, 16, 32]``) and concatenates it with the new values: 2.3.0's constant folding then
    fails (ONNX Runtime: "Can't merge shape info ... Inferred=1 Declared=2" on that Concat).  Not
    for rank > 4: 2.3.0 runs the Reshape back from rank 6 to rank 5 on the CPU (measured on tiny
    AnyFlow-FAR's KV cache, 4 CPU layers the rounds cannot move: no op of the model is behind them)."""
    shapes = view.static_shapes()
    inputs = {i.name for i in view.graph.input} - {t.name for t in view.graph.initializer}

    def one(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        if len(n.input) != 2 or not n.output[0] or n.input[0] not in inputs:
            return None
        idx, shape = view.const_array(n.input[1]), shapes.get(n.input[0])
        if idx is None or idx.ndim != 0 or not shape or len(shape) > 4 or idx.dtype.kind not in "iu":
            return None
        axis = int(attr(n, "axis", 0)) % len(shape)  # type: ignore[call-overload]
        i = int(idx) + (shape[axis] if int(idx) < 0 else 0)
        if not 0 <= i < shape[axis]:
            return None
        base = n.name or n.output[0]
        picked = view.fresh(f"{base}/picked")
        start, end, ax = (_ints(view, f"{base}/{t}", [v]) for t, v in (("start", i), ("end", i + 1), ("axis", axis)))
        out_shape = _ints(view, f"{base}/shape", [*shape[:axis], *shape[axis + 1:]])
        return [helper.make_node("Slice", [n.input[0], start, end, ax], [picked], name=f"{base}/Slice"),
                helper.make_node("Reshape", [picked, out_shape], [n.output[0]], name=f"{base}/Reshape")]

    return view.replace_each("Gather", one)


def _rms_chain(view: GraphEdit, end: onnx.NodeProto, prod: Mapping[str, onnx.NodeProto]) -> list[onnx.NodeProto] | None:
    """The nodes of an RMSNorm ending at ``end``, in data order, as the toolkits' ``replace_rms_norm``
    matches it: ``Pow(x, 2)`` (or ``Mul(x, x)``), ``ReduceMean``, ``Add`` of a constant, ``Sqrt``, then
    ``Mul(x, Div(1, .))``, ``Mul(x, Reciprocal(.))`` or ``Div(x, .)``; else None."""
    def made(t: str, op: str) -> onnx.NodeProto | None:
        n = prod.get(t)
        return n if n is not None and n.op_type == op and n.domain in DEFAULT_DOMAINS else None

    for k in (0, 1) if end.op_type == "Mul" else (0,):
        x, inv = end.input[k], end.input[1 - k]
        if end.op_type == "Div":
            sq, scale = made(inv, "Sqrt"), []
        elif (d := made(inv, "Div")) is not None and view.scalar(d.input[0]) == 1.0:
            sq, scale = made(d.input[1], "Sqrt"), [d]
        elif (r := made(inv, "Reciprocal")) is not None:
            sq, scale = made(r.input[0], "Sqrt"), [r]
        else:
            continue
        add = made(sq.input[0], "Add") if sq is not None else None
        if sq is None or add is None:
            continue
        for j in (0, 1):
            mean = made(add.input[j], "ReduceMean")
            if mean is None or view.const_array(add.input[1 - j]) is None:
                continue
            sqr = made(mean.input[0], "Pow") or made(mean.input[0], "Mul")
            if sqr is None or sqr.input[0] != x or not (
                    (sqr.op_type == "Pow" and view.scalar(sqr.input[1]) == 2.0)
                    or (sqr.op_type == "Mul" and sqr.input[1] == x)):
                continue
            return [sqr, mean, add, sq, *scale, end]
    return None


def _scales_by_constant(view: GraphEdit, n: onnx.NodeProto) -> bool:
    """``n`` is a ``Mul`` with a constant operand (what ``replace_rms_norm`` takes for a norm's weight)."""
    return n.op_type == "Mul" and n.domain in DEFAULT_DOMAINS and any(
        view.const_array(t) is not None for t in n.input)


def rms_norm_contiguous(view: GraphEdit) -> int:
    """Each RMSNorm's nodes (:func:`_rms_chain`) listed one after the other and right before the first
    node that reads the norm, where they were not.  A reordering only: the same nodes and tensors.

    The toolkits' ``replace_rms_norm`` takes the norm's weight from the nodes *listed* after the norm,
    not from its readers: with an unrelated ``Mul`` by a constant listed right after it (RFD4's
    weightless norm of the stream, then the conditioning norm's weight product), 2.5.0 takes that
    Mul into the norm and then loops for ever; 2.3.0 and 2.3.2 fail ("Can not reshape from [8, 32]
    to [8, 16]").  Only a norm with such a Mul (:func:`_scales_by_constant`, not one of the norm's)
    listed between its first node and its first reader is moved; one whose intermediate tensors
    something else reads is left alone; each norm moves at most once."""
    done: set[str] = set()
    count = 0
    while True:
        nodes = list(view.graph.node)
        prod = {o: n for n in nodes for o in n.output}
        readers = view.reader_indices()
        pos = {id(n): i for i, n in enumerate(nodes)}
        for end in nodes:
            if end.op_type not in ("Mul", "Div") or end.domain not in DEFAULT_DOMAINS or not end.output \
                    or end.output[0] in done:
                continue
            chain = _rms_chain(view, end, prod)
            if chain is None:
                continue
            at = [pos[id(n)] for n in chain]
            inner = {o for n in chain[:-1] for o in n.output}
            if any(r not in at for t in inner for r in readers.get(t, [])) or inner & view.outputs:
                continue
            after = readers.get(end.output[0], [])
            first = min(after, default=len(nodes))
            if not any(_scales_by_constant(view, nodes[i]) for i in range(at[0], first) if i not in at):
                continue
            done.add(end.output[0])
            ids = {id(n) for n in chain}
            rest = [n for n in nodes[:first] if id(n) not in ids]
            view.set_nodes([*rest, *chain, *nodes[first:]])
            count += 1
            break
        else:
            return count
