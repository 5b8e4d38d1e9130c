"""``rkpart encode``: a prompt through the pipeline's own text encoders, as the call arguments ``--embeds`` takes.

The board has no text encoder; ``runner.py --embeds E.npz`` takes the conditioning as the diffusers call
arguments the pipeline's transformer inputs come from (``prompt_embeds``, ``negative_prompt_embeds``,
``pooled_prompt_embeds``, ``prompt_attention_mask``, ...: ``pipeline.json``'s ``argument`` and
``negative_argument``).  rkpart keeps no table of how each pipeline encodes a prompt.  It runs the
pipeline's own ``__call__`` with ``prompt=`` (and ``negative_prompt=``) at the export's size and text length,
up to its first scheduler step, with the transformer's ``forward`` hooked (:mod:`rkpart.export.record`), and
inverts the description: an input that ``pipeline.json`` says is argument ``A`` of the conditional pass was
``A``; under ``batched`` CFG its second row is the conditional one, its first the unconditional one
(``negative_argument``); under ``two-pass`` the conditional call is the one a second call, whose negative
prompt is the prompt itself, repeats.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.description import PipelineDescription, load_description
from rkpart.errors import UserError
from rkpart.progress import Progress

#: ``model_index.json`` components that are text encoders (``text_encoder``, ``text_encoder_2``, ...)
TEXT_ENCODER_PREFIX = "text_encoder"


def text_encoders(src: Path) -> list[str]:
    """The text encoder components ``src/model_index.json`` names that are saved (not ``null``)."""
    from rkpart.export.build import _read_json

    index = _read_json(src / "model_index.json", "model_index.json") if (src / "model_index.json").is_file() else {}
    return [k for k, v in index.items() if k.startswith(TEXT_ENCODER_PREFIX) and isinstance(v, list) and v
            and v[0] is not None]


def _call_args(pipe: Any, d: PipelineDescription, prompt: str, negative: str | None, seed: int) -> dict[str, Any]:
    import torch

    params = inspect.signature(pipe.__call__).parameters
    args: dict[str, Any] = {"prompt": prompt, "num_inference_steps": 2, "output_type": "latent",
                            "height": d.image.height, "width": d.image.width,
                            "generator": torch.Generator().manual_seed(seed)}
    if "negative_prompt" in params:
        args["negative_prompt"] = negative if negative is not None else ""
    scale = d.cfg.scale_argument or "guidance_scale"
    if d.cfg.guidance_scale is not None and scale in params:
        args[scale] = d.cfg.guidance_scale
    if d.image.text_len is not None and "max_sequence_length" in params:
        args["max_sequence_length"] = d.image.text_len
    if "use_resolution_binning" in params:
        args["use_resolution_binning"] = False
    return args


def _first_step_calls(pipe: Any, args: dict[str, Any]) -> list[dict[str, Any]]:
    """The transformer calls of the call's first step, each as the flat inputs ``pipeline.json`` names."""
    import contextlib

    import torch

    from rkpart.export.describe import flatten_kwargs
    from rkpart.export.record import Recording, _Stop, hooked

    rec = Recording(args={})
    try:
        with hooked(pipe, rec, stop_at_first_step=True), torch.no_grad(), contextlib.suppress(_Stop):
            pipe(**args)
    except Exception as e:  # noqa: BLE001 - the pipeline's own refusal of these arguments, in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        length = f", text length {args['max_sequence_length']}" if "max_sequence_length" in args else ""
        raise UserError(f"{type(pipe).__name__} cannot encode this prompt at {args['width']}x{args['height']}"
                        f"{length}: {first[:300]}") from None
    if not rec.steps or not rec.trailing_calls:
        raise UserError(f"{type(pipe).__name__}'s call ended before its first transformer step")
    return [flatten_kwargs(c.kwargs)[0] for c in rec.trailing_calls]


def _numpy(v: Any) -> np.ndarray:
    import torch

    if isinstance(v, torch.Tensor):
        return np.asarray(v.detach().float().numpy() if v.dtype == torch.bfloat16 else v.detach().numpy())
    return np.asarray(v)


def _conditional_call(pipe: Any, d: PipelineDescription, args: dict[str, Any], calls: list[dict[str, Any]]) -> int:
    """Which of a two-pass step's calls is the conditional one: the one a call whose negative prompt is
    the prompt itself repeats in every input taken from a call argument."""
    same = _first_step_calls(pipe, {**args, "negative_prompt": args["prompt"]})
    names = [i.name for i in d.inputs if i.argument is not None and i.value is None]
    hits = [k for k, c in enumerate(calls)
            if all(np.array_equal(_numpy(c[n]), _numpy(same[0][n])) for n in names if n in c and n in same[0])]
    if len(hits) != 1:
        raise UserError(f"{d.pipeline_class}: cannot tell which of its two transformer calls per step is the "
                        "conditional one (the prompt and the negative prompt give the same inputs)")
    return hits[0]


