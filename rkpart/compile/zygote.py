"""Toolkit workers forked from a process that has already imported rknn-toolkit2.

Every build (:func:`rkpart.compile.runner.run_build`) and every simulator session
(:class:`rkpart.runtime.rknn_sim.SimSession`) is a process of its own, so that a segfault, a
hang or 13 GB of RAM cannot take rkpart down.  Starting one used to mean starting the toolkit's
python and importing ``rknn.api`` (torch, onnx, scipy, cv2): measured 3.5 s of CPU and 5-15 s of
wall per process on a 2-core machine, more than a small stage's whole build.  A plan of 84
stages paid it 84 times.

A *zygote* (``worker_main.py zygote FD``, one per toolkit python, started on first use and kept
for the life of this process) pays it once.  Each worker is then a ``fork`` of the zygote, which
has imported and done nothing else: the worker starts where a fresh interpreter would be after
its imports, in a session of its own, with its own cwd, environment and descriptors, and dies
with the zygote.  Crash isolation is the same as before: a worker's segfault or kill ends only
the worker; the zygote reports its exit status.  If this process dies, even by SIGKILL, the
zygote sees its socket close and kills every worker it forked.

``RKPART_ZYGOTE=0`` starts every worker as its own interpreter again (the old way).  A zygote
that fails to start (a broken toolkit install, which cannot import ``rknn.api``) is not retried
for that python: its workers start the old way, so the failure shows in each build's log as
before.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO

#: how long a zygote may take to import the toolkit (a cold disk under load: tens of seconds)
START_TIMEOUT_S = 300.0


def enabled() -> bool:
    """Workers are forked from a zygote unless ``RKPART_ZYGOTE=0``."""
    return os.environ.get("RKPART_ZYGOTE", "1") != "0"


class ZygoteChild:
    """A worker forked by a zygote, with the parts of :class:`subprocess.Popen` rkpart uses."""

    def __init__(self, rid: int, stdin: IO[bytes] | None, stdout: IO[bytes] | None) -> None:
        self._rid = rid
        self.stdin = stdin
        self.stdout = stdout
        self.pid = 0
        self.returncode: int | None = None
        self._started = threading.Event()
        self._done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"zygote worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def _exited(self, status: int) -> None:
        self.returncode = status
        self._done.set()
        self._started.set()


class Zygote:
    """One fork server of one toolkit python (see the module docstring)."""

    def __init__(self, python: Path, worker: Path, env: dict[str, str]) -> None:
        self.python = python
        self._home = Path(tempfile.mkdtemp(prefix="rkpart-zygote-"))
        (self._home / "home").mkdir()
        (self._home / "tmp").mkdir()
        env = {**env, "HOME": str(self._home / "home"), "TMPDIR": str(self._home / "tmp")}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._lock = threading.Lock()
        self._children: dict[int, ZygoteChild] = {}
        self._next = 0
        self._dead = False
        try:
            with open(self._home / "zygote.log", "wb") as log:
                argv = [str(python), str(worker), "zygote", str(theirs.fileno()), str(self._home)]
                self._proc = subprocess.Popen(
                    argv, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, cwd=self._home, env=env, start_new_session=True)
        finally:
            theirs.close()
        ours.settimeout(START_TIMEOUT_S)
        try:
            ready = json.loads(ours.recv(1 << 16) or b"{}")
        except (OSError, ValueError):
            ready = {}
        if not ready.get("ready"):
            self.close()
            raise OSError(f"the zygote of {python} did not start (log: {self._home / 'zygote.log'})")
        ours.settimeout(None)
        self._reader = threading.Thread(target=self._read, name="rkpart-zygote", daemon=True)
        self._reader.start()

    def spawn(self, argv: list[str], *, cwd: Path, env: dict[str, str], stdin: int | None = None,
              stdout: int | None = None, stderr: int | None = None, pipes: bool = False) -> ZygoteChild:
        """Fork a worker running ``worker_main.py ARGV``; ``pipes``: its stdin and stdout are pipes to us
        (``child.stdin``/``child.stdout``), else ``stdin``/``stdout``/``stderr`` are descriptors it gets
        (``None``: /dev/null)."""
        null = os.open(os.devnull, os.O_RDWR)
        mine: list[IO[bytes]] = []
        give: list[int] = []
        try:
            if pipes:
                in_r, in_w = os.pipe()
                out_r, out_w = os.pipe()
                mine = [os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb")]
                give = [in_r, out_w]
                fds = [in_r, out_w, stderr if stderr is not None else null]
            else:
                fds = [stdin if stdin is not None else null, stdout if stdout is not None else null,
                       stderr if stderr is not None else null]
            with self._lock:
                if self._dead:
                    raise OSError("the zygote is gone")
                self._next += 1
                child = ZygoteChild(self._next, mine[0] if mine else None, mine[1] if mine else None)
                self._children[child._rid] = child
                msg = {"id": child._rid, "argv": argv, "cwd": str(cwd), "env": env}
                socket.send_fds(self._sock, [json.dumps(msg).encode()], fds)
        except OSError:
            for io in mine:
                io.close()
            raise
        finally:
            for fd in (null, *give):
                os.close(fd)
        if not child._started.wait(START_TIMEOUT_S):
            raise OSError("the zygote did not fork a worker")
        return child

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            with self._lock:
                child = self._children.get(int(msg["id"]))
                if child is None:
                    continue
                child.pid = int(msg["pid"])
                if "status" in msg:
                    del self._children[child._rid]
                    child._exited(int(msg["status"]))
                else:
                    child._started.set()
        with self._lock:  # the zygote is gone, and with it (PR_SET_PDEATHSIG) every worker it forked
            self._dead = True
            for child in self._children.values():
                child._exited(-int(signal.SIGKILL))
            self._children.clear()

    @property
    def alive(self) -> bool:
        return not self._dead and self._proc.poll() is None

    def close(self) -> None:
        """End the zygote (its workers die with it) and remove its folder."""
        with contextlib.suppress(OSError):
            self._sock.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        shutil.rmtree(self._home, ignore_errors=True)


_ZYGOTES: dict[tuple[Path, Path], Zygote] = {}
_FAILED: set[tuple[Path, Path]] = set()
_LOCK = threading.Lock()


def zygote_for(python: Path, worker: Path, env: dict[str, str]) -> Zygote | None:
    """The zygote of ``python`` running ``worker`` (started on first use), or ``None`` when zygotes are
    off or this one could not start."""
    if not enabled():
        return None
    key = (Path(python), Path(worker))
    with _LOCK:
        z = _ZYGOTES.get(key)
        if z is not None and z.alive:
            return z
        if key in _FAILED:
            return None
        try:
            z = Zygote(key[0], key[1], env)
        except OSError:
            _FAILED.add(key)
            return None
        _ZYGOTES[key] = z
        return z


@atexit.register
def close_all() -> None:
    """End every zygote of this process (also at exit)."""
    with _LOCK:
        zs = list(_ZYGOTES.values())
        _ZYGOTES.clear()
    for z in zs:
        z.close()

