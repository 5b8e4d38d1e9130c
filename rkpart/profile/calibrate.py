"""Calibration data for quantized builds, produced by the plan itself (issue 27).

``rkpart calibrate PLAN -o CALIB`` runs the denoising loop of :mod:`rkpart.profile.drift` on
ONNX Runtime through the plan's stages and keeps, per NPU stage, the inputs that stage saw:
``samples`` of them, spread evenly over the steps and both CFG passes (more seeded runs of the
loop are made when one run has fewer than ``samples``).  A plan whose inputs cannot be read as
a denoising loop (``generic`` on a non-DiT model) is calibrated on ``--inputs`` instead.

The NPU stages run on an instrumented ONNX Runtime session that also returns every node
output inside the stage, so the same loop records each stage's intermediate activation
ranges: the *fp16 range check*.  rknn-toolkit2 builds fp16 (or runs int8 layers' accumulators
in fp16 around them), and the simulator computes in fp32, so a stage whose activations come
near fp16's limits can read cosine 1.0 in the simulator and be wrong on the board
(rknn-toolkit2 #149: an SD UNet at 0.339 on the board).

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
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.errors import OutputExistsError, SpecError, UserError
from rkpart.io import folder_lock, load_json_file, recover_folder, regular_file, replace_folder
from rkpart.partitioner.plan import Plan, Stage
from rkpart.runtime.base import Backend, Feeds, StageRunner

MANIFEST = "calibration.json"
FORMAT = "rkpart-calibration"
VERSION = 1
#: rknn-toolkit2 advises 20-100 calibration samples for the ``normal`` algorithm
DEFAULT_SAMPLES = 20
MIN_SAMPLES, MAX_SAMPLES = 1, 1000
#: fp16's largest finite value and smallest normal
FP16_MAX = 65504.0
FP16_TINY = 2.0 ** -14
#: flagged when |x| exceeds this share of FP16_MAX (an intermediate sum or square of such a
#: value already overflows)
OVERFLOW_SHARE = 0.5
#: flagged when at least this share of a tensor's non-zero values lies below fp16's smallest
#: normal (there fp16 keeps fewer than 10 bits, and below 2**-24 the value becomes 0); samples
#: in which the tensor is constant are not counted
UNDERFLOW_SHARE = 0.25
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


# -- the plan's identity ---------------------------------------------------------------------------
def plan_digest(plan: Plan) -> str:
    """sha256 of the plan without compile's records (artifacts, failures, prepared copies,
    ``extra.compile``): what a calibration was made from."""
    d = plan.to_json()
    for s in d.get("stages", []):
        for k in ("artifacts", "failures", "prepared"):
            s.pop(k, None)
    extra = dict(d.get("extra") or {})
    extra.pop("compile", None)
    d["extra"] = extra
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# -- records ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorRange:
    """min / max / max |x| of one tensor over every sample seen."""

    name: str
    min: float
    max: float
    absmax: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "min": self.min, "max": self.max, "absmax": self.absmax}


@dataclass(frozen=True)
class RangeFinding:
    """One tensor of a stage whose values come near fp16's limits.

    ``kind`` is ``overflow`` (``margin`` = 65504 / max |x|: below 2 the headroom is gone; below
    1 it overflows) or ``underflow`` (``margin`` = the share of non-zero values below fp16's
    smallest normal 2**-14), or ``nonfinite`` (inf/NaN already in fp32)."""

    stage: str
    tensor: str
    kind: str
    absmax: float
    margin: float

    def describe(self) -> str:
        if self.kind == "overflow":
            return (f"fp16 range: stage {self.stage} tensor {self.tensor!r} reaches |x| = {self.absmax:.4g}, "
                    f"{self.margin:.2f}x below fp16's max 65504 (overflow risk on the board)")
        if self.kind == "underflow":
            return (f"fp16 range: stage {self.stage} tensor {self.tensor!r}: {self.margin:.0%} of its non-zero "
                    f"values are below fp16's smallest normal 6.1e-05 (max |x| {self.absmax:.3g}; underflow)")
        return f"fp16 range: stage {self.stage} tensor {self.tensor!r} is not finite already in fp32"

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "tensor": self.tensor, "kind": self.kind, "absmax": self.absmax,
                "margin": self.margin}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RangeFinding:
        return cls(str(d["stage"]), str(d["tensor"]), str(d["kind"]), float(d["absmax"]), float(d["margin"]))


@dataclass
class _Stats:
    """Running range of one tensor."""

    min: float = math.inf
    max: float = -math.inf
    absmax: float = 0.0
    nonzero: int = 0
    tiny: int = 0
    nonfinite: bool = False

    def add(self, a: np.ndarray) -> None:
        if a.size == 0 or a.dtype.kind != "f":
            return
        x = a.astype(np.float32, copy=False)
        finite = np.isfinite(x)
        if not finite.all():
            self.nonfinite = True
            x = x[finite]
            if x.size == 0:
                return
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))
        ax = np.abs(x)
        self.absmax = max(self.absmax, float(ax.max()))
        if x.min() == x.max():
            # a constant tensor carries nothing fp16 could lose but its one value: the uncond
            # pass's zero context gives RMSNorm's ``0 + eps`` (1e-6, fp16-subnormal) everywhere
            return
        nz = ax > 0
        self.nonzero += int(nz.sum())
        self.tiny += int((nz & (ax < FP16_TINY)).sum())

    def range(self, name: str) -> TensorRange:
        lo = 0.0 if self.min == math.inf else self.min
        hi = 0.0 if self.max == -math.inf else self.max
        return TensorRange(name, lo, hi, self.absmax)


def fp16_findings(stage: str, stats: Mapping[str, _Stats]) -> list[RangeFinding]:
    """The tensors of ``stage`` near fp16's limits (see :class:`RangeFinding`), worst first."""
    out: list[RangeFinding] = []
    for name, st in stats.items():
        if st.nonfinite:
            out.append(RangeFinding(stage, name, "nonfinite", st.absmax, 0.0))
        elif st.absmax > OVERFLOW_SHARE * FP16_MAX:
            out.append(RangeFinding(stage, name, "overflow", st.absmax, FP16_MAX / st.absmax))
        elif st.nonzero and st.tiny / st.nonzero >= UNDERFLOW_SHARE:
            out.append(RangeFinding(stage, name, "underflow", st.absmax, st.tiny / st.nonzero))
    order = {"nonfinite": 0, "overflow": 1, "underflow": 2}
    return sorted(out, key=lambda f: (order[f.kind], f.margin if f.kind != "underflow" else -f.margin, f.tensor))


