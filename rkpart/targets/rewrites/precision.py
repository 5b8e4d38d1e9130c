"""Precision rewrites: a computation in an element type no toolkit has, done in one it has.

Not exact, unlike :mod:`.npu`: the row naming one of these carries its own gate
(:attr:`rkpart.targets.rewrites.Rewrite.gate`), and ``rkpart compile`` checks it alone against
the original stage under ONNX Runtime before the exact rewrites (:mod:`rkpart.compile.prepare`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.ir.consts import tensor_value
from rkpart.ir.edit import GraphEdit, attr
from rkpart.ir.ops import DEFAULT_DOMAINS

BF16 = TensorProto.BFLOAT16
FLOAT = TensorProto.FLOAT

#: ops without a type attribute whose float outputs take their float inputs' element type (or
#: whose outputs are bool / int64 whatever the float type): an island of them computes in float32
#: what it computed in bfloat16, op for op
_FOLLOWS = frozenset({
    "Abs", "Add", "Ceil", "Clip", "Concat", "Cos", "CumSum", "Div", "Dropout", "Einsum", "Elu", "Erf", "Exp",
    "Expand", "Flatten", "Floor", "Gather", "GatherElements", "GatherND", "Gelu", "Gemm", "HardSigmoid",
    "HardSwish", "Identity", "LayerNormalization", "LeakyRelu", "Log", "LogSoftmax", "MatMul", "Max", "Mean",
    "Min", "Mish", "Mul", "Neg", "Pad", "Pow", "Reciprocal", "ReduceL2", "ReduceMax", "ReduceMean", "ReduceMin",
    "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "RMSNormalization", "Round", "Sigmoid",
    "Sign", "Sin", "Slice", "Softmax", "Softplus", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "Tile",
    "Transpose", "Unsqueeze", "Where",
    # float in, bool / int64 out
    "Equal", "Greater", "GreaterOrEqual", "IsInf", "IsNaN", "Less", "LessOrEqual", "Shape", "Size",
})


def _bf16_to_f32(t: TensorProto) -> TensorProto:
    """A bfloat16 constant as float32, value for value (bfloat16 is float32's upper half)."""
    return numpy_helper.from_array(tensor_value(t).astype(np.float32), t.name)


def may_hold_bfloat16(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s graph makes or holds a bfloat16 tensor (a cast to it, a constant or a
    declared tensor of it), read without its external data."""
    g = model.graph
    if any(t.data_type == BF16 for t in g.initializer):
        return True
    if any(v.type.tensor_type.elem_type == BF16 for v in (*g.input, *g.output, *g.value_info)):
        return True
    for n in g.node:
        for a in n.attribute:
            if (a.name == "to" and a.i == BF16) or (a.name == "value" and a.HasField("t") and a.t.data_type == BF16):
                return True
    return False


def emulated_copy(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of ``model`` with its bfloat16 islands emulated (:func:`emulate_bfloat16`), or ``None``
    when it has none (and nothing is copied)."""
    if not may_hold_bfloat16(model):
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out if emulate_bfloat16(out) else None


def emulate_bfloat16(model: onnx.ModelProto) -> int:
    """Every bfloat16 island of ``model`` computed in float32 and rounded to bfloat16 after each op, in
    place; returns the islands.

    What ONNX Runtime would compute if its CPU provider had the bfloat16 kernels it lacks (``Mul``,
    ``MatMul``, ``Softmax``, ``Sqrt``: 'Could not find an implementation'), as PyTorch's CPU does:
    each op in float32, its result rounded to bfloat16 (a ``Cast`` down and up again).  The
    reference :func:`widen_bfloat16` is checked against, and how ``rkpart run`` runs such a stage.
    """
    return widen_bfloat16(GraphEdit(model), rounding=True)


def widen_bfloat16(view: GraphEdit, rounding: bool = False) -> int:
    """Every island of bfloat16 computation -> the same ops in float32; returns the islands widened.

    An island is what bfloat16 tensors connect: the ``Cast``\\ s into bfloat16 that start it, the
    ops of :data:`_FOLLOWS` inside, the ``Cast``\\ s out of it and its bfloat16 constants
    (initializers, ``Constant`` and ``ConstantOfShape`` values).  A cast in becomes a cast to
    float32 (an ``Identity`` from float32), a cast out to float32 an ``Identity``, the constants
    float32 (exactly: a bfloat16 value is a float32 value).  An island is left as it is when any of
    its bfloat16 tensors is an input or output of the graph, or when one of its ops is not known to
    follow its inputs' type (a ``Cast`` or a ``RandomNormal`` inside it, a custom-domain op).
    """
    if not may_hold_bfloat16(view.model):
        return 0  # read from the graph alone: no type inference for the stages without bfloat16
    g = view.graph
    nodes = list(g.node)
    io = {v.name for v in (*g.input, *g.output)} | _read_in_subgraphs(g)
    inits = {t.name: t for t in g.initializer}
    prod = view.producer_indices()
    readers = view.reader_indices()
    bf = {t for n in nodes for t in (*n.input, *n.output) if t and view.elem(t) == BF16}
    if not bf:
        return 0
    parent = list(range(len(nodes)))

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for t in bf:
        touch = [*readers.get(t, []), *([prod[t]] if t in prod else [])]
        for k in touch[1:]:
            parent[find(k)] = find(touch[0])
    islands: dict[int, list[int]] = {}
    for t in bf:
        for k in (*readers.get(t, []), *([prod[t]] if t in prod else [])):
            islands.setdefault(find(k), [])
    for k in range(len(nodes)):
        if find(k) in islands:
            islands[find(k)].append(k)
    count = 0
    retyped: set[str] = set()
    head: list[onnx.NodeProto] = []  # casts of bfloat16 weights whose bytes are not loaded
    rounds: dict[int, list[onnx.NodeProto]] = {}  # node -> the casts rounding its outputs (``rounding``)
    for members in islands.values():
        tensors = {t for k in members for t in (*nodes[k].input, *nodes[k].output) if t in bf}
        if tensors & io or not all(_widens(view, nodes[k], bf) for k in members):
            continue
        if any(t not in prod and t not in inits for t in tensors):
            continue  # a bfloat16 tensor nothing computes (an input of a subgraph's outer scope)
        for k in members:
            nodes[k] = _widened(view, nodes[k], bf)
            if rounding and nodes[k].op_type not in ("Constant", "ConstantOfShape"):
                rounds[k] = _rounded(view, nodes[k], bf)
        for t in sorted(tensors & set(inits)):
            if inits[t].data_location != TensorProto.EXTERNAL:
                inits[t].CopyFrom(_bf16_to_f32(inits[t]))
                continue
            # its bytes are not loaded (the partitioner's probe): a Cast of it stands for the float32 copy
            wide_name = view.fresh(f"{t}/float32")
            for k in members:
                nodes[k].input[:] = [wide_name if x == t else x for x in nodes[k].input]
            head.append(helper.make_node("Cast", [t], [wide_name], to=FLOAT, name=wide_name))
            tensors.discard(t)
        retyped |= tensors
        count += 1
    if count:
        view.set_nodes([*head, *(m for k, n in enumerate(nodes) for m in (n, *rounds.get(k, ())))])
        for vi in g.value_info:
            if vi.name in retyped and vi.type.tensor_type.elem_type == BF16:
                vi.type.tensor_type.elem_type = FLOAT
    return count


def _read_in_subgraphs(g: onnx.GraphProto) -> set[str]:
    """Every tensor a node of a subgraph (an ``If`` branch, a ``Loop`` body) reads: such a reader is
    no input slot of the outer graph, so the island cannot see it."""
    out: set[str] = set()
    for n in g.node:
        for a in n.attribute:
            for sub in (*([a.g] if a.HasField("g") else []), *a.graphs):
                out |= {t for m in sub.node for t in m.input} | _read_in_subgraphs(sub)
    return out


def _widens(view: GraphEdit, n: onnx.NodeProto, bf: set[str]) -> bool:
    """Whether ``n`` computes in float32 what it computed in bfloat16 once the island is widened."""
    if n.domain not in DEFAULT_DOMAINS:
        return False
    if n.op_type == "Cast":
        return True  # in (to bfloat16), out (from bfloat16), or bfloat16 to bfloat16
    if n.op_type in ("Constant", "ConstantOfShape"):
        t = attr(n, "value", None)
        return isinstance(t, TensorProto) and t.data_type == BF16
    if n.op_type == "CastLike":
        return bool(n.input[1] in bf)
    return n.op_type in _FOLLOWS


def _rounded(view: GraphEdit, n: onnx.NodeProto, bf: set[str]) -> list[onnx.NodeProto]:
    """The casts that round ``n``'s outputs that were bfloat16 (``n`` now writes them under fresh names)."""
    out = []
    for k, t in enumerate(n.output):
        if t not in bf:
            continue
        wide, low = view.fresh(f"{t}/float32"), view.fresh(f"{t}/bfloat16")
        n.output[k] = wide
        out += [helper.make_node("Cast", [wide], [low], to=BF16, name=low),
                helper.make_node("Cast", [low], [t], to=FLOAT, name=f"{low}/up")]
    return out


def _widened(view: GraphEdit, n: onnx.NodeProto, bf: set[str]) -> onnx.NodeProto:
    """``n`` as it reads in the float32 island (a new node; ``n`` itself is left as it was)."""
    out = onnx.NodeProto()
    out.CopyFrom(n)
    if n.op_type == "Cast":
        to = int(attr(n, "to", 0))  # type: ignore[call-overload]
        src = FLOAT if n.input[0] in bf else view.elem(n.input[0])
        dst = FLOAT if to == BF16 else to
        if src == dst:
            return helper.make_node("Identity", list(n.input), list(n.output), name=n.name or None)
        for a in out.attribute:
            if a.name == "to":
                a.i = dst
        return out
    if n.op_type in ("Constant", "ConstantOfShape"):
        for a in out.attribute:
            if a.name == "value":
                a.t.CopyFrom(_bf16_to_f32(a.t))
    return out


__all__ = ["emulate_bfloat16", "emulated_copy", "may_hold_bfloat16", "widen_bfloat16"]
