"""Precision per NPU stage: fp16, int8 (w8a8) or hybrid (issue 27).

``rkpart compile --precision int8 --calibration CALIB`` builds stages with
``RKNN.config(quantized_dtype='w8a8', quantized_algorithm=...)`` and
``build(do_quantization=True, dataset=<the stage's dataset.txt>)``; ``hybrid`` additionally
keeps in float16 the layers the toolkit's ``accuracy_analysis`` measures worst
(``hybrid_quantization_step1/step2``).  ``--precision-spec FILE`` chooses per stage id,
region or kind (the most specific match wins: id, then region, then kind, then ``--precision``).

What goes into the build-cache key: the precision, the algorithm, the calibration's digest
(the sha256 of its manifest) and the digest of the stage's samples: every sample's sha256,
verified against its content-derived name when it is read (issue 51: the manifest alone names
the samples' files, not their bytes, so a build from other samples was served as cached).  An
fp16 stage's key is the one rkpart always computed, so existing caches keep serving fp16 builds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rkpart.errors import SpecError, UserError
from rkpart.io import loads_json, loads_yaml
from rkpart.plan.plan import Plan, Stage
from rkpart.readers import FileKind
from rkpart.types import JsonMap, JsonObject

if TYPE_CHECKING:
    from rkpart.compile.calibration import Calibration, Dataset

PRECISIONS = ("fp16", "int8", "hybrid")
ALGORITHMS = ("normal", "mmse", "kl_divergence")
#: the quantized dtype of each target (rknn-toolkit2 2.3.2 API reference: w8a16 is RK3562
#: only, w4a16 RK3576 / RV1126B only; RK3588 has w8a8 alone)
QUANTIZED_DTYPE = {"rk3588": "w8a8"}
#: hybrid: layers whose single-layer cosine in ``accuracy_analysis`` is below this stay in float16
HYBRID_COSINE = 0.999
#: ... and at most this many of them (the worst first)
HYBRID_MAX_LAYERS = 8
CALIB_DIR = "calibration"  # under the plan's rknn/: the datasets its quantized builds used
#: ``compile --precision-spec FILE`` (YAML, or JSON by its suffix)
PRECISION_SPEC_KIND = FileKind("precision spec", "bytes", 1 << 20, SpecError,
                               doc="`compile --precision-spec`: precision per stage, region or kind")


@dataclass(frozen=True)
class StagePrecision:
    """How one stage is built."""

    precision: str  # one of PRECISIONS
    algorithm: str | None = None  # quantized_algorithm (int8 / hybrid)
    dataset: Dataset | None = None  # the stage's samples, read and verified
    calibration_sha256: str | None = None

    @property
    def quantized(self) -> bool:
        return self.precision != "fp16"

    def config(self, base: JsonMap, target: str) -> JsonObject:
        """``RKNN.config`` options for this stage (``base`` plus the quantization options)."""
        if not self.quantized:
            return dict(base)
        return {**base, "quantized_dtype": QUANTIZED_DTYPE[target], "quantized_algorithm": self.algorithm}

    def key_extra(self) -> JsonObject:
        """What besides the config makes a quantized build different (empty for fp16)."""
        if not self.quantized:
            return {}
        return {"precision": self.precision, "calibration": self.calibration_sha256,
                "samples": None if self.dataset is None else self.dataset.digest}

    def request(self, dataset: Path) -> JsonObject:
        """The worker request's ``quantize`` entry."""
        return {"dataset": str(dataset.absolute()), "hybrid": self.precision == "hybrid",
                "hybrid_cosine": HYBRID_COSINE, "hybrid_max_layers": HYBRID_MAX_LAYERS}


@dataclass(frozen=True)
class PrecisionSpec:
    """``--precision-spec``: precision by stage id, region or kind (each optional)."""

    stages: Mapping[str, str]
    regions: Mapping[str, str]
    kinds: Mapping[str, str]
    default: str | None = None

    def choose(self, stage: Stage, fallback: str) -> str:
        for table, key in ((self.stages, stage.id), (self.regions, stage.region), (self.kinds, stage.kind)):
            if key in table:
                return table[key]
        return self.default or fallback


def load_precision_spec(path: str | os.PathLike[str], plan: Plan | None = None) -> PrecisionSpec:
    """Read a precision spec (YAML or JSON)::

        default: fp16          # optional, else --precision
        stages: {b00.ffn: int8}
        regions: {ffn: int8, attn: hybrid}
        kinds: {ffn: int8}

    Unknown keys, precisions and (with ``plan``) stage ids are refused in one line.
    """
    p = Path(path)
    raw = PRECISION_SPEC_KIND.read(p)
    if p.suffix == ".json":
        data = loads_json(raw, what=f"precision spec {p}", error=SpecError)
    else:
        data = loads_yaml(raw.decode(errors="replace"), what=f"precision spec {p}", error=SpecError)
    if not isinstance(data, dict):
        raise SpecError(f"precision spec {p}: expected a mapping with stages / regions / kinds / default")
    bad = sorted(set(data) - {"stages", "regions", "kinds", "default"})
    if bad:
        raise SpecError(f"precision spec {p}: unknown key {bad[0]!r} (valid: default, stages, regions, kinds)")
    tables: dict[str, dict[str, str]] = {}
    for k in ("stages", "regions", "kinds"):
        t = data.get(k) or {}
        if not isinstance(t, dict):
            raise SpecError(f"precision spec {p}: {k} must map names to a precision")
        for name, prec in t.items():
            _check_precision(prec, f"precision spec {p}: {k}.{name}")
        tables[k] = {str(n): str(v) for n, v in t.items()}
    default = data.get("default")
    if default is not None:
        _check_precision(default, f"precision spec {p}: default")
    if plan is not None:
        npu = {s.id for s in plan.npu_stages}
        unknown = sorted(set(tables["stages"]) - npu)
        if unknown:
            raise SpecError(f"precision spec {p}: {unknown[0]!r} is not an NPU stage of the plan "
                            f"(NPU stages: {', '.join(sorted(npu))})")
    return PrecisionSpec(tables["stages"], tables["regions"], tables["kinds"],
                         None if default is None else str(default))