@dataclass(frozen=True)
class StageCalibration:
    """One NPU stage's calibration set."""

    stage: str
    dataset: str  # relative to the calibration folder
    inputs: tuple[str, ...]
    samples: int
    ranges: tuple[TensorRange, ...]  # of the stage's inputs
    activations: int  # intermediate tensors whose range was recorded
    absmax: float  # the largest |x| of any of them
    absmax_tensor: str
    findings: tuple[RangeFinding, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "dataset": self.dataset, "inputs": list(self.inputs), "samples": self.samples,
                "ranges": [r.to_json() for r in self.ranges],
                "fp16_range": {"activations": self.activations, "absmax": self.absmax,
                               "absmax_tensor": self.absmax_tensor,
                               "findings": [f.to_json() for f in self.findings]}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StageCalibration:
        fr = d.get("fp16_range") or {}
        return cls(stage=str(d["stage"]), dataset=str(d["dataset"]), inputs=tuple(str(x) for x in d["inputs"]),
                   samples=int(d["samples"]),
                   ranges=tuple(TensorRange(str(r["name"]), float(r["min"]), float(r["max"]), float(r["absmax"]))
                                for r in d.get("ranges", ())),
                   activations=int(fr.get("activations", 0)), absmax=float(fr.get("absmax", 0.0)),
                   absmax_tensor=str(fr.get("absmax_tensor", "")),
                   findings=tuple(RangeFinding.from_json(f) for f in fr.get("findings", ())))


@dataclass(frozen=True)
class Calibration:
    """A calibration folder's manifest (:data:`MANIFEST`)."""

    folder: Path
    sha256: str  # of the manifest's bytes: the digest recorded in artifacts and build keys
    plan_sha256: str
    model_sha256: str
    source: str  # "denoise" or "inputs"
    steps: int
    cfg: bool
    seed: int
    samples: int
    stages: Mapping[str, StageCalibration] = field(default_factory=dict)

    def dataset(self, stage_id: str) -> Path:
        """Absolute path of ``stage_id``'s ``dataset.txt`` (:class:`SpecError` if it has none)."""
        sc = self.stages.get(stage_id)
        if sc is None:
            raise SpecError(f"calibration {self.folder} has no samples for stage {stage_id!r}; "
                            "rerun rkpart calibrate on this plan")
        return (self.folder / sc.dataset).absolute()

    @property
    def findings(self) -> list[RangeFinding]:
        return [f for s in self.stages.values() for f in s.findings]

    def check_plan(self, plan: Plan) -> None:
        """:class:`SpecError` (one line) if this calibration was made from another plan."""
        got = plan_digest(plan)
        if got != self.plan_sha256:
            raise SpecError(f"calibration {self.folder} is stale: made from plan sha256 {self.plan_sha256[:12]}, "
                            f"this plan is {got[:12]}; rerun rkpart calibrate")


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Read a calibration folder (or its manifest); one-line :class:`UserError` if unusable."""
    p = Path(path)
    manifest = p if p.name == MANIFEST and not p.is_dir() else p / MANIFEST
    if not manifest.exists():
        raise UserError(f"{p} is not a calibration folder (no {MANIFEST}); make one with rkpart calibrate")
    regular_file(manifest, what="calibration manifest")
    data = load_json_file(manifest, what="calibration manifest", max_bytes=64 << 20)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{manifest} is not an rkpart calibration manifest")
    if data.get("version") != VERSION:
        raise UserError(f"{manifest}: calibration format version {data.get('version')!r}, this rkpart reads "
                        f"{VERSION}; rerun rkpart calibrate")
    try:
        stages = {s["stage"]: StageCalibration.from_json(s) for s in data["stages"]}
        cal = Calibration(folder=manifest.parent, sha256=hashlib.sha256(manifest.read_bytes()).hexdigest(),
                          plan_sha256=str(data["plan_sha256"]), model_sha256=str(data["model_sha256"]),
                          source=str(data["source"]), steps=int(data["steps"]), cfg=bool(data["cfg"]),
                          seed=int(data["seed"]), samples=int(data["samples"]), stages=stages)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{manifest}: malformed calibration manifest ({type(e).__name__}: {e})") from None
    for sc in stages.values():
        ds = (cal.folder / sc.dataset).resolve()
        if cal.folder.resolve() not in ds.parents or not ds.is_file():
            raise UserError(f"{manifest}: stage {sc.stage}'s dataset {sc.dataset} is missing or outside the folder")
    return cal


# -- the instrumented NPU stages --------------------------------------------------------------------
class _Recorder:
    """What the recording runners collect: per NPU stage, the inputs of every call and the
    running range of every tensor inside it."""

    def __init__(self) -> None:
        self.calls: dict[str, list[dict[str, np.ndarray]]] = {}
        self.stats: dict[str, dict[str, _Stats]] = {}
        self.order: dict[str, tuple[str, ...]] = {}  # stage -> its graph inputs in order


class _RecordingRunner(StageRunner):
    def __init__(self, stage: Stage, folder: Path, rec: _Recorder) -> None:
        super().__init__(stage, folder)
        self.rec = rec
        self._sess: Any = None
        self._blob: bytes | None = None
        self._names: list[str] = []

    def _load_impl(self) -> None:
        import onnx

        from rkpart.partitioner.verify import stage_onnx

        model = onnx.load(str(stage_onnx(self.folder, self.stage)))
        self.rec.order[self.stage.id] = tuple(i.name for i in model.graph.input)
        inferred = onnx.shape_inference.infer_shapes(model)
        declared = {o.name for o in model.graph.output}
        floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                  onnx.TensorProto.BFLOAT16}
        for vi in inferred.graph.value_info:
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
        self.rec.calls.setdefault(sid, []).append({n: np.array(v) for n, v in feeds.items()})
        outs = self._sess.run(self._names, feeds)
        stats = self.rec.stats.setdefault(sid, {})
        for n, a in zip(self._names, outs, strict=True):
            stats.setdefault(n, _Stats()).add(np.asarray(a))
        got = dict(zip(self._names, outs, strict=True))
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

    regular_file(path, what="inputs file")
    try:
        with np.load(path, allow_pickle=False) as z:
            raw = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"cannot read inputs {path}: not a usable .npz ({e})") from None
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


def _spread(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)`` (all of them when ``k >= n``)."""
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)} if k > 1 else {0})


