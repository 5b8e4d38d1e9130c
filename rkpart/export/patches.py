"""The patch registry: what makes each diffusers transformer class exportable, and the check that it
changes nothing.

One registry, :data:`PATCHES`, keyed by the diffusers class name (``type(model).__name__``, e.g.
``"Lumina2Transformer2DModel"``), maps a class to its ordered patches.  A patch rewrites the
eval-mode module in place into an exportable form of the *same function*: complex RoPE as real
cos/sin, list inputs flattened, mixture-of-experts and block-sparse attention in dense form,
``rms_norm`` decomposed for TorchScript, ...  Classes that export as they are have no entry.
:data:`GENERIC` patches apply to every class (filtered by exporter).

Two kinds (:attr:`Patch.kind`):

* ``"rewrite"``: the model still takes the same inputs.  :func:`apply_patches` checks each one:
  the patched model's output on the export inputs (and on every input variant, e.g. a second
  attention mask) must equal the unpatched model's within tolerances that follow the dtype
  (:data:`TOLERANCES`); otherwise it raises :class:`PatchError` (exit code 11), naming the patch.
* ``"adapter"``: gives ``forward`` tensor inputs where diffusers takes lists, cache objects or
  dicts.  The unpatched model cannot be called on the export inputs, so an adapter is not
  checked: it calls the model's own forward.  Adapters run first; the reference every rewrite is
  checked against is the adapted model's output.

What is *not* here: changes that make a random-weight test model non-degenerate (zero-initialised
modulation made non-zero, ``tests/models/diffusers_families.py::_trained_like``) or that install
the processor a parent model would (DreamLite's GQA processor): a user's checkpoint needs neither,
so they stay with the test fixtures.

Importing this module needs neither torch nor diffusers: they are imported when a patch runs.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rkpart.errors import ExportError
from rkpart.export.rewrites import attention, graph, rope, signature

if TYPE_CHECKING:
    import torch

#: the exporters :func:`rkpart.export.export_module` drives
EXPORTERS: tuple[str, ...] = ("torchscript", "dynamo")

#: ``fn(model, inputs, fixed)``: rewrites ``model`` in place; may update ``inputs`` (graph inputs by
#: name) and ``fixed`` (keyword arguments of ``forward`` fixed at export time)
PatchFn = Callable[[Any, dict[str, Any], dict[str, Any]], None]


@dataclass(frozen=True)
class Patch:
    """One rewrite of a diffusers module into an exportable form of the same function."""

    name: str
    #: what it is for, one line
    why: str
    fn: PatchFn
    kind: Literal["rewrite", "adapter"] = "rewrite"
    #: the exporters that need it (others export the unpatched module)
    exporters: tuple[str, ...] = EXPORTERS


@dataclass(frozen=True)
class Applied:
    """A patch :func:`apply_patches` applied, and how far its output was from the reference."""

    name: str
    kind: str
    #: largest |patched - reference| over the checked input sets (None: an adapter, not checked)
    max_abs: float | None
    #: the tolerance it was checked against: ``atol + rtol * |reference|`` elementwise
    rtol: float | None
    atol: float | None


@dataclass(frozen=True)
class Patched:
    """What :func:`apply_patches` did, and the references every later check compares with."""

    applied: tuple[Applied, ...]
    #: the input overrides checked besides the export inputs (:func:`mask_variants` by default)
    overrides: tuple[dict[str, Any], ...]
    #: the adapted, unrewritten model's first output on the export inputs, then on each override
    references: tuple[torch.Tensor, ...]


class PatchError(ExportError):
    """A patch changed the model's output (a bug in the patch, or a config it does not handle)."""


#: dtype name -> (rtol, atol) of the patch check (torch.testing's defaults per dtype, rtol for
#: float32 loosened to 1e-4: real-form RoPE in float32 against diffusers' complex128 products
#: differs by up to ~3e-5 relative on SANA-WM's tiny model)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
}


