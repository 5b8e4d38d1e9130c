"""The learned-placement store (rkpart.grouping.learned) and the position-free build key.

Real files in a private cache folder (the autouse fixture sets ``RKPART_CACHE_DIR``); the
toolkit builds that fill the store for real are in ``test_repartition.py``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.compile.cache import build_key
from rkpart.grouping.learned import VERSION, CpuLayer, learn, load_learned, store_path, trace_cpu_layers
from rkpart.targets.capability import PlacementPattern

P1 = PlacementPattern("ScatterND", "float32", (4, 5, 4), dims="1nnn;nnnnn;1nnn>1nnn")
P2 = PlacementPattern("IsNaN", "float32", (4,), dims="1nnn>1nnn")


def test_learn_and_load_round_trip_sorted_and_stable() -> None:
    assert load_learned("rk3588", "2.5.0") == frozenset()
    assert learn("rk3588", "2.5.0", [CpuLayer("b00.attn", "IsNaN:n1", "n1", P2),
                                      CpuLayer("b00.attn", "ScatterND:s1", "s1", P1)]) == sorted([P1, P2])
    path = store_path("rk3588", "2.5.0")
    first = path.read_bytes()
    assert load_learned("rk3588", "2.5.0") == {P1, P2}
    assert load_learned("rk3588", "2.3.0") == frozenset()
    # nothing new: nothing returned, the file is not rewritten
    assert learn("rk3588", "2.5.0", [CpuLayer("b00.attn", "IsNaN:n1", "n1", P2)]) == []
    assert path.read_bytes() == first
    d = json.loads(first)
    assert [p["op_type"] for p in d["patterns"]] == ["IsNaN", "ScatterND"]
    assert d["patterns"][0]["examples"] == ["b00.attn: IsNaN:n1"]
    # untraced layers teach nothing
    assert learn("rk3588", "2.5.0", [CpuLayer("b00.attn", "Transpose:tp_inserted", None, None)]) == []


def test_a_damaged_store_reads_as_what_it_still_holds() -> None:
    path = store_path("rk3588", "2.5.0")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert load_learned("rk3588", "2.5.0") == frozenset()
    path.write_text(json.dumps({"format": "rkpart-learned-placement", "version": VERSION, "patterns": [
        P1.to_json(), {"op_type": 3, "dtype": "float32", "ranks": [1]}, {"op_type": "X", "ranks": "12"},
        {**P2.to_json(), "ranks": [True]}, {**P2.to_json(), "dims": "1x>1"}, {**P2.to_json(), "dims": None},
        {**P2.to_json(), "form": "sideways"}]}))
    assert load_learned("rk3588", "2.5.0") == {P1}
    assert learn("rk3588", "2.5.0", [CpuLayer("s", "IsNaN:n", "n", P2)]) == [P2]
    assert load_learned("rk3588", "2.5.0") == {P1, P2}  # the damaged rows are dropped by the rewrite


def test_concurrent_learners_lose_nothing() -> None:
    pats = [PlacementPattern(f"Op{i}", "float32", (i,), dims="n" * i + ">" + "n" * i) for i in range(16)]
    threads = [threading.Thread(target=learn, args=("rk3588", "2.5.0", [CpuLayer("s", f"Op{i}:n", "n", p)]))
               for i, p in enumerate(pats)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert load_learned("rk3588", "2.5.0") == set(pats)


def test_odd_target_and_toolkit_names_stay_inside_the_store_folder(tmp_path: Path) -> None:
    p = store_path("../../etc", "/usr/bin/python", tmp_path)
    assert p.parent == tmp_path / "placement" and "/" not in p.name


def _stage(path: Path, data_name: str) -> Path:
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                           helper.make_node("ScatterND", ["h", "idx", "h"], ["y"], name="scatter")], "s",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64]),
                           helper.make_tensor_value_info("idx", TensorProto.INT64, [64, 64, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path, save_as_external_data=True, location=data_name, size_threshold=0)
    return path


def test_build_key_does_not_depend_on_the_stages_position(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _stage(tmp_path / "a" / "003_b00.xattn.onnx", "003_b00.xattn.onnx.data")
    b = _stage(tmp_path / "b" / "005_b00.xattn.onnx", "005_b00.xattn.onnx.data")
    assert a.read_bytes() != b.read_bytes()
    assert build_key(a, "2.5.0", "rk3588", {}) == build_key(b, "2.5.0", "rk3588", {})
    # the weights still count
    raw = bytearray((tmp_path / "b" / "005_b00.xattn.onnx.data").read_bytes())
    raw[0] ^= 1
    (tmp_path / "b" / "005_b00.xattn.onnx.data").write_bytes(bytes(raw))
    assert build_key(a, "2.5.0", "rk3588", {}) != build_key(b, "2.5.0", "rk3588", {})


def test_trace_cpu_layers_maps_full_names_to_ops_and_patterns(tmp_path: Path) -> None:
    s = _stage(tmp_path / "001_b00.attn.onnx", "001_b00.attn.onnx.data")
    got = trace_cpu_layers("b00.attn", s, ["ScatterND:scatter", "Transpose:inserted_by_the_toolkit",
                                           "Slice:scatter_2sl"])
    pat = PlacementPattern("ScatterND", "float32", (2, 3, 2), consts=(False, False, False), dims="nn;nnn;nn>nn",
                           shapes="64,64;64,64,2;64,64>64,64", around="MatMul,*,MatMul>*")
    # the last: the op itself, turned into another by the toolkit (AnyFlow-FAR's KV-cache Gather of one
    # index ran as "Slice:node_select_1_2sl"): traced to the op, learned, moved
    assert [(x.op, x.pattern, x.boundary) for x in got] == [("scatter", pat, False), (None, None, False),
                                                            ("scatter", pat, False)]


def test_a_store_of_the_coarser_version_1_classes_is_relearned() -> None:
    """Version 1 keyed a pattern by op, type and input ranks alone: a ``Reshape`` of an attention mask
    learned there took every head split of every later model off the NPU. Such a store reads empty."""
    path = store_path("rk3588", "2.5.0")
    path.parent.mkdir(parents=True)
    row = {k: v for k, v in P1.to_json().items() if k != "dims"}
    path.write_text(json.dumps({"format": "rkpart-learned-placement", "version": 1, "patterns": [row]}))
    assert load_learned("rk3588", "2.5.0") == frozenset()
    assert learn("rk3588", "2.5.0", [CpuLayer("s", "ScatterND:n", "n", P1)]) == [P1]
    assert json.loads(path.read_text())["version"] == VERSION and load_learned("rk3588", "2.5.0") == {P1}


def test_repartition_refuses_no_cache_and_stage(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rkpart.cli import main

    for extra in (["--no-cache"], ["--stage", "b00.attn"]):
        r = CliRunner().invoke(main, ["compile", str(tmp_path), "--toolkit", "2.5.0", "--repartition", *extra])
        assert r.exit_code == 2 and "--repartition" in r.output, r.output


def test_a_conversion_of_a_stage_output_traces_to_its_producer_and_is_not_learned(tmp_path: Path) -> None:
    s = _stage(tmp_path / "001_b00.ffn.onnx", "001_b00.ffn.onnx.data")
    got = trace_cpu_layers("b00.ffn", s, ["Reshape:y_mm_tp_rs", "Reshape:h-rs"])
    # y is the stage output (ScatterND makes it): a boundary, not learned; h is internal, read by the
    # ScatterND alone: the toolkit decomposed that op, whose pattern is learned
    assert [(x.op, x.boundary, x.pattern is None) for x in got] == [("scatter", True, True), ("scatter", False, False)]
    from rkpart.grouping.learned import forced_host

    assert "converted its output on the CPU" in forced_host(got)["scatter"]
    assert learn("rk3588", "2.5.0", got[:1]) == []


def test_capability_takes_the_toolkit_as_compile_options_do(tmp_path: Path) -> None:
    """``compile_repartition(plan, CompileOptions(Toolkit(...)))`` re-partitions with the toolkit's
    capability: a Toolkit object is asked by its version (it raised AttributeError: the API form
    of ``--repartition`` crashed on every plan with a CPU layer)."""
    from rkpart.compile.toolkits import Toolkit, toolkit_version
    from rkpart.grouping.learned import target_capability

    learn("rk3588", "2.5.0", [CpuLayer("s", "IsNaN:n", "n", P2)])
    tk = Toolkit("2.5.0", tmp_path / "python", managed=False)
    by_object, by_version = target_capability("rk3588", toolkit_version(tk)), target_capability("rk3588", "2.5.0")
    assert by_object == by_version and by_object.toolkit == "2.5.0" and P2 in by_object.learned


def test_conversions_of_inner_tensors_trace_to_their_reader_or_producer(tmp_path: Path) -> None:
    """A conversion of an inner tensor with one reader is that reader, decomposed by the toolkit
    (Sana-WM's camera Einsum); with several readers, the producer moves and the tensor becomes a stage
    input (AnyFlow-FAR's rank-5 KV-cache slice on 2.3.0: ``Reshape:select_rs`` and ``Reshape:select_rs#1``,
    the toolkit's second layer of that name)."""
    w = numpy_helper.from_array(np.eye(8, dtype=np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                           helper.make_node("Relu", ["h"], ["a"], name="relu"),
                           helper.make_node("Sigmoid", ["h"], ["b"], name="sig"),
                           helper.make_node("Add", ["a", "b"], ["y"], name="add")], "s",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], initializer=[w])
    path = tmp_path / "001_b00.attn.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    got = trace_cpu_layers("b00.attn", path, ["Reshape:h_rs#1", "Reshape:a_tp_rs"])
    assert [(x.op, x.boundary, x.pattern is not None) for x in got] == [("mm", True, False), ("add", False, True)]
    assert got[1].pattern.op_type == "Add"


def test_the_op_giving_a_rank5_stage_output_is_the_boundary_not_a_class(tmp_path: Path) -> None:
    """rknn-toolkit2 2.3.0 runs the op giving a stage output of rank > 4 on the CPU (measured: a
    ``Reshape`` to ``[1, 16, 2, 4, 8]`` as the output, ``Reshape:view`` on the CPU; the same Reshape and
    back inside a stage, none).  It moves as a boundary and its pattern is not learned: learned, every
    rank 4 -> 5 Reshape of every later model would leave the NPU.  The same op as an inner one is learned."""
    w = numpy_helper.from_array(np.eye(64, dtype=np.float32), "W")
    s5 = numpy_helper.from_array(np.array([1, 16, 2, 4, 8], np.int64), "s5")
    s3 = numpy_helper.from_array(np.array([1, 16, 64], np.int64), "s3")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                           helper.make_node("Reshape", ["h", "s5"], ["y"], name="view"),
                           helper.make_node("Reshape", ["h", "s5"], ["i"], name="inner"),
                           helper.make_node("Reshape", ["i", "s3"], ["z"], name="back")], "s",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 2, 4, 8]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16, 64])],
                          initializer=[w, s5, s3])
    path = tmp_path / "003_b00.attn.2.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    got = trace_cpu_layers("b00.attn.2", path, ["Reshape:view", "Reshape:inner"])
    assert [(x.op, x.boundary, x.pattern is None) for x in got] == [("view", True, True), ("inner", False, False)]
    assert learn("rk3588", "2.3.0", got[:1]) == []
    from rkpart.grouping.learned import forced_host

    assert "converted its output on the CPU" in forced_host(got)["view"]