def encode(src: str | os.PathLike[str], description: str | os.PathLike[str], prompt: str,
           negative_prompt: str | None = None, *, seed: int = 0,
           progress: Progress = lambda _m: None) -> dict[str, np.ndarray]:
    """The call arguments ``pipeline.json`` maps to transformer inputs, for ``prompt`` (and
    ``negative_prompt``) encoded by the pipeline in ``src`` (see the module doc).

    Raises
    ------
    UserError
        The folder has no text encoders, is another pipeline than the description's, or its text
        encoders give another text length than the export took.
    """
    from rkpart.export import require_extra
    from rkpart.export.build import _quiet_libraries, load_pipeline

    require_extra(("torch", "diffusers", "transformers"))
    folder = Path(src)
    d = load_description(description)
    if not (folder / "model_index.json").is_file():
        from rkpart.errors import InvalidModelError

        raise InvalidModelError(f"{folder} is not a diffusers pipeline folder (no model_index.json)")
    if not text_encoders(folder):
        raise UserError(f"{folder} has no text encoders (text_encoder is null in model_index.json): rkpart encode "
                        "runs the pipeline's own text encoders; use the pipeline folder that has them")
    from rkpart.export.build import _read_json

    index = _read_json(folder / "model_index.json", "model_index.json")
    if index.get("_class_name") != d.pipeline_class:
        raise UserError(f"{folder} is a {index.get('_class_name')}, {description} describes a {d.pipeline_class}")
    if not any(i.argument for i in d.inputs):
        raise UserError(f"{description}: the transformer takes no input from a call argument; nothing to encode")
    _quiet_libraries()
    progress(f"loading {folder} ({d.pipeline_class}, text encoders {', '.join(text_encoders(folder))})")
    pipe = load_pipeline(folder)
    args = _call_args(pipe, d, prompt, negative_prompt, seed)
    progress(f"encoding the prompt{' and the negative prompt' if negative_prompt is not None else ''} "
             f"({d.cfg.mode} CFG)")
    calls = _first_step_calls(pipe, args)
    mode = d.cfg.mode
    expect = 2 if mode == "two-pass" else 1
    if len(calls) != expect:
        raise UserError(f"{d.pipeline_class} made {len(calls)} transformer call(s) in its first step; "
                        f"{description} describes {mode} ({expect})")
    cond_k = _conditional_call(pipe, d, args, calls) if mode == "two-pass" else 0
    out: dict[str, np.ndarray] = {}
    for i in d.inputs:
        if i.value is not None or i.role in ("latent", "timestep", "guidance"):
            continue
        for arg, which in ((i.argument, "cond"), (i.negative_argument, "uncond")):
            if arg is None:
                continue
            call = calls[cond_k if which == "cond" else 1 - cond_k] if mode == "two-pass" else calls[0]
            if i.name not in call:
                raise UserError(f"{d.pipeline_class}'s transformer was not given {i.name!r}")
            a = _numpy(call[i.name])
            want = i.shape
            if mode == "batched":
                a = a[1:2] if which == "cond" else a[0:1]
                want = (i.shape[0] // 2, *i.shape[1:])
            if tuple(a.shape) != tuple(want):
                raise UserError(f"the pipeline's text encoders give {arg} of shape {list(a.shape)}; {description} "
                                f"takes {list(want)} (rkpart export --text-len {d.image.text_len}): export with the "
                                "text length the encoders give")
            if arg in out and not np.array_equal(out[arg], a):
                raise UserError(f"{arg} reaches two transformer inputs with different values; cannot invert it")
            out[arg] = a.astype(np.dtype(i.dtype)) if a.dtype.kind == "f" else a
    return out


def write_embeds(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray], *, force: bool = False) -> None:
    """``arrays`` as an ``.npz`` at ``path`` (byte-identical for equal arrays; written atomically),
    with rkpart's zip comment: how ``encode --force`` knows a file it wrote (rkpart.output's rule)."""
    from rkpart.io import write_npz
    from rkpart.output import mark_npz, npz_is_rkparts, output_file

    with output_file(path, force=force, what="--out", owned=npz_is_rkparts) as tmp:
        write_npz(tmp, arrays)
        mark_npz(tmp)


__all__ = ["encode", "text_encoders", "write_embeds"]
