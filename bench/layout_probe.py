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
``rope-halves``
    rotate-half RoPE, ``x.reshape(..., 2, d/2).unbind(-2)``, ``cat(-x2, x1)`` (diffusers' ``apply_rotary_emb(
    use_real_unbind_dim=-2)``: Cosmos, Anima), tables ``[1, 1, T, d]`` computed in the graph (``Cos``/``Sin`` of a
    constant: Cosmos's real-width stages).
``rms-rope``
    ``rms`` then ``rope-halves`` (Cosmos-Predict2's attention).
``norm-rope-slice``
    ``norm`` then ``rope-halves`` on the image tokens alone, written back into the heads tensor as TorchScript
    exports ``q[:, :, text:, :] = apply_rotary_emb(q[:, :, text:, :], ...)`` (CogView4's attention): a ``Slice`` of
    the tokens from ``--text`` on, the rotation, a ``ScatterND`` whose indices are the meshgrid of the slice
    (``Concat`` of ``Unsqueeze(Expand(arange))`` per axis, computed in the graph from constants).
``gqa``
    the key/value heads repeated (``Unsqueeze/Expand/Reshape``, Lumina2's processor), ``H / Hk`` each.
``plain``
    nothing between the head split and the attention (DiT, PixArt).
``gqa-tile``
    grouped-query attention as Lumina2's TorchScript export writes it, tokens-first: ``k``/``v`` graph inputs
    ``[1, T, Hk, d]`` repeated by ``Unsqueeze(3)``, ``Tile [1, 1, 1, H/Hk, 1]``, ``Reshape [1, T, H, d]``, the key
    transposed ``(0, 2, 3, 1)``, the value ``(0, 2, 1, 3)``, the softmax scale's square root on ``q`` and ``k``;
    with ``--mask`` the caption mask (a bool graph input ``[1, 1, 1, T]``, ``Where(mask, 0, -inf)`` added to the
    scores, the exporter's ``IsNaN`` guard after the Softmax).
``linear-pad``
    Sana's linear attention with ``H`` heads of ``d``: ``q``/``k``/``v`` projected from one graph input ``x [1, T,
    H·d]`` (seeded weights: the compiler lays a projection's output out channels-first), channels first per head
    ``[1, H, d, T]`` (``k`` transposed to ``[1, H, T, d]``), ReLU kernels, the value padded with
    a ones row (``F.pad(v, (0, 0, 0, 1), value=1)``: ``[1, H, d+1, T]``), ``(v_pad @ k^T) @ q``, its last row the
    normaliser (``Slice``, ``Add`` eps, ``Div``), back to ``[1, T, H·d]``.
``wide-matmul``
    one wide projection, FLUX.2's single-stream ``to_qkv_mlp_proj``: ``x [1, T, H·d]`` (a graph input) ``@ W
    [H·d, N]`` (seeded, no bias), ``N`` from ``--out-channels`` (default 9 x the q/k/v width, FLUX.2's 3 + 2 x 3),
    its output read as diffusers' block reads it (``--readers``): ``slices`` (the default) as ``Slice`` into q, k, v
    (``--qkv`` channels each, default ``H·d``) and the MLP's two halves, then SiLU(gate) · up, the pieces
    concatenated again (the block's ``to_out`` input); ``one`` the output alone (a graph output).  The compiler's
    Transpose of a product of more than 8192 channels goes to the CPU (``wide-matmul-columns``).

Usage: ``.venv/bin/python bench/layout_probe.py --pattern norm --head-dim 64,72,88 --tokens 1024 [--heads 16]
[--kv-heads 8] [--mask] [--text 256] [--project] [--out-channels N,..] [--readers slices|one] [--qkv C]
[--toolkits 2.5.0] [--rewrites] [--skip-rewrite NAME] [--out FILE.jsonl]``
"""

from __future__ import annotations

import argparse
import itertools
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


def _rope_halves(x: str, out: str, shape: list[int], tag: str) -> tuple[Nodes, Inits]:
    """diffusers' ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-2)`` as TorchScript writes it, the tables
    computed in the graph as Cosmos's real-width stage holds them (``Cos``/``Sin`` of a constant ``[T, d]``,
    unsqueezed to ``[1, 1, T, d]``)."""
    *lead, d = shape
    t = shape[-2]
    rng = np.random.default_rng(2)
    ang = rng.uniform(0, 3, size=(t, d // 2))
    inits = [_c(f"{tag}_ang", np.concatenate([ang, ang], axis=-1)), _c(f"{tag}_01", [0, 1], np.int64),
             _c(f"{tag}_halves", [*lead, 2, d // 2], np.int64), _c(f"{tag}_split", [1, 1], np.int64),
             _c(f"{tag}_ax", [-2], np.int64)]
    nodes = [helper.make_node("Cos", [f"{tag}_ang"], [f"{tag}_cos0"]),
             helper.make_node("Sin", [f"{tag}_ang"], [f"{tag}_sin0"]),
             helper.make_node("Unsqueeze", [f"{tag}_cos0", f"{tag}_01"], [f"{tag}_cos"]),
             helper.make_node("Unsqueeze", [f"{tag}_sin0", f"{tag}_01"], [f"{tag}_sin"]),
             helper.make_node("Reshape", [x, f"{tag}_halves"], [f"{tag}_r"]),
             helper.make_node("Split", [f"{tag}_r", f"{tag}_split"], [f"{tag}_x1", f"{tag}_x2"], axis=-2),
             helper.make_node("Squeeze", [f"{tag}_x1", f"{tag}_ax"], [f"{tag}_s1"]),
             helper.make_node("Squeeze", [f"{tag}_x2", f"{tag}_ax"], [f"{tag}_s2"]),
             helper.make_node("Neg", [f"{tag}_s2"], [f"{tag}_n2"]),
             helper.make_node("Concat", [f"{tag}_n2", f"{tag}_s1"], [f"{tag}_rot"], axis=-1),
             helper.make_node("Mul", [x, f"{tag}_cos"], [f"{tag}_xc"]),
             helper.make_node("Mul", [f"{tag}_rot", f"{tag}_sin"], [f"{tag}_rs"]),
             helper.make_node("Add", [f"{tag}_xc", f"{tag}_rs"], [out])]
    return nodes, inits


def _rope_slice(x: str, out: str, shape: list[int], text: int, tag: str) -> tuple[Nodes, Inits]:
    """``x[:, :, text:, :] = rope_halves(x[:, :, text:, :])`` as TorchScript exports the assignment (CogView4):
    the slice, the rotation, a no-op ``Expand``/``Reshape`` of the update and a ``ScatterND`` into ``x`` whose
    indices ``[1, H, T - text, d, 4]`` are computed in the graph from one ``arange`` per axis."""
    b, h, t, d = shape
    img = [b, h, t - text, d]
    inits = [_c(f"{tag}_from", [text], np.int64), _c(f"{tag}_to", [np.iinfo(np.int64).max], np.int64),
             _c(f"{tag}_axis", [2], np.int64), _c(f"{tag}_step", [1], np.int64),
             _c(f"{tag}_img", img, np.int64), _c(f"{tag}_last", [-1], np.int64),
             _c(f"{tag}_i0", np.zeros((1, 1, 1, 1)), np.int64),
             _c(f"{tag}_i1", np.arange(h).reshape(h, 1, 1), np.int64),
             _c(f"{tag}_i2", np.arange(text, t).reshape(t - text, 1), np.int64),
             _c(f"{tag}_i3", np.arange(d), np.int64)]
    nodes = [helper.make_node("Slice", [x, f"{tag}_from", f"{tag}_to", f"{tag}_axis", f"{tag}_step"], [f"{tag}_s"])]
    n, i = _rope_halves(f"{tag}_s", f"{tag}_r", img, f"{tag}_h")
    nodes += n
    inits += i
    nodes += [helper.make_node("Expand", [f"{tag}_r", f"{tag}_img"], [f"{tag}_e"]),
              helper.make_node("Reshape", [f"{tag}_e", f"{tag}_img"], [f"{tag}_u"])]
    for k in range(4):
        nodes += [helper.make_node("Expand", [f"{tag}_i{k}", f"{tag}_img"], [f"{tag}_ie{k}"]),
                  helper.make_node("Unsqueeze", [f"{tag}_ie{k}", f"{tag}_last"], [f"{tag}_iu{k}"])]
    nodes += [helper.make_node("Concat", [f"{tag}_iu{k}" for k in range(4)], [f"{tag}_idx"], axis=-1),
              helper.make_node("ScatterND", [x, f"{tag}_idx", f"{tag}_u"], [out])]
    return nodes, inits


def probe_model(pattern: str, heads: int, tokens: int, dim: int, kv_heads: int = 0,
                text: int = 0) -> onnx.ModelProto:
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
        "rope-halves": lambda a, b: _rope_halves(a, b, [1, h, t, d], "hq"),
        "rope-slice": lambda a, b: _rope_slice(a, b, [1, h, t, d], text or t // 5, "sq"),
    }
    for k, step in enumerate({"norm": ["norm"], "rms": ["rms"], "rope-interleaved": ["rope-interleaved"],
                              "norm-rope": ["norm", "rope-interleaved"], "rope-halves": ["rope-halves"],
                              "rms-rope": ["rms", "rope-halves"], "norm-rope-slice": ["norm", "rope-slice"],
                              "gqa": [], "plain": []}[pattern]):
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


def gqa_tile_model(heads: int, tokens: int, dim: int, kv_heads: int, mask: bool) -> onnx.ModelProto:
    """The ``gqa-tile`` probe (see the module docstring)."""
    f = TensorProto.FLOAT
    h, t, d, kv = heads, tokens, dim, kv_heads or heads
    rep = h // kv
    root = np.float32(1 / np.sqrt(np.sqrt(d)))
    inits: Inits = [_c("heads_shape", [1, t, h, d], np.int64), _c("root", root), _c("ax3", [3], np.int64),
                    _c("reps", [1, 1, 1, rep, 1], np.int64), _c("out_shape", [1, t, h * d], np.int64)]
    nodes: Nodes = [helper.make_node("Reshape", ["x", "heads_shape"], ["xh"]),
                    helper.make_node("Transpose", ["xh"], ["qt"], perm=[0, 2, 1, 3]),
                    helper.make_node("Mul", ["qt", "root"], ["q"])]
    for name, perm in (("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Unsqueeze", [name, "ax3"], [f"{name}_u"]),
                  helper.make_node("Tile", [f"{name}_u", "reps"], [f"{name}_rep"]),
                  helper.make_node("Reshape", [f"{name}_rep", "heads_shape"], [f"{name}_r"]),
                  helper.make_node("Transpose", [f"{name}_r"], [f"{name}_t"], perm=perm)]
    nodes += [helper.make_node("Mul", ["k_t", "root"], ["kt"]),
              helper.make_node("MatMul", ["q", "kt"], ["s"])]
    inputs = [helper.make_tensor_value_info("x", f, [1, t, h * d]),
              helper.make_tensor_value_info("k", f, [1, t, kv, d]),
              helper.make_tensor_value_info("v", f, [1, t, kv, d])]
    p = "p"
    if mask:
        inits += [_c("zero", 0.0), _c("ninf", -np.inf)]
        nodes += [helper.make_node("Where", ["mask", "zero", "ninf"], ["bias"]),
                  helper.make_node("Add", ["s", "bias"], ["sb"]),
                  helper.make_node("Softmax", ["sb"], ["p0"], axis=-1),
                  helper.make_node("IsNaN", ["p0"], ["nan"]),
                  helper.make_node("Where", ["nan", "zero", "p0"], ["p"])]
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, 1, t]))
    else:
        nodes.append(helper.make_node("Softmax", ["s"], ["p"], axis=-1))
    nodes += [helper.make_node("MatMul", [p, "v_t"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "out_shape"], ["y"])]
    g = helper.make_graph(nodes, "probe-gqa-tile", inputs, [helper.make_tensor_value_info("y", f, [1, t, h * d])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def linear_pad_model(heads: int, tokens: int, dim: int) -> onnx.ModelProto:
    """The ``linear-pad`` probe (see the module docstring)."""
    f = TensorProto.FLOAT
    h, t, d = heads, tokens, dim
    inits: Inits = [_c("heads_shape", [1, h, d, t], np.int64), _c("pads", [0, 0, 0, 0, 0, 0, 1, 0], np.int64),
                    _c("one", 1.0), _c("eps", 1e-15), _c("r0", [0], np.int64), _c("rd", [d], np.int64),
                    _c("rend", [d + 1], np.int64), _c("ax2", [2], np.int64),
                    _c("out_shape", [1, h * d, t], np.int64)]
    rng = np.random.default_rng(3)
    nodes: Nodes = []
    for name in ("q", "k", "v"):
        inits.append(_c(f"w{name}", rng.standard_normal((h * d, h * d)) / np.sqrt(h * d)))
        nodes += [helper.make_node("MatMul", ["x", f"w{name}"], [name]),
                  helper.make_node("Transpose", [name], [f"{name}_c"], perm=[0, 2, 1]),
                  helper.make_node("Reshape", [f"{name}_c", "heads_shape"], [f"{name}_h"])]
    nodes += [helper.make_node("Transpose", ["k_h"], ["k_t"], perm=[0, 1, 3, 2]),
              helper.make_node("Relu", ["q_h"], ["q_r"]),
              helper.make_node("Relu", ["k_t"], ["k_r"]),
              helper.make_node("Pad", ["v_h", "pads", "one"], ["v_p"], mode="constant"),
              helper.make_node("MatMul", ["v_p", "k_r"], ["vk"]),
              helper.make_node("MatMul", ["vk", "q_r"], ["o"]),
              helper.make_node("Slice", ["o", "r0", "rd", "ax2"], ["num"]),
              helper.make_node("Slice", ["o", "rd", "rend", "ax2"], ["den"]),
              helper.make_node("Add", ["den", "eps"], ["den_e"]),
              helper.make_node("Div", ["num", "den_e"], ["a"]),
              helper.make_node("Reshape", ["a", "out_shape"], ["a_c"]),
              helper.make_node("Transpose", ["a_c"], ["y"], perm=[0, 2, 1])]
    g = helper.make_graph(nodes, "probe-linear-pad", [helper.make_tensor_value_info("x", f, [1, t, h * d])],
                          [helper.make_tensor_value_info("y", f, [1, t, h * d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def wide_matmul_model(width: int, tokens: int, out_channels: int, readers: str = "slices",
                      qkv: int = 0) -> onnx.ModelProto:
    """The ``wide-matmul`` probe (see the module docstring)."""
    f = TensorProto.FLOAT
    t, n = tokens, out_channels
    c = qkv or width
    rng = np.random.default_rng(4)
    inits: Inits = [_c("w", rng.standard_normal((width, n)) / np.sqrt(width)), _c("ax", [-1], np.int64)]
    nodes: Nodes = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    if readers == "one":
        g = helper.make_graph(nodes, "probe-wide-matmul", [helper.make_tensor_value_info("x", f, [1, t, width])],
                              [helper.make_tensor_value_info("p", f, [1, t, n])], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    mlp = (n - 3 * c) // 2
    if mlp <= 0 or 3 * c + 2 * mlp != n:
        raise ValueError(f"wide-matmul --readers slices: {n} output channels are not 3 x {c} + 2 x an MLP half")
    bounds = [0, c, 2 * c, 3 * c, 3 * c + mlp, n]
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        inits += [_c(f"s{k}", [a], np.int64), _c(f"e{k}", [b], np.int64)]
        nodes.append(helper.make_node("Slice", ["p", f"s{k}", f"e{k}", "ax"], [f"piece{k}"]))
    nodes += [helper.make_node("Sigmoid", ["piece3"], ["sig"]),
              helper.make_node("Mul", ["piece3", "sig"], ["silu"]),
              helper.make_node("Mul", ["silu", "piece4"], ["mlp"]),
              helper.make_node("Mul", ["piece0", "piece1"], ["qk"]),
              helper.make_node("Add", ["qk", "piece2"], ["attn"]),
              helper.make_node("Concat", ["attn", "mlp"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "probe-wide-matmul", [helper.make_tensor_value_info("x", f, [1, t, width])],
                          [helper.make_tensor_value_info("y", f, [1, t, c + mlp])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def model_for(pattern: str, heads: int, tokens: int, dim: int, kv_heads: int = 0,
              mask: bool = False, text: int = 0, out_channels: int = 0, readers: str = "slices",
              qkv: int = 0) -> onnx.ModelProto:
    """The probe graph of ``pattern`` at one head layout."""
    if pattern == "wide-matmul":
        return wide_matmul_model(heads * dim, tokens, out_channels or 9 * (qkv or heads * dim), readers, qkv)
    if pattern == "gqa-tile":
        return gqa_tile_model(heads, tokens, dim, kv_heads, mask)
    if pattern == "linear-pad":
        return linear_pad_model(heads, tokens, dim)
    return probe_model(pattern, heads, tokens, dim, kv_heads, text)


def with_projection(model: onnx.ModelProto, width: int) -> onnx.ModelProto:
    """``model`` with its graph input ``x`` read through a projection with bias first (``x @ W + b``, seeded
    weights), as the real stages' q is: 2.5.0 then lays a per-head norm out with the heads in its H axis
    (``exNorm (1,d,H,T)``), where over a graph input it puts them in the batch axis (``(H,d,1,T)``)."""
    g = model.graph
    rng = np.random.default_rng(3)
    g.initializer.extend([_c("proj_w", 0.02 * rng.standard_normal((width, width))),
                          _c("proj_b", 0.02 * rng.standard_normal(width))])
    for n in g.node:
        for k, i in enumerate(n.input):
            if i == "x":
                n.input[k] = "xp"
    g.node.insert(0, helper.make_node("Add", ["proj_b", "xm"], ["xp"]))
    g.node.insert(0, helper.make_node("MatMul", ["x", "proj_w"], ["xm"]))
    return model


def build(model: onnx.ModelProto, toolkit: str, work: Path, name: str, rewrites: bool,
          skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Build ``model`` once; its CPU layers (op types and shapes), internal memory, rewrites applied (``skip``:
    rewrites left out, as ``rkpart compile --skip-rewrite`` does)."""
    from rkpart.compile.compiler_plan import parse_layer_rows, parse_memory
    from rkpart.compile.toolkits import find_toolkit
    from rkpart.targets.rewrites import apply_rewrites, compile_rewrites_for
    from rkpart.triage.matrix import build_once

    applied: dict[str, int] = {}
    if rewrites:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        applied = apply_rewrites(model, tuple(r for r in compile_rewrites_for(toolkit) if r.name not in skip))
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


PATTERNS = ["norm", "rms", "rope-interleaved", "norm-rope", "rope-halves", "rms-rope", "norm-rope-slice", "gqa",
            "plain", "gqa-tile", "linear-pad", "wide-matmul"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pattern", required=True,
                    choices=PATTERNS)
    ap.add_argument("--head-dim", default="64,72,88,96,128")
    ap.add_argument("--tokens", default="1024")
    ap.add_argument("--heads", default="16")
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--toolkits", default="2.5.0")
    ap.add_argument("--mask", action="store_true", help="gqa-tile: with the caption mask")
    ap.add_argument("--text", type=int, default=0,
                    help="norm-rope-slice: the leading tokens the RoPE leaves alone (default: a fifth)")
    ap.add_argument("--rewrites", action="store_true", help="build after rkpart's NPU rewrites")
    ap.add_argument("--skip-rewrite", action="append", default=[], help="with --rewrites: leave this one out")
    ap.add_argument("--project", action="store_true",
                    help="read x through a projection with bias first (the real stages' layout of a per-head norm)")
    ap.add_argument("--out-channels", default="0",
                    help="wide-matmul: the projection's output channels, a comma list (0: 9 x the q/k/v width)")
    ap.add_argument("--readers", choices=["slices", "one"], default="slices",
                    help="wide-matmul: what reads the projection (see the patterns)")
    ap.add_argument("--qkv", type=int, default=0,
                    help="wide-matmul --readers slices: q/k/v width (0: heads x head dim)")
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
                        for n in (int(x) for x in a.out_channels.split(",")):
                            wide = a.pattern == "wide-matmul"
                            name = (f"{a.pattern}-h{h}-t{t}-d{d}" + (f"-kv{a.kv_heads}" if a.kv_heads else "")
                                    + ("-mask" if a.mask else "") + ("-proj" if a.project else "")
                                    + (f"-n{n}-{a.readers}" + (f"-qkv{a.qkv}" if a.qkv else "") if wide else ""))
                            model = model_for(a.pattern, h, t, d, a.kv_heads, a.mask, a.text, n, a.readers, a.qkv)
                            if a.project:
                                model = with_projection(model, h * d)
                            row = {"pattern": a.pattern, "heads": h, "tokens": t, "head_dim": d,
                                   "kv_heads": a.kv_heads, "mask": a.mask, "project": a.project, "toolkit": tk,
                                   **({"text": a.text or t // 5} if a.pattern == "norm-rope-slice" else {}),
                                   **({"out_channels": n or 9 * (a.qkv or h * d), "readers": a.readers,
                                      "qkv": a.qkv or h * d} if wide else {}),
                                   **build(model, tk, work, name, a.rewrites, frozenset(a.skip_rewrite))}
                            print(json.dumps(row), flush=True)
                            if a.out:
                                with a.out.open("a") as fh:
                                    fh.write(json.dumps(row, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
