"""Progress of a long command, shown the same way by every command.

Library functions take ``progress: Progress | None``, a plain callable that receives one
human-readable line per event (tests pass a ``list.append``).  The commands pass a
:class:`Reporter`, which is such a callable:

* on a terminal (stderr is a TTY) it keeps a live ``rich`` status line at the bottom: a
  spinner and the elapsed time that move even while the library is silent (a heartbeat for
  builds that take minutes), and, once the library said how far it is (:func:`advance`), a
  bar with ``done/total`` and the estimated time left; the event lines scroll above it;
* otherwise (a pipe, a log file, CI) it writes plain lines, ``[   12.3s] message``, with the
  seconds since the command started, and nothing else.

A leaf module: it imports nothing from rkpart, and ``rich`` only on a terminal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

#: what library functions accept: called with one line per event
Progress = Callable[[str], None]

#: how many characters of the latest event the live status line shows
_STATUS_WIDTH = 60


def silent(_msg: str) -> None:
    """A :data:`Progress` that drops everything."""


class Reporter:
    """A :data:`Progress` for one command run; use it as a context manager.

    ``quiet`` drops every line; ``live`` forces (``True``) or forbids (``False``) the live
    display instead of asking whether the stream is a terminal.
    """

    def __init__(self, *, quiet: bool = False, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.quiet = quiet
        self._stream = stream
        self._live = live
        self._t0 = time.monotonic()
        self._rich: Any = None  # rich.progress.Progress while live
        self._task: Any = None

    # -- the Progress protocol ---------------------------------------------------------------
    def __call__(self, msg: str) -> None:
        if self.quiet:
            return
        line = f"[{time.monotonic() - self._t0:7.1f}s] {msg}"
        bar = self._bar()
        if bar is None:
            stream = self.stream
            stream.write(line + "\n")
            stream.flush()
            return
        bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        bar.update(self._task, description=_status(msg))

    def advance(self, done: int, total: int) -> None:
        """``done`` of ``total`` units are finished: moves the bar (live display only)."""
        bar = None if self.quiet else self._bar()
        if bar is not None:
            bar.update(self._task, completed=done, total=total)

    # -- lifetime ----------------------------------------------------------------------------
    @property
    def stream(self) -> TextIO:
        # looked up at call time: click's test runner swaps sys.stderr per invocation
        return self._stream if self._stream is not None else sys.stderr

    @property
    def live(self) -> bool:
        if self._live is None:
            isatty = getattr(self.stream, "isatty", None)
            self._live = bool(isatty and isatty())
        return self._live

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def close(self) -> None:
        """Stop the live display (leaves its last state on screen)."""
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _bar(self) -> Any:
        if not self.live:
            return None
        if self._rich is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._rich = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                console=Console(file=self.stream), transient=False, refresh_per_second=4,
            )
            self._task = self._rich.add_task("", total=None)
            self._rich.start()
        return self._rich


def _status(msg: str) -> str:
    msg = msg.splitlines()[0] if msg else ""
    return msg if len(msg) <= _STATUS_WIDTH else msg[: _STATUS_WIDTH - 1] + "…"


def advance(progress: Progress | None, done: int, total: int) -> None:
    """Tell ``progress`` how far the work is, if it can show it (a :class:`Reporter`)."""
    if isinstance(progress, Reporter):
        progress.advance(done, total)


__all__ = ["Progress", "Reporter", "advance", "silent"]
