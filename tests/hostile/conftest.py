"""Fixtures for the hostile-input tests and the fuzz case counter printed at the end."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from rkpart.cli_args import bundled_example
from tests.bundle.test_bundle import load_runner
from tests.hostile.models import FUZZ_STATS, HOST_SPEC, cli, mini_dit


@pytest.fixture(scope="session")
def mini_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mini DiT (1 block, ~100 kB, inline weights); do not modify it in place."""
    return mini_dit(tmp_path_factory.mktemp("mini") / "mini.onnx")


@pytest.fixture(scope="session")
def bundled() -> Path:
    return bundled_example()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FUZZ_STATS:
        return
    total = sum(v for k, v in FUZZ_STATS.items() if k.startswith("cases:"))
    terminalreporter.section("rkpart fuzz")
    terminalreporter.write_line(f"fuzz cases run: {total}")
    for k in sorted(FUZZ_STATS):
        terminalreporter.write_line(f"  {k}: {FUZZ_STATS[k]}")


@pytest.fixture(scope="session")
def fused_mini_plan(tmp_path_factory: pytest.TempPathFactory, mini_model: Path) -> Path:
    """A fused plan of ``mini_model``; read-only: tests copy it before changing anything."""
    out = tmp_path_factory.mktemp("fused-mini") / "plan"
    r = cli(["partition", mini_model, "-o", out, "-s", "fused", "-q"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="session")
def host_bundle(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> Path:
    """A real bundle of the example (host stages only, a denoise record); read-only: cases copy it."""
    from rkpart.bundle.build import bundle_plan
    from rkpart.pipeline import partition

    root = tmp_path_factory.mktemp("host-bundle")
    (root / "spec.yaml").write_text(HOST_SPEC)
    partition(example_model, root / "plan", "custom", spec=root / "spec.yaml")
    bundle_plan(root / "plan", root / "board")
    return root / "board"


@pytest.fixture(scope="module")
def runner_mod(host_bundle: Path) -> ModuleType:
    """The bundle's own copy of runner.py, imported as a plain file (as on the board)."""
    return load_runner(host_bundle)


@pytest.fixture(scope="session")
def split_plan(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> Path:
    """A split plan of the bundled example; read-only: cases copy it."""
    from rkpart.pipeline import partition

    out = tmp_path_factory.mktemp("split") / "split"
    partition(example_model, out, "split")
    return out


@pytest.fixture(scope="session")
def profile(split_plan: Path) -> Path:
    """One ONNX Runtime profile round of ``split_plan`` (JSON Lines); read-only."""
    out = split_plan.parent / "split.jsonl"
    r = cli(["profile", split_plan, "--rounds", "1", "--threads", "1", "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    return out
