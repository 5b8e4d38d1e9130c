"""Candidate partitions of each block, with their features and what rules them out.

Per block (or run of consecutive blocks) the candidates are the candidate families of
:mod:`rkpart.grouping.strategies.families` (the split and fused variants, runs of fused blocks,
plugin strategies), each sliced out of a whole-model partition its strategy proposed: the
pipeline proposes them and hands them over, so this module never calls a strategy, and a
chosen candidate is exactly the stage that strategy would have written.  Residency
(per-stage vs resident) is not part of a candidate: :mod:`rkpart.cost_model.select`
evaluates every candidate under each residency.

A candidate is *excluded*, never silently chosen, when the toolkit is known to crash on it: a
failure recorded by ``rkpart compile`` in a plan, or a crash pattern of the target's known-issue
table (:mod:`rkpart.targets.known_issues`) whose op signature, that of the recorded reproducers,
one of its NPU stages holds.  A candidate that matches only a pattern's broad traits is
*suspected*, not excluded: it says so, and a build (``auto --toolkit``) decides.

Precision (issue 27): :func:`with_precisions` adds, per fp16 candidate with NPU stages, its
int8 (w8a8) twin ``F@int8`` (the same stages built quantized).  :func:`mark_exclusions` gives
the twin the compiler's tables of an int8 build when one is among the compiled plans, else
the stated prior of :func:`int8_prior` over the fp16 figures (the compiled fp16 ones when there
are): weights at half, weighted MACs (conv-type layers) at twice the rate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkpart.cost_model.features import Features, group_features
from rkpart.discovery.structure import Block, Discovery
from rkpart.grouping.capability import host_op_key
from rkpart.grouping.groups import Group, Partition, block_id
from rkpart.grouping.strategies.families import candidate_id_for, precision_id, split_precision
from rkpart.ir import ModelGraph
from rkpart.targets.known_issues import KNOWN_ISSUES, SIGNATURES, CrashPattern, Traits, crash_patterns, signatures_in
from rkpart.types import JsonMap

#: one candidate family's whole-model partition: (candidate id, the partition, options recorded for
#: it); its candidates are runs of ``options["blocks_per_stage"]`` blocks (default 1)
Variant = tuple[str, Partition, JsonMap]


@dataclass(frozen=True)
class Candidate:
    """One way to partition ``blocks`` (one block, or a run of consecutive blocks)."""

    id: str
    blocks: tuple[int, ...]
    groups: tuple[Group, ...]
    npu: tuple[Features, ...]  # one per NPU stage, in group order
    host: Features | None  # all host ops of the blocks together (``stages`` = host segments)
    adaln_on_npu: bool
    residual_on_npu: bool
    layernorm: str  # "op" (LayerNormalization) or "decomposed"
    options: JsonMap = field(default_factory=dict)
    excluded: str | None = None  # why it must not be chosen (toolkit crash ...)
    #: the capability's moves inside these blocks (``extra.capability.host_ops`` records of the
    #: variant it was sliced from): what a plan made of this candidate records
    host_ops: tuple[JsonMap, ...] = ()
    #: what the NPU stages are built in: ``fp16`` or ``int8`` (w8a8)
    precision: str = "fp16"
    #: where an int8 candidate's figures come from: ``compiler`` (an int8 build's tables) or
    #: ``prior`` (:func:`int8_prior`); ``None`` for fp16
    precision_source: str | None = None
    #: the known-issue op signatures its NPU stages hold (:data:`rkpart.targets.known_issues.SIGNATURES`)
    signatures: frozenset[str] = frozenset()
    #: a known issue it matches only broadly (not excluded), and what a build said of it
    suspected: str | None = None

    @property
    def start(self) -> int:
        return self.blocks[0]

    @property
    def family(self) -> str:
        """The candidate family (``split``, ``fused``, ...) whatever the precision."""
        return split_precision(self.id)[0]

    def traits(self) -> Traits:
        """What crash patterns match against (:class:`~rkpart.targets.known_issues.CrashPattern`)."""
        return Traits(adaln_on_npu=self.adaln_on_npu, residual_on_npu=self.residual_on_npu,
                      layernorm=self.layernorm, candidate=self.family, signatures=self.signatures)

    @property
    def accuracy_key(self) -> str:
        """The row of the accuracy term (``rkpart drift --accuracy``) this candidate reads; an int8
        candidate's is its own (``...,precision=int8``), measured on an int8 plan."""
        key = f"adaln={'npu' if self.adaln_on_npu else 'host'},residual={'npu' if self.residual_on_npu else 'host'}"
        return key if self.precision == "fp16" else f"{key},precision={self.precision}"


