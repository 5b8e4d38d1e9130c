"""``rkpart export``: a diffusers pipeline folder -> ``transformer.onnx``, ``vae_decoder.onnx``, ``pipeline.json``.

The steps, each checked before the next:

1. load the pipeline (``DiffusionPipeline.from_pretrained``, components saved as ``null`` passed as
   ``None``: no text encoder is needed);
2. make the call arguments from the pipeline's own ``__call__`` signature: ``prompt_embeds`` (and
   every ``*prompt_embeds`` / ``*prompt_attention_mask`` it takes) of ``--text-len`` tokens, seeded
   ``latents=`` of the shape the pipeline makes (:func:`~rkpart.export.record.probe_latents`);
3. record two calls (:mod:`rkpart.export.record`): 2 steps, ``output_type="latent"``; 3 steps,
   ``output_type="np"``; other seeds and another guidance scale;
4. derive the description (:func:`rkpart.export.describe.derive`) and replay both calls from it
   (:func:`~rkpart.export.describe.replay`);
5. find the post-loop path (:mod:`rkpart.export.vae`) and check it against the recorded image;
6. export the transformer (inputs: the recorded call's arguments at the export batch) and the
   post-loop module, each checked under ONNX Runtime, the transformer on every recorded call (the
   conditional and unconditional masks, every timestep);
7. write the four files into a staging folder swapped onto ``OUT`` (:func:`rkpart.output.staged_folder`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rkpart.errors import ExportError, InvalidModelError, UserError, first_line
from rkpart.export.describe import DescribeError, Facts, derive, replay
from rkpart.progress import Progress, silent

if TYPE_CHECKING:
    import torch

    from rkpart.export.record import Recording
    from rkpart.export.vae import PostLoop

FORMAT = "rkpart-pipeline"
VERSION = 1
#: the output kind the folder's marker records (``--force`` replaces only an export)
KIND = "export"
TRANSFORMER_FILE = "transformer.onnx"
VAE_FILE = "vae_decoder.onnx"
DESCRIPTION_FILE = "pipeline.json"
VALUES_FILE = "inputs.npz"
EXPORTERS = ("torchscript", "dynamo")
DTYPES = ("float32", "float16")

#: pipeline classes whose export ``tests/export`` checks end to end (the error for another class names them)
VERIFIED = ("FluxPipeline", "PixArtSigmaPipeline", "StableDiffusion3Pipeline")

#: the text conditioning arguments rkpart gives, by name without ``negative_``: the transformer config keys
#: that give the last dimension (first present wins), and those that fix the sequence length (else
#: ``--text-len``); a mask takes the length of the embeddings it names (``EMBED_OF_MASK``)
EMBEDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "prompt_embeds": (("caption_channels", "joint_attention_dim", "text_embed_dim", "text_dim", "cap_feat_dim",
                       "text_in_dim", "text_hidden_dim", "cross_attention_dim", "caption_dim", "context_in_dim"), ()),
    "prompt_embeds_2": (("cross_attention_dim_t5", "text_embed_2_dim"), ("text_len_t5",)),
    "pooled_prompt_embeds": (("pooled_projection_dim",), ()),
}
#: config keys giving an axis of stacked text-encoder layers between the tokens and the width (Krea 2)
TEXT_LAYERS_KEYS = ("num_text_layers",)
EMBED_OF_MASK = {"prompt_attention_mask": "prompt_embeds", "prompt_embeds_mask": "prompt_embeds",
                 "prompt_attention_mask_2": "prompt_embeds_2"}
#: the dtypes a mask argument is tried in, in order (a tokenizer's int64 first); the first the pipeline runs with
#: is kept (``float`` stands for the transformer's floating dtype)
MASK_DTYPES = ("int64", "float", "bool")
#: the text prompt arguments (``prompt``, ``negative_prompt_2``, ...)
_PROMPT = re.compile(r"^(negative_)?prompt(_\d+)?$")
#: the two recordings: (seed, steps, guidance scale, output_type)
RECORDINGS = ((1, 2, 3.0, "latent"), (2, 3, 5.5, "np"))


@dataclass(frozen=True)
class ExportOptions:
    height: int | None = None
    width: int | None = None
    text_len: int | None = None
    #: what one transformer call takes (``None``: as the pipeline calls it)
    batch: int | None = None
    dtype: str = "float32"
    exporter: str = "torchscript"
    force: bool = False
    #: frames of a video pipeline's call (``None``: the pipeline's default)
    num_frames: int | None = None


@dataclass
class ExportResult:
    out: Path
    description: dict[str, Any]
    #: max |error| / max |torch| of each exported ONNX model under ONNX Runtime
    errors: dict[str, float]


def _quiet_libraries() -> None:
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def _read_json(path: Path, what: str) -> dict[str, Any]:
    from rkpart.io import load_json_file

    doc = load_json_file(path, what=what, max_bytes=16 << 20, error=InvalidModelError)
    if not isinstance(doc, dict):
        raise InvalidModelError(f"{path} is not a JSON object")
    return doc


def pipeline_folder(src: Path) -> Path:
    """``src``, or the pipeline folder around it when ``src`` is a pipeline's ``transformer/`` subfolder."""
    if not (src / "model_index.json").is_file() and (src / "config.json").is_file() \
            and (src.parent / "model_index.json").is_file() and src.resolve().name == "transformer":
        return src.parent
    return src


