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
  graph holds (the old calibration counted them: 2.2-3.4x the compiler's figure at 1024 px);
* ``score16``: the largest score tensor, all heads;
* ``head16``: the largest score matrix of *one* head (its last two dimensions): the fused
  attention streams over heads a few at a time, so its workspace follows one head's
  ``tokens x keys`` matrix (measured on 2.5.0: about 4 heads' worth at 1024-4096 tokens, for 8
  and 16 heads alike), not the whole tensor;
* ``io16``: the stage's boundary tensors.

``weight = a0 + a1 * weight16`` and ``internal = b0 + b1 * act16 + b2 * score16 + b3 * head16 + b4 * io16``
are fitted per toolkit (non-negative, relative error) on compiled stages
(``bench/device_memory.py``); the fit records its in-sample error, the bench its held-out error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from rkpart.ir import ModelGraph, Subgraph, graph_of
from rkpart.ir.liveness import lifetimes
from rkpart.partitioner.plan import Plan
from rkpart.partitioner.verify import stage_onnx

#: what ``eval_memory()`` adds to weight + internal on a board (command buffers): not counted by
#: the build, not measured here (no board); the write-up's board figures bracket it: split's
#: peak is 3 % *below* the compiler's figure, fused's 11 % above (docs/cost-model.md)
OTHER_BYTES = 0
#: the features of :class:`MemoryFeatures`, in the order the JSON and the fit use them
FEATURES = ("weight16", "act16", "score16", "head16", "io16")
WEIGHT_TERMS = ("const", "weight16")
INTERNAL_TERMS = ("const", "act16", "score16", "head16", "io16")
_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
#: ops a score tensor may pass through between the scores MatMul and the Softmax (scale, mask, cast)
_SCORE_PATH = frozenset({"Mul", "Div", "Add", "Sub", "Where", "Cast", "Reshape", "Softmax", "LogSoftmax"})


@dataclass(frozen=True)
class MemoryFeatures:
    """A stage's memory as the NPU would hold it, in bytes (see the module docstring)."""

    weight16: int
    act16: int
    score16: int
    head16: int
    io16: int

    def value(self, name: str) -> float:
        return 1.0 if name == "const" else float(getattr(self, name))

    def to_json(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in FEATURES}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MemoryFeatures:
        return cls(**{k: int(d.get(k, 0)) for k in FEATURES})


def _bytes16(mg: ModelGraph, name: str) -> int:
    t = mg.tensor_types.get(name)
    if t is None:
        return 0
    if mg.is_float(name):
        return 2 * math.prod(t[1])
    return mg.nbytes(name)


def score_tensors(mg: ModelGraph, ops: Iterable[int]) -> set[str]:
    """Attention score tensors among the outputs of ``ops``: from a MatMul of two activations
    through scale/mask ops to a Softmax, and the Softmax's output up to the MatMul that reads it."""
    opset = set(ops)
    scores: set[str] = set()
    for i in opset:
        n = mg.nodes[i]
        if n.op_type != "MatMul" or any(mg.is_const_tensor(t) for t in n.input if t):
            continue
        path: list[str] = []
        t = n.output[0]
        for _ in range(8):  # scale, mask, cast, softmax: a short chain
            path.append(t)
            readers = [c for c in mg.consumers.get(t, []) if c in opset]
            if len(readers) != 1 or mg.nodes[readers[0]].op_type not in _SCORE_PATH:
                break
            r = mg.nodes[readers[0]]
            t = r.output[0]
            if r.op_type in _SOFTMAX:
                path.append(t)
                scores.update(path)
                break
    return scores


def view_memory_features(mg: ModelGraph, sub: Subgraph) -> MemoryFeatures:
    """:class:`MemoryFeatures` of the ops of ``sub`` as one NPU stage."""
    weight16 = sum(_bytes16(mg, t) for t in sub.weights)
    io16 = sum(_bytes16(mg, t) for t in (*sub.inputs, *sub.outputs))
    if not sub.ops:
        return MemoryFeatures(weight16=weight16, act16=0, score16=0, head16=0, io16=io16)
    scores = score_tensors(mg, sub.ops)
    life = lifetimes(mg, sub.ops, inputs=sub.inputs, outputs=sub.outputs, unread_alive=False)
    b16 = np.array([0 if t in scores else _bytes16(mg, t) for t in life.names], dtype=np.int64)
    start = np.maximum(life.born, 0)
    alive = life.last >= start
    diff = np.zeros(life.n + 1, dtype=np.int64)
    np.add.at(diff, start[alive], b16[alive])
    np.add.at(diff, life.last[alive] + 1, -b16[alive])
    act16 = int(np.cumsum(diff[: life.n]).max())
    score16 = max((_bytes16(mg, t) for t in scores), default=0)
    head16 = max((2 * math.prod(sh[-2:]) for t in scores if (sh := mg.shape(t)) and len(sh) >= 2), default=0)
    return MemoryFeatures(weight16=int(weight16), act16=act16, score16=int(score16), head16=int(head16),
                          io16=int(io16))


def stage_memory_features(folder: str | Path, stage: Any) -> MemoryFeatures:
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
    stage_features: Mapping[str, Any] = field(default_factory=dict)

    @property
    def device_bytes(self) -> int:
        return self.weight_bytes + self.internal_bytes

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "shape": self.shape, "strategy": self.strategy, "stage": self.stage,
                "toolkit": self.toolkit, "fit": self.fit, "features": self.features.to_json(),
                "weight_bytes": self.weight_bytes, "internal_bytes": self.internal_bytes,
                "stage_features": dict(self.stage_features)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MemoryRow:
        return cls(family=str(d["family"]), shape=str(d["shape"]), strategy=str(d["strategy"]),
                   stage=str(d["stage"]), toolkit=str(d["toolkit"]), fit=bool(d["fit"]),
                   features=MemoryFeatures.from_json(d["features"]), weight_bytes=int(d["weight_bytes"]),
                   internal_bytes=int(d["internal_bytes"]), stage_features=dict(d.get("stage_features") or {}))


@dataclass(frozen=True)
class MemoryModel:
    """Predicted compiler weight + internal memory of a stage, for one toolkit."""

    toolkit: str
    weight: tuple[float, ...]  # coefficients of WEIGHT_TERMS
    internal: tuple[float, ...]  # coefficients of INTERNAL_TERMS
    samples: int = 0
    #: share of the fit's own samples within +-10 % / +-20 % and the median |% error|
    fit_error: Mapping[str, Any] = field(default_factory=dict)
    #: the held-out error, when a bench measured it (``bench/device_memory.py``)
    held_out: Mapping[str, Any] = field(default_factory=dict)

    def predict_parts(self, f: MemoryFeatures) -> tuple[float, float]:
        w = sum(c * f.value(t) for t, c in zip(WEIGHT_TERMS, self.weight, strict=True))
        i = sum(c * f.value(t) for t, c in zip(INTERNAL_TERMS, self.internal, strict=True))
        return float(w), float(i)

    def predict(self, f: MemoryFeatures) -> float:
        """Predicted weight + internal bytes (what the compiler would report) of a stage."""
        w, i = self.predict_parts(f)
        return w + i

    def to_json(self) -> dict[str, Any]:
        return {"format": "rkpart-device-memory-model", "version": 1, "toolkit": self.toolkit,
                "weight": dict(zip(WEIGHT_TERMS, self.weight, strict=True)),
                "internal": dict(zip(INTERNAL_TERMS, self.internal, strict=True)), "samples": self.samples,
                "fit_error": dict(self.fit_error), "held_out": dict(self.held_out)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MemoryModel:
        if d.get("format") != "rkpart-device-memory-model" or d.get("version") != 1:
            raise ValueError("not an rkpart device-memory model (version 1)")

        def coefs(key: str, terms: Sequence[str]) -> tuple[float, ...]:
            m = d.get(key)
            if not isinstance(m, Mapping) or set(m) != set(terms):
                raise ValueError(f"device-memory model {key}: expected the terms {', '.join(terms)}")
            vals = tuple(float(m[t]) for t in terms)
            if not all(math.isfinite(v) and v >= 0 for v in vals):
                raise ValueError(f"device-memory model {key}: coefficients must be finite and >= 0")
            return vals

        return cls(toolkit=str(d["toolkit"]), weight=coefs("weight", WEIGHT_TERMS),
                   internal=coefs("internal", INTERNAL_TERMS), samples=int(d.get("samples", 0)),
                   fit_error=dict(d.get("fit_error") or {}), held_out=dict(d.get("held_out") or {}))


def fit_memory_model(rows: Sequence[MemoryRow], toolkit: str) -> MemoryModel:
    """Fit weight and internal memory separately on ``rows`` (non-negative, relative error)."""
    from rkpart.cost_model.model import error_summary, nnls_relative

    if not rows:
        raise ValueError(f"no compiled stages to fit a device-memory model for rknn-toolkit2 {toolkit}")
    xw = np.array([[r.features.value(t) for t in WEIGHT_TERMS] for r in rows])
    xi = np.array([[r.features.value(t) for t in INTERNAL_TERMS] for r in rows])
    cw = nnls_relative(xw, np.array([float(r.weight_bytes) for r in rows]))
    ci = nnls_relative(xi, np.array([float(r.internal_bytes) for r in rows]))
    model = MemoryModel(toolkit=toolkit, weight=tuple(float(f"{c:.6g}") for c in cw),
                        internal=tuple(float(f"{c:.6g}") for c in ci), samples=len(rows))
    err = error_summary([model.predict(r.features) for r in rows], [r.device_bytes for r in rows])
    return MemoryModel(toolkit=toolkit, weight=model.weight, internal=model.internal, samples=len(rows),
                       fit_error=err)


def held_out_summary(model: MemoryModel, held: Sequence[MemoryRow], *, fitted_on: str, held_out: str) -> dict[str, Any]:
    """The shipped form of a fitted model: one ``device_mem`` component (weight and internal terms
    summed) with its in-sample and held-out error and what it was fitted and checked on."""
    from rkpart.cost_model.model import error_summary

    apes = sorted(abs(model.predict(r.features) / r.device_bytes - 1) * 100 for r in held)
    err = error_summary([model.predict(r.features) for r in held], [r.device_bytes for r in held])
    if apes:
        err["p90_ape"] = round(float(np.percentile(apes, 90)), 3)
        err["max_ape"] = round(apes[-1], 3)
    w = dict(zip(WEIGHT_TERMS, model.weight, strict=True))
    i = dict(zip(INTERNAL_TERMS, model.internal, strict=True))
    terms = {"const": float(f"{w['const'] + i['const'] + OTHER_BYTES:.6g}"), "weight16": w["weight16"],
             **{t: i[t] for t in INTERNAL_TERMS if t != "const"}}
    return {"terms": terms, "unit": "bytes", "applies_to": "npu", "source": "compiler tables", "samples": model.samples,
            "fit_error": {"in_sample": dict(model.fit_error), "held_out": err, "fitted_on": fitted_on,
                          "held_out_on": held_out},
            "note": "the compiler's weight + internal memory of a stage, predicted from the IR before compiling: "
                    "fp16 weights, the activation peak without attention score matrices, the largest score "
                    "matrix, the boundary tensors (rkpart.cost_model.device_model)"}


def within(model: MemoryModel, rows: Sequence[MemoryRow], tol: float) -> float:
    """Share of ``rows`` whose predicted device memory is within ``tol`` (relative) of the compiler's."""
    if not rows:
        return float("nan")
    return sum(abs(model.predict(r.features) / r.device_bytes - 1) <= tol for r in rows) / len(rows)


__all__ = ["FEATURES", "OTHER_BYTES", "MemoryFeatures", "MemoryModel", "MemoryRow", "fit_memory_model",
           "held_out_summary", "memory_features", "score_tensors", "stage_memory_features", "view_memory_features",
           "within"]
