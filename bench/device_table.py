"""Per candidate of a model: the compiler's memory and cycles of one block per anatomy, the device-memory
prediction made before compiling and its error, and what ``auto`` chooses under the default budget.

For each candidate family ``auto`` chooses from (split, split with AdaLN on the NPU, fused, fused x2)
the model is partitioned (weights linked) and one block per anatomy is compiled (or taken from the
build cache) with ``--toolkit``: exactly what ``rkpart partition --strategy auto --toolkit V`` does
(:func:`rkpart.grounding.ground_candidates`).  Then ``auto`` itself runs under the target's default
budget and the table says how many blocks it keeps resident.

Usage: ``.venv/bin/python bench/device_table.py MODEL.onnx [MODEL.onnx ...] [--toolkit 2.5.0]
[--work DIR] [--steps 30] [--markdown]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rkpart.cost_model.features import stage_features  # noqa: E402
from rkpart.cost_model.model import load_model_or_default  # noqa: E402
from rkpart.discovery.recognizers import discover  # noqa: E402
from rkpart.ir import load_model  # noqa: E402
from rkpart.pipeline import partition  # noqa: E402
from rkpart.plan.plan import load_plan  # noqa: E402

MIB = float(1 << 20)


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def table(model: Path, toolkit: str, work: Path, steps: int) -> tuple[list[dict[str, object]], dict[str, object]]:
    mg = load_model(model)
    disc = discover(mg)
    cands = work / model.stem / "candidates"
    out = work / model.stem / "auto"
    _say(f"auto on {model.name} with rknn-toolkit2 {toolkit}, default budget")
    plan = partition(model, out, "auto", force=True, toolkit=toolkit, compile=True, compile_dir=cands, steps=steps,
                     progress=_say)
    folders = sorted(p.parent for p in cands.glob("*/plan.json"))
    cost = load_model_or_default(None)
    comp = cost.memory_component(toolkit)
    rows: list[dict[str, object]] = []
    for folder in folders:
        cand, _ = load_plan(folder)
        for s in cand.npu_stages:
            art = s.artifact("rknn")
            if art is None or art.compiler is None:
                continue
            cp = art.compiler
            f = stage_features(folder, s)
            pred = None if comp is None else max(comp.predict(f), float(f.weight16))
            mem = cp.device_mem_bytes
            rows.append({"model": model.stem, "candidate": folder.name, "stage": s.id, "blocks": len(s.blocks),
                         "weight_mib": None if cp.weight_bytes is None else round(cp.weight_bytes / MIB, 1),
                         "internal_mib": None if cp.internal_bytes is None else round(cp.internal_bytes / MIB, 1),
                         "cycles": cp.cycles_total, "rw_mib": None if cp.rw_bytes is None else round(cp.rw_bytes / MIB),
                         "predicted_mib": None if pred is None else round(pred / MIB, 1),
                         "error_pct": None if pred is None or not mem else round((pred / mem - 1) * 100, 1)})
    opts = plan.strategy.get("options") or {}
    choices = opts.get("choices", [])
    resident = sum(len(c["blocks"]) for c in choices if c["residency"] == "resident")
    summary = {"model": model.stem, "blocks": len(disc.blocks), "choices": sorted({f"{c['candidate']}/{c['residency']}"
                                                                                   for c in choices}),
               "resident_blocks": resident, "predicted_device_mib": opts.get("predicted_device_mib"),
               "budget_mib": opts.get("budget_mib"), "device_memory_source": opts.get("device_memory_source")}
    return rows, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--toolkit", default="2.5.0")
    ap.add_argument("--work", type=Path, default=Path("/tmp/rkpart-device-table"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    for m in args.models:
        rows, summary = table(m, args.toolkit, args.work, args.steps)
        if args.markdown:
            print(f"\n{m.stem} (rknn-toolkit2 {args.toolkit})\n")
            print("| candidate | stage | weight + internal MiB | Σ cycles | RW MiB | predicted MiB | error |")
            print("|---|---|---|---|---|---|---|")
            for r in rows:
                print(f"| {r['candidate']} | {r['stage']} | {r['weight_mib']} + {r['internal_mib']} | "
                      f"{r['cycles']:.3g} | {r['rw_mib']} | {r['predicted_mib']} | {r['error_pct']:+.1f} % |")
            print(f"\nauto: {', '.join(summary['choices'])}; {summary['resident_blocks']} of {summary['blocks']} "
                  f"blocks resident; {summary['predicted_device_mib']} MiB of {summary['budget_mib']} "
                  f"({', '.join(summary['device_memory_source'] or [])})")
        else:
            print(json.dumps({"rows": rows, "auto": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
