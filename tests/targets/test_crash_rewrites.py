"""Rewrites found on the family exports: 2.5.0 crashes avoided, Lumina2's GQA Tile; recognisers; real builds.

Data (``tests/targets/data``), recorded this way: a tiny HunyuanDiT exported by dynamo (split
plan, cross-attention stage) and a tiny Chroma (fused plan, double block) crashed rknn-toolkit2
2.5.0 with SIGSEGV; ``rkpart repro --toolkits 2.5.0`` reduced them to
``segv_layernorm_scale_2.5.0.onnx`` (8 nodes) and ``segv_slice_slice_concat_2.5.0.onnx``
(3 nodes), now the known-issue table's reproducers (``rkpart/data/known_issues``); the ``.log`` files
are the verbose build logs of the reduced and the original stages.
A tiny HunyuanVideo exported by dynamo (split plan, single-stream block's ``attn_mlp.1`` stage,
lowered with ``--no-rewrites``) crashed 2.5.0 in the same fusion on ``Concat(x[:, :-6], x[:, -6:])``;
``rkpart repro`` reduced it to ``segv_contiguous_slices_concat_2.5.0.onnx`` (5 nodes).
A tiny Sana-WM exported by dynamo (split plan, a linear-attention stage, 478 nodes) fails 2.3.0's
optimiser: ``rkpart repro --toolkits 2.3.0 --fail-regex "KeyError: '[^']*-rs'"`` reduced it to
``fail_single_split_2.3.0.onnx`` (a Split into one piece, two Gathers, a MatMul); with that Split
gone the stage fails again, and ``--fail-regex "Can not reshape from"`` reduced that to
``fail_shared_matmul_constant_2.3.0.onnx`` (3 MatMuls, two reading one constant).  A tiny
Sana-WM-refiner exported by TorchScript (split plan, attention stage, 91 nodes) fails 2.3.0's
constant folding: ``--fail-regex "Can't merge shape info"`` reduced it to
``fail_gather_input_concat_2.3.0.onnx`` (2 Gathers of one index of KV-cache inputs, 2 Casts, a Concat).
A tiny Sana-WM exported by TorchScript (split plan, a linear-attention stage, 563 nodes) fails 2.3.0's
``_p_remove_parallel_node``: ``--fail-regex "_p_remove_parallel_node"`` reduced it to
``fail_wide_tensor_readers_2.3.0.onnx`` (38 nodes; a rank-5 gate read by three Muls).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.targets.known_issues import (
    EXNORM_FUSION_SEGV,
    EXNORM_SCALE_SEGV_250,
    KNOWN_ISSUES,
    SLICE_CONCAT_SEGV_250,
    KnownIssue,
    match_log,
)
from rkpart.targets.known_issues_repro import DATA as REPRO_DATA
from rkpart.targets.known_issues_repro import Reproducer
from rkpart.targets.rewrites import apply_rewrites, rewrites_for

DATA = Path(__file__).parent / "data"
REPRO = REPRO_DATA  # the reduced crash graphs are the known-issue table's reproducers (rkpart/data/known_issues)
LN_SCALE = REPRO / "segv_layernorm_scale_2.5.0.onnx"
SINGLE_SPLIT = DATA / "fail_single_split_2.3.0.onnx"
SHARED_CONSTANT = DATA / "fail_shared_matmul_constant_2.3.0.onnx"
GATHER_INPUT = DATA / "fail_gather_input_concat_2.3.0.onnx"
WIDE_READERS = DATA / "fail_wide_tensor_readers_2.3.0.onnx"
SLICE_CONCAT = REPRO / "segv_slice_slice_concat_2.5.0.onnx"
CONTIGUOUS = REPRO / "segv_contiguous_slices_concat_2.5.0.onnx"


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(x) for x in sess.run(None, feeds)]


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


def _rewritten(path: Path, toolkit: str) -> tuple[onnx.ModelProto, onnx.ModelProto, dict[str, int]]:
    before = onnx.load(str(path))
    after = onnx.load(str(path))
    done = apply_rewrites(after, rewrites_for(toolkit, "npu"))
    onnx.checker.check_model(after, full_check=True)
    return before, after, done


@pytest.mark.parametrize(("path", "rule", "gone"), [(LN_SCALE, "layernorm-scale-fold", "Mul"),
                                                    (SLICE_CONCAT, "strided-slices-concat", "Concat"),
                                                    (CONTIGUOUS, "strided-slices-concat", "Concat")])
def test_reproducer_is_rewritten_exactly_for_250_only(path: Path, rule: str, gone: str) -> None:
    before, after, done = _rewritten(path, "2.5.0")
    assert done == {rule: 1}
    n_gone = sum(n.op_type == gone for n in before.graph.node) - sum(n.op_type == gone for n in after.graph.node)
    assert n_gone == 1
    feeds = _feeds(before)
    for x, y in zip(_run(before, feeds), _run(after, feeds), strict=True):
        np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-6)
    assert rule not in apply_rewrites(onnx.load(str(path)), rewrites_for("2.3.0", "npu"))


def _slices_concat(starts: list[int], length: int, n: int = 32) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits, nodes, parts = [], [], []
    for j, s in enumerate(starts):
        for tag, v in (("s", s), ("e", s + length), ("a", 1)):
            inits.append(numpy_helper.from_array(np.array([v], dtype=np.int64), f"{tag}{j}"))
        nodes.append(helper.make_node("Slice", ["x", f"s{j}", f"e{j}", f"a{j}"], [f"p{j}"]))
        parts.append(f"p{j}")
    nodes.append(helper.make_node("Concat", parts, ["y"], axis=1))
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("starts", "length", "rewritten"), [
    ([6, 18], 6, True),  # Chroma block 0's pieces
    ([12, 24], 6, True),  # block 1's: the window of two periods is shifted to stay inside the axis
    ([0, 10, 20], 4, True),
    ([6, 18], 7, True),
    ([6, 19], 6, True),  # any two ordered, non-overlapping pieces of one length
    ([0, 10, 21], 4, False),  # not equally spaced
    ([18, 6], 6, False),  # out of order
    ([0, 4], 6, False),  # overlapping
    ([20, 28], 6, False),  # no window of two periods fits
])
def test_strided_slices_concat_only_where_exact(starts: list[int], length: int, rewritten: bool) -> None:
    before = _slices_concat(starts, length)
    after = _slices_concat(starts, length)
    done = apply_rewrites(after, rewrites_for("2.5.0", "npu"))
    assert done == ({"strided-slices-concat": 1} if rewritten else {})
    feeds = _feeds(before)
    np.testing.assert_array_equal(_run(after, feeds)[0], _run(before, feeds)[0])


BIG = 2**63 - 1  # what exporters write for x[:, a:]


def _pieces_concat(spans: list[tuple[int, int]], n: int = 22) -> onnx.ModelProto:
    """``Concat(x[:, a0:b0], x[:, a1:b1], ...)`` over ``x`` (1, n, 8), bounds as written (negative, INT64_MAX)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits, nodes = [], []
    for j, (a, b) in enumerate(spans):
        for tag, v in (("s", a), ("e", b), ("a", 1)):
            inits.append(numpy_helper.from_array(np.array([v], dtype=np.int64), f"{tag}{j}"))
        nodes.append(helper.make_node("Slice", ["x", f"s{j}", f"e{j}", f"a{j}"], [f"p{j}"]))
    nodes.append(helper.make_node("Concat", [f"p{j}" for j in range(len(spans))], ["y"], axis=1))
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("spans", "op"), [
    ([(0, -6), (-6, BIG)], "Identity"),  # HunyuanVideo's image and text tokens, joined again
    ([(0, 10), (10, 16), (16, 22)], "Identity"),
    ([(2, 10), (10, -1)], "Slice"),  # adjacent but not all of x: one Slice
    ([(-20, -10), (-10, 30)], "Slice"),  # bounds past the end are clamped, as ONNX Runtime does
    ([(10, BIG), (0, 10)], None),  # the halves swapped: a roll, not a span
    ([(0, 10), (11, 22)], None),  # a gap and unequal lengths: neither form
])
def test_adjacent_slices_concat_becomes_one_span(spans: list[tuple[int, int]], op: str | None) -> None:
    before, after = _pieces_concat(spans), _pieces_concat(spans)
    done = apply_rewrites(after, rewrites_for("2.5.0", "npu"))
    assert done == ({"strided-slices-concat": 1} if op else {})
    if op:
        assert [n.op_type for n in after.graph.node] == [op]
    feeds = _feeds(before)
    np.testing.assert_array_equal(_run(after, feeds)[0], _run(before, feeds)[0])


