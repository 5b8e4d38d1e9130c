"""Every command that writes is as safe as ``partition`` (issue 31): planted staging symlinks,
foreign folders under ``--force``, symlinked or special destinations, other rkpart outputs, and
user files added to rkpart's own outputs.  Each case hashes a victim folder before and after,
and checks the documented exit code (6), one line on stderr and nothing left behind.

Real commands through the real CLI (``CliRunner``) on the bundled example; the bundle is of a
plan with every op on the host, so no toolkit is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rkpart.output import MARKER
from rkpart.pipeline import partition
from tests.hostile.models import FUZZ_STATS, assert_user_error, cli, siblings, snapshot

HOST_SPEC = "version: 1\nrest: host\nstages:\n  - id: b00\n    device: host\n    blocks: [0]\n"


@pytest.fixture(scope="module")
def host_plan(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> Path:
    root = tmp_path_factory.mktemp("host-plan")
    (root / "spec.yaml").write_text(HOST_SPEC)
    partition(example_model, root / "plan", "custom", spec=root / "spec.yaml")
    return root / "plan"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, host_plan: Path) -> dict[str, Path]:
    """One real output of each kind, to copy: a bundle, a report (page + assets)."""
    root = tmp_path_factory.mktemp("made")
    r = cli(["bundle", host_plan, "-o", root / "bundle", "-q"])
    assert r.exit_code == 0, r.output
    r = cli(["report", host_plan, "-o", root / "report.html", "-q"])
    assert r.exit_code == 0, r.output
    return {"bundle": root / "bundle", "report": root / "report.html", "assets": root / "report_files"}


def _victim(tmp: Path) -> Path:
    v = tmp / "victim"
    (v / "stages").mkdir(parents=True)
    (v / "rknn").mkdir()
    (v / "notes.txt").write_text("the user's notes")
    (v / "manifest.json").write_text('{"mine": true}')
    (v / "stages" / "keep.onnx").write_bytes(b"weights")
    (v / "rknn" / "keep.rknn").write_bytes(b"model")
    (v / "accuracy.png").write_bytes(b"png")
    return v


# -- folder outputs: bundle -o O, report's <stem>_files ------------------------------------------

#: an attack prepares ``out`` (and around it) given the victim; returns extra CLI args (``--force``)
Attack = Callable[[Path, Path, dict[str, Path], str], list[str]]


def _staging_symlink(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    out.with_name(f".{out.name}.partial").symlink_to(victim, target_is_directory=True)
    return []


def _out_symlink(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    out.symlink_to(victim, target_is_directory=True)
    return ["--force"]


def _out_is_victim(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    shutil.copytree(victim, out)
    return ["--force"]


def _foreign_with_manifest(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    """A folder holding a file named like rkpart's (the old test: a manifest.json), not rkpart's."""
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"format": "rkpart-bundle", "version": 1}))
    (out / "stages.csv").write_text("mine")
    (out / "data.bin").write_bytes(b"mine")
    return ["--force"]


def _real_plus_note(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    shutil.copytree(made[kind], out, symlinks=True)
    (out / "NOTE.txt").write_text("a note the user added")
    return ["--force"]


def _real_plus_nested_note(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    shutil.copytree(made[kind], out, symlinks=True)
    (out / "sub").mkdir()
    (out / "sub" / "mine.txt").write_text("mine")
    return ["--force"]


def _other_kind(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    other = "assets" if kind == "bundle" else "bundle"
    shutil.copytree(made[other], out, symlinks=True)
    return ["--force"]


def _forged_marker_symlink(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    out.mkdir()
    (out / "user.txt").write_text("mine")
    (out / MARKER).symlink_to(made[kind] / MARKER)
    return ["--force"]


def _marker_lists_nothing_real(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    """A marker of the right kind, but the folder holds files it does not list."""
    shutil.copytree(victim, out)
    shutil.copyfile(made[kind] / MARKER, out / MARKER)
    return ["--force"]


def _staging_foreign(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    shutil.copytree(victim, out.with_name(f".{out.name}.partial"))
    return []


def _staging_other_kind(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    other = "assets" if kind == "bundle" else "bundle"
    shutil.copytree(made[other], out.with_name(f".{out.name}.partial"), symlinks=True)
    return []


def _staging_file(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    out.with_name(f".{out.name}.partial").write_text("mine")
    return []


def _out_file(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    out.write_text("mine")
    return ["--force"]


def _no_force(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    shutil.copytree(made[kind], out, symlinks=True)
    return []


def _old_symlink(out: Path, victim: Path, made: dict[str, Path], kind: str) -> list[str]:
    """``.<out>.old`` (the fallback swap's name) planted as a symlink to the victim."""
    shutil.copytree(made[kind], out, symlinks=True)
    out.with_name(f".{out.name}.old").symlink_to(victim, target_is_directory=True)
    return ["--force"]


FOLDER_ATTACKS: list[tuple[str, Attack, int]] = [
    ("staging-symlink", _staging_symlink, 6), ("out-symlink", _out_symlink, 6),
    ("out-is-foreign", _out_is_victim, 6), ("foreign-with-manifest", _foreign_with_manifest, 6),
    ("real-plus-note", _real_plus_note, 6), ("real-plus-nested-note", _real_plus_nested_note, 6),
    ("other-kind", _other_kind, 6), ("forged-marker-symlink", _forged_marker_symlink, 6),
    ("marker-of-another-folder", _marker_lists_nothing_real, 6), ("staging-foreign", _staging_foreign, 6),
    ("staging-other-kind", _staging_other_kind, 6), ("staging-file", _staging_file, 6),
    ("out-file", _out_file, 6), ("no-force", _no_force, 6),
    ("old-symlink", _old_symlink, 0),  # replaced safely: the planted link is removed, never followed
]


def _bundle_cmd(host_plan: Path, out: Path) -> list[object]:
    return ["bundle", host_plan, "-o", out, "-q"]


def _report_cmd(host_plan: Path, out: Path) -> list[object]:
    return ["report", host_plan, "-o", out.with_name(out.name[: -len("_files")] + ".html"), "-q"]


COMMANDS: dict[str, tuple[str, Callable[[Path, Path], list[object]], str]] = {
    # command -> (kind of ``made`` it writes, argv, the folder the attacks aim at)
    "bundle": ("bundle", _bundle_cmd, "board"),
    "report": ("assets", _report_cmd, "page_files"),
}


def _all_hashes(*folders: Path) -> dict[str, object]:
    return {str(f): snapshot(f) for f in folders}


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("attack", [a[0] for a in FOLDER_ATTACKS])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_folder_outputs_never_write_outside_their_target(command: str, attack: str, host_plan: Path,
                                                         made: dict[str, Path], tmp_path: Path) -> None:
    kind, argv, name = COMMANDS[command]
    victim = _victim(tmp_path)
    out = tmp_path / name
    fn, code = next((f, c) for a, f, c in FOLDER_ATTACKS if a == attack)
    extra = fn(out, victim, made, kind)
    staging = out.with_name(f".{out.name}.partial")
    before = _all_hashes(victim, host_plan, made[kind])
    staged_before = snapshot(staging) if staging.is_dir() and not staging.is_symlink() else None
    out_before = snapshot(out) if out.is_dir() and not out.is_symlink() else None
    r = cli([*argv(host_plan, out), *extra])
    assert _all_hashes(victim, host_plan, made[kind]) == before, "a write outside the target"
    if command == "bundle" and attack == "out-file":
        # -o's click type refuses a file before rkpart runs: a usage error, one line and exit 2 like the rest
        assert_user_error(r, 2, "is a file")
    elif code:
        assert_user_error(r, code)
    if code:
        # what was there is untouched: a refused output, a foreign staging folder
        assert (snapshot(out) if out.is_dir() and not out.is_symlink() else None) == out_before
        assert (snapshot(staging) if staging.is_dir() and not staging.is_symlink() else None) == staged_before
    else:
        assert r.exit_code == 0, r.output
        assert (out / MARKER).is_file() and not out.is_symlink()
        assert siblings(out) == []  # the planted .<out>.old link removed, staging swapped in
    FUZZ_STATS[f"cases:writes-{command}"] += 1


@pytest.mark.parametrize("command", list(COMMANDS))
def test_force_replaces_rkpart_s_own_output_and_leaves_nothing_behind(command: str, host_plan: Path,
                                                                      made: dict[str, Path], tmp_path: Path) -> None:
    kind, argv, name = COMMANDS[command]
    out = tmp_path / name
    shutil.copytree(made[kind], out, symlinks=True)
    (out / "stale.csv").unlink(missing_ok=True)
    page = made["report"]
    if command == "report":
        shutil.copyfile(page, out.with_name("page.html"))
    r = cli([*argv(host_plan, out), "--force"])
    assert r.exit_code == 0, r.output
    assert snapshot(out) == snapshot(made[kind])  # same input, byte-identical output
    assert siblings(out) == []


# -- the report page: a regular file rkpart wrote, or nothing ----------------------------------

PAGE_ATTACKS: list[tuple[str, Callable[[Path, Path, dict[str, Path]], None]]] = [
    ("symlink-to-victim", lambda p, v, m: p.symlink_to(v / "notes.txt")),
    ("fifo", lambda p, v, m: os.mkfifo(p)),
    ("users-page", lambda p, v, m: p.write_text("<html>my own page</html>")),
    ("dangling-symlink", lambda p, v, m: p.symlink_to(v / "nothing-here.html")),
]


@pytest.mark.parametrize("attack", [a[0] for a in PAGE_ATTACKS])
def test_report_page_is_only_ever_a_regular_file_rkpart_wrote(attack: str, host_plan: Path, made: dict[str, Path],
                                                              tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    page = tmp_path / "page.html"
    dict(PAGE_ATTACKS)[attack](page, victim, made)
    before = snapshot(victim)
    r = cli(["report", host_plan, "-o", page, "--force", "-q"])
    assert_user_error(r, 6)
    assert snapshot(victim) == before
    assert not (tmp_path / "page_files").exists()
    FUZZ_STATS["cases:writes-report"] += 1


# -- example DEST: regular files only ----------------------------------------------------------


def _chardev(p: Path) -> None:
    os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null


def _sock(p: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()


EXAMPLE_ATTACKS: list[tuple[str, Callable[[Path, Path], None], int]] = [
    ("fifo", lambda p, v: os.mkfifo(p), 6),
    ("socket", lambda p, v: _sock(p), 6),
    ("symlink-to-victim", lambda p, v: p.symlink_to(v / "notes.txt"), 6),
    ("dangling-symlink", lambda p, v: p.symlink_to(v / "nothing"), 6),
    ("existing-no-force", lambda p, v: p.write_text("mine"), 6),
    ("folder-named-like-the-file", lambda p, v: (p.parent / "into").mkdir() or (p.parent / "into" /
                                                                              "anima_tiny.onnx").mkdir(), 6),
]
if os.geteuid() == 0:
    EXAMPLE_ATTACKS.append(("char-device", lambda p, v: _chardev(p), 6))


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("attack", [a[0] for a in EXAMPLE_ATTACKS])
def test_example_never_replaces_a_device_fifo_or_symlink(attack: str, force: bool, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    dest = tmp_path / "dest.onnx"
    fn, code = next((f, c) for a, f, c in EXAMPLE_ATTACKS if a == attack)
    fn(dest, victim)
    if attack == "existing-no-force" and force:
        pytest.skip("with --force a regular file is replaced: the positive control below")
    arg = str(tmp_path / "into") + "/" if attack.startswith("folder") else str(dest)
    kind_before = os.lstat(dest).st_mode if os.path.lexists(dest) else None
    before = snapshot(victim)
    r = cli(["example", arg, *(["--force"] if force else [])])
    assert_user_error(r, code)
    assert snapshot(victim) == before
    if kind_before is not None:
        assert os.lstat(dest).st_mode == kind_before  # still the FIFO, socket, device or link
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    FUZZ_STATS["cases:writes-example"] += 1


def test_example_force_replaces_only_the_example(tmp_path: Path) -> None:
    """issue 51: ``--force`` replaces a file rkpart wrote (the example's own bytes), never a user's."""
    from rkpart.cli_args import bundled_example

    dest = tmp_path / "m.onnx"
    dest.write_text("old")
    r = cli(["example", dest, "--force"])
    assert_user_error(r, 6, "rkpart did not write it")
    assert dest.read_text() == "old"
    dest.unlink()
    assert cli(["example", dest]).exit_code == 0
    r = cli(["example", dest, "--force"])
    assert r.exit_code == 0, r.output
    assert dest.read_bytes() == bundled_example().read_bytes()


# -- tune's work folder, fit's and drift's files --------------------------------------------------


def _tune_attack(kind: str, work: Path, victim: Path, made: dict[str, Path]) -> None:
    if kind == "symlink":
        work.symlink_to(victim, target_is_directory=True)
    elif kind == "foreign":
        shutil.copytree(victim, work)
    elif kind == "other-kind":
        shutil.copytree(made["bundle"], work, symlinks=True)


@pytest.mark.parametrize("kind", ["symlink", "foreign", "other-kind"])
def test_tune_writes_only_into_its_own_work_folder(kind: str, example_model: Path, made: dict[str, Path],
                                                   tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    work = tmp_path / "tune"
    _tune_attack(kind, work, victim, made)
    before = snapshot(victim)
    r = cli(["tune", example_model, "-o", work, "--rounds", "1", "--verify-rounds", "1", "-q"])
    assert_user_error(r, 6)
    assert snapshot(victim) == before
    FUZZ_STATS["cases:writes-tune"] += 1


FILE_DEST_ATTACKS: list[tuple[str, Callable[[Path, Path], None]]] = [
    ("symlink-to-victim", lambda p, v: p.symlink_to(v / "notes.txt")),
    ("fifo", lambda p, v: os.mkfifo(p)),
    ("socket", lambda p, v: _sock(p)),
]
if os.geteuid() == 0:
    FILE_DEST_ATTACKS.append(("char-device", lambda p, v: _chardev(p)))


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory: pytest.TempPathFactory, host_plan: Path) -> Path:
    out = tmp_path_factory.mktemp("prof") / "p.jsonl"
    r = cli(["profile", host_plan, "--rounds", "1", "--threads", "1", "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("attack", [a[0] for a in FILE_DEST_ATTACKS])
def test_fit_output_is_a_regular_file_only(attack: str, profile_file: Path, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    dest = tmp_path / "model.json"
    dict(FILE_DEST_ATTACKS)[attack](dest, victim)
    mode = os.lstat(dest).st_mode
    before = snapshot(victim)
    r = cli(["fit", profile_file, "-o", dest])
    assert_user_error(r, 6)
    assert snapshot(victim) == before and os.lstat(dest).st_mode == mode
    FUZZ_STATS["cases:writes-fit"] += 1


@pytest.mark.parametrize("attack", [a[0] for a in FILE_DEST_ATTACKS])
def test_drift_accuracy_file_is_checked_before_the_run(attack: str, host_plan: Path, tmp_path: Path) -> None:
    """Refused before the simulator starts (a toolkit that is not installed is never asked for)."""
    victim = _victim(tmp_path)
    dest = tmp_path / "acc.json"
    dict(FILE_DEST_ATTACKS)[attack](dest, victim)
    before = snapshot(victim)
    r = cli(["drift", host_plan, "--toolkit", "9.9.9", "--accuracy", dest, "-q"])
    assert_user_error(r, 6)
    assert snapshot(victim) == before
    FUZZ_STATS["cases:writes-drift"] += 1


# -- cache prune: only the cache's own entries --------------------------------------------------

KEY = "ab" * 32


def _entry(objects: Path, key: str, *, rknn: bytes = b"rknn-bytes", meta: object = None) -> None:
    (objects / f"{key}.rknn").write_bytes(rknn)
    doc = meta if meta is not None else {"toolkit": "2.3.0", "target": "rk3588", "size_bytes": len(rknn),
                                         "sha256": "cd" * 32}
    (objects / f"{key}.json").write_text(json.dumps(doc))


def _deep(n: int) -> str:
    return "[" * n + "]" * n


JUNK: list[tuple[str, Callable[[Path, Path], None]]] = [
    ("short-key", lambda o, v: _entry(o, "X")),
    ("upper-hex-key", lambda o, v: _entry(o, "AB" * 32)),
    ("key-63", lambda o, v: _entry(o, "a" * 63)),
    ("sidecar-not-schema", lambda o, v: _entry(o, "01" * 32, meta={"hello": "world"})),
    ("sidecar-wrong-size", lambda o, v: _entry(o, "02" * 32, meta={"toolkit": "2.3.0", "target": "rk3588",
                                                                   "size_bytes": 1, "sha256": "cd" * 32})),
    ("sidecar-deep", lambda o, v: (o / f"{'03' * 32}.json").write_text(_deep(5000))
     or (o / f"{'03' * 32}.rknn").write_bytes(b"x")),
    ("sidecar-digits", lambda o, v: (o / f"{'04' * 32}.json").write_text('{"size_bytes": ' + "9" * 5000 + "}")
     or (o / f"{'04' * 32}.rknn").write_bytes(b"x")),
    ("rknn-symlink-to-victim", lambda o, v: _entry(o, "05" * 32) or (o / f"{'05' * 32}.rknn").unlink()
     or (o / f"{'05' * 32}.rknn").symlink_to(v / "notes.txt")),
    ("sidecar-symlink-devzero", lambda o, v: (o / f"{'06' * 32}.json").symlink_to("/dev/zero")
     or (o / f"{'06' * 32}.rknn").write_bytes(b"x")),
    ("sidecar-fifo", lambda o, v: os.mkfifo(o / f"{'07' * 32}.json") or (o / f"{'07' * 32}.rknn").write_bytes(b"x")),
    ("failure-not-schema", lambda o, v: (o / f"{'08' * 32}.fail.json").write_text('{"x": 1}')),
    ("user-file", lambda o, v: (o / "README.json").write_text("{}")),
]


def _cache(tmp: Path) -> tuple[Path, Path]:
    root = tmp / "cache"
    objects = root / "objects"
    objects.mkdir(parents=True)
    _entry(objects, KEY)
    return root, objects


@pytest.mark.parametrize("junk", [j[0] for j in JUNK])
def test_cache_prune_touches_only_its_own_entries(junk: str, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    root, objects = _cache(tmp_path)
    dict(JUNK)[junk](objects, victim)
    theirs = {p.name: os.lstat(p).st_mode for p in objects.iterdir() if not p.name.startswith(KEY)}
    before = snapshot(victim)
    # in a thread with a timeout: a FIFO that blocked an open would hang the test, not fail it
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(cli(["cache", "info", "--cache-dir", root, "--json"])),
                         daemon=True)
    t.start()
    t.join(timeout=30)
    assert done, "cache info blocked"
    assert done[0].exit_code == 0, done[0].output
    assert json.loads(done[0].stdout)["entries"] == 1  # only the real entry counts
    r = cli(["cache", "prune", "--all", "--cache-dir", root])
    assert r.exit_code == 0, r.output
    assert not (objects / f"{KEY}.json").exists() and not (objects / f"{KEY}.rknn").exists()
    assert {p.name: os.lstat(p).st_mode for p in objects.iterdir()} == theirs  # not one of theirs removed
    assert snapshot(victim) == before
    FUZZ_STATS["cases:writes-cache"] += 1


def test_cache_prune_never_follows_a_symlinked_objects_folder(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    _entry(victim / "rknn", KEY)  # entries that look like the cache's, inside the victim
    root = tmp_path / "cache"
    root.mkdir()
    (root / "objects").symlink_to(victim / "rknn", target_is_directory=True)
    before = snapshot(victim)
    for args in (["prune", "--all"], ["info"]):
        r = cli(["cache", *args, "--cache-dir", root])
        assert_user_error(r, 2, "symlink")
    assert snapshot(victim) == before
    FUZZ_STATS["cases:writes-cache"] += 2


@pytest.mark.parametrize("command", ["profile", "run"])
@pytest.mark.parametrize("attack", [a[0] for a in FILE_DEST_ATTACKS])
def test_profile_and_run_outputs_are_regular_files_only(command: str, attack: str, host_plan: Path,
                                                        tmp_path: Path) -> None:
    """Checked before anything runs (``profile -o``, ``run --save-outputs``)."""
    victim = _victim(tmp_path)
    dest = tmp_path / "out.bin"
    dict(FILE_DEST_ATTACKS)[attack](dest, victim)
    mode = os.lstat(dest).st_mode
    before = snapshot(victim)
    args = (["profile", host_plan, "--rounds", "1", "-o", dest, "-q"] if command == "profile"
            else ["run", host_plan, "--save-outputs", dest, "-q"])
    r = cli(args)
    assert_user_error(r, 6)
    assert snapshot(victim) == before and os.lstat(dest).st_mode == mode
    FUZZ_STATS[f"cases:writes-{command}"] += 1


@pytest.mark.parametrize("fault", ["interrupt", "disk-full"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_failed_write_leaves_the_previous_output_and_nothing_else(command: str, fault: str, host_plan: Path,
                                                                   made: dict[str, Path], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """FAKE (fault injection only): Ctrl-C or ENOSPC just before the staging folder is swapped in."""
    import errno

    import rkpart.output as output

    kind, argv, name = COMMANDS[command]
    out = tmp_path / name
    shutil.copytree(made[kind], out, symlinks=True)
    if command == "report":
        shutil.copyfile(made["report"], tmp_path / "page.html")
    before = snapshot(tmp_path)
    real = output.write_marker

    def failing(folder: Path, k: str, *, complete: bool = True) -> None:
        if complete:
            if fault == "interrupt":
                raise KeyboardInterrupt
            raise OSError(errno.ENOSPC, "No space left on device", str(folder))
        real(folder, k, complete=complete)

    monkeypatch.setattr(output, "write_marker", failing)
    r = cli([*argv(host_plan, out), "--force"])
    if fault == "interrupt":
        assert r.exit_code == 130 and "Traceback" not in r.output
    else:
        assert_user_error(r, 10, "no space left")
    assert snapshot(tmp_path) == before  # the previous output, byte for byte; no staging folder
    FUZZ_STATS[f"cases:writes-{command}"] += 1


@pytest.fixture(scope="module")
def npu_plan(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> Path:
    out = tmp_path_factory.mktemp("calib-plan") / "split"
    partition(example_model, out, "split")
    return out


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("attack", ["staging-foreign", "staging-symlink", "out-is-foreign", "other-kind"])
def test_calibrate_writes_only_its_own_folder(attack: str, npu_plan: Path, made: dict[str, Path],
                                              tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "calib"
    fn = {"staging-foreign": _staging_foreign, "staging-symlink": _staging_symlink,
          "out-is-foreign": _out_is_victim, "other-kind": _other_kind}[attack]
    extra = fn(out, victim, made, "bundle")
    before = snapshot(tmp_path)
    r = cli(["calibrate", npu_plan, "-o", out, "--steps", "1", "--samples", "2", "-q", *extra])
    assert_user_error(r, 6)
    assert snapshot(tmp_path) == before  # the victim, the planted folders: untouched
    FUZZ_STATS["cases:writes-calibrate"] += 1
