"""Multiply-accumulates of the weighted ops, from static shapes.

:func:`rkpart.ir.work.node_macs` is the one MAC counter; ``op_macs`` and ``output_rows``
answer it for an op of a :class:`~rkpart.ir.graph.ModelGraph`.  *Rows* are
the independent vectors an op computes (every output element but the last axis of a
matrix product, every output position of a convolution): a per-step modulation GEMV
(``SiLU(t_emb) @ W``) has one, a token-wise linear layer one per token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rkpart.ir.graph import ModelGraph, OpNode
from rkpart.ir.ops import CONV_OPS, MAC_OPS
from rkpart.ir.tensors import TensorType
from rkpart.ir.work import node_macs, numel

#: ops with at most this many output rows are vector products (GEMVs), not token work
GEMV_ROWS = 2


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


__all__ = ["GEMV_ROWS", "node_rows", "op_macs", "output_rows", "token_macs"]
