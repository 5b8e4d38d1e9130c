"""Recognising known toolkit failures from real build logs (recorded from rknn-toolkit2 builds), and the
known-issue table's op signatures against its own reproducers (tests/targets/test_known_issue_reproducers.py
builds those again with the toolkits)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx
import pytest

from rkpart.compile.runner import BuildResult
from rkpart.ir.load import graph_of
from rkpart.targets.known_issues import (
    EXNORM_FUSION_SEGV,
    KNOWN_ISSUES,
    SIGNATURES,
    CrashPattern,
    KnownIssue,
    Traits,
    crash_patterns,
    find_signature,
    match_log,
    match_signature,
    signatures_in,
)
from rkpart.targets.known_issues_repro import Reproducer

DATA = Path(__file__).parents[1] / "triage" / "data"  # recorded logs shared with the triage tests
CRASH_LOG = DATA / "reduced_adaln_2.3.2.log"  # the 5-node AdaLN reproducer, 2.3.2: SIGSEGV
OK_LOG = DATA / "reduced_adaln_2.5.0.log"  # the same graph, 2.5.0: built


def _result(log: Path, *, ok: bool, signal: str | None, toolkit: str = "2.3.2") -> BuildResult:
    return BuildResult(stage_id="b00.block", ok=ok, kind="ok" if ok else "crash", message="", toolkit=toolkit,
                       exit_code=0 if ok else 139, signal=signal, wall_s=3.0, peak_rss_bytes=1 << 28,
                       rknn_size=0, log=log, last_step="convert_exmatmul_to_conv")


def test_exnorm_fusion_segv_is_recognised_from_a_real_crash_log() -> None:
    sig = match_signature(_result(CRASH_LOG, ok=False, signal="SIGSEGV"))
    assert sig is EXNORM_FUSION_SEGV
    assert sig.id == "exnorm-fusion-segv"
    assert "fuse_exnorm_mul" in sig.summary and "--fallback-toolkit" in sig.workaround
    assert sig.describe().startswith("known issue exnorm-fusion-segv: ")
    assert find_signature("exnorm-fusion-segv") is sig


def test_not_matched_without_a_segfault_or_without_the_fusion() -> None:
    text = CRASH_LOG.read_text()
    assert match_log(text, signal="SIGABRT", toolkit="2.3.2") is None  # another crash
    assert match_signature(_result(CRASH_LOG, ok=True, signal=None)) is None  # a build that worked
    no_fusion = "\n".join(ln for ln in text.splitlines() if "fuse_exnorm" not in ln)
    assert match_log(no_fusion, signal="SIGSEGV", toolkit="2.3.2") is None  # a different segfault
    # A non-verbose log ends at "I rknn building ..." and shows no optimiser rewrites: not recognisable.
    assert match_log("I rknn-toolkit2 version: 2.3.2\nI rknn building ...\n", signal="SIGSEGV") is None


def test_the_successful_build_of_the_same_graph_does_not_match() -> None:
    assert match_log(OK_LOG.read_text(), signal=None, toolkit="2.5.0", kind="ok") is None


def test_version_is_not_part_of_the_match() -> None:
    # 2.3.0 segfaults the same way on decomposed (opset 13) LayerNorm: the log decides, not the version.
    res = dataclasses.replace(_result(CRASH_LOG, ok=False, signal="SIGSEGV"), toolkit="2.3.0")
    assert match_signature(res) is EXNORM_FUSION_SEGV


def test_missing_log_matches_nothing(tmp_path: Path) -> None:
    assert match_signature(_result(tmp_path / "gone.log", ok=False, signal="SIGSEGV")) is None


# -- the table's reproducers and op signatures ------------------------------------------------------


def _signatures(rep: Reproducer) -> frozenset[str]:
    """The op signatures the reproducer's whole graph holds (one NPU stage of it all)."""
    mg = graph_of(rep.model(), f"{rep.name}.onnx")
    return signatures_in(mg, (frozenset(i for i in range(mg.num_ops) if i not in mg.const_ops),))


def test_every_issue_carries_a_reproducer_that_crashes_the_toolkit_it_names() -> None:
    for issue in KNOWN_ISSUES:
        crashes = [r for r in issue.reproducers if r.outcome == "SIGSEGV"]
        assert crashes, issue.id
        for r in issue.reproducers:
            onnx.checker.check_model(r.model(), full_check=True)
        for p in issue.patterns:  # a pattern that excludes candidates is proven on its own toolkit
            assert p.signature in SIGNATURES, p
            assert any(r.toolkit == p.toolkit for r in crashes), p


@pytest.mark.parametrize("issue", [i for i in KNOWN_ISSUES if i.patterns], ids=lambda i: i.id)
def test_an_issues_signatures_hold_exactly_its_crashing_reproducers(issue: KnownIssue) -> None:
    """On each toolkit, every reproducer that crashed it holds one of the issue's signatures for that
    toolkit, and no graph recorded as building there holds any: the signature is as specific as the
    crashes seen."""
    for r in issue.reproducers:
        mine = {p.signature for p in issue.patterns if p.toolkit == r.toolkit}
        held = _signatures(r) & mine
        assert bool(held) == (r.outcome == "SIGSEGV"), (r.name, r.toolkit, r.outcome, sorted(held))


def test_a_signature_excludes_a_broad_match_is_only_suspected() -> None:
    p = next(p for p in crash_patterns("2.3.0") if p.when)
    broad = Traits(adaln_on_npu=True, residual_on_npu=True, layernorm="decomposed", candidate="fused")
    assert p.match("2.3.0", broad) == "suspected"  # an RMSNorm DiT's fused block: AdaLN on the NPU, no LayerNorm
    assert p.match("2.3.0", dataclasses.replace(broad, signatures=frozenset({p.signature or ""}))) == "known"
    assert p.match("2.3.2", dataclasses.replace(broad, signatures=frozenset({p.signature or ""}))) is None
    # a pattern with no broad form is recognised by its signature only
    only = next(p for p in crash_patterns("2.3.0") if not p.when)
    assert only.match("2.3.0", broad) is None
    assert only.match("2.3.0", dataclasses.replace(broad, signatures=frozenset({only.signature or ""}))) == "known"


def test_a_cost_model_row_naming_an_unknown_signature_is_refused() -> None:
    from rkpart.cost_model.checks import check_model_document
    from rkpart.errors import SpecError

    row = {**crash_patterns("2.3.2")[0].to_json(), "signature": "adaln-everything"}
    assert CrashPattern.from_json(crash_patterns("2.3.2")[0].to_json()) == crash_patterns("2.3.2")[0]
    with pytest.raises(SpecError, match="'adaln-everything' is no op signature"):
        check_model_document({"known_issues": [row]}, where="edited")
