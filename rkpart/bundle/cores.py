"""Per-stage NPU core masks of a bundle, from ``--core-mask`` and the compile logs.

RK3588's three NPU cores cooperate on one context only for Conv, Add, Mul and their fused
forms (``ConvAdd``, ``ConvExGelu``, ...); exMatMul, exSDPAttention, exNorm, exGelu, Softmax
and Transpose run on core 0 whatever the mask (rknn-toolkit2 2.3.2 operator list).  So by
default a stage gets ``0_1_2`` only when every compute layer the compiler placed on the NPU
splits across cores (:data:`rkpart.types.MULTICORE_OPS`); layout layers (Reshape, Transpose,
Gather, Split, Concat, ...) move data and are not counted.  The compiler's layer table says
which layers those are: the per-layer rows ``rkpart compile`` keeps with the artifact's
compiler plan (``artifacts[].compiler.layers_file``, also for builds taken from the cache),
else the stage's build log (``rknn/logs/<stage>.<toolkit>.log``, parsed by
:mod:`rkpart.compile.placement`); a stage with neither gets ``auto``.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rkpart.compile.compiler_plan import LayerRow, read_layers
from rkpart.compile.placement import PlacedOp, parse_layer_table
from rkpart.compile.runner import read_log
from rkpart.errors import SpecError, UserError
from rkpart.io import confined_path
from rkpart.plan.plan import Plan, Stage
from rkpart.runtime.board_runner import CORE_MASKS
from rkpart.types import MULTICORE_OPS

#: layers that only move data; they decide nothing about splitting across cores
LAYOUT_OPS = frozenset({"InputOperator", "OutputOperator", "Reshape", "Transpose", "Gather", "Split", "Concat",
                        "Slice", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Tile", "Pad", "Cast"})
ALL_CORES = "0_1_2"


@dataclass(frozen=True)
class CoreMask:
    mask: str
    reason: str


def splits_across_cores(rows: Sequence[PlacedOp | LayerRow]) -> tuple[bool, tuple[str, ...]]:
    """Whether every NPU compute layer of a layer table splits across cores, and the op types that do not."""
    compute = [r for r in rows if r.target == "NPU" and r.op_type not in LAYOUT_OPS]
    single = tuple(sorted({r.op_type for r in compute if r.op_type not in MULTICORE_OPS}))
    return bool(compute) and not single, single


def build_log(folder: Path, stage: Stage) -> Path | None:
    """The build log of the stage's ``.rknn`` artifact in the plan folder, if compile kept one here."""
    art = stage.artifact("rknn")
    if art is None:
        return None
    p = folder / "rknn" / "logs" / f"{stage.id}.{art.toolkit}.log"
    return p if p.is_file() else None


def _compiler_rows(folder: Path, stage: Stage) -> list[LayerRow] | None:
    """The per-layer rows kept with the stage's compiler plan, if any (unreadable: none)."""
    art = stage.artifact("rknn")
    rel = art.compiler.layers_file if art is not None and art.compiler is not None else None
    if rel is None:
        return None
    try:
        path = confined_path(folder, rel, what=f"stage {stage.id} layer table")
        return read_layers(path, folder) if os.path.lexists(path) else None
    except (SpecError, ValueError, TypeError, OSError):
        return None


def from_log(folder: Path, stage: Stage) -> CoreMask:
    """The default mask of one NPU stage (see the module doc)."""
    rows: Sequence[PlacedOp | LayerRow] | None = _compiler_rows(folder, stage)
    source = "compiler plan"
    if rows is None:
        log = build_log(folder, stage)
        if log is None:
            return CoreMask("auto", "no layer table of the stage (compiler plan or rknn/logs/); auto")
        rows, source = parse_layer_table(read_log(log, folder)), "compile log"
    if not rows:
        return CoreMask("auto", f"no layer table in the {source}; auto")
    ok, single = splits_across_cores(rows)
    if ok:
        return CoreMask(ALL_CORES, f"{source}: every NPU compute layer splits across cores")
    return CoreMask("auto", f"{source}: {', '.join(single) or 'no compute layer'} run on one core")


def parse_spec(spec: str | None, stage_ids: Sequence[str]) -> tuple[str | None, dict[str, str]]:
    """``--core-mask`` as ``(default for unnamed stages, {stage id: mask})``.

    The spec is a mask for every stage (``0_1_2``), or comma-separated ``PATTERN=MASK`` items
    (stage ids, shell wildcards: ``*.ffn=0_1_2``; the first matching item wins) with at most
    one bare mask for the stages no pattern names.

    Raises
    ------
    UserError
        An unknown mask, a pattern that names no stage, or two bare masks.
    """
    if spec is None or not spec.strip():
        return None, {}
    default: str | None = None
    per: dict[str, str] = {}
    for item in (i.strip() for i in spec.split(",")):
        pattern, _, mask = item.rpartition("=")
        if mask not in CORE_MASKS:
            raise UserError(f"--core-mask {item!r}: {mask!r} is not one of {', '.join(CORE_MASKS)}")
        if not pattern:
            if default is not None:
                raise UserError(f"--core-mask {spec!r} gives two masks for all stages")
            default = mask
            continue
        hits = [s for s in stage_ids if fnmatch.fnmatchcase(s, pattern)]
        if not hits:
            raise UserError(f"--core-mask {item!r}: {pattern!r} names no NPU stage (they are: "
                            f"{', '.join(stage_ids)})")
        for s in hits:
            per.setdefault(s, mask)
    return default, per


def core_masks(plan: Plan, folder: Path, spec: str | None = None) -> dict[str, CoreMask]:
    """The mask of every NPU stage: the spec's, else the compile log's rule (module doc)."""
    ids = [s.id for s in plan.npu_stages]
    default, per = parse_spec(spec, ids)
    out: dict[str, CoreMask] = {}
    for s in plan.npu_stages:
        if s.id in per:
            out[s.id] = CoreMask(per[s.id], "--core-mask")
        elif default is not None:
            out[s.id] = CoreMask(default, "--core-mask")
        else:
            out[s.id] = from_log(folder, s)
    return out


__all__ = ["ALL_CORES", "CoreMask", "core_masks", "from_log", "parse_spec", "splits_across_cores"]
