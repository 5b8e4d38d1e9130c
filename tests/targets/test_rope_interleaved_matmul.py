"""``rope-interleaved-matmul``: RoPE's rotation of interleaved pairs (diffusers' ``apply_rotary_emb(
use_real_unbind_dim=-1)`` as TorchScript writes it) times its sin table becomes ``MatMul(x * T', P)``.

HunyuanDiT's attention at its real width (16 heads of 88) normalises q and k per head and then rotates
the pairs: 2.5.0 puts the rotation's last Reshape and a Transpose after the norm on the CPU at head dims
that are not a multiple of 16 (issue 50).  The rewrite computes the same one product per value, so ONNX
Runtime gives the same bits; the toolkit test builds the hand-made attention before and after.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.rewrites import REWRITES
from tests.targets.rewrite_check import cpu_layers_before_after, rewritten, run_unoptimised

ROW = tuple(r for r in REWRITES if r.name == "rope-interleaved-matmul")


def _c(name: str, v: object, dtype: object = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(v, dtype=dtype), name)  # type: ignore[call-overload]


def _attention(d: int, *, heads: int = 4, tokens: int = 128, elem: int = TensorProto.FLOAT, opset: int = 17,
               cast: bool = True, extra_reader: bool = False, tokens_first: bool = False) -> onnx.ModelProto:
    """x [1, T, H*d] -> heads [1, H, T, d] -> LayerNorm(d) -> x*cos + rotate(x)*sin (rank-5 form, random
    tables whose pairs differ) -> attention with k, v inputs -> [1, T, H*d]."""
    dt = helper.tensor_dtype_to_np_dtype(elem)
    rng = np.random.default_rng(d)
    t, h = tokens, heads
    lead = [1, h, t]
    axes: dict[str, object] = {}
    # tokens_first: no heads Transpose in front of the norm (x read as [1, H, T, d] directly), as the rotation of
    # a tokens-first layout sees it
    inits = [_c("hs", [1, h, t, d] if tokens_first else [1, t, h, d], np.int64),
             _c("pairs", [*lead, d // 2, 2], np.int64),
             _c("flat", [*lead, d], np.int64), _c("out", [1, t, h * d], np.int64),
             _c("cos", rng.standard_normal((1, 1, t, d)), dt), _c("sin", rng.standard_normal((1, 1, t, d)), dt),
             _c("w", 1 + 0.1 * rng.standard_normal(d), dt), _c("b", 0.1 * rng.standard_normal(d), dt),
             _c("scale", 1 / np.sqrt(d), dt)]
    if opset >= 13:
        inits += [_c("last", [-1], np.int64), _c("ones", [1, 1], np.int64)]
        sq = lambda a, b: helper.make_node("Squeeze", [a, "last"], [b])  # noqa: E731
        usq = lambda a, b: helper.make_node("Unsqueeze", [a, "last"], [b])  # noqa: E731
        split = helper.make_node("Split", ["r", "ones"], ["x1", "x2"], axis=-1)
    else:
        axes = {"axes": [-1]}
        sq = lambda a, b: helper.make_node("Squeeze", [a], [b], **axes)  # noqa: E731
        usq = lambda a, b: helper.make_node("Unsqueeze", [a], [b], **axes)  # noqa: E731
        split = helper.make_node("Split", ["r"], ["x1", "x2"], axis=-1, split=[1, 1])
    nodes = [helper.make_node("Reshape", ["x", "hs"], ["xh"]),
             helper.make_node("Transpose", ["xh"], ["q0"], perm=[0, 1, 2, 3] if tokens_first else [0, 2, 1, 3]),
             helper.make_node("LayerNormalization", ["q0", "w", "b"], ["q"], axis=-1, epsilon=1e-6),
             helper.make_node("Reshape", ["q", "pairs"], ["r"]), split, sq("x1", "s1"), sq("x2", "s2"),
             helper.make_node("Neg", ["s2"], ["n2"]), usq("n2", "u2"), usq("s1", "u1"),
             helper.make_node("Concat", ["u2", "u1"], ["c"], axis=-1),
             helper.make_node("Reshape", ["c", "flat"], ["rot"])]
    rot = "rot"
    if cast:
        nodes.append(helper.make_node("Cast", ["rot"], ["rot_c"], to=elem))
        rot = "rot_c"
    nodes += [helper.make_node("Mul", ["q", "cos"], ["qc"]), helper.make_node("Mul", [rot, "sin"], ["qs"]),
              helper.make_node("Add", ["qc", "qs"], ["qr"]),
              helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qr", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "out"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", elem, [1, t, h * d])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("c", elem, [*lead, d // 2, 2]))
    g = helper.make_graph(nodes, "rope", [helper.make_tensor_value_info("x", elem, [1, t, h * d]),
                                          helper.make_tensor_value_info("k", elem, [1, h, t, d]),
                                          helper.make_tensor_value_info("v", elem, [1, h, t, d])], outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _feeds(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {v.name: rng.standard_normal([x.dim_value for x in v.type.tensor_type.shape.dim]).astype(
        helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)) for v in m.graph.input}


@pytest.mark.parametrize(("d", "elem", "opset", "cast"), [(88, TensorProto.FLOAT, 17, True),
                                                          (72, TensorProto.FLOAT16, 17, False),
                                                          (72, TensorProto.FLOAT, 18, True)])
def test_rotation_times_table_is_a_pair_swap_matmul_bit_for_bit(d: int, elem: int, opset: int, cast: bool) -> None:
    m = _attention(d, elem=elem, opset=opset, cast=cast)
    r, applied = rewritten(m, ROW)
    assert applied == {"rope-interleaved-matmul": 1}
    ops = [n.op_type for n in r.graph.node]
    assert not {"Split", "Squeeze", "Unsqueeze", "Neg", "Concat"} & set(ops) and ops.count("Reshape") == 2
    feeds = _feeds(m)
    (want,), (got,) = run_unoptimised(m, feeds), run_unoptimised(r, feeds)
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize(("d", "extra_reader", "tokens_first"), [(88, True, False), (64, False, False),
                                                                  (88, False, True)])
def test_left_alone(d: int, extra_reader: bool, tokens_first: bool) -> None:
    """A piece of the rotation read elsewhere; head dim 64 and the tokens-first layout, which 2.5.0 keeps on the
    NPU."""
    m = _attention(d, extra_reader=extra_reader, tokens_first=tokens_first)
    r, applied = rewritten(m, ROW)
    assert applied == {} and list(r.graph.node) == list(m.graph.node)


@pytest.mark.toolkit
@pytest.mark.slow
def test_real_build_puts_the_rotation_on_the_npu(tk250: object, tmp_path: Path) -> None:
    """2.5.0 at head dim 72, 1024 tokens (4 heads: 16 heads of 128 or 256 tokens keep it on the NPU): the Transpose
    after the norm and the rotation's Reshape on the CPU before, nothing after."""
    m = _attention(72, tokens=1024)
    r, _ = rewritten(m, ROW)
    cpu = cpu_layers_before_after(m, r, tk250, tmp_path)
    assert sorted(op.split(":")[0] for op in cpu["before"]) == ["Reshape", "Transpose"], cpu
    assert cpu["after"] == (), cpu