def _layernorm_form(mg: ModelGraph, b: Block) -> str:
    ops = {mg.op(i).op_type for r in b.regions for i in r.pre}
    return "decomposed" if "ReduceMean" in ops and "LayerNormalization" not in ops else "op"


def _make(mg: ModelGraph, disc: Discovery, cid: str, run: Sequence[Block], groups: Iterable[Group],
          options: JsonMap, moved: Sequence[JsonMap] = ()) -> Candidate:
    groups = tuple(groups)
    if moved:
        names = {host_op_key(mg, i) for g in groups if g.device == "host" for i in g.ops}
        moved = tuple(h for h in moved if h.get("op") in names)
    npu_ops = frozenset().union(*(g.ops for g in groups if g.device == "npu"))
    host_ops = frozenset().union(*(g.ops for g in groups if g.device == "host"))
    npu = tuple(group_features(mg, g.ops, device="npu") for g in groups if g.device == "npu")
    host = None
    if host_ops:
        hf = group_features(mg, host_ops, device="host")
        # host code runs between NPU stages: one host segment before each NPU stage
        host = dataclasses.replace(hf, stages=max(1, len(npu)))
    pre = frozenset().union(*(r.pre for b in run for r in b.regions))
    adds = frozenset().union(*(r.adds for b in run for r in b.regions))
    forms = {_layernorm_form(mg, b) for b in run}
    sigs = signatures_in(mg, tuple(frozenset(g.ops) for g in groups if g.device == "npu"))
    return Candidate(id=cid, blocks=tuple(b.index for b in run), groups=groups, npu=npu, host=host,
                     adaln_on_npu=bool(pre & npu_ops), residual_on_npu=bool(adds & npu_ops),
                     layernorm="decomposed" if "decomposed" in forms else "op", options=dict(options),
                     host_ops=tuple(moved), signatures=sigs)


def _per_run(part: Partition, blocks: Mapping[int, Block]) -> dict[tuple[int, ...], list[Group]]:
    """The groups of each run of blocks (one block, or the blocks a group spans); a run's ops no
    group of it holds (what ``GroupBuilder.add_host_rest`` leaves on the host without a block)
    become one host group of the run, so that every candidate is costed for its whole run."""
    out: dict[tuple[int, ...], list[Group]] = {}
    for g in part.groups:
        if g.block is None:
            continue
        out.setdefault(tuple(g.blocks) or (g.block,), []).append(g)
    for run, gs in out.items():
        rest = frozenset().union(*(blocks[b].ops for b in run if b in blocks)) - frozenset().union(
            *(g.ops for g in gs))
        if rest:
            first, last = blocks[run[0]], blocks[run[-1]]
            gid = block_id(first) if len(run) == 1 else f"{block_id(first)}-{block_id(last)}.block"
            gs.append(Group(id=f"{gid}.host-rest", device="host", ops=frozenset(rest), region="host",
                            kind="host", block=run[0], blocks=run))
    return out


def candidates_from(mg: ModelGraph, disc: Discovery, variants: Sequence[Variant]) -> dict[int, list[Candidate]]:
    """Candidates starting at each block index (runs are listed at their first block).

    ``variants`` are whole-model partitions (``(candidate id, partition, options)``, as
    :func:`rkpart.auto.candidate_variants` proposes them with the strategies of
    :mod:`rkpart.grouping.strategies.families`): each is sliced into runs of
    ``options["blocks_per_stage"]`` consecutive blocks (default 1); runs of another length (a
    stage that spans several blocks where one was expected, a short tail) and runs sharing a
    block with another run are skipped.
    """
    blocks = {b.index: b for b in disc.blocks}
    out: dict[int, list[Candidate]] = {b: [] for b in blocks}
    for cid, part, opts in variants:
        k = int(opts.get("blocks_per_stage", 1))
        runs = _per_run(part, blocks)
        moved = (part.extra.get("capability") or {}).get("host_ops") or ()
        touched: dict[int, int] = {}  # block -> how many runs have a group in it
        for run in runs:
            for b in run:
                touched[b] = touched.get(b, 0) + 1
        for run, gs in sorted(runs.items()):
            if len(run) != k or any(b not in blocks or touched[b] > 1 for b in run):
                continue
            out[run[0]].append(_make(mg, disc, cid, [blocks[b] for b in run], gs, opts, moved))
    return out