def _p(name: str, why: str, fn: PatchFn, kind: Literal["rewrite", "adapter"] = "rewrite",
       exporters: tuple[str, ...] = EXPORTERS) -> Patch:
    return Patch(name, why, fn, kind, exporters)


#: diffusers class name -> its patches, in the order they apply (adapters first)
PATCHES: dict[str, tuple[Patch, ...]] = {
    "Lumina2Transformer2DModel": (
        _p("real_rope", "complex RoPE as real cos/sin, caption positions computed from the mask in the graph",
           rope.real_rope_lumina2),
    ),
    "LuminaNextDiT2DModel": (
        _p("real_rope", "the pipeline's complex64 RoPE table as a real (cos, sin) table", rope.real_rope_lumina_next),
    ),
    "BriaFiboTransformer2DModel": (
        _p("list_inputs", "the per-block text-encoder layers (a list) as one graph input each",
           signature.list_inputs, "adapter"),
    ),
    "BriaFibo2Transformer2DModel": (
        _p("real_rope", "complex RoPE as real cos/sin pairs gathered by position", rope.real_rope_fibo2),
    ),
    "GlmImageTransformer2DModel": (
        _p("prior_drop_where", "the prior codes' boolean-mask drop as a where (no NonZero)",
           graph.prior_drop_where_glm),
    ),
    "HiDreamImageTransformer2DModel": (
        _p("dense_moe", "top-k MoE FFNs as every expert weighed by its gate (no data-dependent grouping)",
           attention.dense_moe_hidream),
    ),
    "Ideogram4Transformer2DModel": (
        _p("mrope_where", "the MRoPE interleave as where with constant masks (no index_put)",
           rope.mrope_where_ideogram4),
    ),
    "Krea2Transformer2DModel": (
        _p("decomposed_rms_norm", "F.rms_norm (weight 1 + w) decomposed (no TorchScript symbolic)",
           graph.decomposed_rms_norm_krea2),
    ),
    "NucleusMoEImageTransformer2DModel": (
        _p("real_rope_static_experts", "complex RoPE as real cos/sin; expert-choice split by its static size",
           rope.real_rope_static_experts_nucleus),
    ),
    "OmniGenTransformer2DModel": (
        _p("static_rope_factors", "the SuScaled RoPE's short/long choice made from the static length",
           rope.static_rope_factors_omnigen),
    ),
    "QwenImage21Transformer2DModel": (
        _p("real_rope_static_layout", "complex RoPE as real cos/sin; the static layout's token metadata as constants",
           rope.real_rope_qwenimage21),
    ),
    "ZImageTransformer2DModel": (
        _p("list_forward", "per-sample list inputs and output as batch tensors", signature.list_forward_zimage,
           "adapter"),
        _p("pad_sequence", "pad_sequence as pad + stack (no TorchScript symbolic)", graph.pad_sequence_zimage),
        _p("real_rope", "complex RoPE as real (cos, sin) pairs", rope.real_rope_zimage),
    ),
    "Kandinsky6SRTransformer3DModel": (
        _p("dense_nabla", "NABLA block-sparse flex attention as SDPA with the same block mask, dense",
           attention.dense_nabla_kandinsky6_sr),
    ),
    "AnyFlowTransformer3DModel": (
        _p("real_rope", "complex RoPE as real cos/sin tables for the static layout", rope.real_rope_anyflow),
    ),
    "AnyFlowFARTransformer3DModel": (
        _p("kv_cache_inputs", "the step's KV caches as two stacked tensor inputs", signature.kv_cache_inputs_far,
           "adapter"),
        _p("real_rope_sdpa", "complex RoPE as real cos/sin; unmasked flex attention as SDPA",
           attention.real_rope_sdpa_far),
    ),
    "Cosmos3OmniTransformer": (
        _p("one_video", "one video tensor in, its prediction out (diffusers takes and returns lists)",
           signature.one_video_cosmos3, "adapter"),
        _p("repeat_kv", "GQA with key/value heads repeated (no enable_gqa SDPA)", attention.repeat_kv_cosmos3),
    ),
    "WanAnimateTransformer3DModel": (
        _p("static_motion_qr", "the motion encoder's QR factor of its weights computed once (no linalg_qr)",
           graph.static_motion_qr_wan_animate),
    ),
    "SanaWMTransformer3DModel": (
        _p("real_rope_precomputed_camera", "camera transforms as inputs and RoPE as real tables (no rad2deg, "
           "no complex)", rope.real_rope_sana_wm),
    ),
    "SanaWMLTX2RefinerTransformer3DModel": (
        _p("kv_cache_inputs", "the sink / history KV cache as stacked tensor inputs",
           signature.kv_cache_inputs_sana_wm_refiner, "adapter"),
    ),
    "EasyAnimateTransformer3DModel": (
        _p("static_rope", "RoPE tables computed once for the static shape (no round of a traced size)",
           rope.static_rope_easyanimate),
    ),
    "AceStepTransformer1DModel": (
        _p("repeat_kv", "GQA with key/value heads repeated (no enable_gqa SDPA)", attention.repeat_kv_ace_step),
    ),
}

