"""Hand-written ``pipeline.json`` documents following the contract (docs/pipeline-json.md), for
tests that need a description before ``rkpart export`` writes one."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

FLOW_MATCH_CONFIG = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.42.1",
                     "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5,
                     "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096}


def base_doc(inputs: Mapping[str, dict[str, Any]], *, output: str = "sample", cfg: dict[str, Any] | None = None,
             latent: dict[str, Any] | None = None, pipeline: str = "FluxPipeline",
             transformer: str = "FluxTransformer2DModel", batch: int = 1, values: str | None = "inputs.npz",
             timestep: dict[str, Any] | None = None) -> dict[str, Any]:
    """A version-1 document: ``inputs`` as the contract's ``inputs.<name>`` (missing keys null)."""
    ins = {n: {"argument": None, "negative_argument": None, "value": None, **spec} for n, spec in inputs.items()}
    lat = next(spec for spec in ins.values() if spec["role"] == "latent")
    return {
        "format": "rkpart-pipeline", "version": 1,
        "pipeline": {"class": pipeline, "diffusers": "0.42.1"},
        "transformer": {"class": transformer, "file": "transformer.onnx", "dtype": "float32",
                        "exporter": "torchscript", "patches": []},
        "image": {"height": 64, "width": 64, "text_len": 6, "batch": batch},
        "inputs": ins,
        "output": {"name": output, "prediction": "flow", "learned_sigma": False, "sign": 1, "channels_axis": 1},
        "timestep": timestep or {"scale": 0.001, "offset": 0.0},
        "scheduler": {"class": "FlowMatchEulerDiscreteScheduler", "config": dict(FLOW_MATCH_CONFIG),
                      "set_timesteps": {"sigmas": "linspace(1, 1/n, n)", "mu": 0.5}},
        "cfg": cfg or {"mode": "distilled", "guidance_scale": 3.5, "guidance_input": "guidance", "combine": None},
        "latent": latent or {"shape": lat["shape"], "dtype": lat["dtype"], "init": "identity", "packing": "flux-2x2",
                             "channels": lat["shape"][-1]},
        "vae": {"class": "AutoencoderKL", "file": "vae_decoder.onnx", "scaling_factor": 0.3611,
                "shift_factor": 0.1159, "latent_channels": 4, "image_shape": [1, 3, 64, 64]},
        "values": values if any(s["value"] for s in ins.values()) else None,
    }


def flux_guidance_inputs(tokens: int = 16, channels: int = 16, text: int = 6, joint: int = 24,
                         pooled: int = 16) -> dict[str, dict[str, Any]]:
    """The inputs of a Flux transformer with ``guidance_embeds=True`` as ``FluxPipeline`` calls it."""
    return {
        "hidden_states": {"role": "latent", "shape": [1, tokens, channels], "dtype": "float32"},
        "encoder_hidden_states": {"role": "text_embeddings", "shape": [1, text, joint], "dtype": "float32",
                                  "argument": "prompt_embeds"},
        "pooled_projections": {"role": "pooled_embeddings", "shape": [1, pooled], "dtype": "float32",
                               "argument": "pooled_prompt_embeds"},
        "timestep": {"role": "timestep", "shape": [1], "dtype": "float32"},
        "img_ids": {"role": "image_ids", "shape": [tokens, 3], "dtype": "float32", "value": "img_ids"},
        "txt_ids": {"role": "text_ids", "shape": [text, 3], "dtype": "float32", "value": "txt_ids"},
        "guidance": {"role": "guidance", "shape": [1], "dtype": "float32"},
    }


def flux_ids(tokens: int = 16, text: int = 6) -> dict[str, np.ndarray]:
    """``FluxPipeline._prepare_latent_image_ids`` for a square grid, and its zero text ids."""
    side = round(tokens ** 0.5)
    img = np.zeros((tokens, 3), np.float32)
    img[:, 1] = np.arange(tokens) // side
    img[:, 2] = np.arange(tokens) % side
    return {"img_ids": img, "txt_ids": np.zeros((text, 3), np.float32)}


def write(folder: Path, doc: Mapping[str, Any], values: Mapping[str, np.ndarray] | None = None) -> Path:
    """``folder/pipeline.json`` (and its ``values`` .npz); returns the json's path."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "pipeline.json"
    p.write_text(json.dumps(doc, indent=2) + "\n")
    if values is not None and doc.get("values"):
        np.savez(folder / doc["values"], **dict(values))  # type: ignore[arg-type]
    return p


def edited(doc: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with the dotted ``path`` set to ``value`` (``...`` deletes it)."""
    out = copy.deepcopy(dict(doc))
    node: Any = out
    *parents, last = path.split(".")
    for k in parents:
        node = node[k]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return out