def _heads(path: Path, tokens: int, heads: int, head_dim: int) -> Path:
    """A stage splitting ``[1, tokens, heads * head_dim]`` into heads: MatMul, Reshape, Transpose, MatMul."""
    c = heads * head_dim
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         helper.make_node("Reshape", ["h", "s4"], ["h4"], name="view"),
         helper.make_node("Transpose", ["h4"], ["t"], perm=[0, 2, 1, 3], name="heads"),
         helper.make_node("MatMul", ["t", "V"], ["y"], name="mm2")], "s",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, c])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, heads, tokens, 8])],
        initializer=[numpy_helper.from_array(np.zeros((c, c), np.float32), "W"),
                     numpy_helper.from_array(np.array([1, tokens, heads, head_dim], np.int64), "s4"),
                     numpy_helper.from_array(np.zeros((head_dim, 8), np.float32), "V")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_pattern_is_keyed_by_sizes_and_layout(tmp_path: Path) -> None:
    """Issue 50: a head ``Transpose`` learned from a head-dim-88 build ("Transpose, rank 4" with the
    same unit dims as every head split) took a head-dim-72 family's Transposes off the NPU.  The class
    now holds the sizes and the ``perm``: another head dim, head count or permutation is another class."""
    a = trace_cpu_layers("a", _heads(tmp_path / "a.onnx", 64, 4, 88), ["Transpose:heads"])[0].pattern
    b = trace_cpu_layers("b", _heads(tmp_path / "b.onnx", 64, 4, 72), ["Transpose:heads"])[0].pattern
    same = trace_cpu_layers("c", _heads(tmp_path / "c.onnx", 64, 4, 88), ["Transpose:heads"])[0].pattern
    assert a is not None and b is not None and a == same
    assert a != b and a.dims == b.dims and a.ranks == b.ranks  # the version-4 class could not tell them apart
    assert a.shapes == "1,64,4,88>1,4,64,88" and a.attrs == "perm=0,2,1,3"
    assert "1,64,4,88" in a.describe() and "perm=0,2,1,3" in a.key()
    assert PlacementPattern.from_json(a.to_json()) == a
    learn("rk3588", "2.5.0", [CpuLayer("a", "Transpose:heads", "heads", a)])
    assert load_learned("rk3588", "2.5.0") == {a}


def test_a_build_that_runs_a_learned_pattern_on_the_npu_drops_it(tmp_path: Path) -> None:
    """A pattern one build put on the CPU and a later build ran on the NPU (the same shapes in another
    context) is no longer applied; a build that puts it on the CPU again does not revive it."""
    from rkpart.grouping.learned import contradict, load_contradicted, npu_ops

    stage = _heads(tmp_path / "s.onnx", 64, 4, 88)
    cpu = trace_cpu_layers("b00.attn", stage, ["Transpose:heads"])
    pat = cpu[0].pattern
    assert pat is not None
    learn("rk3588", "2.5.0", cpu)
    # the build that put it on the CPU is no evidence against it
    assert npu_ops("b00.attn", stage, cpu, {pat}) == []
    # a twin stage whose build has no CPU layer: the same op ran on the NPU
    seen = npu_ops("b01.attn", stage, [], {pat})
    assert [(x.op, x.pattern) for x in seen] == [("heads", pat)]
    # an untraced CPU layer of the same op type may be the op under another name: no evidence
    assert npu_ops("b01.attn", stage, [CpuLayer("b01.attn", "Transpose:heads_tp", None, None)], {pat}) == []
    assert contradict("rk3588", "2.5.0", seen) == [pat]
    assert load_learned("rk3588", "2.5.0") == frozenset() and load_contradicted("rk3588", "2.5.0") == {pat}
    row = json.loads(store_path("rk3588", "2.5.0").read_text())["patterns"][0]
    assert row["examples"] == ["b00.attn: Transpose:heads"] and row["npu"] == ["b01.attn: heads"]
    assert learn("rk3588", "2.5.0", trace_cpu_layers("b02.attn", stage, ["Transpose:heads"])) == []
    assert load_learned("rk3588", "2.5.0") == frozenset()
    assert contradict("rk3588", "2.5.0", seen) == []  # already dropped


@pytest.mark.parametrize("version", [4, 5])
def test_an_older_store_is_relearned(version: int) -> None:
    """Version 4 keyed patterns without sizes, version 5 without neighbours: a store of either reads empty
    (re-learned by the next builds)."""
    path = store_path("rk3588", "2.5.0")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": "rkpart-learned-placement", "version": version,
                                "patterns": [P1.to_json()]}))
    assert VERSION == 6 and load_learned("rk3588", "2.5.0") == frozenset()


