"""The graph every stage of the flow shares: a loaded model's ops, tensors and their types.

``ModelGraph.ops`` is a :class:`networkx.DiGraph` over the model's *data* ops (indices into
``ModelGraph.nodes``, model order = a topological order); each node carries its typed
:class:`OpNode` under the ``"op"`` key.  Constant-only computations (``Constant`` nodes, ops
fed only by weights and constants, and ``Shape`` of a statically shaped tensor) are *not*
part of it: they carry no data from the model inputs, so they are copied into every stage
that needs them instead of becoming stage boundaries (:meth:`ModelGraph.const_closure`).

Graph facts -- shapes, bytes, op kinds, constants, the boundary of an op set -- are answered
here (and in :mod:`rkpart.ir.subgraph`), never re-derived by the packages above.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import networkx as nx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor

from rkpart.ir.consts import constant_tensor, evaluate, inline_bytes, opsets_of
from rkpart.ir.liveness import Lifetimes, lifetimes
from rkpart.ir.subgraph import Subgraph, subgraph
from rkpart.ir.tensors import TensorType, nbytes, tensor_nbytes
from rkpart.types import JsonMap, JsonObject


@dataclass(frozen=True)
class OpNode:
    """What the graph knows about one op: how every package above :mod:`rkpart.ir` reads an op.

    Its attributes are decoded when first asked for (:attr:`attrs`); the ``NodeProto`` it was
    read from stays inside :mod:`rkpart.ir` (a stage gets a copy: :meth:`ModelGraph.node_proto`).
    """

    index: int
    op_type: str
    name: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    #: module path from exporter names or metadata (``/transformer_blocks.3/attn``), for block numbering
    scope: str
    _proto: onnx.NodeProto = field(repr=False, compare=False)

    @classmethod
    def of(cls, index: int, node: onnx.NodeProto, scope: str) -> OpNode:
        return cls(index=index, op_type=node.op_type, name=node.name, domain=node.domain,
                   inputs=tuple(node.input), outputs=tuple(node.output), scope=scope, _proto=node)

    @cached_property
    def attrs(self) -> JsonMap:
        """Attribute name -> decoded value (``onnx.helper.get_attribute_value``: ints, floats, bytes,
        ``TensorProto`` ...), in the node's order."""
        return MappingProxyType({a.name: helper.get_attribute_value(a) for a in self._proto.attribute})

    def attr(self, name: str, default: object = None) -> Any:
        return self.attrs.get(name, default)

    @property
    def label(self) -> str:
        """``OpType name`` (its index when it has no name), for messages and reports."""
        return f"{self.op_type} {self.name or self.index}"


