"""Device memory of a bundle's run, and the budget check of ``--cfg-parallel``.

Each NPU stage holds its weights and internal (activation) buffers while its context lives.
The compiler states both in every verbose build log (``Total Weight Memory Size`` and
``Total Internal Memory Size``; published: equal to ``eval_memory()`` on a board), which
``rkpart compile`` keeps as the artifact's compiler plan (``artifacts[].compiler``); else the
build log is read; without either the ``.rknn`` file's size plus the stage's I/O bytes stand
in.  A run holds every resident stage plus the largest per-stage one; ``--cfg-parallel`` holds
two contexts of each, so twice that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rkpart.bundle.cores import build_log
from rkpart.compile.compiler_plan import parse_memory
from rkpart.compile.runner import read_log
from rkpart.errors import BudgetError
from rkpart.plan.plan import Plan, Stage
from rkpart.units import MIB


@dataclass(frozen=True)
class StageMemory:
    bytes: int
    source: str  # "compiler plan", "compile log" or "rknn file + I/O"


def stage_memory(folder: Path, stage: Stage) -> StageMemory:
    """Device bytes one context of ``stage`` holds (module doc)."""
    art = stage.artifact("rknn")
    planned = art.compiler.device_mem_bytes if art is not None and art.compiler is not None else None
    if planned is not None:
        return StageMemory(planned, "compiler plan")
    log = build_log(folder, stage)
    if log is not None:
        weight, internal = parse_memory(read_log(log, folder))
        if weight is not None and internal is not None:
            return StageMemory(weight + internal, "compile log")
    return StageMemory((art.size_bytes if art else stage.weight_bytes) + stage.io_bytes, "rknn file + I/O")


def run_bytes(per_stage: Mapping[str, int], residency: Mapping[str, str], *, cfg_parallel: bool) -> int:
    """Resident stages + the largest per-stage one, twice under ``cfg_parallel``."""
    resident = sum(b for sid, b in per_stage.items() if residency[sid] == "resident")
    peak = max((b for sid, b in per_stage.items() if residency[sid] != "resident"), default=0)
    return (resident + peak) * (2 if cfg_parallel else 1)


def check_cfg_parallel(plan: Plan, per_stage: Mapping[str, int], residency: Mapping[str, str], budget: int) -> None:
    """Refuse ``--cfg-parallel`` when both contexts of the run do not fit ``budget``.

    Raises
    ------
    BudgetError
        Naming what the run needs and the largest configuration that fits.
    """
    need = run_bytes(per_stage, residency, cfg_parallel=True)
    if need <= budget:
        return
    per = {sid: "per-stage" for sid in residency}
    options = [("--cfg-parallel --residency per-stage", run_bytes(per_stage, per, cfg_parallel=True)),
               ("no --cfg-parallel, the residency as given", run_bytes(per_stage, residency, cfg_parallel=False)),
               ("no --cfg-parallel, --residency per-stage", run_bytes(per_stage, per, cfg_parallel=False))]
    fits = [(label, b) for label, b in options if b <= budget]
    hint = (f"the largest that fits: {fits[0][0]} ({fits[0][1] / MIB:.1f} MiB)" if fits
            else f"nothing fits; the smallest is {options[-1][1] / MIB:.1f} MiB")
    raise BudgetError(f"--cfg-parallel holds two contexts of every NPU stage: {need / MIB:.1f} MiB of device "
                      f"memory ({len(plan.npu_stages)} NPU stages), over the budget of {budget / MIB:.1f} MiB; "
                      f"{hint}")


__all__ = ["StageMemory", "check_cfg_parallel", "run_bytes", "stage_memory"]
