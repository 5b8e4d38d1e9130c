"""The Ray executor's node-side stage cache (``<cache>/ray/stages/<build key>/``) serves a stage's
files only while they are the bytes the task carries (issue 51: a cache hit never builds from other
bytes).  No Ray needed: the node's half is a plain function."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.compile.ray_executor import _stage_files

FILES = {"s.onnx": b"onnx bytes of the stage", "s.onnx.data": b"\x00\x01" * 64}


def test_a_stage_copy_changed_on_the_node_is_written_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RKPART_CACHE_DIR", str(tmp_path / "cache"))
    key = "ab" * 32
    folder = _stage_files(key, FILES)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name in FILES} == FILES
    # the same size, other bytes (a damaged disk, an edit): main built from them, the key unchanged
    (folder / "s.onnx").write_bytes(b"ONNX BYTES OF THE STAGE")
    assert _stage_files(key, FILES) == folder
    assert (folder / "s.onnx").read_bytes() == FILES["s.onnx"]
    # a cache folder replaced by a symlink to somewhere else: never served, never written through
    outside = tmp_path / "outside"
    outside.mkdir()
    for name, data in FILES.items():
        (outside / name).write_bytes(data)
    (outside / ".complete").write_bytes(b"")
    import shutil

    shutil.rmtree(folder)
    folder.symlink_to(outside)
    got = _stage_files(key, FILES)
    assert not got.is_symlink() and (got / "s.onnx").read_bytes() == FILES["s.onnx"]
    assert sorted(p.name for p in outside.iterdir()) == sorted([*FILES, ".complete"])
