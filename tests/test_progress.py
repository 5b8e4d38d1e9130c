"""rkpart.progress: what every command prints while it works."""

from __future__ import annotations

import io
import re

from rkpart.progress import Reporter, advance


def test_plain_lines_carry_the_elapsed_time_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Reporter(stream=out) as say:
        say("loading model")
        advance(say, 1, 3)  # no bar off a terminal: nothing printed
        say("done")
    assert re.fullmatch(r"\[ +\d+\.\ds\] loading model\n\[ +\d+\.\ds\] done\n", out.getvalue()), out.getvalue()


def test_quiet_prints_nothing_and_plain_callables_ignore_advance() -> None:
    out = io.StringIO()
    with Reporter(stream=out, quiet=True) as say:
        say("x")
        advance(say, 1, 2)
    assert out.getvalue() == ""
    seen: list[str] = []
    advance(seen.append, 1, 2)  # a plain Progress (tests, library callers) is left alone
    assert seen == []


def test_live_display_shows_the_events_and_a_bar_with_counts() -> None:
    out = io.StringIO()
    with Reporter(stream=out, live=True) as say:
        say("building b00.attn")
        advance(say, 2, 4)
    text = out.getvalue()
    assert "building b00.attn" in text and "2/4" in text, text