def load_pipeline(src: Path) -> Any:
    """The diffusers pipeline saved in ``src`` (components saved as ``null`` loaded as ``None``)."""
    import diffusers

    index_path = src / "model_index.json"
    if not src.is_dir():
        raise InvalidModelError(f"{src} is not a folder (a diffusers pipeline folder holds model_index.json)")
    if not index_path.is_file():
        if (src / "config.json").is_file():
            raise InvalidModelError(f"{src} is a model folder, not a pipeline: rkpart export records the "
                                    "pipeline's call (its scheduler, VAE and the way it feeds the transformer); "
                                    "give the folder holding model_index.json")
        raise InvalidModelError(f"{src} is not a diffusers pipeline folder (no model_index.json)")
    index = _read_json(index_path, "model_index.json")
    cls_name = index.get("_class_name")
    if not isinstance(cls_name, str):
        raise InvalidModelError(f"{index_path} names no pipeline class (_class_name)")
    cls = getattr(diffusers, cls_name, None)
    if cls is None:
        raise InvalidModelError(f"{index_path}: diffusers {diffusers.__version__} has no pipeline class {cls_name}")
    components = {k: v for k, v in index.items() if not k.startswith("_")}
    if "transformer" not in components or not isinstance(components["transformer"], list) \
            or components["transformer"][0] is None:
        raise ExportError(f"{cls_name} has no transformer; rkpart exports diffusion-transformer pipelines "
                          f"({', '.join(VERIFIED)} are verified)")
    nulls = {k: None for k, v in components.items() if isinstance(v, list) and v and v[0] is None}
    try:
        pipe = cls.from_pretrained(str(src), **nulls)
    except Exception as e:  # noqa: BLE001 - a folder diffusers cannot load is the user's input
        raise InvalidModelError(f"{src}: diffusers cannot load {cls_name}: {first_line(e)}") from None
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _call_params(pipe: Any) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(pipe.__call__).parameters)


