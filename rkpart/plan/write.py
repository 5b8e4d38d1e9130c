"""Partition -> plan folder, crash-safe.  The last step of ``rkpart partition``.

Stages are written into a sibling staging folder ``.<out>.partial``; once a stage's files
are written, a line recording it is appended to ``stages/done.jsonl``, so a killed run can be
resumed (same model, strategy and options) without redoing finished stages.  Only when every
stage and ``plan.json`` are written does the staging folder replace ``out``.

Deciding the partition is not done here: :func:`rkpart.grouping.propose.propose` does that.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, cast

from rkpart.discovery.structure import Discovery
from rkpart.errors import InvalidModelError, UserError, os_error
from rkpart.grouping.coverage import npu_coverage
from rkpart.grouping.groups import Group, Partition, order_groups
from rkpart.io import (
    atomic_write_bytes,
    file_sha256,
    folder_lock,
    loads_json,
    recover_folder,
    replace_folder,
)
from rkpart.ir import ModelGraph
from rkpart.ir.ops import CONTROL_FLOW_OPS
from rkpart.output import write_marker
from rkpart.plan.extract import (
    DEFAULT_EXTERNAL_THRESHOLD,
    ExtractedStage,
    PendingStage,
    check_stage,
    extract_start,
    source_sha256,
    stage_sha256,
)
from rkpart.plan.outdir import PLAN_KIND, RUN_KEY_FILE, check_out, check_staging, resume_key
from rkpart.plan.plan import PLAN_FILENAME, Plan, Stage, TensorInfo
from rkpart.plan.weights import LINK_DIR, WeightsMode, fast_writer, link_files, sync_tree
from rkpart.progress import Progress
from rkpart.readers import FileKind
from rkpart.types import JsonObject, PlanExtra

#: stages whose weights may be in flight at once, and the threads moving them
_IN_FLIGHT = 3
_WORKERS = 2
#: rewrites an NPU stage file in place and returns its new description, or ``None`` to keep it
StageSimplifier = Callable[[Path, ExtractedStage], "ExtractedStage | None"]


def _noop(_: str) -> None:
    pass


def prepare_out(out: Path, force: bool, model: Path | None = None) -> None:
    """Refuse an output that is a file or a symlink, holds the model, or is not empty without
    ``force``; with ``force``, one that does not validate as a plan folder (:mod:`.outdir`)."""
    check_out(out, force, model)


@dataclass(frozen=True)
class StageFiles:
    """How each stage's files are written (part of the resume key).

    ``weights="link"`` copies no weights: stages reference the source's external data, linked
    into the plan folder (:mod:`rkpart.plan.weights`).  A stage's weights over
    ``external_threshold`` bytes go to a data file beside it; ``simplify`` rewrites each NPU
    stage after extraction.
    """

    weights: WeightsMode = "copy"
    external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD
    simplify: StageSimplifier | None = None


def write_partition(
    mg: ModelGraph,
    disc: Discovery | None,
    part: Partition,
    out: str | os.PathLike[str],
    *,
    force: bool = False,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    files: StageFiles = StageFiles(),
    progress: Progress = _noop,
    attach: Callable[[Path], None] | None = None,
) -> Plan:
    """Write ``part`` of ``mg`` as the plan folder ``out`` and return the plan.

    ``attach`` adds files to the finished plan before it is swapped into place (the pipeline
    description, :func:`rkpart.roles.description_attacher`).  ``files`` is how each stage's
    files are written (weights copied or linked, :class:`StageFiles`).

    An existing non-empty ``out`` is replaced only with ``force``, and only once the new plan
    is complete.  ``input_shapes`` are the shapes ``mg`` was loaded with (part of the resume
    key).

    Raises
    ------
    SpecError
        The grouping is cyclic (two stages need each other's outputs).
    InvalidModelError
        A control-flow op would be cut into a stage.
    OutputExistsError
        ``out`` cannot be replaced.
    """
    model_path = mg.path
    # absolute: "." or "build/" must still have a name to put the staging folder next to
    out = Path(os.path.abspath(out))
    groups = order_groups(mg, part)
    _check_control_flow(mg, groups)

    model_sha = file_sha256(model_path)
    # every input of the stages: the model by content, its external data by identity (by
    # content per resumed stage, below: each weight byte is hashed once), the grouping (an
    # edited spec or cost model), options, rkpart version (rkpart.plan.outdir)
    run_key = resume_key(model_path, mg.model, part.strategy, _jsonable(part.options), groups,
                         external_threshold=files.external_threshold, simplify=files.simplify is not None,
                         input_shapes=input_shapes, model_sha256=model_sha,
                         variant={**({"weights": files.weights} if files.weights != "copy" else {}),
                                  **({"specialised": list(mg.specialised)} if mg.specialised else {})})

    staging = out.with_name(f".{out.name}.partial")
    check_staging(staging, contents=False)  # its contents are judged under the lock, below
    with folder_lock(staging, what=f"output folder {out}", nofollow=True):
        # now that it is ours, and outside the try below: a staging folder that is not ours to
        # write is refused, never removed as a failed run's leftovers
        check_staging(staging)
        try:
            with _lock_existing(out):
                recover_folder(out)
                prepare_out(out, force, model_path)  # again: another run may have finished meanwhile
                run = _Run(run_key, model_sha, files)
                plan = _write_stages(mg, disc, part, groups, staging, run, progress)
                if attach is not None:
                    attach(staging)
                write_marker(staging, PLAN_KIND)  # what --force may replace later (rkpart.output)
                replace_folder(staging, out)
        except UserError:
            # a user error is deterministic (a rerun hits it again): the staging folder is
            # useless, remove it while it is still ours
            shutil.rmtree(staging, ignore_errors=True)
            raise
        except OSError as e:
            err = os_error(e, f"writing {out}")
            if err is None:
                raise
            # disk full or read-only: a half-written staging folder would only fill the disk
            shutil.rmtree(staging, ignore_errors=True)
            raise err from None
    progress(f"wrote {out / PLAN_FILENAME}: {len(plan.npu_stages)} NPU + {len(plan.host_stages)} host stages")
    return plan


@contextlib.contextmanager
def _lock_existing(out: Path) -> Iterator[None]:
    """Lock ``out`` too when it exists, so a compile running on it blocks a ``--force`` replace."""
    if out.is_dir():
        with folder_lock(out, what=f"output folder {out}", nofollow=True):
            yield
    else:
        yield


def _check_control_flow(mg: ModelGraph, groups: list[Group]) -> None:
    """Refuse control-flow ops before anything is written.

    Their subgraphs read outer-scope tensors implicitly (not through ``node.input``), so a
    cut cannot see those dependencies and a stage holding one would not be standalone.
    """
    for g in groups:
        for i in sorted(g.ops):
            n = mg.op(i)
            if n.op_type in CONTROL_FLOW_OPS:
                raise InvalidModelError(
                    f"{mg.path.name}: control-flow op {n.op_type} {n.name or i!r} would be cut into stage "
                    f"{g.id}; rkpart cannot cut around If/Loop/Scan: inline or remove it first "
                    "(e.g. onnxsim, or export with the condition resolved)"
                )


def _sweep_temp(folder: Path) -> None:
    """Remove temp files a killed atomic write left behind (``.<name>.<random>.tmp``)."""
    for p in folder.rglob(".*.tmp"):
        if p.is_file():
            p.unlink()


#: the resume journal: one JSON line per finished stage, appended once its files are written
JOURNAL = "done.jsonl"


#: what an interrupted partition left in its staging folder to resume from (unreadable: not resumed)
JOURNAL_KIND = FileKind("resume journal", "bytes", 1 << 26, UserError, symlinks=False,
                        doc="a staging folder's journal of finished stages (unreadable: written again)")
RUN_KEY_KIND = FileKind("run key", "json", 1 << 16, UserError, symlinks=False,
                        doc="a staging folder's run key (unreadable: the run starts over)")


def _read_journal(stages_dir: Path) -> dict[str, Stage]:
    """The stages an interrupted run recorded as finished, by file name (a torn or foreign line
    is skipped: that stage is written again)."""
    path = stages_dir / JOURNAL
    if not path.is_file() or path.is_symlink():
        return {}
    try:
        text = JOURNAL_KIND.read(path, root=stages_dir)
    except (OSError, UserError):
        return {}  # an unreadable journal: every stage is written again
    out: dict[str, Stage] = {}
    for line in text.splitlines():
        try:
            stage = Stage.from_json(loads_json(line, what="resume journal line"))
        except (UserError, KeyError, TypeError, ValueError, AttributeError):
            continue
        out[PurePosixPath(stage.file).name] = stage
    return out


def _stage_done(stages_dir: Path, fname: str, journal: Mapping[str, Stage]) -> Stage | None:
    """The finished stage recorded by a previous (interrupted) run, if its files are intact."""
    stage = journal.get(fname)
    if stage is None or not (stages_dir / fname).is_file():
        return None
    return stage if stage_sha256(stages_dir / fname) == stage.sha256 else None


@dataclass(frozen=True)
class _Run:
    """One write of a plan folder: its resume key, the model's sha256 and how stages are written."""

    key: str
    model_sha: str
    files: StageFiles


def _write_stages(mg: ModelGraph, disc: Discovery | None, part: Partition, groups: list[Group],
                  staging: Path, run: _Run, progress: Progress) -> Plan:
    """Write every stage and ``plan.json`` into ``staging`` (locked), resuming finished stages.

    Order matters for crash safety: a stage's journal line is appended after its files are
    written (a stage killed half-way has none and is written again; a journaled one is resumed
    only if its files still hash to what the line says); ``plan.json`` is written before the
    journal and ``run.json`` are removed, so a run killed anywhere either resumes or starts
    over, never trusts half a file.
    """
    model_path, run_key, model_sha = mg.path, run.key, run.model_sha
    external_threshold, simplify, weights = run.files.external_threshold, run.files.simplify, run.files.weights
    key_file = staging / RUN_KEY_FILE
    old = None
    if key_file.is_file():
        try:
            old = RUN_KEY_KIND.load(key_file, root=staging).get("key")
        except (OSError, UserError, AttributeError):
            old = None
    resuming = old == run_key
    if not resuming:
        # a different run (other model/options) or one killed before it recorded its key:
        # nothing in the folder can be trusted
        _clear(staging)
    _sweep_temp(staging)
    atomic_write_bytes(key_file, json.dumps({"key": run_key}).encode())
    stages_dir = staging / "stages"
    stages_dir.mkdir(exist_ok=True)
    journal = _read_journal(stages_dir) if resuming else {}
    linked: dict[str, str] | None = None
    weights_record: JsonObject | None = None
    if weights == "link":
        linked, weights_record = link_files(mg, stages_dir)
        progress(f"linked {len(linked)} weights file(s) into {stages_dir.name}/{LINK_DIR}")
    stages: list[Stage | None] = []
    tensors: dict[str, TensorInfo] = {}
    pending: dict[int, tuple[PendingStage, Group, str]] = {}
    infos: JsonObject = {}  # value infos, shared by the stages a tensor crosses

    def finish(i: int) -> None:
        job, g, fname = pending.pop(i)
        ex = job.result()
        check_stage(stages_dir / fname)
        if simplify is not None and g.device == "npu":
            ex = simplify(stages_dir / fname, ex) or ex
        stage = Stage(
            id=g.id, device=g.device, file=f"stages/{fname}", inputs=ex.inputs, outputs=ex.outputs,
            block=g.block, blocks=g.blocks, region=g.region, kind=g.kind, weight_bytes=ex.weight_bytes,
            io_bytes=ex.io_bytes, sha256=ex.sha256, num_nodes=ex.num_nodes,
        )
        # one line, one write: verified by sha256 on resume, a torn one is skipped
        os.write(log, json.dumps(stage.to_json(), sort_keys=True).encode() + b"\n")
        stages[i] = stage

    n = len(groups)
    # weight bytes are copied (in the kernel) and hashed (from the source) on two threads while
    # the next stages' graphs are cut; at most a few stages are in flight
    log = _open_journal(stages_dir / JOURNAL)
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, log)
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="rkpart-weights"))
        for idx, g in enumerate(groups):
            sub = mg.subgraph(g.ops)
            _add_tensors(mg, tensors, [*sub.inputs, *sub.outputs])
            fname = f"{idx:03d}_{g.id}.onnx"
            doc = f"rkpart stage {g.id} ({g.kind}) of {model_path.name}"
            prev = _stage_done(stages_dir, fname, journal) if journal else None
            if prev is not None and source_sha256(mg, sub, stages_dir / fname, name=g.id, doc=doc, linked=linked,
                                                  external_threshold=external_threshold) != prev.sha256:
                prev = None  # its bytes in the source changed since it was written: write it again
            stages.append(prev)
            if prev is not None:
                progress(f"[{idx + 1}/{n}] {g.id}: already written (resumed)")
                continue
            progress(f"[{idx + 1}/{n}] {g.id} ({g.device}, {len(g.ops)} ops)")
            job = extract_start(mg, sub, stages_dir / fname, name=g.id,
                                external_threshold=external_threshold, linked=linked, durable=False,
                                doc=doc, pool=pool, infos=infos)
            pending[idx] = (job, g, fname)
            for i in sorted(pending):
                if pending[i][0].done() or len(pending) > _IN_FLIGHT:
                    finish(i)
        for i in sorted(pending):
            finish(i)
    done = [s for s in stages if s is not None]
    assert len(done) == n
    _add_tensors(mg, tensors, [*mg.inputs, *mg.outputs])
    plan = Plan(
        model={"file": model_path.name, "sha256": model_sha, "opset": mg.opset,
               "path": str(model_path.resolve()),
               "nodes": mg.num_ops},
        strategy={"name": part.strategy, "options": _jsonable(part.options)},
        inputs=mg.inputs,
        outputs=mg.outputs,
        tensors=tensors,
        stages=tuple(done),
        blocks=tuple(disc.summary()) if disc else (),
        specialised=mg.specialised,
        # the strategy's own keys come along (a plugin's are its own): PlanExtra names rkpart's
        extra=cast(PlanExtra, {"discovery": disc.method if disc else None, "notes": list(part.notes),
                               **dict(part.extra),
                               **({"npu_coverage": npu_coverage(mg, disc, groups).to_json()} if disc else {}),
                               **({"weights": weights_record} if weights_record else {})}),
    )
    with fast_writer(staging / PLAN_FILENAME) as tmp:
        tmp.write_bytes(plan.dumps().encode())
    (stages_dir / JOURNAL).unlink()
    key_file.unlink()
    # files of stages a previous, different partition left (e.g. more stages) are not ours
    keep = {Path(s.file).name for s in done} | {f"{Path(s.file).name}.data" for s in done}
    if linked is not None:
        keep.add(LINK_DIR)
    for f in stages_dir.iterdir():
        if f.name not in keep:
            if f.is_dir() and not f.is_symlink():
                shutil.rmtree(f)
            else:
                f.unlink()
    _sweep_temp(staging)
    sync_tree(staging)  # the one flush: every stage file was renamed into place without fsync
    return plan


def _open_journal(path: Path) -> int:
    """The resume journal, opened for appending (never through a symlink)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        path.unlink()  # a symlink rkpart did not make: replace it, never write through it
        return os.open(path, flags, 0o666)


def _clear(folder: Path) -> None:
    """Empty a staging folder, its run key last: a run killed half-way through leaves a folder
    that still says it is a staging folder (:func:`~rkpart.plan.outdir.check_staging`)."""
    for p in sorted(folder.iterdir(), key=lambda p: p.name == RUN_KEY_FILE):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _add_tensors(mg: ModelGraph, tensors: dict[str, TensorInfo], names: list[str]) -> None:
    for t in names:
        if t not in tensors:
            dt, shape = mg.tensor_types[t]
            tensors[t] = TensorInfo(t, dt, shape)


def _jsonable(v: object) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


__all__ = ["StageFiles", "StageSimplifier", "prepare_out", "write_partition"]
