"""Malformed and hostile models (issue 8 item 1, issue 2 "Bad input").

Each case runs ``rkpart partition`` in-process and asserts the documented exit code, one
stderr line naming the problem (no traceback) and that nothing was written: no output
folder and no staging sibling.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.hostile.models import (
    assert_user_error,
    cli,
    fvi,
    graph_model,
    mini_dit,
    mlp,
    save,
    siblings,
    snapshot,
)

INVALID = 3  # InvalidModelError
DISCOVERY = 4  # DiscoveryError
OUTPUT = 6  # OutputExistsError


def _partition_fails(tmp_path: Path, model: Path, code: int, *needles: str, extra: tuple[str, ...] = ()) -> str:
    out = tmp_path / "out"
    r = cli(["partition", model, "-o", out, "-s", "fused", "-q", *extra])
    msg = assert_user_error(r, code, *needles)
    assert not out.exists(), "output folder written on failure"
    assert siblings(out) == [], f"left {siblings(out)}"
    return msg


# -- not ONNX at all -------------------------------------------------------------------------


def test_random_bytes(tmp_path: Path) -> None:
    p = tmp_path / "noise.onnx"
    p.write_bytes(np.random.default_rng(1).bytes(4096))
    _partition_fails(tmp_path, p, INVALID, "noise.onnx", "not an ONNX model")


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    _partition_fails(tmp_path, p, INVALID, "empty.onnx", "empty")


def test_text_file(tmp_path: Path) -> None:
    p = tmp_path / "readme.onnx"
    p.write_text("this is not a model\n" * 20)
    _partition_fails(tmp_path, p, INVALID, "readme.onnx", "not an ONNX model")


def test_missing_file(tmp_path: Path) -> None:
    _partition_fails(tmp_path, tmp_path / "nope.onnx", INVALID, "nope.onnx")


@pytest.mark.parametrize("frac", [0.001, 0.05, 0.25, 0.5, 0.75, 0.95, 0.9999])
def test_truncated(tmp_path: Path, mini_model: Path, frac: float) -> None:
    data = mini_model.read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: int(len(data) * frac)])
    _partition_fails(tmp_path, p, INVALID, "cut.onnx")


# -- parses, but invalid ---------------------------------------------------------------------

X, Y = fvi("x", [2, 8]), fvi("y", [2, 8])


def test_dangling_reference(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add")], [X], [Y])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'ghost'", "nothing produces")


def test_dangling_output(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("Relu", ["x"], ["y"])], [X], [Y, fvi("z", [2, 8])])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'z'", "produced by nothing")


def test_cycle(tmp_path: Path) -> None:
    m = graph_model([
        helper.make_node("Add", ["x", "b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
        helper.make_node("Relu", ["a"], ["y"], name="out"),
    ], [X], [Y])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "cycle", "first")


def test_tensor_produced_twice(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])], [X], [Y])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'y'", "more than once")


def test_output_overwrites_input(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("Relu", ["x"], ["x"]), helper.make_node("Neg", ["x"], ["y"])], [X], [Y])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'x'", "more than once")


def test_missing_initializer(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [X], [fvi("y", [2, 4])])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'w'", "nothing produces")


def test_missing_initializer_in_dit(tmp_path: Path, mini_model: Path) -> None:
    m = onnx.load(str(mini_model))
    victim = next(i for i in m.graph.initializer if "ff" in i.name or "to_q" in i.name)
    m.graph.initializer.remove(victim)
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, repr(victim.name))


def test_initializer_data_does_not_fit_shape(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    w.raw_data = w.raw_data[:-4]
    m = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [X], [fvi("y", [2, 4])], [w])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'w'", "124 bytes", "needs 128")


def test_wrong_dtypes(tmp_path: Path) -> None:
    """Add(float, int64): ONNX's type check (check_type=True) catches it."""
    m = graph_model([helper.make_node("Add", ["x", "i"], ["y"])], [X, fvi("i", [2, 8], TensorProto.INT64)], [Y])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "shape inference failed", "int64")


def test_undefined_element_type(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("Cast", ["x"], ["y"], to=0)], [X], [Y])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "data type 0")


def test_attribute_removed_in_declared_opset(tmp_path: Path) -> None:
    """ReduceMean's ``axes`` attribute became an input in opset 18: the checker refuses it."""
    m = graph_model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1, name="rm")],
                    [X], [fvi("y", [2, 1])], opset=21)
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "not a valid ONNX model", "axes")