@dataclass(frozen=True)
class ModelGraph:
    """A parsed model, its tensors' static types and the op graph built over it (frozen after load).

    Packages above :mod:`rkpart.ir` read ops through :meth:`op` (an :class:`OpNode`), never
    through ``nodes`` (the raw protos, for :mod:`rkpart.ir` itself); ``tests/test_graph_api.py``
    enforces it.
    """

    path: Path
    model: onnx.ModelProto
    nodes: tuple[onnx.NodeProto, ...]
    tensor_types: dict[str, TensorType]  # name -> (numpy dtype name, shape)
    initializers: dict[str, TensorProto]
    producer: dict[str, int]
    consumers: dict[str, list[int]]
    const_ops: frozenset[int]
    ops: nx.DiGraph  # op-level DAG over non-constant ops; node data "op": OpNode
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    opset: int
    #: the typed record of every op, constant ones included (``op_nodes[i]`` is op ``i``)
    op_nodes: tuple[OpNode, ...] = ()
    #: shapes the data decided, specialised by a run on representative inputs
    #: (:func:`rkpart.runtime.specialise.load_specialised`): ``{"op", "node", "tensor", "shape",
    #: "inputs": {model input: sha256 of the array it was given}}`` per data-dependent op
    specialised: tuple[JsonObject, ...] = ()
    _index_ops: frozenset[int] | None = field(default=None, init=False, repr=False, compare=False)
    #: constant name -> (sample, sha256) of its bytes: caches of a frozen graph
    _samples: dict[str, bytes | None] = field(default_factory=dict, init=False, repr=False, compare=False)
    _digests: dict[str, str | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    # -- ops -------------------------------------------------------------------------------
    def op(self, i: int) -> OpNode:
        """The typed record of op ``i`` (a data op or a constant one)."""
        return self.op_nodes[i]

    @property
    def num_ops(self) -> int:
        """How many ops the model has (constant ones included)."""
        return len(self.op_nodes)

    def op_label(self, i: int) -> str:
        """``OpType name`` of op ``i`` (its index when it has no name), for messages and reports."""
        return self.op_nodes[i].label

    @property
    def ir_version(self) -> int:
        return int(self.model.ir_version)

    @property
    def opset_imports(self) -> list[onnx.OperatorSetIdProto]:
        """The model's opset imports (copies), for a stage written from it."""
        out = []
        for o in self.model.opset_import:
            c = onnx.OperatorSetIdProto()
            c.CopyFrom(o)
            out.append(c)
        return out

    @property
    def graph_name(self) -> str:
        return str(self.model.graph.name)

    def node_proto(self, i: int) -> onnx.NodeProto:
        """A copy of op ``i``'s ``NodeProto``, to write into a stage."""
        n = onnx.NodeProto()
        n.CopyFrom(self.nodes[i])
        return n

    def descendants(self, ops: Iterable[int]) -> set[int]:
        """Data ops downstream of any of ``ops`` (``ops`` excluded unless downstream of another)."""
        out: set[int] = set()
        for i in ops:
            if i not in out:
                out |= nx.descendants(self.ops, i)
        return out

    def ancestors(self, ops: Iterable[int]) -> set[int]:
        """Data ops upstream of any of ``ops`` (``ops`` excluded unless upstream of another)."""
        out: set[int] = set()
        for i in ops:
            if i not in out:
                out |= nx.ancestors(self.ops, i)
        return out

    def between(self, sources: Iterable[str], sinks: Iterable[str]) -> set[int]:
        """Data ops on a path from a reader of a ``sources`` tensor to the producer of a ``sinks`` tensor.

        Both ends included; a constant tensor or a model input among ``sinks`` adds no op.
        """
        start = {c for t in sources for c in self.consumers.get(t, []) if c not in self.const_ops}
        end = {p for t in sinks if (p := self.producer.get(t)) is not None and p not in self.const_ops}
        return (start | self.descendants(start)) & (end | self.ancestors(end))

    def input_index_ops(self) -> frozenset[int]:
        """Data ops that compute only on integer or boolean data of the model inputs.

        Labels, masks and positions a model takes as ``int64``/``bool`` inputs are prepared by
        index arithmetic before they meet the activations: a class label's embedding
        ``Gather`` (DiT), a caption mask's ``Cast -> Reshape`` (Lumina2).  An op is such
        *input index work* when every data input it reads is an integer or boolean tensor
        that is a model input or an output of such an op, and it either reads an integer or
        yields only integers/booleans.  A boolean mask turned into floats (``Where(mask, 0,
        -inf)``) is not: a boolean is a select condition, and masked attention is kept whole
        for what reads it (the ``nan-guard`` rewrite proves the guard after a masked Softmax
        from that ``Where``).  The set is closed upwards: every data op an index op depends
        on is one too, so its ops can run first, before anything else.  Their results (an
        embedding row, a boolean mask) are where the index work meets the rest of the model.
        """
        if self._index_ops is not None:
            return self._index_ops
        index_tensors = {t for t in self.inputs if self.is_index(t)}
        out: set[int] = set()
        for i in sorted(self.ops.nodes):  # model order is topological
            dyn = self.dyn_inputs(i)
            if not dyn or not all(t in index_tensors for t in dyn):
                continue
            outs = [t for t in self.nodes[i].output if t]
            if all(self.is_index(t) for t in outs) or any(self.dtype(t) != "bool" for t in dyn):
                out.add(i)
                index_tensors.update(t for t in outs if self.is_index(t))
        object.__setattr__(self, "_index_ops", frozenset(out))  # a cache of a frozen graph
        return frozenset(out)

    def lifetimes(self, order: Sequence[int] | None = None) -> Lifetimes:
        """When each activation is born, read and last alive over ``order`` (see :mod:`rkpart.ir.liveness`)."""
        return lifetimes(self, order)

    # -- tensors ---------------------------------------------------------------------------
    def is_const_tensor(self, name: str) -> bool:
        if name in self.initializers:
            return True
        p = self.producer.get(name)
        return p is not None and p in self.const_ops

    def dyn_inputs(self, op: int) -> list[str]:
        """Non-constant inputs of ``op`` (what carries data from the model inputs)."""
        return [t for t in self.nodes[op].input if t and not self.is_const_tensor(t)]

    def shape(self, name: str) -> tuple[int, ...] | None:
        t = self.tensor_types.get(name)
        return None if t is None else t[1]

    def dtype(self, name: str) -> str | None:
        t = self.tensor_types.get(name)
        return None if t is None else t[0]

    def is_float(self, name: str) -> bool:
        dt = self.dtype(name)
        return dt is not None and not dt.startswith("onnx:") and np.dtype(dt).kind == "f"

    def is_index(self, name: str) -> bool:
        """Whether ``name`` holds integers or booleans (labels, masks, positions, shapes)."""
        dt = self.dtype(name)
        return dt is not None and not dt.startswith("onnx:") and np.dtype(dt).kind in "iub"

    def nbytes(self, name: str) -> int:
        """Bytes of tensor ``name`` (0 when its type is unknown, e.g. an unread optional output)."""
        t = self.tensor_types.get(name)
        return 0 if t is None else nbytes(*t)

    def weight_bytes(self, name: str) -> int:
        """Bytes of initializer ``name`` (0 for anything else)."""
        init = self.initializers.get(name)
        return 0 if init is None else tensor_nbytes(init.data_type, init.dims, f"initializer {name!r}")

    def value_info(self, name: str) -> onnx.ValueInfoProto:
        """A typed ``ValueInfoProto`` with the static shape the model gives ``name``."""
        dt, shape = self.tensor_types[name]
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), list(shape))

    # -- constants -------------------------------------------------------------------------
    def _stored_constant(self, name: str) -> TensorProto | None:
        """The proto that stores constant ``name``: its initializer or its ``Constant`` op's value."""
        init = self.initializers.get(name)
        if init is not None:
            return init
        p = self.producer.get(name)
        if p is None or p not in self.const_ops:
            return None
        return constant_tensor(self.nodes[p])  # None: computed from other constants

    def _constant_bytes(self, name: str, limit: int | None = None) -> bytes | None:
        """The stored bytes of constant ``name`` (at most ``limit``; external data read from its file)."""
        t = self._stored_constant(name)
        if t is None:
            return None
        if t.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            offset, length = int(info.get("offset", 0)), int(info.get("length", -1))  # no length: to the end
            if limit is not None:
                length = limit if length < 0 else min(length, limit)
            with open(self.path.parent / info["location"], "rb") as f:
                f.seek(offset)
                return f.read(length)
        data = inline_bytes(t)
        return data if limit is None else data[:limit]

    def constant_digest(self, name: str) -> str | None:
        """sha256 of the bytes of stored constant ``name`` (``None``: not a stored constant)."""
        if name not in self._digests:
            import hashlib

            data = self._constant_bytes(name)
            self._digests[name] = None if data is None else hashlib.sha256(data).hexdigest()
        return self._digests[name]

    def distinct_constants(self, names: Iterable[str]) -> list[str]:
        """``names`` without the constants that hold exactly what an earlier one holds (element
        type, shape and bytes): what a stage stores once its copies of one table are merged
        (``rkpart compile``'s ``dedupe-constants`` rewrite).  Bytes are read only for constants that
        share type and shape with another, and hashed whole only when their first 4 KiB agree."""
        names = list(names)
        by_type: dict[object, list[str]] = {}
        for n in names:
            by_type.setdefault(self.tensor_types.get(n), []).append(n)
        dropped: set[str] = set()
        for key, group in by_type.items():
            if key is None or len(group) < 2:
                continue
            by_sample: dict[bytes, list[str]] = {}
            for n in group:
                if n not in self._samples:
                    self._samples[n] = self._constant_bytes(n, 4096)
                sample = self._samples[n]
                if sample is not None:
                    by_sample.setdefault(sample, []).append(n)
            for same in by_sample.values():
                if len(same) < 2:
                    continue
                seen: set[str] = set()
                for n in same:
                    d = self.constant_digest(n)
                    if d is not None and d in seen:
                        dropped.add(n)
                    elif d is not None:
                        seen.add(d)
        return [n for n in names if n not in dropped]

    def const_closure(self, tensors: Iterable[str]) -> list[int]:
        """Constant ops needed to compute ``tensors``, in model order."""
        need: set[int] = set()
        stack = [self.producer[t] for t in tensors if t in self.producer and self.producer[t] in self.const_ops]
        while stack:
            i = stack.pop()
            if i in need:
                continue
            need.add(i)
            for t in self.nodes[i].input:
                p = self.producer.get(t)
                if p is not None and p in self.const_ops and p not in need:
                    stack.append(p)
        return sorted(need)

    def const_node(self, i: int) -> onnx.NodeProto:
        """Constant op ``i`` as it goes into a stage: ``Shape`` of a static tensor becomes a ``Constant``."""
        n = self.nodes[i]
        if n.op_type == "Shape":
            return shape_as_constant(n, self.tensor_types)
        return n

    def constant(self, name: str) -> TensorProto:
        """The value of constant tensor ``name`` as an inline initializer (external data read).

        An initializer is copied; a computed constant (a transposed weight, a static shape)
        is evaluated from its constant closure with the ONNX reference evaluator.
        """
        init = self.initializers.get(name)
        if init is not None:
            out = TensorProto()
            out.CopyFrom(init)
            if out.data_location == TensorProto.EXTERNAL:
                load_external_data_for_tensor(out, str(self.path.parent))
                out.data_location = TensorProto.DEFAULT
                del out.external_data[:]
            return out
        if not self.is_const_tensor(name):
            raise ValueError(f"{name!r} is not a constant of {self.path.name}")
        nodes = [self.const_node(i) for i in self.const_closure([name])]
        produced = {o for n in nodes for o in n.output}
        needed = sorted({x for n in nodes for x in n.input if x and x not in produced})
        (value,) = evaluate(nodes, [name], opsets_of(self.model), initializers=[self.constant(x) for x in needed])
        return numpy_helper.from_array(value, name=name)

    def subgraph(self, ops: Iterable[int], *, sinks: bool = False) -> Subgraph:
        """The frozen view of the data ops ``ops`` as one standalone graph (see :mod:`rkpart.ir.subgraph`)."""
        return subgraph(self, ops, sinks=sinks)


