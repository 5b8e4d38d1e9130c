"""Exception hierarchy.

Two branches, as in Polygraphy: :class:`UserError` is something the user can fix (bad file,
bad option, a toolkit that crashed on their graph); the CLI prints it as one line and exits
with its ``exit_code``.  :class:`InternalError` is a bug in rkpart and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Sequence


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type name when the message is empty.

    Third-party errors (protobuf, onnx, numpy, YAML) carry multi-line messages; a user
    error is one line.
    """
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


#: the longest error message rkpart prints (characters): a message naming every offender (20 000 run
#: ids, 360 KB) is no longer one line a user reads; raise sites name the first few and the count
MAX_MESSAGE = 480


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` as one line of at most ``limit`` characters: line breaks and runs of whitespace
    collapsed, the middle elided (the start says what is wrong, the end often how to fix it)."""
    msg = " ".join(str(text).split())
    if len(msg) <= limit:
        return msg
    tail = msg[-(limit // 5):]
    head = msg[: limit - len(tail) - 40]
    return f"{head} [... {len(msg) - len(head) - len(tail)} characters ...] {tail}"


def listed(items: Sequence[object], *, first: int = 5) -> str:
    """``a, b, c, d, e and 37 more``: the first few of ``items`` and how many there are besides."""
    shown = ", ".join(str(x) for x in items[:first])
    return shown + (f" and {len(items) - first} more" if len(items) > first else "")


def describe_exception(e: BaseException) -> str:
    """``Type: first line`` (or ``Type``), for reports about code that is not ours (plugins)."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


class RkpartError(Exception):
    """Base of every error rkpart raises on purpose.

    A subclass names its process exit code as a class keyword,
    ``class GateError(UserError, exit_code=8)``; without one it keeps its base's.
    """

    exit_code: int = 70

    def __init_subclass__(cls, *, exit_code: int | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code


class UserError(RkpartError, exit_code=2):
    """A problem with the user's input or environment; printed without a traceback."""


class InvalidModelError(UserError, exit_code=3):
    """The input is not a valid, loadable ONNX model."""


class DiscoveryError(UserError, exit_code=4):
    """No transformer blocks (or not the requested ones) could be found."""


class SpecError(UserError, exit_code=5):
    """A custom spec, plan or config file does not match its schema."""


class OutputExistsError(UserError, exit_code=6):
    """The output folder exists, is not empty and ``--force`` was not given, or is locked."""


class ToolkitError(UserError, exit_code=7):
    """rknn-toolkit2 is missing, failed to install, or failed on a stage."""


class GateError(UserError, exit_code=8):
    """A numerical gate (cosine, max abs, ...) failed."""


class BudgetError(UserError, exit_code=9):
    """No candidate partition fits the requested memory budget."""


class ResourceError(UserError, exit_code=10):
    """The machine ran out of disk space (or quota) while rkpart was writing."""


class ExportError(UserError, exit_code=11):
    """The torch -> ONNX export failed: the exporter, a patch, ONNX Runtime or the ONNX-vs-torch check."""


#: exit status of a run interrupted with Ctrl-C (SIGINT), as shells report it (128 + 2)
INTERRUPTED_EXIT = 130


def os_error(e: OSError, what: str) -> UserError | None:
    """The user error an ``OSError`` of the environment stands for, or ``None`` (a bug).

    Disk full / quota -> :class:`ResourceError`; a read-only or forbidden folder ->
    :class:`OutputExistsError` (the output cannot be written).
    """
    import errno

    why = e.strerror or type(e).__name__
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceError(f"{what}: no space left on device{where}; free some space and rerun")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return OutputExistsError(f"{what}: cannot write{where}: {why}")
    return None


class InternalError(RkpartError, exit_code=70):
    """A bug in rkpart: reported with its traceback."""
