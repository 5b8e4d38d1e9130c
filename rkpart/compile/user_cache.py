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
import math
import os
import re
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rkpart.compile.cache import ENTRY_KIND, MAX_ENTRY_BYTES, OBJECTS
from rkpart.errors import UserError
from rkpart.io import default_cache_dir
from rkpart.output import MARKER, read_marker, write_marker
from rkpart.types import JsonObject

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


#: an entry's key: the sha256 of :func:`rkpart.compile.cache.build_key`, lowercase hex
_KEY = re.compile(r"[0-9a-f]{64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _objects(root: Path) -> Path | None:
    """``root/objects`` if it is a real folder; a symlinked one is refused (prune would delete through it)."""
    objects = root / OBJECTS
    if objects.is_symlink() or (root.is_symlink() and not root.is_dir()):
        raise UserError(f"cache folder {objects} is a symlink; rkpart does not read or prune through one")
    try:
        if not stat.S_ISDIR(os.lstat(objects).st_mode):
            return None
    except OSError:
        return None
    return objects


def _regular(p: Path, max_bytes: int | None = None) -> os.stat_result | None:
    """``lstat`` of ``p`` if it is a regular file (not a symlink, FIFO or device) within ``max_bytes``."""
    try:
        st = os.lstat(p)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or (max_bytes is not None and st.st_size > max_bytes):
        return None
    return st


def _sidecar(p: Path, *, failure: bool) -> JsonObject | None:
    """The sidecar at ``p`` if it matches the schema rkpart writes, else ``None`` (not ours: left alone)."""
    if _regular(p, MAX_ENTRY_BYTES) is None:
        return None
    try:
        meta = ENTRY_KIND.load(p, root=p.parent)
    except UserError:
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("toolkit", ""), str) \
            or not isinstance(meta.get("target", ""), str):
        return None
    if failure:
        return meta if isinstance(meta.get("kind"), str) else None
    size, sha = meta.get("size_bytes"), meta.get("sha256")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0 \
            or not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        return None
    return meta


def entries(root: Path) -> list[Entry]:
    """Complete entries and remembered failures under ``root``, oldest use first.

    Only what the cache itself writes counts: a name ``<sha256 hex>.json`` (+ ``.rknn``) or
    ``<sha256 hex>.fail.json``, regular files (never a symlink, FIFO or device: ``cache
    info`` must not block on a FIFO or read ``/dev/zero``), a sidecar of the cache's schema
    and an ``.rknn`` of the size it records.  Anything else is not an entry, so ``prune``
    never deletes it.
    """
    objects = _objects(root)
    out: list[Entry] = []
    if objects is None:
        return out
    for p in sorted(objects.iterdir()):
        name = p.name
        failure = name.endswith(".fail.json")
        if not failure and not name.endswith(".json"):
            continue
        key = name[: -len(".fail.json")] if failure else name[: -len(".json")]
        if not _KEY.fullmatch(key):
            continue
        meta = _sidecar(p, failure=failure)
        st = _regular(p)
        if meta is None or st is None:
            continue
        size = st.st_size
        if not failure:
            rk = _regular(objects / f"{key}.rknn")
            if rk is None or rk.st_size != meta["size_bytes"]:
                continue
            size += rk.st_size
        out.append(Entry(key=key, toolkit=str(meta.get("toolkit", "?")), target=str(meta.get("target", "?")),
                         size_bytes=size, used=st.st_mtime, failure=failure))
    out.sort(key=lambda e: (e.used, e.key))
    return out


def info(root: Path) -> JsonObject:
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
        "verdicts": len(verdicts(root)),
        "toolkits": dict(sorted(per.items())),
        "oldest_use": min((e.used for e in builds), default=None),
        "newest_use": max((e.used for e in builds), default=None),
    }


#: the kind in a shared build cache's rkpart output marker (:func:`mark_cache`)
CACHE_KIND = "build cache"
#: what a shared build cache holds besides its entries (a ``--cache-dir`` also keeps the build memory model)
_CACHE_FILES = frozenset({OBJECTS, MARKER, "build-memory.json", ".tmp", "weigh"})
#: the folder of weighed-rewrite verdicts in a build cache (rkpart.compile.weigh.WEIGH_DIR; not imported: weigh
#: imports onnx, and ``cache info`` must stay light)
VERDICTS = "weigh"


