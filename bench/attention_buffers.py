"""What the compiler allocates for one attention, by heads, tokens, keys and head dim.

Each case is one scaled dot-product attention as the exporters write it, ``q [1, H, T, d]``, ``k``, ``v``
``[1, Hk, K, d]`` graph inputs (``Hk`` < ``H``: grouped-query attention, the key/value heads repeated with
``Unsqueeze/Expand/Reshape`` as diffusers' processors do), ``MatMul(q, kᵀ) · scale -> Softmax -> MatMul v``,
``Transpose`` back to ``[1, T, H·d]``.  Built by each toolkit (crash-isolated, the ``.rknn`` discarded); the
row is the build's own "Feature Tensor Information Table" (:func:`rkpart.compile.compiler_plan.parse_feature_tensors`):
the fused ``exSDPAttention``'s scratch buffer (``..._exSecondary``), the internal memory, the layers on the CPU.

The device-memory model's attention term (:mod:`rkpart.cost_model.device_model`) is fitted on these.

Usage: ``.venv/bin/python bench/attention_buffers.py [--toolkits 2.5.0,2.3.0] [--out FILE.jsonl] [--cases small]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

#: (heads, query tokens, key tokens, head dim, key/value heads); a base case and one factor varied at a time
BASE = (16, 1024, 1024, 64, 16)
CASES: tuple[tuple[int, int, int, int, int], ...] = (
    BASE,
    *((h, 1024, 1024, 64, h) for h in (1, 4, 8, 24, 32)),
    *((16, t, t, 64, 16) for t in (256, 512, 1536)),
    *((16, 1024, k, 64, 16) for k in (77, 120, 256, 333, 512)),
    *((16, 1024, 1024, d, 16) for d in (32, 40, 72, 88, 96, 112, 128, 256)),
    (70, 1024, 1024, 32, 70), (24, 1024, 1024, 96, 8), (24, 1280, 1280, 96, 8), (12, 1280, 1280, 256, 12),
    (24, 1536, 1536, 128, 24), (20, 1024, 300, 112, 20), (64, 1248, 1248, 40, 64), (16, 1024, 333, 88, 16),
    (32, 1280, 1280, 128, 32), (28, 1280, 1280, 64, 28),
)


def attention_model(heads: int, tokens: int, keys: int, dim: int, kv_heads: int) -> onnx.ModelProto:
    """The attention of one case, opset 17, float32 graph inputs."""
    f = TensorProto.FLOAT
    nodes = []
    inits = [numpy_helper.from_array(np.array(1 / np.sqrt(dim), dtype=np.float32), "scale")]
    k, v = "k", "v"
    if kv_heads != heads:  # diffusers' repeat: [1, Hk, K, d] -> [1, Hk, 1, K, d] -> expand -> [1, H, K, d]
        rep = heads // kv_heads
        inits += [numpy_helper.from_array(np.array([2], dtype=np.int64), "ax2"),
                  numpy_helper.from_array(np.array([1, kv_heads, rep, keys, dim], dtype=np.int64), "exp"),
                  numpy_helper.from_array(np.array([1, heads, keys, dim], dtype=np.int64), "shp")]
        for t in ("k", "v"):
            nodes += [helper.make_node("Unsqueeze", [t, "ax2"], [f"{t}_u"]),
                      helper.make_node("Expand", [f"{t}_u", "exp"], [f"{t}_e"]),
                      helper.make_node("Reshape", [f"{t}_e", "shp"], [f"{t}_r"])]
        k, v = "k_r", "v_r"
    inits.append(numpy_helper.from_array(np.array([1, tokens, heads * dim], dtype=np.int64), "out_shape"))
    nodes += [
        helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", v], ["o"]),
        helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "out_shape"], ["y"]),
    ]
    g = helper.make_graph(nodes, "attention", [
        helper.make_tensor_value_info("q", f, [1, heads, tokens, dim]),
        helper.make_tensor_value_info("k", f, [1, kv_heads, keys, dim]),
        helper.make_tensor_value_info("v", f, [1, kv_heads, keys, dim])],
        [helper.make_tensor_value_info("y", f, [1, tokens, heads * dim])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def measure(case: tuple[int, int, int, int, int], toolkit: str, work: Path) -> dict[str, Any]:
    from rkpart.compile.compiler_plan import parse_feature_tensors, parse_memory
    from rkpart.compile.placement import parse_layer_table
    from rkpart.compile.toolkits import find_toolkit
    from rkpart.triage.matrix import build_once

    h, t, k, d, hk = case
    path = work / f"attn-{h}-{t}-{k}-{d}-{hk}.onnx"
    onnx.save(attention_model(*case), str(path))
    log = path.with_suffix(f".{toolkit}.log")
    t0 = time.monotonic()
    res = build_once(path, find_toolkit(toolkit), target="rk3588", log=log, label="attention")
    text = log.read_text(errors="replace") if log.is_file() else ""
    rows = parse_feature_tensors(text) or []
    sec = [r for r in rows if r.user == "exSDPAttention" and r.tensor.endswith("_exSecondary")]
    weight, internal = parse_memory(text)
    cpu = sorted(op.op_type for op in parse_layer_table(text) if op.target == "CPU")
    return {"heads": h, "tokens": t, "keys": k, "head_dim": d, "kv_heads": hk, "toolkit": toolkit, "kind": res.kind,
            "workspace_bytes": sum(r.size for r in sec), "workspace_native": [list(r.native) for r in sec],
            "internal_bytes": internal, "weight_bytes": weight, "cpu_ops": cpu, "fused": bool(
                [r for r in rows if r.user == "exSDPAttention"]), "build_s": round(time.monotonic() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toolkits", default="2.5.0,2.3.0")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "data" / "attention_buffers.jsonl")
    a = ap.parse_args()
    done = set()
    if a.out.is_file():
        for line in a.out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["heads"], r["tokens"], r["keys"], r["head_dim"], r["kv_heads"], r["toolkit"]))
    with tempfile.TemporaryDirectory(prefix="rkpart-attn-") as td:
        for tk in a.toolkits.split(","):
            for case in CASES:
                if (*case, tk) in done:
                    continue
                row = measure(case, tk, Path(td))
                print(json.dumps(row), flush=True)
                with a.out.open("a") as fh:
                    fh.write(json.dumps(row, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
