"""Tiny, real diffusers pipelines of the family sweep: the oracle for ``rkpart export`` and the board runner.

For every family of :data:`tests.models.diffusers_families.CLASS_OF` for which diffusers ships a pipeline,
:data:`PIPELINES` holds a :class:`TinyPipeline`: real classes (transformer, VAE, scheduler) built from configs
with seeded random weights, nothing downloaded.  The transformer is the family's tiny config from
``diffusers_families`` (widths changed only where the pipeline needs them to agree: the VAE's latent
channels, the text width the call passes); the VAE is the class the pipeline's ``__init__`` names, tiny (8
channels per block) but with the published checkpoint's scaling / shift / mean-std fields; the scheduler is the
class and config the published checkpoint ships (each one's source is a comment beside it).  Text encoders and
tokenizers are ``None`` (``null`` in ``model_index.json``): the call takes ``prompt_embeds=`` and friends
directly.  ``docs/pipelines.md`` tabulates them.

- :func:`cached_pipeline` -- the ``save_pretrained`` folder of a family, made once per source of its builder
  functions and the diffusers / transformers / torch versions, written atomically.
- :func:`call_inputs` -- seeded embeddings (keys: the pipeline's call arguments) and initial ``latents=``.
- :func:`run_diffusers` -- ``DiffusionPipeline.from_pretrained(folder)(...)`` on them, as numpy.

Image size: 64 x 64 pixels for every image pipeline (the tiny VAEs downsample 8x like the published ones: a
latent of 8 x 8, the size of the sweep's tiny configs).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.models import diffusers_families as df

#: pixels of every image pipeline's call (8x VAE: 8 x 8 latents)
SIZE = 64
#: text tokens of the tiny prompt embeddings and their width (the sweep's tiny configs: 6 tokens of 24)
TEXT_LEN, TEXT_DIM, POOLED_DIM = 6, 24, 16


@dataclass(frozen=True)
class TinyPipeline:
    family: str
    pipeline: str  #: the diffusers pipeline class
    components: Callable[[], dict[str, Any]]  #: -> the pipeline's ``__init__`` arguments
    #: the call's conditioning arguments, drawn from ``rng`` (:func:`call_inputs`)
    embeds: Callable[[np.random.Generator], dict[str, np.ndarray]]
    latent_shape: tuple[int, ...]  #: the ``latents=`` argument, as the pipeline takes it
    output_shape: tuple[int, ...]  #: ``output_type="np"``'s array
    cfg: str  #: ``batched`` (one call on [uncond, cond]), ``two-pass``, ``distilled`` (guidance as an input), ``none``
    guidance: float  #: the call's default ``guidance_scale``
    #: further call arguments the tiny size needs: resolution binning off (it resizes to a 1024-pixel bin);
    #: ``negative_prompt=None`` where its default is ``""`` (diffusers refuses it beside ``negative_prompt_embeds``)
    call: dict[str, Any] = field(default_factory=dict)
    height: int = SIZE
    width: int = SIZE
    #: -> tiny real text encoders and tokenizers (built offline) replacing the ``None`` ones:
    #: ``cached_pipeline(family, text_encoders=True)``; None: this family has no such folder
    text_encoders: Callable[[], dict[str, Any]] | None = None


# ---- shared builders -------------------------------------------------------------------------------------------

def _transformer(family: str, **overrides: Any) -> Any:
    """The family's tiny transformer (``diffusers_families``), its config changed by ``overrides``, seeded
    weights; parameters diffusers initialises to all zeros (adaLN-Zero gates, output layers) get small seeded
    values as a trained checkpoint has them, so that the output depends on every input (a zero output would
    make a sampler check vacuous)."""
    import torch

    torch.manual_seed(0)
    model, _ = df.ALL[family].build()
    if overrides:
        cfg = {k: v for k, v in model.config.items() if not k.startswith("_")}
        cfg.update(overrides)
        torch.manual_seed(0)
        model = type(model).from_config(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, prm in sorted(model.named_parameters()):
            if prm.dtype.is_floating_point and prm.numel() > 1 and not prm.any():
                prm.copy_(torch.randn(prm.shape, generator=gen) * 0.02)
    return model.eval()


def _vae_kl(latent_channels: int = 4, **published: Any) -> Any:
    """A tiny ``AutoencoderKL``: 4 blocks of 8 channels (an 8x downsampling, as the published VAEs), one layer
    each; ``published`` are the checkpoint's own fields (``scaling_factor``, ``shift_factor``, quant convs)."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                         up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 8, 8, 8),
                         layers_per_block=1, latent_channels=latent_channels, norm_num_groups=4,
                         sample_size=SIZE, **published)


