"""How much work an op does, counted from static shapes (never by running it).

The cost model's features (:mod:`rkpart.cost_model.features`) sum these over a subgraph;
which ops count is :mod:`rkpart.ir.ops`' taxonomy (``MAC_OPS``, ``MATMUL_OPS``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rkpart.ir.ops import CONV_OPS, MATMUL_OPS
from rkpart.ir.tensors import TensorType

if TYPE_CHECKING:
    from rkpart.ir.graph import OpNode


def numel(shape: Iterable[int]) -> int:
    """Elements of a tensor of static ``shape``."""
    return int(math.prod(int(d) for d in shape))


def node_macs(node: OpNode, types: Mapping[str, TensorType]) -> int:
    """Multiply-accumulates of one MatMul / Gemm / Conv / ConvTranspose from its input/output
    shapes (0 for other ops, or when shapes are unknown)."""
    def shape(i: int) -> tuple[int, ...] | None:
        if i >= len(node.inputs) or not node.inputs[i]:
            return None
        t = types.get(node.inputs[i])
        return None if t is None else t[1]

    out = types.get(node.outputs[0]) if node.outputs else None
    if out is None:
        return 0
    op = node.op_type
    if op in MATMUL_OPS:
        a = shape(0)
        if a is None or not a:
            return 0
        k = int(a[-1])
        return numel(out[1]) * k
    if op == "Gemm":
        a = shape(0)
        if a is None or len(a) != 2:
            return 0
        trans_a = int(node.attr("transA", 0))
        k = int(a[0] if trans_a else a[1])
        return numel(out[1]) * k
    if op in CONV_OPS:
        w = shape(1)
        if w is None or len(w) < 2:
            return 0
        per_out = numel(w[1:])  # Cin/group * kernel
        if op == "ConvTranspose":
            x = shape(0)
            return 0 if x is None else numel(x) * int(w[1]) * numel(w[2:])
        return numel(out[1]) * per_out
    return 0


__all__ = ["node_macs", "numel"]
