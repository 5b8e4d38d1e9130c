"""Shapes shape inference cannot follow but the input shapes decide: resolved by one run on zeros.

ONNX shape inference knows no ONNX Runtime contrib op (``com.microsoft``: what
``onnxruntime.transformers.optimizer`` fuses an export into) and leaves everything after the
first one untyped; rkpart used to refuse such a model with "give the model inputs static
shapes", which they already are.  :func:`rkpart.ir.shape_deps.shape_varying` proves from the
graph that no input value decides a shape, and the loader then observes the shapes in one ONNX
Runtime run.  A shape some input value does decide still needs ``--inputs``, and the error
names that op, not the contrib op inference stopped at.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from rkpart.cli import main
from rkpart.errors import InvalidModelError
from rkpart.ir import load_model
from rkpart.ir.load import DataDependentShapeError
from rkpart.ir.shape_deps import shape_varying
from tests.partitioner.checks import partition_and_check

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _const(name: str, value: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64)))


def _model(path: Path, *, bias: int = 32, reshape_by: str = "shape", blocks: int = 2) -> Path:
    """``blocks`` residual FFN blocks ``x + W2 FastGelu(W1 x + b)`` (the gelu a contrib op), each
    output reshaped to heads and back by a target computed from ``Shape`` (``reshape_by="shape"``)
    or from the values of the int64 input ``heads`` (``"value"``)."""
    rng = np.random.default_rng(0)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    inputs = [helper.make_tensor_value_info("x", F, [1, 8, 16])]
    if reshape_by == "value":
        inputs.append(helper.make_tensor_value_info("heads", I64, [1]))
    x = "x"
    for b in range(blocks):
        p = f"blocks.{b}"
        inits += [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32) * 0.2, f"{p}.w1"),
                  numpy_helper.from_array(rng.standard_normal(bias).astype(np.float32) * 0.1, f"{p}.b1"),
                  numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32) * 0.2, f"{p}.w2")]
        nodes += [
            helper.make_node("MatMul", [x, f"{p}.w1"], [f"{p}/h"], name=f"/{p}/ff/MatMul"),
            helper.make_node("FastGelu", [f"{p}/h", f"{p}.b1"], [f"{p}/g"], name=f"/{p}/ff/FastGelu",
                             domain="com.microsoft"),
            _const(f"{p}/k2", [2]), _const(f"{p}/m1", [-1]), _const(f"{p}/one", [1]),
        ]
        if reshape_by == "shape":  # [1, 8, 2, -1]: Shape(g)[:2] ++ [2, -1]
            nodes += [helper.make_node("Shape", [f"{p}/g"], [f"{p}/shp"], name=f"/{p}/Shape"),
                      _const(f"{p}/z", [0]),
                      helper.make_node("Slice", [f"{p}/shp", f"{p}/z", f"{p}/k2"], [f"{p}/lead"], name=f"/{p}/Slice"),
                      helper.make_node("Concat", [f"{p}/lead", f"{p}/k2", f"{p}/m1"], [f"{p}/tgt"], axis=0,
                                       name=f"/{p}/Concat")]
        else:  # [1, 8, heads, -1]
            nodes += [_const(f"{p}/lead", [1, 8]),
                      helper.make_node("Concat", [f"{p}/lead", "heads", f"{p}/m1"], [f"{p}/tgt"], axis=0,
                                       name=f"/{p}/Concat")]
        nodes += [
            helper.make_node("Reshape", [f"{p}/g", f"{p}/tgt"], [f"{p}/heads"], name=f"/{p}/Reshape"),
            _const(f"{p}/flat", [1, 8, -1]),
            helper.make_node("Reshape", [f"{p}/heads", f"{p}/flat"], [f"{p}/g2"], name=f"/{p}/Reshape_1"),
            helper.make_node("MatMul", [f"{p}/g2", f"{p}.w2"], [f"{p}/f"], name=f"/{p}/ff/MatMul_1"),
            helper.make_node("Add", [x, f"{p}/f"], [f"{p}/out"], name=f"/{p}/Add"),
        ]
        x = f"{p}/out"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="/out"))
    graph = helper.make_graph(nodes, "contrib", inputs, [helper.make_tensor_value_info("y", F, [1, 8, 16])], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    onnx.save(model, path)
    return path


def test_shapes_inference_cannot_follow_are_observed(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx")
    inferred = onnx.shape_inference.infer_shapes(onnx.load(model))
    assert "blocks.0/g" not in {vi.name for vi in inferred.graph.value_info}  # what inference leaves
    mg = load_model(model)
    for b in range(2):
        assert mg.tensor_types[f"blocks.{b}/g"] == ("float32", (1, 8, 32))
        assert mg.tensor_types[f"blocks.{b}/heads"] == ("float32", (1, 8, 2, 16))
        assert mg.tensor_types[f"blocks.{b}/out"] == ("float32", (1, 8, 16))
    assert mg.specialised == ()  # nothing the data decided: no input the plan must refuse


def test_the_plan_of_such_a_model_reproduces_it(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx")
    plan = partition_and_check(model, tmp_path / "p", "generic")
    ops = {dev: [n.op_type for s in plan.stages if s.device == dev
                 for n in onnx.load(tmp_path / "p" / s.file, load_external_data=False).graph.node]
           for dev in ("npu", "host")}
    # the contrib op on the host (no toolkit loads its domain), the matmuls on the NPU
    assert ops["host"].count("FastGelu") == 2 and "FastGelu" not in ops["npu"]
    assert ops["npu"].count("MatMul") == 4


def test_a_shape_an_input_value_decides_still_needs_inputs(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", reshape_by="value")
    with pytest.raises(DataDependentShapeError) as e:
        load_model(model)
    # the op the value decides the shape by, not the contrib op inference stopped at
    assert e.value.sources[0][:2] == ("Reshape", "/blocks.0/Reshape")
    assert "--inputs FILE.npz" in str(e.value)


def test_a_model_onnx_runtime_cannot_run_is_refused_in_one_line(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", bias=31)  # FastGelu's bias does not fit its input
    r = CliRunner().invoke(main, ["partition", str(model), "-o", str(tmp_path / "p")])
    assert r.exit_code == InvalidModelError.exit_code, r.output
    line = r.output.strip().splitlines()[-1]
    assert "unresolved dynamic shape" in line and "ONNX Runtime cannot run the model" in line, line
    assert "Traceback" not in r.output and not (tmp_path / "p").exists()


def _nodes(*specs: tuple[str, list[str], list[str]]) -> list[onnx.NodeProto]:
    return [helper.make_node(op, ins, outs) for op, ins, outs in specs]


def test_shape_arithmetic_does_not_vary_with_values() -> None:
    nodes = _nodes(("Shape", ["x"], ["s"]), ("Gather", ["s", "i"], ["d"]), ("Div", ["d", "two"], ["h"]),
                   ("Concat", ["h", "m1"], ["t"]), ("Reshape", ["x", "t"], ["r"]), ("Relu", ["r"], ["y"]))
    values, shapes = shape_varying(nodes, ["x"])
    assert not shapes & {"s", "d", "h", "t", "r", "y"}
    assert "r" in values and "t" not in values


@pytest.mark.parametrize(("spec", "varies"), [
    (("Reshape", ["x", "n"], ["r"]), True),        # a target read from an input's values
    (("Reshape", ["x", "c"], ["r"]), False),       # a constant target
    (("NonZero", ["x"], ["r"]), True),             # the data decides how many
    (("Expand", ["x", "n"], ["r"]), True),
    (("Gather", ["x", "n"], ["r"]), False),        # the indices' shape decides, not their values
    (("Unique", ["c"], ["r"]), False),             # of a constant: nothing varies
    (("MyOp", ["x"], ["r"]), True),                # an op no table knows: taken as varying
])
def test_which_ops_let_values_decide_a_shape(spec: tuple[str, list[str], list[str]], varies: bool) -> None:
    _, shapes = shape_varying(_nodes(spec, ("Relu", ["r"], ["y"])), ["x", "n"])
    assert ("r" in shapes) is varies and ("y" in shapes) is varies


@pytest.mark.export
@pytest.mark.slow
def test_an_export_fused_by_the_onnx_runtime_optimizer_partitions_and_reproduces(tmp_path: Path) -> None:
    """A real export through ``onnxruntime.transformers.optimizer`` (SkipLayerNormalization,
    FastGelu): refused as "unresolved dynamic shape" before; now split, and the plan reproduces it."""
    from onnxruntime.transformers.optimizer import optimize_model

    from tests.models.diffusers_families import block_count, cached_export

    pytest.importorskip("torch")
    src = cached_export("dit", "torchscript")
    model = tmp_path / "dit-ort.onnx"
    optimize_model(str(src), model_type="bert", num_heads=0, hidden_size=0, opt_level=0).save_model_to_file(str(model))
    fused = {n.op_type for n in onnx.load(model).graph.node if n.domain == "com.microsoft"}
    assert {"SkipLayerNormalization", "FastGelu"} <= fused
    plan = partition_and_check(model, tmp_path / "p", "split")
    assert len({s.block for s in plan.npu_stages}) == block_count("dit")
    host = [n for s in plan.stages if s.device == "host"
            for n in onnx.load(tmp_path / "p" / s.file, load_external_data=False).graph.node]
    assert fused <= {n.op_type for n in host if n.domain == "com.microsoft"}


def _if(cond: str) -> onnx.NodeProto:
    """TorchScript's ``x.squeeze(1)``: ``If(cond, Squeeze(x, [1]), Identity(x))``."""
    then = helper.make_graph([helper.make_node("Squeeze", ["x", "ax"], ["sq"])], "then", [],
                             [helper.make_tensor_value_info("sq", F, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["id"])], "else", [],
                              [helper.make_tensor_value_info("id", F, None)])
    return helper.make_node("If", [cond], ["r"], then_branch=then, else_branch=other)