def plan_precision_spec(plan: Plan) -> PrecisionSpec | None:
    """The precision spec ``--strategy auto`` recorded in the plan (``strategy.options.precision``:
    the stages it chose int8 for), or ``None``.  ``rkpart compile`` uses it when no
    ``--precision-spec`` is given, so ``compile PLAN --calibration CALIB`` builds what auto chose."""
    rec = (plan.strategy.get("options") or {}).get("precision")
    if not isinstance(rec, dict):
        return None
    stages = rec.get("stages") or {}
    where = "plan.json strategy.options.precision"
    if not isinstance(stages, dict):
        raise SpecError(f"{where}: stages must map stage ids to a precision")
    for sid, prec in stages.items():
        _check_precision(prec, f"{where}: stages.{sid}")
    return PrecisionSpec({str(k): str(v) for k, v in stages.items()}, {}, {})


def _check_precision(value: object, where: str) -> None:
    if value not in PRECISIONS:
        raise SpecError(f"{where}: precision {value!r} is not one of {', '.join(PRECISIONS)}")


def resolve(plan: Plan, stages: tuple[Stage, ...], *, precision: str = "fp16", spec: PrecisionSpec | None = None,
            calibration: str | os.PathLike[str] | None = None, algorithm: str = "normal",
            target: str = "rk3588") -> dict[str, StagePrecision]:
    """Each of ``stages``' precision; one-line :class:`UserError` for what cannot be built:
    a quantized stage without calibration, a stale calibration (made from another plan), a
    target without a quantized type, an unknown precision or algorithm."""
    _check_precision(precision, "--precision")
    if algorithm not in ALGORITHMS:
        raise UserError(f"--quantized-algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    chosen = {s.id: (spec.choose(s, precision) if spec else precision) for s in stages}
    quantized = [sid for sid, p in chosen.items() if p != "fp16"]
    if not quantized:
        return {sid: StagePrecision("fp16") for sid in chosen}
    if target not in QUANTIZED_DTYPE:
        raise UserError(f"target {target} has no quantized type rkpart can build (quantizing targets: "
                        f"{', '.join(QUANTIZED_DTYPE)}); use --precision fp16")
    if calibration is None:
        raise UserError(f"--precision {chosen[quantized[0]]} (stage {quantized[0]}) needs calibration data: "
                        "run `rkpart calibrate PLAN -o CALIB` and pass --calibration CALIB")
    from rkpart.compile.calibration import load_calibration

    cal = load_calibration(calibration)
    cal.check_plan(plan)
    by_id = {s.id: s for s in stages}
    hashes: dict[Path, str] = {}  # a sample several stages read is hashed once
    out = {}
    for sid, p in chosen.items():
        if p == "fp16":
            out[sid] = StagePrecision("fp16")
        else:
            cal.dataset(sid)  # a stage the calibration has no samples for: one line naming it
            ds = read_stage_dataset(cal, by_id[sid], plan, hashes)
            out[sid] = StagePrecision(p, algorithm, ds, cal.sha256)
    return out


def read_stage_dataset(cal: Calibration, stage: Stage, plan: Plan, hashes: dict[Path, str] | None = None) -> Dataset:
    """``stage``'s samples in the calibration ``cal``, checked against the stage's inputs."""
    sc = cal.stages[stage.id]
    if list(sc.inputs) != list(stage.inputs):
        raise UserError(f"calibration {cal.folder}: stage {stage.id}'s samples are of inputs "
                        f"{', '.join(sc.inputs)[:200]}, the stage reads {', '.join(stage.inputs)[:200]}; "
                        "rerun rkpart calibrate")
    from rkpart.compile.calibration import read_dataset

    return read_dataset(cal.dataset(stage.id), root=cal.folder, inputs=[plan.tensors[n] for n in stage.inputs],
                        samples=sc.samples, hashes=hashes)


def link_dataset(dataset: Dataset, plan_rknn: Path) -> Path:
    """Hard-link (else copy) a stage's verified samples into ``<plan>/rknn/calibration/<digest[:16]>/``
    (:func:`rkpart.compile.calibration.write_dataset`: names rkpart writes, never paths read from
    the dataset), so the plan carries what its quantized artifacts were built from (the simulator
    rebuilds them).  Returns the linked ``dataset.txt``."""
    from rkpart.compile.calibration import write_dataset

    return write_dataset(dataset, plan_rknn / CALIB_DIR / dataset.digest[:16])


def plan_precision(plan: Plan) -> str:
    """The precision a compiled plan's NPU stages were built in: ``fp16`` (also when not compiled),
    the one quantized precision they share, or ``mixed``."""
    found = {a.precision for s in plan.npu_stages if (a := s.artifact("rknn")) is not None}
    if not found or found == {"fp16"}:
        return "fp16"
    return found.pop() if len(found) == 1 else "mixed"


__all__ = ["ALGORITHMS", "PRECISIONS", "QUANTIZED_DTYPE", "PrecisionSpec", "StagePrecision", "link_dataset",
           "load_precision_spec", "plan_precision", "plan_precision_spec", "read_stage_dataset", "resolve"]
