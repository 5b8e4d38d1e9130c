"""Cut a model down to any subset of its ops and still get a valid, statically shaped ONNX graph.

This is what delta debugging needs: a candidate is just a set of op indices, and
:meth:`Subgraph.extract` turns it into a new :class:`onnx.ModelProto` by a recipe of small
steps, as ``onnx.utils.Extractor`` does:

1. tensors read by a kept op but produced by a dropped one ("cut producers") become new
   graph inputs with the static dtype/shape the full model had;
2. cut tensors that are not floating point (index arithmetic, masks) cannot be inputs of an
   RKNN model, so they are frozen into initializers with the value a seeded ONNX Runtime run
   of the full model gives them (as Polygraphy's ``debug reduce`` freezes branches);
3. constant computations (``Constant`` nodes, transposed weights) are evaluated into
   initializers, so a candidate's node count is the number of ops that carry data;
4. a kept op's outputs become graph outputs when nothing kept reads them (but something in
   the full model did, or they were model outputs); ops whose results nobody ever reads are
   dropped;
5. only the initializers the kept ops read are copied.

The input model is never modified.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor

from rkpart.ir import ModelGraph, load_model

#: seed of the ONNX Runtime run that gives frozen (non-float) cut tensors their values
FREEZE_SEED = 0


def graph_hash(model: onnx.ModelProto) -> str:
    """sha256 of the deterministic serialisation: equal graphs share cached build outcomes."""
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


@dataclass(frozen=True)
class Candidate:
    """One extracted subgraph: the ops it keeps (indices into ``Subgraph.mg.nodes``) and its model."""

    ops: tuple[int, ...]
    model: onnx.ModelProto
    digest: str

    @property
    def num_nodes(self) -> int:
        return len(self.model.graph.node)


class Subgraph:
    """A loaded model prepared for cutting (see the module docstring).

    Parameters
    ----------
    path
        The ONNX model (external data is read from its folder when a candidate needs it).
    input_shapes
        Static shapes for symbolic model inputs, as for ``rkpart partition --shape``.
    """

    def __init__(self, path: str | Path, input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self.path = Path(path)
        self.mg: ModelGraph = load_model(self.path, input_shapes=input_shapes)
        #: the reducible units: ops that carry data from the model inputs, in topological order
        self.ops: tuple[int, ...] = tuple(sorted(self.mg.ops.nodes))
        self._outputs = set(self.mg.outputs)
        self._values: dict[str, np.ndarray] = {}
        self._inits: dict[str, TensorProto] = {}

    # -- public -------------------------------------------------------------------------
    def extract(self, keep: Iterable[int]) -> Candidate | None:
        """The candidate graph keeping ``keep`` (op indices), or ``None`` if it has no inputs or outputs."""
        kept = self._live(sorted(set(keep)))
        if not kept:
            return None
        produced = {t for i in kept for t in self.mg.nodes[i].output if t}
        readers = self._readers(kept)
        inputs, inits = self._collect_inputs(kept, produced)
        outputs = self._collect_outputs(kept, readers)
        if not inputs or not outputs:
            return None
        nodes = []
        for i in kept:
            n = onnx.NodeProto()
            n.CopyFrom(self.mg.nodes[i])
            nodes.append(n)
        graph = helper.make_graph(
            nodes,
            self.mg.model.graph.name or "reduced",
            [self._value_info(t) for t in inputs],
            [self._value_info(t) for t in outputs],
            initializer=[self._initializer(t) for t in inits],
        )
        model = helper.make_model(graph, opset_imports=list(self.mg.model.opset_import),
                                  producer_name="rkpart-triage")
        model.ir_version = self.mg.model.ir_version
        return Candidate(ops=tuple(kept), model=model, digest=graph_hash(model))

    def describe(self, ops: Iterable[int]) -> list[str]:
        """``OpType name`` of each op, for progress lines and reports."""
        return [f"{self.mg.nodes[i].op_type} {self.mg.nodes[i].name or i}" for i in ops]

    # -- recipe steps ---------------------------------------------------------------------
    def _live(self, kept: list[int]) -> list[int]:
        # An op none of whose results is read by anything (in the full model) nor is a model
        # output would only add dangling outputs.
        def used(t: str) -> bool:
            return bool(t) and (t in self._outputs or bool(self.mg.consumers.get(t)))

        return [i for i in kept if any(used(t) for t in self.mg.nodes[i].output)]

    def _readers(self, kept: list[int]) -> dict[str, int]:
        count: dict[str, int] = {}
        for i in kept:
            for t in self.mg.nodes[i].input:
                if t:
                    count[t] = count.get(t, 0) + 1
        return count

    def _collect_inputs(self, kept: list[int], produced: set[str]) -> tuple[list[str], list[str]]:
        inputs: list[str] = []
        inits: list[str] = []
        seen: set[str] = set()
        for i in kept:
            for t in self.mg.nodes[i].input:
                if not t or t in produced or t in seen:
                    continue
                seen.add(t)
                if t in self.mg.initializers or self.mg.is_const_tensor(t):
                    inits.append(t)
                elif t in self.mg.inputs or self._is_float(t):
                    inputs.append(t)
                else:
                    inits.append(t)  # a cut non-float tensor: frozen, see _initializer
        return inputs, inits

    def _collect_outputs(self, kept: list[int], readers: Mapping[str, int]) -> list[str]:
        outs = []
        for i in kept:
            for t in self.mg.nodes[i].output:
                if not t:
                    continue
                if t in self._outputs or (self.mg.consumers.get(t) and not readers.get(t)):
                    outs.append(t)
        return outs

    # -- helpers ------------------------------------------------------------------------------
    def _is_float(self, t: str) -> bool:
        dt = self.mg.dtype(t)
        return dt is not None and not dt.startswith("onnx:") and np.dtype(dt).kind == "f"

    def _value_info(self, t: str) -> onnx.ValueInfoProto:
        dt, shape = self.mg.tensor_types[t]
        return helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), list(shape))

    def _initializer(self, t: str) -> TensorProto:
        if t in self._inits:
            return self._inits[t]
        init = self.mg.initializers.get(t)
        if init is not None:
            out = TensorProto()
            out.CopyFrom(init)
            if out.data_location == TensorProto.EXTERNAL:
                load_external_data_for_tensor(out, str(self.path.parent))
                out.data_location = TensorProto.DEFAULT
                del out.external_data[:]
        else:
            out = numpy_helper.from_array(self._value(t), name=t)
        self._inits[t] = out
        return out

    def _value(self, t: str) -> np.ndarray:
        if t not in self._values:
            if self.mg.is_const_tensor(t):
                self._values[t] = self._eval_constant(t)
            else:
                self._values.update(self._run_full_model([t]))
        return self._values[t]

    def _eval_constant(self, t: str) -> np.ndarray:
        from onnx.reference import ReferenceEvaluator

        closure = self.mg.const_closure([t])
        nodes = [self.mg.nodes[i] for i in closure]
        produced = {o for n in nodes for o in n.output}
        needed = sorted({x for n in nodes for x in n.input if x and x not in produced})
        graph = helper.make_graph(nodes, "const", [], [self._value_info(t)],
                                  initializer=[self._initializer(x) for x in needed])
        model = helper.make_model(graph, opset_imports=list(self.mg.model.opset_import))
        model.ir_version = self.mg.model.ir_version
        res: Any = ReferenceEvaluator(model).run(None, {})
        return np.asarray(res[0])

    def _run_full_model(self, tensors: list[str]) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        model = onnx.load(str(self.path))  # with external data: ORT needs the weights
        have = {o.name for o in model.graph.output}
        for t in tensors:
            if t not in have:
                model.graph.output.append(self._value_info(t))
        from rkpart.runtime.executor import random_feeds

        feeds = random_feeds(((n, *self.mg.tensor_types[n]) for n in self.mg.inputs), FREEZE_SEED)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = sess.run(tensors, dict(feeds))
        return {t: np.asarray(v) for t, v in zip(tensors, got, strict=True)}