def _config(pipe: Any, keys: tuple[str, ...]) -> int | None:
    cfg = pipe.transformer.config
    for k in keys:
        v = cfg.get(k) if hasattr(cfg, "get") else getattr(cfg, k, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _width(pipe: Any, arg: str) -> int:
    keys = EMBEDS[arg.removeprefix("negative_")][0]
    width = _config(pipe, keys)
    if width is None:
        raise ExportError(f"{type(pipe).__name__}: cannot tell the width of its {arg} argument from "
                          f"{type(pipe.transformer).__name__}'s config (none of {', '.join(keys)})")
    return width


def _length(pipe: Any, arg: str, text_len: int) -> int:
    return _config(pipe, EMBEDS[arg.removeprefix("negative_")][1]) or text_len


def conditioning_args(pipe: Any, text_len: int, seed: int, mask_dtype: str = "int64") -> dict[str, Any]:
    """Seeded embeddings and masks for every conditioning argument of :data:`EMBEDS` the call takes.

    Each argument gets its own values (the derivation tells arguments apart by value); the masks
    have some invalid tokens at the end (fewer for the conditional pass, and one more at odd seeds),
    so the masks the export is checked with differ from all-ones and from each other.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    dtype = pipe.transformer.dtype
    params = _call_params(pipe)
    out: dict[str, Any] = {}
    for name in params:
        base = name.removeprefix("negative_")
        if base in EMBEDS:
            width = _width(pipe, name)
            layers = _config(pipe, TEXT_LAYERS_KEYS) if base == "prompt_embeds" else None
            shape = (1, width) if base.startswith("pooled") else (
                1, _length(pipe, name, text_len), *((layers,) if layers else ()), width)
            out[name] = torch.randn(shape, generator=gen).to(dtype)
    for name in params:
        base = name.removeprefix("negative_")
        if base in EMBED_OF_MASK and name.replace(base, EMBED_OF_MASK[base]) in out:
            n = _length(pipe, EMBED_OF_MASK[base], text_len)
            mask = torch.ones(1, n, dtype=torch.int64)
            cut = max(1, n // (3 if name.startswith("negative_") else 6)) if n > 1 else 0
            cut += seed % 2 if n > cut + 1 else 0
            if cut:
                mask[:, n - cut:] = 0
            out[name] = mask.to({"int64": torch.int64, "bool": torch.bool, "float": dtype}[mask_dtype])
    if "prompt_embeds" not in out and "class_labels" in params:
        # a class-conditional pipeline (DiT): one class per seed, below the null class the model keeps last
        classes = _config(pipe, ("num_embeds_ada_norm", "num_classes")) or 1000
        out["class_labels"] = [(7 * seed + 3) % classes]
        return out
    if "prompt_embeds" not in out:
        raise ExportError(f"{type(pipe).__name__}.__call__ takes neither prompt_embeds nor class_labels: rkpart "
                          "export records text-conditioned pipelines fed their conditioning as embeddings, and "
                          "class-conditioned ones")
    for name in list(out):
        if str(params[name].annotation).lower().startswith("list[") and out[name].dim() == 3:
            out[name] = list(out[name].unbind(0))  # one tensor per prompt (Z-Image): the derivation stacks them
    # a text prompt argument with a default ("" for negative_prompt) would conflict with the embeddings
    for name, p in params.items():
        if _PROMPT.match(name) and p.default not in (None, inspect.Parameter.empty):
            out[name] = None
    return out


def base_args(pipe: Any, opts: ExportOptions, text_len: int, seed: int, steps: int, guidance: float,
              output_type: str, mask_dtype: str = "int64") -> dict[str, Any]:
    import torch

    params = _call_params(pipe)
    args: dict[str, Any] = conditioning_args(pipe, text_len, seed, mask_dtype)
    args.update(num_inference_steps=steps, output_type=output_type, generator=torch.Generator().manual_seed(seed))
    # a pipeline without height= / width= (DiT) makes the size its transformer's sample_size
    if opts.height is not None and "height" in params:
        args["height"] = opts.height
    if opts.width is not None and "width" in params:
        args["width"] = opts.width
    if opts.num_frames is not None:
        if "num_frames" not in params:
            raise UserError(f"--num-frames {opts.num_frames}: {type(pipe).__name__} is not a video pipeline (its "
                            "call takes no num_frames)")
        args["num_frames"] = opts.num_frames
    if "guidance_scale" in params:
        args["guidance_scale"] = guidance
    if "use_resolution_binning" in params:
        args["use_resolution_binning"] = False  # the export size is the size the transformer sees
    if "return_dict" in params:
        args["return_dict"] = True
    return args


def default_text_len(pipe: Any) -> int:
    """The transformer's fixed text length (a ``text_len`` config), else the call's ``max_sequence_length``
    default, else 77 (a CLIP text length)."""
    fixed = _config(pipe, ("text_len",))
    if fixed is not None:
        return fixed
    p = _call_params(pipe).get("max_sequence_length")
    return p.default if p is not None and isinstance(p.default, int) and p.default > 0 else 77


def _call(pipe: Any, fn: Any, args: dict[str, Any], opts: ExportOptions, text_len: int) -> Any:
    try:
        return fn(pipe, args)
    except (DescribeError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - the pipeline refusing the call is a problem of the export's size
        size = f"height={opts.height or 'default'}, width={opts.width or 'default'}, text length {text_len}"
        raise UserError(f"{type(pipe).__name__} cannot run at {size}: {first_line(e)}") from None


def record(pipe: Any, opts: ExportOptions, text_len: int, progress: Progress) -> list[Recording]:
    """The probe and the two recorded calls of :data:`RECORDINGS`."""
    import torch

    from rkpart.export.record import probe_latents, record_call

    progress(f"probing the latents= {type(pipe).__name__} takes")
    has_mask = any(n.removeprefix("negative_") in EMBED_OF_MASK for n in _call_params(pipe))
    first_error: UserError | None = None
    for mask_dtype in MASK_DTYPES if has_mask else MASK_DTYPES[:1]:
        args = base_args(pipe, opts, text_len, 0, 1, RECORDINGS[0][2], "latent", mask_dtype)
        try:
            probe = _call(pipe, probe_latents, args, opts, text_len)
            break
        except UserError as e:  # the mask in another dtype may be what the pipeline takes
            first_error = first_error or e
    else:
        assert first_error is not None
        annotation = str(getattr(_call_params(pipe).get("prompt_embeds"), "annotation", ""))
        if annotation.lower().startswith("list["):  # Z-Image: one tensor per prompt, of its own length
            raise ExportError(f"{type(pipe).__name__} refuses prompt_embeds as one tensor ({first_error}); it takes "
                              f"a list of per-prompt tensors ({annotation}), which rkpart export does not "
                              "give") from None
        raise first_error
    recs: list[Recording] = []
    takes_latents = "latents" in _call_params(pipe)
    for seed, steps, guidance, output_type in RECORDINGS:
        progress(f"recording the pipeline's call: {steps} steps, output_type={output_type!r}")
        args = base_args(pipe, opts, text_len, seed, steps, guidance, output_type, mask_dtype)
        if not takes_latents:  # the pipeline draws its latents from generator= (DiT): the recording keeps the draw
            recs.append(_call(pipe, record_call, args, opts, text_len))
            continue
        tried: UserError | None = None
        for shape in probe if not recs else [recs[0].args["latents"]]:
            args["latents"] = torch.randn(shape.shape, generator=torch.Generator().manual_seed(100 + seed)).to(
                shape.dtype)
            try:
                recs.append(_call(pipe, record_call, args, opts, text_len))
                break
            except UserError as e:  # the next candidate shape of latents= (the pipeline refused this one)
                tried = tried or e
        else:
            assert tried is not None
            raise tried
    return recs


def _example(facts: Facts, rec: Recording, batch: int) -> dict[str, torch.Tensor]:
    """The first recorded call's inputs at the export batch (the conditional row when halving a batched pair)."""
    kwargs = rec.steps[0].calls[0].kwargs
    out = {}
    for name in facts.inputs:
        v = kwargs[name]
        if batch != facts.pipeline_batch and _batched(facts, name, v):
            v = v[0:1] if facts.cond_first else v[1:2]
        out[name] = v
    return out


def _batched(facts: Facts, name: str, v: Any) -> bool:
    """Whether input ``name`` carries the CFG pair along its first axis (batched mode)."""
    f, n = facts.inputs[name], facts.pipeline_batch
    if f.value is not None:
        return bool(v.dim() and v.shape[0] == n and n == 2 and (v[0] == v[1]).all())
    return bool(v.dim() and v.shape[0] == n)


def halve(facts: Facts, transformer: Any, recs: list[Recording]) -> Facts:
    """The facts for a batch-1 export of a pipeline that batches its CFG pair: two passes of one row each.

    Checked on torch: each row of every recorded batched call, run alone, gives that row of the
    batched output (a transformer that mixes its batch rows cannot be halved).
    """
    import torch

    from rkpart.export.describe import nest_kwargs, same
    from rkpart.export.record import first_output

    for r in recs:
        for s in r.steps:
            c = s.calls[0]
            for row in (0, 1):
                feeds = {k: (v[row:row + 1] if isinstance(v, torch.Tensor) and _batched(facts, k, v) else v)
                         for k, v in c.kwargs.items() if k in facts.inputs}
                with torch.no_grad():
                    out = first_output(transformer(**nest_kwargs({**feeds, **facts.fixed}, facts.nests)))
                if not same(out, c.output[row:row + 1], rtol=1e-4):
                    raise ExportError("--batch 1: the transformer's output for one row of the CFG pair differs from "
                                      "that row of the batched call; export with --batch 2")
    inputs = {}
    for name, f in facts.inputs.items():
        v = f.value
        if v is not None and v.ndim and v.shape[0] == 2 and (v[0] == v[1]).all():
            v = v[1:2]
        inputs[name] = dataclasses.replace(f, value=v)
    return dataclasses.replace(facts, inputs=inputs, cfg_mode="two-pass", cond_call=0, call_batch=1, cond_first=False)


def _prediction(config: dict[str, Any], cls_name: str) -> str:
    pred = config.get("prediction_type")
    if "FlowMatch" in cls_name or pred == "flow_prediction":
        return "flow"
    return pred if pred in ("epsilon", "v_prediction", "sample") else "epsilon"


def _onnx_io(path: Path) -> tuple[dict[str, tuple[list[int], str]], list[str]]:
    """Inputs (shape, numpy dtype name) and output names of an ONNX model."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    ins = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        ins[i.name] = ([d.dim_value for d in t.shape.dim],
                       str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))))
    return ins, [o.name for o in m.graph.output]


def describe(pipe: Any, src: Path, facts: Facts, post: PostLoop | None, recs: list[Recording], opts: ExportOptions,
             onnx_inputs: dict[str, tuple[list[int], str]], output: str, values: dict[str, np.ndarray],
             patches: Sequence[str]) -> dict[str, Any]:
    """``pipeline.json`` (docs/pipeline-json.md, version 1).

    ``opts`` as exported: its ``text_len`` and ``batch`` resolved (:func:`export_pipeline`)."""
    import diffusers

    sched_cfg = json_safe(_read_json(src / "scheduler" / "scheduler_config.json", "scheduler_config.json"))
    sched_cls = type(pipe.scheduler).__name__
    image = np.asarray(recs[1].result)
    latent = recs[0].args["latents"]
    loop = recs[0].steps[0].sample
    inputs: dict[str, Any] = {}
    for name, (shape, dtype) in onnx_inputs.items():
        f = facts.inputs[name]
        inputs[name] = {"role": f.role, "shape": shape, "dtype": dtype, "argument": f.argument,
                        "negative_argument": f.negative_argument, "value": name if name in values else None}
        if f.negative_fill is not None:
            inputs[name]["negative_fill"] = _tidy_number(f.negative_fill)
        if f.append_valid:
            inputs[name]["append_valid"] = f.append_valid
    vae_cfg = pipe.vae.config if getattr(pipe, "vae", None) is not None else None
    vae = None if post is None or vae_cfg is None else {
        "class": type(pipe.vae).__name__, "file": VAE_FILE, "dtype": "float32",
        "scaling_factor": _number(vae_cfg.get("scaling_factor")), "shift_factor": _number(vae_cfg.get("shift_factor")),
        "latent_channels": int(vae_cfg.get("latent_channels") or post.decode_shape[1]),
        "image_shape": list(post.image_shape),
    }
    from rkpart.export.vae import PACKING

    packing = PACKING[post.unpack] if post is not None else None
    return {
        "format": FORMAT,
        "version": VERSION,
        "pipeline": {"class": type(pipe).__name__, "diffusers": diffusers.__version__},
        "transformer": {"class": type(pipe.transformer).__name__, "file": TRANSFORMER_FILE, "dtype": opts.dtype,
                        "exporter": opts.exporter, "patches": list(patches)},
        # (B, H, W, 3), or a video's (B, F, H, W, 3): num_frames (null for an image pipeline)
        "image": {"height": int(image.shape[-3]), "width": int(image.shape[-2]), "text_len": opts.text_len,
                  "batch": opts.batch,
                  **({"num_frames": int(image.shape[1])} if image.ndim == 5 else {})},
        "inputs": inputs,
        "output": {"name": output, "prediction": _prediction(sched_cfg, sched_cls),
                   "learned_sigma": facts.learned_sigma, "sign": facts.sign, "channels_axis": facts.channels_axis},
        "timestep": {"scale": facts.timestep_scale, "offset": facts.timestep_offset,
                     "reverse": _reverse(facts, sched_cfg)},
        "scheduler": {"class": sched_cls, "config": sched_cfg,
                      "set_timesteps": {"sigmas": facts.sigmas_rule, "mu": facts.mu,
                                        "timesteps": facts.timesteps_rule,
                                        **({"mu_rule": facts.mu_rule, "image_seq_len": facts.image_seq_len}
                                           if facts.mu_rule else {})}},
        "cfg": _cfg(facts),
        "latent": {"shape": list(latent.shape), "dtype": str(latent.numpy().dtype), "init": facts.latent_init,
                   "packing": packing,
                   # the loop latent's channels: last of tokens (B, N, C), else axis 1
                   "channels": int(loop.shape[-1] if loop.dim() == 3 else loop.shape[1])},
        "vae": vae,
        "values": VALUES_FILE if values else None,
    }


def _cfg(facts: Facts) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "mode": facts.cfg_mode, "guidance_scale": facts.guidance_scale, "guidance_input": facts.guidance_input,
        "combine": facts.combine if facts.cfg_mode in ("batched", "two-pass") else None,
        "scale_argument": facts.scale_argument,
        "renorm": facts.renorm if facts.cfg_mode in ("batched", "two-pass") else None,
    }
    if facts.cond_first:
        cfg["batch_order"] = "cond,uncond"
    if facts.cfg_channels is not None:
        cfg["channels"] = facts.cfg_channels
    if facts.guidance_input_scale is not None:
        cfg["guidance_input_scale"] = facts.guidance_input_scale
    return cfg


def _reverse(facts: Facts, sched_cfg: dict[str, Any]) -> bool:
    """Whether the timestep runs the other way: ``offset == -scale * num_train_timesteps`` with ``scale < 0``."""
    n = float(sched_cfg.get("num_train_timesteps") or 1000)
    return facts.timestep_scale < 0 and abs(facts.timestep_offset + facts.timestep_scale * n) <= 1e-6 * abs(
        facts.timestep_offset)


def json_safe(v: Any) -> Any:
    """``v`` with every NaN or infinite float spelled as a string (``"-Infinity"``, ``"Infinity"``, ``"NaN"``).

    A scheduler config may hold one (DPMSolverMultistepScheduler's ``lambda_min_clipped`` is ``-inf``
    by default); pipeline.json holds only finite numbers, and ``float()`` / NumPy read these strings
    back (:func:`from_json_safe`).
    """
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity"
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_safe(x) for x in v]
    return v


def from_json_safe(v: Any) -> Any:
    """The inverse of :func:`json_safe`: the three strings back to floats."""
    if v in ("NaN", "Infinity", "-Infinity"):
        return float(v)
    if isinstance(v, dict):
        return {k: from_json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json_safe(x) for x in v]
    return v


def _tidy_number(v: float) -> int | float:
    """An integral fill as an integer (DiT's null class 1000, zeros 0), else the float."""
    return int(v) if float(v).is_integer() else float(v)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def export_pipeline(src: str | Path, out: str | Path, opts: ExportOptions,
                    progress: Progress | None = None) -> ExportResult:
    """Export the pipeline in ``src`` into the folder ``out`` (see the module docstring)."""
    say = progress or silent
    from rkpart.export import require_extra

    if opts.exporter not in EXPORTERS:
        raise UserError(f"unknown exporter {opts.exporter!r}; choose one of {', '.join(EXPORTERS)}")
    if opts.dtype not in DTYPES:
        raise UserError(f"unknown dtype {opts.dtype!r}; choose one of {', '.join(DTYPES)}")
    from rkpart.output import check_folder_target, staged_folder

    src, out = Path(src), Path(out)
    # before minutes of work, and before seconds of importing torch and diffusers
    check_folder_target(out.absolute(), kind=KIND, force=opts.force)
    # the pipeline classes of diffusers refuse to load without transformers, even with no text encoder
    require_extra(("torch", "onnx", "diffusers", "transformers", *(("onnxscript",) if opts.exporter == "dynamo"
                                                                    else ())))
    import torch

    _quiet_libraries()
    torch.manual_seed(0)
    if pipeline_folder(src) != src:
        say(f"{src} is the transformer of the pipeline in {src.parent}: exporting that pipeline")
        src = pipeline_folder(src)
    say(f"loading {src}")
    pipe = load_pipeline(src)
    text_len = opts.text_len or default_text_len(pipe)
    recs = record(pipe, opts, text_len, say)
    say("deriving the description from the recorded calls")
    defaults = {k: p.default for k, p in _call_params(pipe).items() if p.default is not inspect.Parameter.empty}
    facts = derive(recs, defaults, int(pipe.scheduler.config.get("num_train_timesteps") or 1000))
    _check_latent_output(recs[0])
    batch = opts.batch or facts.call_batch
    if batch != facts.call_batch:
        if facts.cfg_mode != "batched" or batch != 1:
            raise UserError(f"--batch {batch}: {type(pipe).__name__} calls its transformer on batch "
                            f"{facts.call_batch} ({facts.cfg_mode} CFG); only a batched CFG pair can be exported "
                            "as batch 1")
        facts = halve(facts, pipe.transformer, recs)
    first = _example(facts, recs[0], batch)
    # the scheduler config as pipeline.json gives it to the board (non-finite numbers as strings and back)
    sched_cfg = from_json_safe(json.loads(json.dumps(json_safe(
        _read_json(src / "scheduler" / "scheduler_config.json", "scheduler_config.json")))))
    say(f"replaying both calls from the description ({facts.cfg_mode} CFG)")
    for rec in recs:
        shapes = {k: tuple(v.shape) for k, v in _example(facts, rec, batch).items()}
        replay(facts, rec, pipe.transformer, type(pipe.scheduler), sched_cfg, {k: v.dtype for k, v in first.items()},
               shapes)
    post = None
    vae_module = None
    if getattr(pipe, "vae", None) is not None:
        from rkpart.export.vae import check_module, decode_module, find_post_loop

        say("checking the post-loop path (unpack, scale, vae.decode, postprocess) against the recorded image")
        post = find_post_loop(recs[1], pipe.vae.config)
        vae_module = decode_module(pipe.vae, post)
        check_module(vae_module, recs[1])
    errors: dict[str, float] = {}
    with staged_folder(out, kind=KIND, force=opts.force) as staging:
        from rkpart.export import OnnxOptions, export_module

        say(f"exporting {type(pipe.transformer).__name__} ({opts.exporter}, {opts.dtype}, batch {batch})")
        # the core's wrapper passes return_dict=False itself
        fixed = {k: v for k, v in facts.fixed.items() if k != "return_dict"}
        with _positive_movedim():
            res = export_module(_renested(pipe.transformer, facts), first, staging / TRANSFORMER_FILE, fixed=fixed,
                                exporter=opts.exporter, dtype=opts.dtype, progress=say)
        patches = [a.name for a in res.patches]
        errors[TRANSFORMER_FILE] = _relative(res)
        onnx_inputs, outputs = _onnx_io(staging / TRANSFORMER_FILE)
        say("checking transformer.onnx on every recorded call under ONNX Runtime")
        errors[TRANSFORMER_FILE] = max(errors[TRANSFORMER_FILE],
                                       _check_calls(staging / TRANSFORMER_FILE, facts, recs, batch, opts.dtype))
        if vae_module is not None:
            say(f"exporting the post-loop path of {type(pipe.vae).__name__} ({opts.exporter})")
            latent = recs[1].steps[-1].prev_sample.float()
            with _positive_movedim(), _nearest_exact_upsampling():
                vres = export_module(vae_module, {"latent": latent}, staging / VAE_FILE, exporter=opts.exporter,
                                     dtype="float32", options=OnnxOptions(output="image", variants=()))
            errors[VAE_FILE] = _relative(vres)
        # a constant is fed as the graph takes it (float16 ids in a float16 export)
        values = {n: f.value.astype(onnx_inputs[n][1]) for n, f in facts.inputs.items()
                  if f.value is not None and n in onnx_inputs}
        exported = dataclasses.replace(opts, text_len=text_len, batch=batch)
        doc = describe(pipe, src, facts, post, recs, exported, onnx_inputs, outputs[0], values, patches)
        if values:
            from rkpart.io import write_npz

            write_npz(staging / VALUES_FILE, values)
        (staging / DESCRIPTION_FILE).write_text(json.dumps(doc, indent=1) + "\n")
        _validate(staging, onnx_inputs, outputs)
    return ExportResult(out, doc, errors)


def _renested(transformer: Any, facts: Facts) -> Any:
    """The transformer itself, or, when some of its arguments hold tensors (:func:`flatten_kwargs`), a module
    taking one tensor per input that rebuilds them."""
    if not facts.nests:
        return transformer
    from rkpart.export.patches import patches_for

    if all(n.kind == "stack" for n in facts.nests.values()) and any(
            p.kind == "adapter" for p in patches_for(type(transformer).__name__, "torchscript")):
        # per-sample lists stacked into batch inputs: the registry's adapter of the class takes the batch and
        # hands its forward the lists (Z-Image's list_forward), and the class's rewrites still apply
        return transformer
    import torch

    from rkpart.export.describe import nest_kwargs

    class Renested(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, **kwargs: Any) -> Any:
            return self.transformer(**nest_kwargs(kwargs, facts.nests))

    return Renested().eval()


def _validate(folder: Path, onnx_inputs: dict[str, tuple[list[int], str]], outputs: list[str]) -> None:
    """The written pipeline.json loads (schema, values) and describes transformer.onnx: a bug here is rkpart's."""
    from rkpart.description import check_against, load_description
    from rkpart.errors import InternalError, SpecError

    try:
        d = load_description(folder / DESCRIPTION_FILE)
        check_against(d, {n: (dt, shape) for n, (shape, dt) in onnx_inputs.items()}, outputs=outputs)
    except SpecError as e:
        raise InternalError(f"rkpart export wrote a description that does not validate: {e}") from None


def _check_latent_output(rec: Recording) -> None:
    from rkpart.export.describe import same

    result = rec.result
    if rec.decode_input is not None:
        return  # a pipeline that decodes whatever output_type says (DiT): its final latent is the loop's
    if not (hasattr(result, "shape") and same(result, rec.steps[-1].prev_sample, rtol=1e-6)):
        raise DescribeError("the pipeline's output_type='latent' result is not its final loop latent; rkpart "
                            "cannot say what --latent-out should hold")


def _relative(res: Any) -> float:
    """The core's ONNX Runtime check as max |error| / max |torch| (0 when it did not check)."""
    c = res.check
    return 0.0 if c is None else float(c.max_abs / max(c.ref_max_abs, 1e-12))


@contextlib.contextmanager
def _positive_movedim() -> Iterator[None]:
    """``movedim`` with its dimensions made non-negative while an exporter traces.

    TorchScript's symbolic writes ``x.movedim(-1, 1)`` as a ``Transpose`` whose ``perm`` holds -1,
    which ONNX refuses (AutoencoderDC's norms and Sana's attention use it); the same dimensions
    counted from the front give the same function and a valid ``perm``.
    """
    import torch

    original = torch.Tensor.movedim

    def positive(d: Any, n: int) -> Any:
        return tuple(x % n for x in d) if isinstance(d, (tuple, list)) else d % n

    def movedim(self: torch.Tensor, source: Any, destination: Any) -> torch.Tensor:
        return original(self, positive(source, self.dim()), positive(destination, self.dim()))

    torch.Tensor.movedim = movedim  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.Tensor.movedim = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _nearest_exact_upsampling() -> Iterator[None]:
    """``interpolate(mode="nearest-exact")`` by an integer ``scale_factor`` >= 1 as ``mode="nearest"`` while an
    exporter traces.

    TorchScript has no symbolic for ``_upsample_nearest_exact2d`` (Qwen-Image's VAE upsamples so: Krea 2,
    Nucleus-MoE); an integer upscale picks the same source pixel either way (``floor((i + 0.5) / k)`` ==
    ``floor(i / k)``), and the exported module is checked against torch under ONNX Runtime.
    """
    import torch.nn.functional as F

    original = F.interpolate

    def integer_upscale(scale: float | tuple[float, ...] | list[float] | None) -> bool:
        if scale is None:
            return False
        scales = scale if isinstance(scale, (tuple, list)) else [scale]
        return all(float(k) >= 1 and float(k).is_integer() for k in scales)

    sig = inspect.signature(original)

    def interpolate(*args: Any, **kwargs: Any) -> Any:
        a = sig.bind(*args, **kwargs).arguments  # nn.Upsample passes its mode positionally
        if a.get("mode") == "nearest-exact" and integer_upscale(a.get("scale_factor")):
            a["mode"] = "nearest"
        return original(**a)

    F.interpolate = interpolate
    try:
        yield
    finally:
        F.interpolate = original


def _session(path: Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own Fail / InvalidGraph / RuntimeException
        raise ExportError(f"the exported {path.name} does not load in ONNX Runtime: {first_line(e)}") from None


def _check_close(got: np.ndarray, want: np.ndarray, *, dtype: str, what: str) -> float:
    """max |got - want| / max |want|, refused above the dtype's bound (1e-3 float32, 2e-2 float16)."""
    got64, want64 = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got64.shape != want64.shape:
        raise ExportError(f"{what}: output shape {got64.shape} differs from torch's {want64.shape}")
    if not np.isfinite(got64).all():
        raise ExportError(f"{what}: the output holds NaN or infinity where torch's does not")
    rel = float(np.abs(got64 - want64).max() / max(float(np.abs(want64).max()), 1e-12))
    bound = 2e-2 if dtype == "float16" else 1e-3
    if rel > bound:
        raise ExportError(f"{what} differs from torch: max |error| / max |torch| = {rel:.3g} (bound {bound})")
    return rel


def _check_calls(path: Path, facts: Facts, recs: list[Recording], batch: int, dtype: str) -> float:
    """ONNX Runtime on every recorded transformer call (each row alone for a halved pair) vs torch's outputs."""
    sess = _session(path)
    graph_inputs = {i.name for i in sess.get_inputs()}
    worst = 0.0
    np_dtype = {"float16": np.float16, "float32": np.float32}[dtype]
    for r in recs:
        for k, s in enumerate(r.steps):
            for c in s.calls:
                rows = [slice(None)] if batch == facts.pipeline_batch else [slice(0, 1), slice(1, 2)]
                for row in rows:
                    feeds = {}
                    for name in facts.inputs:
                        v = c.kwargs[name]
                        if row != slice(None) and _batched(facts, name, v):
                            v = v[row]
                        a = v.numpy()
                        feeds[name] = a.astype(np_dtype) if a.dtype.kind == "f" else a
                    try:
                        got = sess.run(None, {k: v for k, v in feeds.items() if k in graph_inputs})[0]
                    except Exception as e:  # noqa: BLE001 - onnxruntime's own errors
                        raise ExportError(f"{path.name} fails under ONNX Runtime on a recorded call: "
                                          f"{first_line(e)}") from None
                    worst = max(worst, _check_close(got, c.output[row].float().numpy(), dtype=dtype,
                                                   what=f"{path.name} on step {k + 1} of the {len(r.steps)}-step call"))
    return worst
