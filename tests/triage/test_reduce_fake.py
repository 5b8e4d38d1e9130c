"""Reduction logic against a FAKE toolkit that segfaults on a known pattern."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from rkpart.compile.toolkits import find_toolkit
from rkpart.triage.matrix import BuildSettings
from rkpart.triage.reduce import FailureSpec, ReductionError, reduce_graph
from rkpart.triage.repro import ReproOptions, reproduce
from tests.triage.conftest import CHAIN_CRASH_EDGES, CHAIN_MINIMAL, FAKE_WORKER

# outside the fast tier: reduces graphs through runner processes (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

SEGV = FailureSpec(kind="crash", signal="SIGSEGV", exit_code=139, signature="exnorm-fusion-segv")
CRASH_CONFIG = {"fake_crash_edges": CHAIN_CRASH_EDGES}
CRASH_BUILD = BuildSettings(config=CRASH_CONFIG, worker=FAKE_WORKER)


@pytest.mark.slow
def test_bisect_then_linear_finds_the_exact_minimal_graph_and_caches_outcomes(
        adaln_chain: Path, fake_toolkits_dir: Path, tmp_path: Path) -> None:
    tk = find_toolkit("2.3.2", fake_toolkits_dir)
    lines: list[str] = []
    red = reduce_graph(adaln_chain, tk, SEGV, CRASH_BUILD, work=tmp_path / "work", max_time=120,
                       progress=lines.append)
    assert sorted(n.name for n in red.model.graph.node) == sorted(CHAIN_MINIMAL)
    assert red.complete
    assert red.original_nodes == 13
    phases = [a.phase for a in red.attempts]
    assert phases[0] == "reference"
    assert phases.index("bisect-end") < phases.index("bisect-start") < phases.index("linear")
    assert min(a.num_nodes for a in red.attempts if a.failed) == 4
    assert red.builds <= 2 * 13  # bisect saves most of the one-by-one builds
    assert any("fails the same way" in ln for ln in lines)  # progress is shown
    onnx.checker.check_model(red.model, full_check=True)

    # Outcomes are cached by graph hash: a rerun (e.g. after an interruption) builds nothing.
    assert red.builds + red.cache_hits == len(red.attempts)
    again = reduce_graph(adaln_chain, tk, SEGV, CRASH_BUILD, work=tmp_path / "work", max_time=120)
    assert again.builds == 0 and again.cache_hits == len(again.attempts)
    assert again.candidate.digest == red.candidate.digest
    assert len(json.loads((tmp_path / "work" / "outcomes.json").read_text())) == red.builds


def test_time_budget_returns_the_smallest_failing_graph_so_far(adaln_chain: Path, fake_toolkits_dir: Path,
                                                               tmp_path: Path) -> None:
    tk = find_toolkit("2.3.2", fake_toolkits_dir)
    red = reduce_graph(adaln_chain, tk, SEGV, CRASH_BUILD, work=tmp_path / "work", max_time=1e-3)
    # Only the reference build started before the budget ran out: the best graph is the full one.
    assert not red.complete
    assert red.builds == 1
    assert red.candidate.num_nodes == 13


def test_a_different_failure_is_not_the_same_failure(adaln_chain: Path, fake_toolkits_dir: Path,
                                                     tmp_path: Path) -> None:
    tk = find_toolkit("2.3.2", fake_toolkits_dir)
    abort = FailureSpec(kind="crash", signal="SIGABRT", exit_code=134, signature=None)
    with pytest.raises(ReductionError, match="not SIGABRT"):
        reduce_graph(adaln_chain, tk, abort, CRASH_BUILD, work=tmp_path / "work", max_time=60)


@pytest.mark.slow
def test_fail_regex_decides_by_the_build_log(adaln_chain: Path, fake_toolkits_dir: Path, tmp_path: Path) -> None:
    # The FAKE prints "<n> nodes" for every build; reduce "to a graph of at most 3 nodes that mentions 3 nodes".
    tk = find_toolkit("2.3.0", fake_toolkits_dir)
    spec = FailureSpec(kind="ok", signal=None, exit_code=0, signature=None, fail_regex=r"fake toolkit \S+: \d+ nodes")
    red = reduce_graph(adaln_chain, tk, spec, BuildSettings(worker=FAKE_WORKER), work=tmp_path / "work", max_time=60)
    assert red.candidate.num_nodes == 1  # every graph "fails": the regex always matches


@pytest.mark.slow
def test_repro_writes_a_deterministic_artifact(adaln_chain: Path, fake_toolkits_dir: Path, tmp_path: Path) -> None:
    cfg = {**CRASH_CONFIG, "fake_crash_versions": ["2.3.2"]}
    opts = ReproOptions(("2.3.0", "2.3.2", "2.5.0"), config=cfg, toolkits_dir=fake_toolkits_dir, worker=FAKE_WORKER,
                        max_time=120)
    rep = reproduce(adaln_chain, tmp_path / "a", opts)
    assert rep.reproduced and rep.reduce_version == "2.3.2"
    assert rep.original.failing == ("2.3.2",)
    assert rep.reduced is not None and rep.reduced.failing == ("2.3.2",)
    assert rep.reduced.verdict() == "regression: builds with 2.3.0, fails with 2.3.2; fixed in 2.5.0"
    assert rep.signature is not None and rep.signature.id == "exnorm-fusion-segv"
    files = sorted(p.name for p in (tmp_path / "a").iterdir() if not p.name.startswith("."))
    assert files == ["README.md", "logs", "matrix.json", "reduced.onnx", "repro.py", "work"]
    readme = (tmp_path / "a" / "README.md").read_text()
    assert "# rknn-toolkit2 2.3.2: SIGSEGV (exit 139) in RKNN.build() on a 4-node ONNX graph" in readme
    assert "| 2.3.2 | SIGSEGV (exit 139) |" in readme
    script = (tmp_path / "a" / "repro.py").read_text()
    imported = {a.name for n in ast.walk(ast.parse(script)) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(ast.parse(script)) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported == {"base64", "os", "sys", "tempfile", "zlib", "rknn.api"}  # stdlib + plain toolkit API
    # Same input, fresh folder (with the first run's outcome cache): byte-identical model and script.
    (tmp_path / "b" / "work").mkdir(parents=True)
    shutil.copy(tmp_path / "a" / "work" / "outcomes.json", tmp_path / "b" / "work" / "outcomes.json")
    rep2 = reproduce(adaln_chain, tmp_path / "b", opts)
    assert rep2.reduction is not None and rep2.reduction.builds == 0
    for name in ("reduced.onnx", "repro.py"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_cli_exits_1_when_no_version_fails(adaln_chain: Path, fake_toolkits_dir: Path, tmp_path: Path) -> None:
    # Without fake_crash_edges the FAKE builds everything.
    from rkpart.cli import main

    res = CliRunner().invoke(main, ["repro", str(adaln_chain), "--toolkits", "2.3.0,2.5.0", "-o", str(tmp_path / "o"),
                                    "--toolkits-dir", str(fake_toolkits_dir), "-q"])
    assert res.exit_code == 1, res.output
    assert "builds with every tested version (2.3.0, 2.5.0)" in res.output
    assert not (tmp_path / "o" / "reduced.onnx").exists()
    assert json.loads((tmp_path / "o" / "matrix.json").read_text())["reduced"] is None
