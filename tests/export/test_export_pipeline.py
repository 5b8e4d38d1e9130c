"""``rkpart export`` on tiny real diffusers pipelines (:mod:`tests.models.pipelines`).

Each export is made once per source (:mod:`tests.export.exports`).  What is checked:

- the files are written and ``pipeline.json`` loads (schema, values) and describes ``transformer.onnx``;
- the description's facts are the pipeline's: the CFG mode tinypipes measured, the guidance-distilled
  Flux's ``timestep`` (t / 1000) and ``guidance`` inputs told apart, PixArt's learned sigma, Flux's
  2x2 packing;
- a loop written from ``pipeline.json`` alone (:mod:`tests.export.loop`) with both ONNX files gives what
  diffusers' own pipeline gives for other embeddings, latents, a step count and a guidance scale than the
  export recorded (cosine of the latent >= 0.9999, image PSNR >= 35 dB);
- both exporters, float16 and ``--batch 1`` (a batched pair exported as two passes);
- the same input gives byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.export.exports import cached_pipeline_export
from tests.export.loop import cosine, psnr, run_description
from tests.models import pipelines as tp

pytestmark = [pytest.mark.export, pytest.mark.slow]

#: family -> (the export options of the case, the latent cosine and image PSNR bounds)
CASES = {
    "pixart_sigma": {},
    "flux": {},
    "sd3": {},
    "sana": {},
    "flux-dynamo-fp16": {"exporter": "dynamo", "dtype": "float16"},
    "sd3-dynamo": {"exporter": "dynamo"},
    "sd3-batch1": {"batch": 1},
}


def _export(case: str) -> Path:
    family = case.split("-")[0]
    return cached_pipeline_export(family, **CASES[case])


def _doc(folder: Path) -> dict:
    return json.loads((folder / "pipeline.json").read_text())


@pytest.mark.parametrize("case", sorted(CASES))
def test_files_written_and_description_valid(case: str) -> None:
    import onnx

    from rkpart.description import check_against, load_description

    folder = _export(case)
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == sorted(
        ["pipeline.json", "transformer.onnx", "vae_decoder.onnx"] + (["inputs.npz"] if _doc(folder)["values"] else []))
    d = load_description(folder / "pipeline.json")
    m = onnx.load(str(folder / "transformer.onnx"), load_external_data=False)
    types = {i.name: (onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name,
                      [x.dim_value for x in i.type.tensor_type.shape.dim]) for i in m.graph.input}
    check_against(d, types, outputs=[o.name for o in m.graph.output])
    spec = tp.PIPELINES[case.split("-")[0]]
    assert d.pipeline_class == spec.pipeline
    # tinypipes measured the CFG mode from the pipeline's calls; --batch 1 makes a batched pair two passes
    assert d.cfg.mode == ("two-pass" if CASES[case].get("batch") == 1 else spec.cfg)
    assert d.cfg.guidance_scale == spec.guidance
    assert _doc(folder)["image"] == {"height": spec.height, "width": spec.width, "text_len": tp.TEXT_LEN,
                                     "batch": CASES[case].get("batch", 2 if spec.cfg == "batched" else 1)}


def test_flux_distilled_timestep_and_guidance_told_apart() -> None:
    """Flux (guidance_embeds=True) takes ``timestep`` = t / 1000 and ``guidance`` = the guidance scale: two inputs
    of the same shape and dtype that a shape rule cannot tell apart."""
    doc = _doc(_export("flux"))
    roles = {k: v["role"] for k, v in doc["inputs"].items()}
    assert roles == {"hidden_states": "latent", "encoder_hidden_states": "text_embeddings",
                     "pooled_projections": "pooled_embeddings", "timestep": "timestep", "img_ids": "image_ids",
                     "txt_ids": "text_ids", "guidance": "guidance"}
    assert doc["inputs"]["timestep"]["shape"] == doc["inputs"]["guidance"]["shape"] == [1]
    assert doc["timestep"] == {"scale": 0.001, "offset": 0.0, "reverse": False}
    assert doc["cfg"]["mode"] == "distilled" and doc["cfg"]["guidance_input"] == "guidance"
    assert doc["cfg"]["guidance_input_scale"] == 1.0
    assert doc["latent"]["packing"] == "flux-2x2" and doc["latent"]["shape"] == list(tp.PIPELINES["flux"].latent_shape)
    assert doc["scheduler"]["set_timesteps"]["sigmas"] == "linspace(1, 1/n, n)"
    assert doc["scheduler"]["set_timesteps"]["mu"] is not None
    assert doc["inputs"]["img_ids"]["value"] == "img_ids" and doc["inputs"]["txt_ids"]["value"] == "txt_ids"
    assert doc["inputs"]["encoder_hidden_states"]["argument"] == "prompt_embeds"


def test_pixart_learned_sigma_and_batched_masks() -> None:
    doc = _doc(_export("pixart_sigma"))
    assert doc["output"]["learned_sigma"] is True and doc["output"]["prediction"] == "epsilon"
    mask = doc["inputs"]["encoder_attention_mask"]
    assert (mask["role"], mask["argument"], mask["negative_argument"]) == (
        "attention_mask", "prompt_attention_mask", "negative_prompt_attention_mask")
    assert doc["inputs"]["timestep"]["dtype"] == "int64" and doc["cfg"]["combine"] == "uncond + g * (cond - uncond)"
    # DPMSolverMultistepScheduler's lambda_min_clipped (-inf) is spelled so that the JSON stays finite
    assert doc["scheduler"]["config"]["lambda_min_clipped"] == "-Infinity"


@pytest.mark.parametrize("case", sorted(CASES))
def test_description_reproduces_diffusers(case: str) -> None:
    """The loop run from pipeline.json alone equals diffusers' own call (other inputs, 4 steps, another guidance)."""
    family = case.split("-")[0]
    folder = _export(case)
    src = tp.cached_pipeline(family)
    embeds, latents = tp.call_inputs(family, seed=7)
    guidance = tp.PIPELINES[family].guidance + 1.25
    pipe = tp.load(src)
    want_latent = tp.run_diffusers(src, embeds, latents, 4, guidance, "latent", pipe=pipe)
    want_image = tp.run_diffusers(src, embeds, latents, 4, guidance, "np", pipe=pipe)
    got_latent, got_image = run_description(folder, embeds, latents, 4, guidance)
    fp16 = CASES[case].get("dtype") == "float16"
    assert cosine(got_latent, want_latent) >= (0.999 if fp16 else 0.9999)
    assert got_image is not None and got_image.shape == want_image.shape
    assert psnr(got_image, want_image) >= (30 if fp16 else 35)


