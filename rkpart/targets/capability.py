"""What one toolkit can run on the NPU, as the grouping asks it: static support plus what builds taught.

A :class:`Capability` is handed to the partitioner before it writes a plan (torch.fx's
``OperatorSupport`` before its ``CapabilityBasedPartitioner``; ONNX Runtime's ``GetCapability``
before it partitions).  It answers one question per op -- *why must this op not be in an NPU
stage?* -- from three sources:

* the toolkit's operator table (:class:`rkpart.targets.base.ToolkitCaps`): a custom-domain op
  cannot be loaded at all, and the ops measured on the CPU (``Support.CPU``) stay there;
* the placements **learned from builds**: every layer a toolkit put on the CPU inside an NPU
  stage is recorded per toolkit as a :class:`PlacementPattern` (op type, element type, input
  ranks, which dims are 1, the sizes of every input and output, the layout attributes), next to
  the build cache (:mod:`rkpart.grouping.learned`), and asked here for every later partition of
  any model; a pattern a later build ran on the NPU is no longer asked (contradicted);
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
from dataclasses import dataclass, replace
from typing import Any

from rkpart.ir.graph import OpNode
from rkpart.targets.base import Support, ToolkitCaps
from rkpart.types import JsonMap, JsonObject

#: the element types (numpy names, :func:`rkpart.ir.tensors`) an RKNN build can hold: the toolkit
#: converts every tensor through numpy's own types. Measured: a stage with a bfloat16 tensor
#: (Kandinsky 5's attention casts q/k to bfloat16 and back; TorchScript and dynamo) fails to build
#: on 2.5.0 in ``fold_constant`` ("RuntimeError: No corresponding Numpy type for Tensor Type");
#: float8, int4, complex and string tensors are outside the same set (not measured)
TOOLKIT_DTYPES = frozenset({"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                            "float16", "float32", "float64"})


#: the forms a :class:`PlacementPattern` may carry ("" : none)
FORMS = frozenset({"", "reverse"})


@dataclass(frozen=True, order=True)
class PlacementPattern:
    """The shape class of an op as a toolkit's placement decision depends on it.

    ``dtype``: the element type of the op's first input as the ONNX graph has it (``float32``;
    the toolkit builds in float16 either way); ``ranks``: the rank of every input, ``-1`` for
    an absent optional input or an unknown rank; ``consts``: which inputs are constants (a
    ``Gather`` of a constant table by data indices runs on the CPU, a ``Gather`` of data by
    constant indices on the NPU: measured, ``scripts/measure_ops.py``); ``dims``: the unit-dim
    mask of every input, then ``>``, then of every output (:func:`unit_mask`: ``1`` a dim of
    size 1, ``n`` a larger one, ``?`` unknown; ``-`` an unknown rank); ``shapes``: the sizes
    themselves, in the same layout (:func:`shapes_class`); ``attrs``: the op's attributes that
    decide its layout (:func:`attrs_class`: a Transpose's ``perm``, an axis).

    Sizes and attributes are part of the class (store version 5): the toolkit's layout
    decisions turn on them.  Measured on real widths (issue 50): a head-dim-88 family's head
    ``Transpose`` ran on the CPU on 2.5.0 while a head-dim-72 family's of the same rank, type
    and unit dims ran on the NPU; keyed without sizes ("Transpose, rank 4"), the first family's
    build took every head ``Transpose`` of every later model off the NPU (a head-dim-72
    family's ``split`` went from 6 to 10 NPU stages, 100 % -> 86.4 % of its block matmul work
    on the NPU).  So a placement learned on one export holds for ops of exactly its shapes and
    layout, and a later build of another size learns its own.
    """

    op_type: str
    dtype: str
    ranks: tuple[int, ...]
    domain: str = ""
    consts: tuple[bool, ...] = ()
    dims: str = ""
    #: a form the op's constant inputs give it that the placement turns on (:data:`FORMS`):
    #: ``reverse``, a ``Slice`` with a negative step (``torch.flip``), which 2.5.0 runs on the
    #: CPU while a forward ``Slice`` of the same ranks and dims runs on the NPU (Sana-WM: a class
    #: learned from its flips took the camera attention's forward Slice off the NPU)
    form: str = ""
    #: every input's and output's sizes (:func:`shapes_class`); ``""``: not known
    shapes: str = ""
    #: the op's layout attributes (:func:`attrs_class`), ``""``: none
    attrs: str = ""
    #: its data neighbours (:func:`around_class`): the op types producing its non-constant inputs, in order,
    #: then ``>`` and the op types reading its outputs; ``*`` where the graph it was read from ends (a stage
    #: input or output: the model has an op there, unknown to the stage), and matches any (:func:`find_learned`).
    #: Measured on real widths (store version 6): Lumina-Image-2.0's masked Softmax (1,24,1280,1280) ran on the
    #: CPU on 2.5.0 because the mask's Add stood between the scores and it (the compiler fused no attention);
    #: Ovis-Image's joint-attention Softmax of exactly those sizes, read from a MatMul, runs on the NPU: keyed
    #: without its neighbours, what Lumina2's build taught moved Ovis's attention Softmax to the host
    #: (``scripts/store_crosscheck.py``)
    around: str = ""

    def key(self) -> str:
        """``ScatterND/float32/4,c2,4`` (``c``: a constant input), then ``/`` and :attr:`dims` when known:
        the pattern as one short, stable name."""
        dom = f"{self.domain}." if self.domain else ""
        ranks = ",".join(("c" if k < len(self.consts) and self.consts[k] else "") + str(r)
                         for k, r in enumerate(self.ranks))
        return (f"{dom}{self.op_type}/{self.dtype or '?'}/{ranks}" + (f"/{self.dims}" if self.dims else "")
                + (f"/{self.form}" if self.form else "") + (f"/{self.shapes}" if self.shapes else "")
                + (f"/{self.attrs}" if self.attrs else "") + (f"/{self.around}" if self.around else ""))

    def describe(self) -> str:
        ranks = ", ".join(("-" if r < 0 else str(r)) + (" const" if k < len(self.consts) and self.consts[k] else "")
                          for k, r in enumerate(self.ranks))
        dims = f"; unit dims {self.dims}" if self.dims else ""
        form = f"; {self.form}" if self.form else ""
        shapes = f"; shapes {self.shapes}" if self.shapes else ""
        attrs = f"; {self.attrs}" if self.attrs else ""
        around = f"; between {self.around.replace('>', ' and ')}" if self.around else ""
        return (f"{self.op_type} ({self.dtype or 'unknown type'}, input ranks {ranks}{dims}{form}{shapes}{attrs}"
                f"{around})")

    def to_json(self) -> JsonObject:
        return {"op_type": self.op_type, "domain": self.domain, "dtype": self.dtype, "ranks": list(self.ranks),
                "consts": list(self.consts), "dims": self.dims, "form": self.form, "shapes": self.shapes,
                "attrs": self.attrs, "around": self.around}

    @classmethod
    def from_json(cls, d: JsonMap) -> PlacementPattern:
        """Raises ``KeyError``/``TypeError``/``ValueError`` on a malformed row (the store skips it)."""
        ranks, consts = d["ranks"], d.get("consts", [])
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise ValueError("ranks must be a list of integers")
        if not isinstance(consts, list) or not all(isinstance(c, bool) for c in consts) or len(consts) > len(ranks):
            raise ValueError("consts must be a list of booleans, one per input")
        op_type, dtype, domain, dims = d["op_type"], d["dtype"], d.get("domain", ""), d["dims"]
        if not all(isinstance(x, str) for x in (op_type, dtype, domain, dims)) or not op_type:
            raise ValueError("op_type, dtype, domain and dims must be strings")
        if len(dims) > 512 or set(dims) - set("1n?-0;>"):
            raise ValueError("dims must be unit-dim masks")
        form = d.get("form", "")
        if form not in FORMS:
            raise ValueError(f"form must be one of {sorted(FORMS)}")
        shapes, attrs = d.get("shapes", ""), d.get("attrs", "")
        if not isinstance(shapes, str) or len(shapes) > 2048 or set(shapes) - set("0123456789,;>?-"):
            raise ValueError("shapes must be sizes")
        if not isinstance(attrs, str) or len(attrs) > 1024 or not attrs.isprintable():
            raise ValueError("attrs must be a short printable string")
        around = d.get("around", "")
        if not isinstance(around, str) or len(around) > 1024 or not around.isprintable() or around.count(">") > 1:
            raise ValueError("around must be op types, '>' between producers and readers")
        return cls(op_type=op_type, dtype=dtype, ranks=tuple(ranks), domain=domain, consts=tuple(consts), dims=dims,
                   form=form, shapes=shapes, attrs=attrs, around=around)


def unit_mask(shape: tuple[Any, ...] | None) -> str:
    """``(1, 77, 2048) -> "1nn"``: which dims of a shape are 1 (``1``), 0 (``0``), larger (``n``) or
    unknown (``?``); ``-`` for an unknown rank, ``""`` for a scalar."""
    if shape is None:
        return "-"
    return "".join("1" if d == 1 else "0" if d == 0 else "n" if isinstance(d, int) and d > 1 else "?" for d in shape)


def dims_class(in_shapes: Iterable[tuple[Any, ...] | None], out_shapes: Iterable[tuple[Any, ...] | None]) -> str:
    """:attr:`PlacementPattern.dims` of an op with these input and output shapes (``None``: unknown)."""
    return ";".join(unit_mask(s) for s in in_shapes) + ">" + ";".join(unit_mask(s) for s in out_shapes)


def around_class(producers: Iterable[str], readers: Iterable[str]) -> str:
    """:attr:`PlacementPattern.around`: ``["MatMul", "*"], ["MatMul", "MatMul"] -> "MatMul,*>MatMul"``
    (producers in input order, readers sorted and unique; ``*`` where the graph ends)."""
    return ",".join(producers) + ">" + ",".join(sorted(set(readers)))


def _around_matches(a: str, b: str) -> bool:
    """Two :attr:`PlacementPattern.around` classes that may be one op's: equal where both graphs see the
    neighbour, ``*`` (the edge of a stage) standing for any producer, and for any further readers."""
    if a == b or not a or not b:
        return a == b
    ap, _, ar = a.partition(">")
    bp, _, br = b.partition(">")
    aps, bps = ap.split(",") if ap else [], bp.split(",") if bp else []
    if len(aps) != len(bps) or any(x != y and "*" not in (x, y) for x, y in zip(aps, bps, strict=True)):
        return False
    ars, brs = set(filter(None, ar.split(","))), set(filter(None, br.split(",")))
    a_open, b_open = "*" in ars, "*" in brs
    ars.discard("*")
    brs.discard("*")
    if a_open and b_open:
        return True
    if a_open:
        return ars <= brs
    if b_open:
        return brs <= ars
    return ars == brs


def find_learned(learned: Iterable[PlacementPattern], pattern: PlacementPattern) -> PlacementPattern | None:
    """The learned pattern ``pattern`` (an op's, read from a model or a stage) is an instance of: equal in
    everything but :attr:`~PlacementPattern.around`, whose ``*`` (a stage's edge, on either side) matches any
    neighbour; ``None`` when none is."""
    if isinstance(learned, set | frozenset) and pattern in learned:
        return pattern
    bare = replace(pattern, around="")
    for p in learned:
        if p.op_type == pattern.op_type and replace(p, around="") == bare and _around_matches(p.around, pattern.around):
            return p
    return None


def shapes_class(in_shapes: Iterable[tuple[Any, ...] | None], out_shapes: Iterable[tuple[Any, ...] | None]) -> str:
    """:attr:`PlacementPattern.shapes`: ``(1, 77, 2048), (3,) -> (1, 77, 32, 64)`` is
    ``1,77,2048;3>1,77,32,64`` (``?`` an unknown or symbolic dim, ``-`` an unknown rank)."""
    def one(s: tuple[Any, ...] | None) -> str:
        if s is None:
            return "-"
        return ",".join(str(d) if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else "?" for d in s)

    return ";".join(one(s) for s in in_shapes) + ">" + ";".join(one(s) for s in out_shapes)


#: attribute values longer than this many elements are not a layout (a constant's data): left out of the class
_ATTR_ELEMS = 16


def attrs_class(attrs: Mapping[str, object]) -> str:
    """:attr:`PlacementPattern.attrs`: the op's scalar and short-list attributes, sorted, as
    ``axis=1;perm=0,2,1,3`` (floats to 6 significant digits; tensors, graphs and long lists left out:
    what decides a layout is a permutation, an axis, a mode)."""
    out = []
    for k in sorted(attrs):
        v = attrs[k]
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        if isinstance(v, bool | int):
            text = str(int(v))
        elif isinstance(v, float):
            text = f"{v:.6g}"
        elif isinstance(v, str):
            text = v
        elif isinstance(v, list | tuple) and len(v) <= _ATTR_ELEMS and all(
                isinstance(x, int | float) and not isinstance(x, bool) for x in v):
            text = ",".join(str(x) if isinstance(x, int) else f"{x:.6g}" for x in v)
        else:
            continue
        text = "".join(c if c.isprintable() and c not in ";=" else "_" for c in text)[:64]
        out.append(f"{k}={text}")
    return ";".join(out)


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
        hit = find_learned(self._learned_of(pattern.op_type), pattern) if self.learned else None
        if hit is not None:
            return (f"rknn-toolkit2 {self.toolkit} placed {hit.describe()} on the CPU in an earlier build "
                    "(learned placement)")
        return None

    def _learned_of(self, op_type: str) -> frozenset[PlacementPattern]:
        by_type = self.__dict__.get("_by_type")
        if by_type is None:  # an index of a frozen value, made once
            by_type = {}
            for p in self.learned:
                by_type.setdefault(p.op_type, set()).add(p)
            by_type = {k: frozenset(v) for k, v in by_type.items()}
            object.__setattr__(self, "_by_type", by_type)
        return by_type.get(op_type, frozenset())

    def to_json(self) -> JsonObject:
        """What the plan records of the capability it was partitioned with."""
        return {"target": self.target, "toolkit": self.toolkit, "rewrites": self.rewrites,
                "learned_patterns": len(self.learned)}


__all__ = ["FORMS", "TOOLKIT_DTYPES", "Capability", "PlacementPattern", "around_class", "attrs_class", "dims_class",
           "find_learned", "shapes_class", "unit_mask"]
