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
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from rkpart.errors import OutputExistsError, SpecError, UserError, first_line

if TYPE_CHECKING:  # numpy and onnx are imported where they are used: rkpart's CLI starts without them
    import onnx
    from numpy.typing import ArrayLike


class Hash(Protocol):
    """A :mod:`hashlib` object, as the byte streams feed it."""

    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...

#: lock files of older versions (folder_lock now locks the folder itself)
LOCK_NAME = ".rkpart.lock"


def default_cache_dir() -> Path:
    """Where cross-plan knowledge (the build cache, learned placements, the memory model) lives:
    ``$RKPART_CACHE_DIR`` or ``~/.cache/rkpart``."""
    env = os.environ.get("RKPART_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rkpart"


def hash_file(h: Hash, path: str | os.PathLike[str], chunk: int = 1 << 22) -> None:
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


def fsync_path(path: str | os.PathLike[str]) -> None:
    """``fsync`` the file or folder at ``path`` (a folder's entries name its files)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    """:func:`fsync_path` of a folder, best effort: a file system that cannot sync folders is no error."""
    with contextlib.suppress(OSError):
        fsync_path(folder)


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
def atomic_writer(path: str | os.PathLike[str], *,
                  before_replace: Callable[[], None] | None = None) -> Iterator[Path]:
    """Yield a temp path next to ``path``; on success it is fsynced and renamed onto ``path``.

    For writers that need a file name (``onnx.save``, ``rknn.export_rknn``).  ``before_replace``
    runs between the fsync and the rename (a last check of the destination); if it raises, the
    temp file is removed and ``path`` is left as it was.
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
        if before_replace is not None:
            before_replace()
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise
    _fsync_dir(path.parent)


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str], *, what: str | None = None, nofollow: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` for the duration; refuse a second concurrent run.

    The lock is a ``flock`` on the folder itself (no lock file): it needs no cleanup, dies
    with the process (a SIGKILLed run never leaves a stale lock), and follows the folder
    when it is renamed, which is how a finished staging folder becomes the output.
    ``what`` names the folder in the error message (default: its path).  With ``nofollow``
    the folder must not be a symlink (a planted one would redirect the run elsewhere).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | (os.O_NOFOLLOW if nofollow else 0))
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OutputExistsError(
                f"{folder} is a symlink or not a folder; rkpart does not write through it") from None
        raise
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
    if not os.path.lexists(old):
        return
    if old.is_symlink() or not old.is_dir():
        old.unlink()  # not ours (rkpart only renames real folders there): never follow it
    elif final.exists() or final.is_symlink():
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
        if old.is_symlink() or (os.path.lexists(old) and not old.is_dir()):
            old.unlink()
        elif old.exists():
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


# -- reading files rkpart did not write ---------------------------------------------------------
# One place for the rules every command follows when it opens a file named by the user or by
# a plan: only regular files (a FIFO would block the open, /dev/zero would never end), with a
# size limit, and for files a plan names, only inside the plan folder.

#: JSON/YAML rkpart reads: nesting depth, digits of one integer, and items (after YAML aliases)
MAX_DEPTH = 64
MAX_INT_DIGITS = 64
MAX_ITEMS = 5_000_000
#: the largest integer a schema-checked file (plan.json, profile records) may hold: 2**53, the
#: largest every JSON reader keeps exact (8 PiB as a byte count); a plan claiming 1e308 weight
#: bytes was estimated and reported as it said
MAX_JSON_INT = 2**53


def bounded_integers(schema: object, *, numbers: bool = False) -> Any:
    """A copy of the JSON Schema ``schema`` in which every integer without a ``maximum`` of its own
    has ``maximum`` :data:`MAX_JSON_INT` (``type`` ``"integer"`` or a list holding it).

    ``numbers``: every ``"number"`` too, and on both sides (``minimum`` ``-MAX_JSON_INT`` where
    it has none): a measurement file's 1e300 is no measurement, and sums of such overflow.
    """
    if isinstance(schema, list):
        return [bounded_integers(v, numbers=numbers) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded_integers(v, numbers=numbers) for k, v in schema.items()}
    t = schema.get("type")
    types = set(t) if isinstance(t, list) else {t}
    if "integer" in types or (numbers and "number" in types):
        out.setdefault("maximum", MAX_JSON_INT)
        if numbers:
            out.setdefault("minimum", -MAX_JSON_INT)
    return out


def bad_number(doc: object, *, limit: float | None = None) -> tuple[str, float] | None:
    """The dotted path (``""``: ``doc`` itself) and value of a number in the parsed JSON ``doc``
    that is NaN or infinite (JSON readers accept ``NaN``), or, with ``limit``, over ``limit`` in
    size; ``None`` when there is none. Booleans are not numbers here."""
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, Mapping):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(x))
        elif isinstance(x, (int, float)) and not isinstance(x, bool) and (
                (isinstance(x, float) and not math.isfinite(x)) or (limit is not None and abs(x) > limit)):
            return path, x
    return None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def regular_file(path: str | os.PathLike[str], *, what: str, error: type[UserError] = UserError,
                 name: str | None = None, missing: str = "does not exist") -> os.stat_result:
    """``os.stat`` of ``path`` (symlinks followed) or ``error`` naming why it cannot be read.

    Checked *before* anything opens the file: opening a FIFO blocks until a writer comes.
    ``name`` is how messages show the file (default: ``path``).
    """
    shown = path if name is None else name
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{what} {shown} {missing}") from None
    except OSError as e:
        raise error(f"cannot read {what} {shown}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {shown} is {_kind(st.st_mode)}, not a regular file")
    return st


@contextlib.contextmanager
def open_limited(path: str | os.PathLike[str], *, what: str, max_bytes: int,
                 error: type[UserError] = UserError) -> Iterator[BinaryIO]:
    """The regular file ``path`` opened for reading, refusing FIFOs, devices, folders and files
    over ``max_bytes`` (its size when opened; a reader that streams counts what it reads too).

    The file is opened non-blocking and checked again through its descriptor, so a path
    swapped for a FIFO between the check and the open cannot hang the read.
    """
    regular_file(path, what=what, error=error)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise error(f"{what} {path} is too large ({st.st_size} bytes; the limit is {max_bytes})")
        yield f


def read_limited(path: str | os.PathLike[str], *, what: str, max_bytes: int,
                 error: type[UserError] = UserError) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_limited`), at most ``max_bytes``."""
    with open_limited(path, what=what, max_bytes=max_bytes, error=error) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise error(f"cannot read {what} {path}: {e.strerror}") from None
    if len(data) > max_bytes:
        raise error(f"{what} {path} is too large (over {max_bytes} bytes)")
    return data


def check_tree(data: object, *, what: str, error: type[UserError] = UserError,
               max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS) -> None:
    """Refuse parsed JSON/YAML nested deeper than ``max_depth`` or with more than ``max_items``
    nodes (YAML aliases share objects, so a small file can expand to billions).  Iterative:
    a deep document must not exhaust the stack of whoever walks it next."""
    n = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        x, d = stack.pop()
        n += 1
        if n > max_items:
            raise error(f"{what}: more than {max_items} items (YAML aliases expanding?); refusing it")
        if isinstance(x, (dict, list)):
            if d > max_depth:
                raise error(f"{what}: nested more than {max_depth} levels deep")
            items = [*x.keys(), *x.values()] if isinstance(x, dict) else x
            stack.extend((y, d + 1) for y in items)
        elif isinstance(x, int) and not isinstance(x, bool) and abs(x).bit_length() > MAX_INT_DIGITS * 4:
            raise error(f"{what}: integer with more than {MAX_INT_DIGITS} digits")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer with {len(text.lstrip('-'))} digits (more than {MAX_INT_DIGITS})")
    return int(text)


def loads_json(text: str | bytes, *, what: str, error: type[UserError] = UserError,
               max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON with integer, depth and item limits; ``error`` (one line) for anything wrong."""
    try:
        data = json.loads(text, parse_int=_parse_int)
    except RecursionError:
        raise error(f"{what} is not valid JSON: nested too deeply") from None
    except UnicodeDecodeError:
        raise error(f"{what} is not valid JSON: not UTF-8 text") from None
    except ValueError as e:  # JSONDecodeError and the integer limit
        raise error(f"{what} is not valid JSON: {first_line(e)}") from None
    check_tree(data, what=what, error=error, max_depth=max_depth)
    return data


