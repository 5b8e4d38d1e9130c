"""The rewrite table's output is byte-identical to the recorded one on a fixed set of graphs.

``data/rewrite_golden.json`` holds, per graph, toolkit and kind, the sha256 of the rewritten
model (deterministic serialisation) and the hits :func:`apply_rewrites` reports.  It was
generated from main before the rewrites moved onto :class:`rkpart.ir.edit.GraphEdit`
(``python -m tests.targets.test_rewrite_golden`` rewrites it; only do that for an intended change).
The graphs are the rewrite tests' own (every row of the table matches at least one) and the
reduced crash reproducers (``segv_*``: 2.5.0; ``fail_*``: 2.3.0 optimiser failures).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.rewrites import apply_rewrites, rewrites_for
from tests.targets import test_head_layouts as head_layouts

DATA = Path(__file__).parent / "data"
REPRO_DATA = Path(__file__).resolve().parents[2] / "rkpart" / "data" / "known_issues"
GOLDEN = DATA / "rewrite_golden.json"
TOOLKITS = ("2.3.0", "2.3.2", "2.5.0")
F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _model(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _g(nodes: list[onnx.NodeProto], ins: list[onnx.ValueInfoProto], outs: list[onnx.ValueInfoProto],
       inits: list[onnx.TensorProto]) -> onnx.GraphProto:
    return helper.make_graph(nodes, "g", ins, outs, initializer=inits)


def interleave_indices(full: bool) -> tuple[list[int], list[int], np.ndarray, np.ndarray]:
    """(shape, half shape, even indices, odd indices) of ``out[..., 0::2] = a; out[..., 1::2] = b``
    as the TorchScript exporter (``full`` index) and dynamo (index depth 1 along axis 0) write it."""
    if full:
        shape, half = [1, 4, 2, 16], [1, 4, 2, 8]
        grid = np.stack(np.meshgrid(*[np.arange(n) for n in half], indexing="ij"), axis=-1)
        i0, i1 = grid.copy(), grid.copy()
        i0[..., 3] *= 2
        i1[..., 3] = i1[..., 3] * 2 + 1
    else:
        shape, half = [16, 4, 2, 1], [8, 4, 2, 1]
        i0 = (np.arange(8) * 2)[:, None]
        i1 = (np.arange(8) * 2 + 1)[:, None]
    return shape, half, i0, i1


def _scatternd(full: bool) -> onnx.GraphProto:
    shape, half, i0, i1 = interleave_indices(full)
    inits = [numpy_helper.from_array(np.arange(math.prod(shape), dtype=np.float32).reshape(shape), "d"),
             numpy_helper.from_array(i0.astype(np.int64), "i0"), numpy_helper.from_array(i1.astype(np.int64), "i1")]
    nodes = [helper.make_node("ScatterND", ["d", "i0", "a"], ["s0"]),
             helper.make_node("Identity", ["s0"], ["s0i"]),
             helper.make_node("ScatterND", ["s0i", "i1", "b"], ["s1"]),
             helper.make_node("Relu", ["s1"], ["y"]),
             helper.make_node("Neg", ["s0"], ["z"])]
    return _g(nodes, [vi("a", F, half), vi("b", F, half)], [vi("y", F, shape), vi("z", F, shape)], inits)


def pad_graph() -> onnx.GraphProto:
    """Sana's ``F.pad(v, (0, 0, 0, 1), value=1.0)``, pads computed from constants (folded), and a two-axis pad."""
    nodes = [
        helper.make_node("Constant", [], ["p64"], value=numpy_helper.from_array(
            np.array([0, 0, 0, 0, 0, 0, 1, 0], dtype=np.int64))),
        helper.make_node("Cast", ["p64"], ["pads"], to=TensorProto.INT64),
        helper.make_node("Pad", ["x", "pads", "one"], ["y"], mode="constant"),
        helper.make_node("Pad", ["x", "pads2"], ["z"]),
    ]
    inits = [numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
             numpy_helper.from_array(np.array([0, 1, 0, 2, 0, 0, 3, 0], dtype=np.int64), "pads2")]
    return _g(nodes, [vi("x", F, [1, 2, 16, 8])], [vi("y", F, [1, 2, 17, 8]), vi("z", F, [1, 3, 19, 10])], inits)