def test_layernorm_scale_fold_leaves_a_norm_read_elsewhere() -> None:
    """The LayerNorm's result also read by another node: folding would change that reader, so no rewrite."""
    model = onnx.load(str(LN_SCALE))
    ln = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    model.graph.output.append(helper.make_tensor_value_info(ln.output[0], TensorProto.FLOAT, None))
    assert apply_rewrites(model, rewrites_for("2.5.0", "npu")) == {}


def test_250_crashes_are_recognised_and_not_mislabelled() -> None:
    hy = (DATA / "segv_hunyuandit_xattn_2.5.0.log").read_text()  # last step convert_exmatmul_to_conv
    assert match_log(hy, signal="SIGSEGV", toolkit="2.5.0") is EXNORM_SCALE_SEGV_250
    assert match_log((DATA / "segv_layernorm_scale_2.5.0.log").read_text(), signal="SIGSEGV",
                     toolkit="2.5.0") is EXNORM_SCALE_SEGV_250
    # the same log from a 2.3.2 build is the AdaLN exnorm bug's signature, as before
    assert match_log(hy, signal="SIGSEGV", toolkit="2.3.2") is EXNORM_FUSION_SEGV
    for name in ("segv_chroma_block_2.5.0.log", "segv_slice_slice_concat_2.5.0.log",
                 "segv_contiguous_slices_concat_2.5.0.log"):
        text = (DATA / name).read_text()
        assert match_log(text, signal="SIGSEGV", toolkit="2.5.0") is SLICE_CONCAT_SEGV_250
        assert match_log(text, signal="SIGSEGV", toolkit="2.3.0") is None
        assert match_log(text, signal=None, toolkit="2.5.0", kind="error") is None
    assert "--fallback-toolkit 2.3.0" in EXNORM_SCALE_SEGV_250.workaround


