"""Run one toolkit build in its own process group and turn its fate into a typed record.

A build can segfault in the native compiler, hang, or take 13 GB of RAM; none of that may
take rkpart down.  Each build is a subprocess of the toolkit's python running
:mod:`rkpart.compile.worker_main`, in a fresh session (its own process group, so a timeout
kills everything it started), with a disposable HOME/TMPDIR/cwd that is removed afterwards.
Its stdout and stderr form the build log, which is where the placement table and the
optimiser steps are read from.  The worker is forked from a process that has imported the
toolkit already (:mod:`rkpart.compile.zygote`), so a build no longer pays the toolkit's import.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from rkpart.compile.hang import Watch
from rkpart.compile.placement import last_step, open_native_pass
from rkpart.compile.toolkits import Toolkit
from rkpart.compile.zygote import ZygoteChild, zygote_for
from rkpart.errors import SpecError
from rkpart.readers import FileKind
from rkpart.types import BuildFailure, JsonMap, JsonObject
from rkpart.units import human_bytes

#: a build log kept in a plan folder (``rknn/logs/``): read back by compile's retries, bundle's core
#: masks and device memory, the compiler-plan of an old cache entry, and --repartition
LOG_KIND = FileKind("build log", "bytes", 1 << 30, SpecError, symlinks=False,
                    doc="a plan's `rknn/logs/*.log`, read by `compile`, `bundle`, `--repartition`")


def read_log(path: Path, root: Path | None = None) -> str:
    """A build log's text (:data:`LOG_KIND`; bytes that are not UTF-8 replaced)."""
    return LOG_KIND.read(path, root=root).decode(errors="replace")

WORKER = Path(__file__).with_name("worker_main.py")
SAMPLE_S = 0.2
TERM_GRACE_S = 3.0

# Exit codes of worker_main
_EXIT_MEMORY = 4
_EXIT_DISK = 5
#: a failed build next to less free space than this ran out of disk (its log may not say so:
#: it could not be written)
DISK_FULL_BYTES = 1 << 20
_OOM_MARKERS = ("MemoryError", "std::bad_alloc", "Cannot allocate memory", "Out of memory")
#: the disk, not the graph: such a failure is never cached
_DISK_MARKERS = ("No space left on device", "[Errno 28]", "Disk quota exceeded", "[Errno 122]")
#: signals that come from outside the build (a user, a service manager, a closed terminal),
#: not from a bug in the compiler; SIGKILL is reported as ``oom`` (the OOM killer's signal)
_OUTSIDE_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE,
                              signal.SIGXCPU, signal.SIGXFSZ})

# Environment variables that would make the toolkit's python see rkpart's venv.
_DROP_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")


@dataclass(frozen=True)
class BuildJob:
    """One stage to build."""

    stage_id: str
    onnx: Path
    output: Path  # final .rknn location (written atomically)
    log: Path
    config: JsonMap  # RKNN.config keyword arguments, target_platform included
    toolkit: Toolkit
    timeout: float | None = None
    est_peak_rss: int = 0  # bytes, filled in by the scheduler's memory model
    size_bytes: int = 0  # stage weights + I/O, for the memory model
    worker: Path = WORKER  # replaced only by fault-injection fakes in tests
    #: int8 / hybrid: {"dataset": abs path, "hybrid": bool, ...} (rkpart.compile.precision); None: fp16
    quantize: JsonMap | None = None
    #: asked at every sample with the CPU seconds of the build's process tree and the wall seconds: a reason
    #: stops the build as a hang before ``timeout`` (:mod:`rkpart.compile.hang`); local builds only
    watch: Watch | None = field(default=None, compare=False)


