"""Head layouts of real widths the compiler would run on the CPU: layout rewrites keyed on the pattern and on the
shape condition the layout probes show (``bench/layout_probe.py``, issue 50).

``kv_repeat_gather``
    grouped-query attention's key/value head repeat, ``x[.., n, 1, ..]`` broadcast to ``[.., n, r, ..]`` (``Tile``,
    ``Expand`` or the ``Mul(x, ones)`` ``tile-broadcast``/``expand-broadcast`` make of them) and merged into
    ``n·r`` heads by the ``Reshape`` after it (``repeat_interleave``) -> one ``Gather`` of the ``n`` heads with the
    indices ``0,..,0, 1,..,1, ..`` (each ``r`` times) on that axis: the same values copied, bit-exact.  2.5.0 lays a
    broadcast repeat out with the repeats in front and transposes it on the CPU ((3,T,8,96) -> (8,3,96,T)); a
    Gather stays on the NPU.  Two key/value heads or more: one head's repeat is a broadcast of the leading axis,
    which ``expand-broadcast`` keeps on the NPU.
``pad_rows_matmul``
    a constant-mode ``Pad`` of the rows of a ``MatMul``'s left operand (Sana's linear attention pads the value with
    a ones row: ``F.pad(v, (0, 0, 0, 1), value=1)`` then ``v @ k^T``) -> the product of the unpadded rows and the
    product of the constant rows, concatenated: the same dot products, row by row (summed in the order ONNX
    Runtime's GEMM picks for each shape: not bit-exact, within the rewrite check).  At 70 heads 2.5.0 transposes
    the padded value (1,70,33,1024) -> (70,1024,1,33) on the CPU; 33 rows are never transposed after it.
``wide_matmul_columns``
    a ``MatMul`` of more than 8192 output channels (FLUX.2's fused q/k/v/MLP projection, 27648) -> one product per
    column range its readers slice, at most 8192 wide: the compilers transpose a wider product back to tokens-first
    on the CPU.  The same dot products on the same weight columns, bit-exact.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
from onnx import helper

from rkpart.ir.edit import GraphEdit, attr
from rkpart.targets.rewrites.npu import slice_range

#: element types the rewrites below copy or multiply (float only: the toolkit's types)
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)


#: the most elements a repeat's constant of ones may have (one repeat axis: the number of repeats)
_MAX_ONES = 4096


def _ones(view: GraphEdit, name: str, shapes: dict[str, list[int]]) -> np.ndarray | None:
    """The value of ``name`` when it is a small constant of ones (its size read from its shape first: the
    partitioner's rewrite probe holds large constants as placeholders without data)."""
    shape = shapes.get(name)
    if shape is None or int(np.prod(shape)) > _MAX_ONES:
        return None
    v = view.const_array(name)
    return v if v is not None and v.size and np.all(v == 1) else None


def _repeat_axis(view: GraphEdit, n: onnx.NodeProto, shapes: dict[str, list[int]]) -> tuple[str, int, int] | None:
    """``(x, a, r)`` when ``n`` broadcasts axis ``a`` of ``x`` from 1 to ``r`` > 1 and copies every other axis as it
    is: a ``Tile`` with repeats 1 elsewhere, an ``Expand`` to ``x``'s shape but there, a ``Mul`` by a constant of
    ones shaped 1 but there."""
    if not n.input or not n.output:
        return None
    x = n.input[0]
    src, out = shapes.get(x), shapes.get(n.output[0])
    if n.op_type == "Mul" and len(n.input) == 2:
        ones = _ones(view, n.input[1], shapes)
        if ones is None:
            x, ones = n.input[1], _ones(view, n.input[0], shapes)
            if ones is None:
                return None
            src = shapes.get(x)
        if src is None or out is None or ones.ndim > len(src):
            return None
    elif n.op_type not in ("Tile", "Expand") or len(n.input) != 2:
        return None
    if src is None or out is None or len(src) != len(out):
        return None
    grown = [k for k, (s, o) in enumerate(zip(src, out, strict=True)) if s != o]
    if len(grown) != 1 or src[grown[0]] != 1 or out[grown[0]] < 2:
        return None
    return x, grown[0], out[grown[0]]


def kv_repeat_gather(view: GraphEdit) -> int:
    """GQA's head repeat (module docstring) -> ``Gather`` of the heads on the axis before the repeat."""
    shapes = view.static_shapes()

    def one(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        found = _repeat_axis(view, n, shapes)
        if found is None or view.elem(n.output[0]) not in _FLOATS:
            return None
        x, b, r = found
        src, out = shapes[x], shapes[n.output[0]]
        a = b - 1  # the heads axis the repeat interleaves with
        # one key/value head (Stable Audio): the repeat is a broadcast of the leading axis, which 2.5.0 keeps on
        # the NPU once expand-broadcast wrote it as a product; the transposed layout needs heads to interleave with
        if a < 0 or src[a] < 2:
            return None
        readers = view.readers(n.output[0])
        merged = [*out[:a], src[a] * r, *out[b + 1:]]
        # only the repeat_interleave of heads: every reader merges the two axes (a Reshape to ``merged``)
        if (not readers or n.output[0] in view.outputs
                or any(m.op_type != "Reshape" or shapes.get(m.output[0]) != merged for m in readers)):
            return None
        base = n.name or n.output[0]
        squeezed = view.add_constant(f"{base}/heads", np.array([*src[:b], *src[b + 1:]], np.int64))
        idx = view.add_constant(f"{base}/repeat", np.repeat(np.arange(src[a], dtype=np.int64), r))
        flat, gathered = view.fresh(f"{base}/squeezed"), view.fresh(f"{base}/gathered")
        back = view.add_constant(f"{base}/shape", np.array(out, np.int64))
        return [helper.make_node("Reshape", [x, squeezed], [flat], name=f"{base}/squeeze"),
                helper.make_node("Gather", [flat, idx], [gathered], axis=a, name=f"{base}/Gather"),
                helper.make_node("Reshape", [gathered, back], [n.output[0]], name=f"{base}/unmerge")]

    count = 0
    for op in ("Tile", "Expand", "Mul"):
        got = view.replace_each(op, one)
        if got:
            view.retype()
            shapes = view.static_shapes()
        count += got
    return count


def pad_rows_matmul(view: GraphEdit) -> int:
    """``MatMul(Pad(x), B)``, the Pad constant-mode and only on ``x``'s rows (axis -2) -> ``Concat(MatMul(C_top,
    B), MatMul(x, B), MatMul(C_bottom, B))`` on axis -2, ``C`` the padded rows ``[1, .., 1, rows, K]`` (broadcast
    over ``B``'s batch axes).  Only where ``B``'s batch axes are the product's (so the pieces concatenate)."""
    shapes = view.static_shapes()

    def one(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        pad = view.producer(n.input[0])
        if pad is None or pad.op_type != "Pad" or attr(pad, "mode", b"constant") not in (b"constant", "constant"):
            return None
        if (len(pad.input) > 3 and pad.input[3]) or len(pad.input) < 2:
            return None
        x, b_in, y = pad.input[0], n.input[1], n.output[0]
        xs, bs, ys = shapes.get(x), shapes.get(b_in), shapes.get(y)
        pads = view.value(pad.input[1])
        if xs is None or bs is None or ys is None or pads is None or len(xs) < 2 or len(bs) < 2:
            return None
        rank = len(xs)
        pads = np.asarray(pads, np.int64).reshape(-1)
        if pads.size != 2 * rank or (pads < 0).any():
            return None
        top, bottom = int(pads[rank - 2]), int(pads[2 * rank - 2])
        rest = [int(p) for k, p in enumerate(pads.tolist()) if k not in (rank - 2, 2 * rank - 2)]
        value = view.value(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(())
        elem = view.elem(x)
        if any(rest) or not (top or bottom) or value is None or value.size != 1 or elem not in _FLOATS:
            return None
        # the constant rows' product is shaped by B's batch axes: they must be the product's
        if len(bs) != len(ys) or bs[:-2] != ys[:-2]:
            return None
        base = n.name or y
        dtype = helper.tensor_dtype_to_np_dtype(elem)
        parts, new = [], []
        for side, rows in (("top", top), ("x", 0), ("bottom", bottom)):
            if side == "x":
                inner = view.fresh(f"{base}/rows")
                new.append(helper.make_node("MatMul", [x, b_in], [inner], name=f"{base}/rows"))
                parts.append(inner)
            elif rows:
                c = view.add_constant(f"{base}/{side}", np.full([1] * (rank - 2) + [rows, xs[-1]],
                                                                 value.reshape(()), dtype=dtype))
                out = view.fresh(f"{base}/{side}_rows")
                new.append(helper.make_node("MatMul", [c, b_in], [out], name=f"{base}/{side}_rows"))
                parts.append(out)
        new.append(helper.make_node("Concat", parts, [y], axis=len(ys) - 2, name=f"{base}/Concat_rows"))
        return new

    count = view.replace_each("MatMul", one)
    if count:
        view.drop_unread_nodes({n.output[0] for n in view.graph.node if n.op_type == "Pad"})
    return count


#: masked attention from this many query rows on is cut into row chunks (2.5.0 runs the Softmax of a masked
#: attention of 512 query rows or more and its score Transposes on the CPU; measured at 512, 1024, 1152, 1280)
MASKED_ROWS = 512
#: query rows per chunk (2.5.0 fuses each chunk into exSDPAttention, mask included: 256 and 512 measured)
ROW_CHUNK = 256


def _single_reader(view: GraphEdit, tensor: str) -> onnx.NodeProto | None:
    readers = view.readers(tensor)
    return readers[0] if len(readers) == 1 and tensor not in view.outputs else None


def _masked_chain(view: GraphEdit, sm: onnx.NodeProto, shapes: dict[str, list[int]]
                  ) -> tuple[list[onnx.NodeProto], onnx.NodeProto, str, str] | None:
    """``(chain, last MatMul, Q, K)`` when ``sm`` is the Softmax of ``MatMul(Q, K) + mask`` over the last axis,
    the mask the same for every query row and not a constant, read by ``MatMul(P, V)`` (maybe through a ``Mul`` by
    a factor the same for every entry of a row: nan-guard's "has a key")."""
    rank = len(shapes.get(sm.input[0]) or [])
    if rank < 2 or int(attr(sm, "axis", -1)) not in (-1, rank - 1):  # type: ignore[call-overload]
        return None
    add = view.producer(sm.input[0])
    if add is None or add.op_type != "Add" or _single_reader(view, add.output[0]) is not sm:
        return None
    for k in (0, 1):
        mm = view.producer(add.input[k])
        if mm is not None and mm.op_type == "MatMul":
            mask = add.input[1 - k]
            break
    else:
        return None
    ms = shapes.get(mask)
    if (_single_reader(view, mm.output[0]) is not add or ms is None or (len(ms) >= 2 and ms[-2] != 1)
            or view.producer(mask) is None or view.const_array(mask) is not None):
        return None  # a constant mask (or none) is fused by 2.5.0 as it is
    chain = [mm, add, sm]
    nxt = _single_reader(view, sm.output[0])
    if nxt is not None and nxt.op_type == "Mul":
        other = nxt.input[1] if nxt.input[0] == sm.output[0] else nxt.input[0]
        os_ = shapes.get(other)
        if os_ is None or (len(os_) >= 1 and os_[-1] != 1) or (len(os_) >= 2 and os_[-2] != 1):
            return None
        chain.append(nxt)
        nxt = _single_reader(view, nxt.output[0])
    if nxt is None or nxt.op_type != "MatMul" or nxt.input[0] != chain[-1].output[0]:
        return None
    return chain, nxt, mm.input[0], mm.input[1]


def masked_attention_row_chunks(view: GraphEdit) -> int:
    """Masked attention (``Softmax(Q @ K + mask) @ V``, the mask computed in the stage or read from its inputs, the
    same for every query row) of :data:`MASKED_ROWS` query rows or more -> the same per chunk of :data:`ROW_CHUNK`
    query rows (``Slice`` of ``Q``, above its scalar scale), the outputs concatenated: every row's scores, Softmax
    and product are the same ops on the same values (bit-exact under ONNX Runtime)."""
    shapes = view.static_shapes()
    done = 0
    index = {n.output[0]: i for i, n in enumerate(view.graph.node) if n.output}
    for sm in [n for n in view.graph.node if n.op_type == "Softmax"]:
        found = _masked_chain(view, sm, shapes)
        if found is None:
            continue
        chain, last, q, _ = found
        qs, ys = shapes.get(q), shapes.get(last.output[0])
        if qs is None or ys is None or len(qs) < 2 or len(ys) != len(qs) or qs[-2] < MASKED_ROWS:
            continue
        if view.elem(q) not in _FLOATS:
            continue
        axis = len(qs) - 2
        # slice above Q's scalar scale (TorchScript's SDPA scales q and k by the square root of the scale each):
        # each chunk keeps it next to its MatMul, as ONNX Runtime's MatMul-scale fusion and the toolkit see it
        pre: list[onnx.NodeProto] = []
        reader = chain[0]
        while (p := view.producer(q)) is not None and p.op_type == "Mul" and _single_reader(view, q) is reader:
            data = [i for i in p.input if shapes.get(i) is not None and int(np.prod(shapes[i])) > 1]
            if len(data) != 1 or shapes[data[0]] != qs or view.scalar(next(i for i in p.input if i != data[0])) \
                    is None:
                break
            pre.insert(0, p)
            reader, q = p, data[0]
        base = sm.name or sm.output[0]
        ax = view.add_constant(f"{base}/rows_axis", np.array([axis], np.int64))
        new: list[onnx.NodeProto] = []
        parts = []
        for c0 in range(0, qs[-2], ROW_CHUNK):
            c1 = min(qs[-2], c0 + ROW_CHUNK)
            tag = f"{base}/rows{c0}"
            lo = view.add_constant(f"{tag}/start", np.array([c0], np.int64))
            hi = view.add_constant(f"{tag}/end", np.array([c1], np.int64))
            qc = view.fresh(f"{tag}/q")
            new.append(helper.make_node("Slice", [q, lo, hi, ax], [qc], name=f"{tag}/Slice"))
            cur = {q: qc}
            for j, n in enumerate((*pre, *chain, last)):
                c = onnx.NodeProto()
                c.CopyFrom(n)
                c.name = f"{tag}/{j}_{(n.name or n.op_type).rsplit('/', 1)[-1]}"
                del c.input[:]
                c.input.extend(cur.get(i, i) for i in n.input)
                out = view.fresh(f"{tag}/{n.output[0].rsplit('/', 1)[-1]}")
                cur[n.output[0]] = out
                del c.output[:]
                c.output.append(out)
                new.append(c)
            parts.append(cur[last.output[0]])
        new.append(helper.make_node("Concat", parts, [last.output[0]], axis=axis, name=f"{base}/Concat_rows"))
        for n in (*pre, *chain):
            view.replace_later(index[n.output[0]], [])
        view.replace_later(index[last.output[0]], new)
        done += 1
    view.apply_edits()
    return done


def _zero_one_factor(view: GraphEdit, f: str) -> bool:
    """``f`` is nan-guard's "has a key" factor, exactly 0 or 1: ``Clip(MatMul(Where(c, 1, 0), ones), 0, 1)`` (a
    count of keys, an integer, clipped to [0, 1])."""
    clip = view.producer(f)
    if clip is None or clip.op_type != "Clip" or len(clip.input) != 3:
        return False
    if view.scalar(clip.input[1]) != 0.0 or view.scalar(clip.input[2]) != 1.0:
        return False
    count = view.producer(clip.input[0])
    if count is None or count.op_type != "MatMul":
        return False
    ones = view.const_array(count.input[1])
    keys = view.producer(count.input[0])
    if ones is None or not ones.size or not np.all(ones == 1) or keys is None or keys.op_type != "Where":
        return False
    return {view.scalar(keys.input[1]), view.scalar(keys.input[2])} == {0.0, 1.0}


def guard_after_product(view: GraphEdit) -> int:
    """``MatMul(Softmax(s) * f, V)``, ``f`` nan-guard's per-row factor of 0 or 1 (:func:`_zero_one_factor`) the same
    for every query row (a mask over the keys) -> ``MatMul(Softmax(s), V * f)``: for ``f = 1`` the same product,
    for ``f = 0`` zeros (finite values), bit for bit (a zero's sign aside).  2.3.0 fuses the masked attention (its
    Softmax and the product with ``V``) only when nothing stands between them."""
    shapes = view.static_shapes()
    index = {n.output[0]: i for i, n in enumerate(view.graph.node) if n.output}
    done = 0
    for mul in [n for n in view.graph.node if n.op_type == "Mul" and len(n.input) == 2]:
        found = [p for i in mul.input if (p := view.producer(i)) is not None and p.op_type == "Softmax"]
        if not found:
            continue
        sm = found[0]
        only = _single_reader(view, sm.output[0])
        if only is None or list(only.output) != list(mul.output):  # the Softmax read by this Mul alone
            continue
        f = mul.input[1] if mul.input[0] == sm.output[0] else mul.input[0]
        mm = _single_reader(view, mul.output[0])
        if mm is None or mm.op_type != "MatMul" or mm.input[0] != mul.output[0]:
            continue
        fs, ps, ys = shapes.get(f), shapes.get(sm.output[0]), shapes.get(mm.output[0])
        if fs is None or ps is None or ys is None or shapes.get(mul.output[0]) != ps or len(fs) > len(ys):
            continue
        # one factor per row of the product: 1 on the keys axis, the rows' or 1 on every other
        if (fs and fs[-1] != 1) or any(a not in (1, b) for a, b in zip(fs[::-1][1:], ys[::-1][1:], strict=False)):
            continue
        if view.elem(f) not in _FLOATS or not _zero_one_factor(view, f):
            continue
        # the same factor for every query row (a mask over the keys: Lumina2's caption mask), shaped to broadcast
        # onto V: onto V, which 2.3.0 fuses with the attention.  A factor per query row would go after the product,
        # where 2.3.0 runs the fused output's Transpose to it on the CPU at 24 heads (Lumina2's main attention,
        # measured): left alone
        vs = shapes.get(mm.input[1])
        if len(fs) >= 2 and (fs[-2] != 1 or vs is None or len(fs) > len(vs) or any(
                a not in (1, b) for a, b in zip(fs[::-1], vs[::-1], strict=False))):
            continue
        base = mul.name or mul.output[0]
        pre = view.fresh(f"{base}/values")
        view.replace_later(index[mul.output[0]], [])
        view.replace_later(index[mm.output[0]], [
            helper.make_node("Mul", [mm.input[1], f], [pre], name=f"{base}/on_values"),
            helper.make_node("MatMul", [sm.output[0], pre], [mm.output[0]], name=mm.name or f"{base}/MatMul")])
        done += 1
    view.apply_edits()
    return done


#: the most output channels a MatMul's result may have where the compiler transposes it back to the tokens-first
#: layout on the NPU: its lowering computes the product channels-first, (1,N,1,T), and places the Transpose to
#: (1,T,1,N) on the CPU from N = 8208 on ("channel is too large, may produce thousands of regtask, fallback to
#: cpu!"); measured with bench/layout_probe.py --pattern wide-matmul at 256 to 4096 tokens: 8192 stays, 8208 goes,
#: on 2.5.0 and 2.3.0
MAX_OUT_CHANNELS = 8192


def _column_leaves(view: GraphEdit, head: str, n: int, rank: int, offset: int,
                   leaves: list[tuple[str, int, int]], inner: list[str]) -> bool:
    """The column ranges ``head`` (columns ``offset`` on of the product) is read as: each reader a ``Slice`` of the
    last axis with constant bounds, step 1; a Slice read only by such Slices (diffusers' FLUX.2 block takes
    ``[:9216]`` and then q, k and v of it) is looked through.  ``leaves`` gets ``(tensor, start, end)`` in the
    product's columns, ``inner`` the Slices looked through; ``False`` when a reader is anything else."""
    readers = view.readers(head)
    if not readers or head in view.outputs:
        return False
    for sl in readers:
        r = slice_range(view, sl, rank, n)
        if r is None:
            return False
        a, b = r
        out = sl.output[0]
        deeper: list[tuple[str, int, int]] = []
        if out not in view.outputs and view.readers(out) and \
                _column_leaves(view, out, b - a, rank, offset + a, deeper, inner):
            leaves.extend(deeper)
            inner.append(out)
        else:
            leaves.append((out, offset + a, offset + b))
    return True


def _column_segments(bounds: list[int], covered: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """The column ranges between consecutive ``bounds`` that a range of ``covered`` reads (columns nobody reads are
    not computed), each longer than ``limit`` cut into equal parts (multiples of 16 where the length is)."""
    segs: list[tuple[int, int]] = []
    for a, b in itertools.pairwise(bounds):
        if not any(s <= a and b <= e for s, e in covered):
            continue
        parts = -(-(b - a) // limit)
        step = -(-(b - a) // parts)
        if (b - a) % 16 == 0:
            step = -(-step // 16) * 16
        segs += [(s, min(b, s + step)) for s in range(a, b, step)]
    return segs


#: ops that read a product in whatever layout the compiler holds it (channels-first after its MatMul lowering): a
#: piece read only through these into the next MatMul (SwiGLU's gate and up halves, FLUX.2's FFN and Ovis-Image's)
#: needs no Transpose back
_ANY_LAYOUT = frozenset({"Add", "Sub", "Mul", "Div", "Sigmoid", "Tanh", "Relu", "Gelu", "Erf", "Sqrt", "Pow", "Cast",
                         "Neg", "Exp", "Softplus", "HardSigmoid", "LeakyRelu", "Clip"})


def _needs_tokens_first(view: GraphEdit, tensor: str, budget: int = 32) -> bool:
    """``tensor``, or what elementwise ops make of it, is the stage's output or read by an op that is neither
    elementwise nor a MatMul reading it on the left (a Reshape into heads, a Concat, a Transpose): the compiler
    transposes the product back to tokens-first.  A SwiGLU's halves, ``silu(gate) * up`` into the down projection,
    stay channels-first.  Past ``budget`` ops followed: assumed so."""
    todo, seen = [tensor], set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in view.outputs or len(seen) > budget:
            return True
        for r in view.readers(t):
            if r.op_type == "MatMul" and r.input[0] == t and r.input[1] != t:
                continue
            if r.op_type not in _ANY_LAYOUT or r.domain not in ("", "ai.onnx"):
                return True
            todo.extend(r.output)
    return False


def wide_matmul_columns(view: GraphEdit, limit: int = MAX_OUT_CHANNELS) -> int:
    """``MatMul(x, W)``, ``W`` a constant ``[K, N]`` with ``N`` > ``limit`` (and a constant bias ``Add`` of ``[N]``
    after it, when that is its one reader) -> one MatMul per column range on ``W``'s columns (and the bias's).

    The ranges are the pieces the product is read as (:func:`_column_leaves`: FLUX.2's single-stream block slices
    its 27648-wide fused projection into q, k, v and the MLP's gate and up halves), each cut to at most ``limit``
    columns; a piece of several ranges is their ``Concat``; only where a piece needs the tokens-first layout
    (:func:`_needs_tokens_first`: FLUX.2's q, k and v go into a Reshape to heads, the MLP half into the Concat
    before ``to_out``).  A product that is the stage's output is cut into equal ranges concatenated back to the
    whole.  Left alone: a product whose pieces are read elementwise into the next MatMul (SwiGLU's gate and up
    halves: FLUX.2's 18432-wide FFN builds with 0 CPU layers either way, the same memory), a product read whole by
    other ops (an FFN's GELU, the next MatMul: the compiler keeps it channels-first, no Transpose; FLUX.1's
    12288-wide GELU FFN at its width builds with 0 CPU layers), and one row (a modulation GEMV: not measured).
    Each output element is the same dot product (and bias add) as before."""
    shapes = view.static_shapes()
    outputs = view.outputs
    view.new_names()
    bounds_of: set[str] = set()  # the inputs of the Slices replaced: their starts, ends, axes and steps
    count = 0
    for i in list(view.matches("MatMul")):
        mm = view.graph.node[i]
        y = mm.output[0]
        w = view.const_array(mm.input[1])
        ys = shapes.get(y)
        if w is None or w.ndim != 2 or w.shape[1] <= limit or ys is None or len(ys) < 2 or ys[-1] != w.shape[1] \
                or math.prod(ys[:-1]) < 2 or view.elem(y) not in _FLOATS:
            continue
        n, rank = int(w.shape[1]), len(ys)
        head: str = y
        bias: tuple[np.ndarray, bool] | None = None  # the bias's values, and whether the product is its first input
        bias_node: onnx.NodeProto | None = None
        first = view.readers(y)
        if len(first) == 1 and first[0].op_type == "Add" and first[0].domain in ("", "ai.onnx") and y not in outputs:
            add = first[0]
            vec = view.const_array(add.input[1] if add.input[0] == y else add.input[0])
            if vec is not None and vec.ndim == 1 and vec.shape[0] == n and add.output[0] not in outputs:
                head, bias, bias_node = add.output[0], (vec, add.input[0] == y), add
        leaves: list[tuple[str, int, int]] = []
        inner: list[str] = []
        if not _column_leaves(view, head, n, rank, 0, leaves, inner):
            if head not in outputs:
                continue  # read whole by the stage (a GELU, the next MatMul): the compiler keeps it channels-first
            leaves, inner = [(head, 0, n)], []
        elif not any(_needs_tokens_first(view, out) for out, _, _ in leaves):
            continue  # SwiGLU's halves into the down projection: kept channels-first, no Transpose (FLUX.2's FFN)
        bounds = sorted({0, n} | {c for _, a, b in leaves for c in (a, b)})
        segs = _column_segments(bounds, [(a, b) for _, a, b in leaves], limit)
        # a leaf that is one range is that range's product itself (the first such leaf; a twin copies it)
        named: dict[tuple[int, int], str] = {}
        for out, a, b in leaves:
            if (a, b) in segs and (a, b) not in named:
                named[(a, b)] = out
        base = mm.name or y
        new: list[onnx.NodeProto] = []
        seg_out: dict[tuple[int, int], str] = {}
        for c, (a, b) in enumerate(segs):
            wn = view.add_constant(f"{base}/cols{c}_weight", np.ascontiguousarray(w[:, a:b]))
            last = named.get((a, b)) or view.fresh(f"{base}/cols{c}")
            prod = last if bias is None else view.fresh(f"{base}/cols{c}_product")
            new.append(helper.make_node("MatMul", [mm.input[0], wn], [prod], name=f"{base}/cols{c}"))
            if bias is not None:
                bn = view.add_constant(f"{base}/cols{c}_bias", np.ascontiguousarray(bias[0][a:b]))
                new.append(helper.make_node("Add", [prod, bn] if bias[1] else [bn, prod], [last],
                                            name=f"{base}/cols{c}_bias"))
            seg_out[(a, b)] = last
        for out, a, b in leaves:
            pieces = [seg_out[s] for s in segs if a <= s[0] and s[1] <= b]
            if pieces == [out]:
                continue
            name = view.fresh(f"{base}/cols_{out}")
            new.append(helper.make_node("Identity", pieces, [out], name=name) if len(pieces) == 1 else
                       helper.make_node("Concat", pieces, [out], name=name, axis=rank - 1))
        view.replace_later(i, new)
        # what the new nodes compute instead: the bias Add, the Slices looked through and the leaves' Slices
        replaced = {*inner, *(out for out, _, _ in leaves)} - {y}
        if bias_node is not None:
            replaced.add(bias_node.output[0])
        for k, node in enumerate(view.graph.node):
            if k != i and node.output and node.output[0] in replaced:
                view.replace_later(k, [])
                bounds_of.update(node.input[1:])
        count += 1
    if count:
        view.apply_edits()
        # the Slices' bounds computed in the graph (the exporter's chunk widths), now read by nobody
        while True:
            read = {t for n in view.graph.node for t in n.input} | view.outputs
            dead = [n for n in view.graph.node if n.output and set(n.output) & bounds_of and not set(n.output) & read]
            if not dead:
                break
            bounds_of = {t for n in dead for t in n.input}
            view.set_nodes(n for n in view.graph.node if not any(n is d for d in dead))
        view.drop_unread_initializers()  # the whole weights and biases, now read by nobody
    return count
