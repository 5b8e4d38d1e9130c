"""``wide-matmul-columns``: a MatMul of more than 8192 output channels as one product per column range (issue 50).

FLUX.2's single-stream block projects the tokens once into q, k, v and the MLP's gate and up halves
(``to_qkv_mlp_proj``, 3072 -> 27648) and slices the product; the compiler computes a MatMul channels-first and
runs the Transpose of a product of more than 8192 channels back to tokens-first on the CPU.  The rewritten
products are the same dot products on the same columns of the weight, so ONNX Runtime gives the same bits.  The
toolkit test builds the smallest probe that shows the CPU layer (``bench/layout_probe.py --pattern wide-matmul``:
128 input channels, 256 tokens) before and after.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.ir.edit import GraphEdit
from rkpart.targets.rewrites import REWRITES, compile_rewrites_for
from rkpart.targets.rewrites.heads import MAX_OUT_CHANNELS, wide_matmul_columns
from tests.targets.rewrite_check import cpu_layers_before_after, rewritten, run_unoptimised

WIDE = tuple(r for r in REWRITES if r.name == "wide-matmul-columns")
F = TensorProto.FLOAT


def _c(name: str, v: object, dtype: object = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(v, dtype=dtype), name)  # type: ignore[call-overload]


def single_block(width: int = 4, tokens: int = 8, qkv: int = 3072, mlp: int = 9216, *, bias: bool = False,
                 computed: bool = True) -> onnx.ModelProto:
    """FLUX.2's single-stream projection as its TorchScript export reads it: ``p = x @ W`` (``[width, 3·qkv +
    2·mlp]``, seeded), ``p[..., :3·qkv]`` sliced again into q, k and v (bounds computed from constants when
    ``computed``, as the exporter writes ``qkv.chunk(3)`` of a traced width), ``p[..., 3·qkv:]`` into the gate and
    the up half (``axes`` 2, an end past the axis), SiLU(gate)·up, the pieces combined into one output."""
    t, n = tokens, 3 * qkv + 2 * mlp
    rng = np.random.default_rng(5)
    inits = [_c("w", rng.standard_normal((width, n)) / np.sqrt(width)), _c("ax", [-1], np.int64),
             _c("ax2", [2], np.int64), _c("z", [0], np.int64), _c("a3", [3 * qkv], np.int64),
             _c("big", [2**63 - 1], np.int64), _c("mid", [mlp], np.int64), _c("one", [1], np.int64),
             _c("q", [qkv], np.int64)]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    src = "p"
    if bias:
        inits.append(_c("b", rng.standard_normal(n)))
        nodes.append(helper.make_node("Add", ["p", "b"], ["pb"]))
        src = "pb"
    if computed:
        inits.append(_c("two", [2], np.int64))
        nodes += [helper.make_node("Mul", ["q", "two"], ["q2"]), helper.make_node("Add", ["q2", "q"], ["q3"])]
    else:
        inits += [_c("q2", [2 * qkv], np.int64), _c("q3", [3 * qkv], np.int64)]
    nodes += [helper.make_node("Slice", [src, "z", "a3", "ax"], ["qkv"]),
              helper.make_node("Slice", [src, "a3", "big", "ax"], ["mlp"]),
              helper.make_node("Slice", ["qkv", "z", "q", "ax"], ["sq"]),
              helper.make_node("Slice", ["qkv", "q", "q2", "ax"], ["sk"]),
              helper.make_node("Slice", ["qkv", "q2", "q3", "ax"], ["sv"]),
              helper.make_node("Slice", ["mlp", "z", "mid", "ax2", "one"], ["gate"]),
              helper.make_node("Slice", ["mlp", "mid", "big", "ax2", "one"], ["up"]),
              helper.make_node("Sigmoid", ["gate"], ["sg"]), helper.make_node("Mul", ["gate", "sg"], ["silu"]),
              helper.make_node("Mul", ["silu", "up"], ["h"]),
              helper.make_node("Mul", ["sq", "sk"], ["qk"]), helper.make_node("Add", ["qk", "sv"], ["a"]),
              helper.make_node("Concat", ["a", "h"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, t, width])],
                          [helper.make_tensor_value_info("y", F, [1, t, qkv + mlp])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def one_product(width: int = 4, tokens: int = 8, n: int = 27648) -> onnx.ModelProto:
    """``x @ W`` of ``n`` output channels, the product itself the graph's output."""
    w = _c("w", np.random.default_rng(6).standard_normal((width, n)) / np.sqrt(width))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", F, [1, tokens, width])],
                          [helper.make_tensor_value_info("y", F, [1, tokens, n])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(0).standard_normal(dims).astype(np.float32)}


def _widths(m: onnx.ModelProto) -> list[int]:
    """The output channels of every MatMul's constant weight, in graph order."""
    inits = {t.name: list(t.dims) for t in m.graph.initializer}
    return [inits[n.input[1]][1] for n in m.graph.node if n.op_type == "MatMul"]


@pytest.mark.parametrize(("bias", "computed"), [(False, True), (True, False)])
def test_the_pieces_read_are_their_own_products_bit_for_bit(bias: bool, computed: bool) -> None:
    """q, k, v of 3072 each and the MLP halves of 9216, each cut in two at most 8192 wide: 7 products, the halves
    concatenated from theirs, no Slice of the product left, the same bits (the same dot products)."""
    m = single_block(bias=bias, computed=computed)
    r, applied = rewritten(m, WIDE)
    assert applied == {"wide-matmul-columns": 1}
    assert _widths(r) == [3072, 3072, 3072, 4608, 4608, 4608, 4608]
    ops = [n.op_type for n in r.graph.node]
    assert "Slice" not in ops and ops.count("Mul") == 3 and ops.count("Concat") == 3  # the bounds' Mul gone
    assert ops.count("Add") == 1 + (7 if bias else 0)  # the block's own, the bias per range
    onnx.checker.check_model(r, full_check=True)
    feeds = _feeds(m)
    (want,), (got,) = run_unoptimised(m, feeds), run_unoptimised(r, feeds)
    assert np.array_equal(got, want)
    assert WIDE[0].exact


