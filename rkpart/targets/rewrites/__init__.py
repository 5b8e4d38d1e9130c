"""Graph rewrites rkpart applies before a toolkit sees a stage: one table, one entry per pattern.

Two kinds of entry:

``lower``
    The op has no ``onnx.version_converter`` adapter down to the toolkit's opset (Gelu and
    AffineGrid did not exist before opset 20; ConstantOfShape-20 and GridSample-20 have no
    down-adapter).  The rewrite replaces it by ops that exist at the lower opset, in the form
    the TorchScript exporter writes (so the toolkit's own fusion rules recognise it).
``npu``
    The op converts but the toolkit places it on the CPU inside an NPU stage (one
    NPU -> CPU -> NPU round trip on the board), crashes or fails on it, or stores its constants
    padded.  The rewrite is an equivalent form the toolkit builds as wanted; each entry cites the
    measured build that justifies it (``evidence``: the verbose "Network Layer Information Table"
    Target column of real builds, the crash, the weight memory).

Each row says what it is for (``purpose``: placement, crash, memory, lowering, precision; a memory row
that only changes a layout is ``weighed``: compile keeps it in a stage only when the compiler's figures
for the stage built without it are worse, :mod:`rkpart.compile.weigh`) and
whether it is exact (the same values bit for bit): five are not -- ``bfloat16-widen`` (the
bfloat16 roundings go), ``reciprocal-mul-div`` (one rounding fewer), ``reduce-sum-matmul`` and
``pad-rows-matmul`` (the MatMul's summation order) and
``layernorm-scale-fold`` (the scale rounded into the weight and bias).  ``docs/compile.md``'s table lists
the same rows (``tests/targets/test_rewrite_docs.py``).

The IsNaN guard after a masked Softmax (``nan-guard``): ``IsNaN`` and its direct exact
replacements ``Equal(p, p)`` / ``Greater(p, -1)`` are all placed on the CPU by 2.3.0 and 2.5.0
(as are Exp, Log, ReduceMax, Min, Less, Not, Or and a Div by a tensor); the row-validity form
kept here uses only Where, MatMul, Clip, Mul and Add, which both place on the NPU.

Every rewrite is checked by its caller: the rewritten stage must match the original under
ONNX Runtime before it is kept (:mod:`rkpart.compile.prepare`).

The table (:data:`REWRITES`) is the public face of this package: one :class:`Rewrite` per
pattern, with its name, the op it starts from (``op_type``), the toolkits it applies to and
what it reads (``needs``).  The rewrites themselves are written on the editing view
:class:`rkpart.ir.edit.GraphEdit`: :mod:`.lower` (opset lowering), :mod:`.npu` (placements),
:mod:`.crashes` (toolkit crashes avoided).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx

from rkpart.ir.edit import NEEDS, GraphEdit
from rkpart.targets.rewrites.crashes import (
    concat_constant_per_reader,
    layernorm_scale_fold,
    matmul_constant_per_reader,
    may_read_wide_tensors,
    may_share_concat_constants,
    may_share_matmul_constants,
    rms_norm_contiguous,
    scalar_gather_slice,
    single_output_split,
    strided_slices_concat,
    wide_tensor_per_reader,
)
from rkpart.targets.rewrites.heads import (
    guard_after_product,
    kv_repeat_gather,
    masked_attention_row_chunks,
    pad_rows_matmul,
    wide_matmul_columns,
)
from rkpart.targets.rewrites.lower import NO_LOWERING, TYPE_ONLY_CHANGES, gelu, grid_sample
from rkpart.targets.rewrites.npu import (
    computed_table_layout,
    dedupe_constants,
    erf_sqrt2_f32,
    expand_broadcast,
    heads_table_layout,
    interleave,
    may_hold_duplicate_constants,
    nan_guard,
    norm_residual_sub,
    pad_concat,
    reciprocal,
    reciprocal_mul,
    reduce_sum_matmul,
    rope_halves,
    rope_interleaved_matmul,
    rope_pair_matrix,
    slice_assign_concat,
    slice_reverse,
    split_chunked_linear,
    tile_broadcast,
)
from rkpart.targets.rewrites.precision import widen_bfloat16

#: a rewrite: edits the view's graph in place and returns how many matches it rewrote
Apply = Callable[[GraphEdit], int]
#: what a rewrite is for (:attr:`Rewrite.purpose`)
PURPOSES = ("placement", "crash", "memory", "lowering", "precision")


@dataclass(frozen=True)
class Rewrite:
    """One row of :data:`REWRITES`."""

    name: str
    op_type: str  # the op the pattern starts from
    kind: str  # "lower" or "npu"
    toolkits: tuple[str, ...]  # versions it applies to; ("*",) = every version
    evidence: str  # why: the missing adapter, or the measured placement before/after
    apply: Apply
    every_node: bool = False  # rewrites every node of ``op_type`` (not only a pattern around it)
    #: what ``apply`` reads from the view beyond the graph (:data:`rkpart.ir.edit.NEEDS`):
    #: "types" (element types), "shapes" (static shapes; writes the inferred value infos),
    #: "inferred_shapes" (static shapes, the model's value infos left as they are)
    needs: tuple[str, ...] = ()
    #: a pattern not found from one op (``op_type`` ""): whether it may match a model, read
    #: without its external data
    probe: Callable[[onnx.ModelProto], bool] | None = None
    #: an approximate rewrite's check, ``(min cosine, max abs / max |ref|)``: ``rkpart compile``
    #: checks it alone against the original stage, before the exact rows (``None``: an exact
    #: rewrite, checked at :func:`rkpart.compile.prepare.exact_gate`)
    gate: tuple[float, float] | None = None
    #: where it matched the stage cannot build without it (an element type no toolkit has): a
    #: failed build is retried without the other rewrites, never without this one
    needed: bool = False
    #: applied after :data:`DEDUPE` (which would merge what the rewrite keeps apart)
    after_dedupe: bool = False
    #: what it is for (:data:`PURPOSES`): ``placement`` (an op the toolkit runs on the CPU), ``crash``
    #: (a build that crashes, fails or hangs), ``memory`` (weight memory), ``lowering`` (an op with
    #: no adapter down to the toolkit's opset), ``precision`` (an element type no toolkit has)
    purpose: str = "placement"
    #: the same values bit for bit, given the same op implementations; ``False``: a rounding is
    #: added, dropped or reordered (checked by the prepared-stage gate, or its own :attr:`gate`)
    exact: bool = True
    #: it changes only a layout, not where an op runs, and what that does to device memory depends on
    #: the stage's shapes (measured: ``heads-table-layout`` takes the 512 px Anima self-attention from
    #: 44.5 to 32.0 MiB of internal memory and costs the 1024 px fused block 45 MiB): ``rkpart compile``
    #: builds a stage it matched in once more without it (one build per anatomy, cached) and keeps it
    #: only when the compiler's figures say it helps (:mod:`rkpart.compile.weigh`)
    weighed: bool = False

    def __post_init__(self) -> None:
        if not set(self.needs) <= NEEDS:
            raise ValueError(f"rewrite {self.name}: unknown needs {sorted(set(self.needs) - NEEDS)}")
        if self.purpose not in PURPOSES:
            raise ValueError(f"rewrite {self.name}: purpose {self.purpose!r} is not one of {', '.join(PURPOSES)}")
        if self.gate is not None and self.exact:
            raise ValueError(f"rewrite {self.name}: a gate of its own is for a rewrite that is not exact")
        if (self.kind == "lower") != (self.purpose == "lowering"):
            raise ValueError(f"rewrite {self.name}: kind 'lower' exactly for purpose 'lowering'")
        if (self.probe is None) == (self.op_type == ""):
            raise ValueError(f"rewrite {self.name}: a probe exactly when there is no op_type")
        if self.weighed and self.purpose != "memory":
            raise ValueError(f"rewrite {self.name}: only a memory rewrite is weighed (a placement or a crash "
                             "avoided is worth its memory)")

    def applies_to(self, toolkit: str) -> bool:
        return "*" in self.toolkits or toolkit in self.toolkits

    def may_match(self, model: onnx.ModelProto, ops: set[str] | None = None) -> bool:
        """Whether the rewrite may change ``model`` (``ops``: its op types, when known already)."""
        if self.probe is not None:
            return self.probe(model)
        return self.op_type in (ops if ops is not None else {n.op_type for n in model.graph.node})


REWRITES: tuple[Rewrite, ...] = (
    # --- precision (first: the exact rows then see the float32 island) ---
    Rewrite("bfloat16-widen", "Cast", "npu", ("*",),
            "No toolkit has a bfloat16 type: a stage holding one fails to build ('No corresponding Numpy type "
            "for Tensor Type', 2.5.0), so the partitioner sent such ops to the host, with their matmuls "
            "(Sana-WM's camera attention casts q, k and v to bfloat16 for SDPA: 24.9 % of its blocks' matmul "
            "work; Kandinsky 5 rounds q and k through bfloat16). The island between the casts into and out "
            "of bfloat16 is computed in float32, which the toolkit builds in float16 like every other float32 "
            "op: 3 more mantissa bits than bfloat16, less range. Not exact (the bfloat16 roundings go): the "
            "prepared stage is checked alone against the original under ONNX Runtime, cosine >= 0.999 and max "
            "abs <= 1/32 of max |ref|. Measured on tiny Sana-WM, split, 2.5.0: the camera attention's stage "
            "builds, 0 CPU layers; NPU share of the blocks' matmul work 75.1 % -> 100 %",
            widen_bfloat16, needs=("types",), gate=(0.999, 1 / 32), needed=True, purpose="precision", exact=False),
    Rewrite("gelu20-decompose", "Gelu", "lower", ("*",),
            "Gelu exists only from opset 20 (version_converter: 'No Previous Version of Gelu exists'); "
            "written as the TorchScript exporter's decomposition, which the toolkits fuse into exGelu",
            gelu, needs=("types",), purpose="lowering"),
    Rewrite("gridsample20-modes", "GridSample", "lower", ("*",),
            "version_converter has no adapter from GridSample-20; only the mode names changed", grid_sample,
            purpose="lowering"),
    Rewrite("reciprocal-mul-div", "Mul", "npu", ("*",),
            "A product with an inverse, Mul(a, Reciprocal(v)) or Mul(a, Div(1, v)) (Sana's linear attention "
            "divides by its normaliser so): both toolkits place the Div(1, v) they make of the inverse on the "
            "CPU ('Div:/model/transformer_blocks.0/attn1/Reciprocal', CPU), while Div(a, v) runs on the NPU, "
            "broadcasting v. Not bit-exact: one rounding fewer (float32/float64 only; the prepared-stage check "
            "bounds the difference). An inverse of a Sqrt (RMSNorm) is left to reciprocal-to-div. Measured on "
            "2.3.0 and 2.5.0: Reciprocal or Div(1, v) then Mul, v (1,2,1,32) into (1,2,16,32), 1 CPU layer "
            "-> 0; tiny Sana-Video, split and fused, both exporters, 2 CPU layers -> 0 (2.5.0)",
            reciprocal_mul, needs=("types",), exact=False),
    Rewrite("reciprocal-to-div", "Reciprocal", "npu", ("*",),
            "RMSNorm's rsqrt as Reciprocal(Sqrt(mean(x^2)+eps)) (dynamo exports): the toolkit turns the "
            "Reciprocal into a Div placed on the CPU ('Div:node_rsqrt#1', CPU). As Div(1, Sqrt(...)) its "
            "replace_rms_norm fusion takes the whole norm onto the NPU. Measured on a tiny Flux, dynamo "
            "opset 20, split plan: 12 CPU layers -> 0 with 2.3.0 and with 2.5.0", reciprocal, every_node=True,
            needs=("types",)),
    Rewrite("scatternd-interleave", "ScatterND", "npu", ("*",),
            "RoPE written as out[..., 0::2] = a; out[..., 1::2] = b (Wan): the second ScatterND of each "
            "chain runs on the CPU ('ScatterND:/model/blocks.0/attn1/ScatterND_1', CPU; dynamo: "
            "'ScatterND:node_ScatterND_321'; 2.3.0 puts both of each chain there). As Unsqueeze/Concat/Reshape "
            "it stays on the NPU. Measured on a tiny Wan, split plan, ScatterND layers on the CPU: "
            "TorchScript 4 -> 0 (2.5.0), 8 -> 0 (2.3.0); dynamo 4 -> 0 (2.5.0) and all 16 CPU layers "
            "-> 0 with reciprocal-to-div (2.3.0)",
            interleave, needs=("shapes",)),
    Rewrite("slice-assign-concat", "ScatterND", "npu", ("*",),
            "A ScatterND writing one contiguous range of one axis and every position of the others, TorchScript's "
            "export of x[:, :, a:b, :] = u (CogView4 rotates the image tokens of q and k alone and writes them back, "
            "its indices [1,32,1024,128,4] computed in the stage from one arange per axis). The capability table "
            "puts ScatterND on the CPU (2.3.0 runs it there; 2.5.0 converts it to Split + Concat, 'may generate "
            "too many tensors (1280)'), so the partitioner cut CogView4's attention around it and the first stage's "
            "heads-layout outputs ran their Transposes on the CPU. As Concat(x[.., :a, ..], u, x[.., b:, ..]) on that "
            "axis it stays on the NPU (the same values copied: bit-exact); the partitioner's probe sees the indices as "
            "the ops computing them. bench/layout_probe.py --pattern norm-rope-slice (4 heads x 1280 tokens at 128, "
            "256 text): 2.5.0 with heads-table-layout 2 CPU layers -> 0 (internal 39.4 -> 34.1 MB); 2.3.0 3 -> 2 "
            "(the ScatterND; the Transpose after the LayerNorm's exNorm and the rotate-half's Reshape stay, see "
            "computed-table-layout). "
            "CogView4-6B at its width, split: see docs/real-width.md",
            slice_assign_concat, needs=("inferred_shapes",)),
    Rewrite("slice-reverse", "Slice", "npu", ("*",),
            "A Slice with a negative step, torch.flip or x[::-1] (Sana-WM's chunked linear attention flips its "
            "chunks, rank 3 to 5, 10 per block in its TorchScript export): 2.3.0 and 2.5.0 place it on the CPU "
            "('Slice:/model/blocks.0/attn/attn/Slice_10', CPU), except a reversal of the last axis of a rank-4 "
            "tensor. As a Concat of one-element Slices in the visited order (at most 32 per axis; a positive-step "
            "Slice first for the entry's other axes) it stays on the NPU: the same elements copied, bit-exact. "
            "Measured on hand-made stages, 2.3.0 and 2.5.0: a flip of axis 1 of rank 3 and 4, of axis 2 of rank "
            "4 (16 pieces), 1 CPU layer -> 0",
            slice_reverse, needs=("inferred_shapes",)),
    Rewrite("gelu-f16-sqrt2", "Erf", "npu", ("*",),
            "Erf-GELU of a float16 model (Anima's FFN; any fp16 TorchScript export of nn.GELU): the "
            "exporter's Div(x, sqrt 2) carries float16(sqrt 2) = 1.4140625, and the toolkits' "
            "replace_torch_gelu fusion matches only the float32 sqrt 2 (1.41421 already fails), so the "
            "Erf runs on the CPU ('Erf:/transformer_blocks.0/ff/net.0/Erf', CPU). With the constant made "
            "by Cast(float32 sqrt 2 -> float16) (the same float16 value under ONNX Runtime) the toolkit "
            "fuses MatMul+GELU into ConvExGelu on the NPU. Measured: tiny fp16 MatMul-GELU-MatMul 1 CPU "
            "layer -> 0 on 2.3.0, 2.3.2, 2.5.0; Anima (1 block, hidden 256, 256 px, fp16) split and fused "
            "plans 1 -> 0 on 2.3.0 and 2.5.0",
            erf_sqrt2_f32),
    Rewrite("adaln-chunk-gemm", "Gemm", "npu", ("2.3.0", "2.3.2"),
            "AdaLN modulation Gemm read as chunks (emb.chunk(6, -1): Slices, or a Split from dynamo): 2.3.0's "
            "merge_parallel_op_after_split merges the two '+1' Adds on the scale chunks into one Add on a "
            "Concat and inserts a Transpose it places on the CPU ('Transpose:/model/transformer_blocks.0/"
            "norm1/Slice_1_output_0-rs_concat-rs_tp', (1,32,2,1) -> (2,32,1,1)). One Gemm per chunk (the "
            "chunk's rows of the weight and bias) leaves no Split to merge after; reshapes that only add or drop "
            "unit axes between the Gemm and the chunks (PRX: emb.unsqueeze(1).chunk(6, -1)) are applied to each "
            "chunk. Measured on fused plans, 2.3.0: Flux (TorchScript, dynamo) 4 CPU layers -> 0, DiT 1 "
            "Transpose per block -> 0, PRX (both exporters) 2 -> 0; 2.5.0 "
            "has no such Transpose (not applied). 2.3.2 crashes on these blocks either way (same "
            "operator list as 2.3.0)",
            split_chunked_linear, needs=("shapes",)),
    Rewrite("nan-guard", "IsNaN", "npu", ("*",),
            "The guard Where(IsNaN(p), 0, p) after Softmax(s + Where(mask, 0, -inf)) (scaled_dot_product_attention "
            "with a bool mask, TorchScript): 'IsNaN:/IsNaN' on the CPU with 2.3.0 and 2.5.0 (Equal(p, p), "
            "Greater(p, -1), Exp, Log, ReduceMax: CPU too). Rewritten with a per-row 'has a key' factor from "
            "Where/MatMul/Clip and a fill that is -inf only in such rows (so a hidden row's Softmax is finite, "
            "times 0): bit-exact under ORT for finite scores, all NPU. Dynamo writes float32's lowest instead of "
            "-inf: no row can be NaN (scores above -2e31), the guard is dropped (float32 only). Measured on a "
            "tiny SDPA with a bool mask, both exporters: 1 CPU layer -> 0 on 2.3.0 and 2.5.0; under rknn-sim "
            "(2.3.0) the original gives 0.69 instead of 0 on a fully masked row (the NPU saturates -inf, no "
            "NaN), the rewrite gives 0. The fill is broadcast to the mask's shape (times ones[.., K]) before "
            "its Where: without that 2.5.0 SIGSEGVs in convert_exmatmul_to_conv on Lumina2's caption-refiner "
            "attention (a Where whose computed branch [1,1,1,1] broadcasts against the [1,1,1,6] mask; the "
            "MatMul, ReduceSum instead of it, the final Mul and a finite fill all crash the same, only the "
            "broadcast builds). Measured on a tiny Lumina2, TorchScript, split, caption-refiner stage: "
            "'IsNaN:/model/context_refiner.0/attn/IsNaN' on the CPU -> gone, on 2.5.0 and 2.3.0 (the mask's "
            "Reshape and Cast stay: int64 ops, the partitioner's side)",
            nan_guard, needs=("shapes", "types")),
    Rewrite("pad-rows-matmul", "MatMul", "npu", ("*",),
            "A constant-mode Pad of the rows of a MatMul's left operand (Sana's linear attention: F.pad(v, (0, 0, "
            "0, 1), value=1) then v @ k^T, [1,70,33,1024] x [1,70,1024,32]): at 70 heads 2.5.0 runs the Transpose of "
            "the padded value to its matmul layout on the CPU ('Transpose:/model/transformer_blocks.0/attn1/"
            "Pad_output_0_tp_rs#1', (1,70,33,1024) -> (70,1024,1,33)); at 8 heads it stays on the NPU. As the "
            "product of the unpadded rows and the product of the constant rows ([1,..,1,rows,K], broadcast over the "
            "heads), concatenated on the rows: the same dot products row by row, every layer on the NPU (not "
            "bit-exact under ONNX Runtime: its GEMM sums a 32-row product in another order than a 33-row one). "
            "Measured "
            "with bench/layout_probe.py --pattern linear-pad (the projections included: the compiler lays their "
            "outputs out channels-first), 70 heads of 32, 1024 tokens, 2.5.0: 1 CPU Transpose -> 0; 2.3.0 and "
            "2.3.2, where pad-to-concat would make a Concat of the Pad whose result they transpose on the CPU the "
            "same way: 1 -> 0. Applied before pad-to-concat",
            pad_rows_matmul, needs=("inferred_shapes", "types"), exact=False),
    Rewrite("wide-matmul-columns", "MatMul", "npu", ("*",),
            "A MatMul with a constant weight of more than 8192 output channels (FLUX.2's single-stream block projects "
            "its tokens once into q, k, v and the MLP's gate and up halves, to_qkv_mlp_proj 3072 -> 27648, and slices "
            "the product): the compilers compute a MatMul channels-first, (1,N,1,T), and run the Transpose of the "
            "product back to (1,T,1,N) on the CPU from N = 8208 on ('Transpose:/model/single_transformer_blocks.0/"
            "attn/to_qkv_mlp_proj/MatMul_output_0_mm_tp', (1,27648,1,1536); 'channel is too large, may produce "
            "thousands of regtask, fallback to cpu!'), at 256 to 4096 tokens, 8192 channels staying. As one MatMul "
            "per column range the product is read as (the Slices of its last axis, looked through where a Slice is "
            "only sliced again), each cut to at most 8192 columns and a range of several concatenated (a product that "
            "is the stage's output: equal ranges concatenated back to the whole; columns nobody reads are not "
            "computed) every layer stays on the NPU: the same dot products on the same weight columns, bit-exact "
            "under ONNX Runtime. Only where a piece needs the tokens-first layout (a Reshape into heads, a Concat, the "
            "output, through elementwise ops): a SwiGLU's halves into the down projection (FLUX.2's 18432-wide FFN) "
            "and a product read whole (GELU FFNs, FLUX.1's 12288) build with 0 CPU layers as they are, and one row "
            "(a modulation GEMV) was not measured: left alone. "
            "Measured with bench/layout_probe.py --pattern wide-matmul --qkv 3072 (128 input channels, 256 tokens, "
            "FLUX.2's slices): 1 CPU Transpose -> 0 on 2.5.0 (internal memory 28.4 -> 29.9 MB), 2.3.2 (28.4 -> 25.2) "
            "and 2.3.0 (28.6 -> 25.4); --readers one (the product whole): 1 -> 0. FLUX.2-klein-4B at its width "
            "(1024 image + 512 text tokens), split, 2.5.0: single-stream block 1 CPU layer -> 0, internal memory "
            "261.8 -> 180.8 MiB, weight memory unchanged",
            wide_matmul_columns, needs=("inferred_shapes", "types")),
    Rewrite("pad-to-concat", "Pad", "npu", ("2.3.0", "2.3.2"),
            "Sana's linear attention pads V with a row of ones (pads computed from constants): 2.3.0 places "
            "the Pad on the CPU ('Pad:/model/transformer_blocks.0/attn1/Pad', CPU), 2.5.0 on the NPU. As a "
            "Concat with a constant block it stays on the NPU. Measured on a tiny Sana, split plan, 2.3.0: "
            "TorchScript and dynamo 2 CPU layers -> 0. 2.3.2 (same operator list as 2.3.0) not measured",
            pad_concat, needs=("shapes", "types")),
    Rewrite("norm-residual-sub", "Add", "npu", ("2.3.0", "2.3.2"),
            "A residual added straight to an RMSNorm's output (x + norm2(attn(x)), Lumina2's context refiner, "
            "no modulation in between): 2.3.0's fuse_exnorm_add folds the Add into the exNorm's beta as a "
            "computed (1,32,1,6) tensor and places that exNorm on the CPU ('exNorm:/model/context_refiner.0/"
            "norm2/ReduceMean_2rmsn', CPU; ffn_norm2 the same). As Sub(x, Mul(r, -w)) (bit-exact) nothing is "
            "folded. Measured on a tiny Lumina2, fused plan, 2.3.0, block 0: 2 exNorm CPU layers -> 0 "
            "(TorchScript and dynamo); 2.5.0 keeps that exNorm on the NPU (not applied). 2.3.2 not measured",
            norm_residual_sub),
    # --- crash avoidance (issue 18) ---
    Rewrite("layernorm-scale-fold", "LayerNormalization", "npu", ("2.5.0",),
            "SIGSEGV avoided, not a placement: 2.5.0 crashes in its native compiler (last step "
            "convert_exmatmul_to_conv, after fuse_exnorm_mul folded the Mul) on LayerNorm -> Reshape -> "
            "Transpose -> Reshape -> Mul(constant scalar), the key side of a dynamo SDPA after a LayerNorm "
            "qk-norm (tiny HunyuanDiT, dynamo, split: both cross-attention stages; `rkpart repro` reduces "
            "them to those 5 nodes plus the query's RoPE Add and scale Mul). With the scalar folded into "
            "the LayerNorm's weight and bias both stages build, 0 CPU layers; 2.3.0 builds either form",
            layernorm_scale_fold, purpose="crash", exact=False),
    Rewrite("strided-slices-concat", "Concat", "npu", ("2.5.0",),
            "SIGSEGV avoided, not a placement: 2.5.0 crashes in fuse_slice_slice_concat_to_conv on a Concat of "
            "two equally spaced constant Slices of one tensor (Chroma's modulation pieces mod[:, 6:12] and "
            "mod[:, 18:24]; tiny Chroma, fused plan, both double blocks, both exporters; the log stops at "
            "replace_torch_tanh_gelu, `rkpart repro` reduces the stage to those 3 nodes). As one Slice of "
            "the span, a Reshape into periods, one Slice and a Reshape back the stage builds; 2.3.0 builds "
            "either form. Adjacent pieces in order (HunyuanVideo's single-stream blocks split the joint sequence "
            "into image and text tokens, x[:, :-T] and x[:, -T:], and concatenate them again; dynamo) crash the "
            "same fusion (`rkpart repro`: Transpose, Reshape, 2 Slices, Concat) and become one Slice of the span, "
            "or an Identity when that is all of x (bounds read as ONNX does: negative from the end, clamped). "
            "Measured on a tiny HunyuanVideo, dynamo, 2.5.0: split 14/18 -> 18/18 stages built, fused 8/12 -> "
            "12/12, 0 CPU layers, no --repartition",
            strided_slices_concat, needs=("shapes",), purpose="crash"),
    Rewrite("single-split", "Split", "npu", ("2.3.0", "2.3.2"),
            "Failure avoided, not a placement: a Split into one piece (dynamo's split_with_sizes of one chunk the "
            "size of the axis; Sana-WM's chunked linear attention, rank 5) read by a Gather of one index: 2.3.0's "
            "optimiser fails on the reshape it inserts for the Gather (KeyError: 'select_10-rs'), 2.3.2 in its "
            "swap_reshape_gather rule ('Can not reshape from [1, 2, 16, 16] to [2, 2, 16, 16]'). As an Identity "
            "both build; 2.5.0 builds either form. Measured with `rkpart repro` "
            "on tiny Sana-WM's linear-attention stage (dynamo, split, 2.3.0: 478 nodes -> Split, 2 Gathers, "
            "a MatMul)",
            single_output_split, purpose="crash"),
    Rewrite("scalar-gather-slice", "Gather", "npu", ("2.3.0",),
            "Failure avoided, not a placement: a Gather of one constant index (x[i], dropping the axis) of a stage "
            "input of rank <= 4 (Sana-WM-refiner's attention picks its layer of the KV cache inputs, sink_v[0] of "
            "[2, 1, 16, 32], and concatenates it with the new values): 2.3.0's constant folding fails (ONNX "
            "Runtime in the toolkit: \"Can't merge shape info ... Inferred=1 Declared=2\" on that Concat), "
            "so --repartition had to cut both attention stages. As Slice(x, i, i+1) and a Reshape that drops "
            "the axis (exact) the stage builds with 0 CPU layers (tiny Sana-WM-refiner, TorchScript, split, "
            "2.3.0: 8 stages after a round -> 6 from the first build). Not for rank > 4: 2.3.0 runs the Reshape "
            "back from rank 6 on the CPU (AnyFlow-FAR's KV cache: 4 CPU layers no round can move), and not for "
            "a computed x (not measured). 2.3.2 builds the reduced reproducer (2 Gathers, 2 Casts, the Concat) "
            "as it is: not applied there",
            scalar_gather_slice, needs=("inferred_shapes",), purpose="crash"),
    Rewrite("matmul-constant-per-reader", "", "npu", ("2.3.0", "2.3.2"),
            "Failure avoided, not a placement: one constant batched operand (rank >= 3) read by several MatMuls "
            "(Sana-WM's chunked linear attention starts its state from one zeros tensor that 4 MatMuls read): "
            "2.3.0 and 2.3.2 fail in _p_replace_inner_dim_shuffle_to_gather ('Can not reshape from [2, 16, 16] "
            "to [2, 16]'; `rkpart repro` reduces the stage, with single-split, to 3 MatMuls, two reading the "
            "same constant). Each MatMul after the first reads it through an Identity of its own: both build. "
            "Applied after dedupe-constants. With single-split, tiny Sana-WM's linear-attention stage (2.3.0, "
            "dynamo, split) builds whole instead of failing",
            matmul_constant_per_reader, probe=may_share_matmul_constants, after_dedupe=True, purpose="crash"),
    Rewrite("concat-constant-per-reader", "", "npu", ("2.3.0", "2.3.2"),
            "Failure avoided, not a placement: one constant of rank > 4 read by several Concats (Sana-WM's dynamo "
            "chunked linear attention prepends one zeros state [1, 2, 1, 16, 16] to five chunk stacks): 2.3.0's "
            "and 2.3.2's constant folding fail (ONNX Runtime in the toolkit: \"Can't merge shape info ... "
            "Inferred=1 Declared=2\" on a Concat of that block; 2.5.0 builds it). Each Concat after the first "
            "reads it through an Identity of its own: the stage builds (tiny Sana-WM, dynamo, split, 2.3.0: both "
            "linear-attention stages, which --repartition had to cut, build whole from the first build; an "
            "Identity for the other shared constant, rank 4, alone does not help). A hand-made stage of the "
            "same shape (2 to 5 Concats of a rank-5 zeros constant) builds either way: the measured stage is "
            "the test. Applied after dedupe-constants",
            concat_constant_per_reader, probe=may_share_concat_constants, after_dedupe=True, purpose="crash"),
    Rewrite("wide-tensor-per-reader", "", "npu", ("2.3.0",),
            "Failure avoided, not a placement: a computed tensor of rank > 4 read by three ops or more (Sana-WM's "
            "TorchScript linear attention broadcasts its gate [1, 2, 2, 1, 16] over three rank-5 products): 2.3.0 "
            "reshapes it to rank 4 once per reader and its _p_remove_parallel_node rule fails on the third "
            "(ValueError: 'x_rs#2' is not in list). Each reader after the first reads it through an Identity of "
            "its own: `rkpart repro`'s 41-op reduction and the whole stage build (tiny Sana-WM, TorchScript, "
            "split, 2.3.0: both linear-attention stages, which --repartition had cut to the host with 41 ops "
            "each, a MatMul and two Convs among them). Two readers build as they are; a Reshape per reader fails "
            "the same way; 2.3.2 and 2.5.0 build the reduction as it is: not applied there",
            wide_tensor_per_reader, probe=may_read_wide_tensors, after_dedupe=True, needs=("inferred_shapes",),
            purpose="crash"),
    Rewrite("kv-repeat-gather", "Reshape", "npu", ("2.5.0",),
            "Grouped-query attention's key/value head repeat: x [.., n, 1, ..] broadcast to [.., n, r, ..] (Tile, "
            "Expand, or the Mul(x, ones) tile-broadcast and expand-broadcast make of them) and merged into n*r heads "
            "by a Reshape (repeat_interleave; Lumina2: Unsqueeze(3), Tile [1,1,1,3,1], Reshape [1,T,24,96]). 2.5.0 "
            "lays the repeat out with the repeats in front and runs its Transpose to heads on the CPU "
            "('Transpose:/model/noise_refiner.0/attn/Transpose_2#1', (3,1024,8,96) -> (8,3,96,1024), one for the "
            "keys and one for the values of every attention). As one Gather of the n heads (indices 0,..,0,1,..,1, "
            "each r times) on the axis before the repeat it stays on the NPU: the same values copied, bit-exact. "
            "Two key/value heads or more (one head's repeat is a broadcast of the leading axis, which 2.5.0 keeps "
            "on the NPU as expand-broadcast writes it: Stable Audio). "
            "Measured with bench/layout_probe.py --pattern gqa-tile (tokens-first, 2.5.0): 6 heads of 96 over 2 KV "
            "heads, 1024 tokens, 2 CPU Transposes -> 0",
            kv_repeat_gather, needs=("inferred_shapes", "types")),
    Rewrite("masked-attention-row-chunks", "Softmax", "npu", ("2.3.2", "2.5.0"),
            "Masked attention, Softmax(Q @ K + mask) @ V with a mask computed in the stage or read from its inputs "
            "(the same for every query row: a caption mask over the keys; nan-guard's factor after the Softmax "
            "kept), of 512 query rows or more: 2.5.0 does not fuse it into exSDPAttention and runs its Softmax and "
            "the scores' Transposes on the CPU ('exSoftmax13:/model/layers.0/attn/Softmax', (1,24,1280,1280); "
            "'height(512) * width(512) = 262144, required product no larger than 8192'), measured at 512, 1024, "
            "1152 and 1280 query rows, 2 heads or 24. Cut into chunks of 256 query rows (a Slice of Q each, the "
            "chain per chunk, the outputs concatenated) every chunk is fused into exSDPAttention, mask included, "
            "and the score buffers are a chunk's. Every row's ops are the same on the same values: bit-exact under "
            "ONNX Runtime, with and without its graph optimisations (each slice is taken above q's scalar scale, "
            "so ORT fuses the scale into every chunk's MatMul as into the original's). A constant mask, or none, "
            "is fused as it is (left alone). Measured with bench/layout_probe.py --pattern gqa-tile --mask (6 heads "
            "of 96 over 2, 1280 tokens, nan-guard applied): 2.5.0 3 CPU layers -> 0 (internal memory 161 -> 48 "
            "MB), 2.3.2 3 -> 0; not on 2.3.0, which runs each chunk's probabilities Transpose ((6,256,1,1280) -> "
            "(6,1280,1,256)) on the CPU: 3 -> 5",
            masked_attention_row_chunks, needs=("inferred_shapes", "types")),
    Rewrite("guard-after-product", "Softmax", "npu", ("2.3.0",),
            "Masked attention after nan-guard, MatMul(Softmax(s + mask) * f, V) with f nan-guard's per-row 'has a "
            "key' factor (Clip(MatMul(Where(mask, 1, 0), ones), 0, 1): exactly 0 or 1): 2.3.0 does not fuse a "
            "Softmax and its product with V that a Mul stands between, and runs the scores' Transpose, the Softmax "
            "and the probabilities' Transpose on the CPU ('exSoftmax13:p0', (6,1280,1,1280)). As "
            "MatMul(Softmax(s + mask), V * f), f the same for every query row (a mask over the keys: Lumina2's "
            "caption mask; f = 1 the same product, f = 0 zeros; bit-exact for finite values), 2.3.0 fuses the "
            "attention. Measured with bench/layout_probe.py --pattern gqa-tile --mask (1280 tokens, nan-guard "
            "applied), 2.3.0: 6 heads of 96 over 2, 3 CPU layers -> 0 (internal memory 162.7 -> 43.8 MB); 24 over "
            "8 (Lumina2's) -> 0. The factor after the product instead (the form a per-row factor would need: left "
            "alone) left the fused output's Transpose on the CPU in Lumina2's main attention "
            "('Where_1/product_sdpa_tp', (24,96,1,1280) -> (1,24,1280,96)). Lumina-Image-2.0 at its width, split, "
            "2.3.0: main attention 3 CPU layers -> 0, internal memory 284 -> 62 MiB. 2.3.2 and 2.5.0 cut such an "
            "attention into row chunks (masked-attention-row-chunks), which 2.3.0 runs worse",
            guard_after_product, needs=("inferred_shapes", "types")),
    Rewrite("tile-broadcast", "Tile", "npu", ("2.5.0",),
            "GQA's key/value repeat (Unsqueeze, Tile [1,1,1,n_rep,1], Reshape; Lumina2): 2.5.0 turns the "
            "Tile into an Expand placed on the CPU ('Expand:/model/noise_refiner.0/attn/Tile#1', CPU), 2.3.0 "
            "keeps it on the NPU. As Mul(x, ones) it stays on the NPU. Measured on a tiny Lumina2, "
            "TorchScript, split plan, 2.5.0: 11 CPU layers -> 3 (the 8 Expand; the caption mask's "
            "Reshape, Cast and IsNaN stay). A Concat of copies instead fails both toolkits' optimiser "
            "(KeyError in remove_node after swap_reshape_mul)",
            tile_broadcast, needs=("shapes", "types")),
    # --- weight memory (issue 27) ---
    Rewrite("expand-broadcast", "Expand", "npu", ("2.5.0",),
            "GQA's key/value repeat as dynamo exports it (Unsqueeze, Expand [1,1,n_rep,1,1], Reshape; Stable "
            "Audio's cross-attention, one key/value head): 2.5.0 lays the Expand out as (1,16,1,6) -> "
            "(2,16,1,6), a broadcast of axis 0, and places it on the CPU ('Expand:node_Expand_173', CPU); "
            "2.3.0 keeps it on the NPU. As Mul(x, ones) (the ones only as large as the broadcast axes, at most "
            "64 Ki elements) it stays on the NPU. Measured on a tiny Stable Audio, dynamo, split plan, 2.5.0: "
            "4 CPU layers -> 0 (the cross-attention stage alone: 2 -> 0)",
            expand_broadcast, needs=("shapes", "types")),
    Rewrite("rope-pair-matrix", "ReduceSum", "npu", ("*",),
            "RoPE applied as a 2x2 matrix per pair of values, (rope * x.view(..., -1, 1, 2)).sum(-1) (Kandinsky "
            "5): a 6-D broadcasting Mul [1,6,1,8,2,2] x [1,6,2,8,1,2] and a ReduceSum. 2.5.0 fails in its own "
            "constant folding (ONNX Runtime refuses the Reshape it inserts, '..self_attention/Mul_output_0_rs', "
            "{1,6,2,8,2,2} -> {6,2,4,2}); 2.3.0 builds it with 8 CPU layers per attention (the Mul, Reshapes). "
            "As x * diag + swap(x) * offdiag (Slices and a Concat, Flux's form; the same products and sum, "
            "bit-exact) it builds with 0 CPU layers on both. Measured on a tiny Kandinsky 5 text block "
            "(TorchScript, fused, nonzero modulation weights). Matrices computed in the stage (Kandinsky 6 "
            "dynamo: Cos/Sin/Neg of gathered constant tables, stacked) are read out with Slices: its split "
            "plan, 8 of 18 stages failed on 2.5.0 ('Can not reshape from [6, 2, 4, 1] to [1, 6, 2, 16]', the "
            "sum, its Reshape and a Transpose) -> 18/18, 0 CPU layers; 2.3.0 60 CPU layers -> 0",
            rope_pair_matrix, needs=("shapes", "types"), purpose="crash"),
    Rewrite("reduce-sum-matmul", "ReduceSum", "npu", ("2.3.0",),
            "A sum over the last axis, ReduceSum(x, -1): 2.3.0 converts it to a MatMul and, where the summed axis "
            "is dropped (keepdims=0, or keepdims=1 and a Reshape that drops it: Sana-WM's TorchScript linear "
            "attention, (k * gate).sum(-1) on [1,2,2,16,16]), runs that conversion's Reshape on the CPU "
            "('Reshape:/model/blocks.2/attn/attn/Mul_14_output_0_rs#1_mm_tp_rs', CPU; `rkpart compile "
            "--repartition` cannot move it: the tensor it converts has two readers). As MatMul(x, ones[D, 1]) "
            "(and a Reshape dropping the axis for keepdims=0) it stays on the NPU. Measured on hand-made stages, "
            "2.3.0: ReduceSum keepdims=0 of rank 3, 4 and 5, one or two readers of x: 1 CPU Reshape -> 0; "
            "keepdims=1 0 -> 0; tiny Sana-WM, TorchScript, split, 2.3.0: 2 CPU layers -> 0. 2.3.2 and 2.5.0 "
            "keep those ReduceSums on the NPU (not applied). Applied after rope-pair-matrix, which reads "
            "Kandinsky 5's RoPE ReduceSums",
            reduce_sum_matmul, needs=("inferred_shapes", "types"), exact=False),
    Rewrite("rope-interleaved-matmul", "Mul", "npu", ("*",),
            "RoPE's rotation of interleaved pairs as TorchScript writes diffusers' apply_rotary_emb("
            "use_real_unbind_dim=-1) (HunyuanDiT, Flux): Reshape [..., D/2, 2], Split, Squeeze, Neg, Unsqueeze, "
            "Concat(-x1, x0), Reshape back, times the sin table, in the heads-first layout [B,H,T,D]. After a "
            "per-head LayerNorm, 2.5.0 runs the rotation's last Reshape ((16,1024,44,2) -> (1,16,1024,88)) and "
            "the Transpose it puts after the norm ('height(1024) * width(88) = 90112, required product no larger "
            "than 8192') on the CPU at head dims 72, 88, 96 and 128, not at 64 (bench/layout_probe.py --pattern "
            "norm-rope, 16 heads x 1024 tokens); the rotation alone leaves its Reshape there at 72 and 88. As "
            "MatMul(x * T', P), P the D x D signed pair swap and T' the table with each pair exchanged (the same "
            "one product per value, added to zeros: bit-exact; the table before the MatMul, since the toolkit "
            "folds a Mul after a MatMul into its weight and fails on a per-token table), every layer stays on "
            "the NPU. Left alone: head dim 64, and the tokens-first layout (Flux's [B,T,H,D] at 128 builds with 0 "
            "CPU layers). The same on 2.3.0 and 2.3.2 (a 4-head, 1024-token probe at 72: 2 CPU layers -> 0). "
            "Measured: HunyuanDiT-v1.2 at its width (16 x 88, 1024 tokens), split, 2.5.0 and 2.3.0: "
            "self-attention 4 CPU layers (2 Reshape, 2 Transpose) -> 0, cross-attention 2 -> 0",
            rope_interleaved_matmul, needs=("inferred_shapes", "types")),
    Rewrite("heads-table-layout", "Transpose", "npu", ("2.5.0",),
            "Not a placement: weight memory. RoPE's cos/sin tables broadcast over the heads ([1,1,T,D] "
            "against q/k [1,H,T,D]; the TorchScript export of diffusers' Cosmos/Anima) are stored by the "
            "compiler padded to 16 bytes per element in float16 and int8 alike (NC1HWC2, C = 1 padded to "
            "C2; 'Const Tensor Information Table': (1,1,64,24) FLOAT16 and INT8 0x6000 bytes). With the "
            "heads Transpose moved past the RoPE (and the RMSNorm before it) the tables are [1,T,1,D]: "
            "(1,64,1,24) FLOAT16 0xc00, INT8 0x600. Measured on the bundled example's self-attention, "
            "2.5.0: weight memory fp16 173 -> 87.1 KB, int8 140.2 -> 48.4 KB, 0 CPU layers, as many "
            "Transposes as before. Not on 2.3.0: fp16 173 -> 129.1 KB only (it lays the two sin Muls out "
            "as (64,1,1,24), padded again) and its int8 build puts 6 Reshapes of the stage on the CPU. "
            "Also a placement: a table computed in the stage from constants alone (Cosmos-Predict2 at its real "
            "width: Cos/Sin of the position grid, which the partitioner copies as ops, not as a value) is read "
            "through a Reshape to [1,T,1,D] the compiler folds. Without it 2.5.0 runs the Transpose it puts after "
            "the q/k RMSNorm's exNorm on the CPU ((1,128,16,1024) -> (1,16,1024,128), 'height(1024) * width(128) "
            "= 131072, required product no larger than 8192'; bench/layout_probe.py --pattern rms-rope, 4 heads x "
            "1024 tokens at 128: that Transpose and the rotate-half's Reshape, 2 -> 0). Cosmos-Predict2 2B at its "
            "width (16 x 128, 1024 tokens), split, 2.5.0: self-attention 2 CPU Transposes -> 0, weight memory "
            "37.8 -> 34.1 MB. Where it moves a computed table the Transpose also moves past a per-head LayerNorm "
            "and a Slice / Concat of the tokens axis (renumbered; CogView4's RoPE of the image tokens after "
            "slice-assign-concat): 2.5.0 runs the Transpose after the LayerNorm's exNorm on the CPU ((1,128,4,1280) "
            "-> (1,4,1280,128)), not in the tokens layout (bench/layout_probe.py --pattern norm-rope-slice). "
            "Weighed per anatomy (rkpart.compile.weigh): the build without it wins only "
            "with no more CPU layers and less device memory",
            heads_table_layout, needs=("inferred_shapes",), purpose="memory", weighed=True),
    Rewrite("computed-table-layout", "Transpose", "npu", ("2.3.0", "2.3.2"),
            "heads-table-layout on 2.3.x, only where it moves a RoPE table computed in the stage from constants "
            "alone (Cosmos-Predict2 at its real width: Cos/Sin of the position grid, copied into the stage as ops; "
            "rope-halves, 2.3.x's form for constant tables, reads the tables' values and leaves these alone). "
            "2.3.0 and 2.3.2 run the Transpose they put after the q/k RMSNorm's exNorm in the heads layout on "
            "the CPU ((1,128,16,1024) -> (1,16,1024,128), 'height(1024) * width(128) = 131072, required product no "
            "larger than 8192'). With the heads Transpose moved past the norm and the RoPE (the tables read "
            "through a Reshape to [1,T,1,D], which the compiler folds; bit-exact) it stays on the NPU. Measured: "
            "Cosmos's q path (RMSNorm, rotate-half RoPE, attention; 16 heads x 1024 tokens at 128), 2.3.0 and "
            "2.3.2: 1 CPU Transpose -> 0; Cosmos-Predict2 2B at its width, split, 2.3.0: self-attention 2 CPU "
            "Transposes -> 0 (weight 37.8 -> 35.9 MB, internal 38.3 -> 29.4 MB; the stage built alone). "
            "Not past a per-head LayerNorm (heads-table-layout's move on 2.5.0): CogView4's q/k path (4 heads x "
            "1280 tokens at 128, bench/layout_probe.py --pattern norm-rope-slice, with slice-assign-concat) built "
            "with 0 CPU layers instead of 2, but its attention at its width (32 heads) was killed out of memory at "
            "14.6 GB of RSS (3.6 GB without the move). "
            "Measured in float16 only (the constant-table form put 6 Reshapes of 2.3.0's int8 build on the CPU)",
            computed_table_layout, needs=("inferred_shapes",)),
    Rewrite("rope-halves", "Add", "npu", ("2.3.0", "2.3.2"),
            "Not a placement: weight memory. The rotate-half RoPE x * cos + rotate_half(x) * sin with tables "
            "broadcast over the heads ([1,1,T,D] against q/k [1,H,T,D]: the TorchScript export of diffusers' "
            "Cosmos/Anima, padded to 16 bytes per element in float16 and int8, 0x6000 for (1,1,64,24); the "
            "pure-ONNX Anima) on 2.3.0, where heads-table-layout does not help (the 5-D Reshape of the exported "
            "rotate-half lays the sin product out (64,1,1,24), padded again, and with the RMSNorm in the tokens "
            "layout the int8 build puts 6 Reshapes on the CPU). Only the RoPE goes to the tokens layout (a "
            "Transpose in and out; the RMSNorm stays), computed on the halves of D: Concat(x1*cos1 - x2*sin1, "
            "x2*cos2 + x1*sin2), half tables [1,T,1,D/2] ((1,12,1,64) FLOAT16 0x800, INT8 0x400; no 24x24 "
            "'gather' ConvAdd, which 2.3.0 makes of a Slice/Neg/Concat rotate-half, 0x600 fp16 / 0x400 int8 per "
            "use). Measured, bundled example's self-attention with dedupe-constants, 2.3.0: weight memory fp16 "
            "124.9 -> 78.7 KB, int8 92.1 -> 43.75 KB, 0 CPU layers; whole plan int8/fp16 0.616 -> 0.547 (2.3.2: "
            "0.616 -> 0.546); pure-ONNX Anima's stage (already unpadded on 2.3.0) 83.6 -> 78.7 / 47.6 -> 43.75 KB. "
            "Not on 2.5.0 (heads-table-layout: 0.547 already; this form measured 82.6 / 45.6 KB without it)",
            rope_halves, needs=("inferred_shapes", "types"), purpose="memory", weighed=True),
    # --- last: sees the order every other row left ---
    Rewrite("rms-norm-contiguous", "ReduceMean", "npu", ("*",),
            "Hang and failure avoided, not a placement: the toolkits' replace_rms_norm takes an RMSNorm's weight "
            "product from the node listed after the norm, not from the norm's readers. RFD4's TorchScript export "
            "lists its conditioning norm's weight Mul right after the stream's weightless RMSNorm (adaptive "
            "LayerNorm): 2.5.0 folds that unrelated Mul into the norm and its optimiser never returns (a 117-op "
            "block stage still running after 900 s; its other stages build in 4 s; `rkpart repro` with a 40 s "
            "timeout reduces it to the norm, the gate Mul that reads it and the unrelated Mul, 8 nodes); 2.3.0 "
            "and 2.3.2 fail ('Can not reshape from [8, 32] to [8, 16]'). The same 8 nodes with the unrelated Mul "
            "listed first or last build on all three. Rewritten: the norm's nodes (Pow or Mul(x, x), ReduceMean, "
            "Add, Sqrt, Div(1, .) or Reciprocal, Mul; or Div(x, Sqrt)) listed together, right before their first "
            "reader: the same graph, reordered. Measured: tiny RFD4, TorchScript, fused, 2.5.0: the 2 block stages "
            "that never finished build, 3/3 stages with 0 CPU layers, rknn-sim gate passed; of the split and "
            "fused plans of 161 tiny exports (322 plans) it matches those two stages alone",
            rms_norm_contiguous, after_dedupe=True, purpose="crash"),
)


#: not a row of the table: graph-wide (no op it starts from) and about memory, not placement;
#: ``rkpart compile`` applies it after the table's rows (its copies of a table merged too), on
#: every toolkit, with the rewrites
DEDUPE = Rewrite("dedupe-constants", "", "npu", ("*",),
                 "Not a placement: weight memory. The TorchScript export of diffusers' Cosmos/Anima folds RoPE's "
                 "cos and sin tables once for q and again for k; the compiler stores every copy (its "
                 "RKNNDuplicateWeightPass leaves them), four (1,1,64,24) tables of 0x6000 bytes in the bundled "
                 "example's self-attention. One name per distinct constant (type, shape, bytes): weight memory of "
                 "that stage fp16 173 -> 124.9 KB and int8 140.25 -> 92.06 KB, on 2.3.0 and on 2.5.0 alike (built "
                 "from the stage file, no other rewrite); the same values, bit for bit. Run last: other rewrites' "
                 "copies of a table are merged too",
                 dedupe_constants, probe=may_hold_duplicate_constants, purpose="memory")


#: the NPU rewrites a user may leave out by name (``rkpart compile --skip-rewrite``)
SKIPPABLE_REWRITES: tuple[str, ...] = tuple(sorted({r.name for r in REWRITES if r.kind == "npu"} | {DEDUPE.name}))


def weighed_rewrites_for(toolkit: str, skip: frozenset[str] = frozenset()) -> tuple[Rewrite, ...]:
    """The rows ``rkpart compile`` weighs for memory on ``toolkit`` (:attr:`Rewrite.weighed`), but ``skip``."""
    return tuple(r for r in compile_rewrites_for(toolkit) if r.weighed and r.name not in skip)


def rewrites_for(toolkit: str, kind: str) -> tuple[Rewrite, ...]:
    """The table's rows of ``kind`` ("lower" or "npu") that apply to ``toolkit``."""
    return tuple(r for r in REWRITES if r.kind == kind and r.applies_to(toolkit))


