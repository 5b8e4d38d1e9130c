"""rknn-toolkit2 simulator backend: runs NPU stages in the toolkit's simulator, out of process.

The simulator cannot run a loaded ``.rknn`` (``load_rknn`` + ``init_runtime()`` is refused),
so each runner builds the stage from its ONNX with the same toolkit and build config that
produced the stage's artifact, in a persistent worker (:mod:`rkpart.compile.worker_main`
``simulate``) living in the toolkit's venv.

Shared workers (the default): one worker process per toolkit and build config hosts the
models of every stage that uses them (one ``RKNN`` object each; measured bit-equal to one
process per stage).  A process costs ~260 MiB before its first model, so 84 stages in
84 processes would spend 22 GB on toolkits alone.  The models' memory is bounded by
:class:`SimPool`'s budget: before a stage loads, the pool evicts idle models (most
recently used first, which keeps the head of a plan resident when passes go round in
order) until the workers' measured RSS plus the largest footprint learned so far fits.
An evicted stage is rebuilt from ONNX at its next inference (counted in :attr:`SimPool.stats`).
A worker crash fails every stage it hosts with a :class:`ToolkitError` naming them.

Lifecycle mapping: ``load`` = ``load_onnx`` in the worker (the first stage of a toolkit and
config also pays the worker's start and toolkit import, ~3 s); ``init`` = ``build`` +
``init_runtime()``; ``infer`` = ``inference`` (plus a rebuild if the pool evicted the model,
never in a per-stage profile); ``release`` = release the model and hand its memory back
(``malloc_trim``); the worker lives until :meth:`RknnSimBackend.close`.  With
``shared=False`` each runner has its own worker, started in ``load`` and stopped in ``release``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from rkpart.compile.cache import ENTRY_KIND
from rkpart.compile.runner import WORKER, kill_group, spawn_worker, worker_env
from rkpart.compile.toolkits import Toolkit, find_toolkit
from rkpart.errors import SpecError, ToolkitError, UserError
from rkpart.io import confined_file
from rkpart.ir import graph_io
from rkpart.plan.plan import Stage
from rkpart.plan.verify import artifact_file, prepared_onnx
from rkpart.runtime.base import Backend, Feeds, StageRunner
from rkpart.types import JsonObject

#: seconds to wait for a build + init_runtime in the simulator
INIT_TIMEOUT_S = 1800.0
REQUEST_TIMEOUT_S = 600.0
#: share of the memory available when the first worker starts that a pool's workers may use
BUDGET_SHARE = 0.7


class SimSession:
    """One simulator worker process, spoken to with JSON lines."""

    def __init__(self, toolkit: Toolkit, *, log: Path | None = None, worker: Path = WORKER) -> None:
        self.toolkit = toolkit
        self.work = Path(tempfile.mkdtemp(prefix="rkpart-sim-"))
        (self.work / "home").mkdir()
        (self.work / "tmp").mkdir()
        self.log_path = log or self.work / "worker.log"
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the session
        self.proc = spawn_worker(toolkit.python, worker, ["simulate"], cwd=self.work,
                                 env=worker_env(self.work / "home", self.work / "tmp"),
                                 stderr=self._log.fileno(), pipes=True)
        self._buf = b""
        #: the worker's resident set after its last reply (bytes; 0 before the first)
        self.rss = 0

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, timeout: float = REQUEST_TIMEOUT_S, **req: Any) -> JsonObject:
        """Send one request and wait for its reply; raises ToolkitError if the worker fails or dies."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise ToolkitError(self._death(req.get("op", "?"))) from None
        line = self._readline(timeout, str(req.get("op")))
        reply = dict(json.loads(line))
        self.rss = int(reply.get("rss", 0))
        if not reply.get("ok"):
            raise ToolkitError(f"rknn-toolkit2 {self.toolkit.version} simulator: {reply.get('error')} "
                               f"(log: {self.log_path})")
        return reply

    def _readline(self, timeout: float, op: str) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise ToolkitError(f"rknn-toolkit2 {self.toolkit.version} simulator: {op} timed out "
                                   f"after {timeout:g} s (log: {self.log_path})")
            r, _, _ = select.select([fd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise ToolkitError(self._death(op))
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _death(self, op: str) -> str:
        rc = self.proc.wait()
        how = f"crashed: {signal.Signals(-rc).name} (exit {128 - rc})" if rc < 0 else f"exited with status {rc}"
        return f"rknn-toolkit2 {self.toolkit.version} simulator {how} during {op} (log: {self.log_path})"

    def close(self) -> None:
        """Ask the worker to exit; kill its process group if it does not."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ToolkitError, ValueError):
                if self.proc.stdin is not None:
                    self.proc.stdin.write(b'{"op": "release"}\n')
                    self.proc.stdin.flush()
                    self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_group(self.proc.pid)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        # A failed worker's log (inside the work dir) is kept: error messages point to it.
        if self.proc.returncode == 0 or self.log_path.parent != self.work:
            shutil.rmtree(self.work, ignore_errors=True)


def _graph_io(path: Path) -> tuple[list[str], list[tuple[str, np.dtype[Any]]]]:
    io = graph_io(path)
    return list(io.inputs), [(n, np.dtype(dt)) for n, (dt, _) in io.outputs.items()]


@dataclass(eq=False)
class _Hosted:
    """One stage's model in a worker of the pool."""

    runner: RknnSimRunner
    key: str
    toolkit: Toolkit
    config: JsonObject
    session: SimSession | None = None
    built: bool = False  # built and init_runtime'd in ``session``
    last_use: int = 0
    grown: int = 0  # the worker's RSS growth during this model's own requests so far
    footprint: int | None = None  # learned at the first inference
    dead: str = ""  # why the worker that hosted it is gone


_STATS = ("workers", "builds", "rebuilds", "evictions", "peak_rss")


@dataclass
class SimPool:
    """The simulator workers of one backend and the stage models they host.

    ``shared``: one worker per (toolkit, build config) hosting many models under a memory
    ``budget`` (bytes; ``None``: :data:`BUDGET_SHARE` of the memory available when the first
    worker starts); otherwise one worker per runner (no eviction).
    """

    worker: Path
    shared: bool = True
    budget: int | None = None
    sessions: dict[tuple[str, str], SimSession] = field(default_factory=dict)
    hosted: dict[str, _Hosted] = field(default_factory=dict)
    #: workers started, models built (rebuilds: after an eviction), evictions, peak RSS of the workers
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_STATS, 0))
    _clock: itertools.count[int] = field(default_factory=itertools.count)
    _keys: itertools.count[int] = field(default_factory=itertools.count)
    _tmp: Path | None = None
    _baseline: int = 0  # a worker's RSS with no model (learned)
    _per_model: int = 0  # the largest model footprint seen (learned)

    # -- hosting ------------------------------------------------------------------------
    def host(self, runner: RknnSimRunner, toolkit: Toolkit, config: JsonObject) -> _Hosted:
        h = _Hosted(runner, f"{runner.stage.id}#{next(self._keys)}", toolkit, config)
        self.hosted[h.key] = h
        self._load(h)
        return h

    def _load(self, h: _Hosted) -> None:
        group = (str(h.toolkit.python), json.dumps(h.config, sort_keys=True))
        s = self.sessions.get(group) if self.shared else None
        if self.shared:
            self._make_room(h, new_worker=s is None)
        if s is None:
            s = SimSession(h.toolkit, worker=self.worker)
            self.stats["workers"] += 1
            if self.shared:
                self.sessions[group] = s
        fresh = not s.rss
        h.session, h.built = s, False
        self._call(h, op="load", onnx=str(h.runner.onnx.absolute()), config=h.config, timeout=INIT_TIMEOUT_S)
        if fresh:  # what a process costs before any model (plus this one's load: an overestimate)
            self._baseline = max(self._baseline, s.rss)
            h.grown = 0

    def build(self, h: _Hosted) -> None:
        extra: JsonObject = {"quantize": h.runner.quantize} if h.runner.quantize else {}
        self._call(h, op="init", timeout=INIT_TIMEOUT_S, **extra)
        h.built = True
        self.stats["builds"] += 1

    def infer(self, h: _Hosted, **req: Any) -> None:
        if h.dead:
            raise ToolkitError(f"stage {h.runner.stage.id}: {h.dead}")
        if not h.built:  # evicted to make room: build it again (bit-equal to the first build)
            self._load(h)
            self.build(h)
            self.stats["rebuilds"] += 1
        self._call(h, op="infer", **req)
        h.last_use = next(self._clock)
        if h.footprint is None:
            # the first inference allocates the simulator's buffers: with it, a model's whole cost
            # (its own requests' growth only, however the executor interleaves stages)
            h.footprint = max(0, h.grown)
            self._per_model = max(self._per_model, h.footprint)

    def release(self, h: _Hosted) -> None:
        self.hosted.pop(h.key, None)
        s, h.session, h.built = h.session, None, False
        if s is None:
            return
        if not self.shared:
            s.close()
        elif s.alive and not h.dead:
            self._call(h, op="drop", session=s)

    # -- memory -------------------------------------------------------------------------
    def _make_room(self, h: _Hosted, *, new_worker: bool) -> None:
        if self.budget is None:
            import psutil

            self.budget = int(psutil.virtual_memory().available * BUDGET_SHARE) + self._rss()
        need = self._per_model + (self._baseline if new_worker else 0)
        while self._rss() + need > self.budget:
            idle = [o for o in self.hosted.values() if o.built and o is not h and o.session is not None]
            if not idle:
                return  # nothing left to evict: the stage must run anyway
            victim = max(idle, key=lambda o: o.last_use)  # MRU: see the module doc
            self._call(victim, op="drop")
            victim.built = False
            self.stats["evictions"] += 1

    def _rss(self) -> int:
        return sum(s.rss for s in self.sessions.values() if s.alive)

    # -- requests -----------------------------------------------------------------------
    def _call(self, h: _Hosted, *, session: SimSession | None = None, **req: Any) -> JsonObject:
        s = session or h.session
        assert s is not None
        before = s.rss
        try:
            reply = s.request(key=h.key, **req)
        except ToolkitError as e:
            msg = str(e)
            if not s.alive:
                others = self._bury(s, msg, h)
                if others:
                    msg += f"; the worker also hosted stage(s) {', '.join(others)}, which fail from now on"
            raise ToolkitError(f"stage {h.runner.stage.id}: {msg}") from None
        h.grown += s.rss - before
        self.stats["peak_rss"] = max(self.stats["peak_rss"], self._rss() if self.shared else s.rss)
        return reply

    def _bury(self, s: SimSession, why: str, culprit: _Hosted) -> list[str]:
        """A worker died: every stage it hosted fails from now on, naming the stage that was
        running; returns the other stages it hosted."""
        others = sorted(o.runner.stage.id for o in self.hosted.values() if o.session is s and o is not culprit)
        for o in self.hosted.values():
            if o.session is s:
                o.dead = f"its simulator worker died while running stage {culprit.runner.stage.id}: {why}"
                o.built = False
        self.sessions = {k: v for k, v in self.sessions.items() if v is not s}
        s.close()
        return others

    @property
    def learned(self) -> tuple[int, int]:
        """What the budget is enforced with: a worker's RSS before its models, the largest
        model footprint seen (bytes; 0 until measured)."""
        return self._baseline, self._per_model

    def reset_stats(self) -> dict[str, int]:
        """Start counting :attr:`stats` afresh; returns the old counts."""
        old, self.stats = self.stats, dict.fromkeys(_STATS, 0)
        return old

    def tmp(self) -> Path:
        """A private directory for the tensors sent to and from the workers."""
        if self._tmp is None or not self._tmp.is_dir():
            self._tmp = Path(tempfile.mkdtemp(prefix="rkpart-sim-io-"))
        return self._tmp

    def close(self) -> None:
        """Stop every worker; a stage still hosted fails if used again."""
        for s in list(self.sessions.values()):
            s.close()
        self.sessions.clear()
        for h in self.hosted.values():
            if h.session is not None and not self.shared:
                h.session.close()
            h.session, h.built = None, False
            h.dead = h.dead or "the rknn-sim backend was closed"
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


