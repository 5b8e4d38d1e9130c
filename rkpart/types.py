"""Vocabulary shared across package borders: where a stage runs, how its sessions live, what
its lifecycle is made of, how a build failed.

A leaf module (it imports nothing from rkpart) so every layer, from the IR up to the CLI,
can name these types without creating an import edge upwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal, TypedDict

#: a JSON object, as a file holds it (``json.loads`` of ``{...}``) and as a record's ``to_json()``
#: returns it: the form between a typed record and its file, its values JSON values
JsonObject = dict[str, Any]
#: a JSON object read, not written (a record's ``from_json`` argument, strategy options)
JsonMap = Mapping[str, Any]


class PlanExtra(TypedDict, total=False):
    """plan.json ``extra``: what the partition and the builds recorded beside the stages (docs/plan.md).

    A strategy's own ``Partition.extra`` keys come along too (a plugin's are its own).
    """

    #: how blocks were numbered (``Discovery.method``; ``None`` without a discovery)
    discovery: str | None
    #: the strategy's remarks and the partition's warnings
    notes: list[str]
    #: the blocks' token-wise matmul work in NPU stages (``Coverage.to_json()``)
    npu_coverage: JsonObject
    #: ops the capability moved to the host, and cuts (``target``, ``toolkit``, ``host_ops``, ``cuts``)
    capability: JsonObject
    #: how stage weights reference the source (``--weights link``)
    weights: JsonObject
    #: how the plan was compiled (``rkpart compile``'s settings: toolkit, target, precision, ...)
    compile: JsonObject
    #: the pipeline description recorded in the plan (``file``, ``sha256``, ``pipeline``, ``values``,
    #: ``values_sha256``: :mod:`rkpart.roles`, docs/pipeline-json.md)
    pipeline: JsonObject

#: where a stage runs: an NPU stage is compiled by rknn-toolkit2, a host stage runs in ONNX Runtime
Device = Literal["npu", "host"]
NPU: Final = "npu"
HOST: Final = "host"
DEVICES: Final[tuple[Device, ...]] = ("npu", "host")


class Residency(str, Enum):
    """How long a stage's runtime session lives during a round of passes."""

    #: loaded, initialised, run and released around each use (what the write-up measured)
    PER_STAGE = "per-stage"
    #: loaded once per round and kept for every pass and step
    RESIDENT = "resident"

    def __str__(self) -> str:
        return self.value


RESIDENCIES: Final[tuple[str, ...]] = tuple(r.value for r in Residency)


# -- lifecycle components ------------------------------------------------------------------
#: what an NPU stage's session costs, in order: load the model file, initialise the runtime,
#: run one inference, release the context
LIFECYCLE: Final = ("load", "init", "infer", "release")
#: the time components of a plan run: the lifecycle of NPU stages plus the whole time of host
#: stages.  Cost models (``rkpart fit``) name them so; profile records hold each one in
#: seconds under :func:`seconds_key` (``load_s``).
TIME_COMPONENTS: Final = (*LIFECYCLE, "host")
TimeComponent = Literal["load", "init", "infer", "release", "host"]


def seconds_key(component: str) -> str:
    """The profile-record field of a time component: ``load`` -> ``load_s`` (seconds)."""
    if component not in TIME_COMPONENTS:
        raise ValueError(f"unknown time component {component!r} (valid: {', '.join(TIME_COMPONENTS)})")
    return f"{component}_s"


# -- build failures --------------------------------------------------------------------------
#: how a toolkit build failed: ``crash`` (killed by a signal such as SIGSEGV), ``timeout``
#: (killed by rkpart after ``--timeout``), ``oom`` (MemoryError or the kernel's OOM killer),
#: ``error`` (the toolkit reported an error and exited), ``resource`` (the machine, not the
#: graph: disk full, or killed from outside with SIGTERM/SIGHUP/SIGINT)
FailureKind = Literal["crash", "timeout", "oom", "error", "resource"]
FAILURE_KINDS: Final[tuple[FailureKind, ...]] = ("crash", "timeout", "oom", "error", "resource")
#: kinds that say something about the graph, not the machine (remembered by the build cache,
#: and excluding a candidate from selection)
DETERMINISTIC_FAILURES: Final[tuple[FailureKind, ...]] = ("crash", "error")


@dataclass(frozen=True)
class BuildFailure:
    """One failed rknn-toolkit2 build of one stage, as ``plan.json`` records it.

    Written by compile (``Stage.failures``, the build cache), read by selection (a recorded
    crash excludes a candidate), the simulator backend and the drop-in build.  The JSON form
    (:meth:`to_json`) is the ``failures`` item of ``docs/plan.md``.
    """

    toolkit: str  # version that failed
    kind: FailureKind
    message: str  # one line, names the toolkit, the signal or exit code, and a known bug if any
    exit_code: int | None = None  # shell style: 128+N for signal N
    signal: str | None = None  # "SIGSEGV", ...
    last_step: str | None = None  # last optimiser step the build log shows
    log: str | None = None  # build log, relative to the plan folder
    signature: str | None = None  # id of the known toolkit bug it matches (rkpart.targets.known_issues)

    @property
    def deterministic(self) -> bool:
        """A property of the graph and toolkit (crash, error), not of the machine (timeout, oom)."""
        return self.kind in DETERMINISTIC_FAILURES

    def to_json(self) -> JsonObject:
        d: JsonObject = {"toolkit": self.toolkit, "kind": self.kind, "message": self.message,
                             "exit_code": self.exit_code, "signal": self.signal, "last_step": self.last_step,
                             "log": self.log}
        if self.signature is not None:
            d["signature"] = self.signature
        return d

    @classmethod
    def from_json(cls, d: JsonMap) -> BuildFailure:
        """Read a ``failures`` item; unknown keys (e.g. timings of older plans) are ignored."""
        kind = str(d.get("kind", "error"))
        return cls(
            toolkit=str(d.get("toolkit", "")),
            kind=kind if kind in FAILURE_KINDS else "error",
            message=str(d.get("message", kind)),
            exit_code=None if d.get("exit_code") is None else int(d["exit_code"]),
            signal=None if d.get("signal") is None else str(d["signal"]),
            last_step=None if d.get("last_step") is None else str(d["last_step"]),
            log=None if d.get("log") is None else str(d["log"]),
            signature=None if d.get("signature") is None else str(d["signature"]),
        )


