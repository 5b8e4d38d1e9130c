"""What the rewrite tests share: run a model under ONNX Runtime with its graph optimisations off (so
the original and the rewritten model run the same kernels) and rewrite a copy with some table rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from rkpart.targets.rewrites import Rewrite, apply_rewrites


def run_unoptimised(m: onnx.ModelProto, feeds: dict[str, np.ndarray], folder: Path | None = None) -> list[np.ndarray]:
    """``m``'s outputs on ``feeds``; ``folder``: save it there first (a stage with external data,
    which ORT reads relative to the file)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if folder is not None:
        path = folder / ".check.onnx"
        onnx.save(m, str(path))
        return [np.asarray(x) for x in ort.InferenceSession(str(path), so).run(None, feeds)]
    return [np.asarray(x) for x in ort.InferenceSession(m.SerializeToString(), so).run(None, feeds)]


def rewritten(m: onnx.ModelProto, rows: tuple[Rewrite, ...]) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A copy of ``m`` with ``rows`` applied, and what :func:`apply_rewrites` reports (``m`` is left as it is)."""
    r = onnx.ModelProto()
    r.CopyFrom(m)
    return r, apply_rewrites(r, rows)


def cpu_layers_before_after(before: onnx.ModelProto, after: onnx.ModelProto, toolkit: object, folder: Path
                            ) -> dict[str, tuple[str, ...]]:
    """The CPU layers of a real rk3588 build of ``before`` and of ``after`` (``toolkit``: a
    :class:`rkpart.compile.toolkits.Toolkit`); each build must succeed (its log tail is the message)."""
    from rkpart.compile.placement import cpu_ops
    from rkpart.triage.matrix import build_once

    cpu = {}
    for tag, model in (("before", before), ("after", after)):
        path = folder / f"{tag}.onnx"
        onnx.save(model, str(path))
        log = folder / f"{tag}.log"
        res = build_once(path, toolkit, target="rk3588", log=log)  # type: ignore[arg-type]
        assert res.kind == "ok", log.read_text(errors="replace")[-2000:]
        cpu[tag] = cpu_ops(log.read_text(errors="replace"))
    return cpu
