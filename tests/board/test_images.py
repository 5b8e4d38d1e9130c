"""The board runner's picture against diffusers' own (issue 49): the oracle nobody here wrote.

For a sample of the families ``rkpart export`` takes, one per sampler configuration of the sweep's image
pipelines (FlowMatchEuler with dynamic shift and a sigma rule: Flux, distilled guidance; with a static
shift: SD3, batched CFG with pooled embeddings; with CogView4's timesteps rule: two-pass CFG;
DPM-Solver++ with epsilon prediction and learned sigma: PixArt-Σ; DPM-Solver with flow prediction: Sana;
DDPM with v prediction, stochastic: HunyuanDiT, given the noise diffusers' generator drew as ``--step-noise``),
the same tiny model, the same embeddings and initial ``latents=``, 20 steps and the pipeline's default
guidance: the bundle's own ``runner.py`` (NPU stages on the ONNX Runtime stand-in) returns the latent of
``pipe(..., output_type="latent")`` (cosine >= 0.9999) and the image of ``output_type="np"`` (PSNR >= 35 dB
over 8-bit pixels).  Flux.2, Z-Image and Wan do the same through ``runner.py``'s command line for the
features of pipeline.json beyond version 1 as first published (5 of its 9).  ``scripts/check_images.py``
runs every exported family; the simulator is ``test_images_sim.py``.

Flux, PixArt-Σ and Sana are compiled for real (rknn-toolkit2 2.5.0, ``fused``: one NPU stage per block, builds
from the build cache after the first run); CogView4, SD3 and HunyuanDiT run every stage on ONNX Runtime (``generic``
with ``device="host"``: no build), which runs the same runner code around the model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.board import images as im

pytestmark = [pytest.mark.export, pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

#: compiled for the NPU (the simulator's families too), and on ONNX Runtime only
NPU_FAMILIES = ("flux", "pixart_sigma", "sana")
HOST_FAMILIES = ("cogview4", "sd3", "hunyuandit")


def _plan(family: str, root: Path) -> Path:
    from tests.toolkits import get_toolkit

    return im.compiled_plan(family, root, get_toolkit("2.5.0") if family in NPU_FAMILIES else None)


def _board(family: str, root: Path, vae: str = "host") -> tuple[Path, Path]:
    plan = _plan(family, root)
    return im.make_board(plan, root / f"{family}-{vae}-board", vae=vae), plan


def _standin(board: Path, plan: Path) -> list[Path]:
    vae = json.loads((board / "manifest.json").read_text()).get("vae") or {}
    return [plan, *([Path(vae["plan"])] if vae.get("plan") else [])]


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.toolkit) for f in NPU_FAMILIES]
                         + list(HOST_FAMILIES))
def test_the_runner_returns_diffusers_latent_and_image(family: str, board_root: Path) -> None:
    vae = "npu" if family == "flux" else "host"  # Flux's decoder is an NPU plan of its own (stand-in too)
    board, plan = _board(family, board_root, vae)
    m = json.loads((board / "manifest.json").read_text())
    assert m["vae"]["device"] == vae and m["denoise"]["pipeline"]["class"] == im.tp.PIPELINES[family].pipeline
    ref = im.reference(family)
    x, img = im.run_board(board, ref, standin=_standin(board, plan))
    assert x.shape == ref.latent.shape and x.dtype == np.float32
    assert im.cosine(x, ref.latent) >= im.MIN_COSINE
    assert img.shape == ref.image.shape and im.psnr(img, ref.image) >= im.MIN_PSNR


#: pipelines whose pipeline.json uses features beyond version 1 as first published (docs/pipeline-json.md,
#: Features), chosen to cover the most of them in three runs: Flux.2 (its mu rule of the step count, patchified
#: latents= looped on as tokens), Z-Image (cond + g * (cond - uncond) on a [cond, uncond] pair, the latent fed
#: with the frame axis the pipeline adds), Wan (a video: its frames written as PNGs); scripts/check_images.py
#: runs all 13 such families
FEATURE_FAMILIES = {
    "flux2": {"scheduler.set_timesteps.mu_rule=flux2_empirical", "latent.init=tokens"},
    "zimage": {"cfg.combine=cond + g * (cond - uncond)", "cfg.batch_order=cond,uncond"},
    "wan": {"image.num_frames"},
}


@pytest.mark.parametrize("family", sorted(FEATURE_FAMILIES))
def test_the_runner_runs_the_pipeline_json_features_as_diffusers(family: str, board_root: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``runner.py --embeds E.npz --latents L.npy --steps 20 --image-out img.png`` (in-process, every stage
    on ONNX Runtime) returns diffusers' latent and pixels, read back by Pillow; a video's frame is
    ``img-f0000.png``."""
    from PIL import Image

    board, _ = _board(family, board_root)
    p = json.loads((board / "manifest.json").read_text())["denoise"]["pipeline"]
    assert set(p["features"]) == FEATURE_FAMILIES[family]
    ref = im.reference(family)
    np.savez(tmp_path / "E.npz", **ref.embeds)
    np.save(tmp_path / "L.npy", ref.latents)
    rc, err = _main(board, "--embeds", str(tmp_path / "E.npz"), "--latents", str(tmp_path / "L.npy"), "--steps",
                    str(im.STEPS), "--latent-out", str(tmp_path / "x.npy"), "--image-out", str(tmp_path / "img.png"),
                    capsys=capsys)
    assert rc == 0, err
    x = np.load(tmp_path / "x.npy")
    assert x.shape == ref.latent.shape and im.cosine(x, ref.latent) >= im.MIN_COSINE
    # with every stage on ONNX Runtime the loop is diffusers' to float32 rounding (measured <= 5e-7 of the
    # largest value); the cosine alone passes Flux.2 with the mu of 4 steps instead of 20 (0.99997)
    assert np.abs(x - ref.latent).max() <= 1e-5 * np.abs(ref.latent).max()
    video = len(ref.image.shape) == 5
    names = [f"img-f{k:04d}.png" for k in range(ref.image.shape[1])] if video else ["img.png"]
    assert sorted(f.name for f in tmp_path.glob("img*")) == names
    frames = []
    for name in names:
        with Image.open(tmp_path / name) as png:
            assert png.format == "PNG" and png.mode == "RGB"
            frames.append(np.asarray(png, dtype=np.float32) / 255.0)
    got = np.stack(frames)[None] if video else frames[0][None]
    assert got.shape == ref.image.shape and im.psnr(got, ref.image) >= im.MIN_PSNR
    assert np.abs(got * 255 - np.round(np.clip(ref.image, 0, 1) * 255)).max() <= 1  # at most one 8-bit level