@pytest.mark.parametrize("opset", [99, 3, 0])
def test_unsupported_opset(tmp_path: Path, opset: int) -> None:
    m = mlp()
    m.opset_import[0].version = opset
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, f"opset {opset}", "not supported")


def test_no_default_opset(tmp_path: Path) -> None:
    m = mlp()
    m.opset_import[0].domain = "com.example"
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "opset")


def test_unknown_op(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("Frobnicate", ["x"], ["y"])], [X], [Y])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "Frobnicate")


def test_negative_input_dim(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("Relu", ["x"], ["y"])], [fvi("x", [2, -8])], [fvi("y", [2, 8])])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'x'", "negative dimension -8")


def test_negative_initializer_dim(tmp_path: Path) -> None:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[8, -4])
    m = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [X], [fvi("y", [2, 4])], [w])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'w'", "negative dimension")


def test_reshape_to_absurd_size(tmp_path: Path) -> None:
    """Reshape 16 elements to 2^50: refused by size, before anything tries to allocate it."""
    s = numpy_helper.from_array(np.array([1 << 25, 1 << 25], np.int64), "s")
    m = graph_model([helper.make_node("Reshape", ["x", "s"], ["y"])], [X], [fvi("y", [1 << 25, 1 << 25])], [s])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'y'", "absurd")


def test_reshape_element_count_mismatch(tmp_path: Path) -> None:
    s = numpy_helper.from_array(np.array([4, 8], np.int64), "s")
    m = graph_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")], [X], [fvi("y", [4, 8])], [s])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "Reshape")


def test_absurd_initializer(tmp_path: Path) -> None:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 30, 1 << 30])
    m = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [X], [fvi("y", [2, 4])], [w])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'w'", "absurd")


def test_no_outputs(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("Relu", ["x"], ["y"])], [X], [])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "no outputs")


def test_no_nodes(tmp_path: Path) -> None:
    m = graph_model([], [X], [X])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "no graph nodes")


def _dit_with_if(src: Path) -> onnx.ModelProto:
    """The mini DiT with one FFN op wrapped in an If (both branches compute it)."""
    m = onnx.load(str(src))
    g = m.graph
    idx, node = next((i, n) for i, n in enumerate(g.node) if n.op_type == "Erf" or
                     (n.op_type in ("Gelu", "Sigmoid") and "ff" in n.name))
    branch_out = node.output[0] + "_b"

    def branch(name: str) -> onnx.GraphProto:
        inner = onnx.NodeProto()
        inner.CopyFrom(node)
        inner.name = f"{name}/{node.name}"
        inner.output[0] = branch_out
        return helper.make_graph([inner], name, [], [helper.make_tensor_value_info(branch_out, 0, None)])

    # a condition computed from the input's values (a constant one is folded: the If is its branch)
    g.initializer.append(numpy_helper.from_array(np.array(-1e30, dtype=np.float32), "floor"))
    wrapped = [helper.make_node("ReduceMax", [g.input[0].name], ["/ff/max"], keepdims=0, name="/ff/ReduceMax"),
               helper.make_node("Greater", ["/ff/max", "floor"], ["/ff/cond"], name="/ff/Greater"),
               helper.make_node("If", ["/ff/cond"], [node.output[0]], name="/ff/If",
                                then_branch=branch("then"), else_branch=branch("else"))]
    g.node.remove(node)
    for k, n in enumerate(wrapped):
        g.node.insert(idx + k, n)
    return m


def test_control_flow_across_a_cut(tmp_path: Path, mini_model: Path) -> None:
    p = save(_dit_with_if(mini_model), tmp_path / "if.onnx")
    _partition_fails(tmp_path, p, INVALID, "control-flow op If", "/ff/If")


def test_model_without_blocks_suggests_another_strategy(tmp_path: Path) -> None:
    msg = _partition_fails(tmp_path, save(mlp(), tmp_path / "mlp.onnx"), DISCOVERY, "no transformer blocks")
    assert "--strategy" in msg or "custom" in msg


def test_unresolved_dynamic_shape_suggests_shape(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("Relu", ["x"], ["y"])], [fvi("x", ["N", 8])], [fvi("y", ["N", 8])])
    p = save(m, tmp_path / "dyn.onnx")
    _partition_fails(tmp_path, p, INVALID, "'x'", "dynamic", "--shape")


