"""Run the whole generated hostile suite of issue 51 and print what it found.

    PYTHONPATH=. .venv/bin/python scripts/hostile_suite.py [--numbers N] [--only readers,commands,outputs]

Builds the world (tests/hostile/world.py: every file kind rkpart reads, made by rkpart), then runs
every case of tests/hostile/generated.py: each registered file kind read directly on every hostile
variant (NaN / Inf / 0 / -1 / 1e308 in every number with ``--numbers 0``, the default), the same
variants given to every command that reads them (and every file a document names pointed out of
its folder: never opened), and every output flag given every hostile
destination.  Prints the count of cases per family, every break (a hang, a traceback, an exit
code docs/errors.md does not list, an error longer than one line, a write outside the target,
something lost), the slowest cases and the CPU time; exits 1 when anything broke.  The test suite
(tests/hostile/test_generated_hostile.py) runs a sample of the same cases.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rkpart.cli_args import bundled_example
from tests.hostile import generated as G
from tests.hostile import world as W
from tests.hostile.test_errors_doc import all_kinds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numbers", type=int, default=0,
                    help="numbers per document given NaN / Inf / 0 / -1 / 1e308 (0: every number) [0]")
    ap.add_argument("--cli-numbers", type=int, default=4, help="the same, for the command cases [4]")
    ap.add_argument("--only", default="readers,commands,outputs", help="families to run [all]")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    t_cpu, t_wall = time.process_time(), time.monotonic()
    all_kinds()
    with tempfile.TemporaryDirectory(prefix="rkpart-hostile-suite-") as tmp:
        os.environ["RKPART_CACHE_DIR"] = str(Path(tmp) / "user-cache")  # the user's own cache is never touched
        world, routes = W.make_world(Path(tmp), bundled_example())
        print(f"world: {len(routes)} reading commands, {sum(len(r.reads) for r in routes)} (command, kind) routes; "
              f"made in {time.process_time() - t_cpu:.1f} s of CPU", flush=True)
        families = {
            "readers": lambda: G.reader_cases(world, routes, numbers=args.numbers or None),
            "commands": lambda: G.cli_cases(world, routes, numbers=args.cli_numbers),
            "outputs": lambda: itertools.chain(G.output_cases(world, full=True), G.runner_output_cases(world)),
        }
        counts: Counter[str] = Counter()
        broken: list[W.Outcome] = []
        slowest: list[tuple[float, str]] = []
        codes: Counter[str] = Counter()
        for fam, make in families.items():
            if fam not in only:
                continue
            c0 = time.process_time()
            for case in make():
                o = G.run_case(case)
                counts[fam] += 1
                codes[f"{fam}:{o.exit_code}"] += 1
                slowest.append((o.seconds, o.case))
                if o.breaks:
                    broken.append(o)
                    print(f"BREAK {o.case}: {'; '.join(o.breaks)} (exit {o.exit_code}: {o.message[:200]})", flush=True)
                if counts[fam] % 100 == 0:
                    print(f"  {fam}: {counts[fam]} cases, {len(broken)} breaks so far", flush=True)
            print(f"{fam}: {counts[fam]} cases in {time.process_time() - c0:.1f} s of CPU", flush=True)
    print(f"hostile cases: {sum(counts.values())} ({', '.join(f'{k} {v}' for k, v in counts.items())}); "
          f"breaks: {len(broken)}")
    print("exit codes: " + ", ".join(f"{k} x{v}" for k, v in sorted(codes.items())))
    print("slowest: " + "; ".join(f"{c} {s:.1f} s" for s, c in sorted(slowest, reverse=True)[:5]))
    print(f"CPU {time.process_time() - t_cpu:.0f} s, wall {time.monotonic() - t_wall:.0f} s")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
