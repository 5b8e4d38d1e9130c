"""The one op taxonomy: which ONNX op types rkpart treats alike, and why.

Every package asks these sets (loading, discovery, extraction, cost-model features) instead
of keeping its own list, so "is this op weighted?" has one answer.  A set names a role, not
a device: what the NPU can run is :mod:`rkpart.targets`' business.
"""

from __future__ import annotations

#: domains rkpart loads (ONNX Runtime's contrib ops included)
DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})
SUPPORTED_DOMAINS = DEFAULT_DOMAINS | {"com.microsoft"}

#: ops whose presence we accept only inside a single stage (a cut through them is refused)
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
#: ops whose result differs between runs: never constant, never folded
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"})
#: ops that only re-label data; walked through when following the residual stream
PASS_THROUGH_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Identity", "Cast", "Flatten"})
#: ops that move data without computing: the residual stream may pass through them between
#: blocks (Flux single blocks concatenate the text and image streams and slice them apart)
LINK_OPS = PASS_THROUGH_OPS | frozenset({"Concat", "Slice", "Split", "Transpose"})
#: ops that re-label a tensor or make a small constant: no data movement worth counting
RELABEL_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten", "Shape", "Constant",
                         "ConstantOfShape", "Size"})

#: ops with a weight operand (the linear layers of a block)
WEIGHTED_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"})
#: matrix products whose operands are (batched) matrices: ``k`` is the last dim of input 0
MATMUL_OPS = frozenset({"MatMul", "MatMulInteger", "QLinearMatMul"})
#: convolutions (multiply-accumulates from the weight's ``Cin/group x kernel`` per output element)
CONV_OPS = frozenset({"Conv", "ConvTranspose"})
#: ops whose multiply-accumulates are counted
MAC_OPS = WEIGHTED_OPS | MATMUL_OPS
#: fused attention ops (ONNX Runtime contrib / opset 23)
ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention"})
#: normalisations (ReduceMean: the mean of a hand-written LayerNorm / RMSNorm)
NORM_OPS = frozenset({"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
                      "GroupNormalization", "InstanceNormalization", "ReduceMean"})
#: ops that read a whole axis to produce a smaller result (their work is their input's size)
REDUCE_OPS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
                        "ReduceSumSquare", "Softmax", "LayerNormalization", "RMSNormalization",
                        "SimplifiedLayerNormalization", "GroupNormalization", "InstanceNormalization"})
#: ops whose output can be far larger than their inputs (a 16-byte shape -> 64 GB of ones)
GENERATIVE_OPS = frozenset({"ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Upsample", "Pad", "OneHot",
                            "EyeLike", "MatMul", "Gemm", "Einsum", "Col2Im", "Unique", "NonZero"})

__all__ = ["ATTENTION_OPS", "CONTROL_FLOW_OPS", "CONV_OPS", "DEFAULT_DOMAINS", "GENERATIVE_OPS", "LINK_OPS", "MAC_OPS",
           "MATMUL_OPS", "NORM_OPS", "PASS_THROUGH_OPS", "RANDOM_OPS", "REDUCE_OPS", "RELABEL_OPS",
           "SUPPORTED_DOMAINS", "WEIGHTED_OPS"]