def _vae_dc(latent_channels: int = 4, **published: Any) -> Any:
    """A tiny ``AutoencoderDC`` (Sana's DC-AE): diffusers' test config (tests/pipelines/sana/test_sana.py
    ``get_dummy_components``) with 4 blocks, an 8x downsampling (the published f32c32 is 32x: 6 blocks)."""
    import torch
    from diffusers import AutoencoderDC

    torch.manual_seed(0)
    blocks = ("ResBlock", "ResBlock", "EfficientViTBlock", "EfficientViTBlock")
    return AutoencoderDC(in_channels=3, latent_channels=latent_channels, attention_head_dim=2,
                         encoder_block_types=blocks, decoder_block_types=blocks,
                         encoder_block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
                         encoder_qkv_multiscales=((), (), (5,), (5,)), decoder_qkv_multiscales=((), (), (5,), (5,)),
                         encoder_layers_per_block=(1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
                         downsample_block_type="conv", upsample_block_type="interpolate",
                         decoder_norm_types="rms_norm", decoder_act_fns="silu", **published)


def _t5_tokenizer(max_length: int) -> Any:
    """A T5 tokenizer built offline: a sentencepiece-style Unigram model (``tokenizers``) over a small vocabulary
    (T5's ids for ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2; a few words, then every letter, digit and punctuation
    mark alone and after "▁", so that any ASCII prompt tokenizes), the metaspace pre-tokenizer and decoder, and
    ``</s>`` appended as T5 does.  It round-trips through ``save_pretrained`` / ``from_pretrained``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    words = ["a", "an", "the", "of", "on", "in", "at", "with", "and", "cat", "dog", "photo", "red", "blue", "green",
             "small", "big", "house", "tree", "sky"]
    chars = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-")
    pieces = ["▁" + w for w in words] + ["▁" + c for c in chars if c not in words] + chars
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [(p, -3.0 - 0.01 * i) for i, p in enumerate(pieces)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    return T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                           extra_ids=0, model_max_length=max_length)


def _t5_encoder(vocab_size: int, d_model: int) -> Any:
    """A tiny ``T5EncoderModel`` (T5 v1.1's gated-GELU FFN, relative attention), seeded weights."""
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    cfg = T5Config(vocab_size=vocab_size, d_model=d_model, d_kv=8, d_ff=2 * d_model, num_layers=2, num_heads=3,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                   feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False, pad_token_id=0,
                   eos_token_id=1, decoder_start_token_id=0)
    return T5EncoderModel(cfg).eval()


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _masks(n: int = TEXT_LEN) -> dict[str, np.ndarray]:
    """A prompt that fills all but the last token and a negative prompt of 2 tokens (as a tokenizer pads ``""``
    and a short prompt to the same length): the two passes' masks differ."""
    pos = np.ones((1, n), dtype=np.int64)
    pos[0, -1] = 0
    neg = np.zeros((1, n), dtype=np.int64)
    neg[0, :2] = 1
    return {"prompt_attention_mask": pos, "negative_prompt_attention_mask": neg}


def _text(rng: np.random.Generator, *, negative: bool = True, masks: bool = False, pooled: int = 0,
          n: int = TEXT_LEN, dim: int = TEXT_DIM) -> dict[str, np.ndarray]:
    out = {"prompt_embeds": _normal(rng, 1, n, dim)}
    if pooled:
        out["pooled_prompt_embeds"] = _normal(rng, 1, pooled)
    if negative:
        out["negative_prompt_embeds"] = _normal(rng, 1, n, dim)
        if pooled:
            out["negative_pooled_prompt_embeds"] = _normal(rng, 1, pooled)
    if masks:
        m = _masks(n)
        out["prompt_attention_mask"] = m["prompt_attention_mask"]
        if negative:
            out["negative_prompt_attention_mask"] = m["negative_prompt_attention_mask"]
    return out


# ---- the families ----------------------------------------------------------------------------------------------

def _pixart_sigma() -> dict[str, Any]:
    from diffusers import DPMSolverMultistepScheduler

    return {
        "transformer": _transformer("pixart_sigma"),
        # PixArt-Σ ships the SDXL VAE (scripts/convert_pixart_sigma_to_diffusers.py: pixart_sigma_sdxlvae_T5_diffusers)
        "vae": _vae_kl(scaling_factor=0.13025, force_upcast=True),
        # scripts/convert_pixart_sigma_to_diffusers.py: DPMSolverMultistepScheduler() (dpmsolver++, order 2, epsilon)
        "scheduler": DPMSolverMultistepScheduler(),
        "tokenizer": None, "text_encoder": None,
    }


def _pixart_sigma_text() -> dict[str, Any]:
    # PixArt-Σ's T5-XXL (4096 wide, max_sequence_length 300) as a 2-layer T5 of the transformer's caption width
    tokenizer = _t5_tokenizer(300)
    return {"tokenizer": tokenizer, "text_encoder": _t5_encoder(len(tokenizer), TEXT_DIM)}


def _flux() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        # FLUX.1-dev: guidance-distilled (guidance_embeds=True; the sweep's tiny config is schnell-like)
        "transformer": _transformer("flux", guidance_embeds=True),
        # FLUX.1 VAE: 16 latent channels (here 4: the tiny transformer's in_channels 16 = 4 x 2x2 packing),
        # scaling 0.3611, shift 0.1159, no quant convs (diffusers' single_file_utils flux VAE config)
        "vae": _vae_kl(scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False),
        # FLUX.1-dev scheduler_config.json: dynamic shifting from the image's token count, the values FluxPipeline
        # falls back to (pipeline_flux.py: scheduler.config.get("base_image_seq_len", 256), ...)
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                                     base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                                     max_image_seq_len=4096),
        "text_encoder": None, "tokenizer": None, "text_encoder_2": None, "tokenizer_2": None,
    }