def _rms_reciprocal() -> onnx.GraphProto:
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "ax"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["v"]),
             helper.make_node("Sqrt", ["v"], ["r"]),
             helper.make_node("Reciprocal", ["r"], ["inv"]),
             helper.make_node("Mul", ["x", "inv"], ["y"])]
    inits = [numpy_helper.from_array(np.array([-1], dtype=np.int64), "ax"),
             numpy_helper.from_array(np.array(1e-6, dtype=np.float32), "eps")]
    return _g(nodes, [vi("x", F, [1, 2, 6, 16])], [vi("y", F, [1, 2, 6, 16])], inits)


def _normaliser_product() -> onnx.GraphProto:
    """Sana-Video's linear attention: a (1,2,16,32) times Reciprocal(s + eps), s (1,2,1,32)."""
    nodes = [helper.make_node("Add", ["s", "eps"], ["d"]),
             helper.make_node("Reciprocal", ["d"], ["inv"]),
             helper.make_node("Mul", ["a", "inv"], ["y"])]
    inits = [numpy_helper.from_array(np.array(1e-15, dtype=np.float32), "eps")]
    return _g(nodes, [vi("a", F, [1, 2, 16, 32]), vi("s", F, [1, 2, 1, 32])], [vi("y", F, [1, 2, 16, 32])], inits)


def _gqa_expand() -> onnx.GraphProto:
    """dynamo's GQA repeat (Stable Audio): k (1,1,6,16) -> Unsqueeze(2) -> Expand (1,1,2,1,1) -> Reshape."""
    nodes = [helper.make_node("Unsqueeze", ["k", "ax"], ["u"]),
             helper.make_node("Expand", ["u", "sh"], ["e"]),
             helper.make_node("Reshape", ["e", "rs"], ["y"])]
    inits = [numpy_helper.from_array(np.array([2], dtype=np.int64), "ax"),
             numpy_helper.from_array(np.array([1, 1, 2, 1, 1], dtype=np.int64), "sh"),
             numpy_helper.from_array(np.array([1, 2, 6, 16], dtype=np.int64), "rs")]
    return _g(nodes, [vi("k", F, [1, 1, 6, 16])], [vi("y", F, [1, 2, 6, 16])], inits)


def _rope_pair_matrix() -> onnx.ModelProto:
    from tests.targets.test_rope_pair_matrix import _rope

    return _rope()


def _rope_pair_matrix_computed() -> onnx.ModelProto:
    from tests.targets.test_rope_pair_matrix import _rope

    return _rope(computed=True)


def _gelu_grid() -> onnx.GraphProto:
    return _g([helper.make_node("Gelu", ["x"], ["g"], approximate="none"),
               helper.make_node("Gelu", ["g"], ["y"], approximate="tanh"),
               helper.make_node("GridSample", ["im", "gr"], ["s"], mode="linear", align_corners=0)],
              [vi("x", F, [2, 8, 16]), vi("im", F, [1, 2, 5, 5]), vi("gr", F, [1, 4, 4, 2])],
              [vi("y", F, [2, 8, 16]), vi("s", F, [1, 2, 4, 4])], [])


def _tile(n_rep: int, head: int) -> onnx.GraphProto:
    reps = numpy_helper.from_array(np.array([1, 1, 1, n_rep, 1], dtype=np.int64), "reps")
    return _g([helper.make_node("Tile", ["k", "reps"], ["y"])], [vi("k", F, [1, 6, 1, head, 16])],
              [vi("y", F, None)], [reps])


