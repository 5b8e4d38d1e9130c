"""torch module -> ONNX file: patch, export with static shapes, check under ONNX Runtime.

:func:`export_module` is the one entry point.  In order:

1. the registry's patches for ``type(model).__name__`` (:mod:`rkpart.export.patches`), each
   rewrite checked equal to the unpatched model on the export inputs and on a second value of
   every attention-mask input (:func:`~rkpart.export.patches.mask_variants`);
2. ``float16``: the patched float32 model and its floating inputs cast to half (see below);
3. positional inputs wrapped into the model's keyword call (exporters want a plain signature);
4. the export (TorchScript or dynamo) into a private staging folder beside ``path``;
5. external data (one ``<name>.data`` file beside the model) when the weights exceed
   ``external_data_threshold`` (protobuf cannot hold a model over 2 GiB in one message);
6. the ONNX run under ONNX Runtime (CPU) on every checked input set, compared with the unpatched
   torch model in float32;
7. the files moved into place.  A failure at any step leaves nothing at ``path``.

float16
    A float16 / bfloat16 model and its half inputs are cast to float32 first (torch's CPU kernels
    for half types are slow or missing).  The patches are applied and checked on the float32
    model; then the model, its floating
    inputs and its fixed floating tensors are cast to float16 and traced in float16 on the CPU
    (torch 2.13 runs every op of the sweep's families in half on the CPU, slowly; the trace runs
    once).  The graph then computes in float16 where diffusers does and in float32 where
    diffusers upcasts (norms, RoPE), as the pipeline does on a GPU.  The reference of the check
    stays the float32 torch model: a float16 torch reference on the CPU would add its own
    rounding to the comparison, and it is the float32 function the export must approximate.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rkpart.errors import ExportError, UserError, describe_exception
from rkpart.export.patches import EXPORTERS, Applied, apply_patches, patches_for

if TYPE_CHECKING:
    from types import ModuleType

    import numpy as np
    import torch

#: the dtypes :func:`export_module` writes
DTYPES: tuple[str, ...] = ("float32", "float16")
#: exporter -> the opset :func:`export_module` asks for when ``opset`` is None (None: the exporter's own
#: default, 20 for dynamo in torch 2.13)
DEFAULT_OPSET: dict[str, int | None] = {"torchscript": 17, "dynamo": None}
#: weights over this many bytes go to external data (protobuf's hard limit for one message is 2 GiB,
#: and the graph itself needs room)
EXTERNAL_DATA_THRESHOLD = 1 << 30
#: dtype -> (minimum cosine, maximum |onnx - torch| / max |torch|) of the ONNX Runtime check.
#: float32: the family sweep's bound.  float16: measured on the sweep's tiny families (worst cosine
#: 0.9997, max error 0.6 % of the largest output), with room for larger models' longer sums
CHECK_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (0.99999, 1e-4),
    "float16": (0.999, 2e-2),
}


@dataclass(frozen=True)
class OnnxCheck:
    """The export run under ONNX Runtime against the unpatched torch model (worst over the input sets)."""

    #: input sets compared: the export inputs, then each variant
    input_sets: int
    cosine: float
    max_abs: float
    #: largest |torch output|, what ``max_abs`` is relative to
    ref_max_abs: float


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_module` wrote."""

    path: Path
    #: the external data file beside ``path`` (None: the weights are inside the model)
    external_data: Path | None
    exporter: str
    opset: int
    dtype: str
    #: the graph's inputs, in order (torch inputs the output does not depend on are dropped by the exporters)
    inputs: tuple[str, ...]
    #: the export inputs that are not graph inputs
    unused: tuple[str, ...]
    output: str
    patches: tuple[Applied, ...]
    #: None when ``OnnxOptions.check`` is False
    check: OnnxCheck | None


def source_key(class_name: str, exporter: str) -> list[str]:
    """The source of every module of rkpart an export of ``class_name`` by ``exporter`` runs: a cache
    key that changes whenever a patch, the registry or the export code changes.  (Here, beside the
    export, not in :mod:`rkpart.export.patches`: that module reading this one would be an import circle.)"""
    import inspect
    import sys

    modules: dict[str, ModuleType] = {m.__name__: m for m in (sys.modules[__name__], inspect.getmodule(patches_for))
                                      if m is not None}
    for p in patches_for(class_name, exporter):
        mod = inspect.getmodule(p.fn)
        if mod is not None:
            modules[mod.__name__] = mod
    return [inspect.getsource(modules[name]) for name in sorted(modules)]


