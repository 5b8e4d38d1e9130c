"""Crash-safe file writing and output-folder locking.

Every file rkpart produces goes through :func:`atomic_write_bytes` (temp file in the same
folder, fsync, rename) so a killed run leaves either the old file or the new one, never half
of one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rkpart.errors import OutputExistsError

#: lock files of older versions (folder_lock now locks the folder itself)
LOCK_NAME = ".rkpart.lock"


def hash_file(h: Any, path: str | os.PathLike[str], chunk: int = 1 << 22) -> None:
    """Feed ``path``'s bytes into the hash object ``h`` without reading the file whole."""
    with open(path, "rb") as f:
        while buf := f.read(chunk):
            h.update(buf)


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    hash_file(h, path)
    return h.hexdigest()


def _umask_mode() -> int:
    # mkstemp creates 0600 files; outputs should get the usual mode (0644 under umask 022)
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _umask_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path next to ``path``; on success it is fsynced and renamed onto ``path``.

    For writers that need a file name (``onnx.save``, ``rknn.export_rknn``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, _umask_mode())
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise
    _fsync_dir(path.parent)


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str], *, what: str | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` for the duration; refuse a second concurrent run.

    The lock is a ``flock`` on the folder itself (no lock file): it needs no cleanup, dies
    with the process (a SIGKILLed run never leaves a stale lock), and follows the folder
    when it is renamed, which is how a finished staging folder becomes the output.
    ``what`` names the folder in the error message (default: its path).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise OutputExistsError(
                    f"{what or folder} is in use by another rkpart run; wait for it or choose another folder"
                ) from None
            raise
        yield
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` if unsupported."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def old_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.old")


def recover_folder(final: Path) -> None:
    """Undo a :func:`replace_folder` interrupted between its two renames (fallback path only).

    If ``final`` is missing but ``.<final>.old`` exists, the old folder is the last complete
    state: move it back.  If both exist, the old one is leftover garbage: remove it.
    """
    old = old_path(final)
    if not old.exists():
        return
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(old, final)


def replace_folder(staging: Path, final: Path) -> None:
    """Move a fully written ``staging`` folder onto ``final`` (old content is removed last).

    With ``renameat2(RENAME_EXCHANGE)`` the swap is atomic: at every instant ``final`` is
    either the old or the new complete folder.  Elsewhere the old folder is first renamed to
    ``.<final>.old``; :func:`recover_folder` restores it if the process dies in between.
    The caller should hold :func:`folder_lock` on both folders, so that no other run can
    take the swapped-out old folder (which briefly sits at ``staging``'s path) for its own.
    """
    _fsync_dir(staging)
    if final.exists():
        old = old_path(final)
        if old.exists():
            shutil.rmtree(old)
        if _exchange(staging, final):
            os.replace(staging, old)
        else:
            os.replace(final, old)
            os.replace(staging, final)
        _fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, final)
        _fsync_dir(final.parent)
