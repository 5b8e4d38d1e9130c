"""Device memory as the NPU holds it (issue 26): fp16 features, score matrices left out, the fitted
predictor, and selection taking the compiler's figure over a prediction."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.cost_model.device_model import (
    GELU_BUFFER,
    INTERNAL_TERMS,
    SWISH_BUFFER,
    MemoryFeatures,
    MemoryModel,
    MemoryRow,
    budget_margin,
    error_table,
    fit_memory_model,
    gelu_regions,
    head_norm_inputs,
    held_out_summary,
    leave_one_family_out,
    swish_outputs,
    within,
)
from rkpart.cost_model.features import Features, model_features
from rkpart.cost_model.model import Component, CostModel, default_model_path
from rkpart.cost_model.select import memory_term, stage_memory
from rkpart.errors import SpecError
from rkpart.ir import graph_of


def _attention(heads: int = 4, tokens: int = 32, dim: int = 16, mask: str = "", guard: bool = False
               ) -> onnx.ModelProto:
    """
    ::

        x[1,T,D] -MatMul(Wq)-> q -Reshape/Transpose-> qh[1,H,T,d] -\\
        x        -MatMul(Wk)-> k -Reshape/Transpose-> kt[1,H,d,T] --MatMul-> s[1,H,T,T] -Mul(scale)-> ss
                                                      --Softmax-> p -MatMul(p, vh)-> o[1,H,T,d] -> y[1,T,D]
        x        -MatMul(Wv)-> v -Reshape/Transpose-> vh[1,H,T,d] -/
    """
    d = dim // heads
    inits = [numpy_helper.from_array(np.full((dim, dim), k + 1.0, np.float32), n)
             for k, n in enumerate(("Wq", "Wk", "Wv"))]
    inits += [numpy_helper.from_array(np.array([1, tokens, heads, d], np.int64), "shp"),
              numpy_helper.from_array(np.array([1, tokens, dim], np.int64), "out_shp"),
              numpy_helper.from_array(np.array(0.5, np.float32), "scale")]
    nodes = []
    for n, w, perm in (("q", "Wq", [0, 2, 1, 3]), ("k", "Wk", [0, 2, 3, 1]), ("v", "Wv", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", ["x", w], [n]), helper.make_node("Reshape", [n, "shp"], [f"{n}r"]),
                  helper.make_node("Transpose", [f"{n}r"], [f"{n}h"], perm=perm)]
    nodes += [helper.make_node("MatMul", ["qh", "kh"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim])]
    if mask:  # an additive mask on the scores: a graph input ("input") or a constant ("constant")
        nodes.append(helper.make_node("Add", ["ss", "mask"], ["sm"]))
        if mask == "input":
            inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, tokens, tokens]))
        else:
            inits.append(numpy_helper.from_array(np.zeros((1, 1, tokens, tokens), np.float32), "mask"))
    nodes.append(helper.make_node("Softmax", ["sm" if mask else "ss"], ["p"], axis=-1))
    if guard:  # TorchScript's guard of a bool-masked attention: Where(IsNaN(p), 0, p)
        inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p"], ["pg"])]
    nodes += [helper.make_node("MatMul", ["pg" if guard else "p", "vh"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "out_shp"], ["y"])]
    g = helper.make_graph(nodes, "attn", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, dim])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_fp16_features_leave_the_score_matrices_out() -> None:
    f = model_features(_attention(heads=4, tokens=32, dim=16), device="npu")
    assert f.weight16 == 3 * 16 * 16 * 2 + (4 + 3) * 8 + 2  # float weights at 2 bytes, int64 shapes as stored
    assert f.score16 == 4 * 32 * 32 * 2  # s, ss, p: every head's tokens x tokens matrix
    assert f.head16 == 32 * 32 * 2  # one head's
    assert f.io16 == 2 * 32 * 16 * 2
    # the fp32 liveness peak holds the scores; the NPU one does not: it is a few token x hidden tensors
    assert f.peak_bytes >= 2 * 4 * 32 * 32 * 4
    assert f.act16 < f.score16 and f.act16 <= 6 * 32 * 16 * 2
    # while the scores would be alive: the projections' heads (q, k, v) at least, never more than the peak
    assert 3 * 32 * 16 * 2 <= f.att16 <= f.act16
    # 4x the tokens: scores grow 16x, the activations only 4x
    g = model_features(_attention(heads=4, tokens=128, dim=16), device="npu")
    assert g.score16 == 16 * f.score16 and g.act16 <= 4 * f.act16


def test_masked_scores_count_as_activations() -> None:
    """A mask read from the stage's inputs keeps 2.5.0 from fusing the attention (exMatMul, exSoftmax13: the
    scores are held, Lumina-Image-2.0 at its width); a constant bias on the scores does not."""
    plain = model_features(_attention(tokens=64), device="npu")
    const = model_features(_attention(tokens=64, mask="constant"), device="npu")
    masked = model_features(_attention(tokens=64, mask="input"), device="npu")
    score = 4 * 64 * 64 * 2
    assert const.score16 == plain.score16 == score and const.act16 == plain.act16 < score
    assert masked.score16 == masked.head16 == masked.att16 == 0
    assert masked.act16 >= 2 * score  # the masked scores and the probabilities, both alive at the Softmax


def test_a_constant_held_twice_counts_once_as_the_compile_stores_it() -> None:
    """RoPE's tables folded once for q and again for k: ``rkpart compile`` merges the copies
    (dedupe-constants), so the weight feature counts each distinct constant once."""
    m = _attention(heads=4, tokens=32, dim=16)
    base = model_features(m, device="npu").weight16
    for t in m.graph.initializer:
        if t.name == "Wk":
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(
                next(x for x in m.graph.initializer if x.name == "Wq")), "Wk"))
    assert model_features(m, device="npu").weight16 == base - 16 * 16 * 2
    # one element apart: two constants
    wq = numpy_helper.to_array(next(x for x in m.graph.initializer if x.name == "Wq")).copy()
    wq[15, 15] += 1.0
    next(x for x in m.graph.initializer if x.name == "Wk").CopyFrom(numpy_helper.from_array(wq, "Wk"))
    assert model_features(m, device="npu").weight16 == base


def _ffn(act: str, tokens: int = 32, dim: int = 16, hidden: int = 64) -> onnx.ModelProto:
    """``x -MatMul-> +bias -> act -> MatMul -> +bias -> y`` with the activation written as ``act``:
    ``gelu`` (the Gelu op, opset 20, tanh approximation), ``erf`` (TorchScript's exact form),
    ``tanh`` (the tanh form as rkpart lowers it to opset 19), ``silu`` (Sigmoid, Mul: no GELU) or
    ``gate`` (a Tanh that mixes in a second activation: no GELU either)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("W1", (dim, hidden)), ("b1", (hidden,)), ("W2", (hidden, dim)), ("b2", (dim,)))]

    def c(name: str, v: float) -> str:
        inits.append(numpy_helper.from_array(np.array(v, np.float32), name))
        return name

    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h"])]
    if act == "gelu":
        nodes.append(helper.make_node("Gelu", ["h"], ["g"], approximate="tanh"))
    elif act == "erf":
        nodes += [helper.make_node("Div", ["h", c("s2", 1.4142135)], ["e0"]), helper.make_node("Erf", ["e0"], ["e1"]),
                  helper.make_node("Add", ["e1", c("one", 1.0)], ["e2"]), helper.make_node("Mul", ["h", "e2"], ["e3"]),
                  helper.make_node("Mul", ["e3", c("half", 0.5)], ["g"])]
    elif act == "tanh":
        nodes += [helper.make_node("Mul", ["h", "h"], ["x2"]), helper.make_node("Mul", ["h", "x2"], ["x3"]),
                  helper.make_node("Mul", [c("k", 0.044715), "x3"], ["kx3"]),
                  helper.make_node("Add", ["h", "kx3"], ["i"]),
                  helper.make_node("Mul", [c("b", 0.79788456), "i"], ["bi"]), helper.make_node("Tanh", ["bi"], ["t"]),
                  helper.make_node("Add", [c("one", 1.0), "t"], ["t1"]), helper.make_node("Mul", ["h", "t1"], ["m"]),
                  helper.make_node("Mul", [c("half", 0.5), "m"], ["g"])]
    elif act == "silu":
        nodes += [helper.make_node("Sigmoid", ["h"], ["sg"]), helper.make_node("Mul", ["h", "sg"], ["g"])]
    else:  # gate: tanh of the hidden times the boundary input's projection (two activations in)
        nodes += [helper.make_node("Tanh", ["h"], ["t"]), helper.make_node("MatMul", ["x", "W1"], ["xg"]),
                  helper.make_node("Mul", ["t", "xg"], ["g"])]
    nodes += [helper.make_node("MatMul", ["g", "W2"], ["y0"]), helper.make_node("Add", ["y0", "b2"], ["y"])]
    g = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, dim])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20 if act == "gelu" else 17)])


