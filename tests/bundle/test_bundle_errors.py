"""``rkpart bundle`` input checks and the plan's residency policy (no toolkit needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rkpart.bundle.build import stage_residency
from rkpart.cli import main
from rkpart.pipeline import partition
from rkpart.plan.plan import Plan


def test_uncompiled_plan_is_refused_and_nothing_is_written(plans: dict[str, tuple[Plan, Path]],
                                                           tmp_path: Path) -> None:
    out = tmp_path / "board"
    r = CliRunner().invoke(main, ["bundle", str(plans["split"][1]), "-o", str(out)])
    assert r.exit_code == 5
    assert r.output.strip() == ("rkpart: error: NPU stage b00.attn has no .rknn artifact (6 of 6 uncompiled); "
                                "run `rkpart compile` first")
    assert not out.exists() and not list(tmp_path.iterdir())


def test_missing_plan_is_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["bundle", str(tmp_path / "nope"), "-o", str(tmp_path / "b")])
    assert r.exit_code == 5 and r.output.count("\n") == 1 and "no plan at" in r.output


def test_run_rknnlite_without_the_board_runtime_is_one_line(plans: dict[str, tuple[Plan, Path]],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import rknnlite  # noqa: F401

        pytest.skip("rknn-toolkit-lite2 is installed here")
    except ImportError:
        pass
    monkeypatch.delenv("RKPART_RUNNER_NPU_STANDIN", raising=False)
    r = CliRunner().invoke(main, ["run", str(plans["split"][1]), "--backend", "rknnlite", "-q"])
    assert r.exit_code == 7 and r.output.count("\n") == 1 and "needs rknn-toolkit-lite2 on the board" in r.output


def test_core_mask_is_refused_for_other_backends(plans: dict[str, tuple[Plan, Path]]) -> None:
    r = CliRunner().invoke(main, ["run", str(plans["split"][1]), "--core-mask", "0", "-q"])
    assert r.exit_code == 2 and "--core-mask applies to --backend rknnlite only" in r.output


@pytest.mark.parametrize("forced", [None, "per-stage"])
def test_residency_follows_the_auto_plan(example_model: Path, tmp_path: Path, forced: str | None) -> None:
    plan = partition(example_model, tmp_path / "auto", "auto", **({"residency": forced} if forced else {}))
    chosen = {c["residency"] for c in plan.strategy["options"]["choices"]}
    # no budget: the cost model keeps every block resident; a forced residency is what the plan records
    assert chosen == {forced or "resident"}
    assert set(stage_residency(plan).values()) == chosen
    assert set(stage_residency(plan, "per-stage").values()) == {"per-stage"}
    assert set(stage_residency(plans_split(example_model, tmp_path)).values()) == {"per-stage"}


def plans_split(model: Path, tmp_path: Path) -> Plan:
    return partition(model, tmp_path / "split", "split")
