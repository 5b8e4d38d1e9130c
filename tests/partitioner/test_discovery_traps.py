"""Hand-built tiny DiTs that pin down discovery's traps (graphsurgeon-style, onnx.helper).

Every graph is the same two-block DiT; one knob changes one thing::

      x [1,T,D]                      t [1,D]
        |                              |
        |                  /transformer_blocks.0/norm1/emb/MatMul   <- shared by ALL blocks,
        |                            SiLU = c                          named after block 0
        |                              |
        +-----------------+            +--> c@Ws, c@Wc, c@Wg  (per block and branch: shift,
        |                 |            |                       scale, gate)
        |            norm(x)*(1+scale)+shift      norm: LayerNormalization | decomposed | RMS
        |                 |
        |      q,k,v = h@Wq, h@Wk, h@Wv
        |      Softmax(q@k^T) @ v             attention: softmax | linear (ReLU(q)@(ReLU(k)^T@v))
        |                 |@Wo
        +------(+)<--- gate * o               residual 1
        |                 |
        |            norm(x)*(1+scale)+shift
        |      Relu(h@W1) @ W2                ffn: plain | softmax gate (h@W1 * Softmax(h@Wg))
        +------(+)<--- gate * f               residual 2
        |   (x 2 blocks)
      x @ Wout -> out
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.discovery.structure import Discovery, discover
from rkpart.ir import ModelGraph, load_model
from tests.partitioner.checks import npu_per_block, partition_and_check, region_sizes, region_table

T, D = 8, 16


class _G:
    """A tiny graph builder: named nodes, seeded weights."""

    def __init__(self, seed: int = 0) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def w(self, name: str, shape: tuple[int, ...], scale: float = 0.2) -> str:
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal(shape) * scale).astype(np.float32),
                                                  name))
        return name

    def c(self, name: str, value: object, dtype: type = np.float32) -> str:
        self.inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        return name

    def op(self, scope: str, op_type: str, inputs: list[str], **attrs: Any) -> str:
        self.n += 1
        out = f"{scope}/{op_type}_{self.n}_output_0"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{scope}/{op_type}_{self.n}", **attrs))
        return out


def _norm(g: _G, s: str, x: str, kind: str) -> str:
    if kind == "layernorm":
        return g.op(s, "LayerNormalization", [x, g.c(f"{s}.ones", np.ones(D)), g.c(f"{s}.zeros", np.zeros(D))],
                    axis=-1, epsilon=1e-6)
    eps = g.c(f"{s}.eps", 1e-6)
    two = g.c(f"{s}.two", 2.0)
    if kind == "decomposed":
        mean = g.op(s, "ReduceMean", [x], axes=[-1], keepdims=1)
        x = g.op(s, "Sub", [x, mean])
    var = g.op(s, "ReduceMean", [g.op(s, "Pow", [x, two])], axes=[-1], keepdims=1)
    y = g.op(s, "Div", [x, g.op(s, "Sqrt", [g.op(s, "Add", [var, eps])])])
    if kind == "rms":
        y = g.op(s, "Mul", [y, g.w(f"{s}.weight", (D,))])
    return y


def build_dit(path: Path, *, norm: str = "layernorm", attention: str = "softmax", ffn: str = "plain",
              blocks: int = 2, mod: str = "per_block") -> Path:
    """``mod="shared_split"``: one per-token modulation ``[1, T, 6D]`` that every block reads, cut by
    one ``Split`` into each branch's shift, scale and gate (dynamo's one Split of a modulation that
    several blocks read: the shift has the stream's shape and several readers)."""
    g = _G()
    c = g.op("/transformer_blocks.0/norm1/emb", "MatMul", ["t", g.w("emb.w", (D, D))])
    c = g.op("/transformer_blocks.0/norm1/emb", "Mul", [c, g.op("/transformer_blocks.0/norm1/emb", "Sigmoid", [c])])
    x = g.op("/proj_in", "MatMul", ["x", g.w("proj_in.w", (D, D))])
    one = g.c("one", 1.0)
    shared: dict[str, list[str]] = {}
    if mod == "shared_split":
        m = g.op("/mod", "MatMul", [c, g.w("mod.w", (D, 6 * D))])
        m = g.op("/mod", "Expand", [g.op("/mod", "Unsqueeze", [m, g.c("mod.ax", [1], np.int64)]),
                                    g.c("mod.shape", [1, T, 6 * D], np.int64)])
        outs = [f"/mod/Split_{k}" for k in range(6)]
        g.nodes.append(helper.make_node("Split", [m], outs, name="/mod/Split", axis=-1))
        shared = {"attn": outs[:3], "ffn": outs[3:]}
    for k in range(blocks):
        b = f"/transformer_blocks.{k}"

        def modulated(branch: str, x: str, b: str = b) -> tuple[str, str]:
            s = f"{b}/norm_{branch}"
            mods = shared.get(branch) or [
                g.op(s, "Unsqueeze", [g.op(s, "MatMul", [c, g.w(f"{s}.{m}", (D, D))]),
                                      g.c(f"{s}.{m}.ax", [1], np.int64)]) for m in ("shift", "scale", "gate")]
            h = g.op(s, "Add", [g.op(s, "Mul", [_norm(g, s, x, norm), g.op(s, "Add", [mods[1], one])]), mods[0]])
            return h, mods[2]

        h, gate = modulated("attn", x)
        a = f"{b}/attn"
        q, kk, v = (g.op(a, "MatMul", [h, g.w(f"{a}.{n}", (D, D))]) for n in ("q", "k", "v"))
        if attention == "softmax":
            sc = g.op(a, "MatMul", [q, g.op(a, "Transpose", [kk], perm=[0, 2, 1])])
            o = g.op(a, "MatMul", [g.op(a, "Softmax", [g.op(a, "Mul", [sc, g.c(f"{a}.scale", 0.25)])], axis=-1), v])
        else:  # linear attention: ReLU kernels, no Softmax
            kv = g.op(a, "MatMul", [g.op(a, "Transpose", [g.op(a, "Relu", [kk])], perm=[0, 2, 1]), v])
            o = g.op(a, "MatMul", [g.op(a, "Relu", [q]), kv])
        o = g.op(a, "MatMul", [o, g.w(f"{a}.o", (D, D))])
        x = g.op(b, "Add", [x, g.op(b, "Mul", [gate, o])])

        h, gate = modulated("ffn", x)
        f = f"{b}/ff"
        u = g.op(f, "MatMul", [h, g.w(f"{f}.w1", (D, 2 * D))])
        if ffn == "softmax_gate":  # a Softmax that is not attention: a gate over the hidden units
            u = g.op(f, "Mul", [u, g.op(f, "Softmax", [g.op(f, "MatMul", [h, g.w(f"{f}.wg", (D, 2 * D))])],
                                        axis=-1)])
        else:
            u = g.op(f, "Relu", [u])
        o = g.op(f, "MatMul", [u, g.w(f"{f}.w2", (2 * D, D))])
        x = g.op(b, "Add", [x, g.op(b, "Mul", [gate, o])])
    g.nodes.append(helper.make_node("MatMul", [x, g.w("proj_out.w", (D, D))], ["out"], name="/proj_out/MatMul"))
    graph = helper.make_graph(
        g.nodes, "tiny_dit",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D]),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, D])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, T, D])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _discover(path: Path) -> tuple[ModelGraph, Discovery]:
    mg = load_model(path)
    return mg, discover(mg)