class RknnSimRunner(StageRunner):
    def __init__(self, stage: Stage, folder: Path, backend: RknnSimBackend) -> None:
        super().__init__(stage, folder)
        self.backend = backend
        # the copy compile prepared for the toolkit (lowered opset, NPU rewrites) if any, else the stage
        # file: confined, regular, sha256 as recorded
        self.onnx = prepared_onnx(folder, stage)
        self._hosted: _Hosted | None = None
        self._inputs: list[str] = []
        self._outputs: list[tuple[str, np.dtype[Any]]] = []
        self._n = 0
        #: int8 / hybrid artifacts: the worker's ``quantize`` request (built from the same dataset)
        self.quantize: JsonObject | None = None

    def _build_settings(self) -> tuple[Toolkit, JsonObject]:
        """Toolkit and config of the stage's artifact, so the simulation matches the compiled model."""
        b = self.backend
        config: JsonObject = {**b.config, "target_platform": b.target}
        version = b.toolkit
        art = self.stage.artifact("rknn")
        if art is None and self.stage.failures:
            raise ToolkitError(f"stage {self.stage.id} did not compile: {self.stage.failures[-1].message}")
        if art is not None:
            meta_path = artifact_file(self.folder, self.stage, art).with_suffix(".json")
            with contextlib.suppress(OSError, ValueError, UserError, AttributeError):
                meta = ENTRY_KIND.load(meta_path, root=self.folder)
                config = {**meta.get("config", {}), "target_platform": meta.get("target", art.target)}
            # The artifact's toolkit, even if the backend names another: that is the model
            # that would run on the board (a fallback may have built some stages).
            version = art.toolkit
            self.quantize = _quantize_request(self.folder, self.stage, art)
        if not version:
            raise ToolkitError(f"stage {self.stage.id} has no rknn artifact; compile the plan or pass "
                               "a toolkit to the rknn-sim backend")
        return b.resolve(version), config

    def _load_impl(self) -> None:
        tk, config = self._build_settings()
        self._inputs, self._outputs = _graph_io(self.onnx)
        self._hosted = self.backend.pool.host(self, tk, config)

    def _init_impl(self) -> None:
        assert self._hosted is not None
        self.backend.pool.build(self._hosted)

    def _infer_impl(self, feeds: Feeds) -> Feeds:
        h = self._hosted
        assert h is not None
        self._n += 1
        d = Path(tempfile.mkdtemp(prefix="io-", dir=self.backend.pool.tmp()))
        try:
            fin, fout = d / "in.npz", d / "out.npz"
            # The simulator takes fp32 for fp16 models; other types go through unchanged.
            arrays: JsonObject = {}
            for n in self._inputs:
                a = np.asarray(feeds[n])
                arrays[n] = a.astype(np.float32) if a.dtype == np.float16 else a
            np.savez(fin, **arrays)
            names = [n for n, _ in self._outputs]
            self.backend.pool.infer(h, inputs=str(fin), names=self._inputs, outputs=str(fout), output_names=names)
            with np.load(fout, allow_pickle=False) as z:
                return {n: np.asarray(z[n]).astype(dt, copy=False) for n, dt in self._outputs}
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def _release_impl(self) -> None:
        if self._hosted is not None:
            h, self._hosted = self._hosted, None
            self.backend.pool.release(h)


