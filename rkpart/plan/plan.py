"""The partition plan: what every later step (compile, run, profile, cost model) consumes.

A plan is a folder: ``plan.json`` plus the stage ONNX files it names, all paths relative to
the folder.  The JSON is versioned (``format``/``version``) and documented in
``docs/plan.md``.  Plans are immutable values; functions that change one return a new one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from rkpart.errors import SpecError, UserError
from rkpart.io import atomic_write_bytes, confined_path
from rkpart.readers import FileKind
from rkpart.types import DEVICES, HOST, NPU, BuildFailure, CompilerPlan, Device, JsonMap, JsonObject, PlanExtra
from rkpart.units import mib

PLAN_FORMAT = "rkpart-plan"
PLAN_VERSION = 1
PLAN_FILENAME = "plan.json"
#: plan.json files are read only up to this size (a plan of 1000 stages is about 2 MB)
MAX_PLAN_BYTES = 32 << 20

__all__ = ["DEVICES", "PLAN_FILENAME", "PLAN_FORMAT", "PLAN_VERSION", "Artifact", "BuildFailure", "Plan", "Stage",
           "TensorInfo", "check_inside", "load_plan", "plan_folder", "stage_order_ok"]


@dataclass(frozen=True)
class TensorInfo:
    """Name, element type (numpy dtype name) and static shape of a boundary tensor."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        from rkpart.ir.tensors import nbytes

        return nbytes(self.dtype, self.shape)

    def to_json(self) -> JsonObject:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: JsonMap) -> TensorInfo:
        return cls(name=str(d["name"]), dtype=str(d["dtype"]), shape=tuple(int(x) for x in d["shape"]))


@dataclass(frozen=True)
class Artifact:
    """A compiled form of a stage (e.g. an ``.rknn`` file) and how it was made."""

    kind: str  # "rknn"
    file: str  # relative to the plan folder
    toolkit: str  # toolkit version that built it
    target: str
    config_hash: str
    sha256: str
    size_bytes: int
    cpu_ops: tuple[str, ...] = ()
    fallback_reason: str | None = None  # set when a fallback toolkit built it
    #: the compiler's own plan of the build (memory, cycles, layer counts; ``None``: not read)
    compiler: CompilerPlan | None = None
    #: issue 27: "fp16", "int8" (w8a8) or "hybrid"; the rest only for int8 / hybrid
    precision: str = "fp16"
    quantized_algorithm: str | None = None
    calibration_sha256: str | None = None  # the calibration manifest's sha256
    calibration_dataset: str | None = None  # the stage's dataset.txt, relative to the plan folder
    float16_layers: tuple[str, ...] = ()  # hybrid: the layers kept in float16

    def to_json(self) -> JsonObject:
        d = dataclasses.asdict(self)
        d["cpu_ops"] = list(self.cpu_ops)
        d["compiler"] = None if self.compiler is None else self.compiler.to_json()
        # an fp16 artifact's record stays as it was before precisions existed (byte-identical plans)
        if self.precision == "fp16":
            for k in ("precision", "quantized_algorithm", "calibration_sha256", "calibration_dataset",
                      "float16_layers"):
                d.pop(k)
        else:
            d["float16_layers"] = list(self.float16_layers)
        return d

    @classmethod
    def from_json(cls, d: JsonMap) -> Artifact:
        return cls(
            kind=str(d["kind"]),
            file=str(d["file"]),
            toolkit=str(d["toolkit"]),
            target=str(d["target"]),
            config_hash=str(d["config_hash"]),
            sha256=str(d["sha256"]),
            size_bytes=int(d["size_bytes"]),
            cpu_ops=tuple(str(x) for x in d.get("cpu_ops", ())),
            fallback_reason=d.get("fallback_reason"),
            compiler=None if d.get("compiler") is None else CompilerPlan.from_json(d["compiler"]),
            precision=str(d.get("precision", "fp16")),
            quantized_algorithm=d.get("quantized_algorithm"),
            calibration_sha256=d.get("calibration_sha256"),
            calibration_dataset=d.get("calibration_dataset"),
            float16_layers=tuple(str(x) for x in d.get("float16_layers", ())),
        )


