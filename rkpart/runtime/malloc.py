"""Keep freed memory in the process, so a per-stage load-run-release cycle reuses its pages.

glibc serves allocations above its mmap threshold (128 KiB at first, raised dynamically up to
32 MiB) with their own ``mmap`` and gives them back to the OS on ``free``; the top of the heap
is given back (trimmed) once more than the trim threshold of it is free.  A stage of a
per-stage plan creates its ORT session, runs once and releases it, every pass: at 1024 image
tokens its activations (and the attention scores) are such allocations, so every pass's first
call page-faults them in again, and the cost model, fitted on sizes whose buffers stay on the
heap, never sees it.

:func:`keep_freed_memory` sets ``M_MMAP_THRESHOLD`` to glibc's maximum (32 MiB on 64-bit) and
``M_TRIM_THRESHOLD`` to 1 GiB with ``mallopt`` once per process, the first time an ORT
session is made (:func:`rkpart.runtime.ort.make_session`).  Freed buffers then stay mapped and
the next session's buffers of the same size reuse them.  The process keeps its heap's
high-water mark (the largest stage's working set), not more: freed chunks are reused, not
added to.  Allocations of 32 MiB or more are still mapped and unmapped one by one, which is why
:func:`rkpart.runtime.ort.make_session` turns ORT's CPU arena off while this is in effect (its
regions double in size and reach that), except inside :func:`measuring_memory` (memory
profiles: the arena keeps a stage's intermediates until release, where snapshots see them).

Switch: environment variable ``RKPART_KEEP_FREED_MEMORY=0`` (or ``off``/``false``/``no``)
leaves glibc's defaults; benches run each setting in its own process (``mallopt`` is
process-wide and cannot be undone: the dynamic threshold is off once set).  Not glibc (musl,
macOS, Windows): a no-op.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from collections.abc import Iterator

#: the switch; "0", "off", "false" or "no" turn it off
ENV = "RKPART_KEEP_FREED_MEMORY"
#: glibc's ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``)
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30

_state: bool | None = None


def wanted() -> bool:
    """What the switch says (default on)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def keep_freed_memory() -> bool:
    """Apply the thresholds once per process if :func:`wanted` and glibc; whether they are in effect.

    Later calls return the first call's answer (``mallopt`` is process-wide).
    """
    global _state
    if _state is None:
        _state = wanted() and _apply()
    return _state


def in_effect() -> bool:
    """Whether this process's thresholds were set by :func:`keep_freed_memory` (False before its first call)."""
    return bool(_state)


def _apply() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def give_back() -> bool:
    """Return the free memory glibc keeps to the OS (``malloc_trim(0)``) if it is being kept.

    For memory profiles: after a per-stage stage is released, so the next stage's peak is its
    own and not the kept high-water mark of the stages before it.  False when nothing was done.
    """
    if not _state:
        return False
    libc = ctypes.CDLL(None)
    libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    libc.malloc_trim.restype = ctypes.c_int
    libc.malloc_trim(0)
    return True


_measuring = 0


@contextlib.contextmanager
def measuring_memory() -> Iterator[None]:
    """Sessions made inside keep ORT's CPU arena (memory profiles).

    Without the arena ORT frees each intermediate as soon as it is read, and one of 32 MiB or
    more is unmapped at once: only a sampler tick inside the call would see it.  With the arena
    the block stays until the session is released, where the snapshot after inference sees it.
    """
    global _measuring
    _measuring += 1
    try:
        yield
    finally:
        _measuring -= 1


def arena_wanted() -> bool:
    """Whether a new ORT session should have its CPU arena: freed memory is not kept, or memory is measured."""
    return not keep_freed_memory() or _measuring > 0