def shape_as_constant(node: onnx.NodeProto, types: dict[str, TensorType]) -> onnx.NodeProto:
    """Replace ``Shape(x)`` (x statically shaped) by an equivalent ``Constant`` node."""
    shape = list(types[node.input[0]][1])
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end")
    value = np.array(shape[start:end] if end is not None else shape[start:], dtype=np.int64)
    return helper.make_node(
        "Constant", [], list(node.output), name=node.name, value=numpy_helper.from_array(value)
    )


def describe(mg: ModelGraph) -> JsonObject:
    """A small summary used by ``rkpart inspect``."""
    counts: dict[str, int] = {}
    for n in mg.op_nodes:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return {
        "file": str(mg.path),
        "opset": mg.opset,
        "nodes": len(mg.nodes),
        "const_nodes": len(mg.const_ops),
        "weight_bytes": sum(mg.weight_bytes(n) for n in mg.initializers),
        "inputs": [{"name": n, "dtype": mg.dtype(n), "shape": list(mg.shape(n) or ())} for n in mg.inputs],
        "outputs": [{"name": n, "dtype": mg.dtype(n), "shape": list(mg.shape(n) or ())} for n in mg.outputs],
        "op_counts": dict(sorted(counts.items())),
    }


__all__ = ["ModelGraph", "OpNode", "describe", "shape_as_constant"]
