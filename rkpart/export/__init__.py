"""torch -> ONNX export of diffusers transformers: the patches that make them exportable, and the checks.

The public API (``docs/export.md``, "Export core: patches and the ONNX check")::

    from rkpart.export import export_module
    result = export_module(model, {"hidden_states": x, "timestep": t, ...}, "out/transformer.onnx",
                           exporter="torchscript", dtype="float32")

- :func:`export_module`: patch, export with static shapes, external data when large, check under
  ONNX Runtime; returns an :class:`ExportResult`.  :class:`OnnxOptions` holds its rarely changed
  settings (opset, output name, the input sets checked, the check itself, the external data threshold).
- :data:`PATCHES` / :func:`patches_for`: the registry (diffusers class name -> ordered
  :class:`Patch` list) and what applies to one class and exporter; :func:`apply_patches` applies
  and checks them (the export does this itself).
- :func:`require_extra`: raises a :class:`~rkpart.errors.UserError` naming
  ``pip install 'rkpart[export]'`` when torch / onnxscript / diffusers are missing.

``rkpart export`` (a whole pipeline folder) is built on it: :mod:`~rkpart.export.record` records one
real call of the pipeline, :mod:`~rkpart.export.describe` derives ``pipeline.json`` from it and
checks it reproduces the call, :mod:`~rkpart.export.vae` builds the post-loop decoder,
:mod:`~rkpart.export.build` writes the export folder (docs/export.md).

Importing this package needs neither torch nor diffusers (they are imported when used), so every
other command works without the ``export`` extra.
"""

from __future__ import annotations

from rkpart.export.patches import (
    EXPORTERS,
    GENERIC,
    PATCHES,
    Applied,
    Patch,
    Patched,
    PatchError,
    apply_patches,
    mask_variants,
    patches_for,
    supported_classes,
)
from rkpart.export.torch_onnx import (
    CHECK_TOLERANCES,
    DEFAULT_OPSET,
    DTYPES,
    EXTERNAL_DATA_THRESHOLD,
    ExportResult,
    OnnxCheck,
    OnnxOptions,
    export_module,
    require_extra,
    source_key,
)

__all__ = [
    "CHECK_TOLERANCES",
    "DEFAULT_OPSET",
    "DTYPES",
    "EXPORTERS",
    "EXTERNAL_DATA_THRESHOLD",
    "GENERIC",
    "PATCHES",
    "Applied",
    "ExportResult",
    "OnnxCheck",
    "OnnxOptions",
    "Patch",
    "PatchError",
    "Patched",
    "apply_patches",
    "export_module",
    "mask_variants",
    "patches_for",
    "require_extra",
    "source_key",
    "supported_classes",
]