def _types(mg: ModelGraph, ops: frozenset[int]) -> set[str]:
    return {mg.nodes[i].op_type for i in ops}


def test_softmax_gate_in_ffn_is_not_attention(tmp_path: Path) -> None:
    mg, d = _discover(build_dit(tmp_path / "m.onnx", ffn="softmax_gate"))
    assert region_table(mg, d) == [("attn:self_attention:adaln", "ffn:ffn:adaln")] * 2
    assert all("Softmax" in _types(mg, b.regions[1].core) for b in d.blocks)
    partition_and_check(tmp_path / "m.onnx", tmp_path / "plan", "split")


def test_linear_attention_without_softmax_is_attention(tmp_path: Path) -> None:
    model = build_dit(tmp_path / "m.onnx", attention="linear")
    mg, d = _discover(model)
    assert "Softmax" not in {n.op_type for n in mg.nodes}
    assert region_table(mg, d) == [("attn:self_attention:adaln", "ffn:ffn:adaln")] * 2
    plan = partition_and_check(model, tmp_path / "plan", "split")
    assert npu_per_block(plan) == {0: 2, 1: 2}


def test_shared_computation_named_after_block0_is_prologue(tmp_path: Path) -> None:
    model = build_dit(tmp_path / "m.onnx")
    mg, d = _discover(model)
    assert d.method == "names"
    emb = {i for i in mg.ops.nodes if mg.nodes[i].name.startswith("/transformer_blocks.0/norm1/emb/")}
    assert len(emb) == 3 and emb <= d.prologue
    assert not emb & d.blocks[0].ops
    # and the per-block modulation projections are that block's own
    for b in d.blocks:
        mods = frozenset().union(b.mod, *(r.mod for r in b.regions))
        assert {mg.nodes[i].name.split("/")[1] for i in mods} == {f"transformer_blocks.{b.index}"}
    plan = partition_and_check(model, tmp_path / "plan", "fused")
    assert npu_per_block(plan) == {0: 1, 1: 1}


