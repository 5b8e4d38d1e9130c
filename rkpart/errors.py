"""Exception hierarchy.

Two branches, as in Polygraphy: :class:`UserError` is something the user can fix (bad file,
bad option, a toolkit that crashed on their graph); the CLI prints it as one line and exits
with its ``exit_code``.  :class:`InternalError` is a bug in rkpart and keeps its traceback.
"""

from __future__ import annotations


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type name when the message is empty.

    Third-party errors (protobuf, onnx, numpy, YAML) carry multi-line messages; a user
    error is one line.
    """
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def describe_exception(e: BaseException) -> str:
    """``Type: first line`` (or ``Type``), for reports about code that is not ours (plugins)."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


class RkpartError(Exception):
    """Base of every error rkpart raises on purpose."""

    exit_code = 70


class UserError(RkpartError):
    """A problem with the user's input or environment; printed without a traceback."""

    exit_code = 2


class InvalidModelError(UserError):
    """The input is not a valid, loadable ONNX model."""

    exit_code = 3


class DiscoveryError(UserError):
    """No transformer blocks (or not the requested ones) could be found."""

    exit_code = 4


class SpecError(UserError):
    """A custom spec, plan or config file does not match its schema."""

    exit_code = 5


class OutputExistsError(UserError):
    """The output folder exists, is not empty and ``--force`` was not given, or is locked."""

    exit_code = 6


class ToolkitError(UserError):
    """rknn-toolkit2 is missing, failed to install, or failed on a stage."""

    exit_code = 7


class GateError(UserError):
    """A numerical gate (cosine, max abs, ...) failed."""

    exit_code = 8


class BudgetError(UserError):
    """No candidate partition fits the requested memory budget."""

    exit_code = 9


class InternalError(RkpartError):
    """A bug in rkpart: reported with its traceback."""

    exit_code = 70
