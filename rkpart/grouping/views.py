"""The NPU's rank-4 view rule, in one place: which tensors cross a stage boundary as a rank-4 view,
how the graph reads them so, and which group each op of a view joins.

Measured (``build_once``, rk3588): rknn-toolkit2 converts on the CPU a stage input or output of
rank :data:`NARROW_INPUT_RANK` whose last dim is not a multiple of :data:`NPU_ALIGN` (2.3.0 and
2.5.0), and a tensor of rank > :data:`NPU_INPUT_RANK` (2.3.0: a stage input is reshaped on the
CPU, the op giving a stage output runs there).  Fed the same values as a rank-4 view and reshaped
back inside the stage, the same graph builds on the NPU.  So:

* **the edits** (:func:`with_rank4_inputs`, :func:`with_rank4_views`) read a tensor through
  ``Reshape(t, view)`` and a ``Reshape`` back per reader, named ``rkpart/rank4/...``; each returns a
  new graph, exact, and leaves the one it was given as it was;
* **the questions** the proposal asks of a partition (:func:`reads_wide_inputs`,
  :func:`narrow_npu_inputs`, :func:`narrow_crossings`): which tensors an NPU stage would take or
  give in a form the toolkit converts on the CPU;
* **the placement** of a view's ops: at proposal time (:func:`hand_over_rank4_views`, through
  :meth:`~rkpart.grouping.strategies.base.GroupBuilder.hand_over_rank4_views`), and again after
  the capability moved ops (:func:`settle_rank4_views`).

:func:`rkpart.grouping.propose.propose` runs the loop that asks, edits and proposes again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkpart.grouping.groups import Partition
from rkpart.ir import ModelGraph
from rkpart.ir.edit import free_name
from rkpart.ir.load import edited, own_copy
from rkpart.ir.ops import CONTROL_FLOW_OPS

#: the widest tensor an NPU stage takes as an input without a CPU layer: rknn-toolkit2 2.3.0 reshapes a
#: rank-5 input on the CPU ('Reshape:control_hidden_states_rs', WanVACE's control video), and builds the
#: same graph fed a rank-4 view and reshaped back inside on the NPU (measured with 2.3.0 and 2.5.0)
NPU_INPUT_RANK = 4
#: name prefix of the Reshape pairs :func:`with_rank4_inputs` inserts
RANK4_PREFIX = "rkpart/rank4/"


def rank4_view(shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The rank-4 shape a wider tensor is handed over as (the same elements in the same order), or
    None for rank 4 or less: unit axes after the first dropped, then the first axis if it is a unit
    one, then the axes between the second and the last merged into one."""
    if len(shape) <= NPU_INPUT_RANK:
        return None
    out = list(shape)
    while len(out) > NPU_INPUT_RANK and 1 in out[1:]:
        del out[out.index(1, 1)]
    if len(out) > NPU_INPUT_RANK and out[0] == 1:
        del out[0]
    if len(out) > NPU_INPUT_RANK:
        out = [out[0], out[1], math.prod(out[2:-1]), out[-1]]
    return tuple(out)


def _fresh_names(used: set[str]) -> Callable[[str], str]:
    """``fresh(name)``: :func:`rkpart.ir.edit.free_name` over ``used``."""
    return lambda name: free_name(name, used)


