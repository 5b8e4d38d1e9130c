"""Helpers shared by the click command modules (kept out of :mod:`rkpart.cli` to avoid cycles)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from rkpart.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


def report_user_error(e: UserError) -> None:
    click.echo(f"rkpart: error: {e}", err=True)


def user_errors(fn: F) -> F:
    """Print a :class:`UserError` as one line and exit with its code.

    The ``rkpart`` group does the same; this keeps a command right when it is invoked on its
    own (``CliRunner().invoke(compile_cmd, ...)``, or embedded in another click group).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            report_user_error(e)
            sys.exit(e.exit_code)

    return wrapper  # type: ignore[return-value]


def parse_key_values(_ctx: click.Context | None, _param: click.Parameter | None,
                     values: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` options: the value as JSON when it parses (numbers, booleans, lists,
    dicts such as ``op_target``), else as a string."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected key=value, e.g. optimization_level=2")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out
