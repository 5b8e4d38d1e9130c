"""A denoising loop written from ``pipeline.json`` alone: the test's reading of an export.

It knows nothing of how ``rkpart export`` derived the description.  It reads the JSON, feeds
``transformer.onnx`` under ONNX Runtime as each input's ``role`` / ``argument`` / ``value`` says,
combines the outputs as ``cfg`` and ``output`` say, steps a diffusers scheduler made from
``scheduler.config``, and decodes with ``vae_decoder.onnx``.  Comparing what it returns with
diffusers' own pipeline (:func:`tests.models.pipelines.run_diffusers`) checks the description and the
two ONNX files together against an oracle nobody here wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

#: the named sigma rules of docs/pipeline-json.md, as this test reads them
SIGMAS = {
    "linspace(1, 1/n, n)": lambda n, _t: np.linspace(1.0, 1.0 / n, n),
    "linspace(1, 0, n+1)[:-1]": lambda n, _t: np.linspace(1.0, 0.0, n + 1)[:-1],
    "int(linspace(T, 1, n)) / T": lambda n, t: np.floor(np.linspace(t, 1.0, n)).astype(np.float32) / t,
}
TIMESTEPS = {"int(linspace(T, 1, n))": lambda n, t: np.floor(np.linspace(t, 1.0, n)).astype(np.float32)}


def _numbers(v: Any) -> Any:
    if v in ("NaN", "Infinity", "-Infinity"):
        return float(v)
    if isinstance(v, dict):
        return {k: _numbers(x) for k, x in v.items()}
    return v


def run_description(folder: Path, embeds: dict[str, np.ndarray], latents: np.ndarray, steps: int,
                    guidance: float | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(final latent, image NHWC in [0, 1] or None)`` of the loop ``folder/pipeline.json`` describes."""
    import diffusers
    import onnxruntime as ort
    import torch

    doc = json.loads((folder / "pipeline.json").read_text())
    values = dict(np.load(folder / doc["values"])) if doc["values"] else {}
    sess = ort.InferenceSession(str(folder / doc["transformer"]["file"]), providers=["CPUExecutionProvider"])
    sched = getattr(diffusers, doc["scheduler"]["class"]).from_config(_numbers(doc["scheduler"]["config"]))
    st = doc["scheduler"]["set_timesteps"]
    kwargs: dict[str, Any] = {} if st["mu"] is None else {"mu": st["mu"]}
    t_train = int(doc["scheduler"]["config"].get("num_train_timesteps", 1000))
    if st.get("timesteps") is not None:
        kwargs["timesteps"] = TIMESTEPS[st["timesteps"]](steps, t_train)
    if st["sigmas"] is not None:
        kwargs["sigmas"] = SIGMAS[st["sigmas"]](steps, t_train)
    if kwargs.keys() & {"sigmas", "timesteps"}:
        sched.set_timesteps(**kwargs)
    else:
        sched.set_timesteps(steps, **kwargs)
    cfg, out, ts = doc["cfg"], doc["output"], doc["timestep"]
    g = float(cfg["guidance_scale"] if guidance is None else guidance)
    latent = torch.from_numpy(latents.copy())
    if doc["latent"]["init"] == "init_noise_sigma":
        latent = latent * sched.init_noise_sigma
    passes = ["cond", "uncond"] if cfg["mode"] == "two-pass" else ["batched" if cfg["mode"] == "batched" else "cond"]
    import inspect

    # a stochastic scheduler (DDPM) draws its noise from a generator: the one run_diffusers passes (seed 0)
    step_kwargs = {"generator": torch.Generator().manual_seed(0)} if "generator" in inspect.signature(
        sched.step).parameters else {}
    for t in sched.timesteps:
        preds = {}
        for kind in passes:
            feeds = {}
            for name, i in doc["inputs"].items():
                dtype, shape = np.dtype(i["dtype"]), tuple(i["shape"])
                if i["role"] == "latent":
                    v = latent.numpy()
                    v = np.concatenate([v, v]) if kind == "batched" else v
                elif i["role"] == "timestep":
                    v = np.full(shape, ts["scale"] * float(t) + ts["offset"])
                elif i["role"] == "guidance":
                    v = np.full(shape, g * cfg.get("guidance_input_scale", 1.0))
                elif i["value"] is not None:
                    v = values[i["value"]]
                elif i["argument"] is None or (i["role"] == "attention_mask" and i["argument"] not in embeds):
                    v = np.ones(shape)  # an attention mask with no argument (or not given): all valid
                elif kind == "batched":
                    v = np.concatenate([embeds[i["negative_argument"]], embeds[i["argument"]]])
                else:
                    v = embeds[i["argument"] if kind == "cond" else i["negative_argument"]]
                feeds[name] = np.asarray(v).astype(dtype).reshape(shape)
            preds[kind] = sess.run([out["name"]], feeds)[0].astype(np.float32)
        if cfg["mode"] == "batched":
            uncond, cond = np.split(preds["batched"], 2)
            pred = uncond + g * (cond - uncond)
        elif cfg["mode"] == "two-pass":
            pred = preds["uncond"] + g * (preds["cond"] - preds["uncond"])
        else:
            pred = preds["cond"]
        if out["learned_sigma"]:
            pred = np.split(pred, 2, axis=out["channels_axis"])[0]
        pred = pred * out["sign"]
        latent = sched.step(torch.from_numpy(pred), t, latent, return_dict=False, **step_kwargs)[0]
    final = latent.numpy()
    if doc["vae"] is None:
        return final, None
    vae = ort.InferenceSession(str(folder / doc["vae"]["file"]), providers=["CPUExecutionProvider"])
    image = vae.run(None, {vae.get_inputs()[0].name: final.astype(np.float32)})[0]
    return final, image.transpose(0, 2, 3, 1)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB over 8-bit pixels of two images in [0, 1]."""
    q = lambda x: np.round(np.clip(x, 0, 1) * 255.0)  # noqa: E731
    mse = float(np.mean((q(a) - q(b)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)
