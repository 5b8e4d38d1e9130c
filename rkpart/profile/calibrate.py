"""Calibration data for quantized builds, produced by the plan itself (issue 27).

``rkpart calibrate PLAN -o CALIB`` runs the denoising loop of :mod:`rkpart.profile.drift` on
ONNX Runtime through the plan's stages and keeps, per NPU stage, the inputs that stage saw:
``samples`` of them, spread evenly over the steps and both CFG passes (more seeded runs of the
loop are made when one run has fewer than ``samples``).  A plan whose inputs cannot be read as
a denoising loop (``generic`` on a non-DiT model) is calibrated on ``--inputs`` instead.

The NPU stages run on an instrumented ONNX Runtime session that also returns every node
output inside the stage (in fp32, also for an fp16 stage: :func:`_to_fp32`), so the same loop
records each stage's intermediate activation ranges: the *fp16 range check*.  The board runs
fp16 layers (every layer of an fp16 build, the layers hybrid keeps) in fp16, while the
simulator does not show their overflow, so a stage whose activations come near fp16's limits
can read cosine 1.0 in the simulator and be wrong on the board (rknn-toolkit2 #149: an SD UNet
at 0.339 on the board).

Layout of CALIB (every name content-derived, no timestamps, no absolute paths, so the same
plan and inputs give byte-identical files)::

    calibration.json            manifest: plan and model sha256, steps, cfg, seed, samples,
                                per stage its dataset, input ranges and the fp16 range check
    samples/<sha256[:32]>.npy   one tensor (a tensor that feeds several stages is stored once)
    stages/<stage id>/dataset.txt   rknn-toolkit2's dataset format: one line per sample,
                                the stage's inputs in graph order, paths relative to the file

The manifest's ``plan_sha256`` is :func:`plan_digest`: the plan as ``partition`` wrote it,
without what ``compile`` adds, so compiling the plan does not make its calibration stale.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.compile.calibration import (
    DATASET_KIND,
    DEFAULT_SAMPLES,
    FORMAT,
    MANIFEST,
    VERSION,
    Calibration,
    RangeStats,
    StageCalibration,
    fp16_findings,
    load_calibration,
    plan_digest,
)
from rkpart.errors import OutputExistsError, SpecError, UserError
from rkpart.io import check_finite_arrays
from rkpart.output import owned_problem, staged_folder
from rkpart.plan.plan import Plan, Stage
from rkpart.readers import FileKind, read_npz
from rkpart.roles import NO_FLAGS, RoleFlags
from rkpart.runtime.base import Backend, Feeds, StageRunner

MIN_SAMPLES, MAX_SAMPLES = 1, 1000
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


# -- the instrumented NPU stages --------------------------------------------------------------------
class _Recorder:
    """What the recording runners collect: per NPU stage, the inputs of every call and the
    running range of every tensor inside it."""

    def __init__(self) -> None:
        #: stage -> sha256 of the inputs -> the inputs, in the order first seen: a stage that does
        #: not read the conditioning (block 0's self-attention) gets the same inputs in both CFG
        #: passes, and a repeated sample would only weigh that point twice
        self.calls: dict[str, dict[str, dict[str, np.ndarray]]] = {}
        self.stats: dict[str, dict[str, RangeStats]] = {}
        self.order: dict[str, tuple[str, ...]] = {}  # stage -> its graph inputs in order


def _to_fp32(model: Any) -> bool:
    """Turn an fp16 model into fp32 in place (initializers, Constant values, Cast targets, declared
    types), so its activations are seen unrounded and unclipped: an fp16 session would show an
    overflow only as inf.  Returns whether anything was fp16."""
    import onnx
    from onnx import numpy_helper

    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    changed = False

    def tensor(t: Any) -> None:
        nonlocal changed
        if t.data_type == f16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
            changed = True

    def graph(g: Any) -> None:
        nonlocal changed
        for t in g.initializer:
            tensor(t)
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.tensor_type.elem_type == f16:
                vi.type.tensor_type.elem_type = f32
                changed = True
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    tensor(a.t)
                elif a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)
                elif n.op_type == "Cast" and a.name == "to" and a.i == f16:
                    a.i = f32
                    changed = True

    graph(model.graph)
    return changed


class _RecordingRunner(StageRunner):
    def __init__(self, stage: Stage, folder: Path, rec: _Recorder) -> None:
        super().__init__(stage, folder)
        self.rec = rec
        self._sess: Any = None
        self._blob: bytes | None = None
        self._names: list[str] = []
        self._fp16 = False  # the stage is fp16: run in fp32, hand fp16 back to the plan

    def _load_impl(self) -> None:
        import onnx

        from rkpart.ir.infer import inferred_value_infos
        from rkpart.plan.verify import stage_onnx

        model = onnx.load(str(stage_onnx(self.folder, self.stage)))
        self.rec.order[self.stage.id] = tuple(i.name for i in model.graph.input)
        self._fp16 = _to_fp32(model)
        inferred = inferred_value_infos(model)
        declared = {o.name for o in model.graph.output}
        floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                  onnx.TensorProto.BFLOAT16}
        for vi in inferred:
            if vi.name not in declared and vi.type.tensor_type.elem_type in floats:
                model.graph.output.append(vi)
        self._names = [o.name for o in model.graph.output]
        self._blob = model.SerializeToString()

    def _init_impl(self) -> None:
        import onnxruntime as ort

        self._sess = ort.InferenceSession(self._blob, providers=["CPUExecutionProvider"])
        self._blob = None

    def _infer_impl(self, feeds: Feeds) -> Feeds:
        sid = self.stage.id
        h = hashlib.sha256()
        for n in sorted(feeds):
            a = np.ascontiguousarray(feeds[n])
            h.update(f"{n}\0{a.dtype.str}\0{a.shape}\0".encode())
            h.update(a.tobytes())
        self.rec.calls.setdefault(sid, {}).setdefault(h.hexdigest(), {n: np.array(v) for n, v in feeds.items()})
        run = {n: v.astype(np.float32) if v.dtype == np.float16 else v for n, v in feeds.items()} if self._fp16 \
            else feeds
        outs = self._sess.run(self._names, run)
        stats = self.rec.stats.setdefault(sid, {})
        for n, a in zip(self._names, outs, strict=True):
            stats.setdefault(n, RangeStats()).add(np.asarray(a))
        got = dict(zip(self._names, outs, strict=True))
        if self._fp16:  # what the stage itself would give: fp16 (overflowing values become inf there)
            return {n: got[n].astype(np.float16) if got[n].dtype == np.float32 else got[n] for n in self.stage.outputs}
        return {n: got[n] for n in self.stage.outputs}

    def _release_impl(self) -> None:
        self._sess = None


class _RecordingBackend(Backend):
    name = "ort-calibrate"
    devices = ("npu",)

    def __init__(self) -> None:
        self.rec = _Recorder()

    def runner(self, stage: Stage, folder: Path) -> StageRunner:
        return _RecordingRunner(stage, folder, self.rec)


# -- running ---------------------------------------------------------------------------------------
def _load_samples(path: Path, plan: Plan) -> list[Feeds]:
    """``--inputs``: an .npz with one array per model input, shaped as the model's input
    (one sample) or with one more leading axis (that many samples)."""
    from rkpart.runtime.executor import load_inputs

    # only the model's inputs are decoded, each header checked first (a 2^40-element header on a
    # few bytes is refused, not allocated); samples with NaN/Inf would make every range NaN
    raw = read_npz(path, what="inputs file", names=plan.inputs)
    check_finite_arrays(raw, what=f"inputs file {path}")
    counts = set()
    for n in plan.inputs:
        a, shape = raw.get(n), plan.tensors[n].shape
        if a is not None and a.ndim == len(shape) + 1 and tuple(a.shape[1:]) == tuple(shape):
            counts.add(int(a.shape[0]))
        else:
            counts.add(0)
    if counts == {0}:
        return [load_inputs(path, plan)]
    if len(counts) != 1 or 0 in counts:
        raise UserError(f"inputs {path}: every model input needs the same number of samples along a leading "
                        f"axis (model inputs: {', '.join(f'{n} {list(plan.tensors[n].shape)}' for n in plan.inputs)})")
    k = counts.pop()
    return [{n: raw[n][i].astype(plan.tensors[n].dtype, copy=False) for n in plan.inputs} for i in range(k)]


#: ``rkpart.build(..., dataset=FILE)``: rknn-toolkit2's dataset file of the whole model, the user's
#: own (its paths may be absolute, as rknn-toolkit2 takes them), and each ``.npy`` sample it names
USER_DATASET_KIND = FileKind("dataset file", "text", 4 << 20, UserError,
                             doc="`rkpart.build(dataset=...)`: rknn-toolkit2's sample list of the whole model")
USER_SAMPLE_KIND = FileKind("dataset sample", "npy", 16 << 30, UserError,
                            doc="a `.npy` sample a dataset file names")


def dataset_feeds(dataset: Path, plan: Plan) -> list[Feeds]:
    """The samples of a whole model's rknn-toolkit2 dataset file (one line per sample, the model
    inputs' ``.npy`` paths in input order, relative to the file), checked against the plan."""
    text = USER_DATASET_KIND.parse(USER_DATASET_KIND.read(dataset), str(dataset))
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    if len(lines) > MAX_SAMPLES:
        raise USER_DATASET_KIND.fail(dataset, f"has {len(lines)} samples, more than {MAX_SAMPLES}")
    out: list[Feeds] = []
    for k, paths in enumerate(lines, 1):
        if len(paths) != len(plan.inputs):
            raise UserError(f"dataset {dataset} line {k}: {len(paths)} path(s), the model has {len(plan.inputs)} "
                            f"input(s) ({', '.join(plan.inputs)})")
        feeds: Feeds = {}
        for name, p in zip(plan.inputs, paths, strict=True):
            a = USER_SAMPLE_KIND.load(dataset.parent / p)
            info = plan.tensors[name]
            if tuple(a.shape) != tuple(info.shape):
                raise UserError(f"dataset {dataset} line {k}: {p} has shape {list(a.shape)}, input {name!r} "
                                f"wants {list(info.shape)}")
            feeds[name] = a.astype(info.dtype, copy=False)
        out.append(feeds)
    if not out:
        raise UserError(f"dataset {dataset} has no samples")
    return out