def _sd3_components(family: str) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return {
        "transformer": _transformer(family),
        # SD3 VAE: 16 latent channels (here 4, the tiny transformer's), scaling 1.5305, shift 0.0609, no quant convs
        "vae": _vae_kl(scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False),
        # stable-diffusion-3-medium-diffusers scheduler_config.json: FlowMatchEulerDiscreteScheduler, shift 3.0
        # (SD3.5 large / medium ship the same)
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        "text_encoder": None, "tokenizer": None, "text_encoder_2": None, "tokenizer_2": None,
        "text_encoder_3": None, "tokenizer_3": None,
    }


def _sd3() -> dict[str, Any]:
    return _sd3_components("sd3")


def _sd35() -> dict[str, Any]:
    return _sd3_components("sd35")


def _sana() -> dict[str, Any]:
    from diffusers import DPMSolverMultistepScheduler

    return {
        "transformer": _transformer("sana"),
        # DC-AE f32c32: scaling 0.41407 (diffusers' Sana tests and docs)
        "vae": _vae_dc(scaling_factor=0.41407),
        # scripts/convert_sana_to_diffusers.py, "flow-dpm_solver" (the default): flow_shift 3.0 below 4096 pixels
        "scheduler": DPMSolverMultistepScheduler(flow_shift=3.0, use_flow_sigmas=True,
                                                 prediction_type="flow_prediction"),
        "tokenizer": None, "text_encoder": None,
    }


_L = SIZE // 8  # latent side

