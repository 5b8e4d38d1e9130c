"""Features of a subgraph that a cost model predicts from.

A subgraph is a :class:`rkpart.ir.Subgraph` view: of a stage file of a plan, loaded as its
own graph (:func:`stage_features`), or of a set of ops of a loaded model that a candidate
partition would cut out (:func:`group_features`).  Boundaries, constants, weight bytes and
tensor sizes are the graph's answers; both paths end in :func:`view_features`, so a
candidate's features equal those of the stage it becomes.

Everything is counted from static shapes, never by running the graph:

* ``macs``: multiply-accumulates of MatMul / Gemm / Conv / ConvTranspose with a weight
  operand; ``act_macs`` the same for MatMul of two activations (attention scores and
  attention-weighted values), which hardware runs at a different efficiency;
* ``weight_bytes``: initializers the subgraph reads (constant closures included);
* ``in_bytes`` / ``out_bytes``: boundary activations;
* ``peak_bytes``: the largest sum of live activation bytes over the nodes in
  topological order (a tensor is live from its producer to its last consumer inside the
  subgraph; boundary inputs from the start, boundary outputs to the end), as
  :func:`rkpart.ir.liveness.peak_bytes` computes it;
* ``elementwise_elems``: output elements of every op that is neither weighted nor a pure
  re-labelling (Reshape, Transpose counts: it moves data); reductions count their input;
* ``moved_bytes``: activation bytes read and written by all ops plus the weights read once;
* ``mac_bytes``: bytes read and written by the MAC ops (both operands, weights included, and
  the result); ``elementwise_bytes``: activation bytes read and written by every other op that
  moves data (the ``elementwise_elems`` ops).  The two split ``moved_bytes`` by who moves it: a
  matrix product packs and streams its operands at a different cost per byte than an
  elementwise op streams its tensors (on ONNX Runtime's CPU kernels a MatMul byte costs several
  times an elementwise byte), and a stage's mix of the two changes with tokens and hidden size;
* ``cpu_ops`` / ``cpu_elems``: layers the toolkit placed on the CPU (from a compile
  result), and the output elements of the ONNX nodes they came from;
* ``file_bytes``: the ``.rknn`` size when the stage was compiled, else ``weight_bytes``
  (what the runtime has to read and upload).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import onnx

from rkpart.cost_model.device_model import attention_excess, peak16, view_memory_features
from rkpart.ir import ModelGraph, OpNode, Subgraph, TensorType, graph_of, nbytes
from rkpart.ir.liveness import peak_bytes, stage_lifetimes
from rkpart.ir.ops import MAC_OPS, MATMUL_OPS, REDUCE_OPS, RELABEL_OPS
from rkpart.ir.work import node_macs, numel
from rkpart.plan.plan import Artifact, Stage
from rkpart.plan.verify import stage_onnx
from rkpart.types import JsonMap, JsonObject

#: derived terms a model may use besides :data:`NUMERIC`: ``const`` (1 per stage),
#: ``all_macs`` (weighted + activation MACs), ``io_bytes`` (boundary in + out), and
#: ``npu_peak16:R`` (:func:`rkpart.cost_model.device_model.peak16` with ``R`` heads of workspace)
DERIVED = ("const", "all_macs", "io_bytes")
PEAK_TERM = "npu_peak16:"
#: ``npu_attx16:R``: how far the attention's peak with ``R`` heads of workspace rises above ``act16``
#: (:func:`rkpart.cost_model.device_model.attention_excess`)
ATTX_TERM = "npu_attx16:"
#: ``npu_fpeak16:R``: ``npu_peak16:R`` of the features with every attention fused, a masked one too (``fact16``,
#: ``fatt16``, ``fhead16``: 2.3.0's device memory)
FPEAK_TERM = "npu_fpeak16:"
#: the parametrised terms (``PREFIX`` + a number of heads)
PARAM_TERMS = (PEAK_TERM, ATTX_TERM, FPEAK_TERM)
#: the terms of the glue design row of a round (:mod:`rkpart.cost_model.rounds`), not of a stage:
#: ``const``: per stage and pass (feeding one stage's outputs to the next); ``cycle``: per
#: load-to-release cycle of a stage (creating and dropping its runner: every pass for a
#: per-stage NPU stage, once a round otherwise); ``round``: once per round.  Measured on the
#: fit profiles of bench/selection_regret.py: what CPU time the stages' own calls leave of a
#: round is ~0.4 ms per stage and pass, ~0.2-0.4 ms more per per-stage cycle and ~1 ms per
#: round; a constant per stage and pass alone over-predicted split plans (many stages) and
#: under-predicted fused ones by up to 15-20 %.  Boundary bytes (``io_bytes``) and cold weights
#: (``weight_bytes``) were tried too and over-predicted split plans at 1024 tokens by 20-40 %.
GLUE_TERMS = ("const", "cycle", "round")


@dataclass(frozen=True)
class Features:
    """Features of one stage (or, with ``stages > 1``, the sum over several stages).

    ``op_counts`` is sorted by op type so that equal subgraphs give equal objects.
    """

    device: str
    weight_bytes: int = 0
    file_bytes: int = 0
    macs: int = 0
    act_macs: int = 0
    in_bytes: int = 0
    out_bytes: int = 0
    peak_bytes: int = 0
    elementwise_elems: int = 0
    moved_bytes: int = 0
    mac_bytes: int = 0
    elementwise_bytes: int = 0
    nodes: int = 0
    cpu_ops: int = 0
    cpu_elems: int = 0
    stages: int = 1
    #: memory as the NPU holds it (:mod:`rkpart.cost_model.device_model`): fp16 weights, the live
    #: activation peak without attention score matrices, the largest score matrix, the boundary
    weight16: int = 0
    act16: int = 0
    score16: int = 0
    head16: int = 0
    io16: int = 0
    att16: int = 0
    #: the activations normalised per attention head (q/k norms; the compiler's exNorm buffers)
    hnorm16: int = 0
    #: the key/value heads repeated for grouped-query attention (the compiler's repeat buffers)
    gqa16: int = 0
    #: the outputs of the MatMuls the compiler tiles by input channels (their partial sums' buffers)
    psum16: int = 0
    #: the layout constants the compiler stores on some toolkits: a key/value weight folded with its head repeat,
    #: the row-gather matrices of chunked masked attention (:data:`rkpart.cost_model.device_model.WEIGHT_TERMS`)
    kvfold16: int = 0
    rowgather16: int = 0
    #: ``act16``, ``att16``, ``head16`` with every attention fused, a masked one too (2.3.0's device memory)
    fact16: int = 0
    fatt16: int = 0
    fhead16: int = 0
    rknn_bytes: int | None = None
    op_counts: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    #: the compiler's own plan when the stage was compiled (``artifacts[].compiler``): weight +
    #: internal memory, Σ Total cycles, Σ RW bytes; ``None``: not compiled (or the log had none)
    compiled_mem_bytes: int | None = None
    compiled_cycles: int | None = None
    compiled_rw_bytes: int | None = None

    def value(self, name: str) -> float:
        """A numeric feature by name; ``"const"`` is 1 per stage (fixed per-call overhead)."""
        if name == "const":
            return float(self.stages)
        if name == "all_macs":
            return float(self.macs + self.act_macs)
        if name == "io_bytes":
            return float(self.in_bytes + self.out_bytes)
        if name.startswith(PEAK_TERM):  # npu_peak16:R, the NPU's activation peak with R heads of workspace
            return peak16(self.act16, self.att16, self.head16, float(name[len(PEAK_TERM):]))
        if name.startswith(ATTX_TERM):  # npu_attx16:R, the attention's excess over the activation peak
            return attention_excess(self.act16, self.att16, self.head16, float(name[len(ATTX_TERM):]))
        if name.startswith(FPEAK_TERM):  # npu_fpeak16:R, the peak with every attention fused
            return peak16(self.fact16, self.fatt16, self.fhead16, float(name[len(FPEAK_TERM):]))
        return float(getattr(self, name))

    def to_json(self) -> JsonObject:
        d: JsonObject = {"device": self.device}
        for k in NUMERIC:
            d[k] = getattr(self, k)
        d["rknn_bytes"] = self.rknn_bytes
        d["op_counts"] = dict(self.op_counts)
        for k in _COMPILED:
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d

    @classmethod
    def from_json(cls, d: JsonMap) -> Features:
        kw: JsonObject = {k: int(d.get(k, 0)) for k in NUMERIC}
        for k in _COMPILED:
            kw[k] = None if d.get(k) is None else int(d[k])
        return cls(device=str(d["device"]), rknn_bytes=None if d.get("rknn_bytes") is None else int(d["rknn_bytes"]),
                   op_counts=tuple(sorted((str(k), int(v)) for k, v in dict(d.get("op_counts", {})).items())), **kw)


#: numeric features (the ``int`` fields of :class:`Features`), in the order the JSON and the tables show them
NUMERIC: tuple[str, ...] = tuple(f.name for f in fields(Features) if f.type == "int")
#: the compiler's figures (optional: only a compiled stage has them)
_COMPILED = ("compiled_mem_bytes", "compiled_cycles", "compiled_rw_bytes")


def _nbytes(tt: TensorType | None) -> int:
    return 0 if tt is None else nbytes(*tt)


def subgraph_features(
    nodes: Sequence[OpNode],
    types: Mapping[str, TensorType],
    *,
    device: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    weight_bytes: int,
    peak_bytes: int,
    const_tensors: frozenset[str] | set[str] = frozenset(),
    artifact: Artifact | None = None,
) -> Features:
    """Features of ``nodes`` (in topological order) with boundary ``inputs``/``outputs``.

    ``const_tensors`` are tensors that hold weights or constants (not activations); they
    are left out of activation counts and decide whether a MatMul is weighted.
    ``peak_bytes`` is the graph's answer (:func:`rkpart.ir.liveness.peak_bytes`).
    """
    macs = act_macs = ew = moved = mac_bytes = ew_bytes = 0
    counts: Counter[str] = Counter()

    def is_const(t: str) -> bool:
        return t in const_tensors

    for n in nodes:
        counts[n.op_type] += 1
        outs = [t for t in n.outputs if t]
        out_elems = sum(numel(types[t][1]) for t in outs if t in types)
        dyn_in = [t for t in n.inputs if t and not is_const(t)]
        in_bytes = sum(_nbytes(types.get(t)) for t in dyn_in)
        out_bytes = sum(_nbytes(types.get(t)) for t in outs)
        if n.op_type in MAC_OPS:
            m = node_macs(n, types)
            if n.op_type in MATMUL_OPS:
                weighted = any(is_const(t) for t in n.inputs if t)
            else:
                weighted = len(n.inputs) > 1 and is_const(n.inputs[1])
            if weighted:
                macs += m
            else:
                act_macs += m
            mac_bytes += sum(_nbytes(types.get(t)) for t in n.inputs if t) + out_bytes
        elif n.op_type not in RELABEL_OPS:
            ew_bytes += in_bytes + out_bytes
            if n.op_type in REDUCE_OPS and dyn_in:
                ew += max(out_elems, max(numel(types[t][1]) for t in dyn_in if t in types) if any(
                    t in types for t in dyn_in) else 0)
            else:
                ew += out_elems
        if n.op_type not in RELABEL_OPS:
            moved += in_bytes + out_bytes
    cpu_names = _cpu_node_names(artifact)
    cpu_elems = sum(numel(types[t][1]) for n in nodes if n.name in cpu_names for t in n.outputs if t in types)
    rknn = artifact.size_bytes if artifact is not None else None
    return Features(
        device=device,
        weight_bytes=int(weight_bytes),
        file_bytes=int(rknn if rknn is not None else weight_bytes),
        macs=int(macs),
        act_macs=int(act_macs),
        in_bytes=int(sum(_nbytes(types.get(t)) for t in inputs if not is_const(t))),
        out_bytes=int(sum(_nbytes(types.get(t)) for t in outputs)),
        peak_bytes=int(peak_bytes),
        elementwise_elems=int(ew),
        moved_bytes=int(moved + weight_bytes),
        mac_bytes=int(mac_bytes),
        elementwise_bytes=int(ew_bytes),
        nodes=len(nodes),
        cpu_ops=len(artifact.cpu_ops) if artifact is not None else 0,
        cpu_elems=int(cpu_elems),
        stages=1,
        rknn_bytes=rknn,
        op_counts=tuple(sorted(counts.items())),
    )


def _cpu_node_names(artifact: Artifact | None) -> set[str]:
    # layer names look like "Erf:/block/Erf"; the part after the first colon is the ONNX
    # node name the layer came from (fused layers keep one of their nodes' names)
    if artifact is None:
        return set()
    return {n.partition(":")[2] or n for n in artifact.cpu_ops}


# -- front ends ----------------------------------------------------------------------------


def model_features(model: onnx.ModelProto, *, device: str, artifact: Artifact | None = None,
                   path: str | Path = "<stage>") -> Features:
    """Features of a whole (stage) model, weights not loaded: the graph :mod:`rkpart.ir` builds of it."""
    mg = graph_of(model, path)
    return view_features(mg, mg.subgraph(mg.ops.nodes), device=device, artifact=artifact)


def stage_features(folder: str | Path, stage: Stage) -> Features:
    """Features of one stage of a plan folder (its ONNX file; its ``.rknn`` artifact if any)."""
    path = stage_onnx(Path(folder), stage)  # confined, a regular file, sha256 as in plan.json
    model = onnx.load_model(str(path), format="protobuf", load_external_data=False)
    art = stage.artifact("rknn") if stage.device == "npu" else None
    f = model_features(model, device=stage.device, artifact=art, path=path)
    # the plan's own weight count is authoritative (it knows what went to external data)
    return _replace(f, weight_bytes=stage.weight_bytes,
                    file_bytes=art.size_bytes if art is not None else stage.weight_bytes,
                    moved_bytes=f.moved_bytes - f.weight_bytes + stage.weight_bytes)


def group_features(mg: ModelGraph, ops: Iterable[int], *, device: str) -> Features:
    """Features of the ops ``ops`` of a :class:`~rkpart.ir.ModelGraph` as one stage."""
    return view_features(mg, mg.subgraph(ops), device=device)


def view_features(mg: ModelGraph, sub: Subgraph, *, device: str, artifact: Artifact | None = None) -> Features:
    """Features of the :class:`~rkpart.ir.Subgraph` ``sub`` of ``mg``: the one place both front ends meet."""
    life = stage_lifetimes(mg, sub)  # once: the fp32 peak and the NPU's fp16 counts both read it
    f = subgraph_features([mg.op(i) for i in sub.ops], mg.tensor_types, device=device, inputs=sub.inputs,
                          outputs=sub.outputs, weight_bytes=sub.weight_bytes, peak_bytes=peak_bytes(mg, sub, life),
                          const_tensors=sub.const_tensors, artifact=artifact)
    mem = view_memory_features(mg, sub, life)
    cp = artifact.compiler if artifact is not None else None
    return _replace(f, weight16=mem.weight16, act16=mem.act16, score16=mem.score16, head16=mem.head16, io16=mem.io16,
                    att16=mem.att16, hnorm16=mem.hnorm16, gqa16=mem.gqa16, psum16=mem.psum16,
                    kvfold16=mem.kvfold16, rowgather16=mem.rowgather16, fact16=mem.fact16, fatt16=mem.fatt16,
                    fhead16=mem.fhead16,
                    compiled_mem_bytes=None if cp is None else cp.device_mem_bytes,
                    compiled_cycles=None if cp is None else cp.cycles_total,
                    compiled_rw_bytes=None if cp is None else cp.rw_bytes)


def _replace(f: Features, **changes: Any) -> Features:
    import dataclasses

    return dataclasses.replace(f, **changes)


def combine(parts: Sequence[Features], device: str | None = None) -> Features:
    """The sum of several stages' features (``peak_bytes`` is the largest, not the sum)."""
    if not parts:
        return Features(device=device or "npu", stages=0)
    counts: Counter[str] = Counter()
    for p in parts:
        counts.update(dict(p.op_counts))
    kw: JsonObject = {k: sum(getattr(p, k) for p in parts) for k in NUMERIC}
    # a peak of one stage at a time, not a sum
    for k in ("peak_bytes", "act16", "att16", "score16", "head16", "fact16", "fatt16", "fhead16"):
        kw[k] = max(getattr(p, k) for p in parts)
    for k in _COMPILED:
        vals = [getattr(p, k) for p in parts]
        kw[k] = None if any(v is None for v in vals) else sum(vals)
    rk = [p.rknn_bytes for p in parts]
    return Features(device=device or parts[0].device, rknn_bytes=None if any(r is None for r in rk) else sum(
        r for r in rk if r is not None), op_counts=tuple(sorted(counts.items())), **kw)


__all__ = ["NUMERIC", "Features", "combine", "group_features", "model_features", "stage_features",
           "subgraph_features", "view_features"]
