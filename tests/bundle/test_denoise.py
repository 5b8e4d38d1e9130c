"""The denoising loop of a bundle (``runner.py --steps``, ``Runner.denoise``) on x86.

The plan is the bundled example, compiled for real by rknn-toolkit2 2.3.0 (without the build
cache, so its build logs, which decide the default core masks, are in the plan folder), and
bundled by ``rkpart bundle``.  The NPU is replaced either by the runner's ONNX Runtime stand-in
or by the FAKE RKNNLite of :mod:`tests.bundle.fake_rknnlite`, which records what the board
runtime would be asked to do.  The reference is ``rkpart drift``'s ONNX Runtime trajectory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from rkpart.bundle.build import bundle_plan
from rkpart.cli import main
from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.pipeline import partition
from rkpart.plan.plan import Plan
from rkpart.profile.drift import denoise as drift_denoise
from tests.bundle.fake_rknnlite import fake_for
from tests.bundle.test_bundle import load_runner, run_cli
from tests.toolkits import get_toolkit

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> tuple[Plan, Path]:
    folder = tmp_path_factory.mktemp("loop-plan") / "split"
    plan = partition(example_model, folder, "split")
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit("2.3.0"), "rk3588", {}, jobs=2, cache=False))
    assert not rep.failed
    return rep.plan, folder


@pytest.fixture(scope="module")
def bundle(compiled: tuple[Plan, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("loop-bundle") / "board"
    bundle_plan(compiled[1], out)
    return out


@pytest.fixture(scope="module")
def reference(compiled: tuple[Plan, Path]) -> np.ndarray:
    """``rkpart drift``'s ORT reference: 4 steps, CFG 4.5, seed 0."""
    plan, folder = compiled
    return drift_denoise(plan, folder, backend=None, steps=4, cfg=True, guidance=4.5, seed=0).latents[-1]


def manifest(bundle: Path) -> dict[str, Any]:
    return dict(json.loads((bundle / "manifest.json").read_text()))


def test_runner_loop_writes_drifts_reference_latent_and_cfg_parallel_the_same_bytes(
        bundle: Path, compiled: tuple[Plan, Path], reference: np.ndarray, tmp_path: Path) -> None:
    seq, par = tmp_path / "seq.npy", tmp_path / "par.npy"
    p = run_cli(bundle, "--steps", "4", "--guidance", "4.5", "--latent-out", str(seq), standin=compiled[1])
    assert p.returncode == 0, p.stderr[-2000:]
    steps = [ln for ln in p.stdout.splitlines() if ln.startswith("step ")]
    assert [ln.split(":")[0] for ln in steps] == [f"step {i}/4" for i in range(1, 5)]
    assert all(all(k in ln for k in ("load", "init", "infer", "release", "cond then uncond")) for ln in steps)
    x = np.load(seq)
    assert x.shape == reference.shape and x.dtype == reference.dtype
    assert float(np.max(np.abs(x - reference))) <= 1e-5
    assert np.array_equal(x, reference)  # the same ORT graphs and the same arithmetic: exactly equal
    p = run_cli(bundle, "--steps", "4", "--guidance", "4.5", "--latent-out", str(par), "--cfg-parallel", "--json",
                standin=compiled[1])
    assert p.returncode == 0, p.stderr[-2000:]
    rep = json.loads(p.stdout)
    assert rep["cfg_parallel"] is True and len(rep["per_step"]) == 4 and rep["passes_per_step"] == 2
    assert np.load(par).tobytes() == x.tobytes()
    # run as on the board (bytecode on): the bundle is as bundled, the pipeline's sampler left no __pycache__
    assert not list(bundle.rglob("__pycache__")), sorted(bundle.rglob("__pycache__"))


