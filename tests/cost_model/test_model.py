"""Fitting, prediction and JSON round trip of the linear non-negative cost model."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.cost_model.features import Features
from rkpart.cost_model.model import Accuracy, CostModel, FamilyAccuracy, Provenance, Sample, default_model_path
from rkpart.errors import SpecError


def _samples() -> list[Sample]:
    # infer = 2 ms per stage + 1 ns per MAC, exactly; five runs of three stages
    out = []
    for run in range(5):
        for k, macs in enumerate((1_000_000, 5_000_000, 20_000_000)):
            f = Features(device="npu", macs=macs * (run + 1), nodes=10 + k)
            out.append(Sample(f, {"infer": 0.002 + 1e-9 * f.macs}, group=f"run{run}"))
    return out


def test_fit_recovers_coefficients_and_reports_held_out_error() -> None:
    m = CostModel().fit(_samples(), terms={"infer": ("const", "macs", "nodes")})
    c = dict(zip(m.components["infer"].terms, m.components["infer"].coef, strict=True))
    assert c["const"] == pytest.approx(0.002, rel=1e-6)
    assert c["macs"] == pytest.approx(1e-9, rel=1e-6)
    assert c["nodes"] == pytest.approx(0.0, abs=1e-9)
    cv = m.components["infer"].fit_error["cross_validation"]  # type: ignore[index]
    assert cv["method"] == "leave-one-plan-out" and cv["within_10"] == 1.0 and cv["n"] == 15


def test_coefficients_are_never_negative() -> None:
    # time falls with nodes in this data: an unconstrained fit would give nodes a negative cost
    rows = [Sample(Features(device="npu", macs=m, nodes=n), {"infer": 1e-9 * m}, group=str(i))
            for i, (m, n) in enumerate([(1e6, 50), (2e6, 40), (4e6, 10), (8e6, 5)])]
    m = CostModel().fit(rows, terms={"infer": ("macs", "nodes")})
    assert all(c >= 0 for c in m.components["infer"].coef)


def test_update_keeps_components_the_samples_do_not_measure() -> None:
    shipped = CostModel.load(default_model_path())
    before = shipped.components["device_mem"]
    shipped.update(_samples())
    assert shipped.components["infer"].source == "fit"
    assert shipped.components["device_mem"] == before and before.source == "compiler tables"
    assert shipped.components["load"].source == "calibration"


def test_save_load_round_trip_is_byte_identical(tmp_path: Path) -> None:
    m = CostModel().fit(_samples())
    a = m.save(tmp_path / "a.json")
    b = CostModel.load(a).save(tmp_path / "b.json")
    assert a.read_bytes() == b.read_bytes()


def test_load_rejects_what_is_not_a_model(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "rkpart-cost-model", "version": 1, "components": {"infer": {"terms": {"macs": -1}}}}')
    with pytest.raises(SpecError, match="must be a number >= 0"):
        CostModel.load(bad)
    bad.write_text("[]")
    with pytest.raises(SpecError, match="not a JSON object"):
        CostModel.load(bad)
    with pytest.raises(SpecError, match="does not exist"):
        CostModel.load(tmp_path / "missing.json")


def test_the_shipped_calibration_loads_typed_and_dumps_byte_identical(tmp_path: Path) -> None:
    path = default_model_path()
    model = CostModel.load(path)
    assert model.dumps().encode() == path.read_bytes()
    assert CostModel.load(model.save(tmp_path / "again.json")).dumps() == model.dumps()
    acc, prov = model.accuracy, model.provenance
    assert isinstance(acc, Accuracy) and isinstance(prov, Provenance)
    # what selection reads, typed
    assert acc.default_max_ratio is not None and acc.default_max_ratio >= 1.0
    fused = acc.family("adaln=npu,residual=npu")
    assert isinstance(fused, FamilyAccuracy) and fused.ratio == acc.default_max_ratio
    assert fused.final_cosine is not None and 0.99 < fused.final_cosine <= 1.0
    assert acc.family("no such family") is None
    assert prov.toolkit == "2.3.0" and prov.degrees_of_freedom == 0
    assert prov.latency_resolution is not None and 0 < prov.latency_resolution < 1
    assert prov.whole_plan_error is None and prov.backends == () and prov.fitted_range == {}
    # replace(): a copy with fields set or removed; the original is untouched
    blunt = prov.replace(latency_resolution=None, clock="cpu")
    assert blunt.latency_resolution is None and blunt.clock == "cpu" and "latency_resolution" not in blunt.to_json()
    assert prov.latency_resolution is not None and prov.clock is None
