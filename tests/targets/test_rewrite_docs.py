"""docs/compile.md's table of NPU rewrites and :data:`rkpart.targets.rewrites.REWRITES` say the same.

Every ``npu`` row (and ``dedupe-constants``) has one row in the docs table, and no other name does;
the docs row's toolkit tag is the row's ``toolkits``, a row that is not exact says so, and a row
for a crash or for weight memory says it is not a placement.
"""

from __future__ import annotations

import re
from pathlib import Path

from rkpart.targets.rewrites import DEDUPE, PURPOSES, REWRITES, Rewrite

DOC = Path(__file__).resolve().parents[2] / "docs" / "compile.md"
#: the toolkit tag a docs row carries after its name, per ``toolkits``
TAGS = {("2.3.0", "2.3.2"): "(2.3.x only", ("2.5.0",): "(2.5.0 only", ("2.3.0",): "(2.3.0 only", ("*",): "",
        ("2.3.2", "2.5.0"): "(2.3.2 and 2.5.0 only"}


def _doc_rows() -> dict[str, str]:
    """Rewrite name -> its row of the docs table (the table after ``| rewrite | pattern |``)."""
    text = DOC.read_text()
    start = text.index("| rewrite | pattern |")
    rows: dict[str, str] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.strip().startswith("|"):
            break
        m = re.match(r"\s*\| `([a-z0-9-]+)`", line)
        assert m, line
        assert m.group(1) not in rows, f"{m.group(1)} twice in docs/compile.md"
        rows[m.group(1)] = line
    return rows


def _rows() -> dict[str, Rewrite]:
    return {r.name: r for r in (*REWRITES, DEDUPE) if r.kind == "npu"}


def test_the_docs_table_lists_the_rows_of_the_table() -> None:
    assert sorted(_doc_rows()) == sorted(_rows())


def test_each_docs_row_says_what_the_row_says() -> None:
    docs = _doc_rows()
    for name, r in _rows().items():
        head = docs[name].split("|")[1]
        tag = TAGS[r.toolkits]
        assert (tag in head) if tag else "only" not in head, (name, r.toolkits, head)
        said_inexact = "not exact" in docs[name].lower() or "(approximate)" in head
        assert said_inexact is not r.exact, (name, r.exact, "docs/compile.md must say whether it is exact")
        if r.purpose == "crash":
            assert re.search(r"avoids an? ", docs[name]), (name, "a crash row says what it avoids")
        if r.purpose == "memory":
            assert "weight memory" in docs[name], name
        # a row compile weighs for memory (builds the stage without it too) says so in its first column
        assert ("weighed" in head) is r.weighed, (name, r.weighed, head)


def test_every_row_declares_a_purpose_and_five_are_not_exact() -> None:
    assert {r.purpose for r in (*REWRITES, DEDUPE)} == set(PURPOSES)
    assert sorted(r.name for r in (*REWRITES, DEDUPE) if not r.exact) == [
        "bfloat16-widen", "layernorm-scale-fold", "pad-rows-matmul", "reciprocal-mul-div", "reduce-sum-matmul"]
    assert all(r.gate is None or not r.exact for r in REWRITES)
