"""NPU rewrites: equivalent forms of patterns a toolkit would place on the CPU, or store padded.

Each row of :data:`rkpart.targets.rewrites.REWRITES` naming one of these cites the measured
placement that justifies it, and says whether it is exact: all are but ``reciprocal-mul-div``
(one rounding fewer) and ``reduce-sum-matmul`` (the MatMul's summation order).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import cast

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkpart.ir.consts import constant_tensor, inline_bytes
from rkpart.ir.edit import GraphEdit, attr


def reciprocal(view: GraphEdit) -> int:
    """``Reciprocal(v)`` -> ``Div(1, v)``."""
    def one(n: onnx.NodeProto) -> list[onnx.NodeProto]:
        c = view.add_constant(f"{n.name or n.output[0]}/one",
                              np.array(1.0, dtype=helper.tensor_dtype_to_np_dtype(view.elem(n.input[0]))))
        return [helper.make_node("Div", [c, n.input[0]], [n.output[0]], name=n.name or None)]
    return view.replace_each("Reciprocal", one)


#: element types the quotient form is checked in: the product and the quotient differ by one
#: rounding, within the prepared-stage check's 1e-6 relative bound in float32, not in float16
_QUOTIENT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def _inverse_of(view: GraphEdit, node: onnx.NodeProto) -> str | None:
    """``v`` when ``node`` is ``Reciprocal(v)`` or ``Div(1, v)`` with a scalar constant 1, else ``None``."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Reciprocal" and len(node.input) == 1:
        return node.input[0]
    if node.op_type == "Div" and len(node.input) == 2:
        one = view.const_array(node.input[0])
        if one is not None and one.ndim == 0 and one.dtype.kind == "f" and float(one) == 1.0:
            return node.input[1]
    return None


def reciprocal_mul(view: GraphEdit) -> int:
    """``Mul(a, Reciprocal(v))`` (or ``Mul(a, Div(1, v))``, either operand order) -> ``Div(a, v)``,
    in float32/float64; the inverse stays while anything else reads it.

    Not where ``v`` is a ``Sqrt``: an RMSNorm's ``x * rsqrt(...)`` keeps the form the toolkits'
    norm fusions were measured on (reciprocal-to-div, norm-residual-sub)."""
    inverses: set[str] = set()  # the inverses read by a rewritten product
    count = 0
    for n in view.graph.node:
        if n.op_type != "Mul" or n.domain not in ("", "ai.onnx") or len(n.input) != 2:
            continue
        if view.elem(n.output[0]) not in _QUOTIENT_TYPES:
            continue
        for k in (1, 0):
            inv = view.parent(n, k)
            v = None if inv is None else _inverse_of(view, inv)
            src = view.producer(v) if v is not None else None
            if v is not None and (src is None or src.op_type != "Sqrt"):
                inverses.add(n.input[k])
                a = n.input[1 - k]
                n.op_type = "Div"
                del n.input[:]
                n.input.extend([a, v])
                count += 1
                break
    if count:
        view.drop_unread_nodes(inverses)
    return count


_SQRT2 = 1.4142135623730951


def _is_half_sqrt2(view: GraphEdit, name: str) -> bool:
    """``name`` is a one-element float16 constant holding float16(sqrt 2) = 1.4140625."""
    v = view.const_array(name)
    return v is not None and v.dtype == np.float16 and v.size == 1 and v.reshape(()) == np.float16(_SQRT2)


def erf_sqrt2_f32(view: GraphEdit) -> int:
    """Erf-GELU in float16: ``Erf(Div(x, c))`` with ``c`` = float16(sqrt 2) -> ``c`` made by
    ``Cast(float32 sqrt 2 -> float16)`` (the same float16 value under ONNX Runtime, bit for bit)."""
    graph = view.graph
    index = view.producer_indices()
    view.new_names()
    casts: dict[int, onnx.NodeProto] = {}  # Div index -> the Cast to insert before it
    for n in graph.node:
        if n.op_type != "Erf" or n.domain not in ("", "ai.onnx"):
            continue
        j = index.get(n.input[0])
        if j is None or j in casts:
            continue
        div = graph.node[j]
        if div.op_type != "Div" or len(div.input) != 2 or not _is_half_sqrt2(view, div.input[1]):
            continue
        base = div.name or div.output[0]
        f32 = view.fresh(f"{base}/sqrt2_f32")
        graph.initializer.append(numpy_helper.from_array(np.array(_SQRT2, dtype=np.float32), f32))
        half = view.fresh(f"{base}/sqrt2")
        casts[j] = helper.make_node("Cast", [f32], [half], to=onnx.TensorProto.FLOAT16, name=f"{base}/Cast_sqrt2")
        div.input[1] = half
    if casts:
        nodes: list[onnx.NodeProto] = []
        for k, n in enumerate(graph.node):
            if k in casts:
                nodes.append(casts[k])
            nodes.append(n)
        view.set_nodes(nodes)
    return len(casts)


def split_chunked_linear(view: GraphEdit) -> int:
    """A ``Gemm`` whose output is only read as column chunks (``emb.chunk(k, -1)`` of an AdaLN
    modulation: Slices of the last axis with constant bounds, or one Split of the last axis)
    -> one Gemm per chunk, on the chunk's rows of B (columns when ``transB`` = 0) and of C.

    Each output element is the same dot product and bias add as before.  Matches ``transA`` = 0
    with a 2-D constant B and a constant (or no) C.
    """
    graph = view.graph
    shapes = view.static_shapes()
    outputs = view.outputs
    readers = view.reader_indices()  # tensor -> indices of the nodes that read it
    view.new_names()
    edits: dict[int, list[onnx.NodeProto]] = {}  # linear's index -> its replacement
    drop: set[int] = set()  # indices of the Slices / Splits the new Gemms replace
    for k, lin in enumerate(graph.node):
        if lin.op_type != "Gemm" or lin.domain not in ("", "ai.onnx") or lin.output[0] in outputs \
                or attr(lin, "transA", 0):
            continue
        w = view.const_array(lin.input[1])
        if w is None or w.ndim != 2:
            continue
        trans_b = bool(attr(lin, "transB", 0))
        n_out = w.shape[0] if trans_b else w.shape[1]
        bias = None
        if len(lin.input) > 2 and lin.input[2]:
            bias = view.const_array(lin.input[2])
            if bias is None or bias.size not in (1, n_out) or bias.ndim > 1:
                continue
        out_shape = shapes.get(lin.output[0])
        if out_shape is None or out_shape[-1] != n_out:
            continue
        head, mids = lin.output[0], []  # mids: unit-axis reshapes between the Gemm and its chunks
        while len(readers.get(head, [])) == 1 and _keeps_rows(graph.node[readers[head][0]], shapes, n_out) \
                and graph.node[readers[head][0]].output[0] not in outputs:
            mids.append(readers[head][0])
            head = graph.node[mids[-1]].output[0]
        out_shape = shapes[head]
        slices = [graph.node[j] for j in readers.get(head, [])]
        chunks = _split_ranges(view, slices[0], len(out_shape), n_out) if len(slices) == 1 else None
        if chunks is None and len(slices) >= 2:
            ranges = [slice_range(view, sl, len(out_shape), n_out) for sl in slices]
            chunks = [(sl.output[0], *r) for sl, r in zip(slices, ranges, strict=True) if r is not None]
            if len(chunks) != len(slices):
                chunks = None
        if chunks:
            base = lin.name or lin.output[0]
            new = []
            for c, (out, a, b) in enumerate(chunks):
                wc = w[a:b] if trans_b else w[:, a:b]
                wn = view.fresh(f"{base}/chunk{c}_weight")
                graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(wc), wn))
                ins = [lin.input[0], wn]
                if bias is not None:
                    bn = view.fresh(f"{base}/chunk{c}_bias")
                    bc = bias if bias.size == 1 else bias[a:b]
                    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(bc), bn))
                    ins.append(bn)
                attrs = {a_.name: helper.get_attribute_value(a_) for a_ in lin.attribute}
                y = view.fresh(f"{base}/chunk{c}") if mids else out
                new.append(helper.make_node(lin.op_type, ins, [y], name=f"{base}_chunk{c}", **attrs))
                for i, j in enumerate(mids):  # the same unit axes, on the chunk's columns
                    sn = view.fresh(f"{base}/chunk{c}_shape{i}")
                    dims = [*shapes[graph.node[j].output[0]][:-1], b - a]
                    graph.initializer.append(numpy_helper.from_array(np.array(dims, np.int64), sn))
                    z = out if i == len(mids) - 1 else view.fresh(f"{base}/chunk{c}_rs{i}")
                    new.append(helper.make_node("Reshape", [y, sn], [z], name=f"{base}_chunk{c}_rs{i}"))
                    y = z
            drop.update(mids)
            drop.update(readers[head])
            edits[k] = new
    if not edits:
        return 0
    nodes: list[onnx.NodeProto] = []
    for k, n in enumerate(graph.node):
        if k in edits:
            nodes.extend(edits[k])
        elif k not in drop:
            nodes.append(n)
    view.set_nodes(nodes)
    view.drop_unread_initializers()  # the whole weights and biases, now read by nobody
    return len(edits)


def _keeps_rows(n: onnx.NodeProto, shapes: dict[str, list[int]], n_out: int) -> bool:
    """``n`` only inserts or removes unit axes before the last one (of size ``n_out``): an Unsqueeze,
    Squeeze or Reshape such as PRX's ``emb.unsqueeze(1)`` before ``chunk``, which commutes with
    slicing the last axis."""
    if n.op_type not in ("Unsqueeze", "Squeeze", "Reshape") or n.domain not in ("", "ai.onnx"):
        return False
    si, so = shapes.get(n.input[0]), shapes.get(n.output[0])
    if not si or not so or si[-1] != n_out or so[-1] != n_out:
        return False
    return [d for d in si[:-1] if d != 1] == [d for d in so[:-1] if d != 1]


