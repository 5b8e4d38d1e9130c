"""The one constant evaluator: ONNX ops on known values, at the model's own opset.

Folding at load (:mod:`rkpart.ir.load`), a computed constant copied into a stage
(:meth:`rkpart.ir.graph.ModelGraph.constant`) and the values a rewrite matches on
(:meth:`rkpart.ir.edit.GraphEdit.value`) all evaluate through :func:`evaluate`, with the
ONNX reference evaluator and the opsets of the model the ops come from (an op's meaning
depends on its opset: ``Split``'s sizes, ``Clip``'s bounds).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def opsets_of(model: onnx.ModelProto) -> dict[str, int]:
    """Domain -> version of ``model``'s opset imports (``ai.onnx`` spelled ``""``)."""
    return {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}


def evaluate(
    nodes: Sequence[onnx.NodeProto],
    outputs: Sequence[str],
    opsets: Mapping[str, int],
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    initializers: Iterable[TensorProto] = (),
) -> list[np.ndarray]:
    """The values of ``outputs`` computed by ``nodes`` (in a topological order) from ``feeds``
    and ``initializers``.

    Raises what the evaluator raises (an op it cannot run, data that does not fit its shape);
    numeric warnings (a hostile model dividing by zero) are its result, not news for stderr.
    """
    from onnx.reference import ReferenceEvaluator  # imported only if needed: slow to load

    feeds = dict(feeds or {})
    ins = [helper.make_tensor_value_info(t, TensorProto.UNDEFINED, None) for t in feeds]
    outs = [helper.make_tensor_value_info(t, TensorProto.UNDEFINED, None) for t in outputs]
    graph = helper.make_graph(list(nodes), "const", ins, outs, initializer=list(initializers))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res: Any = ReferenceEvaluator(graph, opsets=dict(opsets)).run(None, feeds)
    return [np.asarray(r) for r in res]


def tensor_value(t: TensorProto) -> np.ndarray:
    """The value of an inline tensor (an initializer, a ``Constant``'s ``value``)."""
    return np.asarray(numpy_helper.to_array(t))


def inline_bytes(t: TensorProto) -> bytes:
    """The bytes of an inline tensor's values (``raw_data``, or its typed fields packed as such)."""
    return t.raw_data if t.raw_data else tensor_value(t).tobytes()


def constant_tensor(n: onnx.NodeProto) -> TensorProto | None:
    """The tensor a ``Constant`` op holds in its ``value`` attribute (``None``: another op, or
    another form of Constant)."""
    if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.attribute) == 1 \
            and n.attribute[0].name == "value":
        return n.attribute[0].t
    return None


__all__ = ["constant_tensor", "evaluate", "inline_bytes", "opsets_of", "tensor_value"]
