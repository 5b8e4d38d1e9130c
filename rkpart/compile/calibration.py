"""The calibration folder's manifest and the fp16 range check (issue 27): records only.

``rkpart calibrate`` (:mod:`rkpart.profile.calibrate`) writes a calibration folder; compile
(``--calibration``), the simulator and ``report`` read it through :func:`load_calibration`.
See :mod:`rkpart.profile.calibrate` for the layout.  It lives here, below ``runtime`` and
``profile``, because compile reads it.

The manifest's ``plan_sha256`` is :func:`plan_digest`: the plan as ``partition`` wrote it,
without what ``compile`` adds, so compiling the plan does not make its calibration stale.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rkpart.errors import SpecError, UserError
from rkpart.plan.plan import Plan, TensorInfo
from rkpart.readers import FileKind, npy_header
from rkpart.types import JsonMap, JsonObject

MANIFEST = "calibration.json"
FORMAT = "rkpart-calibration"
VERSION = 1
#: rknn-toolkit2 advises 20-100 calibration samples for the ``normal`` algorithm
DEFAULT_SAMPLES = 20
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

    def to_json(self) -> JsonObject:
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

    def to_json(self) -> JsonObject:
        return {"stage": self.stage, "tensor": self.tensor, "kind": self.kind, "absmax": self.absmax,
                "margin": self.margin}

    @classmethod
    def from_json(cls, d: JsonMap) -> RangeFinding:
        return cls(str(d["stage"]), str(d["tensor"]), str(d["kind"]), float(d["absmax"]), float(d["margin"]))


@dataclass
class RangeStats:
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


def fp16_findings(stage: str, stats: Mapping[str, RangeStats]) -> list[RangeFinding]:
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

    def to_json(self) -> JsonObject:
        return {"stage": self.stage, "dataset": self.dataset, "inputs": list(self.inputs), "samples": self.samples,
                "ranges": [r.to_json() for r in self.ranges],
                "fp16_range": {"activations": self.activations, "absmax": self.absmax,
                               "absmax_tensor": self.absmax_tensor,
                               "findings": [f.to_json() for f in self.findings]}}

    @classmethod
    def from_json(cls, d: JsonMap) -> StageCalibration:
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

    def read_samples(self, stage_id: str, inputs: Sequence[TensorInfo]) -> Dataset:
        """``stage_id``'s samples, read and verified (:func:`read_dataset`): as many lines as the
        manifest says, every sample inside the folder, named by its content, of the stage's dtypes
        and shapes."""
        return read_dataset(self.dataset(stage_id), root=self.folder, inputs=inputs,
                            samples=self.stages[stage_id].samples)

    @property
    def findings(self) -> list[RangeFinding]:
        return [f for s in self.stages.values() for f in s.findings]

    def check_plan(self, plan: Plan) -> None:
        """:class:`SpecError` (one line) if this calibration was made from another plan."""
        got = plan_digest(plan)
        if got != self.plan_sha256:
            raise SpecError(f"calibration {self.folder} is stale: made from plan sha256 {self.plan_sha256[:12]}, "
                            f"this plan is {got[:12]}; rerun rkpart calibrate")


#: float32's largest finite value: every range a calibration records is of float32 values
FLOAT32_MAX = 3.4028234663852886e38
#: ``calibrate --samples`` and ``--steps`` bounds (rkpart.profile.calibrate, rkpart.cli_args)
MAX_SAMPLES = 1000
MAX_STEPS = 10_000
FINDING_KINDS = ("nonfinite", "overflow", "underflow")


def _bad_int(v: object, lo: int, hi: int) -> bool:
    return isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi


def _bad_value(v: object, lo: float = -FLOAT32_MAX) -> bool:
    """Not a float32 value (a finite number within float32's range, at least ``lo``)."""
    return isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
        or not lo <= v <= FLOAT32_MAX


def _check_numbers(manifest: Path, data: JsonMap) -> None:
    """Every number of a calibration manifest is one ``rkpart calibrate`` writes (issue 31): counts
    within calibrate's bounds, ranges finite float32 values with min <= max, and a range check that
    agrees with its own max |x| (a 1e300 absmax with no finding read "fp16 range: ok")."""
    def bad(what: str, v: object, need: str) -> UserError:
        return UserError(f"{manifest}: {what} must be {need}, got {repr(v)[:40]}")

    for k, lo, hi in (("steps", 0, MAX_STEPS), ("samples", 1, MAX_SAMPLES), ("seed", 0, 2**32 - 1)):
        if _bad_int(data.get(k), lo, hi):
            raise bad(k, data.get(k), f"an integer in [{lo}, {hi}]")
    if not isinstance(data.get("cfg"), bool):
        raise bad("cfg", data.get("cfg"), "true or false")
    if not isinstance(data.get("stages"), list):
        raise bad("stages", data.get("stages"), "a list")
    for i, st in enumerate(data["stages"]):
        if not isinstance(st, Mapping):
            raise bad(f"stages[{i}]", st, "an object")
        sid = repr(st.get("stage"))[:40]
        if _bad_int(st.get("samples"), 0, MAX_SAMPLES):
            raise bad(f"stage {sid} samples", st.get("samples"), f"an integer in [0, {MAX_SAMPLES}]")
        for r in st.get("ranges", ()) if isinstance(st.get("ranges", ()), list) else [None]:
            if not isinstance(r, Mapping):
                raise bad(f"stage {sid} ranges", r, "a list of objects")
            for k in ("min", "max", "absmax"):
                if _bad_value(r.get(k), 0.0 if k == "absmax" else -FLOAT32_MAX):
                    raise bad(f"stage {sid} range {k}", r.get(k), "a finite float32 value")
            if r["min"] > r["max"] or not math.isclose(r["absmax"], max(-r["min"], r["max"]), rel_tol=1e-6):
                raise UserError(f"{manifest}: stage {sid} range of {repr(r.get('name'))[:40]} is not a range "
                                f"(min {r['min']:g}, max {r['max']:g}, max |x| {r['absmax']:g})")
        fr = st.get("fp16_range") or {}
        if not isinstance(fr, Mapping):
            raise bad(f"stage {sid} fp16_range", fr, "an object")
        if _bad_int(fr.get("activations", 0), 0, 2**53):
            raise bad(f"stage {sid} fp16_range.activations", fr.get("activations"), "a count")
        if _bad_value(fr.get("absmax", 0.0), 0.0):
            raise bad(f"stage {sid} fp16_range.absmax", fr.get("absmax"), "a finite float32 value >= 0")
        findings = fr.get("findings", [])
        if not isinstance(findings, list) or not all(isinstance(f, Mapping) for f in findings):
            raise bad(f"stage {sid} fp16_range.findings", findings, "a list of objects")
        for f in findings:
            if f.get("kind") not in FINDING_KINDS:
                raise bad(f"stage {sid} finding kind", f.get("kind"), f"one of {', '.join(FINDING_KINDS)}")
            for k in ("absmax", "margin"):
                if _bad_value(f.get(k), 0.0):
                    raise bad(f"stage {sid} finding {k}", f.get(k), "a finite number >= 0")
            # what fp16_findings computes: an overflow's margin is 65504 / max |x| (past half of
            # fp16's range), an underflow's the share of tiny values
            if f["kind"] == "overflow" and not (f["absmax"] > OVERFLOW_SHARE * FP16_MAX and math.isclose(
                    f["margin"], FP16_MAX / f["absmax"], rel_tol=1e-6)):
                raise UserError(f"{manifest}: stage {sid} overflow finding (max |x| {f['absmax']:g}, margin "
                                f"{f['margin']:g}) contradicts itself: its margin is 65504 / max |x|, past 32752")
            if f["kind"] == "underflow" and not f["margin"] <= 1:
                raise bad(f"stage {sid} underflow finding margin", f["margin"], "a share in [0, 1]")
        if fr.get("absmax", 0.0) > OVERFLOW_SHARE * FP16_MAX and not any(
                f.get("kind") in ("overflow", "nonfinite") for f in findings):
            raise UserError(f"{manifest}: stage {sid} records max |x| {fr['absmax']:g} past fp16's range but no "
                            "overflow finding; not a manifest rkpart calibrate wrote")


def _check_manifest(data: object, where: str) -> None:
    """:data:`MANIFEST_KIND`'s check: an rkpart calibration manifest of this version, every number
    one ``rkpart calibrate`` writes (:func:`_check_numbers`), every stage record complete."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{where} is not an rkpart calibration manifest")
    if data.get("version") != VERSION:
        raise UserError(f"{where}: calibration format version {repr(data.get('version'))[:40]}, this rkpart reads "
                        f"{VERSION}; rerun rkpart calibrate")
    _check_numbers(Path(where), data)
    seen: set[str] = set()
    for i, st in enumerate(data["stages"]):
        for k in ("stage", "dataset"):
            if not isinstance(st.get(k), str) or not st[k]:
                raise UserError(f"{where}: stages[{i}].{k} must be a non-empty string, got {repr(st.get(k))[:40]}")
        if st["stage"] in seen:
            raise UserError(f"{where}: stage {st['stage']!r} is listed twice")
        seen.add(st["stage"])
        if not isinstance(st.get("inputs"), list) or not all(isinstance(x, str) for x in st["inputs"]) \
                or not st["inputs"]:
            raise UserError(f"{where}: stage {st['stage']!r} inputs must be a non-empty list of tensor names")


#: the files of a calibration folder (issue 51): the manifest, each stage's sample list, the samples
MANIFEST_KIND = FileKind("calibration manifest", "json", 64 << 20, UserError, check=_check_manifest,
                         doc="`compile --calibration`, `calibrate --force`, the simulator")
DATASET_KIND = FileKind("calibration dataset", "text", 4 << 20, UserError, symlinks=False,
                        doc="a calibration's `stages/<id>/dataset.txt`: one line per sample")
SAMPLE_KIND = FileKind("calibration sample", "npy", 16 << 30, UserError, symlinks=False,
                       doc="a calibration's `samples/<sha256[:32]>.npy`, read by int8 / hybrid compile")
#: how ``rkpart calibrate`` names a sample: the first 32 hex digits of the sha256 of its bytes
SAMPLE_NAME = re.compile(r"[0-9a-f]{32}\.npy")


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Read a calibration folder (or its manifest); one-line :class:`UserError` if unusable.

    Every stage's dataset must be a regular file inside the folder; its samples are read and
    verified when a build needs them (:meth:`Calibration.read_samples`)."""
    p = Path(path)
    manifest = p if p.name == MANIFEST and not p.is_dir() else p / MANIFEST
    if not os.path.lexists(manifest):
        raise UserError(f"{p} is not a calibration folder (no {MANIFEST}); make one with rkpart calibrate")
    raw = MANIFEST_KIND.read(manifest, root=manifest.parent)
    data = MANIFEST_KIND.parse(raw, str(manifest))
    _check_manifest(data, str(manifest))
    try:
        stages = {s["stage"]: StageCalibration.from_json(s) for s in data["stages"]}
        cal = Calibration(folder=manifest.parent, sha256=hashlib.sha256(raw).hexdigest(),
                          plan_sha256=str(data["plan_sha256"]), model_sha256=str(data["model_sha256"]),
                          source=str(data["source"]), steps=int(data["steps"]), cfg=bool(data["cfg"]),
                          seed=int(data["seed"]), samples=int(data["samples"]), stages=stages)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{manifest}: malformed calibration manifest ({type(e).__name__}: {e})") from None
    for sc in stages.values():
        DATASET_KIND.stat_checked(MANIFEST_KIND.within(cal.folder, sc.dataset, by=manifest), cal.folder)
    return cal


# -- a stage's samples ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dataset:
    """One stage's calibration samples, read and verified by :func:`read_dataset`."""

    #: per sample (line), per stage input: the sample's file name, ``<sha256[:32]>.npy``
    lines: tuple[tuple[str, ...], ...]
    #: file name -> the verified file
    files: Mapping[str, Path]
    #: sha256 over every sample's full sha256, line by line: what the build key covers
    digest: str


def sample_dtype(info: TensorInfo) -> np.dtype[np.generic]:
    """The dtype ``rkpart calibrate`` stores a stage input in (float32 for a float16 input: the
    toolkit takes float32 for an fp16 model, exactly)."""
    dt = np.dtype(info.dtype)
    return np.dtype(np.float32) if dt == np.float16 else dt


def read_dataset(path: Path, *, root: Path, inputs: Sequence[TensorInfo], samples: int | None = None,
                 hashes: dict[Path, str] | None = None) -> Dataset:
    """A stage's ``dataset.txt`` and every sample it names, checked before a build may use them.

    ``samples``: the line count the manifest records (``None``: a linked copy in a plan folder,
    at most :data:`MAX_SAMPLES`).  Each line names one sample per stage input, relative to the
    file and inside ``root``; each sample is a regular file (not a symlink, FIFO or device), named
    by its content as ``rkpart calibrate`` names it and verified against that name, a ``.npy`` of
    the stage input's dtype and shape.  ``hashes`` caches full sha256s across stages.
    """
    text = DATASET_KIND.parse(DATASET_KIND.read(path, root=root), str(path))
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    want = samples if samples is not None else None
    if want is not None and len(lines) != want:
        raise DATASET_KIND.fail(path, f"has {len(lines)} sample line(s), its manifest says {want}: the "
                                      "calibration was changed after rkpart calibrate wrote it")
    if not lines or len(lines) > MAX_SAMPLES:
        raise DATASET_KIND.fail(path, f"has {len(lines)} sample line(s), not 1..{MAX_SAMPLES}")
    hashes = {} if hashes is None else hashes
    files: dict[str, Path] = {}
    out: list[tuple[str, ...]] = []
    h = hashlib.sha256()
    for k, toks in enumerate(lines, 1):
        if len(toks) != len(inputs):
            raise DATASET_KIND.fail(path, f"names {len(toks)} sample(s) on line {k}, the stage has {len(inputs)} "
                                          f"input(s) ({', '.join(i.name for i in inputs)[:200]})")
        names = []
        for tok, info in zip(toks, inputs, strict=True):
            full = DATASET_KIND.within(root, tok, base=path.parent, by=path)
            name = full.name
            if not SAMPLE_NAME.fullmatch(name):
                raise DATASET_KIND.fail(path, f"names {tok[:200]!r} on line {k}, not a sample rkpart calibrate "
                                              "writes (<sha256[:32]>.npy)")
            if name in files and os.path.normpath(files[name]) != os.path.normpath(full):
                raise DATASET_KIND.fail(path, f"names two samples called {name} (line {k})")
            if name not in files:
                digest = hashes.get(Path(os.path.normpath(full)))
                if digest is None:
                    digest = _verified_sample(full, root, name, info)
                    hashes[Path(os.path.normpath(full))] = digest
                files[name] = full
            names.append(name)
            h.update(f"{hashes[Path(os.path.normpath(files[name]))]} ".encode())
        h.update(b"\n")
        out.append(tuple(names))
    return Dataset(lines=tuple(out), files=files, digest=h.hexdigest())


def _verified_sample(path: Path, root: Path, name: str, info: TensorInfo) -> str:
    """The full sha256 of the sample at ``path`` once it is the stage input ``info``'s dtype and shape
    and its bytes match its name."""
    want_dtype, want_shape = sample_dtype(info), tuple(info.shape)
    h = hashlib.sha256()
    with SAMPLE_KIND.open(path, root=root) as f:
        size = os.fstat(f.fileno()).st_size
        dtype, shape = npy_header(f, lambda why: SAMPLE_KIND.fail(path, why), size=size)
        if dtype != want_dtype or shape != want_shape:
            raise SAMPLE_KIND.fail(path, f"is {dtype}{list(shape)}, the stage input {info.name!r} is "
                                         f"{want_dtype}{list(want_shape)}")
        f.seek(0)
        while buf := f.read(1 << 22):
            h.update(buf)
    digest = h.hexdigest()
    if digest[:32] != name[:32]:
        raise SAMPLE_KIND.fail(path, f"does not match its name: its bytes have sha256 {digest[:12]}...; the sample "
                                     "was changed after rkpart calibrate wrote it: rerun rkpart calibrate")
    return digest


def write_dataset(ds: Dataset, dest: Path) -> Path:
    """Hard-link (else copy) the verified samples of ``ds`` into ``dest`` in ``rkpart calibrate``'s
    layout (``samples/<name>``, ``stages/s/dataset.txt``) and return the written ``dataset.txt``.

    Every name written is rkpart's own (content names checked by :func:`read_dataset`), never a
    path taken from the dataset; a folder on the way that is a symlink is refused."""
    import shutil
    import tempfile

    from rkpart.io import atomic_write_bytes, file_sha256

    for d in (dest, dest / "samples", dest / "stages", dest / "stages" / "s"):
        if d.is_symlink() or (os.path.lexists(d) and not d.is_dir()):
            raise UserError(f"{d} is a symlink or not a folder; rkpart does not write the calibration through it")
        d.mkdir(parents=True, exist_ok=True)
    for name, src in sorted(ds.files.items()):
        dst = dest / "samples" / name
        if dst.is_file() and not dst.is_symlink() and file_sha256(dst)[:32] == name[:32]:
            continue
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=dst.parent)
        os.close(fd)
        os.unlink(tmp)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    out = dest / "stages" / "s" / "dataset.txt"
    atomic_write_bytes(out, "".join(" ".join(f"../../samples/{n}" for n in line) + "\n"
                                    for line in ds.lines).encode())
    return out


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


__all__ = ["DATASET_KIND", "DEFAULT_SAMPLES", "MANIFEST", "MANIFEST_KIND", "SAMPLE_KIND", "Calibration", "Dataset",
           "RangeFinding", "RangeStats", "StageCalibration", "TensorRange", "fp16_findings", "load_calibration",
           "plan_digest", "read_dataset", "render", "render_range_check", "sample_dtype", "write_dataset"]
