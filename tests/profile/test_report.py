"""The comparison tables, checked against the write-up's own numbers."""

from __future__ import annotations

import pytest

from rkpart.errors import SpecError
from rkpart.profile import records as rec
from rkpart.profile.report import compare_rows, render_compare, render_single
from tests.profile.writeup import FUSED, SPLIT, writeup_records


@pytest.fixture(scope="module")
def split() -> list[dict]:
    return writeup_records("split")


@pytest.fixture(scope="module")
def fused() -> list[dict]:
    return writeup_records("fused")


def test_constructed_records_are_valid(split: list[dict], fused: list[dict]) -> None:
    rec.validate_records(split)
    rec.validate_records(fused)


def test_medians_over_measured_rounds_reproduce_the_writeup(split: list[dict]) -> None:
    agg = rec.aggregate(split)
    for k in ("load_s", "init_s", "infer_s", "release_s", "host_s", "wall_s"):
        assert agg[k]["median"] == pytest.approx(SPLIT[k], abs=1e-12), k
        assert agg[k]["n"] == 3  # the warm-up round (x5) is left out
    assert agg["net_s"]["median"] == pytest.approx(4.3856, abs=1e-12)
    assert agg["device_pss_kib"]["median"] == 127144
    assert agg["infer_s"]["spread"] == pytest.approx(SPLIT["infer_s"] * 0.03)


def test_deltas_and_percentages(split: list[dict], fused: list[dict]) -> None:
    times, mems = compare_rows(split, fused)
    t = {r.key: r for r in times}
    assert round(t["infer_s"].delta, 4) == 0.1795 and round(t["infer_s"].percent, 2) == 5.76
    assert t["net_s"].a == pytest.approx(4.3856) and t["net_s"].b == pytest.approx(4.3650)
    assert round(t["net_s"].delta, 4) == -0.0206 and round(t["net_s"].percent, 2) == -0.47
    assert round(t["wall_s"].percent, 2) == -5.06
    assert t["host_s"].percent == pytest.approx(-100.0)
    m = {r.key: r for r in mems}
    assert m["device_pss_kib"].delta == 96560 and round(m["device_pss_kib"].percent, 1) == 75.9
    assert m["pss_peak_kib"].delta == 46600 and round(m["pss_peak_kib"].percent, 1) == 7.2
    assert m["swap_new_kib"].delta == 0 and m["swap_new_kib"].percent is None


def test_rendered_tables_show_the_writeup_rows(split: list[dict], fused: list[dict]) -> None:
    out = render_compare(split, fused, names=("split.jsonl", "fused.jsonl"))
    expect = {
        "Model Load": ("0.4863 s", "0.4814 s", "-0.0049 s (-1.00%)"),
        "Runtime Init": ("0.4464 s", "0.4240 s", "-0.0224 s (-5.01%)"),
        "NPU Inference (×2)": ("3.1177 s", "3.2972 s", "+0.1795 s (+5.76%)"),
        "Context Release": ("0.1694 s", "0.1623 s", "-0.0071 s (-4.17%)"),
        "Host AdaLN & Residual": ("0.1658 s", "0.0000 s", "-0.1658 s (-100.00%)"),
        "Net Component Sum": ("4.3856 s", "4.3650 s", "-0.0206 s (-0.47%)"),
        "Measured Wall": ("4.7379 s", "4.4981 s", "-0.2398 s (-5.06%)"),
        "NPU Device-Mapped PSS": ("127,144 KiB", "223,704 KiB", "+96,560 KiB (+94.30 MiB, +75.9%)"),
        "Peak Process PSS": ("648,282 KiB", "694,882 KiB", "+46,600 KiB (+45.51 MiB, +7.2%)"),
        "New System Swap": ("0 KiB", "0 KiB", "0 KiB"),
    }
    lines = out.splitlines()
    for label, cells in expect.items():
        line = next((ln for ln in lines if ln.startswith(label)), None)
        assert line is not None, label
        for c in cells:
            assert c in line, (label, c, line)
    assert "split.jsonl" in out and "strategy fused, 1 stage(s)" in out and "3 measured round(s) + 1 warm-up" in out


def test_per_block_report_ignores_other_blocks(split: list[dict], fused: list[dict]) -> None:
    noisy = split[:-1] + [r for r in writeup_records("fused", block=1, with_round_records=False)]
    times, mems = compare_rows(noisy, fused, block=0)
    t = {r.key: r for r in times}
    assert t["net_s"].a == pytest.approx(4.3856) and t["wall_s"].a == pytest.approx(SPLIT["wall_s"])
    assert {r.key: r for r in mems}["device_pss_kib"].a == 127144
    whole = rec.aggregate(noisy)
    assert whole["net_s"]["median"] > 4.3856 + 4  # block 1 counts for the whole plan
    with pytest.raises(SpecError, match="block 7"):
        compare_rows(split, fused, block=7)


def test_single_profile_table(fused: list[dict]) -> None:
    out = render_single(fused, name="fused.jsonl")
    assert "NPU Inference (×2)" in out and "3.2972 s" in out and "223,704 KiB" in out
    assert FUSED["host_s"] == 0 and "0.0000 s" in out


def test_a_baseline_summary_is_valid_and_rendered_once() -> None:
    import copy

    recs = writeup_records("split")
    stat = {"median": 2.0, "min": 2.0, "max": 2.0, "spread": 0.0, "n": 1}
    recs[-1] = {**recs[-1], "baseline": {"model": "m.onnx", "session_s": 0.5, "whole_s": stat,
                                         "plan_infer_s": {**stat, "median": 2.5}, "plan_net_s": {**stat, "median": 3.0},
                                         "infer_ratio": 1.25, "net_ratio": 1.5}}
    rec.validate_records(recs)
    text = render_single(recs, name="a")
    assert text.count("whole model 2.0000 s per round") == 1 and "(1.25x)" in text and "(1.50x)" in text
    bad = copy.deepcopy(recs)
    del bad[-1]["baseline"]["model"]
    with pytest.raises(SpecError, match="baseline"):
        rec.validate_records(bad)
    assert "whole model" not in render_single(writeup_records("split"), name="a")
