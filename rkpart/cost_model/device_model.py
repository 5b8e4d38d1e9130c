"""Device memory of an NPU stage: the compiler's figure, and a model that predicts it before a build.

On rk3588 a compiled stage needs, while its context is alive, the compiler's **weight memory**
plus its **internal memory** (the feature buffers it allocated), the two figures every verbose
build prints ("Total Weight Memory Size", "Total Internal Memory Size";
:mod:`rkpart.compile.compiler_plan`).  Published: ``eval_memory()`` on a board reports those two
and adds a small ``other`` term (command buffers); :data:`OTHER_BYTES` stands for it.

Before anything is compiled, :class:`MemoryModel` predicts weight + internal from the IR,
counted as the NPU runs it (fp16, 2 bytes an element):

* ``weight16``: float weights at 2 bytes an element, other constants as stored;
* ``act16``: the largest sum of live activations in model order, at 2 bytes an element,
  **without the attention score tensors** -- the compiler fuses MatMul -> Softmax -> MatMul into
  ``exSDPAttention`` and never materialises the ``heads x tokens x tokens`` matrices the ONNX
  graph holds (the old calibration counted them: 2.2-3.4x the compiler's figure at 1024 px) --
  and with **every GELU counted as the NPU's fused layer holds it**, whatever form the export
  wrote it in (:func:`gelu_regions`): the compiler fuses the MatMul, its bias and the GELU into one
  ``ConvExGelu`` whose output buffer is :data:`GELU_BUFFER` (3) times the tensor, and nothing in
  between.  Counted op by op instead, the same FFN gave 3 hidden-sized tensors in TorchScript's
  Erf form and 2 for the opset-20 ``Gelu`` op (DiT, PixArt, SD3 exports), while the compiler's
  table is identical for both: the families' FFNs were under-predicted by 15-25 %.  The 3x is held
  while the MatMuls reading the GELU's input run, the output alone after them (the compiler reuses the
  rest: a single-stream block's Concat lives there, Flux 2.5.0);
* ``att16``: the live activations while an attention core runs (the same count, at the
  positions where a score tensor would be alive);
* ``head16``: the largest score matrix of *one* head (its last two dimensions) and
  ``score16`` all heads': the fused attention streams over heads a few at a time, so its
  workspace follows one head's ``tokens x keys`` matrix, not the whole tensor;
* ``io16``: the stage's boundary tensors (a term of the predictors fitted before the real-width rows, and of
  2.3.0's: it holds a stage's inputs and outputs in buffers of their own);
* ``fact16``, ``fatt16``, ``fhead16``: ``act16``, ``att16`` and ``head16`` with a masked attention fused too, as
  2.3.0 builds it once ``guard-after-product`` has moved the ``nan-guard`` factor past the product (Lumina2's
  main attention at real width, 2.3.0: internal memory 62 MiB against 193 MiB of scores and guard counted as
  2.5.0 holds them, +180 % predicted); the same as the others in a stage without a masked attention;
* ``hnorm16``: the activations normalised **per attention head** (q/k RMSNorm or LayerNorm over the
  last axis of a ``[batch, tokens, heads, head_dim]``-like tensor, :func:`head_norm_inputs`).  The
  compiler's ``exNorm`` lays such a tensor out with the heads in its H axis and holds an output
  buffer of 2x and a secondary of 2.25x the tensor (Feature Tensor Information Table, 2.3.0, Anima
  attention at 256-1024 tokens); at 256 tokens its buffers are the stage's peak.  A stage without
  q/k norms (DiT, PixArt) has none of it, which the attention workspace ``R`` alone cannot tell apart;
* ``gqa16``: the key/value heads repeated for grouped-query attention (:func:`kv_repeats`): the compiler
  lays the repeat out with the repeats padded and transposed and holds a secondary of the repeated
  tensor (Lumina-Image-2.0's 24 query heads over 8 KV heads: (8,4,96,T) and (8,8,96,T) buffers);
* ``kvfold16``, ``rowgather16``: constants 2.5.0 stores for the layouts rkpart's rewrites give it (a key/value
  projection folded with its head repeat, :func:`kv_folded_weights`; the one-hot row gather of a masked attention
  cut into row chunks, :func:`row_gather_matrices`), counted as weight on :data:`LAYOUT_WEIGHT_TOOLKITS`;
* ``psum16``: the outputs of the weighted MatMuls of more than :data:`K_TILE` input channels: the
  compiler splits such a MatMul into input-channel tiles and sums their full-size outputs in buffers
  of their own (:func:`tiled_matmul_outputs`; the GELU FFNs of hidden 2560-3072 and the SwiGLU FFNs
  were under-predicted by 8-40 % without it).

The compiler's internal memory is the peak of its buffers over the schedule: at the attention
(live activations plus the workspace of ``R`` heads' score matrices) or elsewhere (the FFN's
hidden activations), whichever is larger::

    weight   = a0 + a1 * (weight16 + kvfold16 + rowgather16)   (the last two on the toolkits that store them)
    internal = b0 + b1 * act16 + b2 * max(0, att16 + R * head16 - act16) + b3 * hnorm16 + b4 * gqa16
                  + b5 * psum16

``R`` (:data:`WORKSPACE_HEADS`) is chosen per toolkit by leave-one-shape-out cross-validation on
the fit set alone (``bench/device_memory.py``; 4 on 2.5.0), the coefficients are non-negative and
minimise the relative error.  The fit records its in-sample error, the bench its held-out error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from rkpart.cost_model.fitting import error_summary, nnls_relative
from rkpart.ir import ModelGraph, OpNode, Subgraph, graph_of
from rkpart.ir.liveness import Lifetimes, stage_lifetimes
from rkpart.plan.plan import Plan, Stage
from rkpart.plan.verify import stage_onnx
from rkpart.types import JsonMap, JsonObject

#: what ``eval_memory()`` adds to weight + internal on a board (command buffers): not counted by
#: the build, not measured here (no board); the write-up's board figures bracket it: split's
#: peak is 3 % *below* the compiler's figure, fused's 11 % above (docs/cost-model.md)
OTHER_BYTES = 0
#: the held-out error a budget is about: stages of at least this much compiler memory
MIN_STAGE_BYTES = 1 << 20
#: the features of :class:`MemoryFeatures`, in the order the JSON and the fit use them
FEATURES = ("weight16", "act16", "att16", "score16", "head16", "io16", "hnorm16", "gqa16", "psum16", "kvfold16",
            "rowgather16", "fact16", "fatt16", "fhead16")
#: ``kvfold16`` and ``rowgather16`` are constants the compiler stores for a layout rkpart's rewrites give it, on the
#: toolkits :data:`LAYOUT_WEIGHT_TOOLKITS` names: their coefficient is the one of ``weight16`` there, 0 elsewhere
#: (bytes the compiler stores like any weight; one family shows each, so a fitted coefficient of their own would be
#: 0 whenever that family is held out)
WEIGHT_TERMS = ("const", "weight16", "kvfold16", "rowgather16")
#: the toolkits whose compiler stores each layout constant (:func:`kv_folded_weights`, :func:`row_gather_matrices`):
#: the toolkits of the rewrite that makes the layout (``kv-repeat-gather``: 2.5.0; ``masked-attention-row-chunks``
#: is applied on 2.3.2 too, but its gather matrix was measured on 2.5.0 only)
LAYOUT_WEIGHT_TOOLKITS: dict[str, tuple[str, ...]] = {"kvfold16": ("2.5.0",), "rowgather16": ("2.5.0",)}
#: ``attx16`` is the attention's excess over the activation peak, ``max(0, att16 + R * head16 - act16)``
#: (:func:`attention_excess`): ``act16 + attx16`` is the NPU's peak, and each part has a coefficient
#: of its own (one coefficient for both scaled the GELU FFNs, whose buffers the compiler holds exactly
#: as counted, by the attention's: +16 % to +18 % at real widths)
#: the boundary tensors (``io16``) are not a term of their own: they are live activations, counted in
#: ``act16`` (a coefficient of their own was 0.2 and made the held-out error worse at real widths)
INTERNAL_TERMS = ("const", "act16", "attx16", "hnorm16", "gqa16", "psum16")
#: the internal terms of the toolkits whose compiler holds other buffers (:func:`internal_terms`): 2.3.0's is the
#: form its shipped predictor was fitted in (Anima and DiT stages), one coefficient for the whole NPU peak
#: (``fpeak16``: of the features with every attention fused, a masked one too, as 2.3.0 builds it after
#: ``guard-after-product``) and the boundary tensors, which 2.3.0 holds in buffers of their own (``io16``: every
#: real-width GELU FFN of 2.3.0 holds 4x its hidden activation, 2.5.0 3x and its input: DiT 36.0 against 29.2
#: MiB, SD3 48.0 against 39.0, Cosmos 64.0), with the repeated KV heads; no partial sums of input-channel tiles
#: (``psum16``: 2.3.0 does not hold them as 2.5.0 does, PRX's FFN +24.5 % with it). Held out by family on the
#: real-width rows of 2.3.0 (12 families, 41 stages of 1 MiB or more): 35 within ±10 %, 2.5.0's form 24; the
#: shipped predictor, fitted on other stages, 36 (``bench/real_width_memory_fit.py --toolkit 2.3.0``)
INTERNAL_TERMS_OF: dict[str, tuple[str, ...]] = {"2.3.0": ("const", "fpeak16", "io16", "hnorm16", "gqa16")}
#: the workspace sizes tried, in heads' score matrices (``R`` of the module docstring)
WORKSPACE_HEADS = (0, 1, 2, 3, 4, 5, 6, 8)
_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
#: ops a score tensor may pass through between the scores MatMul and the Softmax (scale, mask, cast)
_SCORE_PATH = frozenset({"Mul", "Div", "Add", "Sub", "Where", "Cast", "Reshape", "Softmax", "LogSoftmax"})
#: the score-path ops that apply a mask when they read an activation (:func:`_masks`)
_MASK_OPS = frozenset({"Add", "Sub", "Where"})
#: the op a GELU is computed around, in any form: the Gelu op (opset 20), or the Erf / Tanh of the
#: exporters' decompositions (TorchScript's exact Div/Erf/Add/Mul/Mul, the tanh form's Mul/Pow chain)
_GELU_CORE = frozenset({"Gelu", "Erf", "Tanh"})
#: the elementwise ops such a decomposition is written with
_GELU_PARTS = frozenset({"Gelu", "Erf", "Tanh", "Mul", "Div", "Add", "Sub", "Pow", "Sqrt"})
#: a decomposed GELU is a handful of ops (the tanh form lowered for opset 19 is 9, with the bias Add 10)
_GELU_MAX_OPS = 12
_MAC = frozenset({"MatMul", "Gemm", "Conv"})
#: the NPU's fused GELU (``ConvExGelu``: the producing MatMul, its bias and the GELU as one layer,
#: whatever form the ONNX graph wrote the GELU in) allocates its output at this many times the
#: tensor's fp16 size.  Measured in the compiler's Feature Tensor Information Table of every FFN the
#: bench built (68 builds): 3.00 on rknn-toolkit2 2.3.0 and 2.5.0, the exact (Erf) and tanh forms
#: alike, 64 to 2304 tokens, hidden 96 to 2048 (docs/cost-model.md, "Device memory from the compiler")
GELU_BUFFER = 3
#: the input channels of one tile of a weighted MatMul: the compiler splits a MatMul (a 1x1 Conv on
#: the NPU) of more input channels into tiles of this many and sums their full-size outputs
#: (``MatMul#2_tile0``, ``_tile1``, ... and their ``_conv_add`` Adds in the layer tables of every
#: real-width FFN of rknn-toolkit2 2.5.0: Flux, AuraFlow, CogView3-Plus, Lumina2, PRX, Sana; none at
#: 1536 channels or fewer: SD3, DiT, HunyuanDiT)
K_TILE = 1536
#: the NPU's fused SiLU (``exSwish``: ``x * Sigmoid(x)`` as one layer) holds its output at this many times the
#: tensor's fp16 size for the output's whole life, and never materialises the Sigmoid's.  Measured in the Feature
#: Tensor Information Table of every real-width SwiGLU and conv FFN of rknn-toolkit2 2.5.0 (AuraFlow, Ovis-Image,
#: FLUX.2-klein, Lumina-Image-2.0, Sana: e.g. AuraFlow's ``(1,8192,1,1288)`` gate held as ``(1,8192,1,1288,8)``,
#: 40.25 MiB, until the gate product reads it; Sana's two ``exSwish`` outputs, read by the depthwise Conv and the
#: gate product, both 2.00x) -- the same 2x as the standalone ``exGelu``'s output at these widths
SWISH_BUFFER = 2
#: the ops that repeat key/value heads for grouped-query attention (``repeat_interleave`` exported as
#: Expand, then Tile after ``tile-broadcast``)
_REPEAT_OPS = frozenset({"Expand", "Tile"})


@dataclass(frozen=True)
class MemoryFeatures:
    """A stage's memory as the NPU would hold it, in bytes (see the module docstring)."""

    weight16: int
    act16: int
    score16: int
    head16: int
    io16: int
    #: the live activations (scores left out) while an attention core runs (0: no attention)
    att16: int = 0
    #: the activations normalised per attention head (:func:`head_norm_inputs`)
    hnorm16: int = 0
    #: the key/value heads repeated for grouped-query attention (:func:`kv_repeats`)
    gqa16: int = 0
    #: the outputs of the MatMuls the compiler tiles by input channels (:func:`tiled_matmul_outputs`)
    psum16: int = 0
    #: the copies of a key/value projection's weight the compiler stores when it folds the head repeat into it
    #: (:func:`kv_folded_weights`)
    kvfold16: int = 0
    #: the one-hot row-gather matrices of the masked attentions cut into row chunks (:func:`row_gather_matrices`)
    rowgather16: int = 0
    #: ``act16``, ``att16`` and ``head16`` with every attention fused, a masked one too (2.3.0's form)
    fact16: int = 0
    fatt16: int = 0
    fhead16: int = 0

    def value(self, name: str, heads: float = 0.0) -> float:
        if name == "const":
            return 1.0
        if name == "peak16":
            return peak16(self.act16, self.att16, self.head16, heads)
        if name == "attx16":
            return attention_excess(self.act16, self.att16, self.head16, heads)
        if name == "fpeak16":
            return peak16(self.fact16, self.fatt16, self.fhead16, heads)
        return float(getattr(self, name))

    def to_json(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in FEATURES}

    @classmethod
    def from_json(cls, d: JsonMap) -> MemoryFeatures:
        return cls(**{k: int(d.get(k, 0)) for k in FEATURES})


