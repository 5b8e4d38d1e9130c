"""Tensor lifetimes over a schedule: when each tensor of a graph is born, read and last alive.

A *schedule* is an order of the graph's data ops (model order, a topological order, by
default); positions ``0 .. n-1`` index it.  A tensor is born at the position of the op that
produces it (``-1`` for a model input: alive before the first op) and stays alive up to its
last reader, or to the end for a model output; a tensor nobody reads lives only at its birth.
Memory estimates (:mod:`rkpart.grouping.strategies.generic`) are sums over these intervals.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from rkpart.ir.facts import GraphFacts
from rkpart.ir.subgraph import Subgraph


@dataclass(frozen=True)
class Lifetimes:
    """Lifetimes of every activation of a schedule, indexed alike (sorted by birth, then name)."""

    order: tuple[int, ...]
    names: tuple[str, ...]
    #: position of the producing op (-1 for a model input)
    born: np.ndarray
    #: sorted positions of the ops that read the tensor
    uses: tuple[tuple[int, ...], ...]
    #: last position the tensor is alive at (< born: never alive)
    last: np.ndarray
    nbytes: np.ndarray

    @property
    def n(self) -> int:
        return len(self.order)

    def live_bytes(self, nbytes: np.ndarray | None = None) -> np.ndarray:
        """Bytes alive at each position of the schedule (int64, length ``n``).

        ``nbytes``: each tensor's size counted another way (indexed like :attr:`names`, e.g. at
        2 bytes an element, or 0 for tensors a device never holds); default :attr:`nbytes`.
        """
        size = self.nbytes if nbytes is None else nbytes
        start = np.maximum(self.born, 0)
        alive = self.last >= start  # a tensor alive never (see ``unread_alive``) adds nothing
        diff = np.zeros(self.n + 1, dtype=np.int64)
        np.add.at(diff, start[alive], size[alive])
        np.add.at(diff, self.last[alive] + 1, -size[alive])
        return np.cumsum(diff[: self.n])


def lifetimes(
    mg: GraphFacts,
    order: Sequence[int] | None = None,
    *,
    inputs: Iterable[str] | None = None,
    outputs: Iterable[str] | None = None,
    unread_alive: bool = True,
) -> Lifetimes:
    """The :class:`Lifetimes` of ``mg``'s activations over ``order`` (default: all data ops in model order).

    ``inputs`` are alive before the first op and ``outputs`` to the end (default: the
    model's).  A tensor that no op of ``order`` reads and that is not an output is alive at
    its birth with ``unread_alive`` (the op still writes it), else never.
    """
    order = tuple(sorted(mg.ops.nodes) if order is None else order)
    n = len(order)
    pos = {op: k for k, op in enumerate(order)}
    outs = set(mg.outputs if outputs is None else outputs)
    prod: dict[str, int] = {t: -1 for t in (mg.inputs if inputs is None else inputs)}
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
        if t in outs:
            last.append(max(n - 1, prod[t]))
        elif u:
            last.append(u[-1])
        else:  # nobody reads it: alive at its birth only, or never (last before birth)
            last.append(prod[t] if unread_alive else prod[t] - 1)
    return Lifetimes(
        order=order,
        names=names,
        born=np.array([prod[t] for t in names], dtype=np.int64),
        uses=tuple(uses),
        last=np.array(last, dtype=np.int64),
        nbytes=np.array([mg.nbytes(t) for t in names], dtype=np.int64),
    )


def stage_lifetimes(mg: GraphFacts, sub: Subgraph) -> Lifetimes | None:
    """The :class:`Lifetimes` of the ops of ``sub`` run in model order as one stage (``None``: no ops).

    Its boundary inputs are alive from the start, its boundary outputs to the end; a tensor
    no op of the stage reads and that leaves nowhere is not counted.
    """
    if not sub.ops:
        return None
    return lifetimes(mg, sub.ops, inputs=sub.inputs, outputs=sub.outputs, unread_alive=False)


def peak_bytes(mg: GraphFacts, sub: Subgraph, life: Lifetimes | None = None) -> int:
    """Largest activation bytes alive at once while the ops of ``sub`` run as one stage
    (:func:`stage_lifetimes`; ``life``: those lifetimes, when the caller has them already)."""
    life = life if life is not None else stage_lifetimes(mg, sub)
    return 0 if life is None else int(life.live_bytes().max())


__all__ = ["Lifetimes", "lifetimes", "peak_bytes", "stage_lifetimes"]
