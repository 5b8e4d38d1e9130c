"""Known rknn-toolkit2 bugs: which graph patterns crash which toolkit, and how the crash looks.

ONE table for the two questions asked about a toolkit bug:

* *before* a build (``--strategy auto``, :mod:`rkpart.cost_model.select`): does this candidate
  partition contain a pattern the chosen toolkit is known to crash on?  Answered by each
  issue's :class:`CrashPattern` rows, matched against a candidate's traits
  (``adaln_on_npu``, ``layernorm`` ...).
* *after* a build (``rkpart compile``, ``rkpart repro``, reduction): is this failure a known
  bug?  Answered by each issue's matcher, which reads only what every build records (exit
  status / signal, toolkit version, the verbose build log).

Sources are cited per issue; the measurements are in ``/work/shared/reference/rknn.md`` ("The
AdaLN SIGSEGV (reproduced)") and the seed write-up (section 2).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Protocol

from rkpart.types import JsonMap, JsonObject


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
    """The parts of a build an issue's matcher may look at."""

    toolkit: str
    kind: str  # "ok", "crash", "error", "timeout", "oom" (as in BuildResult)
    signal: str | None
    exit_code: int | None
    log_text: str


@dataclass(frozen=True)
class Traits:
    """What a crash pattern can ask of a candidate partition
    (:meth:`rkpart.cost_model.candidates.Candidate.traits`).

    A :class:`CrashPattern`'s ``when`` names these attributes; a cost-model file's
    ``known_issues`` rows may name no other (:data:`TRAIT_NAMES`, checked on load).
    """

    adaln_on_npu: bool
    residual_on_npu: bool
    layernorm: str  # "op" (LayerNormalization) or "decomposed"
    candidate: str  # the candidate family's id (rkpart.grouping.strategies.families)


#: the attribute names a crash pattern's ``when`` may use
TRAIT_NAMES = frozenset(f.name for f in fields(Traits))


@dataclass(frozen=True)
class CrashPattern:
    """A graph pattern one toolkit version is known to crash on.

    ``when`` (a mapping, as in cost-model JSON files) is matched against a candidate
    partition's :class:`Traits` by attribute name: every named trait must be equal; a name
    that is no trait never matches.
    """

    toolkit: str
    when: JsonMap
    what: str  # one line for "excluded: known issue: ..."
    source: str

    def matches(self, toolkit: str | None, traits: Traits) -> bool:
        return toolkit == self.toolkit and all(
            k in TRAIT_NAMES and getattr(traits, k) == v for k, v in self.when.items())

    def to_json(self) -> JsonObject:
        """The row format cost-model JSON files carry (``known_issues``)."""
        return {"toolkit": self.toolkit, "when": dict(self.when), "what": self.what, "source": self.source}

    @classmethod
    def from_json(cls, row: JsonMap) -> CrashPattern:
        """A row of a cost-model file's ``known_issues`` (checked by :mod:`rkpart.cost_model.checks`)."""
        return cls(toolkit=str(row.get("toolkit")), when=dict(row.get("when", {})), what=str(row.get("what")),
                   source=str(row.get("source", "")))


@dataclass(frozen=True)
class KnownIssue:
    """One known toolkit bug: its crash patterns, its log signature and its workaround."""

    id: str  # stable identifier, stored in plan.json and used in test assertions
    title: str
    summary: str  # one line for compile reports
    affected: tuple[str, ...]  # toolkit versions known to show it (with conditions)
    unaffected: tuple[str, ...]
    workaround: str
    details: str
    patterns: tuple[CrashPattern, ...]
    matcher: Callable[[BuildFacts], bool] = field(default=lambda _f: False, repr=False, compare=False)
    #: the optimiser rules whose fusions lead to the crash: cutting the stage before the nodes they
    #: removed (so the rule cannot fire) is a workaround for any spelling of the pattern
    fusion_rules: tuple[str, ...] = ()

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
    # 2.5.0 is unaffected by this bug; its own exnorm crash is EXNORM_SCALE_SEGV_250
    if f.signal != "SIGSEGV" or f.toolkit == "2.5.0":
        return False
    # The crash is in the native compiler (after the Python optimiser has finished), on a
    # graph where the exnorm fusion rewrote a LayerNorm whose modulation is computed.
    return bool(_EXNORM_RULE.search(f.log_text)) and bool(_NATIVE_BUILD.search(f.log_text))