def collect(plan: Plan, folder: Path, *, steps: int, cfg: bool, samples: int, seed: int,
            inputs: Sequence[Feeds] | None, guidance: float = 4.0,
            progress: Callable[[str], None] | None = None) -> tuple[_Recorder, str, int]:
    """Run the loop (or ``inputs``) through ``plan`` with the NPU stages instrumented.

    Returns the recorder, the source (``denoise``/``inputs``) and the number of loop runs.
    """
    from rkpart.profile.drift import denoise_steps, roles
    from rkpart.runtime.executor import PlanExecutor

    say = progress or (lambda _m: None)
    backend = _RecordingBackend()
    if inputs is not None:
        with PlanExecutor(plan, folder, backend=backend, residency="resident") as ex:
            for i, feeds in enumerate(inputs):
                ex.run(feeds)
                say(f"sample {i + 1}/{len(inputs)} run")
        return backend.rec, "inputs", len(inputs)
    try:
        roles(plan)
    except SpecError as e:
        raise SpecError(f"this plan has no denoising loop to calibrate on ({e}); pass --inputs FILE.npz") from None
    per_run = steps * (2 if cfg else 1)
    runs = max(1, math.ceil(samples / per_run))
    for r in range(runs):
        for step, _ in enumerate(denoise_steps(plan, folder, backend=backend, steps=steps, cfg=cfg,
                                               guidance=guidance, seed=seed + r)):
            say(f"run {r + 1}/{runs} (seed {seed + r}): step {step + 1}/{steps}")
    return backend.rec, "denoise", runs


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _stage_dir(index: int, stage_id: str) -> str:
    return stage_id if _SAFE_ID.fullmatch(stage_id) and stage_id not in (".", "..") else f"stage{index:03d}"


