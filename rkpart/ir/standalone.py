"""A set of ops of a :class:`~rkpart.ir.ModelGraph` as one standalone ONNX model, in memory.

:func:`model_of` is the one way rkpart makes a ``ModelProto`` of a :class:`~rkpart.ir.Subgraph`:
stage extraction (:mod:`rkpart.plan.extract`, which streams the weights to files), the
capability's probe of a group (:mod:`rkpart.grouping.capability`) and delta debugging
(:mod:`rkpart.triage.reduce`, through :func:`subgraph_model`) all build on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import onnx
from onnx import TensorProto, helper

from rkpart.ir.graph import ModelGraph
from rkpart.ir.subgraph import Subgraph


def subgraph_model(
    mg: ModelGraph, sub: Subgraph, values: Mapping[str, TensorProto], *, name: str, producer_name: str = "rkpart"
) -> onnx.ModelProto:
    """``sub`` as one in-memory model whose constants are initializers: what delta debugging builds.

    Unlike :func:`rkpart.plan.extract.extract`, the constant closure is not copied as ops: every constant tensor
    the ops read becomes an initializer, so the node count is the number of data ops.
    ``values`` holds those initializers (:meth:`ModelGraph.constant`) and, for boundary inputs
    that must not be graph inputs (frozen cut tensors), their fixed values.
    """
    produced = {t for i in sub.ops for t in mg.op(i).outputs if t}
    fixed: list[str] = []
    for i in sub.ops:
        for t in mg.op(i).inputs:
            if t and t not in produced and t in values and t not in fixed:
                fixed.append(t)
    missing = [t for t in sub.const_tensors if t not in values]
    if missing:
        raise ValueError(f"no value for constant {missing[0]!r}")
    nodes = [mg.node_proto(i) for i in sub.ops]
    inputs = tuple(t for t in sub.inputs if t not in values)
    return model_of(mg, replace(sub, inputs=inputs), nodes, [values[t] for t in fixed], name=name, doc="",
                  producer_name=producer_name, value_info=False)


def model_of(
    mg: ModelGraph,
    sub: Subgraph,
    nodes: list[onnx.NodeProto],
    initializers: list[TensorProto],
    *,
    name: str,
    doc: str,
    producer_name: str,
    value_info: bool,
    infos: dict[str, onnx.ValueInfoProto] | None = None,
) -> onnx.ModelProto:
    """``infos``: value infos already made (:meth:`ModelGraph.value_info`), filled as they are made."""
    types = mg.tensor_types
    cache = infos if infos is not None else {}

    def info(t: str) -> onnx.ValueInfoProto:
        vi = cache.get(t)
        if vi is None:
            vi = cache[t] = mg.value_info(t)
        return vi

    internal = sorted({
        t for n in nodes for t in n.output if t and t in types and t not in sub.outputs
    }, key=lambda t: (mg.producer.get(t, -1), t)) if value_info else []
    graph = helper.make_graph(
        nodes,
        name,
        [info(t) for t in sub.inputs],
        [info(t) for t in sub.outputs],
        initializer=initializers,
        value_info=[info(t) for t in internal],
        doc_string=doc or None,
    )
    return helper.make_model(
        graph,
        opset_imports=mg.opset_imports,
        producer_name=producer_name,
        ir_version=mg.ir_version,
    )


__all__ = ["model_of", "subgraph_model"]