def test_a_gelu_counts_as_the_npus_fused_layer_whatever_form_the_export_wrote() -> None:
    x16, h16 = 32 * 16 * 2, 32 * 64 * 2
    act = {}
    for form in ("gelu", "erf", "tanh"):
        model = _ffn(form)
        mg = graph_of(model, "<ffn>")
        (region,) = gelu_regions(mg, mg.ops.nodes)
        assert region.output == "g" and region.source == "h0"  # the bias Add is inside: only the GELU reads it
        assert region.fused_into is not None and mg.op(region.fused_into).op_type == "MatMul"
        act[form] = model_features(model, device="npu").act16
    # ConvExGelu: the MatMul's input, then the GELU's output at GELU_BUFFER times; nothing in between
    assert act == {f: x16 + GELU_BUFFER * h16 for f in act}
    # not a GELU: counted tensor by tensor (SiLU: input, sigmoid, product; the gate reads a second activation)
    for form in ("silu", "gate"):
        model = _ffn(form)
        mg = graph_of(model, "<ffn>")
        assert gelu_regions(mg, mg.ops.nodes) == []
        assert model_features(model, device="npu").act16 < x16 + GELU_BUFFER * h16
    assert model_features(_ffn("silu"), device="npu").act16 == 3 * h16  # h0 dead after the bias Add


