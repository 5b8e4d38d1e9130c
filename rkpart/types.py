"""Vocabulary shared across package borders: where a stage runs, how its sessions live, what
its lifecycle is made of, how a build failed.

A leaf module (it imports nothing from rkpart) so every layer, from the IR up to the CLI,
can name these types without creating an import edge upwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal

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

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"toolkit": self.toolkit, "kind": self.kind, "message": self.message,
                             "exit_code": self.exit_code, "signal": self.signal, "last_step": self.last_step,
                             "log": self.log}
        if self.signature is not None:
            d["signature"] = self.signature
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BuildFailure:
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
