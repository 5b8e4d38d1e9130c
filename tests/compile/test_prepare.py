"""Opset lowering and NPU rewrites (rkpart.targets.opset / rewrites, rkpart.compile.prepare) under real ORT.

Models are built here with onnx.helper; every rewrite is checked by running the original and
the rewritten model in ONNX Runtime.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter

from rkpart.compile.prepare import prepare_stage
from rkpart.errors import SpecError, ToolkitError
from rkpart.ir.edit import GraphEdit
from rkpart.plan.extract import stage_sha256
from rkpart.plan.plan import Stage
from rkpart.plan.verify import prepared_onnx
from rkpart.runtime.ort import make_session
from rkpart.targets.opset import lower_model, lowering_note, model_opset
from rkpart.targets.rewrites import NO_LOWERING, REWRITES, TYPE_ONLY_CHANGES, apply_rewrites, rewrites_for
from tests.targets.test_rewrite_golden import interleave_indices, pad_graph

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto] = (), opset: int = 20) -> onnx.ModelProto:  # type: ignore[assignment]
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(x) for x in make_session(m.SerializeToString()).run(None, feeds)]


def _same(a: onnx.ModelProto, b: onnx.ModelProto, feeds: dict[str, np.ndarray], rel: float = 1e-6) -> None:
    for x, y in zip(_run(a, feeds), _run(b, feeds), strict=True):
        assert x.shape == y.shape
        if x.dtype.kind == "f":
            assert np.abs(x - y).max() <= rel * max(np.abs(x).max(), 1e-30)
        else:
            assert np.array_equal(x, y)


X = np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32) * 3


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu20_lowered_matches_under_ort(approximate: str) -> None:
    m = _model([helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)],
               [vi("x", F, [2, 8, 16])], [vi("y", F, [2, 8, 16])])
    low, rec = lower_model(m, 19, "2.5.0")
    assert model_opset(low) == 19 and rec.rewrites == {"gelu20-decompose": 1}
    assert "Gelu" not in {n.op_type for n in low.graph.node}
    onnx.checker.check_model(low, full_check=True)
    _same(m, low, {"x": X}, rel=1e-5)


def test_type_only_and_adapted_ops_lower_unchanged() -> None:
    """ConstantOfShape-20 (no adapter) is carried through; IsNaN/ReduceMax/Split-18 go through the converter."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["c"], value=helper.make_tensor("v", F, [1], [0.5])),
        helper.make_node("Add", ["x", "c"], ["a"]),
        helper.make_node("IsNaN", ["a"], ["nan"]),
        helper.make_node("Where", ["nan", "c", "a"], ["w"]),
        helper.make_node("ReduceMax", ["w", "ax"], ["r"], keepdims=1),
        helper.make_node("Split", ["w"], ["p", "q"], axis=2, num_outputs=2),
        helper.make_node("Mul", ["p", "q"], ["pq"]),
    ]
    m = _model(nodes, [vi("x", F, [2, 8, 16])], [vi("r", F, None), vi("pq", F, None)],
               [numpy_helper.from_array(np.array([-1], dtype=np.int64), "ax")])
    low, rec = lower_model(m, 19, "2.3.0")
    assert model_opset(low) == 19 and rec.from_opset == 20
    assert [n.domain for n in low.graph.node] == [""] * len(low.graph.node)
    assert all(o.domain in ("", "ai.onnx") for o in low.opset_import)
    _same(m, low, {"x": X})


def test_no_lowering_op_is_a_one_line_error() -> None:
    m = _model([helper.make_node("AffineGrid", ["t", "s"], ["y"])],
               [vi("t", F, [1, 2, 3]), vi("s", TensorProto.INT64, [4])], [vi("y", F, None)])
    with pytest.raises(ToolkitError, match=r"^cannot lower AffineGrid from opset 20 to 19 for rknn-toolkit2 2.5.0"):
        lower_model(m, 19, "2.5.0")


