"""One output protocol for every command that writes (issue 31).

``partition`` learned it first (:mod:`rkpart.plan.outdir`); every other command that
writes a folder or a file goes through the same rules here:

- **Folders** are written into a sibling staging folder ``.<out>.partial``, locked with
  :func:`~rkpart.io.folder_lock` and never followed through a symlink, then swapped onto
  ``out`` atomically (:func:`~rkpart.io.replace_folder`).  A staging folder is reused only
  when it is empty or holds this module's marker (a run killed before it could clean up);
  anything else is refused, never removed.  On any error or Ctrl-C the staging folder is
  removed while it is still ours, so nothing is left behind.
- **Ownership** is judged by a marker file rkpart writes itself, :data:`MARKER`, listing the
  command that wrote the folder and every file it wrote, not by a file name such as
  ``manifest.json``: ``--force`` replaces a folder only if the marker names the same kind of
  output and the folder holds nothing else (a note a user added is reason to refuse).
- **Outputs older than the marker** (written by an rkpart before it had one) are recognised
  by their own document instead: a ``legacy`` :data:`Listing` reads it (a plan's
  ``plan.json``, a bundle's ``manifest.json``, ...) and gives every file that document says
  rkpart wrote there (:func:`legacy_problem`).  ``--force`` replaces such a folder only if the
  document is valid and the folder holds nothing else, no symlink among them: a file the
  document does not list is a user's, and the folder is refused.
- **Files** are written only onto a path that is missing or a regular file: never through a
  symlink, never onto a device node, FIFO, socket or folder (``rkpart example /dev/null``
  as root would otherwise replace the machine's ``/dev/null``).  The kind is checked again
  just before the rename, so a path swapped meanwhile is not replaced either.
- **A command's ``-o FILE``** (issue 51) follows the folders' rule through
  :func:`claim_output_file`, before any work: it is refused when it is one of the command's
  inputs or lies inside one, when it lies inside a folder rkpart manages (a plan, a bundle, a
  calibration, a report's assets, a tune folder, the build cache: :func:`managing_folder`), and
  when it exists, unless ``--force`` is given and the file is one rkpart wrote.  rkpart knows
  a file it wrote by its format header, never by its name: a cost model's or a profile's
  ``"format"`` (:func:`json_format_is`), the report page's generator tag, the zip comment of
  an ``.npz`` of outputs (:func:`npz_is_rkparts`), the example's own bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from rkpart.errors import OutputExistsError, UserError, os_error
from rkpart.io import (
    _kind,
    atomic_writer,
    default_cache_dir,
    folder_lock,
    recover_folder,
    replace_folder,
)
from rkpart.readers import FileKind
from rkpart.types import JsonObject

#: the file rkpart writes into every output folder: who wrote it and which files it wrote
MARKER = ".rkpart-output.json"
MARKER_FORMAT = "rkpart-output"
MARKER_VERSION = 1
#: a marker larger than this is not one rkpart wrote
_MARKER_MAX_BYTES = 16 << 20

#: the marker, read through rkpart's one reader: never a symlink, FIFO or device, at most 16 MiB
MARKER_KIND = FileKind("output marker", "json", _MARKER_MAX_BYTES, OutputExistsError, symlinks=False,
                       doc="`.rkpart-output.json` of every folder rkpart writes (a bad one: not rkpart's)")

Problem = Callable[[Path], "str | None"]
#: a folder written before :data:`MARKER` existed -> every file (relative POSIX path) its own
#: document says rkpart wrote there, or why it is not such a folder (a one-line reason)
Listing = Callable[[Path], "set[str] | str"]


def staging_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.partial")


def is_temp_name(rel: str) -> bool:
    """Whether ``rel`` names a temp file of rkpart's atomic writes (``.<name>.<random>.tmp``),
    which a killed run may leave anywhere it was writing."""
    name = rel.rsplit("/", 1)[-1]
    return name.startswith(".") and name.endswith(".tmp")


def is_leftover_temp(p: Path) -> bool:
    """``p`` is a regular file (not a symlink) named as an atomic write's temp file (:func:`is_temp_name`)."""
    return is_temp_name(p.name) and p.is_file() and not p.is_symlink()


def folder_entries(folder: Path) -> list[str]:
    """Every file and symlink under ``folder`` (relative POSIX paths, sorted), symlinks never followed."""
    out: list[str] = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        base = Path(root).relative_to(folder)
        for d in list(dirs):
            if os.path.islink(os.path.join(root, d)):
                out.append((base / d).as_posix())
        out.extend((base / f).as_posix() for f in files)
    return sorted(out)