def test_denoise_from_python_follows_drift_with_shift_seed_and_given_conditioning(
        bundle: Path, compiled: tuple[Plan, Path]) -> None:
    plan, folder = compiled
    mod = load_runner(bundle)
    with mod.Runner(bundle, npu_standin=folder) as r:
        got = r.denoise(3, guidance=4.5, shift=3.0, seed=1)
        assert len(r.step_timings) == 3
        want = drift_denoise(plan, folder, backend=None, steps=3, cfg=True, guidance=4.5, seed=1,
                             shift=3.0).latents[-1]
        assert np.array_equal(got, want)
        assert not np.array_equal(got, r.denoise(3, guidance=4.5, shift=1.0, seed=1))
        # the conditioning drift draws, given as a file would give it: the same latent
        rng = np.random.default_rng(1)
        rng.standard_normal(plan.tensors["hidden_states"].shape)
        ctx = rng.standard_normal(plan.tensors["encoder_hidden_states"].shape).astype(np.float32)
        assert np.array_equal(r.denoise(3, guidance=4.5, shift=3.0, seed=1, cond={"encoder_hidden_states": ctx}),
                              got)
        # uncond = cond: the CFG combine is the identity, so the loop equals the cond-only loop
        same = r.denoise(2, seed=1, cond={"encoder_hidden_states": ctx}, uncond={"encoder_hidden_states": ctx})
        assert np.array_equal(same, r.denoise(2, seed=1, cond={"encoder_hidden_states": ctx}, cfg=False))
        with pytest.raises(mod.BundleError, match="cond conditioning lacks 'encoder_hidden_states'"):
            r.denoise(1, cond={})


def test_fake_rknnlite_per_stage_loop_has_one_context_alive_and_the_manifests_masks(
        bundle: Path, compiled: tuple[Plan, Path], reference: np.ndarray) -> None:
    mod = load_runner(bundle)
    fake = fake_for(bundle, compiled[1], mod.ort_session)
    with mod.Runner(bundle, rknnlite_api=fake) as r:
        x = r.denoise(4, guidance=4.5)
    rec = fake.recorder
    assert np.array_equal(x, reference)
    assert rec.max_alive == 1 and not rec.alive
    npu = [s for s in manifest(bundle)["stages"] if s["device"] == "npu"]
    masks = {Path(s["file"]).name: mod.CORE_MASKS[s["core_mask"]] for s in npu}
    assert {s["id"]: s["core_mask"] for s in npu} == {
        "b00.attn": "auto", "b00.xattn": "auto", "b00.ffn": "0_1_2",
        "b01.attn": "auto", "b01.xattn": "auto", "b01.ffn": "0_1_2"}
    inits = rec.of("init_runtime")
    # stage-major CFG: one context per stage and step serves both passes
    assert len(inits) == 6 * 4 and len(rec.of("release")) == 6 * 4 and len(rec.of("inference")) == 6 * 4 * 2
    for c in inits:
        assert c.kwargs["core_mask"] == masks[Path(rec.calls[[k.context for k in rec.calls].index(c.context) + 1]
                                                  .args[0]).name]
    order = [c.kwargs["file"] for c in rec.of("inference")]
    assert order[:12] == [Path(s["file"]).name for s in npu for _ in range(2)]
    assert {c.thread for c in rec.calls} == {"MainThread"}


def test_fake_rknnlite_cfg_parallel_holds_two_contexts_on_cores_0_and_1(
        bundle: Path, compiled: tuple[Plan, Path], reference: np.ndarray) -> None:
    mod = load_runner(bundle)
    fake = fake_for(bundle, compiled[1], mod.ort_session)
    with mod.Runner(bundle, rknnlite_api=fake, cfg_parallel=True) as r:
        x = r.denoise(4, guidance=4.5)
    rec = fake.recorder
    assert x.tobytes() == reference.tobytes()
    assert rec.max_alive == 2 and not rec.alive
    inits = rec.of("init_runtime")
    assert len(inits) == 6 * 4 * 2
    assert sorted({c.kwargs["core_mask"] for c in inits}) == [1, 2]  # NPU_CORE_0, NPU_CORE_1
    # one thread per pass: the cond pass's contexts on core 0, the uncond pass's on core 1
    by_thread = {c.thread.rsplit("_", 1)[0]: {k.kwargs["core_mask"] for k in inits if k.thread == c.thread}
                 for c in inits}
    assert by_thread == {"cfg-cond": {1}, "cfg-uncond": {2}}
    for k in range(0, len(inits), 2):  # stage by stage: both contexts of a stage, then the next stage
        assert {inits[k].kwargs["core_mask"], inits[k + 1].kwargs["core_mask"]} == {1, 2}
    # both contexts of a stage are initialised before either infers: the first inference of
    # every stage and step sees both alive
    infers = rec.of("inference")
    assert [infers[k].alive for k in range(0, len(infers), 2)] == [2] * (6 * 4)