def test_every_op_changed_above_19_has_a_lowering() -> None:
    """Each default-domain op with a version in 20..21 either converts with onnx's adapter, has a
    rewrite, is carried through, or is refused by name (no silent gap)."""
    handled = {r.op_type for r in REWRITES if r.kind == "lower"} | set(TYPE_ONLY_CHANGES) | set(NO_LOWERING)
    changed = set()
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "" and s.since_version == 20:
            changed.add(s.name)
    assert changed, "onnx.defs lists no opset-20 op"
    converter_ok = {"IsNaN", "IsInf", "ReduceMax", "ReduceMin", "DFT"}  # adapters exist (checked below)
    assert changed <= handled | converter_ok, sorted(changed - handled - converter_ok)
    for op in sorted(converter_ok):
        ins = [vi("x", F, [1, 8, 1])] if op == "DFT" else [vi("x", F, [2, 3])]
        m = _model([helper.make_node(op, ["x"], ["y"])], ins, [vi("y", F, None)])
        assert model_opset(version_converter.convert_version(m, 19)) == 19


def test_lowering_note() -> None:
    assert lowering_note(20, {"2.5.0": 19, "2.3.0": 19}) == \
        "stages will be lowered from opset 20 to 19 for rknn-toolkit2 2.3.0, 2.5.0"
    assert lowering_note(19, {"2.5.0": 19}) is None


def _rms(reciprocal: bool) -> onnx.ModelProto:
    ins = [vi("x", F, [1, 2, 6, 16])]
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "ax"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["r"]),
        helper.make_node("Reciprocal", ["r"], ["inv"]),
        helper.make_node("Mul", ["x", "inv"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([-1], dtype=np.int64), "ax"),
             numpy_helper.from_array(np.array(1e-6, dtype=np.float32), "eps")]
    return _model(nodes, ins, [vi("y", F, [1, 2, 6, 16])], inits, opset=18)


def test_rms_norm_reciprocal_rewrite_exact() -> None:
    """dynamo's RMSNorm, ``x * Reciprocal(Sqrt(...))``: ``Div(1, Sqrt(...))`` (the product is
    left: reciprocal-mul-div does not take an inverse of a Sqrt)."""
    m = _rms(True)
    r = onnx.ModelProto()
    r.CopyFrom(m)
    assert apply_rewrites(r, rewrites_for("2.5.0", "npu")) == {"reciprocal-to-div": 1}
    assert [n.op_type for n in r.graph.node] == ["Mul", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]
    _same(m, r, {"x": np.random.default_rng(1).standard_normal((1, 2, 6, 16)).astype(np.float32)})


