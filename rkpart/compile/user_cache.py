"""The user-level build cache: every ``.rknn`` built on this machine, reused by any plan.

``rkpart compile`` looks a stage up in the plan's own ``rknn/`` folder, then here, and
publishes every new build here (hard links, so a hit costs no space).  Because the key is
the stage's content with the toolkit, target and config (:func:`rkpart.compile.cache.build_key`),
a plan that is partitioned again (``partition --force`` replaces ``rknn/``) gets its
byte-identical stages back without building them.

Location: ``--cache-dir D``, else ``$RKPART_CACHE_DIR/rknn``, else ``~/.cache/rkpart/rknn``.
``--no-cache`` (``CompileOptions(cache=False)``) skips it.  ``rkpart cache info`` shows
what it holds and ``rkpart cache prune`` removes entries (least recently used first).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rkpart.compile.cache import OBJECTS
from rkpart.compile.scheduler import default_cache_dir
from rkpart.errors import UserError

BUILD_CACHE = "rknn"


def user_cache_dir() -> Path:
    """``$RKPART_CACHE_DIR/rknn`` or ``~/.cache/rkpart/rknn``."""
    return default_cache_dir() / BUILD_CACHE


def touch(path: Path) -> None:
    """Mark an entry as used now (its metadata's mtime orders :func:`prune`)."""
    with contextlib.suppress(OSError):
        os.utime(path)


@dataclass(frozen=True)
class Entry:
    key: str
    toolkit: str
    target: str
    size_bytes: int  # .rknn + .json
    used: float  # mtime of the metadata: last build or hit
    failure: bool = False  # a remembered crash (``<key>.fail.json``), no model

    def files(self, objects: Path) -> list[Path]:
        if self.failure:
            return [objects / f"{self.key}.fail.json"]
        # metadata first: once it is gone the entry no longer exists for readers
        return [objects / f"{self.key}.json", objects / f"{self.key}.rknn"]


def entries(root: Path) -> list[Entry]:
    """Complete entries and remembered failures under ``root``, oldest use first."""
    objects = root / OBJECTS
    out: list[Entry] = []
    if not objects.is_dir():
        return out
    for p in objects.iterdir():
        name = p.name
        failure = name.endswith(".fail.json")
        if not failure and not name.endswith(".json"):
            continue
        key = name[: -len(".fail.json")] if failure else name[: -len(".json")]
        try:
            meta = json.loads(p.read_text())
            st = p.stat()
            size = st.st_size
            if not failure:
                size += (objects / f"{key}.rknn").stat().st_size
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict):
            continue
        out.append(Entry(key=key, toolkit=str(meta.get("toolkit", "?")), target=str(meta.get("target", "?")),
                         size_bytes=size, used=st.st_mtime, failure=failure))
    out.sort(key=lambda e: (e.used, e.key))
    return out


def info(root: Path) -> dict[str, Any]:
    """What ``rkpart cache info`` prints: location, counts and sizes per toolkit."""
    es = entries(root)
    builds = [e for e in es if not e.failure]
    per: dict[str, dict[str, int]] = {}
    for e in builds:
        d = per.setdefault(e.toolkit, {"entries": 0, "bytes": 0})
        d["entries"] += 1
        d["bytes"] += e.size_bytes
    return {
        "path": str(root),
        "exists": root.is_dir(),
        "entries": len(builds),
        "bytes": sum(e.size_bytes for e in builds),
        "failures": sum(e.failure for e in es),
        "toolkits": dict(sorted(per.items())),
        "oldest_use": min((e.used for e in builds), default=None),
        "newest_use": max((e.used for e in builds), default=None),
    }


def prune(root: Path, *, max_bytes: int | None = None, older_than_days: float | None = None,
          toolkits: Sequence[str] = (), failures: bool = False, everything: bool = False,
          dry_run: bool = False, now: float | None = None) -> list[Entry]:
    """Remove entries; returns what was (or, with ``dry_run``, would be) removed.

    Criteria add up: ``everything``; builds of ``toolkits``; builds not used for
    ``older_than_days``; remembered failures with ``failures``; and then, least recently used
    first, builds until the rest fit in ``max_bytes``.
    """
    if not (everything or toolkits or failures or older_than_days is not None or max_bytes is not None):
        raise UserError("cache prune needs what to remove: --all, --max-size, --older-than, --toolkit or --failures")
    now = time.time() if now is None else now
    es = entries(root)
    gone: list[Entry] = []
    keep: list[Entry] = []
    for e in es:
        if (everything or (e.failure and failures)
                or (not e.failure and (e.toolkit in toolkits
                                       or (older_than_days is not None and now - e.used > older_than_days * 86400)))):
            gone.append(e)
        else:
            keep.append(e)
    if max_bytes is not None:
        total = sum(e.size_bytes for e in keep if not e.failure)
        for e in [e for e in keep if not e.failure]:  # oldest use first
            if total <= max_bytes:
                break
            gone.append(e)
            total -= e.size_bytes
    if not dry_run:
        for e in gone:
            for p in e.files(root / OBJECTS):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
    return gone


def parse_size(text: str) -> int:
    """``10G``, ``500MB``, ``1.5 GiB``, ``0`` -> bytes (binary units)."""
    t = text.strip().upper().replace(" ", "").removesuffix("B").removesuffix("I")
    mult = 1
    for suffix, m in (("K", 2**10), ("M", 2**20), ("G", 2**30), ("T", 2**40)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        v = float(t)
    except ValueError:
        raise UserError(f"size {text!r}: expected a number with an optional K/M/G/T unit, e.g. 10G") from None
    if v < 0:
        raise UserError(f"size {text!r} is negative")
    return int(v * mult)
