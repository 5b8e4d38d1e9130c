"""``rkpart export``'s refusals: one line, the documented exit code, nothing written (docs/errors.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rkpart.cli import main

pytestmark = [pytest.mark.export, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["export", *args, "-q"], catch_exceptions=False)
    return res.exit_code, res.output


def _one_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rkpart: error: "), out
    return lines[0]


def _nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not any(p.name.startswith(f".{out.name}.") for p in out.parent.iterdir()), list(out.parent.iterdir())


def test_not_a_pipeline_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (tmp_path / "empty").mkdir()
    code, text = _run(str(tmp_path / "empty"), "-o", str(out))
    assert code == 3 and "not a diffusers pipeline folder (no model_index.json)" in _one_line(text)
    model = tmp_path / "transformer"
    model.mkdir()
    (model / "config.json").write_text('{"_class_name": "FluxTransformer2DModel"}')
    code, text = _run(str(model), "-o", str(out))
    assert code == 3 and "is a model folder, not a pipeline" in _one_line(text)
    assert "give the folder holding model_index.json" in text
    code, text = _run(str(tmp_path / "missing"), "-o", str(out))
    assert code == 3 and "is not a folder" in _one_line(text)
    _nothing_written(out)


def test_pipeline_without_a_transformer(tmp_path: Path) -> None:
    """A U-Net pipeline: refused naming the pipelines rkpart verifies, before anything is loaded."""
    src = tmp_path / "sd"
    src.mkdir()
    (src / "model_index.json").write_text(json.dumps({
        "_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"], "scheduler": ["diffusers", "PNDMScheduler"]}))
    out = tmp_path / "out"
    code, text = _run(str(src), "-o", str(out))
    line = _one_line(text)
    assert code == 11 and "StableDiffusionPipeline has no transformer" in line
    assert "FluxPipeline" in line and "PixArtSigmaPipeline" in line
    _nothing_written(out)


def test_unknown_pipeline_class(tmp_path: Path) -> None:
    src = tmp_path / "x"
    src.mkdir()
    (src / "model_index.json").write_text(json.dumps({"_class_name": "NoSuchPipeline"}))
    code, text = _run(str(src), "-o", str(tmp_path / "out"))
    assert code == 3 and "has no pipeline class NoSuchPipeline" in _one_line(text)


def test_output_folder_not_empty_is_refused_first(tmp_path: Path) -> None:
    from tests.models import pipelines as tp

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, text = _run(str(tp.cached_pipeline("sd3")), "-o", str(out))
    assert code == 6 and "is not empty; use --force" in _one_line(text)
    code, text = _run(str(tp.cached_pipeline("sd3")), "-o", str(out), "--force")
    assert code == 6 and "it is not an rkpart export: it has no rkpart output marker" in _one_line(text)
    assert (out / "notes.txt").read_text() == "mine"


def test_a_size_the_model_cannot_take(tmp_path: Path) -> None:
    """The tiny SD3's position embedding covers 16 x 16 patches: 512 pixels is more than it takes."""
    from tests.models import pipelines as tp

    out = tmp_path / "out"
    code, text = _run(str(tp.cached_pipeline("sd3")), "-o", str(out), "--height", "512", "--width", "512",
                      "--text-len", "6")
    line = _one_line(text)
    assert code == 2 and "StableDiffusion3Pipeline cannot run at height=512, width=512" in line
    assert "pos_embed_max_size" in line
    _nothing_written(out)


def test_batch_the_pipeline_cannot_take(tmp_path: Path) -> None:
    """Flux calls its transformer once per step on batch 1 (distilled guidance): --batch 2 is not what it does."""
    from tests.models import pipelines as tp

    out = tmp_path / "out"
    code, text = _run(str(tp.cached_pipeline("flux")), "-o", str(out), "--height", "64", "--width", "64",
                      "--text-len", "6", "--batch", "2")
    assert code == 2 and "--batch 2: FluxPipeline calls its transformer on batch 1 (distilled CFG)" in _one_line(text)
    _nothing_written(out)


def test_exporter_failure_is_one_line_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault injected into torch's exporter (a fake, to reach the failure path): its reason in one line, exit 11,
    no output folder and no staging folder left."""
    import torch

    from tests.models import pipelines as tp

    def failing_export(*_a: object, **_k: object) -> None:
        raise RuntimeError("injected exporter failure\nwith a second line")

    monkeypatch.setattr(torch.onnx, "export", failing_export)
    out = tmp_path / "out"
    code, text = _run(str(tp.cached_pipeline("flux")), "-o", str(out), "--height", "64", "--width", "64",
                      "--text-len", "6")
    line = _one_line(text)
    assert code == 11 and ("the torchscript exporter failed on FluxTransformer2DModel: RuntimeError: injected "
                           "exporter failure; try --exporter dynamo") in line
    _nothing_written(out)


def test_without_the_export_extra(tmp_path: Path) -> None:
    """torch hidden from a fresh process: one line naming the extra, exit 2, nothing written."""
    out = tmp_path / "out"
    (tmp_path / "p").mkdir()
    code = ("import sys; sys.modules['torch'] = None; from rkpart.cli import main; "
            f"sys.exit(main(['export', {str(tmp_path / 'p')!r}, '-o', {str(out)!r}]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == ("rkpart: error: torch is not installed (exporting needs the export extra): "
                                  "pip install 'rkpart[export]'")
    _nothing_written(out)


def test_frames_of_an_image_pipeline_are_refused(tmp_path: Path) -> None:
    """``--num-frames`` is for a video pipeline: refused in one line before any recording."""
    from tests.models import pipelines as tp

    out = tmp_path / "out"
    code, text = _run(str(tp.cached_pipeline("pixart_sigma")), "-o", str(out), "--num-frames", "2")
    assert code == 2 and "--num-frames 2: PixArtSigmaPipeline is not a video pipeline" in _one_line(text)
    _nothing_written(out)
