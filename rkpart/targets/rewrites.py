"""Graph rewrites rkpart applies before a toolkit sees a stage: one table, one entry per pattern.

Two kinds of entry:

``lower``
    The op has no ``onnx.version_converter`` adapter down to the toolkit's opset (Gelu and
    AffineGrid did not exist before opset 20; ConstantOfShape-20 and GridSample-20 have no
    down-adapter).  The rewrite replaces it by ops that exist at the lower opset, in the form
    the TorchScript exporter writes (so the toolkit's own fusion rules recognise it).
``npu``
    The op converts but the toolkit places it on the CPU inside an NPU stage (one
    NPU -> CPU -> NPU round trip on the board).  The rewrite is an exactly equivalent form
    the toolkit places on the NPU; each entry cites the measured placement that justifies it
    (``evidence``: the verbose "Network Layer Information Table" Target column of real builds).

The IsNaN guard after a masked Softmax (``nan-guard``): ``IsNaN`` and its direct exact
replacements ``Equal(p, p)`` / ``Greater(p, -1)`` are all placed on the CPU by 2.3.0 and 2.5.0
(as are Exp, Log, ReduceMax, Min, Less, Not, Or and a Div by a tensor); the row-validity form
kept here uses only Where, MatMul, Clip, Mul and Add, which both place on the NPU.

Every rewrite is checked by its caller: the rewritten stage must match the original under
ONNX Runtime before it is kept (:mod:`rkpart.compile.prepare`).

Layer: :mod:`rkpart.targets`; imports onnx and nothing of rkpart but :mod:`rkpart.errors`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: a rewrite: edits ``graph`` in place and returns how many matches it rewrote
Apply = Callable[[onnx.GraphProto, "_Types"], int]


@dataclass(frozen=True)
class Rewrite:
    """One row of :data:`REWRITES`."""

    name: str
    op_type: str  # the op the pattern starts from
    kind: str  # "lower" or "npu"
    toolkits: tuple[str, ...]  # versions it applies to; ("*",) = every version
    evidence: str  # why: the missing adapter, or the measured placement before/after
    apply: Apply
    every_node: bool = False  # rewrites every node of ``op_type`` (not only a pattern around it)

    def applies_to(self, toolkit: str) -> bool:
        return "*" in self.toolkits or toolkit in self.toolkits


class _Types:
    """Element types of the graph's tensors (from shape inference), float when unknown."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.elem: dict[str, int] = {}
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:  # noqa: BLE001 - inference is a hint; an unknown type defaults to float
            inferred = model
        g = inferred.graph
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.HasField("tensor_type"):
                self.elem[vi.name] = vi.type.tensor_type.elem_type
        for init in g.initializer:
            self.elem[init.name] = init.data_type

    def of(self, name: str) -> int:
        return self.elem.get(name, onnx.TensorProto.FLOAT)


def _wiring(graph: onnx.GraphProto) -> tuple[dict[str, onnx.NodeProto], dict[str, int], set[str]]:
    """What the rewrites look up: tensor -> producing node, tensor -> number of reads, graph outputs."""
    prod = {o: n for n in graph.node for o in n.output}
    uses: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    return prod, uses, {o.name for o in graph.output}


