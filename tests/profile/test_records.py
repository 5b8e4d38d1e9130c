"""Schema validation and JSON Lines I/O of profile records."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rkpart.errors import SpecError
from rkpart.profile import records as rec
from tests.profile.writeup import writeup_records


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return writeup_records("split")


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(rec.record_schema())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r["timings"].pop("infer_s"), "'infer_s' is a required property"),
        (lambda r: r["timings"].__setitem__("load_s", -1.0), "timings/load_s"),
        (lambda r: r.__setitem__("pass", "both"), "pass"),
        (lambda r: r["stage"].__setitem__("device", "gpu"), "stage/device"),
        (lambda r: r.__setitem__("version", 2), "version"),
        (lambda r: r["memory"].__setitem__("pss_peak_kib", 1.5), "memory/pss_peak_kib"),
        (lambda r: r["timings"].__setitem__("infer_s", 1e300), "timings/infer_s"),
        (lambda r: r["timings"].__setitem__("wall_s", 1.5e6), "timings/wall_s"),
        (lambda r: r["settings"].__setitem__("sample_interval_s", 61.0), "settings/sample_interval_s"),
        (lambda r: r["memory"].__setitem__("pss_before_kib", 2**53 + 1), "memory/pss_before_kib"),
    ],
)
def test_invalid_stage_records_are_rejected_in_one_line(records: list[dict], mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    r = copy.deepcopy(next(r for r in records if r["record"] == "stage"))
    rec.validate_record(r)
    mutate(r)
    with pytest.raises(SpecError) as e:
        rec.validate_record(r, where="x.jsonl line 3")
    assert "x.jsonl line 3" in str(e.value) and "\n" not in str(e.value)
    assert message.split("/")[-1] in str(e.value)


@pytest.mark.parametrize(("section", "field", "value"), [
    ("memory", "pss_before_kib", 2**60), ("timings", "infer_s", 1e300), ("timings", "load_s", 2e6),
])
def test_an_out_of_range_number_is_refused_on_a_line_that_looks_like_a_valid_one(
        records: list[dict], tmp_path: Path, section: str, field: str, value: float) -> None:
    """Look-alike lines are validated once (their signature): a bound the loader adds to the
    schema (2^53 for every number) must be one of the thresholds a signature tells apart, or
    the 35th stage record's 2^60 KiB passes because the 34th's 1000 KiB did."""
    bad = copy.deepcopy(records)
    last = max(i for i, r in enumerate(bad) if r["record"] == "stage")
    bad[last][section][field] = value
    (tmp_path / "p.jsonl").write_text(rec.dumps_jsonl(bad))
    with pytest.raises(SpecError, match=rf"line {last + 1}: invalid profile record at {section}/{field}"):
        rec.read_jsonl(tmp_path / "p.jsonl")


def test_jsonl_round_trip_is_byte_stable(records: list[dict], tmp_path: Path) -> None:
    p = rec.write_jsonl(tmp_path / "a.jsonl", records)
    back = rec.read_jsonl(p)
    assert back == records
    rec.write_jsonl(tmp_path / "b.jsonl", back)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert len(p.read_text().splitlines()) == len(records)


def test_write_refuses_invalid_records_and_leaves_no_file(records: list[dict], tmp_path: Path) -> None:
    bad = copy.deepcopy(records)
    del bad[0]["stage"]
    with pytest.raises(SpecError, match="line 1"):
        rec.write_jsonl(tmp_path / "out.jsonl", bad)
    assert list(tmp_path.iterdir()) == []


def test_read_errors_are_user_errors(records: list[dict], tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        rec.read_jsonl(tmp_path / "missing.jsonl")
    (tmp_path / "junk.jsonl").write_text(json.dumps(records[0]) + "\n{not json\n")
    with pytest.raises(SpecError, match="line 2 is not valid JSON"):
        rec.read_jsonl(tmp_path / "junk.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SpecError, match="no profile records"):
        rec.read_jsonl(tmp_path / "empty.jsonl")


def test_a_file_with_two_runs_needs_a_choice(records: list[dict]) -> None:
    other = writeup_records("fused")
    both = records + other
    with pytest.raises(SpecError, match="holds 2 runs"):
        rec.single_run(both, where="both.jsonl")
    picked = rec.single_run(both, where="both.jsonl", run_id=other[0]["run_id"])
    assert picked == other


def test_summary_lists_warmup_and_per_stage_medians(records: list[dict]) -> None:
    s = records[-1]
    assert s["record"] == "summary" and s["warmup_rounds"] == [0] and s["rounds_measured"] == [1, 2, 3]
    assert s["passes_per_round"] == 2
    attn = next(x for x in s["stages"] if x["id"] == "b0_attn")
    # one third of the split block's inference, summed over both passes
    assert attn["infer_s"]["median"] == pytest.approx(3.1177 / 3)
    assert attn["infer_s"]["n"] == 3


def test_stage_records_are_typed_with_the_component_names_of_the_cost_model(records: list[dict]) -> None:
    from rkpart.types import LIFECYCLE, Residency

    typed = rec.stage_records(records)
    assert len(typed) == sum(r["record"] == "stage" for r in records) > 0
    for raw, r in zip((r for r in records if r["record"] == "stage"), typed, strict=True):
        assert r.stage_id == raw["stage"]["id"] and r.device == raw["stage"]["device"]
        assert set(r.seconds) <= set(LIFECYCLE)  # "load", not the file's "load_s"
        assert r.seconds == {c: raw["timings"][f"{c}_s"] for c in LIFECYCLE if raw["timings"][f"{c}_s"] is not None}
        assert r.residency is Residency(raw["residency"]) and r.run_residency == raw["settings"]["residency"]
        assert r.calls("infer") == [raw["timings"]["infer_s"]]
    with pytest.raises(TypeError):
        typed[0].seconds["load"] = 1.0  # type: ignore[index]  # frozen all the way down
