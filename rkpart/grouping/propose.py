"""Propose: a strategy's groups for a graph, made buildable for the target -- a value, never an edit.

One proposal is the loop below, around any strategy (plugins too)::

    group          the strategy's groups (re-cut or merged where stages would feed each other)
    rank-4 inputs  an NPU stage would read a model input of rank > 4: read it through a view, again
    narrow inputs  an NPU stage would read a narrow rank-3 tensor from the host: a view, again
    capability     ops the toolkit does not run on the NPU leave NPU stages (learned ones too)
    crossings      a tensor the moves left crossing a boundary in a converted form: a view, again
    cuts           a crashed build's fused ops start new stages (``compile --repartition``)
    notes          what the toolkit will not do with what stays; the blocks' NPU coverage

and, around that, value-equal outputs of an NPU stage merged (the toolkit may build one output
for both), again.  Each "again" proposes on a *new* graph that computes the same values
(:mod:`rkpart.grouping.views`, :func:`rkpart.ir.load.with_merged_tensors`): the graph given is
never changed, and the :class:`Proposal` carries the graph its partition is of, which is the one
the plan is written from (:func:`rkpart.pipeline.write_plan`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rkpart.discovery.recognizers import discover_with_progress
from rkpart.discovery.structure import Discovery
from rkpart.grouping.capability import apply_capability, capability_notes, cut_before
from rkpart.grouping.coverage import coverage_note, npu_coverage
from rkpart.grouping.groups import Partition, acyclic
from rkpart.grouping.learned import target_capability
from rkpart.grouping.strategies.base import Strategy, propose_with
from rkpart.grouping.views import (
    VIEW_PASSES,
    narrow_crossings,
    narrow_npu_inputs,
    reads_wide_inputs,
    settle_rank4_views,
    with_rank4_inputs,
    with_rank4_views,
)
from rkpart.ir import ModelGraph
from rkpart.ir.load import with_merged_tensors
from rkpart.ir.subgraph import outputs_of
from rkpart.ir.values import same_values
from rkpart.progress import Progress, silent
from rkpart.targets import DEFAULT_TARGET


@dataclass(frozen=True)
class Proposal:
    """What :func:`propose` made: the partition, and the graph and discovery it is of.

    ``graph`` is the graph proposed for, or a new one computing the same values (rank-4 views,
    merged outputs: each exact); ``discovery`` is its block discovery when one was made (``None``
    for a strategy that needs none and a graph nobody discovered).
    """

    graph: ModelGraph
    discovery: Discovery | None
    partition: Partition


#: a strategy's groups for a graph (the strategy and its built options, or the pipeline's grounded ``auto``)
Grouping = Callable[[ModelGraph, Discovery | None], Partition]


@dataclass(frozen=True)
class Placement:
    """What decides where ops run besides the strategy: the target's capability and a build's findings.

    ``capability=False``: the strategy's groups are kept as proposed.  Otherwise rknn-toolkit2
    ``version`` (``None``: the target's default; resolved from ``toolkit`` by the caller) decides,
    with the placements ``learned`` from earlier builds and the ``rewrites`` the build applies;
    ``force_host`` names ops (by node name) that leave NPU stages whatever the rewrites do, and
    ``cut_before`` ops an NPU stage is cut in front of, each with why.  ``toolkit`` as the user gave
    it is what the notes check the opset and ops against.
    """

    target: str = DEFAULT_TARGET
    toolkit: str | None = None
    version: str | None = None
    capability: bool = True
    learned: bool = True
    rewrites: bool = True
    force_host: Mapping[str, str] = field(default_factory=dict)
    cut_before: Mapping[str, str] = field(default_factory=dict)


#: proposals at most that merge value-equal outputs of an NPU stage (each pass merges what the last left)
MERGE_PASSES = 3


def propose(graph: ModelGraph, strategy: Strategy[Any], opts: object, placement: Placement = Placement(), *,
            discovery: Discovery | None = None, group: Grouping | None = None,
            progress: Progress = silent) -> Proposal:
    """The partition ``strategy`` (its options ``opts`` built) proposes for ``graph``, checked against
    the target's capabilities; ``graph`` is not changed.

    ``discovery``: ``graph``'s, when it is known already.  ``group``: how the strategy is asked
    (default: :func:`~rkpart.grouping.strategies.base.propose_with`).

    An NPU stage never hands the host two tensors that hold the same values by construction (a
    tensor and its alias, or two equal computations): the toolkit may build one output for both
    (:mod:`rkpart.ir.values`), so the readers of the second read the first and the model is
    proposed again.
    """
    grouping: Grouping = group or (lambda mg, disc: propose_with(strategy, mg, disc, built=opts))
    merged: dict[str, str] = {}
    for _ in range(MERGE_PASSES):
        proposal, lines = _propose_once(graph, discovery, strategy.needs_blocks, grouping, placement, progress)
        same = same_values(proposal.graph, _npu_outputs(proposal.graph, proposal.partition))
        if not same:
            break
        merged.update(same)
        progress(f"merging {len(same)} output(s) of NPU stages that hold the same values as another "
                 "output of the stage (the toolkit may build one output for both): proposing again")
        graph, discovery = with_merged_tensors(proposal.graph, same), None
    for line in lines:
        progress(line)
    if not merged:
        return proposal
    note = (f"{len(merged)} tensor(s) read as another that holds the same values (an NPU stage would have "
            "handed both to the host; the toolkit may build one output for both): "
            + ", ".join(f"{a} -> {b}" for a, b in sorted(merged.items())[:8])
            + (" ..." if len(merged) > 8 else ""))
    part = proposal.partition
    return dataclasses.replace(proposal, partition=dataclasses.replace(part, notes=(*part.notes, note)))


def _npu_outputs(mg: ModelGraph, part: Partition) -> list[list[str]]:
    """Per NPU group of ``part``, the outputs its stage will have (:func:`rkpart.ir.subgraph.outputs_of`)."""
    return [list(outputs_of(mg, g.ops)) for g in part.groups if g.device == "npu"]


def _group(mg: ModelGraph, disc: Discovery | None, needs_blocks: bool, group: Grouping,
           progress: Progress) -> tuple[Partition, Discovery | None]:
    """The strategy's groups for ``mg``, made acyclic (stages that feed each other are re-cut or
    merged, and noted), and ``mg``'s discovery: ``disc``, or made here for a strategy that needs it."""
    if needs_blocks and disc is None:
        disc = discover_with_progress(mg, progress)
    return acyclic(mg, group(mg, disc if needs_blocks else None)), disc


