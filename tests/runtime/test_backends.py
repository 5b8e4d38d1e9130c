"""One backend factory (:func:`rkpart.runtime.get_backend`) for ``run``, ``profile`` and the API."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.errors import ToolkitError, UserError
from rkpart.runtime import BACKENDS, CORE_MASK_CHOICES, get_backend
from rkpart.runtime.ort import OrtBackend
from rkpart.runtime.rknn_sim import RknnSimBackend
from rkpart.runtime.rknnlite import CORE_MASKS
from tests.compile.plans import tiny_plan


def test_ort_backend_gets_the_thread_count() -> None:
    be = get_backend("ort", threads=3)
    assert isinstance(be, OrtBackend)
    assert be.threads == 3


def test_rknn_sim_backend_defaults_to_each_artifacts_toolkit(tmp_path: Path) -> None:
    be = get_backend("rknn-sim")  # no --toolkit: a compiled stage runs in the toolkit that built it
    assert isinstance(be, RknnSimBackend) and be.toolkit is None
    plan = tiny_plan(tmp_path)  # not compiled: no artifact says which toolkit
    with pytest.raises(ToolkitError, match="has no rknn artifact"):
        be.runner(plan.stage("ffn"), tmp_path).load()
    assert get_backend("rknn-sim", toolkit="2.3.0").toolkit == "2.3.0"  # type: ignore[attr-defined]


def test_unknown_backend_is_a_usage_error() -> None:
    with pytest.raises(UserError, match=r"unknown backend 'npu' \(available: ort, rknn-sim, rknnlite\)") as e:
        get_backend("npu")
    assert e.value.exit_code == 2


def test_the_core_mask_choices_are_the_board_runtimes() -> None:
    assert tuple(CORE_MASKS) == CORE_MASK_CHOICES
    assert BACKENDS == ("ort", "rknn-sim", "rknnlite")
