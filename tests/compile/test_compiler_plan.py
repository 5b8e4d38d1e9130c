"""The compiler's own plan of every build: memory statistics and the layer table, read from real
verbose builds of rknn-toolkit2 2.3.0, 2.3.2 and 2.5.0 (issue 26)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.compile.compiler_plan import LAYER_COLUMNS, artifact_compiler_plan, read_compiler_plan, read_layers
from rkpart.compile.toolkits import Toolkit
from rkpart.cost_model.device_model import stage_memory_features
from rkpart.pipeline import partition
from rkpart.plan.plan import load_plan
from rkpart.types import CompilerPlan


@pytest.fixture(scope="module")
def split_plan(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> Path:
    folder = tmp_path_factory.mktemp("cp") / "split"
    partition(example_model, folder, "split")
    return folder


def _sizes(log: str) -> tuple[int, int]:
    """The two memory statistics as the log prints them, read independently of the parser."""
    def one(kind: str) -> int:
        m = re.findall(rf"Total {kind} Memory Size: ([0-9.]+)(KB|MB)", log)
        v, unit = m[-1]
        return round(float(v) * (1024 if unit == "KB" else 1 << 20))
    return one("Weight"), one("Internal")


@pytest.mark.toolkit
@pytest.mark.parametrize("version", ["2.3.0", "2.3.2", "2.5.0"])
def test_every_built_artifact_carries_the_compilers_plan(tmp_path: Path, split_plan: Path, version: str,
                                                         request: pytest.FixtureRequest) -> None:
    tk: Toolkit = request.getfixturevalue({"2.3.0": "tk230", "2.3.2": "tk232", "2.5.0": "tk250"}[version])
    import shutil

    folder = tmp_path / "plan"
    shutil.copytree(split_plan, folder)
    plan, _ = load_plan(folder)
    rep = compile_plan_report(plan, folder, CompileOptions(tk, "rk3588", {}, stages=["b00.attn", "b00.ffn"],
                                                           cache=False))
    assert [o.status for o in rep.outcomes] == ["built", "built"]
    on_disk = json.loads((folder / "plan.json").read_text())
    for o in rep.outcomes:
        art = o.artifact
        assert art is not None and art.compiler is not None
        cp = art.compiler
        log = (folder / str(o.log)).read_text()
        assert (cp.weight_bytes, cp.internal_bytes) == _sizes(log)
        # fp16 weights: the compiler's weight memory is the stage's float weights at 2 bytes (+ its padding)
        stage = plan.stage(o.stage_id)
        w16 = stage_memory_features(folder, stage).weight16
        assert w16 <= cp.weight_bytes <= 2.2 * w16
        # the layer table, summarised: every conv-type layer carries cycles, attention and norms none
        assert cp.layers > 5 and cp.cycles_total and cp.cycles_total >= (cp.cycles_npu or 0) > 0
        assert cp.rw_bytes and cp.rw_bytes > 0
        assert dict(cp.by_target).get("CPU", 0) == len(art.cpu_ops) == 0
        assert "Conv" not in cp.uncycled_ops and any(op.startswith("Conv") for op, _ in cp.by_op)
        if o.stage_id == "b00.attn":
            assert "exSDPAttention" in cp.uncycled_ops
        # the rows are kept beside the plan, and add up to the summary
        assert cp.layers_file is not None
        rows = read_layers(folder / cp.layers_file)
        assert len(rows) == cp.layers and sum(r.cycles_total for r in rows) == cp.cycles_total
        assert sum(r.rw_bytes for r in rows) == cp.rw_bytes
        # plan.json round-trips the record
        rec = next(s for s in on_disk["stages"] if s["id"] == o.stage_id)["artifacts"][0]["compiler"]
        assert CompilerPlan.from_json(rec) == cp
    if version == "2.5.0":  # the report shows the same figures
        pytest.importorskip("matplotlib")
        from rkpart.report.build import build_report

        page = build_report(folder, [], tmp_path / "r" / "report.html")
        rows = {r["stage"]: r for r in csv.DictReader(io.StringIO((page.assets / "compile.csv").read_text()))}
        for o in rep.outcomes:
            cp = o.artifact.compiler  # type: ignore[union-attr]
            assert int(rows[o.stage_id]["weight_bytes"]) == cp.weight_bytes  # type: ignore[union-attr]
            assert int(rows[o.stage_id]["cycles_total"]) == cp.cycles_total  # type: ignore[union-attr]
    # a cached build gives the same figures with no log at hand
    again = compile_plan_report(rep.plan, folder, CompileOptions(tk, "rk3588", {}, stages=["b00.attn", "b00.ffn"]))
    assert [o.status for o in again.outcomes] == ["cached", "cached"]
    assert [o.artifact.compiler for o in again.outcomes] == [o.artifact.compiler for o in rep.outcomes]  # type: ignore[union-attr]


def test_a_log_without_tables_records_null_never_zero(tmp_path: Path) -> None:
    cp, rows = read_compiler_plan("I rknn building ...\nI rknn building done.\n")
    assert rows is None
    assert (cp.weight_bytes, cp.internal_bytes, cp.cycles_total, cp.rw_bytes, cp.device_mem_bytes) == (None,) * 5
    assert CompilerPlan.from_json(cp.to_json()) == cp
    # an older cache entry without the record reads the build log; with no log there is no record
    assert artifact_compiler_plan(tmp_path, "k" * 64, {"log": "rknn/logs/missing.log"}) is None


def test_the_last_table_and_statistic_win_and_units_are_binary() -> None:
    head = ("D RKNN: [10:00:00.000] ID   OpType   DataType Target InputShape   OutputShape   Cycles(DDR/NPU/Total)"
            "    RW(KB)       FullName\n")
    rule = "D RKNN: [10:00:00.000] " + "-" * 40 + "\n"

    def table(cycles: str) -> str:
        return (rule + "D RKNN: [10:00:00.000]      Network Layer Information Table\n" + rule + head + rule
                + "D RKNN: [10:00:00.000] 0    InputOperator FLOAT16 CPU \\   (1,8)   0/0/0   0   InputOperator:x\n"
                + f"D RKNN: [10:00:00.000] 1    Conv     FLOAT16  NPU    (1,8,1,1),(8,8,1,1) (1,8,1,1) {cycles} 3 "
                  "Conv:/a/MatMul\n" + rule)
    log = (table("9/9/9") + "D RKNN: [10:00:00.000] Total Weight Memory Size: 1KB\n" + table("20/10/20")
           + "D RKNN: [10:00:00.000] Total Internal Memory Size: 1.5MB\n"
           + "D RKNN: [10:00:00.000] Total Weight Memory Size: 2KB\n")
    cp, rows = read_compiler_plan(log)
    assert rows is not None and [r.cycles_total for r in rows] == [0, 20]
    assert (cp.weight_bytes, cp.internal_bytes) == (2048, 3 << 19)
    assert (cp.cycles_ddr, cp.cycles_npu, cp.cycles_total, cp.rw_bytes) == (20, 10, 20, 3072)
    assert cp.by_target == (("NPU", 1),) and cp.uncycled_ops == ()
    assert rows[1].to_json()[LAYER_COLUMNS.index("name")] == "Conv:/a/MatMul"


def test_a_damaged_record_is_refused_by_the_plan_reader() -> None:
    good = read_compiler_plan("Total Weight Memory Size: 1KB\nTotal Internal Memory Size: 2KB\n")[0].to_json()
    for bad in ({**good, "version": 2}, {**good, "weight_bytes": -1}, {**good, "by_op": {"Conv": "x"}},
                {**good, "internal_bytes": True}):
        with pytest.raises(ValueError):
            CompilerPlan.from_json(bad)


#: the head and three rows of a 2.5.0 build's Feature Tensor Information Table (HunyuanDiT at its width),
#: the second starred where the compiler reached its peak, and the closing rule
_FEATURES = """\
D RKNN: [13:38:50.934]                 Feature Tensor Information Table
D RKNN: [13:38:50.934] -------------------------------------------------------------------------+--------------
D RKNN: [13:38:50.934] ID  User           Tensor                          DataType  DataFormat   OrigShape       \
NativeShape      |     [Start       End)       Size
D RKNN: [13:38:50.934] -------------------------------------------------------------------------+--------------
D RKNN: [13:38:50.934] 16  exNorm         /model/attn1/Transpose_output_0_tp FLOAT16 NC1HWC2 (1,88,16,1024) \
(1,88,16,1024,8) | 0x01080000 0x01600000 0x00580000
D RKNN: [13:38:50.934] 16  exNorm         /model/attn1/Transpose_output_0_tp_exSecondary FLOAT16 NC1HWC2 \
(1,88,16,1024) (1,112,16,1024,8) | 0x01600000*0x01d00040 0x00700040
D RKNN: [13:38:50.934] 46  OutputOperator /model/attn1/Div_1_output_0 FLOAT16 UNDEFINED (1,1024,1408) \
(1,1024,1408) | 0x00580000 0x00840000 0x002c0000
D RKNN: [13:38:50.934] -------------------------------------------------------------------------+--------------
D RKNN: [13:38:50.934] Total Internal Memory Size: 29696.1KB
"""


def test_the_feature_tensor_table_is_read_row_by_row() -> None:
    from rkpart.compile.compiler_plan import parse_feature_tensors

    assert parse_feature_tensors("no table here") is None
    rows = parse_feature_tensors(_FEATURES)
    assert rows is not None and [(r.layer, r.user, r.peak) for r in rows] == [
        (16, "exNorm", False), (16, "exNorm", True), (46, "OutputOperator", False)]
    peak = rows[1]
    assert peak.tensor.endswith("_exSecondary") and peak.layout == "NC1HWC2" and peak.dtype == "FLOAT16"
    assert peak.shape == (1, 88, 16, 1024) and peak.native == (1, 112, 16, 1024, 8)
    assert (peak.start, peak.end, peak.size) == (0x01600000, 0x01D00040, 0x00700040)
    assert max(r.end for r in rows) == 0x01D00040  # the table's end is the internal memory (29696.1 KB)
