"""Where the compiler places the head layouts of real widths: per-head norms, RoPE, GQA repeats.

Each probe is the attention of one head layout as diffusers' processors export it (TorchScript, opset 17),
cut to the ops around the layout: ``x [1, T, H·d]`` (a projection's output, a graph input) ``-> Reshape
[1, T, H, d] -> Transpose [1, H, T, d]``, then the pattern, then a scaled dot-product attention with ``k``/``v``
graph inputs and the ``Transpose/Reshape`` back to ``[1, T, H·d]``.  Built by a toolkit (crash-isolated, the
``.rknn`` discarded): the row is the build's layers on the CPU (:mod:`rkpart.compile.placement`) and its internal
memory.  Optionally each probe is built after rkpart's NPU rewrites (``--rewrites``: what ``rkpart compile``
would build).

Patterns (``--pattern``):

``norm``
    q/k LayerNorm over the head dim (HunyuanDiT: ``norm_q`` of ``[1, H, T, d]``).
``rms``
    the same as an RMSNorm (Pow, ReduceMean, Add, Sqrt, Div, Mul: the TorchScript decomposition).
``rope-interleaved``
    RoPE of interleaved pairs, ``x.reshape(..., d/2, 2).unbind(-1)``, ``stack(-x2, x1).flatten`` (HunyuanDiT,
    Flux: diffusers' ``apply_rotary_emb(use_real_unbind_dim=-1)``), tables ``[1, 1, T, d]``.
``norm-rope``
    ``norm`` then ``rope-interleaved`` (HunyuanDiT's attention).
``gqa``
    the key/value heads repeated (``Unsqueeze/Expand/Reshape``, Lumina2's processor), ``H / Hk`` each.
``plain``
    nothing between the head split and the attention (DiT, PixArt).

Usage: ``.venv/bin/python bench/layout_probe.py --pattern norm --head-dim 64,72,88 --tokens 1024 [--heads 16]
[--kv-heads 8] [--toolkits 2.5.0] [--rewrites] [--out FILE.jsonl]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

Nodes = list[onnx.NodeProto]
Inits = list[onnx.TensorProto]


def _c(name: str, arr: Any, dtype: Any = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr, dtype=dtype), name)


def _norm(x: str, out: str, d: int, rms: bool, tag: str) -> tuple[Nodes, Inits]:
    rng = np.random.default_rng(1)
    w = _c(f"{tag}_w", 1 + 0.1 * rng.standard_normal(d))
    if not rms:
        b = _c(f"{tag}_b", 0.1 * rng.standard_normal(d))
        return [helper.make_node("LayerNormalization", [x, w.name, b.name], [out], axis=-1, epsilon=1e-6)], [w, b]
    two, eps = _c(f"{tag}_two", 2.0), _c(f"{tag}_eps", 1e-6)
    ax = _c(f"{tag}_ax", [-1], np.int64)
    return [helper.make_node("Pow", [x, two.name], [f"{tag}_p"]),
            helper.make_node("ReduceMean", [f"{tag}_p"], [f"{tag}_m"], axes=[-1], keepdims=1),
            helper.make_node("Add", [f"{tag}_m", eps.name], [f"{tag}_a"]),
            helper.make_node("Sqrt", [f"{tag}_a"], [f"{tag}_s"]),
            helper.make_node("Div", [x, f"{tag}_s"], [f"{tag}_n"]),
            helper.make_node("Mul", [f"{tag}_n", w.name], [out])], [w, two, eps, ax][:3]


def _rope_interleaved(x: str, out: str, shape: list[int], tag: str) -> tuple[Nodes, Inits]:
    """diffusers' ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-1)`` as TorchScript writes it."""
    *lead, d = shape
    t = shape[-2]
    rng = np.random.default_rng(2)
    ang = rng.uniform(0, 3, size=(t, d // 2))
    cos = np.repeat(np.cos(ang), 2, axis=-1)[None, None]
    sin = np.repeat(np.sin(ang), 2, axis=-1)[None, None]
    inits = [_c(f"{tag}_cos", cos), _c(f"{tag}_sin", sin), _c(f"{tag}_pairs", [*lead, d // 2, 2], np.int64),
             _c(f"{tag}_flat", shape, np.int64), _c(f"{tag}_split", [1, 1], np.int64), _c(f"{tag}_ax", [-1], np.int64)]
    nodes = [helper.make_node("Reshape", [x, f"{tag}_pairs"], [f"{tag}_r"]),
             helper.make_node("Split", [f"{tag}_r", f"{tag}_split"], [f"{tag}_x1", f"{tag}_x2"], axis=-1),
             helper.make_node("Squeeze", [f"{tag}_x1", f"{tag}_ax"], [f"{tag}_s1"]),
             helper.make_node("Squeeze", [f"{tag}_x2", f"{tag}_ax"], [f"{tag}_s2"]),
             helper.make_node("Neg", [f"{tag}_s2"], [f"{tag}_n2"]),
             helper.make_node("Unsqueeze", [f"{tag}_n2", f"{tag}_ax"], [f"{tag}_u2"]),
             helper.make_node("Unsqueeze", [f"{tag}_s1", f"{tag}_ax"], [f"{tag}_u1"]),
             helper.make_node("Concat", [f"{tag}_u2", f"{tag}_u1"], [f"{tag}_c"], axis=-1),
             helper.make_node("Reshape", [f"{tag}_c", f"{tag}_flat"], [f"{tag}_rot"]),
             helper.make_node("Mul", [x, f"{tag}_cos"], [f"{tag}_xc"]),
             helper.make_node("Mul", [f"{tag}_rot", f"{tag}_sin"], [f"{tag}_rs"]),
             helper.make_node("Add", [f"{tag}_xc", f"{tag}_rs"], [out])]
    return nodes, inits


def probe_model(pattern: str, heads: int, tokens: int, dim: int, kv_heads: int = 0) -> onnx.ModelProto:
    """The probe graph of one pattern and head layout (see the module docstring)."""
    f = TensorProto.FLOAT
    kv = kv_heads or heads
    h, t, d = heads, tokens, dim
    nodes: Nodes = [
        helper.make_node("Reshape", ["x", "heads_shape"], ["xh"]),
        helper.make_node("Transpose", ["xh"], ["q0"], perm=[0, 2, 1, 3]),
    ]
    inits: Inits = [_c("heads_shape", [1, t, h, d], np.int64), _c("scale", 1 / np.sqrt(d)),
                    _c("out_shape", [1, t, h * d], np.int64)]
    q = "q0"
    steps: dict[str, Callable[[str, str], tuple[Nodes, Inits]]] = {
        "norm": lambda a, b: _norm(a, b, d, False, "nq"),
        "rms": lambda a, b: _norm(a, b, d, True, "nq"),
        "rope-interleaved": lambda a, b: _rope_interleaved(a, b, [1, h, t, d], "rq"),
    }
    for k, step in enumerate({"norm": ["norm"], "rms": ["rms"], "rope-interleaved": ["rope-interleaved"],
                              "norm-rope": ["norm", "rope-interleaved"], "gqa": [], "plain": []}[pattern]):
        n, i = steps[step](q, f"q{k + 1}")
        nodes += n
        inits += i
        q = f"q{k + 1}"
    k_, v_ = "k", "v"
    if kv != h:
        inits += [_c("ax2", [2], np.int64), _c("exp", [1, kv, h // kv, t, d], np.int64),
                  _c("kv_shape", [1, h, t, d], np.int64)]
        for name in ("k", "v"):
            nodes += [helper.make_node("Unsqueeze", [name, "ax2"], [f"{name}_u"]),
                      helper.make_node("Expand", [f"{name}_u", "exp"], [f"{name}_e"]),
                      helper.make_node("Reshape", [f"{name}_e", "kv_shape"], [f"{name}_r"])]
        k_, v_ = "k_r", "v_r"
    nodes += [helper.make_node("Transpose", [k_], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", [q, "kt"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", v_], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "out_shape"], ["y"])]
    g = helper.make_graph(nodes, f"probe-{pattern}", [
        helper.make_tensor_value_info("x", f, [1, t, h * d]),
        helper.make_tensor_value_info("k", f, [1, kv, t, d]),
        helper.make_tensor_value_info("v", f, [1, kv, t, d])],
        [helper.make_tensor_value_info("y", f, [1, t, h * d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def build(model: onnx.ModelProto, toolkit: str, work: Path, name: str, rewrites: bool) -> dict[str, Any]:
    """Build ``model`` once; its CPU layers (op types and shapes), internal memory, rewrites applied."""
    from rkpart.compile.compiler_plan import parse_layer_rows, parse_memory
    from rkpart.compile.toolkits import find_toolkit
    from rkpart.targets.rewrites import apply_rewrites, compile_rewrites_for
    from rkpart.triage.matrix import build_once

    applied: dict[str, int] = {}
    if rewrites:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        applied = apply_rewrites(model, compile_rewrites_for(toolkit))
    path = work / f"{name}.onnx"
    onnx.save(model, str(path))
    log = path.with_suffix(f".{toolkit}.log")
    t0 = time.monotonic()
    res = build_once(path, find_toolkit(toolkit), target="rk3588", log=log, label=name)
    text = log.read_text(errors="replace") if log.is_file() else ""
    rows = parse_layer_rows(text) or []
    _, internal = parse_memory(text)
    cpu = [f"{r.op_type} {r.inputs} -> {r.outputs}" for r in rows
           if r.target == "CPU" and r.op_type not in ("InputOperator", "OutputOperator")]
    return {"kind": res.kind, "cpu": cpu, "internal_bytes": internal, "rewrites": applied,
            "build_s": round(time.monotonic() - t0, 1), "log": str(log)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pattern", required=True,
                    choices=["norm", "rms", "rope-interleaved", "norm-rope", "gqa", "plain"])
    ap.add_argument("--head-dim", default="64,72,88,96,128")
    ap.add_argument("--tokens", default="1024")
    ap.add_argument("--heads", default="16")
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--toolkits", default="2.5.0")
    ap.add_argument("--rewrites", action="store_true", help="build after rkpart's NPU rewrites")
    ap.add_argument("--keep", type=Path, default=None, help="keep the probe models and logs here")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rkpart-probe-") as td:
        work = a.keep or Path(td)
        work.mkdir(parents=True, exist_ok=True)
        for tk in a.toolkits.split(","):
            for h in (int(x) for x in a.heads.split(",")):
                for t in (int(x) for x in a.tokens.split(",")):
                    for d in (int(x) for x in a.head_dim.split(",")):
                        name = f"{a.pattern}-h{h}-t{t}-d{d}" + (f"-kv{a.kv_heads}" if a.kv_heads else "")
                        row = {"pattern": a.pattern, "heads": h, "tokens": t, "head_dim": d, "kv_heads": a.kv_heads,
                               "toolkit": tk, **build(probe_model(a.pattern, h, t, d, a.kv_heads), tk, work, name,
                                                      a.rewrites)}
                        print(json.dumps(row), flush=True)
                        if a.out:
                            with a.out.open("a") as fh:
                                fh.write(json.dumps(row, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
