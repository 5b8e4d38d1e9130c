"""``rkpart export`` of the pipelines that need a feature of ``pipeline.json`` beyond version 1 as first
published (docs/pipeline-json.md, Features): one tiny real pipeline per pattern.

Each case exports the pipeline (cached by source, :mod:`tests.export.exports`), checks that the description
names exactly the features it uses (:func:`rkpart.description.features`: what a reader must implement), and
runs the loop written from ``pipeline.json`` alone (:mod:`tests.export.loop`) against diffusers' own call on
other embeddings, latents, a step count and a guidance scale than the export recorded.  The other families
with each feature run from ``scripts/export_pipelines.py`` (docs/export.md's table).
"""

from __future__ import annotations

import pytest

from tests.export.exports import cached_pipeline_export
from tests.export.loop import cosine, run_description
from tests.models import pipelines as tp

pytestmark = [pytest.mark.export, pytest.mark.slow]

#: family -> the features its description uses: one family per pattern (the CFG form, an unconditional row
#: that is no argument, a mask extended with valid positions, a mu rule, video); scripts/export_pipelines.py
#: runs every family, tests/export/test_describe.py each derivation rule on a hand-made recording
CASES: dict[str, set[str]] = {
    # Krea 2: cond + g * (cond - uncond); its Qwen-Image VAE decodes a frame axis of one (nearest-exact upsampling)
    "krea2": {"cfg.combine=cond + g * (cond - uncond)"},
    # DiT: class labels, the null class 1000 in the unconditional row of a [cond, uncond] pair; its scheduler steps
    # the pair's two identical halves and it draws its own noise
    "dit": {"cfg.batch_order=cond,uncond", "inputs.negative_fill"},
    # Chroma: its mask is the call's text mask followed by the image tokens, valid
    "chroma": {"inputs.append_valid"},
    # Flux.2: mu by its rule of the step count; latents= patchified, looped on as tokens
    "flux2": {"scheduler.set_timesteps.mu_rule=flux2_empirical", "latent.init=tokens"},
    # CogVideoX: a video pipeline (one frame), looped on as (B, F, C, H, W)
    "cogvideox": {"image.num_frames"},
}


@pytest.mark.parametrize("family", sorted(CASES))
def test_feature_exports_and_reproduces_diffusers(family: str) -> None:
    from rkpart.description import features, load_description

    folder = cached_pipeline_export(family)
    d = load_description(folder / "pipeline.json")
    assert features(d) == CASES[family]
    embeds, latents = tp.call_inputs(family, seed=7)
    guidance = tp.PIPELINES[family].guidance + 1.25
    # DiT draws its own noise: from the seed call_inputs drew it with
    want = tp.run_diffusers(tp.cached_pipeline(family), embeds, latents, 4, guidance, "latent",
                            seed=7 if tp.PIPELINES[family].noise_from_generator else 0)
    got, image = run_description(folder, embeds, latents, 4, guidance)
    assert cosine(got, want) >= 0.9999
    assert image is not None and image.shape == tp.PIPELINES[family].output_shape  # a video's (B, F, H, W, 3)
