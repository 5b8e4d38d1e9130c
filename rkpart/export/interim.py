"""Export a torch module to ONNX and check it under ONNX Runtime (interim).

A stand-in for the export core that is moving into this package (the patch registry keyed by
diffusers class and its ``export_module``): the same signature, the same steps as
``tests/models/diffusers_families.py``'s ``export_family`` (a wrapper with a positional signature,
RMSNorm decomposed for TorchScript, static shapes), no family patches.  ``rkpart export`` calls
only :func:`export_module`, so replacing this module is a one-line change.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.errors import ExportError

#: exporter -> opset (``None``: the exporter's own default, 20 for dynamo in torch 2.13)
OPSETS: dict[str, int | None] = {"torchscript": 17, "dynamo": None}
#: the patches this stand-in applies to any class (the registry will add per-class ones)
PATCHES: tuple[str, ...] = ()


def _decompose_rms_norm(model: Any) -> None:
    """``torch.nn.RMSNorm`` (no TorchScript symbolic below opset 23) as the decomposed form."""
    import torch

    class DecomposedRMSNorm(torch.nn.Module):
        def __init__(self, src: torch.nn.RMSNorm) -> None:
            super().__init__()
            self.eps = src.eps if src.eps is not None else torch.finfo(torch.float32).eps
            self.weight = src.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return y * self.weight if self.weight is not None else y

    for _name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, torch.nn.RMSNorm):
                setattr(mod, child_name, DecomposedRMSNorm(child))


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The dynamo exporter logs a warning per torchvision op it cannot register: not the user's concern."""
    log = logging.getLogger("torch.onnx")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def _positive_movedim() -> Iterator[None]:
    """``movedim`` with its dimensions made non-negative while TorchScript traces.

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


def wrap(model: Any, names: list[str], fixed: dict[str, Any]) -> Any:
    """``model`` with a positional signature over ``names`` returning its first output."""
    import torch

    from rkpart.export.record import first_output

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return first_output(self.model(**dict(zip(names, args, strict=True)), **fixed))

    return Wrapped().eval()


def export_module(model: Any, inputs: dict[str, Any], path: str | Path, *, fixed: dict[str, Any], exporter: str,
                  opset: int | None = None, dtype: str = "float32", output: str = "sample") -> float:
    """Write ``model(**inputs, **fixed)`` to ``path`` as ONNX (static shapes, inputs named as ``inputs``).

    ``dtype`` float16 converts the model and the floating inputs first.  Returns the max |error| /
    max |torch| of ONNX Runtime against torch on ``inputs``; raises :class:`ExportError` when the
    exporter fails or the two disagree.
    """
    import torch

    model = model.eval()
    if dtype == "float16":
        model = model.to(torch.float16)
        inputs = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in inputs.items()}
    if exporter == "torchscript":
        _decompose_rms_norm(model)
    names = list(inputs)
    wrapped = wrap(model, names, fixed)
    args = tuple(inputs.values())
    path = Path(path)
    opset = opset if opset is not None else OPSETS[exporter]
    try:
        with torch.no_grad(), warnings.catch_warnings(), _quiet_exporter():
            warnings.simplefilter("ignore")
            reference = wrapped(*args)
            if exporter == "dynamo":
                prog = torch.onnx.export(wrapped, args, input_names=names, output_names=[output], dynamo=True,
                                         optimize=True, verbose=False, opset_version=opset)
                if prog is None:
                    raise ExportError("the dynamo exporter returned no program")
                prog.save(str(path))
            else:
                with _positive_movedim():
                    torch.onnx.export(wrapped, args, str(path), input_names=names, output_names=[output],
                                      dynamo=False, do_constant_folding=True, opset_version=opset)
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001 - any exporter failure is reported as the export's reason
        from rkpart.errors import first_line

        raise ExportError(f"the {exporter} exporter failed on {type(model).__name__}: {first_line(e)}") from None
    feeds = {k: v.numpy() for k, v in inputs.items()}
    got = run_onnx(path, feeds)[0]
    return check_close(got, reference.float().numpy(), dtype=dtype, what=f"{path.name} under ONNX Runtime")


def run_onnx(path: str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run the ONNX model at ``path`` on the inputs it has (extra feeds are dropped: an exporter may
    remove an input the graph does not read)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        names = {i.name for i in sess.get_inputs()}
        return [np.asarray(o) for o in sess.run(None, {k: v for k, v in feeds.items() if k in names})]
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own Fail / InvalidGraph / RuntimeException
        from rkpart.errors import first_line

        raise ExportError(f"the exported {Path(path).name} does not run under ONNX Runtime: {first_line(e)}") from None


def check_close(got: np.ndarray, want: np.ndarray, *, dtype: str, what: str) -> float:
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