def peak16(act16: float, att16: float, head16: float, heads: float) -> float:
    """The NPU's activation peak: elsewhere, or at the attention with ``heads`` score matrices of workspace."""
    return float(max(act16, att16 + heads * head16))


def attention_excess(act16: float, att16: float, head16: float, heads: float) -> float:
    """How far the attention's peak (live activations and ``heads`` score matrices of workspace) rises
    above the activation peak elsewhere: ``peak16 - act16``."""
    return float(max(0.0, att16 + heads * head16 - act16))


def _bytes16(mg: ModelGraph, name: str) -> int:
    t = mg.tensor_types.get(name)
    if t is None:
        return 0
    if mg.is_float(name):
        return 2 * math.prod(t[1])
    return mg.nbytes(name)


def score_tensors(mg: ModelGraph, ops: Iterable[int], fuse_masked: bool = False) -> set[str]:
    """Attention score tensors the NPU never materialises, among the outputs of ``ops``: from a
    MatMul of two activations through scale ops to a Softmax, and the Softmax's output up to the
    MatMul that reads it, with the ``Where(IsNaN(p), 0, p)`` guard after it (``nan-guard`` rewrites it
    into the product: its bool and its copy of the probabilities are never built).

    A path with a mask, an Add, Sub or Where reading an activation (:func:`_masks`), is
    left out unless ``fuse_masked``: 2.5.0 does not fuse such an attention into ``exSDPAttention`` but builds it
    as ``exMatMul`` -> ``exSoftmax13`` -> ``exMatMul`` and holds the scores (Lumina-Image-2.0 at its
    width, 1280 tokens: 24 x 1280 x 1280 score and probability buffers in the compiler's Feature
    Tensor Information Table; its unmasked noise refiner is fused), so they count as activations; 2.3.0 fuses it
    (after ``guard-after-product``), the ``f*`` features."""
    opset = set(ops)
    scores: set[str] = set()
    for i in opset:
        n = mg.op(i)
        if n.op_type != "MatMul" or any(mg.is_const_tensor(t) for t in n.inputs if t):
            continue
        path: list[str] = []
        t = n.outputs[0]
        for _ in range(8):  # scale, mask, cast, softmax: a short chain
            path.append(t)
            readers = [c for c in mg.consumers.get(t, []) if c in opset]
            if len(readers) != 1 or mg.op(readers[0]).op_type not in _SCORE_PATH:
                break
            r = mg.op(readers[0])
            if not fuse_masked and _masks(mg, r, t):
                break
            t = r.outputs[0]
            if r.op_type in _SOFTMAX:
                path.append(t)
                path += _nan_guard(mg, opset, t)
                scores.update(path)
                break
    return scores


