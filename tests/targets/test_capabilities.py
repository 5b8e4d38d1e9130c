"""The capability layer: ops, opsets, memory budgets and crash patterns per target and toolkit."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from rkpart.errors import SpecError, UserError
from rkpart.ir.graph import OpNode
from rkpart.targets import get_target
from rkpart.targets.base import Support
from rkpart.targets.known_issues import EXNORM_FUSION_SEGV, CrashPattern, Traits, crash_patterns

MIB = 1 << 20


def test_rk3588_budget_is_a_quarter_of_the_npu_window_or_of_the_board() -> None:
    t = get_target("rk3588")
    assert t.default_budget_bytes() == 1024 * MIB
    assert t.default_budget_bytes(board_ram_bytes=2048 * MIB) == 512 * MIB  # smaller board: its RAM bounds it
    assert t.default_budget_bytes(board_ram_bytes=16384 * MIB, share=0.5) == 2048 * MIB  # window bounds it
    with pytest.raises(UserError, match=r"share must be in \(0, 1\]"):
        t.default_budget_bytes(share=1.5)


def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(UserError, match=r"unknown target 'rk9999' \(known: rk3588\)"):
        get_target("rk9999")


@pytest.mark.parametrize("toolkit", ["2.3.0", "2.3.2", "2.5.0"])
def test_opset_20_is_refused_by_every_2x_toolkit(toolkit: str) -> None:
    caps = get_target().caps(toolkit)
    assert caps.version == toolkit
    assert caps.opset_problem(19) is None
    assert caps.opset_problem(20) == f"rknn-toolkit2 {toolkit} loads ONNX opset <= 19, the model has opset 20"


def test_op_support_follows_the_operator_list_and_the_measured_builds() -> None:
    caps = get_target().caps("2.3.0")
    assert caps.op("Conv").support is Support.NPU
    assert caps.op("Softmax").note == "batchsize: 1"
    assert caps.op("LayerNormalization").support is Support.FUSED  # NPU only as exNorm
    assert caps.op("Neg").support is Support.NPU  # "Not Supported" in the list, folded into a Conv when built
    assert caps.op("Ceil").support is Support.CPU  # measured
    assert caps.op("TopK").support is Support.CPU  # measured (scripts/measure_ops.py)
    assert caps.op("Equal").support is Support.CPU  # listed, but measured on the CPU: the measurement wins
    assert caps.op("Trilu").support is Support.UNLISTED  # "Not Supported", not measured
    assert caps.op("Relu", domain="com.microsoft").support is Support.NONE
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Sign", ["y"], ["z"], name="sg"),
             helper.make_node("Trilu", ["z"], ["v"], name="tr")]
    ops = [OpNode.of(i, n, "") for i, n in enumerate(nodes)]
    assert [(n.name, str(r.support)) for n, r in caps.off_npu(ops)] == [("sg", "cpu"), ("tr", "unlisted")]


@pytest.mark.parametrize(("mode", "listed"), [(None, True), ("linear", True), ("cubic", False)])
def test_resize_lists_nearest_and_linear_only(mode: str | None, listed: bool) -> None:
    attrs = {} if mode is None else {"mode": mode}
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    rule = get_target().caps("2.3.2").node(OpNode.of(0, node, ""))
    assert (rule.support is Support.NPU) == listed
    if not listed:
        assert rule.note == "mode='cubic' (listed: 'nearest', 'linear')"


def test_one_crash_table_serves_selection_and_log_matching() -> None:
    assert [p.when for p in crash_patterns("2.3.2")] == [{"adaln_on_npu": True}]
    # 2.3.0: the decomposed LayerNorm's broad form, and an RMSNorm pattern known by its signature only
    assert [p.when for p in crash_patterns("2.3.0")] == [{"adaln_on_npu": True, "layernorm": "decomposed"}, {}]
    assert crash_patterns("2.5.0") == ()
    # the patterns belong to the issue the build-log matcher names
    assert crash_patterns() == EXNORM_FUSION_SEGV.patterns
    p = crash_patterns("2.3.2")[0]
    t = Traits(adaln_on_npu=True, residual_on_npu=False, layernorm="op", candidate="split")
    assert p.matches("2.3.2", t)
    assert not p.matches("2.3.0", t)
    assert not p.matches("2.3.2", dataclasses.replace(t, adaln_on_npu=False))
    # matched by attribute name; a name that is no trait never matches (and a cost-model file is refused)
    assert not CrashPattern("2.3.2", {"adaln_on_npu": True, "no_such_trait": None}, "x", "").matches("2.3.2", t)


def test_a_cost_model_naming_no_trait_in_a_crash_pattern_is_refused() -> None:
    from importlib import resources

    from rkpart.cost_model.checks import check_model_document

    d = json.loads(resources.files("rkpart").joinpath("data/rk3588_calibration.json").read_text())
    check_model_document(d, where="shipped")
    d["known_issues"][0]["when"] = {"adaln_on_gpu": True}
    with pytest.raises(SpecError, match="'adaln_on_gpu', which is no candidate trait"):
        check_model_document(d, where="edited")


def _relu(path: Path, opset: int) -> Path:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    onnx.save(m, path)
    return path


_LOAD = """
import sys
from rknn.api import RKNN
r = RKNN(verbose=False)
r.config(target_platform="rk3588")
try:
    print("ret", r.load_onnx(model=sys.argv[1]))
