"""Compile the candidates ``auto`` chooses from before it chooses: the pipeline's step, not the strategy's.

With ``--strategy auto --toolkit V`` (option ``compile``), one block per anatomy of every
candidate family is written as a plan, built with rknn-toolkit2 (or taken from the build cache)
and, for int8 candidates, calibrated and built int8 (:func:`ground_candidates`); the folders go
to :meth:`rkpart.auto.AutoStrategy.choose` as :class:`~rkpart.auto.Grounded` builds, whose
compiler tables replace the cost model's predictions.  :func:`auto_grouping` is how
:func:`rkpart.pipeline.propose` asks ``auto`` for its groups, once per proposal on the graph
the proposal is at.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rkpart.auto import AutoOptions, AutoStrategy, Grounded
from rkpart.cost_model.candidates import block_anatomy
from rkpart.discovery.structure import Discovery
from rkpart.grouping.capability import apply_capability
from rkpart.grouping.groups import Partition
from rkpart.grouping.learned import target_capability
from rkpart.grouping.propose import Grouping
from rkpart.grouping.strategies import get_strategy
from rkpart.grouping.strategies.base import propose_with
from rkpart.grouping.strategies.families import families
from rkpart.io import default_cache_dir
from rkpart.ir import ModelGraph
from rkpart.plan.write import StageFiles, write_partition
from rkpart.progress import Progress, silent
from rkpart.targets import get_target
from rkpart.targets.capability import Capability

if TYPE_CHECKING:  # compile and profile are imported when a candidate is built, not with the pipeline
    from rkpart.compile.compile import CompileReport
    from rkpart.compile.toolkits import Toolkit
    from rkpart.plan.plan import Plan


def auto_grouping(strategy: AutoStrategy, opts: AutoOptions) -> Grouping:
    """How the pipeline asks ``auto`` for its groups: the cost model read, the capability
    (``opts.toolkit``: a version or a python), and with ``opts.compile`` the representative
    candidates compiled first (into ``opts.compile_dir``, else a temporary folder under the user
    cache, removed once the choice is made)."""
    def group(mg: ModelGraph, disc: Discovery | None) -> Partition:
        from rkpart.compile.toolkits import toolkit_version

        assert disc is not None
        model = strategy.cost_model(opts)
        cap = target_capability(get_target().name, toolkit_version(opts.toolkit)) if opts.capability else None
        if not opts.compile or opts.toolkit is None:
            return strategy.choose(mg, disc, opts, model, capability=cap)
        with contextlib.ExitStack() as stack:
            if opts.compile_dir is not None:
                work = Path(opts.compile_dir)
            else:
                root = default_cache_dir()
                root.mkdir(parents=True, exist_ok=True)
                work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="auto-", dir=root)))
            folders, notes = ground_candidates(mg, disc, opts.toolkit, work, max_run=opts.max_run,
                                               toolkits_dir=opts.toolkits_dir, progress=strategy.progress,
                                               capability=cap, precisions=opts.precisions,
                                               keep_weights=opts.compile_dir is not None)
            return strategy.choose(mg, disc, opts, model, capability=cap,
                                   grounded=Grounded(tuple(map(str, folders)), tuple(notes)))

    return group


def ground_candidates(mg: ModelGraph, disc: Discovery, toolkit: str, work: Path, *, max_run: int = 2,
                      toolkits_dir: str | None = None, progress: Progress = silent,
                      capability: Capability | None = None,
                      precisions: tuple[str, ...] = ("fp16",), keep_weights: bool = True
                      ) -> tuple[list[Path], list[str]]:
    """Compile one block per distinct anatomy of every candidate family with ``toolkit``, or take
    the builds from the user's build cache, so that ``auto`` chooses from the compiler's own tables.

    Each family's plan is written under ``work`` (weights linked: a reflink where the file system has
    them, else a copy of the source's data); of its NPU stages only those of the first block of each
    anatomy (:func:`~rkpart.cost_model.candidates.block_anatomy`) are built.  Without
    ``keep_weights`` (``auto``'s own temporary folder) a family's linked weights are removed once it
    is built (and calibrated): the selection reads only its plan.json and builds, and disk holds at
    most two copies of the weights at a time instead of one per family.  The folders are then not
    plans any command can read again (their stages' data is gone), which is why a ``compile_dir``
    the user gives keeps them.
    Returns the compiled plan folders (``SelectionConfig.compiled``) and notes for the
    explanation.  A toolkit that is not installed gives no folders and a note saying so.

    With ``int8`` in ``precisions``, each family's plan is also calibrated (``rkpart calibrate``'s
    :func:`~rkpart.profile.calibrate.write_calibration`, its defaults: 4 denoising steps with CFG on
    ONNX Runtime, 20 samples per stage, seed 0; into ``work/<family>.calib``), written again as
    ``work/<family>.int8`` and its representative stages built int8 from that calibration, so
    that int8 candidates read an int8 build's own tables.  A plan that cannot be calibrated (no
    denoising loop) leaves its int8 candidates on the prior, with a note.
    """
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from rkpart.compile.toolkits import find_toolkit
    from rkpart.errors import ToolkitError
    from rkpart.plan.weights import drop_links

    try:
        tk = find_toolkit(toolkit, toolkits_dir)
    except ToolkitError as e:
        return [], [f"candidates not compiled: {e}; device memory is predicted (rkpart toolkit install {toolkit})"]
    anatomy = {b.index: block_anatomy(mg, b) for b in disc.blocks}
    folders: list[Path] = []
    notes: list[str] = []
    for fam in families(max_run, len(disc.blocks)):
        cid = fam.id
        out = work / cid
        progress(f"auto: {cid}: partitioning to compile one block per anatomy")
        part = propose_with(get_strategy(fam.strategy), mg, disc, fam.options)
        if capability is not None:
            part = apply_capability(mg, part, capability)
        plan = write_partition(mg, disc, part, out, force=True, files=StageFiles(weights="link"))
        seen: set[tuple[tuple[str, ...], str]] = set()
        reps = []
        for st in plan.npu_stages:
            k = (tuple(anatomy.get(b, str(b)) for b in st.blocks), st.region)
            if st.blocks and k not in seen:
                seen.add(k)
                reps.append(st.id)
        if not reps:
            if not keep_weights:
                drop_links(out, plan.extra.get("weights"))
            continue
        progress(f"auto: {cid}: compiling {len(reps)} representative stage(s) with rknn-toolkit2 {tk.version}")
        rep = compile_plan_report(plan, out, CompileOptions(tk, stages=reps), progress=progress)
        failed = [o.stage_id for o in rep.failed]
        notes.append(f"{cid}: {len(reps)} stage(s) of {len({a for a in anatomy.values()})} block anatomy(ies) compiled "
                     f"with rknn-toolkit2 {tk.version} ({len(rep.cached)} from the build cache"
                     + (f"; failed: {', '.join(failed)}" if failed else "") + ")")
        folders.append(out)
        if "int8" in precisions:
            int8 = _ground_int8(mg, disc, part, plan, out, reps, tk, progress)
            if isinstance(int8, str):
                notes.append(f"{cid}: int8 not compiled: {int8}; its int8 candidates use the int8 prior")
            else:
                folder, rep8 = int8
                failed = [o.stage_id for o in rep8.failed]
                notes.append(f"{cid}: {len(reps)} stage(s) compiled int8 (w8a8) from auto's own calibration "
                             f"({folder.name[:-len('.int8')]}.calib) with rknn-toolkit2 {tk.version} "
                             f"({len(rep8.cached)} from the build cache"
                             + (f"; failed: {', '.join(failed)}" if failed else "") + ")")
                folders.append(folder)
                if not keep_weights:
                    drop_links(folder, rep8.plan.extra.get("weights"))
        if not keep_weights:  # built (and calibrated): the selection reads plan.json and the builds only
            drop_links(out, plan.extra.get("weights"))
    return folders, notes


def _reusable_calibration(calib: Path, plan: Plan) -> bool:
    """Whether ``calib`` (kept in ``compile_dir`` by an earlier run) is this plan's calibration with
    calibrate's defaults: the same plan gives the same samples, so it is not made again."""
    from rkpart.compile.calibration import load_calibration
    from rkpart.errors import RkpartError
    from rkpart.profile.calibrate import DEFAULT_SAMPLES

    if not (calib / "calibration.json").is_file():
        return False
    try:
        cal = load_calibration(calib)
        cal.check_plan(plan)
    except RkpartError:
        return False
    return (cal.source, cal.steps, cal.cfg, cal.seed, cal.samples) == ("denoise", 4, True, 0, DEFAULT_SAMPLES)


