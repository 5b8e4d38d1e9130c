"""The six classes of issue 31 on the commands added since the suite was written: ``estimate``,
``calibrate``, ``compile --precision-spec FILE``, ``partition --inputs FILE.npz`` and ``tune``.

Each case is a real command through the real CLI on the bundled example: planted staging
symlinks (a victim folder hashed before and after), FIFOs, devices and folders where a file is
read, NaN/Inf and huge numbers, spec files of 100 MB (sparse) or nested thousands deep, and a
``.npz`` whose header claims 2^40 elements.  Every one must end in the documented exit code
with one line on stderr and leave nothing behind.
"""

from __future__ import annotations

import io
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.hostile.models import FUZZ_STATS, assert_user_error, cli, siblings, snapshot


@pytest.fixture(scope="module")
def split(plans: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the example's split plan (compile reads its precision spec before building)."""
    out = tmp_path_factory.mktemp("new-cmds") / "plan"
    shutil.copytree(plans["split"][1], out)
    return out


def _inputs(plan_tensors: dict[str, tuple[tuple[int, ...], str]], tmp: Path, edit: str) -> Path:
    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal(shape).astype(dt) for n, (shape, dt) in plan_tensors.items()}
    first = sorted(arrays)[0]
    p = tmp / f"{edit}.npz"
    if edit == "nan":
        arrays[first].flat[0] = np.nan
    elif edit == "inf":
        arrays[first].flat[-1] = -np.inf
    elif edit == "huge-header":
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
        with zipfile.ZipFile(p, "w") as z:
            z.writestr(f"{first}.npy", buf.getvalue() + b"\0" * 16)
        return p
    elif edit == "fifo":
        os.mkfifo(p)
        return p
    elif edit == "folder":
        p.mkdir()
        return p
    elif edit == "dev-zero-link":
        p.symlink_to("/dev/zero")
        return p
    np.savez(p, **arrays)
    return p


def _model_inputs(split: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    from rkpart.plan.plan import load_plan

    plan, _ = load_plan(split)
    return {n: (tuple(plan.tensors[n].shape), plan.tensors[n].dtype) for n in plan.inputs}


#: bad --inputs files -> exit code (folder: click's own check, a usage error)
NPZ_CASES = {"nan": 2, "inf": 2, "huge-header": 2, "fifo": 2, "folder": 2, "dev-zero-link": 2}


@pytest.mark.parametrize("case", list(NPZ_CASES))
@pytest.mark.parametrize("command", ["partition", "calibrate"])
def test_bad_inputs_npz_is_one_line_and_writes_nothing(command: str, case: str, split: Path, example_model: Path,
                                                       tmp_path: Path) -> None:
    npz = _inputs(_model_inputs(split), tmp_path, case)
    out = tmp_path / "out"
    argv: list[object] = (["partition", example_model, "-o", out, "--inputs", npz, "-q"] if command == "partition"
                          else ["calibrate", split, "-o", out, "--inputs", npz, "--samples", "2", "-q"])
    before = snapshot(split)
    r = cli(argv)
    if case == "folder":
        assert_user_error(r, 2, "is a directory")  # click's own check: a usage error, one line too
    else:
        assert_user_error(r, NPZ_CASES[case])
    assert not out.exists() and siblings(out) == []
    assert snapshot(split) == before
    FUZZ_STATS[f"cases:new-{command}"] += 1


def _big(p: Path) -> None:
    with open(p, "wb") as f:  # 100 MB, sparse: no disk is spent on it
        f.truncate(100 << 20)


def _deep_json(p: Path) -> None:
    p.write_text('{"stages": ' + "[" * 5000 + "]" * 5000 + "}")


def _deep_yaml(p: Path) -> None:
    p.write_text("stages: " + "[" * 5000 + "]" * 5000 + "\n")


def _alias_bomb(p: Path) -> None:
    lines = ["a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]"]
    for i, k in enumerate("bcdefgh"):
        prev = "abcdefgh"[i]
        lines.append(f"{k}: &{k} [" + ", ".join([f"*{prev}"] * 9) + "]")
    p.write_text("\n".join(lines) + "\n")


SPEC_FILES: dict[str, Callable[[Path], None]] = {
    "fifo": lambda p: os.mkfifo(p),
    "dev-zero-link": lambda p: p.symlink_to("/dev/zero"),
    "folder": lambda p: p.mkdir(),
    "100MB": _big,
    "deep-json": _deep_json,
    "deep-yaml": _deep_yaml,
    "alias-bomb": _alias_bomb,
    "nan-precision": lambda p: p.write_text("stages: {b00.attn: .nan}\n"),
    "huge-int": lambda p: p.write_text("default: " + "9" * 5000 + "\n"),
    "not-utf8": lambda p: p.write_bytes(b"\xff\xfe" * 100),
}


def _spec_path(case: str, tmp: Path, suffix: str) -> Path:
    p = tmp / f"spec{'.json' if case == 'deep-json' else suffix}"
    SPEC_FILES[case](p)
    return p


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("case", list(SPEC_FILES))
def test_compile_precision_spec_file_is_validated_whole_before_any_build(case: str, split: Path,
                                                                         tmp_path: Path) -> None:
    spec = _spec_path(case, tmp_path, ".yaml")
    before = snapshot(split)
    r = cli(["compile", split, "--toolkit", "2.3.0", "--precision-spec", spec, "-q"])
    if case == "folder":
        assert_user_error(r, 2, "is a directory")  # click's own check: a usage error, one line too
    else:
        assert_user_error(r, 5)  # a spec file: docs/errors.md, code 5
    assert snapshot(split) == before
    FUZZ_STATS["cases:new-compile-precision-spec"] += 1


@pytest.mark.parametrize("case", [c for c in SPEC_FILES if c not in ("deep-yaml", "alias-bomb", "nan-precision")])
def test_estimate_cost_model_file_is_validated_whole(case: str, split: Path, tmp_path: Path) -> None:
    model = _spec_path(case, tmp_path, ".json")
    r = cli(["estimate", split, "--cost-model", model])
    if case == "folder":
        assert_user_error(r, 2, "is a directory")
    else:
        assert_user_error(r, 5)
    FUZZ_STATS["cases:new-estimate"] += 1


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--steps", "10001"], ["--steps", "1e3"],
                                  ["--steps", "nan"], ["--steps", str(10 ** 30)]])
