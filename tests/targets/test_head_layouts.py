"""Head layouts of real widths (issue 50): ``kv-repeat-gather`` (GQA's head repeat as a Gather),
``pad-rows-matmul`` (a row-padded MatMul operand as two products) and ``masked-attention-row-chunks`` (a masked
attention of many query rows per chunk of rows).

The Gather copies the same values, so ONNX Runtime gives the same bits on a small graph; the products are the
same dot products, summed in the order ONNX Runtime's GEMM picks for each shape (within the rewrite check).  The
toolkit tests build the smallest probe that shows the CPU layer (``bench/layout_probe.py``) before and after.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.compile.prepare import REWRITE_GATE
from rkpart.targets.rewrites import REWRITES, compile_rewrites_for
from tests.targets.rewrite_check import cpu_layers_before_after, rewritten, run_unoptimised

GATHER = tuple(r for r in REWRITES if r.name == "kv-repeat-gather")
PAD = tuple(r for r in REWRITES if r.name == "pad-rows-matmul")
F = TensorProto.FLOAT
#: Sana's image tokens: 2.5.0 runs the padded value's Transpose of 70 heads on the CPU at 1024, not at 512
SANA_TOKENS = 1024


def _c(name: str, v: object, dtype: object = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(v, dtype=dtype), name)  # type: ignore[call-overload]


def _model(nodes: list[onnx.NodeProto], ins: list[onnx.ValueInfoProto], out: list[int],
           inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", F, out)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def gqa(form: str, *, heads: int = 6, kv: int = 2, tokens: int = 16, d: int = 8, merged: bool = True
        ) -> onnx.ModelProto:
    """Attention of ``heads`` query heads over ``kv`` key/value heads, the keys and values repeated per head.

    ``form``: ``tile`` (Lumina2's TorchScript export: tokens-first ``[1, T, kv, d]``, ``Unsqueeze(3)``, ``Tile``),
    ``expand`` (dynamo's heads-first ``[1, kv, T, d]``, ``Unsqueeze(2)``, ``Expand``), ``ones`` (the ``Mul(x,
    ones)`` tile-broadcast makes of the first).  ``merged=False``: the repeat is read as it is (no Reshape)."""
    h, t, r = heads, tokens, heads // kv
    tokens_first = form in ("tile", "ones")
    ax = 3 if tokens_first else 2
    kv_shape = [1, t, kv, d] if tokens_first else [1, kv, t, d]
    rep_shape = [1, t, kv, r, d] if tokens_first else [1, kv, r, t, d]
    inits = [_c("hs", [1, t, h, d], np.int64), _c("ax", [ax], np.int64), _c("out", [1, t, h * d], np.int64),
             _c("merge", [1, t, h, d] if tokens_first else [1, h, t, d], np.int64), _c("scale", 1 / np.sqrt(d))]
    nodes = [helper.make_node("Reshape", ["x", "hs"], ["xh"]),
             helper.make_node("Transpose", ["xh"], ["q"], perm=[0, 2, 1, 3])]
    for name in ("k", "v"):
        nodes.append(helper.make_node("Unsqueeze", [name, "ax"], [f"{name}_u"]))
        if form == "tile":
            inits.append(_c("reps", [1, 1, 1, r, 1], np.int64))
            nodes.append(helper.make_node("Tile", [f"{name}_u", "reps"], [f"{name}_rep"]))
        elif form == "ones":
            inits.append(_c("ones", np.ones([1, 1, 1, r, 1])))
            nodes.append(helper.make_node("Mul", [f"{name}_u", "ones"], [f"{name}_rep"]))
        else:
            inits.append(_c("shape5", rep_shape, np.int64))
            nodes.append(helper.make_node("Expand", [f"{name}_u", "shape5"], [f"{name}_rep"]))
        if merged:
            nodes.append(helper.make_node("Reshape", [f"{name}_rep", "merge"], [f"{name}_r"]))
        else:  # the repeat read without merging its axes: a sum over the repeats, shaped back to the heads
            inits.append(_c("rows", [1, t, h, d] if tokens_first else [1, h, t, d], np.int64))
            nodes += [helper.make_node("Relu", [f"{name}_rep"], [f"{name}_x"]),
                      helper.make_node("Reshape", [f"{name}_x", "rows"], [f"{name}_r"])]
    perm_k, perm_v = ([0, 2, 3, 1], [0, 2, 1, 3]) if tokens_first else ([0, 1, 3, 2], [0, 1, 2, 3])
    nodes += [helper.make_node("Transpose", ["k_r"], ["kt"], perm=perm_k),
              helper.make_node("Transpose", ["v_r"], ["vt"], perm=perm_v),
              helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "vt"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "out"], ["y"])]
    ins = [helper.make_tensor_value_info("x", F, [1, t, h * d]), helper.make_tensor_value_info("k", F, kv_shape),
           helper.make_tensor_value_info("v", F, kv_shape)]
    return _model(nodes, ins, [1, t, h * d], inits)


def _feeds(m: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal([x.dim_value for x in v.type.tensor_type.shape.dim]).astype(np.float32)
            for v in m.graph.input}


@pytest.mark.parametrize("form", ["tile", "expand", "ones"])
def test_kv_repeat_is_a_gather_of_the_heads_bit_for_bit(form: str) -> None:
    m = gqa(form)
    r, applied = rewritten(m, GATHER)
    assert applied == {"kv-repeat-gather": 2}
    ops = [n.op_type for n in r.graph.node]
    assert ops.count("Gather") == 2 and not {"Tile", "Expand"} & set(ops)
    assert not any(n.op_type == "Mul" and n.input[0].endswith("_u") for n in r.graph.node)
    feeds = _feeds(m)
    (want,), (got,) = run_unoptimised(m, feeds), run_unoptimised(r, feeds)
    assert np.array_equal(got, want)


def test_kv_repeat_runs_before_tile_broadcast_in_the_compile_order() -> None:
    """The whole 2.5.0 set on Lumina2's form: the Gather replaces the Tile (tile-broadcast finds none left)."""
    r, applied = rewritten(gqa("tile"), compile_rewrites_for("2.5.0"))
    assert applied.get("kv-repeat-gather") == 2 and "tile-broadcast" not in applied
    assert "Tile" not in {n.op_type for n in r.graph.node}


