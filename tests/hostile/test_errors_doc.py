"""docs/errors.md documents every error class with the exit code the code actually uses."""

from __future__ import annotations

import re
from pathlib import Path

import rkpart.errors as errors

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def test_exit_code_table_matches_errors_py() -> None:
    documented = {m.group(2): int(m.group(1))
                  for m in re.finditer(r"^\|\s*(\d+)\s*\|\s*`(\w+)`", DOC.read_text(), re.M)}
    classes = {name: cls.exit_code for name, cls in vars(errors).items()
               if isinstance(cls, type) and issubclass(cls, errors.RkpartError) and cls is not errors.RkpartError}
    assert documented == classes


def test_user_error_codes_are_distinct() -> None:
    subclasses = [c for c in vars(errors).values()
                  if isinstance(c, type) and issubclass(c, errors.UserError) and c is not errors.UserError]
    codes = [c.exit_code for c in subclasses]
    assert len(set(codes)) == len(codes)
    assert all(2 < c < 64 for c in codes)
