"""How a plan holds its stages' weights: copied per stage, or linked from the source.

``copy`` (the default) gives every stage its own ``<stage>.onnx.data``.  ``link`` writes no
per-stage weights: each external-data file of the source model is placed once in the plan
folder as ``stages/weights/<location>``, as a reflink (copy-on-write: no bytes copied, and
the plan is unaffected if the source is rewritten) on filesystems that have them (XFS,
Btrfs, bcachefs, ...), else as one in-kernel whole-file copy; every stage's ``.onnx``
references its tensors in that file by the source's own offset and length.  A stage stays
a standalone ONNX file (``onnx.load`` and ONNX Runtime resolve the location next to it), and
every path stays inside the plan folder.  Hard links are not used: ``onnx.load`` refuses
external data files with more than one link.

Weight bytes are moved by :func:`write_pieces`: each source byte is read once into an
aligned buffer, hashed there (the stage's sha256) and written with ``O_DIRECT`` -- straight
to the disk, not copied again into the page cache, which on a machine short of free memory
costs more CPU than the hash (``cp`` spends most of its time there).  Where the file system
refuses ``O_DIRECT`` (tmpfs, some network file systems) the same loop writes through the
page cache.

Writing is not made durable file by file: stage files are renamed into place without
``fsync`` (a resumed run re-verifies each finished stage by sha256), and the whole staging
folder is flushed in one pass by :func:`sync_tree` before it replaces the output.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from onnx import TensorProto

from rkpart.errors import InvalidModelError, SpecError
from rkpart.io import Hash, fsync_path
from rkpart.ir import ModelGraph
from rkpart.types import JsonMap, JsonObject

WeightsMode = Literal["copy", "link"]
WEIGHTS_MODES: tuple[WeightsMode, ...] = ("copy", "link")
#: the folder (under the plan's ``stages/``) holding linked source data files
LINK_DIR = "weights"
_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


def source_locations(mg: ModelGraph) -> list[str]:
    """The external-data locations the model's initializers use, sorted and unique."""
    locs = set()
    for init in mg.initializers.values():
        if init.data_location == TensorProto.EXTERNAL:
            for e in init.external_data:
                if e.key == "location":
                    locs.add(e.value)
    return sorted(locs)


def _reflink(src: Path, dst: Path) -> bool:
    """Clone ``src`` to ``dst`` (``FICLONE``); ``False`` where the filesystem cannot."""
    with open(src, "rb") as s, open(dst, "wb") as d:
        try:
            fcntl.ioctl(d.fileno(), _FICLONE, s.fileno())
            return True
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF):
                return False
            raise


#: one piece of a data file: ``("pad", None, 0, n)`` zeros, ``("bytes", data, 0, n)``, or
#: ``("file", path, offset, n)`` a slice of a source file
Piece = tuple[str, Any, int, int]
#: bytes moved per read / hash / write (a multiple of any block size ``O_DIRECT`` asks for)
_CHUNK = 1 << 23
_ALIGN = 4096


def open_new(path: Path, flags: int = 0) -> int:
    """Open ``path`` for writing, created or truncated (mode ``0o666`` less the umask), never
    through a symlink (one found there is replaced).  For files inside a locked staging folder
    that is flushed once at the end: no temp file and rename per file."""
    flags |= os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
    path.unlink()
    return os.open(path, flags, 0o666)