def require_extra(modules: Sequence[str] = ("torch", "onnxscript", "diffusers")) -> None:
    """Import ``modules``; raise :class:`~rkpart.errors.UserError` naming the extra to install if one is missing."""
    import importlib
    import importlib.util

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):  # a parent package missing, or the module blocked (sys.modules None)
            return True

    # every absent module named, found without importing any (transformers imported without torch
    # prints its own warning on the stream of the one-line error)
    missing = [name for name in modules if absent(name)]
    for name in modules if not missing else ():
        try:
            importlib.import_module(name)
        except ImportError as e:  # installed but broken: the module that is missing, not the one needing it
            missing = [(e.name or name).partition(".")[0]]
            break
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise UserError(f"{', '.join(missing)} {verb} not installed (exporting needs the export extra): "
                        "pip install 'rkpart[export]'")


@dataclass(frozen=True)
class OnnxOptions:
    """How :func:`export_module` writes and checks the ONNX file, beyond its exporter and dtype (the
    defaults suit a diffusers transformer)."""

    #: the ONNX opset; None: :data:`DEFAULT_OPSET`
    opset: int | None = None
    #: the name of the graph's output
    output: str = "sample"
    #: overrides of some inputs, each making one more input set the patches and the export are checked on;
    #: None: a second value of every attention mask (:func:`~rkpart.export.patches.mask_variants`); ``()``:
    #: the export inputs only
    variants: Sequence[Mapping[str, Any]] | None = None
    #: run the export under ONNX Runtime and compare with torch (:data:`CHECK_TOLERANCES`); False writes the
    #: export unchecked (exports ONNX Runtime refuses but rkpart loads)
    check: bool = True
    #: weights over this many bytes go to ``<path>.data``
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD


