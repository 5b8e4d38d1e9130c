"""The ops that make a stage's build fail, found by reducing it, moved to the host (``--repartition``).

``rkpart compile --repartition`` cuts a stage whose build crashed in front of the ops the crash's
known issue (or its last fusion rule) fused.  A failure no cut fixes -- an exception the toolkit
raises in a rule that fuses nothing, or a crash the cuts did not avoid -- is isolated here:

1. **Known failing subgraphs first.**  Every subgraph found failing so far is a *motif*: its ops
   with their shape classes (:func:`rkpart.grouping.capability.pattern_of`: op type, element
   type, ranks, constant inputs, which dims are 1) and the edges between them.  Every occurrence
   of a motif in a failed stage (a subgraph monomorphism, networkx's VF2) goes to the host
   without a build.  Kandinsky 6's q and k RoPE in every text attention are one motif found once.
2. **Else reduce.**  The stage's built file is delta-debugged as ``rkpart repro`` does
   (:func:`rkpart.triage.reduce.reduce_graph`): "fails the same way" is the log's exception line
   with its numbers and shapes generalised (a smaller graph names smaller shapes), or the same
   signal or exit code for a crash, or a build that does not return for a timeout (within
   :func:`hang_limit` seconds of CPU, a few times the plan's slowest successful build).  The smallest failing
   graph's ops are the new motif.  A timeout may be the machine's (a large stage on a slow
   machine): then no smaller graph hangs, nothing is found and nothing moves.

A reduction is bounded (:data:`REDUCE_SECONDS`); the smallest failing graph found by then counts.
Each stage file (by content) is reduced once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import networkx as nx
from networkx.algorithms import isomorphism

from rkpart.compile.runner import read_log
from rkpart.errors import UserError
from rkpart.io import file_sha256
from rkpart.progress import Progress

if TYPE_CHECKING:  # compile is imported when a stage is reduced, not with the module
    from rkpart.compile.compile import CompileOptions, CompileReport, StageOutcome
    from rkpart.ir import ModelGraph
    from rkpart.targets.capability import PlacementPattern
    from rkpart.types import BuildFailure

#: seconds one failed stage's reduction may take
REDUCE_SECONDS = 600.0
#: failures a move can work around (the graph's fault); OOM, disk and resource limits are the machine's.  A
#: timeout may be either: the reduction decides (a smaller graph that still does not return is the graph's)
_ISOLATABLE = ("crash", "error", "timeout")
#: a reduction candidate of a stage whose build timed out "does not return" after this many times the CPU
#: seconds of the plan's slowest successful build (at least :data:`HANG_MIN_S`, or the compile's hang floor
#: when that is lower; at most ``--timeout``)
HANG_FACTOR = 3.0
HANG_MIN_S = 30.0
#: a candidate's wall-clock limit is this many times its CPU limit (a build that sleeps, not spins)
HANG_WALL_SLACK = 10.0
#: failing candidates of such a reduction the time budget allows (RFD4's hang: 12 of 25 builds failed)
HANG_FAILED_BUILDS = 15


def exception_line(log_text: str) -> str | None:
    """The last ``SomeError: message`` line of a build log (not a bare ``Traceback`` header)."""
    lines = [ln for ln in re.findall(r"^\s*(?:E\s+[^:]*:\s*)?([A-Z][A-Za-z]*(?:Error|Exception): .*\S)\s*$",
                                     log_text, re.M) if not ln.endswith("Traceback (most recent call last):")]
    return lines[-1][:200] if lines else None


def failure_regex(log_text: str) -> str | None:
    """A regex for "fails the same way" from a build log's last exception line (``ValueError: Can not
    reshape from [5, 2, 4, 1] to [5, 2, 8, 2]``), numbers and bracketed shapes generalised;
    ``None`` when the log has no such line."""
    last = exception_line(log_text)
    if last is None:
        return None
    line = re.sub(r"\[[^\]]*\]", "QQLISTQQ", last)  # a shape of any rank
    line = re.sub(r"-?\d+(?:\.\d+)?", "QQNUMQQ", line)
    return re.escape(line).replace("QQLISTQQ", r"\[[^\]]*\]").replace("QQNUMQQ", r"-?[\d.]+")


@dataclass
class Isolated:
    """What the rounds of one ``--repartition`` learned: stage files reduced, failing subgraphs found."""

    reduced: set[str] = field(default_factory=set)  # sha256 of the stage files reduced
    motifs: list[nx.DiGraph] = field(default_factory=list)


def _shape_class(mg: ModelGraph, i: int) -> PlacementPattern:
    """Op ``i``'s shape class for a motif: its placement pattern without its neighbours (a motif's edges are
    matched as edges; outside it, q's side and k's side of an attention are read by different ops)."""
    from rkpart.grouping.capability import pattern_of

    return dataclasses.replace(pattern_of(mg, i), around="")


def _typed_ops(mg: ModelGraph, ops: Iterable[int]) -> nx.DiGraph:
    """The op DAG of ``mg`` restricted to ``ops``, each node carrying its shape class."""
    ops = set(ops)
    g = nx.DiGraph()
    for i in sorted(ops):
        g.add_node(i, pattern=_shape_class(mg, i))
    g.add_edges_from((a, b) for a in ops for b in mg.ops.successors(a) if b in ops)
    return g


def occurrences(mg: ModelGraph, motif: nx.DiGraph) -> list[set[int]]:
    """Every set of ops of ``mg`` that is a copy of ``motif``: same shape classes, same edges."""
    wanted = {d["pattern"] for _, d in motif.nodes(data=True)}
    types = {p.op_type for p in wanted}
    cand = [i for i in mg.ops.nodes if mg.op(i).op_type in types and _shape_class(mg, i) in wanted]
    host = _typed_ops(mg, cand)
    gm = isomorphism.DiGraphMatcher(host, motif, node_match=lambda a, b: a["pattern"] == b["pattern"])
    found: list[set[int]] = []
    for m in gm.subgraph_monomorphisms_iter():
        ops = set(m)
        if ops not in found:
            found.append(ops)
    return found


def failing_ops(report: CompileReport, folder: Path, opts: CompileOptions, state: Isolated,
                progress: Progress | None = None, max_time: float = REDUCE_SECONDS,
                skip: set[str] | frozenset[str] = frozenset()) -> dict[str, str]:
    """Op name -> why, for the ops of every failed stage of ``report`` that fail its build alone.

    ``opts``: the :class:`~rkpart.compile.compile.CompileOptions` the stages were built with;
    ``skip``: stages a new cut is tried on first.
    """
    from rkpart.ir import load_model

    say = progress or (lambda _m: None)
    stages = {s.id: s for s in report.plan.stages}
    # CPU seconds where measured (a machine shared with other builds stretches wall time, not CPU time)
    slowest = max((o.cpu_s or o.wall_s for o in report.outcomes if o.status == "built"), default=0.0)
    out: dict[str, str] = {}
    for o in report.outcomes:
        if o.status != "failed" or not o.failures or o.stage_id in skip or o.stage_id not in stages:
            continue
        f = o.failures[-1]
        if f.kind not in _ISOLATABLE or not f.log:
            continue
        st = stages[o.stage_id]
        built = folder / ((st.prepared or {}).get("file") or st.file)
        try:
            mg = load_model(built)
            text = read_log(folder / f.log, folder)
        except (UserError, OSError):
            continue
        why = f"the build of stage {o.stage_id} failed ({exception_line(text) or f.message.splitlines()[0][:120]})"
        known = [ops for m in state.motifs for ops in occurrences(mg, m)]
        digest = file_sha256(built)
        if not known and digest not in state.reduced:
            state.reduced.add(digest)
            ops = _reduce(mg, built, o, f, text, opts, max_time, say, folder, slowest)
            if not ops:
                continue
            state.motifs.append(_typed_ops(mg, ops))
            known = occurrences(mg, state.motifs[-1]) or [ops]
        for ops in known:
            kinds = "/".join(mg.op(i).op_type for i in sorted(ops))
            for i in sorted(ops):
                if mg.op(i).name:
                    out.setdefault(mg.op(i).name, f"{why}; it is in a {len(ops)}-op subgraph ({kinds}) that fails "
                                                  "the build the same way alone (reduced as rkpart repro does): "
                                                  "it runs on the host")
    return dict(sorted(out.items()))


def hang_limit(slowest_s: float, timeout: float | None, floor: float = HANG_MIN_S) -> float:
    """CPU seconds after which a reduction candidate of a stage whose build timed out counts as not
    returning: :data:`HANG_FACTOR` times the plan's slowest successful build (``slowest_s``), at least
    ``floor`` (:data:`HANG_MIN_S`), at most ``timeout``."""
    limit = max(floor, HANG_FACTOR * slowest_s)
    return min(limit, timeout) if timeout is not None else limit


def _reduce(mg: ModelGraph, built: Path, o: StageOutcome, f: BuildFailure, text: str, opts: CompileOptions,
            max_time: float, say: Progress,
            folder: Path, slowest_s: float = 0.0) -> set[int]:
    """The ops of ``mg`` (the stage file ``built``) in the smallest graph that fails its build as ``f`` did.

    A timeout is looked for with :func:`hang_limit` per candidate (not the stage's own limit, which
    every failing candidate would cost) and a budget of :data:`HANG_FAILED_BUILDS` such builds."""
    from rkpart.compile.toolkits import Toolkit, find_toolkit
    from rkpart.triage.matrix import BuildSettings
    from rkpart.triage.reduce import FailureSpec, ReductionError, reduce_graph

    tk = opts.toolkit if isinstance(opts.toolkit, Toolkit) else find_toolkit(str(opts.toolkit), opts.toolkits_dir)
    spec = FailureSpec(kind=f.kind, signal=f.signal, exit_code=f.exit_code,
                       signature=None if f.kind == "timeout" else f.signature,
                       fail_regex=failure_regex(text) if f.kind == "error" else None)
    say(f"stage {o.stage_id} failed in a way no cut fixes: reducing it to the ops that fail "
        f"({spec.describe()}; at most {max_time:.0f} s)")
    cpu: float | None = None
    if f.kind == "timeout":
        # in CPU seconds, as a default compile judged the stage (rkpart.compile.hang): its hang floor, when
        # lower than HANG_MIN_S, is the floor here too
        cpu = hang_limit(slowest_s, opts.timeout, min(HANG_MIN_S, opts.hang_floor) if opts.hang_floor > 0
                         else HANG_MIN_S)
        limit = HANG_WALL_SLACK * cpu if opts.timeout is None else min(opts.timeout, HANG_WALL_SLACK * cpu)
        max_time = max(max_time, HANG_FAILED_BUILDS * cpu)
    else:  # a candidate may hang the toolkit as a stage can: never longer than 5 failed builds
        limit = opts.timeout if opts.timeout is not None else max(60.0, 5 * o.wall_s)
    scratch = folder / "rknn" / ".tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix=f"reduce-{o.stage_id}-", dir=scratch) as work:
            red = reduce_graph(built, tk, spec, BuildSettings(target=opts.target, config=dict(opts.config),
                                                              timeout=limit, worker=opts.worker, cpu_limit=cpu),
                               work=Path(work), max_time=max_time, max_linear_passes=2, progress=say)
            names = {n.name for n in red.model.graph.node if n.name}
    except (ReductionError, UserError) as e:
        say(f"stage {o.stage_id}: not reduced ({e})")
        return set()
    finally:
        with contextlib.suppress(OSError):
            scratch.rmdir()
    ops = {i for i in mg.ops.nodes if mg.op(i).name in names}
    say(f"stage {o.stage_id}: {len(ops)} op(s) of {red.original_nodes} fail the build alone "
        f"({red.builds} builds, {red.wall_s:.0f} s): " + ", ".join(sorted(mg.op(i).op_type for i in ops)))
    return ops


__all__ = ["HANG_FACTOR", "HANG_FAILED_BUILDS", "HANG_MIN_S", "REDUCE_SECONDS", "Isolated", "exception_line",
           "failing_ops", "failure_regex", "hang_limit", "occurrences"]