def loads_yaml(text: str, *, what: str, error: type[UserError] = UserError, max_depth: int = MAX_DEPTH) -> Any:
    """Parse YAML (safe loader) with the same limits as :func:`loads_json`."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 1}, column {mark.column + 1})"
        raise error(f"{what} is not valid YAML: {first_line(e)}{where}") from None
    except RecursionError:
        raise error(f"{what} is not valid YAML: nested too deeply") from None
    except ValueError as e:  # e.g. an integer over Python's digit limit
        raise error(f"{what} is not valid YAML: {first_line(e)}") from None
    check_tree(data, what=what, error=error, max_depth=max_depth)
    return data


def load_json_file(path: str | os.PathLike[str], *, what: str, max_bytes: int,
                   error: type[UserError] = UserError) -> Any:
    """:func:`read_limited` + :func:`loads_json`."""
    data = read_limited(path, what=what, max_bytes=max_bytes, error=error)
    return loads_json(data, what=f"{what} {path}", error=error)


# -- files a plan names -------------------------------------------------------------------------


def confined_path(folder: str | os.PathLike[str], rel: str, *, what: str, error: type[UserError] = SpecError,
                  within: str = "plan folder") -> Path:
    """``folder / rel`` if ``rel`` is relative, has no ``..`` and resolves (symlinks followed)
    inside ``folder``; else ``error`` saying it leaves the ``within`` (the lexical half of
    :func:`confined_file`, for paths that need not exist yet)."""
    folder = Path(folder)
    pp = PurePosixPath(rel)
    if not rel or pp.is_absolute() or os.path.isabs(rel) or ".." in pp.parts or "\\" in rel:
        raise error(f"{what} {rel!r} leaves the {within}")
    root = folder.resolve()
    full = (folder / rel).resolve()
    if full != root and root not in full.parents:
        raise error(f"{what} {rel!r} leaves the {within}")
    return folder / rel


def confined_file(folder: str | os.PathLike[str], rel: str, *, what: str,
                  error: type[UserError] = SpecError, within: str = "plan folder") -> Path:
    """The one confinement check for a file a plan, a stage or a model names, relative to ``folder``.

    ``rel`` must be relative, without ``..``, resolve (symlinks followed) to a path inside
    ``folder``, and be a regular file there: not a FIFO, a device or a folder.  Returns
    ``folder / rel``.  Used by ``partition`` (a model's external data), ``compile``, ``run``,
    ``profile`` and the runtime backends (stage files, their data, artifacts).
    """
    folder = Path(folder)
    confined_path(folder, rel, what=what, error=error, within=within)
    full = (folder / rel).resolve()
    if full == folder.resolve():
        raise error(f"{what} {rel!r} is a folder, not a regular file")
    regular_file(full, what=what, error=error, name=repr(rel), missing="is missing")
    return folder / rel


def external_locations(onnx_path: str | os.PathLike[str], *, what: str,
                       error: type[UserError] = SpecError) -> list[str]:
    """External-data locations an ONNX file names (initializers and Constant nodes), sorted."""
    import onnx
    from google.protobuf.message import DecodeError

    p = Path(onnx_path)
    regular_file(p, what=what, error=error)
    try:
        # format given: onnx would otherwise pick a parser by the file's extension (.json, .txt)
        model = onnx.load_model(str(p), format="protobuf", load_external_data=False)
    except (DecodeError, OSError, ValueError, RuntimeError) as e:
        raise error(f"{what} {p.name} is not an ONNX model: {first_line(e)}") from None
    return locations_in(model)


def locations_in(model: onnx.ModelProto) -> list[str]:
    """External-data locations of a parsed ``onnx.ModelProto``, sorted and unique."""
    import onnx

    locs: set[str] = set()
    tensors = list(model.graph.initializer)
    for node in model.graph.node:  # Constant nodes may hold external tensors too
        for a in node.attribute:
            if a.HasField("t"):
                tensors.append(a.t)
    for t in tensors:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location":
                    locs.add(e.value)
    return sorted(locs)


def onnx_with_data(folder: str | os.PathLike[str], rel: str, *, what: str,
                   error: type[UserError] = SpecError) -> list[Path]:
    """``[onnx, *external data files]`` of the ONNX file ``rel`` in ``folder``, each through
    :func:`confined_file` (data locations relative to the ONNX file, confined to ``folder``)."""
    onnx_path = confined_file(folder, rel, what=what, error=error)
    base = PurePosixPath(rel).parent
    files = [onnx_path]
    for loc in external_locations(onnx_path, what=what, error=error):
        if os.path.isabs(loc) or ".." in PurePosixPath(loc).parts:
            raise error(f"{what} {rel!r}: external data {loc!r} leaves the plan folder")
        files.append(confined_file(folder, str(base / loc), what=f"{what} {rel!r} external data", error=error))
    return files


def content_sha256(files: list[Path]) -> str:
    """sha256 over several files: name, size and bytes of each, so moving bytes between them
    changes the digest."""
    h = hashlib.sha256()
    for i, f in enumerate(files):
        h.update(f"\0{i}:{f.name}:{f.stat().st_size}\0".encode())
        hash_file(h, f)
    return h.hexdigest()


# -- .npz files the user gives --------------------------------------------------------------------

#: elements of one array in an ``.npz`` rkpart reads (2^34: 64 GiB of float32)
MAX_NPZ_ELEMENTS = 1 << 34


def input_digest(a: ArrayLike) -> str:
    """sha256 of an array's dtype, shape and bytes: the inputs a specialised plan was made on.

    ``rkpart/runtime/board_runner.py`` computes the same (a test keeps the two equal).
    """
    import numpy as np

    arr = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{arr.dtype.str}{list(arr.shape)}".encode())
    h.update(arr.tobytes())
    return h.hexdigest()


def check_finite_arrays(arrays: Mapping[str, ArrayLike], *, what: str, error: type[UserError] = UserError) -> None:
    """Refuse (one line) a mapping of arrays in which a float array holds NaN or Inf: inputs
    that are meant to be representative (``partition --inputs``, calibration samples) cannot be."""
    import numpy as np

    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        if a.dtype.kind in "fc" and a.size and not bool(np.isfinite(a).all()):
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise error(f"{what}: array {name!r} holds {bad} NaN/Inf value(s); representative inputs must be finite")


def write_npz(path: str | os.PathLike[str], arrays: Mapping[str, ArrayLike]) -> None:
    """An ``.npz`` that ``np.load`` and :func:`rkpart.readers.read_npz` read, byte-identical for equal arrays.

    ``np.savez`` stamps each member with the current time; here members are sorted and dated
    1980-01-01, and the file is written atomically.
    """
    import zipfile

    import numpy as np

    with atomic_writer(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for k in sorted(arrays):
            info = zipfile.ZipInfo(f"{k}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with z.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(arrays[k]), allow_pickle=False)
