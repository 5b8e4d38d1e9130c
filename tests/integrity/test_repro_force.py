"""``rkpart repro --force`` (issue 13 item 8): the folder lock is taken before anything is
deleted, and a folder that is not a repro folder is never emptied."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from rkpart.cli import main
from rkpart.io import folder_lock
from tests.hostile.models import snapshot


def _repro(*args: object) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["repro", *map(str, args)])
    return res.exit_code, res.output


def _repro_folder(out: Path) -> None:
    """What a previous repro left (its known files)."""
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "original.2.3.0.log").write_text("log")
    (out / "matrix.json").write_text(json.dumps({"original": {}}))
    (out / "README.md").write_text("# repro")


def test_force_waits_for_the_lock_before_deleting(adaln_chain: Path, fake_toolkits_dir: Path,
                                                  tmp_path: Path) -> None:
    out = tmp_path / "out"
    _repro_folder(out)
    before = snapshot(out)
    with folder_lock(out):  # a repro running in this folder
        rc, text = _repro(adaln_chain, "-o", out, "--toolkits-dir", fake_toolkits_dir, "--force", "-q")
    assert rc == 6 and "in use" in text, text
    assert len(text.strip().splitlines()) == 1
    assert snapshot(out) == before


def test_force_refuses_a_foreign_folder(adaln_chain: Path, fake_toolkits_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "plan.json").write_text("{}")
    (out / "thesis.tex").write_text("years of work")
    (out / "sub").mkdir()
    (out / "sub" / "x.csv").write_text("1")
    before = snapshot(out)
    rc, text = _repro(adaln_chain, "-o", out, "--toolkits-dir", fake_toolkits_dir, "--force", "-q")
    assert rc == 6 and "not an rkpart repro folder" in text, text
    assert snapshot(out) == before


def test_force_replaces_a_repro_folder(adaln_chain: Path, fake_toolkits_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _repro_folder(out)
    rc, text = _repro(adaln_chain, "-o", out, "--toolkits-dir", fake_toolkits_dir, "--force", "-q",
                      "--toolkits", "2.3.0")
    assert rc == 1, text  # documented: no version fails (the fake builds it)
    assert (out / "logs" / "original.2.3.0.log").read_text() != "log"  # replaced