def write_calibration(plan: Plan, folder: Path, out: Path, *, steps: int = 4, cfg: bool = True,
                      samples: int = DEFAULT_SAMPLES, seed: int = 0, inputs: Path | None = None,
                      force: bool = False, progress: Callable[[str], None] | None = None) -> Calibration:
    """``rkpart calibrate``: collect, then write ``out`` through a staging folder and an atomic swap.

    ``out`` may be replaced (``force``) only if it is a calibration folder itself.
    """
    if not MIN_SAMPLES <= samples <= MAX_SAMPLES:
        raise UserError(f"--samples {samples}: must be {MIN_SAMPLES}..{MAX_SAMPLES} (rknn-toolkit2 advises 20-100)")
    if not plan.npu_stages:
        raise SpecError("the plan has no NPU stages: nothing to calibrate")
    out = Path(out)
    _check_out(out, force)
    feeds = _load_samples(inputs, plan) if inputs is not None else None
    rec, source, _runs = collect(plan, folder, steps=steps, cfg=cfg, samples=samples, seed=seed,
                                 inputs=feeds, progress=progress)
    staging = out.with_name(f".{out.name}.partial")
    if staging.is_symlink() or (staging.exists() and not staging.is_dir()):
        raise OutputExistsError(f"staging path {staging} is not a folder rkpart left; remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(staging, what=f"calibration staging folder {staging}", nofollow=True):
        for p in list(staging.iterdir()):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        entries = _write_tree(plan, staging, rec, source, steps, cfg, seed, samples)
        recover_folder(out)
        replace_folder(staging, out)
    assert entries  # the plan has NPU stages, so every one of them was recorded
    return load_calibration(out)


def _check_out(out: Path, force: bool) -> None:
    if out.is_symlink():
        raise OutputExistsError(f"output {out} is a symlink; give the folder it points to or another path")
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"output {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise OutputExistsError(f"output folder {out} is not empty; use --force to replace it")
        if not (out / MANIFEST).is_file() or any(p.name not in (MANIFEST, "samples", "stages")
                                                 for p in out.iterdir()):
            raise OutputExistsError(f"refusing to replace {out}: it is not an rkpart calibration folder")


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
        calls = rec.calls[s.id]
        order = rec.order.get(s.id, s.inputs)
        lines = []
        ranges = {n: _Stats() for n in order}
        for i in _spread(len(calls), samples):
            names = []
            for n in order:
                a = calls[i][n]
                ranges[n].add(a)
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
        top = max(inner.items(), key=lambda kv: (kv[1].absmax, kv[0]), default=("", _Stats()))
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


def render(cal: Calibration) -> str:
    """What ``rkpart calibrate`` prints: per stage its samples and the fp16 range check."""
    lines = [f"calibration: {cal.folder}  ({len(cal.stages)} NPU stage(s), {cal.source}"
             + (f", {cal.steps} step(s){' with CFG' if cal.cfg else ''}" if cal.source == "denoise" else "")
             + f", sha256 {cal.sha256[:12]})"]
    for sc in cal.stages.values():
        lines.append(f"  {sc.stage}: {sc.samples} sample(s), inputs "
                     + ", ".join(f"{r.name} [{r.min:.3g}, {r.max:.3g}]" for r in sc.ranges)
                     + f"; max |activation| {sc.absmax:.3g} ({sc.activations} tensors)")
    lines.append(render_range_check(cal))
    return "\n".join(lines)


def render_range_check(cal: Calibration) -> str:
    """One line per finding, or one line saying the check passed."""
    found = cal.findings
    if not found:
        worst = max(cal.stages.values(), key=lambda s: s.absmax, default=None)
        top = f"; largest |x| {worst.absmax:.3g} in {worst.stage}" if worst else ""
        return f"fp16 range: ok ({sum(s.activations for s in cal.stages.values())} activation tensors{top})"
    return "\n".join(f.describe() for f in found)


__all__ = ["DEFAULT_SAMPLES", "MANIFEST", "Calibration", "RangeFinding", "StageCalibration", "TensorRange",
           "fp16_findings", "load_calibration", "plan_digest", "render", "render_range_check", "write_calibration"]