def _nan_guard(mg: ModelGraph, opset: set[int], p: str) -> list[str]:
    """The tensors of a ``Where(IsNaN(p), 0, p)`` guard on the probabilities ``p`` (TorchScript's export of an
    attention with a bool mask), inside ``opset``: the bool and the guarded copy."""
    out: list[str] = []
    for c in mg.consumers.get(p, []):
        n = mg.op(c)
        if c not in opset or n.op_type != "IsNaN":
            continue
        for w in mg.consumers.get(n.outputs[0], []):
            g = mg.op(w)
            if w in opset and g.op_type == "Where" and g.inputs[0] == n.outputs[0] and p in g.inputs[1:]:
                out += [n.outputs[0], g.outputs[0]]
    return out


def _masks(mg: ModelGraph, op: OpNode, score: str) -> bool:
    """``op`` on a score path (reading ``score``) applies a mask: an Add, Sub or Where with an
    operand other than the scores that is an activation (a constant bias or scale is fused)."""
    if op.op_type not in _MASK_OPS:
        return False
    return any(t and t != score and not mg.is_const_tensor(t) for t in op.inputs)


@dataclass(frozen=True)
class GeluRegion:
    """A GELU of the graph as the NPU runs it: one fused layer (see :data:`GELU_BUFFER`)."""

    #: the ops of the GELU (its bias Add included when only the GELU reads the sum)
    ops: frozenset[int]
    #: the one activation it reads, and the one it leaves
    source: str
    output: str
    #: the weighted MatMul / Gemm / Conv that produced ``source`` and that the NPU fuses the GELU into
    #: (``None``: ``source`` comes from elsewhere and is held as it is)
    fused_into: int | None


def _dyn(mg: ModelGraph, i: int) -> list[str]:
    return [t for t in mg.op(i).inputs if t and not mg.is_const_tensor(t)]


def _closed(mg: ModelGraph, region: set[int]) -> tuple[str, str] | None:
    """(source, output) when ``region`` reads exactly one activation and leaves exactly one."""
    made = {t for i in region for t in mg.op(i).outputs if t}
    ext = {t for i in region for t in _dyn(mg, i) if t not in made}
    outs = set(mg.outputs)
    leaving = {t for t in made if t in outs or any(q not in region for q in mg.consumers.get(t, []))}
    if len(ext) != 1 or len(leaving) != 1:
        return None
    return next(iter(ext)), next(iter(leaving))


def _grow(mg: ModelGraph, opset: set[int], core: int, parts: frozenset[str], max_ops: int
          ) -> tuple[set[int], str, str] | None:
    """The largest connected set of ``parts`` ops grown around ``core`` that reads one activation (and
    constants) and leaves one, every tensor in between read only inside it: (ops, source, output),
    or ``None``.  It grows backward through producers only it reads and forward through readers of
    nothing but it and its input; a state that reads or leaves more than one tensor is passed through
    (a decomposition is closed only at its end), the last closed one kept."""
    region = {core}
    best: tuple[set[int], str, str] | None = None
    for _ in range(2 * max_ops):
        ends = _closed(mg, region)
        if ends is not None:
            best = (set(region), *ends)
        made = {t for i in region for t in mg.op(i).outputs if t}
        ext = {t for i in region for t in _dyn(mg, i) if t not in made}
        grown = set(region)
        for u in ext:  # backward: a producer whose result only the region reads
            p = mg.producer.get(u)
            if (p is not None and p in opset and mg.op(p).op_type in parts
                    and all(q in region for q in mg.consumers.get(u, []))):
                grown.add(p)
        for t in made:  # forward: a reader of nothing but the region and its input
            for q in mg.consumers.get(t, []):
                if q in opset and mg.op(q).op_type in parts and all(x in made or x in ext for x in _dyn(mg, q)):
                    grown.add(q)
        if grown == region or len(grown) > max_ops:
            break
        region = grown
    return best


