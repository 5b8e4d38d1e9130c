"""Run every tiny diffusers pipeline (tests/models/pipelines.py): what tests/models/test_pipelines.py checks on a
sample, for all families.

Usage: .venv/bin/python scripts/check_pipelines.py [FAMILY ...] [--steps N]

For each family: build (or reuse) the cached folder, load it with ``DiffusionPipeline.from_pretrained``, run
``--steps`` steps with ``output_type="latent"`` and ``"np"``, check finite outputs of the expected shapes and an
identical rerun.  Prints one line per family with its seconds of CPU; exits 1 when any family fails.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.models.pipelines import (
    CFG_CALLS,
    PIPELINES,
    cached_pipeline,
    call_inputs,
    load,
    run_diffusers,
    transformer_calls,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "pipelines.md"
BEGIN, END = "<!-- pipelines-table -->", "<!-- /pipelines-table -->"


def with_table(page: str, table: str) -> str:
    """``page`` with the text between the table markers replaced by ``table``."""
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def check(family: str, steps: int) -> str:
    spec = PIPELINES[family]
    folder = cached_pipeline(family)
    pipe = load(folder)
    embeds, latents = call_inputs(family, seed=0)
    final = run_diffusers(folder, embeds, latents, steps, output_type="latent", pipe=pipe)
    assert final.shape == (spec.final_shape or spec.latent_shape), (final.shape, spec.latent_shape)
    assert np.isfinite(final).all(), "non-finite latent"
    image = run_diffusers(folder, embeds, latents, steps, output_type="np", pipe=pipe)
    assert image.shape == spec.output_shape, (image.shape, spec.output_shape)
    assert np.isfinite(image).all(), "non-finite image"
    again = run_diffusers(folder, embeds, latents, steps, output_type="np", pipe=pipe)
    assert np.array_equal(again, image), "a rerun differs"
    calls = transformer_calls(folder, steps, pipe=pipe)
    assert calls == CFG_CALLS[spec.cfg] * steps, f"CFG {spec.cfg}: transformer calls of batch {calls}"
    return f"latent {final.shape} image {image.shape} std {image.std():.3f} cfg {spec.cfg}"


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", help="families to run (default: all)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--table", action="store_true", help="print docs/pipelines.md's table instead")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/pipelines.md")
    args = ap.parse_args()
    if args.table or args.write_docs:
        from tests.models.pipelines import table

        if args.write_docs:
            DOCS.write_text(with_table(DOCS.read_text(), table()))
        else:
            print(table(), end="")
        return 0
    torch.set_num_threads(1)  # the shared machine: the intra-op pool under load is 10-30x slower on tiny models
    failed = []
    for family in args.families or list(PIPELINES):
        t = time.process_time()
        try:
            what = check(family, args.steps)
        except Exception as exc:  # noqa: BLE001 (report every family, then fail)
            failed.append(family)
            what = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            traceback.print_exc(file=sys.stderr)
        print(f"{family:24s} {time.process_time() - t:6.1f} s  {what}", flush=True)
    if failed:
        print(f"failed: {' '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