@dataclass(frozen=True)
class BuildResult:
    """What happened to one build."""

    stage_id: str
    ok: bool
    kind: str  # "ok" or a FailureKind: "crash", "error", "timeout", "oom"
    message: str
    toolkit: str
    exit_code: int | None  # shell-style: 128+N for a signal
    signal: str | None
    wall_s: float
    peak_rss_bytes: int
    rknn_size: int
    log: Path
    last_step: str | None
    extra: JsonObject = field(default_factory=dict)
    #: CPU seconds of the build's process tree (0 where not measured: a Ray task)
    cpu_s: float = 0.0
    #: why the build was stopped as a hang (its watch), or ``None``
    stopped: str | None = None

    def failure(self, rel_log: str) -> BuildFailure:
        """The plan's ``failures`` entry for this result (a failed one).

        Wall time and peak RSS vary between runs and stay on the result: the plan keeps only
        what is reproducible.
        """
        assert self.kind != "ok", "a successful build has no failure record"
        return BuildFailure(toolkit=self.toolkit, kind=self.kind, message=self.message,  # type: ignore[arg-type]
                            exit_code=self.exit_code, signal=self.signal, last_step=self.last_step, log=rel_log)


def worker_env(home: Path, tmp: Path) -> dict[str, str]:
    """Environment for a toolkit subprocess: disposable HOME (device probes write ~/.android)."""
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONNOUSERSITE="1", PYTHONUNBUFFERED="1")
    return env


def _load_prctl() -> Callable[..., int] | None:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# resolved here, not in the child: after fork() only async-signal-safe work is wise
_PRCTL = _load_prctl()


def die_with_parent() -> None:
    """``preexec_fn``: SIGKILL the worker when the thread that started it dies.

    Workers run in their own session (so a timeout can kill their whole group), which also
    means a SIGKILLed rkpart would leave them building on as orphans; PR_SET_PDEATHSIG
    (Linux) ties their life to ours.  Elsewhere this does nothing.
    """
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1


def spawn_worker(python: Path, worker: Path, args: list[str], *, cwd: Path, env: dict[str, str],
                 stdout: int | None = None, stderr: int | None = None,
                 pipes: bool = False) -> subprocess.Popen[bytes] | ZygoteChild:
    """Start ``worker ARGS`` under the toolkit's ``python``, in a session of its own that dies with us.

    Forked from the toolkit's zygote (:mod:`rkpart.compile.zygote`: the toolkit imported once per
    process, not once per worker) when ``worker`` is rkpart's own; started as its own interpreter
    when zygotes are off, the zygote cannot start, or ``worker`` is a test's fault-injection fake.
    ``stdout``/``stderr``: descriptors (``stderr`` ``None``: with stdout); ``pipes``: stdin and
    stdout are pipes to us (``.stdin``/``.stdout``), as ``Popen(stdin=PIPE, stdout=PIPE)``.
    """
    err = stdout if stderr is None and not pipes else stderr
    if worker == WORKER:
        z = zygote_for(python, worker, env)
        if z is not None:
            with contextlib.suppress(OSError):  # the zygote died under us: the old way, below
                return z.spawn(args, cwd=cwd, env=env, stdout=stdout, stderr=err, pipes=pipes)
    return subprocess.Popen([str(python), str(worker), *args], stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
                            stdout=subprocess.PIPE if pipes else stdout, stderr=err, cwd=cwd, env=env,
                            start_new_session=True, preexec_fn=die_with_parent)


def tree_rss(proc: psutil.Process) -> int:
    """Resident memory of ``proc`` and all its descendants, in bytes (0 if gone)."""
    return tree_usage(proc)[0]


def tree_usage(proc: psutil.Process) -> tuple[int, float]:
    """Resident memory (bytes) and CPU time (seconds: user + system, with the children each process has
    reaped) of ``proc`` and all its descendants; ``(0, 0.0)`` if gone."""
    rss, cpu = 0, 0.0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0, 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            rss += p.memory_info().rss
            t = p.cpu_times()
            cpu += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return rss, cpu