def gelu_regions(mg: ModelGraph, ops: Iterable[int]) -> list[GeluRegion]:
    """The GELUs among ``ops``, in any form: a connected set of elementwise ops around one Gelu, Erf or
    Tanh, reading exactly one activation (and constants) and leaving exactly one; every tensor in
    between is read only inside the set and has the output's element count."""
    opset = set(ops)
    taken: set[int] = set()
    out: list[GeluRegion] = []
    for c in sorted(opset):
        if mg.op(c).op_type not in _GELU_CORE or c in taken:
            continue
        grown = _grow(mg, opset, c, _GELU_PARTS, _GELU_MAX_OPS)
        if grown is None:
            continue
        region, source, output = grown
        if sum(mg.op(i).op_type in _GELU_CORE for i in region) != 1:
            continue
        if not any(mg.op(i).op_type == "Gelu" for i in region):
            # x * f(x): the GELU's input (the source, or the source plus its bias) is read twice inside,
            # by the Erf/Tanh path and by the product; a lone Tanh is an activation of its own
            xs = {source} | {mg.op(i).outputs[0] for i in region
                             if mg.op(i).op_type == "Add" and _dyn(mg, i) == [source]}
            if max(sum(q in region for q in mg.consumers.get(t, [])) for t in xs) < 2:
                continue
        made = {t for i in region for t in mg.op(i).outputs if t}
        sizes = {math.prod(sh) for t in (*made, source) if (sh := mg.shape(t)) is not None}
        if len(sizes) != 1:
            continue  # broadcasting or a reduction inside: not a GELU
        p = mg.producer.get(source)
        fused = (p if p is not None and p in opset and mg.op(p).op_type in _MAC
                 and any(mg.is_const_tensor(t) for t in mg.op(p).inputs[1:] if t)
                 and all(q in region for q in mg.consumers.get(source, [])) else None)
        taken |= region
        out.append(GeluRegion(ops=frozenset(region), source=source, output=output, fused_into=fused))
    return out


def swish_outputs(mg: ModelGraph, ops: Iterable[int]) -> list[tuple[tuple[str, ...], str]]:
    """The SiLUs among ``ops``, ``x * Sigmoid(x)`` (a Sigmoid of an activation and the Mul of the same activation
    with it, the Sigmoid's output read by nothing else): (the tensors inside the fused layer -- the Sigmoid's
    output, and the product when only a float Cast reads it --, the tensor it leaves) of each."""
    opset = set(ops)
    out: list[tuple[tuple[str, ...], str]] = []
    for i in sorted(opset):
        n = mg.op(i)
        if n.op_type != "Sigmoid" or not n.inputs or not n.inputs[0] or mg.is_const_tensor(n.inputs[0]):
            continue
        x, sg = n.inputs[0], n.outputs[0]
        readers = mg.consumers.get(sg, [])
        if len(readers) != 1 or readers[0] not in opset:
            continue
        m = mg.op(readers[0])
        if m.op_type == "Mul" and sorted(t for t in m.inputs if t) == sorted((x, sg)) and m.outputs[0]:
            held = [sg, m.outputs[0]]
            for _ in range(2):  # a float Cast after it (an fp32 export's autocast: Lumina2) is the same tensor
                r = mg.consumers.get(held[-1], [])
                if len(r) != 1 or r[0] not in opset or mg.op(r[0]).op_type != "Cast" or not mg.is_float(
                        mg.op(r[0]).outputs[0]):
                    break
                held.append(mg.op(r[0]).outputs[0])
            out.append((tuple(held[:-1]), held[-1]))
    return out


#: normalisation ops read whole (a hand-written RMSNorm / LayerNorm is found by its ReduceMean)
_NORM_OPS = frozenset({"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"})
#: the ops between a hand-written LayerNorm's input and its variance's ReduceMean (x - mean, squared)
_NORM_PATH = frozenset({"Sub", "Pow", "Mul", "Cast"})


def _per_head(shape: tuple[int, ...] | None) -> bool:
    """A tensor normalised over its last axis per attention head: rank 4 or more, with tokens and
    heads (two axes of more than one) in front of the normalised one."""
    return shape is not None and len(shape) >= 4 and sum(d > 1 for d in shape[:-1]) >= 2


def head_norm_inputs(mg: ModelGraph, ops: Iterable[int]) -> list[str]:
    """The tensors ``ops`` normalise per attention head, once each: the input of a normalisation op,
    or of a ``ReduceMean`` over the last axis (the mean of a hand-written RMSNorm / LayerNorm), of a
    :func:`_per_head` shape.  A LayerNorm's second ``ReduceMean`` (its variance, of ``x - mean``) is
    the same normalisation and is not counted again."""
    opset = set(ops)
    cands: dict[int, str] = {}
    for i in sorted(opset):
        n = mg.op(i)
        if (n.op_type not in _NORM_OPS and n.op_type != "ReduceMean") or not n.inputs or not n.inputs[0]:
            continue
        x = n.inputs[0]
        sh = mg.shape(x)
        if not _per_head(sh):
            continue
        if n.op_type == "ReduceMean":  # over the last axis only: (..., D) -> (..., 1) or (...)
            out = mg.shape(n.outputs[0])
            if sh is None or out is None or tuple(out) not in ((*sh[:-1], 1), tuple(sh[:-1])):
                continue
        cands[i] = x
    normalised = set(cands.values())
    found: list[str] = []
    for x in cands.values():
        seen: set[str] = set()
        frontier = [x]
        for _ in range(3):  # x - mean, its square, a cast: a short way back to the normalised tensor
            nxt = []
            for t in frontier:
                p = mg.producer.get(t)
                if p is None or p not in opset or mg.op(p).op_type not in _NORM_PATH:
                    continue
                nxt += [u for u in mg.op(p).inputs if u and u not in seen]
            seen.update(nxt)
            frontier = nxt
        if not (seen & normalised) and x not in found:
            found.append(x)
    return found


def _input_channels(mg: ModelGraph, n: OpNode) -> int:
    """The input channels a weighted MatMul / Gemm / Conv reduces over (0: not a weighted one)."""
    if n.op_type not in _MAC or len(n.inputs) < 2 or not n.inputs[1] or not mg.is_const_tensor(n.inputs[1]):
        return 0
    w = mg.shape(n.inputs[1])
    if not w or len(w) < 2:
        return 0
    if n.op_type == "Conv":
        return int(math.prod(w[1:]))
    if n.op_type == "Gemm" and n.attr("transB", 0):
        return int(w[-1])
    return int(w[-2])


