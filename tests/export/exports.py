"""``rkpart export`` of the tiny pipelines (:mod:`tests.models.pipelines`), cached by source.

:func:`cached_pipeline_export` runs :func:`rkpart.export.build.export_pipeline` once per (pipeline
folder, options, source of every ``rkpart/export`` module and of the writers it calls, library
versions) under ``<export root>/pipeline-exports`` (``$RKPART_TEST_EXPORTS``); a rerun with nothing
changed skips the recording and both exporters.  Each export is written by the command's own atomic
folder protocol to a private name, then renamed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from tests.models import diffusers_families as df
from tests.models import pipelines as tp

#: the rkpart modules an export runs (their source keys the cache)
_SOURCES = ("rkpart/export", "rkpart/io.py", "rkpart/output.py", "rkpart/description.py",
            "rkpart/data/pipeline.schema.json")
ROOT = Path(__file__).resolve().parents[2]


def _source_key() -> list[str]:
    parts = []
    for rel in _SOURCES:
        p = ROOT / rel
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        parts += [f"{f.relative_to(ROOT)}\0{f.read_text()}" for f in files]
    return parts


def export_options(family: str, **opts: object) -> dict[str, object]:
    """The export options of ``family``'s tiny pipeline: its call size and text length, then ``opts``."""
    spec = tp.PIPELINES[family]
    frames = {"num_frames": spec.call["num_frames"]} if "num_frames" in spec.call else {}
    return {"height": spec.height, "width": spec.width, "text_len": tp.TEXT_LEN, **frames, **opts}


def cached_pipeline_export(family: str, **opts: object) -> Path:
    """The export folder of ``family``'s tiny pipeline with ``opts`` (``ExportOptions`` fields)."""
    import diffusers
    import torch
    import transformers

    from rkpart.export.build import ExportOptions, export_pipeline

    src = tp.cached_pipeline(family)
    options = export_options(family, **opts)
    key = [src.name, repr(sorted(options.items())), diffusers.__version__, torch.__version__,
           transformers.__version__, *_source_key()]
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
    tag = "-".join(f"{k}{v}" for k, v in sorted(opts.items()))
    root = df.export_root() / "pipeline-exports"
    path = root / f"{family}{'-' + tag if tag else ''}-{digest}"
    if (path / "pipeline.json").is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{path.name}.{os.getpid()}.part"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        export_pipeline(src, tmp, ExportOptions(**options))  # type: ignore[arg-type]
        try:
            os.replace(tmp, path)
        except OSError:
            if not (path / "pipeline.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