def test_same_input_gives_identical_files(tmp_path: Path) -> None:
    """A second export of the same pipeline with the same options writes the same bytes; given as its
    ``transformer/`` subfolder, the pipeline around it is exported."""
    from rkpart.export.build import ExportOptions, export_pipeline
    from tests.export.exports import export_options

    first = _export("sd3")
    export_pipeline(tp.cached_pipeline("sd3") / "transformer", tmp_path / "again",
                    ExportOptions(**export_options("sd3")))  # type: ignore[arg-type]
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "again").iterdir())
    for n in names:
        assert (first / n).read_bytes() == (tmp_path / "again" / n).read_bytes(), n


def test_values_match_the_graph_dtype() -> None:
    """A float16 export's constants (Flux's id grids) are float16, as the graph takes them."""
    folder = _export("flux-dynamo-fp16")
    values = np.load(folder / "inputs.npz")
    doc = _doc(folder)
    for name in ("img_ids", "txt_ids"):
        assert str(values[name].dtype) == doc["inputs"][name]["dtype"] == "float16"


def test_masks_are_graph_inputs() -> None:
    """PixArt-Σ's text mask is an input of transformer.onnx, not a constant of the trace: the graph agrees with the
    torch transformer for an all-valid mask and a half-valid one (the passes of CFG give different masks)."""
    import onnxruntime as ort
    import torch
    from diffusers import PixArtTransformer2DModel

    folder = _export("pixart_sigma")
    model = PixArtTransformer2DModel.from_pretrained(tp.cached_pipeline("pixart_sigma") / "transformer").eval()
    doc = _doc(folder)
    sess = ort.InferenceSession(str(folder / "transformer.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    shapes = {k: v["shape"] for k, v in doc["inputs"].items()}
    feeds = {"hidden_states": rng.standard_normal(shapes["hidden_states"]).astype(np.float32),
             "encoder_hidden_states": rng.standard_normal(shapes["encoder_hidden_states"]).astype(np.float32),
             "timestep": np.full(shapes["timestep"], 500, dtype=np.int64)}
    half = np.ones(shapes["encoder_attention_mask"], dtype=np.int64)
    half[:, half.shape[1] // 2:] = 0
    outs = []
    for mask in (np.ones_like(half), half):
        got = sess.run(None, {**feeds, "encoder_attention_mask": mask})[0]
        with torch.no_grad():
            want = model(**{k: torch.from_numpy(v) for k, v in feeds.items()},
                         encoder_attention_mask=torch.from_numpy(mask),
                         added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False)[0].numpy()
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
        outs.append(got)
    assert np.abs(outs[0] - outs[1]).max() > 1e-3 * np.abs(outs[0]).max()  # the mask reaches the output
