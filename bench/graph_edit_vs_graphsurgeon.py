"""The rewrite table on :class:`rkpart.ir.edit.GraphEdit` against onnx-graphsurgeon's import -> export.

The product card names onnx-graphsurgeon for graph editing; this measures whether it serves
the rewrites (``docs/architecture.md``, "The editing view").  Per model, each variant runs in
a fresh interpreter (peak RSS is per process), the variants interleaved, ``--reps`` rounds:

``load``
    ``onnx.load`` with the external data, as :func:`rkpart.compile.prepare.prepare_stage`
    reads a stage: the floor every variant starts from.
``view``
    load, then for 2.3.0 and for 2.5.0: a copy, every ``npu`` row through
    :func:`apply_rewrites` (one view per call, the rows' real matches), serialised.
``gs``
    load, then twice ``gs.import_onnx`` -> ``gs.export_onnx`` with no edit at all (the
    least a rewrite on graphsurgeon costs), serialised.

With ``--baseline DIR`` (another rkpart source tree, e.g. ``git worktree add DIR REV``) its rewrite
table runs too, as ``view@base``, interleaved in the same rounds, and the ratio view / view@base
is printed (``apply_rewrites`` and ``rewrites_for`` have the same signatures before the view).

Printed: medians of CPU seconds and peak RSS above ``load``, the ratios gs / view, and whether
each variant's output is byte-identical to its input when nothing matched (``gs``: import ->
export of an unedited graph; ``view``: a graph with no match is left as it was).

Models: the full-width one-block Anima (hidden 2048, fp16, external data, ~130 MB; written
once to ``--dir`` by ``bench/_full_model.py``'s builder) and a tiny Anima (hidden 256).

Usage: ``PYTHONPATH=$PWD .venv/bin/python bench/graph_edit_vs_graphsurgeon.py --gs-path DIR [--baseline TREE]``
(``DIR``: where ``pip install --target DIR onnx-graphsurgeon`` put it; not a dependency of rkpart).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _child(variant: str, model: str, gs_path: str) -> None:
    """One measured run: load, then (timed, peak RSS) twice the variant's work and its serialisation."""
    import onnx

    def rss() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    hits: dict[str, int] = {}
    gs = None
    if variant == "gs":
        sys.path.insert(0, gs_path)
        import onnx_graphsurgeon as gs
    elif variant == "view":
        from rkpart.targets.rewrites import apply_rewrites, rewrites_for
    m = onnx.load(model)
    rss_load = rss()  # after the imports and the load: the same floor for every variant
    t1 = time.process_time()
    for tk in ("2.3.0", "2.5.0"):  # prepare_stage does one stage per toolkit
        if variant == "view":
            out = onnx.ModelProto()
            out.CopyFrom(m)
            hits.update(apply_rewrites(out, rewrites_for(tk, "npu")))
        elif variant == "gs":
            assert gs is not None
            out = gs.export_onnx(gs.import_onnx(m))
        else:
            out = m
        data = out.SerializeToString(deterministic=True)
        del out, data
    cpu = time.process_time() - t1
    peak = rss()
    # unedited round trip: the view with no row, graphsurgeon import -> export
    before = m.SerializeToString(deterministic=True)
    if variant == "view":
        out = onnx.ModelProto()
        out.CopyFrom(m)
        apply_rewrites(out, ())
    elif variant == "gs":
        assert gs is not None
        out = gs.export_onnx(gs.import_onnx(m))
    else:
        out = m
    identical = out.SerializeToString(deterministic=True) == before
    tree = str(Path(sys.modules["rkpart"].__file__ or "").parents[1]) if "rkpart" in sys.modules else None
    print(json.dumps({"cpu": cpu, "rss_kib": peak, "rss_load_kib": rss_load, "identical": identical, "hits": hits,
                      "tree": tree}))


def _run(variant: str, model: Path, gs_path: str, baseline: Path | None) -> dict[str, object]:
    """One child process; ``view@base`` is the view variant with ``baseline``'s rkpart first on the path."""
    variant, _, base = variant.partition("@")
    env = {**os.environ, "PYTHONPATH": str(baseline.resolve() if base and baseline else ROOT)}
    out = subprocess.run([sys.executable, __file__, "--child", variant, str(model), "--gs-path", gs_path],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _models(folder: Path) -> list[tuple[str, Path]]:
    sys.path.insert(0, str(ROOT))  # the example models: tests/models/ (not in a child: its tree is PYTHONPATH's)
    from tests.models.anima import AnimaConfig, build_anima_onnx

    folder.mkdir(parents=True, exist_ok=True)
    full = folder / "anima_1block_2048_fp16.onnx"
    if not full.exists():
        build_anima_onnx(AnimaConfig.full(resolution=512, num_blocks=1, dtype="float16"), full, external_data=True)
    tiny = folder / "anima_tiny_fp16.onnx"
    if not tiny.exists():
        build_anima_onnx(AnimaConfig(num_blocks=1, hidden=256, heads=2, ffn_dim=1024, context_dim=256, context_len=32,
                                     latent_height=16, latent_width=16, adaln_lora_dim=64, dtype="float16"), tiny)
    return [("tiny Anima (1 block, hidden 256)", tiny), ("full-width Anima (1 block, hidden 2048, ext. data)", full)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gs-path", required=True, help="folder holding onnx_graphsurgeon (pip install --target)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/rkpart-bench-gs"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another rkpart source tree: its rewrite table as view@base")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "MODEL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], args.gs_path)
        return 0
    for label, path in _models(args.dir):
        size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        runs: dict[str, list[dict[str, object]]] = {"load": [], "view": [], "gs": []}
        if args.baseline:
            runs["view@base"] = []
        for _ in range(args.reps):  # interleaved
            for v in runs:
                runs[v].append(_run(v, path, args.gs_path, args.baseline))
        base = statistics.median(float(r["rss_load_kib"]) for r in runs["load"])  # type: ignore[arg-type]
        # peak above the process's own peak right after loading (the load itself is the same for all)
        med = {v: (statistics.median(float(r["cpu"]) for r in rs),  # type: ignore[arg-type]
                   statistics.median(float(r["rss_kib"]) - float(r["rss_load_kib"])  # type: ignore[arg-type]
                                     for r in rs))
               for v, rs in runs.items()}
        print(f"{label}: {size / 2**20:.0f} MiB on disk, load {base / 1024:.0f} MiB peak RSS, "
              f"{args.reps} interleaved runs, medians")
        for v in [k for k in runs if k != "load"]:
            cpu, rss = med[v]
            tree = f" ({runs[v][0]['tree']})" if runs[v][0]["tree"] else ""
            print(f"  {v:9s}{tree}: {cpu:7.3f} s CPU, +{rss / 1024:6.0f} MiB peak RSS over load, "
                  f"byte-identical when unedited: {runs[v][0]['identical']}, rewrites matched: {runs[v][0]['hits']}")
        print(f"  ratio gs / view: CPU {med['gs'][0] / max(med['view'][0], 1e-9):.2f}x, "
              f"extra RSS {med['gs'][1] / max(med['view'][1], 1.0):.2f}x")
        if args.baseline:
            print(f"  ratio view / view@base: CPU {med['view'][0] / max(med['view@base'][0], 1e-9):.2f}x, "
                  f"extra RSS {med['view'][1] / max(med['view@base'][1], 1.0):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