def export_module(model: torch.nn.Module, inputs: Mapping[str, Any], path: str | Path, *,
                  fixed: Mapping[str, Any] | None = None, exporter: str = "torchscript", dtype: str = "float32",
                  options: OnnxOptions = OnnxOptions(),
                  progress: Callable[[str], None] | None = None) -> ExportResult:
    """Export ``model`` (a diffusers transformer, any ``torch.nn.Module`` whose ``forward`` takes
    ``**inputs, **fixed, return_dict=False`` and returns the prediction first) to ``path``.

    Parameters
    ----------
    model
        The model; put in eval mode and patched in place (:mod:`rkpart.export.patches`).
    inputs
        Graph inputs by ``forward`` argument name, example tensors of the static export shapes
        (masks and ids included: they stay graph inputs).  Copied, not modified.
    path
        The ``.onnx`` file to write; its external data, when there is some, is ``<path>.data``.
    fixed
        Keyword arguments of ``forward`` fixed at export time (not graph inputs): Python values,
        tables computed once for the static shapes.
    exporter
        ``"torchscript"`` or ``"dynamo"``.
    dtype
        ``"float32"`` or ``"float16"`` (weights and floating inputs; see the module docstring).
    options
        The opset, the output's name, the input sets checked, whether to check under ONNX Runtime,
        the external data threshold (:class:`OnnxOptions`).
    progress
        Called with a short message as each step starts.

    Raises
    ------
    UserError
        torch / onnxscript not installed (``pip install 'rkpart[export]'``), an unknown exporter or dtype.
    ExportError
        A patch changed the output (:class:`~rkpart.export.patches.PatchError`), the exporter
        failed, ONNX Runtime cannot load the export (the message names the other exporter), or
        the export differs from torch.  Nothing is left at ``path``.
    """
    require_extra(("torch", "onnx", "onnxscript") if exporter == "dynamo" else ("torch", "onnx"))
    import torch

    if exporter not in EXPORTERS:
        raise UserError(f"unknown exporter {exporter!r}; expected one of {', '.join(EXPORTERS)}")
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    say = progress or (lambda _msg: None)
    name, output = type(model).__name__, options.output
    path = Path(path)
    # patches are checked, and the reference computed, in float32 even for a float16 / bfloat16 checkpoint:
    # torch's CPU kernels for half types are slow or missing, and it is the float32 function the export
    # approximates (float64 tables a model keeps stay as they are)
    halves = (torch.float16, torch.bfloat16)
    model = model.eval()
    if any(t.dtype in halves for t in (*model.parameters(), *model.buffers())):
        model = model.float()
    ins, fix = _cast(dict(inputs), torch.float32, halves), _cast(dict(fixed or {}), torch.float32, halves)
    say(f"patching {name}")
    patched = apply_patches(model, ins, fix, exporter=exporter, variants=options.variants)
    if dtype == "float16":
        model = model.half()
        ins, fix = _cast(ins, torch.float16), _cast(fix, torch.float16)
    ins_dtype = torch.float16 if dtype == "float16" else torch.float32
    names = list(ins)
    wrapped = _wrap(model, names, fix)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        staged = staging / path.name
        say(f"exporting {name} with {exporter}")
        _export(wrapped, tuple(ins.values()), staged, names, output, exporter,
                DEFAULT_OPSET[exporter] if options.opset is None else options.opset, name)
        staged_data = _external_data(staged, options.external_data_threshold)
        result_check = None
        if options.check:
            say("checking the export under ONNX Runtime")
            sets = [{**ins, **_cast(dict(o), ins_dtype)} for o in ({}, *patched.overrides)]
            result_check = _check(staged, path, sets, patched.references, output, exporter, dtype, name,
                                  [sorted(o) for o in patched.overrides])
        graph_inputs, opset_used = _graph_facts(staged)
        data = None
        if staged_data is not None:
            data = path.with_name(staged_data.name)
            os.replace(staged_data, data)
        os.replace(staged, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(path=path, external_data=data, exporter=exporter, opset=opset_used, dtype=dtype,
                        inputs=graph_inputs, unused=tuple(n for n in names if n not in graph_inputs),
                        output=output, patches=patched.applied, check=result_check)


def _wrap(model: torch.nn.Module, names: list[str], fixed: dict[str, Any]) -> torch.nn.Module:
    """Positional inputs -> the model's first output (exporters want a plain signature); the model keeps
    its module names under ``model.``."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            out = self.model(**dict(zip(names, args, strict=True)), **fixed, return_dict=False)
            return out[0]

    return Wrapped().eval()


def _export(wrapped: torch.nn.Module, args: tuple[Any, ...], path: Path, names: list[str], output: str,
            exporter: str, opset: int | None, name: str) -> None:
    import torch

    other = EXPORTERS[1 - EXPORTERS.index(exporter)]
    try:
        with torch.no_grad(), warnings.catch_warnings(), _exporter_chatter_hidden():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                prog = torch.onnx.export(wrapped, args, input_names=names, output_names=[output], dynamo=True,
                                         optimize=True, verbose=False, opset_version=opset)
                if prog is None:
                    raise RuntimeError("torch.onnx.export returned no program")
                _drop_stack_traces(prog.model)
                prog.save(str(path))
            else:
                torch.onnx.export(wrapped, args, str(path), input_names=names, output_names=[output],
                                  dynamo=False, do_constant_folding=True, opset_version=opset)
    except ExportError:
        raise
    except Exception as e:  # the exporters raise anything; the reason is their first line
        raise ExportError(f"the {exporter} exporter failed on {name}: {describe_exception(e)}; "
                          f"try --exporter {other}") from e


@contextlib.contextmanager
def _exporter_chatter_hidden() -> Iterator[None]:
    """The process's stderr (file descriptor 2) sent to a scratch file while an exporter runs.

    The exporters write to it from C++ and from loggers the caller has not configured: TorchScript
    dumps the whole traced graph on any failure (``setup_onnx_logging`` tests the function
    ``_jit_is_onnx_log_enabled`` for truth instead of calling it, so its log is always on: tens of
    thousands of lines above a one-line error), dynamo logs a warning per missing torchvision op.
    The error itself reaches the user as one line (:class:`~rkpart.errors.ExportError`).
    """
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as scratch:
            os.dup2(scratch.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _drop_stack_traces(model: Any) -> None:
    """Remove the dynamo exporter's per-node Python stack traces (``pkg.torch.onnx.stack_trace``): they
    hold the absolute paths of the installation (site-packages, this file), so the same model exported
    from two installations would differ; rkpart reads only the name scopes (``rkpart.ir.load``)."""
    from onnx_ir.traversal import RecursiveGraphIterator

    for node in RecursiveGraphIterator(model.graph):
        node.metadata_props.pop("pkg.torch.onnx.stack_trace", None)


def _external_data(path: Path, threshold: int) -> Path | None:
    """Rewrite ``path`` with every initializer in one ``<name>.data`` beside it when the weights exceed
    ``threshold`` (or the exporter already wrote external data: TorchScript writes a file per
    tensor over 2 GiB); the external file's path, None when the weights stay inside."""
    import onnx

    folder = path.parent
    others = [p for p in folder.iterdir() if p != path]
    if not others and path.stat().st_size <= threshold:
        return None  # the exporter's file as it wrote it: byte for byte
    proto = onnx.load(str(path), load_external_data=True)
    weights = sum(len(t.raw_data) for t in proto.graph.initializer)
    for p in others:
        p.unlink()
    data = folder / f"{path.name}.data"
    if weights <= threshold:
        onnx.save_model(proto, str(path))
        return None
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024, convert_attribute=False)
    return data


