"""Builds as Ray tasks: ``rkpart compile PLAN --executor ray [--address ADDR]``.

The local executor runs each build as a subprocess of this machine (:mod:`.runner`); this one
runs the *same* :func:`~rkpart.compile.runner.run_build` inside a Ray task on whichever node
Ray places it, so a plan's builds spread over a cluster.  What moves where:

- **stage files** go to the task by content: the driver reads the stage (``.onnx`` plus its
  external data; a stage of a ``--weights link`` plan is packed into its own data file so
  that only its slices travel) and the node writes them once into its content-addressed
  stage cache ``<cache>/ray/stages/<build key>/`` (the key is the build cache's:
  :func:`~rkpart.compile.cache.build_key`);
- **artifacts** come back as bytes and land in the plan folder's ``rknn/objects/<key>.rknn``
  with their log, exactly where a local build puts them; everything after (metadata, the
  memory model, ``plan.json``) is the local code path;
- **resources**: each task asks for one CPU and ``memory`` = the scheduler's estimated peak
  RSS (capped at the largest node's memory, else Ray would wait forever), so Ray admits
  builds by memory the way the local scheduler does;
- **toolkits** are found on the node (``rkpart toolkit list``) or installed there on demand
  with the same venv recipe (:func:`~rkpart.compile.toolkits.install_toolkit`);
- **a dying node or worker** is a system failure to Ray: the task is retried on another node
  (``max_retries``).  If every attempt is lost the stage fails with kind ``resource``, which
  the build cache never remembers (it says nothing about the graph).

Every node needs rkpart installed (``pip install 'rkpart[ray]'``) in the Python Ray runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rkpart.compile.runner import BuildJob, BuildResult
from rkpart.errors import ToolkitError, UserError
from rkpart.io import atomic_write_bytes
from rkpart.types import JsonMap, JsonObject

#: attempts after the first when a node or worker dies mid-build
MAX_RETRIES = 3
_POLL_S = 0.2


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'rkpart[ray]'") from None
    return ray


def connect(address: str | None) -> None:
    """Join the Ray cluster at ``address`` (``auto``, ``ray://host:10001``, ``host:6379``), or
    ``$RAY_ADDRESS``, or start a local one-node Ray when neither is given."""
    ray = _ray()
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False, include_dashboard=False)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise UserError(f"cannot connect to the Ray cluster at {address or 'auto'}: {e}") from None


# -- on the node ---------------------------------------------------------------------------------


def _node_cache() -> Path:
    from rkpart.io import default_cache_dir

    return default_cache_dir() / "ray"


@contextlib.contextmanager
def _file_lock(path: Path) -> Any:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


def _holds(folder: Path, files: Mapping[str, bytes]) -> bool:
    """``folder`` (not a symlink) holds exactly ``files``' bytes under their names, each a regular
    file read without following a symlink or blocking on a FIFO."""
    import stat

    if folder.is_symlink() or not (folder / ".complete").is_file():
        return False
    for name, data in files.items():
        try:
            fd = os.open(folder / name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != len(data) or f.read(len(data) + 1) != data:
                return False
    return True


def _stage_files(key: str, files: Mapping[str, bytes]) -> Path:
    """The node's copy of a stage, written once per build key (a folder renamed into place) and
    served again only while it holds the bytes the task carries (issue 51: a cache hit never builds
    from other bytes; a copy edited or damaged on the node is written again)."""
    root = _node_cache() / "stages"
    final = root / key
    if _holds(final, files):
        return final
    if final.is_symlink() or final.exists():
        gone = root / f".{key}.stale.{os.getpid()}.{threading.get_ident()}"
        with contextlib.suppress(OSError):
            os.replace(final, gone)
        if gone.is_symlink():
            gone.unlink()
        else:
            shutil.rmtree(gone, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        (tmp / ".complete").write_bytes(b"")
        with contextlib.suppress(OSError):  # another task of the same key got there first
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not _holds(final, files):  # that other task's copy is not these bytes either
        raise ToolkitError(f"the node's stage cache {final} does not hold the stage's bytes after writing them")
    return final


def _node_toolkit(version: str, toolkits_dir: str | None) -> Any:
    """The toolkit on this node, installed with the usual recipe if it is not there yet."""
    from rkpart.compile.toolkits import find_toolkit, install_toolkit, toolkits_root

    try:
        return find_toolkit(version, toolkits_dir)
    except ToolkitError:
        pass
    with _file_lock(toolkits_root(toolkits_dir) / ".ray-install.lock"):
        try:
            return find_toolkit(version, toolkits_dir)
        except ToolkitError:
            return install_toolkit(version, toolkits_dir)


def build_on_node(stage_id: str, key: str, onnx_name: str, files: Mapping[str, bytes], config: JsonMap,
                  toolkit: str, toolkits_dir: str | None, timeout: float | None) -> JsonObject:
    """The Ray task body: build one stage here and return the outcome, log and artifact bytes."""
    from rkpart.compile.runner import run_build

    folder = _stage_files(key, files)
    tk = _node_toolkit(toolkit, toolkits_dir)
    cache = _node_cache()
    work = Path(tempfile.mkdtemp(prefix=f"build-{stage_id}-", dir=cache))
    try:
        job = BuildJob(stage_id=stage_id, onnx=folder / onnx_name, output=work / "out.rknn", log=work / "build.log",
                       config=config, toolkit=tk, timeout=timeout)
        res = run_build(job, tmp_parent=work / "tmp")
        node = ""
        with contextlib.suppress(Exception):
            import ray

            node = ray.get_runtime_context().get_node_id()
        return {
            "ok": res.ok, "kind": res.kind, "message": res.message, "toolkit": res.toolkit,
            "exit_code": res.exit_code, "signal": res.signal, "wall_s": res.wall_s,
            "peak_rss_bytes": res.peak_rss_bytes, "rknn_size": res.rknn_size, "last_step": res.last_step,
            "extra": res.extra, "log": res.log.read_bytes() if res.log.is_file() else b"",
            "rknn": job.output.read_bytes() if res.ok else None, "node": node,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- on the driver -------------------------------------------------------------------------------


def stage_payload(onnx_path: Path) -> tuple[str, dict[str, bytes]]:
    """``(onnx file name, {file name: bytes})``: the stage as it must exist on the node.

    A stage whose tensors all live in its own ``<stage>.onnx.data`` travels as it is; one
    that references another file (``--weights link``) is packed: its slices are copied into
    a fresh data file so the whole shared weights file never travels.
    """
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    own = onnx_path.name + ".data"
    refs = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    locs = {e.value for t in refs for e in t.external_data if e.key == "location"}
    if locs <= {own}:
        files = {onnx_path.name: onnx_path.read_bytes()}
        if locs:
            files[own] = (onnx_path.parent / own).read_bytes()
        return onnx_path.name, files
    data = bytearray()
    for t in refs:
        info = {e.key: e.value for e in t.external_data}
        with open(onnx_path.parent / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0) or 0))
            chunk = f.read(int(info["length"]))
        data += b"\0" * ((-len(data)) % 64)
        offset = len(data)
        data += chunk
        del t.external_data[:]
        for k, v in (("location", own), ("offset", str(offset)), ("length", str(len(chunk)))):
            e = t.external_data.add()
            e.key, e.value = k, v
    return onnx_path.name, {onnx_path.name: model.SerializeToString(deterministic=True), own: bytes(data)}


def _max_node_memory(ray: Any) -> int:
    mems = [int(n.get("Resources", {}).get("memory", 0)) for n in ray.nodes() if n.get("Alive")]
    return max(mems, default=0)


class RayRunner:
    """A drop-in for :func:`~rkpart.compile.runner.run_build` that runs the build as a Ray task."""

    def __init__(self, address: str | None = None, *, toolkits_dir: str | os.PathLike[str] | None = None,
                 max_retries: int = MAX_RETRIES, say: Callable[[str], None] | None = None) -> None:
        connect(address)
        self.ray = _ray()
        self.toolkits_dir = None if toolkits_dir is None else str(toolkits_dir)
        self.max_retries = max_retries
        self.say = say or (lambda _m: None)
        self._task = self.ray.remote(build_on_node)
        self._lock = threading.Lock()
        #: stage id -> node id that returned its result (for tests and the report)
        self.nodes: dict[str, str] = {}

    def slots(self) -> int:
        """Builds worth having in flight: the cluster's CPUs (each task takes one), so that the
        stages waiting for a node do not all sit in the object store at once."""
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def __call__(self, job: BuildJob, *, on_sample: Callable[[int], None] | None = None,
                 tmp_parent: Path | None = None, cancel: threading.Event | None = None) -> BuildResult:
        from rkpart.compile.cache import build_key

        ray = self.ray
        key = job.output.stem if len(job.output.stem) == 64 else build_key(
            job.onnx, job.toolkit.version, str(job.config.get("target_platform", "")), job.config)
        onnx_name, files = stage_payload(job.onnx)
        cap = _max_node_memory(ray)
        memory = max(1, min(job.est_peak_rss, cap)) if cap else max(1, job.est_peak_rss)
        t0 = time.monotonic()
        ref = self._task.options(num_cpus=1, memory=memory, max_retries=self.max_retries,
                                 retry_exceptions=False, name=f"rkpart-build-{job.stage_id}").remote(
            job.stage_id, key, onnx_name, files, dict(job.config), job.toolkit.version, self.toolkits_dir,
            job.timeout)
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=_POLL_S)
                if ready:
                    break
                if cancel is not None and cancel.is_set():
                    ray.cancel(ref, force=True)
                    raise KeyboardInterrupt
            out = ray.get(ref)
        except ray.exceptions.RayError as e:
            # every attempt lost its worker or node (or Ray gave up): the machine, not the graph
            msg = f"lost on the Ray cluster after {self.max_retries + 1} attempt(s): {type(e).__name__}"
            job.log.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(job.log, f"{msg}\n{e}\n".encode())
            return BuildResult(stage_id=job.stage_id, ok=False, kind="resource", message=msg,
                               toolkit=job.toolkit.version, exit_code=None, signal=None,
                               wall_s=time.monotonic() - t0, peak_rss_bytes=0, rknn_size=0, log=job.log,
                               last_step=None)
        job.log.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(job.log, out["log"])
        if out["ok"]:
            job.output.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(job.output, out["rknn"])
        with self._lock:
            self.nodes[job.stage_id] = out["node"]
        return BuildResult(stage_id=job.stage_id, ok=out["ok"], kind=out["kind"], message=out["message"],
                           toolkit=out["toolkit"], exit_code=out["exit_code"], signal=out["signal"],
                           wall_s=out["wall_s"], peak_rss_bytes=out["peak_rss_bytes"], rknn_size=out["rknn_size"],
                           log=job.log, last_step=out["last_step"], extra=dict(out["extra"]))


__all__ = ["MAX_RETRIES", "RayRunner", "build_on_node", "connect", "stage_payload"]
