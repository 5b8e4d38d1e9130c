"""diffusers' schedulers in NumPy, for the board: the denoising loop's sampler, equal to diffusers'.

This one file is copied into every bundle next to ``runner.py`` (as ``sampling.py``); inside
rkpart it is ``rkpart.runtime.board_sampling``.  Like the runner it imports nothing from rkpart
and nothing but the standard library and NumPy: no torch, no scipy.

It reproduces the schedulers of diffusers 0.42.1 that the sweep's pipelines ship (docs/samplers.md
lists each class and the options it reproduces)::

    from sampling import make_scheduler, unsupported
    sched = make_scheduler(desc["scheduler"]["class"], desc["scheduler"]["config"])
    sched.set_timesteps(30, mu=0.8)
    x = x * sched.init_noise_sigma
    for t in sched.timesteps:
        eps = model(sched.scale_model_input(x, t), t)
        x = sched.step(eps, t, x, generator_noise=lambda shape: rng.standard_normal(shape))

How exactly:
- The schedule (``timesteps``, ``sigmas``) follows diffusers' own arithmetic and dtypes: float32
  where diffusers keeps a float32 tensor, float64 where it computes in NumPy, torch's CPU
  ``linspace`` and ``cumprod`` emulated bit for bit (``linspace`` rounds ``start + step * i``
  once, as the fused multiply-add of torch's x86 build does; ``cumprod`` accumulates in double).
  Integer timesteps are equal; float32 timesteps and sigmas are equal, or differ by an ulp where
  diffusers calls torch's float32 ``sqrt``/``pow``/``log``, which are not correctly rounded.
- A step computes in float64 from those schedule values and returns the dtype diffusers returns:
  a 50-step loop stays within ~1e-6 relative of diffusers' float32 one (tests/runtime/test_board_sampling.py).
- NumPy scalar rules: the arithmetic is written with explicit dtypes, so NumPy 1.x (value-based
  casting) and 2.x (NEP 50) give the same numbers as diffusers under NumPy 2.
- Noise (DDPM, ancestral and SDE solvers, CogVideoX-DPM, stochastic flow sampling) is never drawn
  here: ``step(..., generator_noise=fn)`` calls ``fn(shape)`` exactly where and as often as
  diffusers calls ``randn_tensor``, so a caller that draws from a seeded generator reproduces
  diffusers given the same draws.

A config value this module does not reproduce is refused, never approximated:
:func:`unsupported` names every such ``key=value`` (``rkpart bundle`` refuses with them) and
:func:`make_scheduler` raises :class:`SamplerError` with the same list.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from typing import TypeAlias

    # rkpart.types' JSON aliases, spelled here: this module imports nothing from rkpart, at any depth
    JsonObject: TypeAlias = dict[str, Any]
    JsonMap: TypeAlias = Mapping[str, Any]

    #: a timestep or sigma: a Python number or a numpy scalar (diffusers passes either)
    Scalar: TypeAlias = float | np.floating[Any] | np.integer[Any]

#: the diffusers version whose schedulers this module reproduces
DIFFUSERS_VERSION = "0.42.1"

#: draws standard normal noise of a shape, as diffusers' ``randn_tensor`` would
NoiseFn = Callable[[tuple[int, ...]], np.ndarray]

F32 = np.float32
F64 = np.float64


class SamplerError(ValueError):
    """A scheduler class or option this module does not reproduce, or a call diffusers refuses too."""


# ---------------------------------------------------------------------------------------------
# torch's CPU arithmetic, in NumPy


def _round_exact(x: Fraction, dtype: type[np.floating[Any]]) -> Any:
    """``x`` rounded once (to nearest, ties to even) to ``dtype``."""
    approx = dtype(float(x))  # float() rounds correctly to float64; a second rounding may be off by one
    if not np.isfinite(approx):
        return approx
    best = approx
    for cand in (np.nextafter(approx, dtype(-np.inf)), np.nextafter(approx, dtype(np.inf))):
        d_best, d_cand = abs(Fraction(float(best)) - x), abs(Fraction(float(cand)) - x)
        if d_cand < d_best or (d_cand == d_best and int(cand.view(np.uint32 if dtype is F32 else np.uint64)) % 2 == 0):
            best = cand
    return best


def torch_linspace(start: float, end: float, steps: int, dtype: type[np.floating[Any]] = F32) -> np.ndarray:
    """``torch.linspace(start, end, steps, dtype=dtype)`` on the CPU, bit for bit.

    ATen's kernel computes ``start + step * i`` for the first half and ``end - step * (steps - i - 1)``
    for the rest, in ``dtype``, and the x86 build contracts each into a fused multiply-add: one
    rounding of the exact value (measured: NumPy's linspace differs in ~30% of the float32 betas).
    """
    return _torch_linspace(float(start), float(end), int(steps), np.dtype(dtype).name).copy()


@functools.lru_cache(maxsize=32)
def _torch_linspace(start: float, end: float, steps: int, dtype_name: str) -> np.ndarray:
    # cached: float64 rounds every element through Fractions (~0.1 s for 1000)
    dtype: type[np.floating[Any]] = F32 if dtype_name == "float32" else F64
    if steps < 1:
        return np.zeros(0, dtype)
    s, e = dtype(start), dtype(end)
    if steps == 1:
        return np.array([s], dtype)
    step = dtype(dtype(e - s) / dtype(steps - 1))
    half = steps // 2
    i = np.arange(steps)
    base = np.where(i < half, F64(s), F64(e))
    prod = F64(step) * np.where(i < half, i, -(steps - i - 1)).astype(F64)
    total = base + prod
    # float32 in, float64 sum: the product is exact; where the sum is exact too (TwoSum error 0)
    # one cast is the one rounding, elsewhere round the exact rational value
    back = total - base
    err = (base - (total - back)) + (prod - back)
    out = total.astype(dtype)
    slow = np.nonzero(err != 0)[0] if dtype is F32 and steps < 2 ** 28 else i
    fs, fe, fstep = Fraction(float(s)), Fraction(float(e)), Fraction(float(step))
    for k in slow.tolist():
        out[k] = _round_exact(fs + fstep * k if k < half else fe - fstep * (steps - k - 1), dtype)
    return out


def _cumprod(a: np.ndarray) -> np.ndarray:
    """``torch.cumprod``: on the CPU it accumulates float32 in double."""
    return np.cumprod(a.astype(F64)).astype(a.dtype)


def betas_for_alpha_bar(num_diffusion_timesteps: int, max_beta: float = 0.999,
                        alpha_transform_type: str = "cosine") -> np.ndarray:
    """diffusers' ``betas_for_alpha_bar`` (float32), for ``squaredcos_cap_v2`` and ``laplace``."""
    def alpha_bar_fn(t: float) -> float:
        if alpha_transform_type == "cosine":
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
        if alpha_transform_type == "laplace":
            lmb = -0.5 * math.copysign(1, 0.5 - t) * math.log(1 - 2 * math.fabs(0.5 - t) + 1e-6)
            snr = math.exp(lmb)
            return math.sqrt(snr / (1 + snr))
        return math.exp(t * -12.0)

    betas = []
    for i in range(num_diffusion_timesteps):
        t1, t2 = i / num_diffusion_timesteps, (i + 1) / num_diffusion_timesteps
        betas.append(min(1 - alpha_bar_fn(t2) / alpha_bar_fn(t1), max_beta))
    return np.array(betas, F64).astype(F32)


def _sqrt_f32(a: np.ndarray) -> np.ndarray:
    # torch's float32 sqrt/pow(0.5) are within an ulp of the correctly rounded root, not equal to it
    return np.sqrt(a.astype(F64)).astype(F32)


def rescale_zero_terminal_snr(betas: np.ndarray) -> np.ndarray:
    """diffusers' ``rescale_zero_terminal_snr`` (betas in, betas out; float32 as torch)."""
    alphas = (F32(1.0) - betas).astype(F32)
    root = _sqrt_f32(_cumprod(alphas))
    r0, rt = root[0], root[-1]
    root = (root - rt).astype(F32)
    root = (root * F32(r0 / F32(r0 - rt))).astype(F32)
    bar = (root * root).astype(F32)
    alphas = np.concatenate([bar[0:1], (bar[1:] / bar[:-1]).astype(F32)])
    return (F32(1.0) - alphas).astype(F32)


def _searchsorted_left(a: np.ndarray, v: Any) -> int:
    return int(np.searchsorted(a, v, side="left"))


def _sigma_to_t(sigma: object, log_sigmas: np.ndarray) -> np.ndarray:
    """diffusers' ``_sigma_to_t``: the fractional training timestep of a sigma, by log-sigma interpolation.

    A float64 NumPy scalar minus diffusers' float32 ``log_sigmas`` is float64 under NumPy 2 and
    float32 under NumPy 1's value-based casting; the casts below pin NumPy 2's dtypes (measured:
    without them NumPy 1.26 moves a karras timestep of squaredcos_cap_v2 from 998 to 999).
    """
    sigma = np.asarray(sigma)
    dt = np.result_type(sigma.dtype, log_sigmas.dtype)
    log_sigma = np.log(np.maximum(sigma, sigma.dtype.type(1e-10))).astype(dt)
    dists = log_sigma - log_sigmas.astype(dt)[:, np.newaxis]
    low_idx = np.cumsum((dists >= 0), axis=0).argmax(axis=0).clip(max=log_sigmas.shape[0] - 2)
    high_idx = low_idx + 1
    low, high = log_sigmas[low_idx], log_sigmas[high_idx]
    w = np.clip((low.astype(dt) - log_sigma) / (low - high).astype(dt), 0, 1)
    t = (1 - w) * low_idx + w * high_idx
    return t.reshape(sigma.shape)


def _karras(sigma_min: float, sigma_max: float, n: int) -> np.ndarray:
    rho = 7.0
    ramp = np.linspace(0, 1, n)
    min_inv_rho, max_inv_rho = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return (max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho


def _exponential(sigma_min: float, sigma_max: float, n: int) -> np.ndarray:
    return np.exp(np.linspace(math.log(sigma_max), math.log(sigma_min), n))


def _threshold_sample(x: np.ndarray, ratio: float, max_value: float) -> np.ndarray:
    """Dynamic thresholding (Imagen): clamp each sample to its ``ratio`` quantile of |x|, then scale."""
    b = x.shape[0]
    flat = x.reshape(b, -1)
    s = np.quantile(np.abs(flat), ratio, axis=1)  # torch.quantile's default is NumPy's linear
    s = np.clip(s, 1, max_value)[:, None]
    return (np.clip(flat, -s, s) / s).reshape(x.shape)


def _spaced_timesteps(spacing: str, num_train: int, n: int, steps_offset: int) -> np.ndarray:
    """The DDIM/DDPM family's ``timestep_spacing`` (n timesteps, int64, descending)."""
    if spacing == "linspace":
        return np.linspace(0, num_train - 1, n).round()[::-1].copy().astype(np.int64)
    if spacing == "leading":
        step_ratio = num_train // n
        ts = (np.arange(0, n) * step_ratio).round()[::-1].copy().astype(np.int64)
        return ts + steps_offset
    return np.round(np.arange(num_train, 0, -(num_train / n))).astype(np.int64) - 1


# ---------------------------------------------------------------------------------------------
# configs: diffusers' defaults, what from_config keeps, and what this module reproduces


def _fmt(key: str, value: object) -> str:
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return f"{key}={text[:60]}"


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_BETA = {
    "num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02, "beta_schedule": "linear",
    "trained_betas": None,
}

#: each class's ``__init__`` keyword defaults in diffusers 0.42.1 (a test compares them with diffusers')
DEFAULTS: dict[str, JsonObject] = {
    "FlowMatchEulerDiscreteScheduler": {
        "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False, "base_shift": 0.5,
        "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096, "invert_sigmas": False,
        "shift_terminal": None, "use_karras_sigmas": False, "use_exponential_sigmas": False,
        "use_beta_sigmas": False, "time_shift_type": "exponential", "stochastic_sampling": False,
    },
    "DPMSolverMultistepScheduler": {
        **_BETA, "solver_order": 2, "prediction_type": "epsilon", "thresholding": False,
        "dynamic_thresholding_ratio": 0.995, "sample_max_value": 1.0, "algorithm_type": "dpmsolver++",
        "solver_type": "midpoint", "lower_order_final": True, "euler_at_final": False, "use_karras_sigmas": False,
        "use_exponential_sigmas": False, "use_beta_sigmas": False, "use_lu_lambdas": False, "use_flow_sigmas": False,
        "flow_shift": 1.0, "final_sigmas_type": "zero", "lambda_min_clipped": -math.inf, "variance_type": None,
        "timestep_spacing": "linspace", "steps_offset": 0, "rescale_betas_zero_snr": False,
        "use_dynamic_shifting": False, "time_shift_type": "exponential",
    },
    "DDIMScheduler": {
        **_BETA, "clip_sample": True, "set_alpha_to_one": True, "steps_offset": 0, "prediction_type": "epsilon",
        "thresholding": False, "dynamic_thresholding_ratio": 0.995, "clip_sample_range": 1.0,
        "sample_max_value": 1.0, "timestep_spacing": "leading", "rescale_betas_zero_snr": False,
    },
    "DDPMScheduler": {
        **_BETA, "variance_type": "fixed_small", "clip_sample": True, "prediction_type": "epsilon",
        "thresholding": False, "dynamic_thresholding_ratio": 0.995, "clip_sample_range": 1.0,
        "sample_max_value": 1.0, "timestep_spacing": "leading", "steps_offset": 0, "rescale_betas_zero_snr": False,
    },
    "CogVideoXDDIMScheduler": {
        "num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
        "trained_betas": None, "clip_sample": True, "set_alpha_to_one": True, "steps_offset": 0,
        "prediction_type": "epsilon", "clip_sample_range": 1.0, "sample_max_value": 1.0,
        "timestep_spacing": "leading", "rescale_betas_zero_snr": False, "snr_shift_scale": 3.0,
    },
    "UniPCMultistepScheduler": {
        **_BETA, "solver_order": 2, "prediction_type": "epsilon", "thresholding": False,
        "dynamic_thresholding_ratio": 0.995, "sample_max_value": 1.0, "predict_x0": True, "solver_type": "bh2",
        "lower_order_final": True, "disable_corrector": [], "solver_p": None, "use_karras_sigmas": False,
        "use_exponential_sigmas": False, "use_beta_sigmas": False, "use_flow_sigmas": False, "flow_shift": 1.0,
        "timestep_spacing": "linspace", "steps_offset": 0, "final_sigmas_type": "zero",
        "rescale_betas_zero_snr": False, "use_dynamic_shifting": False, "time_shift_type": "exponential",
        "sigma_min": None, "sigma_max": None, "shift_terminal": None,
    },
    "EulerDiscreteScheduler": {
        **_BETA, "prediction_type": "epsilon", "interpolation_type": "linear", "use_karras_sigmas": False,
        "use_exponential_sigmas": False, "use_beta_sigmas": False, "sigma_min": None, "sigma_max": None,
        "timestep_spacing": "linspace", "timestep_type": "discrete", "steps_offset": 0,
        "rescale_betas_zero_snr": False, "final_sigmas_type": "zero",
    },
    "EulerAncestralDiscreteScheduler": {
        **_BETA, "prediction_type": "epsilon", "timestep_spacing": "linspace", "steps_offset": 0,
        "rescale_betas_zero_snr": False,
    },
}
DEFAULTS["CogVideoXDPMScheduler"] = dict(DEFAULTS["CogVideoXDDIMScheduler"])
DEFAULTS["FlowMapEulerDiscreteScheduler"] = {"num_train_timesteps": 1000, "shift": 1.0}

#: diffusers' ``KarrasDiffusionSchedulers``: the classes whose ``__init__`` keys a Karras-compatible
#: scheduler's ``from_config`` drops from the init arguments (they stay as config attributes)
_KARRAS_COMPATIBLES = (
    "DDIMScheduler", "DDPMScheduler", "PNDMScheduler", "LMSDiscreteScheduler", "EulerDiscreteScheduler",
    "HeunDiscreteScheduler", "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler",
    "DPMSolverSinglestepScheduler", "KDPM2DiscreteScheduler", "KDPM2AncestralDiscreteScheduler",
    "DEISMultistepScheduler", "UniPCMultistepScheduler", "DPMSolverSDEScheduler", "EDMEulerScheduler",
)


class _Config(dict[str, Any]):
    """A scheduler's config as ``from_config`` resolves it: the class defaults, updated with the
    saved config's values for the class's own keys; ``extra`` holds the saved config's other keys
    (diffusers registers them as config attributes: ``hasattr(config, "sigma_min")`` reads them)."""

    extra: JsonObject


def resolve_config(class_name: str, config: JsonMap) -> _Config:
    """The config ``class_name.from_config(config)`` would run with (see :class:`_Config`).

    Keys the saved config lists in ``_use_default_values`` take the class default, as in diffusers.
    """
    if class_name not in DEFAULTS:
        raise SamplerError(f"scheduler class {class_name!r} is not implemented (implemented: {', '.join(SCHEDULERS)})")
    defaults = DEFAULTS[class_name]
    used_defaults = set(config.get("_use_default_values") or ())
    given = {k: v for k, v in config.items() if k not in used_defaults and k != "_use_default_values"}
    cfg = _Config(defaults)
    cfg.extra = {}
    for k, v in given.items():
        if k in defaults:
            cfg[k] = v
        elif not k.startswith("_"):
            cfg.extra[k] = v
    return cfg


def _copy_config(cfg: _Config) -> _Config:
    """A copy a scheduler may rewrite (diffusers rewrites its own config: ``deis`` -> ``dpmsolver++``, mu's shift)."""
    out = _Config(cfg)
    out.extra = dict(cfg.extra)
    return out


def _extra_number(cfg: _Config, key: str) -> float | None:
    """A config attribute diffusers reads with ``hasattr(self.config, key)`` (``sigma_min``/``sigma_max``)."""
    v = cfg[key] if key in cfg else cfg.extra.get(key)
    return None if v is None else float(v)


_BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
_SPACINGS = ("linspace", "leading", "trailing")


def _type_refusals(class_name: str, cfg: _Config) -> list[str]:
    """Values whose JSON type is not the one the default has (a string shift, a float step count...)."""
    out = []
    for k, default in DEFAULTS[class_name].items():
        v = cfg[k]
        if v is None and default is None:
            continue
        if k == "trained_betas":
            ok = isinstance(v, (list, tuple)) and len(v) > 0 and all(_is_number(b) for b in v)
        elif k in ("shift_terminal", "sigma_min", "sigma_max", "base_shift", "max_shift"):
            ok = v is None or _is_number(v)
        elif k == "variance_type":
            ok = v is None or isinstance(v, str)
        elif k == "disable_corrector":
            ok = isinstance(v, (list, tuple)) and all(_is_int(i) for i in v)
        elif k == "solver_p":
            ok = v is None
        elif isinstance(default, bool):
            ok = isinstance(v, bool)
        elif isinstance(default, int):
            ok = _is_int(v)
        elif isinstance(default, float):
            ok = _is_number(v) and (not math.isnan(float(v)))
        elif isinstance(default, str):
            ok = isinstance(v, str)
        else:  # pragma: no cover - every default above is one of these types
            ok = True
        if not ok:
            out.append(_fmt(k, v))
    return out


#: a bound on the training schedule's length: beyond it a config is refused, not allocated
MAX_TRAIN_TIMESTEPS = 100_000


def _train_steps(cfg: _Config, least: int) -> list[str]:
    n = cfg["num_train_timesteps"]
    return [] if least <= n <= MAX_TRAIN_TIMESTEPS else [_fmt("num_train_timesteps", n)]


def _beta_refusals(cfg: _Config, schedules: Sequence[str] = _BETA_SCHEDULES) -> list[str]:
    out = _train_steps(cfg, 2)
    if cfg["trained_betas"] is None and cfg["beta_schedule"] not in schedules:
        out.append(_fmt("beta_schedule", cfg["beta_schedule"]))
    if cfg["trained_betas"] is not None and len(cfg["trained_betas"]) != cfg["num_train_timesteps"]:
        # diffusers sizes alphas_cumprod by the betas and the timesteps by num_train_timesteps
        out.append(_fmt("trained_betas", f"{len(cfg['trained_betas'])} values"))
    return out


def _choice(cfg: _Config, key: str, choices: Sequence[Any]) -> list[str]:
    return [] if cfg[key] in choices else [_fmt(key, cfg[key])]


def _sigma_kinds(cfg: _Config) -> list[str]:
    """``use_beta_sigmas`` needs scipy's beta ppf (the board has no scipy); two kinds at once diffusers refuses."""
    out = []
    if cfg.get("use_beta_sigmas"):
        out.append(_fmt("use_beta_sigmas", True))
    kinds = [k for k in ("use_karras_sigmas", "use_exponential_sigmas") if cfg.get(k)]
    if len(kinds) + bool(cfg.get("use_beta_sigmas")) > 1:
        out.extend(_fmt(k, True) for k in kinds)
    return out


def _refusals(class_name: str, cfg: _Config) -> list[str]:
    out = _type_refusals(class_name, cfg)
    if out:
        return out
    if class_name == "FlowMatchEulerDiscreteScheduler":
        return _train_steps(cfg, 1) + _sigma_kinds(cfg) + _choice(cfg, "time_shift_type", ("exponential", "linear"))
    if class_name == "FlowMapEulerDiscreteScheduler":
        return _train_steps(cfg, 1)
    if class_name == "DPMSolverMultistepScheduler":
        algo = cfg["algorithm_type"]
        out += _beta_refusals(cfg) + _sigma_kinds(cfg) + _choice(cfg, "timestep_spacing", _SPACINGS)
        out += _choice(cfg, "algorithm_type", ("dpmsolver", "dpmsolver++", "sde-dpmsolver", "sde-dpmsolver++", "deis"))
        out += _choice(cfg, "solver_type", ("midpoint", "heun", "logrho", "bh1", "bh2"))
        out += _choice(cfg, "solver_order", (1, 2, 3))
        out += _choice(cfg, "final_sigmas_type", ("zero", "sigma_min"))
        out += _choice(cfg, "variance_type", (None, "learned", "learned_range"))
        out += _choice(cfg, "time_shift_type", ("exponential",))
        noise_pred = algo in ("dpmsolver", "sde-dpmsolver")
        out += _choice(cfg, "prediction_type", ("epsilon", "sample", "v_prediction")
                       + (() if noise_pred else ("flow_prediction",)))
        if algo not in ("dpmsolver++", "sde-dpmsolver++") and cfg["final_sigmas_type"] == "zero":
            out.append(_fmt("final_sigmas_type", "zero"))  # diffusers refuses it with dpmsolver (and deis)
        if algo == "sde-dpmsolver" and cfg["solver_order"] == 3:
            out.append(_fmt("solver_order", 3))  # diffusers has no third-order sde-dpmsolver update
        return out
    if class_name in ("DDIMScheduler", "DDPMScheduler"):
        out += _beta_refusals(cfg, (*_BETA_SCHEDULES, "laplace") if class_name == "DDPMScheduler" else _BETA_SCHEDULES)
        out += _choice(cfg, "timestep_spacing", _SPACINGS)
        out += _choice(cfg, "prediction_type", ("epsilon", "sample", "v_prediction"))
        if class_name == "DDPMScheduler":
            # fixed_large_log takes the square root of a negative log: NaN in diffusers
            out += _choice(cfg, "variance_type", ("fixed_small", "fixed_small_log", "fixed_large", "learned",
                                                  "learned_range"))
        return out
    if class_name in ("CogVideoXDDIMScheduler", "CogVideoXDPMScheduler"):
        out += _beta_refusals(cfg) + _choice(cfg, "timestep_spacing", _SPACINGS)
        out += _choice(cfg, "prediction_type", ("epsilon", "sample", "v_prediction"))
        return out
    if class_name == "UniPCMultistepScheduler":
        out += _beta_refusals(cfg) + _sigma_kinds(cfg) + _choice(cfg, "timestep_spacing", _SPACINGS)
        out += _choice(cfg, "solver_type", ("bh1", "bh2", "midpoint", "heun", "logrho"))
        out += _choice(cfg, "final_sigmas_type", ("zero", "sigma_min"))
        out += _choice(cfg, "time_shift_type", ("exponential", "linear"))
        if cfg["solver_order"] < 1:
            out.append(_fmt("solver_order", cfg["solver_order"]))
        out += _choice(cfg, "prediction_type", ("epsilon", "sample", "v_prediction")
                       + (("flow_prediction",) if cfg["predict_x0"] else ()))
        if cfg["final_sigmas_type"] == "zero":
            # a final sigma of zero makes lambda infinite: with these diffusers' last step returns NaN
            # (inf * 0 in the bh1 or noise-prediction update, a zero step ratio without lower_order_final)
            if cfg["solver_type"] == "bh1":
                out.append(_fmt("solver_type", "bh1"))
            if not cfg["predict_x0"]:
                out.append(_fmt("predict_x0", False))
            if not cfg["lower_order_final"] and cfg["solver_order"] > 1:
                out.append(_fmt("lower_order_final", False))
        if cfg["shift_terminal"] is not None and not cfg["use_flow_sigmas"]:
            out.append(_fmt("shift_terminal", cfg["shift_terminal"]))  # diffusers refuses it without flow sigmas
        return out
    if class_name == "EulerDiscreteScheduler":
        out += _beta_refusals(cfg) + _sigma_kinds(cfg) + _choice(cfg, "timestep_spacing", _SPACINGS)
        out += _choice(cfg, "prediction_type", ("epsilon", "v_prediction", "sample", "original_sample"))
        out += _choice(cfg, "final_sigmas_type", ("zero", "sigma_min"))
        # log_linear interpolates with torch's float32 exp; continuous v timesteps are 0.25*log(sigma) in float32
        out += _choice(cfg, "interpolation_type", ("linear",))
        if cfg["timestep_type"] != "discrete" and not (cfg["timestep_type"] == "continuous"
                                                       and cfg["prediction_type"] != "v_prediction"):
            out.append(_fmt("timestep_type", cfg["timestep_type"]))
        return out
    if class_name == "EulerAncestralDiscreteScheduler":
        out += _beta_refusals(cfg) + _choice(cfg, "timestep_spacing", _SPACINGS)
        out += _choice(cfg, "prediction_type", ("epsilon", "v_prediction"))
        return out
    raise AssertionError(class_name)  # pragma: no cover - SCHEDULERS and DEFAULTS agree


def unsupported(class_name: str, config: JsonMap) -> list[str]:
    """The options of ``config`` (a ``scheduler_config.json``) this module does not reproduce, each
    as ``key=value`` with the value as JSON; ``[class_name]`` when the class is not implemented;
    ``[]`` when :func:`make_scheduler` reproduces the scheduler."""
    if class_name not in SCHEDULERS:
        return [class_name]
    if not isinstance(config, Mapping):
        return [f"config={type(config).__name__}"]
    return _refusals(class_name, resolve_config(class_name, config))


# ---------------------------------------------------------------------------------------------
# the schedulers


def _noise(fn: NoiseFn | None, shape: tuple[int, ...], cls: str) -> np.ndarray:
    if fn is None:
        raise SamplerError(f"{cls}.step draws noise here: pass generator_noise")
    n = np.asarray(fn(tuple(int(d) for d in shape)))
    if n.shape != tuple(shape):
        raise SamplerError(f"generator_noise returned shape {n.shape}, expected {tuple(shape)}")
    return n.astype(F64)


def _betas(cfg: _Config) -> np.ndarray:
    """The float32 betas of the DDPM family's ``__init__``."""
    n = cfg["num_train_timesteps"]
    if cfg["trained_betas"] is not None:
        return np.array(cfg["trained_betas"], F64).astype(F32)
    sched = cfg["beta_schedule"]
    if sched == "linear":
        return torch_linspace(cfg["beta_start"], cfg["beta_end"], n, F32)
    if sched == "scaled_linear":
        r = torch_linspace(cfg["beta_start"] ** 0.5, cfg["beta_end"] ** 0.5, n, F32)
        return (r * r).astype(F32)
    if sched == "squaredcos_cap_v2":
        return betas_for_alpha_bar(n)
    return betas_for_alpha_bar(n, alpha_transform_type="laplace")


class Scheduler:
    """A diffusers scheduler, minus torch: same construction, ``set_timesteps``, ``timesteps``,
    ``sigmas`` (where the class has them), ``init_noise_sigma``, ``scale_model_input`` and ``step``."""

    class_name = ""
    #: model calls per step (diffusers' ``order``; every class here is 1)
    order = 1

    def __init__(self, config: _Config) -> None:
        self.config = config
        self.num_inference_steps: int | None = None
        #: int64 for the DDPM family and the multistep solvers, float32 for the Euler family
        self.timesteps: np.ndarray = np.zeros(0, np.int64)
        self.sigmas: np.ndarray | None = None
        self._step_index: int | None = None

    @property
    def init_noise_sigma(self) -> float:
        """What the pipeline multiplies fresh noise by (``latent.init == "init_noise_sigma"``)."""
        return 1.0

    @property
    def step_index(self) -> int | None:
        return self._step_index

    def set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                      mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        """diffusers' ``set_timesteps`` (``device`` aside): ``timesteps``/``sigmas`` for ``num_inference_steps``,
        or for the custom ``sigmas``/``timesteps`` given; ``mu`` where the class shifts dynamically."""
        if num_inference_steps is not None:
            self._check_steps(num_inference_steps)
        for name, arr in (("sigmas", sigmas), ("timesteps", timesteps)):
            if arr is not None:
                a = np.asarray(arr)
                if a.ndim != 1 or not np.issubdtype(a.dtype, np.number) or not np.isfinite(a).all():
                    raise SamplerError(f"{self.class_name}: {name} must be a 1-D array of finite numbers")
                self._check_steps(len(a))
        if mu is not None and (isinstance(mu, bool) or not isinstance(mu, (int, float, np.number))
                               or not np.isfinite(mu)):
            raise SamplerError(f"{self.class_name}: mu must be a finite number, got {mu!r}")
        self._set_timesteps(num_inference_steps, sigmas=sigmas, mu=mu, timesteps=timesteps)

    def _set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                       mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        raise NotImplementedError

    def scale_model_input(self, sample: np.ndarray, t: Scalar | None = None) -> np.ndarray:
        return sample

    def step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray, *,
             generator_noise: NoiseFn | None = None) -> np.ndarray:
        """One denoising step: ``prev_sample`` from the model's output at timestep ``t``.

        ``t`` is ``timesteps[i]`` of step i.  ``generator_noise(shape)`` is called where diffusers
        draws ``randn_tensor`` (the stochastic samplers); deterministic ones never call it.
        """
        if self._step_index is not None and self._step_index >= len(self.timesteps):
            raise SamplerError(f"{self.class_name}: step {self._step_index + 1} of {len(self.timesteps)} timesteps")
        # diffusers' torch scalars turn a zero sigma into inf/NaN silently; so does NumPy here
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            try:
                return self._step(np.asarray(model_output), t, np.asarray(sample), generator_noise)
            except ValueError as e:
                if isinstance(e, SamplerError) or "broadcast" not in str(e):
                    raise
                raise SamplerError(f"{self.class_name}.step: model_output {np.shape(model_output)} does not fit "
                                   f"sample {np.shape(sample)}") from None

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        raise NotImplementedError

    # diffusers' ``index_for_timestep`` and ``_init_step_index``: the first step finds its index
    # from t (the second match when t repeats, for image-to-image), later steps count on
    def _index_for_timestep(self, t: Scalar, missing_is_last: bool) -> int:
        hits = np.nonzero(self.timesteps == np.asarray(t).item())[0]
        if len(hits) == 0:
            if missing_is_last:
                return len(self.timesteps) - 1
            raise SamplerError(f"timestep {np.asarray(t).item()!r} is not one of the scheduler's timesteps")
        return int(hits[1] if len(hits) > 1 else hits[0])

    def _init_step_index(self, t: Scalar, missing_is_last: bool = False) -> None:
        if self._step_index is None:
            self._step_index = self._index_for_timestep(t, missing_is_last)

    def _need_timesteps(self) -> None:
        if self.num_inference_steps is None:
            raise SamplerError(f"{self.class_name}: call set_timesteps before step")

    def _no_args(self, **kw: Any) -> None:
        bad = [k for k, v in kw.items() if v is not None]
        if bad:
            raise SamplerError(f"{self.class_name}.set_timesteps does not take {', '.join(bad)}")

    def _check_steps(self, n: Scalar) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_TRAIN_TIMESTEPS:
            raise SamplerError(f"{self.class_name}: num_inference_steps must be an integer in "
                               f"[1, {MAX_TRAIN_TIMESTEPS}], got {n!r}")


def _time_shift(kind: str, mu: float, sigma: float, t: Scalar | np.ndarray) -> Any:
    if kind == "exponential":
        return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** sigma)
    return mu / (mu + (1 / t - 1) ** sigma)


