"""Record one real call of a diffusers pipeline: what its transformer, scheduler and VAE were given.

``rkpart export`` does not keep a table of which pipeline feeds which transformer input how.  It
runs the pipeline's own ``__call__`` and writes down what crossed the borders of the three
components it exports or reproduces:

- every call of the transformer's ``forward`` (its arguments by parameter name, and its first
  output, the prediction);
- ``scheduler.set_timesteps`` (its arguments) and the ``timesteps`` it made;
- every ``scheduler.step`` (``model_output``, ``timestep``, ``sample`` and the ``prev_sample`` it
  returned), with the transformer calls made since the step before;
- ``vae.decode`` (its input and its output).

:mod:`rkpart.export.describe` derives the pipeline description from two such recordings and
checks that the description reproduces them.  The hooks are instance attributes and forward hooks,
removed when the call returns, so the pipeline object is left as it was.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class TransformerCall:
    """One ``transformer.forward``: its arguments by parameter name, and its prediction."""

    kwargs: dict[str, Any]
    output: torch.Tensor


@dataclass
class Step:
    """One ``scheduler.step`` and the transformer calls the pipeline made for it."""

    calls: list[TransformerCall]
    t: torch.Tensor
    model_output: torch.Tensor
    sample: torch.Tensor
    prev_sample: torch.Tensor


@dataclass
class Recording:
    """What one pipeline call did (:func:`record_call`)."""

    args: dict[str, Any]
    set_timesteps: dict[str, Any] = field(default_factory=dict)
    timesteps: torch.Tensor | None = None
    init_noise_sigma: float = 1.0
    steps: list[Step] = field(default_factory=list)
    decode_input: torch.Tensor | None = None
    decode_output: torch.Tensor | None = None
    #: what the pipeline returned (``images`` / ``frames`` of its output)
    result: Any = None
    #: transformer calls after the last step (a pipeline rkpart cannot reproduce makes them)
    trailing_calls: list[TransformerCall] = field(default_factory=list)
    #: the state of the call's ``generator=`` before the call (a stochastic scheduler's noise comes from it)
    generator_state: torch.Tensor | None = None


class _Stop(Exception):
    """Ends a probe call at its first scheduler step."""


def _detach(v: Any) -> Any:
    import torch

    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, dict):
        return {k: _detach(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_detach(x) for x in v)
    return v


def first_output(out: Any) -> torch.Tensor:
    """The prediction of a transformer's or VAE's output: ``out[0]`` of a tuple, else ``.sample``."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, list) and out and all(isinstance(x, torch.Tensor) and x.shape == out[0].shape
                                                      for x in out):
        return torch.stack(out)  # one prediction per sample (Z-Image's list): the batch
    if isinstance(out, (tuple, list)):
        return first_output(out[0])
    sample = getattr(out, "sample", None)
    if isinstance(sample, torch.Tensor):
        return sample
    raise TypeError(f"cannot find the prediction in a {type(out).__name__}")


def _bind(fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``fn``'s arguments by parameter name (``**kwargs`` of ``fn`` flattened in)."""
    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs).arguments
    out: dict[str, Any] = {}
    for name, value in bound.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise TypeError(f"{getattr(fn, '__qualname__', fn)} was called with extra positional arguments")
        else:
            out[name] = value
    return out


@contextlib.contextmanager
def _patched(obj: Any, name: str, wrapper_of: Any) -> Iterator[None]:
    """Shadow the bound method ``obj.name`` by an instance attribute for the duration."""
    original = getattr(obj, name)
    wrapper = functools.wraps(original)(wrapper_of(original))  # keeps inspect.signature right
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, wrapper)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