@pytest.mark.parametrize("cfg_parallel", [False, True])
def test_fake_rknnlite_resident_loop_keeps_every_context_for_the_loop(
        bundle: Path, compiled: tuple[Plan, Path], cfg_parallel: bool) -> None:
    mod = load_runner(bundle)
    fake = fake_for(bundle, compiled[1], mod.ort_session)
    with mod.Runner(bundle, rknnlite_api=fake, residency="resident", cfg_parallel=cfg_parallel) as r:
        r.denoise(3)
        alive_in_loop = len(fake.recorder.alive)
    rec = fake.recorder
    lanes = 2 if cfg_parallel else 1
    assert alive_in_loop == rec.max_alive == 6 * lanes and not rec.alive
    assert len(rec.of("init_runtime")) == len(rec.of("release")) == 6 * lanes
    assert len(rec.of("inference")) == 6 * 3 * 2


def test_bundle_refuses_cfg_parallel_over_the_budget_naming_what_fits(compiled: tuple[Plan, Path],
                                                                      tmp_path: Path) -> None:
    folder = compiled[1]
    out = tmp_path / "board"
    # per-stage: the largest stage is 353 KiB (the self-attention, its RoPE tables stored once), two
    # contexts of it 706 KiB
    r = CliRunner().invoke(main, ["bundle", str(folder), "-o", str(out), "-q", "--cfg-parallel", "--budget-mib", "0.5"])
    assert r.exit_code == 9 and r.output.count("\n") == 1, r.output
    assert "--cfg-parallel holds two contexts of every NPU stage: 0.7 MiB" in r.output
    assert "the largest that fits: no --cfg-parallel, the residency as given (0.3 MiB)" in r.output
    assert not out.exists()
    r = CliRunner().invoke(main, ["bundle", str(folder), "-o", str(out), "-q", "--cfg-parallel", "--budget-mib", "1",
                                  "--residency", "resident"])
    assert r.exit_code == 9 and "the largest that fits: --cfg-parallel --residency per-stage (0.7 MiB)" in r.output
    r = CliRunner().invoke(main, ["bundle", str(folder), "-o", str(out), "-q", "--cfg-parallel", "--budget-mib", "1"])
    assert r.exit_code == 0, r.output
    m = manifest(out)
    assert m["denoise"]["cfg_parallel"] is True
    from rkpart.plan.plan import load_plan

    largest = 0  # per-stage: the largest stage's compiler figures (measured 361344 B, 2.3.0)
    for st in load_plan(folder)[0].npu_stages:
        a = st.artifact()
        assert a is not None and a.compiler is not None
        assert a.compiler.weight_bytes is not None and a.compiler.internal_bytes is not None
        largest = max(largest, a.compiler.weight_bytes + a.compiler.internal_bytes)
    assert m["device_memory"]["cfg_parallel_run_bytes"] == 2 * m["device_memory"]["run_bytes"] == 2 * largest
    p = run_cli(out, "--steps", "1", "--latent-out", str(tmp_path / "x.npy"), standin=folder)
    assert p.returncode == 0 and "in parallel (cores 0 and 1)" in p.stdout, p.stderr
    # the runner checks the manifest's budget too: both contexts of every resident stage do not fit 1 MiB
    p = run_cli(out, "--steps", "1", "--residency", "resident", "--latent-out", str(tmp_path / "y.npy"), standin=folder)
    assert p.returncode == 2 and p.stderr.count("\n") <= 2 and "over the bundle's budget of 1.0 MiB" in p.stderr


