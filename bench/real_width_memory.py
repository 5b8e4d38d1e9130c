"""Device memory at real widths: the memory model's prediction of the same stages before and after a change.

For every NPU stage row of ``bench/data/real_width.jsonl`` (compiled by ``scripts/real_width.py``), the family is
partitioned again as the script partitioned it (the cached export, same strategy and toolkit, an empty placement
store; into ``--work``, once, with its weights) and each stage is predicted as ``rkpart estimate`` predicts a
stage that is not compiled: its features (:func:`rkpart.cost_model.features.stage_features`) under the shipped
cost model's device-memory predictor for the toolkit, never below its fp16 weights.  Only stages whose file is
byte for byte the one the script compiled (its sha256 in both plans) are compared: the same stages.

``--out FILE`` writes the predictions (JSON); ``--against FILE`` (an earlier ``--out``, made with the code
before a change) prints, per family, toolkit and strategy, the stages of 1 MiB or more within ±10 % of the
compiler's weight + internal memory, and the worst and median error, before -> after.

Usage: ``.venv/bin/python bench/real_width_memory.py [--rows FILE] [--plans DIR] [--work DIR] [--family F ...]
[--out FILE] [--against FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 1 << 20
TOLERANCE = 0.10


def _sha(plan_dir: Path) -> dict[str, str]:
    doc = json.loads((plan_dir / "plan.json").read_text())
    return {s["id"]: str(s.get("sha256")) for s in doc["stages"]}


def predictions(family: str, strategy: str, toolkit: str, work: Path) -> tuple[Path, dict[str, int]]:
    """(the plan folder, stage id -> predicted device memory) of a fresh partition of ``family``."""
    from rkpart.cost_model.features import stage_features
    from rkpart.cost_model.model import load_model_or_default
    from rkpart.plan.plan import load_plan
    from tests.models.real_width import cached_real_export

    plan_dir = work / family / f"{strategy}-{toolkit}"
    if not (plan_dir / "plan.json").is_file():
        env = {**os.environ, "RKPART_CACHE_DIR": str(work / "cache" / family / f"{strategy}-{toolkit}"),
               "PYTHONPATH": str(ROOT)}
        subprocess.run([str(Path(sys.executable).parent / "rkpart"), "partition", str(cached_real_export(family)),
                        "-o", str(plan_dir), "-s", strategy, "--toolkit", toolkit, "--force", "-q"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
    comp = load_model_or_default(None).memory_component(toolkit)
    assert comp is not None, toolkit
    plan, folder = load_plan(plan_dir)
    out = {}
    for s in plan.npu_stages:
        f = stage_features(folder, s)
        out[s.id] = int(max(comp.predict(f), float(f.weight16)))
    return plan_dir, out


def _summary(errs: Sequence[float]) -> dict[str, Any]:
    if not errs:
        return {"n": 0}
    return {"n": len(errs), "within_10": sum(abs(e) <= TOLERANCE for e in errs),
            "worst": round(max(errs, key=abs) * 100, 1), "median": round(statistics.median(errs) * 100, 1)}


def main(argv: list[str] | None = None) -> int:
    from scripts.real_width import ROWS, read_rows

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=Path, default=ROWS)
    ap.add_argument("--plans", type=Path, default=Path("/var/tmp/rkpart-real-width"),
                    help="scripts/real_width.py's --work (the compiled plans)")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/rkpart-real-width-memory"))
    ap.add_argument("--family", action="append")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--against", type=Path)
    a = ap.parse_args(argv)
    rows, _ = read_rows(a.rows)
    rows = [r for r in rows if r["built"] and r["weight_bytes"] + r["internal_bytes"] >= MIB
            and (not a.family or r["family"] in a.family)]
    stages: dict[str, dict[str, Any]] = {}
    for fam, tk, strat in sorted({(r["family"], r["toolkit"], r["strategy"]) for r in rows}):
        compiled = a.plans / fam / f"{strat}-{tk}"
        if not (compiled / "plan.json").is_file():
            continue
        plan_dir, now = predictions(fam, strat, tk, a.work)
        same = _sha(compiled)
        mine = _sha(plan_dir)
        for r in rows:
            if (r["family"], r["toolkit"], r["strategy"]) != (fam, tk, strat):
                continue
            key = f"{fam} {tk} {strat} {r['stage']}"
            if r["stage"] not in now or same.get(r["stage"]) != mine.get(r["stage"]):
                print(f"{key}: not the stage compiled, left out", file=sys.stderr)
                continue
            stages[key] = {"device": r["weight_bytes"] + r["internal_bytes"], "predicted": now[r["stage"]]}
    if a.out:
        a.out.write_text(json.dumps(stages, indent=1, sort_keys=True) + "\n")
    if a.against is None:
        for k, v in stages.items():
            print(f"{k}: {v['device'] / MIB:.1f} MiB, {(v['predicted'] / v['device'] - 1) * 100:+.1f} %")
        return 0
    before = json.loads(a.against.read_text())
    keys = [k for k in stages if k in before]
    groups: dict[str, list[str]] = {}
    for k in keys:
        groups.setdefault(k.split(" ")[0], []).append(k)
    print("| family | stages | within ±10 % before -> after | worst before -> after | median before -> after |")
    print("| --- | --- | --- | --- | --- |")
    for g, ks in [*sorted(groups.items()), ("all", keys)]:
        b = _summary([before[k]["predicted"] / before[k]["device"] - 1 for k in ks])
        n = _summary([stages[k]["predicted"] / stages[k]["device"] - 1 for k in ks])
        print(f"| {g} | {b['n']} | {b['within_10']} -> {n['within_10']} | {b['worst']:+.1f} % -> {n['worst']:+.1f} % "
              f"| {b['median']:+.1f} % -> {n['median']:+.1f} % |")
    print()
    for k in keys:
        err_b, err_n = (d[k]["predicted"] / d[k]["device"] - 1 for d in (before, stages))
        print(f"{k}: {stages[k]['device'] / MIB:.1f} MiB, {err_b * 100:+.1f} % -> {err_n * 100:+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
