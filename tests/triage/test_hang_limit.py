"""How long a reduction candidate of a stage whose build timed out may take (rkpart.triage.isolate.hang_limit).

The toolkit test that reduces a real hang is ``tests/compile/test_repartition.py``
(``test_a_stage_whose_build_never_returns_is_reduced_and_its_ops_go_to_the_host``).
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