def _f32_time_shift(kind: str, mu: float, t: np.ndarray) -> np.ndarray:
    """:func:`_time_shift` on a float32 array as NumPy 2 computes it (Python scalars stay float32)."""
    c = F32(math.exp(mu) if kind == "exponential" else mu)
    return (c / (c + ((F32(1) / t).astype(F32) - F32(1)) ** F32(1.0))).astype(F32)


def _stretch_to_terminal(t: np.ndarray, shift_terminal: float) -> np.ndarray:
    """``stretch_shift_to_terminal``, in ``t``'s dtype (NumPy 2 keeps float32 with Python scalars)."""
    dt = t.dtype.type
    one_minus_z = (dt(1) - t).astype(t.dtype)
    if one_minus_z[-1] == 0:  # one step: diffusers divides 0 by 0 (NaN), the caller refuses that
        return np.full_like(t, np.nan)
    scale_factor = dt(one_minus_z[-1] / dt(1 - shift_terminal))
    return (dt(1) - (one_minus_z / scale_factor).astype(t.dtype)).astype(t.dtype)


class FlowMatchEulerDiscreteScheduler(Scheduler):
    """Euler over flow-matching sigmas (SD3, Flux, AuraFlow, Lumina2, HunyuanVideo, CogView4, ...)."""

    class_name = "FlowMatchEulerDiscreteScheduler"

    def __init__(self, config: _Config) -> None:
        super().__init__(config)
        n_train, shift = config["num_train_timesteps"], float(config["shift"])
        ts = np.linspace(1, n_train, n_train, dtype=F32)[::-1].copy()
        sig = (ts / F32(n_train)).astype(F32)
        if not config["use_dynamic_shifting"]:
            sig = ((F32(shift) * sig).astype(F32) / (F32(1) + (F32(shift - 1) * sig).astype(F32))).astype(F32)
        self.timesteps = (sig * F32(n_train)).astype(F32)
        self.sigmas = sig
        self.sigma_min, self.sigma_max = float(sig[-1]), float(sig[0])
        self.shift = shift

    def _set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                       mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        cfg = self.config
        n_train = cfg["num_train_timesteps"]
        if cfg["use_dynamic_shifting"] and mu is None:
            raise SamplerError("`mu` must be passed when `use_dynamic_shifting` is set to be `True`")
        if sigmas is not None and timesteps is not None and len(sigmas) != len(timesteps):
            raise SamplerError("`sigmas` and `timesteps` should have the same length")
        if num_inference_steps is not None:
            if (sigmas is not None and len(sigmas) != num_inference_steps) or (
                    timesteps is not None and len(timesteps) != num_inference_steps):
                raise SamplerError("`sigmas` and `timesteps` should have the same length as num_inference_steps")
        elif sigmas is None and timesteps is None:
            raise SamplerError("pass num_inference_steps, sigmas or timesteps")
        else:
            num_inference_steps = len(sigmas) if sigmas is not None else len(timesteps)  # type: ignore[arg-type]
        self.num_inference_steps = num_inference_steps
        given_ts = np.array(timesteps).astype(F32) if timesteps is not None else None
        if sigmas is None:
            if given_ts is None:
                # NumPy float64 from here on, as diffusers computes it
                ts64 = np.linspace(self.sigma_max * n_train, self.sigma_min * n_train, num_inference_steps)
                sig: np.ndarray = ts64 / n_train
            else:
                sig = (given_ts / F32(n_train)).astype(F32)
        else:
            sig = np.array(sigmas).astype(F32)
            num_inference_steps = len(sig)
        if cfg["use_dynamic_shifting"]:
            assert mu is not None
            if sig.dtype == F32:
                sig = _f32_time_shift(cfg["time_shift_type"], float(mu), sig)
            else:
                sig = _time_shift(cfg["time_shift_type"], float(mu), 1.0, sig)
        elif sig.dtype == F32:
            s = self.shift
            sig = ((F32(s) * sig).astype(F32) / (F32(1) + (F32(s - 1) * sig).astype(F32))).astype(F32)
        else:
            s = self.shift
            sig = s * sig / (1 + (s - 1) * sig)
        if cfg["shift_terminal"]:
            sig = _stretch_to_terminal(sig, float(cfg["shift_terminal"]))
        lo, hi = _extra_number(cfg, "sigma_min"), _extra_number(cfg, "sigma_max")
        lo = float(sig[-1]) if lo is None else lo
        hi = float(sig[0]) if hi is None else hi
        if cfg["use_karras_sigmas"]:
            sig = _karras(lo, hi, num_inference_steps)
        elif cfg["use_exponential_sigmas"]:
            sig = _exponential(lo, hi, num_inference_steps)
        sig32 = np.asarray(sig).astype(F32)
        if not np.isfinite(sig32).all():
            # shift_terminal over one step divides 0 by 0: diffusers' loop then finds no timestep
            raise SamplerError(f"{self.class_name}: the sigmas of {num_inference_steps} step(s) are not finite")
        ts32 = given_ts if given_ts is not None else (sig32 * F32(n_train)).astype(F32)
        if cfg["invert_sigmas"]:
            sig32 = (F32(1.0) - sig32).astype(F32)
            ts32 = (sig32 * F32(n_train)).astype(F32)
            sig32 = np.concatenate([sig32, np.ones(1, F32)])
        else:
            sig32 = np.concatenate([sig32, np.zeros(1, F32)])
        self.timesteps, self.sigmas = ts32, sig32
        self._step_index = None

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        if np.issubdtype(np.asarray(t).dtype, np.integer):
            raise SamplerError("pass one of scheduler.timesteps as t, not an integer index")
        self._init_step_index(t)
        assert self._step_index is not None and self.sigmas is not None
        sigma, sigma_next = self.sigmas[self._step_index], self.sigmas[self._step_index + 1]
        x = np.asarray(sample).astype(F32).astype(F64)
        v = np.asarray(model_output).astype(F64)
        if self.config["stochastic_sampling"]:
            x0 = x - F64(sigma) * v
            noise = _noise(generator_noise, x.shape, self.class_name)
            prev = (1.0 - F64(sigma_next)) * x0 + F64(sigma_next) * noise
        else:
            prev = x + F64(F32(sigma_next - sigma)) * v
        self._step_index += 1
        return prev.astype(np.asarray(model_output).dtype)


