"""Warnings when the board runtime differs from the toolkit that built a stage."""

from __future__ import annotations

from rkpart.plan.plan import Artifact, Plan, Stage
from rkpart.triage.compat import check_runtime_compat, parse_runtime_version


def _stage(sid: str, toolkit: str | None) -> Stage:
    arts = () if toolkit is None else (Artifact(kind="rknn", file=f"rknn/{sid}.rknn", toolkit=toolkit,
                                                target="rk3588", config_hash="c", sha256="s", size_bytes=1),)
    return Stage(id=sid, device="npu", file=f"stages/{sid}.onnx", inputs=("x",), outputs=("y",), block=0,
                 region="block", kind="block", weight_bytes=0, io_bytes=0, sha256="0", num_nodes=1, artifacts=arts)


def _plan(*stages: Stage) -> Plan:
    return Plan(model={"file": "m.onnx"}, strategy={"name": "fused", "options": {}}, inputs=("x",),
                outputs=("y",), tensors={}, stages=stages)


def test_matching_runtime_gives_no_warning() -> None:
    assert check_runtime_compat(_plan(_stage("b00", "2.3.0"), _stage("b01", "2.3.0")), "2.3.0") == []
    assert check_runtime_compat(_plan(_stage("b00", "2.5.0")), None) == []


def test_newer_toolkit_than_runtime_is_the_risky_case() -> None:
    plan = _plan(_stage("b00", "2.5.0"), _stage("b01", "2.5.0"), _stage("b02", "2.3.0"), _stage("host", None))
    warnings = check_runtime_compat(plan, "librknnrt version: 2.3.0 (c949ad889d@2024-11-07T11:35:33)")
    assert len(warnings) == 1  # one per differing toolkit version; 2.3.0 matches
    assert warnings[0].startswith("stages b00, b01 built by rknn-toolkit2 2.5.0 but the board runtime is 2.3.0")
    assert "rkpart compile --toolkit 2.3.0" in warnings[0]


def test_older_toolkit_and_patch_differences_are_reported_too() -> None:
    plan = _plan(_stage("b00", "2.3.0"), _stage("b01", "2.5.0"))
    warnings = check_runtime_compat(plan, "2.5.1")
    assert len(warnings) == 2
    assert "stage b00 built by rknn-toolkit2 2.3.0" in warnings[0] and "usually load" in warnings[0]
    assert warnings[1].endswith("(patch versions differ)")


def test_unreadable_runtime_version() -> None:
    (w,) = check_runtime_compat(_plan(_stage("b00", "2.3.0")), "unknown")
    assert "cannot read the board runtime version" in w
    assert parse_runtime_version("v2.3.2") == "2.3.2"
    assert parse_runtime_version("1.6") == "1.6"