#: patches of every class, after the class's own
GENERIC: tuple[Patch, ...] = (
    _p("decompose_rms_norm", "torch.nn.RMSNorm decomposed (aten::rms_norm: no TorchScript symbolic below opset 23)",
       graph.decompose_rms_norm, exporters=("torchscript",)),
)


def patches_for(class_name: str, exporter: str) -> tuple[Patch, ...]:
    """The patches :func:`apply_patches` applies to a ``class_name`` model exported by ``exporter``.

    Raises ``ValueError`` for an exporter not in :data:`EXPORTERS`.
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; expected one of {', '.join(EXPORTERS)}")
    return tuple(p for p in (*PATCHES.get(class_name, ()), *GENERIC) if exporter in p.exporters)


def apply_patches(model: torch.nn.Module, inputs: dict[str, Any], fixed: dict[str, Any], *, exporter: str,
                  variants: Sequence[Mapping[str, Any]] | None = None) -> Patched:
    """Apply ``patches_for(type(model).__name__, exporter)`` to ``model`` in place, checking each rewrite.

    ``inputs`` and ``fixed`` are updated as the patches require.  ``variants`` are overrides of some
    inputs (e.g. another attention mask) merged over ``inputs`` to make more input sets the
    rewrites are checked on; ``None``: :func:`mask_variants` of the adapted inputs.

    Returns the applied patches, the overrides and the reference outputs (the adapted, unrewritten
    model's output on each input set: the export inputs first, then each override).

    Raises :class:`PatchError` when a rewrite changes the output beyond :data:`TOLERANCES`, or when
    the model (or a patch) fails on the export inputs.
    """
    import torch

    name = type(model).__name__
    todo = patches_for(name, exporter)
    applied: list[Applied] = []
    for p in todo:
        if p.kind == "adapter":
            _run_patch(p, name, model, inputs, fixed)
            applied.append(Applied(p.name, p.kind, None, None, None))
    overrides = [dict(o) for o in (mask_variants(inputs) if variants is None else variants)]
    with torch.no_grad():
        refs = [_forward(model, {**inputs, **o}, fixed, name, None) for o in ({}, *overrides)]
    for p in todo:
        if p.kind == "adapter":
            continue
        _run_patch(p, name, model, inputs, fixed)
        worst = 0.0
        rtol = atol = 0.0
        with torch.no_grad():
            for o, ref in zip(({}, *overrides), refs, strict=True):
                got = _forward(model, {**inputs, **o}, fixed, name, p)
                rtol, atol = TOLERANCES.get(str(ref.dtype).removeprefix("torch."), TOLERANCES["float32"])
                worst = max(worst, _check_close(got, ref, rtol, atol, p, name, o))
        applied.append(Applied(p.name, p.kind, worst, rtol, atol))
    return Patched(tuple(applied), tuple(overrides), tuple(refs))


def mask_variants(inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One more value for every attention-mask input, as an override of ``inputs``.

    A mask input is an integer or boolean tensor of rank >= 2 whose name contains ``mask`` or ``drop``
    (GLM-Image's ``prior_token_drop``, what classifier-free guidance changes); its last axis is the
    masked sequence.  The variant is a valid prefix of half the length (rounded
    up) where the mask is all valid, and all valid where it is not: an export must agree with
    torch on both, so the conditional and unconditional passes (whose masks differ) run on one
    graph.  Empty when there is no mask input.
    """
    import torch

    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if (not isinstance(value, torch.Tensor) or not any(w in key.lower() for w in ("mask", "drop"))
                or value.dim() < 2
                or value.dtype.is_floating_point or value.shape[-1] < 2):
            continue
        if bool(value.bool().all()):
            keep = math.ceil(value.shape[-1] / 2)
            new = torch.zeros_like(value)
            new[..., :keep] = 1 if value.dtype != torch.bool else True
        else:
            new = torch.ones_like(value)
        out[key] = new
    return [out] if out else []


def _run_patch(p: Patch, name: str, model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
    try:
        p.fn(model, inputs, fixed)
    except Exception as e:  # a patch meeting a config it does not handle: say which one, in one line
        raise PatchError(f"{name}: patch {p.name!r} failed: {_line(e)}") from e


def _forward(model: Any, inputs: Mapping[str, Any], fixed: Mapping[str, Any], name: str,
             patch: Patch | None) -> torch.Tensor:
    """``model``'s first output tensor on ``inputs`` (the unpatched model's when ``patch`` is None)."""
    import torch

    try:
        with warnings.catch_warnings():  # diffusers' own (flex attention without torch.compile, ...)
            warnings.simplefilter("ignore")
            out: Any = model(**inputs, **fixed, return_dict=False)
    except Exception as e:
        what = f"after patch {patch.name!r}" if patch is not None else "before its patches"
        raise PatchError(f"{name} failed on the export inputs {what}: {_line(e)}") from e
    while isinstance(out, list | tuple):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise PatchError(f"{name}: the first output is a {type(out).__name__}, not a tensor")
    return out


def _check_close(got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float, p: Patch, name: str,
                 override: Mapping[str, Any]) -> float:
    """max |got - ref|; raises :class:`PatchError` when some element is off by more than ``atol + rtol |ref|``."""
    import torch

    if got.shape != ref.shape:
        raise PatchError(f"{name}: patch {p.name!r} changed the output shape from {tuple(ref.shape)} to "
                         f"{tuple(got.shape)}")
    g, r = got.detach().double(), ref.detach().double()
    diff = (g - r).abs()
    finite = torch.isfinite(r)
    if not torch.equal(torch.isfinite(g), finite):
        bad = True
    else:
        bad = bool((diff[finite] > atol + rtol * r[finite].abs()).any())
    worst = float(diff[finite].max()) if bool(finite.any()) else 0.0
    if bad:
        on = f" with {', '.join(sorted(override))} varied" if override else ""
        raise PatchError(f"{name}: patch {p.name!r} changed the output{on}: max |diff| {worst:.3g} "
                         f"(rtol {rtol:g}, atol {atol:g}); this is a bug in the patch, please report it")
    return worst


def _line(e: BaseException) -> str:
    from rkpart.errors import describe_exception

    return describe_exception(e)


def supported_classes() -> list[str]:
    """Every class with registered patches, sorted (classes without patches may export as they are)."""
    return sorted(PATCHES)


def describe(class_names: Iterable[str] | None = None) -> list[str]:
    """``Class: patch (kind) -- why`` lines for ``class_names`` (all registered classes by default)."""
    lines = []
    for cls in sorted(class_names if class_names is not None else PATCHES):
        for p in (*PATCHES.get(cls, ()), *GENERIC):
            only = "" if p.exporters == EXPORTERS else f", {'/'.join(p.exporters)} only"
            lines.append(f"{cls}: {p.name} ({p.kind}{only}) -- {p.why}")
    return lines
