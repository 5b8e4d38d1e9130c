"""Discovery's reachability: hand-written bitsets against NetworkX, at full depth.

The op graph of the full-size Anima DiT (28 blocks) does not depend on the layer widths, so
it is built here at tiny widths (no 3.9 GB of weights): same ops, same edges.  Each variant
runs on the same loaded graph, interleaved, ``--rounds`` times; the medians of CPU time are
printed with their ratio.

* ``discover``: :func:`rkpart.discovery.structure.discover` as it stands.
* ``reach bitsets``: building ``rkpart.ir.reach.Reach`` (every op's ancestors as one int).
* ``reach networkx``: the same ancestor sets from ``nx.ancestors`` per op (what discovery's
  ``is_ancestor`` / ancestor intersections would need without bitsets).
* ``dep bitsets`` / ``dep networkx``: descendants of the stream starts, by bitset propagation
  in topological order vs. ``nx.bfs_layers`` from all starts at once.

``--only NAME`` (repeatable) runs only those variants (``--only discover``: discovery's own time,
e.g. side by side with another tree, without the minutes ``reach networkx`` takes at full depth).

Usage: ``.venv/bin/python bench/graph_algorithms.py [--blocks 28] [--rounds 5] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import chain
from pathlib import Path

import networkx as nx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the example models: tests/models/
from rkpart.discovery import structure as discovery
from rkpart.ir import ModelGraph, load_model
from rkpart.ir.reach import Reach
from tests.models.anima import AnimaConfig, build_anima_onnx


def _cpu(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=28)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", action="append", metavar="NAME", help="run only this variant (repeatable)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_anima_onnx(AnimaConfig.tiny(num_blocks=args.blocks), Path(tmp) / "m.onnx")
        t0 = time.process_time()
        mg: ModelGraph = load_model(path)
        load_s = time.process_time() - t0
    d = discovery.discover(mg)
    starts = [c for t in mg.inputs for c in mg.consumers.get(t, []) if c not in mg.const_ops]
    order = sorted(mg.ops.nodes)

    def reach_nx() -> dict[int, set[int]]:
        return {i: nx.ancestors(mg.ops, i) for i in order}

    def dep_bits() -> int:
        dep = 0
        for c in starts:
            dep |= 1 << c
        for i in order:
            if not dep >> i & 1 and any(dep >> p & 1 for p in mg.ops.predecessors(i)):
                dep |= 1 << i
        return dep

    def dep_nx() -> set[int]:
        return set(chain.from_iterable(nx.bfs_layers(mg.ops, starts)))

    variants: dict[str, Callable[[], object]] = {
        "discover": lambda: discovery.discover(mg),
        "reach bitsets": lambda: Reach(mg),
        "reach networkx": reach_nx,
        "dep bitsets": dep_bits,
        "dep networkx": dep_nx,
    }
    if args.only:
        unknown = sorted(set(args.only) - set(variants))
        if unknown:
            ap.error(f"unknown variant(s) {unknown}; known: {sorted(variants)}")
        variants = {k: v for k, v in variants.items() if k in args.only}
    else:
        assert {i for i in order if dep_bits() >> i & 1} == dep_nx()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for k, fn in variants.items():  # interleaved: every round runs every variant once
            times[k].append(_cpu(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"graph: {args.blocks} blocks, {len(mg.nodes)} nodes, {mg.ops.number_of_nodes()} data ops, "
          f"{mg.ops.number_of_edges()} edges; load {load_s:.2f} s CPU; {len(d.blocks)} blocks found")
    for k, v in med.items():
        print(f"{k:>16}: median {v * 1000:8.1f} ms CPU over {args.rounds} rounds")
    if {"reach networkx", "reach bitsets"} <= set(med):
        print(f"reach: networkx / bitsets = {med['reach networkx'] / med['reach bitsets']:.1f}x")
    if {"dep networkx", "dep bitsets"} <= set(med):
        print(f"dep:   networkx / bitsets = {med['dep networkx'] / med['dep bitsets']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