def _slices_concat(starts: list[int], length: int, n: int = 32) -> onnx.GraphProto:
    c = numpy_helper.from_array
    nodes, inits, outs = [], [], []
    for j, s in enumerate(starts):
        inits += [c(np.array([s], np.int64), f"s{j}"), c(np.array([s + length], np.int64), f"e{j}")]
        nodes.append(helper.make_node("Slice", ["x", f"s{j}", f"e{j}", "ax"], [f"p{j}"]))
        outs.append(f"p{j}")
    inits.append(c(np.array([1], np.int64), "ax"))
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=1))
    return _g(nodes, [vi("x", F, [1, n])], [vi("y", F, None)], inits)


def cases() -> dict[str, Callable[[], onnx.ModelProto]]:
    """name -> a builder of a fresh model (every row of the table matches in at least one)."""
    from tests.compile.test_rewrites_npu import adaln_block, ffn_f16, rms_residual, sdpa_bool_mask
    from tests.targets.test_bfloat16_widen import attention
    from tests.targets.test_crash_rewrites import concats_of_a_state
    from tests.targets.test_heads_table_layout import _flux_rope, cosmos_rope
    from tests.targets.test_reduce_sum_matmul import _linear_attention_sum
    from tests.targets.test_rms_norm_contiguous import listed_weight
    from tests.targets.test_rope_halves import _rope
    from tests.targets.test_rope_interleaved_matmul import _attention as _interleaved
    from tests.targets.test_slice_assign_concat import cogview_qk
    from tests.targets.test_slice_reverse import _slice
    from tests.targets.test_wide_matmul_columns import single_block

    out: dict[str, Callable[[], onnx.ModelProto]] = {
        "ffn_f16": lambda: _model(ffn_f16(), 17),
        "ffn_f32": lambda: _model(ffn_f16(h=np.float32), 17),
        "adaln_slices": lambda: _model(adaln_block(False), 17),
        "adaln_split": lambda: _model(adaln_block(True), 18),
        "adaln_unsqueezed": lambda: _model(adaln_block(False, unsqueezed=True), 17),
        "sdpa_inf": lambda: _model(sdpa_bool_mask(), 17),
        "sdpa_lowest": lambda: _model(sdpa_bool_mask(float(np.finfo(np.float32).min)), 17),
        "sdpa_f16_pad_mask": lambda: _model(sdpa_bool_mask(dtype=TensorProto.FLOAT16, mask_rows=1), 17),
        "rms_residual": lambda: _model(rms_residual(), 17),
        "rms_reciprocal": lambda: _model(_rms_reciprocal(), 18),
        "normaliser_product": lambda: _model(_normaliser_product(), 17),
        "gqa_expand": lambda: _model(_gqa_expand(), 18),
        "rope_pair_matrix": _rope_pair_matrix,
        "rope_pair_matrix_computed": _rope_pair_matrix_computed,
        "scatternd_full": lambda: _model(_scatternd(True), 18),
        "scatternd_partial": lambda: _model(_scatternd(False), 18),
        "pad": lambda: _model(pad_graph(), 19),
        "gelu_grid20": lambda: _model(_gelu_grid(), 20),
        "tile_2": lambda: _model(_tile(2, 1), 17),
        "tile_no": lambda: _model(_tile(2, 2), 17),
        "slices_concat": lambda: _model(_slices_concat([6, 18], 6), 17),
        "slices_concat_off": lambda: _model(_slices_concat([20, 26], 4), 17),
        "rope_heads_table": _flux_rope,
        "rope_per_head_table": lambda: _flux_rope(per_head=True),
        "rope_halves_unbind": lambda: _rope("unbind"),
        "rope_halves_slice": lambda: _rope("slice"),
        "rope_interleaved_d88": lambda: _interleaved(88),
        "bf16_attention": lambda: attention(weights=True),
        "reduce_sum_dropped": lambda: _linear_attention_sum(0),
        "reduce_sum_kept": lambda: _linear_attention_sum(1),
        "concat_state": lambda: concats_of_a_state(5, 3),
        "flip_chunks": lambda: _slice([1, 2, 2, 16, 16], [-1], [-(2**63) + 1], [2], [-1]),
        "flip_partial": lambda: _slice([1, 4, 6, 8], [0, -1], [3, -(2**63) + 1], [1, 3], [1, -2]),
        "rms_listed_weight": listed_weight,
        "rms_listed_weight_reciprocal": lambda: listed_weight("reciprocal"),
        "gqa_tile_repeat": lambda: head_layouts.gqa("tile"),
        "linear_pad_rows": head_layouts.linear,
        "masked_attention_rows": lambda: head_layouts.masked(600),
        "rope_computed_tables": cosmos_rope,
        "rope_slice_assign": cogview_qk,
        "wide_projection_pieces": lambda: single_block(width=1, tokens=2),
    }
    # the reduced crash graphs: the known-issue table's reproducers (rkpart/data/known_issues) and ours
    for f in sorted([*REPRO_DATA.glob("segv_*.onnx"), *DATA.glob("fail_*.onnx")], key=lambda f: f.name):
        out[f.stem] = lambda f=f: onnx.load(str(f))
    return out