def compile_rewrites_for(toolkit: str | None = None) -> tuple[Rewrite, ...]:
    """The ``npu`` rewrites ``rkpart compile`` applies to ``toolkit`` (``None``: to any), in the
    order it applies and drops them: the table's rows, then :data:`DEDUPE`, then the rows that must
    come after it (``after_dedupe``)."""
    npu = [r for r in REWRITES if r.kind == "npu"]
    rows = (*(r for r in npu if not r.after_dedupe), DEDUPE, *(r for r in npu if r.after_dedupe))
    return tuple(r for r in rows if toolkit is None or r.applies_to(toolkit))


def apply_rewrites(model: onnx.ModelProto, rows: tuple[Rewrite, ...]) -> dict[str, int]:
    """Apply ``rows`` to ``model`` in place; returns rewrite name -> matches rewritten (hits only).

    One :class:`~rkpart.ir.edit.GraphEdit` serves every row: types are inferred once, and again
    only after a row that matched.
    """
    view = GraphEdit(model)
    done: dict[str, int] = {}
    for r in rows:
        if not r.may_match(model):
            continue
        view.declare(r.needs)
        k = r.apply(view)
        if k:
            done[r.name] = k
            view.retype()
    return done


__all__ = ["DEDUPE", "NO_LOWERING", "REWRITES", "SKIPPABLE_REWRITES", "TYPE_ONLY_CHANGES",
           "Apply", "Rewrite", "apply_rewrites", "compile_rewrites_for", "rewrites_for",
           "weighed_rewrites_for"]
