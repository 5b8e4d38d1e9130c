"""``dedupe-constants``: a constant a stage holds twice is read under one name (weight memory).

The compiler stores every initializer it is given; the TorchScript export of Cosmos/Anima folds
RoPE's cos/sin tables once for q and again for k, so the bundled example's self-attention holds
four tables where two are distinct.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.ir.edit import GraphEdit
from rkpart.targets.rewrites import DEDUPE, REWRITES, apply_rewrites
from rkpart.targets.rewrites.npu import dedupe_constants, duplicate_constants, may_hold_duplicate_constants


def _model(*, out_is_table: bool = False, subgraph: bool = False) -> onnx.ModelProto:
    """``y = x * cos + rot(x) * sin`` for q and for k, each with its own copy of the tables, plus a
    same-bytes constant of another shape and a Constant op duplicating an initializer."""
    rng = np.random.default_rng(0)
    cos, sin = (rng.standard_normal((1, 1, 8, 4)).astype(np.float32) for _ in range(2))
    inits = [numpy_helper.from_array(cos, "cos_q"), numpy_helper.from_array(sin, "sin_q"),
             numpy_helper.from_array(cos.copy(), "cos_k"), numpy_helper.from_array(sin.copy(), "sin_k"),
             numpy_helper.from_array(cos.reshape(1, 8, 1, 4), "cos_other_shape")]
    nodes = [helper.make_node("Constant", [], ["half_a"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
             helper.make_node("Constant", [], ["half_b"], value=numpy_helper.from_array(np.array(0.5, np.float32)))]
    for t in ("q", "k"):
        nodes += [helper.make_node("Mul", [t, f"cos_{t}"], [f"{t}c"]),
                  helper.make_node("Mul", [t, f"sin_{t}"], [f"{t}s"]),
                  helper.make_node("Add", [f"{t}c", f"{t}s"], [f"{t}r0"]),
                  helper.make_node("Mul", [f"{t}r0", f"half_{'a' if t == 'q' else 'b'}"], [f"{t}r"])]
    nodes += [helper.make_node("Transpose", ["cos_other_shape"], ["co"], perm=[0, 2, 1, 3]),
              helper.make_node("Add", ["qr", "co"], ["q2"]), helper.make_node("Add", ["q2", "kr"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 4])]
    if out_is_table:  # the copy itself is an output of the graph: its name stays
        outs.append(helper.make_tensor_value_info("cos_k", TensorProto.FLOAT, [1, 1, 8, 4]))
    if subgraph:
        body = helper.make_graph([helper.make_node("Identity", ["cos_k"], ["b"])], "body", [],
                                 [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
        inits.append(numpy_helper.from_array(np.array(True), "cond"))
        nodes.append(helper.make_node("If", ["cond"], ["unused"], then_branch=body, else_branch=body))
    ins = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 2, 8, 4]) for t in ("q", "k")]
    return helper.make_model(helper.make_graph(nodes, "rope", ins, outs, inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def _run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_copies_are_read_under_the_first_name_bit_for_bit() -> None:
    m = _model()
    feeds = {t: np.random.default_rng(1).standard_normal((1, 2, 8, 4)).astype(np.float32) for t in ("q", "k")}
    ref = _run(m, feeds)
    assert duplicate_constants(m.graph) == {"cos_k": "cos_q", "sin_k": "sin_q", "half_b": "half_a"}
    assert dedupe_constants(GraphEdit(m)) == 3
    onnx.checker.check_model(m, full_check=True)
    assert {t.name for t in m.graph.initializer} == {"cos_q", "sin_q", "cos_other_shape"}  # other shape: kept
    assert [n.output[0] for n in m.graph.node if n.op_type == "Constant"] == ["half_a"]
    assert not {"cos_k", "sin_k", "half_b"} & {i for n in m.graph.node for i in n.input}
    for a, b in zip(ref, _run(m, feeds), strict=True):
        assert np.array_equal(a, b)
    assert dedupe_constants(GraphEdit(m)) == 0  # nothing left to merge


def test_graph_outputs_and_graphs_with_subgraphs_are_left_alone() -> None:
    m = _model(out_is_table=True)
    assert "cos_k" not in duplicate_constants(m.graph) and "sin_k" in duplicate_constants(m.graph)
    assert duplicate_constants(_model(subgraph=True).graph) == {}


def test_the_probe_sees_candidates_without_loading_external_data(tmp_path: Path) -> None:
    m = _model()
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.onnx.data", size_threshold=0)
    head = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    assert may_hold_duplicate_constants(head)
    assert duplicate_constants(head.graph) == {}  # external bytes not loaded: nothing merged blind
    distinct = helper.make_model(helper.make_graph([helper.make_node("Mul", ["q", "w"], ["y"])], "g",
                                                   [helper.make_tensor_value_info("q", TensorProto.FLOAT, [2])],
                                                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                                                   [numpy_helper.from_array(np.ones(2, np.float32), "w")]))
    assert not may_hold_duplicate_constants(distinct)


def test_it_runs_with_the_rewrites_but_is_no_row_of_the_placement_table() -> None:
    assert DEDUPE.name not in {r.name for r in REWRITES} and DEDUPE.applies_to("2.3.0")
    m = _model()
    assert apply_rewrites(m, (DEDUPE,)) == {"dedupe-constants": 3}


@pytest.mark.slow  # partitions the bundled example and runs the stage under ONNX Runtime (~0.5 s)
def test_the_bundled_attention_stage_holds_its_tables_once(tmp_path: Path) -> None:
    """The example's self-attention: 4 RoPE tables (1,1,64,24), 2 distinct; prepare merges them.

    The toolkit's layout rewrites (rope-halves on 2.3.x, heads-table-layout on 2.5.0) reshape the
    tables after that, so the prepared copy is checked for what dedupe guarantees whatever their
    shape: no constant held twice."""
    from rkpart.cli_args import bundled_example
    from rkpart.compile.prepare import prepare_stage
    from rkpart.pipeline import partition
    from rkpart.plan.extract import stage_sha256

    plan = partition(bundled_example(), tmp_path / "plan", "split")
    st = plan.stage("b00.attn")
    path = tmp_path / "plan" / st.file
    p = prepare_stage(path, stage_sha256(path), tmp_path / "plan" / "rknn", "2.3.0", "rk3588")
    assert p.record is not None and dict(p.record.rewrites).get("dedupe-constants", 0) >= 2
    source = [t for t in onnx.load(str(path)).graph.initializer if list(t.dims) == [1, 1, 64, 24]]
    assert len(source) == 4 and len({numpy_helper.to_array(t).tobytes() for t in source}) == 2
    held = [(t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())
            for t in onnx.load(str(p.onnx)).graph.initializer]
    assert len(held) == len(set(held))