def _row(w16: int, act: int, att: int, head: int, weight: int, internal: int, fit: bool = True,
         shape: str = "s", hnorm: int = 0, psum: int = 0, family: str = "t") -> MemoryRow:
    return MemoryRow(family=family, shape=shape, strategy="split", stage="x", toolkit="9.9", fit=fit,
                     features=MemoryFeatures(weight16=w16, act16=act, att16=att, score16=8 * head, head16=head,
                                             io16=act // 4, hnorm16=hnorm, psum16=psum),
                     weight_bytes=weight, internal_bytes=internal)


def _compiler(act: int, att: int, head: int, hnorm: int = 0, psum: int = 0) -> int:
    """A compiler whose buffers hold the activations as counted, the attention's workspace of 4 heads
    above them at 1.6 times, half the per-head norms' tensors and the tiled MatMuls' outputs once more."""
    return int(1.0 * act + 1.6 * max(0, att + 4 * head - act) + 0.5 * hnorm + psum) + 65536


def test_fit_recovers_the_workspace_and_reports_held_out_error() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for k in range(16):
        w16, act, head = (int(x) for x in rng.integers(1 << 20, 1 << 26, size=3))
        att = int(act * rng.uniform(0.2, 0.9))
        hnorm = 0 if k % 2 else int(rng.integers(1 << 20, 1 << 24))  # half the stages have q/k norms
        psum = 0 if k % 3 else int(rng.integers(1 << 20, 1 << 24))  # a third tile a MatMul
        rows.append(_row(w16, act, att, head, weight=w16 + 4096, internal=_compiler(act, att, head, hnorm, psum),
                         shape=f"s{k % 4}", hnorm=hnorm, psum=psum, family=f"f{k % 4}"))
    model = fit_memory_model(rows, "9.9")
    coef = dict(zip(INTERNAL_TERMS, model.internal, strict=True))
    assert coef["hnorm16"] == pytest.approx(0.5, rel=0.02) and coef["psum16"] == pytest.approx(1.0, rel=0.02)
    assert coef["act16"] == pytest.approx(1.0, rel=0.02) and coef["attx16"] == pytest.approx(1.6, rel=0.02)
    assert model.workspace_heads == 4.0  # chosen by leave-one-family-out cross-validation
    assert within(model, rows, 0.01) == 1.0 and model.samples == 16
    assert model.fit_error["cross_validation"]["4"]["within_10"] == 1.0
    assert MemoryModel.from_json(json.loads(json.dumps(model.to_json()))) == model
    # held out by family: every fold predicts the family it did not see
    pairs = leave_one_family_out(rows, "9.9")
    assert len(pairs) == 16 and error_table(pairs)["within_10"] == 1.0
    big = 1 << 28
    held = [_row(big, big, big // 2, big // 4, weight=big + 4096,
                 internal=_compiler(big, big // 2, big // 4, big // 8), fit=False, hnorm=big // 8)]
    ship = held_out_summary(model, [(r, model.predict(r.features)) for r in held], fitted_on="synthetic",
                            held_out="one bigger row")
    assert ship["fit_error"]["held_out"]["within_10"] == 1.0 and ship["fit_error"]["held_out"]["n"] == 1
    # the shipped form is a cost-model component over Features, predicting the same bytes
    comp = Component.from_json("device_mem", ship)
    assert set(comp.terms) == {"const", "weight16", "act16", "npu_attx16:4", "hnorm16", "gqa16", "psum16"}
    f = held[0].features
    feats = Features(device="npu", **{k: getattr(f, k) for k in ("weight16", "act16", "att16", "score16", "head16",
                                                                 "io16", "hnorm16", "gqa16", "psum16")})
    assert comp.predict(feats) == pytest.approx(model.predict(f), rel=1e-5)


def test_the_budget_margin_covers_the_held_out_under_prediction() -> None:
    rows = [_row(1 << 20, 1 << 20, 0, 0, weight=1 << 20, internal=1 << 20, shape=f"s{k}") for k in range(20)]
    # 19 stages predicted exactly, one 20 % under: the margin is the 95th percentile of compiler / predicted - 1
    pairs = [(r, float(r.device_bytes) * (0.8 if k == 0 else 1.0)) for k, r in enumerate(rows)]
    t = error_table(pairs)
    assert t["worst_under"] == pytest.approx(-20.0) and t["within_10"] == 0.95
    assert t["budget_margin"] == pytest.approx(0.25 * 0.05, rel=1e-3)  # interpolated between 0 and +25 %
    assert budget_margin({"held_out": t}) == t["budget_margin"]
    assert budget_margin({"held_out": {"p90_ape": 4.0}}) == pytest.approx(0.04)  # an older predictor: its p90
    assert budget_margin({}) is None
    over = error_table([(r, 1.5 * r.device_bytes) for r in rows])
    assert over["budget_margin"] == 0.0 and over["worst_under"] == 0.0


def test_a_damaged_memory_model_is_refused() -> None:
    good = fit_memory_model([_row(1 << 20, 1 << 20, 0, 1 << 10, 1 << 20, 1 << 21)], "9.9").to_json()
    for bad in ({**good, "version": 1}, {**good, "internal": {**good["internal"], "act16": float("nan")}},
                {**good, "weight": {"const": 1.0}}, {**good, "workspace_heads": -1}):
        with pytest.raises(ValueError):
            MemoryModel.from_json(bad)
    doc = CostModel.load(default_model_path()).to_json()
    doc["device_memory"] = {"2.5.0": {"terms": {"act16": -1.0}}}
    with pytest.raises(SpecError, match="device_mem: coefficient of act16 must be a number >= 0"):
        CostModel.from_json(doc)


def test_selection_takes_the_compilers_figure_over_a_prediction() -> None:
    model = CostModel.load(default_model_path())
    comp = Component("device_mem", ("const", "weight16", "act16"), (1.0, 1.0, 1.0), source="compiler tables")
    model = dataclasses.replace(model, device_memory={"9.9": comp})
    term = memory_term(model)
    assert term is not None and term.component == "device_mem"
    f = Features(device="npu", weight_bytes=4000, peak_bytes=10_000, weight16=2000, act16=500)
    dev, _, src = stage_memory(model, f, term, "9.9")
    assert (dev, src) == (2501.0, "predicted")  # the toolkit's own predictor, fp16 features
    compiled = dataclasses.replace(f, compiled_mem_bytes=7777)
    dev, _, src = stage_memory(model, compiled, term, "9.9")
    assert (dev, src) == (7777.0, "compiler")
    # never below the weights the stage must hold
    low = Component("device_mem", ("const", "weight16"), (0.0, 0.1), source="compiler tables")
    dev, _, _ = stage_memory(dataclasses.replace(model, device_memory={"9.9": low}), f, term, "9.9")
    assert dev == 2000.0


def _norms(tokens: int = 8, heads: int = 4, d: int = 16) -> onnx.ModelProto:
    """Per-head q/k norms in the spellings exporters write, and norms that are not per head::

        q[1,T,H,d] -Pow-ReduceMean(-1)-Add-Sqrt-Div-Mul-> qn           (RMSNorm, hand-written)
        k[1,T,H,d] -ReduceMean(-1)-Sub-Pow-ReduceMean(-1)-...-> kn     (LayerNorm, hand-written: 2 means)
        v[1,H,T,d] -LayerNormalization-> vn                            (the op, heads in front)
        x[1,T,D]   -LayerNormalization-> xn                            (the hidden: not per head)
        q          -ReduceMean(axis 1)-> qm                            (not over the last axis)
    """
    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("two", 2.0), ("eps", 1e-6))]
    inits += [numpy_helper.from_array(np.ones(d, np.float32), "g"),
              numpy_helper.from_array(np.zeros(d, np.float32), "b"),
              numpy_helper.from_array(np.ones(heads * d, np.float32), "gx"),
              numpy_helper.from_array(np.zeros(heads * d, np.float32), "bx")]
    nodes = [helper.make_node("Pow", ["q", "two"], ["q2"]),
             helper.make_node("ReduceMean", ["q2"], ["qms"], axes=[-1]),
             helper.make_node("Add", ["qms", "eps"], ["qe"]), helper.make_node("Sqrt", ["qe"], ["qs"]),
             helper.make_node("Div", ["q", "qs"], ["qd"]), helper.make_node("Mul", ["qd", "g"], ["qn"]),
             helper.make_node("ReduceMean", ["k"], ["km"], axes=[-1]), helper.make_node("Sub", ["k", "km"], ["kc"]),
             helper.make_node("Pow", ["kc", "two"], ["kc2"]),
             helper.make_node("ReduceMean", ["kc2"], ["kv"], axes=[-1]),
             helper.make_node("Add", ["kv", "eps"], ["kve"]), helper.make_node("Sqrt", ["kve"], ["ks"]),
             helper.make_node("Div", ["kc", "ks"], ["kn"]),
             helper.make_node("LayerNormalization", ["v", "g", "b"], ["vn"], axis=-1),
             helper.make_node("LayerNormalization", ["x", "gx", "bx"], ["xn"], axis=-1),
             helper.make_node("ReduceMean", ["q"], ["qm"], axes=[1])]
    ins = [helper.make_tensor_value_info("q", f, [1, tokens, heads, d]),
           helper.make_tensor_value_info("k", f, [1, tokens, heads, d]),
           helper.make_tensor_value_info("v", f, [1, heads, tokens, d]),
           helper.make_tensor_value_info("x", f, [1, tokens, heads * d])]
    outs = [helper.make_tensor_value_info(n, f, sh) for n, sh in (
        ("qn", [1, tokens, heads, d]), ("kn", [1, tokens, heads, d]), ("vn", [1, heads, tokens, d]),
        ("xn", [1, tokens, heads * d]), ("qm", [1, 1, heads, d]))]
    g = helper.make_graph(nodes, "norms", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_per_head_norms_are_counted_once_each_whatever_their_spelling() -> None:
    model = _norms(tokens=8, heads=4, d=16)
    mg = graph_of(model, "<norms>")
    # the RMSNorm by the tensor its mean reads (q squared: q's size), the LayerNorm once (k), the op
    # (v); not the hidden-size norm, not a mean over another axis
    assert head_norm_inputs(mg, mg.ops.nodes) == ["q2", "k", "v"]
    per_tensor = 2 * 8 * 4 * 16
    assert model_features(model, device="npu").hnorm16 == 3 * per_tensor
    # a stage without the norms has none
    ffn = model_features(_ffn("gelu"), device="npu")
    assert ffn.hnorm16 == 0


def _gqa(tokens: int = 16, kv_heads: int = 2, rep: int = 3, d: int = 8, bias: bool = True) -> onnx.ModelProto:
    """Lumina2's key/value repeat (``repeat_interleave`` as TorchScript writes it): ``x -MatMul(W)-> (+b) ->
    Reshape [1,T,n,d] -> Unsqueeze(3) -> Tile [1,1,1,r,1] -> Reshape [1,T,n*r,d]``, for the values straight from
    their projection and for the keys through a per-token scale (an activation: a norm or RoPE stands there)."""
    dim = kv_heads * d
    hidden = kv_heads * rep * d
    inits = [numpy_helper.from_array(np.full((hidden, dim), 0.5, np.float32), "Wv"),
             numpy_helper.from_array(np.full((hidden, dim), 0.25, np.float32), "Wk"),
             numpy_helper.from_array(np.full((dim,), 0.1, np.float32), "bv"),
             numpy_helper.from_array(np.array([1, tokens, kv_heads, d], np.int64), "heads"),
             numpy_helper.from_array(np.array([3], np.int64), "ax"),
             numpy_helper.from_array(np.array([1, 1, 1, rep, 1], np.int64), "reps"),
             numpy_helper.from_array(np.array([1, tokens, kv_heads * rep, d], np.int64), "merged")]
    nodes = [helper.make_node("MatMul", ["x", "Wv"], ["v0"])]
    if bias:
        nodes.append(helper.make_node("Add", ["v0", "bv"], ["v"]))
    nodes += [helper.make_node("Reshape", ["v" if bias else "v0", "heads"], ["vh"]),
              helper.make_node("MatMul", ["x", "Wk"], ["k"]),
              helper.make_node("Reshape", ["k", "heads"], ["kh0"]),
              helper.make_node("Mul", ["kh0", "s"], ["kh"])]
    for n in ("v", "k"):
        nodes += [helper.make_node("Unsqueeze", [f"{n}h", "ax"], [f"{n}u"]),
                  helper.make_node("Tile", [f"{n}u", "reps"], [f"{n}t"]),
                  helper.make_node("Reshape", [f"{n}t", "merged"], [f"{n}r"])]
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("x", f, [1, tokens, hidden]),
           helper.make_tensor_value_info("s", f, [1, tokens, 1, 1])]
    outs = [helper.make_tensor_value_info(n, f, [1, tokens, kv_heads * rep, d]) for n in ("vr", "kr")]
    g = helper.make_graph(nodes, "gqa", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_kv_repeat_read_from_its_projection_is_stored_as_the_repeated_weight() -> None:
    """2.5.0 folds kv-repeat-gather's Gather of heads into the values' projection (Lumina-Image-2.0: to_v stored
    with 2304 output channels for 768); the keys' repeat, behind an activation, is gathered on the NPU."""
    hidden, dim, rep = 48, 16, 3
    f = model_features(_gqa(rep=rep), device="npu")
    assert f.kvfold16 == (rep - 1) * (hidden * dim + dim) * 2  # Wv and its bias, twice more
    assert model_features(_gqa(rep=rep, bias=False), device="npu").kvfold16 == (rep - 1) * hidden * dim * 2
    assert model_features(_ffn("gelu"), device="npu").kvfold16 == 0
    # the toolkits whose compiler stores it count it at weight16's coefficient, the others not at all
    feats = [dataclasses.replace(MemoryFeatures.from_json(f.to_json()), weight16=w, kvfold16=k)
             for w, k in ((4 << 20, 0), (8 << 20, 0), (6 << 20, 3 << 20), (10 << 20, 0))]
    for tk, stored in (("2.5.0", True), ("2.3.0", False)):
        rows = [MemoryRow(family=f"fam{k}", shape="s", strategy="split", stage="b", toolkit=tk, fit=True,
                          features=x, weight_bytes=x.weight16 + (x.kvfold16 if stored else 0) + 4096,
                          internal_bytes=x.act16 + 1000) for k, x in enumerate(feats)]
        model = fit_memory_model(rows, tk)
        assert model.predict_parts(feats[2])[0] == pytest.approx(rows[2].weight_bytes, rel=1e-3)
        assert (model.weight[2] > 0) is stored


def test_2_3_0_counts_a_masked_attention_fused_and_its_nan_guard_never_built() -> None:
    """2.5.0 holds a masked attention's scores (``act16``); 2.3.0 fuses it once ``guard-after-product`` has moved the
    ``nan-guard`` factor past the product (Lumina2's main attention at real width: 62 MiB of internal memory, +180 %
    predicted from the scores): the ``f*`` features leave its scores out, and neither counts the guard's bool and
    copy of the probabilities, which ``nan-guard`` rewrites into the product."""
    t = 64
    plain = model_features(_attention(tokens=t), device="npu")
    masked = model_features(_attention(tokens=t, mask="input", guard=True), device="npu")
    scores = 4 * t * t * 2
    assert masked.act16 >= scores and masked.att16 == 0  # 2.5.0: held, no fused attention
    # 2.3.0: fused; the mask, a stage input, is the only activation more than the plain attention's
    assert masked.fhead16 == plain.head16 == t * t * 2
    assert masked.fact16 - plain.act16 == t * t * 2 == masked.fatt16 - plain.att16
    assert (plain.fact16, plain.fatt16, plain.fhead16) == (plain.act16, plain.att16, plain.head16)
    guarded = model_features(_attention(tokens=t, guard=True), device="npu")
    assert (guarded.act16, guarded.att16) == (plain.act16, plain.att16)


@pytest.mark.slow  # a fit with its workspace chosen by cross-validation: seconds of numpy on a loaded machine
def test_the_2_3_0_form_reads_the_fused_peak_and_ships_as_a_component() -> None:
    """2.3.0's form (``internal_terms``): the fused peak, the boundary tensors, per-head norms, repeated KV heads;
    the shipped component predicts what the model does, through the cost model's ``npu_fpeak16:R``."""
    plain = model_features(_attention(tokens=64), device="npu")
    masked = model_features(_attention(tokens=64, mask="input", guard=True), device="npu")
    rows = [MemoryRow(family=f"f{k}", shape="s", strategy="split", stage="x", toolkit="2.3.0", fit=True,
                      features=dataclasses.replace(f, weight16=f.weight16 * (k + 1), io16=f.io16 * (3 - k)),
                      weight_bytes=f.weight16 * (k + 1) + 4096, internal_bytes=0)
            for k, f in enumerate(MemoryFeatures.from_json(x.to_json()) for x in (plain, masked, masked, plain))]
    rows = [dataclasses.replace(r, internal_bytes=int(1.1 * r.features.value("fpeak16", 4) + 0.8 * r.features.io16)
                                + 65536) for r in rows]
    model = fit_memory_model(rows, "2.3.0")
    assert within(model, rows, 0.01) == 1.0
    comp = Component.from_json("device_mem", held_out_summary(model, [], fitted_on="synthetic", held_out="none"))
    assert set(comp.terms) == {"const", "weight16", f"npu_fpeak16:{model.workspace_heads:g}", "io16", "hnorm16",
                               "gqa16"}
    for r in rows:
        assert comp.predict(Features(device="npu", **r.features.to_json())) == pytest.approx(
            model.predict(r.features), rel=1e-5)


def test_a_masked_attention_cut_into_row_chunks_stores_its_row_gather() -> None:
    """masked-attention-row-chunks cuts a masked attention of 512 query rows or more into chunks; 2.5.0 gathers
    the chunks' queries with a rows x rows one-hot Conv (Lumina-Image-2.0: 1280 x 1280, 3.1 MiB)."""
    assert model_features(_attention(tokens=512, mask="input"), device="npu").rowgather16 == 2 * 512 * 512
    # fewer rows (not cut), a constant mask or none (fused as it is): nothing stored
    assert model_features(_attention(tokens=256, mask="input"), device="npu").rowgather16 == 0
    assert model_features(_attention(tokens=512, mask="constant"), device="npu").rowgather16 == 0
    assert model_features(_attention(tokens=512), device="npu").rowgather16 == 0


def test_a_gelus_tile_buffers_live_while_the_matmuls_of_its_input_run() -> None:
    """A single-stream block: x feeds the MLP's MatMul (GELU fused) and the attention's; the GELU's output lives
    until the Concat. The compiler holds the GELU's 3x while the MatMuls reading x run and reuses the rest of it
    afterwards (Flux, 2.5.0: the Concat lives in the tiles' region)."""
    t, d, h = 32, 16, 64
    inits = [numpy_helper.from_array(np.full(sh, 0.01, np.float32), n)
             for n, sh in (("Wm", (d, h)), ("Wa", (d, d)), ("Wb", (d, d)), ("Wo", (d + h, d)))]
    nodes = [helper.make_node("MatMul", ["x", "Wm"], ["m"]), helper.make_node("Gelu", ["m"], ["g"]),
             helper.make_node("MatMul", ["x", "Wa"], ["a"]), helper.make_node("MatMul", ["a", "Wb"], ["b"]),
             helper.make_node("Concat", ["b", "g"], ["c"], axis=-1), helper.make_node("MatMul", ["c", "Wo"], ["y"])]
    g = helper.make_graph(nodes, "single", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, t, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, t, d])], inits)
    f = model_features(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), device="npu")
    td = t * d * 2  # one token x hidden tensor at fp16
    # at the attention's MatMul of x: x, the GELU's output with its two more buffers, a; at the Concat (b, g once
    # and the Concat) less: counted for the GELU's whole life, the Concat would have been 18 td
    assert f.act16 == td + GELU_BUFFER * 4 * td + td
    assert f.act16 < (GELU_BUFFER * 4 + 1 + 5) * td


