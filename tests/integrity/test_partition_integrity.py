"""``rkpart partition``: resume keyed by content, --force and staging never touch what is not ours
(issue 13 items 1, 2, 3 and the ``--out`` symlink case)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rkpart.pipeline import PartitionConfig, partition
from tests.hostile.models import assert_user_error, cli, kill_at_last_removal, siblings, snapshot

#: every weight over 64 bytes to a stage data file (the resumed runs below re-check those)
SMALL_STAGE_DATA = PartitionConfig(external_threshold=64)


class _Interrupt(KeyboardInterrupt):
    """Stands in for Ctrl-C / a kill after some stages were written (the staging folder stays)."""


def _interrupt_after(n: int) -> object:
    seen = []

    def progress(msg: str) -> None:
        if msg.startswith("["):
            seen.append(msg)
            if len(seen) > n:
                raise _Interrupt
    return progress


def _data_files(model: Path) -> list[Path]:
    return sorted(p for p in model.parent.iterdir() if p != model)


def test_resume_after_external_weights_changed_rebuilds(tmp_path: Path, ext_copy: Path) -> None:
    """Item 1: interrupted, then the external weights change (same .onnx): nothing is resumed
    and the plan holds the new weights."""
    out = tmp_path / "out"
    with pytest.raises(_Interrupt):
        partition(ext_copy, out, "split", config=SMALL_STAGE_DATA, progress=_interrupt_after(4))
    assert (tmp_path / ".out.partial" / "stages").is_dir()
    data = _data_files(ext_copy)
    assert data, "the model must have external data"
    raw = bytearray(data[0].read_bytes())
    raw[: len(raw) // 2] = bytes(len(raw) // 2)  # zero half the weights, same size
    data[0].write_bytes(bytes(raw))
    msgs: list[str] = []
    plan = partition(ext_copy, out, "split", config=SMALL_STAGE_DATA, progress=msgs.append)
    assert not [m for m in msgs if "(resumed)" in m], msgs
    fresh = partition(ext_copy, tmp_path / "fresh", "split", config=SMALL_STAGE_DATA)
    assert [s.sha256 for s in plan.stages] == [s.sha256 for s in fresh.stages]


def test_resume_with_same_content_still_resumes(tmp_path: Path, ext_copy: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(_Interrupt):
        partition(ext_copy, out, "split", config=SMALL_STAGE_DATA, progress=_interrupt_after(4))
    msgs: list[str] = []
    partition(ext_copy, out, "split", config=SMALL_STAGE_DATA, progress=msgs.append)
    assert [m for m in msgs if "(resumed)" in m]


@pytest.mark.parametrize("content", [{}, {"format": "rkpart-plan"}], ids=["empty-json", "partial"])
def test_force_refuses_folder_with_only_a_plan_json(tmp_path: Path, mini_model: Path, content: object) -> None:
    """Item 2: a folder holding a file named plan.json is not a plan folder."""
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "plan.json").write_text(json.dumps(content))
    (out / "thesis.tex").write_text("years of work")
    (out / "sub" / "data.csv").write_text("1,2")
    before = snapshot(out)
    r = cli(["partition", mini_model, "-o", out, "-s", "fused", "--force", "-q"])
    assert_user_error(r, 6, "not an rkpart plan folder")
    assert snapshot(out) == before
    assert siblings(out) == []


def test_force_refuses_valid_plan_with_user_files(tmp_path: Path, mini_model: Path, fused_mini_plan: Path) -> None:
    import shutil

    out = tmp_path / "plan"
    shutil.copytree(fused_mini_plan, out)
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    r = cli(["partition", mini_model, "-o", out, "-s", "fused", "--force", "-q"])
    assert_user_error(r, 6, "notes.txt")
    assert snapshot(out) == before


def test_force_replaces_a_real_plan_folder(tmp_path: Path, mini_model: Path, fused_mini_plan: Path) -> None:
    import shutil

    out = tmp_path / "plan"
    shutil.copytree(fused_mini_plan, out)
    r = cli(["partition", mini_model, "-o", out, "-s", "split", "--force", "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "plan.json").read_text())["strategy"]["name"] == "split"


def test_planted_partial_symlink_is_not_followed(tmp_path: Path, mini_model: Path) -> None:
    """Item 3: ``.<out>.partial`` pointing at a user folder: that folder is left alone."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    before = snapshot(victim)
    out = tmp_path / "out"
    os.symlink(victim, tmp_path / ".out.partial")
    r = cli(["partition", mini_model, "-o", out, "-s", "fused", "-q"])
    assert_user_error(r, 6, "symlink")
    assert snapshot(victim) == before
    assert not out.exists()


