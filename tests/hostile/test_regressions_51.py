"""The 21 defects of issue 51, one regression test each (every one failed on the main of 2025-12,
daf71ba).  The generated suite (``test_generated_hostile.py``)
covers the same ground for every file kind and output flag; these pin the exact cases found.

By class: outside writes and data loss (``dataset.txt`` with ``../``, an output onto its own
input or into a plan, ``cache prune`` of a plan's ``rknn/``, the runner's latent over its
manifest); wrong results accepted silently (build keys blind to sample bytes, samples that are
symlinks out, absolute or int64, cost models predicting 0 s, an unknown ``--toolkit``, a plan
specialised to an empty tensor); hangs (a FIFO or ``/dev/zero`` as the learned store, a FIFO
sample, a 200 000-line ``dataset.txt``); tracebacks (``extra.compile`` of the wrong type, an
incomplete ``npu_infer``, a malformed ``denoise`` record, a deeply nested layer table); and
messages (a 360 KB "one line", units and targets of cost models, a symlinked ``manifest.json``,
``tune -o`` onto a foreign file, Ctrl-C during start-up).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import Result
from onnx import TensorProto, helper, numpy_helper

from rkpart.cost_model.model import default_model_path
from tests.hostile.models import assert_user_error, cli, snapshot

# outside the fast tier: every case runs a command on a plan, profile or bundle built for the module
# (more than 0.3 s each); tests/test_readers.py keeps the reader's and the output rule's refusals there
pytestmark = pytest.mark.slow

#: a custom spec with one small NPU stage (block 0's FFN): an int8 build of it takes ~30 s
ONE_NPU_STAGE = "version: 1\nrest: host\nstages:\n  - id: b00.ffn\n    block: 0\n    regions: [ffn]\n"


def _invoke(args: list[Any], timeout: float = 60) -> Result:
    """``cli(args)`` in a thread: a reader blocked on a FIFO fails the test instead of hanging it."""
    done: list[Result] = []
    t = threading.Thread(target=lambda: done.append(cli(args)), daemon=True)
    t.start()
    t.join(timeout=timeout)
    assert done, f"blocked for {timeout} s: rkpart {' '.join(map(str, args))}"
    return done[0]


def _unblock(fifo: Path) -> None:
    """Open ``fifo`` for writing and close it: a reader blocked on it (the defect) gets EOF."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _lines(p: Path) -> list[str]:
    return [ln for ln in p.read_text().splitlines() if ln.strip()]


# -- fixtures: the one-NPU-stage plan and its calibration (toolkit tests) ----------------------------