def with_precisions(cands: Mapping[int, Sequence[Candidate]],
                    precisions: Sequence[str] = ("fp16",)) -> dict[int, list[Candidate]]:
    """``cands`` with, for every precision of ``precisions`` besides fp16, a twin of each
    candidate that has NPU stages (``F@int8``: its NPU stages built in that precision), listed
    after the fp16 candidates of the same block.  Without fp16 in ``precisions`` only the twins remain."""
    out: dict[int, list[Candidate]] = {}
    for start, lst in cands.items():
        new = [c for c in lst if "fp16" in precisions or not c.npu]
        for p in precisions:
            if p != "fp16":
                new += [dataclasses.replace(c, id=precision_id(c.id, p), precision=p) for c in lst
                        if c.precision == "fp16" and c.npu]
        out[start] = new
    return out


#: the int8 prior's ratios (w8a8 on RK3588): int8 weights take 1 byte an element where fp16 takes 2;
#: the compiler's cycle tables give int8 convolutions 1024 MACs per cycle per core against fp16's 512
INT8_WEIGHT_RATIO = 0.5
INT8_MAC_SPEEDUP = 2.0
INT8_PRIOR = ("int8 prior: weights at half (w8a8, 1 byte an element), weighted MACs and compiler cycles at "
              "1024 MACs/cycle vs fp16's 512 (rknn-toolkit2 cycle tables); activations, RW and the .rknn size "
              "as fp16")


def int8_prior(f: Features) -> Features:
    """An fp16 stage's features as its int8 (w8a8) build is predicted to have them (:data:`INT8_PRIOR`).

    Weights: ``weight16`` (the NPU's fp16 weight bytes) halves, and so does the weight share of
    the compiler's memory when ``f`` was compiled in fp16 (internal memory stays).  Compute:
    weighted MACs (what the fp16 ``infer`` fit reads) and the compiler's Total cycles (only
    conv-type layers carry them) halve; the attention core, elementwise work and RW stay.  The
    ``.rknn`` size (``file_bytes``: load / init / release) stays: an int8 build's file is not
    smaller on the bundled example (1.1-2.0x fp16's, 2.5.0).  Measured there per stage, int8 over
    fp16 (docs/cost-model.md): cycles 0.52-0.54x, weight memory 0.53-0.81x (RoPE tables stay
    16-bit), internal memory 0.19-1.33x, RW 0.51-0.85x.
    """
    saved = f.weight16 - int(f.weight16 * INT8_WEIGHT_RATIO)
    return dataclasses.replace(
        f, weight16=f.weight16 - saved,
        macs=int(f.macs / INT8_MAC_SPEEDUP),
        compiled_mem_bytes=None if f.compiled_mem_bytes is None else max(0, f.compiled_mem_bytes - saved),
        compiled_cycles=None if f.compiled_cycles is None else int(f.compiled_cycles / INT8_MAC_SPEEDUP))


# -- exclusions ----------------------------------------------------------------------------


def block_anatomy(mg: ModelGraph, block: Block) -> str:
    """What decides a block's compiled tables, whatever its weights (:func:`rkpart.ir.anatomy.ops_anatomy`: the
    definition a stage's weighing uses too).  Blocks with equal anatomy compile to equal layer tables and
    memory statistics, so one build stands for all of them."""
    from rkpart.ir.anatomy import ops_anatomy

    return ops_anatomy(mg, sorted(block.ops))


