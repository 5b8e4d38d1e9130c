"""What the views of a graph read of it: the facts :class:`~rkpart.ir.graph.ModelGraph` holds.

:mod:`rkpart.ir.subgraph` and :mod:`rkpart.ir.liveness` are questions asked of a graph, and the
graph offers them as methods (``mg.subgraph(ops)``, ``mg.lifetimes()``); they read it through
this protocol, so the graph imports its views and no view imports the graph back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import networkx as nx
import onnx
from onnx import TensorProto


class GraphFacts(Protocol):
    """The part of :class:`~rkpart.ir.graph.ModelGraph` a subgraph view and a lifetime count read."""

    @property
    def nodes(self) -> tuple[onnx.NodeProto, ...]: ...

    @property
    def initializers(self) -> Mapping[str, TensorProto]: ...

    @property
    def producer(self) -> Mapping[str, int]: ...

    @property
    def consumers(self) -> Mapping[str, list[int]]: ...

    @property
    def const_ops(self) -> frozenset[int]: ...

    @property
    def ops(self) -> nx.DiGraph: ...

    @property
    def inputs(self) -> tuple[str, ...]: ...

    @property
    def outputs(self) -> tuple[str, ...]: ...

    def is_const_tensor(self, name: str) -> bool: ...

    def nbytes(self, name: str) -> int: ...

    def weight_bytes(self, name: str) -> int: ...

    def const_closure(self, tensors: Iterable[str]) -> list[int]: ...

    def const_node(self, i: int) -> onnx.NodeProto: ...


__all__ = ["GraphFacts"]