def test_shape_option_resolves_dynamic_shape(tmp_path: Path) -> None:
    """With --shape the same model gets past shape checks (and then fails discovery: an MLP)."""
    m = graph_model([helper.make_node("Relu", ["x"], ["y"])], [fvi("x", ["N", 8])], [fvi("y", ["N", 8])])
    p = save(m, tmp_path / "dyn.onnx")
    _partition_fails(tmp_path, p, DISCOVERY, "no transformer blocks", extra=("--shape", "x=2,8"))


def test_shape_option_for_unknown_input(tmp_path: Path, mini_model: Path) -> None:
    _partition_fails(tmp_path, mini_model, INVALID, "'nope'", "not a model input", extra=("--shape", "nope=1,2"))


# -- external data ---------------------------------------------------------------------------


@pytest.fixture
def ext_model(tmp_path: Path) -> tuple[onnx.ModelProto, Path, str]:
    """Mini DiT with external data in ``tmp/m/``; returns (model proto, folder, a tensor name)."""
    folder = tmp_path / "m"
    folder.mkdir()
    src = mini_dit(folder / "base.onnx", external_data=True)
    m = onnx.load(str(src), load_external_data=False)
    name = next(i.name for i in m.graph.initializer if i.data_location == TensorProto.EXTERNAL)
    return m, folder, name