def _check(path: Path, final: Path, sets: list[dict[str, Any]], refs: Sequence[torch.Tensor], output: str,
           exporter: str, dtype: str, name: str, varied: list[list[str]]) -> OnnxCheck:
    """Run the staged export ``path`` on every input set and compare with ``refs``; errors name ``final``."""
    import numpy as np
    import onnxruntime as ort

    other = EXPORTERS[1 - EXPORTERS.index(exporter)]

    def reason(e: BaseException) -> str:  # ORT names the file it loaded: the staging copy
        return describe_exception(e).replace(str(path), str(final))

    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # ORT's warnings (no fp16 kernel to constant-fold a Sqrt, ...) are not ours
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT's load errors are of several types; the first line says why
        raise ExportError(f"ONNX Runtime cannot load the {exporter} export of {name}: {reason(e)}; "
                          f"try --exporter {other}") from e
    min_cos, max_rel = CHECK_TOLERANCES[dtype]
    worst_cos, worst_abs, ref_max = 1.0, 0.0, 0.0
    for i, (feeds, ref) in enumerate(zip(sets, refs, strict=True)):
        try:
            (got,) = sess.run([output], {x.name: _numpy(feeds[x.name]) for x in sess.get_inputs()})
        except Exception as e:
            raise ExportError(f"ONNX Runtime failed to run the {exporter} export of {name}: "
                              f"{reason(e)}; try --exporter {other}") from e
        r = ref.detach().float().numpy().astype(np.float64)
        g = np.asarray(got, dtype=np.float64)
        cos, mx, rmax = _compare(g, r)
        worst_cos, worst_abs, ref_max = min(worst_cos, cos), max(worst_abs, mx), max(ref_max, rmax)
        if g.shape != r.shape or not (cos >= min_cos and mx <= max_rel * rmax):
            on = f" with {', '.join(varied[i - 1])} varied (a value baked in at trace time)" if i else ""
            raise ExportError(f"the {exporter} export of {name} differs from torch{on}: cosine {cos:.6f} "
                              f"(min {min_cos}), max |diff| {mx:.3g} = {mx / max(rmax, 1e-30):.2%} of max |torch| "
                              f"(max {max_rel:.2%}); try --exporter {other}")
    return OnnxCheck(len(sets), worst_cos, worst_abs, ref_max)


def _compare(got: np.ndarray, ref: np.ndarray) -> tuple[float, float, float]:
    """(cosine, max |got - ref|, max |ref|); NaN or a shape mismatch gives cosine -1 and max |diff| inf."""
    import numpy as np

    if got.shape != ref.shape or not np.array_equal(np.isfinite(got), np.isfinite(ref)):
        return -1.0, math.inf, float(np.nanmax(np.abs(ref))) if ref.size else 0.0
    fin = np.isfinite(ref)
    g, r = got[fin], ref[fin]
    den = float(np.linalg.norm(g) * np.linalg.norm(r))
    cos = float(g @ r / den) if den > 0 else (1.0 if np.array_equal(g, r) else 0.0)
    return cos, float(np.abs(g - r).max()) if g.size else 0.0, float(np.abs(r).max()) if r.size else 0.0


def _graph_facts(path: Path) -> tuple[tuple[str, ...], int]:
    """The graph's input names and its default-domain opset (read without the external data)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in proto.graph.initializer}
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    return tuple(i.name for i in proto.graph.input if i.name not in inits), opset


def _numpy(value: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _cast(obj: Any, dtype: torch.dtype, only: tuple[torch.dtype, ...] | None = None) -> Any:
    """``obj`` with every floating tensor (in dicts, lists and tuples too; of a dtype in ``only`` when given)
    cast to ``dtype``."""
    import torch

    if isinstance(obj, torch.Tensor):
        cast = obj.is_floating_point() and (only is None or obj.dtype in only)
        return obj.to(dtype) if cast else obj
    if isinstance(obj, dict):
        return {k: _cast(v, dtype, only) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_cast(v, dtype, only) for v in obj)
    return obj
