"""Placements learned from builds: which op patterns a toolkit put on the CPU inside NPU stages.

After every ``rkpart compile``, each layer the toolkit's layer table places on the CPU inside an
NPU stage is traced back to the ONNX op of the stage it came from (the table's ``FullName`` is
``OpType:node name``) and recorded per target and toolkit as a
:class:`~rkpart.targets.capability.PlacementPattern` (op type, element type, input ranks,
which input and output dims are 1, the sizes of every input and output, and the attributes that
decide its layout, such as a ``Transpose``'s ``perm``).
Every later ``rkpart partition`` for that toolkit reads the store
(:func:`rkpart.grouping.propose.propose`) and keeps such ops out of NPU stages unless a rewrite
removes them, for any model: what one family's build taught holds for an op of exactly the same
shapes and layout in the next family, and for nothing else.

**What is learned is checked by every later build.**  After a compile, every op of every NPU
stage it built (or took from the build cache) whose pattern the store holds, and that the build
did *not* place on the CPU, is evidence against the pattern (:func:`contradict`): the pattern is
kept in the store with that example under ``npu`` and is no longer applied
(:func:`load_learned` returns only the patterns no build ran on the NPU).  So a pattern whose
placement turns on more than its shapes (the op's neighbours, the stage's boundary) stops moving
ops after the first build that shows it on the NPU, and a build that puts it on the CPU again
does not revive it: that plan's own layer is moved by ``rkpart compile --repartition``, by name,
which holds for that plan alone.

**A move the store made is checked by a build of the stage it lands in** under ``rkpart compile
--repartition`` (:func:`rkpart.repartition.compile_repartition`, round 0): when the plan has ops a
learned placement moved to the host, it is partitioned again without the learned placements and
the stages that change (those the moved ops land in) are built; every pattern whose op runs on the
NPU there is contradicted as above (and the op stays on the NPU), and the ops that run on the CPU
are that plan's CPU layers, moved by the rounds.  A plain ``rkpart compile`` does not re-partition,
so it checks only the ops its plan holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import stat
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx

from rkpart.errors import UserError
from rkpart.io import atomic_write_bytes, default_cache_dir
from rkpart.ir import ModelGraph
from rkpart.readers import FileKind
from rkpart.targets import TARGETS, get_target
from rkpart.targets.capability import Capability, PlacementPattern, find_learned

PLACEMENT_DIR = "placement"
FORMAT = "rkpart-learned-placement"
# 2: patterns carry which dims are 1 (a store of version 1 is re-learned); 3: a reversing Slice is a form of its own;
# 4: the op giving a stage output of rank > 4 is the boundary's, not learned (a version-3 store may hold such rows);
# 5: patterns carry sizes and layout attributes, and the builds that ran one on the NPU ("npu": not applied);
# 6: patterns carry the op's data neighbours (PlacementPattern.around)
VERSION = 6
#: a store larger than this is not a store rkpart wrote (patterns are few)
_MAX_BYTES = 4 << 20
#: layers kept per pattern as examples (where it was learned)
_EXAMPLES = 5


@dataclass(frozen=True)
class CpuLayer:
    """One CPU layer of a build, traced back to its ONNX op (``op`` is ``None`` when it cannot be)."""

    stage: str
    layer: str  # the layer table's FullName
    op: str | None  # the ONNX node name in the stage
    pattern: PlacementPattern | None  # None for a layer that is not the op itself
    #: the layer is a conversion the toolkit inserted for a stage output the op produces
    #: (``Reshape:<tensor>-rs``), or for a stage input the op reads (``side="input"``: NucleusMoE's
    #: routed-token ``GatherND`` became ``Reshape:<indices>_rs`` and ``Gather:<tokens>_gather`` on
    #: the CPU): moving the op moves the boundary, but the op's pattern is not learned (the same
    #: op elsewhere runs on the NPU)
    boundary: bool = False
    side: str = "output"
    #: bytes of the op's computed inputs and outputs (what the layer's NPU -> CPU -> NPU round trip moves;
    #: 0 when not traced): ``--repartition`` weighs a round's moves against the layers they remove by it
    nbytes: int = 0


def store_path(target: str, toolkit: str, root: Path | None = None) -> Path:
    """The store of one target and toolkit (``root``: the cache folder, default ``$RKPART_CACHE_DIR``)."""
    safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in f"{target.lower()}-{toolkit}")
    return (root or default_cache_dir()) / PLACEMENT_DIR / f"{safe}.json"


def load_learned(target: str, toolkit: str, root: Path | None = None) -> frozenset[PlacementPattern]:
    """The patterns learned so far for ``target``/``toolkit`` that no build contradicted (empty when
    none, or the store is damaged)."""
    return frozenset(p for p, row in _read(store_path(target, toolkit, root)).items() if not row.npu)


def load_contradicted(target: str, toolkit: str, root: Path | None = None) -> frozenset[PlacementPattern]:
    """The patterns a build put on the CPU and a later build ran on the NPU: held, not applied."""
    return frozenset(p for p, row in _read(store_path(target, toolkit, root)).items() if row.npu)


@dataclass
class _Row:
    """What the store holds of one pattern: where a build put it on the CPU, and where one ran it on the NPU."""

    cpu: list[str]
    npu: list[str]


#: the store, read through rkpart's one reader (issue 51): a FIFO there hung every partition, a
#: symlink to /dev/zero read until the process was killed
STORE_KIND = FileKind("learned-placement store", "json", _MAX_BYTES, UserError, symlinks=False,
                      doc="`$RKPART_CACHE_DIR/placement/<target>-<toolkit>.json`, read by `partition --toolkit`")


def _read(path: Path) -> dict[PlacementPattern, _Row]:
    if not os.path.lexists(path):
        return {}
    try:
        d = STORE_KIND.load(path, root=path.parent)
    except UserError:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            return {}  # damaged knowledge: read as empty, re-learned and replaced by the next compile
        raise  # a FIFO, a device, a symlink: refused in one line, never read
    if not isinstance(d, dict) or d.get("format") != FORMAT or not isinstance(d.get("patterns"), list):
        return {}
    if d.get("version") != VERSION:  # an older store's classes are coarser: re-learned by the next builds
        return {}
    out: dict[PlacementPattern, _Row] = {}
    for row in d["patterns"]:
        try:
            p = PlacementPattern.from_json(row)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # a damaged row is skipped, the rest still counts
        out[p] = _Row(_examples(row.get("examples")), _examples(row.get("npu")))
    return out


def _examples(ex: object) -> list[str]:
    return sorted({str(e)[:300] for e in ex} if isinstance(ex, list) else set())[:_EXAMPLES]


def _update(target: str, toolkit: str, root: Path | None,
            change: Callable[[dict[PlacementPattern, _Row]], None]) -> None:
    """Read the store, ``change`` it in place, and write it back when it changed (under the folder's lock)."""
    path = store_path(target, toolkit, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent):
        known = _read(path)
        before = {p: _Row(list(r.cpu), list(r.npu)) for p, r in known.items()}
        change(known)
        if known != before or not path.is_file():
            rows = []
            for p in sorted(known):
                row = {**p.to_json(), "examples": known[p].cpu}
                if known[p].npu:
                    row["npu"] = known[p].npu
                rows.append(row)
            doc = {"format": FORMAT, "version": VERSION, "target": target.lower(), "toolkit": toolkit,
                   "patterns": rows}
            atomic_write_bytes(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())


def learn(target: str, toolkit: str, layers: Iterable[CpuLayer], root: Path | None = None) -> list[PlacementPattern]:
    """Add the patterns of ``layers`` to the store; returns the patterns it did not hold before.

    Layers without a pattern (not traced to an op) are skipped.  Each pattern keeps up to five
    example layers (``stage: FullName``); nothing is written when nothing changes.  A pattern a
    build already ran on the NPU stays contradicted (not applied): its CPU example is added, and
    it is not returned.
    """
    rows = [(x, x.pattern) for x in layers if x.pattern is not None]
    if not rows:
        return []
    new: list[PlacementPattern] = []

    def change(known: dict[PlacementPattern, _Row]) -> None:
        new.extend(pat for _, pat in rows if pat not in known)
        for x, pat in rows:
            row = known.setdefault(pat, _Row([], []))
            row.cpu = sorted({*row.cpu, f"{x.stage}: {x.layer}"[:300]})[:_EXAMPLES]

    _update(target, toolkit, root, change)
    return sorted(set(new))


@dataclass(frozen=True)
class NpuOp:
    """An op of a built NPU stage that the build did not place on the CPU, with its pattern."""

    stage: str
    op: str  # the ONNX node name
    pattern: PlacementPattern


def contradict(target: str, toolkit: str, seen: Iterable[NpuOp], root: Path | None = None) -> list[PlacementPattern]:
    """Record that builds ran the ops ``seen`` on the NPU; returns the patterns this stops applying.

    Only patterns the store holds are touched (what runs on the NPU is not itself learned).  A
    contradicted pattern keeps its examples both ways and is no longer returned by
    :func:`load_learned`.
    """
    seen = list(seen)
    if not seen or not os.path.lexists(store_path(target, toolkit, root)):
        return []
    dropped: list[PlacementPattern] = []

    def change(known: dict[PlacementPattern, _Row]) -> None:
        for x in seen:
            row = known.get(x.pattern)
            if row is None:
                continue
            if not row.npu:
                dropped.append(x.pattern)
            row.npu = sorted({*row.npu, f"{x.stage}: {x.op}"[:300]})[:_EXAMPLES]

    _update(target, toolkit, root, change)
    return sorted(set(dropped))


def npu_ops(stage_id: str, stage_onnx: Path, layers: Iterable[CpuLayer],
            patterns: Collection[PlacementPattern], screen: Path | None = None, like: Path | None = None
            ) -> list[NpuOp]:
    """The ops of the built ``stage_onnx`` whose pattern is one of ``patterns`` and that its build (whose
    CPU layers, traced, are ``layers``) did not place on the CPU: evidence against those patterns.

    An op named by any CPU layer (itself, or the boundary conversion it feeds) is no evidence; nor is
    any op of a type the build has an untraced CPU layer of (the toolkit may have renamed it).

    ``screen``: a file read first, graph only, to rule the stage out cheaply (the plan's stage file, whose
    weights are external, when ``stage_onnx`` is a prepared copy holding them inline: 130 MB read in 1 s
    and 5 s to load as a graph, per real-width attention stage).  A stage none of whose ops has a
    candidate type and, where the file records it, a candidate output shape is not loaded.
    ``like``: the plan's own file of the stage, patterns read from it as :func:`trace_cpu_layers` reads them.
    """
    from rkpart.ir import load_model

    types = {p.op_type for p in patterns}
    outs: dict[str, set[str]] = {}
    for p in patterns:
        outs.setdefault(p.op_type, set()).add(p.shapes.partition(">")[2] if p.shapes else "")
    layers = list(layers)
    on_cpu = {x.op for x in layers if x.op is not None}
    untraced = {x.layer.partition(":")[0] for x in layers if x.op is None}
    head = onnx.load(str(screen or stage_onnx), load_external_data=False)
    g = head.graph
    known = {vi.name: vi.type.tensor_type.shape for vi in (*g.value_info, *g.input, *g.output)
             if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}

    def may_match(n: onnx.NodeProto) -> bool:
        if n.op_type not in types or n.op_type in untraced or n.name in on_cpu:
            return False
        if "" in outs[n.op_type] or not all(t in known for t in n.output if t):
            return True  # a pattern without sizes, or an output the file does not record: load to know
        dims = [[d.dim_value if d.HasField("dim_value") else -1 for d in known[t].dim] for t in n.output if t]
        got = ";".join(",".join(str(d) if d >= 0 else "?" for d in s) for s in dims)
        return got in outs[n.op_type]

    if not any(may_match(n) for n in g.node):
        return []
    mg = load_model(stage_onnx)
    plan_graph = _like(like, stage_onnx)
    out = []
    for i in sorted(mg.ops.nodes):
        n = mg.op(i)
        if n.op_type not in types or n.op_type in untraced or not n.name or n.name in on_cpu:
            continue
        hit = find_learned(patterns, _pattern(mg, i, plan_graph))
        if hit is not None:  # evidence against the stored pattern (its "*" matched this stage's neighbours)
            out.append(NpuOp(stage_id, n.name, hit))
    return out


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """A blocking exclusive lock on ``folder`` (concurrent compiles wait for each other's write)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def target_capability(target: str, version: str | None, *, learned: bool = True, rewrites: bool = True,
                      root: Path | None = None) -> Capability | None:
    """The :class:`~rkpart.targets.capability.Capability` of rknn-toolkit2 ``version`` (``None``: the
    target's default; a python path is resolved to its version by the caller,
    :func:`rkpart.compile.toolkits.toolkit_version`) with the placements learned so far, or ``None``
    for a target rkpart has no table for."""
    if target.lower() not in TARGETS:
        return None
    tgt = get_target(target)
    caps = tgt.caps(version)
    known = load_learned(tgt.name, caps.version, root) if learned else frozenset()
    return Capability(tgt.name, caps, known, rewrites)


def _like(like: Path | None, built: Path) -> tuple[ModelGraph, dict[str, int]] | None:
    """The plan's own stage file ``like`` as a graph with its ops by name, when it is not the built file
    (``None``: no such file, or it does not load)."""
    from rkpart.ir import load_model

    if like is None or like == built:
        return None
    try:
        g = load_model(like)
    except UserError:
        return None
    return g, {g.op(k).name: k for k in range(g.num_ops) if g.op(k).name}


def _pattern(mg: ModelGraph, i: int, like: tuple[ModelGraph, dict[str, int]] | None) -> PlacementPattern:
    """Op ``i``'s pattern, read from the plan's stage file when it has the op (see :func:`trace_cpu_layers`)."""
    from rkpart.grouping.capability import pattern_of

    name = mg.op(i).name
    if like is not None and name in like[1] and like[1][name] in like[0].ops.nodes:
        return pattern_of(like[0], like[1][name])
    return pattern_of(mg, i)


def trace_cpu_layers(stage_id: str, stage_onnx: Path, cpu_ops: Iterable[str], like: Path | None = None
                     ) -> list[CpuLayer]:
    """The CPU layers ``cpu_ops`` (the table's FullNames) of the build of ``stage_onnx``, traced to ops.

    The stage is loaded as a graph (weights not read) so each op's pattern has the same input
    ranks and types as in the model it was cut from.  ``like``: the plan's own file of the stage when
    ``stage_onnx`` is a prepared copy (rewritten or lowered): an op it holds by name gets its pattern from
    there, its sizes and neighbours as the model has them (a rewrite may have put a Reshape before it), so
    that the next partition, which matches the model's ops, finds it.
    """
    from rkpart.grouping.views import NPU_INPUT_RANK
    from rkpart.ir import load_model

    names = [n for n in cpu_ops]
    if not names:
        return []
    mg = load_model(stage_onnx)
    plan_graph = _like(like, stage_onnx)
    by_name: dict[str, int] = {}
    for k in range(mg.num_ops):
        if mg.op(k).name:
            by_name.setdefault(mg.op(k).name, k)
    out = []
    for full in names:
        _, _, node = full.partition(":")
        i = by_name.get(node) if node else None
        if i is not None and i in mg.ops.nodes:
            if any(len(mg.shape(t) or ()) > NPU_INPUT_RANK for t in mg.op(i).outputs if t in mg.outputs):
                # measured, 2.3.0: the op that gives a stage output of rank > 4 runs on the CPU, whatever it
                # is (a Reshape to rank 5 and back inside a stage builds with no CPU layer): the boundary's
                # doing, not the op's, so it moves and is not learned (Sana-WM's rank-5 views had taught
                # "every rank 4 -> 5 Reshape", and the rounds then emptied its linear attention onto the host)
                out.append(CpuLayer(stage_id, full, mg.op(i).name, None, boundary=True))
                continue
            out.append(CpuLayer(stage_id, full, mg.op(i).name, _pattern(mg, i, plan_graph)))
            continue
        # a conversion the toolkit inserted for a tensor: "<tensor>-rs"; the stage output's producer,
        # or the ops reading a stage input
        base: str = re.sub(r"#\d+$", "", node)  # "Reshape:select_1_rs#1": the toolkit's second such layer
        p: int | None = None
        readers: list[int] = []
        converted: int | None = None
        for _ in range(8):  # "<tensor>_tp_rs_mm_rs_rs": a chain of conversions
            base = re.sub(r"[-_][A-Za-z0-9]+$", "", base)
            if base in by_name and by_name[base] in mg.ops.nodes:
                # the op itself, turned into another by the toolkit: "Slice:<op>_2sl" for a Gather of one index
                converted = by_name[base]
                break
            if base in mg.outputs:
                p = mg.producer.get(base)
                break
            if base in mg.inputs:
                readers = [c for c in mg.consumers.get(base, []) if c in mg.ops.nodes and mg.op(c).name]
                break
            users = sorted({c for c in mg.consumers.get(base, []) if c in mg.ops.nodes})
            if base in mg.producer and len(users) == 1 and mg.op(users[0]).name:
                # an inner tensor converted for the one op that reads it: the toolkit decomposed that op
                # (Sana-WM's camera Einsum became "Reshape:view_119_tp_rs" and a chain after a MatMul)
                converted = users[0]
                break
            if base in mg.producer and len(users) > 1:
                # an inner tensor converted for all its readers (AnyFlow-FAR's rank-5 KV-cache slice on
                # 2.3.0): its producer moves, the tensor becomes a stage input (then its readers follow)
                p = mg.producer[base]
                break
        if converted is not None:
            out.append(CpuLayer(stage_id, full, mg.op(converted).name, _pattern(mg, converted, plan_graph)))
            continue
        if p is not None and p in mg.ops.nodes and mg.op(p).name:
            out.append(CpuLayer(stage_id, full, mg.op(p).name, None, boundary=True))
            continue
        if readers:  # the input converted on the CPU for the ops that read it: they move, the input with them
            out += [CpuLayer(stage_id, full, mg.op(c).name, None, boundary=True, side="input") for c in readers]
            continue
        out.append(CpuLayer(stage_id, full, None, None))
    return [dataclasses.replace(x, nbytes=_op_bytes(mg, by_name[x.op])) if x.op in by_name else x for x in out]


def _op_bytes(mg: ModelGraph, i: int) -> int:
    """Bytes of op ``i``'s computed (not constant) inputs and outputs."""
    n = mg.op(i)
    return sum(mg.nbytes(t) for t in (*n.inputs, *n.outputs) if t and not mg.is_const_tensor(t))


def forced_host(layers: Iterable[CpuLayer]) -> Mapping[str, str]:
    """Op name -> why, for the traced layers of one plan's build (``rkpart compile --repartition``)."""
    out: dict[str, str] = {}
    for x in layers:
        if x.op is not None and x.boundary and x.side == "input":
            out.setdefault(x.op, f"the last build of stage {x.stage} converted an input it reads on the CPU "
                                 f"(layer {x.layer}): the stage boundary moves after it")
        elif x.op is not None and x.boundary:
            out.setdefault(x.op, f"the last build of stage {x.stage} converted its output on the CPU (layer "
                                 f"{x.layer}): the stage boundary moves before it")
        elif x.op is not None:
            out.setdefault(x.op, f"placed on the CPU by the last build of stage {x.stage} (layer {x.layer}), "
                                 "after rkpart's rewrites")
    return dict(sorted(out.items()))


__all__ = ["CpuLayer", "NpuOp", "contradict", "forced_host", "learn", "load_contradicted", "load_learned", "npu_ops",
           "store_path", "target_capability", "trace_cpu_layers"]
