"""Delta-debug a graph that breaks the toolkit down to a minimal subgraph that breaks it the same way.

Modelled on Polygraphy's ``debug reduce``: bisect first, then linear.

* **Bisect.** Over the topologically ordered ops ``P``: binary-search the shortest prefix
  ``P[:k]`` that still fails (dropping everything after the failure), then the latest start
  ``j`` such that ``P[j:k]`` still fails (dropping everything before it).  Each probe cuts
  the graph in halves of the remaining range; ``log2(n)`` builds per side.
* **Linear.** Remove the remaining ops one at a time (last first); a removal is kept when the
  smaller graph still fails the same way.  Passes repeat until one removes nothing.

Every candidate is a valid, statically shaped graph (:class:`Cutter`), is built by the compile runner in its own
subprocess, and its outcome is cached by graph hash (in memory and in ``outcomes.json`` of
the work folder, so an interrupted reduction resumes).  ``max_time`` is checked before each
build; when it runs out, the smallest failing graph found so far is the result.

"Fails the same way" (:class:`FailureSpec`): with a ``fail_regex``, the regex matches the
build log; otherwise the same outcome kind and signal (crash) or exit code (error) as the
reference build, and the same known signature if the reference had one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from rkpart.compile.runner import BuildResult
from rkpart.compile.toolkits import Toolkit
from rkpart.errors import UserError
from rkpart.io import atomic_write_bytes
from rkpart.ir import ModelGraph, load_model
from rkpart.ir.standalone import subgraph_model
from rkpart.progress import Progress
from rkpart.readers import FileKind
from rkpart.targets.known_issues import match_signature
from rkpart.triage.matrix import BuildSettings, MatrixRow, build_once, describe_outcome
from rkpart.types import JsonObject

#: seed of the ONNX Runtime run that gives frozen (non-float) cut tensors their values
FREEZE_SEED = 0


def graph_hash(model: onnx.ModelProto) -> str:
    """sha256 of the deterministic serialisation: equal graphs share cached build outcomes."""
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


@dataclass(frozen=True)
class Candidate:
    """One cut-down graph: the ops it keeps (op indices of ``Cutter.mg``) and its model."""

    ops: tuple[int, ...]
    model: onnx.ModelProto
    digest: str

    @property
    def num_nodes(self) -> int:
        return len(self.model.graph.node)


class Cutter:
    """A loaded model cut down to any subset of its data ops, each a valid, statically shaped graph.

    The boundary is the graph's :meth:`~rkpart.ir.ModelGraph.subgraph` view with
    ``sinks=True`` (a kept op's outputs are graph outputs when nothing kept reads them), built
    by :func:`rkpart.ir.standalone.subgraph_model`:

    1. cut producers become graph inputs with the static dtype/shape the full model had;
    2. cut tensors that are not floating point (index arithmetic, masks) cannot be inputs of
       an RKNN model, so they are frozen into initializers with the value a seeded ONNX
       Runtime run of the full model gives them (as Polygraphy's ``debug reduce`` freezes
       branches);
    3. constants are initializers (:meth:`~rkpart.ir.ModelGraph.constant`), so a candidate's
       node count is the number of ops that carry data;
    4. ops whose results nobody ever reads are dropped.

    The input model is never modified.
    """

    def __init__(self, path: str | Path, input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self.path = Path(path)
        self.mg: ModelGraph = load_model(self.path, input_shapes=input_shapes)
        #: the reducible units: ops that carry data from the model inputs, in topological order
        self.ops: tuple[int, ...] = tuple(sorted(self.mg.ops.nodes))
        self._values: dict[str, TensorProto] = {}

    def extract(self, keep: Iterable[int]) -> Candidate | None:
        """The candidate graph keeping ``keep`` (op indices), or ``None`` if it has no inputs or outputs."""
        kept = self._live(sorted(set(keep)))
        if not kept:
            return None
        sub = self.mg.subgraph(kept, sinks=True)
        frozen = [t for t in sub.inputs if t not in self.mg.inputs and not self.mg.is_float(t)]
        if len(frozen) == len(sub.inputs) or not sub.outputs:
            return None
        values = {t: self._value(t) for t in [*sorted(sub.const_tensors), *frozen]}
        model = subgraph_model(self.mg, sub, values, name=self.mg.graph_name or "reduced",
                               producer_name="rkpart-triage")
        return Candidate(ops=sub.ops, model=model, digest=graph_hash(model))

    def describe(self, ops: Iterable[int]) -> list[str]:
        """``OpType name`` of each op, for progress lines and reports."""
        return [self.mg.op_label(i) for i in ops]

    def _live(self, kept: list[int]) -> list[int]:
        # An op none of whose results is read by anything (in the full model) nor is a model
        # output would only add dangling outputs.
        outputs = set(self.mg.outputs)

        def used(t: str) -> bool:
            return bool(t) and (t in outputs or bool(self.mg.consumers.get(t)))

        return [i for i in kept if any(used(t) for t in self.mg.op(i).outputs)]

    def _value(self, t: str) -> TensorProto:
        if t not in self._values:
            if self.mg.is_const_tensor(t):
                self._values[t] = self.mg.constant(t)
            else:
                for name, v in self._run_full_model([t]).items():
                    self._values[name] = numpy_helper.from_array(v, name=name)
        return self._values[t]

    def _run_full_model(self, tensors: list[str]) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        from rkpart.runtime.executor import random_feeds

        model = onnx.load(str(self.path))  # with external data: ORT needs the weights
        have = {o.name for o in model.graph.output}
        for t in tensors:
            if t not in have:
                model.graph.output.append(self.mg.value_info(t))
        feeds = random_feeds(((n, *self.mg.tensor_types[n]) for n in self.mg.inputs), FREEZE_SEED)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = sess.run(tensors, dict(feeds))
        return {t: np.asarray(v) for t, v in zip(tensors, got, strict=True)}

#: outcome kinds that depend on the machine, not the graph: never cached
_UNSTABLE = ("timeout", "oom")


class ReductionError(UserError, exit_code=7):
    """The graph cannot be reduced (e.g. the full graph does not fail the same way)."""


class _OutOfTime(Exception):
    pass


@dataclass(frozen=True)
class FailureSpec:
    """What "fails the same way" means for one reduction."""

    kind: str
    signal: str | None
    exit_code: int | None
    signature: str | None
    fail_regex: str | None = None

    @classmethod
    def from_row(cls, row: MatrixRow, fail_regex: str | None = None) -> FailureSpec:
        return cls(kind=row.kind, signal=row.signal, exit_code=row.exit_code, signature=row.signature,
                   fail_regex=fail_regex)

    def matches(self, res: BuildResult, log_text: str, signature: str | None) -> bool:
        if self.fail_regex is not None:
            return re.search(self.fail_regex, log_text) is not None
        if res.ok or res.kind != self.kind:
            return False
        if self.kind in ("crash", "oom") and res.signal != self.signal:
            return False
        if self.kind == "error" and res.exit_code != self.exit_code:
            return False
        return self.signature is None or signature == self.signature

    def describe(self) -> str:
        if self.fail_regex is not None:
            return f"build log matches /{self.fail_regex}/"
        what = describe_outcome(self.kind, self.exit_code, self.signal)
        return what + (f" with known issue {self.signature}" if self.signature else "")

    def to_json(self) -> JsonObject:
        return {"kind": self.kind, "signal": self.signal, "exit_code": self.exit_code,
                "signature": self.signature, "fail_regex": self.fail_regex}


@dataclass(frozen=True)
class Attempt:
    """One candidate tried during the reduction."""

    phase: str  # "reference", "bisect-end", "bisect-start", "linear"
    num_nodes: int
    digest: str
    failed: bool  # failed the same way
    outcome: str
    wall_s: float
    cached: bool

    def to_json(self) -> JsonObject:
        return {"phase": self.phase, "num_nodes": self.num_nodes, "digest": self.digest, "failed": self.failed,
                "outcome": self.outcome, "wall_s": round(self.wall_s, 2), "cached": self.cached}


@dataclass(frozen=True)
class Reduction:
    """The result: the smallest failing candidate found and how the search went."""

    candidate: Candidate
    spec: FailureSpec
    toolkit: str
    original_nodes: int
    attempts: tuple[Attempt, ...]
    builds: int
    cache_hits: int
    wall_s: float
    complete: bool  # False when max_time ran out before the linear pass converged
    log: Path  # build log of the final candidate

    @property
    def model(self) -> onnx.ModelProto:
        return self.candidate.model

    def to_json(self) -> JsonObject:
        return {"toolkit": self.toolkit, "spec": self.spec.to_json(), "original_nodes": self.original_nodes,
                "reduced_nodes": self.candidate.num_nodes, "builds": self.builds, "cache_hits": self.cache_hits,
                "wall_s": round(self.wall_s, 1), "complete": self.complete,
                "attempts": [a.to_json() for a in self.attempts]}


#: the reducer's outcome cache in its work folder (a FIFO there hung the reduction; a symlink is not its own)
OUTCOMES_KIND = FileKind("reduction outcomes", "json", 64 << 20, UserError, symlinks=False,
                         doc="`outcomes.json` of a reduction's work folder (`repro`; unreadable: rebuilt)")


class _Oracle:
    """Builds candidates and answers "does it fail the same way?", with a cache by graph hash."""

    def __init__(self, toolkit: Toolkit, build: BuildSettings, *, spec: FailureSpec, work: Path, deadline: float,
                 say: Progress, t0: float, max_time: float) -> None:
        self.toolkit, self.build, self.spec = toolkit, build, spec
        self.work, self.deadline, self.say = work, deadline, say
        self.t0, self.max_time = t0, max_time
        self.cache_path = work / "outcomes.json"
        self.cache: dict[str, JsonObject] = {}
        with contextlib.suppress(OSError, ValueError, UserError):  # unreadable: every candidate is built again
            loaded = OUTCOMES_KIND.load(self.cache_path, root=work)
            if isinstance(loaded, dict):
                self.cache = loaded
        self.attempts: list[Attempt] = []
        self.builds = 0
        self.hits = 0
        self.best: Candidate | None = None
        self.best_log = work / "best.log"
        self._context = json.dumps({"toolkit": toolkit.version, "target": build.target, "config": dict(build.config),
                                    "spec": spec.to_json()}, sort_keys=True)

    def _key(self, digest: str) -> str:
        return hashlib.sha256(f"{digest}|{self._context}".encode()).hexdigest()

    def test(self, cand: Candidate | None, phase: str, *, always: bool = False) -> bool:
        if cand is None:
            return False
        key = self._key(cand.digest)
        hit = self.cache.get(key)
        if hit is not None:
            self.hits += 1
            failed = bool(hit["failed"])
            if failed:
                self._new_best(cand, None)
            self._record(Attempt(phase, cand.num_nodes, cand.digest, failed, str(hit["outcome"]), 0.0, True))
            return failed
        if time.monotonic() >= self.deadline and not always:
            raise _OutOfTime
        onnx_path = self.work / "candidate.onnx"
        atomic_write_bytes(onnx_path, cand.model.SerializeToString(deterministic=True))
        log = self.work / "candidate.log"
        b = self.build
        res = build_once(onnx_path, self.toolkit, target=b.target, config=dict(b.config), log=log,
                         timeout=b.timeout, label="reduce", tmp_parent=self.work, worker=b.worker,
                         cpu_limit=b.cpu_limit)
        self.builds += 1
        text = log.read_text(errors="replace") if log.is_file() else ""
        sig = match_signature(res)
        failed = self.spec.matches(res, text, sig.id if sig else None)
        outcome = describe_outcome(res.kind, res.exit_code, res.signal)
        if res.kind not in _UNSTABLE:
            self.cache[key] = {"failed": failed, "outcome": outcome, "nodes": cand.num_nodes}
            atomic_write_bytes(self.cache_path, (json.dumps(self.cache, indent=1, sort_keys=True) + "\n").encode())
        if failed:
            self._new_best(cand, log)
        self._record(Attempt(phase, cand.num_nodes, cand.digest, failed, outcome, res.wall_s, False))
        return failed

    def _new_best(self, cand: Candidate, log: Path | None) -> None:
        if self.best is None or cand.num_nodes <= self.best.num_nodes:
            self.best = cand
            if log is not None:
                shutil.copyfile(log, self.best_log)
            else:  # outcome from the cache: no log of this graph
                self.best_log.unlink(missing_ok=True)

    def _record(self, a: Attempt) -> None:
        self.attempts.append(a)
        verdict = "fails the same way" if a.failed else "does not"
        src = "cached" if a.cached else f"{a.wall_s:.1f} s"
        best = self.best.num_nodes if self.best else "-"
        self.say(f"[{a.phase} #{len(self.attempts)}] {a.num_nodes} nodes: {a.outcome}, {verdict} ({src})  "
                 f"best {best} nodes  elapsed {time.monotonic() - self.t0:.0f}/{self.max_time:.0f} s")


def reduce_graph(model: str | Path, toolkit: Toolkit, spec: FailureSpec, build: BuildSettings, *,
                 work: Path, max_time: float = 1800.0, max_linear_passes: int = 3,
                 progress: Progress | None = None) -> Reduction:
    """Shrink ``model`` to a minimal subgraph that fails ``toolkit``'s build the way ``spec`` says.

    Parameters
    ----------
    model
        The failing ONNX model (static shapes).
    toolkit
        The toolkit version to reduce against.
    spec
        What counts as the same failure (usually :meth:`FailureSpec.from_row` of the model's
        matrix row for ``toolkit``).
    work
        Folder for candidates, their logs and the outcome cache (``outcomes.json``).
    max_time
        Seconds; checked before each build.  The best graph so far is returned when it runs out.
    build
        Target, config, seconds per candidate build (a timed-out candidate counts as "does not
        fail") and the worker (replaced only by fault-injection fakes in tests).

    Raises
    ------
    ReductionError
        The full graph, as rebuilt from its ops, does not fail the same way.
    """
    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    sub = Cutter(model)
    ops = sub.ops
    oracle = _Oracle(toolkit, build, spec=spec, work=work, deadline=t0 + max_time, say=say, t0=t0,
                     max_time=max_time)
    say(f"reducing {Path(model).name} ({len(ops)} ops) against rknn-toolkit2 {toolkit.version}: "
        f"looking for {spec.describe()}")
    complete = False
    try:
        full = sub.extract(ops)
        # The reference always runs: without it there is no failing graph to return.
        if not oracle.test(full, "reference", always=True):
            last = oracle.attempts[-1].outcome if oracle.attempts else "no valid graph"
            raise ReductionError(
                f"{Path(model).name} rebuilt from its {len(ops)} ops gives {last} with rknn-toolkit2 "
                f"{toolkit.version}, not {spec.describe()}; nothing to reduce")
        current = _bisect(sub, ops, oracle)
        complete = _linear(sub, current, oracle, max_linear_passes)
    except _OutOfTime:
        say(f"time budget of {max_time:.0f} s used up; keeping the smallest failing graph found")
    best = oracle.best
    assert best is not None  # the reference failed
    if not oracle.best_log.is_file():  # every failing candidate came from the cache
        oracle.best_log.write_text("(outcome taken from the cache of an earlier run; no log)\n")
    return Reduction(candidate=best, spec=spec, toolkit=toolkit.version, original_nodes=len(ops),
                     attempts=tuple(oracle.attempts), builds=oracle.builds, cache_hits=oracle.hits,
                     wall_s=time.monotonic() - t0, complete=complete, log=oracle.best_log)


def _bisect(sub: Cutter, ops: Sequence[int], oracle: _Oracle) -> tuple[int, ...]:
    n = len(ops)
    # Shortest failing prefix: fails(ops[:hi]) holds throughout.
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if oracle.test(sub.extract(ops[:mid]), "bisect-end"):
            hi = mid
        else:
            lo = mid
    end = hi
    # Latest failing start: fails(ops[lo:end]) holds throughout.
    lo, hi = 0, end
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if oracle.test(sub.extract(ops[mid:end]), "bisect-start"):
            lo = mid
        else:
            hi = mid
    cand = sub.extract(ops[lo:end])
    assert cand is not None
    return cand.ops


def _linear(sub: Cutter, current: tuple[int, ...], oracle: _Oracle, max_passes: int) -> bool:
    """Remove ops one by one until a pass removes nothing; True when it converged."""
    for _ in range(max_passes):
        removed = False
        for op in reversed(current):
            if op not in current or len(current) <= 1:
                continue
            trial = sub.extract(o for o in current if o != op)
            if oracle.test(trial, "linear"):
                assert trial is not None
                current = trial.ops
                removed = True
        if not removed:
            return True
    return False