def _quantize_request(folder: Path, stage: Stage, art: Any) -> JsonObject | None:
    """An int8 / hybrid artifact's build, for the simulator to repeat: its dataset (linked into
    the plan folder by compile) and, for hybrid, the layers it kept in float16.

    The simulator takes and returns floats for such a stage: the toolkit quantizes the inputs
    and dequantizes the outputs whose dtype its build turned into int8."""
    if art.precision == "fp16":
        return None
    if not art.calibration_dataset:
        raise SpecError(f"stage {stage.id}: its {art.precision} artifact names no calibration dataset; "
                        "rerun rkpart compile with --calibration")
    from rkpart.compile.calibration import DATASET_KIND, read_dataset
    from rkpart.compile.precision import CALIB_DIR
    from rkpart.plan.plan import TensorInfo

    # the copy compile linked into the plan (rknn/calibration/<digest[:16]>/): read as compile read the
    # calibration, every sample verified against its name, of the stage's dtypes and shapes
    ds = DATASET_KIND.within(folder, art.calibration_dataset)
    parts = Path(art.calibration_dataset).parts
    if len(parts) < 3 or parts[:2] != ("rknn", CALIB_DIR):
        raise SpecError(f"stage {stage.id}: calibration dataset {art.calibration_dataset!r} is not one compile "
                        f"links (rknn/{CALIB_DIR}/...)")
    root = folder / parts[0] / parts[1] / parts[2]
    io = graph_io(confined_file(folder, stage.file, what=f"stage {stage.id} file"))
    inputs = [TensorInfo(n, np.dtype(dt).name, tuple(shape)) for n, (dt, shape) in io.inputs.items()]
    read_dataset(ds, root=root, inputs=inputs)
    return {"dataset": str(Path(ds).absolute()), "hybrid": art.precision == "hybrid",
            "float16_layers": list(art.float16_layers)}


