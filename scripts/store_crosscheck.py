"""What one family's builds taught the learned-placement store, matched against every other family's NPU stages.

Issue 50 asks that all families compiled one after another on one shared cache, in any order, move nothing of
another family's NPU work to the host.  :mod:`scripts.real_width` runs every family on a build cache and placement
store of its own (``WORK/cache/<family>/placement/<target>-<toolkit>.json``), so each store holds what that
family's last compile taught (its CPU layers, with their shapes and layout).  This script takes those stores and
the families' plan folders (``WORK/<family>/<strategy>-<toolkit>/``) and asks, for every store and every *other*
family's plan of the same toolkit: which ops of its NPU stages would the store's patterns (applied ones and those a
later build contradicted, alike) have moved to the host, had that family been partitioned after the teacher on one
cache, while its own build ran them on the NPU?  Any such op is contamination; none is the claim.

The partitioner matches a pattern by :func:`rkpart.grouping.capability.pattern_of` on the model; here it is matched
on the stage graphs the plan holds (the same op, input shapes and constants: a stage keeps its op's neighbours'
shapes and copies its constant subgraphs), through :func:`rkpart.grouping.learned.npu_ops`, the function a compile
checks learned patterns with.  Weights are not read: each stage's missing data file is stood in for by a sparse
file of its size while the graph is loaded, then removed.

Usage: ``.venv/bin/python scripts/store_crosscheck.py --work DIR [--work DIR ...] [--toolkit V] [--strategy S]
[--json]``; a ``--work`` folder is searched for ``cache/<family>/placement/*.json`` stores and
``<family>/<strategy>-<toolkit>/plan.json`` plans (up to two levels below it); of a family's plans found in several
folders the newest is used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnx

from rkpart.grouping.learned import load_contradicted, load_learned, npu_ops, trace_cpu_layers
from rkpart.targets.capability import PlacementPattern

TARGET = "rk3588"


@dataclass(frozen=True)
class Teacher:
    """What one family's builds on one toolkit taught (or would teach) the store."""

    family: str
    toolkit: str
    patterns: frozenset[PlacementPattern]
    sources: tuple[str, ...]  # the stores (if any) and the CPU layers recorded in plans it was read from


def find_teachers(roots: list[Path]) -> list[Teacher]:
    """Per (family, toolkit): the patterns of its stores (applied and contradicted), and of the CPU layers
    every plan of it under ``roots`` records (any strategy, old plans too: what their compiles taught, traced
    as :func:`rkpart.grouping.learned.learn` traces them; a layer at a stage boundary is not learned)."""
    got: dict[tuple[str, str], tuple[set[PlacementPattern], list[str]]] = {}
    for root in roots:
        for p in sorted(root.glob("**/cache/*/placement/*.json")):
            family, toolkit = p.parent.parent.name, p.stem.removeprefix(f"{TARGET}-")
            cache = p.parent.parent
            pats = load_learned(TARGET, toolkit, cache) | load_contradicted(TARGET, toolkit, cache)
            if pats:
                ps, src = got.setdefault((family, toolkit), (set(), []))
                ps.update(pats)
                src.append(str(p))
        for p in sorted([*root.glob("*/*/plan.json"), *root.glob("*/*/*/plan.json")]):
            family = p.parent.parent.name
            if family == "cache":
                continue
            plan = json.loads(p.read_text())
            for st in plan.get("stages", []):
                for a in st.get("artifacts", []):
                    if a.get("kind") != "rknn" or not a.get("cpu_ops"):
                        continue
                    f = p.parent / st["file"]
                    with graph_only(f):
                        layers = trace_cpu_layers(st["id"], f, a["cpu_ops"])
                    pats = {x.pattern for x in layers if x.pattern is not None and not x.boundary}
                    if pats:
                        ps, src = got.setdefault((family, str(a.get("toolkit"))), (set(), []))
                        ps.update(pats)
                        src.append(f"{p.parent}:{st['id']}")
    return [Teacher(f, tk, frozenset(ps), tuple(src)) for (f, tk), (ps, src) in sorted(got.items())]