class FlowMapEulerDiscreteScheduler(Scheduler):
    """AnyFlow's flow-map Euler: ``x - (sigma_t - sigma_r) * u`` with r the next sigma (float64 schedule)."""

    class_name = "FlowMapEulerDiscreteScheduler"

    def __init__(self, config: _Config) -> None:
        super().__init__(config)
        self.set_timesteps(config["num_train_timesteps"])
        self.num_inference_steps = None

    def _set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                       mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        self._no_args(mu=mu)
        n_train, shift = self.config["num_train_timesteps"], float(self.config["shift"])
        if sigmas is not None and timesteps is not None and len(sigmas) != len(timesteps):
            raise SamplerError("`sigmas` and `timesteps` should have the same length")
        if num_inference_steps is None:
            if sigmas is None and timesteps is None:
                raise SamplerError("pass num_inference_steps, sigmas or timesteps")
            num_inference_steps = len(sigmas) if sigmas is not None else len(timesteps)  # type: ignore[arg-type]
        elif any(a is not None and len(a) != num_inference_steps for a in (sigmas, timesteps)):
            raise SamplerError("`sigmas` and `timesteps` should have the same length as `num_inference_steps`")
        if sigmas is not None:
            work = np.array(sigmas, F64)
        elif timesteps is not None:
            work = np.array(timesteps, F64) / n_train
        else:
            work = torch_linspace(1.0, 0.0, num_inference_steps + 1, F64)[:-1]
        if shift != 1.0:
            work = shift * work / (1 + (shift - 1) * work)
        self.num_inference_steps = num_inference_steps
        self.sigmas = np.concatenate([work, np.zeros(1)])
        self.timesteps = self.sigmas[:-1] * n_train
        self._step_index = None

    def _index(self, t: Scalar) -> int:
        # diffusers: the nearest timestep in float32, if within 1e-3
        diffs = np.abs(self.timesteps.astype(F32) - F32(np.asarray(t, F64).ravel()[0])).astype(F32)
        i = int(diffs.argmin())
        if diffs[i] > 1e-3:
            raise SamplerError(f"timestep {np.asarray(t).ravel()[0]!r} is not on the schedule (no r_timestep here)")
        return i

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        assert self.sigmas is not None
        if self._step_index is None:
            self._step_index = self._index(t)
        i = self._index(t)
        # a 0-d float64 tensor times float32 ones: torch rounds the coefficient to float32
        c = self.sigmas[i] - self.sigmas[i + 1]
        if model_output.dtype == F32:
            c = F64(F32(c))
        prev = sample.astype(F64) - c * model_output.astype(F64)
        self._step_index += 1
        return prev.astype(model_output.dtype)


