"""Write the full-size Anima DiT (28 blocks, hidden 2048, fp16, external data) and time it.

Prints elapsed time, peak RSS and file sizes.  The point is that weights are streamed: peak
RSS should stay near one tensor (~64 MB for an FFN weight in fp32) plus the interpreter, far
below the ~3.9 GB of weights.

Usage: ``.venv/bin/python bench/make_full_model.py [--out /tmp/anima_full/anima_512_fp16.onnx]
[--resolution 512] [--dtype float16] [--decomposed-layernorm] [--check] [--delete]``
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the example models: tests/models/
from tests.models.anima import AnimaConfig, build_anima_onnx, weight_bytes


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/anima_full/anima_512_fp16.onnx"))
    parser.add_argument("--resolution", type=int, default=512)
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decomposed-layernorm", action="store_true")
    parser.add_argument("--check", action="store_true",
                        help="afterwards: onnx.checker on the path and strict shape inference")
    parser.add_argument("--delete", action="store_true", help="remove the files at the end")
    args = parser.parse_args(argv)

    cfg = AnimaConfig.full(resolution=args.resolution, dtype=args.dtype)
    print(f"config: {cfg}")
    print(f"params: {cfg.param_count() / 1e9:.3f} B, weights {weight_bytes(cfg) / 1e9:.3f} GB")
    rss0 = _peak_rss_mb()
    t0 = time.perf_counter()
    path = build_anima_onnx(cfg, args.out, seed=args.seed, external_data=True,
                            decomposed_layernorm=args.decomposed_layernorm)
    elapsed = time.perf_counter() - t0
    data = path.with_name(path.name + ".data")
    print(f"build: {elapsed:.1f} s, peak RSS {_peak_rss_mb():.0f} MB (before build {rss0:.0f} MB)")
    print(f"files: {path} {path.stat().st_size / 1e6:.2f} MB, {data} {data.stat().st_size / 1e9:.3f} GB")

    if args.check:
        import onnx

        t1 = time.perf_counter()
        onnx.checker.check_model(str(path))  # by path: works past 2 GB
        model = onnx.load(str(path), load_external_data=False)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        print(f"check: {len(model.graph.node)} nodes, {len(inferred.graph.value_info)} inferred shapes, "
              f"{time.perf_counter() - t1:.1f} s, peak RSS {_peak_rss_mb():.0f} MB")
    if args.delete:
        path.unlink()
        data.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
