"""Profile files are read as a stream, bounded, and every line is judged (issue 31).

``rkpart report`` on a 110 000-record profile once passed 5.7 GB RSS at 300 s.  The readers
(:func:`rkpart.profile.records.iter_jsonl`) now read a line at a time within a size limit,
validate each distinct run header and stage identity once, and skip the schema only for a
line that looks to it exactly like one already validated.  These tests grow a real profile
(:mod:`tests.hostile.bigprofile`) and check that a look-alike line that is *not* valid is
still refused, that the limits hold, and (slow) that ``report``, ``fit`` and
``profile --show --against`` on a big profile stay within loose time and memory bounds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rkpart.errors import SpecError
from rkpart.profile import records as rec
from tests.hostile.bigprofile import grow_profile
from tests.hostile.models import FUZZ_STATS, assert_user_error, cli

# outside the fast tier: every case reads a profile grown to tens of MiB (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_profile(tmp_path_factory: pytest.TempPathFactory, plans: dict) -> Path:
    out = tmp_path_factory.mktemp("big") / "p.jsonl"
    r = cli(["profile", plans["split"][1], "--rounds", "2", "--threads", "1", "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def grown(real_profile: Path) -> Path:
    out = real_profile.with_name("grown.jsonl")
    grow_profile(real_profile, out, 600)
    return out


def _lines(p: Path) -> list[str]:
    return p.read_text().splitlines()


def _with_line(src: Path, dst: Path, index: int, edit) -> Path:  # type: ignore[no-untyped-def]
    lines = _lines(src)
    r = json.loads(lines[index])
    edit(r)
    lines[index] = json.dumps(r, sort_keys=True, separators=(",", ":"))
    dst.write_text("\n".join(lines) + "\n")
    return dst


def test_the_grown_profile_reads_whole_and_shares_repeated_fields(grown: Path) -> None:
    recs = rec.read_jsonl(grown)
    assert len(recs) == len(_lines(grown))
    stages = [r for r in recs if r["record"] == "stage"]
    # one object per distinct header and stage identity, not one per line
    assert len({id(r["env"]) for r in recs if "env" in r}) == 1
    assert len({id(r["stage"]) for r in stages}) == len({r["stage"]["id"] for r in stages})


def _set(path: str, value: object):  # type: ignore[no-untyped-def]
    keys = path.split(".")

    def edit(r: dict) -> None:
        for k in keys[:-1]:
            r = r[k]
        r[keys[-1]] = value
    return edit


#: edits of one stage line deep in the grown profile that the schema refuses; each looks like
#: its neighbours except in the one value the signature has to tell apart
LATE_BAD_LINES = [
    ("negative-time", _set("timings.infer_s", -0.5)),
    ("zero-round-to-negative", _set("round", -1)),
    ("string-time", _set("timings.infer_s", "0.1")),
    ("bool-time", _set("timings.infer_s", True)),
    ("unknown-pass", _set("pass", "sideways")),
    ("unknown-key", _set("timings.extra_s", 0.1)),
    ("missing-stage", lambda r: r.pop("stage")),
    ("stage-changed-invalid", _set("stage.device", "gpu")),
    ("env-changed-invalid", _set("env.cpu_count", "two")),
    ("nan", _set("timings.infer_s", float("nan"))),
    ("inf", _set("timings.init_s", float("inf"))),
    ("deep", _set("timings.deep", json.loads("[" * 70 + "]" * 70))),
    ("huge-int", _set("round", 10 ** 80)),
    ("stage-id-a-list", _set("stage.id", [1])),
]


@pytest.mark.parametrize("case", [c[0] for c in LATE_BAD_LINES])
def test_a_bad_line_that_looks_like_its_neighbours_is_still_refused(case: str, grown: Path, tmp_path: Path) -> None:
    n = len(_lines(grown))
    at = n - 40
    assert json.loads(_lines(grown)[at])["record"] == "stage"
    bad = _with_line(grown, tmp_path / "bad.jsonl", at, dict(LATE_BAD_LINES)[case])
    with pytest.raises(SpecError, match=rf"line {at + 1}\b"):
        rec.read_jsonl(bad)
    if case == "negative-time":  # and through a command, as one line
        assert_user_error(cli(["profile", "--show", bad]), 5, f"line {at + 1}")
    FUZZ_STATS["cases:readers-big-profile"] += 1


def test_readers_stream_and_stop_at_their_limits(grown: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # streaming: the first record is yielded before a broken last line is read
    lines = _lines(grown)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([*lines, "{not json"]) + "\n")
    it = rec.iter_jsonl(broken)
    assert next(it)["record"] == "stage"
    with pytest.raises(SpecError, match=rf"line {len(lines) + 1} is not valid JSON"):
        list(it)
    # the size limit counts what is read, not only the size at open
    with pytest.raises(SpecError, match="too large"):
        list(rec.iter_jsonl(grown, max_bytes=grown.stat().st_size // 2))
    # one line over the line limit
    monkeypatch.setattr(rec, "MAX_LINE_BYTES", 1000)
    with pytest.raises(SpecError, match=r"line 1 is longer than 1000 bytes"):
        rec.read_jsonl(grown)
    FUZZ_STATS["cases:readers-big-profile"] += 3


#: the child writes its own high-water RSS (``VmHWM``) to the file named by argv[1] as it exits
_CHILD = ("import atexit, sys\n"
          "from rkpart.compile.runner import peak_of\n"
          "out = sys.argv.pop(1)\n"
          "atexit.register(lambda: open(out, 'w').write(str(peak_of(__import__('os').getpid()))))\n"
          "from rkpart.cli import main\n"
          "main()\n")


def _bounded(argv: list[str], tmp: Path) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run ``rkpart ARGV`` in a child; its wall seconds and its own peak RSS (bytes).

    The child's ``VmHWM``, read by the child as it exits: neither ``RUSAGE_CHILDREN`` (the largest child
    this worker ever waited for, a toolkit build of an earlier test included: CI, 1791 MiB "for" report)
    nor ``os.wait4`` (Linux counts the pytest worker's memory that ``fork`` copied before ``exec``: CI,
    1075 MiB) is the child's own."""
    hwm = tmp / "bounded.hwm"
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _CHILD, str(hwm), *argv], capture_output=True, text=True,
                       timeout=900)
    wall = time.perf_counter() - t0
    return p, wall, int(hwm.read_text()) if hwm.is_file() else 0


