"""``rkpart calibrate`` and the fp16 range check (issue 27), on real ONNX Runtime.

The overflow plan, one NPU stage between two host stages, no denoising loop (calibrated on
``--inputs``)::

    x[1,4,8] ─> [pre (host): * 1] ─ a ─> [big (npu): MatMul w(=300) ─ Cast ─ h ─ Mul h·h ─ s ─ Mul 1e-6] ─ y
                                                            |h| ≈ 2400         |s| ≈ 5.8e6 > 65504
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from rkpart.cli import main
from rkpart.compile.calibration import RangeStats, fp16_findings, load_calibration, plan_digest
from rkpart.compile.precision import load_precision_spec, resolve
from rkpart.errors import SpecError, UserError
from rkpart.plan.plan import Plan, Stage, TensorInfo, load_plan
from rkpart.profile.calibrate import CalibrationOptions, write_calibration

# outside the fast tier: runs the example plan in ONNX Runtime (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

F = TensorProto.FLOAT


def _stage(folder: Path, sid: str, device: str, graph: onnx.GraphProto) -> Stage:
    import hashlib

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    (folder / "stages").mkdir(parents=True, exist_ok=True)
    (folder / "stages" / f"{sid}.onnx").write_bytes(data)
    return Stage(id=sid, device=device, file=f"stages/{sid}.onnx", inputs=tuple(i.name for i in graph.input),
                 outputs=tuple(o.name for o in graph.output), block=None, region=sid, kind=sid, weight_bytes=0,
                 io_bytes=0, sha256=hashlib.sha256(data).hexdigest(), num_nodes=len(graph.node))


def overflow_plan(folder: Path, weight: float = 300.0, scale: float = 1e-6, fp16: bool = False) -> Plan:
    """The plan of the module doc (``fp16``: the same in float16, with a Cast to float16 after the MatMul)."""
    vi = helper.make_tensor_value_info
    t, dt = (TensorProto.FLOAT16, np.float16) if fp16 else (F, np.float32)
    pre = helper.make_graph([helper.make_node("Mul", ["x", "one"], ["a"])], "pre", [vi("x", t, [1, 4, 8])],
                            [vi("a", t, [1, 4, 8])], [numpy_helper.from_array(np.array(1.0, dt), "one")])
    big = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["h0"]), helper.make_node("Cast", ["h0"], ["h"], to=t),
         helper.make_node("Mul", ["h", "h"], ["s"]), helper.make_node("Mul", ["s", "tiny"], ["y"])],
        "big", [vi("a", t, [1, 4, 8])], [vi("y", t, [1, 4, 8])],
        [numpy_helper.from_array(np.full((8, 8), weight, dt), "w"),
         numpy_helper.from_array(np.array(scale, dt), "tiny")])
    stages = (_stage(folder, "pre", "host", pre), _stage(folder, "big", "npu", big))
    plan = Plan(model={"file": "m.onnx", "sha256": "1" * 64, "opset": 17}, strategy={"name": "test", "options": {}},
                inputs=("x",), outputs=("y",),
                tensors={n: TensorInfo(n, "float16" if fp16 else "float32", (1, 4, 8)) for n in "xay"},
                stages=stages)
    plan.save(folder)
    return plan


def test_bundled_example_calibrates_in_the_toolkits_dataset_format(plans: dict[str, tuple[Plan, Path]],
                                                                   tmp_path: Path) -> None:
    plan, folder = plans["split"]
    res = CliRunner().invoke(main, ["calibrate", str(folder), "-o", str(tmp_path / "c1"), "-q"])
    assert res.exit_code == 0, res.output
    assert "fp16 range: ok" in res.output  # the bundled example stays far inside fp16's range
    cal = load_calibration(tmp_path / "c1")
    assert cal.plan_sha256 == plan_digest(plan) and cal.model_sha256 == plan.model["sha256"]
    assert (cal.source, cal.steps, cal.cfg, cal.samples) == ("denoise", 4, True, 20)
    assert set(cal.stages) == {s.id for s in plan.npu_stages} and not cal.findings
    for s in plan.npu_stages:
        sc = cal.stages[s.id]
        lines = cal.dataset(s.id).read_text().splitlines()
        assert len(lines) == sc.samples == 20
        # distinct: block 0's self-attention sees the same inputs in both CFG passes (it does not read
        # the context), so more seeded runs are made instead of repeating samples
        assert len(set(lines)) == 20
        for line in lines:
            paths = line.split()
            assert len(paths) == len(s.inputs)  # several inputs: one line, separated by spaces
            for name, p in zip(sc.inputs, paths, strict=True):
                a = np.load(cal.dataset(s.id).parent / p)  # relative to the dataset file, as the toolkit reads it
                assert a.shape == plan.tensors[name].shape and a.dtype == np.float32
        assert all(r.absmax == max(abs(r.min), abs(r.max)) > 0 for r in sc.ranges)
        assert sc.activations > 0 and sc.absmax < 1000
    # content-addressed: the same plan gives byte-identical files
    assert CliRunner().invoke(main, ["calibrate", str(folder), "-o", str(tmp_path / "c2"), "-q"]).exit_code == 0
    cmp = filecmp.dircmp(tmp_path / "c1", tmp_path / "c2")
    assert not cmp.diff_files and not cmp.left_only and not cmp.right_only
    for sub in ("samples", "stages"):
        assert not filecmp.dircmp(tmp_path / "c1" / sub, tmp_path / "c2" / sub).diff_files
    # a second run into the same folder needs --force; a non-calibration folder is never replaced
    again = CliRunner().invoke(main, ["calibrate", str(folder), "-o", str(tmp_path / "c1"), "-q"])
    assert again.exit_code == 6 and "--force" in again.output
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    refused = CliRunner().invoke(main, ["calibrate", str(folder), "-o", str(tmp_path / "other"), "-q", "--force"])
    assert refused.exit_code == 6 and (tmp_path / "other" / "keep.txt").exists()


def test_stale_or_missing_calibration_is_a_one_line_error(plans: dict[str, tuple[Plan, Path]],
                                                          tmp_path: Path) -> None:
    plan, folder = plans["split"]
    write_calibration(plan, folder, tmp_path / "cal", CalibrationOptions(samples=2, steps=1))
    with pytest.raises(UserError, match=r"needs calibration data: run `rkpart calibrate"):
        resolve(plan, plan.npu_stages, precision="int8")
    ok = resolve(plan, plan.npu_stages, precision="int8", calibration=tmp_path / "cal", algorithm="mmse")
    assert {sp.precision for sp in ok.values()} == {"int8"} and all(sp.dataset and sp.dataset.files
                                                                    for sp in ok.values())
    first = ok[plan.npu_stages[0].id]
    assert first.config({}, "rk3588") == {"quantized_dtype": "w8a8", "quantized_algorithm": "mmse"}
    assert first.key_extra()["calibration"] == load_calibration(tmp_path / "cal").sha256
    # another plan (one stage's file changed) makes the calibration stale
    s0 = plan.npu_stages[0]
    other = plan.replace_stage(dataclasses.replace(s0, sha256="f" * 64))
    with pytest.raises(SpecError, match=r"^calibration .* is stale: made from plan sha256 [0-9a-f]{12}, this plan is"):
        resolve(other, other.npu_stages, precision="int8", calibration=tmp_path / "cal")
    # what compile adds to a plan (artifacts, extra.compile) does not make it stale
    compiled = dataclasses.replace(plan, extra={**plan.extra, "compile": {"toolkit": "2.5.0"}})
    assert plan_digest(compiled) == plan_digest(plan)
    # fp16 needs no calibration; a precision spec mixes
    assert {sp.precision for sp in resolve(plan, plan.npu_stages).values()} == {"fp16"}
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("regions: {ffn: int8}\nstages: {b00.ffn: hybrid}\n")
    spec = load_precision_spec(spec_file, plan)
    mixed = resolve(plan, plan.npu_stages, spec=spec, calibration=tmp_path / "cal")
    assert {sid: sp.precision for sid, sp in mixed.items()} == {
        "b00.attn": "fp16", "b00.xattn": "fp16", "b00.ffn": "hybrid",
        "b01.attn": "fp16", "b01.xattn": "fp16", "b01.ffn": "int8"}
    spec_file.write_text("stages: {b00.fnn: int8}\n")
    with pytest.raises(SpecError, match=r"'b00.fnn' is not an NPU stage of the plan"):
        load_precision_spec(spec_file, plan)
    spec_file.write_text("regions: {ffn: int4}\n")
    with pytest.raises(SpecError, match=r"precision 'int4' is not one of fp16, int8, hybrid"):
        load_precision_spec(spec_file, plan)
    with pytest.raises(UserError, match=r"target rk3566 has no quantized type"):
        resolve(plan, plan.npu_stages, precision="int8", calibration=tmp_path / "cal", target="rk3566")


def test_overflowing_stage_is_flagged_and_calibrated_on_inputs(tmp_path: Path) -> None:
    overflow_plan(tmp_path / "plan")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "in.npz", x=rng.uniform(0.5, 1.0, (3, 1, 4, 8)).astype(np.float32))  # 3 samples
    no_loop = CliRunner().invoke(main, ["calibrate", str(tmp_path / "plan"), "-o", str(tmp_path / "c"), "-q"])
    assert no_loop.exit_code == 5 and "no denoising loop" in no_loop.output and "--inputs" in no_loop.output
    res = CliRunner().invoke(main, ["calibrate", str(tmp_path / "plan"), "-o", str(tmp_path / "c"), "-q",
                                    "--inputs", str(tmp_path / "in.npz"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["source"] == "inputs"
    [finding] = out["fp16_range"]
    assert (finding["stage"], finding["tensor"], finding["kind"]) == ("big", "s", "overflow")
    assert finding["margin"] < 1  # |s| is beyond 65504: it overflows in fp16
    cal = load_calibration(tmp_path / "c")
    assert cal.stages["big"].samples == 3 and cal.stages["big"].absmax_tensor == "s"
    text = CliRunner().invoke(main, ["calibrate", str(tmp_path / "plan"), "-o", str(tmp_path / "c"), "-q", "--force",
                                     "--inputs", str(tmp_path / "in.npz")]).output
    assert "fp16 range: stage big tensor 's' reaches |x| = " in text and "overflow" in text
    # small weights: |y| = |s| * 1e-6 lands below fp16's smallest normal (underflow) ...
    small = overflow_plan(tmp_path / "small", weight=0.1)
    under = write_calibration(small, tmp_path / "small", tmp_path / "c_small", inputs=tmp_path / "in.npz")
    assert [(f.tensor, f.kind, f.margin) for f in under.findings] == [("y", "underflow", 1.0)]
    # ... and without the 1e-6 the stage passes
    fine = overflow_plan(tmp_path / "fine", weight=0.1, scale=1.0)
    ok = write_calibration(fine, tmp_path / "fine", tmp_path / "c_fine", inputs=tmp_path / "in.npz")
    assert not ok.findings


def test_range_rules() -> None:
    """Overflow within 2x of fp16's max; underflow when a quarter of the non-zero values is below
    fp16's smallest normal; constant tensors (RMSNorm's eps over a zero context) are not counted."""
    def stats(*arrays: np.ndarray) -> RangeStats:
        st = RangeStats()
        for a in arrays:
            st.add(a.astype(np.float32))
        return st

    found = fp16_findings("s", {
        "near": stats(np.array([1.0, 40000.0])), "fine": stats(np.array([1.0, 30000.0])),
        "tiny": stats(np.array([1e-6, 2e-6, 1.0, 0.0])), "eps": stats(np.full(8, 1e-6), np.array([0.5, 1.0])),
        "inf": stats(np.array([np.inf, 1.0]))})
    assert [(f.tensor, f.kind) for f in found] == [("inf", "nonfinite"), ("near", "overflow"), ("tiny", "underflow")]
    assert found[1].margin == pytest.approx(65504 / 40000)
    assert found[2].margin == pytest.approx(2 / 3)


def test_bad_arguments_are_one_line_errors(plans: dict[str, tuple[Plan, Path]], tmp_path: Path) -> None:
    _plan, folder = plans["split"]
    np.savez(tmp_path / "bad.npz", hidden_states=np.zeros((2, 3), np.float32))
    res = CliRunner().invoke(main, ["calibrate", str(folder), "-o", str(tmp_path / "c"), "--inputs",
                                    str(tmp_path / "bad.npz")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["calibrate", str(folder), "-o", str(tmp_path / "c"), "--samples", "0"])
    assert res.exit_code == 2 and "--samples" in res.output
    assert not (tmp_path / "c").exists()
    p, _ = load_plan(folder)
    assert p.npu_stages


def test_compile_settings_and_report_name_the_overflowing_tensor(tmp_path: Path) -> None:
    """What compile records with --calibration (fp16 stages need no toolkit for it) reaches the report."""
    from rkpart.compile.calibration import load_calibration
    from rkpart.compile.compile import CompileOptions, _precisions
    from rkpart.compile.precision import resolve
    from rkpart.report.build import build_report

    plan = overflow_plan(tmp_path / "plan")
    np.savez(tmp_path / "in.npz", x=np.ones((1, 4, 8), np.float32))
    write_calibration(plan, tmp_path / "plan", tmp_path / "c", inputs=tmp_path / "in.npz")
    settings: dict[str, object] = {}
    opts = CompileOptions("unused", "rk3588", calibration=tmp_path / "c")
    cal = load_calibration(tmp_path / "c")
    resolved = resolve(plan, plan.npu_stages, precision="fp16", spec=None, calibration=opts.calibration,
                       algorithm=opts.quantized_algorithm, target=opts.target)
    out = _precisions(plan, plan.npu_stages, opts, None, cal, resolved, {}, [], settings)
    assert {sp.precision for sp in out.values()} == {"fp16"} and "precision" not in settings
    [finding] = settings["fp16_range"]  # type: ignore[misc]
    assert finding["tensor"] == "s" and finding["kind"] == "overflow"
    dataclasses.replace(plan, extra={**plan.extra, "compile": settings}).save(tmp_path / "plan")
    build_report(tmp_path / "plan", output=tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert "fp16 range: stage big tensor &#x27;s&#x27; reaches |x| = " in page and "overflow risk" in page
    csv = (tmp_path / "r_files" / "compile.csv").read_text()
    assert "overflow s (" in csv


def test_an_fp16_stage_is_checked_in_fp32(tmp_path: Path) -> None:
    """In fp16 the overflowing tensor is only ``inf``; the check runs the stage in fp32 and names its
    real magnitude.  The samples are stored as float32 (what the toolkit takes for an fp16 model)."""
    plan = overflow_plan(tmp_path / "plan", fp16=True)
    np.savez(tmp_path / "in.npz", x=np.full((1, 4, 8), 0.75, np.float16))
    cal = write_calibration(plan, tmp_path / "plan", tmp_path / "c", inputs=tmp_path / "in.npz")
    [f] = cal.findings
    assert (f.tensor, f.kind) == ("s", "overflow") and f.absmax == pytest.approx((8 * 300 * 0.75) ** 2, rel=1e-3)
    sample = cal.dataset("big").read_text().split()[0]
    assert np.load(cal.dataset("big").parent / sample).dtype == np.float32
