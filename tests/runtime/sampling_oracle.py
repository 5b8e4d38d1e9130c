"""diffusers' own schedulers as the oracle of :mod:`rkpart.runtime.board_sampling` (torch needed).

Shared by ``tests/runtime/test_board_sampling.py`` (a sample) and ``scripts/check_samplers.py``
(the whole grid).  A loop runs the same deterministic model on both sides: a seeded channel mix
of the scheduler's input plus a term in the timestep, computed in NumPy float32 from whatever
sample each side holds, so the two loops see the same model and drift apart only if their
samplers differ.  Noise is diffusers' own: diffusers draws from a seeded ``torch.Generator``
passed to ``step``; the NumPy side gets the same draws from a second generator with the same seed
(``generator_noise``), in the order it asks for them.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rkpart.runtime import board_sampling as bs

#: relative max-abs error of a final latent against diffusers' (measured: <= 1e-6 over 50 steps)
MAX_REL = 1e-5
MIN_COSINE = 0.99999


@dataclass(frozen=True)
class Case:
    """A scheduler as a pipeline configures it: class, ``scheduler_config.json``, ``set_timesteps`` extras."""

    name: str
    cls: str
    config: Mapping[str, Any]
    #: the pipeline's custom schedule (a :data:`board_sampling.SCHEDULE_RULES` name) and ``mu``
    rule: str | None = None
    mu: float | None = None
    #: where the config comes from
    source: str = ""
    shape: tuple[int, ...] = (1, 4, 8, 8)
    model_channels: int | None = None
    tags: tuple[str, ...] = field(default=())


_DPM_PIXART = {"_class_name": "DPMSolverMultistepScheduler"}  # DPMSolverMultistepScheduler() defaults
_COGVIDEOX = {
    "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
    "num_train_timesteps": 1000, "prediction_type": "v_prediction", "rescale_betas_zero_snr": True,
    "set_alpha_to_one": True, "timestep_spacing": "trailing",
}
_FLUX = {"base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
         "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True}

#: the default schedulers of the sweep's pipelines.  "script": diffusers' own conversion script
#: (scripts/convert_*_to_diffusers.py) that wrote the Hub checkpoint's scheduler_config.json;
#: "hub": the checkpoint's config as published (not re-checked here: no Hub access).
PUBLISHED: tuple[Case, ...] = (
    Case("dit", "DDIMScheduler", {"num_train_timesteps": 1000, "beta_schedule": "linear",
                                  "prediction_type": "epsilon", "clip_sample": False},
         source="script convert_dit_to_diffusers.py"),
    Case("pixart", "DPMSolverMultistepScheduler", _DPM_PIXART,
         source="script convert_pixart_{alpha,sigma}_to_diffusers.py"),
    Case("sana", "DPMSolverMultistepScheduler",
         {"flow_shift": 3.0, "use_flow_sigmas": True, "prediction_type": "flow_prediction"},
         source="script convert_sana_to_diffusers.py (1024px; 4K: flow_shift 6)"),
    Case("sana_video", "DPMSolverMultistepScheduler",
         {"flow_shift": 8.0, "use_flow_sigmas": True, "prediction_type": "flow_prediction"},
         source="script convert_sana_video_to_diffusers.py"),
    Case("cogvideox", "CogVideoXDDIMScheduler", {**_COGVIDEOX, "snr_shift_scale": 3.0},
         source="script convert_cogvideox_to_diffusers.py (2B)"),
    Case("cogvideox_5b", "CogVideoXDPMScheduler", {**_COGVIDEOX, "snr_shift_scale": 1.0},
         source="hub CogVideoX-5b (snr_shift_scale 1.0 per the conversion script)"),
    Case("cogview3plus", "CogVideoXDDIMScheduler", {**_COGVIDEOX, "snr_shift_scale": 4.0},
         source="script convert_cogview3_to_diffusers.py"),
    Case("cogview4", "FlowMatchEulerDiscreteScheduler",
         {"base_shift": 0.25, "max_shift": 0.75, "base_image_seq_len": 256, "use_dynamic_shifting": True,
          "time_shift_type": "linear"},
         rule="timesteps=linspace(N, 1, n).int, sigmas=timesteps/N", mu=0.75 * (1024 / 256) ** 0.5 + 0.25,
         source="script convert_cogview4_to_diffusers.py; mu of 1024 image tokens"),
    Case("wan", "UniPCMultistepScheduler",
         {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "num_train_timesteps": 1000,
          "flow_shift": 3.0}, source="script convert_wan_to_diffusers.py (480p; 720p: 5.0)"),
    Case("skyreels_v2", "UniPCMultistepScheduler",
         {"prediction_type": "flow_prediction", "num_train_timesteps": 1000, "use_flow_sigmas": True},
         source="script convert_skyreelsv2_to_diffusers.py"),
    Case("ltx", "FlowMatchEulerDiscreteScheduler",
         {"use_dynamic_shifting": True, "base_shift": 0.95, "max_shift": 2.05, "base_image_seq_len": 1024,
          "max_image_seq_len": 4096, "shift_terminal": 0.1},
         rule="linspace(1, 1/n, n)", mu=bs.calculate_shift(2048, 1024, 4096, 0.95, 2.05),
         source="script convert_ltx_to_diffusers.py (0.9.1)"),
    Case("hunyuanvideo", "FlowMatchEulerDiscreteScheduler", {"shift": 7.0}, rule="linspace(1, 0, n+1)[:-1]",
         source="script convert_hunyuan_video_to_diffusers.py"),
    Case("omnigen", "FlowMatchEulerDiscreteScheduler", {"invert_sigmas": True, "num_train_timesteps": 1},
         rule="linspace(1, 0, n+1)[:-1]", source="script convert_omnigen_to_diffusers.py"),
    Case("cosmos", "FlowMatchEulerDiscreteScheduler",
         # Cosmos2TextToImagePipeline.__init__ registers sigma_max/min/data and final_sigmas_type
         {"use_karras_sigmas": True, "sigma_max": 80.0, "sigma_min": 0.002, "sigma_data": 1.0,
          "final_sigmas_type": "sigma_min"},
         rule="torch.linspace(0, 1, n, float64)", source="script convert_cosmos_to_diffusers.py (2.0)"),
    Case("sd3", "FlowMatchEulerDiscreteScheduler", {"num_train_timesteps": 1000, "shift": 3.0},
         source="hub stabilityai/stable-diffusion-3(.5)"),
    Case("flux", "FlowMatchEulerDiscreteScheduler", _FLUX, rule="linspace(1, 1/n, n)",
         mu=bs.calculate_shift(1024), source="hub black-forest-labs/FLUX.1-dev; mu of 1024 image tokens"),
    Case("chroma", "FlowMatchEulerDiscreteScheduler", _FLUX, rule="linspace(1, 1/n, n)",
         mu=bs.calculate_shift(4096), source="hub (Flux's); mu of 4096 image tokens"),
    Case("auraflow", "FlowMatchEulerDiscreteScheduler", {"num_train_timesteps": 1000, "shift": 1.73},
         source="hub fal/AuraFlow"),
    Case("lumina2", "FlowMatchEulerDiscreteScheduler", {"num_train_timesteps": 1000, "shift": 6.0},
         rule="linspace(1, 1/n, n)", source="hub Alpha-VLLM/Lumina-Image-2.0"),
    Case("lumina_next", "FlowMatchEulerDiscreteScheduler", {}, source="script convert_lumina_to_diffusers.py"),
    Case("zimage", "FlowMatchEulerDiscreteScheduler",
         {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False},
         rule="torch.linspace(1, 1/n, n)", mu=0.93, source="hub Tongyi-MAI/Z-Image-Turbo (mu unused)"),
    Case("ernie_image", "FlowMatchEulerDiscreteScheduler", {"num_train_timesteps": 1000, "shift": 3.0},
         rule="torch.linspace(1, 0, n+1)[:-1]", source="pipeline rule; shift as SD3"),
    Case("hunyuandit", "DDPMScheduler",
         {"beta_end": 0.018, "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
          "num_train_timesteps": 1000, "prediction_type": "v_prediction", "steps_offset": 1,
          "timestep_spacing": "leading", "variance_type": "fixed_small"},
         source="hub Tencent-Hunyuan/HunyuanDiT-v1.2-Diffusers (as tests/models/pipelines.py has it)",
         tags=("noise",)),
    Case("latte", "DDIMScheduler",
         {"beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001, "clip_sample": False,
          "num_train_timesteps": 1000, "prediction_type": "epsilon", "steps_offset": 0,
          "timestep_spacing": "leading"}, source="hub maxin-cn/Latte-1"),
    Case("anyflow", "FlowMapEulerDiscreteScheduler", {"num_train_timesteps": 1000, "shift": 5.0},
         source="script convert_anyflow_to_diffusers.py"),
    Case("allegro", "EulerAncestralDiscreteScheduler",
         {"beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001, "num_train_timesteps": 1000,
          "prediction_type": "epsilon", "steps_offset": 0, "timestep_spacing": "linspace"},
         source="hub rhymes-ai/Allegro", tags=("noise",)),
)

#: option variations of every implemented class (each one option away from a published config)
VARIATIONS: tuple[Case, ...] = (
    # FlowMatchEuler
    Case("fm_exp_sigmas", "FlowMatchEulerDiscreteScheduler", {"shift": 3.0, "use_exponential_sigmas": True}),
    Case("fm_karras", "FlowMatchEulerDiscreteScheduler", {"shift": 1.0, "use_karras_sigmas": True}),
    Case("fm_karras_rule", "FlowMatchEulerDiscreteScheduler", {**_FLUX, "use_karras_sigmas": True},
         rule="linspace(1, 1/n, n)", mu=1.1),
    Case("fm_invert", "FlowMatchEulerDiscreteScheduler", {"shift": 3.0, "invert_sigmas": True}),
    Case("fm_terminal", "FlowMatchEulerDiscreteScheduler", {"shift": 3.0, "shift_terminal": 0.05}),
    Case("fm_dynamic_f64", "FlowMatchEulerDiscreteScheduler", {**_FLUX}, mu=0.8),
    Case("fm_linear_shift", "FlowMatchEulerDiscreteScheduler", {**_FLUX, "time_shift_type": "linear"},
         rule="linspace(1, 1/n, n)", mu=2.5),
    Case("fm_glm_rule", "FlowMatchEulerDiscreteScheduler",
         {"base_shift": 0.25, "max_shift": 0.75, "base_image_seq_len": 256, "use_dynamic_shifting": True,
          "time_shift_type": "linear"}, rule="timesteps=linspace(N, 1, n+1)[:-1].int, sigmas=timesteps/N", mu=1.4),
    Case("fm_stochastic", "FlowMatchEulerDiscreteScheduler", {"shift": 3.0, "stochastic_sampling": True},
         tags=("noise",)),
    Case("flowmap_no_shift", "FlowMapEulerDiscreteScheduler", {}),
    Case("flowmap_rule", "FlowMapEulerDiscreteScheduler", {"shift": 3.0}, rule="linspace(1, 1/n, n)"),
    # DPM-Solver
    Case("dpm_v", "DPMSolverMultistepScheduler", {"prediction_type": "v_prediction"}),
    Case("dpm_sample", "DPMSolverMultistepScheduler", {"prediction_type": "sample", "thresholding": True,
                                                       "sample_max_value": 1.5}),
    Case("dpm_order1", "DPMSolverMultistepScheduler", {"solver_order": 1}),
    Case("dpm_order3_heun", "DPMSolverMultistepScheduler", {"solver_order": 3, "solver_type": "heun"}),
    Case("dpm_noise_pred", "DPMSolverMultistepScheduler",
         {"algorithm_type": "dpmsolver", "final_sigmas_type": "sigma_min", "solver_type": "heun"}),
    Case("dpm_noise_pred_v3", "DPMSolverMultistepScheduler",
         {"algorithm_type": "dpmsolver", "final_sigmas_type": "sigma_min", "prediction_type": "v_prediction",
          "solver_order": 3, "thresholding": True}, tags=("f32_cancel",)),
    Case("dpm_karras", "DPMSolverMultistepScheduler",
         {"use_karras_sigmas": True, "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}),
    Case("dpm_karras_cos", "DPMSolverMultistepScheduler",
         {"use_karras_sigmas": True, "beta_schedule": "squaredcos_cap_v2"}),
    Case("dpm_exponential", "DPMSolverMultistepScheduler", {"use_exponential_sigmas": True}),
    Case("dpm_lu", "DPMSolverMultistepScheduler", {"use_lu_lambdas": True}),
    Case("dpm_euler_final", "DPMSolverMultistepScheduler",
         {"euler_at_final": True, "lower_order_final": False, "final_sigmas_type": "sigma_min"}),
    Case("dpm_clipped", "DPMSolverMultistepScheduler", {"lambda_min_clipped": -5.1, "timestep_spacing": "leading",
                                                        "steps_offset": 1}),
    Case("dpm_trailing_zsnr", "DPMSolverMultistepScheduler",
         {"timestep_spacing": "trailing", "rescale_betas_zero_snr": True, "prediction_type": "v_prediction"}),
    Case("dpm_deis_alias", "DPMSolverMultistepScheduler", {"algorithm_type": "deis", "solver_type": "logrho",
                                                           "final_sigmas_type": "sigma_min"}),
    Case("dpm_flow_dynamic", "DPMSolverMultistepScheduler",
         {"flow_shift": 3.0, "use_flow_sigmas": True, "prediction_type": "flow_prediction",
          "use_dynamic_shifting": True}, mu=1.2),
    Case("dpm_learned_range", "DPMSolverMultistepScheduler", {"variance_type": "learned_range"},
         shape=(1, 3, 8, 8), model_channels=6),
    Case("dpm_trained_betas", "DPMSolverMultistepScheduler",
         {"trained_betas": [float(b) for b in np.linspace(0.0001, 0.02, 1000) ** 1.05], "solver_order": 2}),
    Case("dpm_sde++", "DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++"}, tags=("noise",)),
    Case("dpm_sde++_3", "DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++", "solver_order": 3,
                                                        "solver_type": "heun"}, tags=("noise",)),
    Case("dpm_sde", "DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver",
                                                    "final_sigmas_type": "sigma_min"}, tags=("noise",)),
    # DDIM
    Case("ddim_v_zsnr", "DDIMScheduler", {"prediction_type": "v_prediction", "rescale_betas_zero_snr": True,
                                          "timestep_spacing": "trailing", "beta_schedule": "scaled_linear",
                                          "beta_start": 0.00085, "beta_end": 0.012}),
    Case("ddim_sample_clip", "DDIMScheduler", {"prediction_type": "sample", "clip_sample": True,
                                               "set_alpha_to_one": False, "steps_offset": 1}),
    Case("ddim_linspace_cos", "DDIMScheduler", {"timestep_spacing": "linspace", "beta_schedule": "squaredcos_cap_v2",
                                                "thresholding": True, "sample_max_value": 2.0}),
    # DDPM
    Case("ddpm_eps", "DDPMScheduler", {}, tags=("noise",)),
    Case("ddpm_small_log", "DDPMScheduler", {"variance_type": "fixed_small_log", "timestep_spacing": "trailing"},
         tags=("noise",)),
    Case("ddpm_large", "DDPMScheduler", {"variance_type": "fixed_large", "timestep_spacing": "linspace",
                                         "beta_schedule": "laplace", "clip_sample": False}, tags=("noise",)),
    Case("ddpm_learned_range", "DDPMScheduler", {"variance_type": "learned_range"},
         model_channels=8, tags=("noise",)),
    Case("ddpm_learned", "DDPMScheduler", {"variance_type": "learned", "clip_sample": False,
                                           "prediction_type": "sample"}, model_channels=8, tags=("noise", "abs")),
    # CogVideoX
    Case("cogvideox_linear_eps", "CogVideoXDDIMScheduler", {"beta_schedule": "linear", "beta_start": 0.0001,
                                                            "beta_end": 0.02, "timestep_spacing": "leading"}),
    Case("cogvideox_dpm_linspace", "CogVideoXDPMScheduler", {**_COGVIDEOX, "timestep_spacing": "linspace",
                                                             "set_alpha_to_one": False}, tags=("noise",)),
    # UniPC
    Case("unipc_eps_o3", "UniPCMultistepScheduler", {"solver_order": 3}),
    Case("unipc_bh1_v", "UniPCMultistepScheduler", {"solver_type": "bh1", "prediction_type": "v_prediction",
                                                    "disable_corrector": [0, 2], "final_sigmas_type": "sigma_min"}),
    Case("unipc_noise_pred", "UniPCMultistepScheduler", {"predict_x0": False, "lower_order_final": False,
                                                         "final_sigmas_type": "sigma_min"}),
    Case("unipc_karras_flow", "UniPCMultistepScheduler",
         {"use_karras_sigmas": True, "use_flow_sigmas": True, "prediction_type": "flow_prediction",
          "sigma_max": 200.0, "sigma_min": 0.01}),
    Case("unipc_flow_dynamic", "UniPCMultistepScheduler",
         {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "use_dynamic_shifting": True,
          "shift_terminal": 0.05}, mu=1.0),
    Case("unipc_exponential", "UniPCMultistepScheduler", {"use_exponential_sigmas": True,
                                                          "final_sigmas_type": "sigma_min"}),
    # Euler
    Case("euler_eps", "EulerDiscreteScheduler", {"beta_schedule": "scaled_linear", "beta_start": 0.00085,
                                                 "beta_end": 0.012, "timestep_spacing": "leading",
                                                 "steps_offset": 1}),
    Case("euler_v_karras", "EulerDiscreteScheduler", {"prediction_type": "v_prediction", "use_karras_sigmas": True,
                                                      "final_sigmas_type": "sigma_min"},
         tags=("f32_cancel", "ulp_timesteps")),
    Case("euler_exp_trailing", "EulerDiscreteScheduler", {"use_exponential_sigmas": True,
                                                          "timestep_spacing": "trailing"}, tags=("ulp_timesteps",)),
    Case("euler_a_v_leading", "EulerAncestralDiscreteScheduler", {"prediction_type": "v_prediction",
                                                                  "timestep_spacing": "leading",
                                                                  "rescale_betas_zero_snr": True}, tags=("noise",)),
)


def diffusers_scheduler(case: Case) -> Any:
    import diffusers

    logging.getLogger("diffusers").setLevel(logging.ERROR)
    return getattr(diffusers, case.cls).from_config(dict(case.config))


def set_kwargs(case: Case, n: int) -> dict[str, Any]:
    """``set_timesteps`` keyword arguments as the pipeline computes them (not with board_sampling's rules)."""
    import torch

    kw: dict[str, Any] = {}
    if case.rule == "linspace(1, 1/n, n)":
        kw["sigmas"] = np.linspace(1.0, 1 / n, n)
    elif case.rule == "torch.linspace(1, 1/n, n)":
        kw["sigmas"] = torch.linspace(1.0, 1 / n, n).tolist()
    elif case.rule == "linspace(1, 0, n+1)[:-1]":
        kw["sigmas"] = np.linspace(1.0, 0.0, n + 1)[:-1]
    elif case.rule == "torch.linspace(1, 0, n+1)[:-1]":
        kw["sigmas"] = torch.linspace(1.0, 0.0, n + 1)[:-1].numpy()
    elif case.rule == "torch.linspace(0, 1, n, float64)":
        kw["sigmas"] = torch.linspace(0, 1, n, dtype=torch.float64).numpy()
    elif case.rule == "timesteps=linspace(N, 1, n).int, sigmas=timesteps/N":
        big = case.config.get("num_train_timesteps", 1000)
        ts = np.linspace(big, 1.0, n).astype(np.int64).astype(np.float32)
        kw["timesteps"], kw["sigmas"] = ts, ts / big
    elif case.rule == "timesteps=linspace(N, 1, n+1)[:-1].int, sigmas=timesteps/N":
        big = case.config.get("num_train_timesteps", 1000)
        ts = np.linspace(big, 1.0, n + 1)[:-1].astype(np.int64).astype(np.float32)
        kw["timesteps"], kw["sigmas"] = ts, ts / big
    elif case.rule is not None:
        raise AssertionError(case.rule)
    if case.mu is not None:
        kw["mu"] = case.mu
    return kw


def _set(sched: Any, n: int, kw: Mapping[str, Any], numpy_side: bool) -> None:
    if "sigmas" in kw or "timesteps" in kw:
        sched.set_timesteps(None, **kw) if numpy_side else sched.set_timesteps(**kw)
    else:
        sched.set_timesteps(n, **kw)


def diffusers_schedule(case: Case, n: int) -> Any:
    d = diffusers_scheduler(case)
    _set(d, n, set_kwargs(case, n), numpy_side=False)
    return d


def numpy_schedule(case: Case, n: int) -> bs.Scheduler:
    m = bs.make_scheduler(case.cls, dict(case.config))
    _set(m, n, set_kwargs(case, n), numpy_side=True)
    return m


def sigmas_close(case: Case, ds: np.ndarray, ms: np.ndarray) -> bool:
    """board_sampling's float32 sigmas against diffusers': within 3 ulps (3.6e-7), or 2e-5 with
    ``rescale_betas_zero_snr``: the rescale takes torch's float32 sqrt (MKL's, ~0.75 ulp off the
    correctly rounded one used here) and then subtracts nearly equal numbers at both ends of the
    schedule (``1 - alphas_cumprod`` near t = 0, ``sqrt(alphas_cumprod) - sqrt(alphas_cumprod[-1])``
    near t = T); measured worst over 1-60 steps: 9.5e-6."""
    rtol = 2e-5 if case.config.get("rescale_betas_zero_snr") else 3.6e-7
    return bool(np.allclose(ds, ms, rtol=rtol, atol=0))


def schedule_mismatches(case: Case, n: int) -> list[str]:
    """What differs between diffusers' and board_sampling's schedules (``[]``: equal).

    Timesteps must be equal in dtype and value, except float timesteps the class derives from
    sigmas by log interpolation (Euler's karras/exponential: 2 ulps, from the sigmas' ulp);
    sigmas per :func:`sigmas_close` (diffusers' float32 ``sqrt``/``pow``/``log`` are torch's
    (MKL's), within an ulp of the correctly rounded ones used here).  Where diffusers' schedule is
    not finite (``shift_terminal`` over one step), board_sampling must refuse it.
    """
    import torch

    d = diffusers_schedule(case, n)
    dts = d.timesteps.numpy()
    ds = d.sigmas.numpy() if torch.is_tensor(getattr(d, "sigmas", None)) else None
    try:
        m = numpy_schedule(case, n)
    except bs.SamplerError as e:
        if ds is not None and not np.isfinite(ds).all():
            return []
        return [f"board_sampling refused a schedule diffusers computes: {e}"]
    out = []
    if dts.dtype != m.timesteps.dtype or dts.shape != m.timesteps.shape:
        out.append(f"timesteps {dts.dtype}{dts.shape} != {m.timesteps.dtype}{m.timesteps.shape}")
    elif not np.array_equal(dts, m.timesteps) and not (
            "ulp_timesteps" in case.tags and np.allclose(dts, m.timesteps, rtol=2.4e-7, atol=0)):
        out.append(f"timesteps {dts.tolist()} != {m.timesteps.tolist()}")
    if m.sigmas is not None:
        if ds is None or ds.shape != m.sigmas.shape or ds.dtype != m.sigmas.dtype:
            out.append(f"sigmas {None if ds is None else (ds.dtype, ds.shape)} != {m.sigmas.dtype}{m.sigmas.shape}")
        elif not sigmas_close(case, ds, m.sigmas):
            out.append(f"sigmas {ds.tolist()} != {m.sigmas.tolist()}")
    ins_d = float(d.init_noise_sigma) if hasattr(d, "init_noise_sigma") else 1.0
    if not sigmas_close(case, np.array([ins_d]), np.array([m.init_noise_sigma])):
        out.append(f"init_noise_sigma {ins_d} != {m.init_noise_sigma}")
    return out


def model_fn(case: Case, seed: int = 0, dtype: type = np.float32) -> Callable[[np.ndarray, Any], np.ndarray]:
    """The deterministic stand-in model: f(x, t) = 0.7 W x + 0.3 b cos(3 t / 1000), W mixing channels."""
    rng = np.random.default_rng(seed)
    c_in = case.shape[1]
    c_out = case.model_channels or c_in
    w = (rng.standard_normal((c_out, c_in)) / math.sqrt(c_in)).astype(dtype)
    b = rng.standard_normal((c_out, 1, 1)).astype(dtype)

    def f(x: np.ndarray, t: Any) -> np.ndarray:
        tt = dtype(float(t) / 1000.0)
        y = np.einsum("oc,bchw->bohw", w, np.asarray(x, dtype)) * dtype(0.7)
        y = (y + b * dtype(0.3) * np.cos(tt * dtype(3))).astype(dtype)
        if "abs" in case.tags:  # a learned variance (DDPM "learned") must be positive
            y[:, c_in:] = np.abs(y[:, c_in:]) * dtype(0.01)
        return y

    return f


def diffusers_loop(case: Case, n: int, seed: int = 0) -> np.ndarray:
    """diffusers' final latent: its scheduler, the stand-in model, noise from ``torch.Generator(seed + 2)``."""
    import torch

    d = diffusers_schedule(case, n)
    f = model_fn(case, seed)
    x = torch.from_numpy(np.random.default_rng(seed + 1).standard_normal(case.shape).astype(np.float32))
    x = x * (d.init_noise_sigma if hasattr(d, "init_noise_sigma") else 1.0)
    gen = torch.Generator().manual_seed(seed + 2)
    kw = {"generator": gen} if "generator" in inspect.signature(d.step).parameters else {}
    old = None
    for i, t in enumerate(d.timesteps):
        inp = d.scale_model_input(x, t) if hasattr(d, "scale_model_input") else x
        out = torch.from_numpy(f(inp.numpy(), t))
        if case.cls == "CogVideoXDPMScheduler":  # the pipeline's call: previous x0 and timestep
            x, old = d.step(out, old, t, d.timesteps[i - 1] if i > 0 else None, x, **kw, return_dict=False)
        else:
            x = d.step(out, t, x, **kw, return_dict=False)[0]
    return x.numpy()


def numpy_loop(case: Case, n: int, seed: int = 0) -> np.ndarray:
    """board_sampling's final latent, the same model and the same draws as :func:`diffusers_loop`."""
    import torch

    m = numpy_schedule(case, n)
    f = model_fn(case, seed)
    x = np.random.default_rng(seed + 1).standard_normal(case.shape).astype(np.float32)
    x = x * np.float32(m.init_noise_sigma)
    gen = torch.Generator().manual_seed(seed + 2)

    def noise(shape: tuple[int, ...]) -> np.ndarray:
        return torch.randn(shape, generator=gen, dtype=torch.float32).numpy()

    for t in m.timesteps:
        x = m.step(f(m.scale_model_input(x, t), t), t, x, generator_noise=noise)
    return x


@dataclass(frozen=True)
class LoopResult:
    cosine: float
    max_rel: float
    #: both sides failed (diffusers raised or returned a non-finite latent; board_sampling refused)
    both_refused: bool = False
    error: str = ""

    def ok(self, max_rel: float = MAX_REL) -> bool:
        return self.both_refused or (self.cosine >= MIN_COSINE and self.max_rel <= max_rel)


def loop_error(case: Case, n: int, seed: int = 0) -> LoopResult:
    """diffusers' loop against board_sampling's: cosine and max|diff| / max|diffusers| of the final latents."""
    try:
        a = diffusers_loop(case, n, seed).astype(np.float64).ravel()
        d_err = "" if np.isfinite(a).all() else "diffusers' latent is not finite"
    except (IndexError, ValueError, RuntimeError) as e:
        a, d_err = np.zeros(0), f"diffusers raised {type(e).__name__}: {e}"
    try:
        b = numpy_loop(case, n, seed).astype(np.float64).ravel()
        m_err = "" if np.isfinite(b).all() else "board_sampling's latent is not finite"
    except bs.SamplerError as e:
        b, m_err = np.zeros(0), f"board_sampling refused: {e}"
    if d_err or m_err:
        return LoopResult(math.nan, math.nan, both_refused=bool(d_err and m_err and m_err.startswith("board")),
                          error=f"{d_err} / {m_err}")
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return LoopResult(cos, float(np.max(np.abs(a - b)) / np.max(np.abs(a))))


def max_rel(case: Case) -> float:
    """The loop tolerance: :data:`MAX_REL`, or 1e-4 for configs whose first steps cancel two terms
    ~150 times the result (noise-prediction DPM-Solver from sigma 157 to 0.01, Euler v-prediction
    over two karras steps): there diffusers' float32 rounding of one term alone is ~3e-5 (measured
    by running diffusers' update with float64 sigmas: the float32 sample times a 0-d coefficient
    stays float32)."""
    return 1e-4 if "f32_cancel" in case.tags else MAX_REL
