"""``heads-table-layout``: RoPE's tables broadcast over the heads ([1, 1, T, D]) are laid out
[1, T, 1, D] by moving the heads Transpose past the RoPE (issue 27: the compiler pads a table
whose axis 1 is 1 to 16 bytes per element, in float16 and in int8).

Checked under ONNX Runtime (graph optimisations off, so both models run the same kernels): the
rewritten model gives the same bits as the original, on the bundled example's stages, on the
pure-ONNX Anima at two sizes and in float16, on a hand-written RoPE in the interleaved-pairs
form (Flux's), and it leaves graphs with no such table alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart import partition
from rkpart.targets.rewrites import REWRITES
from tests.models.anima import AnimaConfig, build_anima_onnx
from tests.targets.rewrite_check import rewritten, run_unoptimised

ROW = tuple(r for r in REWRITES if r.name == "heads-table-layout")
COMPUTED = tuple(r for r in REWRITES if r.name == "computed-table-layout")
F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _feeds(m: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in m.graph.initializer}
    out = {}
    for v in m.graph.input:
        if v.name in inits:
            continue
        tt = v.type.tensor_type
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        out[v.name] = rng.standard_normal([d.dim_value for d in tt.shape.dim]).astype(dt)
    return out


def _tables(m: onnx.ModelProto) -> list[tuple[int, ...]]:
    """Shapes of the rank-4 float constants that vary along axis 2 but not along axis 1: what the
    compiler pads (initializers and Constant nodes)."""
    arrays = [numpy_helper.to_array(t) for t in m.graph.initializer]
    arrays += [numpy_helper.to_array(a.t) for n in m.graph.node if n.op_type == "Constant"
               for a in n.attribute if a.name == "value"]
    return [a.shape for a in arrays if a.dtype.kind == "f" and a.ndim == 4 and a.shape[1] == 1 and a.shape[2] > 1]


def _ops(m: onnx.ModelProto, op: str) -> int:
    return sum(n.op_type == op for n in m.graph.node)


def _rewrite(m: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    r, done = rewritten(m, ROW)
    onnx.checker.check_model(r)
    return r, done


def _same_bits(a: onnx.ModelProto, b: onnx.ModelProto, folder: Path | None = None) -> None:
    feeds = _feeds(a)
    for x, y in zip(run_unoptimised(a, feeds, folder), run_unoptimised(b, feeds, folder), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y), float(np.abs(x.astype(np.float64) - y).max())


@pytest.fixture(scope="module")
def split_stages(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> Path:
    folder = tmp_path_factory.mktemp("heads") / "split"
    partition(example_model, folder, "split")
    return folder


def test_bundled_example_attention_stages(split_stages: Path) -> None:
    """The self-attention stage of each block: both RoPE applications (q and k) rewritten, the four
    tables now [1, 64, 1, 24], as many Transposes as before; the other stages untouched."""
    seen = 0
    for path in sorted((split_stages / "stages").glob("*.onnx")):
        m = onnx.load(str(path))
        r, done = _rewrite(m)
        if path.name.endswith(".attn.onnx"):  # not 006_b01.attn.pre (the host's AdaLN before it)
            assert done == {"heads-table-layout": 2}
            assert sorted(_tables(m)) == [(1, 1, 64, 24)] * 4 and _tables(r) == []
            shapes = sorted(tuple(t.dims) for t in r.graph.initializer if len(t.dims) == 4)
            assert shapes == [(1, 64, 1, 24)] * 4
            assert _ops(r, "Transpose") == _ops(m, "Transpose")
            _same_bits(m, r, path.parent)
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
    """The pure-ONNX Anima (rotate-half by Slice/Neg/Concat, the tables one shared [T, D]
    initializer; float16 models run the RoPE in float32 between Casts): every block's q and k."""
    path = build_anima_onnx(cfg, tmp_path / "anima.onnx")
    m = onnx.load(str(path))
    r, done = _rewrite(m)
    assert done == {"heads-table-layout": 2 * cfg.num_blocks}
    tables = [tuple(t.dims) for t in r.graph.initializer if len(t.dims) == 4]
    assert tables == [(1, cfg.num_tokens, 1, cfg.head_dim)] * 2  # cos and sin, each made once
    _same_bits(m, r)


