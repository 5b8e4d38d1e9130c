"""``rkpart export`` on every tiny pipeline of tests/models/pipelines.py, and its description checked against diffusers.

For each family: ``export_pipeline`` (cached by source, :mod:`tests.export.exports`), then the loop written
from ``pipeline.json`` alone (:mod:`tests.export.loop`) against diffusers' own call on other inputs (4
steps, guidance + 1.25).  Prints one Markdown row per family: what it exported as, or the one line it was
refused with.  The test suite runs a sample (tests/export/test_export_pipeline.py); this runs all.

    PYTHONPATH=. .venv/bin/python scripts/export_pipelines.py [FAMILY ...] [--exporter dynamo] [--dtype float16]
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    from rkpart.errors import UserError
    from tests.export.exports import cached_pipeline_export
    from tests.export.loop import cosine, psnr, run_description
    from tests.models import pipelines as tp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", help="families (default: every tiny pipeline)")
    ap.add_argument("--exporter", default="torchscript")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    opts = {k: v for k, v in (("exporter", args.exporter), ("dtype", args.dtype))
            if v != {"exporter": "torchscript", "dtype": "float32"}[k]}
    families = args.families or list(tp.PIPELINES)
    print("| family | pipeline | result | CFG | inputs (role) | latent cosine / image PSNR vs diffusers | s |")
    print("| --- | --- | --- | --- | --- | --- | ---: |")
    failed = 0
    for fam in families:
        spec = tp.PIPELINES[fam]
        t0 = time.monotonic()
        try:
            folder = cached_pipeline_export(fam, **opts)
        except UserError as e:
            took = time.monotonic() - t0
            print(f"| {fam} | {spec.pipeline} | refused (exit {e.exit_code}): {e} | | | | {took:.0f} |", flush=True)
            continue
        doc = json.loads((folder / "pipeline.json").read_text())
        roles = ", ".join(f"{k} ({v['role']})" for k, v in doc["inputs"].items())
        src = tp.cached_pipeline(fam)
        embeds, latents = tp.call_inputs(fam, seed=7)
        g = spec.guidance + 1.25
        try:
            pipe = tp.load(src)
            # a pipeline that draws its own noise (DiT) draws it from the seed call_inputs drew it with
            seed = 7 if spec.noise_from_generator else 0
            want_l = tp.run_diffusers(src, embeds, latents, 4, g, "latent", pipe=pipe, seed=seed)
            want_i = tp.run_diffusers(src, embeds, latents, 4, g, "np", pipe=pipe, seed=seed)
            got_l, got_i = run_description(folder, embeds, latents, 4, g)
            cos, db = cosine(got_l, want_l), psnr(got_i, want_i) if got_i is not None else float("nan")
            check = f"{cos:.6f} / {db:.1f} dB"
            ok = cos >= 0.9999 and db >= 35
        except Exception as e:  # noqa: BLE001 - a row of the table, not a crash of the sweep
            check, ok = f"loop failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", False
        failed += not ok
        print(f"| {fam} | {spec.pipeline} | exported | {doc['cfg']['mode']} | {roles} | {check} | "
              f"{time.monotonic() - t0:.0f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
