"""The IR every stage of the flow shares: a loaded ONNX model as a graph of typed ops.

``load_model(path) -> ModelGraph`` (frozen; ops read as ``mg.op(i)``, an :class:`OpNode`);
``ModelGraph.subgraph(ops) -> Subgraph``; one op taxonomy (:mod:`rkpart.ir.ops`); one byte
counter (:mod:`rkpart.ir.tensors`); one constant evaluator (:mod:`rkpart.ir.consts`); the
editing view rewrites are written on (:class:`rkpart.ir.edit.GraphEdit`).  A leaf
package: it imports only :mod:`rkpart.errors`, :mod:`rkpart.io` and :mod:`rkpart.types`.
"""

from rkpart.ir.graph import ModelGraph, OpNode, describe, shape_as_constant
from rkpart.ir.liveness import Lifetimes, lifetimes
from rkpart.ir.load import GraphIO, check_external_data, graph_io, graph_of, load_model
from rkpart.ir.subgraph import Subgraph, subgraph
from rkpart.ir.tensors import TensorType, nbytes, tensor_nbytes, value_type

__all__ = ["GraphIO", "Lifetimes", "ModelGraph", "OpNode", "Subgraph", "TensorType", "check_external_data", "describe",
           "graph_io", "graph_of", "lifetimes", "load_model", "nbytes", "shape_as_constant", "subgraph",
           "tensor_nbytes", "value_type"]
