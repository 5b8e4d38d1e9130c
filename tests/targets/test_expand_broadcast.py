"""``expand-broadcast`` (2.5.0): ``Expand(x, s)`` becomes ``Mul(x, ones)``, the ones only as large as the
axes the Expand broadcasts.

2.5.0 lays dynamo's GQA head repeat (Unsqueeze, Expand [1,1,n_rep,1,1], Reshape) out as a broadcast
of axis 0 and places it on the CPU; the product with ones stays on the NPU (the measured row of the
table; the real build is the toolkit test below, on Stable Audio's cross-attention stage).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.rewrites import REWRITES, rewrites_for
from tests.targets.rewrite_check import rewritten, run_unoptimised

ROW = tuple(r for r in REWRITES if r.name == "expand-broadcast")
vi = helper.make_tensor_value_info


def _gqa(x_shape: list[int], target: list[int], elem: int = TensorProto.FLOAT, *, unsqueeze: bool = True
         ) -> onnx.ModelProto:
    """k -> Unsqueeze(2) -> Expand(target) -> y (the repeat before its Reshape)."""
    nodes = [helper.make_node("Relu", ["k"], ["k1"])]
    inits = [numpy_helper.from_array(np.array(target, np.int64), "shape")]
    src = "k1"
    if unsqueeze:
        nodes.append(helper.make_node("Unsqueeze", ["k1", "ax"], ["u"]))
        inits.append(numpy_helper.from_array(np.array([2], np.int64), "ax"))
        src = "u"
    nodes.append(helper.make_node("Expand", [src, "shape"], ["y"], name="repeat"))
    x = [*x_shape[:2], 1, *x_shape[2:]] if unsqueeze else x_shape
    out = list(np.broadcast_shapes(tuple(x), tuple(target)))
    g = helper.make_graph(nodes, "g", [vi("k", elem, x_shape)], [vi("y", elem, out)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("x_shape", "target", "ones"), [
    ([1, 1, 6, 16], [1, 1, 2, 1, 1], [1, 1, 2, 1, 1]),  # Stable Audio: one kv head, n_rep 2
    ([1, 2, 6, 16], [1, 2, 4, 6, 16], [1, 1, 4, 1, 1]),  # the full target spelled out: ones only on the repeat
    ([1, 2, 6, 16], [3, 1, 1, 1, 1, 1], [3, 1, 1, 1, 1, 1]),  # a longer target: new leading axes
])
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
def test_expand_is_a_product_with_ones_bit_for_bit(x_shape: list[int], target: list[int], ones: list[int],
                                                   elem: int) -> None:
    m = _gqa(x_shape, target, elem)
    r, done = rewritten(m, ROW)
    assert done == {"expand-broadcast": 1}
    mul = r.graph.node[-1]
    assert mul.op_type == "Mul" and mul.output[0] == "y"
    (c,) = [t for t in r.graph.initializer if t.name == mul.input[1]]
    assert list(c.dims) == ones and c.data_type == elem
    onnx.checker.check_model(r)
    k = np.random.default_rng(4).standard_normal(x_shape).astype(helper.tensor_dtype_to_np_dtype(elem))
    k.flat[:3] = [np.inf, -0.0, np.nan]
    want, got = run_unoptimised(m, {"k": k})[0], run_unoptimised(r, {"k": k})[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("case", ["int64", "no-op", "huge", "dynamic-target"])
def test_left_alone(case: str) -> None:
    """Integers, an Expand that broadcasts nothing, ones that would cost more than 64 Ki elements
    of weights (an attention mask to [B, H, T, T]), a target computed at run time: no match."""
    if case == "dynamic-target":
        m = _gqa([1, 1, 6, 16], [1, 1, 2, 1, 1])
        (shape_in,) = [t for t in m.graph.initializer if t.name == "shape"]
        m.graph.initializer.remove(shape_in)
        m.graph.input.append(vi("shape", TensorProto.INT64, [5]))
    else:
        m = {"int64": lambda: _gqa([1, 1, 6, 16], [1, 1, 2, 1, 1], TensorProto.INT64),
             "no-op": lambda: _gqa([1, 2, 6, 16], [1, 2, 6, 16], unsqueeze=False),
             "huge": lambda: _gqa([1, 1, 1, 1], [1, 8, 512, 512], unsqueeze=False)}[case]()
    r, done = rewritten(m, ROW)
    assert done == {}
    assert list(r.graph.node) == list(m.graph.node) and list(r.graph.initializer) == list(m.graph.initializer)


def test_only_for_250() -> None:
    assert [r.name for r in rewrites_for("2.3.0", "npu") if r.name == "expand-broadcast"] == []
    assert "expand-broadcast" in [r.name for r in rewrites_for("2.5.0", "npu")]


@pytest.mark.toolkit
@pytest.mark.export
def test_real_build_of_stable_audio_cross_attention_has_no_cpu_expand(tmp_path: Path) -> None:
    """Stable Audio (dynamo), split plan, its first cross-attention stage on 2.5.0: the two Expand
    CPU layers are gone with the rewrite (--skip-rewrite expand-broadcast keeps them)."""
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from rkpart.pipeline import partition
    from tests.models.diffusers_families import cached_export
    from tests.toolkits import get_toolkit

    cpu = {}
    for skip in (frozenset(), frozenset({"expand-broadcast"})):
        folder = tmp_path / ("skip" if skip else "all")
        plan = partition(cached_export("stable_audio", "dynamo"), folder, "split")
        (xattn,) = [s.id for s in plan.stages if s.kind == "xattn" and s.block == plan.stages[1].block]
        rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit("2.5.0"), "rk3588", {}, stages=(xattn,),
                                                               cache=False, skip_rewrites=skip))
        (o,) = [o for o in rep.outcomes if o.stage_id == xattn]
        assert o.status == "built", o
        cpu[bool(skip)] = [c.split(":")[0] for c in o.cpu_ops]
    assert cpu == {False: [], True: ["Expand", "Expand"]}