def test_core_mask_spec_and_the_compile_log_default(compiled: tuple[Plan, Path], bundle: Path,
                                                    tmp_path: Path) -> None:
    folder = compiled[1]
    reasons = {s["id"]: s["core_mask_reason"] for s in manifest(bundle)["stages"] if s["device"] == "npu"}
    assert reasons["b00.ffn"] == "compiler plan: every NPU compute layer splits across cores"
    # 2.3.0's layer table: the norm, the attention and rope-halves' Sub (x1*cos1 - x2*sin1) use one core
    assert reasons["b00.attn"] == "compiler plan: Sub, exNorm, exSDPAttention run on one core"
    assert manifest(bundle)["device_memory"]["source"] == ["compiler plan"]
    out = tmp_path / "spec"
    r = CliRunner().invoke(main, ["bundle", str(folder), "-o", str(out), "-q", "--core-mask", "*.attn=0,b00.ffn=2,1"])
    assert r.exit_code == 0, r.output
    assert {s["id"]: s["core_mask"] for s in manifest(out)["stages"] if s["device"] == "npu"} == {
        "b00.attn": "0", "b01.attn": "0", "b00.ffn": "2", "b00.xattn": "1", "b01.xattn": "1", "b01.ffn": "1"}
    for spec, msg in [("nope=0", "'nope' names no NPU stage (they are: b00.attn, "),
                      ("0_1_3", "'0_1_3' is not one of")]:
        r = CliRunner().invoke(main, ["bundle", str(folder), "-o", str(tmp_path / "bad"), "-q", "--core-mask", spec])
        assert r.exit_code == 2 and r.output.count("\n") == 1 and msg in r.output, r.output
    # the build logs alone give the same masks (a plan compiled before compiler plans were kept)
    copy = tmp_path / "logs-only"
    shutil.copytree(folder, copy)
    shutil.rmtree(copy / "rknn" / "layers")
    bundle_plan(copy, tmp_path / "b1")
    assert {s["id"]: s["core_mask_reason"].replace("compile log", "compiler plan")
            for s in manifest(tmp_path / "b1")["stages"] if s["device"] == "npu"} == reasons
    # without any layer table: auto, and said so
    copy = tmp_path / "nolog"
    shutil.copytree(folder, copy)
    shutil.rmtree(copy / "rknn" / "logs")
    shutil.rmtree(copy / "rknn" / "layers")
    r = CliRunner().invoke(main, ["bundle", str(copy), "-o", str(tmp_path / "b2")])
    assert r.exit_code == 0, r.output
    assert "core mask of b00.ffn: no layer table of the stage (compiler plan or rknn/logs/); auto" in r.output
    npu = [s for s in manifest(tmp_path / "b2")["stages"] if s["device"] == "npu"]
    assert {s["core_mask"] for s in npu} == {"auto"}
    assert manifest(tmp_path / "b2")["device_memory"]["source"] == ["compiler plan"]  # plan.json keeps it