def test_a_stage_with_no_op_of_a_learned_size_is_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The evidence scan reads a stage as a graph only when an op of it may have a learned pattern: the output
    sizes the file records rule the others out (a real-width prepared copy holds its weights inline)."""
    import rkpart.ir
    from rkpart.grouping.learned import npu_ops

    learned = trace_cpu_layers("a", _heads(tmp_path / "a.onnx", 64, 4, 88), ["Transpose:heads"])[0].pattern
    other = tmp_path / "b.onnx"
    onnx.save(onnx.shape_inference.infer_shapes(onnx.load(str(_heads(other, 64, 4, 72)))), other)
    assert learned is not None and npu_ops("b", other, [], {learned}) == []

    def refuse(*_: object) -> None:
        raise AssertionError("loaded")

    monkeypatch.setattr(rkpart.ir, "load_model", refuse)
    assert npu_ops("b", other, [], {learned}) == []  # not loaded: no op of the learned output size
    same = tmp_path / "c.onnx"
    onnx.save(onnx.shape_inference.infer_shapes(onnx.load(str(_heads(same, 64, 4, 88)))), same)
    with pytest.raises(AssertionError, match="loaded"):
        npu_ops("c", same, [], {learned}, screen=same)


def test_a_prepared_copys_layer_is_learned_as_the_plans_op(tmp_path: Path) -> None:
    """A layer of a prepared copy (a rewrite put an Identity pair before the Softmax) is learned with the
    sizes and neighbours the plan's own stage file, cut from the model, gives its op: the next partition
    matches the model's ops, where no rewrite stands between the scores and the Softmax."""
    from rkpart.grouping.learned import npu_ops

    def stage(path: Path, prepared: bool) -> Path:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8])
        w = numpy_helper.from_array(np.eye(8, dtype=np.float32)[None], "w")
        nodes = [helper.make_node("MatMul", ["x", "w"], ["s"], name="scores")]
        if prepared:
            nodes += [helper.make_node("Identity", ["s"], ["s1"], name="scores/id"),
                      helper.make_node("Identity", ["s1"], ["s2"], name="scores/id2")]
        nodes += [helper.make_node("Softmax", ["s2" if prepared else "s"], ["p"], axis=-1, name="softmax"),
                  helper.make_node("MatMul", ["p", "w"], ["y"], name="pv")]
        onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]),
                                    opset_imports=[helper.make_opsetid("", 17)]), path)
        return path

    own, prepared = stage(tmp_path / "001_b00.attn.onnx", False), stage(tmp_path / "prepared.onnx", True)
    alone = trace_cpu_layers("b00.attn", prepared, ["Softmax:softmax"])[0].pattern
    assert alone is not None and alone.around == "Identity>MatMul"
    got = trace_cpu_layers("b00.attn", prepared, ["Softmax:softmax"], like=own)[0].pattern
    assert got is not None and got.around == "MatMul>MatMul" and got.shapes == alone.shapes
    # the evidence against it, read the same way: the prepared copy's Softmax is the plan's op
    assert [x.op for x in npu_ops("b00.attn", prepared, [], {got}, like=own)] == ["softmax"]
    assert npu_ops("b00.attn", prepared, [], {got}) == []