PIPELINES: dict[str, TinyPipeline] = {p.family: p for p in (
    TinyPipeline("pixart_sigma", "PixArtSigmaPipeline", _pixart_sigma,
                 lambda rng: _text(rng, masks=True), (1, 4, _L, _L), (1, SIZE, SIZE, 3), "batched", 4.5,
                 {"use_resolution_binning": False, "negative_prompt": None}, text_encoders=_pixart_sigma_text),
    TinyPipeline("flux", "FluxPipeline", _flux, lambda rng: _text(rng, negative=False, pooled=POOLED_DIM),
                 (1, (_L // 2) ** 2, 16), (1, SIZE, SIZE, 3), "distilled", 3.5),
    TinyPipeline("sd3", "StableDiffusion3Pipeline", _sd3, lambda rng: _text(rng, pooled=POOLED_DIM),
                 (1, 4, _L, _L), (1, SIZE, SIZE, 3), "batched", 7.0),
    TinyPipeline("sana", "SanaPipeline", _sana, lambda rng: _text(rng, masks=True), (1, 4, _L, _L),
                 (1, SIZE, SIZE, 3), "batched", 4.5, {"use_resolution_binning": False, "negative_prompt": None}),
)}


# ---- cache, inputs, oracle -------------------------------------------------------------------------------------

def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _sources(start: Callable[..., Any]) -> list[str]:
    """The source of ``start`` and of every function of this module or ``diffusers_families`` it reaches by
    name (transitively): what a pipeline folder is made of, so that the cache key changes when any of it does."""
    modules = [globals(), vars(df)]
    seen: dict[str, str] = {}
    todo: list[Callable[..., Any]] = [start]
    while todo:
        fn = todo.pop()
        key = f"{fn.__module__}.{fn.__qualname__}"
        if key in seen:
            continue
        seen[key] = inspect.getsource(fn)
        for code in _code_objects(fn.__code__):
            for name in code.co_names:
                for mod in modules:
                    obj = mod.get(name)
                    if inspect.isfunction(obj) and obj.__module__ in (__name__, df.__name__):
                        todo.append(obj)
    # the family's builder in diffusers_families (reached through df.ALL, not by name)
    return [seen[k] for k in sorted(seen)]


def _key(spec: TinyPipeline, text_encoders: bool) -> str:
    import diffusers
    import torch
    import transformers

    parts = [diffusers.__version__, torch.__version__, transformers.__version__, spec.pipeline,
             *_sources(spec.components), inspect.getsource(df.ALL[spec.family].build),
             inspect.getsource(_build)]
    if text_encoders:
        assert spec.text_encoders is not None
        parts += ["text encoders", *_sources(spec.text_encoders)]
    return hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:16]


def _build(spec: TinyPipeline, out: Path, text_encoders: bool = False) -> None:
    import diffusers

    components = spec.components()
    if text_encoders:
        assert spec.text_encoders is not None
        components.update(spec.text_encoders())
    pipe = getattr(diffusers, spec.pipeline)(**components)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe.save_pretrained(out, safe_serialization=True)


def pipeline_root() -> Path:
    """Where :func:`cached_pipeline` keeps folders: ``<export root>/pipelines`` (``$RKPART_TEST_EXPORTS``)."""
    return df.export_root() / "pipelines"


def cached_pipeline(family: str, *, text_encoders: bool = False) -> Path:
    """The ``save_pretrained`` folder of family ``family``'s tiny pipeline (:data:`PIPELINES`), made once per
    source of its builder functions and library versions.  Built in a private temporary folder then renamed:
    a failed or concurrent build never leaves a half-written folder under the final name.

    ``text_encoders``: the folder with tiny real text encoders and tokenizers (``<family>-te-<hash>``; only
    the families in :data:`WITH_TEXT_ENCODERS`), for ``rkpart encode``; same transformer, VAE and scheduler.
    """
    spec = PIPELINES[family]
    if text_encoders and spec.text_encoders is None:
        raise KeyError(f"{family}: no tiny text encoders (families with them: {', '.join(WITH_TEXT_ENCODERS)})")
    root = pipeline_root()
    path = root / f"{family}{'-te' if text_encoders else ''}-{_key(spec, text_encoders)}"
    if (path / "model_index.json").is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{path.name}.{os.getpid()}.part"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _build(spec, tmp, text_encoders)
        try:
            os.replace(tmp, path)
        except OSError:
            if not (path / "model_index.json").is_file():  # not a concurrent build's: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def call_inputs(family: str, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Seeded conditioning for family ``family``'s pipeline call and its initial noise.

    Returns ``(embeds, latents)``: ``embeds`` keyed by the call's argument names (``prompt_embeds``,
    ``negative_prompt_embeds``, ``pooled_prompt_embeds``, ``prompt_attention_mask``, ...; float32 embeddings,
    int64 masks), ``latents`` the ``latents=`` argument (float32, :attr:`TinyPipeline.latent_shape`).
    """
    spec = PIPELINES[family]
    rng = np.random.default_rng(seed)
    embeds = spec.embeds(rng)
    latents = _normal(rng, *spec.latent_shape)
    return embeds, latents


def _family_of(folder: Path) -> TinyPipeline:
    """The spec of a cached folder: by its name (``<family>-<hash>``), else the only family of its class."""
    name = folder.name.rsplit("-", 1)[0].removesuffix("-te")
    if name in PIPELINES:
        return PIPELINES[name]
    cls = json.loads((folder / "model_index.json").read_text())["_class_name"]
    matches = [p for p in PIPELINES.values() if p.pipeline == cls]
    if len(matches) != 1:
        raise KeyError(f"{folder}: not one tiny pipeline of class {cls}")
    return matches[0]


def null_components(folder: str | Path) -> dict[str, None]:
    """``{name: None}`` for every component ``model_index.json`` records as ``[null, null]``.

    ``DiffusionPipeline.from_pretrained`` loads a null component as ``None`` only when the pipeline lists it
    in ``_optional_components`` (PixArt, Sana: their text encoder and tokenizer); for the others (Flux, SD3:
    ``text_encoder``, ``tokenizer``, ...) it raises ``ValueError: Pipeline ... expected [...], but only
    {...} were passed`` unless the call passes them, as ``from_pretrained(folder, text_encoder=None, ...)``.
    """
    index = json.loads((Path(folder) / "model_index.json").read_text())
    return {k: None for k, v in index.items()
            if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[0] is None}


def load(folder: str | Path) -> Any:
    """``DiffusionPipeline.from_pretrained(folder, **null_components(folder))`` on the CPU, float32, no progress
    bar."""
    from diffusers import DiffusionPipeline

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = DiffusionPipeline.from_pretrained(str(folder), **null_components(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_diffusers(folder: str | Path, embeds: dict[str, np.ndarray], latents: np.ndarray, steps: int,
                  guidance: float | None = None, output_type: str = "latent", *, pipe: Any = None) -> np.ndarray:
    """What diffusers' own pipeline returns for these inputs: ``pipe(**embeds, latents=latents,
    num_inference_steps=steps, guidance_scale=guidance, output_type=output_type)``, as float32 numpy.

    ``guidance`` None: the pipeline's default.  The height and width are the tiny pipeline's (64 x 64), and
    the few call arguments the tiny size needs (:attr:`TinyPipeline.call`) are passed; everything else is the
    pipeline's default.  ``output_type="latent"`` returns the final latent as the pipeline returns it (packed
    for Flux-style pipelines), ``"np"`` the image NHWC in [0, 1].  A seeded generator is passed for schedulers
    that draw noise during the loop (DDPM).  ``pipe``: an already loaded pipeline of ``folder`` (saves a load).
    """
    import torch

    folder = Path(folder)
    spec = _family_of(folder)
    if pipe is None:
        pipe = load(folder)
    kwargs: dict[str, Any] = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in embeds.items()}
    kwargs.update(spec.call)
    if guidance is not None:
        kwargs["guidance_scale"] = guidance
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = pipe(latents=torch.from_numpy(np.ascontiguousarray(latents)), num_inference_steps=steps,
                   height=spec.height, width=spec.width, output_type=output_type, return_dict=False,
                   generator=torch.Generator().manual_seed(0), **kwargs)[0]
    if isinstance(out, torch.Tensor):
        return np.asarray(out.float().numpy(), dtype=np.float32)
    return np.asarray(out, dtype=np.float32)

#: the families :func:`cached_pipeline` can build with tiny real text encoders and tokenizers
WITH_TEXT_ENCODERS = [f for f, p in PIPELINES.items() if p.text_encoders is not None]

#: families of the sweep for which diffusers 0.42.1 ships no pipeline driving the class (nothing to compare to)
NO_PIPELINE: dict[str, str] = {
    "flux3": "Flux3Transformer2DModel: no pipeline in diffusers 0.42.1",
    "dreamlite": "DreamLiteTransformer2DModel: no pipeline in diffusers 0.42.1",
    "minimax_h3": "MiniMaxH3Transformer3DModel: its pipelines are modular (blocks), no DiffusionPipeline class",
    "sana_wm_refiner": "SanaWMLTX2RefinerTransformer3DModel: a component of SanaWMPipeline's refiner stage, no "
                       "pipeline of its own",
    "minimax_music3": "MiniMaxMusic3Transformer1DModel: no pipeline in diffusers 0.42.1",
    "minimax_rvq": "MiniMaxMusic3RVQDepthDecoder: no pipeline in diffusers 0.42.1",
    "t5film": "T5FilmDecoder: SpectrogramDiffusionPipeline was removed from diffusers (deprecated pipelines)",
    "dual_transformer": "DualTransformer2DModel: VersatileDiffusion's, removed from diffusers (deprecated)",
    "transformer_temporal": "TransformerTemporalModel: a part of UNet3DConditionModel, not a pipeline's denoiser",
}
#: families whose diffusers pipeline exists but has no tiny pipeline here yet, and why
NOT_BUILT: dict[str, str] = {
    f: "not built yet" for f in df.CLASS_OF if f not in PIPELINES and f not in NO_PIPELINE
}