def test_planted_old_symlink_is_not_followed(tmp_path: Path, mini_model: Path, fused_mini_plan: Path) -> None:
    """The backup path ``.<out>.old`` of a --force replace: a planted symlink is removed, not followed."""
    import shutil

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    before = snapshot(victim)
    out = tmp_path / "out"
    shutil.copytree(fused_mini_plan, out)
    os.symlink(victim, tmp_path / ".out.old")
    r = cli(["partition", mini_model, "-o", out, "-s", "split", "--force", "-q"])
    assert r.exit_code == 0, r.output
    assert snapshot(victim) == before
    assert siblings(out) == []


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside-a-run-key-temp-file"])
def test_foreign_partial_folder_is_not_emptied(tmp_path: Path, mini_model: Path, beside: bool) -> None:
    """A foreign file is refused, also next to the temp file a killed run's key leaves."""
    staging = tmp_path / ".out.partial"
    staging.mkdir()
    if beside:
        (staging / ".run.json.k2j4x9.tmp").write_bytes(b"")
    (staging / "mine.txt").write_text("not rkpart's")
    before = snapshot(staging)
    r = cli(["partition", mini_model, "-o", tmp_path / "out", "-s", "fused", "-q"])
    assert_user_error(r, 6, "did not write")
    assert snapshot(staging) == before


def test_out_symlink_is_a_clear_error_and_force_keeps_working(tmp_path: Path, mini_model: Path,
                                                             fused_mini_plan: Path) -> None:
    import shutil

    real = tmp_path / "real"
    shutil.copytree(fused_mini_plan, real)
    link = tmp_path / "link"
    os.symlink(real, link)
    before = snapshot(real)
    for _ in range(2):
        r = cli(["partition", mini_model, "-o", link, "-s", "split", "--force", "-q"])
        assert_user_error(r, 6, "symlink")
    assert snapshot(real) == before
    assert link.is_symlink()
    r = cli(["partition", mini_model, "-o", real, "-s", "split", "--force", "-q"])
    assert r.exit_code == 0, r.output


def test_run_killed_before_its_run_key_landed_is_its_own_leftover(tmp_path: Path, mini_model: Path) -> None:
    """A kill between the staging folder's mkdir and its run key's rename leaves only the key's
    temp file (CI, test_sigkill_during_force_replace_keeps_old_or_new): the next run takes the
    folder as its own (a foreign file beside such a temp file: the test above)."""
    staging = tmp_path / ".out.partial"
    staging.mkdir()
    (staging / ".run.json.k2j4x9.tmp").write_bytes(b'{"ke')
    r = cli(["partition", mini_model, "-o", tmp_path / "out", "-s", "fused", "-q"])
    assert r.exit_code == 0, r.output
    assert not staging.exists() and (tmp_path / "out" / "plan.json").is_file()


def test_clearing_another_runs_staging_removes_its_run_key_last(tmp_path: Path, mini_model: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that finds another run's staging folder empties it; killed half-way (the fault is
    injected) the folder still holds that run's key, so the next run
    clears it again instead of refusing it as foreign.  The kill lands at the last removal, so
    whatever order the folder lists its entries in, the one left must be the key."""
    from rkpart.plan import write

    out = tmp_path / "out"
    with pytest.raises(_Interrupt):
        partition(mini_model, out, "split", progress=_interrupt_after(2))
    staging = tmp_path / ".out.partial"
    assert (staging / "run.json").is_file() and (staging / "stages").is_dir()
    (staging / "a_leftover.bin").write_bytes(b"x")
    (staging / "z_leftover.bin").write_bytes(b"x")
    entries = list(staging.iterdir())
    removed = kill_at_last_removal(monkeypatch, write, len(entries), _Interrupt)
    with pytest.raises(_Interrupt):
        partition(mini_model, out, "fused")  # another run key: it empties the folder first
    monkeypatch.undo()
    assert len(removed) == len(entries) - 1 and "run.json" not in removed
    assert [p.name for p in staging.iterdir()] == ["run.json"]
    plan = partition(mini_model, out, "fused")
    assert plan.strategy["name"] == "fused" and not staging.exists()