def with_rank4_inputs(mg: ModelGraph) -> ModelGraph:
    """``mg`` with each float model input of rank > 4 read through a rank-4 view and back.

    ``x`` becomes ``Reshape(Reshape(x, rank4_view), x's shape)`` for its readers (two ops named
    ``rkpart/rank4/<x>``): the partition can run the first on the host and hand an NPU stage the
    rank-4 view, which it reshapes back on the NPU (:data:`NPU_INPUT_RANK`).  Exact.  A new graph
    (``mg`` is not changed); a model with no such input, or with control flow, is ``mg`` itself.
    """
    if any(op.op_type in CONTROL_FLOW_OPS for op in mg.op_nodes):
        return mg
    wide = [(t, view) for t in mg.inputs if mg.is_float(t) and mg.consumers.get(t)
            and (view := rank4_view(mg.tensor_types[t][1])) is not None]
    if not wide:
        return mg
    model = own_copy(mg.model)
    g = model.graph
    used = set(mg.tensor_types) | set(mg.initializers) | {n.name for n in g.node}
    types = dict(mg.tensor_types)

    fresh = _fresh_names(used)

    front: list[onnx.NodeProto] = []
    for t, view in wide:
        dtype, shape = mg.tensor_types[t]
        r4, r5 = fresh(f"{RANK4_PREFIX}{t}"), fresh(f"{RANK4_PREFIX}{t}/back")
        s4, s5 = fresh(f"{RANK4_PREFIX}{t}/shape4"), fresh(f"{RANK4_PREFIX}{t}/shape")
        for name, dims in ((s4, view), (s5, shape)):
            g.initializer.append(numpy_helper.from_array(np.array(dims, np.int64), name))
            types[name] = ("int64", (len(dims),))
        front += [helper.make_node("Reshape", [t, s4], [r4], name=r4),
                  helper.make_node("Reshape", [r4, s5], [r5], name=r5)]
        types[r4], types[r5] = (dtype, view), (dtype, shape)
        for n in g.node:
            for k, x in enumerate(n.input):
                if x == t:
                    n.input[k] = r5
    nodes = [*front, *g.node]
    del g.node[:]
    g.node.extend(nodes)
    return edited(mg, model, types)


#: a stage input of this rank whose last dim is not a multiple of :data:`NPU_ALIGN` is converted on
#: the CPU by rknn-toolkit2 (:func:`with_rank4_views`)
NARROW_INPUT_RANK = 3
NPU_ALIGN = 8


def with_rank4_views(mg: ModelGraph, tensors: list[str]) -> ModelGraph:
    """``mg`` with each of ``tensors`` read through a rank-4 view and back, one way back per reader.

    ``t`` becomes ``Reshape(t, [1, ..., *shape])`` (``rkpart/rank4/<t>``), and each op that read
    ``t`` reads its own ``Reshape(view, shape)`` (``rkpart/rank4/<t>/back<k>``): the partition
    computes the view on the host and gives each NPU stage that reads ``t`` the view, reshaped
    back inside the stage (:meth:`rkpart.grouping.strategies.base.GroupBuilder.hand_over_rank4_views`).
    Exact.  Measured: rknn-toolkit2 converts a rank-3 stage input whose last dim is not a
    multiple of 8 on the CPU, in every stage that reads it (T5FiLM's cross-attention mask
    ``[2, 16, 22]``: a ``Reshape`` CPU layer per cross-attention stage, 2.3.0 and 2.5.0, which
    moving ops cannot remove: the conversion moves along); fed ``[1, 2, 16, 22]`` it is not.
    A new graph: ``mg`` is not changed.
    """
    model = own_copy(mg.model)
    g = model.graph
    types = dict(mg.tensor_types)
    used = set(types) | set(mg.initializers) | {n.name for n in g.node}

    fresh = _fresh_names(used)

    nodes = list(g.node)
    producer = {t: k for k, n in enumerate(nodes) for t in n.output if t}
    after: dict[int, list[onnx.NodeProto]] = {}
    for t in tensors:
        dtype, shape = types[t]
        view = (1,) * (NPU_INPUT_RANK - len(shape)) + tuple(shape) if len(shape) < NPU_INPUT_RANK \
            else rank4_view(tuple(shape))
        if view is None:
            continue
        r4, s4, s0 = fresh(f"{RANK4_PREFIX}{t}"), fresh(f"{RANK4_PREFIX}{t}/shape4"), fresh(f"{RANK4_PREFIX}{t}/shape")
        for name, dims in ((s4, view), (s0, shape)):
            g.initializer.append(numpy_helper.from_array(np.array(dims, np.int64), name))
            types[name] = ("int64", (len(dims),))
        types[r4] = (dtype, view)
        new = [helper.make_node("Reshape", [t, s4], [r4], name=r4)]
        k = 0
        for n in nodes:
            if t not in n.input:
                continue
            back = fresh(f"{RANK4_PREFIX}{t}/back{k}")
            k += 1
            new.append(helper.make_node("Reshape", [r4, s0], [back], name=back))
            types[back] = (dtype, tuple(shape))
            for j, x in enumerate(n.input):
                if x == t:
                    n.input[j] = back
        after.setdefault(producer.get(t, -1), []).extend(new)
    out = list(after.get(-1, []))
    for k, n in enumerate(nodes):
        out.append(n)
        out.extend(after.get(k, []))
    del g.node[:]
    g.node.extend(out)
    return edited(mg, model, types)