EXNORM_FUSION_SEGV = KnownIssue(
    id="exnorm-fusion-segv",
    title="rknn-toolkit2 segfaults after fusing an AdaLN modulation into LayerNorm (exNorm)",
    summary=("SIGSEGV in the native compiler after the optimiser's fuse_exnorm_mul/fuse_exnorm_add folded "
             "an AdaLN scale/shift computed by a node (or a constant with a row per token) into a LayerNorm's "
             "gamma/beta"),
    affected=("2.3.2 (LayerNormalization, opset 17, followed by attention/FFN)",
              "2.3.0 (decomposed LayerNorm, opset 13; and Flux.3's dynamo export, fused blocks, "
              "LayerNormalization lowered from opset 20)"),
    unaffected=("2.3.0 (Anima's LayerNormalization, opset 17)", "2.5.0"),
    # 2.5.0 only: a crash seen on 2.3.0 must not be answered with "use 2.3.0"
    workaround=("`rkpart compile --repartition` (cuts the stage in front of the ops the crash fused), build this "
                "stage with rknn-toolkit2 2.5.0 (`rkpart compile --fallback-toolkit 2.5.0`), "
                "or keep AdaLN on the host (`rkpart partition -s split --adaln host`)"),
    details=("Every crash follows the graph optimiser's fuse_exnorm_mul / fuse_exnorm_add steps, which fold "
             "the modulation (x * (1 + scale) + shift) into the exNorm's gamma/beta; when that gamma/beta is "
             "produced by a node rather than a constant, RKNNCompiler::build dies with SIGSEGV (exit 139). "
             "No RKNN.config option (optimization_level 0-3, single_core_mode) changes the outcome. Needs a "
             "verbose build log (rkpart's builds are verbose) to be recognised."),
    patterns=(
        CrashPattern(
            toolkit="2.3.2",
            when={"adaln_on_npu": True},
            what="rknn-toolkit2 2.3.2 crashes (SIGSEGV, exit 139) building AdaLN followed by attention/FFN "
                 "in one graph (fuse_exnorm_mul/fuse_exnorm_add)",
            source="seed write-up section 2; reference/rknn.md AdaLN SIGSEGV table",
        ),
        CrashPattern(
            toolkit="2.3.0",
            when={"adaln_on_npu": True, "layernorm": "decomposed"},
            what="rknn-toolkit2 2.3.0 crashes (SIGSEGV, exit 139) on AdaLN with a decomposed (opset 13) "
                 "LayerNorm followed by weighted ops",
            source="reference/rknn.md AdaLN SIGSEGV table (opset 13 rows)",
        ),
    ),
    matcher=_exnorm_fusion_segv,
    fusion_rules=("fuse_exnorm_mul", "fuse_exnorm_add"),
)



def _exnorm_scale_segv_250(f: BuildFacts) -> bool:
    return (f.signal == "SIGSEGV" and f.toolkit == "2.5.0" and bool(_EXNORM_RULE.search(f.log_text))
            and bool(_NATIVE_BUILD.search(f.log_text)))


EXNORM_SCALE_SEGV_250 = KnownIssue(
    id="exnorm-scale-segv-2.5.0",
    title="rknn-toolkit2 2.5.0 segfaults after folding a constant scale through a transpose into a LayerNorm",
    summary=("SIGSEGV in 2.5.0's native compiler after fuse_exnorm_mul folded the constant Mul of "
             "LayerNorm -> Reshape -> Transpose -> Reshape -> Mul(scalar) (the key of a dynamo SDPA after "
             "a LayerNorm qk-norm) into the norm"),
    affected=("2.5.0",),
    unaffected=("2.3.0",),
    workaround=("rkpart's layernorm-scale-fold rewrite (on by default; `--no-rewrites` turns it off) folds the "
                "scale into the LayerNorm first; or build this stage with `--fallback-toolkit 2.3.0`"),
    details=("Measured on a tiny HunyuanDiT exported by dynamo (split plan, both cross-attention stages; the "
             "TorchScript export builds). The build log's last step is convert_exmatmul_to_conv, after "
             "fuse_exnorm_mul; `rkpart repro` reduces the stage to 8 nodes: the key's LayerNorm, Reshape, "
             "Transpose, Reshape and its constant scale Mul, with the query's RoPE Add and scale Mul. Matched "
             "by a 2.5.0 SIGSEGV in the native build after fuse_exnorm_mul."),
    patterns=(),
    matcher=_exnorm_scale_segv_250,
    fusion_rules=("fuse_exnorm_mul",),
)

_SLICE_CONCAT_RULE = re.compile(r"^D\s{2,}fuse_slice_slice_concat_to_conv:\s+remove node", re.MULTILINE)


def _slice_concat_segv_250(f: BuildFacts) -> bool:
    return f.signal == "SIGSEGV" and f.toolkit == "2.5.0" and bool(_SLICE_CONCAT_RULE.search(f.log_text))