def test_reciprocal_rewrite_exact() -> None:
    """A Reciprocal no Mul reads: ``Div(1, v)``, bit for bit."""
    m = _model([helper.make_node("Reciprocal", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
               [vi("x", F, [2, 8])], [vi("y", F, [2, 8])], opset=17)
    r = onnx.ModelProto()
    r.CopyFrom(m)
    assert apply_rewrites(r, rewrites_for("2.5.0", "npu")) == {"reciprocal-to-div": 1}
    assert "Reciprocal" not in {n.op_type for n in r.graph.node}
    _same(m, r, {"x": np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)}, rel=0.0)


@pytest.mark.parametrize("depth", ["full", "partial"])
def test_scatternd_interleave_rewrite_exact(depth: str) -> None:
    """out[..., 0::2] = a; out[..., 1::2] = b as the TorchScript (full index) and dynamo (index
    depth 1 along axis 0, through an Identity) exporters write it."""
    shape, half, i0, i1 = interleave_indices(depth == "full")
    inits = [numpy_helper.from_array(np.zeros(shape, np.float32), "d"),
             numpy_helper.from_array(i0.astype(np.int64), "i0"), numpy_helper.from_array(i1.astype(np.int64), "i1")]
    nodes = [
        helper.make_node("ScatterND", ["d", "i0", "a"], ["s0"]),
        helper.make_node("Identity", ["s0"], ["s0i"]),
        helper.make_node("ScatterND", ["s0i", "i1", "b"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["y"]),
    ]
    m = _model(nodes, [vi("a", F, half), vi("b", F, half)], [vi("y", F, shape)], inits, opset=18)
    r = onnx.ModelProto()
    r.CopyFrom(m)
    assert apply_rewrites(r, rewrites_for("2.3.0", "npu")) == {"scatternd-interleave": 1}
    assert "ScatterND" not in {n.op_type for n in r.graph.node}
    rng = np.random.default_rng(2)
    _same(m, r, {"a": rng.standard_normal(half).astype(np.float32), "b": rng.standard_normal(half).astype(np.float32)},
          rel=0.0)


def test_scatternd_partial_cover_not_rewritten() -> None:
    shape, half = [16, 4], [8, 4]
    inits = [numpy_helper.from_array(np.ones(shape, np.float32), "d"),
             numpy_helper.from_array((np.arange(8) * 2)[:, None].astype(np.int64), "i0"),
             numpy_helper.from_array((np.arange(8) * 2)[:, None].astype(np.int64), "i1")]
    nodes = [helper.make_node("ScatterND", ["d", "i0", "a"], ["s0"]),
             helper.make_node("ScatterND", ["s0", "i1", "a"], ["y"])]
    m = _model(nodes, [vi("a", F, half)], [vi("y", F, shape)], inits, opset=18)
    assert apply_rewrites(m, rewrites_for("2.3.0", "npu")) == {}


def test_prepare_stage_writes_lowered_copy_and_record(tmp_path: Path) -> None:
    m = _model([helper.make_node("Gelu", ["x"], ["y"])], [vi("x", F, [2, 8, 16])], [vi("y", F, [2, 8, 16])])
    src = tmp_path / "stages" / "s.onnx"
    src.parent.mkdir()
    onnx.save(m, str(src))
    before = src.read_bytes()
    p = prepare_stage(src, "ab" * 32, tmp_path / "rknn", "2.5.0", "rk3588")
    assert p.record is not None and p.onnx != src
    assert p.record.to_json() == {"toolkit": "2.5.0", "from_opset": 20, "to_opset": 19,
                                  "rewrites": {"gelu20-decompose": 1},
                                  "file": f"rknn/prepared/{'ab' * 8}.2.5.0.onnx", "sha256": stage_sha256(p.onnx)}
    assert model_opset(onnx.load(str(p.onnx))) == 19
    assert src.read_bytes() == before  # the plan's stage file is never changed
    again = prepare_stage(src, "ab" * 32, tmp_path / "rknn", "2.5.0", "rk3588")
    assert again == p
    meta = json.loads(p.onnx.with_suffix(".json").read_text())
    assert p.record is not None and meta["record"] == p.record.to_json()


@pytest.mark.slow  # copies the rewrite sources: ~0.35 s
def test_a_prepared_copy_is_made_again_when_the_rewrite_code_changes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The record keys the copy by the rewrites' names and the fingerprint of their code: an edited
    rewrite (same name) makes the copy again, an unchanged one is served from the record."""
    from rkpart.compile import prepare

    m = _model([helper.make_node("Gelu", ["x"], ["y"])], [vi("x", F, [2, 8, 16])], [vi("y", F, [2, 8, 16])])
    src = tmp_path / "s.onnx"
    onnx.save(m, str(src))
    p = prepare_stage(src, "cd" * 32, tmp_path / "rknn", "2.5.0", "rk3588")
    meta = p.onnx.with_suffix(".json")
    assert f"code:{prepare.prepare_code_key()}" in json.loads(meta.read_text())["rules"]
    made = meta.stat().st_mtime_ns
    assert prepare_stage(src, "cd" * 32, tmp_path / "rknn", "2.5.0", "rk3588") == p
    assert meta.stat().st_mtime_ns == made  # served, not made again
    # the fingerprint reads the rewrites' source: an edit of a rewrite module changes it
    pkg = Path(prepare.__file__).parents[1]
    copy = tmp_path / "pkg"
    for rel in prepare._PREPARE_SOURCES:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        if (pkg / rel).is_dir():
            shutil.copytree(pkg / rel, copy / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(pkg / rel, copy / rel)
    assert prepare.prepare_code_key(copy) == prepare.prepare_code_key()
    with open(copy / "targets" / "rewrites" / "npu.py", "a") as f:
        f.write("# a fix\n")
    prepare.prepare_code_key.cache_clear()  # (read once per process; the copy was read above)
    edited = prepare.prepare_code_key(copy)
    assert edited != prepare.prepare_code_key()
    monkeypatch.setattr(prepare, "prepare_code_key", lambda: edited)
    time.sleep(0.01)
    again = prepare_stage(src, "cd" * 32, tmp_path / "rknn", "2.5.0", "rk3588")
    assert again == p and meta.stat().st_mtime_ns > made
    assert f"code:{edited}" in json.loads(meta.read_text())["rules"]


def _prepared_plan_stage(tmp_path: Path) -> tuple[Stage, Path]:
    m = _model([helper.make_node("Gelu", ["x"], ["y"])], [vi("x", F, [2, 8, 16])], [vi("y", F, [2, 8, 16])])
    src = tmp_path / "stages" / "s.onnx"
    src.parent.mkdir()
    onnx.save(m, str(src))
    sha = stage_sha256(src)
    p = prepare_stage(src, sha, tmp_path / "rknn", "2.5.0", "rk3588")
    stage = Stage(id="s", device="npu", file="stages/s.onnx", inputs=(), outputs=(), block=0, region="block",
                  kind="block", weight_bytes=0, io_bytes=0, sha256=sha, num_nodes=1, prepared=p.record.to_json())
    return stage, p.onnx


def test_prepared_copy_is_verified_before_use(tmp_path: Path) -> None:
    """rknn-sim loads the prepared copy through prepared_onnx: confined and sha256-checked like a stage."""
    stage, copy = _prepared_plan_stage(tmp_path)
    assert prepared_onnx(tmp_path, stage) == copy
    original = copy.read_bytes()
    edited = onnx.load(str(copy))
    edited.doc_string = "edited after compile"
    onnx.save(edited, str(copy))
    with pytest.raises(SpecError, match=r"prepared copy.*does not match the sha256.*rerun rkpart compile"):
        prepared_onnx(tmp_path, stage)
    # compile makes an edited copy again instead of building it
    again = prepare_stage(tmp_path / "stages" / "s.onnx", stage.sha256, tmp_path / "rknn", "2.5.0", "rk3588")
    assert again.onnx == copy and copy.read_bytes() == original and prepared_onnx(tmp_path, stage) == copy
    outside = tmp_path.parent / f"{tmp_path.name}-outside.onnx"
    outside.write_bytes(original)
    copy.unlink()
    copy.symlink_to(outside)  # a prepared copy that leaves the plan folder
    with pytest.raises(SpecError, match="prepared copy"):
        prepared_onnx(tmp_path, stage)
    assert stage.prepared is not None
    with pytest.raises(SpecError, match="no file or sha256"):
        prepared_onnx(tmp_path, dataclasses.replace(stage, prepared={**stage.prepared, "sha256": None}))


def test_prepare_stage_leaves_a_loadable_stage_alone(tmp_path: Path) -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F, [2, 3])], [vi("y", F, [2, 3])], opset=17)
    src = tmp_path / "s.onnx"
    onnx.save(m, str(src))
    p = prepare_stage(src, "cd" * 32, tmp_path / "rknn", "2.3.0", "rk3588")
    assert p.onnx == src and p.record is None
    assert not (tmp_path / "rknn").exists()


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_gridsample20_lowered_matches_under_ort(mode: str) -> None:
    m = _model([helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, align_corners=0)],
               [vi("x", F, [1, 2, 5, 5]), vi("g", F, [1, 4, 4, 2])], [vi("y", F, [1, 2, 4, 4])])
    low, rec = lower_model(m, 19, "2.5.0")
    assert model_opset(low) == 19 and rec.rewrites == {"gridsample20-modes": 1}
    rng = np.random.default_rng(3)
    _same(m, low, {"x": rng.standard_normal((1, 2, 5, 5)).astype(np.float32),
                   "g": rng.uniform(-1, 1, (1, 4, 4, 2)).astype(np.float32)})



def test_pad_to_concat_rewrite_exact() -> None:
    """The rewrite golden's pad graph (:func:`tests.targets.test_rewrite_golden.pad_graph`) is exact."""
    g = pad_graph()
    m = _model(list(g.node), list(g.input), list(g.output), list(g.initializer), opset=19)
    r = onnx.ModelProto()
    r.CopyFrom(m)
    assert apply_rewrites(r, rewrites_for("2.3.0", "npu")) == {"pad-to-concat": 2}
    assert "Pad" not in {n.op_type for n in r.graph.node}
    _same(m, r, {"x": np.random.default_rng(4).standard_normal((1, 2, 16, 8)).astype(np.float32)}, rel=0.0)


def _fake_inexact(view: GraphEdit) -> int:
    """FAKE rewrite (fault injection: every real row is exact): Relu -> LeakyRelu, wrong for x < 0."""
    count = 0
    for n in view.graph.node:
        if n.op_type == "Relu":
            n.op_type = "LeakyRelu"
            n.attribute.append(helper.make_attribute("alpha", 0.5))
            count += 1
    return count


def test_prepare_drops_only_the_rewrite_that_fails_the_ort_check(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rewrites match; the inexact one (a fake row: no real rewrite is inexact) is dropped with its
    reason, the real one (reciprocal-to-div) is kept."""
    import rkpart.targets.rewrites as rw

    fake = rw.Rewrite("fake-inexact", "Relu", "npu", ("*",), "fault injection (test only)", _fake_inexact)
    monkeypatch.setattr(rw, "REWRITES", (*rw.REWRITES, fake))
    m = _model([helper.make_node("Reciprocal", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
               [vi("x", F, [2, 8])], [vi("y", F, [2, 8])], opset=17)
    src = tmp_path / "stages" / "s.onnx"
    src.parent.mkdir()
    onnx.save(m, str(src))
    p = prepare_stage(src, stage_sha256(src), tmp_path / "rknn", "2.5.0", "rk3588")
    assert p.record is not None and p.record.rewrites == {"reciprocal-to-div": 1}
    assert set(p.record.dropped_rewrites) == {"fake-inexact"}
    assert p.record.dropped_rewrites["fake-inexact"].startswith("differs under ONNX Runtime")
    ops = [n.op_type for n in onnx.load(str(p.onnx)).graph.node]
    assert ops == ["Div", "Relu"]


def test_prepare_leaves_out_the_rewrites_compile_drops(tmp_path: Path) -> None:
    """``drop`` (a build failed with these rewrites): left out, recorded with the reason; when nothing is
    left to change the record names the stage file itself."""
    m = _model([helper.make_node("Reciprocal", ["x"], ["y"])], [vi("x", F, [2, 8])], [vi("y", F, [2, 8])], opset=17)
    src = tmp_path / "stages" / "s.onnx"
    src.parent.mkdir()
    onnx.save(m, str(src))
    sha = stage_sha256(src)
    full = prepare_stage(src, sha, tmp_path / "rknn", "2.5.0", "rk3588")
    assert full.record is not None and full.record.rewrites == {"reciprocal-to-div": 1}
    why = {"reciprocal-to-div": "the rknn-toolkit2 2.5.0 build with it failed: SIGSEGV"}
    p = prepare_stage(src, sha, tmp_path / "rknn", "2.5.0", "rk3588", drop=why)
    assert p.onnx == src
    assert p.record is not None
    assert p.record.to_json() == {"toolkit": "2.5.0", "from_opset": 17, "to_opset": 17, "rewrites": {},
                                  "dropped_rewrites": why, "file": "stages/s.onnx", "sha256": sha}
    assert prepare_stage(src, sha, tmp_path / "rknn", "2.5.0", "rk3588", drop=why) == p  # from its record
    assert prepare_stage(src, sha, tmp_path / "rknn", "2.5.0", "rk3588") == full  # the full copy is kept apart


def test_a_stage_that_makes_nan_of_random_inputs_is_checked_on_inputs_it_can_take(tmp_path: Path) -> None:
    """Sana-WM's camera attention normalises by a square root: on the first random draw the stage
    computes NaN, and every lowered or rewritten copy failed the check ("the reference holds 1024
    NaN/Inf values"), so the stage failed to build.  The check draws inputs the stage can take."""
    from rkpart.compile.prepare import _check, _finite_reference, _run
    from rkpart.errors import ToolkitError
    from rkpart.validation.metrics import Gate

    g = helper.make_graph([helper.make_node("Sqrt", ["x"], ["r"]), helper.make_node("Log", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds, ref = _finite_reference(model, 0)
    assert np.isfinite(ref[0]).all() and (feeds["x"] > 0).all()
    # a stage whose outputs are NaN on any input: the same NaN in the same places passes, others do not
    nan = np.full((2, 3), np.nan, np.float32)
    nan[0, 0] = 1.0
    _check([nan], [nan.copy()], Gate(), "differs")
    moved = nan.copy()
    moved[0, 0], moved[0, 1] = np.nan, 1.0
    with pytest.raises(ToolkitError, match="NaN/Inf in other places"):
        _check([nan], [moved], Gate(), "differs")
    assert _run(model, feeds)[0].shape == (4, 64)
