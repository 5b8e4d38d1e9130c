"""A build's peak RSS is the worker's own, not rkpart's: ``peak_of`` reads ``VmHWM``.

``ru_maxrss`` (``os.wait4``, ``getrusage``) of a forked child counts the parent's memory that
``fork`` copied before ``exec``: every build "peaked" at least at the size of the process that
started it (CI: the pytest worker's 1 GB stood for a 243 MB ``rkpart report``), and the memory
model the scheduler learns from these peaks (``build-memory.json``) inherited the error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rkpart.compile.runner import peak_of


def test_the_peak_of_a_forked_child_is_its_own() -> None:
    ballast = bytearray(384 << 20)
    for i in range(0, len(ballast), 4096):  # touched: resident in this process
        ballast[i] = 1
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                             preexec_fn=os.getpid)  # a preexec_fn: fork, not vfork, as run_build starts builds
    try:
        deadline = time.monotonic() + 30
        while peak_of(child.pid) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        own = peak_of(child.pid)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        _, _, ru = os.wait4(child.pid, 0)
    assert 0 < own < 128 << 20, own  # a bare interpreter
    assert ru.ru_maxrss * 1024 > 384 << 20  # what wait4 says: the parent's ballast
    assert peak_of(child.pid) == 0  # gone: unknown, not a guess
    del ballast