def _swiglu(cast: bool) -> onnx.ModelProto:
    """``x -MatMul(W1)-> h -SiLU-> s``, ``x -MatMul(W3)-> u``, ``s * u -MatMul(W2)-> y``: a SwiGLU FFN, its SiLU
    written ``Mul(h, Sigmoid(h))`` (``cast``: between float Casts, as an fp32 export's autocast writes it)."""
    t, d, h = 32, 16, 64
    inits = [numpy_helper.from_array(np.full(sh, 0.01, np.float32), n)
             for n, sh in (("W1", (d, h)), ("W3", (d, h)), ("W2", (h, d)))]
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"])]
    if cast:
        nodes += [helper.make_node("Cast", ["h"], ["hc"], to=f), helper.make_node("Sigmoid", ["hc"], ["sg"]),
                  helper.make_node("Mul", ["hc", "sg"], ["sm"]), helper.make_node("Cast", ["sm"], ["s"], to=f)]
    else:
        nodes += [helper.make_node("Sigmoid", ["h"], ["sg"]), helper.make_node("Mul", ["h", "sg"], ["s"])]
    nodes += [helper.make_node("MatMul", ["x", "W3"], ["u"]), helper.make_node("Mul", ["s", "u"], ["p"]),
              helper.make_node("MatMul", ["p", "W2"], ["y"])]
    g = helper.make_graph(nodes, "swiglu", [helper.make_tensor_value_info("x", f, [1, t, d])],
                          [helper.make_tensor_value_info("y", f, [1, t, d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_silu_is_held_as_the_npus_swish_layer_until_its_gate_product() -> None:
    """2.5.0's ``exSwish`` holds its output at 2x the tensor for the output's whole life and never materialises the
    Sigmoid (AuraFlow's, Lumina2's, Sana's FFN tables): in a SwiGLU the 2x is held while the up projection runs."""
    x16, h16 = 32 * 16 * 2, 32 * 64 * 2
    for cast in (False, True):
        model = _swiglu(cast)
        mg = graph_of(model, "<swiglu>")
        ((inside, held),) = swish_outputs(mg, mg.ops.nodes)
        assert held == "s" and inside == (("sg", "sm") if cast else ("sg",))
        # at the up projection: x, the SiLU's output at SWISH_BUFFER times, u (h and the Sigmoid are gone);
        # at the product: s twice, u and p
        assert model_features(model, device="npu").act16 == max(x16 + SWISH_BUFFER * h16 + h16,
                                                                  (SWISH_BUFFER + 2) * h16)
    # a Sigmoid that gates another tensor is no SiLU: counted tensor by tensor
    gate = _swiglu(False)
    gate.graph.node[2].input[0] = "u0"
    gate.graph.node.insert(1, helper.make_node("MatMul", ["x", "W3"], ["u0"]))
    mg = graph_of(gate, "<gate>")
    assert swish_outputs(mg, mg.ops.nodes) == []
