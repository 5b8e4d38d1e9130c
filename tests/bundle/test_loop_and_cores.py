"""What ``rkpart bundle`` records for the board's loop, core masks and device memory (no toolkit needed).

The layer-table rows are those of real 2.3.0 builds of the example (``rknn/logs/*.log``),
trimmed to the columns :mod:`rkpart.compile.placement` reads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from rkpart.bundle.cores import core_masks, parse_spec, splits_across_cores
from rkpart.bundle.device import StageMemory, check_cfg_parallel, run_bytes, stage_memory
from rkpart.bundle.loop import loop_record
from rkpart.compile.compiler_plan import LayerRow, layers_json
from rkpart.compile.placement import PlacedOp
from rkpart.errors import BudgetError, UserError
from rkpart.plan.plan import Artifact, Plan
from rkpart.runtime.board_runner import flow_sigmas
from rkpart.types import CompilerPlan

IDS = ["b00.attn", "b00.xattn", "b00.ffn", "b01.attn", "b01.xattn", "b01.ffn"]
MIB = 1 << 20


def rows(*ops: tuple[str, str]) -> list[PlacedOp]:
    return [PlacedOp(i, op, "FLOAT16", target, f"{op}:n{i}") for i, (op, target) in enumerate(ops)]


def test_only_stages_whose_compute_layers_all_split_get_all_cores() -> None:
    ffn = rows(("InputOperator", "CPU"), ("Reshape", "NPU"), ("Transpose", "NPU"), ("ConvExGelu", "NPU"),
               ("Conv", "NPU"), ("OutputOperator", "CPU"))
    attn = rows(("Conv", "NPU"), ("exNorm", "NPU"), ("Mul", "NPU"), ("Add", "NPU"), ("exSDPAttention", "NPU"))
    cpu_erf = rows(("Conv", "NPU"), ("Erf", "CPU"))  # a CPU layer does not occupy an NPU core
    only_layout = rows(("Reshape", "NPU"), ("Transpose", "NPU"))
    assert splits_across_cores(ffn) == (True, ())
    assert splits_across_cores(attn) == (False, ("exNorm", "exSDPAttention"))
    assert splits_across_cores(cpu_erf) == (True, ())
    assert splits_across_cores(only_layout) == (False, ())
    assert splits_across_cores(rows(("Concat", "NPU"), ("exMatMul", "NPU"))) == (False, ("exMatMul",))


def test_core_mask_spec() -> None:
    assert parse_spec(None, IDS) == (None, {})
    assert parse_spec("0_1_2", IDS) == ("0_1_2", {})
    assert parse_spec("*.ffn=0_1_2, b00.attn=0, b00.*=1,auto", IDS) == (
        "auto", {"b00.ffn": "0_1_2", "b01.ffn": "0_1_2", "b00.attn": "0", "b00.xattn": "1"})
    for spec, msg in [("b02.*=0", "names no NPU stage"), ("*.ffn=3", "'3' is not one of auto, 0, 1, 2"),
                      ("0,1", "two masks for all stages"), ("b00.ffn=", "'' is not one of")]:
        with pytest.raises(UserError, match=msg):
            parse_spec(spec, IDS)


def _compiled(plan: Plan, folder: Path, size: int = 1000) -> Plan:
    """The plan as if compiled: an ``.rknn`` artifact record per NPU stage (no file, no log)."""
    stages = tuple(dataclasses.replace(s, artifacts=(Artifact("rknn", f"rknn/objects/{s.id}.rknn", "2.3.0",
                                                              "rk3588", "h", "0" * 64, size),))
                   if s.device == "npu" else s for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)


def test_masks_and_memory_read_the_build_log_and_fall_back_without_one(plans: dict[str, tuple[Plan, Path]],
                                                                       tmp_path: Path) -> None:
    plan, _ = plans["split"]
    plan = _compiled(plan, tmp_path)
    logs = tmp_path / "rknn" / "logs"
    logs.mkdir(parents=True)
    table = ["D RKNN: [23:09:08.856]   Network Layer Information Table",
             "D RKNN: [23:09:08.856] " + "-" * 40,
             "D RKNN: [23:09:08.856] ID   OpType  DataType Target InputShape OutputShape Cycles RW FullName",
             "D RKNN: [23:09:08.856] " + "-" * 40,
             "D RKNN: [23:09:08.856] 0    InputOperator FLOAT16 CPU \\ (1,64,96) 0/0/0 0 InputOperator:x",
             "D RKNN: [23:09:08.856] 1    ConvExGelu FLOAT16 NPU (1,96,1,64) (1,384,1,64) 1/1/1 30 ConvExGelu:g",
             "D RKNN: [23:09:08.856] 2    Conv FLOAT16 NPU (1,384,1,64) (1,96,1,64) 1/1/1 30 Conv:c",
             "D RKNN: [23:09:08.856] " + "-" * 40,
             "D RKNN: [23:09:08.857] Total Internal Memory Size: 192KB",
             "D RKNN: [23:09:08.857] Total Weight Memory Size: 146.125KB"]
    (logs / "b00.ffn.2.3.0.log").write_text("\n".join(table) + "\n")
    masks = core_masks(plan, tmp_path)
    assert masks["b00.ffn"].mask == "0_1_2" and masks["b00.ffn"].reason.startswith("compile log")
    assert masks["b01.ffn"].mask == "auto" and masks["b01.ffn"].reason == (
        "no layer table of the stage (compiler plan or rknn/logs/); auto")
    assert core_masks(plan, tmp_path, "*.attn=0")["b00.ffn"].mask == "0_1_2"  # unnamed: the log's default
    assert core_masks(plan, tmp_path, "*.attn=0,1")["b00.ffn"].mask == "1"
    ffn = next(s for s in plan.stages if s.id == "b00.ffn")
    b01 = next(s for s in plan.stages if s.id == "b01.ffn")
    assert stage_memory(tmp_path, ffn).bytes == 192 * 1024 + 146125 * 1024 // 1000
    assert stage_memory(tmp_path, ffn).source == "compile log"
    assert stage_memory(tmp_path, b01).bytes == 1000 + b01.io_bytes
    assert stage_memory(tmp_path, b01).source == "rknn file + I/O"
    # the artifact's compiler plan (plan.json; also for builds from the cache) comes first
    rows = [LayerRow(0, "exMatMul", "FLOAT16", "NPU", "", "", 0, 0, 0, 0, "exMatMul:m"),
            LayerRow(1, "Erf", "FLOAT16", "CPU", "", "", 0, 0, 0, 0, "Erf:e")]
    (tmp_path / "rknn" / "layers").mkdir()
    (tmp_path / "rknn" / "layers" / "k.json").write_bytes(layers_json(rows))
    cp = CompilerPlan(weight_bytes=5 * MIB, internal_bytes=3 * MIB, layers=2, cycles_ddr=0, cycles_npu=0,
                      cycles_total=0, rw_bytes=0, layers_file="rknn/layers/k.json")
    art = dataclasses.replace(ffn.artifacts[0], compiler=cp)
    ffn = dataclasses.replace(ffn, artifacts=(art,))
    planned = dataclasses.replace(plan, stages=tuple(ffn if s.id == "b00.ffn" else s for s in plan.stages))
    m = core_masks(planned, tmp_path)["b00.ffn"]
    assert (m.mask, m.reason) == ("auto", "compiler plan: exMatMul run on one core")
    assert stage_memory(tmp_path, ffn) == StageMemory(8 * MIB, "compiler plan")


def test_cfg_parallel_budget_counts_both_contexts_and_names_what_fits() -> None:
    per = {"a": 300 * MIB, "b": 500 * MIB, "c": 200 * MIB}
    resident = dict.fromkeys(per, "resident")
    mixed = {"a": "resident", "b": "per-stage", "c": "per-stage"}
    assert run_bytes(per, resident, cfg_parallel=False) == 1000 * MIB
    assert run_bytes(per, mixed, cfg_parallel=False) == 800 * MIB
    assert run_bytes(per, mixed, cfg_parallel=True) == 1600 * MIB

    class _Plan:
        npu_stages = (1, 2, 3)

    check_cfg_parallel(_Plan(), per, resident, 2000 * MIB)  # type: ignore[arg-type]  # fits: no error
    with pytest.raises(BudgetError, match=r"2000\.0 MiB of device memory \(3 NPU stages\), over the budget of "
                                          r"1536\.0 MiB; the largest that fits: --cfg-parallel --residency "
                                          r"per-stage \(1000\.0 MiB\)"):
        check_cfg_parallel(_Plan(), per, resident, 1536 * MIB)  # type: ignore[arg-type]
    with pytest.raises(BudgetError, match=r"the largest that fits: no --cfg-parallel, the residency as given "
                                          r"\(800\.0 MiB\)"):
        check_cfg_parallel(_Plan(), per, mixed, 900 * MIB)  # type: ignore[arg-type]
    with pytest.raises(BudgetError, match=r"the largest that fits: no --cfg-parallel, --residency per-stage "
                                          r"\(500\.0 MiB\)"):
        check_cfg_parallel(_Plan(), per, resident, 900 * MIB)  # type: ignore[arg-type]
    with pytest.raises(BudgetError, match=r"nothing fits; the smallest is 500\.0 MiB"):
        check_cfg_parallel(_Plan(), per, resident, 400 * MIB)  # type: ignore[arg-type]


def test_loop_record_uses_drifts_rule_or_the_flags(plans: dict[str, tuple[Plan, Path]]) -> None:
    plan, _ = plans["split"]
    d = loop_record(plan)
    assert (d["latent"], d["timestep"], d["context"], d["output"]) == (
        "hidden_states", "timestep", ["encoder_hidden_states"], "sample")
    assert d["mapped_by"] == "shape (guessed)"
    assert d["scheduler"] == {"name": "flow-euler", "shift": 1.0, "timestep_scale": 1000.0, "timestep_offset": 0.0}
    assert d["cfg_mode"] == "two-pass" and d["guidance_input"] is None and "fixed" not in d
    assert d["roles"] == {"hidden_states": "latent", "timestep": "timestep", "encoder_hidden_states": "text_embeddings"}
    # a flag for the latent alone: the timestep is still guessed, and the record says so
    assert loop_record(plan, latent="hidden_states", shift=3.0)["mapped_by"] == "shape (guessed)"
    assert loop_record(plan, latent="hidden_states", timestep="timestep")["mapped_by"] == "flags"
    assert "does not have the output's shape" in loop_record(plan, latent="encoder_hidden_states")["error"]
    with pytest.raises(UserError, match="'t' is not an input of the model"):
        loop_record(plan, timestep="t")
    with pytest.raises(UserError, match="must name different inputs"):
        loop_record(plan, latent="hidden_states", context=["hidden_states"])
    assert loop_record(plan, context=["encoder_hidden_states"])["context"] == ["encoder_hidden_states"]


def test_flow_sigmas_shift() -> None:
    assert np.array_equal(flow_sigmas(4), np.linspace(1.0, 0.0, 5))
    s = flow_sigmas(4, 3.0)
    assert s[0] == 1.0 and s[-1] == 0.0 and np.all(np.diff(s) < 0)
    assert s[2] == pytest.approx(3 * 0.5 / (1 + 2 * 0.5))


def test_board_loop_refuses_a_description_feature_it_does_not_implement(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The board's loop implements every pipeline.json feature beyond version 1 as first published (its runner's
    own list); one it did not (a feature added later: here one taken out of the list) is refused by name, and
    a runner given a loop record naming a feature it does not know refuses the manifest."""
    import rkpart.bundle.loop as loop_mod
    from rkpart.description import FEATURES, load_description
    from rkpart.errors import SpecError
    from rkpart.runtime.board_runner import BundleError, _validate_pipeline
    from tests.description.docs import base_doc, flux_guidance_inputs, flux_ids, write

    assert FEATURES.keys() == loop_mod.BOARD_FEATURES
    loop_mod.check_features(load_description(write(tmp_path / "v1", base_doc(flux_guidance_inputs()), flux_ids())))
    doc = base_doc(flux_guidance_inputs())
    doc["scheduler"]["set_timesteps"].update(mu=None, mu_rule="flux2_empirical", image_seq_len=16)
    flux2 = load_description(write(tmp_path / "f2", doc, flux_ids()))
    loop_mod.check_features(flux2)
    # the board's sampler writes Flux.2's mu rule again (it imports nothing from rkpart): the same numbers
    from rkpart.description import flux2_empirical_mu
    from rkpart.runtime.board_sampling import MU_RULES

    assert all(MU_RULES["flux2_empirical"](seq, n) == flux2_empirical_mu(seq, n)
               for seq in (16, 4096, 4301) for n in (1, 20, 50))
    monkeypatch.setattr(loop_mod, "BOARD_FEATURES", loop_mod.BOARD_FEATURES - {
        "scheduler.set_timesteps.mu_rule=flux2_empirical"})
    with pytest.raises(SpecError, match=r"uses scheduler\.set_timesteps\.mu_rule=flux2_empirical, which the board's "
                                        "loop does not implement"):
        loop_mod.check_features(flux2)
    record = {"class": "P", "sampler": {"class": "S", "config": {}}, "timestep": {"scale": 1.0, "offset": 0.0},
              "latent": {"shape": [1, 4], "dtype": "float32"}, "features": ["cfg.future"]}
    with pytest.raises(BundleError, match=r"uses cfg\.future, which this runner does not implement"):
        _validate_pipeline(record, {})