def test_large_constants_without_data_are_not_read() -> None:
    """The partitioner's rewrite probe holds large constants as placeholders without data; reading one raised and
    the probe then rescued nothing (a Lumina2 partition sent the caption refiner's IsNaN, which nan-guard removes,
    to the host and cut its attention in two)."""
    m = gqa("ones")
    big = onnx.TensorProto(name="w", dims=[64, 16, 6, 8], data_type=F)
    big.data_location = onnx.TensorProto.EXTERNAL
    entry = big.external_data.add()
    entry.key, entry.value = "location", "rkpart-capability-probe-placeholder"
    m.graph.initializer.append(big)
    m.graph.node.append(helper.make_node("Mul", ["xh", "w"], ["xw"]))
    m.graph.output.append(helper.make_tensor_value_info("xw", F, [64, 16, 6, 8]))
    _, applied = rewritten(m, GATHER)
    assert applied == {"kv-repeat-gather": 2}


@pytest.mark.parametrize(("kv", "merged"), [(2, False), (1, True)])
def test_a_repeat_read_unmerged_or_of_one_head_is_left_alone(kv: int, merged: bool) -> None:
    """Read without the Reshape that merges the repeats into heads; one key/value head (Stable Audio), which
    expand-broadcast keeps on the NPU."""
    m = gqa("expand", kv=kv, merged=merged)
    r, applied = rewritten(m, GATHER)
    assert applied == {} and list(r.graph.node) == list(m.graph.node)