#: the known-issue table's reproducers kept as files (rkpart/data/known_issues): the 2.5.0 crashes these
#: rewrites avoid; tests/targets/test_known_issue_reproducers.py builds the ones made by a function
FILE_REPRODUCERS = [(issue, r) for issue in KNOWN_ISSUES for r in issue.reproducers if r.file is not None]


def test_the_rewrites_reproducers_are_the_tables() -> None:
    assert {REPRO / r.file for _, r in FILE_REPRODUCERS if r.file} == {LN_SCALE, SLICE_CONCAT, CONTIGUOUS}


@pytest.mark.toolkit
@pytest.mark.parametrize(("issue", "rep"), FILE_REPRODUCERS, ids=[r.name for _, r in FILE_REPRODUCERS])
def test_reproducer_crashes_250_and_builds_once_rewritten(issue: KnownIssue, rep: Reproducer, tmp_path: Path) -> None:
    from rkpart.targets.known_issues import match_signature
    from rkpart.triage.matrix import build_once
    from tests.toolkits import get_toolkit

    assert (rep.toolkit, rep.outcome) == ("2.5.0", "SIGSEGV")
    tk = get_toolkit(rep.toolkit)
    assert rep.file is not None
    path = REPRO / rep.file
    _, after, _ = _rewritten(path, "2.5.0")
    fixed = tmp_path / "rewritten.onnx"
    onnx.save(after, str(fixed))
    crash = build_once(path, tk, target="rk3588", log=tmp_path / "before.log")
    assert not crash.ok and crash.signal == rep.outcome
    assert match_signature(crash) is issue  # it still fails the way the table records
    built = build_once(fixed, tk, target="rk3588", log=tmp_path / "after.log")
    assert built.ok, built.message