def _with_external(m: onnx.ModelProto, name: str, **info: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    init = next(i for i in out.graph.initializer if i.name == name)
    for e in init.external_data:
        if e.key in info:
            e.value = info[e.key]
    return out


@pytest.mark.parametrize("loc", ["../outside.bin", "../../etc/passwd", "sub/../../outside.bin"])
def test_external_data_dotdot(tmp_path: Path, ext_model: tuple[onnx.ModelProto, Path, str], loc: str) -> None:
    m, folder, name = ext_model
    (tmp_path / "outside.bin").write_bytes(b"\0" * 1_000_000)
    p = save(_with_external(m, name, location=loc), folder / "evil.onnx")
    _partition_fails(tmp_path, p, INVALID, repr(name), repr(loc), "leaves the model folder")


def test_external_data_absolute(tmp_path: Path, ext_model: tuple[onnx.ModelProto, Path, str]) -> None:
    m, folder, name = ext_model
    target = tmp_path / "outside.bin"
    target.write_bytes(b"\0" * 1_000_000)
    p = save(_with_external(m, name, location=str(target)), folder / "evil.onnx")
    _partition_fails(tmp_path, p, INVALID, repr(name), "leaves the model folder")


def test_external_data_symlink_outside(tmp_path: Path, ext_model: tuple[onnx.ModelProto, Path, str]) -> None:
    m, folder, name = ext_model
    target = tmp_path / "outside.bin"
    target.write_bytes(b"\0" * 1_000_000)
    (folder / "weights.bin").symlink_to(target)
    p = save(_with_external(m, name, location="weights.bin"), folder / "evil.onnx")
    _partition_fails(tmp_path, p, INVALID, repr(name), "'weights.bin'", "leaves the model folder")


def test_external_data_symlink_inside_is_fine(tmp_path: Path, ext_model: tuple[onnx.ModelProto, Path, str]) -> None:
    """A symlink that stays in the folder is legitimate (dedup'd weights, etc.)."""
    m, folder, _name = ext_model
    (folder / "alias.data").symlink_to(folder / "base.onnx.data")
    mm = onnx.ModelProto()
    mm.CopyFrom(m)
    for init in mm.graph.initializer:
        for e in init.external_data:
            if e.key == "location":
                e.value = "alias.data"
    p = save(mm, folder / "ok.onnx")
    r = cli(["partition", p, "-o", tmp_path / "out", "-s", "fused", "-q"])
    assert r.exit_code == 0, r.output


def test_external_data_missing_file(tmp_path: Path, ext_model: tuple[onnx.ModelProto, Path, str]) -> None:
    m, folder, name = ext_model
    p = save(_with_external(m, name, location="gone.data"), folder / "m.onnx")
    _partition_fails(tmp_path, p, INVALID, repr(name), "'gone.data'", "missing")


def test_external_data_short_file(tmp_path: Path, ext_model: tuple[onnx.ModelProto, Path, str]) -> None:
    m, folder, name = ext_model
    (folder / "short.data").write_bytes(b"\0" * 10)
    p = save(_with_external(m, name, location="short.data", offset="0"), folder / "m.onnx")
    _partition_fails(tmp_path, p, INVALID, repr(name), "'short.data'", "too short")


def test_external_data_truncated_after_export(tmp_path: Path, ext_model: tuple[onnx.ModelProto, Path, str]) -> None:
    """The common real case: the .data file was cut short by an interrupted download."""
    _m, folder, _ = ext_model
    data = folder / "base.onnx.data"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    _partition_fails(tmp_path, folder / "base.onnx", INVALID, "'base.onnx.data'", "too short")


@pytest.mark.parametrize("info", [{"offset": "abc"}, {"offset": "-64"}, {"length": "7"}])
def test_external_data_bad_offset_length(
    tmp_path: Path, ext_model: tuple[onnx.ModelProto, Path, str], info: dict[str, str]
) -> None:
    m, folder, name = ext_model
    p = save(_with_external(m, name, **info), folder / "m.onnx")
    _partition_fails(tmp_path, p, INVALID, repr(name))


# -- output folder ---------------------------------------------------------------------------


def test_non_empty_output_without_force(tmp_path: Path, mini_model: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    r = cli(["partition", mini_model, "-o", out, "-s", "fused", "-q"])
    assert_user_error(r, OUTPUT, str(out), "not empty", "--force")
    assert snapshot(out) == before
    assert siblings(out) == []


def test_force_refuses_a_folder_that_is_not_a_plan(tmp_path: Path, mini_model: Path) -> None:
    out = tmp_path / "home"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    before = snapshot(out)
    r = cli(["partition", mini_model, "-o", out, "-s", "fused", "-q", "--force"])
    assert_user_error(r, OUTPUT, "not an rkpart plan folder")
    assert snapshot(out) == before
    assert siblings(out) == []


def test_force_refuses_a_plan_folder_holding_the_model(tmp_path: Path, mini_model: Path) -> None:
    out = tmp_path / "out"
    assert cli(["partition", mini_model, "-o", out, "-s", "fused", "-q"]).exit_code == 0
    model = out / "model.onnx"
    model.write_bytes(mini_model.read_bytes())
    before = snapshot(out)
    r = cli(["partition", model, "-o", out, "-s", "fused", "-q", "--force"])
    assert_user_error(r, OUTPUT, "contains", "model.onnx")
    assert snapshot(out) == before


def test_output_is_a_file(tmp_path: Path, mini_model: Path) -> None:
    out = tmp_path / "out"
    out.write_text("x")
    r = cli(["partition", mini_model, "-o", out, "-s", "fused", "-q"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert out.read_text() == "x"


def test_force_replaces_a_plan_and_failure_keeps_it(tmp_path: Path, mini_model: Path) -> None:
    """A failing --force run leaves the previous plan exactly as it was."""
    out = tmp_path / "out"
    assert cli(["partition", mini_model, "-o", out, "-s", "fused", "-q"]).exit_code == 0
    before = snapshot(out)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(mini_model.read_bytes()[:1000])
    r = cli(["partition", bad, "-o", out, "-s", "fused", "-q", "--force"])
    assert_user_error(r, INVALID, "bad.onnx")
    assert snapshot(out) == before
    assert siblings(out) == []


def test_invalid_utf8_in_a_name(tmp_path: Path, mini_model: Path) -> None:
    """protobuf parses broken UTF-8 and returns bytes instead of str: refused up front."""
    m = onnx.load(str(mini_model))
    name = m.graph.node[3].name.encode()
    data = mini_model.read_bytes()
    at = data.index(name)
    bad = data[:at] + b"\xef\xbf" + data[at + 2:]  # an incomplete 3-byte UTF-8 sequence
    p = tmp_path / "utf.onnx"
    p.write_bytes(bad)
    _partition_fails(tmp_path, p, INVALID, "utf.onnx", "not valid UTF-8")


def test_string_tensor(tmp_path: Path) -> None:
    m = graph_model([helper.make_node("Identity", ["s"], ["y"])], [fvi("s", [2], TensorProto.STRING)],
                    [fvi("y", [2], TensorProto.STRING)])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), INVALID, "'s'", "string")


def test_constant_division_by_zero_stays_one_line(tmp_path: Path) -> None:
    """Constant folding evaluates 1/0: numpy's warning must not reach stderr."""
    one = numpy_helper.from_array(np.ones((2, 8), np.float32), "one")
    zero = numpy_helper.from_array(np.zeros((2, 8), np.float32), "zero")
    m = graph_model([helper.make_node("Div", ["one", "zero"], ["inf"]),
                     helper.make_node("Add", ["x", "inf"], ["y"])], [X], [Y], [one, zero])
    _partition_fails(tmp_path, save(m, tmp_path / "m.onnx"), DISCOVERY, "no transformer blocks")