def _spread(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)`` (all of them when ``k >= n``)."""
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)} if k > 1 else {0})


@dataclass(frozen=True)
class CalibrationOptions:
    """How ``rkpart calibrate`` runs the denoising loop it records.

    ``steps`` per run, the unconditional pass too (``cfg``; ``None``: as the pipeline runs),
    ``samples`` kept per NPU stage (more seeded runs are made until every stage has them), the
    ``seed`` of the first run (run ``r`` uses ``seed + r``).  The loop's roles come from the
    plan's description, else ``flags``, else the shape rule; ``embeds`` (``--embeds``) gives its
    conditioning (:mod:`rkpart.roles`).
    """

    steps: int = 4
    cfg: bool | None = True
    samples: int = DEFAULT_SAMPLES
    seed: int = 0
    flags: RoleFlags = NO_FLAGS
    embeds: str | os.PathLike[str] | None = None


def collect(plan: Plan, folder: Path, opts: CalibrationOptions, *, inputs: Sequence[Feeds] | None,
            guidance: float | None = None,
            progress: Callable[[str], None] | None = None) -> tuple[_Recorder, str, int, bool]:
    """Run the loop ``opts`` describes (or ``inputs``) through ``plan`` with the NPU stages instrumented.

    Returns the recorder, the source (``denoise``/``inputs``) and the number of loop runs, and
    whether the unconditional pass ran.
    """
    from rkpart.profile.drift import denoise_steps, effective_cfg
    from rkpart.roles import load_embeds, loop_inputs, plan_description, resolve_roles
    from rkpart.runtime.executor import PlanExecutor

    say = progress or (lambda _m: None)
    backend = _RecordingBackend()
    if inputs is not None:
        with PlanExecutor(plan, folder, backend=backend, residency="resident") as ex:
            for i, feeds in enumerate(inputs):
                ex.run(feeds)
                say(f"sample {i + 1}/{len(inputs)} run")
        return backend.rec, "inputs", len(inputs), False
    steps, samples, seed = opts.steps, opts.samples, opts.seed
    try:
        roles = resolve_roles(plan, plan_description(plan, folder), opts.flags, progress=say)
    except SpecError as e:
        raise SpecError(f"this plan has no denoising loop to calibrate on ({e}); pass --inputs FILE.npz") from None
    use_cfg = effective_cfg(roles, opts.cfg, say=say)
    pair = load_embeds(opts.embeds, roles, plan, cfg=use_cfg) if opts.embeds is not None else None
    # one run gives each stage steps x passes samples, fewer distinct ones where the passes agree:
    # more seeded runs until every stage has ``samples`` distinct ones (at most twice the runs
    # that would take if the passes always agreed; a stage whose inputs never vary keeps fewer)
    max_runs = 2 * math.ceil(samples / steps)
    npu = [s.id for s in plan.npu_stages]
    r = 0
    while r < max_runs:
        lp = loop_inputs(plan, roles, seed=seed + r, embeds=pair, guidance=guidance)
        for step, _ in enumerate(denoise_steps(plan, folder, backend=backend, steps=steps, cfg=use_cfg,
                                               guidance=guidance, seed=seed + r, inputs=lp)):
            say(f"run {r + 1} (seed {seed + r}): step {step + 1}/{steps}")
        r += 1
        if min(len(backend.rec.calls.get(sid, {})) for sid in npu) >= samples:
            break
    return backend.rec, "denoise", r, use_cfg


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _stage_dir(index: int, stage_id: str) -> str:
    return stage_id if _SAFE_ID.fullmatch(stage_id) and stage_id not in (".", "..") else f"stage{index:03d}"


def write_calibration(plan: Plan, folder: Path, out: Path, opts: CalibrationOptions = CalibrationOptions(), *,
                      inputs: str | os.PathLike[str] | Sequence[Feeds] | None = None, force: bool = False,
                      progress: Callable[[str], None] | None = None) -> Calibration:
    """``rkpart calibrate``: collect, then write ``out`` through a staging folder and an atomic swap.

    ``opts`` is how the denoising loop runs (:class:`CalibrationOptions`); ``inputs``, an .npz file
    (see :func:`_load_samples`) or model inputs (one dict per sample), replace the loop.  ``out``
    may be replaced (``force``) only if it is a calibration folder itself.
    """
    samples = opts.samples
    if inputs is not None and opts.embeds is not None:
        raise UserError("--embeds gives the denoising loop its conditioning; --inputs replaces the loop: "
                        "give one of them")
    if not MIN_SAMPLES <= samples <= MAX_SAMPLES:
        raise UserError(f"--samples {samples}: must be {MIN_SAMPLES}..{MAX_SAMPLES} (rknn-toolkit2 advises 20-100)")
    if not plan.npu_stages:
        raise SpecError("the plan has no NPU stages: nothing to calibrate")
    out = Path(out)
    _check_out(out, force)
    feeds = _load_samples(Path(inputs), plan) if isinstance(inputs, (str, os.PathLike)) else inputs
    rec, source, _runs, cfg = collect(plan, folder, opts, inputs=feeds, progress=progress)
    # rkpart.output: a staging folder of someone else's files is refused, never emptied
    with staged_folder(out, kind=CALIBRATION_KIND, force=force, problem=_calibration_problem) as staging:
        entries = _write_tree(plan, staging, rec, source, opts.steps, cfg, opts.seed, samples)
    assert entries  # the plan has NPU stages, so every one of them was recorded
    return load_calibration(out)


#: the output kind in a calibration folder's rkpart marker (rkpart.output)
CALIBRATION_KIND = "calibration"


def calibration_listing(folder: Path) -> set[str] | str:
    """What a calibration folder written before rkpart's output marker holds
    (:data:`~rkpart.output.Listing`): its valid manifest, each stage's ``dataset.txt`` and the
    sample files those name."""
    try:
        cal = load_calibration(folder)
    except UserError as e:
        return f"it is not an rkpart calibration folder ({e})"
    files = {MANIFEST}
    for sc in cal.stages.values():
        files.add(sc.dataset)
        ds = DATASET_KIND.within(folder, sc.dataset)
        for tok in DATASET_KIND.parse(DATASET_KIND.read(ds, root=folder), str(ds)).split():
            sample = DATASET_KIND.within(folder, tok, base=ds.parent, by=ds)
            files.add(Path(os.path.normpath(sample)).relative_to(os.path.normpath(folder)).as_posix())
    return files


def _calibration_problem(folder: Path) -> str | None:
    """Why ``--force`` may not replace ``folder``: judged by rkpart's marker, or (a folder written
    before the marker existed) by what its manifest lists (:func:`calibration_listing`)."""
    return owned_problem(folder, CALIBRATION_KIND, legacy=calibration_listing)


def _check_out(out: Path, force: bool) -> None:
    if out.is_symlink():
        raise OutputExistsError(f"output {out} is a symlink; give the folder it points to or another path")
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"output {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise OutputExistsError(f"output folder {out} is not empty; use --force to replace it")
        why = _calibration_problem(out)
        if why is not None:
            raise OutputExistsError(f"refusing to replace {out}: {why}")


def _write_tree(plan: Plan, root: Path, rec: _Recorder, source: str, steps: int, cfg: bool, seed: int,
                samples: int) -> list[StageCalibration]:
    from rkpart.io import atomic_write_bytes

    (root / "samples").mkdir(exist_ok=True)
    (root / "stages").mkdir(exist_ok=True)
    written: set[str] = set()
    stages: list[StageCalibration] = []
    for index, s in enumerate(plan.stages):
        if s.device != "npu" or s.id not in rec.calls:
            continue
        calls = list(rec.calls[s.id].values())
        order = rec.order.get(s.id, s.inputs)
        lines = []
        ranges = {n: RangeStats() for n in order}
        for i in _spread(len(calls), samples):
            names = []
            for n in order:
                a = calls[i][n]
                ranges[n].add(a)
                if a.dtype == np.float16:  # the toolkit takes float32 for an fp16 model (exact)
                    a = a.astype(np.float32)
                blob = _npy_bytes(a)
                name = hashlib.sha256(blob).hexdigest()[:32] + ".npy"
                if name not in written:
                    (root / "samples" / name).write_bytes(blob)
                    written.add(name)
                names.append(f"../../samples/{name}")
            lines.append(" ".join(names))
        d = root / "stages" / _stage_dir(index, s.id)
        d.mkdir(exist_ok=True)
        (d / "dataset.txt").write_text("\n".join(lines) + "\n")
        inner = {n: st for n, st in rec.stats.get(s.id, {}).items()}
        top = max(inner.items(), key=lambda kv: (kv[1].absmax, kv[0]), default=("", RangeStats()))
        stages.append(StageCalibration(
            stage=s.id, dataset=(d / "dataset.txt").relative_to(root).as_posix(), inputs=tuple(order),
            samples=len(lines), ranges=tuple(ranges[n].range(n) for n in order), activations=len(inner),
            absmax=top[1].absmax, absmax_tensor=top[0], findings=tuple(fp16_findings(s.id, inner))))
    manifest = {
        "format": FORMAT, "version": VERSION,
        "plan_sha256": plan_digest(plan), "model_sha256": str(plan.model.get("sha256", "")),
        "source": source, "steps": steps if source == "denoise" else 0, "cfg": cfg if source == "denoise" else False,
        "seed": seed, "samples": samples,
        "stages": [sc.to_json() for sc in stages],
    }
    atomic_write_bytes(root / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return stages


__all__ = ["CalibrationOptions", "collect", "dataset_feeds", "write_calibration"]
