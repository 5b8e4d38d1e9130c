"""Derive the pipeline description from recorded calls, and check it reproduces them.

Two recordings (:mod:`rkpart.export.record`) of the same pipeline at the export size differ in
everything rkpart must tell apart: the seed (embeddings, masks, initial latents), the step count
(2 and 3) and the guidance scale.  Each fact of the description is what holds across both:

- a transformer input equal to a call argument in every call (or to ``cat([negative, positive])``
  of a pair: batched CFG) comes from that argument;
- one equal to the loop latent (or to it twice) is the latent;
- one whose every element is ``scale * t + offset`` of the step's scheduler timestep, for one
  ``scale != 0`` and ``offset`` fitted and then checked at every step, is the timestep;
- one equal to ``k * guidance_scale`` in each recording (the two scales differ) is the guidance;
- one equal in every call of both recordings, and no argument, is a constant (its value is kept);
- anything else is refused: rkpart cannot reproduce where it comes from.

How the transformer's outputs become the scheduler's ``model_output`` is found by trying a small
set of candidates (which call or batch half is unconditional, the CFG combination forms of
:data:`COMBINES` with or without a :data:`RENORMS` rescale, or none, a learned-sigma channel split,
a sign) against the recorded ``model_output`` of every step.

:func:`replay` then runs the denoising loop from the description alone (a fresh scheduler made
from the saved config, the transformer fed from the description's sources) and checks every
step's ``prev_sample`` against the recording: the description is what the pipeline does, not what
rkpart guessed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rkpart.description import flux2_empirical_mu
from rkpart.errors import ExportError

if TYPE_CHECKING:
    import torch

    from rkpart.export.record import Recording, Step, TransformerCall


class DescribeError(ExportError):
    """The recorded call does not match what rkpart reproduces: the export refuses the pipeline."""


#: roles of the contract (docs/pipeline-json.md)
ROLES = ("latent", "timestep", "guidance", "text_embeddings", "pooled_embeddings", "attention_mask", "image_ids",
         "text_ids", "position_ids", "rope", "class_labels", "image_latents", "other")

#: ``sigmas`` the pipeline passes to ``set_timesteps``, by name: a rule of the step count ``n`` and the
#: scheduler's ``num_train_timesteps`` ``T`` (``int``: truncation, as ``astype(np.int64)``)
SIGMA_RULES: dict[str, Callable[[int, int], np.ndarray]] = {
    "linspace(1, 1/n, n)": lambda n, _t: np.linspace(1.0, 1.0 / n, n),  # Flux
    "linspace(1, 0, n+1)[:-1]": lambda n, _t: np.linspace(1.0, 0.0, n + 1)[:-1],
    # CogView4: integer timesteps from T down to 1, as sigmas
    "int(linspace(T, 1, n)) / T": lambda n, t: np.linspace(t, 1.0, n).astype(np.int64).astype(np.float32) / t,
}
#: ``timesteps`` the pipeline passes to ``set_timesteps`` beside its sigmas, by name (as :data:`SIGMA_RULES`)
TIMESTEP_RULES: dict[str, Callable[[int, int], np.ndarray]] = {
    "int(linspace(T, 1, n))": lambda n, t: np.linspace(t, 1.0, n).astype(np.int64).astype(np.float32),  # CogView4
}


@dataclass
class InputFact:
    """Where one transformer input comes from (one ``inputs.<name>`` of the description)."""

    name: str
    role: str
    argument: str | None = None
    negative_argument: str | None = None
    #: a constant input's value (written to ``inputs.npz`` under ``name``)
    value: np.ndarray | None = None
    #: the unconditional pass takes ``argument``'s shape filled with this number (``negative_argument`` is ``None``):
    #: zeros (CogView3-Plus), DiT's null class 1000
    negative_fill: float | None = None
    #: the argument extended with this many valid positions (ones) on its last axis (Chroma's mask)
    append_valid: int = 0


@dataclass(frozen=True)
class Nest:
    """A forward argument that holds tensors: a ``tuple``, ``list`` or ``dict`` (``kind``), the input name of
    each tensor by position or key, and the items that are not tensors (``None`` in ``added_cond_kwargs``)."""

    kind: str
    names: tuple[tuple[Any, str], ...]
    rest: tuple[tuple[Any, Any], ...] = ()


def flatten_kwargs(kwargs: dict[str, Any], per_sample: tuple[int, ...] = ()) -> tuple[dict[str, Any], dict[str, Nest]]:
    """``kwargs`` with every tuple / list / dict of tensors (one level) spread into ``<arg>_<key>`` inputs; a list
    of ``n`` tensors of one shape, ``n`` in ``per_sample`` (the call's batch), stacked into one input.

    HunyuanDiT's ``image_rotary_emb`` (a (cos, sin) pair), PixArt-α's ``added_cond_kwargs``
    (``resolution`` and ``aspect_ratio`` tensors): an ONNX graph takes tensors, one per input.
    """
    import torch

    flat: dict[str, Any] = {}
    nests: dict[str, Nest] = {}
    for k, v in kwargs.items():
        if isinstance(v, list) and len(v) in per_sample and all(
                isinstance(x, torch.Tensor) and x.shape == v[0].shape for x in v):
            # one tensor per sample of the batch (Z-Image's x and cap_feats): the batch, stacked
            nests[k] = Nest("stack", ((0, k),))
            flat[k] = torch.stack(v)
            continue
        items: list[tuple[Any, Any]] | None = None
        if isinstance(v, (tuple, list)) and v and all(isinstance(x, torch.Tensor) for x in v):
            items = list(enumerate(v))
        elif isinstance(v, dict) and any(isinstance(x, torch.Tensor) for x in v.values()) and not any(
                _holds_tensor(x) and not isinstance(x, torch.Tensor) for x in v.values()):
            items = list(v.items())
        if items is None:
            flat[k] = v
            continue
        names = tuple((key, f"{k}_{key}") for key, x in items if isinstance(x, torch.Tensor))
        nests[k] = Nest("dict" if isinstance(v, dict) else type(v).__name__, names,
                        tuple((key, x) for key, x in items if not isinstance(x, torch.Tensor)))
        flat.update({name: v[key] for key, name in names})
    return flat, nests


def nest_kwargs(flat: dict[str, Any], nests: dict[str, Nest]) -> dict[str, Any]:
    """The forward arguments from flattened inputs (the inverse of :func:`flatten_kwargs`)."""
    owned = {name for n in nests.values() for _key, name in n.names}
    out = {k: v for k, v in flat.items() if k not in owned}
    for arg, n in nests.items():
        if n.kind == "stack":
            out[arg] = list(flat[arg].unbind(0))
        elif n.kind == "dict":
            d = dict(n.rest)
            d.update({key: flat[name] for key, name in n.names})
            out[arg] = d
        else:
            seq = [flat[name] for _key, name in n.names]
            out[arg] = tuple(seq) if n.kind == "tuple" else seq
    return out


@dataclass
class Facts:
    """Everything derived from the recordings (the description, before shapes and file names)."""

    inputs: dict[str, InputFact]
    #: ``batched``, ``two-pass``, ``distilled`` or ``none``
    cfg_mode: str
    #: the call argument that scales the CFG combination or feeds the guidance input (``guidance_scale``)
    scale_argument: str | None
    guidance_scale: float | None
    guidance_input: str | None
    guidance_input_scale: float | None
    #: two-pass: which of the two calls of a step is the conditional one (0 or 1)
    cond_call: int | None
    learned_sigma: bool
    sign: int
    channels_axis: int
    timestep_input: str
    timestep_scale: float
    timestep_offset: float
    sigmas_rule: str | None
    mu: float | None
    #: the rule of the ``timesteps`` the pipeline passes to ``set_timesteps`` (CogView4), or ``None``
    timesteps_rule: str | None
    latent_init: str
    latent_input: str
    #: the batch one transformer call takes in the export (2: the CFG pair batched)
    call_batch: int
    #: the batch one transformer call took in the recorded pipeline (differs from ``call_batch`` when
    #: a batched pair is exported as two passes of batch 1)
    pipeline_batch: int
    fixed: dict[str, Any] = field(default_factory=dict)
    #: forward arguments that are a tuple / list / dict holding tensors, flattened into one input per
    #: tensor (:func:`flatten_kwargs`; :func:`nest_kwargs` rebuilds them for the call)
    nests: dict[str, Nest] = field(default_factory=dict)
    #: the CFG combination (a key of :data:`COMBINES`) and its rescale (one of :data:`RENORMS`, or ``None``)
    combine: str = "uncond + g * (cond - uncond)"
    renorm: str | None = None
    #: a ``mu`` that depends on the step count: its rule (a key of :data:`MU_RULES`) and the image token count
    mu_rule: str | None = None
    image_seq_len: int | None = None
    #: batched: the pair is ``[cond, uncond]`` (Lumina-Next, DiT), not diffusers' usual ``[uncond, cond]``
    cond_first: bool = False
    #: the CFG combination applies to the first ``cfg_channels`` output channels only, the rest are the
    #: conditional prediction's (Lumina-Next: 3; ``None``: every channel)
    cfg_channels: int | None = None


# -- comparisons ---------------------------------------------------------------------------------


def _t(x: Any) -> torch.Tensor:
    import torch

    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


def same(a: Any, b: Any, *, rtol: float = 1e-5) -> bool:
    """Equal shapes and values to float tolerance (a cast to another dtype is equal)."""
    import torch

    if a is None or b is None:
        return a is b
    a, b = _t(a), _t(b)
    if tuple(a.shape) != tuple(b.shape):
        return False
    a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
    if not (torch.isfinite(a64).all() and torch.isfinite(b64).all()):
        return bool(torch.equal(a64, b64))
    scale = float(b64.abs().max()) if b64.numel() else 0.0
    return bool((a64 - b64).abs().max() <= rtol * scale + 1e-7) if a64.numel() else True


def _tensors(d: dict[str, Any]) -> dict[str, torch.Tensor]:
    import torch

    return {k: v for k, v in d.items() if isinstance(v, torch.Tensor)}


def _scalar_value(v: torch.Tensor) -> float | None:
    """The one value every element of ``v`` holds, or ``None``."""
    flat = v.detach().double().flatten()
    if flat.numel() == 0:
        return None
    first = float(flat[0])
    return first if bool((flat == first).all()) else None


# -- derivation ----------------------------------------------------------------------------------


def _calls(recs: Sequence[Recording]) -> list[tuple[Recording, Step, int, TransformerCall]]:
    return [(r, s, i, c) for r in recs for s in r.steps for i, c in enumerate(s.calls)]


def _check_structure(recs: Sequence[Recording]) -> int:
    """Calls per step (the same at every step), or refuse."""
    counts = {len(s.calls) for r in recs for s in r.steps}
    if any(r.trailing_calls for r in recs):
        raise DescribeError("the pipeline calls its transformer after the last scheduler step; rkpart reproduces "
                            "only calls made for a step")
    if not recs or not all(r.steps for r in recs):
        raise DescribeError("the pipeline call made no scheduler step")
    if counts == {0}:
        raise DescribeError("the pipeline's scheduler steps without calling the transformer")
    if len(counts) != 1 or next(iter(counts)) > 2:
        raise DescribeError(f"the pipeline calls its transformer {sorted(counts)} times per scheduler step; rkpart "
                            "reproduces one call (or one call per CFG pass) per step")
    return next(iter(counts))


def _undouble(recs: Sequence[Recording]) -> None:
    """A pipeline that steps its scheduler on the CFG pair's two identical halves (DiT: the loop variable is
    ``cat([x, x])``, the model output ``[combined, combined]``) loops on one half: every step's sample, model
    output and result are kept as their first half."""
    import torch

    def doubled(x: torch.Tensor, rows: int) -> bool:
        return x.dim() > 0 and x.shape[0] == 2 * rows and bool(torch.equal(x[:rows], x[rows:]))

    for r in recs:
        given = r.args.get("latents")
        rows = given.shape[0] if isinstance(given, torch.Tensor) and given.dim() else 0
        if not rows or not all(doubled(s.sample, rows) and doubled(s.model_output, rows)
                               and doubled(s.prev_sample, rows) for s in r.steps):
            continue
        for s in r.steps:
            s.sample, s.model_output, s.prev_sample = s.sample[:rows], s.model_output[:rows], s.prev_sample[:rows]


def _latent_input(recs: Sequence[Recording]) -> tuple[str, int]:
    """The transformer input equal to the loop latent in every call, and the call batch."""
    import torch

    first = recs[0].steps[0].calls[0]
    for name, v in _tensors(first.kwargs).items():
        if v.dim() == 0:
            continue
        rows = v.shape[0] // max(1, recs[0].steps[0].sample.shape[0])
        if rows not in (1, 2):
            continue
        ok = True
        for _r, s, _i, c in _calls(recs):
            x = c.kwargs.get(name)
            want = torch.cat([s.sample] * rows) if rows == 2 else s.sample
            # a singleton axis the pipeline adds (Z-Image's frame axis: unsqueeze(2)) is the same values
            if not isinstance(x, torch.Tensor) or x.numel() != want.numel() or not same(x.reshape(want.shape), want):
                ok = False
                break
        if ok:
            return name, rows * s.sample.shape[0]
    raise DescribeError("no transformer input equals the loop latent at every step (the pipeline changes the "
                        "latent before the transformer, e.g. scale_model_input, which rkpart does not reproduce)")


def _is_negative(arg: str) -> bool:
    return arg.startswith("negative_") or arg.startswith("neg_") or "_negative_" in arg


#: the pseudo-argument of an unconditional pass fed a constant shaped like the conditional argument
FILL = "\0fill"


def _argument_source(name: str, recs: Sequence[Recording], mode: str, append: int = 0
                     ) -> tuple[str, str | None, float | None] | None:
    """``(argument, negative_argument, negative_fill)`` when input ``name`` comes from call arguments in every
    call (``negative_fill``: the unconditional pass takes ``argument``'s shape filled with that number, zeros or
    the value the first call's unconditional part holds); ``append``: each argument extended with that many
    valid positions (ones) on its last axis."""
    import torch

    calls = _calls(recs)
    args0 = _tensors(recs[0].args)

    fills = [0.0]
    v0 = recs[0].steps[0].calls[0].kwargs.get(name)
    if isinstance(v0, torch.Tensor) and v0.dim() and v0.shape[0] == 2 and mode == "batched":
        for row in (v0[0], v0[1]):  # a constant row of the batched pair (DiT's null class)
            first = _scalar_value(row)
            if first is not None and first != 0:
                fills.append(first)
    fill = 0.0

    def val(r: Recording, x: str, other: str) -> torch.Tensor:
        v = torch.full_like(r.args[other], fill) if x == FILL else r.args[x]
        return torch.cat([v, torch.ones((*v.shape[:-1], append), dtype=v.dtype)], dim=-1) if append else v

    def expected(r: Recording, i: int, a: str, b: str) -> Any:
        # batched: a is the conditional row (second), b the unconditional (first); two-pass: a feeds call 0
        if mode == "batched":
            return torch.cat([val(r, b, a), val(r, a, b)])
        if mode == "two-pass":
            return val(r, a, b) if i == 0 else val(r, b, a)
        return val(r, a, a)

    def holds(a: str, b: str) -> bool:
        return all(isinstance(c.kwargs.get(name), torch.Tensor) and same(c.kwargs[name], expected(r, i, a, b))
                   for r, _s, i, c in calls)

    names = sorted(args0, key=lambda a: (_is_negative(a), a))
    pairs = [(a, b) for a in names for b in names if args0[a].shape == args0[b].shape] if mode != "none" \
        else [(a, a) for a in names]
    filled: list[tuple[str, str]] = []
    if mode in ("batched", "two-pass"):
        # tried after every pair of arguments: a negative argument the call was given is what it takes
        filled += [(a, FILL) for a in names if not _is_negative(a)]
        filled += [(FILL, a) for a in names if not _is_negative(a)]
    for a, b in pairs:
        if not holds(a, b):
            continue
        if mode == "batched":
            # the second row is fed the negative argument: the pipeline batches [cond, uncond] (Lumina-Next)
            return (b, a, None) if _is_negative(a) and not _is_negative(b) else (a, b, None)
        if mode == "two-pass":
            # the conditional pass is the one fed the argument that is not a negative one
            return ((a, b) if not _is_negative(a) or _is_negative(b) else (b, a)) + (None,)
        return a, None, None
    for fill in fills:
        for a, b in filled:
            if holds(a, b):
                return (b if a == FILL else a), None, fill
    return None


def _appended_source(name: str, recs: Sequence[Recording], mode: str
                     ) -> tuple[str, str | None, float | None, int] | None:
    """``(argument, negative_argument, negative_fill, n)`` when input ``name`` is a mask argument extended with
    ``n`` valid positions on its last axis in every call (Chroma appends its image tokens to the text mask)."""
    import torch

    v = recs[0].steps[0].calls[0].kwargs.get(name)
    if not isinstance(v, torch.Tensor) or v.dim() == 0:
        return None
    for n in sorted({v.shape[-1] - a.shape[-1] for arg, a in _tensors(recs[0].args).items()
                     if "mask" in arg and a.dim() == v.dim() and 0 < a.shape[-1] < v.shape[-1]}):
        src = _argument_source(name, recs, mode, append=n)
        if src is not None:
            return (*src, n)
    return None


def _fit_timestep(name: str, recs: Sequence[Recording]) -> tuple[float, float] | None:
    """``(scale, offset)`` with every element of input ``name`` = ``scale * t + offset``, or ``None``."""
    pts: list[tuple[float, float]] = []
    for _r, s, _i, c in _calls(recs):
        v = c.kwargs.get(name)
        val = _scalar_value(v) if v is not None and hasattr(v, "shape") else None
        tv = _scalar_value(_t(s.t))
        if val is None or tv is None:
            return None
        pts.append((tv, val))
    ts = sorted({p[0] for p in pts})
    if len(ts) < 2:
        return None
    (t0, v0), (t1, v1) = min(pts), max(pts)
    if t0 == t1:
        return None
    scale = (v1 - v0) / (t1 - t0)
    offset = v0 - scale * t0
    if scale == 0:
        return None
    span = max(abs(v) for _t0, v in pts) or 1.0
    # float32 arithmetic leaves an offset of ~1e-8 where the pipeline adds none
    scale, offset = _tidy(scale), 0.0 if abs(offset) <= 1e-6 * span else _tidy(offset)
    if all(abs(scale * t + offset - v) <= 1e-5 * span + 1e-6 for t, v in pts):
        return scale, offset
    return None


def _tidy(x: float) -> float:
    """``x`` rounded to 7 significant digits when that is what it is within float32 (1/1000, not
    0.0010000000474974513): the description holds the pipeline's constants, not their float32 noise."""
    if x == 0 or not math.isfinite(x):
        return x
    r = float(f"{x:.7g}")
    return r if abs(r - x) <= 1e-6 * abs(x) else x


def _guidance_factor(name: str, recs: Sequence[Recording], scale_arg: str) -> float | None:
    """``k`` with input ``name`` = ``k * <scale_arg>`` in every call of every recording."""
    ks: list[float] = []
    for r, _s, _i, c in _calls(recs):
        v = c.kwargs.get(name)
        val = _scalar_value(v) if v is not None and hasattr(v, "shape") else None
        g = r.args.get(scale_arg)
        if val is None or not isinstance(g, (int, float)) or g == 0:
            return None
        ks.append(val / float(g))
    gs = {float(r.args[scale_arg]) for r in recs}
    if len(gs) < 2:
        return None  # one guidance scale cannot tell a guidance input from a constant
    k = _tidy(ks[0])
    if k == 0:
        return None  # zeros whatever the scale: a constant, not the guidance
    return k if all(abs(x - k) <= 1e-6 * abs(k) for x in ks) else None


def _constant(name: str, recs: Sequence[Recording]) -> np.ndarray | None:
    import torch

    calls = _calls(recs)
    v0 = calls[0][3].kwargs.get(name)
    if not isinstance(v0, torch.Tensor):
        return None
    for _r, _s, _i, c in calls:
        x = c.kwargs.get(name)
        if not isinstance(x, torch.Tensor) or x.dtype != v0.dtype or not torch.equal(x, v0):
            return None
    return v0.numpy()


def _role_of_argument(arg: str) -> str:
    a = arg.lower()
    if "pooled" in a:
        return "pooled_embeddings"
    if "mask" in a:
        return "attention_mask"
    if "embeds" in a or "embeddings" in a:
        return "text_embeddings"
    if "class_label" in a:
        return "class_labels"
    if "image" in a or "latent" in a:
        return "image_latents"
    return "other"


def _role_of_constant(param: str) -> str:
    p = param.lower()
    if "mask" in p:
        return "attention_mask"
    if re.search(r"(^|_)(img|image|latent)_?ids?$", p):
        return "image_ids"
    if re.search(r"(^|_)(txt|text)_?ids?$", p):
        return "text_ids"
    if "rope" in p or "freqs" in p or "rotary" in p or p.endswith(("_cos", "_sin")):
        return "rope"
    if "pos" in p or p.endswith("ids"):
        return "position_ids"
    if "class_label" in p:
        return "class_labels"
    return "other"


def _scale_arguments(recs: Sequence[Recording]) -> list[str]:
    """The call's numeric guidance arguments (``guidance_scale``, ``true_cfg_scale``, ...)."""
    return sorted(k for k, v in recs[0].args.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                  and ("guidance" in k or "cfg" in k))


def derive(recs: Sequence[Recording], defaults: dict[str, Any], num_train_timesteps: int = 1000) -> Facts:
    """The facts of the description, from two recordings that differ in seed, steps and guidance.

    ``defaults``: the pipeline's ``__call__`` defaults (the guidance scale the description names);
    ``num_train_timesteps``: the scheduler's (``T`` of the sigma rules).
    Raises :class:`DescribeError` naming what does not match.
    """
    import torch

    per_step = _check_structure(recs)
    _undouble(recs)
    for r in recs:
        for arg, given in list(r.args.items()):  # a list of numbers (DiT's class_labels) is a tensor
            if isinstance(given, list) and given and all(isinstance(x, int) and not isinstance(x, bool)
                                                         for x in given):
                r.args[arg] = torch.tensor(given)
            # a call argument given as one tensor per prompt (Z-Image's prompt_embeds) is their batch
            elif isinstance(given, list) and given and all(isinstance(x, torch.Tensor) and x.shape == given[0].shape
                                                         for x in given):
                r.args[arg] = torch.stack(given)
    nests: dict[str, Nest] = {}
    rows = recs[0].steps[0].sample.shape[0]
    per_sample = (rows, 2 * rows)
    for _r, _s, _i, c in _calls(recs):
        c.kwargs, nested = flatten_kwargs(c.kwargs, per_sample)
        if nests and nested != nests:
            raise DescribeError("the transformer's nested arguments change between calls; rkpart exports one "
                                "graph for every call")
        nests = nested
    latent_input, call_batch = _latent_input(recs)
    loop_batch = recs[0].steps[0].sample.shape[0]
    mode = "two-pass" if per_step == 2 else "batched" if call_batch == 2 * loop_batch else "none"
    scale_args = _scale_arguments(recs)

    first = recs[0].steps[0].calls[0].kwargs
    facts: dict[str, InputFact] = {}
    fixed: dict[str, Any] = {}
    timestep: tuple[str, float, float] | None = None
    guidance: tuple[str, float, str] | None = None
    for name, v in first.items():
        if not isinstance(v, torch.Tensor):
            if _holds_tensor(v):
                raise DescribeError(f"transformer argument {name!r} is a {type(v).__name__} holding tensors; rkpart "
                                    "exports tensor inputs only")
            fixed[name] = v
            continue
        if name == latent_input:
            facts[name] = InputFact(name, "latent")
            continue
        src = _argument_source(name, recs, mode)
        if src is not None:
            arg, neg, fill = src
            facts[name] = InputFact(name, _role_of_argument(arg), arg, neg, negative_fill=fill)
            continue
        fit = _fit_timestep(name, recs)
        if fit is not None and timestep is None:
            timestep = (name, *fit)
            facts[name] = InputFact(name, "timestep")
            continue
        found = next(((a, k) for a in scale_args if (k := _guidance_factor(name, recs, a)) is not None), None)
        if found is not None and guidance is None:
            guidance = (name, found[1], found[0])
            facts[name] = InputFact(name, "guidance")
            continue
        value = _constant(name, recs)
        if value is not None and v.is_complex():
            # ONNX has no complex inputs: a complex constant (Lumina-Next's RoPE table) is the model's, baked in
            # (the export's patches make it real)
            fixed[name] = v
            continue
        if value is not None:
            facts[name] = InputFact(name, _role_of_constant(name), value=value)
            continue
        appended = _appended_source(name, recs, mode)
        if appended is not None:
            arg, neg, fill, n = appended
            facts[name] = InputFact(name, _role_of_argument(arg), arg, neg, negative_fill=fill, append_valid=n)
            continue
        raise DescribeError(f"transformer input {name!r} is neither a call argument, the loop latent, the timestep "
                            "(scale * t + offset), the guidance nor a constant; rkpart cannot tell where the "
                            "pipeline takes it from")
    for _r, _s, _i, c in _calls(recs):
        if set(_tensors(c.kwargs)) - fixed.keys() != {n for n, f in facts.items()}:
            raise DescribeError("the transformer's tensor arguments differ between calls "
                                f"({sorted(_tensors(c.kwargs))} vs {sorted(facts)})")
    if timestep is None:
        raise DescribeError("no transformer input follows the scheduler's timesteps (scale * t + offset)")
    if guidance is not None and mode == "none":
        mode = "distilled"

    cond_call = _cond_call(facts, recs) if mode == "two-pass" else None
    # a token sequence (B, tokens, channels: packed latents) has its channels last
    channels_axis = 2 if recs[0].steps[0].sample.dim() == 3 else 1
    cond_first = mode == "batched" and _cond_first(facts, recs)
    learned_sigma, sign, scale_arg, combine, renorm, cfg_channels = _find_combination(
        recs, mode, cond_call, scale_args, channels_axis, cond_first)
    if guidance is not None:
        scale_arg = guidance[2]
    gdefault = defaults.get(scale_arg) if scale_arg else None
    mu, mu_rule, seq_len = _mu(recs)
    return Facts(
        inputs=facts, cfg_mode=mode, scale_argument=scale_arg,
        guidance_scale=float(gdefault) if isinstance(gdefault, (int, float)) else None,
        guidance_input=guidance[0] if guidance else None,
        guidance_input_scale=guidance[1] if guidance else None,
        cond_call=cond_call, learned_sigma=learned_sigma, sign=sign, channels_axis=channels_axis,
        timestep_input=timestep[0], timestep_scale=timestep[1], timestep_offset=timestep[2],
        sigmas_rule=_named_rule(recs, "sigmas", SIGMA_RULES, num_train_timesteps), mu=mu, mu_rule=mu_rule,
        image_seq_len=seq_len,
        timesteps_rule=_named_rule(recs, "timesteps", TIMESTEP_RULES, num_train_timesteps),
        latent_init=_latent_init(recs),
        latent_input=latent_input,
        call_batch=call_batch, pipeline_batch=call_batch, fixed=fixed, nests=nests, combine=combine, renorm=renorm,
        cond_first=cond_first, cfg_channels=cfg_channels,
    )


def _holds_tensor(v: Any) -> bool:
    import torch

    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, dict):
        return any(_holds_tensor(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(_holds_tensor(x) for x in v)
    return False


def _cond_first(facts: dict[str, InputFact], recs: Sequence[Recording]) -> bool:
    """Batched: whether the pair is ``[cond, uncond]`` (every input fed two arguments agrees)."""
    import torch

    orders = set()
    c0, args = recs[0].steps[0].calls[0].kwargs, recs[0].args
    for f in facts.values():
        if f.argument is None or (f.negative_argument in (None, f.argument) and f.negative_fill is None):
            continue
        pos = args[f.argument]
        neg = torch.full_like(pos, f.negative_fill) if f.negative_fill is not None else args[f.negative_argument or ""]
        orders.add(bool(same(c0[f.name], torch.cat([pos, neg]))) and not same(c0[f.name], torch.cat([neg, pos])))
    if len(orders) > 1:
        raise DescribeError("the pipeline's batched CFG pair puts the conditional row first for one input and second "
                            "for another")
    return orders == {True}


def _cond_call(facts: dict[str, InputFact], recs: Sequence[Recording]) -> int:
    """Two-pass: the conditional call of a step is the one fed the non-negative argument."""
    for f in facts.values():
        if f.argument is not None and (f.negative_fill is not None or (f.negative_argument is not None
                                                            and f.argument != f.negative_argument)):
            r = recs[0]
            c0 = r.steps[0].calls[0].kwargs[f.name]
            return 0 if same(c0, r.args[f.argument]) else 1
    raise DescribeError("the pipeline calls its transformer twice per step with the same arguments; rkpart "
                        "cannot tell the conditional pass from the unconditional one")


def _find_combination(recs: Sequence[Recording], mode: str, cond_call: int | None, scale_args: list[str],
                      axis: int, cond_first: bool = False) -> tuple[bool, int, str | None, str, str | None, int | None]:
    """``(learned_sigma, sign, scale argument, combine, renorm)`` giving every step's model_output.

    The CFG candidates are the forms of :data:`COMBINES` (the usual one first), each with and without the
    rescale of :data:`RENORMS`; the two recordings' guidance scales differ, so a form that holds at both is
    the pipeline's function of ``g``, not a coincidence of one scale.
    """
    scales: list[str | None] = list(scale_args) if mode in ("batched", "two-pass") else [None]
    cfg = mode in ("batched", "two-pass")
    forms: list[tuple[str, str | None, int | None]] = [(c, r, None) for r in (None, *RENORMS) for c in COMBINES] \
        if cfg else [(STANDARD, None, None)]
    out_channels = recs[0].steps[0].calls[0].output.shape[axis] if cfg else 0
    # then the usual form on the first k channels only, the rest the conditional prediction's (Lumina-Next)
    forms += [(STANDARD, None, k) for k in range(1, out_channels)]
    for combine, renorm, channels in forms:
        for scale_arg in scales:
            for learned in (False, True):
                for sign in (1, -1):
                    how = Combination(mode, cond_call, learned=learned, sign=sign, axis=axis, combine=combine,
                                      renorm=renorm, cond_first=cond_first, channels=channels)
                    ok = True
                    for r in recs:
                        for s in r.steps:
                            g = float(r.args[scale_arg]) if scale_arg else 1.0
                            x = combine_outputs([c.output for c in s.calls], how, g)
                            if x is None or x.numel() != s.model_output.numel() or not same(
                                    x.to(s.model_output.dtype).reshape(s.model_output.shape), s.model_output,
                                    rtol=1e-4):
                                ok = False
                                break
                        if not ok:
                            break
                    if ok:
                        return learned, sign, scale_arg, combine, renorm, channels
    # name the first step no candidate reproduces
    r, s = recs[0], recs[0].steps[0]
    shapes = [tuple(c.output.shape) for c in s.calls]
    forms_said = " or ".join(COMBINES) + f", with or without {' / '.join(RENORMS)}"
    raise DescribeError(f"step 1 of {len(r.steps)}: no combination of the transformer output(s) {shapes} (CFG "
                        f"{forms_said}, or none; learned-sigma split or none; sign) gives the "
                        f"scheduler's model_output {tuple(s.model_output.shape)}")


#: the CFG combinations of ``cond`` and ``uncond`` at guidance scale ``g`` (``cfg.combine``, docs/pipeline-json.md)
STANDARD = "uncond + g * (cond - uncond)"
COMBINES: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    STANDARD: lambda cond, uncond, g: uncond + g * (cond - uncond),
    # Krea 2: the usual form at g + 1
    "cond + g * (cond - uncond)": lambda cond, uncond, g: cond + g * (cond - uncond),
}
#: rescales of the combination ``x`` (``cfg.renorm``): ``cond_l2_last_axis`` is ``x * |cond| / |x|``, the L2
#: norms over the last axis of the transformer output (keepdim): Lumina 2's and Nucleus-MoE's CFG normalisation
RENORMS = ("cond_l2_last_axis",)


@dataclass(frozen=True)
class Combination:
    """How a step's transformer outputs give the scheduler's ``model_output`` (:func:`combine_outputs`).

    ``mode`` is the CFG mode (``Facts.cfg_mode``); two-pass: ``cond_call`` is the conditional call,
    batched: ``cond_first`` puts the conditional row first.  ``combine`` (a key of :data:`COMBINES`)
    applies to the first ``channels`` channels (``None``: all), then the ``renorm`` rescale (one of
    :data:`RENORMS`), then the learned-sigma split along ``axis`` (``learned``), then the ``sign``.
    """

    mode: str
    cond_call: int | None = None
    learned: bool = False
    sign: int = 1
    axis: int = 1
    combine: str = STANDARD
    renorm: str | None = None
    cond_first: bool = False
    channels: int | None = None

    @classmethod
    def of(cls, facts: Facts) -> Combination:
        """The combination ``facts`` describe."""
        return cls(facts.cfg_mode, facts.cond_call, learned=facts.learned_sigma, sign=facts.sign,
                   axis=facts.channels_axis, combine=facts.combine, renorm=facts.renorm, cond_first=facts.cond_first,
                   channels=facts.cfg_channels)


def combine_outputs(outputs: Sequence[torch.Tensor], how: Combination, g: float) -> torch.Tensor | None:
    """The scheduler's ``model_output`` from a step's transformer outputs at guidance scale ``g``, as ``how``
    says: the CFG ``combine`` form (on the first ``channels`` channels only, the rest the conditional
    prediction's), then the ``renorm`` rescale, then the learned-sigma split, then the sign; ``None`` when
    the outputs do not fit ``how``."""
    import torch

    mode, cond_call, axis, channels = how.mode, how.cond_call, how.axis, how.channels
    if mode in ("two-pass", "batched"):
        if mode == "two-pass":
            if len(outputs) != 2 or cond_call is None:
                return None
            cond, uncond = outputs[cond_call], outputs[1 - cond_call]
        else:
            if len(outputs) != 1 or outputs[0].shape[0] % 2:
                return None
            uncond, cond = outputs[0].chunk(2)
            if how.cond_first:
                cond, uncond = uncond, cond
        if channels is not None:
            if cond.dim() <= axis or cond.shape[axis] <= channels:
                return None
            head = COMBINES[how.combine](cond.narrow(axis, 0, channels), uncond.narrow(axis, 0, channels), g)
            x = torch.cat([head, cond.narrow(axis, channels, cond.shape[axis] - channels)], dim=axis)
        else:
            x = COMBINES[how.combine](cond, uncond, g)
        if how.renorm == "cond_l2_last_axis":
            x = x * (cond.norm(dim=-1, keepdim=True) / x.norm(dim=-1, keepdim=True))
        elif how.renorm is not None:
            raise ValueError(f"unknown renorm {how.renorm!r}")
    else:
        if len(outputs) != 1:
            return None
        x = outputs[0]
    if how.learned:
        if x.dim() <= axis or x.shape[axis] % 2:
            return None
        x = x.chunk(2, dim=axis)[0]
    return -x if how.sign < 0 else x


def _named_rule(recs: Sequence[Recording], arg: str, rules: dict[str, Callable[[int, int], np.ndarray]],
                t: int) -> str | None:
    """The name of the rule of ``rules`` the ``arg`` passed to ``set_timesteps`` follows at every step count."""
    given = [r.set_timesteps.get(arg) for r in recs]
    if all(s is None for s in given):
        return None
    if any(s is None for s in given):
        raise DescribeError(f"the pipeline passes {arg} to set_timesteps at one step count and not at another")
    for name, rule in rules.items():
        if all(np.allclose(np.asarray(s, dtype=np.float64), rule(len(r.steps), t), rtol=1e-6, atol=1e-7)
               for s, r in zip(given, recs, strict=True)):
            return name
    shown = np.round(np.asarray(given[0], dtype=np.float64), 4).tolist()
    raise DescribeError(f"the {arg} the pipeline passes to set_timesteps ({shown} for {len(recs[0].steps)} steps) "
                        f"follow no rule rkpart knows ({', '.join(rules)})")


#: ``mu`` the pipeline passes to ``set_timesteps`` when it depends on the step count ``n``, by name: a rule of the
#: image token count ``L`` (``set_timesteps.image_seq_len``) and ``n``
MU_RULES: dict[str, Callable[[int, int], float]] = {"flux2_empirical": flux2_empirical_mu}


def _image_seq_lens(recs: Sequence[Recording]) -> list[int]:
    """Candidates for the image token count a ``mu`` rule reads: the loop latent's tokens (``(B, N, C)``) or
    its positions (``(B, C, H, W)``: ``H * W``; 2x2 patches of them: ``H * W / 4``)."""
    shape = tuple(recs[0].steps[0].sample.shape)
    if len(shape) == 3:
        return [shape[1]]
    hw = math.prod(shape[2:])
    return [hw, hw // 4]


def _mu(recs: Sequence[Recording]) -> tuple[float | None, str | None, int | None]:
    """``(mu, None, None)`` for a ``mu`` the same at every step count, ``(None, rule, image_seq_len)`` for one
    that follows a rule of :data:`MU_RULES`, ``(None, None, None)`` when the pipeline passes none."""
    mus = [r.set_timesteps.get("mu") for r in recs]
    known = {"num_inference_steps", "device", "sigmas", "mu", "timesteps"}
    for r in recs:
        extra = sorted(k for k, v in r.set_timesteps.items() if k not in known and v is not None)
        if extra:
            raise DescribeError(f"the pipeline passes {', '.join(extra)} to set_timesteps; rkpart records only "
                                "the step count, sigmas, timesteps and mu")
    if all(m is None for m in mus):
        return None, None, None
    vals = [float(m) for m in mus if m is not None]
    if len(vals) != len(mus):
        raise DescribeError("the pipeline passes mu to set_timesteps at one step count and not at another")
    if all(abs(v - vals[0]) <= 1e-9 * max(1.0, abs(vals[0])) for v in vals):
        return vals[0], None, None
    for name, rule in MU_RULES.items():
        for seq_len in _image_seq_lens(recs):
            if all(abs(rule(seq_len, len(r.steps)) - v) <= 1e-9 * max(1.0, abs(v)) for r, v in zip(recs, vals,
                                                                                                     strict=True)):
                return None, name, seq_len
    raise DescribeError(f"mu passed to set_timesteps changes with the step count ({mus}) and follows no rule rkpart "
                        f"knows ({', '.join(MU_RULES)})")


def _latent_init(recs: Sequence[Recording]) -> str:
    results = []
    for r in recs:
        given, first = r.args["latents"], r.steps[0].sample
        if same(first, given, rtol=1e-6):
            results.append("identity")
        elif same(first, given * r.init_noise_sigma, rtol=1e-6):
            results.append("init_noise_sigma")
        elif given.dim() >= 3 and same(first, to_tokens(given), rtol=1e-6):
            results.append("tokens")
        else:
            raise DescribeError("the pipeline changes the given latents= before its loop in a way rkpart does not "
                                "reproduce (as given, times the scheduler's init_noise_sigma, or its positions as "
                                "row-major tokens)")
    if len(set(results)) == 1:
        return results[0]
    if set(results) == {"identity", "init_noise_sigma"}:
        return "init_noise_sigma"
    raise DescribeError(f"the pipeline prepares the given latents= differently at two step counts ({results})")


def to_tokens(x: torch.Tensor) -> torch.Tensor:
    """``latent.init: tokens``: ``(B, C, *positions)`` -> ``(B, prod(positions), C)``, positions row-major
    (Flux.2's ``_pack_latents``)."""
    return x.flatten(2).transpose(1, 2)


# -- replay ----------------------------------------------------------------------------------------


def step_inputs(facts: Facts, args: dict[str, Any], latent: torch.Tensor, t: torch.Tensor,
                dtypes: dict[str, torch.dtype]) -> list[dict[str, torch.Tensor]]:
    """The transformer's inputs for one step, one dict per call, built from the description alone."""
    import torch

    calls = 2 if facts.cfg_mode == "two-pass" else 1
    out: list[dict[str, torch.Tensor]] = []
    for k in range(calls):
        cond = facts.cfg_mode != "two-pass" or k == facts.cond_call
        feeds: dict[str, torch.Tensor] = {}
        for name, f in facts.inputs.items():
            if f.role == "latent":
                v = torch.cat([latent, latent]) if facts.call_batch == 2 * latent.shape[0] else latent
            elif name == facts.timestep_input:
                tv = float(_scalar_value(_t(t)) or 0.0) * facts.timestep_scale + facts.timestep_offset
                v = torch.full((facts.call_batch,), tv, dtype=torch.float64)
            elif name == facts.guidance_input:
                g = float(args[facts.scale_argument or "guidance_scale"]) * (facts.guidance_input_scale or 1.0)
                v = torch.full((facts.call_batch,), g, dtype=torch.float64)
            elif f.value is not None:
                v = torch.from_numpy(f.value)
            elif facts.cfg_mode == "batched":
                pos = args[f.argument or ""]
                neg = torch.full_like(pos, f.negative_fill) if f.negative_fill is not None \
                    else args[f.negative_argument or ""]
                v = torch.cat([pos, neg] if facts.cond_first else [neg, pos])
            elif not cond and f.negative_fill is not None:
                v = torch.full_like(args[f.argument or ""], f.negative_fill)
            else:
                v = args[(f.argument if cond else f.negative_argument) or ""]
            if f.append_valid and f.value is None:
                v = torch.cat([v.to(dtypes[name]), torch.ones((*v.shape[:-1], f.append_valid), dtype=dtypes[name])],
                              dim=-1)
            feeds[name] = v.to(dtypes[name])
        out.append(feeds)
    return out


def replay(facts: Facts, rec: Recording, transformer: Any, scheduler_cls: Any, scheduler_config: dict[str, Any],
           dtypes: dict[str, torch.dtype], shapes: dict[str, tuple[int, ...]]) -> None:
    """Run the recorded call's loop from the description alone; raise if any step differs.

    A fresh scheduler of ``scheduler_cls`` from ``scheduler_config`` gets ``set_timesteps`` as the
    description says; the transformer gets inputs built by :func:`step_inputs` (reshaped to the
    recorded ``shapes``: a timestep broadcast as the pipeline broadcasts it); the outputs are
    combined by :func:`combine_outputs`.
    """
    import torch

    sched = scheduler_cls.from_config(scheduler_config)
    n = len(rec.steps)
    kwargs: dict[str, Any] = {}
    if facts.mu is not None:
        kwargs["mu"] = facts.mu
    elif facts.mu_rule is not None:
        kwargs["mu"] = MU_RULES[facts.mu_rule](facts.image_seq_len or 0, n)
    t_train = int(scheduler_config.get("num_train_timesteps") or 1000)
    if facts.timesteps_rule is not None:
        kwargs["timesteps"] = TIMESTEP_RULES[facts.timesteps_rule](n, t_train)
    if facts.sigmas_rule is not None:
        kwargs["sigmas"] = SIGMA_RULES[facts.sigmas_rule](n, t_train)
    if "sigmas" in kwargs or "timesteps" in kwargs:
        sched.set_timesteps(**kwargs)
    else:
        sched.set_timesteps(n, **kwargs)
    if rec.timesteps is None or not same(sched.timesteps, rec.timesteps, rtol=1e-6):
        raise DescribeError(f"the scheduler's timesteps made from the description ({sched.timesteps.tolist()}) "
                            f"differ from the pipeline's ({None if rec.timesteps is None else rec.timesteps.tolist()})")
    latent = rec.args["latents"].clone()
    if facts.latent_init == "init_noise_sigma":
        latent = latent * sched.init_noise_sigma
    elif facts.latent_init == "tokens":
        latent = to_tokens(latent)
    step_kwargs: dict[str, Any] = {}
    if "generator" in __import__("inspect").signature(sched.step).parameters:
        # a stochastic scheduler (DDPM) draws its noise from the call's generator, as the pipeline passed it
        gen = torch.Generator()
        if rec.generator_state is not None:
            gen.set_state(rec.generator_state)
        step_kwargs["generator"] = gen
    g = float(rec.args[facts.scale_argument]) if facts.scale_argument else 1.0
    how = Combination.of(facts)
    for i, t in enumerate(sched.timesteps):
        outs = []
        for feeds in step_inputs(facts, rec.args, latent, t, dtypes):
            feeds = {k: v.reshape(shapes[k]) if v.numel() == math.prod(shapes[k]) else v.expand(shapes[k])
                     for k, v in feeds.items()}
            with torch.no_grad():
                out = transformer(**nest_kwargs({**feeds, **facts.fixed}, facts.nests))
            from rkpart.export.record import first_output

            outs.append(first_output(out))
        mo = combine_outputs(outs, how, g)
        assert mo is not None
        latent = sched.step(mo.reshape(latent.shape), t, latent, return_dict=False, **step_kwargs)[0]
        if not same(latent, rec.steps[i].prev_sample, rtol=1e-4):
            err = float((latent - rec.steps[i].prev_sample).abs().max())
            raise DescribeError(f"step {i + 1} of {n}: the loop run from the description differs from the "
                                f"pipeline's (max |error| {err:.3g})")