def _flux_rope(heads: int = 4, tokens: int = 16, dim: int = 16, *, per_head: bool = False,
               matmul_first: bool = False) -> onnx.ModelProto:
    """q = Transpose(Reshape(x @ W)) -> RMSNorm -> RoPE on interleaved pairs, written by hand
    (Reshape [.., D/2, 2], Gather of each half, Neg, Unsqueeze, Concat, Reshape back: Flux's
    ``apply_rotary_emb(use_real_unbind_dim=-1)``), then q @ q^T.  ``per_head``: the tables are
    [1, H, T, D] (nothing to gain).  ``matmul_first``: a MatMul between the Transpose and the RoPE."""
    rng = np.random.default_rng(3)
    hid = heads * dim
    cshape = [1, heads, tokens, dim] if per_head else [tokens, dim]
    init = [numpy_helper.from_array(rng.standard_normal((hid, hid)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([1, tokens, heads, dim], np.int64), "hshape"),
            numpy_helper.from_array(np.array([1, heads, tokens, dim // 2, 2], np.int64), "pairs"),
            numpy_helper.from_array(np.array([1, heads, tokens, dim], np.int64), "flat"),
            numpy_helper.from_array(rng.standard_normal(cshape).astype(np.float32), "cos"),
            numpy_helper.from_array(rng.standard_normal(cshape).astype(np.float32), "sin"),
            numpy_helper.from_array(rng.standard_normal(dim).astype(np.float32), "nw"),
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
            numpy_helper.from_array(np.array(0, np.int64), "i0"),
            numpy_helper.from_array(np.array(1, np.int64), "i1"),
            numpy_helper.from_array(np.array([-1], np.int64), "last"),
            numpy_helper.from_array(rng.standard_normal((dim, dim)).astype(np.float32), "mix")]
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "w"], ["p"]), mk("Reshape", ["p", "hshape"], ["h"]),
             mk("Transpose", ["h"], ["q0"], perm=[0, 2, 1, 3])]
    src = "q0"
    if matmul_first:
        nodes.append(mk("MatMul", ["q0", "mix"], ["qm"]))
        src = "qm"
    nodes += [mk("Pow", [src, "two"], ["sq"]), mk("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
              mk("Add", ["ms", "eps"], ["mse"]), mk("Sqrt", ["mse"], ["rms"]), mk("Div", [src, "rms"], ["nq"]),
              mk("Mul", ["nq", "nw"], ["q"]),
              mk("Reshape", ["q", "pairs"], ["qp"]), mk("Gather", ["qp", "i0"], ["re"], axis=-1),
              mk("Gather", ["qp", "i1"], ["im"], axis=-1), mk("Neg", ["im"], ["nim"]),
              mk("Unsqueeze", ["nim", "last"], ["a"]), mk("Unsqueeze", ["re", "last"], ["b"]),
              mk("Concat", ["a", "b"], ["ab"], axis=-1), mk("Reshape", ["ab", "flat"], ["rot"]),
              mk("Mul", ["q", "cos"], ["qc"]), mk("Mul", ["rot", "sin"], ["rs"]), mk("Add", ["qc", "rs"], ["qr"]),
              mk("Transpose", ["qr"], ["qt"], perm=[0, 1, 3, 2]), mk("MatMul", ["qr", "qt"], ["y"])]
    g = helper.make_graph(nodes, "rope", [vi("x", F, [1, tokens, hid])],
                          [vi("y", F, [1, heads, tokens, tokens]), vi("q", F, [1, heads, tokens, dim])], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m)
    return m


def test_hand_written_interleaved_rope() -> None:
    """Another spelling (pairs, Gather, Unsqueeze; the normed q also a graph output): the same bits,
    the tables [1, T, 1, D], the output q made again by one Transpose."""
    m = _flux_rope()
    r, done = _rewrite(m)
    assert done == {"heads-table-layout": 1}
    assert _tables(r) == [] and sorted(tuple(t.dims) for t in r.graph.initializer
                                       if t.name.startswith(("cos", "sin"))) == [(1, 16, 1, 16)] * 2
    assert [o.name for o in r.graph.output] == ["y", "q"]
    # the heads Transpose is gone; one back for the graph output q, one before the two MatMul readers
    assert _ops(r, "Transpose") == _ops(m, "Transpose") + 1
    _same_bits(m, r)


@pytest.mark.parametrize("kw", [{"per_head": True}, {"matmul_first": True}], ids=["per-head-table", "matmul-first"])
def test_left_alone_when_no_table_would_move(kw: dict[str, bool]) -> None:
    m = _flux_rope(**kw)
    r, done = _rewrite(m)
    assert done == {}  # ("shapes" rows write the inferred value infos; prepare keeps an unmatched stage as it is)
    assert list(r.graph.node) == list(m.graph.node) and list(r.graph.initializer) == list(m.graph.initializer)


@pytest.mark.export
@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_cosmos_export_both_exporters(exporter: str, tmp_path: Path) -> None:
    """diffusers' CosmosTransformer3DModel (the sweep's tiny export): each self-attention stage's
    q and k RoPE rewritten, its tables [1, T, 1, D], the same bits; the other stages untouched."""
    from rkpart.plan.plan import load_plan
    from tests.models.diffusers_families import cached_export, missing_dependencies

    if missing_dependencies():
        pytest.skip(f"not installed: {missing_dependencies()}")
    folder = tmp_path / "split"
    partition(cached_export("cosmos", exporter), folder, "split")
    hits = {}
    for s in load_plan(folder)[0].npu_stages:
        m = onnx.load(str(folder / s.file))
        r, done = _rewrite(m)
        hits[s.id] = done.get("heads-table-layout", 0)
        if done:
            assert _tables(m) and _tables(r) == []
            _same_bits(m, r, (folder / s.file).parent)
    assert hits == {"b00.attn": 2, "b00.xattn": 0, "b00.ffn": 0, "b01.attn": 2, "b01.xattn": 0, "b01.ffn": 0}


# -- real builds ---------------------------------------------------------------------------------

def _compile(folder: Path, version: str, *extra: str) -> dict:  # type: ignore[type-arg]
    import json

    from click.testing import CliRunner

    from rkpart.cli import main

    res = CliRunner().invoke(main, ["compile", str(folder), "--toolkit", version, "-j", "1", "-q", "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)  # type: ignore[no-any-return]


@pytest.mark.toolkit
@pytest.mark.slow
def test_bundled_attention_stage_stores_its_tables_unpadded(plans: dict, tmp_path: Path, tk250: object) -> None:  # type: ignore[type-arg]
    """2.5.0, fp16: the self-attention stage's weight memory loses the padding of its four
    tables (24 KB each -> 3 KB), nothing goes to the CPU, and the plan passes the simulator gate."""
    import json
    import shutil

    from click.testing import CliRunner

    from rkpart.cli import main
    from rkpart.plan.plan import load_plan

    plain, rw = tmp_path / "plain", tmp_path / "rw"
    shutil.copytree(plans["split"][1], plain)
    shutil.copytree(plans["split"][1], rw)
    _compile(plain, "2.5.0", "--no-rewrites", "--stage", "b00.attn")
    _compile(rw, "2.5.0")
    before = load_plan(plain)[0].stage("b00.attn")
    after = load_plan(rw)[0].stage("b00.attn")
    a0, a1 = before.artifact(), after.artifact()
    assert a0 is not None and a1 is not None and a0.compiler is not None and a1.compiler is not None
    assert after.prepared is not None and dict(after.prepared["rewrites"])["heads-table-layout"] == 2
    assert a0.cpu_ops == a1.cpu_ops == ()
    w0, w1 = a0.compiler.weight_bytes, a1.compiler.weight_bytes
    assert w0 is not None and w1 is not None and w1 <= w0 - 4 * (24576 - 3072), (w0, w1)  # measured 177152 -> 89216
    log = (rw / "rknn" / "logs" / "b00.attn.2.5.0.log").read_text(errors="replace")
    assert "(1,1,64,24)" not in log[log.rindex("Const Tensor Information Table"):]
    res = CliRunner().invoke(main, ["run", str(rw), "--backend", "rknn-sim", "--toolkit", "2.5.0", "-q", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["passed"]


# -- tables computed in the stage (Cosmos-Predict2 at its real width) ----------------------------

def cosmos_rope(heads: int = 4, tokens: int = 16, dim: int = 8, *, table_from: str = "constant"
                ) -> onnx.ModelProto:
    """Cosmos's self-attention q path as its real-width TorchScript stage holds it: ``x [1, T, H*d]`` split into
    heads and transposed to ``[1, H, T, d]``, the RMSNorm over the head dim (Cast, Pow, ReduceMean, Add, Sqrt,
    Div(1, .), Mul, Mul by its weight), the rotate-half RoPE as TorchScript writes ``unflatten(-1, (2, -1))
    .unbind(-2)`` (Reshape ``[.., 2, d/2]``, Split, Squeeze, Neg, Concat), its tables ``[1, 1, T, d]`` computed in
    the stage: ``Cos``/``Sin`` of ``table_from`` (``constant``: an angle grid; ``input``: a graph input), then the
    attention's scalar scale and the attention over ``k``, ``v`` (graph inputs ``[1, H, T, d]``), back to ``[1, T,
    H*d]`` (``bench/layout_probe.py --pattern rms-rope``)."""
    h, t, d = heads, tokens, dim
    rng = np.random.default_rng(5)
    ang = rng.uniform(0, 3, size=(t, d // 2)).astype(np.float32)
    c = numpy_helper.from_array
    inits = [c(np.array([1, t, h, d], np.int64), "hs"), c(np.array(2.0, np.float32), "two"),
             c(np.array(1e-6, np.float32), "eps"), c(np.array(1.0, np.float32), "one"),
             c((1 + 0.1 * rng.standard_normal(d)).astype(np.float32), "nw"), c(np.array([0, 1], np.int64), "01"),
             c(np.array([1, h, t, 2, d // 2], np.int64), "halves"), c(np.array([1, 1], np.int64), "sizes"),
             c(np.array([-2], np.int64), "ax"), c(np.array([0.3], np.float32), "scale"),
             c(np.array([1, t, h * d], np.int64), "out")]
    ins = [vi("x", F, [1, t, h * d]), vi("k", F, [1, h, t, d]), vi("v", F, [1, h, t, d])]
    if table_from == "constant":
        inits.append(c(np.concatenate([ang, ang], axis=-1), "ang"))
    else:
        ins.append(vi("ang", F, [t, d]))
    mk = helper.make_node
    nodes = [mk("Reshape", ["x", "hs"], ["xh"]), mk("Transpose", ["xh"], ["q0"], perm=[0, 2, 1, 3]),
             mk("Cast", ["q0"], ["qf"], to=F), mk("Pow", ["qf", "two"], ["sq"]),
             mk("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1), mk("Add", ["ms", "eps"], ["mse"]),
             mk("Sqrt", ["mse"], ["rms"]), mk("Div", ["one", "rms"], ["inv"]), mk("Mul", ["qf", "inv"], ["nq"]),
             mk("Mul", ["nq", "nw"], ["q"]),
             mk("Cos", ["ang"], ["cos0"]), mk("Sin", ["ang"], ["sin0"]),
             mk("Unsqueeze", ["cos0", "01"], ["cos"]), mk("Unsqueeze", ["sin0", "01"], ["sin"]),
             mk("Reshape", ["q", "halves"], ["qr"]), mk("Split", ["qr", "sizes"], ["x1", "x2"], axis=-2),
             mk("Squeeze", ["x1", "ax"], ["s1"]), mk("Squeeze", ["x2", "ax"], ["s2"]), mk("Neg", ["s2"], ["n2"]),
             mk("Concat", ["n2", "s1"], ["rot"], axis=-1), mk("Mul", ["q", "cos"], ["qc"]),
             mk("Mul", ["rot", "sin"], ["rs"]), mk("Add", ["qc", "rs"], ["qe"]), mk("Mul", ["qe", "scale"], ["qs"]),
             mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), mk("MatMul", ["qs", "kt"], ["s"]),
             mk("Softmax", ["s"], ["p"], axis=-1), mk("MatMul", ["p", "v"], ["o"]),
             mk("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]), mk("Reshape", ["ot", "out"], ["y"])]
    g = helper.make_graph(nodes, "cosmos-q", ins, [vi("y", F, [1, t, h * d])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m)
    return m


def test_tables_computed_from_constants_are_laid_out_in_the_graph() -> None:
    """Cosmos at its real width (the partitioner copies the table's computation into the stage, not its value):
    the heads Transpose moves past the norm and the RoPE, the computed tables are read through a Reshape to
    ``[1, T, 1, d]`` (axis 1 is 1: the same order of values), the scale's constant comes along; the same bits."""
    m = cosmos_rope()
    r, done = _rewrite(m)
    assert done == {"heads-table-layout": 1}
    swapped = [n for n in r.graph.node if n.op_type == "Reshape" and n.input[0] in ("cos", "sin")]
    assert len(swapped) == 2
    shapes = {t.name: numpy_helper.to_array(t).tolist() for t in r.graph.initializer}
    assert all(shapes[n.input[1]] == [1, 16, 1, 8] for n in swapped)
    # the heads Transpose is gone; one Transpose back before the attention's MatMul
    assert _ops(r, "Transpose") == _ops(m, "Transpose")
    scores = next(n for n in r.graph.node if n.op_type == "MatMul")
    back = next(n for n in r.graph.node if n.output[0] == scores.input[0])
    assert back.op_type == "Transpose" and list(back.attribute[0].ints) == [0, 2, 1, 3]
    _same_bits(m, r)


def test_a_table_computed_from_an_input_is_left_alone() -> None:
    m = cosmos_rope(table_from="input")
    r, done = _rewrite(m)
    assert done == {} and list(r.graph.node) == list(m.graph.node)


@pytest.mark.toolkit
@pytest.mark.slow
def test_real_build_keeps_the_norm_and_rope_of_computed_tables_on_the_npu(tk250: object, tmp_path: Path) -> None:
    """2.5.0, Cosmos's q path at head dim 128 (4 heads, 1024 tokens): the Transpose after the RMSNorm's exNorm
    ('height(1024) * width(128) = 131072, required product no larger than 8192') and the rotate-half's Reshape
    on the CPU before (16 heads, Cosmos's own: the Transpose alone), nothing after."""
    from tests.targets.rewrite_check import cpu_layers_before_after

    m = cosmos_rope(4, 1024, 128)
    after, done = _rewrite(m)
    assert done == {"heads-table-layout": 1}
    cpu = cpu_layers_before_after(m, after, tk250, tmp_path)
    assert sorted(op.split(":")[0] for op in cpu["before"]) == ["Reshape", "Transpose"], cpu
    assert cpu["after"] == (), cpu


def test_computed_table_layout_moves_computed_tables_only() -> None:
    """2.3.x's row: Cosmos's computed tables as heads-table-layout moves them (the same graph), constant tables
    left to rope-halves."""
    m = cosmos_rope()
    r, done = rewritten(m, COMPUTED)
    assert done == {"computed-table-layout": 1}
    r2, _ = _rewrite(m)
    assert r.SerializeToString() == r2.SerializeToString()
    _same_bits(m, r)
    flux = _flux_rope()
    r, done = rewritten(flux, COMPUTED)
    assert done == {} and list(r.graph.node) == list(flux.graph.node)


@pytest.mark.toolkit
@pytest.mark.slow
def test_real_build_2_3_0_keeps_the_norm_and_rope_of_computed_tables_on_the_npu(tk230: object,
                                                                                 tmp_path: Path) -> None:
    """2.3.0, the same q path (4 heads x 1024 tokens at 128): the Transpose after the exNorm and the rotate-half's
    Reshape on the CPU before (16 heads: the Transpose alone, as in Cosmos's stage), nothing after."""
    from tests.targets.rewrite_check import cpu_layers_before_after

    m = cosmos_rope(4, 1024, 128)
    after, done = rewritten(m, COMPUTED)
    assert done == {"computed-table-layout": 1}
    cpu = cpu_layers_before_after(m, after, tk230, tmp_path)
    assert sorted(op.split(":")[0] for op in cpu["before"]) == ["Reshape", "Transpose"], cpu
    assert cpu["after"] == (), cpu
