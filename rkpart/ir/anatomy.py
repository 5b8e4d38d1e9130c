"""A graph's *anatomy*: what decides its compiled tables whatever its weights.

Its nodes in order with their types, attributes and tensor types, tensors numbered by first use (names
left out), constants by type and shape (by value when small integers or a float scalar: shapes, axes,
an epsilon, a scale).  Two graphs of equal anatomy compile to equal layer tables and memory statistics
(the blocks of one model), so one build stands for all of them.  One definition serves a stage file
(:func:`rkpart.compile.weigh.stage_anatomy`: one weighing per anatomy) and a block of a loaded model
(:func:`rkpart.cost_model.candidates.block_anatomy`: one build per anatomy in ``auto``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import onnx

if TYPE_CHECKING:
    from rkpart.ir.graph import ModelGraph

#: integer constants of at most this many elements are hashed by value (shapes, axes, indices)
SMALL_CONSTANT = 64
_FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                     onnx.TensorProto.BFLOAT16})


def constant_token(t: onnx.TensorProto) -> str:
    """A constant in an anatomy: its type and shape, and its value's hash when it is a small integer tensor or
    a float scalar (a shape, an axis, an index, an epsilon, a scale: they decide the graph; a weight's values
    do not; a tensor whose data is not loaded is a weight)."""
    n = 1
    for d in t.dims:
        n *= d
    head = f"c{t.data_type}{list(t.dims)}"
    # a float tensor of more than one value is a weight (a tiny model's norm weights are small too)
    if n > SMALL_CONSTANT or (t.data_type in _FLOATS and n > 1) or t.data_location == onnx.TensorProto.EXTERNAL:
        return head
    c = onnx.TensorProto()
    c.CopyFrom(t)
    c.ClearField("name")
    c.ClearField("doc_string")
    return head + hashlib.sha256(c.SerializeToString(deterministic=True)).hexdigest()[:12]


def anatomy(nodes: Iterable[onnx.NodeProto], type_of: Callable[[str], str], constant: Callable[[str], str | None],
            outputs: Sequence[str] = ()) -> str:
    """The anatomy of ``nodes`` (in order): ``type_of(tensor)`` its type token, ``constant(tensor)`` a
    constant's token (:func:`constant_token`) or ``None`` for an activation; ``outputs``, the graph's
    outputs, by the same numbering.  32 hex digits."""
    local: dict[str, int] = {}
    h = hashlib.sha256(b"rkpart-anatomy-v1\0")

    def ref(t: str) -> str:
        if not t:
            return "-"
        c = constant(t)
        if c is not None:
            return c
        return f"{local.setdefault(t, len(local))}:{type_of(t)}"

    for n in nodes:
        attrs = []
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                attrs.append(f"{a.name}={constant_token(a.t)}")
            elif a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                attrs.append(f"{a.name}=" + ",".join(model_anatomy(onnx.helper.make_model(sg)) for sg in
                                                    ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))))
            else:
                c = onnx.AttributeProto()
                c.CopyFrom(a)
                c.ClearField("doc_string")
                attrs.append(c.SerializeToString(deterministic=True).hex())
        h.update(f"{n.domain}:{n.op_type}({','.join(ref(t) for t in n.input)})->"
                 f"({','.join(ref(t) for t in n.output)})[{';'.join(attrs)}]\n".encode())
    h.update(("out:" + ",".join(ref(o) for o in outputs)).encode())
    return h.hexdigest()[:32]


def model_anatomy(model: onnx.ModelProto) -> str:
    """The anatomy of a whole ONNX graph (a stage file; ``model`` may be loaded without its external data)."""
    g = model.graph
    types: dict[str, str] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim]
        types[vi.name] = f"{tt.elem_type}{dims}"
    consts = {t.name: constant_token(t) for t in g.initializer}
    return anatomy(g.node, lambda t: types.get(t, "?"), consts.get, [o.name for o in g.output])


def ops_anatomy(mg: ModelGraph, ops: Iterable[int]) -> str:
    """The anatomy of ops ``ops`` of a loaded model (in the order given): a block of it, before it is cut
    into a stage (:func:`rkpart.cost_model.candidates.block_anatomy`)."""
    def type_of(t: str) -> str:
        tt = mg.tensor_types.get(t)
        return "?" if tt is None else f"{tt[0]}{list(tt[1])}"

    def constant(t: str) -> str | None:
        init = mg.initializers.get(t)
        if init is not None:
            return constant_token(init)
        # computed from constants alone in the model (folded or copied into a stage): by type, as a weight
        return f"c:{type_of(t)}" if mg.is_const_tensor(t) else None

    return anatomy((mg.nodes[i] for i in ops), type_of, constant)


__all__ = ["SMALL_CONSTANT", "anatomy", "constant_token", "model_anatomy", "ops_anatomy"]
