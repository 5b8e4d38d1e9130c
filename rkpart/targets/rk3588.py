"""Rockchip RK3588: the NPU's memory window and what rknn-toolkit2 2.3.0 / 2.3.2 / 2.5.0 build for it.

Sources
-------
* ONNX operator list: ``doc/RKNNToolKit2_OP_Support-2.3.0.md`` and ``-2.3.2.md`` of
  github.com/airockchip/rknn-toolkit2 (commits a8dd54d and 42aa1d4; the two ONNX tables are
  identical).  Ops the list marks "Not Supported" are left out of :data:`ONNX_OPS`; they are
  not refused by the toolkit (nine of them were built here, see ``_MEASURED``) but get no NPU
  kernel of their own.  The repository publishes no list for 2.5.0: it gets 2.3.2's
  (:meth:`rkpart.targets.base.Target.caps`); the placement builds below found no op of an
  Anima-style block that 2.5.0 could not build.
* Opset: the same documents ("the corresponding ONNX opset version is 19"); measured here:
  ``load_onnx`` of a one-Relu model succeeds at opset 19 and fails at opset 20 with
  "Unsupport onnx opset 20, need <= 19!" under 2.3.0 and 2.5.0 (2.3.2's ``rknn_base`` binary
  holds the same message).
* NPU placement: ``doc/05_RKNN_Compiler_Support_Operator_List_V2.3.x.pdf`` as summarised in
  /work/shared/reference/rknn.md ("Op placement (CPU fallback)"): the RK3588 NPU has no plain
  MatMul, Erf, Sin, Cos, ReduceMean, Sqrt or LayerNormalization; they run on the NPU only
  when fused.  Measured by rkpart's placement report (:mod:`rkpart.compile.placement`): a
  full Anima-style block built by 2.3.0 and 2.5.0 ran every layer on the NPU (exact GELU
  fused into ``ConvExGelu``/``exGelu``), while a standalone Erf fell back to the CPU in every
  version.  Transpose falls back above shape limits (rknn-toolkit2 issue #490: h*w > 8192).
* Memory: the RK3588 NPU addresses a 4 GiB window (32-bit addresses); a stage's default
  budget is a quarter of it (1024 MiB, the ``generic`` strategy's default since it was written).
  A whole pipeline's default budget (``--strategy auto`` without ``--budget-mib``) is the
  4 GiB window, bounded by half the RAM of the common 8 GiB boards (ROCK 5C 8GB, Orange Pi 5):
  the other half belongs to the OS, the text encoder and the VAE.
"""

from __future__ import annotations

from rkpart.targets.base import GIB, AttrLimit, OpRule, Support, Target, ToolkitCaps, rules

#: ONNX op -> the operator list's remark, for every op the 2.3.x lists do not mark "Not Supported"
ONNX_OPS: dict[str, str] = {
    "Add": "",
    "And": "",
    "ArgMax": "",
    "ArgMin": "",
    "AveragePool": "",
    "BatchNormalization": "",
    "Cast": "",
    "Clip": "",
    "Concat": "",
    "Constant": "",
    "ConstantOfShape": "",
    "Conv": "",
    "ConvTranspose": "",
    "Cos": "",
    "DepthToSpace": "",
    "DequantizeLinear": "",
    "Div": "",
    "Dropout": "",
    "Elu": "",
    "Equal": "",
    "Erf": "",
    "Exp": "",
    "Expand": "",
    "EyeLike": "only support constant input",
    "Flatten": "",
    "Floor": "",
    "Gather": "",
    "GatherElements": "",
    "Gemm": "",
    "GlobalAveragePool": "",
    "GlobalMaxPool": "",
    "Greater": "",
    "GreaterOrEqual": "",
    "GRU": "batchsize: 1",
    "HardSigmoid": "",
    "HardSwish": "",
    "Identity": "",
    "If": "only support constant input",
    "InstanceNormalization": "",
    "LayerNormalization": "",
    "LeakyRelu": "",
    "Less": "",
    "LessOrEqual": "",
    "Log": "",
    "LogSoftmax": "batchsize: 1",
    "LpNormalization": "",
    "LRN": "",
    "LSTM": "",
    "MatMul": "",
    "Max": "",
    "MaxPool": "",
    "MaxRoiPool": "",
    "MaxUnpool": "",
    "MeanVarianceNormalization": "",
    "Min": "",
    "Mish": "",
    "Mod": "",
    "Mul": "",
    "Pad": "",
    "Pow": "",
    "PRelu": "",
    "QuantizeLinear": "",
    "ReduceMax": "",
    "ReduceMean": "",
    "ReduceMin": "",
    "ReduceSum": "",
    "Relu": "",
    "Reshape": "",
    "Resize": "mode: nearest2d/bilinear",
    "ReverseSequence": "",
    "RoiAlign": "pool type: average; batchsize: 1",
    "ScatterND": "",
    "Shape": "",
    "Sigmoid": "",
    "Sin": "",
    "Size": "",
    "Slice": "batchsize: 1",
    "Softmax": "batchsize: 1",
    "Softplus": "",
    "SpaceToDepth": "",
    "Split": "",
    "Sqrt": "",
    "Squeeze": "",
    "Sub": "",
    "Tanh": "",
    "Tile": "batchsize: 1; not support broadcast",
    "Transpose": "",
    "Unsqueeze": "",
    "Where": "",
}