def tiled_matmul_outputs(mg: ModelGraph, ops: Iterable[int]) -> list[str]:
    """The outputs of the weighted MatMuls among ``ops`` of more than :data:`K_TILE` input channels.

    The compiler splits such a MatMul into tiles of :data:`K_TILE` input channels and sums the tiles'
    full-size outputs (``MatMul#2_tile0``, ``_tile1`` and their ``_conv_add`` in the layer tables);
    the feature tables hold the partial sums in buffers of their own, beside the activations."""
    out = []
    for i in sorted(set(ops)):
        n = mg.op(i)
        if n.outputs and n.outputs[0] and _input_channels(mg, n) > K_TILE:
            out.append(n.outputs[0])
    return out


def kv_repeats(mg: ModelGraph, ops: Iterable[int]) -> list[str]:
    """The key/value tensors ``ops`` repeat over heads (grouped-query attention): the output of an
    Expand or Tile of an activation of rank 4 or more that is larger than its input, the last of a
    chain (Expand then Tile is one repeat)."""
    opset = set(ops)
    found: list[str] = []
    for i in sorted(opset):
        n = mg.op(i)
        if n.op_type not in _REPEAT_OPS or not n.inputs or not n.inputs[0] or mg.is_const_tensor(n.inputs[0]):
            continue
        src, out = mg.shape(n.inputs[0]), mg.shape(n.outputs[0])
        if src is None or out is None or len(out) < 4 or math.prod(out) <= math.prod(src):
            continue
        if any(q in opset and mg.op(q).op_type in _REPEAT_OPS for q in mg.consumers.get(n.outputs[0], [])):
            continue  # the next repeat op of the chain holds the result
        found.append(n.outputs[0])
    return found


#: ops that only relabel or reorder a tensor: the compiler looks through them to the weighted MatMul behind a repeat
_LAYOUT_OPS = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Transpose", "Identity", "Flatten"})


def kv_folded_weights(mg: ModelGraph, ops: Iterable[int]) -> int:
    """Bytes (fp16) of the weight copies the compiler stores when a key/value head repeat (:func:`kv_repeats`) reads a
    weighted MatMul / Gemm through layout ops only (and its bias Add): ``(r - 1)`` times that weight and bias.

    ``kv-repeat-gather`` writes the repeat as a Gather of heads; 2.5.0 folds a Gather of a projection's output
    channels into the projection, which then computes every repeated head itself.  Measured in the Const Tensor
    Information Table of Lumina-Image-2.0 at its width (24 query heads of 96 over 8 KV heads, 2.5.0): ``to_v`` is
    stored as (2304, 576) tiles, 2304 output channels for its 768, 6.75 MiB more in each attention stage (weight
    memory 33.8-37.0 MiB against 27.1 of weights); ``to_k``, whose repeat reads it through the per-head RMSNorm and
    RoPE, keeps its 768 channels and is gathered on the NPU (``Gather:.../Tile/Gather``)."""
    opset = set(ops)
    total = 0
    for out in kv_repeats(mg, opset):
        first = mg.producer[out]
        while True:  # back to the first repeat op of the chain: r is the whole chain's
            src = mg.op(first).inputs[0]
            p = mg.producer.get(src)
            if p is None or p not in opset or mg.op(p).op_type not in _REPEAT_OPS:
                break
            first = p
        src_shape, out_shape = mg.shape(mg.op(first).inputs[0]), mg.shape(out)
        if src_shape is None or out_shape is None or math.prod(src_shape) <= 0:
            continue
        r = math.prod(out_shape) // math.prod(src_shape)
        t = mg.op(first).inputs[0]
        consts: list[str] = []
        for _ in range(8):  # Reshape, Unsqueeze, Transpose, a bias Add: a short way back
            p = mg.producer.get(t)
            if p is None or p not in opset:
                break
            n = mg.op(p)
            if n.op_type in _LAYOUT_OPS:
                t = n.inputs[0]
                continue
            if n.op_type == "Add" and len(dyn := _dyn(mg, p)) == 1:
                consts += [u for u in n.inputs if u and mg.is_const_tensor(u)]
                t = dyn[0]
                continue
            if n.op_type in ("MatMul", "Gemm") and len(n.inputs) > 1 and n.inputs[1] \
                    and mg.is_const_tensor(n.inputs[1]):
                consts += [u for u in n.inputs[1:] if u and mg.is_const_tensor(u)]
                total += (r - 1) * sum(_bytes16(mg, u) for u in consts)
            break
    return int(total)


def row_gather_matrices(mg: ModelGraph, ops: Iterable[int]) -> int:
    """Bytes (fp16) of the one-hot matrices the compiler stores for the masked attentions
    ``masked-attention-row-chunks`` cuts into row chunks: a score path with a mask (:func:`_masks`: computed in
    the stage or read from its inputs) of :data:`~rkpart.targets.rewrites.heads.MASKED_ROWS` query rows or more,
    ``rows x rows`` each.

    2.5.0 merges the chunks' Slices of the queries into one Gather of the rows and runs that Gather as a Conv whose
    weight is the ``rows x rows`` one-hot matrix (Lumina-Image-2.0's joint attention, 1280 rows in 5 chunks:
    ``Conv:.../Softmax/rows768/q_concat_2gather_2conv``, two (1280, 640) fp16 tiles, 3.1 MiB of its weight memory)."""
    from rkpart.targets.rewrites.heads import MASKED_ROWS, ROW_CHUNK

    opset = set(ops)
    total = 0
    for i in sorted(opset):
        n = mg.op(i)
        if n.op_type not in _SOFTMAX or not n.inputs or not n.inputs[0]:
            continue
        t, masked = n.inputs[0], False
        for _ in range(8):  # back along the score path to the MatMul of two activations
            p = mg.producer.get(t)
            if p is None or p not in opset:
                break
            q = mg.op(p)
            if q.op_type == "MatMul":
                sh = mg.shape(q.outputs[0])
                if (masked and not any(mg.is_const_tensor(u) for u in q.inputs if u) and sh and len(sh) >= 2
                        and sh[-2] >= MASKED_ROWS and sh[-2] > ROW_CHUNK):
                    total += 2 * sh[-2] * sh[-2]
                break
            if q.op_type not in _SCORE_PATH:
                break
            prev = next((u for u in q.inputs if u and mg.producer.get(u) is not None
                         and mg.op(mg.producer[u]).op_type in _SCORE_PATH | {"MatMul"}), None)
            if prev is None:
                break
            masked |= _masks(mg, q, prev)
            t = prev
    return int(total)