@contextlib.contextmanager
def hooked(pipe: Any, rec: Recording, *, stop_at_first_step: bool = False) -> Iterator[None]:
    """Record into ``rec`` while the block runs (the pipeline is left unhooked afterwards)."""
    pending: list[TransformerCall] = []
    transformer, scheduler, vae = pipe.transformer, pipe.scheduler, getattr(pipe, "vae", None)

    def on_forward(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        pending.append(TransformerCall(_detach(_bind(module.forward, args, kwargs)), _detach(first_output(output))))

    def wrap_set_timesteps(original: Any) -> Any:
        def set_timesteps(*args: Any, **kwargs: Any) -> Any:
            rec.set_timesteps = _detach(_bind(original, args, kwargs))
            res = original(*args, **kwargs)
            rec.timesteps = _detach(scheduler.timesteps)
            rec.init_noise_sigma = float(getattr(scheduler, "init_noise_sigma", 1.0))
            return res
        return set_timesteps

    def wrap_step(original: Any) -> Any:
        def step(*args: Any, **kwargs: Any) -> Any:
            bound = _bind(original, args, kwargs)
            if stop_at_first_step:
                rec.steps.append(Step([], _detach(bound["timestep"]), _detach(bound["model_output"]),
                                      _detach(bound["sample"]), _detach(bound["sample"])))
                raise _Stop
            res = original(*args, **kwargs)
            prev = res[0] if isinstance(res, tuple) else res.prev_sample
            rec.steps.append(Step(list(pending), _detach(bound["timestep"]), _detach(bound["model_output"]),
                                  _detach(bound["sample"]), _detach(prev)))
            pending.clear()
            return res
        return step

    def wrap_decode(original: Any) -> Any:
        def decode(*args: Any, **kwargs: Any) -> Any:
            bound = _bind(original, args, kwargs)
            z = next(iter(bound.values()))
            out = original(*args, **kwargs)
            rec.decode_input = _detach(z)
            rec.decode_output = _detach(first_output(out))
            return out
        return decode

    handle = transformer.register_forward_hook(on_forward, with_kwargs=True)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_patched(scheduler, "set_timesteps", wrap_set_timesteps))
            stack.enter_context(_patched(scheduler, "step", wrap_step))
            if vae is not None:
                stack.enter_context(_patched(vae, "decode", wrap_decode))
            yield
    finally:
        handle.remove()
        rec.trailing_calls = list(pending)


def record_call(pipe: Any, args: dict[str, Any]) -> Recording:
    """Run ``pipe(**args)`` with the hooks on; the recording, with what the pipeline returned."""
    import torch

    rec = Recording(args=_detach(args))
    gen = args.get("generator")
    if isinstance(gen, torch.Generator):
        rec.generator_state = gen.get_state().clone()
    drawn: list[torch.Tensor] = []
    with contextlib.ExitStack() as stack:
        if "latents" not in args:  # the pipeline draws its own (DiT takes no latents=): its first draw is them
            for m in _randn_modules(pipe):
                stack.enter_context(_patched_function(m, "randn_tensor", drawn))
        with hooked(pipe, rec), torch.no_grad():
            out = pipe(**args)
    if "latents" not in args and drawn:
        rec.args["latents"] = drawn[0]
    rec.result = _detach(_images(out))
    return rec


def _randn_modules(pipe: object) -> list[types.ModuleType]:
    """The modules whose ``randn_tensor`` (diffusers' helper every pipeline draws its initial latents with) the
    pipeline calls: its own module's import of it and diffusers' ``torch_utils``."""
    import sys

    return [m for m in (sys.modules.get(type(pipe).__module__), sys.modules.get("diffusers.utils.torch_utils"))
            if m is not None and callable(getattr(m, "randn_tensor", None))]


def probe_latents(pipe: Any, args: dict[str, Any]) -> list[torch.Tensor]:
    """The candidates for what the pipeline's ``latents=`` takes, for ``args`` (no ``latents=``).

    First the loop latent (the first step's sample: most pipelines loop on ``latents=`` as given,
    Flux-style ones already packed), then, when its shape differs, the noise the call drew (the first
    ``randn_tensor``, diffusers' helper every pipeline draws its initial latents with, looked up in the
    pipeline's module: Flux.2 takes ``latents=`` unpacked and packs it).  Stops the call at its first
    ``scheduler.step``: one step's transformer calls, no more.
    """

    import torch

    rec = Recording(args={})
    drawn: list[torch.Tensor] = []
    modules = _randn_modules(pipe)
    with contextlib.ExitStack() as stack:
        for m in modules:
            stack.enter_context(_patched_function(m, "randn_tensor", drawn))
        with hooked(pipe, rec, stop_at_first_step=True), torch.no_grad(), contextlib.suppress(_Stop):
            pipe(**args)
    if not rec.steps:
        raise LookupError("the pipeline call ended without a scheduler step")
    loop = rec.steps[0].sample
    return [loop] + [d for d in drawn[:1] if isinstance(d, torch.Tensor) and d.shape != loop.shape]


@contextlib.contextmanager
def _patched_function(module: Any, name: str, out: list[Any]) -> Iterator[None]:
    """``module.name`` records what it returns into ``out`` for the duration."""
    original = getattr(module, name)

    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        res = original(*args, **kwargs)
        out.append(_detach(res))
        return res

    setattr(module, name, recorded)
    try:
        yield
    finally:
        setattr(module, name, original)


def _images(out: Any) -> Any:
    for name in ("images", "frames", "audios", "latents"):
        v = getattr(out, name, None)
        if v is not None:
            return v
    if isinstance(out, (tuple, list)) and out:
        return out[0]
    return out