@dataclass(frozen=True)
class Stage:
    """One subgraph of the plan, run on one device.

    ``inputs``/``outputs`` are boundary tensor names; their dtype/shape are in
    :attr:`Plan.tensors`.  ``block`` is the transformer block index (``None`` for prologue,
    epilogue and shared parts); ``region`` names what the stage covers (``"attn"``,
    ``"xattn"``, ``"ffn"``, ``"block"``, ``"adaln"``, ``"prologue"``, ...).
    """

    id: str
    device: Device
    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    block: int | None
    region: str
    kind: str  # what the stage holds, e.g. "attn", "mod+adaln", "gate+residual"
    weight_bytes: int
    io_bytes: int
    sha256: str
    num_nodes: int
    blocks: tuple[int, ...] = ()  # every block the stage covers (fused runs cover several)
    artifacts: tuple[Artifact, ...] = ()
    failures: tuple[BuildFailure, ...] = ()  # build failures recorded by compile, oldest first
    #: what compile did to the stage for its toolkit before building (opset lowering, NPU
    #: rewrites; :mod:`rkpart.compile.prepare`): {"file", "toolkit", "from_opset", "to_opset", "rewrites"}
    prepared: JsonObject | None = None

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "device": self.device,
            "file": self.file,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "block": self.block,
            "blocks": list(self.blocks),
            "region": self.region,
            "kind": self.kind,
            "weight_bytes": self.weight_bytes,
            "io_bytes": self.io_bytes,
            "sha256": self.sha256,
            "num_nodes": self.num_nodes,
            "artifacts": [a.to_json() for a in self.artifacts],
            "failures": [f.to_json() for f in self.failures],
            **({"prepared": self.prepared} if self.prepared else {}),
        }

    @classmethod
    def from_json(cls, d: JsonMap) -> Stage:
        return cls(
            id=str(d["id"]),
            device=NPU if d["device"] == NPU else HOST,
            file=str(d["file"]),
            inputs=tuple(str(x) for x in d["inputs"]),
            outputs=tuple(str(x) for x in d["outputs"]),
            block=None if d.get("block") is None else int(d["block"]),
            blocks=tuple(int(x) for x in d.get("blocks", ())),
            region=str(d["region"]),
            kind=str(d.get("kind", d["region"])),
            weight_bytes=int(d["weight_bytes"]),
            io_bytes=int(d["io_bytes"]),
            sha256=str(d["sha256"]),
            num_nodes=int(d.get("num_nodes", 0)),
            artifacts=tuple(Artifact.from_json(a) for a in d.get("artifacts", ())),
            failures=tuple(BuildFailure.from_json(f) for f in d.get("failures", ())),
            prepared=dict(d["prepared"]) if d.get("prepared") else None,
        )

    def artifact(self, kind: str = "rknn") -> Artifact | None:
        """The newest artifact of ``kind``, or ``None``."""
        for a in reversed(self.artifacts):
            if a.kind == kind:
                return a
        return None