def _npu_sizes(mg: ModelGraph, sub: Subgraph, life: Lifetimes, scores: set[str]
               ) -> tuple[np.ndarray, np.ndarray, Lifetimes]:
    """Each tensor of ``life`` at the size the NPU holds it (the attention score tensors ``scores`` 0, a GELU's
    output once), the bytes a fused GELU holds beside it at the position it is computed (its other
    :data:`GELU_BUFFER` - 1 buffers), and the lifetimes with a fused GELU's output born at its MatMul."""
    size = {t: 0 if t in scores else _bytes16(mg, t) for t in life.names}
    born = life.born.copy()
    index = {t: k for k, t in enumerate(life.names)}
    pos = {op: k for k, op in enumerate(life.order)}
    extra = np.zeros(life.n + 1, dtype=np.int64)
    for g in gelu_regions(mg, sub.ops):
        for i in g.ops:  # the decomposition's intermediates live inside the fused layer
            for t in mg.op(i).outputs:
                if t in size and t != g.output:
                    size[t] = 0
        if g.fused_into is not None and g.source in size:
            size[g.source] = 0  # never materialised: the MatMul writes the GELU's output
            if g.output in index:
                born[index[g.output]] = pos[g.fused_into]
        if g.output in index:
            # the fused layer's buffers beyond its output (the tiles' partial sums) are held while the compiler
            # computes the MatMuls that read the same input (it runs their tiles together: PRX's GeGLU, the
            # gate's tiles beside the up projection's; Flux's single-stream block, the proj_mlp tiles beside
            # to_q/to_k/to_v, 144.75 MiB), and reused after them (Flux: the tiles' 72 MiB hold the Concat of
            # attention and MLP afterwards), not for as long as the GELU's output lives
            k = index[g.output]
            at = max(int(born[k]), 0)
            end = at
            if g.fused_into is not None:
                x = _dyn(mg, g.fused_into)
                for q in (mg.consumers.get(x[0], []) if x else []):
                    if q in pos and _input_channels(mg, mg.op(q)) > 0:
                        end = max(end, pos[q])
            extra[at] += (GELU_BUFFER - 1) * _bytes16(mg, g.output)
            extra[end + 1] -= (GELU_BUFFER - 1) * _bytes16(mg, g.output)
    for inside, product in swish_outputs(mg, sub.ops):
        # exSwish: the Sigmoid never materialised, the product held at SWISH_BUFFER times
        for t in inside:
            if t in size:
                size[t] = 0
        if product in size:
            size[product] = SWISH_BUFFER * _bytes16(mg, product)
    life = dataclasses.replace(life, born=born)
    return np.array([size[t] for t in life.names], dtype=np.int64), np.cumsum(extra[: life.n]), life


def _peaks(mg: ModelGraph, sub: Subgraph, life: Lifetimes, scores: set[str]) -> tuple[int, int, int, int]:
    """(``act16``, ``att16``, ``score16``, ``head16``) with ``scores`` the tensors the NPU never holds."""
    sizes, transient, life = _npu_sizes(mg, sub, life, scores)
    live = life.live_bytes(sizes) + transient
    act16 = int(live.max())
    start = np.maximum(life.born, 0)
    # live activations while an attention core runs: positions where a score tensor is alive
    during = np.zeros(life.n, dtype=bool)
    for k, t in enumerate(life.names):
        if t in scores and life.last[k] >= start[k]:
            during[start[k]: life.last[k] + 1] = True
    att16 = int(live[during].max()) if during.any() else 0
    score16 = max((_bytes16(mg, t) for t in scores), default=0)
    head16 = max((2 * math.prod(sh[-2:]) for t in scores if (sh := mg.shape(t)) and len(sh) >= 2), default=0)
    return act16, att16, score16, head16


def view_memory_features(mg: ModelGraph, sub: Subgraph, life: Lifetimes | None = None) -> MemoryFeatures:
    """:class:`MemoryFeatures` of the ops of ``sub`` as one NPU stage (``life``: its
    :func:`~rkpart.ir.liveness.stage_lifetimes`, when the caller has them already)."""
    # a table the stage holds twice (q's and k's RoPE) is stored once: compile merges the copies
    weight16 = sum(_bytes16(mg, t) for t in mg.distinct_constants(sub.weights))
    io16 = sum(_bytes16(mg, t) for t in (*sub.inputs, *sub.outputs))
    hnorm16 = sum(_bytes16(mg, t) for t in head_norm_inputs(mg, sub.ops))
    gqa16 = sum(_bytes16(mg, t) for t in kv_repeats(mg, sub.ops))
    psum16 = sum(_bytes16(mg, t) for t in tiled_matmul_outputs(mg, sub.ops))
    layout = {"kvfold16": kv_folded_weights(mg, sub.ops), "rowgather16": row_gather_matrices(mg, sub.ops)}
    life = life if life is not None else stage_lifetimes(mg, sub)
    if life is None:
        return MemoryFeatures(weight16=weight16, act16=0, score16=0, head16=0, io16=io16, att16=0, hnorm16=hnorm16,
                              gqa16=gqa16, psum16=psum16, **layout)
    scores = score_tensors(mg, sub.ops)
    act16, att16, score16, head16 = _peaks(mg, sub, life, scores)
    # the masked attentions fused (2.3.0's form): counted again only where a mask kept one unfused
    fused = score_tensors(mg, sub.ops, fuse_masked=True)
    fact16, fatt16, _, fhead16 = (act16, att16, score16, head16) if fused == scores else _peaks(mg, sub, life, fused)
    return MemoryFeatures(weight16=int(weight16), act16=act16, score16=int(score16), head16=int(head16),
                          io16=int(io16), att16=att16, hnorm16=int(hnorm16), gqa16=int(gqa16),
                          psum16=int(psum16), fact16=fact16, fatt16=fatt16, fhead16=fhead16, **layout)


def stage_memory_features(folder: str | Path, stage: Stage) -> MemoryFeatures:
    """:class:`MemoryFeatures` of one stage file of a plan folder (weights not loaded)."""
    path = stage_onnx(Path(folder), stage)
    model = onnx.load_model(str(path), format="protobuf", load_external_data=False)
    mg = graph_of(model, path)
    return view_memory_features(mg, mg.subgraph(mg.ops.nodes))


def memory_features(plan: Plan, folder: str | Path) -> dict[str, MemoryFeatures]:
    """:class:`MemoryFeatures` of every NPU stage of ``plan``, by stage id."""
    return {s.id: stage_memory_features(folder, s) for s in plan.npu_stages}