def _split_ranges(view: GraphEdit, sp: onnx.NodeProto, rank: int,
                  n: int) -> list[tuple[str, int, int]] | None:
    """[(output, start, end)] of a Split of the last axis into static parts (unused outputs left out)."""
    if sp.op_type != "Split" or sp.domain not in ("", "ai.onnx"):
        return None
    if int(attr(sp, "axis", 0)) not in (-1, rank - 1):  # type: ignore[call-overload]
        return None
    k = len(sp.output)
    sizes: object = attr(sp, "split", None)
    if len(sp.input) > 1 and sp.input[1]:
        sizes = view.value(sp.input[1])
        if sizes is None:
            return None
    if sizes is None:
        step = -(-n // k)
        sizes = [step] * (k - 1) + [n - step * (k - 1)]
    bounds = [int(v) for v in np.asarray(sizes).reshape(-1)]
    if len(bounds) != k or sum(bounds) != n or min(bounds) <= 0:
        return None
    out, a = [], 0
    for name, size in zip(sp.output, bounds, strict=True):
        if name:
            out.append((name, a, a + size))
        a += size
    return out or None


def slice_range(view: GraphEdit, sl: onnx.NodeProto, rank: int, n: int) -> tuple[int, int] | None:
    """(start, end) of a Slice of the last axis of a tensor of ``n`` columns, constant bounds (folded when computed
    from constants) and step 1, else None (``split-chunked-linear`` and ``wide-matmul-columns`` read slices by it)."""
    if sl.op_type != "Slice" or sl.domain not in ("", "ai.onnx") or len(sl.input) < 3:
        return None
    vals = [view.value(sl.input[j]) if len(sl.input) > j and sl.input[j] else None for j in range(1, 5)]
    starts, ends, axes, steps = vals
    if starts is None or ends is None or starts.size != 1 or ends.size != 1:
        return None
    if axes is not None and (axes.size != 1 or int(axes.reshape(())) not in (-1, rank - 1)):
        return None
    if axes is None and rank != 1:
        return None
    if steps is not None and (steps.size != 1 or int(steps.reshape(())) != 1):
        return None
    a, b = int(starts.reshape(())), int(ends.reshape(()))
    a = max(0, min(n, a + n if a < 0 else a))
    b = max(0, min(n, b + n if b < 0 else b))
    return (a, b) if a < b else None


def nan_guard(view: GraphEdit, broadcast_fill: bool = True) -> int:
    """The exporters' guard after a bool-masked Softmax (scaled_dot_product_attention with a bool
    mask)::

        p = Softmax(s + Where(mask, 0, -inf));  out = Where(IsNaN(p), 0, p)

    A row the mask hides entirely is all -inf, so Softmax gives NaN there and the guard makes it
    0.  Rewritten without IsNaN::

        valid = Clip(MatMul(Where(mask, 1, 0), ones[K, 1]), 0, 1)      # 1: row has a key, else 0
        fill  = -((valid * 65504) ^ 16) * ones[1, .., 1, K]             # -inf if valid, else 0
        p     = Softmax(s + Where(mask, 0, fill));  out = p * valid

    (``^ 16`` is four squarings: 65504^16 overflows float32 and float16 to inf, 0 stays 0.)
    Rows with a key get the same Softmax input, so the same bits (times 1); hidden rows get a
    finite Softmax, times 0.  Exact for finite scores.  ``broadcast_fill=False`` leaves out the
    ``* ones`` (the first form, which 2.5.0 segfaults on; kept to test compile's retry with a
    real crash).
    """
    graph = view.graph
    if view.opset < 13:  # Softmax and Clip changed meaning at 13 / 11
        return 0
    shapes = view.static_shapes()
    index = view.producer_indices()
    readers = view.reader_indices()
    outputs = view.outputs
    view.new_names()
    before: dict[int, list[onnx.NodeProto]] = {}  # index of the Add -> nodes to insert before it
    replace: dict[int, onnx.NodeProto] = {}  # index of the guard's Where -> its replacement
    drop: set[int] = set()
    for ki, isnan in enumerate(graph.node):
        if isnan.op_type != "IsNaN" or isnan.domain not in ("", "ai.onnx"):
            continue
        p = isnan.input[0]
        ks = index.get(p)
        r_nan = readers.get(isnan.output[0], [])
        if ks is None or len(r_nan) != 1 or isnan.output[0] in outputs or p in outputs:
            continue
        sm, kw = graph.node[ks], r_nan[0]
        w = graph.node[kw]
        if sm.op_type != "Softmax" or w.op_type != "Where" or w.input[0] != isnan.output[0] or w.input[2] != p \
                or view.scalar(w.input[1]) != 0.0 or sorted(readers.get(p, [])) != sorted([ki, kw]):
            continue
        x = sm.input[0]
        rank = len(shapes.get(x, []))
        ka = index.get(x)
        axis = attr(sm, "axis", -1)
        if ka is None or not rank or not isinstance(axis, int) or axis not in (-1, rank - 1) \
                or readers.get(x) != [ks] or x in outputs:
            continue
        add = graph.node[ka]
        if add.op_type != "Add" or ka in before:
            continue
        for slot in (0, 1):
            km = index.get(add.input[slot])
            m = graph.node[km] if km is not None else None
            if m is None or m.op_type != "Where":
                continue
            a, b = view.scalar(m.input[1]), view.scalar(m.input[2])
            if a is not None and b is not None and 0.0 in (a, b) and min(a, b) < 0 \
                    and len(shapes.get(m.input[0], [])) >= 1:
                break
        else:
            continue
        if math.isfinite(min(a, b)):
            # a finite fill (dynamo writes float32's lowest): no row is all -inf, Softmax gives no NaN
            # (float32 scores above -2e31), the guard does nothing.  Not in float16: s - 65504
            # overflows to -inf once s < -16.
            if view.elem(x) == onnx.TensorProto.FLOAT:
                replace[kw] = helper.make_node("Identity", [p], [w.output[0]], name=w.name or None)
                drop.add(ki)
            continue
        cond, zero_first = m.input[0], a == 0.0
        k_keys = shapes[cond][-1]
        elem = view.elem(x)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        base = isnan.name or isnan.output[0]

        def c(tag: str, v: float | np.ndarray, base: str = base, dtype: np.dtype = dtype) -> str:
            name = view.fresh(f"{base}/{tag}")
            graph.initializer.append(numpy_helper.from_array(np.asarray(v, dtype=dtype), name))
            return name

        def t(tag: str, base: str = base) -> str:
            return view.fresh(f"{base}/{tag}")

        mk = helper.make_node
        one, zero = c("one", 1.0), c("zero", 0.0)
        mf, cnt, valid, fill, m2 = t("keys"), t("count"), t("valid"), t("fill"), t("mask_add")
        new = [mk("Where", [cond, one, zero] if zero_first else [cond, zero, one], [mf], name=f"{base}/keys"),
               mk("MatMul", [mf, c("ones", np.ones((k_keys, 1)))], [cnt], name=f"{base}/count"),
               mk("Clip", [cnt, zero, one], [valid], name=f"{base}/valid")]
        cur = t("big")
        new.append(mk("Mul", [valid, c("fp16_max", 65504.0)], [cur], name=f"{base}/big"))
        for q in range(4):
            nxt = t(f"square{q}")
            new.append(mk("Mul", [cur, cur], [nxt], name=f"{base}/square{q}"))
            cur = nxt
        new.append(mk("Mul", [cur, c("minus_one", -1.0)], [fill], name=f"{base}/fill"))
        # the fill broadcast to the mask's shape before the Where (times 1: the same values): 2.5.0
        # segfaults (convert_exmatmul_to_conv) on a Where whose computed branch broadcasts
        if broadcast_fill:
            full, ones_k = t("fill_full"), c("mask_ones", np.ones([1] * (len(shapes[cond]) - 1) + [k_keys]))
            new.append(mk("Mul", [fill, ones_k], [full], name=f"{base}/fill_full"))
            fill = full
        keep = m.input[1] if zero_first else m.input[2]
        new.append(mk("Where", [cond, keep, fill] if zero_first else [cond, fill, keep], [m2], name=f"{base}/mask"))
        add.input[slot] = m2
        before[ka] = new
        replace[kw] = mk("Mul", [p, valid], [w.output[0]], name=w.name or None)
        drop.add(ki)
    if not replace:
        return 0
    nodes: list[onnx.NodeProto] = []
    for k, n in enumerate(graph.node):
        nodes.extend(before.get(k, ()))
        if k in replace:
            nodes.append(replace[k])
        elif k not in drop:
            nodes.append(n)
    view.set_nodes(nodes)
    return len(replace)


def interleave(view: GraphEdit) -> int:
    """A chain of ScatterND that fills a tensor with k updates interleaved along one axis
    (``out[..., 0::2] = a; out[..., 1::2] = b``: RoPE in Wan and others) ->
    ``Reshape(Concat(Unsqueeze(a, ax+1), Unsqueeze(b, ax+1), axis=ax+1), shape)``.

    Only chains whose indices are constants and cover every element exactly once are rewritten;
    the data tensor they start from is then irrelevant (its shape is the result's shape).
    Intermediate results that something else reads stay computed.
    """
    count = 0
    while True:
        done = _interleave_once(view)
        if not done:
            return count
        count += 1


def _interleave_once(view: GraphEdit) -> bool:
    graph = view.graph
    prod, uses, outputs = view.wiring()
    shapes = view.static_shapes()
    for last in graph.node:
        if last.op_type != "ScatterND" or attr(last, "reduction", b"none") not in (b"none", "none"):
            continue
        # walk back through the data inputs: ScatterND (through Identity) producing it
        chain = [last]
        seq = [last]  # every node from the head of the chain to ``last``, Identities included
        data = last.input[0]
        while True:
            p = prod.get(data)
            hops = []
            while p is not None and p.op_type == "Identity":
                hops.append(p)
                data = p.input[0]
                p = prod.get(data)
            if p is None or p.op_type != "ScatterND" or attr(p, "reduction", b"none") not in (b"none", "none"):
                break
            seq[0:0] = [p, *reversed(hops)]
            chain.insert(0, p)
            data = p.input[0]
        if len(chain) < 2:
            continue
        shape = shapes.get(chain[0].input[0])
        idxs = [view.const_array(n.input[1]) for n in chain]
        if shape is None or any(a is None for a in idxs):
            continue
        plan = _interleave_plan(shape, [a for a in idxs if a is not None])
        if plan is None:
            continue
        axis, order = plan
        view.new_names()
        base = last.name or last.output[0]
        new: list[onnx.NodeProto] = []
        ax_name = view.fresh(f"{base}/unsq_axis")
        graph.initializer.append(numpy_helper.from_array(np.array([axis + 1], dtype=np.int64), ax_name))
        parts = []
        for c in order:
            upd = chain[c].input[2]
            u = view.fresh(f"{base}/unsq{c}")
            new.append(helper.make_node("Unsqueeze", [upd, ax_name], [u], name=f"{base}/Unsqueeze_{c}"))
            parts.append(u)
        cat = view.fresh(f"{base}/interleaved")
        new.append(helper.make_node("Concat", parts, [cat], axis=axis + 1, name=f"{base}/Concat"))
        shp = view.fresh(f"{base}/shape")
        graph.initializer.append(numpy_helper.from_array(np.array(shape, dtype=np.int64), shp))
        new.append(helper.make_node("Reshape", [cat, shp], [last.output[0]], name=f"{base}/Reshape"))
        # intermediate results read by something else (TorchScript slices them; a fused stage
        # may output them): written the same way with the data's constant values in the offsets
        # not filled yet, else they stay computed by the original chain
        direct = [n for n in seq[:-1] if uses.get(n.output[0], 0) > 1 or n.output[0] in outputs]
        fill = view.value(chain[0].input[0]) if direct else None
        at: dict[str, list[onnx.NodeProto]] = {last.output[0]: new}  # node output -> its replacement
        if direct and fill is not None and fill.shape == tuple(shape) \
                and all(n.op_type == "ScatterND" for n in direct):
            blocks = fill.reshape([*shape[:axis], shape[axis] // len(order), len(order), *shape[axis + 1:]])
            for n in direct:
                t = next(i for i, m in enumerate(chain) if m.output[0] == n.output[0])
                ib = n.name or n.output[0]
                parts = []
                for off, c in enumerate(order):
                    if c <= t:
                        u = view.fresh(f"{ib}/unsq{c}")
                        at.setdefault(n.output[0], []).append(helper.make_node(
                            "Unsqueeze", [chain[c].input[2], ax_name], [u], name=f"{ib}/Unsqueeze_{c}"))
                    else:
                        u = view.fresh(f"{ib}/data{off}")
                        graph.initializer.append(numpy_helper.from_array(
                            np.ascontiguousarray(np.take(blocks, [off], axis=axis + 1)), u))
                    parts.append(u)
                cat_t = view.fresh(f"{ib}/interleaved")
                at.setdefault(n.output[0], []).extend([
                    helper.make_node("Concat", parts, [cat_t], axis=axis + 1, name=f"{ib}/Concat"),
                    helper.make_node("Reshape", [cat_t, shp], [n.output[0]], name=f"{ib}/Reshape")])
            drop = {n.output[0] for n in seq}
        else:
            drop = {last.output[0]}
            needed = False
            for n in reversed(seq[:-1]):
                needed = needed or uses.get(n.output[0], 0) > 1 or n.output[0] in outputs
                if not needed:
                    drop.add(n.output[0])
        kept = []
        for n in graph.node:
            if n.output and n.output[0] in at:
                kept.extend(at[n.output[0]])  # where the replaced node was: its inputs exist by then
            elif not (n.output and n.output[0] in drop):
                kept.append(n)
        view.set_nodes(kept)
        return True
    return False


def _interleave_plan(shape: list[int], idxs: list[np.ndarray]) -> tuple[int, list[int]] | None:
    """(axis, order of the chain's updates by offset) when ``idxs`` interleave along one axis."""
    k = len(idxs)
    q = int(idxs[0].shape[-1])
    if any(int(a.shape[-1]) != q for a in idxs) or q > len(shape):
        return None
    lead = shape[:q]
    for axis in range(q):
        if lead[axis] % k:
            continue
        grid = list(lead)
        grid[axis] //= k
        order: dict[int, int] = {}
        for i, a in enumerate(idxs):
            if list(a.shape[:-1]) != grid:
                break
            coords = np.stack(np.meshgrid(*[np.arange(n) for n in grid], indexing="ij"), axis=-1)
            off = int(a[(0,) * len(grid)][axis]) if a.size else -1
            if not 0 <= off < k or off in order:
                break
            coords[..., axis] = coords[..., axis] * k + off
            if not np.array_equal(a.astype(np.int64), coords):
                break
            order[off] = i
        else:
            return axis, [order[c] for c in range(k)]
    return None


def pad_concat(view: GraphEdit) -> int:
    """Constant-mode Pad with constant pads and value -> Concat with constant blocks, axis by axis.

    Sana's linear attention pads V with a row of ones (``F.pad(v, (0, 0, 0, 1), value=1.0)``).
    """
    graph = view.graph
    shapes = view.static_shapes()

    def one(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        mode = attr(n, "mode", b"constant")
        if mode not in (b"constant", "constant") or (len(n.input) > 3 and n.input[3]):
            return None
        shape = shapes.get(n.input[0])
        pads = view.value(n.input[1]) if len(n.input) > 1 and n.input[1] else None
        if shape is None or pads is None or pads.size != 2 * len(shape) or (pads < 0).any():
            return None
        value = view.value(n.input[2]) if len(n.input) > 2 and n.input[2] else np.zeros(())
        if value is None or value.size != 1:
            return None
        dtype = onnx.helper.tensor_dtype_to_np_dtype(view.elem(n.input[0]))
        rank = len(shape)
        base = n.name or n.output[0]
        cur, dims = n.input[0], list(shape)
        new: list[onnx.NodeProto] = []
        axes = [a for a in range(rank) if pads[a] or pads[a + rank]]
        for k, a in enumerate(axes):
            parts = []
            for side, width in (("begin", int(pads[a])), ("end", int(pads[a + rank]))):
                if side == "end":
                    parts.append(cur)
                if width:
                    block = list(dims)
                    block[a] = width
                    c = view.fresh(f"{base}/{side}{a}")
                    graph.initializer.append(numpy_helper.from_array(
                        np.full(block, value.reshape(()), dtype=dtype), c))
                    parts.append(c)
            out = n.output[0] if k == len(axes) - 1 else view.fresh(f"{base}/axis{a}")
            new.append(helper.make_node("Concat", parts, [out], axis=a, name=f"{base}/Concat_{a}"))
            cur = out
            dims[a] += int(pads[a]) + int(pads[a + rank])
        return new or [helper.make_node("Identity", [n.input[0]], [n.output[0]], name=base)]
    return view.replace_each("Pad", one)


#: the most pieces slice-reverse writes for one axis (a Slice each): a flip of a few chunks or heads,
#: not of a sequence
MAX_REVERSED = 32


def slice_reverse(view: GraphEdit) -> int:
    """A Slice with a negative step (``torch.flip``, ``x[::-1]``; the TorchScript export writes a flip
    so) on an axis of static size -> one positive-step Slice for its other axes, then per reversed
    axis a Concat of one-element Slices in the order the step visits them (at most
    :data:`MAX_REVERSED`): the same elements copied (bit-exact, any type).  Bounds read as ONNX
    does (negative from the end, clamped): Python's ``slice.indices``."""
    shapes = view.static_shapes()

    def one(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        shape = shapes.get(n.input[0])
        if shape is None or len(n.input) < 5 or not n.input[4]:
            return None
        given = [view.const_array(n.input[k]) for k in (1, 2, 4)]
        given.append(view.const_array(n.input[3]) if n.input[3] else np.arange(len(shape)))
        if any(v is None for v in given):
            return None
        starts, ends, steps, axes = ([int(x) for x in np.asarray(v).reshape(-1)] for v in given)
        if not len(starts) == len(ends) == len(steps) == len(axes) or not any(st < 0 for st in steps):
            return None
        rank = len(shape)
        entries = [(a % rank, b, e, st) for a, b, e, st in zip(axes, starts, ends, steps, strict=True)]
        if len({a for a, *_ in entries}) != len(entries):
            return None
        reversed_ = []
        for a, b, e, st in entries:
            if st < 0:
                idx = list(range(*slice(b, e, st).indices(shape[a])))
                if not idx or len(idx) > MAX_REVERSED:
                    return None
                reversed_.append((a, idx))
        base = n.name or n.output[0]
        new: list[onnx.NodeProto] = []
        cur = n.input[0]
        forward = [(a, b, e, st) for a, b, e, st in entries if st > 0]
        if forward:
            cur_out = view.fresh(f"{base}/forward")
            ins = [view.add_constant(f"{base}/forward_{t}", np.array([x[k] for x in forward], np.int64))
                   for k, t in ((1, "starts"), (2, "ends"), (0, "axes"), (3, "steps"))]
            new.append(helper.make_node("Slice", [cur, *ins], [cur_out], name=f"{base}/forward"))
            cur = cur_out
        for j, (a, idx) in enumerate(reversed_):
            # names that extend no other name by "_<k>": 2.3.0 read a piece "flip/axis1_1" as a copy of the
            # axis constant "flip/axis1" (ONNX Runtime in its constant folding: Concat of int64 and float)
            ax = view.add_constant(f"{base}/reverse{a}_axis", np.array([a], np.int64))
            parts = []
            for i in idx:
                lo = view.add_constant(f"{base}/reverse{a}_from{i}", np.array([i], np.int64))
                hi = view.add_constant(f"{base}/reverse{a}_to{i + 1}", np.array([i + 1], np.int64))
                part = view.fresh(f"{base}/reverse{a}_piece{i}")
                new.append(helper.make_node("Slice", [cur, lo, hi, ax], [part], name=part))
                parts.append(part)
            out = n.output[0] if j == len(reversed_) - 1 else view.fresh(f"{base}/reversed{a}")
            new.append(helper.make_node("Concat", parts, [out], axis=a, name=f"{base}/reversed{a}"))
            cur = out
        return new
    return view.replace_each("Slice", one)


#: the most elements of a constant ScatterND index tensor read as a whole (larger ones are followed to the
#: per-axis aranges they are expanded from: CogView4's [1, 32, 1024, 128, 4] is 134 MB of int64)
_MAX_INDEX_ELEMENTS = 1 << 20


def slice_assign_concat(view: GraphEdit) -> int:
    """``ScatterND(x, idx, u)`` writing one contiguous range of one axis, every position of the other axes
    (TorchScript's export of ``x[:, :, a:b, :] = u``: CogView4's RoPE of the image tokens written back into q and
    k) -> ``Concat(x[.., :a, ..], u, x[.., b:, ..])`` on that axis: the same values copied (bit-exact).

    The indices are the meshgrid of the range: a constant, or (as the export computes them) a ``Concat`` over the
    last axis of ``Unsqueeze(Expand(c_k, S), -1)``, ``c_k`` a small constant that varies along axis ``k`` alone.
    An update read through a ``Reshape``/``Expand`` to its own shape (the export's) is read directly."""
    shapes = view.static_shapes()
    prod, _, _ = view.wiring()
    view.new_names()
    replaced: set[str] = set()

    def one(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        if attr(n, "reduction", b"none") not in (b"none", "none") or len(n.input) != 3:
            return None
        data, idx, upd = n.input
        ds, us = shapes.get(data), shapes.get(upd)
        if ds is None or us is None or len(ds) != len(us):
            return None
        ranges = _index_ranges(view, prod, idx, us, ds)
        if ranges is None:
            return None
        cut = [a for a, (start, stop) in enumerate(ranges) if (start, stop) != (0, ds[a])]
        if len(cut) != 1:
            return None  # several axes cut (no such export seen), or the whole tensor written
        a = cut[0]
        start, stop = ranges[a]
        src = upd
        while (p := prod.get(src)) is not None and p.op_type in ("Reshape", "Expand") \
                and shapes.get(p.input[0]) == us:
            src = p.input[0]  # a copy of the update in its own shape
        base = n.name or n.output[0]
        axis = view.add_constant(f"{base}/axis", np.array([a], np.int64))
        new: list[onnx.NodeProto] = []
        parts: list[str] = []
        for tag, lo, hi in (("before", 0, start), ("after", stop, ds[a])):
            if hi > lo:
                piece = view.fresh(f"{base}/{tag}")
                new.append(helper.make_node(
                    "Slice", [data, view.add_constant(f"{base}/{tag}_from", np.array([lo], np.int64)),
                              view.add_constant(f"{base}/{tag}_to", np.array([hi], np.int64)), axis],
                    [piece], name=piece))
                parts.append(piece)
            if tag == "before":
                parts.append(src)
        new.append(helper.make_node("Concat", parts, [n.output[0]], axis=a, name=f"{base}/Concat"))
        replaced.update((idx, upd))
        return new

    count = view.replace_each("ScatterND", one)
    if count:
        _drop_unread_closure(view, replaced)
    return count


def _index_ranges(view: GraphEdit, prod: Mapping[str, onnx.NodeProto], idx: str, us: list[int], ds: list[int]
                  ) -> list[tuple[int, int]] | None:
    """Per axis of the data, ``(start, stop)`` when ScatterND indices ``idx`` (shaped ``us + [rank]``) are
    the meshgrid of contiguous ranges inside ``ds``; else None."""
    r = len(ds)
    axes: list[np.ndarray | None] = []
    v = view.const_array(idx)
    if v is not None:
        if v.size > _MAX_INDEX_ELEMENTS or list(v.shape) != [*us, r]:
            return None
        axes = [_grid_line(v[..., k], us, k) for k in range(r)]
    else:
        cat = prod.get(idx)
        if cat is None or cat.op_type != "Concat" or len(cat.input) != r \
                or int(attr(cat, "axis", 0)) not in (-1, r):  # type: ignore[call-overload]
            return None
        axes = [_index_component(view, prod, part, us, k) for k, part in enumerate(cat.input)]
    out = []
    for k, line in enumerate(axes):
        if line is None:
            return None
        line = np.where(line < 0, line + ds[k], line)
        start = int(line[0]) if line.size else 0
        if line.size != us[k] or not np.array_equal(line, start + np.arange(us[k])) \
                or start < 0 or start + us[k] > ds[k]:
            return None
        out.append((start, start + us[k]))
    return out


def _grid_line(c: np.ndarray, us: list[int], k: int) -> np.ndarray | None:
    """The values of ``c`` (integers, broadcast to ``us``) along axis ``k`` when it varies along no other axis."""
    r = len(us)
    if c.ndim > r or c.dtype.kind not in "iu":
        return None
    c = c.reshape((1,) * (r - c.ndim) + c.shape)
    if any(c.shape[j] not in (1, us[j]) for j in range(r)):
        return None
    line = c[tuple(slice(None) if j == k else slice(0, 1) for j in range(r))]
    if not np.array_equal(np.broadcast_to(line, c.shape), c):
        return None  # it varies along another axis
    return np.broadcast_to(line.reshape(-1), (us[k],)).astype(np.int64)


def _index_component(view: GraphEdit, prod: Mapping[str, onnx.NodeProto], name: str, us: list[int], k: int
                     ) -> np.ndarray | None:
    """The index of axis ``k`` along that axis when ``name`` (``us + [1]``) is a constant that varies along axis
    ``k`` alone (the partitioner folds a small one), or ``Unsqueeze(Expand(c, us), -1)`` with ``c`` such a constant
    (the export's form); else None."""
    r = len(us)
    v = view.const_array(name)
    if v is not None:
        if v.size > _MAX_INDEX_ELEMENTS or list(v.shape) != [*us, 1]:
            return None
        return _grid_line(v[..., 0], us, k)
    uns = prod.get(name)
    if uns is None or uns.op_type != "Unsqueeze":
        return None
    ax = view.value(uns.input[1]) if len(uns.input) > 1 and uns.input[1] else attr(uns, "axes", None)
    if ax is None or [int(a) for a in np.asarray(ax).reshape(-1)] not in ([-1], [r]):
        return None
    exp = prod.get(uns.input[0])
    if exp is None or exp.op_type != "Expand":
        return None
    target = view.value(exp.input[1])
    c = view.value(exp.input[0])
    if target is None or c is None or [int(t) for t in np.asarray(target).reshape(-1)] != list(us):
        return None
    return _grid_line(c, us, k)


def _drop_unread_closure(view: GraphEdit, tensors: set[str]) -> None:
    """Remove the nodes computing ``tensors`` once nothing reads them, and then what only they read."""
    todo = set(tensors)
    while todo:
        read = {i for n in view.graph.node for i in n.input} | view.outputs
        gone = {t for t in todo if t not in read}
        dead = [n for n in view.graph.node if n.output and all(o not in read for o in n.output)
                and any(o in gone for o in n.output)]
        if not dead:
            break
        todo = {i for n in dead for i in n.input if i}
        view.set_nodes(n for n in view.graph.node if not any(n is d for d in dead))
    view.drop_unread_initializers()


#: ops an RMSNorm's scale passes through between its ReduceMean and the weight Mul
_RMS_PATH = ("Mul", "Div", "Sqrt", "Add", "Reciprocal", "Cast", "Pow")


def _rms_normed(prod: dict[str, onnx.NodeProto], name: str, depth: int = 6) -> bool:
    """``name`` is computed from a ReduceMean through at most ``depth`` RMSNorm ops (Mul, Div, Sqrt ...)."""
    n = prod.get(name)
    if n is None or depth == 0:
        return False
    if n.op_type == "ReduceMean":
        return True
    return n.op_type in _RMS_PATH and any(_rms_normed(prod, i, depth - 1) for i in n.input if i)


def norm_residual_sub(view: GraphEdit) -> int:
    """``Add(x, Mul(r, w))``, ``r`` an RMSNorm's normalised value and ``w`` its constant weight (a
    residual added to a norm's output with no modulation in between: Lumina2's context refiner,
    ``x + norm2(attn(x))``) -> ``Sub(x, Mul(r, -w))``: the same bits (negation is exact)."""
    graph = view.graph
    prod, uses, outputs = view.wiring()
    view.new_names()
    count = 0
    for add in graph.node:
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2:
            continue
        for k in (1, 0):
            mul = view.parent(add, k)
            if mul is None or mul.op_type != "Mul" or uses.get(mul.output[0]) != 1 or mul.output[0] in outputs:
                continue
            j = next((j for j in (1, 0) if view.const_array(mul.input[j]) is not None), None)
            if j is None or not _rms_normed(prod, mul.input[1 - j]):
                continue
            w = view.const_array(mul.input[j])
            if w is None or w.dtype.kind != "f" or w.ndim != 1:  # a norm's weight, not RoPE's cos table
                continue
            neg = view.fresh(f"{mul.input[j]}_neg")
            graph.initializer.append(numpy_helper.from_array(-w, neg))
            mul.input[j] = neg
            x = add.input[1 - k]
            add.op_type = "Sub"
            del add.input[:]
            add.input.extend([x, mul.output[0]])
            count += 1
            break
    return count


def tile_broadcast(view: GraphEdit) -> int:
    """``Tile(x, r)``, ``r`` constant, ``x`` of size 1 on every axis ``r`` repeats ->
    ``Mul(x, ones(r))``: the broadcast of a multiplication by one (bit-exact).  GQA's
    ``k.unsqueeze(3).repeat(1, 1, 1, n_rep, 1)`` (Lumina2)."""
    shapes = view.static_shapes()

    def one(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        reps = view.const_array(n.input[1])
        shape = shapes.get(n.input[0])
        elem = view.elem(n.input[0])
        if (reps is None or shape is None or reps.ndim != 1 or reps.size != len(shape)
                or elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
                or any(r > 1 and d != 1 for r, d in zip(reps.tolist(), shape, strict=True))):
            return None
        return _times_ones(view, n, elem, [int(r) for r in reps.tolist()])
    return view.replace_each("Tile", one)


def _times_ones(view: GraphEdit, n: onnx.NodeProto, elem: int, shape: list[int]) -> list[onnx.NodeProto]:
    """``Mul(n's data input, ones(shape))`` computing ``n``'s output (a broadcast written as a product)."""
    base = n.name or n.output[0]
    ones = view.add_constant(f"{base}/ones", np.ones(shape, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem)))
    return [helper.make_node("Mul", [n.input[0], ones], [n.output[0]], name=f"{base}/Mul_ones")]


def _reduce_last_axis(view: GraphEdit, n: onnx.NodeProto, rank: int, keepdims: int | None = 0) -> bool:
    """``n`` (a ReduceSum) sums its input's last axis (of ``rank``) alone, keeping it as ``keepdims``
    says (``None``: either way)."""
    if (keepdims is not None and attr(n, "keepdims", 1) != keepdims) or attr(n, "noop_with_empty_axes", 0) != 0:
        return False
    if len(n.input) > 1 and n.input[1]:
        axes = view.const_array(n.input[1])
        got = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    else:
        a = attr(n, "axes", None)
        got = None if a is None else [int(v) for v in cast("list[int]", a)]
    return got is not None and len(got) == 1 and got[0] in (-1, rank - 1)


def reduce_sum_matmul(view: GraphEdit) -> int:
    """``ReduceSum(x, last axis)``, ``x`` float ``[..., D]`` with a static shape ->
    ``MatMul(x, ones[D, 1])`` (keepdims=1), then a Reshape dropping that axis (keepdims=0): the
    same D products by one and sum per row (the summation order is the MatMul's; checked by
    the prepared-stage gate).  Sana-WM's linear attention ``(k * gate).sum(-1)`` (TorchScript)."""
    shapes = view.static_shapes()

    def one(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        shape = shapes.get(n.input[0])
        elem = view.elem(n.input[0])
        if (shape is None or len(shape) < 2 or shape[-1] < 1
                or elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
                or not _reduce_last_axis(view, n, len(shape), keepdims=None)):
            return None
        base = n.name or n.output[0]
        ones = view.add_constant(f"{base}/ones",
                                 np.ones((shape[-1], 1), dtype=onnx.helper.tensor_dtype_to_np_dtype(elem)))
        if attr(n, "keepdims", 1):
            return [helper.make_node("MatMul", [n.input[0], ones], [n.output[0]], name=f"{base}/MatMul_ones")]
        summed = view.fresh(f"{base}/summed")
        drop = view.add_constant(f"{base}/shape", np.array(shape[:-1], np.int64))
        return [helper.make_node("MatMul", [n.input[0], ones], [summed], name=f"{base}/MatMul_ones"),
                helper.make_node("Reshape", [summed, drop], [n.output[0]], name=f"{base}/drop_axis")]
    return view.replace_each("ReduceSum", one)


def rope_pair_matrix(view: GraphEdit) -> int:
    """RoPE as a 2x2 matrix per pair, ``ReduceSum(Mul(C, X), -1)`` with ``C`` ``[..., 2, 2]`` and
    ``X`` the pairs ``[..., 1, 2]`` (Kandinsky 5: ``(rope * x.view(..., -1, 1, 2)).sum(-1)``) ->
    ``x * A + swap(x) * B``, ``x`` the pairs ``[..., 2]``, ``swap`` exchanging each pair's two
    values (Slices and a Concat, Flux's form), ``A`` the matrices' diagonals and ``B`` their other
    entries: the same two products and one sum per value (bit-exact).

    ``C`` a constant: ``A`` and ``B`` are constants.  ``C`` computed in the stage (Kandinsky 6's
    dynamo export builds it from the positions there: ``Cos``/``Sin``/``Neg`` stacked and
    reshaped), with a static shape: ``A`` and ``B`` are read out of it, ``C`` viewed as
    ``[..., 4]`` (``B`` is its middle two entries, ``A`` the first and last), so the sum 2.5.0
    cannot build (``ReduceSum`` -> ``Reshape`` -> ``Transpose``: "Can not reshape", ``rkpart
    repro``) goes all the same.
    """
    graph = view.graph
    shapes = view.static_shapes()
    prod, _, _ = view.wiring()
    view.new_names()
    products: set[str] = set()
    count = 0
    for k in list(view.matches("ReduceSum")):
        n = graph.node[k]
        mul = prod.get(n.input[0])
        if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.input) != 2:
            continue
        found = _pair_matrix_operands(view, shapes, mul)
        if found is None:
            continue
        j, c, cs = found
        x_name = mul.input[1 - j]
        xs = shapes[x_name]
        if not _reduce_last_axis(view, n, max(len(cs), len(xs))):
            continue
        base = n.name or n.output[0]
        lead = list(xs[:-2])
        axis = len(lead)
        pairs, first, second, swapped, xa, sb = (view.fresh(f"{base}/{t}") for t in
                                                 ("pairs", "first", "second", "swapped", "diag", "cross"))
        shape = view.add_constant(f"{base}/pairs_shape", np.array([*lead, 2], np.int64))
        zero, one, two, ax = (view.add_constant(f"{base}/{t}", np.array([v], np.int64))
                              for t, v in (("zero", 0), ("one", 1), ("two", 2), ("axis", axis)))
        new: list[onnx.NodeProto] = []
        if c is not None:
            ca = view.add_constant(f"{base}/diag_c", np.stack([c[..., 0, 0], c[..., 1, 1]], -1))
            cb = view.add_constant(f"{base}/cross_c", np.stack([c[..., 0, 1], c[..., 1, 0]], -1))
        else:  # read out of the computed matrices, viewed as [..., 4]: [c00, c01, c10, c11]
            c4, c00, c11, ca, cb = (view.fresh(f"{base}/{t}") for t in ("c4", "c00", "c11", "diag_c", "cross_c"))
            c4_shape = view.add_constant(f"{base}/c4_shape", np.array([*cs[:-2], 4], np.int64))
            last = view.add_constant(f"{base}/last", np.array([-1], np.int64))
            at = {v: view.add_constant(f"{base}/at{v}", np.array([v], np.int64)) for v in (0, 1, 3, 4)}
            new += [helper.make_node("Reshape", [mul.input[j], c4_shape], [c4], name=f"{base}/c4"),
                    helper.make_node("Slice", [c4, at[0], at[1], last], [c00], name=f"{base}/c00"),
                    helper.make_node("Slice", [c4, at[3], at[4], last], [c11], name=f"{base}/c11"),
                    helper.make_node("Concat", [c00, c11], [ca], axis=-1, name=f"{base}/diag"),
                    helper.make_node("Slice", [c4, at[1], at[3], last], [cb], name=f"{base}/cross")]
        new += [helper.make_node("Reshape", [x_name, shape], [pairs], name=f"{base}/pairs"),
                helper.make_node("Slice", [pairs, zero, one, ax], [first], name=f"{base}/first"),
                helper.make_node("Slice", [pairs, one, two, ax], [second], name=f"{base}/second"),
                helper.make_node("Concat", [second, first], [swapped], axis=axis, name=f"{base}/swap"),
                helper.make_node("Mul", [pairs, ca], [xa], name=f"{base}/Mul_diag"),
                helper.make_node("Mul", [swapped, cb], [sb], name=f"{base}/Mul_cross"),
                helper.make_node("Add", [xa, sb], [n.output[0]], name=f"{base}/Add")]
        view.replace(k, new)
        products.add(mul.output[0])
        count += 1
    if count:  # a product the ReduceSum alone read goes with it
        view.drop_unread_nodes(products)
    return count


def _pair_matrix_operands(view: GraphEdit, shapes: Mapping[str, list[int]], mul: onnx.NodeProto
                          ) -> tuple[int, np.ndarray | None, tuple[int, ...]] | None:
    """``(j, C, C's shape)`` when ``mul.input[j]`` is the matrices ``[..., 2, 2]`` (``C`` its value when
    constant, else ``None``) and the other operand the pairs ``[..., 1, 2]``, both of one float type
    with static shapes; else ``None``.  A constant operand must be the matrices (a constant table of
    pairs times computed matrices is no RoPE measured)."""
    consts = [j for j in (0, 1) if view.const_array(mul.input[j]) is not None]
    for j in consts[:1] or [0, 1]:
        c = view.const_array(mul.input[j])
        x_name = mul.input[1 - j]
        xs = shapes.get(x_name)
        elem = view.elem(x_name)
        cs = tuple(c.shape) if c is not None else shapes.get(mul.input[j])
        if (xs is None or cs is None or elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
                or len(cs) < 2 or len(xs) < 2 or tuple(cs[-2:]) != (2, 2) or list(xs[-2:]) != [1, 2]):
            continue
        if c is not None and c.dtype != onnx.helper.tensor_dtype_to_np_dtype(elem):
            continue
        if c is None and view.elem(mul.input[j]) != elem:
            continue
        return j, c, tuple(int(d) for d in cs)
    return None


#: the largest ``ones`` constant expand-broadcast adds (elements): a broadcast over a few heads
#: costs a few bytes; an attention mask expanded to [B, H, T, T] would cost megabytes of weights
_MAX_ONES = 1 << 16


def expand_broadcast(view: GraphEdit) -> int:
    """``Expand(x, s)``, ``s`` constant, ``x`` float with a static shape -> ``Mul(x, ones(o))``,
    ``o`` the output shape with 1 wherever ``x`` already has the size: the same broadcast
    (bidirectional, as Expand's), multiplied by one (bit-exact).  GQA's head repeat in dynamo
    exports, ``k[:, :, None].expand(b, h, n_rep, t, d)`` (Stable Audio)."""
    shapes = view.static_shapes()

    def one(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        target = view.const_array(n.input[1])
        shape = shapes.get(n.input[0])
        elem = view.elem(n.input[0])
        if (target is None or shape is None or target.ndim != 1 or target.dtype.kind not in "iu"
                or elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
                or any(t < 1 for t in target.tolist()) or any(d < 1 for d in shape)):
            return None
        rank = max(len(shape), target.size)
        x = [1] * (rank - len(shape)) + list(shape)
        t = [1] * (rank - target.size) + [int(v) for v in target.tolist()]
        if any(a != b and 1 not in (a, b) for a, b in zip(x, t, strict=True)):
            return None  # not broadcastable: the model is wrong, leave it to the toolkit's error
        ones_shape = [b if a == 1 else 1 for a, b in zip(x, t, strict=True)]
        if (ones_shape == [1] * rank and rank == len(shape)) or math.prod(ones_shape) > _MAX_ONES:
            return None  # expands nothing, or the constant would cost more than the CPU layer
        return _times_ones(view, n, elem, ones_shape)
    return view.replace_each("Expand", one)




#: elementwise ops: every input is data, broadcast right-aligned; the output has the inputs' rank
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Cast", "Neg", "Sqrt",
                          "Reciprocal", "Exp", "Abs", "Relu", "Sigmoid", "Tanh", "Erf", "Identity", "Sin",
                          "Cos", "Softplus", "Sign"})
#: ops whose first input is the data and whose other inputs are constant parameters
_AXIS_OPS = frozenset({"Reshape", "Slice", "Split", "Squeeze", "Unsqueeze", "Gather", "Softmax", "ReduceMean",
                       "ReduceSum", "ReduceMax", "ReduceMin", "Concat", "LayerNormalization"})
#: axis ops that may also work on the heads or tokens axis: moved with that axis renumbered (CogView4's RoPE
#: of the image tokens, ``Slice`` of the tokens axis and ``Concat`` back with the text tokens)
_SWAPPABLE = frozenset({"Slice", "Split", "Concat"})


def _swap12(shape: list[int] | tuple[int, ...]) -> list[int]:
    s = list(shape)
    s[1], s[2] = s[2], s[1]
    return s


def _op_axes(view: GraphEdit, n: onnx.NodeProto, rank_in: int, rank_out: int) -> list[int] | None:
    """The axes ``n`` (an op of :data:`_AXIS_OPS` but Reshape) works on, made non-negative; None when they are
    not known constants, or every axis, or its parameter inputs are not constants."""
    op = n.op_type
    for p in n.input[1:] if op != "Concat" else ():
        if p and view.value(p) is None:
            return None
    if op == "LayerNormalization":
        if len(n.output) > 1 and any(n.output[1:]):
            return None  # its mean / inverse deviation outputs are per row of the original layout
        first = int(attr(n, "axis", -1))  # type: ignore[call-overload]
        first = first + rank_in if first < 0 else first
        return list(range(first, rank_in))
    if op in ("Split", "Gather", "Softmax", "Concat"):
        axes = [int(attr(n, "axis", -1 if op == "Softmax" else 0))]  # type: ignore[call-overload]
        rank = rank_in
    elif op == "Slice":
        if len(n.input) < 4 or not n.input[3]:
            return None  # every axis, in order
        axes, rank = [int(a) for a in np.asarray(view.value(n.input[3])).reshape(-1)], rank_in
    else:  # Squeeze / Unsqueeze / Reduce*: axes as an attribute (older opsets) or the second input
        raw: object = attr(n, "axes", None)
        if len(n.input) > 1 and n.input[1]:
            raw = view.value(n.input[1])
        if raw is None:
            return None  # every axis (a full reduce, a squeeze of every 1)
        axes = [int(a) for a in np.asarray(raw).reshape(-1)]
        rank = rank_out if op == "Unsqueeze" else rank_in
        if op.startswith("Reduce") and not axes:
            return None
    return [a + rank if a < 0 else a for a in axes]


def _axes_beyond_heads(view: GraphEdit, n: onnx.NodeProto, rank_in: int, rank_out: int) -> bool:
    """The axes ``n`` (an op of :data:`_AXIS_OPS` but Reshape) works on are all >= 3 (so the batch,
    heads and tokens axes pass through it unchanged); its parameter inputs are constants."""
    axes = _op_axes(view, n, rank_in, rank_out)
    return axes is not None and all(a >= 3 for a in axes)


def _axes_swapped(view: GraphEdit, n: onnx.NodeProto, rank: int) -> list[int] | None:
    """The axes of ``n`` (a :data:`_SWAPPABLE` op on a rank-``rank`` tensor) with 1 and 2 exchanged, when it works
    on the heads or tokens axis (and not the batch): the same op in the tokens layout; else None."""
    axes = _op_axes(view, n, rank, rank)
    if axes is None or not any(a in (1, 2) for a in axes) or 0 in axes:
        return None
    return [{1: 2, 2: 1}.get(a, a) for a in axes]


def heads_table_layout(view: GraphEdit, computed_only: bool = False) -> int:
    """Elementwise work on attention heads ``x[B, H, T, D]`` with a constant broadcast over the heads
    (RoPE's cos / sin tables ``[1, 1, T, D]``) -> the same work on ``x[B, T, H, D]``, so that the
    table is ``[1, T, 1, D]``.

    The compiler lays a 4-D tensor out as NC1HWC2 with C = axis 1 padded to C2 (8 in float16, 16
    in int8): a ``[1, 1, T, D]`` table is stored at 16 bytes per element in both precisions, a
    ``[1, T, 1, D]`` one at 2 (float16) or 1 (int8).  Rewritten: the heads ``Transpose(perm 0,2,1,3)``
    is moved down through every op after it that leaves the batch, heads and tokens axes alone
    (elementwise ops with constants, Cast, RMSNorm's ReduceMean over D, Reshape / Split / Slice /
    Squeeze / Unsqueeze / Gather / Concat / Softmax of the axes from 3 on), swapping axes 1 and 2
    of the constants on the way; the first op that needs the heads layout (the attention MatMul,
    another Transpose) reads a Transpose of the result.  A permutation moved across ops that act
    on each (b, h, t) row alike: the same values, bit for bit.  Applied only where it moves such a
    table (a constant whose axis 1 is 1 and axis 2 is not).

    A table computed in the stage from constants alone (Cosmos-Predict2 at its real width: ``Cos``/``Sin``
    of the position grid, copied into the stage as ops) counts as a constant: it is read through a Reshape
    (or a Transpose) in the graph, which the compiler folds with it.  There the rewrite is also a placement:
    2.5.0 runs the Transpose it puts after the q/k RMSNorm's ``exNorm`` in the heads layout on the CPU at
    head dim 128 (``bench/layout_probe.py --pattern rms-rope``), not in the tokens layout.

    Where it moves such a computed table, the Transpose also moves past a per-head ``LayerNormalization`` and
    ``Slice`` / ``Split`` / ``Concat`` of the heads or tokens axis (their axis renumbered): CogView4 rotates the
    image tokens alone (``Slice`` of the tokens, the RoPE, ``Concat`` with the text tokens after
    ``slice-assign-concat``), and 2.5.0 runs the Transpose after its LayerNorm's ``exNorm`` on the CPU in the
    heads layout (``--pattern norm-rope-slice``).  With constant tables a LayerNorm stops the move (HunyuanDiT's
    builds on the NPU as it is; the tokens layout there is not measured), and on 2.3.x (``computed_only``) always:
    2.3.0 built CogView4's attention at its width with the norm in the tokens layout out of memory (killed at 14.6
    GB of RSS; 3.6 GB as exported), though a 4-head probe built with 0 CPU layers.
    """
    graph = view.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return 0  # a subgraph may read a tensor of the region by name
    shapes = view.static_shapes()
    count = 0
    made: dict[tuple[str, int], str] = {}  # (constant, rank) -> its copy with axes 1 and 2 swapped
    view.new_names()
    seeds = [n.output[0] for n in graph.node if n.op_type == "Transpose" and n.domain in ("", "ai.onnx")
             and _is_swap12([int(p) for p in cast("list[int]", attr(n, "perm", []))])]
    for out in seeds:
        # the node itself: an earlier region's edit copied the graph's nodes
        seed = next((n for n in graph.node if n.op_type == "Transpose" and list(n.output) == [out]), None)
        if seed is not None and _sink_transpose(view, seed, shapes, made, computed_only):
            count += 1
            shapes = view.static_shapes()
    return count


def _is_swap12(perm: list[int]) -> bool:
    return len(perm) >= 3 and perm == _swap12(list(range(len(perm))))


def computed_table_layout(view: GraphEdit) -> int:
    """:func:`heads_table_layout` where it moves a table computed in the stage (2.3.x's row: ``rope-halves``
    does the constant tables there)."""
    return heads_table_layout(view, computed_only=True)


def _sink_transpose(view: GraphEdit, seed: onnx.NodeProto, shapes: dict[str, list[int]],
                    made: dict[tuple[str, int], str], computed_only: bool = False) -> bool:
    """Move ``seed`` (a Transpose swapping axes 1 and 2) down as far as the ops after it allow;
    False (nothing changed) when that would move no table (``computed_only``: no table computed in the
    stage)."""
    graph = view.graph
    outputs = view.outputs
    nodes = list(graph.node)
    start = next(k for k, n in enumerate(nodes) if n is seed)
    # region tensor (original name) -> its rank; the region's nodes in graph order
    region: dict[str, int] = {seed.output[0]: len(shapes.get(seed.output[0], []))}
    if region[seed.output[0]] < 3:
        return False
    members: list[int] = []
    moved_table = False
    moved_computed = False  # a table computed in the stage moved (a placement, not only weight memory)
    passed_norm = False  # a LayerNorm in the region
    plans: dict[int, set[str]] = {}  # member index -> its constant inputs to transpose
    op_rank: dict[int, int] = {}  # member index -> the rank of its region inputs
    renumbered: dict[int, list[int]] = {}  # member index -> its axes in the tokens layout (a Slice of the tokens)
    for k in range(start + 1, len(nodes)):
        n = nodes[k]
        if n.domain not in ("", "ai.onnx") or not any(i in region for i in n.input):
            continue
        op = n.op_type
        if op not in _ELEMENTWISE and op not in _AXIS_OPS:
            continue
        data = list(n.input) if op in _ELEMENTWISE or op == "Concat" else list(n.input[:1])
        if data[0] not in region and op not in _ELEMENTWISE and op != "Concat":
            continue  # the region feeds a parameter (a shape, an index): not layout work
        if any(i in region for i in n.input if i not in data):
            continue
        out_rank = len(shapes.get(n.output[0], []))
        ranks = {region[i] for i in data if i in region}
        if len(ranks) != 1 or out_rank < 3 or any(o not in shapes for o in n.output):
            continue
        rank = ranks.pop()
        consts: set[str] = set()
        ok = True
        for i in data:
            if i in region or not i:
                continue
            v = view.const_array(i)  # an initializer or a Constant (what the compiler stores as weight)
            # or computed from constants alone (Cosmos's real-width tables: Cos/Sin of a constant in the stage,
            # which the compiler folds): its shape, laid out again by a Reshape or Transpose of it in the graph
            vs = list(v.shape) if v is not None else shapes.get(i) if _constant_closure(view, i) else None
            if vs is None or len(vs) > rank or (op == "Concat" and len(vs) != rank):
                ok = False
                break
            full = [1] * (rank - len(vs)) + vs
            if full[1] != 1 or full[2] != 1:
                consts.add(i)  # a transposed copy is made once the region is accepted
                moved_table = moved_table or (full[1] == 1 and full[2] > 1 and (v is None or not computed_only))
                moved_computed = moved_computed or (full[1] == 1 and full[2] > 1 and v is None)
        if not ok:
            continue
        if op == "Reshape":
            s_in, s_out = shapes.get(n.input[0]), shapes.get(n.output[0])
            if s_in is None or s_out is None or len(s_out) < 3 or s_in[:3] != s_out[:3]:
                continue
        elif op in _AXIS_OPS and not _axes_beyond_heads(view, n, rank, out_rank):
            swapped = _axes_swapped(view, n, rank) if op in _SWAPPABLE and out_rank == rank else None
            if swapped is None:
                continue
            renumbered[k] = swapped
        if op == "LayerNormalization" and computed_only:
            # 2.3.0's build of CogView4's attention (32 heads x 1280 x 128) with its LayerNorm in the tokens layout
            # was killed at 14.6 GB of RSS (out of memory, twice); 3.6 GB with the norm in the heads layout
            continue
        passed_norm = passed_norm or op == "LayerNormalization"
        members.append(k)
        plans[k] = consts
        op_rank[k] = rank
        for o in n.output:
            if o:
                region[o] = len(shapes[o])
    if not moved_table or (passed_norm and not moved_computed):
        # a LayerNorm in the tokens layout is measured where it moves a computed table (CogView4's: the Transpose
        # after its exNorm leaves the CPU); HunyuanDiT's, with constant tables, builds on the NPU as it is
        return False
    member_set = set(members)
    # the region's tensors get fresh names (they now hold the swapped layout); an original name
    # read outside the region (or a graph output) is made again by a Transpose back
    renamed = {seed.output[0]: seed.input[0]}
    for k in members:
        for o in nodes[k].output:
            if o:
                renamed[o] = view.fresh(f"{o}_tokens_heads")
    read_outside = set(outputs)
    for k, n in enumerate(nodes):
        if k not in member_set and k != start:
            read_outside.update(n.input)
    keep_seed = seed.output[0] in read_outside
    old_shapes: set[str] = set()
    new_nodes: list[onnx.NodeProto] = []
    for k, n in enumerate(nodes):
        if k == start:
            if keep_seed:
                new_nodes.append(n)
            continue
        if k not in member_set:
            new_nodes.append(n)
            continue
        out_len: int | None = len(shapes[n.output[0]]) if n.op_type == "Reshape" else None
        for slot, i in enumerate(list(n.input)):
            if i in renamed:
                n.input[slot] = renamed[i]
            elif i in plans[k]:
                r = op_rank[k]
                key = (i, r)
                if key not in made:
                    v = view.const_array(i)
                    if v is not None:
                        ranked = v.reshape((1,) * (r - v.ndim) + v.shape)
                        made[key] = view.add_constant(f"{i}_tokens_heads",
                                                      np.ascontiguousarray(np.swapaxes(ranked, 1, 2)))
                    else:  # computed from constants: the same values laid out in the graph, before this reader
                        made[key] = _swapped_in_graph(view, i, [1] * (r - len(shapes[i])) + shapes[i], new_nodes)
                n.input[slot] = made[key]
        if k in renumbered:
            if n.op_type == "Slice":
                old_shapes.add(n.input[3])
                n.input[3] = view.add_constant(f"{n.output[0]}_axes_tokens_heads",
                                               np.array(renumbered[k], dtype=np.int64))
            else:  # Split, Concat: one axis attribute
                for a in [a for a in n.attribute if a.name == "axis"]:
                    n.attribute.remove(a)
                n.attribute.append(helper.make_attribute("axis", renumbered[k][0]))
        if n.op_type == "Reshape" and out_len is not None:
            old_shapes.add(n.input[1])
            n.input[1] = view.add_constant(f"{n.output[0]}_shape_tokens_heads",
                                           np.array(_swap12(shapes[n.output[0]]), dtype=np.int64))
            for a in [a for a in n.attribute if a.name == "allowzero"]:
                n.attribute.remove(a)
        originals = list(n.output)
        for slot, o in enumerate(originals):
            if o:
                n.output[slot] = renamed[o]
        new_nodes.append(n)
        for o in originals:
            if o and o in read_outside:
                r = len(shapes[o])
                new_nodes.append(helper.make_node("Transpose", [renamed[o]], [o], perm=_swap12(list(range(r))),
                                                  name=f"{n.name or o}/to_heads"))
    view.set_nodes(new_nodes)
    gone = set(renamed) - {o for n in new_nodes for o in n.output}
    for vi in [vi for vi in graph.value_info if vi.name in gone]:
        graph.value_info.remove(vi)
    read = {i for n in new_nodes for i in n.input} | outputs
    replaced = ({i for c in plans.values() for i in c} | old_shapes) - read
    for t in [t for t in graph.initializer if t.name in replaced]:
        graph.initializer.remove(t)
    return True


#: the most ops a computed constant the heads layout moves may take (a RoPE table: Cos/Sin of a folded grid)
_CLOSURE_OPS = 64


def _constant_closure(view: GraphEdit, name: str) -> bool:
    """``name`` is computed from initializers and ``Constant`` ops alone (no graph input, no subgraph), in
    at most :data:`_CLOSURE_OPS` default-domain ops."""
    inits = {t.name for t in view.graph.initializer}
    todo, seen, ops = [name], set(), 0
    while todo:
        t = todo.pop()
        if t in seen or not t or t in inits:
            continue
        seen.add(t)
        p = view.producer(t)
        if p is None or p.domain not in ("", "ai.onnx") or p.op_type in ("If", "Loop", "Scan"):
            return False
        if constant_tensor(p) is not None:
            continue
        ops += 1
        if ops > _CLOSURE_OPS:
            return False
        todo.extend(p.input)
    return True


def _swapped_in_graph(view: GraphEdit, name: str, full: list[int], new_nodes: list[onnx.NodeProto]) -> str:
    """Append to ``new_nodes`` the ops that give ``name`` (shaped ``full`` once broadcast to the region's rank)
    with axes 1 and 2 swapped: a Reshape when one of them is 1 (the same order of values), else a Reshape to
    ``full`` and a Transpose.  The compiler folds them with the constant; ONNX Runtime copies the same values."""
    mk = helper.make_node
    out = view.fresh(f"{name}_tokens_heads")
    if full[1] == 1 or full[2] == 1:
        shape = view.add_constant(f"{name}_shape_tokens_heads", np.array(_swap12(full), np.int64))
        new_nodes.append(mk("Reshape", [name, shape], [out], name=out))
        return out
    shape = view.add_constant(f"{name}_shape_full", np.array(full, np.int64))
    mid = view.fresh(f"{name}_full")
    new_nodes += [mk("Reshape", [name, shape], [mid], name=mid),
                  mk("Transpose", [mid], [out], perm=_swap12(list(range(len(full)))), name=out)]
    return out


def _through_casts(prod: dict[str, onnx.NodeProto], name: str) -> tuple[str, list[onnx.NodeProto]]:
    """``name`` followed up through Casts: the tensor they convert and the Casts on the way (last first)."""
    passed: list[onnx.NodeProto] = []
    while (p := prod.get(name)) is not None and p.op_type == "Cast" and p.domain in ("", "ai.onnx"):
        passed.append(p)
        name = p.input[0]
    return name, passed


def _half_slice(view: GraphEdit, n: onnx.NodeProto, d: int) -> int | None:
    """0 / 1 when ``n`` is a Slice of the first / second half of the last axis (of size ``d``), else None."""
    if n.op_type != "Slice" or len(n.input) < 4 or not n.input[3]:
        return None
    vals = [view.value(i) for i in n.input[1:4]]
    steps = view.value(n.input[4]) if len(n.input) > 4 and n.input[4] else np.array([1])
    if any(v is None or np.asarray(v).size != 1 for v in (*vals, steps)) or int(np.asarray(steps).item()) != 1:
        return None
    start, end, axis = (int(np.asarray(v).item()) for v in vals)
    if axis not in (-1, 3):
        return None
    start, end = (v + d if v < 0 else v for v in (start, end))
    end = min(end, d)
    return {(0, d // 2): 0, (d // 2, d): 1}.get((start, end))


def _rotate_half_source(view: GraphEdit, prod: dict[str, onnx.NodeProto], shapes: dict[str, list[int]],
                        name: str, xs: list[int]) -> str | None:
    """The tensor ``x`` (of shape ``xs``, rank 4) when ``name`` is rotate-half of it,
    ``Concat(-x[..., D/2:], x[..., :D/2], axis=-1)``, its halves written as Slices, as one Split
    of the last axis, or as the TorchScript export of ``x.unflatten(-1, (2, -1)).unbind(-2)``
    (Reshape to ``[.., 2, D/2]``, Split of axis -2, Squeezes); else None."""
    d = xs[3]
    cat = prod.get(name)
    if (cat is None or cat.op_type != "Concat" or len(cat.input) != 2
            or int(attr(cat, "axis", 0)) not in (-1, 3)):  # type: ignore[call-overload]
        return None
    neg = prod.get(cat.input[0])
    if neg is None or neg.op_type != "Neg":
        return None
    halves: list[tuple[str, int]] = []  # (source, which half) of the second and the first part
    for part in (neg.input[0], cat.input[1]):
        p = prod.get(part)
        if p is None:
            return None
        if p.op_type == "Slice":
            h = _half_slice(view, p, d)
            if h is None:
                return None
            halves.append((p.input[0], h))
            continue
        split_axes: tuple[int, ...] = (-1, 3)
        if p.op_type == "Squeeze":  # Squeeze(Split(Reshape(x, [.., 2, D/2]), axis -2), axis -2)
            axes = view.value(p.input[1]) if len(p.input) > 1 and p.input[1] else attr(p, "axes", None)
            if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] not in ([-2], [3]):
                return None
            part = p.input[0]
            p = prod.get(part)
            split_axes = (-2, 3)
        if p is None or p.op_type != "Split" or len(p.output) != 2 or \
                int(attr(p, "axis", 0)) not in split_axes:  # type: ignore[call-overload]
            return None
        sizes = view.value(p.input[1]) if len(p.input) > 1 and p.input[1] else attr(p, "split", None)
        if sizes is not None and len({int(v) for v in np.asarray(sizes).reshape(-1)}) != 1:
            return None  # equal halves: a sizes input, an attribute, or none
        src = p.input[0]
        if split_axes == (-2, 3):
            rs = prod.get(src)
            if rs is None or rs.op_type != "Reshape" or shapes.get(src) != [*xs[:3], 2, d // 2]:
                return None
            src = rs.input[0]
        elif shapes.get(src) != xs:
            return None
        halves.append((src, list(p.output).index(part)))
    (src2, h2), (src1, h1) = halves
    return src1 if src1 == src2 and (h1, h2) == (0, 1) else None


def _tokens_halves(view: GraphEdit, new: list[onnx.NodeProto], src: str, chain: list[onnx.NodeProto], tag: str,
                   params: list[str]) -> tuple[str, str]:
    """Append to ``new``: Transpose(src) to the tokens layout, ``chain``'s Casts (last first) made
    again on it, its two halves of the last axis (``params``: the constants 0, D/2, D and axis 3)."""
    zero, half, end, axis = params
    mk = helper.make_node
    out = view.fresh(tag)
    new.append(mk("Transpose", [src], [out], perm=[0, 2, 1, 3], name=out))
    for c in reversed(chain):
        src, out = out, view.fresh(f"{tag}_cast")
        new.append(mk("Cast", [src], [out], name=out, to=int(attr(c, "to", 0))))  # type: ignore[call-overload]
    h1, h2 = view.fresh(f"{tag}1"), view.fresh(f"{tag}2")
    new.extend([mk("Slice", [out, zero, half, axis], [h1], name=h1),
                mk("Slice", [out, half, end, axis], [h2], name=h2)])
    return h1, h2


def rope_halves(view: GraphEdit) -> int:
    """Rotate-half RoPE on attention heads with tables broadcast over the heads,
    ``x * cos + rotate_half(x) * sin`` (``x[B, H, T, D]``, ``cos`` / ``sin`` ``[1, 1, T, D]``) ->
    the same on the tokens layout and on the halves of D: ``Transpose(x)`` to ``[B, T, H, D]``,
    ``x1, x2`` its halves, ``Concat(x1 * cos1 - x2 * sin1, x2 * cos2 + x1 * sin2)``, Transposed
    back; the four half tables ``[1, T, 1, D/2]``.

    For 2.3.0, where heads-table-layout's whole-region move is no help: the compiler stores a
    table ``[1, 1, T, D]`` padded to 16 bytes per element (NC1HWC2, C = 1 padded), and a
    rotate-half as its TorchScript export spells it (Reshape to 5-D) lays the sin product out as
    ``(T, 1, 1, D)``, padded again; the RMSNorm before it stays in the heads layout (2.3.0's int8
    build puts its Reshapes on the CPU in the tokens layout).  The same products and one sum or
    difference per value (``a + (-b) * s`` is ``a - b * s`` exactly): bit for bit the same result.
    A half table equal to the other half (``cat(freqs, freqs)``) is merged by dedupe-constants.
    """
    graph = view.graph
    shapes = view.static_shapes()
    prod, _, _ = view.wiring()
    view.new_names()
    replaced: set[str] = set()
    keep: set[str] = set()  # the data the rewritten RoPEs read
    count = 0
    for k in list(view.matches("Add")):
        n = graph.node[k]
        muls = [prod.get(i) for i in n.input]
        if len(muls) != 2 or any(m is None or m.op_type != "Mul" or len(m.input) != 2 for m in muls):
            continue
        found = None
        for order in ((0, 1), (1, 0)):  # which product is x * cos
            terms = []
            for m in (muls[order[0]], muls[order[1]]):
                assert m is not None
                j = next((j for j in (0, 1) if view.const_array(m.input[j]) is not None), None)
                if j is None:
                    break
                terms.append((m.input[1 - j], view.const_array(m.input[j])))
            if len(terms) != 2:
                break
            (xa, cos), (rb, sin) = terms
            xs = shapes.get(xa)
            if xs is None or len(xs) != 4 or xs[3] % 2 or shapes.get(rb) != xs or xs[1] < 2:
                continue
            x, casts = _through_casts(prod, xa)
            rot, rcasts = _through_casts(prod, rb)
            if _rotate_half_source(view, prod, shapes, rot, xs) != x:
                continue
            found = (xa, rb, cos, sin, xs, x, casts, rcasts)
            break
        if found is None:
            continue
        xa, rb, cos, sin, xs, x, casts, rcasts = found
        assert cos is not None and sin is not None
        elem = view.elem(xa)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        if view.elem(rb) != elem or cos.dtype != dtype or sin.dtype != dtype or cos.ndim > 4 or sin.ndim > 4:
            continue
        full = [tab.reshape((1,) * (4 - tab.ndim) + tab.shape) for tab in (cos, sin)]
        if any(tab.shape[0] != 1 or tab.shape[1] != 1 or tab.shape[2] < 2 or tab.shape[3] != xs[3] for tab in full):
            continue  # not a table broadcast over the heads (nothing to gain)
        d = xs[3] // 2
        base = n.name or n.output[0]
        halves = [np.ascontiguousarray(np.swapaxes(tab[..., part], 1, 2))
                  for tab in full for part in (slice(0, d), slice(d, 2 * d))]
        c1, c2, s1, s2 = (view.add_constant(f"{base}/{tag}", h)
                          for tag, h in zip(("cos1", "cos2", "sin1", "sin2"), halves, strict=True))
        params = [view.add_constant(f"{base}/{tag}", np.array([v], np.int64))
                  for tag, v in (("zero", 0), ("half", d), ("end", 2 * d), ("axis", 3))]
        mk = helper.make_node
        new: list[onnx.NodeProto] = []

        x_elem = view.elem(x)
        if all(int(attr(c, "to", 0)) == x_elem for c in (*casts, *rcasts)):  # type: ignore[call-overload]
            x1, x2 = r1, r2 = _tokens_halves(view, new, x, [], f"{base}/x", params)  # Casts to x's own type: none made
        else:
            # the products with cos read x's Casts as they are, the products with sin x's halves Cast as
            # the rotate-half was (the same values; ONNX Runtime drops a float32 -> float16 -> float32
            # Cast pair when nothing else reads the float16 value, so the two stay apart as they were)
            x1, x2 = _tokens_halves(view, new, xa, [], f"{base}/x", params)
            r1, r2 = _tokens_halves(view, new, x, rcasts, f"{base}/r", params)
        nm = {tag: view.fresh(f"{base}/{tag}") for tag in ("x1c", "x2s", "x2c", "x1s", "first", "second", "both")}
        new += [mk("Mul", [x1, c1], [nm["x1c"]], name=f"{base}/x1_cos"),
                mk("Mul", [r2, s1], [nm["x2s"]], name=f"{base}/x2_sin"),
                mk("Sub", [nm["x1c"], nm["x2s"]], [nm["first"]], name=f"{base}/first"),
                mk("Mul", [x2, c2], [nm["x2c"]], name=f"{base}/x2_cos"),
                mk("Mul", [r1, s2], [nm["x1s"]], name=f"{base}/x1_sin"),
                mk("Add", [nm["x2c"], nm["x1s"]], [nm["second"]], name=f"{base}/second"),
                mk("Concat", [nm["first"], nm["second"]], [nm["both"]], axis=3, name=f"{base}/halves"),
                mk("Transpose", [nm["both"]], [n.output[0]], perm=[0, 2, 1, 3], name=f"{base}/to_heads")]
        view.replace(k, new)
        replaced.update((*n.input, rb, xa))
        keep.add(x)
        count += 1
    if count:  # the products, the rotate-half and its Casts go (chains: until nothing more is unread)
        dead = _upstream(prod, replaced, stop=keep)
        while True:
            before = len(graph.node)
            view.drop_unread_nodes(dead)
            if len(graph.node) == before:
                break
        made = {o for m in graph.node for o in m.output}
        for vi in [vi for vi in graph.value_info if vi.name in dead and vi.name not in made]:
            graph.value_info.remove(vi)
    return count


def _upstream(prod: dict[str, onnx.NodeProto], names: set[str], stop: set[str]) -> set[str]:
    """``names`` and every tensor they are computed from, up to the tensors ``stop`` (left out)."""
    out: set[str] = set()
    todo = list(names)
    while todo:
        t = todo.pop()
        if t in out or t in stop:
            continue
        out.add(t)
        p = prod.get(t)
        if p is not None:
            todo.extend(p.input)
            out.update(o for o in p.output if o)
    return out


def _content_key(t: onnx.TensorProto) -> tuple[int, tuple[int, ...], str]:
    """What makes two inline tensors interchangeable: element type, shape and bytes (sha256)."""
    import hashlib

    return t.data_type, tuple(t.dims), hashlib.sha256(inline_bytes(t)).hexdigest()


def _inline_size(t: onnx.TensorProto) -> int:
    return len(t.raw_data) if t.raw_data else t.ByteSize()


def duplicate_constants(graph: onnx.GraphProto) -> dict[str, str]:
    """Constants of ``graph`` that hold exactly what an earlier one holds: name -> the earlier name.

    Initializers and ``Constant`` ops' ``value`` tensors, by element type, shape and bytes (only
    tensors sharing type, shape and size with another are hashed).  Graph inputs and outputs,
    and a graph with subgraphs (which read tensors by name), are left alone.
    """
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return {}
    fixed = {i.name for i in graph.input} | {o.name for o in graph.output}
    tensors: list[tuple[str, onnx.TensorProto]] = [(t.name, t) for t in graph.initializer if t.name not in fixed]
    for n in graph.node:
        value = constant_tensor(n)
        if value is not None and n.output[0] not in fixed:
            tensors.append((n.output[0], value))
    if any(t.data_location == onnx.TensorProto.EXTERNAL for _, t in tensors):
        return {}  # not loaded: bytes unknown (the caller loads external data first)
    by_size: dict[tuple[int, tuple[int, ...], int], list[tuple[str, onnx.TensorProto]]] = {}
    for name, t in tensors:
        by_size.setdefault((t.data_type, tuple(t.dims), _inline_size(t)), []).append((name, t))
    out: dict[str, str] = {}
    for group in by_size.values():
        if len(group) < 2:
            continue
        first: dict[tuple[int, tuple[int, ...], str], str] = {}
        for name, t in group:
            kept = first.setdefault(_content_key(t), name)
            if kept != name:
                out[name] = kept
    return out


def dedupe_constants(view: GraphEdit) -> int:
    """Every use of a constant that duplicates an earlier one reads the earlier one; the copy goes.

    Exporters fold the same table once per use: the TorchScript export of diffusers' Cosmos / Anima
    holds RoPE's cos and sin once for q and again for k.  The compiler stores each copy (its
    duplicate-weight pass does not merge them), padded at 16 bytes an element when it broadcasts
    over the heads.  The same values read under one name: bit for bit the same result.
    """
    graph = view.graph
    dup = duplicate_constants(graph)
    if not dup:
        return 0
    for n in graph.node:
        for k, x in enumerate(n.input):
            if x in dup:
                n.input[k] = dup[x]
    keep_nodes = [n for n in graph.node if not (n.op_type == "Constant" and n.output and n.output[0] in dup)]
    if len(keep_nodes) != len(graph.node):
        view.set_nodes(keep_nodes)
    for t in [t for t in graph.initializer if t.name in dup]:
        graph.initializer.remove(t)
    for v in [v for v in graph.value_info if v.name in dup]:
        graph.value_info.remove(v)
    return len(dup)


def may_hold_duplicate_constants(head: onnx.ModelProto) -> bool:
    """Whether :func:`dedupe_constants` may find something in ``head`` (external data not loaded):
    two constants of one element type, shape and stored size (external ones by their length)."""
    seen: set[tuple[int, tuple[int, ...], int]] = set()
    g = head.graph
    values = (constant_tensor(n) for n in g.node)
    tensors = [*g.initializer, *(v for v in values if v is not None)]
    for t in tensors:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            length = next((int(e.value) for e in t.external_data if e.key == "length"), -1)
        else:
            length = _inline_size(t)
        key = (t.data_type, tuple(t.dims), length)
        if key in seen:
            return True
        seen.add(key)
    return False


def _axes_arg(view: GraphEdit, n: onnx.NodeProto) -> list[int] | None:
    """A Squeeze's / Unsqueeze's axes: its ``axes`` input (opset 13 on) or attribute."""
    if len(n.input) > 1 and n.input[1]:
        v = view.const_array(n.input[1])
        return None if v is None else [int(a) for a in np.asarray(v).reshape(-1)]
    a = attr(n, "axes", None)
    return None if a is None else [int(x) for x in cast(list[int], a)]


def _last_axis(axes: list[int] | None, rank: int) -> bool:
    return axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1)


def _interleaved_rotation(view: GraphEdit, shapes: Mapping[str, list[int]], rot: str
                          ) -> tuple[str, int, set[str]] | None:
    """``(x, D, the rotation's tensors)`` when ``rot`` is ``x`` ``[..., D]`` with each pair of values
    rotated, ``(x0, x1) -> (-x1, x0)``, as TorchScript writes diffusers' ``apply_rotary_emb(
    use_real_unbind_dim=-1)`` (HunyuanDiT, Flux): ``Reshape [..., D/2, 2]``, ``Split`` of the last
    axis in two, ``Squeeze`` each, ``Neg`` the second, ``Unsqueeze`` both, ``Concat(-x1, x0)`` on the
    last axis, ``Reshape`` back; every tensor in between read only inside.  Else ``None``."""
    r2 = view.producer(rot)
    if r2 is None or r2.op_type != "Reshape":
        return None
    cat = view.parent(r2, 0)
    out = shapes.get(rot)
    if cat is None or cat.op_type != "Concat" or len(cat.input) != 2 or out is None or out[-1] % 2:
        return None
    d = out[-1]
    pairs = [*out[:-1], d // 2, 2]
    if shapes.get(cat.output[0]) != pairs or int(cast(int, attr(cat, "axis", 0))) not in (-1, len(pairs) - 1):
        return None
    halves = []
    for k in (0, 1):
        u = view.parent(cat, k)
        if u is None or u.op_type != "Unsqueeze" or not _last_axis(_axes_arg(view, u), len(pairs)):
            return None
        s = view.parent(u, 0)
        neg = k == 0
        if neg:
            if s is None or s.op_type != "Neg":
                return None
            s = view.parent(s, 0)
        if s is None or s.op_type != "Squeeze" or not _last_axis(_axes_arg(view, s), len(pairs)):
            return None
        halves.append(s.input[0])
    split = view.producer(halves[0])
    if (split is None or split.op_type != "Split" or view.producer(halves[1]) is not split
            or list(split.output) != [halves[1], halves[0]]
            or int(cast(int, attr(split, "axis", 0))) not in (-1, len(pairs) - 1)
            or any(shapes.get(t) != [*pairs[:-1], 1] for t in split.output)):
        return None
    r1 = view.parent(split, 0)
    if r1 is None or r1.op_type != "Reshape" or shapes.get(r1.input[0]) != out:
        return None
    x = r1.input[0]
    inner = {r1.output[0], *split.output, cat.output[0], *cat.input}
    inner |= {t for u in (view.parent(cat, 0), view.parent(cat, 1)) if u is not None for t in u.input[:1]}
    inner |= {t for n in (view.producer(t) for t in list(inner)) if n is not None and n.op_type == "Neg"
              for t in n.input[:1]}
    # the rotation's nodes, by their first output (NodeProtos are not hashable)
    chain = {n.output[0] for t in inner if (n := view.producer(t)) is not None} | {r2.output[0]}
    outputs = view.outputs
    for t in inner:
        if t in outputs or any(q.output[0] not in chain for q in view.readers(t)):
            return None  # something else reads a piece of the rotation
    return x, d, inner | {rot}


#: head dims whose interleaved rotation of the heads-first layout 2.5.0 keeps on the NPU after a per-head
#: LayerNorm (``bench/layout_probe.py --pattern norm-rope``, 16 heads x 1024 tokens: 64 does; 72, 88, 96 and 128
#: put a Transpose and the rotation's Reshape on the CPU)
ROPE_NPU_DIMS = frozenset({64})
#: ops between the heads Transpose and the rotation that leave the layout alone (a per-head norm, its casts)
_PER_ROW = frozenset({"LayerNormalization", "Cast", "Mul", "Div", "Add", "Sub", "Pow", "Sqrt", "ReduceMean",
                      "Reciprocal", "Identity"})


def _heads_first(view: GraphEdit, x: str) -> bool:
    """``x`` is in the heads-first layout ``[B, H, T, D]``: back through per-row ops (its first input) to a
    Transpose swapping the tokens and heads axes of ``[B, T, H, D]``."""
    t = x
    for _ in range(12):
        p = view.producer(t)
        if p is None:
            return False
        if p.op_type == "Transpose":
            return list(cast(list[int], attr(p, "perm", []))) == [0, 2, 1, 3]
        if p.op_type not in _PER_ROW or not p.input:
            return False
        t = p.input[0]
    return False


def rope_interleaved_matmul(view: GraphEdit) -> int:
    """RoPE's rotation of interleaved pairs times its table, ``rotate(x) * T`` with ``rotate`` the
    rank-5 form of :func:`_interleaved_rotation` -> ``MatMul(x * T', P)``: ``P`` the ``D x D`` signed
    pair swap (one ``+-1`` per column), ``T'`` the table with each pair's two values exchanged.

    Bit-exact: each value is the same one product, ``x[2i+1] * T[2i]`` negated or ``x[2i] *
    T[2i+1]``; the MatMul adds it to zeros.  The table multiplies before the MatMul because the
    toolkits fold a Mul after a MatMul into its weight (``fuse_mul_into_matmul``), which a table
    varying over the tokens breaks (2.5.0: "operands could not be broadcast together").  An optional
    Cast between the rotation and the Mul that changes no type goes too.  Only the heads-first layout
    (:func:`_heads_first`) at a head dim not in :data:`ROPE_NPU_DIMS` is rewritten: elsewhere 2.5.0 builds
    the rotation on the NPU as it is (Flux's tokens-first RoPE at 128)."""
    shapes = view.static_shapes()
    view.new_names()
    count = 0
    gone: set[str] = set()
    for k in list(view.matches("Mul")):
        mul = view.graph.node[k]
        if len(mul.input) != 2:
            continue
        for j in (0, 1):
            rot = mul.input[j]
            cast_out: str | None = None
            p = view.producer(rot)
            if p is not None and p.op_type == "Cast" and view.elem(p.input[0]) == view.elem(rot):
                if len(view.readers(rot)) != 1 or rot in view.outputs:
                    continue
                cast_out, rot = rot, p.input[0]
            found = _interleaved_rotation(view, shapes, rot)
            if found is None:
                continue
            x, d, inner = found
            elem = view.elem(x)
            # only where the toolkit needs it: a rotation of the heads-first layout at a head dim it does not keep
            # on the NPU (bench/layout_probe.py); the tokens-first layout (Flux's [B, T, H, D]) builds as it is
            if (d in ROPE_NPU_DIMS or not _heads_first(view, x)
                    or elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
                    or len(view.readers(rot)) != 1 or rot in view.outputs):
                continue
            # the table's value is read last, for a matched rotation only (a stage's other constants may be
            # weights in external data, or a capability probe's placeholders)
            table = view.const_array(mul.input[1 - j])
            if (table is None or table.dtype != helper.tensor_dtype_to_np_dtype(elem) or table.ndim == 0
                    or table.shape[-1] not in (1, d)):
                continue
            swapped = table if table.shape[-1] == 1 else \
                table.reshape(*table.shape[:-1], d // 2, 2)[..., ::-1].reshape(table.shape)
            swap = np.zeros((d, d), dtype=table.dtype)
            swap[np.arange(1, d, 2), np.arange(0, d, 2)] = -1
            swap[np.arange(0, d, 2), np.arange(1, d, 2)] = 1
            base = mul.name or mul.output[0]
            t_name = view.add_constant(f"{base}/table_swapped", np.ascontiguousarray(swapped))
            p_name = view.add_constant(f"{base}/pair_swap", swap)
            pre = view.fresh(f"{base}/pre")
            view.replace(k, [helper.make_node("Mul", [x, t_name], [pre], name=f"{base}/Mul_pre"),
                             helper.make_node("MatMul", [pre, p_name], [mul.output[0]], name=f"{base}/pair_swap")])
            gone |= inner | ({cast_out} if cast_out else set())
            count += 1
            break
    if count:
        before = -1
        while before != len(view.graph.node):  # the rotation's nodes, each once nothing reads it
            before = len(view.graph.node)
            view.drop_unread_nodes(gone)
    return count