def mark_exclusions(
    cands: Mapping[int, Sequence[Candidate]],
    *,
    toolkit: str | None,
    known_issues: Sequence[CrashPattern] | None = None,
    compiled: Sequence[str | Path] = (),
    anatomy: Mapping[int, str] | None = None,
) -> dict[int, list[Candidate]]:
    """New candidate lists with ``excluded`` set for known crashes and recorded compile failures.

    ``compiled`` are plan folders that ``rkpart compile`` has written: a stage whose build
    failed (crash or error) with ``toolkit`` excludes the matching candidate for the blocks
    that stage covers; a successful ``.rknn`` artifact replaces the candidate stage's
    ``file_bytes`` / CPU-placed op counts with the real ones, and gives it the compiler's own
    memory and cycles (``compiled_*`` features).  With ``anatomy`` (block index ->
    :func:`block_anatomy`), a build of one block stands for every block of the same anatomy.
    ``known_issues`` are crash patterns; default: the target's table,
    :func:`rkpart.targets.known_issues.crash_patterns`.  An int8 candidate reads int8 builds only
    (failures and tables); without one its stages get :func:`int8_prior` of the fp16 figures
    (``precision_source="prior"``).
    """
    if known_issues is None:
        known_issues = crash_patterns()
    from rkpart.plan.plan import load_plan

    def key(blocks: Sequence[int]) -> tuple[Any, ...]:
        return tuple(anatomy.get(b, f"block{b}") for b in blocks) if anatomy is not None else tuple(blocks)

    failures: dict[tuple[str, Any], str] = {}
    artifacts: dict[tuple[str, tuple[Any, ...], str, str], Any] = {}
    for folder in compiled:
        plan, _ = load_plan(folder)
        cid = candidate_id_for(str(plan.strategy.get("name")), dict(plan.strategy.get("options", {})))
        if cid is None:
            continue
        stage_prec = dict((plan.extra.get("compile") or {}).get("precision", {}).get("stages", {}))
        for s in plan.npu_stages:
            for f in s.failures:
                if (toolkit is None or f.toolkit == toolkit) and f.deterministic:
                    fid = precision_id(cid, stage_prec.get(s.id, "fp16"))
                    for b in s.blocks:
                        failures[(fid, key([b])[0])] = (f"compile failed with rknn-toolkit2 {f.toolkit}: "
                                                        f"{f.message} (plan {folder})")
            art = s.artifact("rknn")
            if art is not None and (toolkit is None or art.toolkit == toolkit):
                artifacts.setdefault((cid, key(s.blocks), s.region, art.precision), art)
    out: dict[int, list[Candidate]] = {}
    for start, lst in cands.items():
        new: list[Candidate] = []
        for c in lst:
            reason = next((failures[(c.id, k)] for k in key(c.blocks) if (c.id, k) in failures), None)
            suspected = None
            if reason is None and toolkit is not None:
                matched = [(p, p.match(toolkit, c.traits())) for p in known_issues]
                known = next((p for p, m in matched if m == "known"), None)
                broad = next((p for p, m in matched if m == "suspected"), None)
                if known is not None:
                    reason = _known(known)
                elif broad is not None:
                    built = [a for g in c.groups if g.device == "npu"
                             if (a := artifacts.get((c.family, key(tuple(g.blocks) or c.blocks), g.region,
                                                     c.precision))) is not None]
                    suspected = _suspected(broad, toolkit, len(built), sum(g.device == "npu" for g in c.groups))
            npu = c.npu
            source = c.precision_source
            if artifacts or c.precision != "fp16":
                npu_groups = [g for g in c.groups if g.device == "npu"]
                fs = list(npu)
                own = [artifacts.get((c.family, key(tuple(g.blocks) or c.blocks), g.region, c.precision))
                       for g in npu_groups]
                # an int8 candidate without int8 builds of every stage: the prior over the fp16 figures
                prior = c.precision != "fp16" and any(a is None for a in own)
                for i, g in enumerate(npu_groups):
                    art = own[i] if not prior else artifacts.get((c.family, key(tuple(g.blocks) or c.blocks),
                                                                   g.region, "fp16"))
                    if art is not None:
                        cp = art.compiler
                        fs[i] = dataclasses.replace(
                            fs[i], file_bytes=art.size_bytes, rknn_bytes=art.size_bytes, cpu_ops=len(art.cpu_ops),
                            compiled_mem_bytes=None if cp is None else cp.device_mem_bytes,
                            compiled_cycles=None if cp is None else cp.cycles_total,
                            compiled_rw_bytes=None if cp is None else cp.rw_bytes)
                    if prior:
                        fs[i] = int8_prior(fs[i])
                npu = tuple(fs)
                if c.precision != "fp16":
                    source = "prior" if prior else "compiler"
            new.append(dataclasses.replace(c, excluded=reason, npu=npu, precision_source=source, suspected=suspected))
        out[start] = new
    return out


def _issue_id(p: CrashPattern) -> str:
    return next((i.id for i in KNOWN_ISSUES if p in i.patterns), "from the cost model")


def _known(p: CrashPattern) -> str:
    """The exclusion reason of a known crash: the issue, and the op pattern its reproducers crashed on."""
    sig = SIGNATURES.get(p.signature or "")
    return (f"known issue {_issue_id(p)}: {p.what}; its NPU stage holds the op pattern the recorded reproducers "
            f"crashed on ({sig.what if sig else p.signature})")


def _suspected(p: CrashPattern, toolkit: str, built: int, stages: int) -> str:
    """What a broad match of ``p`` means for a candidate whose NPU stages ``built`` of ``stages`` were compiled."""
    what = (f"suspected {_issue_id(p)} (broad match {','.join(f'{k}={v}' for k, v in p.when.items())}, not its "
            "reproducers' op pattern)")
    if stages and built == stages:
        return f"{what}: built by rknn-toolkit2 {toolkit}"
    return f"{what}: `--toolkit {toolkit}` builds it to decide"


__all__ = ["INT8_PRIOR", "Candidate", "Variant", "block_anatomy", "candidates_from", "int8_prior", "mark_exclusions",
           "with_precisions"]