def put_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` as ``path`` through :func:`open_new` (not atomic, not fsynced)."""
    fd = open_new(path)
    try:
        with memoryview(data) as view:
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
    finally:
        os.close(fd)


def write_pieces(pieces: list[Piece], path: Path, h: Hash | None = None) -> int:
    """Write the concatenation of ``pieces`` as the file ``path`` (created or truncated, see
    :func:`open_new`), feeding the same bytes to the hash object ``h`` (when given); returns
    the bytes written.

    Every source byte is read once into one page-aligned buffer, hashed and written from it
    with ``O_DIRECT`` when the file system takes it (the last, partial block is written
    padded and the file truncated to its size), else through the page cache.
    """
    import mmap

    direct = hasattr(os, "O_DIRECT")
    try:
        fd = open_new(path, os.O_DIRECT if direct else 0)
    except OSError as e:
        if not direct or e.errno != errno.EINVAL:
            raise
        direct = False
        fd = open_new(path)
    srcs: dict[str, int] = {}
    buf = mmap.mmap(-1, _CHUNK)
    total = fill = 0
    try:
        with memoryview(buf) as view:

            def emit(n: int, size: int) -> None:
                nonlocal direct
                if h is not None:
                    h.update(view[:n])
                done = 0
                while done < size:
                    try:
                        k = os.write(fd, view[done:size])
                    except OSError as e:
                        if not direct or e.errno != errno.EINVAL:
                            raise
                        # O_DIRECT refused at write time: go on through the page cache
                        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                        direct = False
                        continue
                    if k < size - done and direct:
                        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                        direct = False
                    done += k

            for kind, src, off, length in pieces:
                left = length
                while left:
                    k = min(_CHUNK - fill, left)
                    if kind == "pad":
                        view[fill:fill + k] = bytes(k)
                    elif kind == "bytes":
                        view[fill:fill + k] = src[length - left:length - left + k]
                    else:
                        sfd = srcs.get(str(src))
                        if sfd is None:
                            sfd = srcs[str(src)] = os.open(src, os.O_RDONLY)
                        k = os.preadv(sfd, [view[fill:fill + k]], off + length - left)
                        if not k:
                            raise InvalidModelError(f"external data file {Path(src).name} is too short")
                    fill += k
                    left -= k
                    if fill == _CHUNK:
                        emit(fill, fill)
                        total += fill
                        fill = 0
            if fill:
                padded = -(-fill // _ALIGN) * _ALIGN if direct else fill
                view[fill:padded] = bytes(padded - fill)
                emit(fill, padded)
                total += fill
        os.ftruncate(fd, total)  # the padding of the last O_DIRECT block
    finally:
        buf.close()
        os.close(fd)
        for sfd in srcs.values():
            os.close(sfd)
    return total


def link_one(src: Path, dst: Path) -> str:
    """Place ``src``'s bytes at ``dst`` without copying when possible; returns how (``reflink`` or ``copy``).

    Never a hard link: ``onnx.load`` and ``onnx.checker`` (onnx >= 1.23) refuse external data
    with more than one link ("potential hardlink attack"), so one would break the stages
    *and* the user's source model.  Without reflinks the file is copied whole, unhashed, by
    :func:`write_pieces`.
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if _reflink(src, tmp):
            how = "reflink"
        else:
            write_pieces([("file", src, 0, src.stat().st_size)], tmp)
            how = "copy"
        shutil.copymode(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return how


def link_files(mg: ModelGraph, stages_dir: Path) -> tuple[dict[str, str], JsonObject]:
    """Link every source data file into ``stages_dir/weights``.

    Returns the location map (source location -> location relative to the stage files) and
    the plan record (``extra.weights``).  A file already placed by an interrupted run (same
    size and modification time as the source) is kept.
    """
    locations: dict[str, str] = {}
    files: JsonObject = {}
    for loc in source_locations(mg):
        src = mg.path.parent / loc
        rel = str(PurePosixPath(LINK_DIR) / PurePosixPath(loc))
        dst = stages_dir / rel
        sst = src.stat()
        dstat = dst.lstat() if os.path.lexists(dst) else None
        if dstat is not None and stat.S_ISREG(dstat.st_mode) and dstat.st_size == sst.st_size \
                and dstat.st_mtime_ns == sst.st_mtime_ns:
            how = "kept"
        else:
            how = link_one(src, dst)
            os.utime(dst, ns=(sst.st_atime_ns, sst.st_mtime_ns))
        locations[loc] = rel
        files[rel] = {"size": sst.st_size, "linked": how}
    return locations, {"mode": "link", "files": files}


def linked_file_names(record: JsonMap | None) -> list[str]:
    """The linked data files a plan's ``extra.weights`` record names (relative to ``stages/``)."""
    if not record or record.get("mode") != "link":
        return []
    return sorted(str(k) for k in record.get("files", {}))


def check_links(folder: Path, record: JsonMap | None) -> None:
    """Refuse a linked weights file that is missing or changed size since partition."""
    for rel in linked_file_names(record):
        p = folder / "stages" / rel
        want = int(record["files"][rel]["size"]) if record else 0
        if not p.is_file():
            raise SpecError(f"linked weights file stages/{rel} is missing; rerun rkpart partition")
        if p.stat().st_size != want:
            raise SpecError(f"linked weights file stages/{rel} changed size since partition "
                            f"({p.stat().st_size} bytes, expected {want}): the source model was rewritten in "
                            "place; rerun rkpart partition")


def drop_links(folder: Path, record: JsonMap | None) -> int:
    """Remove the linked weights files of the plan in ``folder`` (``extra.weights``); returns the bytes
    freed.  For plans written only to be built once (``auto``'s candidates, whose builds and tables
    stay): without reflinks each linked file is a whole copy of the source's data."""
    freed = 0
    for rel in linked_file_names(record):
        p = folder / "stages" / rel
        if p.is_file() and not p.is_symlink():
            freed += p.stat().st_size
            p.unlink()
    return freed


@contextlib.contextmanager
def fast_writer(path: Path) -> Iterator[Path]:
    """Like :func:`rkpart.io.atomic_writer` (temp file, rename) but without ``fsync``: for files
    inside a staging folder that :func:`sync_tree` flushes once at the end."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    mask = os.umask(0)
    os.umask(mask)
    os.fchmod(fd, 0o666 & ~mask)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


#: ``fsync`` calls in flight at once: concurrent ones share the file system's journal commits
_SYNC_THREADS = 16


def sync_tree(folder: Path) -> None:
    """Make everything under ``folder`` durable in one pass at the end: ``fsync`` of every file,
    then of every folder (their entries name the files).  Most bytes were written back while
    later stages were cut, so this mostly waits for the tail.  The calls run on a few threads:
    one at a time, each would wait for its own journal commit (ext4, XFS), while concurrent
    ones are batched into a few.  Not ``syncfs``: on a shared disk that would also wait for
    other processes' writes."""
    files: list[str] = []
    dirs: list[str] = []
    for dirpath, _, names in os.walk(folder):
        files += (os.path.join(dirpath, n) for n in names)
        dirs.append(dirpath)
    with ThreadPoolExecutor(max_workers=_SYNC_THREADS, thread_name_prefix="rkpart-sync") as pool:
        list(pool.map(fsync_path, files))
        list(pool.map(fsync_path, dirs))


__all__ = ["LINK_DIR", "WEIGHTS_MODES", "Piece", "WeightsMode", "check_links", "drop_links", "fast_writer",
           "link_files",
           "link_one", "linked_file_names", "open_new", "put_bytes", "source_locations", "sync_tree", "write_pieces"]
