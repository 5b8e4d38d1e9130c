"""rknn-toolkit2 simulator backend: runs NPU stages in the toolkit's simulator, out of process.

The simulator cannot run a loaded ``.rknn`` (``load_rknn`` + ``init_runtime()`` is refused),
so each runner builds the stage from its ONNX with the same toolkit and build config that
produced the stage's artifact, in a persistent worker (:mod:`rkpart.compile.worker_main`
``simulate``) living in the toolkit's venv.  Lifecycle mapping:
``load`` = start worker + ``load_onnx``; ``init`` = ``build`` + ``init_runtime()``;
``infer`` = ``inference``; ``release`` = stop the worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

from rkpart.compile.runner import WORKER, kill_group, worker_env
from rkpart.compile.toolkits import Toolkit, find_toolkit
from rkpart.errors import ToolkitError, UserError
from rkpart.io import load_json_file
from rkpart.ir import graph_io
from rkpart.partitioner.plan import Stage
from rkpart.partitioner.verify import artifact_file, prepared_onnx
from rkpart.runtime.base import Backend, Feeds, StageRunner

#: seconds to wait for a build + init_runtime in the simulator
INIT_TIMEOUT_S = 1800.0
REQUEST_TIMEOUT_S = 600.0


class SimSession:
    """One simulator worker process, spoken to with JSON lines."""

    def __init__(self, toolkit: Toolkit, *, log: Path | None = None, worker: Path = WORKER) -> None:
        self.toolkit = toolkit
        self.work = Path(tempfile.mkdtemp(prefix="rkpart-sim-"))
        (self.work / "home").mkdir()
        (self.work / "tmp").mkdir()
        self.log_path = log or self.work / "worker.log"
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the session
        self.proc = subprocess.Popen(
            [str(toolkit.python), str(worker), "simulate"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, cwd=self.work, env=worker_env(self.work / "home", self.work / "tmp"),
            start_new_session=True)
        self._buf = b""

    def request(self, timeout: float = REQUEST_TIMEOUT_S, **req: Any) -> dict[str, Any]:
        """Send one request and wait for its reply; raises ToolkitError if the worker fails or dies."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise ToolkitError(self._death(req.get("op", "?"))) from None
        line = self._readline(timeout, str(req.get("op")))
        reply = dict(json.loads(line))
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


class RknnSimRunner(StageRunner):
    def __init__(self, stage: Stage, folder: Path, backend: RknnSimBackend) -> None:
        super().__init__(stage, folder)
        self.backend = backend
        # the copy compile prepared for the toolkit (lowered opset, NPU rewrites) if any, else the stage
        # file: confined, regular, sha256 as recorded
        self._onnx = prepared_onnx(folder, stage)
        self._session: SimSession | None = None
        self._inputs: list[str] = []
        self._outputs: list[tuple[str, np.dtype[Any]]] = []
        self._n = 0

    def _build_settings(self) -> tuple[Toolkit, dict[str, Any]]:
        """Toolkit and config of the stage's artifact, so the simulation matches the compiled model."""
        b = self.backend
        config: dict[str, Any] = {**b.config, "target_platform": b.target}
        version = b.toolkit
        art = self.stage.artifact("rknn")
        if art is None and self.stage.failures:
            raise ToolkitError(f"stage {self.stage.id} did not compile: {self.stage.failures[-1].message}")
        if art is not None:
            meta_path = artifact_file(self.folder, self.stage, art).with_suffix(".json")
            with contextlib.suppress(OSError, ValueError, UserError, AttributeError):
                meta = load_json_file(meta_path, what="artifact metadata", max_bytes=4 << 20)
                config = {**meta.get("config", {}), "target_platform": meta.get("target", art.target)}
            # The artifact's toolkit, even if the backend names another: that is the model
            # that would run on the board (a fallback may have built some stages).
            version = art.toolkit
        if not version:
            raise ToolkitError(f"stage {self.stage.id} has no rknn artifact; compile the plan or pass "
                               "a toolkit to the rknn-sim backend")
        return b.resolve(version), config

    def _load_impl(self) -> None:
        tk, config = self._build_settings()
        self._inputs, self._outputs = _graph_io(self._onnx)
        self._session = SimSession(tk, worker=self.backend.worker)
        self._session.request(op="load", onnx=str(self._onnx.absolute()), config=config,
                              timeout=INIT_TIMEOUT_S)

    def _init_impl(self) -> None:
        assert self._session is not None
        self._session.request(op="init", timeout=INIT_TIMEOUT_S)

    def _infer_impl(self, feeds: Feeds) -> Feeds:
        assert self._session is not None
        self._n += 1
        d = self._session.work / "tmp"
        fin, fout = d / f"in{self._n}.npz", d / f"out{self._n}.npz"
        # The simulator takes fp32 for fp16 models; other types go through unchanged.
        arrays: dict[str, Any] = {}
        for n in self._inputs:
            a = np.asarray(feeds[n])
            arrays[n] = a.astype(np.float32) if a.dtype == np.float16 else a
        np.savez(fin, **arrays)
        names = [n for n, _ in self._outputs]
        self._session.request(op="infer", inputs=str(fin), names=self._inputs, outputs=str(fout),
                              output_names=names)
        with np.load(fout, allow_pickle=False) as z:
            out = {n: np.asarray(z[n]).astype(dt, copy=False) for n, dt in self._outputs}
        fin.unlink()
        fout.unlink()
        return out

    def _release_impl(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


class RknnSimBackend(Backend):
    """NPU stages in the rknn-toolkit2 simulator; host stages are left to ONNX Runtime.

    Parameters
    ----------
    toolkit
        Version or python path for stages without an artifact; a compiled stage always runs
        in the toolkit that built its artifact (with the artifact's build config).
    target, config
        Build settings for stages without an artifact (artifacts carry their own).
    """

    name = "rknn-sim"
    devices = ("npu",)

    def __init__(self, toolkit: str | None = None, *, target: str = "rk3588",
                 config: dict[str, Any] | None = None, toolkits_dir: str | os.PathLike[str] | None = None,
                 worker: Path = WORKER) -> None:
        self.toolkit = toolkit
        self.target = target
        self.config = dict(config or {})
        self.toolkits_dir = toolkits_dir
        self.worker = worker
        self._resolved: dict[str, Toolkit] = {}

    def resolve(self, version: str) -> Toolkit:
        if version not in self._resolved:
            self._resolved[version] = find_toolkit(version, self.toolkits_dir)
        return self._resolved[version]

    def runner(self, stage: Stage, folder: Path) -> StageRunner:
        return RknnSimRunner(stage, folder, self)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.name, "target": self.target}
        if self.toolkit:
            d["runtime"] = f"rknn-toolkit2 {self.resolve(self.toolkit).version} simulator"
        return d
