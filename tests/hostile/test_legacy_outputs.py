"""``--force`` on outputs written before rkpart's output marker existed (issue 31).

Such a folder is one rkpart recognisably wrote when its own record lists every file in it: a
plan folder's valid ``plan.json`` (its stage files and their ``.data``; compile's ``rknn/``
aside), a bundle's valid ``manifest.json`` (each file still of the recorded size and sha256),
a report folder's tables, a calibration's manifest and the samples its datasets name, a tune
folder's report.  That is replaced; anything else is refused with one line (exit 6) and
hashed unchanged, as is a victim folder next to it.  "Old" outputs are made by the real
commands with the marker removed: the marker is the only thing older rkparts did not write.

Real commands through the real CLI (``CliRunner``) on the bundled example; the bundle is of a
plan with every op on the host, so no toolkit is needed.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from rkpart.errors import OutputExistsError
from rkpart.output import MARKER, claim_work_folder, read_marker
from rkpart.pipeline import partition
from rkpart.tune import TUNE_GROWS, tune_listing
from tests.hostile.models import FUZZ_STATS, assert_user_error, cli, siblings, snapshot

HOST_SPEC = "version: 1\nrest: host\nstages:\n  - id: b00\n    device: host\n    blocks: [0]\n"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> dict[str, Path]:
    """One real output of each kind, its marker removed (as an rkpart before the marker wrote it)."""
    root = tmp_path_factory.mktemp("legacy")
    (root / "spec.yaml").write_text(HOST_SPEC)
    host = root / "host-plan"
    partition(example_model, host, "custom", spec=root / "spec.yaml")
    out = {"host_plan": host}
    steps: dict[str, list[object]] = {
        "plan": ["partition", example_model, "-o", root / "plan", "-s", "split", "-q"],
        "bundle": ["bundle", host, "-o", root / "bundle", "-q"],
        "assets": ["report", host, "-o", root / "report.html", "-q"],
        "calibration": ["calibrate", root / "plan", "-o", root / "calibration", "--steps", "1", "--samples", "2", "-q"],
    }
    names = {"plan": "plan", "bundle": "bundle", "assets": "report_files", "calibration": "calibration"}
    for kind, argv in steps.items():
        r = cli(argv)
        assert r.exit_code == 0, r.output
        out[kind] = root / names[kind]
    for kind in names:
        (out[kind] / MARKER).unlink()
    return out


def _argv(kind: str, made: dict[str, Path], out: Path, example_model: Path) -> list[object]:
    return {
        "plan": ["partition", example_model, "-o", out, "-s", "split", "-q"],
        "bundle": ["bundle", made["host_plan"], "-o", out, "-q"],
        "assets": ["report", made["host_plan"], "-o", out.with_name(out.name[: -len("_files")] + ".html"), "-q"],
        "calibration": ["calibrate", made["plan"], "-o", out, "--steps", "1", "--samples", "2", "-q"],
    }[kind]


def _name(kind: str) -> str:
    return "report_files" if kind == "assets" else kind


def _a_file(out: Path, inner: bool) -> Path:
    """A file rkpart wrote into ``out``: at the top, or one level down if ``inner``."""
    files = sorted(p for p in out.rglob("*") if p.is_file() and (len(p.relative_to(out).parts) > 1) == inner)
    return files[0] if files else sorted(p for p in out.rglob("*") if p.is_file())[0]


#: an attack changes a legacy output ``out`` so that it is no longer only what rkpart wrote
LEGACY_ATTACKS: list[tuple[str, Callable[[Path], None]]] = [
    ("note-at-top", lambda o: (o / "NOTES.txt").write_text("the user's notes")),
    ("note-inside", lambda o: (_a_file(o, True).parent / "mine.txt").write_text("mine")),
    ("nested-user-folder", lambda o: ((o / "mine").mkdir(), (o / "mine" / "x.bin").write_bytes(b"x"))),
    ("symlink-to-victim", lambda o: (o / "link").symlink_to(o.parent / "victim", target_is_directory=True)),
    ("listed-file-is-symlink", lambda o: _listed_symlink(o)),
    ("record-corrupted", lambda o: _corrupt(o)),
]


def _listed_symlink(out: Path) -> None:
    f = _a_file(out, True)
    f.unlink()
    f.symlink_to(out.parent / "victim" / "notes.txt")


def _corrupt(out: Path) -> None:
    for doc in ("plan.json", "manifest.json", "calibration.json", "stages.csv"):
        if (out / doc).is_file():
            if doc.endswith(".csv"):
                (out / doc).unlink()  # a report folder is recognised by its tables
            else:
                (out / doc).write_text('{"not": "rkpart"}')
            return
    raise AssertionError(f"no record in {out}")


def _victim(tmp: Path) -> Path:
    v = tmp / "victim"
    v.mkdir()
    (v / "notes.txt").write_text("the user's notes")
    return v


KINDS = ["plan", "bundle", "assets", "calibration"]


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.slow  # the module's `made` outputs take ~5 s of CPU to write (a plan, bundle, profile, ...)
@pytest.mark.parametrize("kind", KINDS)
def test_force_replaces_an_output_written_before_the_marker(kind: str, made: dict[str, Path], tmp_path: Path,
                                                           example_model: Path) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / _name(kind)
    shutil.copytree(made[kind], out, symlinks=True)
    if kind == "assets":
        shutil.copyfile(made["assets"].with_name("report.html"), tmp_path / "report.html")
    before = snapshot(victim)
    r = cli([*_argv(kind, made, out, example_model), "--force"])
    assert r.exit_code == 0, r.output
    doc = read_marker(out)
    assert doc is not None and doc["complete"] is True  # now it carries the marker
    assert snapshot(victim) == before
    assert siblings(out) == []
    FUZZ_STATS["cases:writes-legacy"] += 1


@pytest.mark.slow  # reads the module's `made` outputs
@pytest.mark.parametrize("attack", [a[0] for a in LEGACY_ATTACKS])
@pytest.mark.parametrize("kind", KINDS)
def test_force_refuses_a_legacy_output_holding_anything_rkpart_did_not_write(
        kind: str, attack: str, made: dict[str, Path], tmp_path: Path, example_model: Path) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / _name(kind)
    shutil.copytree(made[kind], out, symlinks=True)
    next(f for a, f in LEGACY_ATTACKS if a == attack)(out)
    before = {"victim": snapshot(victim), "out": snapshot(out), "made": snapshot(made[kind])}
    r = cli([*_argv(kind, made, out, example_model), "--force"])
    msg = assert_user_error(r, 6, "refusing to replace")
    assert MARKER in msg  # names why: no marker, and what it holds or lacks
    assert {"victim": snapshot(victim), "out": snapshot(out), "made": snapshot(made[kind])} == before
    assert siblings(out) == []
    FUZZ_STATS["cases:writes-legacy"] += 1


@pytest.mark.slow  # reads the module's `made` outputs
def test_a_legacy_bundle_with_an_edited_file_is_the_users(made: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    shutil.copytree(made["bundle"], out)
    runner = out / "runner.py"
    runner.write_text(runner.read_text() + "\n# my change\n")
    before = snapshot(out)
    r = cli(["bundle", made["host_plan"], "-o", out, "-q", "--force"])
    msg = assert_user_error(r, 6, "runner.py")
    assert "changed since rkpart wrote it" in msg
    assert snapshot(out) == before


def test_legacy_tune_folder_is_claimed_and_a_foreign_one_refused(tmp_path: Path) -> None:
    old = tmp_path / "tune"
    (old / "plans" / "fused").mkdir(parents=True)
    (old / "plans" / "fused" / "plan.json").write_text("{}")
    (old / "cost_model.json").write_text("{}")
    (old / "tune_report.json").write_text(json.dumps({"cost_model": "x", "auto_plan": "y", "verify": []}))
    assert claim_work_folder(old, kind="tune", legacy=tune_listing, grows=TUNE_GROWS) == old
    doc = read_marker(old)
    assert doc is not None and doc["kind"] == "tune"
    for name, make in [("note", lambda d: (d / "NOTES.txt").write_text("mine")),
                       ("no-report", lambda d: (d / "tune_report.json").unlink()),
                       ("foreign-report", lambda d: (d / "tune_report.json").write_text('{"mine": 1}'))]:
        d = tmp_path / f"tune-{name}"
        shutil.copytree(old, d)
        (d / MARKER).unlink()
        make(d)
        before = snapshot(d)
        with pytest.raises(OutputExistsError, match=r"not an rkpart tune folder .*" + MARKER):
            claim_work_folder(d, kind="tune", legacy=tune_listing, grows=TUNE_GROWS)
        assert snapshot(d) == before
        FUZZ_STATS["cases:writes-legacy"] += 1


@pytest.mark.parametrize("grown", TUNE_GROWS)
def test_tune_folder_with_a_symlinked_run_folder_is_refused(tmp_path: Path, grown: str) -> None:
    """A tune folder rkpart wrote, whose ``plans/`` (or any folder runs add to) was replaced by a
    symlink to a folder of the user's: refused in one line, nothing written there."""
    work = tmp_path / "tune"
    assert claim_work_folder(work, kind="tune", legacy=tune_listing, grows=TUNE_GROWS) == work
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    (work / grown).symlink_to(theirs)
    before = snapshot(theirs)
    with pytest.raises(OutputExistsError, match=f"its {grown}/ is a symlink"):
        claim_work_folder(work, kind="tune", legacy=tune_listing, grows=TUNE_GROWS)
    assert snapshot(theirs) == before
    FUZZ_STATS["cases:writes-legacy"] += 1