def find_plans(roots: list[Path], strategy: str, toolkit: str) -> dict[str, Path]:
    out: dict[str, tuple[float, Path]] = {}
    for root in roots:
        for p in [*root.glob(f"*/{strategy}-{toolkit}/plan.json"), *root.glob(f"*/*/{strategy}-{toolkit}/plan.json")]:
            family = p.parent.parent.name
            if family == "cache":
                continue
            mtime = p.stat().st_mtime
            if family not in out or out[family][0] < mtime:
                out[family] = (mtime, p.parent)
    return {f: d for f, (_, d) in sorted(out.items())}


@contextlib.contextmanager
def graph_only(stage: Path) -> Iterator[None]:
    """The stage loadable as a graph without its weights: a sparse stand-in for each missing data file."""
    head = onnx.load(str(stage), load_external_data=False)
    need: dict[str, int] = {}
    for t in head.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            kv = {e.key: e.value for e in t.external_data}
            end = int(kv.get("offset", 0)) + int(kv.get("length", 0))
            need[kv["location"]] = max(need.get(kv["location"], 0), end)
    made = []
    try:
        for loc, size in need.items():
            f = stage.parent / loc
            if not f.exists():
                with open(f, "wb") as fh:
                    fh.truncate(size)
                made.append(f)
        yield
    finally:
        for f in made:
            with contextlib.suppress(FileNotFoundError):
                f.unlink()


@dataclass
class Finding:
    teacher: str
    family: str
    stage: str
    op: str
    pattern: str


def check(teachers: list[Teacher], plans: dict[str, Path], toolkit: str) -> tuple[list[Finding], dict[str, int]]:
    findings: list[Finding] = []
    counted = {"plans": 0, "stages": 0}
    teachers = [s for s in teachers if s.toolkit == toolkit]
    for family, folder in plans.items():
        others = [s for s in teachers if s.family != family]
        if not others:
            continue
        patterns = frozenset().union(*(s.patterns for s in others))
        plan = json.loads((folder / "plan.json").read_text())
        counted["plans"] += 1
        for st in plan["stages"]:
            arts = [a for a in st.get("artifacts", []) if a.get("kind") == "rknn" and a.get("toolkit") == toolkit]
            if st.get("device") != "npu" or not arts:
                continue
            f = folder / st["file"]
            counted["stages"] += 1
            with graph_only(f):
                layers = trace_cpu_layers(st["id"], f, arts[-1].get("cpu_ops") or [])
                for x in npu_ops(st["id"], f, layers, patterns):
                    for s in others:
                        if x.pattern in s.patterns:
                            findings.append(Finding(s.family, family, x.stage, x.op, f"{x.pattern.op_type} "
                                                    f"{x.pattern.shapes or x.pattern.dims}"))
    return findings, counted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, action="append", required=True, help="a real-width work folder (repeatable)")
    ap.add_argument("--toolkit", action="append", help="default: every toolkit a store was found for")
    ap.add_argument("--strategy", default="split")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    teachers_all = find_teachers(a.work)
    toolkits = a.toolkit or sorted({s.toolkit for s in teachers_all})
    report = []
    bad = 0
    for tk in toolkits:
        plans = find_plans(a.work, a.strategy, tk)
        findings, counted = check(teachers_all, plans, tk)
        bad += len(findings)
        teachers = [s for s in teachers_all if s.toolkit == tk]
        report.append({"toolkit": tk, "teachers": {s.family: {"patterns": len(s.patterns), "from": list(s.sources)}
                                                     for s in teachers},
                       "families": sorted(plans), **counted, "moved_npu_ops": [f.__dict__ for f in findings]})
        if not a.json:
            print(f"rknn-toolkit2 {tk}: {len(teachers)} famil{'y' if len(teachers) == 1 else 'ies'} whose builds "
                  "taught the store (" + ", ".join(f"{s.family}: {len(s.patterns)} pattern(s)" for s in teachers)
                  + ")")
            print(f"  matched against the {counted['stages']} NPU stage(s) of {counted['plans']} famil"
                  f"{'y' if counted['plans'] == 1 else 'ies'}' {a.strategy} plans ({', '.join(plans)}), "
                  "each against the others' patterns: "
                  f"{len(findings)} op(s) their own build ran on the NPU would have moved to the host")
            for f in findings:
                print(f"    {f.teacher} -> {f.family} {f.stage}: {f.op} ({f.pattern})")
    if a.json:
        print(json.dumps(report, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
