"""Crash workarounds: exact rewrites of patterns a toolkit's compiler crashes on (issue 18).

Not placements: each avoids a SIGSEGV recorded in :mod:`rkpart.targets.known_issues`.
"""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from rkpart.ir.edit import GraphEdit, attr


def layernorm_scale_fold(view: GraphEdit) -> int:
    """``Mul(T(LayerNorm(x; g, b)), c)``, ``c`` a constant scalar and ``T`` a chain of Reshape /
    Transpose that only feeds the Mul -> ``T(LayerNorm(x; g*c, b*c))`` (a scalar commutes with
    reshapes and transposes; the LayerNorm gets its own scaled copies of ``g`` and ``b``).

    The form dynamo writes for SDPA after a LayerNorm qk-norm (HunyuanDiT's cross-attention:
    ``k^T * sqrt(scale)``)."""
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
                or any(o for o in ln.output[1:]) or not all(a in inits for a in ln.input[1:] if a)):
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
        slices = [prod.get(x) for x in cat.input]
        if len(slices) < 2 or any(s is None or s.op_type != "Slice" or len(s.input) < 4 for s in slices):
            continue
        src = slices[0].input[0]  # type: ignore[union-attr]
        shape = shapes.get(src)
        if shape is None or any(s.input[0] != src for s in slices):  # type: ignore[union-attr]
            continue
        rank = len(shape)
        axis = int(attr(cat, "axis", 0)) % rank  # type: ignore[call-overload]
        spans = []
        for s in slices:
            assert s is not None
            st, en, ax = (view.const_array(s.input[j]) for j in (1, 2, 3))
            step = view.const_array(s.input[4]) if len(s.input) > 4 and s.input[4] else np.array([1])
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
                name = view.fresh(f"{base}/{tag}")
                graph.initializer.append(numpy_helper.from_array(np.array(v, dtype=np.int64), name))
                return name

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
            # the Slices nothing else reads go (they precede the Concat: indices >= i are untouched)
            for s in slices:
                assert s is not None
                if uses.get(s.output[0], 0) == 1 and s.output[0] not in outputs and s in graph.node:
                    graph.node.remove(s)
            count += 1
    return count


