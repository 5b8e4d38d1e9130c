"""The shared vocabulary (rkpart/types.py): devices, residencies, time components, build failures."""

from __future__ import annotations

import pytest

from rkpart.types import DEVICES, LIFECYCLE, RESIDENCIES, TIME_COMPONENTS, BuildFailure, Residency, seconds_key


def test_devices_residencies_and_components_are_spelled_once() -> None:
    assert DEVICES == ("npu", "host")
    assert RESIDENCIES == ("per-stage", "resident")
    assert Residency("resident") is Residency.RESIDENT and str(Residency.PER_STAGE) == "per-stage"
    assert LIFECYCLE == ("load", "init", "infer", "release")
    assert (*LIFECYCLE, "host") == TIME_COMPONENTS


def test_seconds_key_names_the_profile_field_and_refuses_unknown_components() -> None:
    assert [seconds_key(c) for c in TIME_COMPONENTS] == ["load_s", "init_s", "infer_s", "release_s", "host_s"]
    with pytest.raises(ValueError, match=r"unknown time component 'load_s' \(valid: load, init, infer, release"):
        seconds_key("load_s")


def test_build_failure_round_trips_plan_json_and_says_what_is_deterministic() -> None:
    crash = BuildFailure(toolkit="2.3.2", kind="crash", message="rknn-toolkit2 2.3.2 crashed (SIGSEGV)",
                         exit_code=139, signal="SIGSEGV", last_step="fuse_exmatmul", log="logs/a.log",
                         signature="exnorm-fusion-segv")
    assert BuildFailure.from_json(crash.to_json()) == crash
    assert crash.deterministic
    timeout = BuildFailure(toolkit="2.3.0", kind="timeout", message="killed after 60 s")
    assert not timeout.deterministic
    assert "signature" not in timeout.to_json()  # only written when a known issue matched
    assert BuildFailure.from_json(timeout.to_json()) == timeout


def test_build_failure_reads_older_and_odd_records() -> None:
    old = BuildFailure.from_json({"toolkit": "2.3.0", "kind": "segfault", "seconds": 3.5})
    assert old == BuildFailure(toolkit="2.3.0", kind="error", message="segfault")  # unknown kind -> error
    assert BuildFailure.from_json({"exit_code": "134"}).exit_code == 134