#: ops the RK3588 NPU runs only inside a fused pattern (alone they fall back to the CPU)
_FUSED = {
    "MatMul": "NPU as exMatMul / exSDPAttention (fp16); no plain MatMul unit",
    "Erf": "NPU inside exact GELU (ConvExGelu / exGelu); a standalone Erf runs on the CPU (measured)",
    "Sin": "no plain Sin unit on the RK3588 NPU",
    "Cos": "no plain Cos unit on the RK3588 NPU",
    "ReduceMean": "NPU inside exNorm (LayerNorm pattern); no plain ReduceMean unit",
    "Sqrt": "NPU inside exNorm (LayerNorm pattern); no plain Sqrt unit",
    "LayerNormalization": "NPU as exNorm (fp16, normalised axes [1] or [1,2,3])",
}

#: ops the list marks "Not Supported", built here with 2.3.0 (one op before a 1x1 Conv, fp16,
#: rk3588; placement from the build's layer table, :mod:`rkpart.compile.placement`): every one
#: built; the toolkit rewrote some into NPU ops and ran the others on the CPU
_MEASURED = {
    "Neg": OpRule("Neg", Support.NPU, "folded into the following Conv's weights (measured, 2.3.0)"),
    "Abs": OpRule("Abs", Support.NPU, "rewritten to LeakyRelu on the NPU (measured, 2.3.0)"),
    "Sum": OpRule("Sum", Support.NPU, "rewritten to Add on the NPU (measured, 2.3.0)"),
    "CumSum": OpRule("CumSum", Support.NPU, "rewritten to Reshape + Conv on the NPU (measured, 2.3.0)"),
    "Reciprocal": OpRule("Reciprocal", Support.CPU, "runs as Div on the CPU (measured, 2.3.0)"),
    "Ceil": OpRule("Ceil", Support.CPU, "runs on the CPU (measured, 2.3.0)"),
    "Round": OpRule("Round", Support.CPU, "runs on the CPU (measured, 2.3.0)"),
    "Sign": OpRule("Sign", Support.CPU, "runs on the CPU (measured, 2.3.0)"),
    "Not": OpRule("Not", Support.CPU, "runs on the CPU (measured, 2.3.0)"),
}

#: listed or not, built between two matmuls (16 tokens x 64, fp16; ``scripts/measure_ops.py``) and
#: placed on the CPU by both 2.3.0 and 2.5.0: routing (TopK, ArgMax, OneHot, ScatterElements),
#: guards and comparisons (IsNaN, IsInf, Equal), Mod, a standalone ReduceMax and ScatterND.  Measured
#: on the NPU and not listed here: GatherElements with constant indices (a matmul), Expand, Einsum;
#: Tile is context-dependent (CPU there, NPU in Lumina2's GQA repeat on 2.3.0): learned, not listed.
_MEASURED_BOTH = "runs on the CPU (measured, 2.3.0 and 2.5.0, scripts/measure_ops.py)"
_MEASURED.update({op: OpRule(op, Support.CPU, _MEASURED_BOTH) for op in (
    "TopK", "ArgMax", "OneHot", "ScatterElements", "IsNaN", "IsInf", "Equal", "Mod", "ReduceMax", "ScatterND")})

_OPS = rules(ONNX_OPS, fused=_FUSED, measured=_MEASURED)
#: attribute ranges the operator list states ("Resize: mode: nearest2d/bilinear")
_ATTRS = {"Resize": (AttrLimit("mode", ("nearest", "linear"), "nearest"),)}
_DOC = "airockchip/rknn-toolkit2 doc/RKNNToolKit2_OP_Support-{v}.md"
_FORMS = {"Gather": ((True, False), "a Gather of a constant table by data indices runs on the CPU (measured, "
                                    "2.3.0 and 2.5.0, scripts/measure_ops.py)")}

RK3588 = Target(
    name="rk3588",
    npu_window_bytes=4 * GIB,
    toolkits={
        "2.3.0": ToolkitCaps(version="2.3.0", max_opset=19, ops=_OPS, source=_DOC.format(v="2.3.0"), attrs=_ATTRS,
                             cpu_forms=_FORMS),
        "2.3.2": ToolkitCaps(version="2.3.2", max_opset=19, ops=_OPS, source=_DOC.format(v="2.3.2"), attrs=_ATTRS,
                             cpu_forms=_FORMS),
    },
    default_toolkit="2.3.0",
    board_ram_bytes=8 * GIB,
    board_share=0.5,
)

__all__ = ["ONNX_OPS", "RK3588"]