@dataclass(frozen=True)
class MemoryRow:
    """One compiled stage: its IR features and the compiler's memory (a sample of the fit)."""

    family: str
    shape: str
    strategy: str
    stage: str
    toolkit: str
    fit: bool
    features: MemoryFeatures
    weight_bytes: int
    internal_bytes: int
    #: the stage's cost-model features (compiled figures included), for the NPU-time calibration
    stage_features: JsonMap = field(default_factory=dict)

    @property
    def device_bytes(self) -> int:
        return self.weight_bytes + self.internal_bytes

    def to_json(self) -> JsonObject:
        return {"family": self.family, "shape": self.shape, "strategy": self.strategy, "stage": self.stage,
                "toolkit": self.toolkit, "fit": self.fit, "features": self.features.to_json(),
                "weight_bytes": self.weight_bytes, "internal_bytes": self.internal_bytes,
                "stage_features": dict(self.stage_features)}

    @classmethod
    def from_json(cls, d: JsonMap) -> MemoryRow:
        return cls(family=str(d["family"]), shape=str(d["shape"]), strategy=str(d["strategy"]),
                   stage=str(d["stage"]), toolkit=str(d["toolkit"]), fit=bool(d["fit"]),
                   features=MemoryFeatures.from_json(d["features"]), weight_bytes=int(d["weight_bytes"]),
                   internal_bytes=int(d["internal_bytes"]), stage_features=dict(d.get("stage_features") or {}))


@dataclass(frozen=True)
class MemoryModel:
    """Predicted compiler weight + internal memory of a stage, for one toolkit."""

    toolkit: str
    weight: tuple[float, ...]  # coefficients of WEIGHT_TERMS
    internal: tuple[float, ...]  # coefficients of internal_terms(toolkit)
    #: ``R``: the attention workspace in heads' score matrices
    workspace_heads: float = 0.0
    samples: int = 0
    #: share of the fit's own samples within +-10 % / +-20 % and the median |% error|
    fit_error: JsonMap = field(default_factory=dict)
    #: the held-out error, when a bench measured it (``bench/device_memory.py``)
    held_out: JsonMap = field(default_factory=dict)

    def predict_parts(self, f: MemoryFeatures) -> tuple[float, float]:
        w = sum(c * f.value(t) for t, c in zip(WEIGHT_TERMS, self.weight, strict=True))
        i = sum(c * f.value(t, self.workspace_heads)
                for t, c in zip(internal_terms(self.toolkit), self.internal, strict=True))
        return float(w), float(i)

    def predict(self, f: MemoryFeatures) -> float:
        """Predicted weight + internal bytes (what the compiler would report) of a stage."""
        w, i = self.predict_parts(f)
        return w + i

    def to_json(self) -> JsonObject:
        return {"format": "rkpart-device-memory-model", "version": 2, "toolkit": self.toolkit,
                "weight": dict(zip(WEIGHT_TERMS, self.weight, strict=True)),
                "internal": dict(zip(internal_terms(self.toolkit), self.internal, strict=True)),
                "workspace_heads": self.workspace_heads, "samples": self.samples,
                "fit_error": dict(self.fit_error), "held_out": dict(self.held_out)}

    @classmethod
    def from_json(cls, d: JsonMap) -> MemoryModel:
        if d.get("format") != "rkpart-device-memory-model" or d.get("version") != 2:
            raise ValueError("not an rkpart device-memory model (version 2)")

        def coefs(key: str, terms: Sequence[str]) -> tuple[float, ...]:
            m = d.get(key)
            if isinstance(m, Mapping) and key == "weight":  # a model written before the layout constants: none
                m = {**{t: 0.0 for t in LAYOUT_WEIGHT_TOOLKITS}, **m}
            if not isinstance(m, Mapping) or set(m) != set(terms):
                raise ValueError(f"device-memory model {key}: expected the terms {', '.join(terms)}")
            vals = tuple(float(m[t]) for t in terms)
            if not all(math.isfinite(v) and v >= 0 for v in vals):
                raise ValueError(f"device-memory model {key}: coefficients must be finite and >= 0")
            return vals

        heads = d.get("workspace_heads", 0.0)
        if isinstance(heads, bool) or not isinstance(heads, (int, float)) or not 0 <= heads <= 64:
            raise ValueError("device-memory model workspace_heads must be a number in 0..64")
        return cls(toolkit=str(d["toolkit"]), weight=coefs("weight", WEIGHT_TERMS),
                   internal=coefs("internal", internal_terms(str(d["toolkit"]))), workspace_heads=float(heads),
                   samples=int(d.get("samples", 0)),
                   fit_error=dict(d.get("fit_error") or {}), held_out=dict(d.get("held_out") or {}))


def internal_terms(toolkit: str) -> tuple[str, ...]:
    """The internal-memory terms of ``toolkit``'s form: :data:`INTERNAL_TERMS_OF`, else :data:`INTERNAL_TERMS`."""
    return INTERNAL_TERMS_OF.get(toolkit, INTERNAL_TERMS)


def stored_weight16(f: MemoryFeatures, toolkit: str) -> float:
    """The constants ``toolkit``'s compiler stores, at 2 bytes an element: ``weight16`` and the layout constants
    (:data:`LAYOUT_WEIGHT_TOOLKITS`) it stores on that toolkit."""
    return float(f.weight16 + sum(f.value(t) for t, tks in LAYOUT_WEIGHT_TOOLKITS.items() if toolkit in tks))


