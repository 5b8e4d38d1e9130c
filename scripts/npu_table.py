"""Per-family table: NPU stages built and CPU-fallback layers left, before and after rkpart's NPU rewrites.

For each tiny diffusers family (``tests/models/diffusers_families.py``), each exporter (TorchScript at
opset 17, dynamo at its default opset, 20 in torch 2.13), each strategy and each toolkit:
partition, compile with ``--no-rewrites`` (opset lowering only), then with the rewrites, and
count built stages and CPU layers from the placement report.  Exports are cached as the tests
cache them (:func:`tests.models.diffusers_families.cached_export`).  Builds run one at a time.

Usage: ``python scripts/npu_table.py OUT.md [--family F ...] [--toolkit V ...] [--strategy S ...]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from rkpart.compile.compile import compile_plan_report
    from rkpart.compile.toolkits import find_toolkit
    try:
        from rkpart.pipeline import partition
    except ImportError:  # before the pipeline module existed
        from rkpart.partitioner.api import partition  # type: ignore[no-redef]
    from tests.models.diffusers_families import FAMILIES, cached_export

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES))
    ap.add_argument("--exporter", action="append", choices=["torchscript", "dynamo"])
    ap.add_argument("--toolkit", action="append")
    ap.add_argument("--strategy", action="append")
    a = ap.parse_args(argv)
    fams = a.family or list(FAMILIES)
    rows = ["| family | exporter | strategy | toolkit | NPU stages | built (no rewrites) | CPU layers (no rewrites) "
            "| built (rewrites) | CPU layers (rewrites) | rewrites applied |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    a.out.write_text("\n".join(rows) + "\n")
    for fam in fams:
        for exp in a.exporter or ["torchscript", "dynamo"]:
            try:
                model = cached_export(fam, exp)
            except BaseException as e:  # noqa: BLE001 - a family the exporter cannot export is a table row
                rows.append(f"| {fam} | {exp} | - | - | export failed: {type(e).__name__}: "
                            f"{str(e).splitlines()[0][:80] if str(e) else ''} | | | | | |")
                a.out.write_text("\n".join(rows) + "\n")
                continue
            for strat in a.strategy or ["split", "fused"]:
                with tempfile.TemporaryDirectory() as td:
                    folder = Path(td) / "plan"
                    try:
                        plan = partition(model, folder, strat)
                    except Exception as e:  # noqa: BLE001 - reported in the table
                        rows.append(f"| {fam} | {exp} | {strat} | - | partition failed: {str(e)[:80]} | | | | | |")
                        a.out.write_text("\n".join(rows) + "\n")
                        continue
                    for v in a.toolkit or ["2.5.0", "2.3.0"]:
                        tk = find_toolkit(v)
                        cells = []
                        applied: dict[str, int] = {}
                        for rw in (False, True):
                            t0 = time.monotonic()
                            try:
                                rep = compile_plan_report(plan, folder, tk, "rk3588", {}, jobs=1, rewrites=rw)
                            except Exception:  # noqa: BLE001
                                traceback.print_exc()
                                cells += ["error", "-"]
                                continue
                            n_cpu = sum(len(x) for x in rep.cpu_ops_per_block().values())
                            ops = sorted({op.split(":")[0] for x in rep.cpu_ops_per_block().values() for op in x})
                            cells += [f"{len(rep.outcomes) - len(rep.failed)}/{len(rep.outcomes)}",
                                      f"{n_cpu}" + (f" ({', '.join(ops)})" if ops else "")]
                            if rw:
                                for s in rep.plan.npu_stages:
                                    for k, c in ((s.prepared or {}).get("rewrites") or {}).items():
                                        applied[k] = applied.get(k, 0) + c
                            print(f"{fam} {exp} {strat} {v} rewrites={rw}: {cells[-2]} built, {cells[-1]} CPU "
                                  f"({time.monotonic() - t0:.0f} s)", flush=True)
                        rw_text = ", ".join(f"{k} x{c}" for k, c in sorted(applied.items())) or "-"
                        rows.append(f"| {fam} | {exp} | {strat} | {v} | {len(plan.npu_stages)} | "
                                    + " | ".join(cells) + f" | {rw_text} |")
                        a.out.write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
