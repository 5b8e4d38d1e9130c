"""Known rknn-toolkit2 bugs: which graph patterns crash which toolkit, and how the crash looks.

ONE table for the two questions asked about a toolkit bug:

* *before* a build (``--strategy auto``, :mod:`rkpart.cost_model.select`): does this candidate
  partition contain a pattern the chosen toolkit is known to crash on?  Answered by each
  issue's :class:`CrashPattern` rows.  A row's op signature (:data:`SIGNATURES`: the ops, their
  shapes and the toolkit of the recorded reproducers) found in one of the candidate's NPU stages
  makes the crash *known* and excludes the candidate; a match of its broad traits only
  (``adaln_on_npu``, ``layernorm`` ...) makes it *suspected*: the candidate stays, and a build
  (``auto --toolkit``) decides.
* *after* a build (``rkpart compile``, ``rkpart repro``, reduction): is this failure a known
  bug?  Answered by each issue's matcher, which reads only what every build records (exit
  status / signal, toolkit version, the verbose build log).

Every issue carries the reproducers that prove it (:mod:`rkpart.targets.known_issues_repro`), each
with the toolkit it was built with and what the build did; ``tests/targets/test_known_issue_reproducers.py``
builds them again.  Sources are cited per issue; the first measurements are in
``/work/shared/reference/rknn.md`` ("The AdaLN SIGSEGV (reproduced)") and the seed write-up (section 2).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rkpart.targets.known_issues_repro import Reproducer, adaln_matmul
from rkpart.types import JsonMap, JsonObject

if TYPE_CHECKING:
    from rkpart.ir.graph import ModelGraph


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
    #: the op signatures (names of :data:`SIGNATURES`) one of the candidate's NPU stages holds
    signatures: frozenset[str] = frozenset()


#: the attribute names a crash pattern's ``when`` may use
TRAIT_NAMES = frozenset(f.name for f in fields(Traits)) - {"signatures"}

Match = Literal["known", "suspected"]


@dataclass(frozen=True)
class CrashPattern:
    """A graph pattern one toolkit version is known to crash on.

    ``signature`` names the op pattern its issue's crashing reproducers share (:data:`SIGNATURES`,
    on ``toolkit``): a candidate holding it in an NPU stage is known to crash.  ``when`` (a
    mapping, as in cost-model JSON files) is the broad form, matched against a candidate
    partition's :class:`Traits` by attribute name (every named trait equal; a name that is no
    trait never matches): a candidate matching it without the signature is only suspected.
    """

    toolkit: str
    when: JsonMap
    what: str  # one line for "excluded: known issue: ..."
    source: str
    signature: str | None = None

    def match(self, toolkit: str | None, traits: Traits) -> Match | None:
        """``"known"`` (the signature is in the candidate), ``"suspected"`` (only the broad traits
        match) or ``None``."""
        if toolkit != self.toolkit:
            return None
        if self.signature is not None and self.signature in traits.signatures:
            return "known"
        # a pattern with no broad form is recognised by its signature only
        broad = bool(self.when) and all(k in TRAIT_NAMES and getattr(traits, k) == v for k, v in self.when.items())
        return "suspected" if broad else None

    def matches(self, toolkit: str | None, traits: Traits) -> bool:
        """Whether the pattern matches at all (known or suspected)."""
        return self.match(toolkit, traits) is not None

    def to_json(self) -> JsonObject:
        """The row format cost-model JSON files carry (``known_issues``)."""
        return {"toolkit": self.toolkit, "when": dict(self.when), "what": self.what, "source": self.source,
                **({} if self.signature is None else {"signature": self.signature})}

    @classmethod
    def from_json(cls, row: JsonMap) -> CrashPattern:
        """A row of a cost-model file's ``known_issues`` (checked by :mod:`rkpart.cost_model.checks`)."""
        sig = row.get("signature")
        return cls(toolkit=str(row.get("toolkit")), when=dict(row.get("when", {})), what=str(row.get("what")),
                   source=str(row.get("source", "")), signature=None if sig is None else str(sig))


# -- op signatures: what the recorded reproducers share ---------------------------------------------

