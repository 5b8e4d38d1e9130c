"""``slice-reverse``: a Slice with a negative step (``torch.flip``, ``x[::-1]``) becomes a Concat of
one-element Slices in the order the step visits them.

2.3.0 and 2.5.0 place a reversing Slice on the CPU (but for the last axis of a rank-4 tensor);
Sana-WM's chunked linear attention flips its chunks ten times per block.  The copy is bit-exact
for every element type and every bound ONNX allows (negative from the end, clamped); the toolkit
test builds flips with and without the rewrite on both toolkits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.rewrites import REWRITES, rewrites_for
from rkpart.targets.rewrites.npu import MAX_REVERSED
from tests.targets.rewrite_check import cpu_layers_before_after, rewritten, run_unoptimised

ROW = tuple(r for r in REWRITES if r.name == "slice-reverse")
INT64_MIN1 = -(2**63) + 1  # torch's "to the start" end of a flip
vi = helper.make_tensor_value_info


def _slice(shape: list[int], starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int],
           elem: int = TensorProto.FLOAT, *, computed: bool = True) -> onnx.ModelProto:
    """x -> (Relu) -> Slice(starts, ends, axes, steps) -> y; axes None: the input left empty (all axes)."""
    c = numpy_helper.from_array
    inits = [c(np.array(starts, np.int64), "st"), c(np.array(ends, np.int64), "en"), c(np.array(steps, np.int64), "sp")]
    if axes is not None:
        inits.append(c(np.array(axes, np.int64), "ax"))
    src = "x"
    nodes = []
    if computed:
        nodes.append(helper.make_node("Identity", ["x"], ["xr"]))
        src = "xr"
    nodes.append(helper.make_node("Slice", [src, "st", "en", "ax" if axes is not None else "", "sp"], ["y"],
                                  name="flip"))
    ref = np.zeros(shape)
    sl = [slice(None)] * len(shape)
    for a, b, e, s in zip(axes if axes is not None else range(len(starts)), starts, ends, steps, strict=True):
        sl[a] = slice(b, e, s)
    out = list(ref[tuple(sl)].shape)
    g = helper.make_graph(nodes, "g", [vi("x", elem, shape)], [vi("y", elem, out)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


CASES = [
    ([1, 2, 2, 16, 16], [-1], [INT64_MIN1], [2], [-1]),  # Sana-WM: torch.flip of the chunk axis, rank 5
    ([1, 2, 2], [-1], [INT64_MIN1], [2], [-1]),  # rank 3, the last axis
    ([16, 2, 32], [-1], [INT64_MIN1], [-2], [-1]),  # a negative axis
    ([3, 8], [6], [1], [1], [-2]),  # a partial reversal, every second element
    ([1, 4, 6, 8], [0, -1], [3, INT64_MIN1], [1, 3], [1, -2]),  # a forward axis and a reversed one
    ([4, 6], [-1, 2], [INT64_MIN1, 100], [0, 1], [-1, 1]),  # reversed first, forward clamped
    ([5, 3], [100, -1], [-100, INT64_MIN1], None, [-2, -1]),  # every axis (no axes input), clamped bounds
]


@pytest.mark.parametrize(("shape", "starts", "ends", "axes", "steps"), CASES)
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL],
                         ids=["f32", "f16", "i64", "bool"])
def test_reversal_is_a_concat_of_pieces_bit_for_bit(shape: list[int], starts: list[int], ends: list[int],
                                                    axes: list[int] | None, steps: list[int], elem: int) -> None:
    m = _slice(shape, starts, ends, axes, steps, elem)
    r, done = rewritten(m, ROW)
    assert done == {"slice-reverse": 1}
    ops = [n.op_type for n in r.graph.node]
    assert "Concat" in ops and all(op in ("Identity", "Slice", "Concat") for op in ops)
    assert all(numpy_helper.to_array(t).min() > 0 for n in r.graph.node if n.op_type == "Slice" and len(n.input) > 4
               for t in r.graph.initializer if t.name == n.input[4])  # no negative step left
    onnx.checker.check_model(r)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape) * 100
    x = x.astype(helper.tensor_dtype_to_np_dtype(elem)) if elem != TensorProto.BOOL else x > 0
    if elem == TensorProto.FLOAT:
        x.flat[:3] = [np.nan, -0.0, np.inf]
    want, got = run_unoptimised(m, {"x": x})[0], run_unoptimised(r, {"x": x})[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    if elem == TensorProto.FLOAT:
        assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("case", ["forward", "empty", "too-long", "dynamic-bounds", "no-steps", "dynamic-shape",
                                  "repeated-axis"])
def test_left_alone(case: str) -> None:
    """Positive steps only, a reversal that selects nothing, more than MAX_REVERSED pieces, bounds
    computed at run time, no steps input, an input without a static shape, an axis named twice."""
    if case == "forward":
        m = _slice([4, 6], [0], [3], [1], [1])
    elif case == "empty":
        m = _slice([4, 6], [0], [3], [1], [-1])
    elif case == "too-long":
        m = _slice([2, MAX_REVERSED + 1], [-1], [INT64_MIN1], [1], [-1])
    elif case == "dynamic-bounds":
        m = _slice([4, 6], [-1], [INT64_MIN1], [1], [-1])
        (st,) = [t for t in m.graph.initializer if t.name == "st"]
        m.graph.initializer.remove(st)
        m.graph.input.append(vi("st", TensorProto.INT64, [1]))
    elif case == "no-steps":
        m = _slice([4, 6], [0], [3], [1], [1])
        m.graph.node[-1].input.pop()
    elif case == "dynamic-shape":
        m = _slice([4, 6], [-1], [INT64_MIN1], [1], [-1])
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    else:
        m = _slice([4, 6], [-1, -1], [INT64_MIN1, INT64_MIN1], [1, 1], [-1, -1])
        m.graph.output[0].type.tensor_type.ClearField("shape")
    r, done = rewritten(m, ROW)
    assert done == {}
    assert list(r.graph.node) == list(m.graph.node)


def test_every_toolkit() -> None:
    for v in ("2.3.0", "2.3.2", "2.5.0"):
        assert "slice-reverse" in [r.name for r in rewrites_for(v, "npu")]


#: (shape, axis) of the measured flips: rank 3 and 4 on axis 1, rank 4 on axis 2 (16 pieces), rank 5 (Sana-WM)
BUILDS = [([1, 2, 32], 1), ([1, 2, 16, 16], 1), ([1, 2, 16, 16], 2), ([1, 2, 2, 16, 16], 2)]


@pytest.mark.toolkit
@pytest.mark.parametrize("version", ["2.3.0", "2.5.0"])
def test_flip_runs_on_the_npu_once_rewritten(version: str, tmp_path: Path) -> None:
    """A flip inside a stage (a computed tensor in, a computed tensor out): the toolkit puts the
    Slice on the CPU; the Concat of pieces builds with no CPU layer."""
    from tests.toolkits import get_toolkit

    tk = get_toolkit(version)
    rng = np.random.default_rng(0)
    for shape, axis in BUILDS:
        f = TensorProto.FLOAT
        inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), "w")]
        inits += [numpy_helper.from_array(np.array(v, np.int64), k)
                  for k, v in (("st", [-1]), ("en", [INT64_MIN1]), ("ax", [axis]), ("sp", [-1]))]
        nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]),
                 helper.make_node("Slice", ["xw", "st", "en", "ax", "sp"], ["f"], name="flip"),
                 helper.make_node("Relu", ["f"], ["y"])]
        # a rank-5 tensor crosses no stage boundary: viewed from and to rank 4
        if len(shape) == 5:
            four = [1, shape[1] * shape[2], *shape[3:]]
            inits += [numpy_helper.from_array(np.array(shape, np.int64), "s5"),
                      numpy_helper.from_array(np.array(four, np.int64), "s4")]
            nodes = [helper.make_node("Reshape", ["x4", "s5"], ["x"]), *nodes,
                     helper.make_node("Reshape", ["y", "s4"], ["y4"])]
            ins, outs = [vi("x4", f, four)], [vi("y4", f, four)]
        else:
            ins, outs = [vi("x", f, shape)], [vi("y", f, shape)]
        m = helper.make_model(helper.make_graph(nodes, "flip", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        r, done = rewritten(m, ROW)
        assert done == {"slice-reverse": 1}
        cpu = cpu_layers_before_after(m, r, tk, tmp_path)
        assert cpu == {"before": ("Slice:flip",), "after": ()}, (shape, axis, cpu)
