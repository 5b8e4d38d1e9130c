"""Per-family table: NPU stages built and CPU-fallback layers left, before and after rkpart's NPU rewrites.

For each tiny diffusers family (``tests/models/diffusers_families.py``), each exporter (TorchScript at
opset 17, dynamo at its default opset, 20 in torch 2.13), each strategy and each toolkit:
partition, compile with ``--no-rewrites`` (opset lowering only), then with the rewrites, and
count built stages and CPU layers from the placement report.  Exports are cached as the tests
cache them (:func:`tests.models.diffusers_families.cached_export`).  Builds run one at a time.

Usage: ``python scripts/npu_table.py OUT.md [--family F ...] [--newer] [--latest] [--toolkit V ...]
[--strategy S ...] [--exporter E ...] [--rewrites-only] [--repartition] [--gate GATE.md] [--timeout S]
[--anonymised] [--empty-cache]``

``--family`` takes any name of ``ALL`` there (default: the 12 ``FAMILIES``); ``--newer`` runs the
``NEWER`` ones instead (after any ``--family`` given), ``--latest`` the ``LATEST`` ones;
``--rewrites-only`` skips the ``--no-rewrites`` build (its cells read ``not run``);
``--repartition`` compiles the build with rewrites as ``rkpart compile --repartition`` does
(placement learned from the plan's own builds, crashed stages cut) and reports what it left.
``--gate GATE.md`` then runs the rknn-sim gate on that build (:mod:`tests.compile.sim_gate`: the plan
with every NPU stage in the toolkit's simulator against ONNX Runtime, or torch, or stage by stage) and
writes one row per plan there: the reference, how many tensors were compared, the lowest cosine.
Exports whose shapes depend on data (``SPECIALISE`` of the sweep) are partitioned with their
example inputs (``--inputs``).  ``--anonymised`` runs each export's anonymised copy instead
(:func:`rkpart.plan.anonymize.anonymize_file`: every node and tensor renamed, metadata dropped, so
discovery finds the blocks from structure alone); its rows read ``<exporter> (anonymised)``.  Each run
reads and fills the placement store of ``$RKPART_CACHE_DIR``: give every run an empty one for a table
that does not depend on what earlier runs learned (``--empty-cache``: each family on its own temporary one).

``python scripts/npu_table.py --merge ALL.md OUT.md [OUT2.md ...]`` writes the rows of such tables as one
(later files win for a repeated row; newest toolkit first, then by family).
``python scripts/npu_table.py --pivot OUT.md [OUT2.md ...]`` prints the rows of such tables as the
docs/npu-stages.md's per-family table (one row per family, exporter and toolkit; split and fused side by side).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cell(row: dict[str, str]) -> str:
    """``built before -> after; CPU before -> after`` for one plan (before/after: without/with rewrites);
    ``built; CPU`` when only the build with rewrites ran (``--rewrites-only``)."""
    if not row:
        return "not run"
    if not row["built (rewrites)"]:
        return row["NPU stages"]  # a failed export or partition: its message
    if row["built (no rewrites)"] == "not run":  # --rewrites-only: the default build alone
        return f"{row['built (rewrites)']}; {row['CPU layers (rewrites)']}"
    built = row["built (no rewrites)"]
    built += "" if row["built (rewrites)"] == built else f" -> {row['built (rewrites)']}"
    return f"{built}; {row['CPU layers (no rewrites)']} -> {row['CPU layers (rewrites)']}"


def read_table(path: Path, strict: bool = False) -> tuple[list[str], list[tuple[dict[str, str], str]]]:
    """One of :func:`main`'s output tables: its header lines, and per data row (column -> cell, the
    line as written).  ``strict``: a row with more or fewer cells than the header raises."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return lines[:2], [(dict(zip(head, (c.strip() for c in ln.strip("|").split("|")), strict=strict)), ln)
                       for ln in lines[2:]]


