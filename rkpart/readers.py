"""One way in (issue 51): every file rkpart reads from a folder the user gives enters here.

Each kind of file (a plan, a calibration manifest, one of its samples, a cost model, a profile,
a compiler layer table, the learned-placement store...) is a :class:`FileKind`, declared once
next to the code that owns its format and registered in :data:`KINDS`.  Reading one goes
through :meth:`FileKind.open` / :meth:`FileKind.read` / :meth:`FileKind.load`, which check,
before a byte is used:

- the path is inside its ``root`` (the plan, calibration or cache folder it belongs to) after
  every symlink is resolved, and a name read from a file (a ``dataset.txt`` line) is relative;
- it is a regular file: not a FIFO (opening one blocks until a writer comes), not a device
  (``/dev/zero`` never ends), not a folder; where the kind says so (files rkpart writes inside
  its own folders), not a symlink at all;
- its size is within the kind's bound before it is read; the file is opened ``O_NONBLOCK`` (and
  ``O_NOFOLLOW`` where symlinks are refused) and checked again through its descriptor, so a path
  swapped for a FIFO between the check and the open cannot hang the read;
- it parses in the kind's format with depth, integer and item limits (JSON, YAML, ``.npy``
  headers checked before any array is allocated);
- it passes the kind's ``check``: its schema and semantic bounds (finite positive latencies,
  known units and targets, counts that match their manifest, dtypes and shapes that match the
  stage).

A failure is one line, ``<kind> <path>: <why>``, raised as the kind's error class, so its exit
code is the one docs/errors.md lists for that kind, and a new kind of file cannot skip a check:
the checks are the reader's, not each caller's.  :func:`tracing` records which kinds a run read
(the generated hostile suite derives its cases from it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

from rkpart.errors import SpecError, UserError, first_line
from rkpart.io import MAX_DEPTH, _kind, loads_json, loads_yaml

if TYPE_CHECKING:  # numpy is imported where it is used: rkpart's CLI starts without it
    import numpy as np

Format = Literal["json", "jsonl", "yaml", "text", "npy", "npz", "bytes"]
#: elements of one array rkpart reads (2^34: 64 GiB of float32)
MAX_ELEMENTS = 1 << 34

#: every kind of file rkpart reads, by name (filled as the modules that own them are imported)
KINDS: dict[str, FileKind] = {}
#: while :func:`tracing` is active: every (kind name, resolved path) read, in order
_TRACE: list[list[tuple[str, Path]]] = []


@dataclass(frozen=True)
class FileKind:
    """One kind of file rkpart reads (see the module doc).

    ``check(doc, where)`` validates the parsed document (``where``: how messages name the file)
    and raises ``error``; ``symlinks``: whether a symlink is followed (never out of ``root``).
    """

    name: str
    fmt: Format
    max_bytes: int
    error: type[UserError] = SpecError
    check: Callable[[Any, str], object] | None = field(default=None, compare=False)
    symlinks: bool = True
    max_depth: int = MAX_DEPTH
    doc: str = ""  # one line for docs/errors.md: where the kind is read
    #: in :data:`KINDS` (a copy made for one call's message, ``dataclasses.replace(..., register=False,
    #: family=...)``, is not: it is traced as the ``family`` it copies)
    register: bool = field(default=True, compare=False, repr=False)
    family: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.register:
            KINDS.setdefault(self.name, self)

    # -- the path -----------------------------------------------------------------------------
    def fail(self, path: str | os.PathLike[str], why: str) -> UserError:
        """The kind's one-line error about ``path``: ``<kind> <path> <why>`` (``why`` reads on from
        the path: "is a FIFO, not a regular file", "does not exist")."""
        return self.error(f"{self.name} {path} {why}")

    def within(self, root: str | os.PathLike[str], rel: str, *, base: str | os.PathLike[str] | None = None,
               by: str | os.PathLike[str] | None = None) -> Path:
        """``base / rel`` (``base`` defaults to ``root``) if ``rel`` is a relative name that stays inside
        ``root`` once resolved; else the kind's error naming ``by`` (the file that names ``rel``;
        default ``base``).  ``..`` segments are allowed only as far as they stay inside (a
        calibration's ``dataset.txt`` names ``../../samples/<sha>.npy``)."""
        base_path = Path(base) if base is not None else Path(root)
        subject = by if by is not None else base_path
        shown = repr(rel[:200]) if isinstance(rel, str) else repr(rel)[:200]
        if not isinstance(rel, str) or not rel or "\0" in rel or "\\" in rel or os.path.isabs(rel) \
                or PurePosixPath(rel).is_absolute():
            raise self.fail(subject, f"names {shown}, which leaves its folder {root}")
        full = base_path / rel
        if not _inside(Path(root), Path(os.path.normpath(full))):
            raise self.fail(subject, f"names {shown}, which leaves its folder {root}")
        return full

    def stat_checked(self, path: Path, root: Path | None) -> os.stat_result:
        """``stat`` of ``path`` once it passed the checks of the module doc (before any open)."""
        try:
            lst = os.lstat(path)
        except FileNotFoundError:
            raise self.fail(path, "does not exist") from None
        except (OSError, ValueError) as e:  # ValueError: a NUL byte in the name
            raise self.fail(path, f"cannot be read ({getattr(e, 'strerror', None) or first_line(e)})") from None
        if root is not None and not _inside(root, Path(os.path.normpath(path))):
            raise self.fail(path, f"leaves its folder {root}")
        if stat.S_ISLNK(lst.st_mode):
            if not self.symlinks:
                raise self.fail(path, f"is a symlink (to {os.readlink(path)[:200]}); rkpart reads only the "
                                      "regular file itself here")
            if root is not None and not _inside(root, Path(os.path.realpath(path)), resolved=True):
                raise self.fail(path, f"is a symlink leaving its folder {root}")
        if root is not None and not _inside(root, Path(os.path.realpath(path)), resolved=True):
            raise self.fail(path, f"leaves its folder {root} (through a symlinked folder)")
        try:
            st = os.stat(path)
        except OSError as e:
            raise self.fail(path, f"cannot be read ({e.strerror})") from None
        if not stat.S_ISREG(st.st_mode):
            raise self.fail(path, f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > self.max_bytes:
            raise self.fail(path, f"is too large ({st.st_size} bytes; the limit is {self.max_bytes})")
        return st

    # -- reading ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def open(self, path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> Iterator[BinaryIO]:
        """``path`` opened for reading once every check of the module doc passed (a reader that
        streams must still count what it reads: the file may grow)."""
        p = Path(path)
        r = None if root is None else Path(root)
        self.stat_checked(p, r)
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if self.symlinks else os.O_NOFOLLOW)
        try:
            fd = os.open(p, flags)
        except OSError as e:
            raise self.fail(p, f"cannot be read ({e.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self.fail(p, f"is {_kind(st.st_mode)}, not a regular file")
            if st.st_size > self.max_bytes:
                raise self.fail(p, f"is too large ({st.st_size} bytes; the limit is {self.max_bytes})")
            if _TRACE:
                _TRACE[-1].append((self.family or self.name, p.absolute()))
            yield f

    def read(self, path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> bytes:
        """The bytes of ``path`` (:meth:`open`), at most :attr:`max_bytes`."""
        with self.open(path, root=root) as f:
            try:
                # never more than the file holds (a buffer of the bound would be allocated whole)
                data = f.read(min(os.fstat(f.fileno()).st_size, self.max_bytes) + 1)
            except OSError as e:
                raise self.fail(path, f"cannot be read ({e.strerror})") from None
        if len(data) > self.max_bytes:
            raise self.fail(path, f"is too large (over {self.max_bytes} bytes)")
        return data

    def parse(self, data: bytes, where: str) -> Any:
        """``data`` parsed in the kind's format (no ``check``)."""
        if self.fmt == "json":
            return loads_json(data, what=f"{self.name} {where}", error=self.error, max_depth=self.max_depth)
        if self.fmt == "yaml":
            try:
                text = data.decode()
            except UnicodeDecodeError:
                raise self.error(f"{self.name} {where} is not UTF-8 text") from None
            return loads_yaml(text, what=f"{self.name} {where}", error=self.error, max_depth=self.max_depth)
        if self.fmt in ("text", "jsonl"):
            try:
                return data.decode()
            except UnicodeDecodeError as e:
                raise self.error(f"{self.name} {where} is not UTF-8 text (byte {e.start})") from None
        if self.fmt == "npy":
            return parse_npy(data, fail=lambda why: self.error(f"{self.name} {where} {why}"))
        return data

    def load(self, path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> Any:
        """``path`` read (:meth:`read`), parsed in the kind's format and checked (``check``); an
        ``.npz`` is read member by member (:func:`read_npz`), never whole."""
        if self.fmt == "npz":
            if root is not None:
                self.stat_checked(Path(path), Path(root))
            doc = read_npz(path, what=self.name, error=self.error)
        else:
            doc = self.parse(self.read(path, root=root), str(path))
        if self.check is not None:
            self.check(doc, str(path))
        return doc


def _inside(root: Path, path: Path, *, resolved: bool = False) -> bool:
    """``path`` is ``root`` or below it (both resolved when ``resolved``, else compared as written
    and as resolved: a lexical ``root/../x`` leaves even if a symlink would bring it back)."""
    r = Path(os.path.realpath(root))
    if resolved:
        return path == r or r in path.parents
    lexical_root = Path(os.path.normpath(os.path.abspath(root)))
    lexical = Path(os.path.normpath(os.path.abspath(path)))
    return lexical == lexical_root or lexical_root in lexical.parents


# -- .npy ---------------------------------------------------------------------------------------------
NUMERIC_KINDS = "biuf"


def npy_header(f: BinaryIO, fail: Callable[[str], UserError], size: int | None = None) -> tuple[Any, tuple[int, ...]]:
    """``(dtype, shape)`` of the ``.npy`` stream ``f`` (at its magic), refusing a non-numeric or
    structured dtype and a shape needing more bytes than ``size`` (the bytes after the header)."""
    import numpy as np

    fmt = np.lib.format
    try:
        start = f.tell()
        version = fmt.read_magic(f)
        shape, _fortran, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                                  else fmt.read_array_header_2_0(f))
        header_bytes = f.tell() - start
    except (ValueError, EOFError, OSError, SyntaxError) as e:
        raise fail(f"is not a .npy array ({first_line(e)})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in NUMERIC_KINDS:
        raise fail(f"has dtype {dtype}, not a numeric one")
    n = 1
    for d in shape:
        n *= int(d)
    if n > MAX_ELEMENTS or (size is not None and n * dtype.itemsize > size - header_bytes):
        raise fail(f"claims shape {tuple(shape)}, more than its {size} bytes hold")
    return dtype, tuple(int(d) for d in shape)


def parse_npy(data: bytes, fail: Callable[[str], UserError]) -> Any:
    """The array of a ``.npy`` file's bytes, its header checked first (:func:`npy_header`)."""
    import numpy as np

    f = io.BytesIO(data)
    npy_header(f, fail, size=len(data))
    f.seek(0)
    try:
        return np.lib.format.read_array(f, allow_pickle=False)
    except (ValueError, EOFError, OSError) as e:
        raise fail(f"is not a usable .npy array ({first_line(e)})") from None


#: an ``.npz`` of arrays the user gives (``--inputs``, ``--reference``): opened here, its members'
#: headers checked by :func:`read_npz` before any array is allocated
NPZ_KIND = FileKind("arrays file", "npz", 1 << 40, UserError,
                    doc="`--inputs` / `--reference` `.npz` of `run`, `bundle`, `partition`, `calibrate`")


def read_npz(path: str | os.PathLike[str], *, what: str, names: Iterable[str] | None = None,
             error: type[UserError] = UserError) -> dict[str, np.ndarray]:
    """The arrays ``names`` (default: all) of the ``.npz`` at ``path``, other members never decoded.

    Only a regular file; each member's header is read first, and an object or non-numeric
    dtype, or a shape needing more bytes than the member holds (a 2^40-element header on a few
    bytes would otherwise be allocated), is refused before anything is allocated.
    """
    import zipfile
    import zlib

    import numpy as np

    p = Path(path)
    # rkpart.readers: a regular file within its bound, opened non-blocking (a FIFO never hangs the read)
    kind = dataclasses.replace(NPZ_KIND, name=what, error=error, register=False, family=NPZ_KIND.name)
    fmt = np.lib.format
    out: dict[str, np.ndarray] = {}
    try:
        with kind.open(p) as raw:
            if raw.read(6) == b"\x93NUMPY":
                raise error(f"{what} {p} is a single .npy array, not an .npz with one array per name")
            raw.seek(0)
            with zipfile.ZipFile(raw) as zf:
                members = {n[: -len(".npy")]: n for n in zf.namelist() if n.endswith(".npy")}
                if not members:
                    raise error(f"{what} {p} holds no .npy arrays")
                for k in (sorted(members) if names is None else [n for n in names if n in members]):
                    info = zf.getinfo(members[k])
                    with zf.open(info) as f:
                        version = fmt.read_magic(f)
                        shape, _fortran, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                                                  else fmt.read_array_header_2_0(f))
                    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "biuf":
                        raise error(f"{what} {p}: array {k!r} has dtype {dtype}, not a numeric one")
                    n = 1
                    for d in shape:
                        n *= int(d)
                    if n > MAX_ELEMENTS or n * dtype.itemsize > info.file_size:
                        raise error(f"{what} {p}: array {k!r} claims shape {tuple(shape)}, more than its "
                                    f"{info.file_size} bytes hold")
                    with zf.open(info) as f:
                        out[k] = fmt.read_array(f, allow_pickle=False)
    except UserError:
        raise
    except (OSError, ValueError, EOFError, KeyError, RuntimeError, zipfile.BadZipFile, zlib.error) as e:
        why = "it holds pickled (object) arrays" if "pickle" in str(e) else first_line(e)
        raise error(f"cannot read {what} {p}: not a usable .npz ({why})") from None
    return out


# -- tracing ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def tracing() -> Iterator[list[tuple[str, Path]]]:
    """Record every file read through a :class:`FileKind` while active: ``(kind name, path)``."""
    got: list[tuple[str, Path]] = []
    _TRACE.append(got)
    try:
        yield got
    finally:
        _TRACE.pop()


def kind(name: str) -> FileKind:
    """The registered kind ``name`` (``KeyError`` when no module declared it)."""
    return KINDS[name]


__all__ = ["KINDS", "MAX_ELEMENTS", "NPZ_KIND", "FileKind", "kind", "npy_header", "parse_npy", "read_npz", "tracing"]