def test_estimate_numbers_out_of_range_are_usage_errors(argv: list[str], split: Path) -> None:
    r = cli(["estimate", split, *argv])
    assert_user_error(r, 2, argv[0], "see 'main estimate -h'")
    FUZZ_STATS["cases:new-estimate"] += 1


def _victim(tmp: Path) -> Path:
    v = tmp / "victim"
    v.mkdir()
    (v / "notes.txt").write_text("the user's notes")
    (v / "calibration.json").write_text("{}")
    return v


STAGING_ATTACKS: dict[str, Callable[[Path, Path], None]] = {
    "staging-symlink": lambda out, v: out.with_name(f".{out.name}.partial").symlink_to(v, target_is_directory=True),
    "staging-file": lambda out, v: out.with_name(f".{out.name}.partial").write_text("mine"),
    "staging-foreign": lambda out, v: shutil.copytree(v, out.with_name(f".{out.name}.partial")),
    "out-symlink": lambda out, v: out.symlink_to(v, target_is_directory=True),
    "out-fifo": lambda out, v: os.mkfifo(out),
}


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("attack", list(STAGING_ATTACKS))
def test_calibrate_never_writes_outside_its_output(attack: str, split: Path, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "cal"
    STAGING_ATTACKS[attack](out, victim)
    staging = out.with_name(f".{out.name}.partial")
    before = (snapshot(victim), snapshot(staging) if staging.is_dir() and not staging.is_symlink() else None)
    r = cli(["calibrate", split, "-o", out, "--steps", "1", "--samples", "2", "--force", "-q"])
    if attack == "out-fifo":
        assert r.exit_code in (2, 6) and "Traceback" not in r.output  # click or rkpart: not a folder
    else:
        assert_user_error(r, 6)
    after = (snapshot(victim), snapshot(staging) if staging.is_dir() and not staging.is_symlink() else None)
    assert after == before
    FUZZ_STATS["cases:new-calibrate"] += 1


@pytest.mark.parametrize("argv", [["--budget-mib", "nan"], ["--budget-mib", "inf"], ["--budget-mib", "-1"],
                                  ["--threads", "100000"], ["--rounds", "0"], ["--steps", "-1"],
                                  ["--verify-rounds", "nan"]])
def test_tune_refuses_absurd_numbers_before_writing(argv: list[str], example_model: Path, tmp_path: Path) -> None:
    r = cli(["tune", example_model, "-o", tmp_path / "work", "-q", *argv])
    assert_user_error(r, 2, argv[0])
    assert not (tmp_path / "work").exists()
    FUZZ_STATS["cases:new-tune"] += 1


@pytest.mark.parametrize("make", ["fifo", "file", "dev-null-link"])
def test_tune_work_folder_is_never_a_file_fifo_or_device(make: str, example_model: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    if make == "fifo":
        os.mkfifo(work)
    elif make == "file":
        work.write_text("mine")
    else:
        work.symlink_to("/dev/null")
    r = cli(["tune", example_model, "-o", work, "-q"])
    assert r.exit_code in (2, 6) and "Traceback" not in r.output
    assert os.path.lexists(work) and (make != "file" or work.read_text() == "mine")
    FUZZ_STATS["cases:new-tune"] += 1