SLICE_CONCAT_SEGV_250 = KnownIssue(
    id="slice-concat-conv-segv-2.5.0",
    title="rknn-toolkit2 2.5.0 segfaults on a Concat of two constant Slices it turned into a conv",
    summary=("SIGSEGV in 2.5.0 after fuse_slice_slice_concat_to_conv turned Concat(x[:, a:b], x[:, c:d]) "
             "into a convolution (Chroma's modulation pieces)"),
    affected=("2.5.0",),
    unaffected=("2.3.0",),
    workaround=("rkpart's strided-slices-concat rewrite (on by default; `--no-rewrites` turns it off) writes "
                "the pieces as Slice/Reshape/Slice/Reshape; or build this stage with `--fallback-toolkit 2.3.0`"),
    details=("Measured on tiny Chroma exports (both exporters, fused plan, both double blocks: the block stage "
             "reads the approximator's output and picks mod[:, 6:12] and mod[:, 18:24]). The log of the whole "
             "block ends at replace_torch_tanh_gelu; `rkpart repro` reduces it to the two Slices and the "
             "Concat, whose log shows fuse_slice_slice_concat_to_conv. Matched by a 2.5.0 SIGSEGV whose "
             "verbose log shows that rule."),
    patterns=(),
    matcher=_slice_concat_segv_250,
    fusion_rules=("fuse_slice_slice_concat_to_conv",),
)

#: every known issue, most specific first
KNOWN_ISSUES: tuple[KnownIssue, ...] = (SLICE_CONCAT_SEGV_250, EXNORM_SCALE_SEGV_250, EXNORM_FUSION_SEGV)


def crash_patterns(toolkit: str | None = None) -> tuple[CrashPattern, ...]:
    """Every crash pattern of the table (only ``toolkit``'s when given)."""
    return tuple(p for i in KNOWN_ISSUES for p in i.patterns if toolkit is None or p.toolkit == toolkit)


def match_log(log_text: str, *, signal: str | None, toolkit: str = "", kind: str = "crash",
              exit_code: int | None = None) -> KnownIssue | None:
    """The first known issue matching this outcome and build log, or ``None``."""
    facts = BuildFacts(toolkit=toolkit, kind=kind, signal=signal, exit_code=exit_code, log_text=log_text)
    return next((s for s in KNOWN_ISSUES if s.matches(facts)), None)


def match_signature(build_result: _ResultLike) -> KnownIssue | None:
    """The known issue ``build_result`` shows (reads its build log), or ``None``.

    Successful builds never match.  A missing or unreadable log matches nothing.

    Examples
    --------
    >>> issue = match_signature(result)              # doctest: +SKIP
    >>> if issue: message += f" ({issue.describe()})"  # doctest: +SKIP
    """
    if build_result.ok:
        return None
    try:
        text = Path(build_result.log).read_text(errors="replace")
    except OSError:
        return None
    return match_log(text, signal=build_result.signal, toolkit=build_result.toolkit, kind=build_result.kind,
                     exit_code=build_result.exit_code)


_REMOVED = re.compile(r"^D\s{2,}([A-Za-z_]\w*):\s+remove node = \[([^\]]*)\]", re.MULTILINE)


def fused_nodes(log_text: str, rules: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """(rule, node name) for every node the optimiser's fusion ``rules`` removed, in log order.

    ``rules=None``: the nodes of the last fusion rule the log shows (the step before a crash no
    known issue names).  Only nodes of the model are returned (the optimiser's own inserted nodes
    are named ``<op>_<n>_<suffix>`` and never reach the ONNX graph; callers filter by name).
    """
    found = [(m.group(1), m.group(2)) for m in _REMOVED.finditer(log_text)]
    if rules is None:
        fuse = [f for f in found if f[0].startswith("fuse_")]
        if not fuse:
            return []
        rules = (fuse[-1][0],)
    out: list[tuple[str, str]] = []
    for rule, names in found:
        if rule not in rules:
            continue
        for n in re.findall(r"'([^']*)'", names):
            if (rule, n) not in out:
                out.append((rule, n))
    return out


def find_signature(issue_id: str) -> KnownIssue | None:
    """The known issue with this id (as stored in plans and reports), or ``None``."""
    return next((s for s in KNOWN_ISSUES if s.id == issue_id), None)


__all__ = [
    "EXNORM_FUSION_SEGV",
    "EXNORM_SCALE_SEGV_250",
    "KNOWN_ISSUES",
    "SLICE_CONCAT_SEGV_250",
    "TRAIT_NAMES",
    "BuildFacts",
    "CrashPattern",
    "KnownIssue",
    "Traits",
    "crash_patterns",
    "find_signature",
    "fused_nodes",
    "match_log",
    "match_signature",
]