#: ops a modulated norm's output passes through on its way to the weighted op that follows it
_PASS = frozenset({"Add", "Mul", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Cast"})
_WEIGHTED = frozenset({"MatMul", "Gemm", "Conv"})


def _norms(mg: ModelGraph, ops: frozenset[int], forms: frozenset[str]) -> Iterator[tuple[str, str]]:
    """(output, input) of each LayerNorm in ``ops`` of the given forms: ``op`` (LayerNormalization),
    ``decomposed`` (``(x - mean(x)) / sqrt(var + eps)``, opset 13's form).  An RMSNorm (no mean
    subtracted) is neither."""
    def made_by(t: str, op_type: str) -> Any:
        i = mg.producer.get(t)
        return mg.op(i) if i is not None and i in ops and mg.op(i).op_type == op_type else None

    for i in sorted(ops):
        n = mg.op(i)
        if n.op_type == "LayerNormalization" and "op" in forms:
            yield n.outputs[0], n.inputs[0]
        elif n.op_type == "Div" and "decomposed" in forms and len(n.inputs) == 2:
            sub, sqrt = made_by(n.inputs[0], "Sub"), made_by(n.inputs[1], "Sqrt")
            mean = made_by(sub.inputs[1], "ReduceMean") if sub is not None else None
            if sqrt is not None and mean is not None and mean.inputs[0] == sub.inputs[0]:
                yield n.outputs[0], sub.inputs[0]


def _rms_norms(mg: ModelGraph, ops: frozenset[int]) -> Iterator[tuple[str, str]]:
    """(output, input) of each RMSNorm in ``ops`` as the TorchScript exporter writes it,
    ``x * (1 / sqrt(mean(x^2) + eps))`` (``Reciprocal`` for the ``1 /``: dynamo's, which rkpart's
    reciprocal-to-div rewrite makes the same before a build)."""
    def made_by(t: str, *op_types: str) -> Any:
        i = mg.producer.get(t)
        return mg.op(i) if i is not None and i in ops and mg.op(i).op_type in op_types else None

    for i in sorted(ops):
        n = mg.op(i)
        if n.op_type != "Mul" or len(n.inputs) != 2:
            continue
        for x, inv_t in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            inv = made_by(inv_t, "Div", "Reciprocal")
            if inv is None or (inv.op_type == "Div" and not mg.is_const_tensor(inv.inputs[0])):
                continue
            sqrt = made_by(inv.inputs[-1], "Sqrt")
            add = made_by(sqrt.inputs[0], "Add") if sqrt is not None else None
            mean = next((m for t in (add.inputs if add is not None else ()) if (m := made_by(t, "ReduceMean"))), None)
            sq = made_by(mean.inputs[0], "Pow", "Mul") if mean is not None else None
            if sq is not None and x in sq.inputs:
                yield n.outputs[0], x


def _per_channel(mg: ModelGraph, t: str) -> bool:
    """A constant with one value per channel (a norm's gamma / beta), not one per token."""
    shape = mg.shape(t)
    return mg.is_const_tensor(t) and shape is not None and math.prod(shape[:-1]) == 1


def _affine(mg: ModelGraph, ops: frozenset[int], t: str) -> str:
    """``t`` past a norm's own gamma / beta (a Mul and an Add by per-channel constants), if any."""
    for _ in range(2):
        readers = [j for j in mg.consumers.get(t, ()) if j in ops]
        if len(readers) != 1:
            return t
        n = mg.op(readers[0])
        if n.op_type not in ("Mul", "Add") or not any(_per_channel(mg, x) for x in n.inputs if x != t):
            return t
        t = n.outputs[0]
    return t


#: ops a modulation passes through between its own computation and the norm's product (``1 + scale``
#: is an Add of a constant; chunks are unsqueezed, reshaped)
_MOD_PASS = frozenset({"Unsqueeze", "Reshape", "Squeeze", "Cast"})


def _computed(mg: ModelGraph, ops: frozenset[int], t: str) -> bool:
    """Whether the modulation ``t`` is computed by the stage: past its ``1 +`` and layout ops, an op of
    the stage made it (SiLU + Linear, a table + t), not a stage input."""
    for _ in range(4):
        i = mg.producer.get(t)
        if mg.is_const_tensor(t) or i is None or i not in ops:
            return False
        n = mg.op(i)
        rest = [x for x in n.inputs if x and not mg.is_const_tensor(x)]
        if n.op_type in _MOD_PASS or (n.op_type == "Add" and len(rest) == 1 and len(n.inputs) == 2):
            t = rest[0]
            continue
        return True
    return True


def _feeds_weighted(mg: ModelGraph, ops: frozenset[int], t: str, depth: int = 4) -> bool:
    """Whether ``t`` reaches a MatMul / Gemm / Conv by a constant weight (a linear layer, as in every
    reproducer: not attention's ``q @ k^T``) through at most ``depth`` elementwise or layout ops."""
    frontier = [t]
    for _ in range(depth):
        nxt: list[str] = []
        for x in frontier:
            for j in mg.consumers.get(x, ()):
                if j not in ops:
                    continue
                n = mg.op(j)
                if n.op_type in _WEIGHTED and any(mg.is_const_tensor(w) for w in n.inputs[1:] if w):
                    return True
                if n.op_type in _PASS:
                    nxt.extend(n.outputs)
        frontier = nxt
    return False


def _modulated_norm(mg: ModelGraph, ops: frozenset[int], forms: frozenset[str],
                    modulation: Callable[[ModelGraph, frozenset[int], str, tuple[int, ...]], bool]) -> bool:
    """A LayerNorm of ``forms`` (or an RMSNorm: ``{"rms"}``) whose output is multiplied by a
    modulation ``modulation`` accepts, the product then read by a weighted op of the stage (the
    exnorm fusion's pattern)."""
    found = _rms_norms(mg, ops) if forms == _RMS else _norms(mg, ops, forms)
    for out, x in found:
        xs = mg.shape(x)
        if xs is None or len(xs) < 2:
            continue
        y = _affine(mg, ops, out)
        for j in mg.consumers.get(y, ()):
            n = mg.op(j)
            if j not in ops or n.op_type != "Mul" or len(n.inputs) != 2:
                continue
            s = n.inputs[1] if n.inputs[0] == y else n.inputs[0]
            ss = mg.shape(s)
            if ss is None or len(ss) != len(xs) or ss[-1] != xs[-1]:
                continue
            if modulation(mg, ops, s, xs) and _feeds_weighted(mg, ops, n.outputs[0]):
                return True
    return False


def _per_sample(mg: ModelGraph, ops: frozenset[int], s: str, xs: tuple[int, ...]) -> bool:
    """One modulation row for all tokens ([.., 1, C] against [.., T, C], T > 1), not a constant."""
    ss = mg.shape(s)
    return ss is not None and ss[-2] == 1 and xs[-2] > 1 and not mg.is_const_tensor(s)


def _per_sample_computed(mg: ModelGraph, ops: frozenset[int], s: str, xs: tuple[int, ...]) -> bool:
    """:func:`_per_sample`, and computed in the stage (SiLU + Linear, or PixArt's table + t)."""
    return _per_sample(mg, ops, s, xs) and _computed(mg, ops, s)


def _token_constant(mg: ModelGraph, ops: frozenset[int], s: str, xs: tuple[int, ...]) -> bool:
    """A constant with a row per token ([.., T, C], T > 1): a modulation of weights alone, folded."""
    ss = mg.shape(s)
    return ss is not None and mg.is_const_tensor(s) and ss[-2] == xs[-2] > 1


@dataclass(frozen=True)
class Signature:
    """An op pattern the crashing reproducers of a known issue share, as a test on an NPU stage."""

    name: str
    what: str
    test: Callable[[ModelGraph, frozenset[int]], bool] = field(repr=False, compare=False)

    def found(self, mg: ModelGraph, ops: frozenset[int]) -> bool:
        """Whether the stage made of ``ops`` holds the pattern."""
        return self.test(mg, ops)


_ANY_LN = frozenset({"op", "decomposed"})
_DECOMPOSED = frozenset({"decomposed"})
_RMS = frozenset({"rms"})

#: every op signature of the table, by name (cost-model files refer to them by name)
SIGNATURES: dict[str, Signature] = {s.name: s for s in (
    Signature("layernorm-modulated", "a LayerNorm (LayerNormalization or its opset-13 decomposition) times a "
              "per-sample modulation [.., 1, C] that is not a constant, then a MatMul",
              lambda mg, ops: _modulated_norm(mg, ops, _ANY_LN, _per_sample)),
    Signature("decomposed-layernorm-computed-modulation", "a decomposed (opset 13) LayerNorm times a per-sample "
              "modulation [.., 1, C] computed in the stage (SiLU + Linear, or a table + t), then a MatMul",
              lambda mg, ops: _modulated_norm(mg, ops, _DECOMPOSED, _per_sample_computed)),
    Signature("rmsnorm-token-constant-modulation", "an RMSNorm (x / sqrt(mean(x^2) + eps)) times a constant "
              "modulation with a row per token [.., T, C], then a MatMul",
              lambda mg, ops: _modulated_norm(mg, ops, _RMS, _token_constant)),
)}


def signatures_in(mg: ModelGraph, stages: Iterator[frozenset[int]] | tuple[frozenset[int], ...]) -> frozenset[str]:
    """The names of :data:`SIGNATURES` found in any of ``stages`` (op sets of NPU stages)."""
    stages = tuple(stages)
    return frozenset(name for name, sig in SIGNATURES.items() if any(sig.found(mg, ops) for ops in stages))


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
    #: the graphs that prove it (and controls that build), each with its toolkit and outcome
    reproducers: tuple[Reproducer, ...] = field(default=(), compare=False)
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


def _adaln(norm: str, modulation: str) -> Callable[[], Any]:
    """The AdaLN reproducer of ``norm`` and ``modulation`` (:func:`rkpart.targets.known_issues_repro.adaln_matmul`)."""
    def make() -> Any:
        return adaln_matmul(norm, modulation)

    return make


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
            what="rknn-toolkit2 2.3.2 crashes (SIGSEGV, exit 139) building a LayerNorm times an AdaLN modulation "
                 "followed by a MatMul in one graph (fuse_exnorm_mul/fuse_exnorm_add)",
            source="reproducers adaln-layernorm-inputs, adaln-decomposed-silu-linear on 2.3.2; seed write-up "
                   "section 2; reference/rknn.md AdaLN SIGSEGV table",
            signature="layernorm-modulated",
        ),
        CrashPattern(
            toolkit="2.3.0",
            when={"adaln_on_npu": True, "layernorm": "decomposed"},
            what="rknn-toolkit2 2.3.0 crashes (SIGSEGV, exit 139) on a decomposed (opset 13) LayerNorm times an "
                 "AdaLN modulation computed in the stage, followed by a MatMul",
            source="reproducers adaln-decomposed-silu-linear, adaln-decomposed-table on 2.3.0 (an RMSNorm, a "
                   "LayerNormalization or a modulation read as a stage input builds); reference/rknn.md AdaLN "
                   "SIGSEGV table (opset 13 rows)",
            signature="decomposed-layernorm-computed-modulation",
        ),
        CrashPattern(
            toolkit="2.3.0",
            when={},  # no broad form: only the signature is on record
            what="rknn-toolkit2 2.3.0 crashes (SIGSEGV, exit 139) on an RMSNorm times a constant modulation with a "
                 "row per token, followed by a MatMul",
            source="reproducer adaln-rmsnorm-token-constant on 2.3.0 (a LayerNormalization builds; 2.3.2 and 2.5.0 "
                   "build it)",
            signature="rmsnorm-token-constant-modulation",
        ),
    ),
    reproducers=(
        # 2.3.2: any LayerNorm under any per-sample modulation; an RMSNorm builds
        Reproducer("adaln-layernorm-inputs", "2.3.2", "SIGSEGV", _adaln("layernorm", "inputs"),
                   what="the 5-node reduction of the bundled example's fused block (bench/triage_repro.py)"),
        Reproducer("adaln-decomposed-silu-linear", "2.3.2", "SIGSEGV", _adaln("layernorm-decomposed", "silu-linear")),
        Reproducer("adaln-rmsnorm-silu-linear", "2.3.2", "ok", _adaln("rmsnorm", "silu-linear")),
        # 2.3.0: the decomposed LayerNorm under a modulation the stage computes; the rest builds
        Reproducer("adaln-decomposed-silu-linear", "2.3.0", "SIGSEGV", _adaln("layernorm-decomposed", "silu-linear")),
        Reproducer("adaln-decomposed-table", "2.3.0", "SIGSEGV", _adaln("layernorm-decomposed", "table")),
        Reproducer("adaln-decomposed-inputs", "2.3.0", "ok", _adaln("layernorm-decomposed", "inputs")),
        Reproducer("adaln-layernorm-silu-linear", "2.3.0", "ok", _adaln("layernorm", "silu-linear")),
        Reproducer("adaln-rmsnorm-silu-linear", "2.3.0", "ok", _adaln("rmsnorm", "silu-linear"),
                   what="the form of an RMSNorm DiT's AdaLN (Z-Image, TorchScript): its fused plan builds"),
        Reproducer("adaln-rmsnorm-table", "2.3.0", "ok", _adaln("rmsnorm", "table")),
        # 2.3.0: an RMSNorm under a constant modulation with a row per token (a LayerNormalization builds)
        Reproducer("adaln-rmsnorm-token-constant", "2.3.0", "SIGSEGV", _adaln("rmsnorm", "token-constant")),
        Reproducer("adaln-layernorm-token-constant", "2.3.0", "ok", _adaln("layernorm", "token-constant")),
        # unaffected
        Reproducer("adaln-decomposed-silu-linear", "2.5.0", "ok", _adaln("layernorm-decomposed", "silu-linear")),
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
    reproducers=(Reproducer("segv-layernorm-scale", "2.5.0", "SIGSEGV", file="segv_layernorm_scale_2.5.0.onnx",
                            what="`rkpart repro` of a tiny HunyuanDiT's dynamo cross-attention stage (8 nodes)"),),
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
    reproducers=(Reproducer("segv-slice-slice-concat", "2.5.0", "SIGSEGV", file="segv_slice_slice_concat_2.5.0.onnx",
                            what="`rkpart repro` of a tiny Chroma's fused double block (3 nodes)"),
                 Reproducer("segv-contiguous-slices-concat", "2.5.0", "SIGSEGV",
                            file="segv_contiguous_slices_concat_2.5.0.onnx",
                            what="`rkpart repro` of a tiny HunyuanVideo's dynamo single-stream stage (5 nodes)")),
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
    "SIGNATURES",
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
    "signatures_in",
]