def _propose_once(graph: ModelGraph, discovery: Discovery | None, needs_blocks: bool, group: Grouping,
                  placement: Placement, progress: Progress) -> tuple[Proposal, list[str]]:
    """One proposal of :func:`propose` and the progress lines it has for the user (said once, for the
    proposal kept).  Each view makes a new graph, discovered again and grouped again."""
    lines: list[str] = []
    # any strategy, plugins too, before the capability pass, which relies on convex groups
    mg = graph
    part, disc = _group(mg, discovery, needs_blocks, group, progress)
    if reads_wide_inputs(mg, part):
        # an NPU stage would take a model input of rank > 4 (a CPU Reshape on 2.3.0): read such
        # inputs through a rank-4 view (the strategies hand the view to the stage) and propose again
        mg = with_rank4_inputs(mg)
        part, disc = _group(mg, None, needs_blocks, group, progress)
    narrow = narrow_npu_inputs(mg, part)
    if narrow:
        # an NPU stage would take a rank-3 tensor with an unaligned last dim from the host (the
        # toolkit converts it on the CPU): hand it a rank-4 view, reshaped back inside the stage
        mg = with_rank4_views(mg, narrow)
        part, disc = _group(mg, None, needs_blocks, group, progress)
    lines += [note for note in part.notes if " cycle " in note]
    # read after the strategy ran: auto's grounding builds (rkpart.grounding) may have taught the store
    cap = target_capability(placement.target, placement.version, learned=placement.learned,
                            rewrites=placement.rewrites) if placement.capability else None
    said: list[str] = []
    if cap is not None:
        part = apply_capability(mg, part, cap, placement.force_host, said.append)
    for _ in range(VIEW_PASSES):
        narrow = narrow_crossings(mg, part)
        if not narrow:
            break
        # the moves left a tensor the toolkit converts on the CPU (rank 3 with an unaligned last dim,
        # rank > 4) crossing into or out of an NPU stage: it crosses as a rank-4 view, and the model
        # is proposed again (the moves on the new graph can leave another such crossing: again)
        mg = with_rank4_views(mg, narrow)
        part, disc = _group(mg, None, needs_blocks, group, progress)
        said = []
        if cap is not None:
            part = apply_capability(mg, part, cap, placement.force_host, said.append)
        part = settle_rank4_views(mg, part)
    lines += said
    if placement.cut_before:
        part, cuts = cut_before(mg, part, placement.cut_before)
        if cuts:
            rec = dict(part.extra.get("capability") or {})
            part = dataclasses.replace(part, extra={**part.extra, "capability": {**rec, "cuts": cuts}})
    notes = capability_notes(mg, part, placement.target, placement.toolkit)
    if needs_blocks and disc is not None:
        low = coverage_note(mg, npu_coverage(mg, disc, part.groups))
        if low is not None:
            notes.append(f"{part.strategy}: {low}")
    lines += [f"warning: {note}" for note in notes]
    if not any(g.device == "npu" for g in part.groups):
        # recorded in the plan's notes; the CLI warns on stderr even with --quiet
        notes.append(f"strategy {part.strategy} put no stage on the NPU: the whole model runs on the host")
    if notes:
        part = dataclasses.replace(part, notes=(*part.notes, *notes))
    return Proposal(mg, disc, part), lines


__all__ = ["MERGE_PASSES", "Grouping", "Placement", "Proposal", "propose"]
