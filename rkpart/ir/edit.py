"""The editing view of one ONNX model (a stage) that rewrites are written on.

A rewrite reads the graph through a :class:`GraphEdit` -- producers, readers, constant values,
static shapes, element types, fresh names -- and edits its ``GraphProto`` in place.  What
the view derives is cached and dropped again when the graph changes:

* the wiring (producers, readers, uses) and the static shapes: derived from the graph as it
  is when asked for (a rewrite keeps what it looked up while it edits);
* the pool of fresh names: one per rewrite (:meth:`GraphEdit.new_names` starts another);
* element types and the inferred value infos: **one** shape inference per stage (on a copy
  without the large weights), run again only after a rewrite changed the graph
  (:meth:`GraphEdit.retype`), not once per rewrite tried.

A rewrite declares what it reads (:data:`NEEDS`): ``"types"`` (element types), ``"shapes"``
(static shapes, which also writes the inferred value infos into the model, as a toolkit
then sees them) or ``"inferred_shapes"`` (the same static shapes, read from the inference
without writing them: a model the rewrite does not match keeps its bytes); asking the view for
what the current rewrite did not declare is a bug and raises.  Constant values are evaluated by
:func:`rkpart.ir.consts.evaluate` at the model's own opsets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.ir.consts import constant_tensor, evaluate, opsets_of, tensor_value
from rkpart.ir.infer import infer_shapes
from rkpart.ir.ops import DEFAULT_DOMAINS

#: what a rewrite may declare it reads beyond the graph itself
NEEDS = frozenset({"types", "shapes", "inferred_shapes"})

#: a constant value is evaluated from at most this many producing ops
_FOLD_OPS = 64


def free_name(base: str, used: set[str]) -> str:
    """``base``, else ``base_rk1``, ``base_rk2``, ...: the first name not in ``used``, added to it.

    Not ``base_1``: rknn-toolkit2 2.3.0 fails to build a graph where a float tensor is named
    ``<c>_1`` for an int64 constant ``<c>`` (its optimiser binds the two, "Concat" of int64 and
    float; measured with ``build_once``: ``k_1`` fails, ``k_2``, ``k.1`` and ``k_rk1`` build, and
    2.5.0 builds all four).
    """
    name, k = base, 0
    while name in used:
        k += 1
        name = f"{base}_rk{k}"
    used.add(name)
    return name


class GraphEdit:
    """An editing view of ``model`` (edited in place)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph
        self.opsets = opsets_of(model)
        #: the default domain's opset version (0 when the model imports none)
        self.opset = self.opsets.get("", 0)
        self.needs: frozenset[str] = NEEDS
        self._inferred: onnx.GraphProto | None = None
        self._elem: dict[str, int] | None = None
        self._used: set[str] | None = None
        self.inferences = 0  # how many shape inferences the view ran (for tests and benches)
        #: producer and readers of every tensor, of the node list as it was when first asked
        #: (dropped when the list is rebuilt: :meth:`set_nodes`, :meth:`apply_edits`)
        self._lookup: tuple[dict[str, onnx.NodeProto], dict[str, list[onnx.NodeProto]]] | None = None
        #: edits waiting for :meth:`apply_edits`: node index -> the nodes taking its place
        self._pending: dict[int, list[onnx.NodeProto]] = {}

    # -- bookkeeping ---------------------------------------------------------------------
    def declare(self, needs: Iterable[str]) -> None:
        """What the rewrite about to run reads (a subset of :data:`NEEDS`); resets the wiring."""
        needs = frozenset(needs)
        if not needs <= NEEDS:
            raise ValueError(f"unknown needs {sorted(needs - NEEDS)}")
        self.needs = needs
        self._used = None
        self._lookup = None
        if "shapes" in needs:
            self.write_value_info()

    def retype(self) -> None:
        """The graph changed (a rewrite matched): infer types again when next asked."""
        self._inferred = None
        self._elem = None

    def _need(self, what: str) -> None:
        if what not in self.needs:
            raise RuntimeError(f"a rewrite read {what} without declaring it (needs={sorted(self.needs)})")

    # -- types -----------------------------------------------------------------------------
    def _infer(self) -> onnx.GraphProto:
        if self._inferred is None:
            self.inferences += 1
            try:
                # local functions are not carried by the light copy: infer those models whole
                self._inferred = infer_shapes(self.model, light=not self.model.functions).graph
            except Exception:  # noqa: BLE001 - inference is a hint; an unknown type defaults to float
                self._inferred = self.graph
        return self._inferred

    def elem(self, name: str) -> int:
        """The element type of ``name`` (``TensorProto`` enum), float when inference does not know it."""
        self._need("types")
        if self._elem is None:
            g = self._infer()
            elem: dict[str, int] = {}
            for vi in (*g.input, *g.output, *g.value_info):
                if vi.type.HasField("tensor_type"):
                    elem[vi.name] = vi.type.tensor_type.elem_type
            for init in self.graph.initializer:
                elem[init.name] = init.data_type
            self._elem = elem
        return self._elem.get(name, TensorProto.FLOAT)

    def write_value_info(self) -> None:
        """Replace the model's value infos by the inferred ones (what :meth:`static_shapes` reads)."""
        inferred = self._infer()
        if inferred is self.graph:
            return
        del self.graph.value_info[:]
        self.graph.value_info.extend(inferred.value_info)

    def static_shapes(self) -> dict[str, list[int]]:
        """Tensor -> its shape, for initializers and value infos whose every dimension is a number."""
        if "inferred_shapes" not in self.needs:
            self._need("shapes")
        g = self.graph
        out: dict[str, list[int]] = {t.name: list(t.dims) for t in g.initializer}
        infos = self._infer().value_info if "inferred_shapes" in self.needs else g.value_info
        for vi in (*g.input, *infos, *g.output):
            tt = vi.type.tensor_type
            # no shape field: the rank is unknown (not a scalar)
            if vi.type.HasField("tensor_type") and tt.HasField("shape") \
                    and all(d.HasField("dim_value") for d in tt.shape.dim):
                out.setdefault(vi.name, [d.dim_value for d in tt.shape.dim])
        return out

    # -- wiring (derived from the graph as it is now: a rewrite keeps what it looked up) --------
    def wiring(self) -> tuple[dict[str, onnx.NodeProto], dict[str, int], set[str]]:
        """Tensor -> producing node, tensor -> number of input slots reading it, graph outputs."""
        prod = {o: n for n in self.graph.node for o in n.output}
        uses: dict[str, int] = {}
        for n in self.graph.node:
            for i in n.input:
                uses[i] = uses.get(i, 0) + 1
        return prod, uses, self.outputs

    def producer_indices(self) -> dict[str, int]:
        """Tensor -> index of the node computing it."""
        return {o: k for k, n in enumerate(self.graph.node) for o in n.output}

    def reader_indices(self) -> dict[str, list[int]]:
        """Tensor -> indices of the nodes reading it, once per input slot (model order)."""
        readers: dict[str, list[int]] = {}
        for k, n in enumerate(self.graph.node):
            for t in n.input:
                readers.setdefault(t, []).append(k)
        return readers

    @property
    def outputs(self) -> set[str]:
        return {o.name for o in self.graph.output}

    # -- lookups, as onnxruntime's fusion passes and graphsurgeon's node.i() / node.o() read a graph ----
    def _maps(self) -> tuple[dict[str, onnx.NodeProto], dict[str, list[onnx.NodeProto]]]:
        if self._lookup is None:
            prod: dict[str, onnx.NodeProto] = {}
            readers: dict[str, list[onnx.NodeProto]] = {}
            for n in self.graph.node:
                for o in n.output:
                    if o:
                        prod[o] = n
                for i in dict.fromkeys(n.input):  # a node reading a tensor twice is one reader
                    if i:
                        readers.setdefault(i, []).append(n)
            self._lookup = (prod, readers)
        return self._lookup

    def producer(self, tensor: str) -> onnx.NodeProto | None:
        """The node computing ``tensor`` (``None``: an input, an initializer, or nothing)."""
        return self._maps()[0].get(tensor)

    def readers(self, tensor: str) -> list[onnx.NodeProto]:
        """The nodes reading ``tensor``, each once, in model order."""
        return self._maps()[1].get(tensor, [])

    def parent(self, node: onnx.NodeProto, index: int) -> onnx.NodeProto | None:
        """The producer of input ``index`` of ``node`` (``None`` when it has no such input, or no producer)."""
        return self.producer(node.input[index]) if index < len(node.input) and node.input[index] else None

    def match_parent_path(self, node: onnx.NodeProto,
                          path: Sequence[tuple[str, int]]) -> list[onnx.NodeProto] | None:
        """The nodes up ``path`` from ``node``, or ``None`` unless every step matches: step ``(op_type,
        k)`` is the default-domain ``op_type`` node computing input ``k`` of the last node matched
        (onnxruntime's ``match_parent_path``)."""
        out: list[onnx.NodeProto] = []
        at = node
        for op_type, k in path:
            p = self.parent(at, k)
            if p is None or p.op_type != op_type or p.domain not in DEFAULT_DOMAINS:
                return None
            out.append(p)
            at = p
        return out

    def matches(self, op_type: str) -> Iterator[int]:
        """Indices of default-domain ``op_type`` nodes, last first (replacing one keeps the others' valid)."""
        nodes = self.graph.node
        for i in range(len(nodes) - 1, -1, -1):
            n = nodes[i]
            if n.op_type == op_type and n.domain in DEFAULT_DOMAINS:
                yield i

    # -- names and constants ----------------------------------------------------------------
    def new_names(self) -> None:
        """Start the pool of fresh names from the graph as it is now (names handed out stay taken
        until then, also when what they named was removed again)."""
        g = self.graph
        self._used = {o for n in g.node for o in n.output} | {i.name for i in g.initializer}
        self._used |= {i.name for i in g.input}

    def fresh(self, base: str) -> str:
        """A tensor name no output, initializer or input uses (:func:`free_name`)."""
        if self._used is None:
            self.new_names()
        assert self._used is not None
        return free_name(base, self._used)

    def add_constant(self, base: str, value: np.ndarray) -> str:
        """A new initializer holding ``value`` under a fresh name derived from ``base``."""
        name = self.fresh(base)
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def const_array(self, name: str) -> np.ndarray | None:
        """The value of an initializer or a ``Constant``'s output ``name`` (else ``None``).  An initializer whose
        data was not loaded (external: the partitioner's rewrite probe holds large constants as placeholders of
        the right shape) has no value here: ``None``, as for data."""
        for t in self.graph.initializer:
            if t.name == name:
                return None if t.data_location == onnx.TensorProto.EXTERNAL else tensor_value(t)
        for n in self.graph.node:
            if n.output and n.output[0] == name and (t := constant_tensor(n)) is not None:
                return tensor_value(t)
        return None

    def scalar(self, name: str) -> float | None:
        """The value of a one-element float constant ``name`` (:meth:`const_array`), else ``None``."""
        v = self.const_array(name)
        return float(v.reshape(())) if v is not None and v.size == 1 and v.dtype.kind == "f" else None

    def value(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it depends on constants only (evaluated at the model's opsets), else None."""
        direct = self.const_array(name)
        if direct is not None:
            return direct
        g = self.graph
        prod = {o: n for n in g.node for o in n.output}
        inits = {t.name: t for t in g.initializer}
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
            if p is None or len(nodes) > _FOLD_OPS or p.op_type in ("If", "Loop", "Scan"):
                return None  # a graph input, or too much to fold here
            if p not in nodes:
                nodes.append(p)
            todo.extend(p.input)
        order = [n for n in g.node if any(n is m for m in nodes)]
        try:
            (value,) = evaluate(order, [name], self.opsets, initializers=[inits[t] for t in sorted(need)])
        except Exception:  # noqa: BLE001 - an unfoldable value just means the pattern does not match
            return None
        return value

    # -- edits -----------------------------------------------------------------------------
    def replace_each(self, op_type: str,
                     rewrite: Callable[[onnx.NodeProto], list[onnx.NodeProto] | None]) -> int:
        """Each default-domain ``op_type`` node, last first, becomes the nodes ``rewrite(node)``
        returns (``None``: it stays); the count replaced.  Fresh names start from the graph as it
        is now (:meth:`new_names`); the node list is rebuilt once, after every match was asked
        (:meth:`replace_later`)."""
        self.new_names()
        count = 0
        for i in list(self.matches(op_type)):
            new = rewrite(self.graph.node[i])
            if new is not None:
                self.replace_later(i, new)
                count += 1
        self.apply_edits()
        return count

    def replace_later(self, index: int, new: list[onnx.NodeProto]) -> None:
        """Node ``index`` is to become the nodes ``new`` (``[]``: removed) when :meth:`apply_edits`
        runs; until then the node list (and so every index) stays as it is."""
        self._pending[index] = list(new)

    def apply_edits(self) -> None:
        """Every edit :meth:`replace_later` queued, in one rebuild of the node list (a graph of N
        nodes with M matches costs N, not N x M, as graphsurgeon's ``cleanup()`` applies its
        removals once)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        nodes: list[onnx.NodeProto] = []
        for k, n in enumerate(self.graph.node):
            nodes.extend(pending.get(k, [n]))
        self.set_nodes(nodes)

    def replace(self, index: int, new: list[onnx.NodeProto]) -> None:
        """Node ``index`` becomes the nodes ``new`` (in its place)."""
        nodes = list(self.graph.node)
        nodes[index:index + 1] = new
        self.set_nodes(nodes)

    def set_nodes(self, nodes: Iterable[onnx.NodeProto]) -> None:
        """The graph's nodes become ``nodes`` (in that order)."""
        nodes = list(nodes)
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        self._lookup = None

    def drop_unread_nodes(self, tensors: set[str]) -> None:
        """Remove the nodes computing one of ``tensors`` (the pieces a rewrite replaced) that no node
        and no graph output reads any more, then the initializers nothing reads."""
        g = self.graph
        read = {i for n in g.node for i in n.input} | self.outputs
        gone = tensors - read
        self.set_nodes(n for n in g.node if not (n.output and n.output[0] in gone))
        self.drop_unread_initializers()

    def drop_unread_initializers(self) -> None:
        """Remove the initializers no node and no output reads."""
        g = self.graph
        read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        for t in [t for t in g.initializer if t.name not in read]:
            g.initializer.remove(t)


def attr(node: onnx.NodeProto, name: str, default: object) -> object:
    """The value of attribute ``name`` of ``node`` (``default`` when it has none)."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


__all__ = ["NEEDS", "GraphEdit", "attr"]
