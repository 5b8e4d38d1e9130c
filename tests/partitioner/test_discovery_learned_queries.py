"""A stream that starts at learned queries (a Perceiver resampler) is found from its first unit.

Bria-Fibo 2's Perceiver squeezes the text into gist tokens: ``gist = latents + xattn(norm(latents),
text)``, then self-attention and an FFN on ``gist``, layer after layer.  The latents are a weight,
and their norm and query projection fold to a constant at load, so layer 0's residual add is
``Add(constant, xattn(...))``: no skip tensor any op computes.  Discovery reads it as the stream's
first unit when its branch is an attention whose score product has a constant operand laid out
like activations (rank 3 or more) and feeds only that add.  A position embedding added to the
patch projection (a constant of the stream's shape too) has no such product: no unit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rkpart.discovery.structure import discover
from rkpart.ir import load_model
from rkpart.plan.anonymize import anonymize_file
from tests.partitioner.checks import partition_and_check, region_table
from tests.partitioner.test_discovery_traps import _G

T, L, D = 8, 4, 16


def _attend(g: _G, s: str, q: str, kv: str) -> str:
    """softmax(q k^T / 4) v @ Wo, k and v projected from ``kv``; ``q`` as given."""
    k = g.op(s, "MatMul", [kv, g.w(f"{s}.k", (D, D))])
    v = g.op(s, "MatMul", [kv, g.w(f"{s}.v", (D, D))])
    sc = g.op(s, "MatMul", [q, g.op(s, "Transpose", [k], perm=[0, 2, 1])])
    p = g.op(s, "Softmax", [g.op(s, "Mul", [sc, g.c(f"{s}.scale", 0.25)])], axis=-1)
    return g.op(s, "MatMul", [g.op(s, "MatMul", [p, v]), g.w(f"{s}.o", (D, D))])


def _ln(g: _G, s: str, x: str) -> str:
    return g.op(s, "LayerNormalization", [x, g.c(f"{s}.ones", np.ones(D)), g.c(f"{s}.zeros", np.zeros(D))],
                axis=-1, epsilon=1e-6)


def _ffn(g: _G, s: str, x: str) -> str:
    h = g.op(s, "Relu", [g.op(s, "MatMul", [_ln(g, f"{s}/norm", x), g.w(f"{s}.w1", (D, 2 * D))])])
    return g.op(s, "MatMul", [h, g.w(f"{s}.w2", (2 * D, D))])


def perceiver(path: Path, layers: int = 2) -> Path:
    """``layers`` Perceiver layers over the text ``x`` [1, T, D]: cross-attention from the gist
    tokens, self-attention, FFN, each a residual unit; layer 0's queries are the folded constant."""
    g = _G(seed=3)
    text = g.op("/text_proj", "MatMul", ["x", g.w("text_proj.w", (D, D))])
    latents = g.w("latents", (1, L, D), scale=1.0)
    gist = latents
    for k in range(layers):
        s = f"/perceiver/layers.{k}"
        # layer 0: norm(latents) @ Wq is a constant (what the loader folds it to, written as such here)
        q = g.w(f"{s}.q0", (1, L, D)) if k == 0 else g.op(f"{s}/xattn", "MatMul",
                                                            [_ln(g, f"{s}/xnorm", gist), g.w(f"{s}.q", (D, D))])
        gist = g.op(s, "Add", [gist, _attend(g, f"{s}/xattn", q, text)])
        h = _ln(g, f"{s}/anorm", gist)
        gist = g.op(s, "Add", [gist, _attend(g, f"{s}/attn", g.op(f"{s}/attn", "MatMul",
                                                                   [h, g.w(f"{s}.aq", (D, D))]), h)])
        gist = g.op(s, "Add", [gist, _ffn(g, f"{s}/ffn", gist)])
    g.nodes.append(helper.make_node("MatMul", [gist, g.w("out.w", (D, D))], ["out"], name="/out/MatMul"))
    graph = helper.make_graph(g.nodes, "perceiver", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, L, D])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def pos_embedded(path: Path, blocks: int = 2) -> Path:
    """Self-attention blocks over ``proj(x) + pos`` (``pos`` a constant of the stream's shape)."""
    g = _G(seed=4)
    x = g.op("/pos_embed", "Add", [g.op("/proj_in", "MatMul", ["x", g.w("proj_in.w", (D, D))]),
                                   g.w("pos", (1, T, D), scale=1.0)])
    for k in range(blocks):
        s = f"/blocks.{k}"
        h = _ln(g, f"{s}/norm", x)
        x = g.op(s, "Add", [x, _attend(g, f"{s}/attn", g.op(f"{s}/attn", "MatMul", [h, g.w(f"{s}.q", (D, D))]), h)])
        x = g.op(s, "Add", [x, _ffn(g, f"{s}/ffn", x)])
    g.nodes.append(helper.make_node("MatMul", [x, g.w("out.w", (D, D))], ["out"], name="/out/MatMul"))
    graph = helper.make_graph(g.nodes, "pos", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, T, D])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("anon", [False, True], ids=["named", "anonymised"])
def test_the_first_perceiver_layer_is_a_block_with_its_cross_attention(anon: bool, tmp_path: Path) -> None:
    model = perceiver(tmp_path / "p.onnx", layers=3)
    if anon:
        model = anonymize_file(model, tmp_path / "anon.onnx")
    mg = load_model(model)
    d = discover(mg)
    assert d.method == ("structure" if anon else "names")
    kinds = [tuple(r.split(":")[1] for r in b) for b in region_table(mg, d)]
    assert kinds == [("cross_attention", "self_attention", "ffn")] * 3
    # layer 0's score product (constant queries) is in its block, not in the prologue
    first = d.blocks[0].ops
    scores = [i for i in mg.ops.nodes if mg.op(i).op_type == "MatMul"
              and any(mg.is_const_tensor(t) and len(mg.shape(t) or ()) == 3 for t in mg.op(i).inputs)]
    assert scores and set(scores) <= first and not set(scores) & d.prologue
    partition_and_check(model, tmp_path / "plan", "split")


def test_a_position_embedding_added_to_the_stream_is_no_unit(tmp_path: Path) -> None:
    mg = load_model(pos_embedded(tmp_path / "m.onnx"))
    d = discover(mg)
    kinds = [tuple(r.split(":")[1] for r in b) for b in region_table(mg, d)]
    assert kinds == [("self_attention", "ffn")] * 2
    add = next(i for i in mg.ops.nodes if mg.op(i).name == "/pos_embed/Add_2")
    assert add in d.prologue