except ValueError as e:
    print("error", e)
"""


@pytest.mark.toolkit
@pytest.mark.slow
@pytest.mark.parametrize("version", ["2.3.0", "2.5.0"])
def test_max_opset_is_what_the_real_toolkit_loads(version: str, tmp_path: Path) -> None:
    from tests.toolkits import get_toolkit

    tk = get_toolkit(version)
    caps = get_target().caps(version)
    out = {}
    for opset in (caps.max_opset, caps.max_opset + 1):
        r = subprocess.run([str(tk.python), "-c", _LOAD, str(_relu(tmp_path / f"r{opset}.onnx", opset))],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
        out[opset] = r.stdout
    assert "ret 0" in out[caps.max_opset]
    assert f"Unsupport onnx opset {caps.max_opset + 1}, need <= {caps.max_opset}!" in out[caps.max_opset + 1]
    assert not any(ln.startswith("ret ") for ln in out[caps.max_opset + 1].splitlines())


_BUILD = """
import sys
from rknn.api import RKNN
r = RKNN(verbose=True)
r.config(target_platform="rk3588")
assert r.load_onnx(model=sys.argv[1]) == 0
print("BUILD", r.build(do_quantization=False), flush=True)
"""


def _op_then_conv(path: Path, op: str) -> Path:
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4, 1, 1], [0.1] * 16)
    g = helper.make_graph([helper.make_node(op, ["x"], ["t"]), helper.make_node("Conv", ["t", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


@pytest.mark.toolkit
@pytest.mark.slow
@pytest.mark.parametrize("op", ["Neg", "Abs", "Ceil", "Sign"])
def test_measured_placement_is_what_the_real_toolkit_does(op: str, tmp_path: Path) -> None:
    """The ops the list marks "Not Supported" build; the table says which land on the CPU."""
    from rkpart.compile.placement import parse_layer_table
    from tests.toolkits import get_toolkit

    tk = get_toolkit("2.3.0")
    r = subprocess.run([str(tk.python), "-c", _BUILD, str(_op_then_conv(tmp_path / f"{op}.onnx", op))],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert "BUILD 0" in r.stdout
    on_cpu = {p.op_type for p in parse_layer_table(r.stdout) if p.target == "CPU"} - {"InputOperator", "OutputOperator"}
    rule = get_target().caps("2.3.0").op(op)
    assert (rule.support is Support.CPU) == (op in on_cpu), (rule, on_cpu)
