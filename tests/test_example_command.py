"""``rkpart example [DEST]``: the bundled model to a file or into a folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.cli_args import bundled_example


@pytest.mark.parametrize("dest,written", [
    ("newdir/", "newdir/anima_tiny.onnx"),
    ("a/b/m.onnx", "a/b/m.onnx"),
    (".", "anima_tiny.onnx"),
    (None, "anima_tiny.onnx"),
])
def test_example_goes_to_a_file_or_into_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 dest: str | None, written: str) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["example", *([dest] if dest else [])])
    assert r.exit_code == 0, r.output
    assert os.path.normpath(r.output.strip()) == os.path.normpath(written)
    assert (tmp_path / written).read_bytes() == bundled_example().read_bytes()
    again = CliRunner().invoke(main, ["example", *([dest] if dest else [])])
    assert again.exit_code == 6 and "exists; use --force" in again.output
    assert CliRunner().invoke(main, ["example", *([dest] if dest else []), "--force"]).exit_code == 0
