"""One-line descriptions of third-party exceptions."""

from __future__ import annotations

from rkpart.errors import describe_exception, first_line


def test_first_line_and_empty_messages():
    assert first_line(ValueError("bad thing\n  at line 3\n")) == "bad thing"
    assert first_line(ValueError("")) == "ValueError"  # no IndexError on an empty message
    assert first_line(OSError()) == "OSError"
    assert describe_exception(ImportError("  no module x\nmore")) == "ImportError: no module x"
    assert describe_exception(RuntimeError()) == "RuntimeError"
