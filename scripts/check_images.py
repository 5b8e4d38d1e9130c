"""The board runner's image against diffusers' own, for every family ``rkpart export`` takes.

For each family of tests/models/pipelines.py (image pipelines, then the video ones at one frame, whose
frames the runner writes one PNG each): ``rkpart export`` (cached), partition
(``fused``), compile (rknn-toolkit2, ``--toolkit``; the build cache makes reruns fast), ``rkpart bundle``
with the VAE decoder (``--vae host`` or ``npu``), then the bundle's own runner.py on seeded embeddings and
``latents=`` for ``--steps`` steps at the pipeline's default guidance, NPU stages on the ONNX Runtime
stand-in (``--sim``: in the toolkit's simulator), against ``pipe(..., output_type="latent")`` (cosine) and
``output_type="np"`` (PSNR over 8-bit pixels).  Prints one Markdown row per family; a family ``rkpart
export`` refuses is listed with its reason.  The test suite runs a sample (tests/board/test_images.py).

    PYTHONPATH=. RKPART_TOOLKITS_DIR=~/.cache/rkpart/toolkits .venv/bin/python scripts/check_images.py \\
        [FAMILY ...] [--vae host|npu|auto] [--sim | --host] [--steps 20] [--toolkit 2.5.0] [--work DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from rkpart.compile.toolkits import find_toolkit
    from rkpart.errors import UserError
    from tests.board import images as im
    from tests.models import pipelines as tp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = im.IMAGE_FAMILIES + im.VIDEO_FAMILIES
    ap.add_argument("families", nargs="*", help=f"families [default: every one: {', '.join(every)}]")
    ap.add_argument("--vae", choices=("host", "npu", "auto"), default="host",
                    help="where the VAE decoder runs (auto: the NPU, the host when its NPU plan fails its gate)")
    ap.add_argument("--sim", action="store_true", help="NPU stages in the rknn-toolkit2 simulator (resident)")
    ap.add_argument("--steps", type=int, default=im.STEPS)
    ap.add_argument("--toolkit", default="2.5.0")
    ap.add_argument("--strategy", default="fused", help="how the transformer is partitioned [default: fused]")
    ap.add_argument("--host", action="store_true",
                    help="every transformer stage on ONNX Runtime (generic, device=host): no toolkit build; the "
                         "runner's loop, sampler and decoder are the same (not with --sim or --vae npu)")
    ap.add_argument("--work", type=Path, default=None, help="folder for plans and bundles [default: a temp folder]")
    args = ap.parse_args(argv)
    if args.host and (args.sim or args.vae != "host"):
        ap.error("--host runs no NPU stage: not with --sim or --vae npu/auto")
    tk = None if args.host else find_toolkit(args.toolkit)
    work = args.work or Path(tempfile.mkdtemp(prefix="check-images-"))
    where = ("rknn-toolkit2 simulator" if args.sim else "ONNX Runtime stand-in" if not args.host
             else "host (no NPU stage)")
    print(f"{args.steps} steps, default guidance, VAE decoder: {args.vae}, NPU stages on the {where}\n")
    print("| family | pipeline | sampler | CFG | features (pipeline.json) | VAE | latent cosine | image PSNR | s |")
    print("| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |")
    failed = 0
    backend = None
    for fam in args.families or every:
        spec = tp.PIPELINES[fam]
        t0 = time.monotonic()
        try:
            plan = im.compiled_plan(fam, work, tk, args.strategy)
        except UserError as e:
            print(f"| {fam} | {spec.pipeline} | | | | | not exported (exit {e.exit_code}): {e} | | "
                  f"{time.monotonic() - t0:.0f} |", flush=True)
            continue
        try:
            board = im.make_board(plan, work / f"{fam}-{args.vae}-board", vae=args.vae)
            ref = im.reference(fam, steps=args.steps)
            api, standin, residency = None, [plan], None
            if args.sim:
                from rkpart.runtime.rknn_sim import RknnSimBackend
                from tests.board.sim_rknnlite import sim_rknnlite

                backend = backend or RknnSimBackend()
                vae_plan = im.bundle_runner(board).read_manifest(board).get("vae", {}).get("plan")
                api = sim_rknnlite([plan, *([Path(vae_plan)] if vae_plan else [])], backend)
                standin, residency = None, "resident"
            else:
                vae_plan = im.bundle_runner(board).read_manifest(board)["vae"].get("plan")
                standin = [plan, *([Path(vae_plan)] if vae_plan else [])]
            x, img = im.run_board(board, ref, steps=args.steps, standin=standin, rknnlite_api=api, residency=residency)
            cos, db = im.cosine(x, ref.latent), im.psnr(img, ref.image)
            ok = cos >= im.MIN_COSINE and db >= im.MIN_PSNR
            m = im.bundle_runner(board).read_manifest(board)
            p = m["denoise"]["pipeline"]
            row = (f"| {fam} | {p['class']} | {p['sampler']['class']} | {m['denoise']['cfg_mode']} | "
                   f"{', '.join(p.get('features') or []) or '-'} | {m['vae']['device']} | {cos:.7f} | {db:.1f} dB |")
        except Exception as e:  # noqa: BLE001 - a row of the table, not a crash of the sweep
            ok, row = False, f"| {fam} | {spec.pipeline} | | | | | failed: {type(e).__name__}: {str(e)[:200]} | |"
        failed += not ok
        print(f"{row} {time.monotonic() - t0:.0f} |", flush=True)
    if backend is not None:
        backend.close()
    print(f"\n{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
