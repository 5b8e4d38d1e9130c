"""The tiny diffusers pipelines (tests/models/pipelines.py) load from their folders and run: the oracle works.

For each family: ``DiffusionPipeline.from_pretrained`` on the cached ``save_pretrained`` folder, 2 steps with
``output_type="latent"`` and ``"np"``: finite outputs of the expected shapes, the same latents give the same
image twice, and the conditioning reaches the output.  ``SAMPLE`` runs in the suite;
``scripts/check_pipelines.py`` runs every family.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.models.diffusers_families import CLASS_OF, missing_dependencies
from tests.models.pipelines import PIPELINES

pytestmark = [pytest.mark.export,
              pytest.mark.skipif(bool(missing_dependencies()), reason=f"not installed: {missing_dependencies()}")]

#: the families the suite runs: all of them while they stay cheap (27 pipelines: 22 s of CPU for
#: scripts/check_pipelines.py, 8 s of it the first import of diffusers' pipelines and transformers)
SAMPLE = sorted(PIPELINES)


@pytest.fixture
def _one_thread() -> Iterator[None]:
    """One torch thread: on the shared 2-core machine under load, the default intra-op pool made a 2-step run
    of the tiny Flux 10-30x slower (1.3-4.3 s against 0.15 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_every_family_with_a_pipeline_is_in_the_table() -> None:
    """A family of the sweep has a tiny pipeline or is listed with the reason it has none."""
    from tests.models.pipelines import NO_PIPELINE, NOT_BUILT, PIPELINES

    assert set(PIPELINES) | set(NO_PIPELINE) | set(NOT_BUILT) == set(CLASS_OF)
    assert len(PIPELINES) + len(NO_PIPELINE) + len(NOT_BUILT) == len(CLASS_OF)


@pytest.mark.slow
@pytest.mark.usefixtures("_one_thread")
@pytest.mark.parametrize("family", SAMPLE)
def test_pipeline_runs_and_is_deterministic(family: str) -> None:
    from tests.models.pipelines import (
        CFG_CALLS,
        PIPELINES,
        cached_pipeline,
        call_inputs,
        load,
        run_diffusers,
        transformer_calls,
    )

    spec = PIPELINES[family]
    folder = cached_pipeline(family)
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == spec.pipeline
    pipe = load(folder)
    embeds, latents = call_inputs(family, seed=0)
    assert latents.shape == spec.latent_shape and latents.dtype == np.float32

    final = run_diffusers(folder, embeds, latents, 2, output_type="latent", pipe=pipe)
    assert final.shape == (spec.final_shape or spec.latent_shape) and np.isfinite(final).all()
    assert final.shape != latents.shape or not np.allclose(final, latents)  # the loop moved the latent

    image = run_diffusers(folder, embeds, latents, 2, output_type="np", pipe=pipe)
    assert image.shape == spec.output_shape and np.isfinite(image).all()
    assert image.min() >= 0.0 and image.max() <= 1.0 and image.std() > 0
    np.testing.assert_array_equal(run_diffusers(folder, embeds, latents, 2, output_type="np", pipe=pipe), image)

    # the CFG mode of the table: the transformer's calls and their batch in a 2-step run
    assert transformer_calls(folder, pipe=pipe) == CFG_CALLS[spec.cfg] * 2

    # the conditioning reaches the output: other prompt embeddings, another latent
    first = next(iter(embeds))  # prompt_embeds, or DiT's class_labels
    other, _ = call_inputs(family, seed=1)
    assert not np.array_equal(other[first], embeds[first])
    moved = run_diffusers(folder, {**embeds, first: other[first]}, latents, 2, output_type="latent", pipe=pipe)
    assert np.abs(moved - final).max() > 1e-4


@pytest.mark.slow
def test_cached_pipeline_is_made_once_and_whole(tmp_path_factory: pytest.TempPathFactory,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A second call returns the same folder without rebuilding it; no temporary folder is left beside it."""
    from tests.models import pipelines

    root = tmp_path_factory.mktemp("exports")
    monkeypatch.setenv("RKPART_TEST_EXPORTS", str(root))
    builds: list[str] = []
    real = pipelines._build

    def counting(spec: pipelines.TinyPipeline, out: Path, text_encoders: bool = False) -> None:
        builds.append(spec.family)
        real(spec, out, text_encoders)

    monkeypatch.setattr(pipelines, "_build", counting)
    first = pipelines.cached_pipeline("sana")
    assert pipelines.cached_pipeline("sana") == first and builds == ["sana"]
    assert sorted(p.name for p in (root / "pipelines").iterdir()) == [first.name]
    index = json.loads((first / "model_index.json").read_text())
    assert index["text_encoder"] == [None, None] and index["vae"] == ["diffusers", "AutoencoderDC"]


@pytest.mark.slow
@pytest.mark.usefixtures("_one_thread")
@pytest.mark.parametrize("family", ["pixart_sigma"])
def test_folder_with_text_encoders_encodes_a_prompt(family: str) -> None:
    """The folder ``rkpart encode`` is tested on: plain ``from_pretrained`` loads its tiny T5 and tokenizer; the
    prompt's embeddings and masks (what ``rkpart encode`` writes) give the image the prompt gives."""
    import torch
    from diffusers import DiffusionPipeline

    from tests.models.pipelines import cached_pipeline, call_inputs, run_diffusers

    folder = cached_pipeline(family, text_encoders=True)
    index = json.loads((folder / "model_index.json").read_text())
    assert index["text_encoder"] == ["transformers", "T5EncoderModel"]
    assert index["tokenizer"] == ["transformers", "T5Tokenizer"]
    pipe = DiffusionPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    _, latents = call_inputs(family)
    with torch.no_grad():
        pe, pm, ne, nm = pipe.encode_prompt("a small red cat", negative_prompt="", max_sequence_length=6)
        by_prompt = pipe(prompt="a small red cat", latents=torch.from_numpy(latents), num_inference_steps=2,
                         height=64, width=64, max_sequence_length=6, output_type="np",
                         use_resolution_binning=False).images
    assert pe.shape == (1, 6, 24) and pm.tolist() == [[1, 1, 1, 1, 1, 0]] and nm.tolist() == [[1, 0, 0, 0, 0, 0]]
    embeds = {"prompt_embeds": pe, "prompt_attention_mask": pm, "negative_prompt_embeds": ne,
              "negative_prompt_attention_mask": nm}
    by_embeds = run_diffusers(folder, {k: v.numpy() for k, v in embeds.items()}, latents, 2, output_type="np",
                              pipe=pipe)
    np.testing.assert_array_equal(by_embeds, by_prompt)


@pytest.mark.parametrize("family", SAMPLE)
def test_default_guidance_is_the_pipelines(family: str) -> None:
    """The table's default guidance is the ``guidance_scale`` default of the pipeline's ``__call__``."""
    import inspect

    import diffusers

    spec = PIPELINES[family]
    params = inspect.signature(getattr(diffusers, spec.pipeline).__call__).parameters
    assert params["guidance_scale"].default == spec.guidance


@pytest.mark.slow
def test_docs_table_is_the_generated_one() -> None:
    """docs/pipelines.md's table is what ``scripts/check_pipelines.py --write-docs`` writes from the folders."""
    import importlib.util

    from tests.models.pipelines import table

    path = Path(__file__).resolve().parents[2] / "scripts" / "check_pipelines.py"
    spec = importlib.util.spec_from_file_location("check_pipelines", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = script.DOCS.read_text()
    assert script.with_table(page, table()) == page, "run: .venv/bin/python scripts/check_pipelines.py --write-docs"
