"""Precision in ``auto`` (issue 27 part 6): int8 twins of every candidate, chosen only under a measured drift bound.

Fast: the selection on the bundled example with constructed accuracy tables (the int8 figures are
the stated prior, nothing is compiled).  The toolkit-tier test with real builds and a real drift
table is ``tests/compile/test_auto_precision_real.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from rkpart.auto import select
from rkpart.cost_model.candidates import INT8_WEIGHT_RATIO, int8_prior
from rkpart.cost_model.features import Features
from rkpart.cost_model.model import Accuracy, CostModel, default_model_path
from rkpart.cost_model.select import Selection, SelectionConfig
from rkpart.errors import UserError
from rkpart.grouping.strategies.families import precision_id, split_precision
from rkpart.pipeline import load

FUSED8 = "adaln=npu,residual=npu,precision=int8"


def _accuracy(int8: dict[str, float]) -> dict[str, Any]:
    fams: dict[str, Any] = {"adaln=host,residual=host": {"ratio": 1.0}, "adaln=npu,residual=host": {"ratio": 1.5},
                            "adaln=npu,residual=npu": {"ratio": 1.5}}
    for key, ratio in int8.items():
        fams[key] = {"ratio": ratio, "final_cosine": 0.9995, "source": "constructed for the test"}
    return {"default_max_ratio": 1.5, "min_cosine": 0.999, "families": fams}


@pytest.fixture(scope="module")
def example(example_model: Path) -> Any:
    loaded = load(example_model)
    return loaded.graph, loaded.discovery()


def _select(example: Any, int8: dict[str, float], **cfg: Any) -> Selection:
    mg, disc = example
    model = dataclasses.replace(CostModel.load(default_model_path()), accuracy=Accuracy(_accuracy(int8)))
    return select(mg, disc, model, SelectionConfig(**{"budget_mib": 4096, "steps": 4, "precisions": ("fp16", "int8"),
                                                      **cfg}))


def _int8(sel: Selection) -> list[Any]:
    return [o for lst in sel.options.values() for o in lst if o.candidate.precision == "int8"]


def test_int8_is_chosen_within_the_bound_when_it_saves_time_and_memory(example: Any) -> None:
    sel = _select(example, {FUSED8: 2000.0}, max_error_ratio=2500)
    (ch,) = sel.chosen  # the fused run of both blocks, as in fp16
    assert ch.candidate.precision == "int8" and split_precision(ch.candidate.id) == ("fused-x2", "int8")
    base = sel.fp16_twin(ch)
    assert base is not None and base.excluded is None
    assert ch.latency < base.latency and ch.device_bytes < base.device_bytes
    assert ch.device_source == "int8-prior" and ch.error_ratio == 2000.0
    why = sel.reason(ch)
    assert "measured drift 2000x <= bound 2500x" in why and "int8 prior" in why
    text = sel.render()
    assert "precision: block 0,1: int8 (fused-x2@int8/resident)" in text and "'int8-prior' = " in text
    # split's int8 twin has no measured drift: excluded, whatever the bound
    split8 = [o for o in _int8(sel) if o.candidate.family == "split"]
    assert split8 and all(o.excluded and "no measured drift for int8" in o.excluded for o in split8)


def test_int8_is_refused_outside_the_bound(example: Any) -> None:
    sel = _select(example, {FUSED8: 2000.0}, max_error_ratio=1999)
    assert all(o.candidate.precision == "fp16" for o in sel.chosen)
    fused8 = [o for o in _int8(sel) if o.candidate.family.startswith("fused")]
    assert fused8 and all(o.excluded and "drift 2000x" in o.excluded and "> bound 1999x" in o.excluded
                          for o in fused8)
    assert any("precision: block 0,1: fp16" in ln and "> bound 1999x" in ln for ln in sel.precision_lines())


def test_the_default_bound_is_the_fp16_floor_which_int8_never_widens(example: Any) -> None:
    sel = _select(example, {FUSED8: 2000.0})
    assert sel.max_error_ratio == 1.5 and all(o.candidate.precision == "fp16" for o in sel.chosen)


def test_int8_is_refused_when_not_measured(example: Any) -> None:
    sel = _select(example, {}, max_error_ratio=1e9)
    assert all(o.candidate.precision == "fp16" for o in sel.chosen)
    assert _int8(sel) and all(o.excluded and "no measured drift" in o.excluded for o in _int8(sel))
    assert "auto never picks an unmeasured precision" in sel.render()


def test_int8_fits_a_budget_fp16_does_not(example: Any) -> None:
    """Memory, not only time: under a budget no fp16 cover fits, the measured int8 twin is the choice."""
    fp16 = _select(example, {}, precisions=("fp16",), budget_mib=None)
    need = min(o.device_bytes for lst in fp16.options.values() for o in lst if o.excluded is None)
    int8 = {FUSED8: 2000.0, "adaln=host,residual=host,precision=int8": 2000.0,
            "adaln=npu,residual=host,precision=int8": 2000.0}
    with pytest.raises(UserError, match="smallest feasible budget"):
        _select(example, {}, budget_mib=need * 0.95 / 2**20)
    sel = _select(example, int8, budget_mib=need * 0.95 / 2**20, max_error_ratio=2500)
    assert all(o.candidate.precision == "int8" for o in sel.chosen)
    assert sel.device_bytes <= need * 0.95


def test_fp16_only_selection_is_unchanged_by_the_precision_dimension(example: Any) -> None:
    a = _select(example, {FUSED8: 2000.0}, precisions=("fp16",), max_error_ratio=2500)
    assert not _int8(a) and "precision" not in a.to_json() and not a.precision_lines()


def test_the_int8_prior_halves_weights_and_weighted_macs() -> None:
    f = Features(device="npu", weight_bytes=4000, file_bytes=4000, weight16=2000, macs=1000, act_macs=300,
                 compiled_mem_bytes=5000, compiled_cycles=80)
    g = int8_prior(f)
    assert g.weight16 == 2000 * INT8_WEIGHT_RATIO and g.macs == 500 and g.act_macs == 300
    assert g.compiled_mem_bytes == 4000 and g.compiled_cycles == 40
    assert g.file_bytes == f.file_bytes  # an int8 .rknn is not smaller (measured: 1.1-2.0x fp16's on the example)


def test_candidate_ids_round_trip() -> None:
    assert precision_id("fused-x2", "int8") == "fused-x2@int8" and precision_id("split", "fp16") == "split"
    assert split_precision("fused-x2@int8") == ("fused-x2", "int8") and split_precision("myplugin") == ("myplugin",
                                                                                                       "fp16")


def test_the_plan_records_the_choice_as_a_precision_spec_compile_honours(example_model: Path, tmp_path: Path) -> None:
    from rkpart.compile.precision import plan_precision_spec, resolve
    from rkpart.pipeline import partition

    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps(_accuracy({FUSED8: 2000.0})))
    plan = partition(example_model, tmp_path / "plan", strategy="auto", precisions="fp16,int8", accuracy=str(acc),
                     max_error_ratio=2500, steps=4)
    rec = plan.strategy["options"]
    assert rec["precisions"] == ["fp16", "int8"]
    (stage,) = plan.npu_stages
    assert rec["precision"] == {"stages": {stage.id: "int8"}}
    spec = plan_precision_spec(plan)
    assert spec is not None and spec.choose(stage, "fp16") == "int8"
    with pytest.raises(UserError, match="needs calibration data"):  # compile PLAN without --calibration
        resolve(plan, plan.npu_stages, spec=spec)
    # fp16-only auto records nothing new: plans stay byte-identical
    plain = partition(example_model, tmp_path / "plain", strategy="auto", steps=4)
    assert "precision" not in plain.strategy["options"] and plan_precision_spec(plain) is None


def test_bad_precisions_option_is_one_line(example_model: Path, tmp_path: Path) -> None:
    from rkpart.pipeline import partition

    with pytest.raises(UserError, match="'hybrid' is not one of fp16, int8"):
        partition(example_model, tmp_path / "p", strategy="auto", precisions="fp16,hybrid")
