"""Which tensors' *shapes* the model inputs' *values* can change, read from the graph's structure.

Shape inference gives up on some exports whose shapes all follow from the static input shapes:
TorchScript's timestep embedding casts to a type inference leaves unranked, a Reshape target is
``Concat(Slice(Shape(x)), ...)`` with bounds computed by ``Mod`` / ``Add`` of constants, a ``Slice``
of a ``Shape`` gets its bounds from a ``Reshape`` of shape arithmetic.  Such a model is not
data-dependent: any inputs of the right shapes give every tensor the same shape, so one ONNX
Runtime run on zeros observes them (:func:`rkpart.ir.load.load_model` does, see
:func:`shape_varying`).  A model whose shapes the data decides (``NonZero`` of a mask, an ``If``
on a value, a ``Reshape`` to a value computed from an input's values) still needs
``--inputs``: the run proves nothing there.

:func:`shape_varying` is a forward pass over the nodes with two facts per tensor, as XLA's
and TVM's shape functions split "data-dependent" from "shape-dependent" outputs:

* **value-varying**: its value depends on the values of a model input;
* **shape-varying**: its shape does.

A model input is value-varying (its shape is static).  ``Shape`` and ``Size`` read only their
input's shape.  An op of :data:`SHAPE_FROM_SHAPES` (elementwise, matmul, normalisation, layout)
makes its output shapes from its inputs' shapes and attributes; an op of
:data:`SHAPE_FROM_VALUES` also from the values of the inputs at the positions listed (a
``Reshape``'s target, a ``Slice``'s bounds, a ``ConstantOfShape``'s shape).  Every other op
(``NonZero``, ``Unique``, control flow, sequences, other domains but the ONNX Runtime contrib ops
of :data:`CONTRIB_SHAPE_FROM_SHAPES`) is taken as one whose output
shapes may depend on any input value.  The analysis only ever errs towards "varying".
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from rkpart.ir.ops import DEFAULT_DOMAINS

#: ops whose output shapes follow from their inputs' shapes and attributes alone
SHAPE_FROM_SHAPES = frozenset({
    # elementwise (broadcasting reads shapes only)
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitShift", "BitwiseAnd",
    "BitwiseNot", "BitwiseOr", "BitwiseXor", "Cast", "CastLike", "Ceil", "Celu", "Clip", "Cos", "Cosh",
    "Div", "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu", "Greater", "GreaterOrEqual", "HardSigmoid",
    "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Less", "LessOrEqual", "Log", "Max", "Mean",
    "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal", "Relu", "Round",
    "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Sub", "Sum",
    "Tan", "Tanh", "ThresholdedRelu", "Where", "Xor", "QuantizeLinear", "DequantizeLinear",
    "Dropout", "Trilu",
    # contractions, normalisations, layout, indexing by index *shape*
    "MatMul", "MatMulInteger", "QLinearMatMul", "Gemm", "Conv", "ConvTranspose", "ConvInteger",
    "QLinearConv", "Einsum", "Softmax", "LogSoftmax", "Hardmax", "LayerNormalization",
    "RMSNormalization", "GroupNormalization", "InstanceNormalization", "BatchNormalization",
    "LpNormalization", "MeanVarianceNormalization", "LRN", "Transpose", "Flatten", "Concat",
    "Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements", "Scatter",
    "DepthToSpace", "SpaceToDepth", "CumSum", "ArgMax", "ArgMin", "MaxPool", "AveragePool", "LpPool",
    "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "EyeLike", "ReverseSequence",
})
#: ONNX Runtime's contrib ops (``com.microsoft``, what ``onnxruntime.transformers.optimizer`` fuses an
#: export into) whose output shapes follow from their inputs' shapes: ONNX shape inference knows
#: none of them and leaves everything after the first untyped
CONTRIB_SHAPE_FROM_SHAPES = frozenset({
    "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "GemmFastGelu", "FusedMatMul", "BiasAdd", "BiasSplitGelu",
    "BiasSoftmax", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
    "LayerNormalization", "RotaryEmbedding", "MultiHeadAttention", "GroupNorm", "SkipGroupNorm", "NhwcConv",
})
#: op -> the input positions whose *values* (besides every input's shape) decide the output shapes
SHAPE_FROM_VALUES: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4), "Tile": (1,), "Pad": (1, 3),
    "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,), "CenterCropPad": (1,),
    "Col2Im": (1, 2), "DFT": (1, 2), "STFT": (2, 3), "GridSample": (),
    **dict.fromkeys(("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                     "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"), (1,)),
}
#: ops that read only their input's shape (its value never)
SHAPE_READERS = frozenset({"Shape", "Size"})


def node_reads(node: onnx.NodeProto) -> set[str]:
    """Tensors ``node`` reads: its inputs and what its subgraphs (``If``/``Loop`` bodies) read
    from the enclosing scopes."""
    out = {t for t in node.input if t}
    for a in node.attribute:
        for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                    list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
            for inner in sub.node:
                out |= node_reads(inner)
    return out


def _if_varies(n: onnx.NodeProto, values: set[str], shapes: set[str]) -> bool:
    """Whether the output shapes of the ``If`` ``n`` can vary: its condition's value can, or a
    branch's output shape can (each branch read with the outer tensors' facts)."""
    if not n.input or n.input[0] in values or n.input[0] in shapes:
        return True
    for a in n.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            _, inner_shapes = shape_varying(a.g.node, (), values=values, shapes=shapes)
            if any(o.name in inner_shapes for o in a.g.output):
                return True
    return False


def shape_varying(nodes: Iterable[onnx.NodeProto], inputs: Iterable[str], *, values: set[str] | None = None,
                  shapes: set[str] | None = None) -> tuple[set[str], set[str]]:
    """``(value_varying, shape_varying)``: the tensors of ``nodes`` (topologically sorted) whose
    value, resp. shape, the values of the model ``inputs`` (static shapes) can change.

    ``values`` / ``shapes``: facts already known of outer tensors (a branch's reads), copied.
    """
    values = set(values or ()) | set(inputs)
    shapes = set(shapes or ())
    for n in nodes:
        outs = [t for t in n.output if t]
        default = n.domain in DEFAULT_DOMAINS
        ins = list(n.input)
        if default and n.op_type in SHAPE_READERS:
            # the value is the shape; its own shape (the rank) varies with the input's shape
            vary_value = vary_shape = bool(ins) and ins[0] in shapes
        elif (default and n.op_type in SHAPE_FROM_SHAPES) or (
                n.domain == "com.microsoft" and n.op_type in CONTRIB_SHAPE_FROM_SHAPES):
            vary_value = any(t in values or t in shapes for t in ins if t)
            vary_shape = any(t in shapes for t in ins if t)
        elif default and n.op_type in SHAPE_FROM_VALUES:
            at = SHAPE_FROM_VALUES[n.op_type]
            vary_value = any(t in values or t in shapes for t in ins if t)
            vary_shape = any(t in shapes for t in ins if t) or any(
                i < len(ins) and ins[i] in values for i in at)
        elif default and n.op_type == "If":
            # TorchScript's squeeze of a dim it cannot prove is 1: If(Shape(x)[d] == 1, ...)
            vary_value = any(t in values or t in shapes for t in node_reads(n))
            vary_shape = _if_varies(n, values, shapes)
        else:
            vary_value = vary_shape = any(t in values or t in shapes for t in node_reads(n))
        if vary_value:
            values.update(outs)
        if vary_shape:
            shapes.update(outs)
    return values, shapes


__all__ = ["CONTRIB_SHAPE_FROM_SHAPES", "SHAPE_FROM_SHAPES", "SHAPE_FROM_VALUES", "SHAPE_READERS", "node_reads",
           "shape_varying"]