def write_marker(folder: Path, kind: str, *, complete: bool = True) -> None:
    """Write :data:`MARKER` into ``folder``: ``kind`` and (``complete``) every file it holds now.

    Deterministic (sorted names, no times), so identical runs give identical folders.
    """
    from rkpart.io import atomic_write_bytes

    files = [r for r in folder_entries(folder) if r != MARKER and not is_temp_name(r)] if complete else []
    doc = {"format": MARKER_FORMAT, "version": MARKER_VERSION, "kind": kind, "complete": complete, "files": files}
    atomic_write_bytes(folder / MARKER, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def read_marker(folder: Path) -> JsonObject | None:
    """The marker of ``folder`` if it holds a valid one (a regular file, not a symlink), else ``None``."""
    try:
        doc = MARKER_KIND.load(folder / MARKER, root=folder)
    except (OSError, UserError):
        return None
    if not (isinstance(doc, dict) and doc.get("format") == MARKER_FORMAT and isinstance(doc.get("kind"), str)
            and isinstance(doc.get("files"), list) and all(isinstance(f, str) for f in doc["files"])):
        return None
    return doc


def legacy_problem(folder: Path, listing: Listing, *, grows: tuple[str, ...] = ()) -> str | None:
    """Why ``folder``, which has no :data:`MARKER`, is not an output an older rkpart wrote, or ``None``.

    ``listing`` reads the folder's own document (:data:`Listing`); every entry of the folder
    must be one it lists (or under a ``grows`` folder), and none may be a symlink.
    """
    try:
        listed = listing(folder)
    except UserError as e:
        listed = str(e)
    if isinstance(listed, str):
        return f"it has no rkpart output marker ({MARKER}) and {listed}"
    for rel in folder_entries(folder):
        if is_temp_name(rel):
            continue
        top = rel.split("/", 1)[0]
        if os.path.islink(folder / rel) or os.path.islink(folder / top):
            return f"it has no rkpart output marker ({MARKER}) and {rel!r} is a symlink"
        if rel not in listed and top not in grows:
            return f"it has no rkpart output marker ({MARKER}) and holds {rel!r}, which its own record does not list"
    return None


def owned_problem(folder: Path, kind: str, *, grows: tuple[str, ...] = (), legacy: Listing | None = None) -> str | None:
    """Why ``folder`` is not an rkpart ``kind`` output that ``--force`` may replace, or ``None``.

    ``grows``: top-level folders later commands add to (``compile`` adds ``rknn/`` to a plan).
    ``legacy``: how a ``kind`` folder written before the marker existed lists its files
    (:func:`legacy_problem`); without it such a folder is refused.
    """
    doc = read_marker(folder)
    if doc is None:
        if legacy is not None:
            return legacy_problem(folder, legacy, grows=grows)
        return f"it has no rkpart output marker ({MARKER})"
    if doc["kind"] != kind:
        return f"it is an rkpart {doc['kind']} output, not a {kind}"
    listed = set(doc["files"])
    for rel in folder_entries(folder):
        if rel == MARKER or is_temp_name(rel) or rel in listed or rel.split("/", 1)[0] in grows:
            continue
        return f"it holds {rel!r}, which rkpart did not write"
    return None


def check_folder_target(out: Path, *, kind: str, force: bool, what: str = "output folder",
                        problem: Problem | None = None, legacy: Listing | None = None) -> None:
    """Refuse an output folder rkpart must not write into or replace (``problem``: ownership
    test, default :func:`owned_problem` for ``kind`` with ``legacy``)."""
    if out.is_symlink():
        raise OutputExistsError(f"{what} {out} is a symlink; give the folder it points to "
                                f"({os.path.realpath(out)}) or another path")
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"{what} {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise OutputExistsError(f"{what} {out} is not empty; use --force to replace it")
        why = (problem or (lambda f: owned_problem(f, kind, legacy=legacy)))(out)
        if why is not None:
            raise OutputExistsError(f"refusing to replace {out}: it is not an rkpart {kind}: {why}")


def check_staging_path(staging: Path) -> None:
    """Refuse a staging path that is a symlink or not a folder (before locking it)."""
    if staging.is_symlink():
        raise OutputExistsError(f"staging path {staging} is a symlink (rkpart never writes through one); remove it")
    if os.path.lexists(staging) and not staging.is_dir():
        raise OutputExistsError(f"staging path {staging} exists and is not a folder; remove it")


def _claim_staging(staging: Path, kind: str) -> None:
    """Empty the locked staging folder if a killed rkpart run of ``kind`` left it; refuse anything else."""
    entries = list(staging.iterdir())
    # a run killed before its marker's rename leaves only the marker's temp file
    if all(is_leftover_temp(p) for p in entries):
        for p in entries:
            p.unlink()
        return
    doc = read_marker(staging)
    if doc is None or doc["kind"] != kind:
        raise OutputExistsError(f"staging path {staging} holds files rkpart did not write; move them away")
    # the marker last: a run killed half-way leaves a folder still marked as a staging folder
    for p in sorted(entries, key=lambda p: p.name == MARKER):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


@contextlib.contextmanager
def _lock_existing(out: Path, what: str) -> Iterator[None]:
    if out.is_dir() and not out.is_symlink():
        with folder_lock(out, what=what, nofollow=True):
            yield
    else:
        yield


@contextlib.contextmanager
def staged_folder(out: str | os.PathLike[str], *, kind: str, force: bool, what: str = "output folder",
                  problem: Problem | None = None, legacy: Listing | None = None) -> Iterator[Path]:
    """Yield the staging folder for the output folder ``out``; on success swap it onto ``out``.

    ``legacy``: how a ``kind`` folder older than the marker lists its files (:func:`legacy_problem`).
    The folder is checked before (``--force``, ownership), locked, checked again under the
    lock, and :data:`MARKER` (``kind``, the files written) is added last.  On any exception
    (including ``KeyboardInterrupt``) the staging folder is removed and ``out`` is untouched;
    a disk-full or read-only ``OSError`` becomes the matching one-line user error.
    """
    final = Path(os.path.abspath(out))
    check_folder_target(final, kind=kind, force=force, what=what, problem=problem, legacy=legacy)
    staging = staging_path(final)
    check_staging_path(staging)
    with folder_lock(staging, what=f"{what} {final}", nofollow=True):
        _claim_staging(staging, kind)  # outside the try: a staging folder not ours is never removed
        try:
            with _lock_existing(final, f"{what} {final}"):
                recover_folder(final)
                check_folder_target(final, kind=kind, force=force, what=what, problem=problem, legacy=legacy)
                write_marker(staging, kind, complete=False)  # a killed run's leftovers are recognisable
                yield staging
                write_marker(staging, kind)
                replace_folder(staging, final)
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            err = os_error(e, f"writing {final}")
            if err is None:
                raise
            raise err from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


# -- single files ------------------------------------------------------------------------------


def check_file_target(path: str | os.PathLike[str], *, force: bool, what: str = "output",
                      owned: Callable[[Path], bool] | None = None) -> None:
    """Refuse a destination file that is a symlink or not a regular file, or exists without ``force``.

    ``owned``: with ``force``, an existing file is replaced only if ``owned(path)`` says rkpart wrote it.
    """
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    except OSError as e:
        raise OutputExistsError(f"cannot write {what} {p}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputExistsError(f"{what} {p} is a symlink; rkpart does not write through one")
    if not stat.S_ISREG(st.st_mode):
        raise OutputExistsError(f"{what} {p} is {_kind(st.st_mode)}; rkpart writes only regular files")
    if not force:
        raise OutputExistsError(f"{what} {p} exists; use --force to replace it")
    if owned is not None and not owned(p):
        raise OutputExistsError(f"refusing to replace {what} {p}: rkpart did not write it")


def _still_regular_or_missing(p: Path, what: str) -> None:
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else _kind(st.st_mode)
        raise OutputExistsError(f"{what} {p} became {kind} while rkpart was writing; not replaced")


@contextlib.contextmanager
def output_file(path: str | os.PathLike[str], *, force: bool, what: str = "output",
                owned: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a temp path next to ``path``; on success it is fsynced and renamed onto ``path``.

    ``path`` is checked first (:func:`check_file_target`) and again before the rename; the
    temp file is removed on any error or Ctrl-C.
    """
    p = Path(os.path.abspath(path))
    check_file_target(p, force=force, what=what, owned=owned)
    try:
        with atomic_writer(p, before_replace=lambda: _still_regular_or_missing(p, what)) as tmp_path:
            yield tmp_path
    except OSError as e:
        err = os_error(e, f"writing {what} {p}")
        if err is None:
            raise
        raise err from None


def write_output_file(path: str | os.PathLike[str], data: bytes, *, force: bool, what: str = "output",
                      owned: Callable[[Path], bool] | None = None) -> None:
    """:func:`output_file` for bytes already in memory."""
    with output_file(path, force=force, what=what, owned=owned) as tmp:
        tmp.write_bytes(data)


# -- a command's -o FILE (issue 51) --------------------------------------------------------------

#: what a folder rkpart manages holds (besides :data:`MARKER`), to know one written before the
#: marker: its document and the folder beside it
_MANAGED = (("plan.json", "stages", "plan folder"), ("manifest.json", "runner.py", "bundle"),
            ("calibration.json", "samples", "calibration folder"), ("tune_report.json", "plans", "tune folder"))


def managing_folder(path: str | os.PathLike[str]) -> tuple[Path, str] | None:
    """The folder rkpart manages that ``path`` lies inside, and what it is (``None``: none).

    A folder with rkpart's output marker (:data:`MARKER`: a plan, a bundle, a calibration, a
    report's assets, a tune folder, a shared build cache), one written before the marker existed
    (:data:`_MANAGED`: its document and the folder next to it), and everything under the
    user-level cache folder (:func:`~rkpart.io.default_cache_dir`: builds, learned placements,
    toolkits).  Judged on the path as written and with its symlinks resolved.
    """
    p = Path(os.path.abspath(path))
    cache = Path(os.path.realpath(default_cache_dir()))
    for cand in dict.fromkeys([p, Path(os.path.realpath(p))]):
        if cand == cache or cache in cand.parents:
            return cache, "cache folder"
        for d in cand.parents:
            doc = read_marker(d) if os.path.lexists(d / MARKER) else None
            if doc is not None:
                return d, f"{doc['kind']} folder" if not doc["kind"].endswith(("folder", "cache")) else doc["kind"]
            for name, beside, what in _MANAGED:
                if os.path.isfile(d / name) and os.path.isdir(d / beside):
                    return d, what
    return None


def input_problem(p: Path, inputs: Iterable[str | os.PathLike[str]]) -> str | None:
    """Why ``p`` may not be written because of the command's ``inputs``: it is one, or lies in one."""
    real = Path(os.path.realpath(p))
    for i in inputs:
        ip = Path(os.path.abspath(i))
        ireal = Path(os.path.realpath(ip))
        if ireal.is_dir():
            if ireal == real or ip == p:
                return f"is one of its inputs ({i})"
            if ireal in real.parents or ip in p.parents:
                return f"lies inside {i}, one of its inputs"
        elif ireal == real or ip == p or (real.exists() and ireal.exists() and os.path.samefile(real, ireal)):
            return f"is one of its inputs ({i})"
    return None


def claim_output_file(path: str | os.PathLike[str], *, what: str, force: bool, owned: Callable[[Path], bool],
                      inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """The rule of a command's ``-o FILE``, checked before any work (see the module doc); returns
    the absolute path.  ``owned(path)`` says whether an existing file is one rkpart wrote (its
    format header); ``inputs``: the command's input files and folders.

    Raises :class:`OutputExistsError` (one line) naming why the destination is refused.
    """
    p = Path(os.path.abspath(path))
    why = input_problem(p, inputs)
    if why is not None:
        raise OutputExistsError(f"{what} {p} {why}; rkpart never writes over what it reads: choose another path")
    found = managing_folder(p)
    if found is not None:
        folder, kind = found
        raise OutputExistsError(f"{what} {p} lies inside {folder}, an rkpart {kind}: rkpart manages the files in "
                                "it; choose a path outside it")
    check_file_target(p, force=force, what=what, owned=owned)
    return p


def claim_output_folder(out: str | os.PathLike[str], *, what: str = "output folder",
                        inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Path:
    """The half of :func:`claim_output_file`'s rule a command's ``-o DIR`` adds to the folder protocol
    (:func:`staged_folder`), checked before any work: the folder is none of the command's inputs, does
    not lie inside one or hold one (``--force`` would replace it), and does not lie inside a folder
    rkpart manages (a plan, a bundle, a calibration, a tune folder, the cache).  Returns it absolute."""
    p = Path(os.path.abspath(out))
    real = Path(os.path.realpath(p))
    given = [i for i in inputs if i is not None]
    why = input_problem(p, given)
    if why is None:
        held = next((i for i in given if real in Path(os.path.realpath(i)).parents), None)
        why = None if held is None else f"contains {held}, one of its inputs"
    if why is not None:
        raise OutputExistsError(f"{what} {p} {why}; rkpart never writes over what it reads: choose another folder")
    found = managing_folder(p)
    if found is not None:
        folder, kind = found
        raise OutputExistsError(f"{what} {p} lies inside {folder}, an rkpart {kind}: rkpart manages the files in "
                                "it; choose a folder outside it")
    return p


def head_bytes(path: Path, n: int = 1 << 16) -> bytes:
    """The first ``n`` bytes of the regular file ``path`` (``b""`` for anything else): what the
    ownership tests read.  Opened non-blocking, never through a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return f.read(n)


def json_format_is(fmt: str, *, first_line: bool = False) -> Callable[[Path], bool]:
    """An ownership test (:func:`claim_output_file`): the file is JSON (``first_line``: JSON Lines)
    whose ``"format"`` is ``fmt``."""
    def owned(path: Path) -> bool:
        head = head_bytes(path, 16 << 20)
        if first_line:
            head = head.split(b"\n", 1)[0]
        try:
            doc = json.loads(head)
        except ValueError:
            return False
        return isinstance(doc, dict) and doc.get("format") == fmt

    return owned


#: the zip comment of an ``.npz`` of outputs rkpart (``run --save-outputs``) or the runner wrote
NPZ_COMMENT = b"rkpart outputs"


def npz_is_rkparts(path: Path) -> bool:
    """An ownership test: an ``.npz`` whose zip comment is :data:`NPZ_COMMENT`."""
    import zipfile

    if not head_bytes(path, 4).startswith(b"PK"):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            return z.comment == NPZ_COMMENT
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def mark_npz(path: Path) -> None:
    """Give the ``.npz`` at ``path`` (a temp file being written) rkpart's zip comment."""
    import zipfile

    with zipfile.ZipFile(path, "a") as z:
        z.comment = NPZ_COMMENT


# -- work folders ------------------------------------------------------------------------------


def claim_work_folder(work: str | os.PathLike[str], *, kind: str, legacy: Listing | None = None,
                      grows: tuple[str, ...] = (), known: tuple[str, ...] = ()) -> Path:
    """Make ``work`` a folder rkpart may keep writing into across runs (``tune``'s work folder).

    It must be missing, empty, or already carry a ``kind`` marker, or (``legacy``) be a ``kind``
    folder written before the marker existed (:func:`legacy_problem`, ``grows``: its folders of
    runs); never a symlink, a file, or a folder of someone else's files.  The marker is written
    before anything else.  ``known``: the files a ``kind`` folder holds at its top besides the
    ``grows`` folders; anything else there is someone else's and the folder is refused (issue 51:
    ``tune -o`` accepted a folder of its own with a user's note in it).
    """
    w = Path(os.path.abspath(work))
    if w.is_symlink():
        raise OutputExistsError(f"work folder {w} is a symlink; give the folder it points to "
                                f"({os.path.realpath(w)}) or another path")
    if os.path.lexists(w) and not w.is_dir():
        raise OutputExistsError(f"work folder {w} exists and is not a folder")
    # the folders runs add to are written through (plans, profiles...): one planted as a symlink
    # would send those writes outside the work folder
    linked = next((g for g in grows if (w / g).is_symlink()), None)
    if linked is not None:
        raise OutputExistsError(f"refusing to write into {w}: its {linked}/ is a symlink "
                                f"(to {os.path.realpath(w / linked)}); remove it or choose another folder")
    if w.is_dir() and any(w.iterdir()):
        doc = read_marker(w)
        if doc is not None and doc["kind"] == kind:
            foreign = sorted(n for n in os.listdir(w) if n != MARKER and not is_temp_name(n)
                             and n not in grows and n not in known)
            if foreign:
                raise OutputExistsError(f"refusing to write into {w}: it holds {foreign[0]!r}"
                                        f"{f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''}, which "
                                        f"rkpart {kind} did not write; move it away or choose another folder")
            return w
        why = (f"an rkpart {doc['kind']} output" if doc is not None else
               None if legacy is None else legacy_problem(w, legacy, grows=grows))
        if why is not None or legacy is None:
            raise OutputExistsError(f"refusing to write into {w}: it is not an rkpart {kind} folder "
                                    f"({why or 'no ' + MARKER}); choose an empty or new folder")
    try:
        w.mkdir(parents=True, exist_ok=True)
        write_marker(w, kind, complete=False)
    except OSError as e:
        err = os_error(e, f"writing {w}")
        if err is None:
            raise
        raise err from None
    return w