def linear(heads: int = 4, d: int = 8, tokens: int = 16, pads: tuple[int, int] = (0, 1), value: float = 1.0,
           axis: int = 2) -> onnx.ModelProto:
    """Sana's linear attention: ``(pad(v) @ k^T) @ q``, the last row the normaliser (``axis``: the padded axis of
    ``v [1, H, d, T]``)."""
    h, t = heads, tokens
    pad = [0] * 8
    pad[axis], pad[axis + 4] = pads
    rows = d + sum(pads) if axis == 2 else d
    inits = [_c("pads", pad, np.int64), _c("val", value), _c("r0", [0], np.int64), _c("rd", [d], np.int64),
             _c("ax2", [2], np.int64), _c("eps", 1e-15), _c("rend", [d + 1], np.int64)]
    nodes = [helper.make_node("Relu", ["k"], ["kr"]), helper.make_node("Relu", ["q"], ["qr"]),
             helper.make_node("Pad", ["v", "pads", "val"], ["vp"], mode="constant")]
    if axis == 2:
        nodes += [helper.make_node("MatMul", ["vp", "kr"], ["vk"]), helper.make_node("MatMul", ["vk", "qr"], ["o"]),
                  helper.make_node("Slice", ["o", "r0", "rd", "ax2"], ["num"]),
                  helper.make_node("Slice", ["o", "rd", "rend", "ax2"], ["den"]),
                  helper.make_node("Add", ["den", "eps"], ["den_e"]), helper.make_node("Div", ["num", "den_e"], ["y"])]
        out = [1, h, d, t]
    else:  # padded columns (the reduction axis): not the rows' pattern
        inits.append(_c("kpad", [0, 0, 0, 0, 0, 0, sum(pads), 0], np.int64))
        nodes += [helper.make_node("Pad", ["kr", "kpad"], ["kp"], mode="constant"),
                  helper.make_node("MatMul", ["vp", "kp"], ["y"])]
        out = [1, h, rows, d]
    ins = [helper.make_tensor_value_info("q", F, [1, h, d, t]), helper.make_tensor_value_info("k", F, [1, h, t, d]),
           helper.make_tensor_value_info("v", F, [1, h, d, t])]
    return _model(nodes, ins, out, inits)


@pytest.mark.parametrize(("pads", "value"), [((0, 1), 1.0), ((2, 1), 0.5)])
def test_padded_rows_are_their_own_product_within_the_rewrite_check(pads: tuple[int, int], value: float) -> None:
    """Not bit-exact: ONNX Runtime's GEMM sums a 32-row product in another order than a 33-row one (measured: 4e-8
    on values of 0.3), so the row is ``exact=False`` and held to the prepared-stage check."""
    m = linear(pads=pads, value=value)
    r, applied = rewritten(m, PAD)
    assert applied == {"pad-rows-matmul": 1}
    ops = [n.op_type for n in r.graph.node]
    assert "Pad" not in ops and ops.count("MatMul") == 2 + sum(1 for p in pads if p) and "Concat" in ops
    feeds = _feeds(m)
    (want,), (got,) = run_unoptimised(m, feeds), run_unoptimised(r, feeds)
    assert np.abs(got - want).max() <= REWRITE_GATE.max_abs_rel * np.abs(want).max()
    assert not PAD[0].exact


def test_a_pad_of_the_reduction_axis_is_left_alone() -> None:
    m = linear(axis=3, pads=(0, 1))
    r, applied = rewritten(m, PAD)
    assert applied == {} and list(r.graph.node) == list(m.graph.node)


CHUNKS = tuple(r for r in REWRITES if r.name == "masked-attention-row-chunks")


