"""`rkpart repro` user errors: one line, the error's exit code, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rkpart.cli import main

# outside the fast tier: the triage command runs its version matrix and reductions (fast tier: under 1 min of CPU)
pytestmark = pytest.mark.slow


def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["repro", *args])
    return res.exit_code, res.output


@pytest.mark.parametrize(("extra", "code", "message"), [
    (["--fail-regex", "(unclosed"], 2, "--fail-regex '(unclosed' is not a valid regular expression"),
    (["--toolkits", "2.2.0"], 7, "rknn-toolkit2 2.2.0 is not installed"),
    (["--toolkits", "2.3.0,2.3.0"], 2, "toolkit versions repeat"),
    (["--toolkits", "2.3.0", "--reduce-with", "2.3.2"], 2, "--reduce-with 2.3.2 is not one of --toolkits"),
])
def test_option_errors(adaln_chain: Path, fake_toolkits_dir: Path, tmp_path: Path, extra: list[str], code: int,
                       message: str) -> None:
    out = tmp_path / "out"
    rc, text = _invoke(str(adaln_chain), "-o", str(out), "--toolkits-dir", str(fake_toolkits_dir), *extra)
    assert rc == code, text
    assert message in text
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text
    assert not out.exists()


def test_not_an_onnx_model(fake_toolkits_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    rc, text = _invoke(str(bad), "-o", str(tmp_path / "out"), "--toolkits-dir", str(fake_toolkits_dir))
    assert rc == 3 and text.startswith("rkpart: error: ")
    assert not (tmp_path / "out").exists()


def test_non_empty_output_needs_force(adaln_chain: Path, fake_toolkits_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("someone else's")
    rc, text = _invoke(str(adaln_chain), "-o", str(out), "--toolkits-dir", str(fake_toolkits_dir))
    assert rc == 6 and "is not empty; pass --force" in text
    assert (out / "README.md").read_text() == "someone else's"


def test_help_lists_the_options() -> None:
    rc, text = _invoke("--help")
    assert rc == 0
    for opt in ("--toolkits", "--target", "--fail-regex", "--max-time", "--out"):
        assert opt in text


def test_reducing_against_a_version_that_builds_is_refused_after_the_matrix(
        adaln_chain: Path, fake_toolkits_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc, text = _invoke(str(adaln_chain), "-o", str(out), "--toolkits-dir", str(fake_toolkits_dir), "-q",
                       "--toolkits", "2.3.0,2.3.2", "--reduce-with", "2.3.0",
                       "--config", 'fake_crash_edges=[["ln", "mul"]]', "--config", 'fake_crash_versions=["2.3.2"]')
    assert rc == 7 and "rknn-toolkit2 2.3.0 builds adaln_chain.onnx (ok (exit 0)); nothing to reduce" in text
    # the matrix was measured and is kept; no reproducer was claimed
    assert json.loads((out / "matrix.json").read_text())["original"]["failing"] == ["2.3.2"]
    assert not (out / "repro.py").exists()
