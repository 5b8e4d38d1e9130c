"""Recognising known toolkit failures from real build logs (recorded from rknn-toolkit2 builds)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rkpart.compile.runner import BuildResult
from rkpart.targets.known_issues import EXNORM_FUSION_SEGV, find_signature, match_log, match_signature

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
