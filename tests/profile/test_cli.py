"""``rkpart profile`` through click's CliRunner, on real plans and real ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.profile import records as rec
from tests.profile.plans import mini_block_plan
from tests.profile.writeup import writeup_records

# outside the fast tier: runs the profile command on plans in ONNX Runtime (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow


def test_profile_writes_valid_records_and_prints_the_tables(tmp_path: Path) -> None:
    mini_block_plan(tmp_path / "plan")
    out = tmp_path / "p.jsonl"
    res = CliRunner().invoke(main, ["profile", str(tmp_path / "plan" / "plan.json"), "--backend", "ort",
                                    "--rounds", "2", "--warmup", "0", "--no-cfg", "--steps", "2",
                                    "--interval", "0", "-o", str(out)])
    assert res.exit_code == 0, res.output
    recs = rec.read_jsonl(out)
    stages = [r for r in recs if r["record"] == "stage"]
    assert len(stages) == 4 * 2 * 2 and {r["pass"] for r in stages} == {"cond"}
    assert "NPU Inference (×2)" in res.output and "round 2/2 step 1 cond: b0_residual" in res.output


def test_compare_prints_both_tables(tmp_path: Path) -> None:
    a, b = tmp_path / "split.jsonl", tmp_path / "fused.jsonl"
    rec.write_jsonl(a, writeup_records("split"))
    rec.write_jsonl(b, writeup_records("fused"))
    res = CliRunner().invoke(main, ["profile", "--compare", str(a), str(b)])
    assert res.exit_code == 0, res.output
    assert "+0.1795 s (+5.76%)" in res.output and "-0.0206 s (-0.47%)" in res.output
    assert "+96,560 KiB (+94.30 MiB, +75.9%)" in res.output


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["profile"], 2, "exactly one of"),
        (["profile", "--compare", "{a}", "{bad}"], 5, "line 1"),
        (["profile", "{plan}"], 2, "-o/--output"),
        (["profile", "{plan}", "-o", "{out}", "--device-pattern", "("], 2, "not a regular expression"),
        (["profile", "{plan}", "-o", "{out}", "--backend", "rknnlite"], 7, "rknn-toolkit-lite2"),
    ],
)
def test_user_errors_are_one_line_and_write_nothing(tmp_path: Path, args: list[str], code: int, text: str) -> None:
    mini_block_plan(tmp_path / "plan")
    rec.write_jsonl(tmp_path / "a.jsonl", writeup_records("split"))
    (tmp_path / "bad.jsonl").write_text('{"format": "rkpart-profile"}\n')
    subst = {"a": str(tmp_path / "a.jsonl"), "bad": str(tmp_path / "bad.jsonl"),
             "plan": str(tmp_path / "plan"), "out": str(tmp_path / "out.jsonl")}
    res = CliRunner().invoke(main, [a.format(**subst) for a in args])
    assert res.exit_code == code, res.output
    assert text in res.output
    assert not (tmp_path / "out.jsonl").exists()
    assert "Traceback" not in res.output


def test_infer_repeat_and_threads_options_reach_the_records(tmp_path: Path) -> None:
    mini_block_plan(tmp_path / "plan")
    out = tmp_path / "p.jsonl"
    res = CliRunner().invoke(main, ["profile", str(tmp_path / "plan" / "plan.json"), "--rounds", "1", "--warmup", "0",
                                    "--no-cfg", "--interval", "0", "--infer-repeat", "2", "--threads", "1",
                                    "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    recs = rec.read_jsonl(out)
    stages = [r for r in recs if r["record"] == "stage"]
    assert all(len(r["timings"]["infer_calls_s"]) == 2 for r in stages)
    assert recs[0]["settings"]["infer_repeat"] == 2
    assert recs[0]["env"]["backend"]["intra_op_threads"] == 1
    assert recs[0]["env"]["host_backend"]["intra_op_threads"] == 1
