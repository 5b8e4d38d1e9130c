"""Crash-safe writing and folder locking (rkpart/io.py); kills mid-write are in tests/hostile."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from rkpart.errors import OutputExistsError
from rkpart.io import (
    atomic_write_bytes,
    atomic_writer,
    file_sha256,
    folder_lock,
    old_path,
    recover_folder,
    replace_folder,
)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_atomic_write_replaces_the_file_with_the_usual_mode_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.bin"
    atomic_write_bytes(target, b"old")
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()  # not mkstemp's 0600
    assert [p.name for p in target.parent.iterdir()] == ["out.bin"]


def test_atomic_writer_keeps_the_old_file_when_the_writer_fails(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="writer died"), atomic_writer(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_bytes(b"half")
        raise RuntimeError("writer died")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
    with atomic_writer(target) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"


def test_file_sha256_reads_in_chunks_and_matches_hashlib(tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 7)
    (tmp_path / "f").write_bytes(data)
    assert file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_folder_lock_refuses_a_second_holder_and_is_released(tmp_path: Path) -> None:
    folder = tmp_path / "plan"
    with folder_lock(folder), \
            pytest.raises(OutputExistsError, match=r"^the plan folder is in use by another rkpart run; wait"), \
            folder_lock(folder, what="the plan folder"):
        pass
    with folder_lock(folder):  # released: taken again
        pass
    assert list(folder.iterdir()) == []  # no lock file left behind


def test_replace_folder_swaps_in_the_new_content_and_removes_the_old(tmp_path: Path) -> None:
    final, staging = tmp_path / "out", tmp_path / ".out.partial"
    final.mkdir()
    (final / "old.txt").write_text("old")
    staging.mkdir()
    (staging / "new.txt").write_text("new")
    replace_folder(staging, final)
    assert [p.name for p in final.iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_recover_folder_restores_the_old_folder_after_a_half_done_replace(tmp_path: Path) -> None:
    final = tmp_path / "out"
    old = old_path(final)
    old.mkdir()
    (old / "plan.json").write_text("{}")
    recover_folder(final)  # died after "final -> old", before "staging -> final"
    assert (final / "plan.json").read_text() == "{}" and not old.exists()
    old.mkdir()
    recover_folder(final)  # both exist: the old one is garbage
    assert final.exists() and not old.exists()


@pytest.mark.parametrize(("doc", "limit", "found"), [
    ({"a": [1, 2.5, {"b": float("nan")}]}, None, "a[2].b"),
    ({"a": float("-inf")}, None, "a"),
    (float("inf"), None, ""),
    ({"a": 2**60}, None, None),             # no limit: a big integer is a number
    ({"a": 2**60}, 2**53, "a"),
    ({"a": [-1e300]}, 2**53, "a[0]"),
    ({"a": True, "b": "NaN", "c": None}, 1, None),  # booleans and strings are not numbers
])
def test_bad_number_names_the_path_of_the_first_bad_number(doc: object, limit: float | None,
                                                           found: str | None) -> None:
    from rkpart.io import bad_number

    bad = bad_number(doc, limit=limit)
    assert (bad[0] if bad is not None else None) == found


# -- staged_folder: what a SIGKILL can leave in the staging folder --------------------------------


def _staged(out: Path) -> None:
    from rkpart.output import staged_folder

    with staged_folder(out, kind="report", force=False) as st:
        (st / "index.html").write_text("report")


def test_staging_holding_only_the_markers_temp_file_is_a_killed_runs(tmp_path: Path) -> None:
    """Killed between the staging folder's mkdir and its marker's rename: only the marker's temp
    file is there, and the next run takes the folder as its own."""
    staging = tmp_path / ".out.partial"
    staging.mkdir()
    (staging / ".rkpart-output.json.q81zb3.tmp").write_bytes(b'{"form')
    _staged(tmp_path / "out")
    assert (tmp_path / "out" / "index.html").read_text() == "report" and not staging.exists()


def test_staging_with_a_foreign_file_beside_a_temp_file_is_refused(tmp_path: Path) -> None:
    staging = tmp_path / ".out.partial"
    staging.mkdir()
    (staging / ".rkpart-output.json.q81zb3.tmp").write_bytes(b"")
    (staging / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="did not write"):
        _staged(tmp_path / "out")
    assert sorted(p.name for p in staging.iterdir()) == [".rkpart-output.json.q81zb3.tmp", "notes.txt"]


def test_claiming_a_killed_runs_staging_removes_its_marker_last(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed run's staging folder is emptied by the next; killed at the last removal (the
    fault is injected), what is left is the marker, so the run after that claims it again."""
    from rkpart import output
    from tests.hostile.models import kill_at_last_removal

    staging = tmp_path / ".out.partial"
    staging.mkdir()
    output.write_marker(staging, "report", complete=False)
    for i in range(16):  # enough entries that no listing order puts the marker last by chance
        (staging / f"page{i}.html").write_text("half")
    (staging / "assets").mkdir()
    n = len(list(staging.iterdir()))
    removed = kill_at_last_removal(monkeypatch, output, n)
    with pytest.raises(KeyboardInterrupt):
        _staged(tmp_path / "out")
    monkeypatch.undo()
    assert len(removed) == n - 1 and [p.name for p in staging.iterdir()] == [output.MARKER]
    _staged(tmp_path / "out")
    assert (tmp_path / "out" / "index.html").is_file() and not staging.exists()