@pytest.mark.toolkit
def test_a_sampler_that_drifts_from_diffusers_fails_the_oracle(board_root: Path, tmp_path: Path) -> None:
    """The same check catches a sampler off by one solver order, and drift's flow-Euler loop."""
    board, plan = _board("pixart_sigma", board_root)
    ref = im.reference("pixart_sigma")
    drifted = tmp_path / "board"
    shutil.copytree(board, drifted)
    m = json.loads((drifted / "manifest.json").read_text())
    m["denoise"]["pipeline"]["sampler"]["config"]["solver_order"] = 1  # DPM-Solver++ 1 instead of 2
    (drifted / "manifest.json").write_text(json.dumps(m))
    x, img = im.run_board(drifted, ref, standin=[plan])
    assert im.cosine(x, ref.latent) < im.MIN_COSINE or im.psnr(img, ref.image) < im.MIN_PSNR
    flux, fplan = _board("flux", board_root, "npu")
    fref = im.reference("flux")
    mod = im.bundle_runner(flux)
    with mod.Runner(flux, npu_standin=_standin(flux, fplan)) as r:
        euler = r.denoise(im.STEPS, scheduler="flow-euler", seed=3)  # rkpart drift's sampler, not Flux's
    assert im.cosine(euler, fref.latent) < 0.99


