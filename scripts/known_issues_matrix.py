"""Build every AdaLN reproducer form with every toolkit: the matrix the known-issue table was read from.

``rkpart/targets/known_issues.py`` records, per toolkit, the reproducers that prove each crash pattern
and the controls that bound it (``tests/targets/test_known_issue_reproducers.py`` rebuilds those 12);
this script builds all the forms of :func:`rkpart.targets.known_issues_repro.adaln_matmul` (3 norms x
4 modulations) with each toolkit, optionally also as ``rkpart compile`` prepares them (its ``npu``
rewrites applied first), and prints one Markdown row per form: the outcome per toolkit, the known
issue its log shows, and the op signatures the table finds in it.

    python scripts/known_issues_matrix.py [--toolkits 2.3.0,2.3.2,2.5.0] [--rewrites] [--work DIR]

About 20 s of CPU a build (36 builds: ~12 minutes on one core).  Needs the toolkits installed
(``rkpart toolkit install V``; ``$RKPART_TOOLKITS_DIR``).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import onnx

from rkpart.compile.toolkits import find_toolkit
from rkpart.ir.load import graph_of
from rkpart.targets.known_issues import match_signature, signatures_in
from rkpart.targets.known_issues_repro import MODULATIONS, NORMS, adaln_matmul
from rkpart.targets.rewrites import apply_rewrites, compile_rewrites_for
from rkpart.triage.matrix import build_once, describe_outcome


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toolkits", default="2.3.0,2.3.2,2.5.0")
    ap.add_argument("--rewrites", action="store_true", help="apply rkpart compile's npu rewrites before each build")
    ap.add_argument("--work", type=Path, default=None, help="keep the graphs and build logs here")
    args = ap.parse_args(argv)
    versions = [v for v in args.toolkits.split(",") if v]
    tks = {v: find_toolkit(v) for v in versions}
    work = args.work or Path(tempfile.mkdtemp(prefix="rkpart-known-issues-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"| norm | modulation | signatures | {' | '.join(versions)} |")
    print(f"| --- | --- | --- | {' | '.join('---' for _ in versions)} |")
    for norm, mod in itertools.product(NORMS, MODULATIONS):
        model = adaln_matmul(norm, mod)
        mg = graph_of(model, f"{norm}-{mod}.onnx")
        sigs = sorted(signatures_in(mg, (frozenset(i for i in range(mg.num_ops) if i not in mg.const_ops),)))
        cells = []
        for v in versions:
            m = adaln_matmul(norm, mod)
            if args.rewrites:
                apply_rewrites(m, compile_rewrites_for(v))
            path = work / f"{norm}_{mod}_{v}.onnx"
            onnx.save(m, str(path))
            res = build_once(path, tks[v], target="rk3588", log=path.with_suffix(".log"), timeout=900)
            issue = match_signature(res)
            cells.append(describe_outcome(res.kind, res.exit_code, res.signal) + (f" {issue.id}" if issue else ""))
        print(f"| {norm} | {mod} | {', '.join(sigs) or '-'} | {' | '.join(cells)} |", flush=True)
    print(f"graphs and logs: {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
