"""``slice-assign-concat`` and the heads layout of CogView4's attention.

CogView4 rotates the image tokens of q and k alone and writes them back into the heads tensor,
``q[:, :, text:, :] = apply_rotary_emb(q[:, :, text:, :], ...)``, after a per-head LayerNorm.  TorchScript exports the
assignment as a ``ScatterND`` whose indices (``[1, H, T - text, d, 4]``, 134 MB of int64 at the real width) are
computed in the graph from one ``arange`` per axis.  The capability table puts ``ScatterND`` on the CPU, so the
partitioner cut the attention around it; the first stage's heads-layout outputs then ran their Transposes on the CPU
(docs/real-width.md).  Checked here under ONNX Runtime (graph optimisations off): the ``Concat`` form and the tokens
layout give the same bits; the partitioner's probe sees the indices as the ops that compute them and keeps the
``ScatterND`` in the NPU stage; a probe-sized 2.5.0 build places every layer on the NPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.rewrites import REWRITES
from tests.targets.rewrite_check import rewritten, run_unoptimised

SCATTER = tuple(r for r in REWRITES if r.name == "slice-assign-concat")
#: the heads layout's row per toolkit (2.3.x moves computed tables only)
MOVE = {"2.5.0": "heads-table-layout", "2.3.0": "computed-table-layout"}
LAYOUT = {tk: tuple(r for r in REWRITES if r.name in ("slice-assign-concat", name)) for tk, name in MOVE.items()}
F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def cogview_qk(heads: int = 2, tokens: int = 20, dim: int = 8, text: int = 4, *, indices: str = "computed",
               step: int = 1, reduction: str = "none") -> onnx.ModelProto:
    """CogView4's q path as its real-width TorchScript stage holds it: ``x [1, T, H*d]`` projected (seeded weight and
    bias), split into heads ``[1, H, T, d]``, LayerNorm over the head dim, then the rotate-half RoPE of the tokens
    from ``text`` on (tables ``Cos``/``Sin`` of a constant grid), written back by ``ScatterND`` (``indices``:
    ``computed`` as the export does, ``Concat(Unsqueeze(Expand(arange_k, S), -1))``; ``constant``: the meshgrid as an
    initializer), the attention's scale and the attention over ``k``, ``v`` graph inputs, back to ``[1, T, H*d]``.
    ``step`` 2 writes every other token (no slice), ``reduction`` the ScatterND's."""
    h, t, d = heads, tokens, dim
    n_img = len(range(text, t, step))
    img = [1, h, n_img, d]
    rng = np.random.default_rng(7)
    ang = rng.uniform(0, 3, size=(n_img, d // 2)).astype(np.float32)
    c = numpy_helper.from_array
    inits = [c((0.05 * rng.standard_normal((h * d, h * d))).astype(np.float32), "w"),
             c((0.05 * rng.standard_normal(h * d)).astype(np.float32), "b"),
             c(np.array([1, t, h, d], np.int64), "hs"), c((1 + 0.1 * rng.standard_normal(d)).astype(np.float32), "nw"),
             c((0.1 * rng.standard_normal(d)).astype(np.float32), "nb"),
             c(np.array([text], np.int64), "from"), c(np.array([np.iinfo(np.int64).max], np.int64), "to"),
             c(np.array([2], np.int64), "ax2"), c(np.array([step], np.int64), "step"),
             c(np.concatenate([ang, ang], axis=-1), "ang"), c(np.array([0, 1], np.int64), "01"),
             c(np.array([1, h, n_img, 2, d // 2], np.int64), "halves"), c(np.array([1, 1], np.int64), "sizes"),
             c(np.array([-2], np.int64), "axm2"), c(np.array(img, np.int64), "img"),
             c(np.array([-1], np.int64), "last"), c(np.array([0.3], np.float32), "scale"),
             c(np.array([1, t, h * d], np.int64), "out")]
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "w"], ["xw"], name="to_q"), mk("Add", ["b", "xw"], ["xb"], name="to_q_bias"),
             mk("Reshape", ["xb", "hs"], ["xh"], name="heads"),
             mk("Transpose", ["xh"], ["q0"], perm=[0, 2, 1, 3], name="T"),
             mk("LayerNormalization", ["q0", "nw", "nb"], ["qn"], axis=-1, epsilon=1e-5, name="norm_q"),
             mk("Cast", ["qn"], ["q"], to=F, name="cast"),
             mk("Slice", ["q", "from", "to", "ax2", "step"], ["qi"], name="image_tokens"),
             mk("Cos", ["ang"], ["cos0"], name="cos0"), mk("Sin", ["ang"], ["sin0"], name="sin0"),
             mk("Unsqueeze", ["cos0", "01"], ["cos"], name="cos"), mk("Unsqueeze", ["sin0", "01"], ["sin"], name="sin"),
             mk("Reshape", ["qi", "halves"], ["qr"], name="halves"),
             mk("Split", ["qr", "sizes"], ["x1", "x2"], axis=-2, name="split"),
             mk("Squeeze", ["x1", "axm2"], ["s1"], name="sq1"), mk("Squeeze", ["x2", "axm2"], ["s2"], name="sq2"),
             mk("Neg", ["s2"], ["n2"], name="neg"), mk("Concat", ["n2", "s1"], ["rot"], axis=-1, name="rot"),
             mk("Mul", ["qi", "cos"], ["qc"], name="mul_cos"), mk("Mul", ["rot", "sin"], ["rs"], name="mul_sin"),
             mk("Add", ["qc", "rs"], ["qe"], name="rope"),
             mk("Expand", ["qe", "img"], ["qx"], name="update_expand"),
             mk("Reshape", ["qx", "img"], ["upd"], name="update_reshape")]
    aranges = [np.zeros((1, 1, 1, 1)), np.arange(h).reshape(h, 1, 1), np.arange(text, t, step).reshape(n_img, 1),
               np.arange(d)]
    if indices == "computed":
        for k, a in enumerate(aranges):
            inits.append(c(a.astype(np.int64), f"i{k}"))
            nodes += [mk("Expand", [f"i{k}", "img"], [f"ie{k}"], name=f"ie{k}"),
                      mk("Unsqueeze", [f"ie{k}", "last"], [f"iu{k}"], name=f"iu{k}")]
        nodes.append(mk("Concat", [f"iu{k}" for k in range(4)], ["idx"], axis=-1, name="idx"))
    else:
        grid = np.stack([np.broadcast_to(a, img) for a in aranges], axis=-1).astype(np.int64)
        inits.append(c(grid, "idx"))
    nodes += [mk("ScatterND", ["q", "idx", "upd"], ["qs"], name="assign", reduction=reduction),
              mk("Mul", ["qs", "scale"], ["qq"], name="scale"),
              mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="kT"),
              mk("MatMul", ["qq", "kt"], ["s"], name="qk"), mk("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
              mk("MatMul", ["p", "v"], ["o"], name="pv"),
              mk("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3], name="back"),
              mk("Reshape", ["ot", "out"], ["y"], name="y")]
    g = helper.make_graph(nodes, "cogview4-q", [vi("x", F, [1, t, h * d]), vi("k", F, [1, h, t, d]),
                                                vi("v", F, [1, h, t, d])], [vi("y", F, [1, t, h * d])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(m)
    return m


def _same_bits(a: onnx.ModelProto, b: onnx.ModelProto) -> None:
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32)
             for v in a.graph.input}
    for x, y in zip(run_unoptimised(a, feeds), run_unoptimised(b, feeds), strict=True):
        assert x.shape == y.shape and np.array_equal(x, y), float(np.abs(x - y).max())


def _ops(m: onnx.ModelProto, op: str) -> list[onnx.NodeProto]:
    return [n for n in m.graph.node if n.op_type == op]


@pytest.mark.parametrize("indices", ["computed", "constant"])
def test_the_assignment_becomes_a_concat_of_the_text_tokens_and_the_rotated_ones(indices: str) -> None:
    """The ScatterND and the ops computing its indices are gone; the text tokens (a Slice of q) and the rotated
    image tokens (read past the export's no-op Expand/Reshape) are concatenated on the tokens axis: the same bits."""
    m = cogview_qk(indices=indices)
    r, done = rewritten(m, SCATTER)
    onnx.checker.check_model(r)
    assert done == {"slice-assign-concat": 1}
    assert not _ops(r, "ScatterND") and not _ops(r, "Expand") and "idx" not in {t.name for t in r.graph.initializer}
    (cat,) = [n for n in _ops(r, "Concat") if n.output[0] == "qs"]
    assert helper.get_attribute_value(cat.attribute[0]) == 2 and cat.input[1] == "qe"
    text = next(n for n in r.graph.node if n.output[0] == cat.input[0])
    assert text.op_type == "Slice" and text.input[0] == "q"
    assert numpy_helper.to_array(next(t for t in r.graph.initializer if t.name == text.input[2])).tolist() == [4]
    _same_bits(m, r)


@pytest.mark.parametrize("kw", [{"step": 2}, {"reduction": "add"}, {"text": 0}], ids=["every-other", "add", "all"])
def test_left_alone_unless_it_writes_one_slice_of_one_axis(kw: dict[str, object]) -> None:
    """A strided write is no slice, an accumulating one no copy, and a write of every token (``text`` 0) no slice
    either (no such export measured): the graph as it was."""
    m = cogview_qk(**kw)  # type: ignore[arg-type]
    r, done = rewritten(m, SCATTER)
    assert done == {} and list(r.graph.node) == list(m.graph.node)


def test_the_heads_transpose_moves_past_the_norm_and_the_token_slices() -> None:
    """2.5.0: after the assignment is a Concat, ``heads-table-layout`` moves the heads Transpose past the LayerNorm,
    the Slices of the tokens axis and the Concat back (their axis 2 becomes 1), the RoPE tables are read as
    ``[1, T', 1, d]``; one Transpose back before the attention's MatMul (the scale moved too): the same bits."""
    m = cogview_qk()
    r, done = rewritten(m, LAYOUT["2.5.0"])
    onnx.checker.check_model(r)
    assert done == {"slice-assign-concat": 1, "heads-table-layout": 1}
    assert _ops(r, "Transpose")[0].output[0] != "q0" and "T" not in {n.name for n in r.graph.node}
    norm = _ops(r, "LayerNormalization")[0]
    assert norm.input[0] == "xh"  # [1, T, H, d]: the projection's heads, not transposed
    inits = {t.name: numpy_helper.to_array(t) for t in r.graph.initializer}
    assert sorted(inits[n.input[3]].tolist() for n in _ops(r, "Slice") if n.input[0].startswith("q")) == [[1], [1]]
    (cat,) = [n for n in _ops(r, "Concat") if len(n.input) == 2 and n.input[1].startswith("qe")]
    assert helper.get_attribute_value(cat.attribute[0]) == 1
    qk = next(n for n in r.graph.node if n.name == "qk")
    back = next(n for n in r.graph.node if n.output[0] == qk.input[0])  # after the scale, which moved too
    assert back.op_type == "Transpose" and list(back.attribute[0].ints) == [0, 2, 1, 3]
    _same_bits(m, r)


def test_2_3_x_leaves_the_layernorm_in_the_heads_layout() -> None:
    """2.3.x: ``computed-table-layout`` does not move past a LayerNorm (2.3.0 built CogView4's attention at its
    width that way out of memory, 14.6 GB of RSS): only the assignment is rewritten."""
    m = cogview_qk()
    r, done = rewritten(m, LAYOUT["2.3.0"])
    assert done == {"slice-assign-concat": 1}
    assert _ops(r, "LayerNormalization")[0].input[0] == "q0" and _ops(r, "Transpose")[0].name == "T"
    _same_bits(m, r)


@pytest.mark.slow
def test_the_partitioner_keeps_the_assignment_in_the_npu_stage(tmp_path: Path) -> None:
    """The indices, 128 KB of int64 here (over the probe's 64 KB for a computed value: at the real width 134 MB),
    reach the rewrite probe as the ops computing them, so ``slice-assign-concat`` rescues the ScatterND the
    capability table puts on the CPU: one NPU stage.  Without rewrites it leaves for the host."""
    from rkpart.grouping.groups import order_groups
    from rkpart.pipeline import PartitionConfig, load, propose

    m = cogview_qk(2, 80, 32, 16)
    idx_bytes = 2 * 64 * 32 * 4 * 8
    assert idx_bytes > 1 << 16
    path = tmp_path / "cogview4-q.onnx"
    onnx.save(m, str(path))
    model = load(path)

    def devices(**kw: object) -> list[tuple[str, list[str]]]:
        p = propose(model, "generic", PartitionConfig(toolkit="2.5.0", **kw))  # type: ignore[arg-type]
        return [(g.device, sorted(p.graph.op(i).op_type for i in g.ops)) for g in order_groups(p.graph, p.partition)]

    kept = devices()
    assert [d for d, _ in kept] == ["npu"] and "ScatterND" in kept[0][1]
    moved = devices(rewrites=False)
    assert any(d == "host" and "ScatterND" in ops for d, ops in moved)


@pytest.mark.toolkit
@pytest.mark.slow
def test_real_build_keeps_the_norm_the_rope_and_the_assignment_on_the_npu(tk250: object, tmp_path: Path) -> None:
    """2.5.0, CogView4's q path at head dim 128 (4 heads, 1024 image + 256 text tokens): as exported, the Transpose
    after the LayerNorm's exNorm ('height(1280) * width(128) = 163840, required product no larger than 8192') and the
    rotate-half's Reshape run on the CPU (the toolkit itself turns this ScatterND into Split + Concat); after
    ``slice-assign-concat`` and ``heads-table-layout`` nothing does."""
    from tests.targets.rewrite_check import cpu_layers_before_after

    m = cogview_qk(4, 1280, 128, 256)
    after, done = rewritten(m, LAYOUT["2.5.0"])
    assert done == {"slice-assign-concat": 1, "heads-table-layout": 1}
    cpu = cpu_layers_before_after(m, after, tk250, tmp_path)
    assert sorted(op.split(":")[0] for op in cpu["before"]) == ["Reshape", "Transpose"], cpu
    assert cpu["after"] == (), cpu
