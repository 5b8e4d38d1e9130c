"""A frozen view of a set of data ops as one standalone graph.

Extraction (:mod:`rkpart.plan.extract`), cost-model features
(:mod:`rkpart.cost_model.features`) and triage's reduction all ask this one view what a set of
ops reads, writes and carries, so a candidate's features are those of the stage it becomes
and a reduced graph has the boundary an extracted stage would have.

* ``inputs``: tensors the ops read that are neither produced inside nor constant, in
  first-read order;
* ``outputs``: tensors produced inside that the rest of the model reads (constant ops
  aside) or that are model outputs; with ``sinks=True`` (delta debugging) only those that
  nothing *inside* reads, so a cut graph exposes as little as possible;
* ``const_ops``: the constant closure the ops need (copied into a stage, not a boundary);
* ``const_tensors``: constant tensors the ops read directly (weights, folded values);
* ``weights``: initializers read by the ops or their closure, in first-use order, and their
  ``weight_bytes``; ``in_bytes`` / ``out_bytes``: the boundary's activation bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rkpart.ir.facts import GraphFacts


@dataclass(frozen=True)
class Subgraph:
    """What the data ops ``ops`` of a graph are as one standalone graph (see the module docstring)."""

    ops: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    const_ops: tuple[int, ...]
    const_tensors: frozenset[str]
    weights: tuple[str, ...]
    weight_bytes: int
    in_bytes: int
    out_bytes: int

    @property
    def io_bytes(self) -> int:
        return self.in_bytes + self.out_bytes

    @property
    def all_ops(self) -> tuple[int, ...]:
        """Data ops and their constant closure, in model (topological) order."""
        return tuple(sorted({*self.ops, *self.const_ops}))


def subgraph(mg: GraphFacts, ops: Iterable[int], *, sinks: bool = False) -> Subgraph:
    """The :class:`Subgraph` of ``ops`` (data-op indices of ``mg``; order and repeats do not matter)."""
    order = tuple(sorted(set(ops)))
    opset = set(order)
    inputs = _inputs(mg, order, opset)
    outputs = _sinks(mg, order) if sinks else _outputs(mg, order, opset)
    const_tensors = frozenset(t for i in order for t in mg.nodes[i].input if t and mg.is_const_tensor(t))
    const_ops = tuple(mg.const_closure(const_tensors))
    weights = _weights(mg, sorted(opset | set(const_ops)))
    return Subgraph(
        ops=order,
        inputs=inputs,
        outputs=outputs,
        const_ops=const_ops,
        const_tensors=const_tensors,
        weights=weights,
        weight_bytes=sum(mg.weight_bytes(t) for t in weights),
        in_bytes=sum(mg.nbytes(t) for t in inputs),
        out_bytes=sum(mg.nbytes(t) for t in outputs),
    )


def outputs_of(mg: GraphFacts, ops: Iterable[int]) -> tuple[str, ...]:
    """The tensors the data ops ``ops`` hand on (read by another op, or model outputs), in model
    order: :attr:`Subgraph.outputs` alone, without the rest of :func:`subgraph`'s work."""
    order = tuple(sorted(set(ops)))
    return _outputs(mg, order, set(order))


def _inputs(mg: GraphFacts, order: tuple[int, ...], opset: set[int]) -> tuple[str, ...]:
    inputs: list[str] = []
    seen: set[str] = set()
    for i in order:
        for t in mg.nodes[i].input:
            if not t or t in seen or mg.is_const_tensor(t):
                continue
            p = mg.producer.get(t)
            if p is None or p not in opset:
                inputs.append(t)
                seen.add(t)
    return tuple(inputs)


def _outputs(mg: GraphFacts, order: tuple[int, ...], opset: set[int]) -> tuple[str, ...]:
    model_outputs = set(mg.outputs)
    return tuple(
        t for i in order for t in mg.nodes[i].output
        if t and (t in model_outputs
                  or any(c not in opset and c not in mg.const_ops for c in mg.consumers.get(t, [])))
    )


def _sinks(mg: GraphFacts, order: tuple[int, ...]) -> tuple[str, ...]:
    model_outputs = set(mg.outputs)
    read_inside = {t for i in order for t in mg.nodes[i].input if t}
    return tuple(
        t for i in order for t in mg.nodes[i].output
        if t and (t in model_outputs or (bool(mg.consumers.get(t)) and t not in read_inside))
    )


def _weights(mg: GraphFacts, nodes: list[int]) -> tuple[str, ...]:
    used: dict[str, None] = {}  # a dict is an ordered set: first use decides the order
    for i in nodes:
        # a constant Shape goes into a stage as a Constant: it reads no weight
        for t in (mg.const_node(i) if i in mg.const_ops else mg.nodes[i]).input:
            if t in mg.initializers:
                used.setdefault(t)
    return tuple(used)


__all__ = ["Subgraph", "subgraph"]