# -- which tensors the toolkit would convert at a stage boundary ---------------------------------


def reads_wide_inputs(mg: ModelGraph, part: Partition) -> bool:
    """Whether an NPU group of ``part`` reads a float model input of rank > 4 directly."""
    wide = {t for t in mg.inputs if mg.is_float(t) and rank4_view(mg.shape(t) or ()) is not None}
    return bool(wide) and any(t in wide for g in part.groups if g.device == "npu" for i in g.ops
                              for t in mg.op(i).inputs)


def narrow_npu_inputs(mg: ModelGraph, part: Partition) -> list[str]:
    """Tensors of rank :data:`NARROW_INPUT_RANK` whose last dim is not a multiple of
    :data:`NPU_ALIGN` that an NPU group of ``part`` reads from the host or as a model input
    (:func:`with_rank4_views`)."""
    npu = {i for g in part.groups if g.device == "npu" for i in g.ops}
    out: list[str] = []
    for i in sorted(npu):
        for t in mg.op(i).inputs:
            shape = mg.shape(t) if t else None
            if not t or t in out or shape is None or len(shape) != NARROW_INPUT_RANK or shape[-1] % NPU_ALIGN == 0 \
                    or mg.is_const_tensor(t) or mg.producer.get(t) in npu or t.startswith(RANK4_PREFIX):
                continue
            out.append(t)
    return out


#: proposals with rank-4 views at most (each pass views every crossing the last one left)
VIEW_PASSES = 3


def narrow_crossings(mg: ModelGraph, part: Partition) -> list[str]:
    """Tensors the toolkit converts on the CPU at a stage boundary that cross into or out of an NPU
    group of ``part``: read from another group or as a model input, or read by another group (not
    model outputs: the plan gives those as the model does).

    Measured (``build_once``, rk3588): a tensor of rank :data:`NARROW_INPUT_RANK` whose last dim is
    not a multiple of :data:`NPU_ALIGN`, as a stage input or output, 2.3.0 and 2.5.0; a tensor of
    rank > 4, as a stage input (``Reshape:<t>_rs``) or output (the op producing it runs on the CPU),
    2.3.0 (2.5.0 runs both on the NPU; the view costs it nothing)."""
    owner = {i: k for k, g in enumerate(part.groups) for i in g.ops}
    npu = {k for k, g in enumerate(part.groups) if g.device == "npu"}
    outputs = set(mg.outputs)
    out: list[str] = []
    for k in sorted(npu):
        for i in sorted(part.groups[k].ops):
            op = mg.op(i)
            for t in (*op.inputs, *op.outputs):
                shape = mg.shape(t) if t else None
                if not t or t in out or t in outputs or shape is None or mg.is_const_tensor(t) \
                        or t.startswith(RANK4_PREFIX):
                    continue
                narrow = len(shape) == NARROW_INPUT_RANK and shape[-1] % NPU_ALIGN != 0
                if not narrow and rank4_view(shape) is None:
                    continue
                p = mg.producer.get(t)
                comes_in = p is None or owner.get(p) != k  # a model input, or another group's
                goes_out = p is not None and owner.get(p) == k and any(owner.get(c) != k
                                                                        for c in mg.consumers.get(t, ()))
                if comes_in or goes_out:
                    out.append(t)
    return out


# -- which group each op of a view joins ----------------------------------------------------------


