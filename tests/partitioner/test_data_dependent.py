"""Shapes that depend on data: ``rkpart partition --inputs`` specialises the plan by a run.

The models (:mod:`tests.models.data_dependent`) have static inputs, yet their text context is
gathered from a boolean mask (``NonZero``) or chosen by an ``If`` on it.  Without ``--inputs``
loading fails naming the op; with it, one ONNX Runtime run resolves the shapes, the plan
records them, reproduces the model on those inputs, and refuses inputs that would change them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.errors import InvalidModelError, UserError
from rkpart.io import input_digest
from rkpart.ir.load import DataDependentShapeError
from rkpart.pipeline import partition
from rkpart.runtime import board_runner
from rkpart.runtime.executor import run_plan
from tests.partitioner.checks import assert_reproduces

CASES = [("nonzero", "torchscript", "NonZero"), ("nonzero", "dynamo", "NonZero"), ("if", "dynamo", "If")]
#: expert-choice gathering in a scripted loop: named without --inputs; with them unrolled
SEQUENCE = ("sequence", "torchscript", "ConcatFromSequence")


def _export(kind: str, exporter: str) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from tests.models.data_dependent import cached_export

    return cached_export(kind, exporter)


def _npz(path: Path, feeds: dict[str, np.ndarray]) -> Path:
    np.savez(path, **feeds)  # type: ignore[arg-type]
    return path


@pytest.mark.export
@pytest.mark.parametrize(("kind", "exporter", "op"), [*CASES, SEQUENCE])
def test_without_inputs_the_error_names_the_op_and_the_flag(tmp_path: Path, kind: str, exporter: str,
                                                            op: str) -> None:
    model = _export(kind, exporter)
    r = CliRunner().invoke(main, ["partition", str(model), "-o", str(tmp_path / "p")])
    assert r.exit_code == InvalidModelError.exit_code, r.output
    line = r.output.strip().splitlines()[-1]
    assert "depends on values, not only on the input shapes" in line
    assert f"{op} node '" in line and "--inputs FILE.npz" in line
    assert not (tmp_path / "p").exists()
    with pytest.raises(DataDependentShapeError) as e:
        partition(model, tmp_path / "q")
    assert e.value.sources[0][0] == op


@pytest.mark.export
@pytest.mark.parametrize("strategy", ["split", "fused"])
@pytest.mark.parametrize(("kind", "exporter", "op"), CASES)
def test_inputs_specialise_the_plan_and_it_reproduces(tmp_path: Path, kind: str, exporter: str, op: str,
                                                      strategy: str) -> None:
    from tests.models.data_dependent import example_inputs

    model = _export(kind, exporter)
    feeds = example_inputs(seed=2)  # 5 of 7 text tokens valid
    plan = partition(model, tmp_path / "p", strategy, inputs=_npz(tmp_path / "in.npz", feeds))
    rec = plan.specialised[0]
    assert rec["op"] == op and rec["inputs"]["mask"] == input_digest(feeds["mask"])
    if op == "NonZero":
        assert rec["shape"] == [1, 5]
    else:
        assert rec["branch"] == "else_branch" and rec["shape"] == [1, 5, 12]
    assert_reproduces(plan, tmp_path / "p", model, feeds)
    # other image tokens, same mask and text: accepted, and still the model
    assert_reproduces(plan, tmp_path / "p", model, {**feeds, "hidden_states": example_inputs(seed=9)["hidden_states"]})
    # another mask would change the shape: refused before any stage runs, in one line
    other = {**feeds, "mask": np.array([[1, 0, 0, 1, 0, 1, 1]], dtype=bool)}
    with pytest.raises(UserError, match=r"^input 'mask' differs from the one this plan was specialised to \("):
        run_plan(plan, tmp_path / "p", other)


@pytest.mark.export
@pytest.mark.parametrize("strategy", ["split", "fused"])
def test_sequence_loops_are_unrolled_for_the_trip_count_the_inputs_give(tmp_path: Path, strategy: str) -> None:
    """Expert-choice gathering in a scripted ``Loop`` of ``SequenceInsert`` then
    ``ConcatFromSequence``: with ``--inputs`` the loop is unrolled for its trip count, the plan
    records it, holds no sequence op or Loop, and reproduces the model on other image tokens too
    (the trip count is a constant: no input decides it, so none is pinned)."""
    from tests.models.data_dependent import example_inputs

    model = _export(*SEQUENCE[:2])
    names = {i.name for i in onnx.load(str(model), load_external_data=False).graph.input}
    feeds = {k: v for k, v in example_inputs().items() if k in names}
    plan = partition(model, tmp_path / "p", strategy, inputs=_npz(tmp_path / "in.npz", feeds))
    rec = plan.specialised[0]
    assert rec["op"] == "ConcatFromSequence" and list(rec["trips"].values()) == [2]
    assert rec["inputs"] == {} and rec["shape"][0] == 2 * 2  # two experts' two tokens each
    from rkpart.plan.outdir import plan_folder_problem

    assert plan_folder_problem(tmp_path / "p") is None  # the schema knows "trips" (it refused the plan)
    stages = [onnx.load(str(tmp_path / "p" / s.file), load_external_data=False) for s in plan.stages]
    ops = {n.op_type for m in stages for n in m.graph.node}
    assert not ops & {"Loop", "SequenceEmpty", "SequenceInsert", "ConcatFromSequence"}
    assert_reproduces(plan, tmp_path / "p", model, feeds)
    for seed in (3, 9):
        other = {k: v for k, v in example_inputs(seed=seed).items() if k in names}
        assert_reproduces(plan, tmp_path / "p", model, other)


@pytest.mark.export
def test_if_takes_the_branch_the_inputs_chose(tmp_path: Path) -> None:
    from tests.models.data_dependent import example_inputs

    model = _export("if", "dynamo")
    feeds = example_inputs(seed=1, valid=(1,) * 7)
    plan = partition(model, tmp_path / "p", "split", inputs=_npz(tmp_path / "in.npz", feeds))
    assert plan.specialised[0]["branch"] == "then_branch"
    assert set(plan.specialised[0]["inputs"]) >= {"mask", "text"}  # the condition's input counts
    assert_reproduces(plan, tmp_path / "p", model, feeds)
    stages = [onnx.load(str(tmp_path / "p" / s.file), load_external_data=False) for s in plan.stages]
    assert not any(n.op_type == "If" for m in stages for n in m.graph.node)


@pytest.mark.export
def test_run_refuses_changed_inputs_in_one_line(tmp_path: Path) -> None:
    from tests.models.data_dependent import example_inputs

    model = _export("nonzero", "torchscript")
    feeds = example_inputs()
    r = CliRunner().invoke(main, ["partition", str(model), "-o", str(tmp_path / "p"), "-q",
                                  "--inputs", str(_npz(tmp_path / "in.npz", feeds))])
    assert r.exit_code == 0, r.output
    ok = CliRunner().invoke(main, ["run", str(tmp_path / "p"), "--inputs", str(tmp_path / "in.npz")])
    assert ok.exit_code == 0, ok.output
    other = _npz(tmp_path / "other.npz", {**feeds, "mask": np.ones((1, 7), dtype=bool)})
    bad = CliRunner().invoke(main, ["run", str(tmp_path / "p"), "--inputs", str(other)])
    assert bad.exit_code == UserError.exit_code
    assert bad.output.strip().splitlines()[-1].startswith("rkpart: error: input 'mask' differs")
    assert "Traceback" not in bad.output


@pytest.mark.export
def test_external_data_is_read_by_the_run_not_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.models.data_dependent import example_inputs

    m = onnx.load(str(_export("nonzero", "torchscript")))
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save_model(m, str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.onnx.data", size_threshold=0)
    assert (folder / "m.onnx.data").stat().st_size > 0
    monkeypatch.chdir(tmp_path)  # the run must find the weights beside the model, not in the cwd
    feeds = example_inputs(seed=5)
    plan = partition(folder / "m.onnx", tmp_path / "p", "split", inputs=_npz(tmp_path / "in.npz", feeds))
    assert plan.specialised and sorted(p.name for p in folder.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert_reproduces(plan, tmp_path / "p", folder / "m.onnx", feeds)


def test_board_runner_digest_is_rkparts() -> None:
    rng = np.random.default_rng(0)
    for a in (np.array([[True, False, True]]), rng.standard_normal((2, 3)).astype(np.float32),
              np.arange(6, dtype=np.int64).reshape(3, 2).T):
        assert board_runner.input_digest(a) == input_digest(a)
    assert input_digest(np.zeros((2, 3), np.float32)) != input_digest(np.zeros((3, 2), np.float32))


@pytest.mark.export
@pytest.mark.toolkit
@pytest.mark.slow
def test_bundle_runner_refuses_changed_inputs(tmp_path: Path) -> None:
    """A real 2.3.0 build of the specialised plan, bundled; the board runner (NPU stages on its
    ONNX Runtime stand-in) passes on the inputs the plan was made on and refuses another mask."""
    import os
    import subprocess
    import sys

    from rkpart.bundle.build import bundle_plan
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from tests.models.data_dependent import example_inputs
    from tests.toolkits import get_toolkit

    model = _export("nonzero", "torchscript")
    feeds = example_inputs()
    folder = tmp_path / "plan"
    plan = partition(model, folder, "fused", inputs=_npz(tmp_path / "in.npz", feeds))
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit("2.3.0")))
    assert not rep.failed
    with pytest.raises(UserError, match="pass those with --inputs"):
        bundle_plan(folder, tmp_path / "nobundle")
    assert not (tmp_path / "nobundle").exists()
    out = tmp_path / "board"
    bundle_plan(folder, out, inputs=feeds)
    other = _npz(tmp_path / "other.npz", {**feeds, "mask": np.ones((1, 7), dtype=bool)})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"RKPART_RUNNER_NPU_STANDIN": str(folder)}

    def runner(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(out / "runner.py"), *args], cwd=out, env=env,
                              capture_output=True, text=True, timeout=300)

    ok = runner("--inputs", "ref_inputs.npz", "--reference", "ref_outputs.npz")
    assert ok.returncode == 0, ok.stderr[-2000:]
    bad = runner("--inputs", str(other))
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert bad.stderr.strip().splitlines()[-1].startswith("runner: error: input 'mask' differs")


@pytest.mark.export
def test_repartition_partitions_a_specialised_plan_again_with_its_inputs(tmp_path: Path) -> None:
    """``rkpart compile --repartition`` writes the plan again from its model: a plan specialised to
    ``--inputs`` is loaded with the same file (recorded in the plan), so the model loads and the
    plan still reproduces it (it failed: "depends on values ... give --inputs").  A file that is
    gone, or no longer gives the same shapes, is refused in one line."""
    from rkpart.compile.compile import CompileOptions
    from rkpart.plan.plan import load_plan
    from rkpart.repartition import _write_again
    from tests.models.data_dependent import example_inputs

    model = _export("nonzero", "dynamo")
    feeds = example_inputs(seed=2)
    npz = _npz(tmp_path / "in.npz", feeds)
    folder = tmp_path / "p"
    plan = partition(model, folder, "split", inputs=npz)
    assert {r["inputs_file"] for r in plan.specialised} == {str(npz.resolve())}
    host = {o for s in plan.stages if s.device == "host" for o in [s.id]}
    moved = next(n.name for n in onnx.load(str(folder / plan.npu_stages[0].file), load_external_data=False).graph.node
                 if n.op_type in ("Add", "Mul") and n.name)
    opts = CompileOptions("2.5.0")
    _write_again(plan, folder, opts, {moved: "a test moves it"}, {}, lambda _m: None)
    again, _ = load_plan(folder)
    assert again.specialised == plan.specialised
    assert {h["op"] for h in again.extra["capability"]["host_ops"]} >= {moved}
    assert {s.id for s in again.stages if s.device == "host"} != host
    assert_reproduces(again, folder, model, feeds)
    np.savez(npz, **{**feeds, "mask": np.array([[1, 0, 0, 1, 0, 1, 1]], dtype=bool)})
    with pytest.raises(UserError, match=r"^input 'mask' differs from the one this plan was specialised to"):
        _write_again(again, folder, opts, {}, {}, lambda _m: None)
    npz.unlink()
    with pytest.raises(UserError, match=r"^--repartition: the plan was specialised to --inputs .*, which is gone"):
        _write_again(again, folder, opts, {}, {}, lambda _m: None)
