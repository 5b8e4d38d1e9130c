"""Tensor lifetimes over a schedule: when each tensor of a graph is born, read and last alive.

A *schedule* is an order of the graph's data ops (model order, a topological order, by
default); positions ``0 .. n-1`` index it.  A tensor is born at the position of the op that
produces it (``-1`` for a model input: alive before the first op) and stays alive up to its
last reader, or to the end for a model output; a tensor nobody reads lives only at its birth.
Memory estimates (:mod:`rkpart.strategies.generic`) are sums over these intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rkpart.ir.graph import ModelGraph


@dataclass(frozen=True)
class Lifetimes:
    """Lifetimes of every activation of a schedule, indexed alike (sorted by birth, then name)."""

    order: tuple[int, ...]
    names: tuple[str, ...]
    #: position of the producing op (-1 for a model input)
    born: np.ndarray
    #: sorted positions of the ops that read the tensor
    uses: tuple[tuple[int, ...], ...]
    #: last position the tensor is alive at (>= born)
    last: np.ndarray
    nbytes: np.ndarray

    @property
    def n(self) -> int:
        return len(self.order)

    def live_bytes(self) -> np.ndarray:
        """Bytes alive at each position of the schedule (int64, length ``n``)."""
        diff = np.zeros(self.n + 1, dtype=np.int64)
        np.add.at(diff, np.maximum(self.born, 0), self.nbytes)
        np.add.at(diff, self.last + 1, -self.nbytes)
        return np.cumsum(diff[: self.n])


def lifetimes(mg: ModelGraph, order: Sequence[int] | None = None) -> Lifetimes:
    """The :class:`Lifetimes` of ``mg``'s activations over ``order`` (default: all data ops in model order)."""
    order = tuple(sorted(mg.ops.nodes) if order is None else order)
    n = len(order)
    pos = {op: k for k, op in enumerate(order)}
    outputs = set(mg.outputs)
    prod: dict[str, int] = {t: -1 for t in mg.inputs}
    for k, op in enumerate(order):
        for t in mg.nodes[op].output:
            if t:
                prod[t] = k
    names = tuple(sorted(prod, key=lambda t: (prod[t], t)))
    uses: list[tuple[int, ...]] = []
    last: list[int] = []
    for t in names:
        u = tuple(sorted({pos[c] for c in mg.consumers.get(t, []) if c in pos}))
        uses.append(u)
        lv = n - 1 if t in outputs else (u[-1] if u else prod[t])
        last.append(max(lv, prod[t]))
    return Lifetimes(
        order=order,
        names=names,
        born=np.array([prod[t] for t in names], dtype=np.int64),
        uses=tuple(uses),
        last=np.array(last, dtype=np.int64),
        nbytes=np.array([mg.nbytes(t) for t in names], dtype=np.int64),
    )


__all__ = ["Lifetimes", "lifetimes"]
