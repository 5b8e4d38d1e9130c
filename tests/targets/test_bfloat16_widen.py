"""``bfloat16-widen``: an island of bfloat16 computation is computed in float32.

No toolkit has a bfloat16 type (a stage holding one does not build), so without the rewrite the
partitioner sends every op of such an island to the host, with its matmuls (Sana-WM's camera
attention casts q, k and v to bfloat16 for SDPA).  Widened, the island computes in float32
exactly what the same graph written in float32 computes (the check below: bit for bit under ONNX
Runtime), which is within the row's gate of the bfloat16 original; the toolkit then builds it in
float16 like any float32 stage.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.rewrites import REWRITES, apply_rewrites, compile_rewrites_for
from rkpart.targets.rewrites.precision import emulate_bfloat16
from rkpart.validation.metrics import Gate, compare
from tests.targets.rewrite_check import rewritten, run_unoptimised

ROW = tuple(r for r in REWRITES if r.name == "bfloat16-widen")
F, BF = TensorProto.FLOAT, TensorProto.BFLOAT16
vi = helper.make_tensor_value_info
S, D = 12, 16  # tokens, head dim


def _bf16(a: np.ndarray, name: str) -> onnx.TensorProto:
    """``a`` rounded to bfloat16 (to nearest even), as an initializer."""
    bits = np.asarray(a, np.float32).view(np.uint32)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    t = helper.make_tensor(name, BF, list(a.shape), bits.tobytes(), raw=True)
    return t


def attention(elem: int = BF, *, weights: bool = False, leak: str = "") -> onnx.ModelProto:
    """q, k, v (1, 2, S, D) float32, each cast to ``elem``, softmax(q k^T * scale) v, cast back; then a
    float32 projection (the matmul around it the stage keeps).  ``weights``: the value side goes
    through a ``elem`` weight (an initializer of that type).  ``leak``: ``"output"`` a ``elem`` tensor
    is also a graph output; ``"random"`` a ``RandomNormalLike`` (a type attribute) joins the island;
    ``"subgraph"`` an ``If`` branch reads an island tensor."""
    rng = np.random.default_rng(0)
    scale = np.array(D ** -0.5, np.float32)
    inits = [numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32) * 0.3, "wo")]
    if elem == BF:
        inits.append(_bf16(scale, "scale"))
    else:
        inits.append(numpy_helper.from_array(scale, "scale"))
    nodes = [helper.make_node("Cast", [t], [f"{t}c"], to=elem, name=f"cast_{t}") for t in "qkv"]
    v = "vc"
    if weights:
        w = rng.standard_normal((D, D)).astype(np.float32) * 0.3
        inits.append(_bf16(w, "wv") if elem == BF else numpy_helper.from_array(
            (np.frombuffer(_bf16(w, "x").raw_data, np.uint16).astype(np.uint32) << 16).view(np.float32)
            .reshape(D, D), "wv"))
        nodes.append(helper.make_node("MatMul", ["vc", "wv"], ["vw"], name="value_proj"))
        v = "vw"
    nodes += [helper.make_node("Transpose", ["kc"], ["kt"], perm=[0, 1, 3, 2], name="kt"),
              helper.make_node("MatMul", ["qc", "kt"], ["s0"], name="scores"),
              helper.make_node("Mul", ["s0", "scale"], ["s"], name="scaled"),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
              helper.make_node("MatMul", ["p", v], ["o"], name="values"),
              helper.make_node("Cast", ["o"], ["of"], to=F, name="cast_out"),
              helper.make_node("MatMul", ["of", "wo"], ["y"], name="out_proj")]
    outs = [vi("y", F, [1, 2, S, D])]
    if leak == "output":
        outs.append(vi("p", elem, [1, 2, S, S]))
    elif leak == "random":
        nodes.append(helper.make_node("RandomNormalLike", ["p"], ["r"], name="noise", seed=1.0))
        nodes.append(helper.make_node("Cast", ["r"], ["rf"], to=F, name="cast_r"))
        outs.append(vi("rf", F, [1, 2, S, S]))
    elif leak == "subgraph":
        branch = helper.make_graph([helper.make_node("Cast", ["o"], ["bo"], to=F)], "b", [], [vi("bo", F, None)])
        inits.append(numpy_helper.from_array(np.array(True), "cond"))
        nodes.append(helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch))
        outs.append(vi("z", F, None))
    ins = [vi(t, F, [1, 2, S, D]) for t in "qkv"]
    g = helper.make_graph(nodes, "g", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {t: rng.standard_normal((1, 2, S, D)).astype(np.float32) for t in "qkv"}


def _elems(m: onnx.ModelProto) -> set[int]:
    g = onnx.shape_inference.infer_shapes(m).graph
    return {v.type.tensor_type.elem_type for v in (*g.value_info, *g.output)} | {t.data_type for t in g.initializer}


@pytest.mark.parametrize("weights", [False, True], ids=["casts", "bf16-weight"])
def test_the_island_computes_in_float32_what_float32_computes(weights: bool) -> None:
    m = attention(weights=weights)
    assert BF in _elems(m)
    r, done = rewritten(m, ROW)
    assert done == {"bfloat16-widen": 1}
    onnx.checker.check_model(r, full_check=True)
    assert BF not in _elems(r)
    # the casts into and out of the island are Identities now, the ops kept their names
    ops = {n.name: n.op_type for n in r.graph.node}
    assert ops["cast_q"] == ops["cast_out"] == "Identity" and ops["softmax"] == "Softmax"
    feeds = _feeds()
    (got,) = run_unoptimised(r, feeds)
    (f32,) = run_unoptimised(attention(F, weights=weights), feeds)
    np.testing.assert_array_equal(got, f32)
    # the original as bfloat16 computes it (ORT's CPU provider has no bfloat16 MatMul: emulated)
    em = onnx.ModelProto()
    em.CopyFrom(m)
    assert emulate_bfloat16(em) == 1
    (orig,) = run_unoptimised(em, feeds)
    # within the row's own gate of the bfloat16 original, and not equal to it (the roundings went)
    assert not Gate(*ROW[0].gate).failures(compare(got, orig))  # type: ignore[misc]
    assert not np.array_equal(got, orig)


def _rounded_by_hand(weights: bool) -> onnx.ModelProto:
    """The float32 attention with a Cast down to bfloat16 and up again after every op that was bfloat16."""
    m = attention(F, weights=weights)
    nodes = []
    for n in m.graph.node:
        nodes.append(n)
        if n.name in ("out_proj", "cast_out"):
            continue
        t = n.output[0]
        n.output[0] = f"{t}_w"
        nodes += [helper.make_node("Cast", [f"{t}_w"], [f"{t}_b"], to=BF),
                  helper.make_node("Cast", [f"{t}_b"], [t], to=F)]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


@pytest.mark.parametrize("weights", [False, True], ids=["casts", "bf16-weight"])
def test_the_emulation_rounds_after_every_op_as_bfloat16_does(weights: bool) -> None:
    """What ``rkpart run`` and the prepared-stage check run for a bfloat16 island ORT has no kernels
    for: bit for bit the float32 graph rounded to bfloat16 after each op, written by hand; and
    ``rkpart.runtime.ort.make_session`` falls back to it where ORT refuses the original."""
    from rkpart.runtime.ort import make_session

    m = attention(weights=weights)
    em = onnx.ModelProto()
    em.CopyFrom(m)
    assert emulate_bfloat16(em) == 1
    onnx.checker.check_model(em, full_check=True)
    feeds = _feeds()
    (want,) = run_unoptimised(_rounded_by_hand(weights), feeds)
    (got,) = run_unoptimised(em, feeds)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        run_unoptimised(m, feeds)
    (via_session,) = make_session(m.SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(via_session, want, rtol=0, atol=1e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize("leak", ["output", "random", "subgraph"])
def test_an_island_that_cannot_be_widened_whole_is_left_as_it_is(leak: str) -> None:
    """A bfloat16 tensor the graph outputs, an op with a type attribute, a reader inside an ``If``
    branch: widening would change what is outside the island, so nothing changes."""
    m = attention(leak=leak)
    r, done = rewritten(m, ROW)
    assert done == {}
    assert r.SerializeToString() == m.SerializeToString()


def test_a_float32_graph_is_not_touched() -> None:
    m = attention(F)
    r, done = rewritten(m, ROW)
    assert done == {} and r.SerializeToString() == m.SerializeToString()


def test_it_runs_first_so_the_exact_rows_see_float32() -> None:
    """The table applies it before the exact rows: after it no bfloat16 is left for them to skip."""
    names = [r.name for r in compile_rewrites_for("2.5.0")]
    assert names[0] == "bfloat16-widen"
    m = attention()
    done = apply_rewrites(m, compile_rewrites_for("2.5.0"))
    assert done.get("bfloat16-widen") == 1 and BF not in _elems(m)


def test_prepare_checks_it_alone_and_drops_it_where_the_rounding_is_the_result(tmp_path: Path) -> None:
    """A stage whose output *is* the bfloat16 rounding error (x - float(bfloat16(x))): widened it is 0
    everywhere, far outside the gate, so prepare drops the rewrite with why; the attention stage keeps it."""
    from rkpart.compile.prepare import prepare_stage
    from rkpart.plan.extract import stage_sha256

    x = vi("x", F, [4, 64])
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=BF, name="down"),
             helper.make_node("Cast", ["xb"], ["xf"], to=F, name="up"),
             helper.make_node("Sub", ["x", "xf"], ["err"], name="err"),
             helper.make_node("MatMul", ["err", "w"], ["y"], name="mm")]
    w = numpy_helper.from_array(np.eye(64, dtype=np.float32), "w")
    rounding = helper.make_model(helper.make_graph(nodes, "g", [x], [vi("y", F, [4, 64])], [w]),
                                 opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    # at opset 20 the stage is lowered first (dynamo's exports), and the lowered copy is checked too
    at20 = attention()
    at20.opset_import[0].version, at20.ir_version = 20, 10
    for name, m in (("rounding", rounding), ("attention", attention()), ("attention20", at20)):
        path = tmp_path / f"{name}.onnx"
        onnx.save(m, str(path))
        rknn = tmp_path / name / "rknn"
        rknn.mkdir(parents=True)
        prep = prepare_stage(path, stage_sha256(path), rknn, "2.5.0", "rk3588")
        assert prep.record is not None
        if name == "rounding":
            assert "bfloat16-widen" not in prep.record.rewrites
            assert "differs under ONNX Runtime" in prep.record.dropped_rewrites["bfloat16-widen"]
        else:
            assert prep.record.rewrites["bfloat16-widen"] == 1
            assert prep.record.to_opset == (19 if name == "attention20" else 17)
            assert BF not in _elems(onnx.load(str(prep.onnx)))


@pytest.mark.toolkit
@pytest.mark.parametrize("version", ["2.3.0", "2.5.0"])
def test_real_build_of_the_widened_island_puts_no_layer_on_the_cpu(version: str, tmp_path: Path) -> None:
    """Real builds: the bfloat16 attention does not build ('No corresponding Numpy type'); widened
    it builds with every layer on the NPU."""
    from rkpart.compile.compiler_plan import parse_layer_rows
    from rkpart.triage.matrix import build_once
    from tests.toolkits import get_toolkit

    tk = get_toolkit(version)
    ok, cpu = {}, {}
    for what, m in (("before", attention()), ("after", rewritten(attention(), ROW)[0])):
        path = tmp_path / f"{what}.onnx"
        onnx.save(m, str(path))
        log = tmp_path / f"{what}.log"
        ok[what] = build_once(path, tk, target="rk3588", log=log).ok
        rows = parse_layer_rows(log.read_text(errors="replace")) or []
        cpu[what] = [x.op_type for x in rows if x.target.upper() == "CPU"
                     and x.op_type not in ("InputOperator", "OutputOperator")]
    assert ok == {"before": False, "after": True}
    assert cpu["after"] == []


def _round_output_through_bfloat16(view: object) -> int:
    """Fault injection (named as such): the stage's output rounded through bfloat16 *after*
    bfloat16-widen ran, so the prepared stage holds a bfloat16 tensor again and no toolkit builds it."""
    from rkpart.ir.edit import GraphEdit

    assert isinstance(view, GraphEdit)
    g = view.graph
    y = g.output[0].name
    prod = next(n for n in g.node if y in n.output)
    prod.output[list(prod.output).index(y)] = "y_pre"
    g.node.extend([helper.make_node("Cast", ["y_pre"], ["y_b"], to=BF, name="fault_down"),
                   helper.make_node("Cast", ["y_b"], [y], to=F, name="fault_up")])
    return 1


@pytest.mark.toolkit
def test_a_failed_build_is_retried_without_the_other_rewrites_but_never_without_the_widening(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage whose build fails with its rewrites is rebuilt without them; without bfloat16-widen it
    could never build (measured on Sana-WM, 2.5.0: widen + heads-table-layout failed in the optimiser,
    the retry without both failed on the bfloat16 type, the stage went to the host).  So the retry
    keeps it: here a fault-injecting row after it puts a bfloat16 tensor back; the retry drops that
    row only and the stage builds, widened."""
    import dataclasses

    import rkpart.targets.rewrites as rw
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from rkpart.pipeline import partition
    from tests.toolkits import get_toolkit

    fault = dataclasses.replace(ROW[0], name="fault-bfloat16-output", op_type="MatMul",
                                apply=_round_output_through_bfloat16, gate=(0.9, 1.0), needed=False)
    monkeypatch.setattr(rw, "REWRITES", (*rw.REWRITES, fault))
    model = tmp_path / "attn.onnx"
    onnx.save(attention(), str(model))
    folder = tmp_path / "plan"
    plan = partition(model, folder, "generic")
    (stage,) = plan.npu_stages
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit("2.5.0"), "rk3588", {}, cache=False))
    (o,) = rep.outcomes
    assert o.status == "built", [f.message for f in o.failures]
    assert set(o.dropped_rewrites) == {"fault-bfloat16-output"}
    assert "No corresponding Numpy type" in o.dropped_rewrites["fault-bfloat16-output"]
    rec = json.loads((folder / "plan.json").read_text())
    prepared = next(s for s in rec["stages"] if s["id"] == stage.id)["prepared"]
    assert prepared["rewrites"].get("bfloat16-widen") == 1