@pytest.mark.parametrize(("cond_from", "varies"), [("x_shape", False), ("x_value", True)])
def test_an_if_varies_only_when_its_condition_or_a_branch_does(cond_from: str, varies: bool) -> None:
    pre = (_nodes(("Shape", ["x"], ["s"]), ("Gather", ["s", "one"], ["d"]), ("Equal", ["d", "one"], ["c"]))
           if cond_from == "x_shape" else _nodes(("ReduceMax", ["x"], ["m"]), ("Greater", ["m", "zero"], ["c"])))
    _, shapes = shape_varying([*pre, _if("c")], ["x"])
    assert ("r" in shapes) is varies


def test_an_absurd_static_shape_is_refused_before_any_run(tmp_path: Path) -> None:
    """Inference left the contrib op untyped, but a tensor it did type is absurd: refused as such,
    before the run that would resolve the rest allocates it."""
    model = onnx.load(_model(tmp_path / "m.onnx"))
    g = model.graph
    g.node.extend([
        _const("huge/shape", [1 << 20, 1 << 20]),
        helper.make_node("ConstantOfShape", ["huge/shape"], ["huge"], name="/huge"),
        helper.make_node("ReduceSum", ["huge"], ["huge/sum"], keepdims=0, name="/huge/sum"),
        helper.make_node("Add", ["y", "huge/sum"], ["y2"], name="/out2"),
    ])
    g.output[0].name = "y2"
    onnx.save(model, tmp_path / "h.onnx")
    with pytest.raises(InvalidModelError, match="absurd shape"):
        load_model(tmp_path / "h.onnx")