@dataclass(frozen=True)
class Plan:
    """A partition of one ONNX model into stages, in execution order."""

    model: JsonObject  # {"file": original path (informative), "sha256": ..., "opset": ...}
    strategy: JsonObject  # {"name": ..., "options": {...}}
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    tensors: dict[str, TensorInfo]
    stages: tuple[Stage, ...]
    blocks: tuple[JsonObject, ...] = ()  # discovery summary: [{"index", "regions": [...]}]
    version: int = PLAN_VERSION
    extra: PlanExtra = field(default_factory=lambda: PlanExtra())
    #: shapes the data decided (``rkpart partition --inputs``): per data-dependent op its
    #: ``op``, ``node``, ``tensor``, ``shape`` and the sha256 of each model input it depends on
    specialised: tuple[JsonObject, ...] = ()

    # -- queries ---------------------------------------------------------------------------
    def stage(self, stage_id: str) -> Stage:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise KeyError(stage_id)

    @property
    def npu_stages(self) -> tuple[Stage, ...]:
        return tuple(s for s in self.stages if s.device == NPU)

    @property
    def host_stages(self) -> tuple[Stage, ...]:
        return tuple(s for s in self.stages if s.device == HOST)

    def stages_per_block(self) -> list[int]:
        """The distinct numbers of NPU stages a block is cut into (``[3]`` for split, ``[1]`` fused)."""
        per_block: dict[int, int] = {}
        for s in self.npu_stages:
            for b in s.blocks:
                per_block[b] = per_block.get(b, 0) + 1
        return sorted(set(per_block.values()))

    # -- reports ---------------------------------------------------------------------------
    def summary_json(self) -> JsonObject:
        """What ``rkpart partition --json`` prints about the plan (besides paths and memory)."""
        return {
            "strategy": self.strategy,
            "blocks": len(self.blocks),
            "npu_stages": len(self.npu_stages),
            "host_stages": len(self.host_stages),
            "stages": [{"id": s.id, "device": s.device, "kind": s.kind, "weight_bytes": s.weight_bytes,
                        "io_bytes": s.io_bytes} for s in self.stages],
        }

    def render_stages(self) -> str:
        """One line per stage: index, id, device, kind, weights and I/O in MiB."""
        lines = [f"{'#':>3}  {'stage':<28} {'device':<6} {'kind':<34} {'weights MiB':>11} {'I/O MiB':>8}"]
        for i, s in enumerate(self.stages):
            lines.append(f"{i:>3}  {s.id:<28} {s.device:<6} {s.kind[:34]:<34} {mib(s.weight_bytes):>11} "
                         f"{mib(s.io_bytes):>8}")
        return "\n".join(lines)

    def stage_shape(self) -> str:
        """How the NPU stages cover the blocks, as the plan holds them: ``3 per block`` (split),
        ``1 per block for 1 block, 1 per 2 blocks for 4 blocks`` (a fused block and two runs of two),
        ``none for 2 blocks`` where a block has no NPU stage."""
        spans: dict[int, list[int]] = {int(b["index"]): [] for b in self.blocks}
        for s in self.npu_stages:
            covered = s.blocks or (() if s.block is None else (s.block,))
            for b in covered:
                spans.setdefault(b, []).append(len(covered))
        kinds: dict[str, int] = {}  # wording -> how many blocks have it, in block order
        for b in sorted(spans):
            n, span = len(spans[b]), max(spans[b], default=1)
            what = "none" if n == 0 else f"{n} per block" if span == 1 else f"{n} per {span} blocks"
            kinds[what] = kinds.get(what, 0) + 1
        if len(kinds) <= 1:
            return next(iter(kinds), "no blocks")
        return ", ".join(f"{what} for {k} block{'s' if k > 1 else ''}" for what, k in kinds.items())

    def render_summary(self, path: str | os.PathLike[str]) -> str:
        """The one-line summary after ``rkpart partition`` (``path``: where plan.json was written)."""
        return (f"plan: {path}  strategy={self.strategy['name']}  blocks={len(self.blocks)}  "
                f"NPU stages={len(self.npu_stages)} ({self.stage_shape()})  host stages={len(self.host_stages)}")

    def replace_stage(self, stage: Stage) -> Plan:
        """A new plan with the stage of the same id replaced."""
        stages = tuple(stage if s.id == stage.id else s for s in self.stages)
        return dataclasses.replace(self, stages=stages)

    # -- (de)serialisation -----------------------------------------------------------------
    def to_json(self) -> JsonObject:
        return {
            "format": PLAN_FORMAT,
            "version": self.version,
            "model": self.model,
            "strategy": self.strategy,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "tensors": {k: self.tensors[k].to_json() for k in sorted(self.tensors)},
            "blocks": list(self.blocks),
            "stages": [s.to_json() for s in self.stages],
            **({"specialised": [dict(r) for r in self.specialised]} if self.specialised else {}),
            "extra": self.extra,
        }

    def check_specialised(self, feeds: JsonMap) -> None:
        """Refuse ``feeds`` that could change a shape the plan was specialised to.

        The rule (``docs/plan.md``, "specialised"): each model input a data-dependent op
        depends on must be the array the plan was partitioned on (same dtype, shape and bytes),
        so every specialised shape is what it was.  Raises a one-line :class:`UserError`.
        """
        from rkpart.io import input_digest

        for rec in self.specialised:
            for name, digest in sorted(rec["inputs"].items()):
                if name in feeds and input_digest(feeds[name]) != digest:
                    raise UserError(
                        f"input {name!r} differs from the one this plan was specialised to ({rec['op']} node "
                        f"{rec['node']!r} gave {rec['tensor']!r} the shape {rec['shape']}); partition again "
                        f"with --inputs holding these inputs")

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n"

    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write ``plan.json`` atomically into ``folder``; returns its path."""
        path = Path(folder) / PLAN_FILENAME
        atomic_write_bytes(path, self.dumps().encode())
        return path

    @classmethod
    def from_json(cls, d: JsonMap) -> Plan:
        from rkpart.plan.schema import validate_plan_json

        validate_plan_json(d)
        tensors = {k: TensorInfo.from_json(v) for k, v in d["tensors"].items()}
        return cls(
            model=dict(d["model"]),
            strategy=dict(d["strategy"]),
            inputs=tuple(d["inputs"]),
            outputs=tuple(d["outputs"]),
            tensors=tensors,
            stages=tuple(Stage.from_json(s) for s in d["stages"]),
            blocks=tuple(dict(b) for b in d.get("blocks", ())),
            version=int(d["version"]),
            extra=cast(PlanExtra, dict(d.get("extra", {}))),
            specialised=tuple(dict(r) for r in d.get("specialised", ())),
        )


def plan_folder(path: str | os.PathLike[str]) -> Path:
    """Accept either a plan folder or its ``plan.json``; return the folder."""
    p = Path(path)
    return p.parent if p.name.endswith(".json") or p.is_file() else p


#: a plan's ``plan.json``, read by every command taking PLAN (issue 51: through rkpart's one reader)
PLAN_KIND = FileKind("plan", "json", MAX_PLAN_BYTES, SpecError, doc="a plan folder's `plan.json`: every command "
                                                                   "that takes PLAN")


def load_plan(path: str | os.PathLike[str]) -> tuple[Plan, Path]:
    """Load and validate a plan; returns ``(plan, folder)``.

    Raises :class:`SpecError` for a missing, unreadable or invalid plan, including one that
    names files outside its own folder.
    """
    folder = plan_folder(path)
    pj = folder / PLAN_FILENAME if not str(path).endswith(".json") else Path(path)
    if not os.path.lexists(pj):
        raise SpecError(f"no plan at {pj}: expected a plan folder or its plan.json")
    data = PLAN_KIND.load(pj, root=pj.parent)
    plan = Plan.from_json(data)
    for s in plan.stages:
        for rel in [s.file, *[a.file for a in s.artifacts]]:
            check_inside(folder, rel, what=f"stage {s.id} file")
    return plan, folder


def check_inside(folder: Path, rel: str, *, what: str) -> Path:
    """Refuse paths that leave ``folder`` (``..``, absolute, symlinks); the file need not exist.

    Opening a file goes through :func:`rkpart.io.confined_file` (this plus: a regular file).
    """
    return confined_path(folder, rel, what=what, error=SpecError)


def stage_order_ok(stages: Sequence[Stage], inputs: Sequence[str]) -> str | None:
    """Return a message if some stage reads a tensor not produced before it, else ``None``."""
    have = set(inputs)
    for s in stages:
        missing = [t for t in s.inputs if t not in have]
        if missing:
            return f"stage {s.id} reads {missing[0]!r} before any stage produces it"
        have.update(s.outputs)
    return None
