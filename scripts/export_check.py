"""Export every family of the sweep through ``rkpart.export.export_module`` with its ONNX Runtime check.

The test suite checks a sample (``tests/export/``); this runs the whole matrix: each family of
``tests/models/diffusers_families.py`` (or those named), each exporter, each dtype, with the
product's checks on (every rewrite against the unpatched model, the export against torch under
ONNX Runtime on the example inputs and on a second value of every mask input).  One line a case:

    family exporter dtype status seconds [cosine max|diff|/max|torch| input-sets | the error's line]

usage: python scripts/export_check.py [--exporter torchscript|dynamo]... [--dtype float32|float16]...
                                      [--family NAME]... [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from rkpart.errors import RkpartError
    from rkpart.export import export_module
    from tests.models.diffusers_families import ALL, SIZED, _prepared

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exporter", action="append", choices=["torchscript", "dynamo"])
    ap.add_argument("--dtype", action="append", choices=["float32", "float16"])
    ap.add_argument("--family", action="append", choices=sorted(ALL))
    ap.add_argument("--json", type=Path, help="write the rows as JSON too")
    args = ap.parse_args()
    rows = []
    for fam in args.family or [f for f in ALL if f not in SIZED]:
        for exporter in args.exporter or ["torchscript", "dynamo"]:
            for dtype in args.dtype or ["float32"]:
                t0 = time.perf_counter()
                row: dict[str, object] = {"family": fam, "exporter": exporter, "dtype": dtype}
                with tempfile.TemporaryDirectory() as td:
                    model, inputs, fixed = _prepared(fam, 0)
                    try:
                        res = export_module(model, inputs, Path(td) / "t.onnx", fixed=fixed, exporter=exporter,
                                            dtype=dtype)
                    except RkpartError as e:
                        row.update(status="error", exit=e.exit_code, error=str(e))
                    else:
                        assert res.check is not None
                        row.update(status="ok", cosine=res.check.cosine, input_sets=res.check.input_sets,
                                   rel=res.check.max_abs / max(res.check.ref_max_abs, 1e-30),
                                   patches=[p.name for p in res.patches], unused=list(res.unused))
                row["seconds"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                tail = (f"{row['cosine']:.7f} {row['rel']:.2e} {row['input_sets']}" if row["status"] == "ok"
                        else str(row["error"]))
                print(f"{fam} {exporter} {dtype} {row['status']} {row['seconds']} {tail}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
