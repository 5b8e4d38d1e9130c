"""Measure the fast test tier and write what it is into README.md's tier block.

The block between ``<!-- tiers:begin -->`` and ``<!-- tiers:end -->`` says how many tests the fast
tier (``pytest -m "not slow and not toolkit and not export"``) holds and how long it took, as this
script measured them; ``tests/test_tiers.py`` checks the count against ``pytest --collect-only``.

    python scripts/tiers.py            # run the tier as on a fresh clone, rewrite the block (minutes)
    python scripts/tiers.py --count    # only the count (a collection, seconds); the timing stays

The run is hermetic, as the README says the tier is: an empty home folder and empty toolkits
folders (``$RKPART_TOOLKITS_DIR``, ``$RKPART_TEST_TOOLKITS_DIR``), so it passes only where a fresh
clone after ``bash scripts/setup.sh`` would.  A run with a failure writes nothing (exit 1).  CPU time
is user + system time of pytest and its workers (``getrusage`` of the waited-for children).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BEGIN, END = "<!-- tiers:begin -->", "<!-- tiers:end -->"
FAST = "not slow and not toolkit and not export"
#: the timing sentence of the block, as :func:`render` writes it and :func:`timing` reads it back
TIMING = re.compile(r"Measured by `python scripts/tiers\.py` on (?P<date>\d{4}-\d{2}-\d{2}) "
                    r"\((?P<tests>\d+) passed, `-n (?P<workers>\d+)`, load (?P<load>[\d.]+)\): "
                    r"(?P<cpu>[\d.]+) s of CPU, (?P<wall>[\d.]+) s wall\.")
COUNT = re.compile(r"holds \*\*(?P<tests>\d+) tests\*\*")


def hermetic_env(home: Path) -> dict[str, str]:
    """The environment of a fresh clone: an empty home and no toolkit anywhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RKPART_")}
    (home / "toolkits").mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), RKPART_TOOLKITS_DIR=str(home / "toolkits"),
               RKPART_TEST_TOOLKITS_DIR=str(home / "toolkits"))
    return env


def collect_count(env: dict[str, str] | None = None) -> int:
    """How many tests the fast tier holds (``pytest --collect-only``)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", FAST, "-p", "no:cacheprovider"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    m = re.search(r"^(\d+)/\d+ tests collected", r.stdout, re.MULTILINE) or re.search(
        r"^(\d+) tests? collected", r.stdout, re.MULTILINE)
    if r.returncode != 0 or m is None:
        raise SystemExit(f"tiers: pytest --collect-only failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return int(m.group(1))


def run_tier(env: dict[str, str], workers: int) -> tuple[int, float, float, float]:
    """Run the fast tier: (tests passed, CPU s, wall s, load average at the start)."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", FAST, "-n", str(workers), "-p", "no:cacheprovider"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    m = re.search(r"(\d+) passed", tail)
    if r.returncode != 0 or m is None or re.search(r"\d+ (failed|error)", tail):
        raise SystemExit(f"tiers: the fast tier did not pass on a fresh home with no toolkit:\n{r.stdout[-4000:]}")
    return int(m.group(1)), cpu, wall, load


def render(count: int, timing_line: str) -> str:
    """The block's text (markers included)."""
    return (f"{BEGIN}\nThe fast tier is the rest: `-m \"{FAST}\"` holds **{count} tests** (`pytest --collect-only`), "
            "nearly all in-process; a test without `toolkit` sees an empty toolkits folder and fails if it reads an "
            "installed toolkit (tests/conftest.py), so the tier passes on a fresh clone after `bash scripts/setup.sh` "
            f"with no toolkit installed and an empty home folder. {timing_line}\n{END}")


def timing(text: str) -> re.Match[str] | None:
    """The timing sentence of README's block, parsed."""
    return TIMING.search(block(text))


def block(text: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"tiers: README.md has no {BEGIN} ... {END} block")
    return text[start:end + len(END)]


def write(count: int, timing_line: str) -> None:
    text = README.read_text()
    README.write_text(text.replace(block(text), render(count, timing_line)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", action="store_true", help="only collect and rewrite the count (the timing stays)")
    ap.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers of the timed run (default 2)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rkpart-tiers-") as tmp:
        env = hermetic_env(Path(tmp) / "home")
        count = collect_count(env)
        if args.count:
            old = timing(README.read_text())
            if old is None:
                raise SystemExit("tiers: README's block has no timing yet; run without --count")
            write(count, old.group(0))
            print(f"fast tier: {count} tests (timing kept: {old.group('tests')} passed on {old.group('date')})")
            return 0
        passed, cpu, wall, load = run_tier(env, args.workers)
    day = datetime.date.today().isoformat()
    line = (f"Measured by `python scripts/tiers.py` on {day} ({passed} passed, `-n {args.workers}`, load {load:.1f}): "
            f"{cpu:.0f} s of CPU, {wall:.0f} s wall.")
    write(count, line)
    print(f"fast tier: {count} tests collected, {passed} passed; {cpu:.0f} s of CPU, {wall:.0f} s wall "
          f"at load {load:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
