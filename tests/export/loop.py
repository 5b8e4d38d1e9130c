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
    if st.get("mu_rule") == "flux2_empirical":  # docs/pipeline-json.md's formula, L the image token count
        seq = st["image_seq_len"]
        m200, m10 = 0.00016927 * seq + 0.45666666, 8.73809524e-05 * seq + 1.89833333
        a = (m200 - m10) / 190.0
        kwargs["mu"] = m200 if seq > 4300 else a * steps + (m200 - 200.0 * a)
    else:
        assert st.get("mu_rule") is None, st["mu_rule"]
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
    elif doc["latent"]["init"] == "tokens":  # (B, C, H, W) -> (B, H*W, C), row-major
        latent = latent.reshape(*latent.shape[:2], -1).permute(0, 2, 1).contiguous()
    cond_first = cfg.get("batch_order", "uncond,cond") == "cond,uncond"
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
                    pos = embeds[i["argument"]]
                    fill = i.get("negative_fill")
                    neg = np.full_like(pos, fill) if fill is not None else embeds[i["negative_argument"]]
                    v = np.concatenate([pos, neg] if cond_first else [neg, pos])
                elif kind == "uncond" and i.get("negative_fill") is not None:
                    v = np.full_like(embeds[i["argument"]], i["negative_fill"])
                else:
                    v = embeds[i["argument"] if kind == "cond" else i["negative_argument"]]
                n = i.get("append_valid", 0)
                if n and i["argument"] in embeds and i["value"] is None:  # the argument, then n valid positions
                    v = np.asarray(v).astype(dtype)
                    v = np.concatenate([v, np.ones((*v.shape[:-1], n), dtype)], axis=-1)
                feeds[name] = np.asarray(v).astype(dtype).reshape(shape)
            preds[kind] = sess.run([out["name"]], feeds)[0].astype(np.float32)
        if cfg["mode"] in ("batched", "two-pass"):
            uncond, cond = np.split(preds["batched"], 2) if cfg["mode"] == "batched" else (preds["uncond"],
                                                                                           preds["cond"])
            if cfg["mode"] == "batched" and cond_first:
                uncond, cond = cond, uncond
            pred = {"uncond + g * (cond - uncond)": uncond, "cond + g * (cond - uncond)": cond}[cfg["combine"]] \
                + g * (cond - uncond)
            k = cfg.get("channels")
            if k is not None:  # the combination on the first k channels, the conditional prediction's after them
                ax = out["channels_axis"]
                pred = np.concatenate([np.take(pred, range(k), axis=ax),
                                       np.take(cond, range(k, cond.shape[ax]), axis=ax)], axis=ax)
            if cfg.get("renorm") == "cond_l2_last_axis":
                pred = pred * (np.linalg.norm(cond, axis=-1, keepdims=True) / np.linalg.norm(pred, axis=-1,
                                                                                               keepdims=True))
            else:
                assert cfg.get("renorm") is None, cfg["renorm"]
        else:
            pred = preds["cond"]
        if out["learned_sigma"]:
            pred = np.split(pred, 2, axis=out["channels_axis"])[0]
        pred = pred * out["sign"]
        # a singleton axis of the output (Z-Image's frame axis) is not the latent's
        step = torch.from_numpy(pred).reshape(latent.shape)
        latent = sched.step(step, t, latent, return_dict=False, **step_kwargs)[0]
    final = latent.numpy()
    if doc["vae"] is None:
        return final, None
    vae = ort.InferenceSession(str(folder / doc["vae"]["file"]), providers=["CPUExecutionProvider"])
    image = vae.run(None, {vae.get_inputs()[0].name: final.astype(np.float32)})[0]
    return final, np.moveaxis(image, 1, -1)  # NCHW -> NHWC; a video's NCFHW -> NFHWC


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB over 8-bit pixels of two images in [0, 1]."""
    q = lambda x: np.round(np.clip(x, 0, 1) * 255.0)  # noqa: E731
    mse = float(np.mean((q(a) - q(b)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)