def test_a_product_that_is_the_stage_output_is_cut_into_equal_ranges_concatenated() -> None:
    """The product as the graph's output: 27648 columns as 4 ranges of 6912, concatenated back, the same bits."""
    m = one_product()
    r, applied = rewritten(m, WIDE)
    assert applied == {"wide-matmul-columns": 1}
    assert _widths(r) == [6912] * 4
    assert [n.op_type for n in r.graph.node][-1] == "Concat" and r.graph.node[-1].output[0] == "y"
    feeds = _feeds(m)
    assert np.array_equal(run_unoptimised(r, feeds)[0], run_unoptimised(m, feeds)[0])


def test_columns_nobody_reads_are_not_computed() -> None:
    """Only q and the up half are read: the products of k, v and the gate are not made."""
    m = single_block()
    g = m.graph
    keep = [n for n in g.node if n.op_type != "Concat" and not (set(n.output) & {"sk", "sv", "gate", "sg", "silu",
                                                                                    "h", "qk", "a"})]
    del g.node[:]
    g.node.extend([*keep, helper.make_node("Concat", ["sq", "up"], ["y"], axis=-1)])
    r, applied = rewritten(m, WIDE)
    assert applied == {"wide-matmul-columns": 1}
    assert _widths(r) == [3072, 4608, 4608]
    feeds = _feeds(m)
    assert np.array_equal(run_unoptimised(r, feeds)[0], run_unoptimised(m, feeds)[0])


def _gelu_ffn() -> onnx.ModelProto:
    """FLUX.1's FFN shape at 4 input channels: ``gelu(x @ W1) @ W2``, W1 12288 wide, read whole by the GELU."""
    m = one_product(n=12288)
    g = m.graph
    g.initializer.append(_c("w2", np.random.default_rng(7).standard_normal((12288, 4)) / 100))
    g.node.extend([helper.make_node("Gelu", ["y"], ["h"], domain="com.microsoft"),
                   helper.make_node("MatMul", ["h", "w2"], ["z"])])
    g.node[0].output[0] = "y"
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("z", F, [1, 8, 4]))
    return m


def _swiglu_ffn() -> onnx.ModelProto:
    """FLUX.2's FFN at 4 input channels: ``x @ W`` (18432 wide) sliced into gate and up, SiLU(gate) · up, the down
    projection."""
    m = single_block(qkv=0)
    g = m.graph
    keep = [n for n in g.node if not (set(n.output) & {"qkv", "sq", "sk", "sv", "qk", "a", "y"})]
    g.initializer.append(_c("w2", np.random.default_rng(7).standard_normal((9216, 4)) / 100))
    del g.node[:]
    g.node.extend([*keep, helper.make_node("MatMul", ["h", "w2"], ["y"])])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("y", F, [1, 8, 4]))
    return m


@pytest.mark.parametrize("case", ["8192", "computed-weight", "one-row", "read-whole", "swiglu"])
def test_left_alone(case: str) -> None:
    """At most 8192 channels, a computed weight, a product of one row (a modulation GEMV: not measured), a product
    read whole by the stage (an FFN's GELU) and one whose pieces are read elementwise (SwiGLU's halves): the
    compiler keeps those channels-first, no Transpose."""
    assert MAX_OUT_CHANNELS == 8192
    if case == "8192":
        m = one_product(n=MAX_OUT_CHANNELS)
    elif case == "computed-weight":
        m = one_product()
        m.graph.node.insert(0, helper.make_node("Relu", ["w"], ["wr"]))
        m.graph.node[1].input[1] = "wr"
    elif case == "one-row":
        m = one_product(tokens=1)
    elif case == "read-whole":
        m = _gelu_ffn()
    else:
        m = _swiglu_ffn()
    r, applied = rewritten(m, WIDE)
    assert applied == {} and list(r.graph.node) == list(m.graph.node)


def test_the_limit_is_a_parameter_of_the_cut() -> None:
    """The cut follows ``limit``: q, k, v of 24 and halves of 72 at a limit of 32 -> halves in three."""
    m = single_block(qkv=24, mlp=72)
    view = GraphEdit(m)
    view.declare(("inferred_shapes", "types"))
    assert wide_matmul_columns(view, limit=32) == 1
    assert _widths(m) == [24, 24, 24, 24, 24, 24, 24, 24, 24]


@pytest.mark.toolkit
@pytest.mark.slow
def test_real_build_keeps_the_wide_projection_on_the_npu(tk250: object, tmp_path: Path) -> None:
    """2.5.0, FLUX.2's 27648-wide projection read as its block reads it (128 input channels, 256 tokens): the
    product's Transpose (1,27648,1,256) -> (1,256,1,27648) on the CPU before, nothing after."""
    m = single_block(width=128, tokens=256)
    after, applied = rewritten(m, compile_rewrites_for("2.5.0"))
    assert applied.get("wide-matmul-columns") == 1
    cpu = cpu_layers_before_after(m, after, tk250, tmp_path)
    assert [op.split(":")[0] for op in cpu["before"]] == ["Transpose"], cpu
    assert cpu["after"] == (), cpu
