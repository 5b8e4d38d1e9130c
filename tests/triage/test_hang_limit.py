"""Builds that never return, in ``--repartition``: how long a reduction candidate of such a stage may take
(rkpart.triage.isolate.hang_limit), and what the round reports.

A hang no workaround fixes is reduced, against the FAKE worker's spinning build, in
``tests/compile/test_hang.py``; the real 2.5.0 hang (``tests/compile/test_repartition.py``) is now fixed by
its rebuild with the rule it stopped after turned off, before any reduction.
"""

from __future__ import annotations

from rkpart.triage.isolate import _ISOLATABLE, HANG_FACTOR, HANG_MIN_S, hang_limit


def test_a_few_times_the_slowest_build_within_the_users_timeout() -> None:
    assert hang_limit(0.0, None) == HANG_MIN_S  # no stage built: the floor
    assert hang_limit(4.0, None) == HANG_MIN_S  # RFD4: its other stages built in 4 s
    assert hang_limit(100.0, None) == HANG_FACTOR * 100.0
    assert hang_limit(100.0, 120.0) == 120.0  # never past --timeout
    assert hang_limit(4.0, 10.0) == 10.0


def test_timeouts_are_reduced_like_crashes_and_errors() -> None:
    assert set(_ISOLATABLE) == {"crash", "error", "timeout"}


def test_a_round_that_moved_failing_ops_says_how_many_stages_still_fail() -> None:
    """A round that moved the ops of a failed (or hung) stage, with no cut, reports the failed stages too."""
    from rkpart.repartition import RepartitionRound

    text = RepartitionRound(1, ("norm", "gate"), 0, 0, 3, failed_before=1, failed_after=0).describe()
    assert "2 op(s) the build put on the CPU (or that fail it) moved to the host" in text
    assert "failed stages 1 -> 0" in text and "cut(s)" not in text
    assert "failed stages" not in RepartitionRound(1, ("x",), 4, 0, 2).describe()  # nothing failed: not said