def masked(tokens: int, *, heads: int = 2, d: int = 8, mask: str = "input", guard: bool = True) -> onnx.ModelProto:
    """``Softmax(q * r @ k * r + Where(mask, 0, -inf)) @ v`` as TorchScript exports SDPA with a bool key mask ``[1,
    1, 1, T]`` (``mask``: ``input``, a graph input; ``const``, a constant; ``r`` the square root of the scale), the
    IsNaN guard after the Softmax."""
    h, t = heads, tokens
    inits = [_c("zero", 0.0), _c("ninf", -np.inf), _c("root", d ** -0.25)]
    ins = [helper.make_tensor_value_info("q", F, [1, h, t, d]), helper.make_tensor_value_info("k", F, [1, h, d, t]),
           helper.make_tensor_value_info("v", F, [1, h, t, d])]
    if mask == "input":
        ins.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, 1, t]))
    else:
        inits.append(_c("mask", (np.arange(t) < t - 3).reshape(1, 1, 1, t), np.bool_))
    nodes = [helper.make_node("Mul", ["q", "root"], ["qs"]), helper.make_node("Mul", ["k", "root"], ["ks"]),
             helper.make_node("MatMul", ["qs", "ks"], ["s"]),
             helper.make_node("Where", ["mask", "zero", "ninf"], ["b"]),
             helper.make_node("Add", ["s", "b"], ["sb"]), helper.make_node("Softmax", ["sb"], ["p0"], axis=-1)]
    if guard:
        nodes += [helper.make_node("IsNaN", ["p0"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p0"], ["p"])]
    else:
        nodes.append(helper.make_node("Identity", ["p0"], ["p"]))
    nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    return _model(nodes, ins, [1, h, t, d], inits)


def _mask_feeds(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = _feeds(m)
    if "mask" in feeds:
        t = feeds["mask"].shape[-1]
        feeds["mask"] = (np.arange(t) < t // 3).reshape(1, 1, 1, t)
    return feeds


@pytest.mark.parametrize("optimised", [False, True])
def test_masked_attention_is_cut_into_row_chunks_bit_for_bit(optimised: bool) -> None:
    """The 2.5.0 set (nan-guard first, its factor after the Softmax carried into every chunk): 600 query rows in
    chunks of 256, 256 and 88, each slice taken above q's scale.  With ONNX Runtime's graph optimisations (what
    ``rkpart compile`` checks with) as without: a slice between the scale and the MatMul kept ORT from fusing the
    scale into the chunks' MatMuls as it does into the original's (Lumina2's main attention: 7.9e-6 of 5.35, the
    rewrite dropped)."""
    m = masked(600)
    r, applied = rewritten(m, compile_rewrites_for("2.5.0"))
    assert applied.get("masked-attention-row-chunks") == 1 and applied.get("nan-guard") == 1
    ops = [n.op_type for n in r.graph.node]
    assert ops.count("Softmax") == 3 and ops.count("Slice") == 3 and "IsNaN" not in ops
    feeds = _mask_feeds(m)
    if optimised:
        want, got = _run_default(m, feeds), _run_default(r, feeds)
    else:
        (want,), (got,) = run_unoptimised(m, feeds), run_unoptimised(r, feeds)
    assert np.array_equal(got, want)


def _run_default(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    return np.asarray(ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds)[0])


@pytest.mark.parametrize(("tokens", "mask"), [(256, "input"), (600, "const")])
def test_short_or_constant_masked_attention_is_left_alone(tokens: int, mask: str) -> None:
    """256 query rows stay on the NPU as they are, a constant mask is fused by 2.5.0."""
    m = masked(tokens, mask=mask, guard=False)
    r, applied = rewritten(m, CHUNKS)
    assert applied == {} and list(r.graph.node) == list(m.graph.node)


@pytest.mark.toolkit
@pytest.mark.slow
def test_real_build_keeps_the_kv_repeat_on_the_npu(tk250: object, tmp_path: Path) -> None:
    """2.5.0, Lumina2's tokens-first repeat at head dim 96 (6 heads over 2, 1024 tokens): the keys' and the values'
    Transposes to heads on the CPU before, nothing after."""
    m = gqa("tile", tokens=1024, d=96)
    before, _ = rewritten(m, tuple(r for r in compile_rewrites_for("2.5.0") if r.name != "kv-repeat-gather"))
    after, applied = rewritten(m, compile_rewrites_for("2.5.0"))
    assert applied.get("kv-repeat-gather") == 2
    cpu = cpu_layers_before_after(before, after, tk250, tmp_path)
    assert [op.split(":")[0] for op in cpu["before"]] == ["Transpose", "Transpose"], cpu
    assert cpu["after"] == (), cpu


def sana_linear(heads: int, d: int, tokens: int, projected: tuple[str, ...] = ("q", "k", "v")) -> onnx.ModelProto:
    """Sana's linear attention as its TorchScript export lays it out: ``q``/``k``/``v`` projected from ``x [1, T,
    H*d]`` (seeded weights; the compiler lays a projection's output out channels-first), channels first per head,
    the value padded with a ones row, ``(v_pad @ relu(k)^T) @ relu(q)``, the last row the normaliser (``projected``:
    the others are graph inputs)."""
    h, t = heads, tokens
    rng = np.random.default_rng(3)
    inits = [_c("hs", [1, h, d, t], np.int64), _c("pads", [0, 0, 0, 0, 0, 0, 1, 0], np.int64), _c("one", 1.0),
             _c("eps", 1e-15), _c("r0", [0], np.int64), _c("rd", [d], np.int64), _c("rend", [d + 1], np.int64),
             _c("ax2", [2], np.int64), _c("out", [1, h * d, t], np.int64)]
    nodes = []
    ins = [helper.make_tensor_value_info("x", F, [1, t, h * d])]
    for name in ("q", "k", "v"):
        if name in projected:
            inits.append(_c(f"w{name}", rng.standard_normal((h * d, h * d)) / np.sqrt(h * d)))
            nodes.append(helper.make_node("MatMul", ["x", f"w{name}"], [name]))
        else:
            ins.append(helper.make_tensor_value_info(name, F, [1, t, h * d]))
        nodes += [helper.make_node("Transpose", [name], [f"{name}_c"], perm=[0, 2, 1]),
                  helper.make_node("Reshape", [f"{name}_c", "hs"], [f"{name}_h"])]
    nodes += [helper.make_node("Transpose", ["k_h"], ["k_t"], perm=[0, 1, 3, 2]),
              helper.make_node("Relu", ["q_h"], ["q_r"]), helper.make_node("Relu", ["k_t"], ["k_r"]),
              helper.make_node("Pad", ["v_h", "pads", "one"], ["v_p"], mode="constant"),
              helper.make_node("MatMul", ["v_p", "k_r"], ["vk"]), helper.make_node("MatMul", ["vk", "q_r"], ["o"]),
              helper.make_node("Slice", ["o", "r0", "rd", "ax2"], ["num"]),
              helper.make_node("Slice", ["o", "rd", "rend", "ax2"], ["den"]),
              helper.make_node("Add", ["den", "eps"], ["den_e"]), helper.make_node("Div", ["num", "den_e"], ["a"]),
              helper.make_node("Reshape", ["a", "out"], ["a_c"]),
              helper.make_node("Transpose", ["a_c"], ["y"], perm=[0, 2, 1])]
    return _model(nodes, ins, [1, t, h * d], inits)


@pytest.mark.toolkit
@pytest.mark.slow
def test_real_build_keeps_the_padded_value_on_the_npu(tk250: object, tmp_path: Path) -> None:
    """2.5.0, Sana's 70 heads of 32, the value projected (q and k read as inputs: the build is a third): the padded
    value's Transpose on the CPU before, nothing after.  Not at 64 heads, nor at 70 heads of 512 tokens (probed)."""
    m = sana_linear(70, 32, SANA_TOKENS, projected=("v",))
    after, applied = rewritten(m, compile_rewrites_for("2.5.0"))
    assert applied.get("pad-rows-matmul") == 1
    cpu = cpu_layers_before_after(m, after, tk250, tmp_path)
    assert [op.split(":")[0] for op in cpu["before"]] == ["Transpose"], cpu
    assert cpu["after"] == (), cpu


@pytest.mark.toolkit
@pytest.mark.slow
def test_real_build_keeps_long_masked_attention_on_the_npu(tk250: object, tmp_path: Path) -> None:
    """2.5.0, a masked attention of 512 query rows (2 heads of 96): the Softmax and the scores' Transposes on the
    CPU before, nothing after (two chunks of 256)."""
    m = masked(512, d=96)
    before, _ = rewritten(m, tuple(r for r in compile_rewrites_for("2.5.0") if r.name != "masked-attention-row-chunks"))
    after, applied = rewritten(m, compile_rewrites_for("2.5.0"))
    assert applied.get("masked-attention-row-chunks") == 1
    cpu = cpu_layers_before_after(before, after, tk250, tmp_path)
    assert "exSoftmax13" in {op.split(":")[0] for op in cpu["before"]}, cpu
    assert cpu["after"] == (), cpu


GUARD = tuple(r for r in REWRITES if r.name in ("nan-guard", "guard-after-product"))


@pytest.mark.parametrize("keys", ["some", "none"])
def test_the_guard_factor_goes_after_the_product_bit_for_bit(keys: str) -> None:
    """2.3.0's set on the masked attention: nan-guard's 0/1 factor (one for every query row: the mask is over the
    keys) multiplies V, not the probabilities; the same values under ONNX Runtime with some keys and with every key
    masked (the factor 0)."""
    m = masked(600)
    r, applied = rewritten(m, compile_rewrites_for("2.3.0"))
    assert applied.get("guard-after-product") == 1 and applied.get("nan-guard") == 1
    assert "masked-attention-row-chunks" not in applied
    last = r.graph.node[-1]
    assert last.op_type == "MatMul" and last.output[0] == "y"
    sm = next(n for n in r.graph.node if n.op_type == "Softmax")
    assert [n.op_type for n in r.graph.node if sm.output[0] in n.input] == ["MatMul"]
    values = next(n for n in r.graph.node if n.output[0] == last.input[1])
    assert values.op_type == "Mul" and "v" in values.input
    feeds = _mask_feeds(m)
    if keys == "none":
        feeds["mask"] = np.zeros_like(feeds["mask"])
    (want,), (got,) = run_unoptimised(m, feeds), run_unoptimised(r, feeds)
    assert np.array_equal(got, want) and (keys == "some" or not got.any())


def test_a_factor_that_is_not_the_guard_stays_before_the_product() -> None:
    """A per-row factor of any value (here a graph input) does not commute with the product's rounding: left alone."""
    m = masked(16, guard=False)
    g = m.graph
    ident = next(n for n in g.node if n.op_type == "Identity")
    ident.op_type = "Mul"
    ident.input.append("f")
    g.input.append(helper.make_tensor_value_info("f", F, [1, 2, 16, 1]))
    r, applied = rewritten(m, GUARD)
    assert applied == {} and list(r.graph.node) == list(m.graph.node)


@pytest.mark.toolkit
@pytest.mark.slow
def test_real_build_2_3_0_keeps_long_masked_attention_on_the_npu(tk230: object, tmp_path: Path) -> None:
    """2.3.0, a masked attention of 512 query rows (2 heads of 96) after nan-guard: the scores' Transpose, the
    Softmax and the probabilities' Transpose on the CPU before, nothing after."""
    before, _ = rewritten(masked(512, d=96), tuple(r for r in compile_rewrites_for("2.3.0")
                                                    if r.name != "guard-after-product"))
    after, applied = rewritten(masked(512, d=96), compile_rewrites_for("2.3.0"))
    assert applied.get("guard-after-product") == 1
    cpu = cpu_layers_before_after(before, after, tk230, tmp_path)
    assert "exSoftmax13" in {op.split(":")[0] for op in cpu["before"]}, cpu
    assert cpu["after"] == (), cpu


def test_a_placeholder_constant_is_no_value_to_any_rewrite() -> None:
    """The partitioner's rewrite probe on Lumina2's caption refiner (2.3.0): norm-residual-sub read a large
    computed constant the probe holds as a placeholder (a Mul feeding an Add), the probe raised and rescued
    nothing, and the partition cut the attention in two around a host IsNaN.  A placeholder has no value: the
    probe runs on and nan-guard rescues the IsNaN."""
    m = masked(16)
    big = onnx.TensorProto(name="w", dims=[1, 2, 16, 8], data_type=F)
    big.data_location = onnx.TensorProto.EXTERNAL
    entry = big.external_data.add()
    entry.key, entry.value = "location", "rkpart-capability-probe-placeholder"
    m.graph.initializer.append(big)
    m.graph.node.extend([helper.make_node("Mul", ["q", "w"], ["qw"]), helper.make_node("Add", ["qw", "q"], ["qa"])])
    m.graph.output.append(helper.make_tensor_value_info("qa", F, [1, 2, 16, 8]))
    _, applied = rewritten(m, tuple(r for r in REWRITES if r.applies_to("2.3.0") and r.kind == "npu"))
    assert applied.get("nan-guard") == 1
