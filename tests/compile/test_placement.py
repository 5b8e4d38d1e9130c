"""Placement and optimiser steps read from recorded real build logs (tests/compile/data)."""

from __future__ import annotations

from pathlib import Path

from rkpart.compile.placement import cpu_ops, last_step, open_native_pass, parse_layer_table

DATA = Path(__file__).with_name("data")


def test_fused_gelu_stays_on_the_npu_in_230() -> None:
    text = (DATA / "build_ffn_2.3.0.log").read_text()
    rows = parse_layer_table(text)
    assert rows[0].op_type == "InputOperator" and rows[-1].op_type == "OutputOperator"
    assert any(r.op_type == "ConvExGelu" and r.target == "NPU" for r in rows)
    assert cpu_ops(text) == ()


def test_standalone_erf_is_on_the_cpu_in_250() -> None:
    text = (DATA / "build_erf_2.5.0.log").read_text()
    assert cpu_ops(text) == ("Erf:ef",)
    # the feature-tensor table that follows the layer table is not read as layers
    assert [r.id for r in parse_layer_table(text)] == list(range(6))


def test_last_table_wins() -> None:
    one = (DATA / "build_erf_2.5.0.log").read_text()
    two = (DATA / "build_ffn_2.3.0.log").read_text()
    assert cpu_ops(one + two) == ()
    assert cpu_ops(two + one) == ("Erf:ef",)


def test_prefixless_rows_parse_too() -> None:
    text = """Network Layer Information Table
ID   OpType   DataType Target InputShape   OutputShape  Cycles(DDR/NPU/Total)  RW(KB)  FullName
----
0    InputOperator FLOAT16 CPU \\  (1,4)  0/0/0  0  InputOperator:x
1    Sin      FLOAT16  CPU    (1,4)        (1,4)        0/0/0                  0       Sin:/rope/Sin
2    OutputOperator FLOAT16 CPU (1,4) \\  0/0/0  0  OutputOperator:y
----
"""
    assert cpu_ops(text) == ("Sin:/rope/Sin",)


def test_no_table_means_no_cpu_ops() -> None:
    assert cpu_ops("I rknn building ...\n") == ()


def test_crash_log_steps() -> None:
    text = (DATA / "crash_adaln_2.3.2.log").read_text()
    assert last_step(text) == "convert_exmatmul_to_conv"
    assert open_native_pass(text) == "rknn::RKNNSubgraphManager"
    assert open_native_pass((DATA / "build_ffn_2.3.0.log").read_text()) is None