def rank4_views(mg: ModelGraph) -> list[tuple[int, tuple[int, ...]]]:
    """(first, backs) of :func:`with_rank4_inputs` and :func:`with_rank4_views`: a ``Reshape`` of a
    tensor to rank 4 (named ``rkpart/rank4/...``), read only by ``Reshape`` ops back to the tensor's
    shape."""
    out = []
    for first in sorted(mg.ops):
        op = mg.op(first)
        if op.op_type != "Reshape" or not op.name.startswith(RANK4_PREFIX) or not op.inputs:
            continue
        shape = mg.shape(op.inputs[0])
        if not shape or len(mg.shape(op.outputs[0]) or ()) != 4:
            continue
        backs = mg.consumers.get(op.outputs[0], [])
        if backs and all(mg.op(b).op_type == "Reshape" and mg.shape(mg.op(b).outputs[0]) == shape and b in mg.ops
                         for b in backs):
            out.append((first, tuple(backs)))
    return out


class ViewGroups(Protocol):
    """The groups a strategy is building, as :func:`hand_over_rank4_views` moves ops between them
    (:class:`~rkpart.grouping.strategies.base.GroupBuilder`)."""

    def owner_of(self, op: int) -> str | None: ...

    def is_npu(self, gid: str) -> bool: ...

    def move(self, op: int, gid: str) -> None: ...

    def move_to_host(self, op: int, *, prologue: bool) -> None: ...


def hand_over_rank4_views(groups: ViewGroups, mg: ModelGraph) -> None:
    """A tensor read through a rank-4 view is handed to the NPU groups that read it as the view.

    Each Reshape back joins the NPU group that reads it, and the first one is computed on the host
    (in the prologue for a model input, else in a host group of its own, merged with the host work
    around it when the plan is ordered), so the stage's input has rank 4.  A Reshape back read on
    the host stays there.
    """
    for first, backs in rank4_views(mg):
        handed = False
        for back in backs:
            owners = {groups.owner_of(j) for j in mg.ops.successors(back)}
            gid = next(iter(owners)) if len(owners) == 1 else None
            if gid is None or not groups.is_npu(gid):
                continue
            groups.move(back, gid)
            handed = True
        if handed:
            groups.move_to_host(first, prologue=mg.op(first).inputs[0] in mg.inputs)


def settle_rank4_views(mg: ModelGraph, part: Partition) -> Partition:
    """``part`` with each rank-4 view beside the stages that exchange it, wherever the groups ended up.

    The view (:func:`with_rank4_views`) joins the group that produces the tensor, so an NPU stage
    gives the view rather than the narrow tensor (measured: rknn-toolkit2 2.3.0 and 2.5.0 convert a
    rank-3 stage *output* whose last dim is not a multiple of 8 on the CPU, ``Reshape:<t>-rs``, and
    not the same values given as ``[1, 1, ...]``), and a host stage gives the view to the NPU stage
    that reads it; each Reshape back joins the group of the op that reads it, host or NPU.  For the
    groups after the capability moved ops (:func:`hand_over_rank4_views` places them at proposal
    time, before).  No group dependency is added that a path did not already imply, so the plan
    stays acyclic.
    """
    owner = {i: k for k, g in enumerate(part.groups) for i in g.ops}
    move: dict[int, int] = {}
    for first, backs in rank4_views(mg):
        p = mg.producer.get(mg.op(first).inputs[0])
        if p is not None and p in owner:
            move[first] = owner[p]
        for b in backs:
            readers = {owner[c] for c in mg.ops.successors(b) if c in owner}
            if len(readers) == 1:
                move[b] = readers.pop()
    move = {i: k for i, k in move.items() if owner.get(i) != k}
    if not move:
        return part
    ops = [set(g.ops) for g in part.groups]
    for i, k in move.items():
        if i in owner:
            ops[owner[i]].discard(i)
        ops[k].add(i)
    groups = tuple(replace(g, ops=frozenset(o)) for g, o in zip(part.groups, ops, strict=True) if o)
    return replace(part, groups=groups)


__all__ = ["NARROW_INPUT_RANK", "NPU_ALIGN", "NPU_INPUT_RANK", "RANK4_PREFIX", "VIEW_PASSES", "ViewGroups",
           "hand_over_rank4_views", "narrow_crossings", "narrow_npu_inputs", "rank4_view", "rank4_views",
           "reads_wide_inputs", "settle_rank4_views", "with_rank4_inputs", "with_rank4_views"]