class RknnSimBackend(Backend):
    """NPU stages in the rknn-toolkit2 simulator; host stages are left to ONNX Runtime.

    Parameters
    ----------
    toolkit
        Version or python path for stages without an artifact; a compiled stage always runs
        in the toolkit that built its artifact (with the artifact's build config).
    target, config
        Build settings for stages without an artifact (artifacts carry their own).
    shared
        Host the stages of one toolkit and config in one worker (see the module doc);
        ``False``: one worker process per runner.
    memory_budget
        Bytes the shared workers may hold together (default: 70 % of the memory available
        when the first one starts); over it, idle models are evicted and rebuilt when used.
    """

    name = "rknn-sim"
    devices = ("npu",)

    def __init__(self, toolkit: str | None = None, *, target: str = "rk3588",
                 config: JsonObject | None = None, toolkits_dir: str | os.PathLike[str] | None = None,
                 worker: Path = WORKER, shared: bool = True, memory_budget: int | None = None) -> None:
        self.toolkit = toolkit
        self.target = target
        self.config = dict(config or {})
        self.toolkits_dir = toolkits_dir
        self.worker = worker
        self.pool = SimPool(worker, shared=shared, budget=memory_budget)
        self._resolved: dict[str, Toolkit] = {}
        # workers and their temporary files go with the backend even if close() is forgotten
        weakref.finalize(self, self.pool.close)

    def resolve(self, version: str) -> Toolkit:
        if version not in self._resolved:
            self._resolved[version] = find_toolkit(version, self.toolkits_dir)
        return self._resolved[version]

    def runner(self, stage: Stage, folder: Path) -> StageRunner:
        return RknnSimRunner(stage, folder, self)

    def describe(self) -> JsonObject:
        d: JsonObject = {"backend": self.name, "target": self.target,
                             "workers": "shared" if self.pool.shared else "per-stage"}
        if self.toolkit:
            d["runtime"] = f"rknn-toolkit2 {self.resolve(self.toolkit).version} simulator"
        return d

    def close(self) -> None:
        """Stop every worker (stages still loaded fail if used again)."""
        self.pool.close()
