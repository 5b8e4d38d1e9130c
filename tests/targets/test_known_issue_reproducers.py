"""Every reproducer of the known-issue table still does, on the toolkit it names, what the table records.

A crashing reproducer must still crash with that signal and be recognised as its own issue from the
build log (:func:`~rkpart.targets.known_issues.match_signature`); a control (``"ok"``: a form the issue
does not need) must still build.  Each build is one real rknn-toolkit2 build in a crash-isolated
subprocess (:func:`rkpart.triage.matrix.build_once`), ~15-25 s of CPU.  The reproducers kept as files
(2.5.0) are built by ``tests/targets/test_crash_rewrites.py``, with the rewrites that avoid them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.targets.known_issues import KNOWN_ISSUES, KnownIssue, match_signature
from rkpart.targets.known_issues_repro import Reproducer

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]

MADE = [(issue, r) for issue in KNOWN_ISSUES for r in issue.reproducers if r.make is not None]


@pytest.mark.parametrize(("issue", "rep"), MADE, ids=[f"{r.name}-{r.toolkit}" for _, r in MADE])
def test_reproducer_does_what_the_table_records(issue: KnownIssue, rep: Reproducer, tmp_path: Path) -> None:
    from rkpart.triage.matrix import build_once
    from tests.toolkits import get_toolkit

    tk = get_toolkit(rep.toolkit)
    res = build_once(rep.save(tmp_path / f"{rep.name}.onnx"), tk, target="rk3588", log=tmp_path / "build.log",
                     timeout=900)
    if rep.outcome == "ok":
        assert res.ok, f"{rep.name} was recorded building on {rep.toolkit}: {res.message}"
        return
    assert not res.ok and res.signal == rep.outcome, (res.kind, res.signal, res.message)
    assert match_signature(res) is issue