# -- the compiler's own plan of a built stage -------------------------------------------------
#: version of :class:`CompilerPlan`'s JSON form (``artifacts[].compiler`` in plan.json)
COMPILER_PLAN_VERSION: Final = 1
#: layer types that the RK3588 NPU splits across its cores (rknn-toolkit2 2.3.2 operator list:
#: "only Conv, Add, Mul and their fused forms"); every other layer runs on core 0
MULTICORE_OPS: Final = frozenset({"Conv", "ConvAdd", "ConvExGelu", "ConvRelu", "ConvSigmoid", "ConvClip",
                                  "ConvSwish", "ConvMul", "Add", "Mul"})


@dataclass(frozen=True)
class CompilerPlan:
    """What the toolkit's verbose build log says it planned for one stage.

    Read from the log's "Network Layer Information Table" (per-layer ``Cycles(DDR/NPU/Total)``
    and ``RW(KB)``) and its memory statistics ("Total Weight Memory Size", "Total Internal
    Memory Size"); published: those two equal what ``eval_memory()`` reports on a board.
    A figure the log does not print is ``None``, never 0.  Counts are sorted tuples so that
    equal tables give equal objects and byte-identical JSON.
    """

    weight_bytes: int | None
    internal_bytes: int | None
    layers: int  # rows of the layer table, input/output operators included
    cycles_ddr: int | None
    cycles_npu: int | None
    cycles_total: int | None  # per row max(DDR, NPU), summed
    rw_bytes: int | None
    by_op: tuple[tuple[str, int], ...] = ()
    by_dtype: tuple[tuple[str, int], ...] = ()
    by_target: tuple[tuple[str, int], ...] = ()
    #: layer types whose every row shows 0/0/0 cycles (the compiler gives them no estimate)
    uncycled_ops: tuple[str, ...] = ()
    #: Σ Total cycles of the layers the NPU splits across cores (:data:`MULTICORE_OPS`)
    multicore_cycles: int | None = None
    #: the per-layer rows, relative to the plan folder (``None``: not kept)
    layers_file: str | None = None
    version: int = COMPILER_PLAN_VERSION

    @property
    def device_mem_bytes(self) -> int | None:
        """Weight + internal memory, the two figures the build counts (``None`` if either is missing)."""
        if self.weight_bytes is None or self.internal_bytes is None:
            return None
        return self.weight_bytes + self.internal_bytes

    def to_json(self) -> JsonObject:
        return {"version": self.version, "weight_bytes": self.weight_bytes, "internal_bytes": self.internal_bytes,
                "layers": self.layers, "cycles_ddr": self.cycles_ddr, "cycles_npu": self.cycles_npu,
                "cycles_total": self.cycles_total, "rw_bytes": self.rw_bytes, "by_op": dict(self.by_op),
                "by_dtype": dict(self.by_dtype), "by_target": dict(self.by_target),
                "uncycled_ops": list(self.uncycled_ops), "multicore_cycles": self.multicore_cycles,
                "layers_file": self.layers_file}

    @classmethod
    def from_json(cls, d: JsonMap) -> CompilerPlan:
        """Read ``artifacts[].compiler``; a version this reader does not know is a ``ValueError``."""
        if d.get("version") != COMPILER_PLAN_VERSION:
            raise ValueError(f"compiler plan version {d.get('version')!r} is not {COMPILER_PLAN_VERSION}")

        def opt(k: str) -> int | None:
            v = d.get(k)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"compiler plan {k} must be a non-negative integer or null, not {v!r}")
            return v

        def counts(k: str) -> tuple[tuple[str, int], ...]:
            m = d.get(k) or {}
            if not isinstance(m, Mapping) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                     for v in m.values()):
                raise ValueError(f"compiler plan {k} must map names to counts")
            return tuple(sorted((str(a), int(b)) for a, b in m.items()))

        layers = opt("layers")
        unc = d.get("uncycled_ops") or []
        if not isinstance(unc, list):
            raise ValueError("compiler plan uncycled_ops must be a list")
        lf = d.get("layers_file")
        return cls(weight_bytes=opt("weight_bytes"), internal_bytes=opt("internal_bytes"), layers=layers or 0,
                   cycles_ddr=opt("cycles_ddr"), cycles_npu=opt("cycles_npu"), cycles_total=opt("cycles_total"),
                   rw_bytes=opt("rw_bytes"), by_op=counts("by_op"), by_dtype=counts("by_dtype"),
                   by_target=counts("by_target"), uncycled_ops=tuple(sorted(str(x) for x in unc)),
                   multicore_cycles=opt("multicore_cycles"), layers_file=None if lf is None else str(lf))