def _run_cli(board: Path, *args: str, standin: list[Path] | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RKPART_RUNNER_NPU_STANDIN")}
    if standin:
        env["RKPART_RUNNER_NPU_STANDIN"] = os.pathsep.join(map(str, standin))
    return subprocess.run([sys.executable, str(board / "runner.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.toolkit
def test_runner_cli_writes_the_png_of_diffusers_image(board_root: Path, tmp_path: Path) -> None:
    """``runner.py --embeds E.npz --steps 20 --image-out img.png``: the PNG, read back by Pillow (not the
    runner's code), has diffusers' size and pixels; the latents were the runner's own draw from --seed 0."""
    from PIL import Image

    board, plan = _board("flux", board_root, "npu")
    embeds, _ = im.tp.call_inputs("flux", seed=3)
    np.savez(tmp_path / "E.npz", **embeds)
    p = _run_cli(board, "--embeds", "E.npz", "--steps", "20", "--image-out", "img.png", "--json",
                 standin=_standin(board, plan), cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout)
    assert report["images"] == ["img.png"] and report["passes_per_step"] == 1
    assert report["sampler"] == "FlowMatchEulerDiscreteScheduler" and report["pipeline"] == "FluxPipeline"
    latents = np.random.default_rng(0).standard_normal(im.tp.PIPELINES["flux"].latent_shape).astype(np.float32)
    src = im.tp.cached_pipeline("flux")
    want = im.tp.run_diffusers(src, embeds, latents, 20, None, "np")
    with Image.open(tmp_path / "img.png") as png:
        assert png.format == "PNG" and png.mode == "RGB" and png.size == (64, 64)
        got = np.asarray(png, dtype=np.float32)[None] / 255.0
    assert im.psnr(got, want) >= im.MIN_PSNR
    assert np.abs(got * 255 - np.round(np.clip(want, 0, 1) * 255)).max() <= 1  # at most one 8-bit level
    np.testing.assert_array_equal(np.load(tmp_path / "latent.npy"), im.run_board(
        board, im.Reference(embeds, latents, want, want), standin=_standin(board, plan))[0])


@pytest.mark.toolkit
def test_help_says_which_pipeline_sampler_and_vae_the_bundle_carries(board_root: Path, tmp_path: Path) -> None:
    board, _ = _board("flux", board_root, "npu")
    p = _run_cli(board, "--help", standin=None, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "Pipeline: FluxPipeline (FluxTransformer2DModel); sampler FlowMatchEulerDiscreteScheduler " \
           "(linspace(1, 1/n, n) mu 0.459375); guidance distilled 3.5" in text
    assert "call arguments for --embeds: pooled_prompt_embeds, prompt_embeds" in text
    assert "VAE decoder: AutoencoderKL on the NPU (1 stage); --image-out writes a PNG." in text


@pytest.fixture(scope="module")
def sd3_board(board_root: Path) -> Path:
    return _board("sd3", board_root)[0]


def _main(board: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    mod = im.bundle_runner(board)
    rc = mod.main(["--bundle", str(board), *args])
    return rc, capsys.readouterr().err


BAD_EMBEDS: list[tuple[str, Any, str]] = [
    ("missing", lambda e: {k: v for k, v in e.items() if k != "negative_prompt_embeds"},
     "has no 'negative_prompt_embeds' (input 'encoder_hidden_states', uncond pass; its keys: "),
    ("shape", lambda e: {**e, "prompt_embeds": np.zeros((1, 7, 24), np.float32)},
     "'prompt_embeds' is [1, 7, 24]; input 'encoder_hidden_states' takes [1, 6, 24] (one row of its batch-2 CFG "
     "pair)"),
    ("dtype", lambda e: {**e, "pooled_prompt_embeds": np.ones((1, 16), np.int64)},
     "'pooled_prompt_embeds' is int64; input 'pooled_projections' takes float32"),
    ("nan", lambda e: {**e, "prompt_embeds": np.full((1, 6, 24), np.nan, np.float32)},
     "'prompt_embeds' holds NaN/Inf values"),
]


@pytest.mark.parametrize(("case", "edit", "message"), BAD_EMBEDS, ids=[c[0] for c in BAD_EMBEDS])
def test_bad_embeds_are_one_line_exit_2_and_nothing_is_written(sd3_board: Path, tmp_path: Path, case: str,
                                                               edit: Any, message: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    embeds, _ = im.tp.call_inputs("sd3")
    np.savez(tmp_path / "E.npz", **edit(embeds))
    rc, err = _main(sd3_board, "--embeds", str(tmp_path / "E.npz"), "--steps", "2", "--latent-out",
                    str(tmp_path / "x.npy"), "--image-out", str(tmp_path / "x.png"), capsys=capsys)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("runner: error: --embeds ") and message in err, err
    assert not (tmp_path / "x.npy").exists() and not (tmp_path / "x.png").exists()


def test_bad_latents_and_image_paths_are_one_line_exit_2(sd3_board: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    embeds, latents = im.tp.call_inputs("sd3")
    np.savez(tmp_path / "E.npz", **embeds)
    np.save(tmp_path / "short.npy", latents[:, :, :4])
    nan = latents.copy()
    nan[0, 0, 0, 0] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link.png").symlink_to(tmp_path / "elsewhere" / "img.png")
    run = ["--embeds", str(tmp_path / "E.npz"), "--steps", "2", "--latent-out", str(tmp_path / "x.npy")]
    cases = [
        (["--latents", str(tmp_path / "short.npy")], "--latents is [1, 4, 4, 8]; the pipeline's latents= is "
                                                     "[1, 4, 8, 8] float32"),
        (["--latents", str(tmp_path / "nan.npy")], "--latents holds 1 NaN/Inf values"),
        (["--image-out", str(tmp_path / "link.png")], "is a symlink; the runner does not write through one"),
        (["--image-out", str(tmp_path / "nowhere" / "img.png")], "does not exist"),
        (["--image-out", str(tmp_path / "elsewhere")], "is not a regular file"),
    ]
    for extra, message in cases:
        rc, err = _main(sd3_board, *run, *extra, capsys=capsys)
        assert rc == 2, (extra, err)
        assert err.count("\n") == 1 and err.startswith("runner: error: ") and message in err, (extra, err)
    assert not (tmp_path / "x.npy").exists() and not (tmp_path / "elsewhere" / "img.png").exists()
    assert not list((tmp_path / "elsewhere").iterdir())
    np.save(tmp_path / "L.npy", latents)
    rc, err = _main(sd3_board, *run, "--latents", str(tmp_path / "L.npy"), "--image-out", str(tmp_path / "ok.png"),
                    capsys=capsys)
    assert rc == 0, err
    assert (tmp_path / "x.npy").is_file() and (tmp_path / "ok.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_bundle_refuses_a_scheduler_option_the_board_does_not_reproduce(board_root: Path, tmp_path: Path) -> None:
    """A scheduler config option board_sampling does not reproduce: ``rkpart bundle`` exits 2 naming it."""
    from click.testing import CliRunner

    from rkpart.cli import main
    from rkpart.pipeline import partition
    from tests.export.exports import cached_pipeline_export

    src = cached_pipeline_export("sd3")
    export = tmp_path / "export"
    shutil.copytree(src, export, ignore=shutil.ignore_patterns(".rkpart-output.json"))
    doc = json.loads((export / "pipeline.json").read_text())
    doc["scheduler"]["config"]["use_beta_sigmas"] = True
    (export / "pipeline.json").write_text(json.dumps(doc))
    partition(export / "transformer.onnx", tmp_path / "plan", "generic", device="host")
    r = CliRunner().invoke(main, ["bundle", str(tmp_path / "plan"), "-o", str(tmp_path / "board"), "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1
    assert "the pipeline's scheduler FlowMatchEulerDiscreteScheduler has options the board's sampler does not " \
           "reproduce: use_beta_sigmas=true" in r.stderr
    assert not (tmp_path / "board").exists()


def test_estimate_counts_the_samplers_model_calls_and_the_vae_decode(board_root: Path) -> None:
    """Two-pass CFG (CogView4) is 2 calls per step, batched CFG (SD3) 1 call of batch 2; the VAE decode is
    counted once per image; --cfg/--no-cfg still override."""
    from click.testing import CliRunner

    from rkpart.cli import main

    def est(family: str, *extra: str) -> dict[str, Any]:
        r = CliRunner().invoke(main, ["estimate", str(_plan(family, board_root)), "--steps", "20", "--json", *extra])
        assert r.exit_code == 0, r.output
        return dict(json.loads(r.stdout)["pipeline"])

    two, batched = est("cogview4"), est("sd3")
    assert (two["calls_per_step"], two["passes"], two["cfg_parallel"] is not None) == (2, 40, True)
    assert (batched["calls_per_step"], batched["passes"], batched["cfg_parallel"]) == (1, 20, None)
    assert "batched CFG" in batched["calls_source"] and "two-pass" in two["calls_source"]
    for p in (two, batched):
        assert p["vae_decode_s"] > 0 and p["vae_source"] == "vae_decoder.onnx on the host CPU, predicted"
        assert p["seconds_per_image"] > p["vae_decode_s"]
    forced = est("sd3", "--cfg")
    assert (forced["calls_per_step"], forced["calls_source"]) == (2, "--cfg")
    assert forced["seconds_per_image"] > batched["seconds_per_image"]


@pytest.mark.toolkit
def test_a_decoder_failing_its_gate_is_recorded_and_auto_puts_it_on_the_host(board_root: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection (the real gate failure, Sana's DC-AE giving NaN in the 2.5.0 simulator, takes minutes of
    builds): a decoder plan that fails its gate is recorded and not built again; ``--vae auto`` then bundles
    the decoder on the host, saying why; ``--vae npu`` fails."""
    import rkpart.board as board_mod
    import rkpart.pipeline
    from rkpart.errors import GateError
    from tests.export.exports import cached_pipeline_export

    decoder = cached_pipeline_export("flux") / "vae_decoder.onnx"
    plan = _plan("flux", board_root)  # before partition is patched below

    def injected(*_a: Any, **_k: Any) -> None:
        raise GateError("injected: the VAE decoder's plan fails its simulator gate (NaN)")

    monkeypatch.setattr(rkpart.pipeline, "partition", injected)
    args = {"toolkit": "2.5.0", "target": "rk3588", "config": {}, "budget_bytes": 1 << 30, "cache": tmp_path}
    with pytest.raises(GateError, match="injected"):
        board_mod.vae_plan(decoder, **args)
    (record,) = tmp_path.glob("*.json")
    assert json.loads(record.read_text())["failed"].startswith("injected")

    def must_not_build(*_a: Any, **_k: Any) -> None:
        raise AssertionError("a recorded failure was built again")

    monkeypatch.setattr(rkpart.pipeline, "partition", must_not_build)
    with pytest.raises(GateError, match="recorded in"):
        board_mod.vae_plan(decoder, **args)

    monkeypatch.setattr(board_mod, "vae_plan", injected)
    said: list[str] = []
    src = board_mod.vae_source(plan, "auto", progress=said.append)
    assert src is not None and src.device == "host" and src.plan is None
    assert any(m.startswith("VAE decoder on the host CPU instead of the NPU: injected") for m in said), said
    with pytest.raises(GateError, match="injected"):
        board_mod.vae_source(plan, "npu")