class _Namer:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.used = {o for n in graph.node for o in n.output} | {i.name for i in graph.initializer}
        self.used |= {i.name for i in graph.input}

    def __call__(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name


def _const(graph: onnx.GraphProto, namer: _Namer, base: str, value: float, elem: int) -> str:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    name = namer(base)
    graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
    return name


def _replace(graph: onnx.GraphProto, index: int, new: list[onnx.NodeProto]) -> None:
    nodes = list(graph.node)
    nodes[index:index + 1] = new
    del graph.node[:]
    graph.node.extend(nodes)


def _matches(graph: onnx.GraphProto, op_type: str) -> Iterator[int]:
    """Indices of ``op_type`` nodes (default domain), last first so replacing keeps indices valid."""
    for i in range(len(graph.node) - 1, -1, -1):
        n = graph.node[i]
        if n.op_type == op_type and n.domain in ("", "ai.onnx"):
            yield i


def _attr(node: onnx.NodeProto, name: str, default: object) -> object:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _gelu(graph: onnx.GraphProto, types: _Types) -> int:
    """Gelu-20 -> the TorchScript exporter's decomposition (exact: Div/Erf/Add/Mul/Mul; tanh form)."""
    namer = _Namer(graph)
    count = 0
    for i in list(_matches(graph, "Gelu")):
        n = graph.node[i]
        approx = _attr(n, "approximate", b"none")
        approx = approx.decode() if isinstance(approx, bytes) else str(approx)
        _replace(graph, i, _gelu_nodes(graph, namer, n, types.of(n.input[0]), approx == "tanh"))
        count += 1
    return count


def _gelu_nodes(graph: onnx.GraphProto, namer: _Namer, n: onnx.NodeProto, elem: int,
                tanh: bool) -> list[onnx.NodeProto]:
    x, y = n.input[0], n.output[0]
    base = n.name or y

    def c(tag: str, v: float) -> str:
        return _const(graph, namer, f"{base}/{tag}", v, elem)

    def t(tag: str) -> str:
        return namer(f"{base}/{tag}")

    mk = helper.make_node
    if tanh:
        xx, cube, kx, inner, scaled, th, one_p, xm = (t(s) for s in (
            "x2", "x3", "kappa_x3", "inner", "beta_inner", "tanh", "one_plus", "x_mul"))
        return [
            mk("Mul", [x, x], [xx], name=f"{base}/Mul_x2"),
            mk("Mul", [x, xx], [cube], name=f"{base}/Mul_x3"),
            mk("Mul", [c("kappa", 0.044715), cube], [kx], name=f"{base}/Mul_kappa"),
            mk("Add", [x, kx], [inner], name=f"{base}/Add_inner"),
            mk("Mul", [c("beta", math.sqrt(2 / math.pi)), inner], [scaled], name=f"{base}/Mul_beta"),
            mk("Tanh", [scaled], [th], name=f"{base}/Tanh"),
            mk("Add", [c("one", 1.0), th], [one_p], name=f"{base}/Add_one"),
            mk("Mul", [x, one_p], [xm], name=f"{base}/Mul_x"),
            mk("Mul", [c("half", 0.5), xm], [y], name=f"{base}/Mul_half"),
        ]
    d, e, a, m = (t(s) for s in ("div", "erf", "add", "mul"))
    return [
        mk("Div", [x, c("sqrt2", 1.4142135623730951)], [d], name=f"{base}/Div"),
        mk("Erf", [d], [e], name=f"{base}/Erf"),
        mk("Add", [e, c("one", 1.0)], [a], name=f"{base}/Add"),
        mk("Mul", [x, a], [m], name=f"{base}/Mul"),
        mk("Mul", [m, c("half", 0.5)], [y], name=f"{base}/Mul_1"),
    ]


_SQRT2 = 1.4142135623730951


def _is_half_sqrt2(graph: onnx.GraphProto, name: str) -> bool:
    """``name`` is a one-element float16 constant holding float16(sqrt 2) = 1.4140625."""
    v = _const_array(graph, name)
    return v is not None and v.dtype == np.float16 and v.size == 1 and v.reshape(()) == np.float16(_SQRT2)


def _erf_sqrt2_f32(graph: onnx.GraphProto, types: _Types) -> int:
    """Erf-GELU in float16: ``Erf(Div(x, c))`` with ``c`` = float16(sqrt 2) -> ``c`` made by
    ``Cast(float32 sqrt 2 -> float16)`` (the same float16 value under ONNX Runtime, bit for bit)."""
    index = {o: k for k, n in enumerate(graph.node) for o in n.output}
    namer = _Namer(graph)
    casts: dict[int, onnx.NodeProto] = {}  # Div index -> the Cast to insert before it
    for n in graph.node:
        if n.op_type != "Erf" or n.domain not in ("", "ai.onnx"):
            continue
        j = index.get(n.input[0])
        if j is None or j in casts:
            continue
        div = graph.node[j]
        if div.op_type != "Div" or len(div.input) != 2 or not _is_half_sqrt2(graph, div.input[1]):
            continue
        base = div.name or div.output[0]
        f32 = namer(f"{base}/sqrt2_f32")
        graph.initializer.append(numpy_helper.from_array(np.array(_SQRT2, dtype=np.float32), f32))
        half = namer(f"{base}/sqrt2")
        casts[j] = helper.make_node("Cast", [f32], [half], to=onnx.TensorProto.FLOAT16, name=f"{base}/Cast_sqrt2")
        div.input[1] = half
    if casts:
        nodes: list[onnx.NodeProto] = []
        for k, n in enumerate(graph.node):
            if k in casts:
                nodes.append(casts[k])
            nodes.append(n)
        del graph.node[:]
        graph.node.extend(nodes)
    return len(casts)


def _split_chunked_linear(graph: onnx.GraphProto, types: _Types) -> int:
    """A ``Gemm`` whose output is only read as column chunks (``emb.chunk(k, -1)`` of an AdaLN
    modulation: Slices of the last axis with constant bounds, or one Split of the last axis)
    -> one Gemm per chunk, on the chunk's rows of B (columns when ``transB`` = 0) and of C.

    Each output element is the same dot product and bias add as before.  Matches ``transA`` = 0
    with a 2-D constant B and a constant (or no) C.
    """
    shapes = _static_shapes(graph)
    outputs = {o.name for o in graph.output}
    readers: dict[str, list[int]] = {}  # tensor -> indices of the nodes that read it
    for j, n in enumerate(graph.node):
        for i in n.input:
            readers.setdefault(i, []).append(j)
    namer = _Namer(graph)
    edits: dict[int, list[onnx.NodeProto]] = {}  # linear's index -> its replacement
    drop: set[int] = set()  # indices of the Slices / Splits the new Gemms replace
    for k, lin in enumerate(graph.node):
        if lin.op_type != "Gemm" or lin.domain not in ("", "ai.onnx") or lin.output[0] in outputs \
                or _attr(lin, "transA", 0):
            continue
        w = _const_array(graph, lin.input[1])
        if w is None or w.ndim != 2:
            continue
        trans_b = bool(_attr(lin, "transB", 0))
        n_out = w.shape[0] if trans_b else w.shape[1]
        bias = None
        if len(lin.input) > 2 and lin.input[2]:
            bias = _const_array(graph, lin.input[2])
            if bias is None or bias.size not in (1, n_out) or bias.ndim > 1:
                continue
        out_shape = shapes.get(lin.output[0])
        if out_shape is None or out_shape[-1] != n_out:
            continue
        slices = [graph.node[j] for j in readers.get(lin.output[0], [])]
        chunks = _split_ranges(graph, slices[0], len(out_shape), n_out) if len(slices) == 1 else None
        if chunks is None and len(slices) >= 2:
            ranges = [_slice_range(graph, sl, len(out_shape), n_out) for sl in slices]
            chunks = [(sl.output[0], *r) for sl, r in zip(slices, ranges, strict=True) if r is not None]
            if len(chunks) != len(slices):
                chunks = None
        if chunks:
            base = lin.name or lin.output[0]
            new = []
            for c, (out, a, b) in enumerate(chunks):
                wc = w[a:b] if trans_b else w[:, a:b]
                wn = namer(f"{base}/chunk{c}_weight")
                graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(wc), wn))
                ins = [lin.input[0], wn]
                if bias is not None:
                    bn = namer(f"{base}/chunk{c}_bias")
                    bc = bias if bias.size == 1 else bias[a:b]
                    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(bc), bn))
                    ins.append(bn)
                attrs = {a_.name: helper.get_attribute_value(a_) for a_ in lin.attribute}
                new.append(helper.make_node(lin.op_type, ins, [out], name=f"{base}_chunk{c}", **attrs))
            drop.update(readers[lin.output[0]])
            edits[k] = new
    if not edits:
        return 0
    nodes: list[onnx.NodeProto] = []
    for k, n in enumerate(graph.node):
        if k in edits:
            nodes.extend(edits[k])
        elif k not in drop:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    unused = [t for t in graph.initializer if t.name not in read]
    for t in unused:  # the whole weights and biases, now read by nobody
        graph.initializer.remove(t)
    return len(edits)