def _solve(rows: Sequence[MemoryRow], heads: float, toolkit: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    # the weight side: one coefficient for everything stored (weights and the toolkit's layout constants)
    xw = np.array([[1.0, stored_weight16(r.features, toolkit)] for r in rows])
    xi = np.array([[r.features.value(t, heads) for t in internal_terms(toolkit)] for r in rows])
    a0, a1 = (float(f"{c:.6g}") for c in nnls_relative(xw, np.array([float(r.weight_bytes) for r in rows])))
    ci = nnls_relative(xi, np.array([float(r.internal_bytes) for r in rows]))
    cw = (a0, a1, *(a1 if toolkit in LAYOUT_WEIGHT_TOOLKITS[t] else 0.0 for t in WEIGHT_TERMS[2:]))
    return cw, tuple(float(f"{c:.6g}") for c in ci)


def cross_validate_heads(rows: Sequence[MemoryRow], toolkit: str) -> dict[float, tuple[float, float]]:
    """Per candidate ``R``: (share within +-10 %, median |error|) leaving one shape out at a time."""
    shapes = sorted({(r.family, r.shape) for r in rows})
    out: dict[float, tuple[float, float]] = {}
    for heads in WORKSPACE_HEADS:
        errs = []
        for sh in shapes:
            train = [r for r in rows if (r.family, r.shape) != sh]
            if not train:
                continue
            w, i = _solve(train, heads, toolkit)
            m = MemoryModel(toolkit=toolkit, weight=w, internal=i, workspace_heads=float(heads))
            errs += [abs(m.predict(r.features) / r.device_bytes - 1) for r in rows if (r.family, r.shape) == sh]
        out[float(heads)] = (float(np.mean(np.array(errs) <= 0.10)) if errs else 0.0,
                             float(np.median(errs)) if errs else math.inf)
    return out


def fit_memory_model(rows: Sequence[MemoryRow], toolkit: str) -> MemoryModel:
    """Fit weight and internal memory on ``rows`` (non-negative, relative error), with the attention
    workspace ``R`` chosen by leave-one-shape-out cross-validation on these rows alone."""
    if not rows:
        raise ValueError(f"no compiled stages to fit a device-memory model for rknn-toolkit2 {toolkit}")
    cv = cross_validate_heads(rows, toolkit) if len({(r.family, r.shape) for r in rows}) > 1 else {0.0: (0, 0)}
    heads = max(cv, key=lambda h: (cv[h][0], -cv[h][1], -h))
    w, i = _solve(rows, heads, toolkit)
    model = MemoryModel(toolkit=toolkit, weight=w, internal=i, workspace_heads=heads, samples=len(rows))
    err = error_summary([model.predict(r.features) for r in rows], [r.device_bytes for r in rows])
    err["cross_validation"] = {f"{h:g}": {"within_10": round(a, 4), "median_ape": round(b * 100, 3)}
                               for h, (a, b) in sorted(cv.items())}
    return dataclasses.replace(model, fit_error=err)


def leave_one_family_out(rows: Sequence[MemoryRow], toolkit: str) -> list[tuple[MemoryRow, float]]:
    """Each row of ``rows`` with its prediction by a model fitted without its family (``R`` chosen
    again on each fold's rows alone): the error at a family the model never saw."""
    out: list[tuple[MemoryRow, float]] = []
    for fam in sorted({r.family for r in rows}):
        train = [r for r in rows if r.family != fam]
        if not train:
            continue
        model = fit_memory_model(train, toolkit)
        out += [(r, model.predict(r.features)) for r in rows if r.family == fam]
    return out


#: the quantile of the held-out under-prediction a budget's bound covers (:func:`budget_margin`)
BOUND_QUANTILE = 0.95


def error_table(pairs: Sequence[tuple[MemoryRow, float]]) -> JsonObject:
    """Held-out error of (row, prediction) pairs: :func:`~rkpart.cost_model.fitting.error_summary`, the
    90th percentile and largest |error| (%), the worst under-prediction (%) and the budget margin:
    the :data:`BOUND_QUANTILE` quantile of ``compiler / predicted - 1`` (0 when nothing is
    under-predicted), by which a prediction is raised to bound the compiler's figure."""
    if not pairs:
        return {"n": 0}
    errs = np.array([p / r.device_bytes - 1 for r, p in pairs])
    out = error_summary([p for _, p in pairs], [r.device_bytes for r, _ in pairs])
    apes = np.abs(errs) * 100
    out["p90_ape"] = round(float(np.percentile(apes, 90)), 3)
    out["max_ape"] = round(float(apes.max()), 3)
    out["worst_under"] = round(float(min(errs.min(), 0.0)) * 100, 3)
    need = np.array([r.device_bytes / p - 1 if p > 0 else math.inf for r, p in pairs])
    out["budget_margin"] = round(max(float(np.quantile(need, BOUND_QUANTILE)), 0.0), 4)
    return out


def held_out_summary(model: MemoryModel, held: Sequence[tuple[MemoryRow, float]], *, fitted_on: str,
                     held_out: str) -> JsonObject:
    """The shipped form of a fitted model: one ``device_mem`` component (weight and internal terms
    summed) with its in-sample and held-out error (``held``: rows with their held-out predictions,
    :func:`leave_one_family_out`) and what it was fitted and checked on."""
    # what a budget is about: stages of a megabyte and more (kilobyte stages are mostly alignment)
    err = error_table([(r, p) for r, p in held if r.device_bytes >= MIN_STAGE_BYTES])
    err["min_stage_bytes"] = MIN_STAGE_BYTES
    err["all_sizes"] = error_table(held)
    w = dict(zip(WEIGHT_TERMS, model.weight, strict=True))
    i = dict(zip(internal_terms(model.toolkit), model.internal, strict=True))
    # the excess over the activation peak is a parametrised term of the cost model's features (its R)
    # (rkpart.cost_model.features: ATTX_TERM, FPEAK_TERM)
    param = {"attx16": attx_term(model.workspace_heads), "fpeak16": f"npu_fpeak16:{model.workspace_heads:g}"}
    terms = {"const": float(f"{w['const'] + i['const'] + OTHER_BYTES:.6g}"), "weight16": w["weight16"],
             **{param.get(t, t): c for t, c in i.items() if t != "const"},
             **{t: w[t] for t in LAYOUT_WEIGHT_TOOLKITS if w[t]}}
    return {"terms": terms, "unit": "bytes", "applies_to": "npu", "source": "compiler tables", "samples": model.samples,
            "fit_error": {"in_sample": dict(model.fit_error), "held_out": err, "fitted_on": fitted_on,
                          "held_out_on": held_out},
            "note": "the compiler's weight + internal memory of a stage, predicted from the IR before compiling: "
                    + ("fp16 weights, the NPU's peak with every attention fused (its workspace included), the "
                       "boundary tensors, per-head norms, repeated KV heads" if "fpeak16" in i else
                       "fp16 weights, the activation peak without attention score matrices, the attention's "
                       "workspace above it, per-head norms, repeated KV heads, the partial sums of "
                       "input-channel-tiled MatMuls") + " (rkpart.cost_model.device_model)"}


def budget_margin(fit_error: JsonMap | None) -> float | None:
    """The relative margin a budget adds to a predicted device memory (``held_out.budget_margin`` of a
    shipped predictor's ``fit_error``, :func:`error_table`); for a predictor without one, its held-out
    90th-percentile |error|; ``None``: it carries neither."""
    held = (fit_error or {}).get("held_out") or {}
    if not isinstance(held, Mapping):
        return None
    for key, scale in (("budget_margin", 1.0), ("p90_ape", 0.01)):
        v = held.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
            return float(v) * scale
    return None


def attx_term(heads: float) -> str:
    """The cost-model term of :func:`attention_excess` with ``heads`` of workspace: ``npu_attx16:<heads>``."""
    return f"npu_attx16:{heads:g}"


def within(model: MemoryModel, rows: Sequence[MemoryRow], tol: float) -> float:
    """Share of ``rows`` whose predicted device memory is within ``tol`` (relative) of the compiler's."""
    if not rows:
        return float("nan")
    return sum(abs(model.predict(r.features) / r.device_bytes - 1) <= tol for r in rows) / len(rows)


__all__ = [
    "FEATURES",
    "GELU_BUFFER",
    "LAYOUT_WEIGHT_TOOLKITS",
    "OTHER_BYTES",
    "SWISH_BUFFER",
    "WORKSPACE_HEADS",
    "GeluRegion",
    "MemoryFeatures",
    "MemoryModel",
    "MemoryRow",
    "attention_excess",
    "attx_term",
    "budget_margin",
    "cross_validate_heads",
    "error_table",
    "fit_memory_model",
    "gelu_regions",
    "head_norm_inputs",
    "held_out_summary",
    "internal_terms",
    "kv_folded_weights",
    "kv_repeats",
    "leave_one_family_out",
    "memory_features",
    "peak16",
    "row_gather_matrices",
    "score_tensors",
    "stage_memory_features",
    "stored_weight16",
    "swish_outputs",
    "tiled_matmul_outputs",
    "view_memory_features",
    "within",
]