def peak_of(pid: int) -> int:
    """The high-water resident memory of process ``pid``'s own image, in bytes (0 if unknown).

    ``VmHWM`` of ``/proc/<pid>/status``: the mm the process made at ``exec``.  Not ``ru_maxrss``
    (``os.wait4``, ``getrusage``): Linux folds the pre-``exec`` mm into it, which for a child of
    ``fork`` is a copy of the parent, so every build "peaked" at least at rkpart's own size
    (measured: a child whose VmHWM is 11 MB reports 1036 MB from a 1 GiB parent; in CI the
    pytest worker's 1 GB stood for a report's peak)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def kill_group(pgid: int, reap: Callable[[], object] | None = None) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after a grace period.

    ``reap``: reaps the group's leader if it exited (a non-blocking wait): a leader that died on SIGTERM
    stays in the group as a zombie until its parent waits for it, which kept every kill waiting out the
    whole grace period."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_build(job: BuildJob, *, on_sample: Callable[[int], None] | None = None,
              tmp_parent: Path | None = None, cancel: threading.Event | None = None) -> BuildResult:
    """Build ``job`` in a subprocess and classify the outcome; never raises for build failures."""
    job.log.parent.mkdir(parents=True, exist_ok=True)
    job.output.parent.mkdir(parents=True, exist_ok=True)
    if tmp_parent is not None:
        tmp_parent.mkdir(parents=True, exist_ok=True)
    # the worker runs with ``work`` as its cwd: every path it is given must be absolute
    work = Path(tempfile.mkdtemp(prefix=f"build-{job.stage_id}-", dir=tmp_parent)).resolve()
    try:
        return _run_in(work, job, on_sample, cancel)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_in(work: Path, job: BuildJob, on_sample: Callable[[int], None] | None,
            cancel: threading.Event | None) -> BuildResult:
    (work / "home").mkdir()
    (work / "tmp").mkdir()
    out = work / "out.rknn"
    result_path = work / "result.json"
    req = {"onnx": str(job.onnx.absolute()), "output": str(out), "config": dict(job.config),
           "result": str(result_path)}
    if job.quantize:
        req["quantize"] = dict(job.quantize)
    (work / "request.json").write_text(json.dumps(req, indent=2, sort_keys=True))
    argv = [str(job.toolkit.python), str(job.worker), "build", str(work / "request.json")]
    t0 = time.monotonic()
    peak = 0
    timed_out = False
    stopped: str | None = None  # the watch's reason
    cpu = 0.0  # CPU seconds of the process tree, as last sampled (it only grows)
    own = 0  # the worker's own high water (peak_of), sampled while it runs and reported by it at the end
    with open(job.log, "wb") as log:
        proc = spawn_worker(job.toolkit.python, job.worker, argv[2:], cwd=work,
                            env=worker_env(work / "home", work / "tmp"), stdout=log.fileno())
        reaped = False
        try:
            ps = psutil.Process(proc.pid)
            while True:
                own = max(own, peak_of(proc.pid))
                if proc.poll() is not None:  # (its CPU time: as last sampled, at most SAMPLE_S short)
                    reaped = True
                    break
                rss, used = tree_usage(ps)
                peak = max(peak, rss)
                cpu = max(cpu, used)
                if on_sample is not None:
                    on_sample(rss)
                if cancel is not None and cancel.is_set():
                    raise KeyboardInterrupt
                if job.watch is not None:
                    stopped = job.watch(cpu, time.monotonic() - t0)
                if stopped is not None or (job.timeout is not None and time.monotonic() - t0 > job.timeout):
                    timed_out = True
                    kill_group(proc.pid, proc.poll)  # poll: reaps the leader once it died
                    proc.wait()
                    reaped = True
                    break
                time.sleep(SAMPLE_S)
        finally:
            if not reaped:  # interrupted (Ctrl-C): leave no compiler running
                kill_group(proc.pid)
                with contextlib.suppress(ChildProcessError):
                    proc.wait()
            # Anything the worker left behind in its group (adb servers, helpers).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    wall = time.monotonic() - t0
    if on_sample is not None:
        on_sample(0)
    rc = proc.returncode
    assert rc is not None
    text = job.log.read_text(errors="replace")
    step = last_step(text)
    version = job.toolkit.version
    result: JsonObject = {}
    with contextlib.suppress(OSError, ValueError):
        result = json.loads(result_path.read_text())
    reported = result.get("vm_hwm_bytes") if isinstance(result, dict) else None
    peak = max(peak, own, reported if isinstance(reported, int) and not isinstance(reported, bool) else 0)

    def done(ok: bool, kind: str, message: str, size: int = 0) -> BuildResult:
        code = rc if rc >= 0 else 128 - rc
        sig = signal.Signals(-rc).name if rc < 0 else None
        return BuildResult(stage_id=job.stage_id, ok=ok, kind=kind, message=message, toolkit=version,
                           exit_code=code, signal=sig, wall_s=wall, peak_rss_bytes=peak, rknn_size=size,
                           log=job.log, last_step=step, extra=result, cpu_s=cpu, stopped=stopped)

    at = f"in rknn-toolkit2 {version}" + (f", last step {step}" if step else "")
    if stopped is not None:
        return done(False, "timeout", f"{stopped} (build killed) {at}")
    if timed_out:
        return done(False, "timeout", f"timed out after {job.timeout:g} s (build killed) {at}")
    if rc < 0:
        name = signal.Signals(-rc).name
        if -rc == signal.SIGKILL:
            return done(False, "oom", f"out of memory: killed by SIGKILL at {human_bytes(peak)} peak RSS "
                                      f"(most likely the kernel's OOM killer) {at}")
        if -rc in _OUTSIDE_SIGNALS:
            return done(False, "resource", f"build killed from outside: {name} (exit {128 - rc}) {at}; "
                                           "not remembered as a failure, a rerun builds it again")
        if any(m in text for m in _OOM_MARKERS):
            return done(False, "oom", f"out of memory: {name} after an allocation failure at "
                                      f"{human_bytes(peak)} peak RSS {at}")
        native = open_native_pass(text)
        inside = f" (inside native pass {native})" if native else ""
        return done(False, "crash", f"compiler crashed: {name} (exit {128 - rc}) {at}{inside}")
    if rc == _EXIT_DISK or (rc != 0 and (any(m in text or m in str(result.get("error", "")) for m in _DISK_MARKERS)
                                         or _disk_full(work, job.output.parent, job.log.parent))):
        return done(False, "resource", f"build failed: no space left on device {at}; free some space and rerun")
    if rc == _EXIT_MEMORY or (rc != 0 and any(m in text for m in _OOM_MARKERS)):
        return done(False, "oom", f"out of memory: MemoryError at {human_bytes(peak)} peak RSS {at}")
    if rc != 0 or not result.get("ok"):
        why = one_line(str(result.get("error") or f"exit {rc} without a result"))
        return done(False, "error", f"build failed: {why} (exit {rc}) {at}")
    if not out.is_file():
        return done(False, "error", f"build failed: the worker reported success but wrote no .rknn {at}")
    size = out.stat().st_size
    _move_atomic(out, job.output)
    return done(True, "ok", f"built in {wall:.1f} s", size)


def one_line(error: str) -> str:
    """A toolkit error as one line: a Python traceback the toolkit folded into its message
    (``ValueError: Traceback (most recent call last): File ... ValueError: 'x' is not in list``)
    becomes its last exception line and the innermost function (``ValueError: 'x' is not in list
    (in _p_remove_parallel_node)``); the whole traceback stays in the build log."""
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else error
    exc = [ln for ln in lines if re.match(r"[A-Za-z_][\w.]*(?:Error|Exception|Warning|Interrupt|Exit)\b", ln)
           and not ln.endswith("Traceback (most recent call last):")]
    frames = re.findall(r'File "[^"]*", line \d+, in (\S+)', error)
    head = exc[-1] if exc else lines[-1]
    return head + (f" (in {frames[-1]})" if frames else "")


def _disk_full(*folders: Path) -> bool:
    for f in folders:
        try:
            st = os.statvfs(f)
        except OSError:
            continue
        if st.f_bavail * st.f_frsize < DISK_FULL_BYTES:
            return True
    return False


def _move_atomic(src: Path, dst: Path) -> None:
    try:
        os.replace(src, dst)
    except OSError:  # different file systems: copy next to dst, then rename
        from rkpart.io import atomic_writer

        with atomic_writer(dst) as tmp:
            shutil.copyfile(src, tmp)