def _split_ranges(graph: onnx.GraphProto, sp: onnx.NodeProto, rank: int,
                  n: int) -> list[tuple[str, int, int]] | None:
    """[(output, start, end)] of a Split of the last axis into static parts (unused outputs left out)."""
    if sp.op_type != "Split" or sp.domain not in ("", "ai.onnx"):
        return None
    if int(_attr(sp, "axis", 0)) not in (-1, rank - 1):  # type: ignore[call-overload]
        return None
    k = len(sp.output)
    sizes: object = _attr(sp, "split", None)
    if len(sp.input) > 1 and sp.input[1]:
        sizes = _folded(graph, sp.input[1])
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


def _slice_range(graph: onnx.GraphProto, sl: onnx.NodeProto, rank: int, n: int) -> tuple[int, int] | None:
    """(start, end) of a Slice of the last axis with constant bounds and step 1, else None."""
    if sl.op_type != "Slice" or sl.domain not in ("", "ai.onnx") or len(sl.input) < 3:
        return None
    vals = [_folded(graph, sl.input[j]) if len(sl.input) > j and sl.input[j] else None for j in range(1, 5)]
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


def _scalar(graph: onnx.GraphProto, name: str) -> float | None:
    v = _const_array(graph, name)
    return float(v.reshape(())) if v is not None and v.size == 1 and v.dtype.kind == "f" else None


def _nan_guard(graph: onnx.GraphProto, types: _Types, broadcast_fill: bool = True) -> int:
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
    if types.opset < 13:  # Softmax and Clip changed meaning at 13 / 11
        return 0
    shapes = _static_shapes(graph)
    index = {o: k for k, n in enumerate(graph.node) for o in n.output}
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(graph.node):
        for i in n.input:
            readers.setdefault(i, []).append(k)
    outputs = {o.name for o in graph.output}
    namer = _Namer(graph)
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
                or _scalar(graph, w.input[1]) != 0.0 or sorted(readers.get(p, [])) != sorted([ki, kw]):
            continue
        x = sm.input[0]
        rank = len(shapes.get(x, []))
        ka = index.get(x)
        axis = _attr(sm, "axis", -1)
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
            a, b = _scalar(graph, m.input[1]), _scalar(graph, m.input[2])
            if a is not None and b is not None and 0.0 in (a, b) and min(a, b) < 0 \
                    and len(shapes.get(m.input[0], [])) >= 1:
                break
        else:
            continue
        if math.isfinite(min(a, b)):
            # a finite fill (dynamo writes float32's lowest): no row is all -inf, Softmax gives no NaN
            # (float32 scores above -2e31), the guard does nothing.  Not in float16: s - 65504
            # overflows to -inf once s < -16.
            if types.of(x) == onnx.TensorProto.FLOAT:
                replace[kw] = helper.make_node("Identity", [p], [w.output[0]], name=w.name or None)
                drop.add(ki)
            continue
        cond, zero_first = m.input[0], a == 0.0
        k_keys = shapes[cond][-1]
        elem = types.of(x)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        base = isnan.name or isnan.output[0]

        def c(tag: str, v: float | np.ndarray, base: str = base, dtype: np.dtype = dtype) -> str:
            name = namer(f"{base}/{tag}")
            graph.initializer.append(numpy_helper.from_array(np.asarray(v, dtype=dtype), name))
            return name

        def t(tag: str, base: str = base) -> str:
            return namer(f"{base}/{tag}")

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
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replace)


