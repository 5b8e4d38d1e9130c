"""Which memory-only rewrites compile keeps, per stage: one block of the onnx-built Anima, compiled with weighing.

For each strategy the block is partitioned and compiled (``rkpart compile`` with its default weighing,
:mod:`rkpart.compile.weigh`); a row per stage that a weighed rewrite matched: the verdict and both builds'
figures (the compiler's CPU layers, weight + internal memory).  Used to find the smallest model of
``tests/compile/test_weigh_real.py``: at 4 heads x 128 and 4096 tokens ``heads-table-layout`` loses in the
fused block (204.23 against 200.23 MiB) and wins in the split self-attention (182.19 against 186.19 MiB).

Usage: ``.venv/bin/python bench/weigh_probe.py --heads 4 --head-dim 128 --latent 128 [--strategy fused,split]
[--toolkit 2.5.0] [--resolution 1024 (the full-width block instead)] [--out DIR]``.  Builds go to a build
cache of their own under DIR (default: a temporary folder, deleted).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rkpart.compile.compile import CompileOptions, compile_plan_report  # noqa: E402
from rkpart.pipeline import partition  # noqa: E402
from tests.models.anima import AnimaConfig, build_anima_onnx  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--latent", type=int, default=128, help="latent height = width (tokens: (latent / 2)^2)")
    ap.add_argument("--resolution", type=int, default=0, help="the full-width Anima block at this many px instead")
    ap.add_argument("--strategy", default="fused,split")
    ap.add_argument("--toolkit", default="2.5.0")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="weigh-probe-") as tmp:
        out = a.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        if a.resolution:
            cfg = dataclasses.replace(AnimaConfig.full(resolution=a.resolution), num_blocks=1)
        else:
            hidden = a.heads * a.head_dim
            cfg = AnimaConfig(num_blocks=1, hidden=hidden, heads=a.heads, ffn_dim=4 * hidden, context_dim=256,
                              context_len=64, latent_height=a.latent, latent_width=a.latent, adaln_lora_dim=32)
        model = build_anima_onnx(cfg, out / "model.onnx")
        for strategy in a.strategy.split(","):
            folder = out / strategy
            plan = partition(model, folder, strategy)
            t0 = time.monotonic()
            rep = compile_plan_report(plan, folder, CompileOptions(a.toolkit, shared_cache=out / "cache", learn=False),
                                      progress=lambda m: print(m, file=sys.stderr, flush=True))
            for o in rep.outcomes:
                if o.weighed is None:
                    continue
                print(json.dumps({"hidden": cfg.hidden, "heads": cfg.heads, "tokens": cfg.num_tokens,
                                  "strategy": strategy, "stage": o.stage_id, "toolkit": a.toolkit,
                                  **o.weighed.to_json(), "compile_s": round(time.monotonic() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
