"""``rope-halves`` (2.3.0, 2.3.2): the rotate-half RoPE ``x * cos + rotate_half(x) * sin`` with
tables broadcast over the heads ([1, 1, T, D]) is computed on the tokens layout and on the halves
of D, ``Concat(x1 * cos1 - x2 * sin1, x2 * cos2 + x1 * sin2)`` with half tables [1, T, 1, D/2]
(issue 27: 2.3.0 stores a [1, 1, T, D] table padded to 16 bytes per element in float16 and int8).

Checked under ONNX Runtime (graph optimisations off): the rewritten model gives the same bits as
the original, on the bundled example's stages, on the pure-ONNX Anima at two sizes and in float16,
on hand-written RoPEs in the three spellings of the halves (Slices, one Split, the TorchScript
export of ``unflatten(-1, (2, -1)).unbind(-2)``), and it leaves other rotations and tables alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart import partition
from rkpart.targets.rewrites import DEDUPE, REWRITES
from tests.models.anima import AnimaConfig, build_anima_onnx
from tests.targets.rewrite_check import rewritten, run_unoptimised
from tests.targets.test_heads_table_layout import _feeds, _ops, _tables

ROW = tuple(r for r in REWRITES if r.name == "rope-halves")
F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _rewrite(m: onnx.ModelProto, dedupe: bool = False) -> tuple[onnx.ModelProto, dict[str, int]]:
    r, done = rewritten(m, (*ROW, DEDUPE) if dedupe else ROW)
    onnx.checker.check_model(r)
    return r, done


def _same_bits(a: onnx.ModelProto, b: onnx.ModelProto, folder: Path | None = None) -> None:
    feeds = _feeds(a)
    for x, y in zip(run_unoptimised(a, feeds, folder), run_unoptimised(b, feeds, folder), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y), float(np.abs(x.astype(np.float64) - y).max())


def _shapes4(m: onnx.ModelProto) -> list[tuple[int, ...]]:
    return sorted(tuple(t.dims) for t in m.graph.initializer if len(t.dims) == 4)


def test_bundled_example_attention_stages(tmp_path: Path, example_model: Path) -> None:
    """The self-attention stage of each block: q's and k's RoPE rewritten, the tables [1, 64, 1, 12]
    (with dedupe-constants: one cos and one sin half, the halves of cat(freqs, freqs) being equal),
    two Transposes per RoPE added, the rotate-half's Reshape / Split / Squeeze / Neg gone; the
    other stages untouched."""
    folder = tmp_path / "split"
    partition(example_model, folder, "split")
    seen = 0
    for path in sorted((folder / "stages").glob("*.onnx")):
        m = onnx.load(str(path))
        r, done = _rewrite(m)
        if path.name.endswith(".attn.onnx"):
            assert done == {"rope-halves": 2}
            assert sorted(_tables(m)) == [(1, 1, 64, 24)] * 4 and _tables(r) == []
            assert _shapes4(r) == [(1, 64, 1, 12)] * 8
            assert _ops(r, "Transpose") == _ops(m, "Transpose") + 4
            assert _ops(r, "Neg") == _ops(r, "Split") == _ops(r, "Squeeze") == 0
            _same_bits(m, r, path.parent)
            d, done = _rewrite(m, dedupe=True)
            assert done["rope-halves"] == 2 and _shapes4(d) == [(1, 64, 1, 12)] * 2
            _same_bits(m, d, path.parent)
            seen += 1
        else:  # cross-attention (no RoPE), FFN, host stages
            assert done == {} and r.SerializeToString() == m.SerializeToString()
    assert seen == 2


@pytest.mark.parametrize("cfg", [
    AnimaConfig.tiny(),
    AnimaConfig.tiny(hidden=128, heads=2, latent_height=8, latent_width=24, num_blocks=1),
    AnimaConfig.tiny(hidden=128, heads=8, latent_height=8, latent_width=8, num_blocks=1, dtype="float16"),
], ids=["tiny", "h128-2heads-48tokens", "h128-8heads-fp16"])
def test_anima_whole_model_two_sizes_and_float16(cfg: AnimaConfig, tmp_path: Path) -> None:
    """The pure-ONNX Anima (rotate-half by Slice / Neg / Concat, one shared [T, D] table; float16
    models run the RoPE in float32 between Casts): every block's q and k."""
    m = onnx.load(str(build_anima_onnx(cfg, tmp_path / "anima.onnx")))
    r, done = _rewrite(m, dedupe=True)
    assert done["rope-halves"] == 2 * cfg.num_blocks
    assert _shapes4(r) == [(1, cfg.num_tokens, 1, cfg.head_dim // 2)] * 2  # cos and sin, each made once
    _same_bits(m, r)


def _rope(halves: str = "slice", heads: int = 4, tokens: int = 16, dim: int = 16, *, per_head: bool = False,
          rotation: str = "half") -> onnx.ModelProto:
    """q = Transpose(Reshape(x @ W)) -> x * cos + rotate_half(x) * sin (the tables constants) ->
    q @ q^T.  ``halves``: how the halves of D are taken, ``slice`` (two Slices), ``split`` (one
    Split of the last axis) or ``unbind`` (Reshape to [.., 2, D/2], Split of axis -2, Squeezes: the
    TorchScript export of diffusers' Cosmos).  ``per_head``: tables [1, H, T, D] (nothing to gain);
    ``rotation`` "neg-first-half": Concat(-x1, x2), not rotate-half."""
    rng = np.random.default_rng(5)
    hid, h = heads * dim, dim // 2
    cshape = [1, heads, tokens, dim] if per_head else [1, 1, tokens, dim]
    freqs = rng.standard_normal((tokens, h)).astype(np.float32)
    table = np.concatenate([freqs, freqs], -1)
    init = [numpy_helper.from_array(rng.standard_normal((hid, hid)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([1, tokens, heads, dim], np.int64), "hshape"),
            numpy_helper.from_array(np.array([1, heads, tokens, 2, -1], np.int64), "two_halves"),
            numpy_helper.from_array(np.array([h, h], np.int64), "sizes"),
            numpy_helper.from_array(np.array([1, 1], np.int64), "ones"),
            numpy_helper.from_array(np.array([-2], np.int64), "m2"),
            numpy_helper.from_array(np.array([0], np.int64), "z"),
            numpy_helper.from_array(np.array([h], np.int64), "h"),
            numpy_helper.from_array(np.array([dim], np.int64), "e"),
            numpy_helper.from_array(np.array([-1], np.int64), "last"),
            numpy_helper.from_array(np.broadcast_to(np.cos(table), cshape).copy(), "cos"),
            numpy_helper.from_array(np.broadcast_to(np.sin(table), cshape).copy(), "sin")]
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "w"], ["p"]), mk("Reshape", ["p", "hshape"], ["hd"]),
             mk("Transpose", ["hd"], ["q"], perm=[0, 2, 1, 3])]
    if halves == "slice":
        nodes += [mk("Slice", ["q", "z", "h", "last"], ["x1"]), mk("Slice", ["q", "h", "e", "last"], ["x2"])]
    elif halves == "split":
        nodes += [mk("Split", ["q", "sizes"], ["x1", "x2"], axis=-1)]
    else:
        nodes += [mk("Reshape", ["q", "two_halves"], ["q5"]), mk("Split", ["q5", "ones"], ["u1", "u2"], axis=-2),
                  mk("Squeeze", ["u1", "m2"], ["x1"]), mk("Squeeze", ["u2", "m2"], ["x2"])]
    if rotation == "half":
        nodes += [mk("Neg", ["x2"], ["nx"]), mk("Concat", ["nx", "x1"], ["rot"], axis=-1)]
    else:
        nodes += [mk("Neg", ["x1"], ["nx"]), mk("Concat", ["nx", "x2"], ["rot"], axis=-1)]
    nodes += [mk("Mul", ["q", "cos"], ["qc"]), mk("Mul", ["rot", "sin"], ["rs"]), mk("Add", ["qc", "rs"], ["qr"]),
              mk("Transpose", ["qr"], ["qt"], perm=[0, 1, 3, 2]), mk("MatMul", ["qr", "qt"], ["y"])]
    g = helper.make_graph(nodes, "rope", [vi("x", F, [1, tokens, hid])], [vi("y", F, [1, heads, tokens, tokens])],
                          init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("halves", ["slice", "split", "unbind"])
def test_hand_written_rope_three_spellings(halves: str) -> None:
    m = _rope(halves)
    r, done = _rewrite(m)
    assert done == {"rope-halves": 1}
    assert _tables(r) == [] and _shapes4(r) == [(1, 16, 1, 8)] * 4
    assert _ops(r, "Neg") == 0 and _ops(r, "Sub") == 1 and _ops(r, "Transpose") == _ops(m, "Transpose") + 2
    assert not any(n.op_type in ("Split", "Squeeze") for n in r.graph.node)
    assert {t.name for t in r.graph.initializer}.isdisjoint({"cos", "sin", "two_halves", "sizes", "ones", "m2"})
    _same_bits(m, r)


@pytest.mark.parametrize("kw", [{"per_head": True}, {"rotation": "neg-first-half"}, {"heads": 1}],
                         ids=["per-head-table", "not-rotate-half", "one-head"])
def test_left_alone(kw: dict[str, object]) -> None:
    m = _rope("unbind", **kw)  # type: ignore[arg-type]
    r, done = _rewrite(m)
    assert done == {}
    assert list(r.graph.node) == list(m.graph.node) and list(r.graph.initializer) == list(m.graph.initializer)


# -- real builds ---------------------------------------------------------------------------------

@pytest.mark.toolkit
@pytest.mark.slow
def test_bundled_attention_stage_2_3_0(plans: dict, tmp_path: Path, tk230: object) -> None:  # type: ignore[type-arg]
    """2.3.0, fp16: the self-attention stage's tables are no longer padded (24 KB each -> the two
    half tables left, 2 KB each), nothing goes to the CPU, and the plan passes the simulator gate."""
    import json
    import shutil

    from click.testing import CliRunner

    from rkpart.cli import main
    from rkpart.plan.plan import load_plan
    from tests.targets.test_heads_table_layout import _compile

    plain, rw = tmp_path / "plain", tmp_path / "rw"
    shutil.copytree(plans["split"][1], plain)
    shutil.copytree(plans["split"][1], rw)
    _compile(plain, "2.3.0", "--skip-rewrite", "rope-halves", "--stage", "b00.attn")
    _compile(rw, "2.3.0")
    before = load_plan(plain)[0].stage("b00.attn")
    after = load_plan(rw)[0].stage("b00.attn")
    a0, a1 = before.artifact(), after.artifact()
    assert a0 is not None and a1 is not None and a0.compiler is not None and a1.compiler is not None
    assert after.prepared is not None and dict(after.prepared["rewrites"])["rope-halves"] == 2
    assert a0.cpu_ops == a1.cpu_ops == ()
    w0, w1 = a0.compiler.weight_bytes, a1.compiler.weight_bytes
    assert w0 is not None and w1 is not None and w1 <= w0 - 2 * (24576 - 2048), (w0, w1)  # measured 127872 -> 80576
    log = (rw / "rknn" / "logs" / "b00.attn.2.3.0.log").read_text(errors="replace")
    table = log[log.rindex("Const Tensor Information Table"):]
    assert "(1,1,64,24)" not in table and "(1,12,1,64)" in table
    res = CliRunner().invoke(main, ["run", str(rw), "--backend", "rknn-sim", "--toolkit", "2.3.0", "-q", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["passed"]