class _AlphaScheduler(Scheduler):
    """The DDPM family: betas -> alphas_cumprod (float32 as diffusers' torch tensors)."""

    def __init__(self, config: _Config) -> None:
        super().__init__(config)
        betas = _betas(config)
        if config["rescale_betas_zero_snr"]:
            betas = rescale_zero_terminal_snr(betas)
        self.betas = betas
        self.alphas = (F32(1.0) - betas).astype(F32)
        self.alphas_cumprod = _cumprod(self.alphas)


class DDIMScheduler(_AlphaScheduler):
    """DDIM with ``eta = 0`` (what pipelines pass by default): deterministic (DiT, Latte)."""

    class_name = "DDIMScheduler"

    def __init__(self, config: _Config) -> None:
        super().__init__(config)
        self.final_alpha_cumprod = F32(1.0) if config["set_alpha_to_one"] else self.alphas_cumprod[0]
        n = config["num_train_timesteps"]
        self.timesteps = np.arange(0, n)[::-1].copy().astype(np.int64)

    def _set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                       mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        self._no_args(sigmas=sigmas, mu=mu, timesteps=timesteps)
        n_train = self.config["num_train_timesteps"]
        if num_inference_steps is None or num_inference_steps > n_train or num_inference_steps < 1:
            raise SamplerError(f"num_inference_steps must be in [1, {n_train}], got {num_inference_steps}")
        self.num_inference_steps = num_inference_steps
        self.timesteps = _spaced_timesteps(self.config["timestep_spacing"], n_train, num_inference_steps,
                                           self.config["steps_offset"])

    def _x0_eps(self, v: np.ndarray, x: np.ndarray, a_t: Scalar) -> tuple[np.ndarray, np.ndarray]:
        b_t = 1 - a_t
        kind = self.config["prediction_type"]
        if kind == "epsilon":
            return (x - b_t ** 0.5 * v) / a_t ** 0.5, v
        if kind == "sample":
            return v, (x - a_t ** 0.5 * v) / b_t ** 0.5
        return a_t ** 0.5 * x - b_t ** 0.5 * v, a_t ** 0.5 * v + b_t ** 0.5 * x

    def _clip(self, x0: np.ndarray) -> np.ndarray:
        cfg = self.config
        if cfg.get("thresholding"):
            return _threshold_sample(x0, cfg["dynamic_thresholding_ratio"], cfg["sample_max_value"])
        if cfg["clip_sample"]:
            r = cfg["clip_sample_range"]
            return np.clip(x0, -r, r)
        return x0

    def _alphas(self, t: int, prev_t: int) -> tuple[Any, Any]:
        a_t = F64(self.alphas_cumprod[t])
        a_prev = F64(self.alphas_cumprod[prev_t] if prev_t >= 0 else self.final_alpha_cumprod)
        return a_t, a_prev

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        self._need_timesteps()
        assert self.num_inference_steps is not None
        t = int(np.asarray(t).item())
        prev_t = t - self.config["num_train_timesteps"] // self.num_inference_steps
        a_t, a_prev = self._alphas(t, prev_t)
        x, v = np.asarray(sample).astype(F64), np.asarray(model_output).astype(F64)
        x0, eps = self._x0_eps(v, x, a_t)
        x0 = self._clip(x0)
        prev = a_prev ** 0.5 * x0 + (1 - a_prev) ** 0.5 * eps
        return prev.astype(np.result_type(sample, model_output))


class CogVideoXDDIMScheduler(DDIMScheduler):
    """CogVideoX's DDIM: an SNR-shifted ``alphas_cumprod`` and its own update (CogVideoX-2b, CogView3-Plus)."""

    class_name = "CogVideoXDDIMScheduler"

    def __init__(self, config: _Config) -> None:
        Scheduler.__init__(self, config)
        n = config["num_train_timesteps"]
        if config["trained_betas"] is None and config["beta_schedule"] == "scaled_linear":
            # CogVideoX's own scaled_linear is float64 end to end
            r = torch_linspace(config["beta_start"] ** 0.5, config["beta_end"] ** 0.5, n, F64)
            betas = r * r
        else:
            betas = _betas(config)
        dt = betas.dtype.type
        alphas = (dt(1.0) - betas).astype(betas.dtype)
        ac = np.cumprod(alphas.astype(F64)).astype(betas.dtype)
        snr = float(config["snr_shift_scale"])
        ac = (ac / (dt(snr) + (dt(1 - snr) * ac).astype(ac.dtype)).astype(ac.dtype)).astype(ac.dtype)
        if config["rescale_betas_zero_snr"]:
            root = np.sqrt(ac.astype(F64)).astype(ac.dtype)
            r0, rt = root[0], root[-1]
            root = (root - rt).astype(ac.dtype)
            root = (root * dt(r0 / dt(r0 - rt))).astype(ac.dtype)
            ac = (root * root).astype(ac.dtype)
        self.alphas_cumprod = ac
        self.final_alpha_cumprod = dt(1.0) if config["set_alpha_to_one"] else ac[0]
        self.timesteps = np.arange(0, n)[::-1].copy().astype(np.int64)

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        self._need_timesteps()
        assert self.num_inference_steps is not None
        t = int(np.asarray(t).item())
        prev_t = t - self.config["num_train_timesteps"] // self.num_inference_steps
        a_t, a_prev = self._alphas(t, prev_t)
        x, v = np.asarray(sample).astype(F64), np.asarray(model_output).astype(F64)
        x0, _ = self._x0_eps(v, x, a_t)
        a = ((1 - a_prev) / (1 - a_t)) ** 0.5
        b = a_prev ** 0.5 - a_t ** 0.5 * a
        prev = a * x + b * x0
        # diffusers' float64 alphas are 0-d tensors: they do not promote the float32 sample
        return prev.astype(np.result_type(sample, model_output))