@pytest.mark.slow
def test_report_fit_and_against_on_a_big_profile_stay_bounded(real_profile: Path, plans: dict,
                                                             tmp_path: Path) -> None:
    """30 000 records (~60 MB): loose bounds, a busy 2-core machine included (measured:
    docs/report.md); the old readers needed about 2.9 ms of CPU per line for the schema alone."""
    big = tmp_path / "big.jsonl"
    n = grow_profile(real_profile, big, 30_000)
    assert n >= 29_000
    cm = Path(rec.__file__).parents[1] / "data" / "rk3588_calibration.json"
    runs = {
        "report": ["report", str(plans["split"][1]), str(big), "-o", str(tmp_path / "r.html"), "-q"],
        "fit": ["fit", str(big), "-o", str(tmp_path / "m.json")],
        "against": ["profile", "--show", str(big), "--against", str(cm)],
    }
    for name, argv in runs.items():
        p, wall, peak = _bounded(argv, tmp_path)
        assert peak > 0, name
        assert p.returncode == 0, (name, p.stderr[-2000:])
        print(f"{name}: peak RSS {peak / 2 ** 20:.0f} MiB, {wall:.1f} s")
        assert peak < 768 * 2 ** 20, f"{name}: peak RSS {peak / 2 ** 20:.0f} MiB"
        assert wall < 600, f"{name}: {wall:.0f} s"
    page = (tmp_path / "r.html").read_text()
    assert "first, middle and last of" in page  # the memory timeline summarises the rounds
    FUZZ_STATS["cases:readers-big-profile"] += 3
