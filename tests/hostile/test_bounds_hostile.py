"""Counts, seconds and recorded figures have bounds a user could mean (issue 31, the red team's
second pass): what was not covered yet and broke.

- ``--steps 10**30`` (calibrate, drift) overflowed NumPy's schedule with a traceback; tune,
  profile and partition ran on for ever with huge ``--steps`` / ``--rounds``; ``profile
  --interval nan`` was taken, ``inf`` / ``1e10`` crashed the memory sampler with a traceback.
- plan.json and profile records took integers of any size: a plan claiming 1e308 weight bytes was
  estimated and reported as it said (``estimate`` printed a 300-digit latency).
- the bundle's runner: ``--steps 10**30`` and ``--seed -1`` were tracebacks, ``--guidance nan``
  wrote a NaN latent and exited 0, and ``--latent-out`` wrote through a planted
  ``.<name>.partial`` symlink and put a regular file in place of a FIFO or device.

Real commands (``CliRunner``) on the bundled example; the runner is a real bundle's own runner.py.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.hostile.models import FUZZ_STATS, assert_option_refused, assert_user_error, cli, fast_sample, snapshot

HUGE = str(10**30)
#: the bound rkpart.io.MAX_JSON_INT documents (docs/plan.md)
MAX_JSON_INT = 2**53


# -- options: counts and seconds ---------------------------------------------------------------

OPTION_CASES: list[tuple[str, list[str]]] = [
    *((f"{c}-steps-{n}", [c, "{plan}", "--steps", v, *extra])
      for c, extra in (("calibrate", ["-o", "{tmp}/cal"]), ("drift", ["--toolkit", "2.5.0"]),
                       ("profile", ["-o", "{tmp}/p.jsonl"]), ("estimate", []))
      for n, v in (("huge", HUGE), ("10001", "10001"))),
    ("tune-steps-huge", ["tune", "{model}", "--steps", HUGE, "-o", "{tmp}/t"]),
    ("tune-rounds-huge", ["tune", "{model}", "--rounds", HUGE, "-o", "{tmp}/t"]),
    ("tune-verify-rounds-huge", ["tune", "{model}", "--verify-rounds", HUGE, "-o", "{tmp}/t"]),
    ("partition-auto-steps-huge", ["partition", "{model}", "-s", "auto", "--steps", HUGE, "-o", "{tmp}/a"]),
    *((f"profile-{o}-huge", ["profile", "{plan}", o, HUGE, "-o", "{tmp}/p.jsonl"])
      for o in ("--rounds", "--warmup", "--infer-repeat")),
    *((f"profile-interval-{v}", ["profile", "{plan}", "--interval", v, "-o", "{tmp}/p.jsonl"])
      for v in ("nan", "inf", "1e10", "-1")),
    ("fit-folds-10001", ["fit", "{plan}/plan.json", "--folds", "10001", "-o", "{tmp}/m.json"]),
    ("drift-sim-memory-huge", ["drift", "{plan}", "--toolkit", "2.5.0", "--sim-memory", HUGE]),
    ("partition-external-threshold-huge", ["partition", "{model}", "--external-threshold", HUGE, "-o", "{tmp}/s"]),
]


@pytest.mark.parametrize("case", [c[0] for c in OPTION_CASES])
def test_counts_and_seconds_out_of_range_are_refused_before_any_work(case: str, split_plan: Path,
                                                                     example_model: Path, tmp_path: Path) -> None:
    args = [a.format(plan=split_plan, tmp=tmp_path, model=example_model) for a in dict(OPTION_CASES)[case]]
    before = snapshot(split_plan)
    assert_option_refused(args, tmp_path)
    assert snapshot(split_plan) == before
    FUZZ_STATS["cases:bounds-options"] += 1


# -- plan.json and profile records: integers no file can mean -----------------------------------

def _stage(i: int, key: str) -> Callable[[dict[str, Any], Any], None]:
    return lambda d, v: d["stages"][i].__setitem__(key, v)


PLAN_FIELDS: dict[str, Callable[[dict[str, Any], Any], None]] = {
    "weight_bytes": _stage(1, "weight_bytes"), "io_bytes": _stage(1, "io_bytes"),
    "num_nodes": _stage(1, "num_nodes"), "block": _stage(1, "block"),
    "model-opset": lambda d, v: d["model"].__setitem__("opset", v),
    "model-nodes": lambda d, v: d["model"].__setitem__("nodes", v),
}
HUGE_NUMBERS = {"1e308": 1e308, "10**30": 10**30, "2**53+1": MAX_JSON_INT + 1}


@pytest.mark.parametrize("value", fast_sample(list(HUGE_NUMBERS), len(HUGE_NUMBERS)))
@pytest.mark.parametrize("field", list(PLAN_FIELDS))
def test_a_plan_claiming_absurd_figures_is_refused(field: str, value: str, split_plan: Path, tmp_path: Path) -> None:
    folder = tmp_path / "plan"
    shutil.copytree(split_plan, folder)
    doc = json.loads((folder / "plan.json").read_text())
    PLAN_FIELDS[field](doc, HUGE_NUMBERS[value])
    (folder / "plan.json").write_text(json.dumps(doc))
    before = snapshot(folder)
    assert_user_error(cli(["estimate", folder]), 5, "invalid plan")
    assert_user_error(cli(["report", folder, "-o", tmp_path / "r.html", "-q"]), 5, "invalid plan")
    assert snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]
    FUZZ_STATS["cases:bounds-plan"] += 2


def test_the_largest_figure_a_plan_may_hold_is_still_read(split_plan: Path, tmp_path: Path) -> None:
    from rkpart.io import MAX_JSON_INT as bound

    assert bound == MAX_JSON_INT
    folder = tmp_path / "plan"
    shutil.copytree(split_plan, folder)
    doc = json.loads((folder / "plan.json").read_text())
    doc["model"]["nodes"] = MAX_JSON_INT
    (folder / "plan.json").write_text(json.dumps(doc))
    assert cli(["estimate", folder]).exit_code == 0


PROFILE_FIELDS: dict[str, tuple[str, ...]] = {
    "pss_peak_kib": ("memory", "pss_peak_kib"), "device_pss_peak_kib": ("memory", "device_pss_peak_kib"),
    "round": ("round",), "stage-weight_bytes": ("stage", "weight_bytes"),
}


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("value", ["1e308", "10**30"])
@pytest.mark.parametrize("field", list(PROFILE_FIELDS))
def test_a_profile_claiming_absurd_figures_is_refused(field: str, value: str, split_plan: Path, profile: Path,
                                                      tmp_path: Path) -> None:
    path = PROFILE_FIELDS[field]
    recs = [json.loads(ln) for ln in profile.read_text().splitlines() if ln.strip()]
    for rec in recs:
        d = rec
        for k in path[:-1]:
            d = d.get(k) if isinstance(d, dict) else None
        if isinstance(d, dict) and path[-1] in d:
            d[path[-1]] = HUGE_NUMBERS[value]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert_user_error(cli(["profile", "--show", bad]), 5)
    assert_user_error(cli(["report", split_plan, bad, "-o", tmp_path / "r.html", "-q"]), 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
    FUZZ_STATS["cases:bounds-profile"] += 2


# -- the bundle's runner -----------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _no_standin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RKPART_RUNNER_NPU_STANDIN", raising=False)


def _runner(mod: ModuleType, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = mod.main([*args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("runner: error: "), lines
    return rc, lines[0]


RUNNER_CASES: dict[str, list[str]] = {
    "steps-huge": ["--steps", HUGE], "steps-10001": ["--steps", "10001"],
    "seed-negative": ["--steps", "1", "--seed", "-1"],
    "guidance-nan": ["--steps", "1", "--guidance", "nan"], "guidance-inf": ["--steps", "1", "--guidance", "inf"],
    "shift-inf": ["--steps", "1", "--shift", "inf"], "passes-huge": ["--passes", HUGE],
}


@pytest.mark.parametrize("case", list(RUNNER_CASES))
def test_runner_refuses_absurd_numbers_in_one_line(case: str, host_bundle: Path, runner_mod: ModuleType,
                                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    latent = tmp_path / "latent.npy"
    t0 = time.monotonic()
    rc, msg = _runner(runner_mod, capsys, "--bundle", str(host_bundle), *RUNNER_CASES[case],
                      "--latent-out", str(latent))
    assert rc == 2, msg
    assert time.monotonic() - t0 < 30
    assert not latent.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    FUZZ_STATS["cases:bounds-runner"] += 1


def test_runner_never_writes_a_nan_latent_as_a_pass(host_bundle: Path, runner_mod: ModuleType, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    # conditioning at float32's largest value overflows the stages (a 1e308 --guidance did that
    # before the runner bounded it to [-1000, 1000])
    m = json.loads((host_bundle / "manifest.json").read_text())
    ctx = {t: np.full(m["tensors"][t]["shape"], np.finfo(np.float32).max, dtype=np.float32)
           for t in m["denoise"]["context"]}
    cond = tmp_path / "cond" / "cond.npz"
    cond.parent.mkdir()
    np.savez(cond, **ctx)
    latent = tmp_path / "latent.npy"
    rc, msg = _runner(runner_mod, capsys, "--bundle", str(host_bundle), "--steps", "2", "--cond", str(cond),
                      "--latent-out", str(latent))
    assert rc == 8 and "NaN/Inf" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cond"]


def _planted_partial(tmp: Path, victim: Path) -> Path:
    (tmp / ".latent.npy.partial").symlink_to(victim)
    return tmp / "latent.npy"


def _fifo(tmp: Path, victim: Path) -> Path:
    os.mkfifo(tmp / "latent.npy")
    return tmp / "latent.npy"


def _symlink(tmp: Path, victim: Path) -> Path:
    (tmp / "latent.npy").symlink_to(victim)
    return tmp / "latent.npy"


LATENT_ATTACKS: dict[str, Callable[[Path, Path], Path]] = {
    "planted-partial-symlink": _planted_partial, "fifo": _fifo, "symlink": _symlink,
}


@pytest.mark.parametrize("attack", list(LATENT_ATTACKS))
def test_runner_latent_out_never_writes_through_or_replaces_what_is_not_its_file(
        attack: str, host_bundle: Path, runner_mod: ModuleType, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    victim = victim_dir / "keep.txt"
    victim.write_text("the user's file\n")
    work = tmp_path / "work"
    work.mkdir()
    out = LATENT_ATTACKS[attack](work, victim)
    kinds = {p.name: (p.is_symlink(), p.is_fifo()) for p in work.iterdir()}
    rc = runner_mod.main(["--bundle", str(host_bundle), "--steps", "1", "--latent-out", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert victim.read_text() == "the user's file\n" and sorted(p.name for p in victim_dir.iterdir()) == ["keep.txt"]
    if attack == "planted-partial-symlink":  # a fresh temp file of its own: the run succeeds
        assert rc == 0 and out.is_file() and not out.is_symlink()
        assert (work / ".latent.npy.partial").is_symlink()
    else:  # refused before the run; the FIFO / symlink is still what it was
        assert rc == 2 and len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
        assert {p.name: (p.is_symlink(), p.is_fifo()) for p in work.iterdir()} == kinds
    FUZZ_STATS["cases:bounds-runner"] += 1