def test_layernorm_op_and_decomposed_give_same_regions(tmp_path: Path) -> None:
    mg1, d1 = _discover(build_dit(tmp_path / "ln.onnx", norm="layernorm"))
    mg2, d2 = _discover(build_dit(tmp_path / "dec.onnx", norm="decomposed"))
    assert region_table(mg1, d1) == region_table(mg2, d2) == [("attn:self_attention:adaln", "ffn:ffn:adaln")] * 2
    # the whole decomposition is AdaLN (pre); core, gate and modulation are identical
    # (1 + scale) depends on the timestep only: modulation, not AdaLN
    ln_pre = 1 + 2  # LayerNormalization + Mul scale, Add shift
    dec_pre = 7 + 2  # ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div + the same two
    assert [[len(r.pre) for r in b.regions] for b in d1.blocks] == [[ln_pre] * 2] * 2
    assert [[len(r.pre) for r in b.regions] for b in d2.blocks] == [[dec_pre] * 2] * 2
    strip = [[s[1:] for s in blk] for blk in region_sizes(d1)]
    assert strip == [[s[1:] for s in blk] for blk in region_sizes(d2)]
    for m in ("ln", "dec"):
        plan = partition_and_check(tmp_path / f"{m}.onnx", tmp_path / f"plan_{m}", "split", adaln="npu")
        assert npu_per_block(plan) == {0: 2, 1: 2}


def test_rmsnorm_decomposed_is_adaln(tmp_path: Path) -> None:
    model = build_dit(tmp_path / "m.onnx", norm="rms")
    mg, d = _discover(model)
    assert region_table(mg, d) == [("attn:self_attention:adaln", "ffn:ffn:adaln")] * 2
    for b in d.blocks:
        for r in b.regions:
            assert {"Pow", "ReduceMean", "Sqrt", "Div"} <= _types(mg, r.pre)
            assert "Sub" not in _types(mg, r.pre)
    partition_and_check(model, tmp_path / "plan", "split")


@pytest.mark.parametrize("knob", [{"norm": "rms", "attention": "linear"}, {"ffn": "softmax_gate"}])
def test_traps_anonymized_same_regions(tmp_path: Path, knob: dict[str, str]) -> None:
    from rkpart.plan.anonymize import anonymize_file

    model = build_dit(tmp_path / "m.onnx", blocks=3, **knob)
    mg, d = _discover(model)
    mg2, d2 = _discover(anonymize_file(model, tmp_path / "anon.onnx"))
    assert d2.method == "structure" and len(d2.blocks) == 3
    assert region_table(mg, d) == region_table(mg2, d2)
    assert [b.ops for b in d.blocks] == [b.ops for b in d2.blocks]
    assert d.prologue == d2.prologue


def test_adaln_shift_from_a_shared_split_is_no_residual(tmp_path: Path) -> None:
    """``norm(x) * (1 + scale) + shift`` with shift and scale outputs of one Split: the Split is an
    ancestor of the Mul, the shift tensor is not -- no residual add (was: each AdaLN read as a
    residual of its own stream, the blocks cut into 'branch' regions)."""
    from rkpart.plan.anonymize import anonymize_file

    model = build_dit(tmp_path / "m.onnx", mod="shared_split")
    mg, d = _discover(model)
    assert region_table(mg, d) == [("attn:self_attention:adaln", "ffn:ffn:adaln")] * 2
    assert d.streams == 1
    split = next(i for i in mg.ops.nodes if mg.nodes[i].op_type == "Split")
    assert split in d.prologue  # every block reads it
    mg2, d2 = _discover(anonymize_file(model, tmp_path / "anon.onnx"))
    assert d2.method == "structure" and region_table(mg2, d2) == region_table(mg, d)
    partition_and_check(model, tmp_path / "plan", "split")
