"""Measure where rknn-toolkit2 places single ops between two matmuls (rk3588, fp16).

Each case is a tiny graph ``x -> MatMul -> OP -> (glue) -> MatMul -> y`` (tokens 16, width 64),
built by each toolkit in a crash-isolated subprocess; the placement is the build's own layer
table (:mod:`rkpart.compile.placement`).  The results are the measured rows of
``rkpart/targets/rk3588.py`` (``_MEASURED_BY_TOOLKIT``).  Usage::

    python scripts/measure_ops.py --toolkits 2.3.0,2.5.0 [--only TopK,IsNaN] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.compile.placement import parse_layer_table
from rkpart.compile.toolkits import find_toolkit
from rkpart.triage.matrix import build_once

T, D = 16, 64
Nodes = list[onnx.NodeProto]


def _f(name: str, arr: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(arr, name)


def _i64(name: str, values: list[int] | np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _case(op: str) -> tuple[Nodes, list[TensorProto], list[int]]:
    """Nodes from ``t`` [1, T, D] to ``u`` (float), their constants, and ``u``'s shape."""
    rng = np.random.default_rng(0)
    idx2 = rng.integers(0, D, size=(1, T, 2))
    cases: dict[str, Callable[[], tuple[Nodes, list[TensorProto], list[int]]]] = {
        "TopK": lambda: ([helper.make_node("TopK", ["t", "k"], ["u", "ti"], axis=-1)], [_i64("k", [2])], [1, T, 2]),
        "ArgMax": lambda: ([helper.make_node("ArgMax", ["t"], ["am"], axis=-1, keepdims=1),
                            helper.make_node("Cast", ["am"], ["amf"], to=TensorProto.FLOAT),
                            helper.make_node("Mul", ["t", "amf"], ["u"])], [], [1, T, D]),
        "GatherElements": lambda: ([helper.make_node("GatherElements", ["t", "gi"], ["u"], axis=-1)],
                                   [_i64("gi", idx2)], [1, T, 2]),
        "ScatterElements": lambda: ([helper.make_node("Slice", ["t", "s0", "s2", "sax"], ["upd"]),
                                     helper.make_node("ScatterElements", ["t", "gi", "upd"], ["u"], axis=-1)],
                                    [_i64("gi", idx2), _i64("s0", [0]), _i64("s2", [2]), _i64("sax", [-1])],
                                    [1, T, D]),
        "OneHot": lambda: ([helper.make_node("ArgMax", ["t"], ["am"], axis=-1, keepdims=0),
                            helper.make_node("OneHot", ["am", "depth", "ohv"], ["u"], axis=-1)],
                           [_i64("depth", [D]), _f("ohv", np.array([0, 1], dtype=np.float32))], [1, T, D]),
        "Gather-data-indices": lambda: ([helper.make_node("ArgMax", ["t"], ["am"], axis=-1, keepdims=0),
                                         helper.make_node("Gather", ["emb", "am"], ["u"], axis=0)],
                                        [_f("emb", rng.normal(size=(D, D)).astype(np.float32))], [1, T, D]),
        "IsNaN": lambda: ([helper.make_node("IsNaN", ["t"], ["nan"]),
                           helper.make_node("Where", ["nan", "zero", "t"], ["u"])],
                          [_f("zero", np.array(0, dtype=np.float32))], [1, T, D]),
        "IsInf": lambda: ([helper.make_node("IsInf", ["t"], ["inf"]),
                           helper.make_node("Where", ["inf", "zero", "t"], ["u"])],
                          [_f("zero", np.array(0, dtype=np.float32))], [1, T, D]),
        "Equal": lambda: ([helper.make_node("Equal", ["t", "t"], ["eq"]),
                           helper.make_node("Where", ["eq", "t", "zero"], ["u"])],
                          [_f("zero", np.array(0, dtype=np.float32))], [1, T, D]),
        "Mod": lambda: ([helper.make_node("Mod", ["t", "three"], ["u"], fmod=1)],
                        [_f("three", np.array(3, dtype=np.float32))], [1, T, D]),
        "Expand": lambda: ([helper.make_node("ReduceSum", ["t", "ax"], ["rs"], keepdims=1),
                            helper.make_node("Expand", ["rs", "shp"], ["u"])],
                           [_i64("ax", [-1]), _i64("shp", [1, T, D])], [1, T, D]),
        "Tile": lambda: ([helper.make_node("Slice", ["t", "s0", "s2", "sax"], ["sl"]),
                          helper.make_node("Tile", ["sl", "reps"], ["u"])],
                         [_i64("s0", [0]), _i64("s2", [D // 4]), _i64("sax", [-1]), _i64("reps", [1, 1, 4])],
                         [1, T, D]),
        "ScatterND": lambda: ([helper.make_node("ScatterND", ["t", "ndi", "upd"], ["u"])],
                              [_i64("ndi", [[[0, 0]], ]), _f("upd", rng.normal(size=(1, 1, D)).astype(np.float32))],
                              [1, T, D]),
        "ReduceMax": lambda: ([helper.make_node("ReduceMax", ["t"], ["rm"], axes=[-1], keepdims=1),
                               helper.make_node("Sub", ["t", "rm"], ["u"])], [], [1, T, D]),
        "Einsum": lambda: ([helper.make_node("Einsum", ["t", "ew"], ["u"], equation="bij,jk->bik")],
                           [_f("ew", rng.normal(size=(D, D)).astype(np.float32))], [1, T, D]),
    }
    return cases[op]()


OPS = ("TopK", "ArgMax", "GatherElements", "ScatterElements", "OneHot", "Gather-data-indices", "IsNaN", "IsInf",
       "Equal", "Mod", "Expand", "Tile", "ScatterND", "ReduceMax", "Einsum")


def model_for(op: str) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    body, consts, shape = _case(op)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["t"], name="mm_in"), *body,
             helper.make_node("MatMul", ["u", "w2"], ["y"], name="mm_out")]
    for k, n in enumerate(nodes):
        if not n.name:
            n.name = f"{n.op_type.lower()}_{k}"
    inits = [_f("w1", rng.normal(size=(D, D)).astype(np.float32)),
             _f("w2", rng.normal(size=(shape[-1], D)).astype(np.float32)), *consts]
    g = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, D])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def measure(op: str, version: str, work: Path) -> dict[str, object]:
    tk = find_toolkit(version)
    path = work / f"{op}.onnx"
    onnx.save(model_for(op), path)
    log = work / f"{op}-{version}.log"
    res = build_once(path, tk, target="rk3588", log=log, timeout=600)
    if not res.ok:
        return {"op": op, "toolkit": version, "built": False, "why": res.message}
    rows = parse_layer_table(log.read_text(errors="replace"))
    cpu = [f"{r.op_type}:{r.name.partition(':')[2]}" for r in rows if r.target == "CPU"
           and r.op_type not in ("InputOperator", "OutputOperator")]
    return {"op": op, "toolkit": version, "built": True, "cpu_layers": cpu,
            "layers": [f"{r.op_type}/{r.target}" for r in rows if r.op_type not in ("InputOperator", "OutputOperator")]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toolkits", default="2.3.0,2.5.0")
    ap.add_argument("--only", default="")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    ops = [o for o in OPS if not a.only or o in a.only.split(",")]
    out = []
    with tempfile.TemporaryDirectory(prefix="rkpart-measure-ops-") as d:
        for op in ops:
            for v in a.toolkits.split(","):
                r = measure(op, v, Path(d))
                out.append(r)
                where = ("build failed: " + str(r["why"])) if not r["built"] else (
                    "CPU: " + ", ".join(r["cpu_layers"]) if r["cpu_layers"] else "all on the NPU")  # type: ignore[arg-type]
                print(f"{op:22s} {v}  {where}   [{' '.join(r.get('layers', []))}]", flush=True)  # type: ignore[arg-type]
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