def test_loop_inputs_named_by_flags_or_refused_in_one_line(compiled: tuple[Plan, Path], bundle: Path,
                                                           tmp_path: Path) -> None:
    folder = compiled[1]
    d = manifest(bundle)["denoise"]
    assert (d["latent"], d["timestep"], d["context"], d["output"]) == (
        "hidden_states", "timestep", ["encoder_hidden_states"], "sample")
    assert d["mapped_by"] == "shape (guessed)" and d["scheduler"]["name"] == "flow-euler"
    named = tmp_path / "named"
    r = CliRunner().invoke(main, ["bundle", str(folder), "-o", str(named), "-q", "--latent-input", "hidden_states",
                                  "--timestep-input", "timestep"])
    assert r.exit_code == 0 and manifest(named)["denoise"]["mapped_by"] == "flags", r.output
    r = CliRunner().invoke(main, ["bundle", str(folder), "-o", str(tmp_path / "bad"), "-q", "--latent-input", "x"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "'x' is not an input of the model" in r.output
    # a latent that cannot be stepped (not the output's shape): bundled, but the loop is refused
    wrong = tmp_path / "wrong"
    r = CliRunner().invoke(main, ["bundle", str(folder), "-o", str(wrong), "-q", "--latent-input",
                                  "encoder_hidden_states"])
    assert r.exit_code == 0 and "denoising loop: not available" in r.output, r.output
    p = run_cli(wrong, "--steps", "2", "--latent-out", str(tmp_path / "w.npy"), standin=folder)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("runner: error")]
    assert len(err) == 1 and "--latent-input NAME --timestep-input NAME" in err[0]
    assert "does not have the output's shape" in err[0]


def test_loop_without_cfg_is_drifts_no_cfg_loop(bundle: Path, compiled: tuple[Plan, Path]) -> None:
    plan, folder = compiled
    mod = load_runner(bundle)
    with mod.Runner(bundle, npu_standin=folder) as r:
        got = r.denoise(3, cfg=False, seed=2)
    want = drift_denoise(plan, folder, backend=None, steps=3, cfg=False, seed=2).latents[-1]
    assert np.array_equal(got, want)


def test_a_context_failing_under_cfg_parallel_is_one_error_and_the_other_is_released(
        bundle: Path, compiled: tuple[Plan, Path]) -> None:
    mod = load_runner(bundle)
    fake = fake_for(bundle, compiled[1], mod.ort_session)
    real_init = fake.init_runtime

    def init_runtime(self, target=None, device_id=None, async_mode=False, core_mask=0):  # type: ignore[no-untyped-def]
        if core_mask == 2 and self.path.name.endswith("b00.xattn.rknn"):  # core 1's context of the second stage
            return -1
        return real_init(self, target, device_id, async_mode, core_mask)

    failing = type("FailingFake", (fake,), {"init_runtime": init_runtime})
    with mod.Runner(bundle, rknnlite_api=failing, cfg_parallel=True) as r, \
            pytest.raises(mod.RuntimeFailure, match=r"stage b00\.xattn: init_runtime returned -1"):
        r.denoise(2)
    rec = fake.recorder
    assert not rec.alive  # core 0's context of b00.xattn was released, not left waiting for its partner
    assert [c.kwargs["file"] for c in rec.of("inference")] == ["001_b00.attn.rknn"] * 2


class _TimedCores:
    """The FAKE board's clock: every inference takes ``seconds`` on the NPU core its context was
    initialised on, one inference per core at a time (a stand-in for the board's timing)."""

    def __init__(self, seconds: float) -> None:
        import threading

        self.seconds = seconds
        self.locks: dict[int, Any] = {}
        self.guard = threading.Lock()

    def fake(self, base: type) -> type:
        import time

        cores = self
        real = base.inference

        def inference(self, inputs, data_type=None, data_format=None, inputs_pass_through=None,  # type: ignore[no-untyped-def]
                      get_frame_id=False):
            with cores.guard:
                lock = cores.locks.setdefault(getattr(self, "core_mask", 0), __import__("threading").Lock())
            with lock:
                time.sleep(cores.seconds)
            return real(self, inputs, data_type, data_format, inputs_pass_through, get_frame_id)

        return type("TimedFakeRKNNLite", (base,), {"inference": inference})


def test_tune_measures_cfg_parallel_both_ways_on_the_fake_board_and_replaces_the_prior(
        bundle: Path, compiled: tuple[Plan, Path], tmp_path: Path) -> None:
    from rkpart.cost_model.estimate import estimate_plan
    from rkpart.cost_model.model import CostModel, default_model_path
    from rkpart.cost_model.npu_time import CFG_PARALLEL_SPEEDUP, cfg_parallel_speedup
    from rkpart.runtime import board_runner
    from rkpart.tune import measure_cfg_parallel, record_cfg_parallel

    fake = fake_for(bundle, compiled[1], board_runner.ort_session)
    timed = _TimedCores(0.05).fake(fake)  # 0.02 s measured 1.17x on a loaded 2-core machine: the ORT half grew
    got = measure_cfg_parallel(bundle, steps=2, rounds=3, rknnlite_api=timed)
    rec = fake.recorder
    m = got.measured
    assert len(m["sequential_s"]) == 3 and len(m["parallel_s"]) == 3 and m["max_abs_diff"] == 0.0
    # both ways ran: the manifest's masks one after the other, cores 0 and 1 (masks 1, 2) at once
    masks = {c.kwargs["core_mask"] for c in rec.of("init_runtime")}
    assert {1, 2} <= masks and masks - {1, 2}
    assert rec.max_alive == 2 and not rec.alive
    assert len(rec.of("inference")) == 2 * 3 * (6 * 2 * 2)  # both ways x rounds x (stages x steps x passes)
    import statistics
    want = statistics.median(m["sequential_s"]) / statistics.median(m["parallel_s"])
    assert got.speedup == pytest.approx(want, rel=1e-3)
    assert got.speedup > 1.2  # two fake cores at once: the inference half of the loop halves
    assert got.source.startswith("measured")

    model_file = tmp_path / "model.json"
    shutil.copyfile(default_model_path(), model_file)
    assert cfg_parallel_speedup(CostModel.load(model_file))[0] == CFG_PARALLEL_SPEEDUP
    record_cfg_parallel(model_file, got)
    model = CostModel.load(model_file)
    assert model.cfg_parallel == got
    assert cfg_parallel_speedup(model) == (got.speedup, got.source)
    est = estimate_plan(compiled[0], compiled[1], model, steps=4)
    assert est.cfg_parallel is not None and est.cfg_parallel["speedup"] == got.speedup
    assert est.cfg_parallel["source"] == got.source