class CogVideoXDPMScheduler(CogVideoXDDIMScheduler):
    """CogVideoX's stochastic DPM-Solver (CogVideoX-5b, ConsisID): two noise draws per step after the first."""

    class_name = "CogVideoXDPMScheduler"

    def _set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                       mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        super()._set_timesteps(num_inference_steps, sigmas=sigmas, mu=mu, timesteps=timesteps)
        # the pipeline passes step i the previous x0 and timesteps[i - 1]; this object keeps them
        self._old_x0: np.ndarray | None = None
        self._t_back: int | None = None

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        self._need_timesteps()
        assert self.num_inference_steps is not None
        t = int(np.asarray(t).item())
        prev_t = t - self.config["num_train_timesteps"] // self.num_inference_steps
        a_t, a_prev = self._alphas(t, prev_t)
        a_back = float(self.alphas_cumprod[self._t_back]) if self._t_back is not None else None
        x, v = np.asarray(sample).astype(F64), np.asarray(model_output).astype(F64)
        x0, _ = self._x0_eps(v, x, a_t)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # the last step has a_prev == 1: lambda_next = inf, and diffusers' torch scalars return
            # inf/0 silently where Python floats would raise
            at, ap = F64(a_t), F64(a_prev)
            lamb = np.log((at / (1 - at)) ** 0.5)
            lamb_next = np.log((ap / (1 - ap)) ** 0.5)
            h = lamb_next - lamb
            mult1 = ((1 - ap) / (1 - at)) ** 0.5 * np.exp(-h)
            mult2 = np.expm1(-2 * h) * ap ** 0.5
            mult_noise = (1 - ap) ** 0.5 * (1 - np.exp(-2 * h)) ** 0.5
            noise = _noise(generator_noise, x.shape, self.class_name)
            prev = mult1 * x - mult2 * x0 + mult_noise * noise
            if self._old_x0 is not None and prev_t >= 0 and a_back is not None:
                h_last = lamb - np.log((F64(a_back) / (1 - F64(a_back))) ** 0.5)
                r = h_last / h
                mult3, mult4 = 1 + 1 / (2 * r), 1 / (2 * r)
                denoised_d = mult3 * x0 - mult4 * self._old_x0
                noise = _noise(generator_noise, x.shape, self.class_name)
                prev = mult1 * x - mult2 * denoised_d + mult_noise * noise
        self._old_x0, self._t_back = x0, t
        # diffusers' float64 alphas are 0-d tensors: they do not promote the float32 sample
        return prev.astype(np.result_type(sample, model_output))


class DDPMScheduler(DDIMScheduler):
    """DDPM ancestral sampling (HunyuanDiT): the variance noise comes from ``generator_noise``."""

    class_name = "DDPMScheduler"

    def __init__(self, config: _Config) -> None:
        _AlphaScheduler.__init__(self, config)
        self.custom_timesteps = False
        self.timesteps = np.arange(0, config["num_train_timesteps"])[::-1].copy().astype(np.int64)

    def _set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                       mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        self._no_args(sigmas=sigmas, mu=mu)
        n_train = self.config["num_train_timesteps"]
        if num_inference_steps is not None and timesteps is not None:
            raise SamplerError("Can only pass one of `num_inference_steps` or `timesteps`")
        if timesteps is not None:
            ts = [int(x) for x in timesteps]
            if any(ts[i] >= ts[i - 1] for i in range(1, len(ts))) or not ts or ts[0] >= n_train:
                raise SamplerError("custom timesteps must descend from below num_train_timesteps")
            self.timesteps = np.array(ts, np.int64)
            self.custom_timesteps = True
            # diffusers leaves num_inference_steps unset with custom timesteps; step needs none
            self.num_inference_steps = None
            return
        super()._set_timesteps(num_inference_steps)
        self.custom_timesteps = False

    def _prev(self, t: int) -> int:
        if self.custom_timesteps or self.num_inference_steps:
            hits = np.nonzero(self.timesteps == t)[0]
            if len(hits) == 0:
                raise SamplerError(f"timestep {t} is not one of the scheduler's timesteps")
            i = int(hits[0])
            return -1 if i == len(self.timesteps) - 1 else int(self.timesteps[i + 1])
        return t - 1

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        t = int(np.asarray(t).item())
        prev_t = self._prev(t)
        cfg = self.config
        kind = cfg["variance_type"]
        mo, x = np.asarray(model_output), np.asarray(sample)
        pred_var = None
        if mo.shape[1] == x.shape[1] * 2 and kind in ("learned", "learned_range"):
            mo, pv = mo[:, : x.shape[1]], mo[:, x.shape[1]:]
            pred_var = pv.astype(F64)
        a_t = F64(self.alphas_cumprod[t])
        a_prev = F64(self.alphas_cumprod[prev_t]) if prev_t >= 0 else F64(1.0)
        b_t, b_prev = 1 - a_t, 1 - a_prev
        cur_alpha = a_t / a_prev
        cur_beta = 1 - cur_alpha
        v, x64 = mo.astype(F64), x.astype(F64)
        x0, _ = self._x0_eps(v, x64, a_t)
        x0 = self._clip(x0)
        prev = (a_prev ** 0.5 * cur_beta / b_t) * x0 + (cur_alpha ** 0.5 * b_prev / b_t) * x64
        if t > 0:
            noise = _noise(generator_noise, mo.shape, self.class_name)
            variance = np.maximum(b_prev / b_t * cur_beta, F64(1e-20))
            if kind == "fixed_small_log":
                prev = prev + np.exp(0.5 * np.log(variance)) * noise
            elif kind == "learned_range":
                assert pred_var is not None, "learned_range needs the learned variance channels"
                frac = (pred_var + 1) / 2
                log_var = frac * np.log(cur_beta) + (1 - frac) * np.log(variance)
                prev = prev + np.exp(0.5 * log_var) * noise
            elif kind == "learned":
                assert pred_var is not None, "learned needs the learned variance channels"
                prev = prev + pred_var ** 0.5 * noise
            else:
                var = variance if kind == "fixed_small" else cur_beta
                prev = prev + var ** 0.5 * noise
        return prev.astype(np.result_type(x, mo))


class _SigmaMultistep(_AlphaScheduler):
    """DPM-Solver and UniPC's common part: sigmas over ``alphas_cumprod``, or flow sigmas."""

    def __init__(self, config: _Config) -> None:
        super().__init__(config)
        if config["rescale_betas_zero_snr"]:
            self.alphas_cumprod[-1] = F32(2.0 ** -24)
        ac64 = self.alphas_cumprod.astype(F64)
        # torch's float32 sqrt/log: within an ulp of these
        self.alpha_t = np.sqrt(ac64).astype(F32)
        self.sigma_t = np.sqrt((F32(1) - self.alphas_cumprod).astype(F32).astype(F64)).astype(F32)
        self.lambda_t = (np.log(self.alpha_t.astype(F64)).astype(F32)
                         - np.log(self.sigma_t.astype(F64)).astype(F32)).astype(F32)
        self._train_sigmas = self._sigmas_f32()
        self.model_outputs: list[np.ndarray | None] = [None] * config["solver_order"]
        self.lower_order_nums = 0

    def _sigmas_f32(self) -> np.ndarray:
        """``((1 - alphas_cumprod) / alphas_cumprod) ** 0.5`` as diffusers' float32 tensor."""
        ac = self.alphas_cumprod
        ratio = ((F32(1) - ac).astype(F32) / ac).astype(F32)
        return np.sqrt(ratio.astype(F64)).astype(F32)

    # Step arithmetic is NumPy float64 scalars, not Python floats: like diffusers' torch scalars,
    # a zero sigma gives inf/NaN where Python would raise (callers run under np.errstate).
    def _alpha_sigma(self, sigma: Scalar) -> tuple[Any, Any]:
        sigma = F64(sigma)
        if self.config["use_flow_sigmas"]:
            return 1 - sigma, sigma
        alpha = 1 / ((sigma ** 2 + 1) ** 0.5)
        return alpha, sigma * alpha

    def _lambda(self, sigma: Scalar) -> Any:
        a, s = self._alpha_sigma(sigma)
        return np.log(a) - np.log(s)

    def _karras_bounds(self, in_sigmas: np.ndarray) -> tuple[float, float]:
        lo, hi = _extra_number(self.config, "sigma_min"), _extra_number(self.config, "sigma_max")
        return (float(in_sigmas[-1]) if lo is None else lo), (float(in_sigmas[0]) if hi is None else hi)

    def _sigma_last(self) -> float:
        if self.config["final_sigmas_type"] == "zero":
            return 0.0
        ac0 = self.alphas_cumprod[0]
        return float(np.sqrt(F64(F32(F32(1) - ac0) / ac0)).astype(F32))

    def _x0(self, v: np.ndarray, x: np.ndarray, sigma: float) -> np.ndarray:
        kind = self.config["prediction_type"]
        if kind == "flow_prediction":
            return x - sigma * v
        if kind == "sample":
            return v
        a, s = self._alpha_sigma(sigma)
        if kind == "epsilon":
            return (x - s * v) / a
        return a * x - s * v

    def _eps(self, v: np.ndarray, x: np.ndarray, sigma: float) -> np.ndarray:
        kind = self.config["prediction_type"]
        if kind == "epsilon":
            return v
        a, s = self._alpha_sigma(sigma)
        if kind == "sample":
            return (x - a * v) / s
        return a * v + s * x

    def _threshold(self, x0: np.ndarray) -> np.ndarray:
        cfg = self.config
        return _threshold_sample(x0, cfg["dynamic_thresholding_ratio"], cfg["sample_max_value"])