def _gqa_tile(n_rep: int, head: int = 1) -> onnx.ModelProto:
    """Lumina2's GQA repeat: k [1, 6, 1, 16] -> Unsqueeze(3) -> Tile [1,1,1,n_rep,1] -> Reshape."""
    x = helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 6, 1, head, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    reps = numpy_helper.from_array(np.array([1, 1, 1, n_rep, 1], dtype=np.int64), "reps")
    return helper.make_model(helper.make_graph([helper.make_node("Tile", ["k", "reps"], ["y"])], "g", [x], [y],
                                               [reps]), opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("n_rep", "head", "rewritten"), [(2, 1, True), (4, 1, True), (2, 2, False)])
def test_tile_broadcast_only_on_size_one_axes(n_rep: int, head: int, rewritten: bool) -> None:
    before, after = _gqa_tile(n_rep, head), _gqa_tile(n_rep, head)
    assert apply_rewrites(after, rewrites_for("2.5.0", "npu")) == ({"tile-broadcast": 1} if rewritten else {})
    assert [n.op_type for n in after.graph.node] == (["Mul"] if rewritten else ["Tile"])
    feeds = _feeds(before)
    np.testing.assert_array_equal(_run(after, feeds)[0], _run(before, feeds)[0])
    assert apply_rewrites(_gqa_tile(n_rep, head), rewrites_for("2.3.0", "npu")) == {}


#: rows every toolkit applies that match a reproducer too: the flip in the wide-tensor reduction (2 ops more)
EVERYWHERE = {"slice-reverse": 1}


@pytest.mark.parametrize(("path", "hits", "added", "versions", "everywhere"), [
    (SINGLE_SPLIT, {"single-split": 1}, 0, ("2.3.0", "2.3.2"), {}),  # its Gathers read the Split's piece
    (SHARED_CONSTANT, {"matmul-constant-per-reader": 1}, 1, ("2.3.0", "2.3.2"), {}),
    (GATHER_INPUT, {"scalar-gather-slice": 2}, 2, ("2.3.0",), {}),  # 2.3.2 builds it as it is
    (WIDE_READERS, {"wide-tensor-per-reader": 2}, 2 + 2, ("2.3.0",), EVERYWHERE)])  # 2.3.2 builds it as it is
def test_23x_failure_reproducer_is_rewritten_exactly_for_23x_only(path: Path, hits: dict[str, int], added: int,
                                                                   versions: tuple[str, ...],
                                                                   everywhere: dict[str, int]) -> None:
    for other in {"2.3.0", "2.3.2"} - set(versions):
        assert apply_rewrites(onnx.load(str(path)), rewrites_for(other, "npu")) == everywhere
    for tk in versions:
        before, after, done = _rewritten(path, tk)
        assert done == {**hits, **everywhere}
        assert len(after.graph.node) == len(before.graph.node) + added
        assert "Split" not in {n.op_type for n in after.graph.node}
        feeds = _feeds(before)
        for x, y in zip(_run(before, feeds), _run(after, feeds), strict=True):
            np.testing.assert_array_equal(y, x)
    assert apply_rewrites(onnx.load(str(path)), rewrites_for("2.5.0", "npu")) == everywhere


