"""Candidate partitions of each block, with their features and what rules them out.

Per block (or run of consecutive blocks) the candidates are:

``split``            one NPU stage per branch, AdaLN + gates + residuals on the host
``split-adaln-npu``  one NPU stage per branch with its AdaLN inside; residuals on the host
``fused``            the whole block (AdaLN, residuals, modulation) in one NPU stage
``fused-xK``         K consecutive blocks in one NPU stage (K = 2 .. ``max_run``)
``<plugin>``         any registered strategy whose stages each stay inside one block

Groups come from the strategies themselves (``SplitStrategy.propose`` sliced per block; the
pipeline proposes the whole-model partitions and hands them over, so this module never
calls a strategy), and a chosen candidate is exactly the stage that strategy would have
written.  Residency
(per-stage vs resident) is not part of a candidate: :mod:`rkpart.cost_model.select`
evaluates every candidate under each residency.

A candidate is *excluded*, never silently chosen, when the toolkit is known to crash on it
(a failure recorded by ``rkpart compile`` in a plan, or a crash pattern of the target's
known-issue table, :mod:`rkpart.targets.known_issues`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkpart.cost_model.features import Features, group_features
from rkpart.ir import ModelGraph
from rkpart.partitioner.discovery import Block, Discovery
from rkpart.partitioner.partition import Group, Partition, block_id
from rkpart.targets.known_issues import crash_patterns

#: strategies the auto strategy builds candidates from itself (or must not recurse into)
OWN_STRATEGIES = frozenset({"split", "fused", "custom", "auto", "generic"})
#: one candidate family: (candidate id, a partition of the whole model, options recorded for it)
Variant = tuple[str, Partition, Mapping[str, Any]]

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
    options: Mapping[str, Any] = field(default_factory=dict)
    excluded: str | None = None  # why it must not be chosen (toolkit crash ...)

    @property
    def start(self) -> int:
        return self.blocks[0]

    def traits(self) -> dict[str, Any]:
        return {"adaln_on_npu": self.adaln_on_npu, "residual_on_npu": self.residual_on_npu,
                "layernorm": self.layernorm, "candidate": self.id}

    @property
    def accuracy_key(self) -> str:
        return f"adaln={'npu' if self.adaln_on_npu else 'host'},residual={'npu' if self.residual_on_npu else 'host'}"


def _layernorm_form(mg: ModelGraph, b: Block) -> str:
    ops = {mg.op(i).op_type for r in b.regions for i in r.pre}
    return "decomposed" if "ReduceMean" in ops and "LayerNormalization" not in ops else "op"


def _make(mg: ModelGraph, disc: Discovery, cid: str, run: Sequence[Block], groups: Iterable[Group],
          options: Mapping[str, Any]) -> Candidate:
    groups = tuple(groups)
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
    return Candidate(id=cid, blocks=tuple(b.index for b in run), groups=groups, npu=npu, host=host,
                     adaln_on_npu=bool(pre & npu_ops), residual_on_npu=bool(adds & npu_ops),
                     layernorm="decomposed" if "decomposed" in forms else "op", options=dict(options))


def _per_block(part: Partition, blocks: Sequence[Block]) -> dict[int, list[Group]]:
    """The groups of each block; a block's ops no group of that block holds (what
    ``GroupBuilder.add_host_rest`` leaves on the host without a block) become one host group
    of the block, so that every candidate is costed for the whole block."""
    out: dict[int, list[Group]] = {}
    for g in part.groups:
        if g.block is None:
            continue
        out.setdefault(g.block, []).append(g)
    for b in blocks:
        gs = out.get(b.index)
        if not gs:
            continue
        rest = b.ops - frozenset().union(*(g.ops for g in gs))
        if rest:
            gs.append(Group(id=f"{block_id(b)}.host-rest", device="host", ops=frozenset(rest), region="host",
                            kind="host", block=b.index, blocks=(b.index,)))
    return out


def candidates_from(
    mg: ModelGraph,
    disc: Discovery,
    variants: Sequence[Variant],
    *,
    max_run: int = 2,
) -> dict[int, list[Candidate]]:
    """Candidates starting at each block index (runs are listed at their first block).

    ``variants`` are whole-model partitions (``(candidate id, partition, options)``, as
    :func:`rkpart.pipeline.candidate_variants` proposes them with the strategies): each is
    sliced per block, skipping blocks whose stages span several blocks.  Runs of
    ``2 .. max_run`` fused blocks are added as ``fused-xK``.
    """
    blocks = list(disc.blocks)
    out: dict[int, list[Candidate]] = {b.index: [] for b in blocks}
    for cid, part, opts in variants:
        per = _per_block(part, blocks)
        for b in blocks:
            gs = per.get(b.index, [])
            if any(len(g.blocks) > 1 for g in gs):
                continue
            if gs:
                out[b.index].append(_make(mg, disc, cid, [b], gs, opts))
    # what the fused strategy does to its stages: index work on integer model inputs runs on the host
    index = frozenset(mg.input_index_ops()) if max_run >= 2 else frozenset()
    for k in range(2, max_run + 1):
        for start in range(0, len(blocks) - k + 1):
            run = blocks[start:start + k]
            ids = tuple(b.index for b in run)
            gid = f"{block_id(run[0])}-{block_id(run[-1])}.block"
            ops = frozenset().union(*(b.ops for b in run))
            groups = [Group(id=gid, device="npu", ops=ops - index, region="block", kind="block",
                            block=run[0].index, blocks=ids)]
            if ops & index:  # costed as the run's host work, as a single fused block's is
                groups.append(Group(id=f"{gid}.host-rest", device="host", ops=ops & index, region="host",
                                    kind="host", block=run[0].index, blocks=ids))
            out[run[0].index].append(_make(mg, disc, f"fused-x{k}", run, groups,
                                           {"strategy": "fused", "blocks_per_stage": k}))
    return out


# -- exclusions ----------------------------------------------------------------------------


def candidate_id_for(strategy: str, options: Mapping[str, Any]) -> str | None:
    """The candidate id a plan made with ``strategy``/``options`` corresponds to (or ``None``)."""
    if strategy == "split":
        return "split-adaln-npu" if options.get("adaln") == "npu" else (
            "split" if options.get("residual", "host") == "host" else None)
    if strategy == "fused":
        k = int(options.get("blocks_per_stage", 1))
        return "fused" if k == 1 else f"fused-x{k}"
    return strategy if strategy not in OWN_STRATEGIES else None


def _matches(when: Mapping[str, Any], traits: Mapping[str, Any]) -> bool:
    return all(traits.get(k) == v for k, v in when.items())


def block_anatomy(mg: ModelGraph, block: Block) -> str:
    """What decides a block's compiled tables, whatever its weights: its ops in model order with
    their types, attributes and tensor types (names left out).  Blocks with equal anatomy compile to
    equal layer tables and memory statistics, so one build stands for all of them."""
    import hashlib

    import onnx

    h = hashlib.sha256()
    local: dict[str, int] = {}

    def ref(t: str) -> str:
        tt = mg.tensor_types.get(t)
        ty = "?" if tt is None else f"{tt[0]}{list(tt[1])}"
        if mg.is_const_tensor(t):
            return f"c:{ty}"
        return f"{local.setdefault(t, len(local))}:{ty}"

    for i in sorted(block.ops):
        n = mg.op(i)
        attrs = [f"{k}={v.SerializeToString().hex() if isinstance(v, onnx.TensorProto) else v!r}"
                 for k, v in n.attrs.items()]
        h.update(f"{n.domain}:{n.op_type}({','.join(ref(t) for t in n.inputs if t)})->"
                 f"({','.join(ref(t) for t in n.outputs if t)})[{';'.join(attrs)}]\n".encode())
    return h.hexdigest()[:16]


def mark_exclusions(
    cands: Mapping[int, Sequence[Candidate]],
    *,
    toolkit: str | None,
    known_issues: Sequence[Mapping[str, Any]] | None = None,
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
    ``known_issues`` are crash pattern rows (``{"toolkit", "when", "what"}``, as cost-model files
    carry them); default: the target's table, :func:`rkpart.targets.known_issues.crash_patterns`.
    """
    if known_issues is None:
        known_issues = [p.to_json() for p in crash_patterns()]
    from rkpart.partitioner.plan import load_plan

    def key(blocks: Sequence[int]) -> tuple[Any, ...]:
        return tuple(anatomy.get(b, f"block{b}") for b in blocks) if anatomy is not None else tuple(blocks)

    failures: dict[tuple[str, Any], str] = {}
    artifacts: dict[tuple[str, tuple[Any, ...], str], Any] = {}
    for folder in compiled:
        plan, _ = load_plan(folder)
        cid = candidate_id_for(str(plan.strategy.get("name")), dict(plan.strategy.get("options", {})))
        if cid is None:
            continue
        for s in plan.npu_stages:
            for f in s.failures:
                if (toolkit is None or f.toolkit == toolkit) and f.deterministic:
                    for b in s.blocks:
                        failures[(cid, key([b])[0])] = (f"compile failed with rknn-toolkit2 {f.toolkit}: "
                                                        f"{f.message} (plan {folder})")
            art = s.artifact("rknn")
            if art is not None and (toolkit is None or art.toolkit == toolkit):
                artifacts.setdefault((cid, key(s.blocks), s.region), art)
    out: dict[int, list[Candidate]] = {}
    for start, lst in cands.items():
        new: list[Candidate] = []
        for c in lst:
            reason = next((failures[(c.id, k)] for k in key(c.blocks) if (c.id, k) in failures), None)
            if reason is None and toolkit is not None:
                for row in known_issues:
                    if str(row.get("toolkit")) == toolkit and _matches(row.get("when", {}), c.traits()):
                        reason = f"known issue: {row.get('what')}"
                        break
            npu = c.npu
            if artifacts:
                npu_groups = [g for g in c.groups if g.device == "npu"]
                fs = list(npu)
                for i, g in enumerate(npu_groups):
                    art = artifacts.get((c.id, key(tuple(g.blocks) or c.blocks), g.region))
                    if art is not None:
                        cp = art.compiler
                        fs[i] = dataclasses.replace(
                            fs[i], file_bytes=art.size_bytes, rknn_bytes=art.size_bytes, cpu_ops=len(art.cpu_ops),
                            compiled_mem_bytes=None if cp is None else cp.device_mem_bytes,
                            compiled_cycles=None if cp is None else cp.cycles_total,
                            compiled_rw_bytes=None if cp is None else cp.rw_bytes)
                npu = tuple(fs)
            new.append(dataclasses.replace(c, excluded=reason, npu=npu))
        out[start] = new
    return out


__all__ = ["OWN_STRATEGIES", "Candidate", "Variant", "block_anatomy", "candidate_id_for", "candidates_from",
           "mark_exclusions"]