def _ground_int8(mg: ModelGraph, disc: Discovery, part: Partition, plan: Plan, fp16_dir: Path, reps: list[str],
                 tk: Toolkit, progress: Progress) -> tuple[Path, CompileReport] | str:
    """Calibrate a family's fp16 plan and build its representative stages int8 in a second plan
    folder (``<family>.int8``); the reason as a string when that cannot be done."""
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from rkpart.errors import RkpartError
    from rkpart.profile.calibrate import write_calibration

    calib = fp16_dir.with_name(fp16_dir.name + ".calib")
    out = fp16_dir.with_name(fp16_dir.name + ".int8")
    try:
        if not _reusable_calibration(calib, plan):
            progress(f"auto: {fp16_dir.name}: calibrating the plan for int8 builds (rkpart calibrate, 4 steps, CFG)")
            write_calibration(plan, fp16_dir, calib, force=True, progress=progress)
        plan8 = write_partition(mg, disc, part, out, force=True, files=StageFiles(weights="link"))
        progress(f"auto: {fp16_dir.name}: compiling {len(reps)} representative stage(s) int8 with rknn-toolkit2 "
                 f"{tk.version}")
        rep = compile_plan_report(plan8, out, CompileOptions(tk, stages=tuple(reps), precision="int8",
                                                             calibration=str(calib)), progress=progress)
    except RkpartError as e:
        return str(e)
    return out, rep


__all__ = ["auto_grouping", "ground_candidates"]