def _splits(outputs: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 8])
    ys = [helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, None) for j in range(outputs)]
    size = numpy_helper.from_array(np.array([4 // outputs] * outputs, dtype=np.int64), "size")
    split = helper.make_node("Split", ["x", "size"], [f"s{j}" for j in range(outputs)], axis=2)
    negs = [helper.make_node("Neg", [f"s{j}"], [f"y{j}"]) for j in range(outputs)]
    return helper.make_model(helper.make_graph([split, *negs], "g", [x], ys, [size]),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("outputs", [1, 2])
def test_single_split_only_for_one_piece(outputs: int) -> None:
    before, after = _splits(outputs), _splits(outputs)
    done = apply_rewrites(after, rewrites_for("2.3.0", "npu"))
    assert done == ({"single-split": 1} if outputs == 1 else {})
    assert after.graph.node[0].op_type == ("Identity" if outputs == 1 else "Split")
    feeds = _feeds(before)
    for x, y in zip(_run(before, feeds), _run(after, feeds), strict=True):
        np.testing.assert_array_equal(y, x)


def _matmuls(shape: list[int], copies: bool) -> onnx.ModelProto:
    """Three MatMuls reading a constant ``c`` (``copies``: the third reads an equal copy ``c2``)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    ys = [helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, None) for j in range(3)]
    c = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    inits = [numpy_helper.from_array(c, "c"), numpy_helper.from_array(c.copy(), "c2")]
    nodes = [helper.make_node("MatMul", ["c", "x"], ["y0"]), helper.make_node("MatMul", ["x", "c"], ["y1"]),
             helper.make_node("MatMul", ["c2" if copies else "c", "x"], ["y2"])]
    return helper.make_model(helper.make_graph(nodes, "g", [x], ys, inits if copies else inits[:1]),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("shape", "copies", "identities"), [
    ([1, 2, 8, 8], False, 2),  # one batched constant, three readers: the second and third get their own
    ([1, 2, 8, 8], True, 2),  # an equal copy: dedupe-constants merges it first, then it is kept apart again
    ([8, 8], False, 0),  # a linear layer's weight (rank 2) stays shared
])
def test_matmul_constant_per_reader_after_dedupe(shape: list[int], copies: bool, identities: int) -> None:
    from rkpart.targets.rewrites import compile_rewrites_for

    before, after = _matmuls(shape, copies), _matmuls(shape, copies)
    done = apply_rewrites(after, compile_rewrites_for("2.3.0"))
    assert done.get("matmul-constant-per-reader", 0) == identities
    assert sum(n.op_type == "Identity" for n in after.graph.node) == identities
    readers = [n.input[k] for n in after.graph.node if n.op_type == "MatMul" for k in (0, 1) if n.input[k] != "x"]
    assert len(set(readers)) == (3 if identities else 1)
    feeds = _feeds(before)
    for x, y in zip(_run(before, feeds), _run(after, feeds), strict=True):
        np.testing.assert_array_equal(y, x)
    assert apply_rewrites(_matmuls(shape, copies), compile_rewrites_for("2.5.0")).get(
        "matmul-constant-per-reader") is None


def concats_of_a_state(rank: int, readers: int, twice: bool = False) -> onnx.ModelProto:
    """``readers`` Concats of one zeros constant of ``rank`` with a computed tensor (Sana-WM's dynamo
    chunk stacks); ``twice``: the first Concat reads the constant in two of its slots."""
    shape = [1, 2, 1, 16, 16][5 - rank:] if rank <= 5 else [1] * (rank - 5) + [1, 2, 1, 16, 16]
    axis = len(shape) - 3
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    ys = [helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, None) for j in range(readers)]
    nodes = []
    for j in range(readers):
        nodes.append(helper.make_node("Relu" if j % 2 else "Neg", ["x"], [f"h{j}"]))
        ins = ["state", f"h{j}"] + (["state"] if twice and j == 0 else [])
        nodes.append(helper.make_node("Concat", ins, [f"y{j}"], axis=axis, name=f"stack{j}"))
    state = numpy_helper.from_array(np.zeros(shape, np.float32), "state")
    return helper.make_model(helper.make_graph(nodes, "g", [x], ys, [state]),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("rank", "readers", "twice", "identities"), [
    (5, 5, False, 4),  # Sana-WM: five stacks of one rank-5 state, the last four through their own
    (5, 2, True, 1),  # the first reader's two slots read the constant itself; one Identity for the second
    (6, 3, False, 2),
    (4, 3, False, 0),  # rank 4: shared as it is (a rank-4 state alone did not fail the measured stage)
    (5, 1, True, 0),  # one reader, twice: nothing shared between Concats
])
def test_concat_constant_per_reader(rank: int, readers: int, twice: bool, identities: int) -> None:
    from rkpart.targets.rewrites import compile_rewrites_for

    before, after = concats_of_a_state(rank, readers, twice), concats_of_a_state(rank, readers, twice)
    done = apply_rewrites(after, compile_rewrites_for("2.3.0"))
    assert done.get("concat-constant-per-reader", 0) == identities
    copies = {n.output[0] for n in after.graph.node if n.op_type == "Identity" and n.input[0] == "state"}
    assert len(copies) == identities
    read = {n.name: {i for i in n.input if i == "state" or i in copies} for n in after.graph.node
            if n.op_type == "Concat"}
    assert read["stack0"] == {"state"}
    if identities:  # every other Concat reads a copy of its own
        others = [read[f"stack{j}"] for j in range(1, readers)]
        assert all(len(r) == 1 and r <= copies for r in others) and len(set().union(*others)) == readers - 1
    feeds = _feeds(before)
    for x, y in zip(_run(before, feeds), _run(after, feeds), strict=True):
        np.testing.assert_array_equal(y, x)
    assert "concat-constant-per-reader" not in apply_rewrites(concats_of_a_state(rank, readers, twice),
                                                              compile_rewrites_for("2.5.0"))


@pytest.mark.toolkit
@pytest.mark.parametrize(("path", "version"), [(SINGLE_SPLIT, "2.3.0"), (SINGLE_SPLIT, "2.3.2"),
                                               (SHARED_CONSTANT, "2.3.0"), (SHARED_CONSTANT, "2.3.2"),
                                               (GATHER_INPUT, "2.3.0"), (WIDE_READERS, "2.3.0")],
                         ids=["single-split-2.3.0", "single-split-2.3.2", "shared-constant-2.3.0",
                              "shared-constant-2.3.2", "gather-input-2.3.0", "wide-readers-2.3.0"])
def test_23x_reproducer_fails_and_builds_once_rewritten(path: Path, version: str, tmp_path: Path) -> None:
    from rkpart.triage.matrix import build_once
    from tests.toolkits import get_toolkit

    tk = get_toolkit(version)
    _, after, _ = _rewritten(path, version)
    fixed = tmp_path / "rewritten.onnx"
    onnx.save(after, str(fixed))
    failed = build_once(path, tk, target="rk3588", log=tmp_path / "before.log")
    assert not failed.ok and failed.kind == "error"
    text = (tmp_path / "before.log").read_text(errors="replace")
    assert any(m in text for m in ("KeyError", "Can not reshape", "Can't merge shape info", "is not in list"))
    built = build_once(fixed, tk, target="rk3588", log=tmp_path / "after.log")
    assert built.ok, built.message


def _wide_readers(shape: list[int], readers: int, constant: bool = False) -> onnx.ModelProto:
    """``g = Sigmoid(x)`` (``constant``: an initializer) of ``shape`` broadcast over ``readers`` products
    ``y_j = g * a_j`` of shape ``[*shape[:-2], 4, shape[-1]]``."""
    wide = [*shape[:-2], 4, shape[-1]]
    ins = [helper.make_tensor_value_info(f"a{j}", TensorProto.FLOAT, wide) for j in range(readers)]
    ys = [helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, wide) for j in range(readers)]
    inits = []
    if constant:
        inits.append(numpy_helper.from_array(np.random.default_rng(2).standard_normal(shape).astype(np.float32), "g"))
        nodes = []
    else:
        ins.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, shape))
        nodes = [helper.make_node("Sigmoid", ["x"], ["g"])]
    nodes += [helper.make_node("Mul", ["g", f"a{j}"], [f"y{j}"]) for j in range(readers)]
    return helper.make_model(helper.make_graph(nodes, "g", ins, ys, inits), opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("shape", "readers", "constant", "identities"), [
    ([1, 2, 2, 1, 16], 3, False, 2),  # Sana-WM's gate: the second and third reader get their own
    ([1, 2, 2, 1, 16], 5, False, 4),
    ([1, 2, 1, 2, 1, 8], 3, False, 2),  # rank 6
    ([1, 2, 2, 1, 16], 2, False, 0),  # two readers build as they are
    ([2, 2, 1, 16], 3, False, 0),  # rank 4: not lowered per reader
    ([1, 2, 2, 1, 16], 3, True, 0),  # a constant (matmul-constant-per-reader's, for MatMuls)
])
def test_wide_tensor_per_reader_only_for_three_readers_of_rank_above_4(shape: list[int], readers: int,
                                                                      constant: bool, identities: int) -> None:
    from rkpart.targets.rewrites import compile_rewrites_for

    before, after = _wide_readers(shape, readers, constant), _wide_readers(shape, readers, constant)
    done = apply_rewrites(after, compile_rewrites_for("2.3.0"))
    onnx.checker.check_model(after)
    assert done.get("wide-tensor-per-reader", 0) == identities
    assert [n.op_type for n in after.graph.node].count("Identity") == identities
    muls = [n for n in after.graph.node if n.op_type == "Mul"]
    assert len({n.input[0] for n in muls}) == (1 + identities if identities else 1)
    feeds = _feeds(before)
    for x, y in zip(_run(before, feeds), _run(after, feeds), strict=True):
        np.testing.assert_array_equal(y, x)
    for other in ("2.3.2", "2.5.0"):
        assert "wide-tensor-per-reader" not in apply_rewrites(_wide_readers(shape, readers, constant),
                                                              compile_rewrites_for(other))


def _gather(index: object, axis: int, shape: list[int] | None = None, computed: bool = False) -> onnx.ModelProto:
    """``y = Gather(x, index, axis)`` over the stage input ``x`` (2, 3, 4, 8) (``index`` an initializer;
    ``None``: an input; ``computed``: over ``Neg(x)``, not the input itself)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape or [2, 3, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    ins, inits = [x], []
    if index is None:
        ins.append(helper.make_tensor_value_info("i", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(index, dtype=np.int64), "i"))
    nodes = [helper.make_node("Neg", ["x"], ["nx"])] if computed else []
    nodes.append(helper.make_node("Gather", ["nx" if computed else "x", "i"], ["y"], axis=axis))
    return helper.make_model(helper.make_graph(nodes, "g", ins, [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("index", "axis", "shape", "computed", "rewritten"), [
    (0, 0, None, False, True),  # Sana-WM-refiner's layer of the KV cache
    (1, 0, None, False, True),
    (-1, 2, None, False, True),  # negative: counted from the end, as ONNX does
    (2, -1, None, False, True),
    ([1], 0, None, False, False),  # a 1-D index keeps the axis: not this pattern
    (None, 0, None, False, False),  # an index given at run time
    (0, 0, [2, 1, 2, 4, 8], False, False),  # rank 5: 2.3.0 would run the Reshape back on the CPU
    (0, 0, None, True, False),  # not a stage input
])
def test_scalar_gather_slice_only_for_one_constant_index_of_an_input(index: object, axis: int, shape: list[int] | None,
                                                                     computed: bool, rewritten: bool) -> None:
    before, after = _gather(index, axis, shape, computed), _gather(index, axis, shape, computed)
    done = apply_rewrites(after, rewrites_for("2.3.0", "npu"))
    assert done == ({"scalar-gather-slice": 1} if rewritten else {})
    ops = [n.op_type for n in after.graph.node if n.op_type != "Neg"]
    assert ops == (["Slice", "Reshape"] if rewritten else ["Gather"])
    feeds = _feeds(before)
    if index is None:
        feeds["i"] = np.array(1, dtype=np.int64)
    np.testing.assert_array_equal(_run(after, feeds)[0], _run(before, feeds)[0])
    assert apply_rewrites(_gather(index, axis, shape, computed), rewrites_for("2.5.0", "npu")) == {}
