"""The numerical gate: metrics of two tensors, and which thresholds they fail."""

from __future__ import annotations

import numpy as np
import pytest

from rkpart.errors import GateError
from rkpart.validation.metrics import Gate, compare


def test_identical_tensors_have_cosine_one_and_no_error() -> None:
    x = np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32)
    m = compare(x, x.copy())
    assert m.cosine == pytest.approx(1.0, abs=1e-12)
    assert (m.max_abs, m.mean_abs, m.mse, m.nan, m.inf) == (0.0, 0.0, 0.0, 0, 0)
    assert m.ref_max_abs == pytest.approx(float(np.abs(x).max()))
    assert Gate().failures(m) == []


def test_metrics_are_computed_in_float64() -> None:
    ref = np.array([1.0, -2.0, 3.0, 0.5], np.float16)
    got = np.array([1.0, -2.0, 2.0, 0.5], np.float16)
    m = compare(got, ref)
    assert (m.max_abs, m.mean_abs, m.mse) == (1.0, 0.25, 0.25)
    assert m.cosine == pytest.approx(float(np.dot([1, -2, 2, 0.5], [1, -2, 3, 0.5]) / (np.sqrt(9.25) * np.sqrt(14.25))))


def test_a_scaled_tensor_keeps_cosine_but_fails_an_absolute_bound() -> None:
    ref = np.linspace(-1, 1, 64, dtype=np.float32)
    m = compare(ref * 2, ref)
    assert m.cosine == pytest.approx(1.0)
    assert Gate(min_cosine=0.999).failures(m) == []
    assert Gate(max_abs_rel=0.5).failures(m) == ["max abs 1 > 0.5 x max|ref| (1)"]
    assert Gate(max_abs=0.1).failures(m) == ["max abs 1 > 0.1"]


def test_opposite_tensors_fail_the_cosine_gate() -> None:
    ref = np.ones(8, np.float32)
    m = compare(-ref, ref)
    assert m.cosine == pytest.approx(-1.0)
    assert Gate(min_cosine=0.999).failures(m) == ["cosine -1.00000000 < 0.999"]


def test_zero_tensors() -> None:
    z = np.zeros(4, np.float32)
    assert compare(z, z).cosine == 1.0  # nothing to disagree about
    assert compare(z, np.ones(4, np.float32)).cosine == 0.0  # no direction vs a direction


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("side", ["actual", "reference", "both"])
def test_a_non_finite_value_is_never_a_perfect_score(bad: float, side: str) -> None:
    ref = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    got = ref.copy()
    if side in ("actual", "both"):
        got[1] = bad
    if side in ("reference", "both"):
        ref[1] = bad
    m = compare(got, ref)
    assert not m.finite
    assert np.isnan(m.cosine) and np.isnan(m.max_abs) and np.isnan(m.mse)  # no score over the finite rest
    assert (m.nan, m.inf) == ((int(np.isnan(bad)), int(np.isinf(bad))) if side != "reference" else (0, 0))
    assert m.ref_nonfinite == (1 if side != "actual" else 0)
    fails = Gate(min_cosine=-1.0, max_abs=1e30, max_abs_rel=1e30).failures(m)
    assert fails and all("NaN" in f for f in fails)


def test_all_nan_is_gated_as_non_finite() -> None:
    m = compare(np.array([np.nan], np.float32), np.array([np.nan], np.float32))
    assert Gate().failures(m) == ["1 NaN / 0 Inf", "the reference holds 1 NaN/Inf values"]


def test_shape_mismatch_is_a_gate_error() -> None:
    with pytest.raises(GateError, match=r"shape mismatch: got \(2, 3\), reference \(3, 2\)"):
        compare(np.zeros((2, 3)), np.zeros((3, 2)))


def test_metrics_serialise_to_plain_json() -> None:
    m = compare(np.ones(4), np.ones(4))
    assert m.to_json() == {"cosine": 1.0, "max_abs": 0.0, "mean_abs": 0.0, "mse": 0.0, "nan": 0, "inf": 0,
                           "ref_max_abs": 1.0, "ref_nonfinite": 0}