def _digest(m: onnx.ModelProto) -> str:
    return hashlib.sha256(m.SerializeToString(deterministic=True)).hexdigest()


def rewritten() -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, make in sorted(cases().items()):
        for tk in TOOLKITS:
            for kind in ("lower", "npu"):
                m = make()
                done = apply_rewrites(m, rewrites_for(tk, kind))
                out[f"{name}/{tk}/{kind}"] = {"sha256": _digest(m), "hits": done}
    return out


def test_rewrites_are_byte_identical_to_the_golden() -> None:
    golden = json.loads(GOLDEN.read_text())
    got = rewritten()
    assert sorted(got) == sorted(golden)
    # every row of the table is exercised by some graph (else the golden proves nothing about it)
    from rkpart.targets.rewrites import REWRITES

    hit = {r for v in golden.values() for r in v["hits"]}  # type: ignore[attr-defined]
    assert hit == {r.name for r in REWRITES}, sorted({r.name for r in REWRITES} - hit)
    diff = [k for k in golden if got[k] != golden[k]]
    assert not diff, diff


def _placeholders(m: onnx.ModelProto, above: int) -> int:
    """Every initializer of more than ``above`` elements made a placeholder whose data is not loaded,
    as the partitioner's rewrite probe holds large constants (rkpart.grouping.capability._probe_value)."""
    n = 0
    for t in m.graph.initializer:
        if int(np.prod(t.dims)) > above:
            dims, dtype, name = list(t.dims), t.data_type, t.name
            t.Clear()
            t.name, t.data_type = name, dtype
            t.dims.extend(dims)
            t.data_location = TensorProto.EXTERNAL
            entry = t.external_data.add()
            entry.key, entry.value = "location", "rkpart-capability-probe-placeholder"
            n += 1
    return n


@pytest.mark.slow  # every case x toolkit x threshold: ~1 s
def test_no_rewrite_reads_a_constant_whose_data_is_not_loaded() -> None:
    """The rewrite probe gives large constants by type and shape only: a rewrite that reads one must
    see it as unknown and not match (raising ended the probe for every rewrite of the stage, so it
    rescued nothing)."""
    held = 0
    for name, make in sorted(cases().items()):
        for above in (1, 64):
            for tk in TOOLKITS:
                m = make()
                held += _placeholders(m, above)
                try:
                    apply_rewrites(m, rewrites_for(tk, "npu"))
                except Exception as e:  # which rewrite raised, on which case, is the finding
                    raise AssertionError(f"{name} ({tk}, constants over {above} elements not loaded): "
                                         f"{type(e).__name__}: {e}") from e
    assert held > 100  # the cases do hold such constants


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.targets.test_rewrite_golden --write")
    GOLDEN.write_text(json.dumps(rewritten(), indent=1, sort_keys=True) + "\n")
