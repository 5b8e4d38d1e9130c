"""docs/errors.md documents every error class with the exit code the code actually uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


# -- the reader's file kinds (issue 51) -----------------------------------------------------------------

def all_kinds() -> dict[str, object]:
    """Every :class:`rkpart.readers.FileKind`: the registry once every module of rkpart is imported
    (a kind registers itself where its format is owned)."""
    import importlib
    import pkgutil

    import rkpart
    from rkpart.readers import KINDS

    for m in pkgutil.walk_packages(rkpart.__path__, "rkpart."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    return dict(KINDS)


def _size(n: int) -> str:
    for unit, k in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):g} {unit}"
    return f"{n} B"


def kinds_rows() -> str:
    """The table of docs/errors.md's "One way in" section, one row per kind, sorted by name."""
    from rkpart.readers import FileKind

    rows = []
    for name, k in sorted(all_kinds().items()):
        assert isinstance(k, FileKind)
        rows.append(f"| {name} | {k.error.exit_code} | {_size(k.max_bytes)} | "
                    f"{'followed, never out of its folder' if k.symlinks else 'refused'} | {k.doc} |")
    return "\n".join(rows)


TABLE_HEAD = "| kind | exit | bound | symlink | read by |\n|---|---:|---:|---|---|\n"


@pytest.mark.slow  # imports every module of rkpart to find every kind (seconds of CPU)
def test_every_file_kind_is_documented_with_its_exit_code() -> None:
    """``python -m tests.hostile.test_errors_doc`` rewrites the table."""
    text = DOC.read_text()
    i = text.index(TABLE_HEAD) + len(TABLE_HEAD)
    j = text.index("\n\n", i)
    assert text[i:j] == kinds_rows(), "docs/errors.md's file kinds are stale: python -m tests.hostile.test_errors_doc"
    assert len(all_kinds()) >= 20


if __name__ == "__main__":
    text = DOC.read_text()
    if "{rows}" in text:
        text = text.replace("{rows}", kinds_rows())
    else:
        i = text.index(TABLE_HEAD) + len(TABLE_HEAD)
        j = text.index("\n\n", i)
        text = text[:i] + kinds_rows() + text[j:]
    DOC.write_text(text)