class DPMSolverMultistepScheduler(_SigmaMultistep):
    """DPM-Solver(++) multistep, orders 1-3 (PixArt-α/Σ, Sana, Sana-Video)."""

    class_name = "DPMSolverMultistepScheduler"

    def __init__(self, config: _Config) -> None:
        config = _copy_config(config)
        if config["algorithm_type"] == "deis":
            config["algorithm_type"] = "dpmsolver++"
        if config["solver_type"] in ("logrho", "bh1", "bh2"):
            config["solver_type"] = "midpoint"
        super().__init__(config)
        n = config["num_train_timesteps"]
        self.timesteps = np.linspace(0, n - 1, n, dtype=F32)[::-1].copy()
        self.sigmas = self._train_sigmas

    def _set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                       mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        self._no_args(sigmas=sigmas)
        cfg = self.config
        if mu is not None:
            if not (cfg["use_dynamic_shifting"] and cfg["time_shift_type"] == "exponential"):
                raise SamplerError("mu needs use_dynamic_shifting with time_shift_type exponential")
            cfg["flow_shift"] = float(np.exp(mu))  # diffusers writes it into the config, for good
        if (num_inference_steps is None) == (timesteps is None):
            raise SamplerError("pass exactly one of num_inference_steps or timesteps")
        if timesteps is not None and any(cfg[k] for k in ("use_karras_sigmas", "use_lu_lambdas",
                                                          "use_exponential_sigmas", "use_beta_sigmas")):
            raise SamplerError("custom timesteps do not go with karras, lu, exponential or beta sigmas")
        n_train = cfg["num_train_timesteps"]
        if timesteps is not None:
            ts = np.array(timesteps).astype(np.int64)
        else:
            assert num_inference_steps is not None
            clipped = _searchsorted_left(self.lambda_t[::-1].copy(), F32(cfg["lambda_min_clipped"]))
            last = n_train - clipped
            spacing, n = cfg["timestep_spacing"], num_inference_steps
            if spacing == "linspace":
                ts = np.linspace(0, last - 1, n + 1).round()[::-1][:-1].copy().astype(np.int64)
            elif spacing == "leading":
                ratio = last // (n + 1)
                ts = (np.arange(0, n + 1) * ratio).round()[::-1][:-1].copy().astype(np.int64) + cfg["steps_offset"]
            else:
                ts = np.arange(last, 0, -(n_train / n)).round().copy().astype(np.int64) - 1
        sig = self._train_sigmas.copy()
        log_sigmas = np.log(sig)
        n = num_inference_steps if num_inference_steps is not None else len(ts)
        squaredcos = cfg["beta_schedule"] == "squaredcos_cap_v2"
        if cfg["use_karras_sigmas"]:
            flipped = np.flip(sig).copy()
            out = _karras(*self._karras_bounds(flipped), n)
            t_f = np.array([_sigma_to_t(s, log_sigmas) for s in out])
            ts = (t_f if squaredcos else t_f.round()).astype(np.int64)
        elif cfg["use_lu_lambdas"]:
            lambdas = np.flip(log_sigmas.copy())
            lmin, lmax = float(lambdas[-1]), float(lambdas[0])
            out = np.exp(lmax + np.linspace(0, 1, n) * (lmin - lmax))
            t_f = np.array([_sigma_to_t(s, log_sigmas) for s in out])
            ts = (t_f if squaredcos else t_f.round()).astype(np.int64)
        elif cfg["use_exponential_sigmas"]:
            flipped = np.flip(sig).copy()
            out = _exponential(*self._karras_bounds(flipped), n)
            ts = np.array([_sigma_to_t(s, log_sigmas) for s in out]).astype(np.int64)
        elif cfg["use_flow_sigmas"]:
            alphas = np.linspace(1, 1 / n_train, n + 1)
            s = 1.0 - alphas
            fs = float(cfg["flow_shift"])
            out = np.flip(fs * s / (1 + (fs - 1) * s))[:-1].copy()
            ts = (out * n_train).copy().astype(np.int64)
        else:
            out = np.interp(ts, np.arange(0, len(sig)), sig)
        self.sigmas = np.concatenate([np.asarray(out, F64), [self._sigma_last()]]).astype(F32)
        self.timesteps = ts.astype(np.int64)
        self.num_inference_steps = len(ts)
        self.model_outputs = [None] * cfg["solver_order"]
        self.lower_order_nums = 0
        self._step_index = None

    def _convert(self, v: np.ndarray, x: np.ndarray) -> np.ndarray:
        cfg = self.config
        assert self.sigmas is not None and self._step_index is not None
        sigma = F64(self.sigmas[self._step_index])
        if cfg["prediction_type"] == "epsilon" and cfg["variance_type"] in ("learned", "learned_range"):
            v = v[:, :3]  # diffusers keeps the first three channels: a pixel-space convention
        if cfg["algorithm_type"] in ("dpmsolver++", "sde-dpmsolver++"):
            x0 = self._x0(v, x, sigma)
            return self._threshold(x0) if cfg["thresholding"] else x0
        eps = self._eps(v, x, sigma)
        if cfg["thresholding"]:
            a, s = self._alpha_sigma(sigma)
            x0 = self._threshold((x - s * eps) / a)
            eps = (x - a * x0) / s
        return eps

    def _first_order(self, m: np.ndarray, x: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        assert self.sigmas is not None and self._step_index is not None
        i = self._step_index
        a_t, s_t = self._alpha_sigma(F64(self.sigmas[i + 1]))
        a_s, s_s = self._alpha_sigma(F64(self.sigmas[i]))
        h = self._lambda(F64(self.sigmas[i + 1])) - self._lambda(F64(self.sigmas[i]))
        algo = self.config["algorithm_type"]
        if algo == "dpmsolver++":
            return (s_t / s_s) * x - (a_t * np.expm1(-h)) * m
        if algo == "dpmsolver":
            return (a_t / a_s) * x - (s_t * np.expm1(h)) * m
        assert noise is not None
        if algo == "sde-dpmsolver++":
            return ((s_t / s_s * np.exp(-h)) * x + (a_t * (1 - np.exp(-2.0 * h))) * m
                    + s_t * np.sqrt(1.0 - np.exp(-2 * h)) * noise)
        return ((a_t / a_s) * x - 2.0 * (s_t * np.expm1(h)) * m + s_t * np.sqrt(np.expm1(2 * h)) * noise)

    def _second_order(self, x: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        assert self.sigmas is not None and self._step_index is not None
        i = self._step_index
        sig_t, sig_s0, sig_s1 = (F64(self.sigmas[j]) for j in (i + 1, i, i - 1))
        a_t, s_t = self._alpha_sigma(sig_t)
        a_s0, s_s0 = self._alpha_sigma(sig_s0)
        lam_t, lam_s0, lam_s1 = self._lambda(sig_t), self._lambda(sig_s0), self._lambda(sig_s1)
        m0, m1 = self.model_outputs[-1], self.model_outputs[-2]
        assert m0 is not None and m1 is not None
        h, h_0 = lam_t - lam_s0, lam_s0 - lam_s1
        r0 = h_0 / h
        d0, d1 = m0, (1.0 / r0) * (m0 - m1)
        algo, midpoint = self.config["algorithm_type"], self.config["solver_type"] == "midpoint"
        if algo == "dpmsolver++":
            e = np.expm1(-h)
            return ((s_t / s_s0) * x - (a_t * e) * d0 - 0.5 * (a_t * e) * d1 if midpoint
                    else (s_t / s_s0) * x - (a_t * e) * d0 + (a_t * (e / h + 1.0)) * d1)
        if algo == "dpmsolver":
            e = np.expm1(h)
            return ((a_t / a_s0) * x - (s_t * e) * d0 - 0.5 * (s_t * e) * d1 if midpoint
                    else (a_t / a_s0) * x - (s_t * e) * d0 - (s_t * (e / h - 1.0)) * d1)
        assert noise is not None
        if algo == "sde-dpmsolver++":
            e2 = 1 - np.exp(-2.0 * h)
            base = (s_t / s_s0 * np.exp(-h)) * x + (a_t * e2) * d0 + s_t * np.sqrt(e2) * noise
            return base + (0.5 * (a_t * e2) * d1 if midpoint else (a_t * (e2 / (-2.0 * h) + 1.0)) * d1)
        e = np.expm1(h)
        base = (a_t / a_s0) * x - 2.0 * (s_t * e) * d0 + s_t * np.sqrt(np.expm1(2 * h)) * noise
        return base - ((s_t * e) * d1 if midpoint else 2.0 * (s_t * (e / h - 1.0)) * d1)

    def _third_order(self, x: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        assert self.sigmas is not None and self._step_index is not None
        i = self._step_index
        sig = [F64(self.sigmas[j]) for j in (i + 1, i, i - 1, i - 2)]
        a_t, s_t = self._alpha_sigma(sig[0])
        a_s0, s_s0 = self._alpha_sigma(sig[1])
        lam_t, lam_s0, lam_s1, lam_s2 = (self._lambda(s) for s in sig)
        m0, m1, m2 = self.model_outputs[-1], self.model_outputs[-2], self.model_outputs[-3]
        assert m0 is not None and m1 is not None and m2 is not None
        h, h_0, h_1 = lam_t - lam_s0, lam_s0 - lam_s1, lam_s1 - lam_s2
        r0, r1 = h_0 / h, h_1 / h
        d1_0, d1_1 = (1.0 / r0) * (m0 - m1), (1.0 / r1) * (m1 - m2)
        d1 = d1_0 + (r0 / (r0 + r1)) * (d1_0 - d1_1)
        d2 = (1.0 / (r0 + r1)) * (d1_0 - d1_1)
        algo = self.config["algorithm_type"]
        if algo == "dpmsolver++":
            e = np.expm1(-h)
            return ((s_t / s_s0) * x - (a_t * e) * m0 + (a_t * (e / h + 1.0)) * d1
                    - (a_t * ((e + h) / h ** 2 - 0.5)) * d2)
        if algo == "dpmsolver":
            e = np.expm1(h)
            return ((a_t / a_s0) * x - (s_t * e) * m0 - (s_t * (e / h - 1.0)) * d1
                    - (s_t * ((e - h) / h ** 2 - 0.5)) * d2)
        assert noise is not None and algo == "sde-dpmsolver++"
        e2 = 1.0 - np.exp(-2.0 * h)
        return ((s_t / s_s0 * np.exp(-h)) * x + (a_t * e2) * m0 + (a_t * (e2 / (-2.0 * h) + 1.0)) * d1
                + (a_t * ((e2 - 2.0 * h) / (2.0 * h) ** 2 - 0.5)) * d2 + s_t * np.sqrt(e2) * noise)

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        self._need_timesteps()
        self._init_step_index(t, missing_is_last=True)
        assert self._step_index is not None
        cfg, i, n = self.config, self._step_index, len(self.timesteps)
        lower_final = i == n - 1 and (cfg["euler_at_final"] or (cfg["lower_order_final"] and n < 15)
                                      or cfg["final_sigmas_type"] == "zero")
        lower_second = i == n - 2 and cfg["lower_order_final"] and n < 15
        mo = np.asarray(model_output)
        m = self._convert(mo.astype(F64), np.asarray(sample).astype(F64))
        self.model_outputs = [*self.model_outputs[1:], m]
        x = np.asarray(sample).astype(F32).astype(F64)
        noise = (_noise(generator_noise, mo.shape, self.class_name)
                 if cfg["algorithm_type"] in ("sde-dpmsolver", "sde-dpmsolver++") else None)
        order = cfg["solver_order"]
        if order == 1 or self.lower_order_nums < 1 or lower_final:
            prev = self._first_order(m, x, noise)
        elif order == 2 or self.lower_order_nums < 2 or lower_second:
            prev = self._second_order(x, noise)
        else:
            prev = self._third_order(x, noise)
        self.lower_order_nums = min(self.lower_order_nums + 1, order)
        self._step_index += 1
        return prev.astype(mo.dtype)


class UniPCMultistepScheduler(_SigmaMultistep):
    """UniPC predictor-corrector (bh1/bh2, any order; Wan, SkyReels-V2, ChronoEdit, HiDream's alternative)."""

    class_name = "UniPCMultistepScheduler"

    def __init__(self, config: _Config) -> None:
        config = _copy_config(config)
        if config["solver_type"] in ("midpoint", "heun", "logrho"):
            config["solver_type"] = "bh2"
        super().__init__(config)
        n = config["num_train_timesteps"]
        self.timesteps = np.linspace(0, n - 1, n, dtype=F32)[::-1].copy()
        self.sigmas = self._train_sigmas
        self.timestep_list: list[Any] = [None] * config["solver_order"]
        self.last_sample: np.ndarray | None = None
        self.this_order = 0

    def _set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                       mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        self._no_args(timesteps=timesteps)
        cfg = self.config
        n_train = cfg["num_train_timesteps"]
        if cfg["use_dynamic_shifting"] and mu is None:
            raise SamplerError("`mu` must be passed when `use_dynamic_shifting` is set to be `True`")
        if sigmas is not None:
            if not cfg["use_flow_sigmas"]:
                raise SamplerError("custom sigmas need use_flow_sigmas=True")
            num_inference_steps = len(sigmas)
        if num_inference_steps is None:
            raise SamplerError("pass num_inference_steps or sigmas")
        n = num_inference_steps
        spacing = cfg["timestep_spacing"]
        if spacing == "linspace":
            ts = np.linspace(0, n_train - 1, n + 1).round()[::-1][:-1].copy().astype(np.int64)
        elif spacing == "leading":
            ratio = n_train // (n + 1)
            ts = (np.arange(0, n + 1) * ratio).round()[::-1][:-1].copy().astype(np.int64) + cfg["steps_offset"]
        else:
            ts = np.arange(n_train, 0, -(n_train / n)).round().copy().astype(np.int64) - 1
        zero = cfg["final_sigmas_type"] == "zero"
        given = None if sigmas is None else np.array(sigmas, dtype=F64 if not isinstance(sigmas, np.ndarray) else None)
        if cfg["use_karras_sigmas"] or cfg["use_exponential_sigmas"]:
            base = self._train_sigmas.copy() if given is None else given
            log_sigmas = np.log(base)
            flipped = np.flip(base).copy()
            lo, hi = self._karras_bounds(flipped)
            if cfg["use_karras_sigmas"]:
                out = _karras(lo, hi, n)
                if cfg["use_flow_sigmas"]:
                    out = out / (out + 1)
                    ts = (out * n_train).copy()
                else:
                    ts = np.array([_sigma_to_t(s, log_sigmas) for s in out]).round()
            else:
                out = _exponential(lo, hi, n)
                ts = np.array([_sigma_to_t(s, log_sigmas) for s in out])
            sig = np.concatenate([out, [0.0 if zero else out[-1]]]).astype(F32)
        elif cfg["use_flow_sigmas"]:
            out = np.linspace(1, 1 / n_train, n + 1)[:-1] if given is None else given
            if cfg["use_dynamic_shifting"]:
                assert mu is not None
                out = (_f32_time_shift(cfg["time_shift_type"], float(mu), out) if out.dtype == F32
                       else _time_shift(cfg["time_shift_type"], float(mu), 1.0, out))
            else:
                fs = float(cfg["flow_shift"])
                if out.dtype == F32:
                    out = ((F32(fs) * out).astype(F32) / (F32(1) + (F32(fs - 1) * out).astype(F32))).astype(F32)
                else:
                    out = fs * out / (1 + (fs - 1) * out)
            if cfg["shift_terminal"]:
                out = _stretch_to_terminal(out, float(cfg["shift_terminal"]))
            out = np.array(out)
            eps = 1e-6
            if np.fabs(out[0] - 1) < eps:
                out[0] -= out.dtype.type(eps)
            ts = (out * out.dtype.type(n_train)).copy()
            sig = np.concatenate([out, [0.0 if zero else out[-1]]]).astype(F32)
        else:
            base = self._train_sigmas.copy() if given is None else given
            out = np.interp(ts, np.arange(0, len(base)), base)
            sig = np.concatenate([out, [0.0 if zero else self._sigma_last_any()]]).astype(F32)
        if not np.isfinite(sig).all():
            raise SamplerError(f"{self.class_name}: the sigmas of {n} step(s) are not finite")
        self.sigmas = sig
        self.timesteps = np.asarray(ts).astype(np.int64)
        self.num_inference_steps = len(self.timesteps)
        self.model_outputs = [None] * cfg["solver_order"]
        self.timestep_list = [None] * cfg["solver_order"]
        self.lower_order_nums = 0
        self.last_sample = None
        self._step_index = None

    def _sigma_last_any(self) -> float:
        ac0 = self.alphas_cumprod[0]
        return float(np.sqrt(F64(F32(F32(1) - ac0) / ac0)).astype(F32))

    def _bh(self, hh: Scalar, order: int) -> tuple[Any, Any, list[Any]]:
        """``h_phi_1``, ``B_h`` and the right-hand side ``b`` of UniPC's order conditions."""
        h_phi_1 = np.expm1(hh)
        h_phi_k = h_phi_1 / hh - 1
        b_h = hh if self.config["solver_type"] == "bh1" else np.expm1(hh)
        b, factorial_i = [], 1
        for i in range(1, order + 1):
            b.append(h_phi_k * factorial_i / b_h)
            factorial_i *= i + 1
            h_phi_k = h_phi_k / hh - 1 / factorial_i
        return h_phi_1, b_h, b

    def _rks_d1s(self, newest: int, order: int, sig_s0: Scalar, h: Scalar) -> tuple[list[Any], list[np.ndarray]]:
        assert self.sigmas is not None
        m0 = self.model_outputs[-1]
        assert m0 is not None
        lam_s0 = self._lambda(sig_s0)
        rks, d1s = [], []
        for i in range(1, order):
            mi = self.model_outputs[-(i + 1)]
            assert mi is not None
            rk = (self._lambda(F64(self.sigmas[newest - i])) - lam_s0) / h
            rks.append(rk)
            d1s.append((mi - m0) / rk)
        return [*rks, 1.0], d1s

    def _predict(self, x: np.ndarray, order: int) -> np.ndarray:
        assert self.sigmas is not None and self._step_index is not None
        i = self._step_index
        sig_t, sig_s0 = F64(self.sigmas[i + 1]), F64(self.sigmas[i])
        a_t, s_t = self._alpha_sigma(sig_t)
        a_s0, s_s0 = self._alpha_sigma(sig_s0)
        h = self._lambda(sig_t) - self._lambda(sig_s0)
        rks, d1s = self._rks_d1s(i, order, sig_s0, h)
        x0_mode = self.config["predict_x0"]
        hh = -h if x0_mode else h
        h_phi_1, b_h, b = self._bh(hh, order)
        m0 = self.model_outputs[-1]
        assert m0 is not None
        pred_res: Any = 0
        if d1s:
            if order == 2:
                rhos = [0.5]
            else:
                r = np.array([[rk ** (k - 1) for rk in rks] for k in range(1, order + 1)])
                rhos = list(np.linalg.solve(r[:-1, :-1], np.array(b[:-1])))
            pred_res = sum(rho * d for rho, d in zip(rhos, d1s, strict=True))
        if x0_mode:
            return s_t / s_s0 * x - a_t * h_phi_1 * m0 - a_t * b_h * pred_res
        return a_t / a_s0 * x - s_t * h_phi_1 * m0 - s_t * b_h * pred_res

    def _correct(self, model_t: np.ndarray, last: np.ndarray, this: np.ndarray, order: int) -> np.ndarray:
        assert self.sigmas is not None and self._step_index is not None
        i = self._step_index
        sig_t, sig_s0 = F64(self.sigmas[i]), F64(self.sigmas[i - 1])
        a_t, s_t = self._alpha_sigma(sig_t)
        a_s0, s_s0 = self._alpha_sigma(sig_s0)
        h = self._lambda(sig_t) - self._lambda(sig_s0)
        rks, d1s = self._rks_d1s(i - 1, order, sig_s0, h)
        x0_mode = self.config["predict_x0"]
        hh = -h if x0_mode else h
        h_phi_1, b_h, b = self._bh(hh, order)
        if order == 1:
            rhos = [0.5]
        else:
            r = np.array([[rk ** (k - 1) for rk in rks] for k in range(1, order + 1)])
            rhos = list(np.linalg.solve(r, np.array(b)))
        m0 = self.model_outputs[-1]
        assert m0 is not None
        corr: Any = sum(rho * d for rho, d in zip(rhos[:-1], d1s, strict=True)) if d1s else 0
        d1_t = model_t - m0
        if x0_mode:
            return s_t / s_s0 * last - a_t * h_phi_1 * m0 - a_t * b_h * (corr + rhos[-1] * d1_t)
        return a_t / a_s0 * last - s_t * h_phi_1 * m0 - s_t * b_h * (corr + rhos[-1] * d1_t)

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        self._need_timesteps()
        self._init_step_index(t, missing_is_last=True)
        assert self._step_index is not None
        cfg = self.config
        x = np.asarray(sample).astype(F64)
        use_corrector = (self._step_index > 0 and self._step_index - 1 not in cfg["disable_corrector"]
                         and self.last_sample is not None)
        assert self.sigmas is not None
        sigma = F64(self.sigmas[self._step_index])
        mo = np.asarray(model_output).astype(F64)
        if cfg["predict_x0"]:
            m = self._x0(mo, x, sigma)
            if cfg["thresholding"]:
                m = self._threshold(m)
        else:
            m = self._eps(mo, x, sigma)
        if use_corrector:
            assert self.last_sample is not None
            x = self._correct(m, self.last_sample, x, self.this_order)
        self.model_outputs = [*self.model_outputs[1:], m]
        self.timestep_list = [*self.timestep_list[1:], t]
        order = cfg["solver_order"]
        this_order = min(order, len(self.timesteps) - self._step_index) if cfg["lower_order_final"] else order
        self.this_order = min(this_order, self.lower_order_nums + 1)
        self.last_sample = x
        prev = self._predict(x, self.this_order)
        self.lower_order_nums = min(self.lower_order_nums + 1, order)
        self._step_index += 1
        return prev.astype(np.asarray(sample).dtype)


class EulerDiscreteScheduler(_AlphaScheduler):
    """Euler over the DDPM sigmas (k-diffusion's ``sample_euler``; ``s_churn = 0``, as pipelines call it)."""

    class_name = "EulerDiscreteScheduler"

    def __init__(self, config: _Config) -> None:
        super().__init__(config)
        if config["rescale_betas_zero_snr"]:
            self.alphas_cumprod[-1] = F32(2.0 ** -24)
        n = config["num_train_timesteps"]
        train = self._train_sigmas()
        self.sigmas = np.concatenate([train[::-1], np.zeros(1, F32)])
        self.timesteps = np.linspace(0, n - 1, n)[::-1].copy().astype(F32)

    def _train_sigmas(self) -> np.ndarray:
        ac = self.alphas_cumprod
        ratio = ((F32(1) - ac).astype(F32) / ac).astype(F32)
        return np.sqrt(ratio.astype(F64)).astype(F32)

    @property
    def init_noise_sigma(self) -> float:
        assert self.sigmas is not None
        m = F32(self.sigmas.max())
        if self.config["timestep_spacing"] in ("linspace", "trailing"):
            return float(m)
        return float(F32(np.sqrt(F64(F32(F32(m * m) + F32(1))))))

    def _set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                       mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        self._no_args(mu=mu)
        cfg = self.config
        if timesteps is not None and sigmas is not None:
            raise SamplerError("Only one of `timesteps` or `sigmas` should be set")
        if (num_inference_steps is None) == (timesteps is None and sigmas is None):
            raise SamplerError("pass exactly one of num_inference_steps, timesteps or sigmas")
        if timesteps is not None and (cfg.get("use_karras_sigmas") or cfg.get("use_exponential_sigmas")):
            raise SamplerError("custom timesteps do not go with karras or exponential sigmas")
        train = self._train_sigmas()
        log_sigmas = np.log(train)
        if num_inference_steps is None:
            num_inference_steps = len(timesteps) if timesteps is not None else len(sigmas) - 1  # type: ignore[arg-type]
        n = num_inference_steps
        self.num_inference_steps = n
        if sigmas is not None:
            sig = np.array(sigmas).astype(F32)
            ts: np.ndarray = np.array([_sigma_to_t(s, log_sigmas) for s in sig[:-1]])
        else:
            n_train = cfg["num_train_timesteps"]
            if timesteps is not None:
                ts = np.array(timesteps).astype(F32)
            elif cfg["timestep_spacing"] == "linspace":
                ts = np.linspace(0, n_train - 1, n, dtype=F32)[::-1].copy()
            elif cfg["timestep_spacing"] == "leading":
                ratio = n_train // n
                ts = (np.arange(0, n) * ratio).round()[::-1].copy().astype(F32) + F32(cfg["steps_offset"])
            else:
                ratio = n_train / n
                ts = np.arange(n_train, 0, -ratio).round().copy().astype(F32) - F32(1)
            out = np.interp(ts, np.arange(0, len(train)), train)
            if cfg.get("use_karras_sigmas") or cfg.get("use_exponential_sigmas"):
                lo, hi = _extra_number(cfg, "sigma_min"), _extra_number(cfg, "sigma_max")
                lo = float(out[-1]) if lo is None else lo
                hi = float(out[0]) if hi is None else hi
                out = _karras(lo, hi, n) if cfg.get("use_karras_sigmas") else _exponential(lo, hi, n)
                ts = np.array([_sigma_to_t(s, log_sigmas) for s in out])
            last = 0.0 if cfg.get("final_sigmas_type", "zero") == "zero" else float(train[0])
            sig = np.concatenate([out, [last]]).astype(F32)
        self.sigmas = sig
        self.timesteps = np.asarray(ts).astype(F32)
        self._step_index = None

    def scale_model_input(self, sample: np.ndarray, t: Any = None) -> np.ndarray:
        self._init_step_index(t)
        assert self.sigmas is not None and self._step_index is not None
        sigma = F64(self.sigmas[self._step_index])
        x = np.asarray(sample)
        return (x.astype(F64) / (sigma ** 2 + 1) ** 0.5).astype(x.dtype)

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        if np.issubdtype(np.asarray(t).dtype, np.integer):
            raise SamplerError("pass one of scheduler.timesteps as t, not an integer index")
        self._init_step_index(t)
        assert self.sigmas is not None and self._step_index is not None
        x = np.asarray(sample).astype(F32).astype(F64)
        v = np.asarray(model_output).astype(F64)
        sigma = F64(self.sigmas[self._step_index])
        kind = self.config["prediction_type"]
        if kind in ("sample", "original_sample"):
            x0 = v
        elif kind == "epsilon":
            x0 = x - sigma * v
        else:
            x0 = v * (-sigma / (sigma ** 2 + 1) ** 0.5) + x / (sigma ** 2 + 1)
        derivative = (x - x0) / sigma
        dt = F64(self.sigmas[self._step_index + 1] - self.sigmas[self._step_index])  # a float32 difference
        self._step_index += 1
        return (x + derivative * dt).astype(np.asarray(model_output).dtype)


class EulerAncestralDiscreteScheduler(EulerDiscreteScheduler):
    """Euler ancestral (k-diffusion's ``sample_euler_ancestral``): one noise draw per step."""

    class_name = "EulerAncestralDiscreteScheduler"

    def _set_timesteps(self, num_inference_steps: int | None = None, *, sigmas: Sequence[float] | None = None,
                       mu: float | None = None, timesteps: Sequence[float] | None = None) -> None:
        self._no_args(sigmas=sigmas, mu=mu, timesteps=timesteps)
        if num_inference_steps is None:
            raise SamplerError("pass num_inference_steps")
        super()._set_timesteps(num_inference_steps)

    def _step(self, model_output: np.ndarray, t: Scalar, sample: np.ndarray,
              generator_noise: NoiseFn | None) -> np.ndarray:
        if np.issubdtype(np.asarray(t).dtype, np.integer):
            raise SamplerError("pass one of scheduler.timesteps as t, not an integer index")
        self._init_step_index(t)
        assert self.sigmas is not None and self._step_index is not None
        x = np.asarray(sample).astype(F32).astype(F64)
        mo = np.asarray(model_output)
        v = mo.astype(F64)
        sigma = F64(self.sigmas[self._step_index])
        if self.config["prediction_type"] == "epsilon":
            x0 = x - sigma * v
        else:
            x0 = v * (-sigma / (sigma ** 2 + 1) ** 0.5) + x / (sigma ** 2 + 1)
        s_from, s_to = sigma, F64(self.sigmas[self._step_index + 1])
        sigma_up = (s_to ** 2 * (s_from ** 2 - s_to ** 2) / s_from ** 2) ** 0.5
        sigma_down = (s_to ** 2 - sigma_up ** 2) ** 0.5
        prev = x + (x - x0) / sigma * (sigma_down - sigma)
        prev = prev + _noise(generator_noise, mo.shape, self.class_name) * sigma_up
        self._step_index += 1
        return prev.astype(mo.dtype)


#: the implemented classes, by diffusers class name
SCHEDULERS: dict[str, type[Scheduler]] = {
    c.class_name: c for c in (
        FlowMatchEulerDiscreteScheduler, DPMSolverMultistepScheduler, DDIMScheduler, DDPMScheduler,
        CogVideoXDDIMScheduler, CogVideoXDPMScheduler, UniPCMultistepScheduler, EulerDiscreteScheduler,
        EulerAncestralDiscreteScheduler, FlowMapEulerDiscreteScheduler,
    )
}


def make_scheduler(class_name: str, config: JsonMap) -> Scheduler:
    """The scheduler ``diffusers.<class_name>.from_config(config)`` would be, in NumPy.

    Raises :class:`SamplerError` naming the class, or every option :func:`unsupported` lists.
    """
    refused = unsupported(class_name, config)
    if refused == [class_name]:
        raise SamplerError(f"scheduler class {class_name!r} is not implemented "
                           f"(implemented: {', '.join(SCHEDULERS)})")
    if refused:
        raise SamplerError(f"{class_name}: options not reproduced: {', '.join(refused)}")
    return SCHEDULERS[class_name](resolve_config(class_name, config))


# ---------------------------------------------------------------------------------------------
# what pipelines do around ``set_timesteps``


def calculate_shift(image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096,
                    base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """Flux's ``calculate_shift``: ``mu`` linear in the image's token count (SD3, Flux, Chroma, ...)."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return image_seq_len * m + b


def flux2_empirical_mu(image_seq_len: int, num_inference_steps: int) -> float:
    """Flux2Pipeline's ``compute_empirical_mu`` (and the Flux.2 Klein pipelines'): ``mu`` of the image's
    token count and the step count, in Python floats as the pipeline computes it (the formula of
    :func:`rkpart.description.flux2_empirical_mu`, written again: this file imports nothing from rkpart)."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if image_seq_len > 4300:
        return float(a2 * image_seq_len + b2)
    m_200, m_10 = a2 * image_seq_len + b2, a1 * image_seq_len + b1
    a = (m_200 - m_10) / 190.0
    return float(a * num_inference_steps + (m_200 - 200.0 * a))


#: ``mu`` as a rule of the image token count and the step count (pipeline.json ``set_timesteps.mu_rule``)
MU_RULES: dict[str, Callable[[int, int], float]] = {"flux2_empirical": flux2_empirical_mu}


def _int_timesteps(ts: np.ndarray, n_train: int) -> dict[str, np.ndarray]:
    ts = ts.astype(np.int64).astype(F32)
    return {"timesteps": ts, "sigmas": (ts / F32(n_train)).astype(F32)}


#: the custom schedules pipelines pass to ``set_timesteps``, by name; ``n`` is the call's
#: ``num_inference_steps``, ``N`` the scheduler's ``num_train_timesteps``.  Each gives the keyword
#: arguments of ``set_timesteps`` with the values (and dtypes) the pipeline computes.
SCHEDULE_RULES: dict[str, Callable[[int, int], dict[str, np.ndarray]]] = {
    # np.linspace(1.0, 1 / n, n): Flux, Chroma, Lumina2, LTX-Video, LongCat-Image, Ovis, Bria, DreamLite
    "linspace(1, 1/n, n)": lambda n, _: {"sigmas": np.linspace(1.0, 1 / n, n)},
    # torch.linspace(1.0, 1 / n, n) (float32): Z-Image
    "torch.linspace(1, 1/n, n)": lambda n, _: {"sigmas": torch_linspace(1.0, 1 / n, n, F32)},
    # np.linspace(1.0, 0.0, n + 1)[:-1]: HunyuanVideo, HunyuanImage, OmniGen, QwenImage-Layered
    "linspace(1, 0, n+1)[:-1]": lambda n, _: {"sigmas": np.linspace(1.0, 0.0, n + 1)[:-1]},
    # torch.linspace(1.0, 0.0, n + 1)[:-1] (float32): ERNIE-Image
    "torch.linspace(1, 0, n+1)[:-1]": lambda n, _: {"sigmas": torch_linspace(1.0, 0.0, n + 1, F32)[:-1]},
    # torch.linspace(0, 1, n, dtype=torch.float64): Cosmos-Predict2 (which then also sets the last
    # sigma to the one before it: a pipeline step outside set_timesteps, not part of this rule)
    "torch.linspace(0, 1, n, float64)": lambda n, _: {"sigmas": torch_linspace(0.0, 1.0, n, F64)},
    # CogView4: integer timesteps np.linspace(N, 1, n), sigmas = timesteps / N (float32)
    "timesteps=linspace(N, 1, n).int, sigmas=timesteps/N":
        lambda n, big: _int_timesteps(np.linspace(big, 1.0, n), big),
    # GLM-Image: the same over np.linspace(N, 1, n + 1)[:-1]
    "timesteps=linspace(N, 1, n+1)[:-1].int, sigmas=timesteps/N":
        lambda n, big: _int_timesteps(np.linspace(big, 1.0, n + 1)[:-1], big),
}


def schedule_arguments(rule: str, num_inference_steps: int, num_train_timesteps: int = 1000) -> dict[str, np.ndarray]:
    """The ``set_timesteps`` keyword arguments of the named rule (:data:`SCHEDULE_RULES`)."""
    if rule not in SCHEDULE_RULES:
        raise SamplerError(f"unknown schedule rule {rule!r} (known: {', '.join(SCHEDULE_RULES)})")
    if num_inference_steps < 1:
        raise SamplerError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
    return SCHEDULE_RULES[rule](num_inference_steps, num_train_timesteps)


def named_sigmas(rule: str, num_inference_steps: int, num_train_timesteps: int = 1000) -> np.ndarray:
    """The sigmas array of a named rule (``"linspace(1, 1/n, n)"`` -> ``np.linspace(1, 1/n, n)``)."""
    args = schedule_arguments(rule, num_inference_steps, num_train_timesteps)
    return args["sigmas"]


def retrieve_timesteps(scheduler: Scheduler, num_inference_steps: int | None = None, *,
                       sigmas: Sequence[float] | np.ndarray | None = None,
                       timesteps: Sequence[float] | np.ndarray | None = None,
                       mu: float | None = None, rule: str | None = None) -> tuple[np.ndarray, int]:
    """diffusers' pipeline ``retrieve_timesteps``: ``set_timesteps`` with the custom schedule (given,
    or the named ``rule`` for ``num_inference_steps``), then ``(timesteps, num_inference_steps)``."""
    if rule is not None:
        if sigmas is not None or timesteps is not None or num_inference_steps is None:
            raise SamplerError("a rule takes num_inference_steps and no explicit sigmas or timesteps")
        args = schedule_arguments(rule, num_inference_steps, scheduler.config.get("num_train_timesteps", 1000))
        sigmas, timesteps = args.get("sigmas"), args.get("timesteps")
    kw: JsonObject = {} if mu is None else {"mu": mu}
    if timesteps is not None or sigmas is not None:
        scheduler.set_timesteps(None, sigmas=sigmas, timesteps=timesteps, **kw)  # type: ignore[arg-type]
        return scheduler.timesteps, len(scheduler.timesteps)
    scheduler.set_timesteps(num_inference_steps, **kw)
    return scheduler.timesteps, int(num_inference_steps or 0)


__all__ = [
    "DEFAULTS", "DIFFUSERS_VERSION", "MU_RULES", "SCHEDULERS", "SCHEDULE_RULES", "NoiseFn", "SamplerError",
    "Scheduler", "calculate_shift", "flux2_empirical_mu", "make_scheduler", "named_sigmas", "resolve_config",
    "retrieve_timesteps", "schedule_arguments", "torch_linspace", "unsupported",
]