def _grid_sample(graph: onnx.GraphProto, types: _Types) -> int:
    """GridSample-20 -> GridSample-16: the modes were renamed (linear -> bilinear, cubic -> bicubic)."""
    count = 0
    for i in _matches(graph, "GridSample"):
        for a in graph.node[i].attribute:
            if a.name == "mode" and a.s in (b"linear", b"cubic"):
                a.s = {b"linear": b"bilinear", b"cubic": b"bicubic"}[a.s]
        count += 1
    return count


def _reciprocal(graph: onnx.GraphProto, types: _Types) -> int:
    """``Reciprocal(v)`` -> ``Div(1, v)``."""
    namer = _Namer(graph)
    count = 0
    for i in list(_matches(graph, "Reciprocal")):
        n = graph.node[i]
        one = _const(graph, namer, f"{n.name or n.output[0]}/one", 1.0, types.of(n.input[0]))
        _replace(graph, i, [helper.make_node("Div", [one, n.input[0]], [n.output[0]], name=n.name or None)])
        count += 1
    return count


def _const_array(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    for t in graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for n in graph.node:
        if n.op_type == "Constant" and n.output[0] == name:
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
    return None


def _interleave(graph: onnx.GraphProto, types: _Types) -> int:
    """A chain of ScatterND that fills a tensor with k updates interleaved along one axis
    (``out[..., 0::2] = a; out[..., 1::2] = b``: RoPE in Wan and others) ->
    ``Reshape(Concat(Unsqueeze(a, ax+1), Unsqueeze(b, ax+1), axis=ax+1), shape)``.

    Only chains whose indices are constants and cover every element exactly once are rewritten;
    the data tensor they start from is then irrelevant (its shape is the result's shape).
    Intermediate results that something else reads stay computed.
    """
    count = 0
    while True:
        done = _interleave_once(graph)
        if not done:
            return count
        count += 1


def _interleave_once(graph: onnx.GraphProto) -> bool:
    prod, uses, outputs = _wiring(graph)
    shapes = _static_shapes(graph)
    for last in graph.node:
        if last.op_type != "ScatterND" or _attr(last, "reduction", b"none") not in (b"none", "none"):
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
            if p is None or p.op_type != "ScatterND" or _attr(p, "reduction", b"none") not in (b"none", "none"):
                break
            seq[0:0] = [p, *reversed(hops)]
            chain.insert(0, p)
            data = p.input[0]
        if len(chain) < 2:
            continue
        shape = shapes.get(chain[0].input[0])
        idxs = [_const_array(graph, n.input[1]) for n in chain]
        if shape is None or any(a is None for a in idxs):
            continue
        plan = _interleave_plan(shape, [a for a in idxs if a is not None])
        if plan is None:
            continue
        axis, order = plan
        namer = _Namer(graph)
        base = last.name or last.output[0]
        new: list[onnx.NodeProto] = []
        ax_name = namer(f"{base}/unsq_axis")
        graph.initializer.append(numpy_helper.from_array(np.array([axis + 1], dtype=np.int64), ax_name))
        parts = []
        for c in order:
            upd = chain[c].input[2]
            u = namer(f"{base}/unsq{c}")
            new.append(helper.make_node("Unsqueeze", [upd, ax_name], [u], name=f"{base}/Unsqueeze_{c}"))
            parts.append(u)
        cat = namer(f"{base}/interleaved")
        new.append(helper.make_node("Concat", parts, [cat], axis=axis + 1, name=f"{base}/Concat"))
        shp = namer(f"{base}/shape")
        graph.initializer.append(numpy_helper.from_array(np.array(shape, dtype=np.int64), shp))
        new.append(helper.make_node("Reshape", [cat, shp], [last.output[0]], name=f"{base}/Reshape"))
        # intermediate results read by something else (TorchScript slices them; a fused stage
        # may output them): written the same way with the data's constant values in the offsets
        # not filled yet, else they stay computed by the original chain
        direct = [n for n in seq[:-1] if uses.get(n.output[0], 0) > 1 or n.output[0] in outputs]
        fill = _folded(graph, chain[0].input[0]) if direct else None
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
                        u = namer(f"{ib}/unsq{c}")
                        at.setdefault(n.output[0], []).append(helper.make_node(
                            "Unsqueeze", [chain[c].input[2], ax_name], [u], name=f"{ib}/Unsqueeze_{c}"))
                    else:
                        u = namer(f"{ib}/data{off}")
                        graph.initializer.append(numpy_helper.from_array(
                            np.ascontiguousarray(np.take(blocks, [off], axis=axis + 1)), u))
                    parts.append(u)
                cat_t = namer(f"{ib}/interleaved")
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
        del graph.node[:]
        graph.node.extend(kept)
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


def _static_shapes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {t.name: list(t.dims) for t in graph.initializer}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            out.setdefault(vi.name, [d.dim_value for d in dims])
    return out


def _folded(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    """The value of ``name`` when it depends on constants only (evaluated with onnx.reference), else None."""
    direct = _const_array(graph, name)
    if direct is not None:
        return direct
    prod = {o: n for n in graph.node for o in n.output}
    inits = {t.name: t for t in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    need: set[str] = set()
    todo, seen = [name], set()
    while todo:
        t = todo.pop()
        if t in seen or not t:
            continue
        seen.add(t)
        if t in inits:
            need.add(t)
            continue
        p = prod.get(t)
        if p is None or len(nodes) > 64 or p.op_type in ("If", "Loop", "Scan"):
            return None  # a graph input, or too much to fold here
        if p not in nodes:
            nodes.append(p)
        todo.extend(p.input)
    order = [n for n in graph.node if any(n is m for m in nodes)]
    sub = helper.make_graph(order, "fold", [], [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED,
                                                                                  None)],
                            initializer=[inits[t] for t in sorted(need)])
    try:
        from onnx.reference import ReferenceEvaluator

        (value,) = ReferenceEvaluator(helper.make_model(sub, opset_imports=[helper.make_opsetid("", 19)])).run(
            None, {})
    except Exception:  # noqa: BLE001 - an unfoldable value just means the pattern does not match
        return None
    return np.asarray(value)


def _pad_concat(graph: onnx.GraphProto, types: _Types) -> int:
    """Constant-mode Pad with constant pads and value -> Concat with constant blocks, axis by axis.

    Sana's linear attention pads V with a row of ones (``F.pad(v, (0, 0, 0, 1), value=1.0)``).
    """
    shapes = _static_shapes(graph)
    namer = _Namer(graph)
    count = 0
    for i in list(_matches(graph, "Pad")):
        n = graph.node[i]
        mode = _attr(n, "mode", b"constant")
        if mode not in (b"constant", "constant") or (len(n.input) > 3 and n.input[3]):
            continue
        shape = shapes.get(n.input[0])
        pads = _folded(graph, n.input[1]) if len(n.input) > 1 and n.input[1] else None
        if shape is None or pads is None or pads.size != 2 * len(shape) or (pads < 0).any():
            continue
        value = _folded(graph, n.input[2]) if len(n.input) > 2 and n.input[2] else np.zeros(())
        if value is None or value.size != 1:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(types.of(n.input[0]))
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
                    c = namer(f"{base}/{side}{a}")
                    graph.initializer.append(numpy_helper.from_array(
                        np.full(block, value.reshape(()), dtype=dtype), c))
                    parts.append(c)
            out = n.output[0] if k == len(axes) - 1 else namer(f"{base}/axis{a}")
            new.append(helper.make_node("Concat", parts, [out], axis=a, name=f"{base}/Concat_{a}"))
            cur = out
            dims[a] += int(pads[a]) + int(pads[a + rank])
        if not new:
            new = [helper.make_node("Identity", [n.input[0]], [n.output[0]], name=base)]
        _replace(graph, i, new)
        count += 1
    return count


#: ops whose opset-20 version only widened the type list (float8 / bfloat16 / bool): the same
#: node is valid one opset lower for every type the toolkit takes.  ``onnx.version_converter``
#: has adapters for IsNaN, IsInf, ReduceMax and ReduceMin; ConstantOfShape has none, so it is
#: carried through conversion unchanged (:func:`rkpart.targets.opset.lower_model`).
#: GridSample-20 is carried through the same way once ``gridsample20-modes`` renamed its modes
#: (4-D input: GridSample-16 and -20 compute the same).
TYPE_ONLY_CHANGES: dict[str, int] = {"ConstantOfShape": 20, "GridSample": 20}

#: ops that did not exist below opset 20 and have no decomposition here: a stage holding one
#: cannot be lowered (a one-line error names the op)
NO_LOWERING: dict[str, str] = {
    "AffineGrid": "introduced in opset 20, no decomposition",
    "ImageDecoder": "introduced in opset 20",
    "RegexFullMatch": "introduced in opset 20 (strings)",
    "StringConcat": "introduced in opset 20 (strings)",
    "StringSplit": "introduced in opset 20 (strings)",
}


def _layernorm_scale_fold(graph: onnx.GraphProto, types: _Types) -> int:
    """``Mul(T(LayerNorm(x; g, b)), c)``, ``c`` a constant scalar and ``T`` a chain of Reshape /
    Transpose that only feeds the Mul -> ``T(LayerNorm(x; g*c, b*c))`` (a scalar commutes with
    reshapes and transposes; the LayerNorm gets its own scaled copies of ``g`` and ``b``).

    The form dynamo writes for SDPA after a LayerNorm qk-norm (HunyuanDiT's cross-attention:
    ``k^T * sqrt(scale)``)."""
    prod, uses, outputs = _wiring(graph)
    namer = _Namer(graph)
    inits = {t.name: t for t in graph.initializer}
    count = 0
    for i in list(_matches(graph, "Mul")):
        mul = graph.node[i]
        for k in (0, 1):
            c = _const_array(graph, mul.input[1 - k])
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
                or any(o for o in ln.output[1:]) or not all(a in inits for a in ln.input[1:] if a)):
            continue
        for j, name in enumerate(ln.input[1:], start=1):
            if name:
                t = numpy_helper.to_array(inits[name])
                scaled = namer(f"{name}_x_scale")
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



def _strided_slices_concat(graph: onnx.GraphProto, types: _Types) -> int:
    """``Concat(x[.., s:s+L], x[.., s+P:s+P+L], ..., axis)``: k >= 2 constant Slices of one tensor
    along the Concat's axis, equal length ``L``, equally spaced (period ``P >= L``), in order ->
    ``Reshape(Slice(Reshape(Slice(x, s-o:s-o+k*P), [.., k, P, ..]), o:o+L), [.., k*L, ..])``, the
    offset ``o`` (0 when it fits) keeping the window of k periods inside the axis.

    Chroma's modulation picks such pieces of the approximator's output
    (``mod[:, 6:12]`` and ``mod[:, 18:24]``)."""
    shapes = _static_shapes(graph)
    namer = _Namer(graph)
    prod, uses, outputs = _wiring(graph)
    count = 0
    for i in list(_matches(graph, "Concat")):
        cat = graph.node[i]
        slices = [prod.get(x) for x in cat.input]
        if len(slices) < 2 or any(s is None or s.op_type != "Slice" or len(s.input) < 4 for s in slices):
            continue
        src = slices[0].input[0]  # type: ignore[union-attr]
        shape = shapes.get(src)
        if shape is None or any(s.input[0] != src for s in slices):  # type: ignore[union-attr]
            continue
        rank = len(shape)
        axis = int(_attr(cat, "axis", 0)) % rank  # type: ignore[call-overload]
        spans = []
        for s in slices:
            assert s is not None
            st, en, ax = (_const_array(graph, s.input[j]) for j in (1, 2, 3))
            step = _const_array(graph, s.input[4]) if len(s.input) > 4 and s.input[4] else np.array([1])
            if any(a is None or a.size != 1 for a in (st, en, ax, step)):
                break
            assert st is not None and en is not None and ax is not None and step is not None
            b, e = int(st.ravel()[0]), int(en.ravel()[0])
            if int(ax.ravel()[0]) % rank != axis or int(step.ravel()[0]) != 1 or not 0 <= b < e <= shape[axis]:
                break
            spans.append((b, e))
        else:
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
                name = namer(f"{base}/{tag}")
                graph.initializer.append(numpy_helper.from_array(np.array(v, dtype=np.int64), name))
                return name

            span, periods, picked = (namer(f"{base}/{t}") for t in ("span", "periods", "picked"))
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
            _replace(graph, i, new)
            # the Slices nothing else reads go (they precede the Concat: indices >= i are untouched)
            for s in slices:
                assert s is not None
                if uses.get(s.output[0], 0) == 1 and s.output[0] not in outputs and s in graph.node:
                    graph.node.remove(s)
            count += 1
    return count



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


def _norm_residual_sub(graph: onnx.GraphProto, types: _Types) -> int:
    """``Add(x, Mul(r, w))``, ``r`` an RMSNorm's normalised value and ``w`` its constant weight (a
    residual added to a norm's output with no modulation in between: Lumina2's context refiner,
    ``x + norm2(attn(x))``) -> ``Sub(x, Mul(r, -w))``: the same bits (negation is exact)."""
    prod, uses, outputs = _wiring(graph)
    namer = _Namer(graph)
    count = 0
    for add in graph.node:
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2:
            continue
        for k in (1, 0):
            mul = prod.get(add.input[k])
            if mul is None or mul.op_type != "Mul" or uses.get(mul.output[0]) != 1 or mul.output[0] in outputs:
                continue
            j = next((j for j in (1, 0) if _const_array(graph, mul.input[j]) is not None), None)
            if j is None or not _rms_normed(prod, mul.input[1 - j]):
                continue
            w = _const_array(graph, mul.input[j])
            if w is None or w.dtype.kind != "f" or w.ndim != 1:  # a norm's weight, not RoPE's cos table
                continue
            neg = namer(f"{mul.input[j]}_neg")
            graph.initializer.append(numpy_helper.from_array(-w, neg))
            mul.input[j] = neg
            x = add.input[1 - k]
            add.op_type = "Sub"
            del add.input[:]
            add.input.extend([x, mul.output[0]])
            count += 1
            break
    return count


def _tile_broadcast(graph: onnx.GraphProto, types: _Types) -> int:
    """``Tile(x, r)``, ``r`` constant, ``x`` of size 1 on every axis ``r`` repeats ->
    ``Mul(x, ones(r))``: the broadcast of a multiplication by one (bit-exact).  GQA's
    ``k.unsqueeze(3).repeat(1, 1, 1, n_rep, 1)`` (Lumina2)."""
    shapes = _static_shapes(graph)
    namer = _Namer(graph)
    count = 0
    for i in list(_matches(graph, "Tile")):
        n = graph.node[i]
        reps = _const_array(graph, n.input[1])
        shape = shapes.get(n.input[0])
        elem = types.of(n.input[0])
        if (reps is None or shape is None or reps.ndim != 1 or reps.size != len(shape)
                or elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
                or any(r > 1 and d != 1 for r, d in zip(reps.tolist(), shape, strict=True))):
            continue
        base = n.name or n.output[0]
        ones = namer(f"{base}/ones")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        graph.initializer.append(numpy_helper.from_array(np.ones(reps.astype(np.int64), dtype=dtype), ones))
        _replace(graph, i, [helper.make_node("Mul", [n.input[0], ones], [n.output[0]], name=f"{base}/Mul_ones")])
        count += 1
    return count


REWRITES: tuple[Rewrite, ...] = (
    Rewrite("gelu20-decompose", "Gelu", "lower", ("*",),
            "Gelu exists only from opset 20 (version_converter: 'No Previous Version of Gelu exists'); "
            "written as the TorchScript exporter's decomposition, which the toolkits fuse into exGelu",
            _gelu),
    Rewrite("gridsample20-modes", "GridSample", "lower", ("*",),
            "version_converter has no adapter from GridSample-20; only the mode names changed", _grid_sample),
    Rewrite("reciprocal-to-div", "Reciprocal", "npu", ("*",),
            "RMSNorm's rsqrt as Reciprocal(Sqrt(mean(x^2)+eps)) (dynamo exports): the toolkit turns the "
            "Reciprocal into a Div placed on the CPU ('Div:node_rsqrt#1', CPU). As Div(1, Sqrt(...)) its "
            "replace_rms_norm fusion takes the whole norm onto the NPU. Measured on a tiny Flux, dynamo "
            "opset 20, split plan: 12 CPU layers -> 0 with 2.3.0 and with 2.5.0", _reciprocal, every_node=True),
    Rewrite("scatternd-interleave", "ScatterND", "npu", ("*",),
            "RoPE written as out[..., 0::2] = a; out[..., 1::2] = b (Wan): the second ScatterND of each "
            "chain runs on the CPU ('ScatterND:/model/blocks.0/attn1/ScatterND_1', CPU; dynamo: "
            "'ScatterND:node_ScatterND_321'; 2.3.0 puts both of each chain there). As Unsqueeze/Concat/Reshape "
            "it stays on the NPU. Measured on a tiny Wan, split plan, ScatterND layers on the CPU: "
            "TorchScript 4 -> 0 (2.5.0), 8 -> 0 (2.3.0); dynamo 4 -> 0 (2.5.0) and all 16 CPU layers "
            "-> 0 with reciprocal-to-div (2.3.0)",
            _interleave),
    Rewrite("gelu-f16-sqrt2", "Erf", "npu", ("*",),
            "Erf-GELU of a float16 model (Anima's FFN; any fp16 TorchScript export of nn.GELU): the "
            "exporter's Div(x, sqrt 2) carries float16(sqrt 2) = 1.4140625, and the toolkits' "
            "replace_torch_gelu fusion matches only the float32 sqrt 2 (1.41421 already fails), so the "
            "Erf runs on the CPU ('Erf:/transformer_blocks.0/ff/net.0/Erf', CPU). With the constant made "
            "by Cast(float32 sqrt 2 -> float16) (the same float16 value under ONNX Runtime) the toolkit "
            "fuses MatMul+GELU into ConvExGelu on the NPU. Measured: tiny fp16 MatMul-GELU-MatMul 1 CPU "
            "layer -> 0 on 2.3.0, 2.3.2, 2.5.0; Anima (1 block, hidden 256, 256 px, fp16) split and fused "
            "plans 1 -> 0 on 2.3.0 and 2.5.0",
            _erf_sqrt2_f32),
    Rewrite("adaln-chunk-gemm", "Gemm", "npu", ("2.3.0", "2.3.2"),
            "AdaLN modulation Gemm read as chunks (emb.chunk(6, -1): Slices, or a Split from dynamo): 2.3.0's "
            "merge_parallel_op_after_split merges the two '+1' Adds on the scale chunks into one Add on a "
            "Concat and inserts a Transpose it places on the CPU ('Transpose:/model/transformer_blocks.0/"
            "norm1/Slice_1_output_0-rs_concat-rs_tp', (1,32,2,1) -> (2,32,1,1)). One Gemm per chunk (the "
            "chunk's rows of the weight and bias) leaves no Split to merge after. Measured on fused plans, "
            "2.3.0: Flux (TorchScript, dynamo) 4 CPU layers -> 0, DiT 1 Transpose per block -> 0; 2.5.0 "
            "has no such Transpose (not applied). 2.3.2 crashes on these blocks either way (same "
            "operator list as 2.3.0)",
            _split_chunked_linear),
    Rewrite("nan-guard", "IsNaN", "npu", ("*",),
            "The guard Where(IsNaN(p), 0, p) after Softmax(s + Where(mask, 0, -inf)) (scaled_dot_product_attention "
            "with a bool mask, TorchScript): 'IsNaN:/IsNaN' on the CPU with 2.3.0 and 2.5.0 (Equal(p, p), "
            "Greater(p, -1), Exp, Log, ReduceMax: CPU too). Rewritten with a per-row 'has a key' factor from "
            "Where/MatMul/Clip and a fill that is -inf only in such rows (so a hidden row's Softmax is finite, "
            "times 0): bit-exact under ORT for finite scores, all NPU. Dynamo writes float32's lowest instead of "
            "-inf: no row can be NaN (scores above -2e31), the guard is dropped (float32 only). Measured on a "
            "tiny SDPA with a bool mask, both exporters: 1 CPU layer -> 0 on 2.3.0 and 2.5.0; under rknn-sim "
            "(2.3.0) the original gives 0.69 instead of 0 on a fully masked row (the NPU saturates -inf, no "
            "NaN), the rewrite gives 0. The fill is broadcast to the mask's shape (times ones[.., K]) before "
            "its Where: without that 2.5.0 SIGSEGVs in convert_exmatmul_to_conv on Lumina2's caption-refiner "
            "attention (a Where whose computed branch [1,1,1,1] broadcasts against the [1,1,1,6] mask; the "
            "MatMul, ReduceSum instead of it, the final Mul and a finite fill all crash the same, only the "
            "broadcast builds). Measured on a tiny Lumina2, TorchScript, split, caption-refiner stage: "
            "'IsNaN:/model/context_refiner.0/attn/IsNaN' on the CPU -> gone, on 2.5.0 and 2.3.0 (the mask's "
            "Reshape and Cast stay: int64 ops, the partitioner's side)",
            _nan_guard),
    Rewrite("pad-to-concat", "Pad", "npu", ("2.3.0", "2.3.2"),
            "Sana's linear attention pads V with a row of ones (pads computed from constants): 2.3.0 places "
            "the Pad on the CPU ('Pad:/model/transformer_blocks.0/attn1/Pad', CPU), 2.5.0 on the NPU. As a "
            "Concat with a constant block it stays on the NPU. Measured on a tiny Sana, split plan, 2.3.0: "
            "TorchScript and dynamo 2 CPU layers -> 0. 2.3.2 (same operator list as 2.3.0) not measured",
            _pad_concat),
    Rewrite("norm-residual-sub", "Add", "npu", ("2.3.0", "2.3.2"),
            "A residual added straight to an RMSNorm's output (x + norm2(attn(x)), Lumina2's context refiner, "
            "no modulation in between): 2.3.0's fuse_exnorm_add folds the Add into the exNorm's beta as a "
            "computed (1,32,1,6) tensor and places that exNorm on the CPU ('exNorm:/model/context_refiner.0/"
            "norm2/ReduceMean_2rmsn', CPU; ffn_norm2 the same). As Sub(x, Mul(r, -w)) (bit-exact) nothing is "
            "folded. Measured on a tiny Lumina2, fused plan, 2.3.0, block 0: 2 exNorm CPU layers -> 0 "
            "(TorchScript and dynamo); 2.5.0 keeps that exNorm on the NPU (not applied). 2.3.2 not measured",
            _norm_residual_sub),
    # --- crash avoidance (issue 18) ---
    Rewrite("layernorm-scale-fold", "LayerNormalization", "npu", ("2.5.0",),
            "SIGSEGV avoided, not a placement: 2.5.0 crashes in its native compiler (last step "
            "convert_exmatmul_to_conv, after fuse_exnorm_mul folded the Mul) on LayerNorm -> Reshape -> "
            "Transpose -> Reshape -> Mul(constant scalar), the key side of a dynamo SDPA after a LayerNorm "
            "qk-norm (tiny HunyuanDiT, dynamo, split: both cross-attention stages; `rkpart repro` reduces "
            "them to those 5 nodes plus the query's RoPE Add and scale Mul). With the scalar folded into "
            "the LayerNorm's weight and bias both stages build, 0 CPU layers; 2.3.0 builds either form",
            _layernorm_scale_fold),
    Rewrite("strided-slices-concat", "Concat", "npu", ("2.5.0",),
            "SIGSEGV avoided, not a placement: 2.5.0 crashes in fuse_slice_slice_concat_to_conv on a Concat of "
            "two equally spaced constant Slices of one tensor (Chroma's modulation pieces mod[:, 6:12] and "
            "mod[:, 18:24]; tiny Chroma, fused plan, both double blocks, both exporters; the log stops at "
            "replace_torch_tanh_gelu, `rkpart repro` reduces the stage to those 3 nodes). As one Slice of "
            "the span, a Reshape into periods, one Slice and a Reshape back the stage builds; 2.3.0 builds "
            "either form",
            _strided_slices_concat),
    Rewrite("tile-broadcast", "Tile", "npu", ("2.5.0",),
            "GQA's key/value repeat (Unsqueeze, Tile [1,1,1,n_rep,1], Reshape; Lumina2): 2.5.0 turns the "
            "Tile into an Expand placed on the CPU ('Expand:/model/noise_refiner.0/attn/Tile#1', CPU), 2.3.0 "
            "keeps it on the NPU. As Mul(x, ones) it stays on the NPU. Measured on a tiny Lumina2, "
            "TorchScript, split plan, 2.5.0: 11 CPU layers -> 3 (the 8 Expand; the caption mask's "
            "Reshape, Cast and IsNaN stay). A Concat of copies instead fails both toolkits' optimiser "
            "(KeyError in remove_node after swap_reshape_mul)",
            _tile_broadcast),
)


def rewrites_for(toolkit: str, kind: str) -> tuple[Rewrite, ...]:
    """The table's rows of ``kind`` ("lower" or "npu") that apply to ``toolkit``."""
    return tuple(r for r in REWRITES if r.kind == kind and r.applies_to(toolkit))


def apply_rewrites(model: onnx.ModelProto, rows: tuple[Rewrite, ...]) -> dict[str, int]:
    """Apply ``rows`` to ``model`` in place; returns rewrite name -> matches rewritten (hits only)."""
    done: dict[str, int] = {}
    for r in rows:
        if not any(n.op_type == r.op_type for n in model.graph.node):
            continue
        if r.op_type in ("ScatterND", "Pad", "Gemm", "IsNaN", "Tile", "Concat"):  # need static shapes
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
            del model.graph.value_info[:]
            model.graph.value_info.extend(inferred.graph.value_info)
        k = r.apply(model.graph, _Types(model))
        if k:
            done[r.name] = k
    return done


__all__ = ["NO_LOWERING", "REWRITES", "TYPE_ONLY_CHANGES", "Rewrite", "apply_rewrites", "rewrites_for"]