def mark_cache(root: Path) -> None:
    """Give the shared build cache ``root`` rkpart's output marker (once): what ``cache prune``
    requires of a folder before it deletes anything in it."""
    if read_marker(root) is None and not (root / "plan.json").exists():
        with contextlib.suppress(OSError):
            root.mkdir(parents=True, exist_ok=True)
            write_marker(root, CACHE_KIND, complete=False)


def cache_problem(root: Path) -> str | None:
    """Why ``root`` is not a build cache rkpart made (``None``: it is one, or holds nothing).

    A plan's ``rknn/`` holds the plan's own artifacts (docs/compile.md: pruning never touches
    them); anything else must carry rkpart's cache marker, or be a cache made before the marker
    existed: the user-level cache, or a folder holding nothing but cache entries."""
    if (root / "plan.json").exists():
        return "it is a plan folder, not a build cache"
    if (root.parent / "plan.json").exists():
        return (f"it is the {root.name}/ folder of the plan {root.parent}: its builds are the plan's artifacts, "
                "never pruned (partition or compile the plan again to replace them)")
    doc = read_marker(root)
    if doc is not None:
        return None if doc["kind"] == CACHE_KIND else f"it is an rkpart {doc['kind']} folder, not a build cache"
    if not root.is_dir() or Path(os.path.abspath(root)) == Path(os.path.abspath(user_cache_dir())):
        return None
    other = sorted(n for n in os.listdir(root) if n not in _CACHE_FILES)
    if other:
        return f"it is not a build cache rkpart made (no {MARKER}; it holds {other[0]!r})"
    return None


def prune(root: Path, *, max_bytes: int | None = None, older_than_days: float | None = None,
          toolkits: Sequence[str] = (), failures: bool = False, everything: bool = False,
          dry_run: bool = False, now: float | None = None) -> list[Entry]:
    """Remove entries; returns what was (or, with ``dry_run``, would be) removed.

    Criteria add up: ``everything``; builds of ``toolkits``; builds not used for
    ``older_than_days``; remembered failures with ``failures``; and then, least recently used
    first, builds until the rest fit in ``max_bytes``.  ``root`` must be a build cache rkpart
    made (:func:`cache_problem`), never a plan's ``rknn/``.
    """
    if not (everything or toolkits or failures or older_than_days is not None or max_bytes is not None):
        raise UserError("cache prune needs what to remove: --all, --max-size, --older-than, --toolkit or --failures")
    why = cache_problem(root)
    if why is not None:
        raise UserError(f"refusing to prune {root}: {why}")
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


def verdicts(root: Path) -> list[tuple[Path, float]]:
    """The weighed-rewrite verdicts ``root/weigh/<sha256 hex>.json`` (regular files, nothing else), with the
    time each was last used, oldest first.  A verdict is a few hundred bytes; it saves one build per stage
    anatomy (minutes at full width), so only ``--all`` and ``--older-than`` remove it."""
    d = root / VERDICTS
    try:
        if d.is_symlink() or not stat.S_ISDIR(os.lstat(d).st_mode):
            return []
        names = sorted(os.listdir(d))
    except OSError:
        return []
    out = []
    for n in names:
        if n.endswith(".json") and _KEY.fullmatch(n[: -len(".json")]):
            st = _regular(d / n)
            if st is not None:
                out.append((d / n, st.st_mtime))
    out.sort(key=lambda pv: (pv[1], pv[0].name))
    return out


def prune_verdicts(root: Path, *, older_than_days: float | None = None, everything: bool = False,
                   dry_run: bool = False, now: float | None = None) -> int:
    """Remove weighed-rewrite verdicts (all, or those not used for ``older_than_days``); how many went
    (or, with ``dry_run``, would go).  ``root`` is checked as :func:`prune` checks it."""
    why = cache_problem(root)
    if why is not None:
        raise UserError(f"refusing to prune {root}: {why}")
    now = time.time() if now is None else now
    gone = [p for p, used in verdicts(root)
            if everything or (older_than_days is not None and now - used > older_than_days * 86400)]
    if not dry_run:
        for p in gone:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    return len(gone)


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
    if not math.isfinite(v):
        raise UserError(f"size {text!r} is not a finite number")
    if v < 0:
        raise UserError(f"size {text!r} is negative")
    if v * mult > 2**62:
        raise UserError(f"size {text!r} is beyond any disk (at most 4 EiB)")
    return int(v * mult)
