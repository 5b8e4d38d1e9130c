"""Which tensors of a model hold the same values by construction: value numbering, as a compiler's
common-subexpression elimination finds them (constants compared by value; an op that changes
nothing, such as a Cast to the type it has or a Reshape to its shape, hands its input's number on).

rknn-toolkit2 builds one output for tensors it finds equal, and a stage declaring both then builds
into an ``.rknn`` with fewer outputs than the stage declares, which every runner refuses.
Measured (rk3588): ``Cast(h)`` and ``Cast(Cast(h))`` to float32 as outputs -> one
``OutputOperator`` (``build_once``, 2.3.0 and 2.5.0; Kandinsky 5's TorchScript blocks end so);
Sana-WM's TorchScript linear attention computes two rank-5 Transposes twice, and its stage handing
the host all four (as rank-4 views) built 19 of its 21 outputs on 2.5.0.  Two equal Slices, or two
equal Transposes, of a tiny stage stay two outputs: which equal computations the toolkit merges
depends on its fusions, so the partition reads every second tensor of equal value among an NPU
stage's outputs as the first before it writes the plan (:func:`rkpart.grouping.propose.propose`,
:func:`rkpart.ir.load.with_merged_tensors`).  Exact: a deterministic op on the same values
computes the same values; the host receives one tensor fewer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

from onnx import AttributeProto, NodeProto, TensorProto, numpy_helper

from rkpart.ir.graph import ModelGraph
from rkpart.ir.ops import DEFAULT_DOMAINS

#: ops whose result is not a function of their inputs: never the same value twice by construction
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                              "Multinomial", "Bernoulli", "Dropout"})
#: constants up to this size are compared by value (larger ones, the weights, by name)
VALUE_BYTES = 1 << 16
#: ops that hand on their first input's values unchanged when their output has its type (dtype and
#: shape): a Cast to the type it has (Kandinsky 5's TorchScript blocks cast float32 to float32 twice,
#: and 2.5.0 built a stage declaring both casts' results with one output), a Reshape to its shape
PASS_THROUGH = frozenset({"Identity", "Cast", "CastLike", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand"})


def _constant_key(t: TensorProto) -> Hashable:
    if t.data_location == TensorProto.EXTERNAL or t.ByteSize() > VALUE_BYTES:
        return ("tensor", t.name)
    a = numpy_helper.to_array(t)
    return ("const", t.data_type, tuple(t.dims), hashlib.sha256(a.tobytes()).hexdigest())


def value_numbers(mg: ModelGraph) -> dict[str, int]:
    """Tensor -> a number equal for two tensors exactly when the graph computes them the same way
    from the same values (model inputs by name, constants by value, ops by type, domain,
    attributes and the numbers of their inputs; an op of :data:`PASS_THROUGH` that changes no type
    hands its input's number on).  An op whose result depends on more than its inputs (random,
    control flow with a body, another domain's) numbers its outputs apart."""
    table: dict[Hashable, int] = {}

    def number(key: Hashable) -> int:
        return table.setdefault(key, len(table))

    nums: dict[str, int] = {name: number(_constant_key(t)) for name, t in mg.initializers.items()}
    for t in mg.inputs:
        nums.setdefault(t, number(("tensor", t)))
    for n in mg.nodes:
        if (n.op_type in NONDETERMINISTIC or n.domain not in DEFAULT_DOMAINS
                or any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in n.attribute)):
            for o in n.output:
                nums[o] = number(("tensor", o))
            continue
        if n.input and n.input[0] in nums and len(n.output) == 1 and _passes_through(mg, n):
            nums[n.output[0]] = nums[n.input[0]]
            continue
        if n.op_type == "Constant" and n.output:
            value = next((a.t for a in n.attribute if a.type == AttributeProto.TENSOR), None)
            if value is not None:
                nums[n.output[0]] = number(_constant_key(_named(value, n.output[0])))
                continue
        attrs = tuple(sorted(a.SerializeToString() for a in n.attribute))
        ins = tuple(nums[t] if t in nums else number(("tensor", t)) if t else -1 for t in n.input)
        for k, o in enumerate(n.output):
            if o:
                nums[o] = number(("op", n.op_type, n.domain or "", attrs, ins, k))
    return nums


def _passes_through(mg: ModelGraph, n: NodeProto) -> bool:
    """Whether ``n`` hands on its first input's values unchanged (:data:`PASS_THROUGH`; a Transpose
    whose permutation is the identity)."""
    src, out = mg.tensor_types.get(n.input[0]), mg.tensor_types.get(n.output[0])
    if src is None or src != out:
        return False
    if n.op_type == "Transpose":
        perm = next((list(a.ints) for a in n.attribute if a.name == "perm"), None)
        return perm == list(range(len(src[1])))
    return n.op_type in PASS_THROUGH


def _named(t: TensorProto, name: str) -> TensorProto:
    out = TensorProto()
    out.CopyFrom(t)
    out.name = name
    return out


def same_values(mg: ModelGraph, groups: list[list[str]]) -> dict[str, str]:
    """Of the tensors of each of ``groups`` (in order; tensors the graph computes or takes in),
    each one whose values an earlier one of the same group already holds (:func:`value_numbers`)
    -> that one.  A model output is never mapped (its name is the model's); it may be what others
    map to."""
    groups = [g for g in groups if len(g) > 1]
    nums = value_numbers(mg) if groups else {}
    outputs = set(mg.outputs)
    out: dict[str, str] = {}
    for tensors in groups:
        first: dict[int, str] = {}
        # model outputs first, so that an output is the one kept
        for t in sorted(tensors, key=lambda x: x not in outputs):
            k = nums[t]
            if k in first and t not in outputs:
                out[t] = first[k]
            else:
                first.setdefault(k, t)
    return out
