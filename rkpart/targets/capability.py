"""What one toolkit can run on the NPU, as the grouping asks it: static support plus what builds taught.

A :class:`Capability` is handed to the partitioner before it writes a plan (torch.fx's
``OperatorSupport`` before its ``CapabilityBasedPartitioner``; ONNX Runtime's ``GetCapability``
before it partitions).  It answers one question per op -- *why must this op not be in an NPU
stage?* -- from three sources:

* the toolkit's operator table (:class:`rkpart.targets.base.ToolkitCaps`): a custom-domain op
  cannot be loaded at all, and the ops measured on the CPU (``Support.CPU``) stay there;
* the placements **learned from builds**: every layer a toolkit put on the CPU inside an NPU
  stage is recorded per toolkit as a :class:`PlacementPattern` (op type, element type, input
  ranks), next to the build cache (:mod:`rkpart.compile.learned`), and asked here for every
  later partition of any model;
* the ``npu`` rewrites of :mod:`rkpart.targets.rewrites` rescue an op: the partitioner applies
  them to the stage it would propose and keeps on the NPU only what they remove (a rewrite
  written for one exporter's spelling that misses another's leaves the op to the host).

An op that reads or writes an element type the toolkit has no type for (bfloat16, float8, int4,
complex, string) cannot be built at all, whatever its op type: it leaves NPU stages too.

Ops the table marks "Not Supported" (``Support.UNLISTED``) are not moved: the toolkit builds
most of them on the NPU (rewritten), and the ones it does not are learned by the first build.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rkpart.ir.graph import OpNode
from rkpart.targets.base import Support, ToolkitCaps

#: the element types (numpy names, :func:`rkpart.ir.tensors`) an RKNN build can hold: the toolkit
#: converts every tensor through numpy's own types. Measured: a stage with a bfloat16 tensor
#: (Kandinsky 5's attention casts q/k to bfloat16 and back; TorchScript and dynamo) fails to build
#: on 2.5.0 in ``fold_constant`` ("RuntimeError: No corresponding Numpy type for Tensor Type");
#: float8, int4, complex and string tensors are outside the same set (not measured)
TOOLKIT_DTYPES = frozenset({"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                            "float16", "float32", "float64"})


@dataclass(frozen=True, order=True)
class PlacementPattern:
    """The shape class of an op as a toolkit's placement decision depends on it.

    ``dtype``: the element type of the op's first input as the ONNX graph has it (``float32``;
    the toolkit builds in float16 either way); ``ranks``: the rank of every input, ``-1`` for
    an absent optional input or an unknown rank; ``consts``: which inputs are constants (a
    ``Gather`` of a constant table by data indices runs on the CPU, a ``Gather`` of data by
    constant indices on the NPU: measured, ``scripts/measure_ops.py``).  Sizes are left out on
    purpose: a placement learned on a tiny export must hold for the full-size model.
    """

    op_type: str
    dtype: str
    ranks: tuple[int, ...]
    domain: str = ""
    consts: tuple[bool, ...] = ()

    def key(self) -> str:
        """``ScatterND/float32/4,c2,4`` (``c``: a constant input): the pattern as one short, stable name."""
        dom = f"{self.domain}." if self.domain else ""
        ranks = ",".join(("c" if k < len(self.consts) and self.consts[k] else "") + str(r)
                         for k, r in enumerate(self.ranks))
        return f"{dom}{self.op_type}/{self.dtype or '?'}/{ranks}"

    def describe(self) -> str:
        ranks = ", ".join(("-" if r < 0 else str(r)) + (" const" if k < len(self.consts) and self.consts[k] else "")
                          for k, r in enumerate(self.ranks))
        return f"{self.op_type} ({self.dtype or 'unknown type'}, input ranks {ranks})"

    def to_json(self) -> dict[str, Any]:
        return {"op_type": self.op_type, "domain": self.domain, "dtype": self.dtype, "ranks": list(self.ranks),
                "consts": list(self.consts)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PlacementPattern:
        """Raises ``KeyError``/``TypeError``/``ValueError`` on a malformed row (the store skips it)."""
        ranks, consts = d["ranks"], d.get("consts", [])
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise ValueError("ranks must be a list of integers")
        if not isinstance(consts, list) or not all(isinstance(c, bool) for c in consts) or len(consts) > len(ranks):
            raise ValueError("consts must be a list of booleans, one per input")
        op_type, dtype, domain = d["op_type"], d["dtype"], d.get("domain", "")
        if not all(isinstance(x, str) for x in (op_type, dtype, domain)) or not op_type:
            raise ValueError("op_type, dtype and domain must be strings")
        return cls(op_type=op_type, dtype=dtype, ranks=tuple(ranks), domain=domain, consts=tuple(consts))


@dataclass(frozen=True)
class Capability:
    """What ``caps.version`` runs on the NPU for ``target``, with the placements learned so far.

    ``rewrites``: whether the build will apply rkpart's ``npu`` rewrites (``rkpart compile
    --no-rewrites`` does not); without them no op is rescued by a rewrite.
    """

    target: str
    caps: ToolkitCaps
    learned: frozenset[PlacementPattern] = frozenset()
    rewrites: bool = True

    @property
    def toolkit(self) -> str:
        return self.caps.version

    def with_learned(self, patterns: Iterable[PlacementPattern]) -> Capability:
        return Capability(self.target, self.caps, self.learned | frozenset(patterns), self.rewrites)

    def reason(self, node: OpNode, pattern: PlacementPattern, dtypes: Collection[str] = ()) -> str | None:
        """Why ``node`` (of shape class ``pattern``) must leave NPU stages, or ``None`` if it may stay.

        ``dtypes``: the element types of its inputs and outputs (numpy names; unknown ones left out).
        Only facts: an element type no build can hold, an op that cannot be loaded, an op measured
        on the CPU, or a pattern a build put on the CPU.  Whether a rewrite rescues it is the
        partitioner's question (it applies the rewrites to the stage it proposes).
        """
        foreign = sorted(set(dtypes) - TOOLKIT_DTYPES)
        if foreign:
            return (f"rknn-toolkit2 {self.toolkit} has no {'/'.join(foreign)} type (a build with such a tensor "
                    "fails: 'No corresponding Numpy type for Tensor Type')")
        rule = self.caps.node(node)
        if rule.support is Support.NONE:
            return f"rknn-toolkit2 {self.toolkit} cannot load it ({rule.note})"
        if rule.support is Support.CPU:
            return f"rknn-toolkit2 {self.toolkit} runs {node.op_type} on the CPU ({rule.note})"
        form = self.caps.cpu_forms.get(node.op_type)
        if form is not None and pattern.consts[:len(form[0])] == form[0]:
            return f"rknn-toolkit2 {self.toolkit}: {form[1]}"
        if pattern in self.learned:
            return (f"rknn-toolkit2 {self.toolkit} placed {pattern.describe()} on the CPU in an earlier build "
                    "(learned placement)")
        return None

    def to_json(self) -> dict[str, Any]:
        """What the plan records of the capability it was partitioned with."""
        return {"target": self.target, "toolkit": self.toolkit, "rewrites": self.rewrites,
                "learned_patterns": len(self.learned)}


__all__ = ["TOOLKIT_DTYPES", "Capability", "PlacementPattern"]
