"""Known rknn-toolkit2 failures, recognised from a build's outcome and its log.

A signature turns "compiler crashed: SIGSEGV" into something a user can act on: which bug it
is, which versions have it, and the workaround.  Matching looks only at what every build
records (exit status / signal, toolkit version, the verbose build log), so it works for
compile stages, ``repro`` matrices and reduction candidates alike.

Use :func:`match_signature` with a :class:`rkpart.compile.runner.BuildResult`, or
:func:`match_log` when only the log text and the outcome are at hand.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class _ResultLike(Protocol):
    """What :func:`match_signature` reads from a build result (``BuildResult`` has it all)."""

    @property
    def ok(self) -> bool: ...
    @property
    def kind(self) -> str: ...
    @property
    def toolkit(self) -> str: ...
    @property
    def signal(self) -> str | None: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def log(self) -> Path: ...


@dataclass(frozen=True)
class BuildFacts:
    """The parts of a build a signature may look at."""

    toolkit: str
    kind: str  # "ok", "crash", "error", "timeout", "oom" (as in BuildResult)
    signal: str | None
    exit_code: int | None
    log_text: str


@dataclass(frozen=True)
class Signature:
    """One known toolkit failure."""

    id: str  # stable identifier, e.g. used in plan.json and test assertions
    title: str
    summary: str  # one line for compile reports
    affected: tuple[str, ...]  # toolkit versions known to show it (with conditions)
    unaffected: tuple[str, ...]
    workaround: str
    details: str
    matcher: Callable[[BuildFacts], bool] = field(repr=False, compare=False)

    def matches(self, facts: BuildFacts) -> bool:
        return self.matcher(facts)

    def describe(self) -> str:
        """``known issue <id>: <summary>; workaround: ...`` for failure messages."""
        return f"known issue {self.id}: {self.summary}; workaround: {self.workaround}"

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "title": self.title, "summary": self.summary,
                "affected": list(self.affected), "unaffected": list(self.unaffected),
                "workaround": self.workaround}


# The optimiser prints its rewrites as "D     <rule>: remove node = [...]"; the exnorm fusion
# rules fold a Mul/Add that follows a LayerNorm into the norm's gamma/beta.
_EXNORM_RULE = re.compile(r"^D\s{2,}(fuse_exnorm_mul|fuse_exnorm_add):\s+remove node", re.MULTILINE)
_NATIVE_BUILD = re.compile(r"rknn building|RKNN: \[[^\]]*\] RKNN is invoked")


def _exnorm_fusion_segv(f: BuildFacts) -> bool:
    if f.signal != "SIGSEGV":
        return False
    # The crash is in the native compiler (after the Python optimiser has finished), on a
    # graph where the exnorm fusion rewrote a LayerNorm whose modulation is computed.
    return bool(_EXNORM_RULE.search(f.log_text)) and bool(_NATIVE_BUILD.search(f.log_text))


EXNORM_FUSION_SEGV = Signature(
    id="exnorm-fusion-segv",
    title="rknn-toolkit2 segfaults after fusing an AdaLN modulation into LayerNorm (exNorm)",
    summary=("SIGSEGV in the native compiler after the optimiser's fuse_exnorm_mul/fuse_exnorm_add folded "
             "an AdaLN scale/shift computed by a node into a LayerNorm's gamma/beta"),
    affected=("2.3.2 (LayerNormalization, opset 17, followed by attention/FFN)",
              "2.3.0 (decomposed LayerNorm, opset 13)"),
    unaffected=("2.3.0 (LayerNormalization, opset 17)", "2.5.0"),
    workaround=("build this stage with rknn-toolkit2 2.3.0 or 2.5.0 (`rkpart compile --fallback-toolkit 2.5.0`), "
                "or keep AdaLN on the host (`rkpart partition -s split --adaln host`)"),
    details=("Every crash follows the graph optimiser's fuse_exnorm_mul / fuse_exnorm_add steps, which fold "
             "the modulation (x * (1 + scale) + shift) into the exNorm's gamma/beta; when that gamma/beta is "
             "produced by a node rather than a constant, RKNNCompiler::build dies with SIGSEGV (exit 139). "
             "No RKNN.config option (optimization_level 0-3, single_core_mode) changes the outcome. Needs a "
             "verbose build log (rkpart's builds are verbose) to be recognised."),
    matcher=_exnorm_fusion_segv,
)

#: every known signature, most specific first
SIGNATURES: tuple[Signature, ...] = (EXNORM_FUSION_SEGV,)


def match_log(log_text: str, *, signal: str | None, toolkit: str = "", kind: str = "crash",
              exit_code: int | None = None) -> Signature | None:
    """The first known signature matching this outcome and build log, or ``None``."""
    facts = BuildFacts(toolkit=toolkit, kind=kind, signal=signal, exit_code=exit_code, log_text=log_text)
    return next((s for s in SIGNATURES if s.matches(facts)), None)


def match_signature(build_result: _ResultLike) -> Signature | None:
    """The known failure ``build_result`` shows (reads its build log), or ``None``.

    Successful builds never match.  A missing or unreadable log matches nothing.

    Examples
    --------
    >>> sig = match_signature(result)            # doctest: +SKIP
    >>> if sig: message += f" ({sig.describe()})"  # doctest: +SKIP
    """
    if build_result.ok:
        return None
    try:
        text = Path(build_result.log).read_text(errors="replace")
    except OSError:
        return None
    return match_log(text, signal=build_result.signal, toolkit=build_result.toolkit, kind=build_result.kind,
                     exit_code=build_result.exit_code)


def find_signature(signature_id: str) -> Signature | None:
    """The signature with this id (as stored in plans and reports), or ``None``."""
    return next((s for s in SIGNATURES if s.id == signature_id), None)
