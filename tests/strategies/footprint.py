"""The generic strategy's memory model, written the slow and obvious way (a test oracle).

A segment (a set of op positions in model order) needs its weights (initializers its ops
read, directly or through constant ops, each once) plus, at its worst step, every tensor it
reads or writes that is alive: from its producer (or the segment's start) to its last
consumer anywhere (graph outputs: to the end), never past the segment's end.
"""

from __future__ import annotations

from rkpart.ir import ModelGraph


def footprint(mg: ModelGraph, ops: list[int]) -> tuple[int, int]:
    """``(weight bytes, peak activation bytes)`` of the op set ``ops`` (model-order indices)."""
    order = sorted(mg.ops.nodes)
    pos = {op: k for k, op in enumerate(order)}
    steps = sorted(pos[o] for o in ops)
    s, e = steps[0], steps[-1] + 1
    assert steps == list(range(s, e)), "segments are consecutive in model order"
    weights: set[str] = set()
    for o in ops:
        stack = [t for t in mg.nodes[o].input if t]
        while stack:
            t = stack.pop()
            if t in mg.initializers:
                weights.add(t)
            elif mg.is_const_tensor(t):
                stack.extend(x for x in mg.nodes[mg.producer[t]].input if x)
    w = sum(mg.weight_bytes(t) for t in weights)

    touched: set[str] = set()
    for o in ops:
        touched |= {t for t in [*mg.nodes[o].input, *mg.nodes[o].output] if t and not mg.is_const_tensor(t)}
    peak = 0
    for k in range(s, e):
        live = 0
        for t in touched:
            p = pos[mg.producer[t]] if t in mg.producer else -1
            uses = [pos[c] for c in mg.consumers.get(t, []) if c in pos]
            last = len(order) - 1 if t in mg.outputs else max([p, *uses])
            if max(p, s) <= k <= min(last, e - 1):
                live += mg.nbytes(t)
        peak = max(peak, live)
    return w, peak


def crossing(mg: ModelGraph, c: int) -> tuple[int, int]:
    """``(bytes, tensors)`` produced before model-order position ``c`` and read at or after it."""
    order = sorted(mg.ops.nodes)
    pos = {op: k for k, op in enumerate(order)}
    b = n = 0
    for t in {*mg.inputs, *mg.producer}:
        if mg.is_const_tensor(t):
            continue
        p = pos[mg.producer[t]] if t in mg.producer else -1
        if p < c and any(pos[x] >= c for x in mg.consumers.get(t, []) if x in pos):
            b += mg.nbytes(t)
            n += 1
    return b, n