def pivot(tables: list[Path]) -> str:
    """The docs/npu-stages.md table from :func:`main`'s output files (later files win for a repeated row)."""
    rows: dict[tuple[str, str, str, str], dict[str, str]] = {}
    for t in tables:
        for r, _ in read_table(t)[1]:
            rows[(r["family"], r["exporter"], r["strategy"], r["toolkit"])] = r
    only = all(r.get("built (no rewrites)") in ("not run", "") for r in rows.values())  # --rewrites-only runs
    cell = "stages built; CPU layers" if only else "stages built; CPU layers before -> after rewrites"
    out = [f"| family | exporter | toolkit | split: {cell} | fused: {cell} | rewrites applied (split; fused) |",
           "|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((f, e, v) for f, e, _, v in rows if v != "-"))  # in the order of the runs
    for f, e, v in keys:
        sp, fu = rows.get((f, e, "split", v), {}), rows.get((f, e, "fused", v), {})
        applied = "; ".join(r.get("rewrites applied", "-") or "-" for r in (sp, fu))
        out.append(f"| {f} | {e} | {v} | {_cell(sp)} | {_cell(fu)} | {applied} |")
    for (f, e, s, v), r in rows.items():
        if v == "-":
            out.append(f"| {f} | {e} | - | {s}: {r['NPU stages']} | | |")
    return "\n".join(out) + "\n"


def merge(tables: list[Path]) -> str:
    """One table of the rows of ``tables`` (later files win for a repeated row), sorted by toolkit
    (newest first) then family, exporter and strategy: what ``--pivot`` of the runs of one sweep reads."""
    head: list[str] = []
    rows: dict[tuple[str, ...], str] = {}
    for t in tables:
        lines, table = read_table(t)
        head = head or lines
        for r, ln in table:
            rows[(r["family"], r["exporter"], r["strategy"], r["toolkit"])] = ln

    def order(k: tuple[str, ...]) -> tuple[object, ...]:
        return (tuple(-int(p) for p in k[3].split(".") if p.isdigit()), k[0], k[1], k[2])
    return "\n".join([*head, *(rows[k] for k in sorted(rows, key=order))]) + "\n"


GATE_HEAD = "| family | exporter | strategy | toolkit | stages built | reference | compared | lowest cosine |"


def _gate_row(fam: str, exporter: str, strat: str, v: str, model: Path, rep: object, folder: Path,
              exp: str) -> str:
    """One row of the ``--gate`` table: the rknn-sim gate of the build ``rep`` (a compile report);
    ``exp`` is the row's exporter cell (``exporter``, or ``exporter (anonymised)``)."""
    from tests.compile.sim_gate import sim_gate

    plan = rep.plan  # type: ignore[attr-defined]
    failed = len(rep.failed)  # type: ignore[attr-defined]
    built = f"{len(plan.npu_stages) - failed}/{len(plan.npu_stages)}"
    if failed:
        return f"| {fam} | {exp} | {strat} | {v} | {built} | not run: a stage failed | | |"
    t0 = time.monotonic()
    try:
        kind, got = sim_gate(fam, exporter, model, plan, folder, v)
    except Exception as e:  # noqa: BLE001 - reported in the table
        traceback.print_exc()
        msg = str(e).splitlines()[0][:100] if str(e) else ""
        return f"| {fam} | {exp} | {strat} | {v} | {built} | error: {type(e).__name__}: {msg} | | |"
    bad = [r for r in got if not r.ok]
    low = min((r.cosine for r in got), default=float("nan"))
    verdict = "pass" if got and not bad else f"FAIL ({len(bad)}: " + ", ".join(
        f"{r.stage}:{r.name} cos {r.cosine:.6f} nan {r.nan} inf {r.inf}" for r in bad[:3]) + ")"
    print(f"{fam} {exp} {strat} {v} gate: {verdict} ({time.monotonic() - t0:.0f} s)", flush=True)
    return f"| {fam} | {exp} | {strat} | {v} | {built} | {kind}: {verdict} | {len(got)} | {low:.6f} |"


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--pivot"]:
        sys.stdout.write(pivot([Path(a) for a in argv[1:]]))
        return 0
    if argv[:1] == ["--merge"] and len(argv) >= 3:
        Path(argv[1]).write_text(merge([Path(a) for a in argv[2:]]))
        return 0
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from rkpart.compile.toolkits import find_toolkit
    try:
        from rkpart.pipeline import partition
    except ImportError:  # before the pipeline module existed
        from rkpart.partitioner.api import partition  # type: ignore[no-redef]
    import numpy as np

    try:
        from rkpart.repartition import compile_repartition
    except ImportError:  # before the repartition module existed
        from rkpart.pipeline import compile_repartition  # type: ignore[attr-defined,no-redef]
    from tests.models.diffusers_families import ALL, FAMILIES, LATEST, NEWER, cached_export, example_inputs
    from tests.partitioner.test_family_sweep import SPECIALISE

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--family", action="append", choices=sorted(ALL))
    ap.add_argument("--newer", action="store_true", help="the NEWER families instead of the 12 (after any --family)")
    ap.add_argument("--latest", action="store_true", help="the LATEST families too (after any --family, --newer)")
    ap.add_argument("--rewrites-only", action="store_true", help="skip the --no-rewrites build")
    ap.add_argument("--repartition", action="store_true", help="the build with rewrites as compile --repartition")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per build (default: compile's)")
    ap.add_argument("--exporter", action="append", choices=["torchscript", "dynamo"])
    ap.add_argument("--toolkit", action="append")
    ap.add_argument("--strategy", action="append")
    ap.add_argument("--gate", type=Path, help="run the rknn-sim gate on the build with rewrites; its rows go here")
    ap.add_argument("--anonymised", action="store_true", help="each export's anonymised copy instead")
    ap.add_argument("--empty-cache", action="store_true",
                    help="each family on an empty $RKPART_CACHE_DIR (a temporary one), learning from no other family")
    a = ap.parse_args(argv)
    fams = ((a.family or ([] if a.newer or a.latest else list(FAMILIES))) + (list(NEWER) if a.newer else [])
            + (list(LATEST) if a.latest else []))
    rows = ["| family | exporter | strategy | toolkit | NPU stages | built (no rewrites) | CPU layers (no rewrites) "
            "| built (rewrites) | CPU layers (rewrites) | rewrites applied |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    a.out.write_text("\n".join(rows) + "\n")
    gates = [GATE_HEAD, "|---|---|---|---|---|---|---|---|"]
    if a.gate:
        a.gate.write_text("\n".join(gates) + "\n")
    anon_dir = tempfile.TemporaryDirectory() if a.anonymised else None
    family_cache: tempfile.TemporaryDirectory[str] | None = None
    for fam in fams:
        if a.empty_cache:  # the placement store (and build cache) of this family alone
            if family_cache:
                family_cache.cleanup()
            family_cache = tempfile.TemporaryDirectory(prefix=f"rkpart-cache-{fam}-")
            os.environ["RKPART_CACHE_DIR"] = family_cache.name
        for exporter in a.exporter or ["torchscript", "dynamo"]:
            exp = f"{exporter} (anonymised)" if anon_dir else exporter
            try:
                model = cached_export(fam, exporter)
            except BaseException as e:  # noqa: BLE001 - a family the exporter cannot export is a table row
                msg = re.sub(r"\x1b\[[0-9;]*m", "", str(e).splitlines()[0]) if str(e) else ""  # no colours
                rows.append(f"| {fam} | {exp} | - | - | export failed: {type(e).__name__}: {msg[:80]} | | | | | |")
                a.out.write_text("\n".join(rows) + "\n")
                continue
            if anon_dir:
                from rkpart.plan.anonymize import anonymize_file
                model = anonymize_file(model, Path(anon_dir.name) / f"{fam}-{exporter}.onnx")
            for strat in a.strategy or ["split", "fused"]:
                with tempfile.TemporaryDirectory() as td:
                    folder = Path(td) / "plan"
                    opts = {}
                    if (fam, exporter) in SPECIALISE:  # shapes resolved by one run on the family's example inputs
                        np.savez(Path(td) / "inputs.npz", **example_inputs(fam))
                        opts["inputs"] = str(Path(td) / "inputs.npz")
                    try:
                        plan = partition(model, folder, strat, **opts)
                    except Exception as e:  # noqa: BLE001 - reported in the table
                        msg = str(e).replace(str(model.parent) + "/", "")  # no temporary folder in the table
                        rows.append(f"| {fam} | {exp} | {strat} | - | partition failed: {msg[:80]} | | | | | |")
                        a.out.write_text("\n".join(rows) + "\n")
                        continue
                    for k, v in enumerate(a.toolkit or ["2.5.0", "2.3.0"]):
                        if k and a.repartition:  # each toolkit's rounds start from the partition, not the last's
                            folder = Path(td) / f"plan-{v}"
                            plan = partition(model, folder, strat, **opts)
                        tk = find_toolkit(v)
                        cells = []
                        applied: dict[str, int] = {}
                        for rw in (False, True):
                            if a.rewrites_only and not rw:
                                cells += ["not run", "not run"]
                                continue
                            t0 = time.monotonic()
                            copts = CompileOptions(tk, "rk3588", {}, jobs=1, rewrites=rw, timeout=a.timeout)
                            rounds: list = []
                            try:
                                if rw and a.repartition:
                                    rep, rounds, _ = compile_repartition(folder, copts)
                                else:
                                    rep = compile_plan_report(plan, folder, copts)
                            except Exception:  # noqa: BLE001
                                traceback.print_exc()
                                cells += ["error", "-"]
                                continue
                            n_cpu = sum(len(x) for x in rep.cpu_ops_per_block().values())
                            ops = sorted({op.split(":")[0] for x in rep.cpu_ops_per_block().values() for op in x})
                            built = f"{len(rep.outcomes) - len(rep.failed)}/{len(rep.outcomes)}"
                            cpu = f"{n_cpu}" + (f" ({', '.join(ops)})" if ops else "")
                            if rounds:  # what the first build left, and how many rounds closed it
                                first = rounds[0]
                                built += f" ({first.failed_before} failed before --repartition)" \
                                    if first.failed_before else ""
                                cpu += f" ({first.cpu_layers_before} before --repartition, {len(rounds)} round(s))"
                            cells += [built, cpu]
                            if rw and a.gate:
                                gates.append(_gate_row(fam, exporter, strat, v, model, rep, folder, exp))
                                a.gate.write_text("\n".join(gates) + "\n")
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