@pytest.fixture(scope="module")
def one_stage(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> tuple[Path, Path]:
    """A plan of the example with one NPU stage and its calibration (4 samples); read-only."""
    root = tmp_path_factory.mktemp("one-stage")
    (root / "one.yaml").write_text(ONE_NPU_STAGE)
    r = cli(["partition", example_model, "-s", "custom", "--spec", root / "one.yaml", "-o", root / "plan", "-q"])
    assert r.exit_code == 0, r.output
    r = cli(["calibrate", root / "plan", "-o", root / "calib", "--samples", "4", "--steps", "2", "-q"])
    assert r.exit_code == 0, r.output
    return root / "plan", root / "calib"


def _copies(one_stage: tuple[Path, Path], where: Path) -> tuple[Path, Path]:
    plan, calib = one_stage
    shutil.copytree(plan, where / "plan")
    shutil.copytree(calib, where / "calib")
    return where / "plan", where / "calib"


def _compile_int8(plan: Path, calib: Path, cache: Path, *extra: Any) -> Result:
    """An int8 compile; the calibration is read and verified before the toolkit is looked up, so the
    refusals below hold with no toolkit installed (these tests run without the ``toolkit`` marker)."""
    return cli(["compile", plan, "--toolkit", "2.5.0", "--precision", "int8", "--calibration", calib, "-j", "1",
                "-q", "--cache-dir", cache, "--json", *extra])


def _dataset(calib: Path) -> Path:
    return calib / "stages" / "b00.ffn" / "dataset.txt"


def _npy(a: np.ndarray) -> tuple[str, bytes]:
    """A sample as ``rkpart calibrate`` names it: ``<sha256[:32]>.npy`` of its bytes."""
    import hashlib

    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return hashlib.sha256(buf.getvalue()).hexdigest()[:32] + ".npy", buf.getvalue()


# == outside writes and data loss =====================================================================


@pytest.mark.slow
def test_a_dataset_line_leaving_the_calibration_never_replaces_a_users_file(
        one_stage: tuple[Path, Path], tmp_path: Path) -> None:
    """main: the line made compile hard-link the attacker's file over the user's, exit 7."""
    deep = tmp_path / "d1" / "c1" / "c2"
    deep.mkdir(parents=True)
    plan, calib = _copies(one_stage, deep)
    shutil.move(str(plan), tmp_path / "d1" / "plan")
    plan = tmp_path / "d1" / "plan"
    (tmp_path / "d1" / "evil").write_text("the user's file\n")
    (tmp_path / "evil").write_text("the attacker's file\n")
    lines = _lines(_dataset(calib))
    lines[0] = "../../../../../../evil"  # as many lines as the manifest says
    _dataset(calib).write_text("\n".join(lines) + "\n")
    r = _compile_int8(plan, calib, tmp_path / "cache")
    assert_user_error(r, 2, "dataset", "leaves its folder")
    assert (tmp_path / "d1" / "evil").read_text() == "the user's file\n"
    assert not (plan / "rknn" / "objects").exists()  # refused before any build


def test_fit_refuses_to_write_over_its_own_input(profile: Path, tmp_path: Path) -> None:
    own = tmp_path / "p.jsonl"
    shutil.copy(profile, own)
    before = own.read_bytes()
    for force in ((), ("--force",)):
        r = cli(["fit", own, "-o", own, *force])
        assert_user_error(r, 6, "is one of its inputs")
        assert own.read_bytes() == before


@pytest.mark.parametrize("command", ["fit", "profile", "drift"])
def test_an_output_file_inside_a_plan_folder_is_refused(command: str, split_plan: Path, profile: Path,
                                                        tmp_path: Path) -> None:
    """main: fit -o, profile -o and drift --accuracy pointed at plan.json replaced the plan, exit 0."""
    plan = tmp_path / "plan"
    shutil.copytree(split_plan, plan)
    before = snapshot(plan)
    target = plan / "plan.json"
    args = {"fit": ["fit", profile, "-o", target],
            "profile": ["profile", plan, "--rounds", "1", "--threads", "1", "-o", target, "-q"],
            # a toolkit that is not installed: main only failed once the simulator was needed
            "drift": ["drift", plan, "--toolkit", "9.9.9", "--accuracy", target, "-q"]}[command]
    r = cli(args)
    assert_user_error(r, 6, "inside", "plan")
    assert snapshot(plan) == before


def test_cache_prune_refuses_a_plans_rknn_folder(split_plan: Path, tmp_path: Path) -> None:
    """main: `cache prune --cache-dir PLAN/rknn --all` deleted the compiled plan's artifacts."""
    from rkpart.compile.cache import ArtifactCache

    plan = tmp_path / "plan"
    shutil.copytree(split_plan, plan)
    # an entry written by rkpart's own cache code, as compile leaves one in the plan's rknn/
    cache = ArtifactCache(plan / "rknn")
    key = "ab" * 32
    cache.rknn_path(key).parent.mkdir(parents=True)
    cache.rknn_path(key).write_bytes(b"rknn" * 16)
    import hashlib

    cache.put_meta(key, {"toolkit": "2.5.0", "target": "rk3588", "size_bytes": 64,
                         "sha256": hashlib.sha256(b"rknn" * 16).hexdigest()})
    before = snapshot(plan)
    for args in (["--all"], ["--all", "--dry-run"], ["--max-size", "0"]):
        r = cli(["cache", "prune", "--cache-dir", plan / "rknn", *args])
        assert_user_error(r, 2, "rknn", "plan")
    assert snapshot(plan) == before
    r = cli(["cache", "prune", "--cache-dir", plan, "--all"])  # the plan folder itself is no cache either
    assert_user_error(r, 2, "not a build cache")


def test_the_runners_latent_never_replaces_the_bundles_manifest(host_bundle: Path, runner_mod: ModuleType,
                                                                tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "b"
    shutil.copytree(host_bundle, d)
    before = snapshot(d)
    for target in (d / "manifest.json", d / "new-latent.npy"):
        code = runner_mod.main(["--bundle", str(d), "--steps", "1", "--latent-out", str(target), "--force"])
        assert code == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and "inside the bundle" in err[0], err
    # run from inside the bundle folder without --latent-out: the default's line says what to do instead
    monkeypatch.chdir(d)
    assert runner_mod.main(["--bundle", str(d), "--steps", "1"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "latent.npy (the default, in the current folder)" in err[0], err
    assert "run it from outside the bundle folder, or pass --latent-out PATH" in err[0]
    assert snapshot(d) == before


# == wrong results accepted silently ==================================================================


def test_the_int8_build_key_covers_the_samples_bytes(one_stage: tuple[Path, Path], tmp_path: Path) -> None:
    """main: the key was the manifest's sha256 only, so a build from other samples (the manifest
    unchanged, the dataset naming another sample) was served as ``cached`` to the genuine one.
    Checked on what compile puts in the key (``StagePrecision.key_extra``, resolved by the code compile
    runs before any toolkit work), not by two int8 builds (35 s of toolkit CPU)."""
    from rkpart.compile.precision import resolve
    from rkpart.plan.plan import load_plan

    plan_dir, calib = _copies(one_stage, tmp_path)
    other = tmp_path / "other"
    shutil.copytree(calib, other)
    lines = _lines(_dataset(other))
    first = other / "stages" / "b00.ffn" / lines[0]
    a = np.load(first)
    name, blob = _npy((a * 0.5).astype(a.dtype))
    (other / "samples" / name).write_bytes(blob)
    lines[0] = f"../../samples/{name}"
    _dataset(other).write_text("\n".join(lines) + "\n")
    assert (other / "calibration.json").read_bytes() == (calib / "calibration.json").read_bytes()
    plan, _ = load_plan(plan_dir)
    [genuine] = resolve(plan, plan.npu_stages, precision="int8", calibration=calib).values()
    [edited] = resolve(plan, plan.npu_stages, precision="int8", calibration=other).values()
    assert genuine.calibration_sha256 == edited.calibration_sha256
    assert genuine.key_extra() != edited.key_extra(), "a build from other samples would be served as cached"
    [again] = resolve(plan, plan.npu_stages, precision="int8", calibration=calib).values()
    assert again.key_extra() == genuine.key_extra()  # the same samples: the same key, the cache still serves


SAMPLE_MUTATIONS = ["symlink-out", "absolute", "int64", "tampered"]


@pytest.mark.slow
@pytest.mark.parametrize("mutation", SAMPLE_MUTATIONS)
def test_samples_that_are_not_the_calibrations_are_refused_before_any_build(
        mutation: str, one_stage: tuple[Path, Path], tmp_path: Path) -> None:
    """main: each built with exit 0 (a tampered sample was built under its old name's key)."""
    plan, calib = _copies(one_stage, tmp_path)
    lines = _lines(_dataset(calib))
    rel = lines[0]
    sample = (_dataset(calib).parent / rel).resolve()
    a = np.load(sample)
    if mutation == "symlink-out":
        outside = tmp_path / "outside.npy"
        shutil.copy(sample, outside)
        sample.unlink()
        sample.symlink_to(outside)  # the same bytes, but not the calibration's file
        why = "symlink"
    elif mutation == "absolute":
        lines[0] = str(sample)
        _dataset(calib).write_text("\n".join(lines) + "\n")
        why = "leaves its folder"
    elif mutation == "int64":
        name, blob = _npy(np.round(a).astype(np.int64))
        (calib / "samples" / name).write_bytes(blob)
        lines[0] = f"../../samples/{name}"
        _dataset(calib).write_text("\n".join(lines) + "\n")
        why = "int64"
    else:
        _, blob = _npy((a + 1).astype(a.dtype))
        sample.write_bytes(blob)
        why = "sha256"
    r = _compile_int8(plan, calib, tmp_path / "cache")
    assert_user_error(r, 2, why)
    assert not (plan / "rknn" / "objects").exists()


def _zero_model(tmp: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    d = json.loads(default_model_path().read_text())
    edit(d)
    p = tmp / "model.json"
    p.write_text(json.dumps(d))
    return p


def test_estimate_refuses_a_cost_model_that_predicts_zero_seconds(split_plan: Path, tmp_path: Path) -> None:
    """main: printed seconds_per_image 0.0 with exit 0; errors.md says such a model is refused."""
    def zero(d: dict[str, Any]) -> None:
        for c in d["components"].values():
            c["terms"] = {k: 0.0 for k in c["terms"]}

    r = cli(["estimate", split_plan, "--cost-model", _zero_model(tmp_path, zero)])
    assert_user_error(r, 5, "0")


def test_estimate_refuses_an_unknown_toolkit(split_plan: Path) -> None:
    """main: --toolkit bogus used another toolkit's memory model under the bogus label."""
    r = cli(["estimate", split_plan, "--toolkit", "bogus"])
    assert_user_error(r, 2, "bogus", "2.3.0", "2.5.0")


def _empty_nonzero_model(path: Path) -> Path:
    """x[1,4,8], mask[4] -> x gathered at NonZero(mask) -> MatMul -> mean: a plan made on a mask of
    zeros would hold a zero-sized tensor (``idx`` of shape [0])."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("NonZero", ["mask"], ["nz"], name="nonzero"),
             helper.make_node("Squeeze", ["nz", "ax"], ["idx"], name="sq"),
             helper.make_node("Gather", ["x", "idx"], ["g"], axis=1, name="gather"),
             helper.make_node("MatMul", ["g", "W"], ["h"], name="mm"),
             helper.make_node("ReduceSum", ["h"], ["y"], keepdims=1, name="rs")]
    g = helper.make_graph(nodes, "nz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8]),
                                        helper.make_tensor_value_info("mask", TensorProto.BOOL, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1])],
                          initializer=[numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W"),
                                       numpy_helper.from_array(np.array([0], dtype=np.int64), "ax")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_plan_is_never_specialised_to_an_empty_tensor(tmp_path: Path) -> None:
    """main: the plan was written (the NPU stage reading a [0]-shaped tensor cannot be built or run
    on the board); a mask with valid tokens is specialised as before."""
    model = _empty_nonzero_model(tmp_path / "nz.onnx")
    x = np.random.default_rng(1).standard_normal((1, 4, 8)).astype(np.float32)
    np.savez(tmp_path / "empty.npz", x=x, mask=np.zeros(4, bool))
    np.savez(tmp_path / "ok.npz", x=x, mask=np.array([1, 0, 1, 1], bool))
    r = cli(["partition", model, "-s", "generic", "--inputs", tmp_path / "empty.npz", "-o", tmp_path / "p0", "-q"])
    assert_user_error(r, 3, "nonzero", "empty")
    assert not (tmp_path / "p0").exists()
    r = cli(["partition", model, "-s", "generic", "--inputs", tmp_path / "ok.npz", "-o", tmp_path / "p1", "-q"])
    assert r.exit_code == 0, r.output


# == hangs and unbounded work =========================================================================


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_a_learned_store_that_is_no_file_never_hangs_partition(kind: str, bundled: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from rkpart.grouping.learned import store_path

    monkeypatch.setenv("RKPART_CACHE_DIR", str(tmp_path / "cache"))
    store = store_path("rk3588", "2.5.0")
    store.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(store)
    else:
        store.symlink_to("/dev/zero")
    try:
        r = _invoke(["partition", bundled, "--toolkit", "2.5.0", "-o", tmp_path / "out", "-q"], timeout=60)
    finally:
        if kind == "fifo":
            _unblock(store)
    assert_user_error(r, 2, "learned-placement store")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_fifo_sample_never_hangs_an_int8_compile(one_stage: tuple[Path, Path], tmp_path: Path) -> None:
    """main: the toolkit blocked on the FIFO until the build timeout (here 30 s), exit 7."""
    plan, calib = _copies(one_stage, tmp_path)
    sample = (_dataset(calib).parent / _lines(_dataset(calib))[0]).resolve()
    sample.unlink()
    os.mkfifo(sample)
    t0 = time.monotonic()
    try:
        r = _invoke(["compile", plan, "--toolkit", "2.5.0", "--precision", "int8", "--calibration", calib, "-j", "1",
                     "-q", "--cache-dir", tmp_path / "cache", "--timeout", "30"], timeout=300)
    finally:
        _unblock(sample)
    assert_user_error(r, 2, "FIFO")
    assert time.monotonic() - t0 < 25


@pytest.mark.slow
def test_a_dataset_longer_than_its_manifest_is_refused_at_once(one_stage: tuple[Path, Path], tmp_path: Path) -> None:
    """main: 200 000 lines where the manifest says 4 ran for minutes (here until a 30 s build timeout)."""
    plan, calib = _copies(one_stage, tmp_path)
    first = _lines(_dataset(calib))[0]
    _dataset(calib).write_text((first + "\n") * 200_000)
    t0 = time.monotonic()
    r = _invoke(["compile", plan, "--toolkit", "2.5.0", "--precision", "int8", "--calibration", calib, "-j", "1",
                 "-q", "--cache-dir", tmp_path / "cache", "--timeout", "30"], timeout=600)
    assert_user_error(r, 2, "200000", "4")
    assert time.monotonic() - t0 < 25


# == tracebacks where one line is promised ============================================================


def test_estimate_on_a_plan_whose_compile_record_has_the_wrong_type(split_plan: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(split_plan, plan)
    d = json.loads((plan / "plan.json").read_text())
    d.setdefault("extra", {})["compile"] = ["not", "a", "record"]
    (plan / "plan.json").write_text(json.dumps(d))
    assert_user_error(cli(["estimate", plan]), 5, "extra/compile", "object")


def test_a_cost_model_with_incomplete_npu_infer_terms_is_refused(split_plan: Path, tmp_path: Path) -> None:
    def incomplete(d: dict[str, Any]) -> None:
        d["components"]["npu_infer"]["terms"].pop("act_macs")

    assert_user_error(cli(["estimate", split_plan, "--cost-model", _zero_model(tmp_path, incomplete)]), 5,
                      "npu_infer")


def test_the_runner_refuses_a_denoise_output_that_is_no_model_output(host_bundle: Path, runner_mod: ModuleType,
                                                                     tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """main: exit 1 with a KeyError traceback; docs/board.md promises exit 2."""
    d = tmp_path / "b"
    shutil.copytree(host_bundle, d)
    m = json.loads((d / "manifest.json").read_text())
    m["denoise"]["output"] = m["denoise"]["latent"]  # a model input, not an output
    (d / "manifest.json").write_text(json.dumps(m))
    code = runner_mod.main(["--bundle", str(d), "--steps", "1", "--latent-out", str(tmp_path / "lat.npy")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and "denoise.output" in err[0], (code, err)
    assert not (tmp_path / "lat.npy").exists()


@pytest.mark.toolkit
@pytest.mark.slow
def test_bundle_with_a_deeply_nested_layer_table(one_stage: tuple[Path, Path], tmp_path: Path, tk250: Any) -> None:
    """main: RecursionError traceback; the layer table is read through the reader, refused, and the
    core masks come from the build log instead."""
    plan, _ = _copies(one_stage, tmp_path)
    r = cli(["compile", plan, "--toolkit", "2.5.0", "-j", "1", "-q", "--cache-dir", tmp_path / "cache"])
    assert r.exit_code == 0, r.output
    tables = sorted((plan / "rknn" / "layers").glob("*.json"))
    assert tables
    tables[0].write_bytes(b"[" * 200_000 + b"]" * 200_000)
    r = cli(["bundle", plan, "-o", tmp_path / "board", "-q"])
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    assert r.exit_code == 0, r.output
    assert (tmp_path / "board" / "manifest.json").is_file()


# == messages and loose validation ====================================================================


def test_an_error_naming_many_runs_stays_short(profile: Path, tmp_path: Path) -> None:
    """main: a 'one-line' error listing every run id (360 KB for 20 000 runs)."""
    lines = profile.read_text().splitlines()
    many = tmp_path / "many.jsonl"
    with open(many, "w") as f:
        for i in range(60):
            for ln in lines:
                d = json.loads(ln)
                d["run_id"] = f"{i:016x}"
                f.write(json.dumps(d) + "\n")
    r = cli(["profile", "--show", many])
    msg = assert_user_error(r, 5, "60 runs", f"{0:016x}")
    assert len(msg) <= 500, len(msg)


@pytest.mark.parametrize(("field", "value"), [("unit", "furlongs"), ("applies_to", "gpu")])
def test_a_cost_models_units_and_targets_are_checked(field: str, value: str, split_plan: Path, tmp_path: Path) -> None:
    def edit(d: dict[str, Any]) -> None:
        d["components"]["load"][field] = value

    assert_user_error(cli(["estimate", split_plan, "--cost-model", _zero_model(tmp_path, edit)]), 5, field, value)


def test_the_runner_refuses_a_symlinked_manifest(host_bundle: Path, runner_mod: ModuleType, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """main: accepted, while every other symlink in a bundle is refused."""
    d = tmp_path / "b"
    shutil.copytree(host_bundle, d)
    (tmp_path / "elsewhere.json").write_bytes((d / "manifest.json").read_bytes())
    (d / "manifest.json").unlink()
    (d / "manifest.json").symlink_to(tmp_path / "elsewhere.json")
    code = runner_mod.main(["--bundle", str(d), "--passes", "1"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and "symlink" in err[0], (code, err)


def test_tune_refuses_a_work_folder_holding_a_foreign_file(bundled: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from rkpart import tune as tune_mod
    from rkpart.output import claim_work_folder

    work = tmp_path / "work"
    claim_work_folder(work, kind="tune", grows=tune_mod.TUNE_GROWS)  # as a tune run killed after its claim
    (work / "notes.txt").write_text("mine\n")

    class Reached(Exception):
        pass

    def stop(*_a: Any, **_k: Any) -> Any:  # FAULT INJECTION: main went on to partition every plan
        raise Reached

    monkeypatch.setattr(tune_mod, "single_plans", stop)
    r = cli(["tune", bundled, "-o", work, "-q"])
    assert not isinstance(r.exception, Reached), "tune accepted the folder"
    assert_user_error(r, 6, "notes.txt")
    assert (work / "notes.txt").read_text() == "mine\n"


@pytest.mark.slow
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(bundled: Path, tmp_path: Path) -> None:
    """A real SIGINT to ``rkpart partition`` right after each of several imports of start-up
    (``-X importtime`` says when one is done) and once its work has begun (its first progress line):
    never a traceback, always ``rkpart: interrupted`` and 130 (main: a traceback from the import)."""
    points = ["click", "rkpart.errors", "rkpart.cli_args", "numpy", "onnx", "rkpart.ir.load", "progress"]
    for point in points:
        out = tmp_path / f"out-{point}"
        for _ in range(3):  # again when the run ended before the signal could be sent (a loaded machine)
            sent, rc, rest = _interrupt_at(point, [sys.executable, "-X", "importtime",
                                               str(Path(sys.executable).parent / "rkpart"), "partition",
                                               str(bundled), "-o", str(out), "-s", "split"])
            if sent:
                break
            shutil.rmtree(out, ignore_errors=True)
        else:
            pytest.fail(f"the run ended before the signal at {point}, three times")
        err = [ln for ln in rest.splitlines() if ln.strip() and not ln.startswith(("import time:", "["))]
        assert "Traceback" not in rest, (point, rest[-2000:])
        assert rc == 130 and err == ["rkpart: interrupted"], (point, rc, err)
        assert not out.exists()


def _interrupt_at(point: str, argv: list[str]) -> tuple[bool, int, str]:
    """Run ``argv`` and send it SIGINT once its stderr says ``point`` was imported (or, for ``progress``, at
    its first progress line); whether it was still running then, its exit status and the stderr that followed.

    The stderr pipe is shrunk to one page and read without read-ahead, so the run cannot get more than a
    few KB of output past the point before the signal (with a 64 KB pipe, a run whose reader was
    descheduled wrote the rest of its 80 KB of import times and ended first)."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, bufsize=0)
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, 1031, 4096)  # F_SETPIPE_SZ
    buf = b""
    while True:
        chunk = os.read(fd, 512)
        if not chunk:
            proc.wait(120)
            pytest.fail(f"never reached {point}")
        buf += chunk
        *lines, buf = buf.split(b"\n")
        if any((ln.startswith(b"import time:") and ln.rsplit(b"|", 1)[-1].strip() == point.encode())
               or (point == "progress" and ln.startswith(b"[")) for ln in lines):
            break
    alive = proc.poll() is None
    if alive:
        proc.send_signal(signal.SIGINT)
    rest = buf + proc.communicate(timeout=120)[1]
    return alive, proc.returncode, rest.decode(errors="replace")
