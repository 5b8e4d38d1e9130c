"""How much work an op does, counted from static shapes (never by running it).

The cost model's features (:mod:`rkpart.cost_model.features`) sum these over a subgraph;
which ops count is :mod:`rkpart.ir.ops`' taxonomy (``MAC_OPS``, ``MATMUL_OPS``).
:func:`node_macs` is the one MAC counter; :func:`op_macs` and :func:`output_rows` answer it
for an op of a :class:`~rkpart.ir.graph.ModelGraph`.  *Rows* are the independent vectors an
op computes (every output element but the last axis of a matrix product, every output
position of a convolution): a per-step modulation GEMV (``SiLU(t_emb) @ W``) has one, a
token-wise linear layer one per token.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from rkpart.ir.graph import ModelGraph, OpNode
from rkpart.ir.ops import CONV_OPS, MAC_OPS, MATMUL_OPS
from rkpart.ir.tensors import TensorType

#: ops with at most this many output rows are vector products (GEMVs), not token work
GEMV_ROWS = 2


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


def node_rows(node: OpNode, types: Mapping[str, TensorType]) -> int:
    """Output rows of a weighted op (0 when its output shape is unknown)."""
    out = types.get(node.outputs[0]) if node.outputs else None
    if out is None or not out[1]:
        return 0
    shape = out[1]
    if node.op_type in CONV_OPS:
        # N x C x spatial...: one row per batch and output position
        return numel(shape[:1]) * numel(shape[2:]) if len(shape) >= 2 else 0
    return numel(shape[:-1])


def op_macs(mg: ModelGraph, i: int) -> int:
    """MACs of op ``i`` of ``mg`` (0 for ops that are not MatMul / Gemm / Conv / Einsum-like)."""
    n = mg.op(i)
    return node_macs(n, mg.tensor_types) if n.op_type in MAC_OPS else 0


def output_rows(mg: ModelGraph, i: int) -> int:
    """Output rows of op ``i`` (see the module docstring)."""
    return node_rows(mg.op(i), mg.tensor_types)


def token_macs(mg: ModelGraph, ops: Sequence[int] | frozenset[int] | set[int]) -> dict[int, int]:
    """``op -> MACs`` for the weighted ops among ``ops`` with more than :data:`GEMV_ROWS` output rows."""
    out: dict[int, int] = {}
    for i in ops:
        if mg.op(i).op_type not in MAC_OPS:
            continue
        m = op_macs(mg, i)
        if m and output_rows(mg, i) > GEMV_ROWS:
            out[i] = m
    return out


__all__ = ["GEMV_ROWS", "node_macs", "node_rows", "numel", "op_macs", "output_rows", "token_macs"]
