"""Lowering rewrites: ops with no ``onnx.version_converter`` adapter down to a toolkit's opset.

Each is replaced by ops that exist at the lower opset, in the form the TorchScript exporter
writes (so the toolkit's own fusion rules recognise it).  Rows: :data:`rkpart.targets.rewrites.REWRITES`.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from rkpart.ir.edit import GraphEdit, attr


def gelu(view: GraphEdit) -> int:
    """Gelu-20 -> the TorchScript exporter's decomposition (exact: Div/Erf/Add/Mul/Mul; tanh form)."""
    def one(n: onnx.NodeProto) -> list[onnx.NodeProto]:
        approx = attr(n, "approximate", b"none")
        approx = approx.decode() if isinstance(approx, bytes) else str(approx)
        return _gelu_nodes(view, n, view.elem(n.input[0]), approx == "tanh")
    return view.replace_each("Gelu", one)


def _gelu_nodes(view: GraphEdit, n: onnx.NodeProto, elem: int,
                tanh: bool) -> list[onnx.NodeProto]:
    x, y = n.input[0], n.output[0]
    base = n.name or y

    def c(tag: str, v: float) -> str:
        return view.add_constant(f"{base}/{tag}", np.array(v, dtype=helper.tensor_dtype_to_np_dtype(elem)))

    def t(tag: str) -> str:
        return view.fresh(f"{base}/{tag}")

    mk = helper.make_node
    if tanh:
        xx, cube, kx, inner, scaled, th, one_p, xm = (t(s) for s in (
            "x2", "x3", "kappa_x3", "inner", "beta_inner", "tanh", "one_plus", "x_mul"))
        return [
            mk("Mul", [x, x], [xx], name=f"{base}/Mul_x2"),
            mk("Mul", [x, xx], [cube], name=f"{base}/Mul_x3"),
            mk("Mul", [c("kappa", 0.044715), cube], [kx], name=f"{base}/Mul_kappa"),
            mk("Add", [x, kx], [inner], name=f"{base}/Add_inner"),
            mk("Mul", [c("beta", math.sqrt(2 / math.pi)), inner], [scaled], name=f"{base}/Mul_beta"),
            mk("Tanh", [scaled], [th], name=f"{base}/Tanh"),
            mk("Add", [c("one", 1.0), th], [one_p], name=f"{base}/Add_one"),
            mk("Mul", [x, one_p], [xm], name=f"{base}/Mul_x"),
            mk("Mul", [c("half", 0.5), xm], [y], name=f"{base}/Mul_half"),
        ]
    d, e, a, m = (t(s) for s in ("div", "erf", "add", "mul"))
    return [
        mk("Div", [x, c("sqrt2", 1.4142135623730951)], [d], name=f"{base}/Div"),
        mk("Erf", [d], [e], name=f"{base}/Erf"),
        mk("Add", [e, c("one", 1.0)], [a], name=f"{base}/Add"),
        mk("Mul", [x, a], [m], name=f"{base}/Mul"),
        mk("Mul", [m, c("half", 0.5)], [y], name=f"{base}/Mul_1"),
    ]


def grid_sample(view: GraphEdit) -> int:
    """GridSample-20 -> GridSample-16: the modes were renamed (linear -> bilinear, cubic -> bicubic)."""
    graph = view.graph
    count = 0
    for i in view.matches("GridSample"):
        for a in graph.node[i].attribute:
            if a.name == "mode" and a.s in (b"linear", b"cubic"):
                a.s = {b"linear": b"bilinear", b"cubic": b"bicubic"}[a.s]
        count += 1
    return count


#: ops whose opset-20 version only widened the type list (float8 / bfloat16 / bool): the same
#: node is valid one opset lower for every type the toolkit takes.  ``onnx.version_converter``
#: has adapters for IsNaN, IsInf, ReduceMax and ReduceMin; ConstantOfShape has none, so it is
#: carried through conversion unchanged (:func:`rkpart.targets.opset.lower_model`).
#: GridSample-20 is carried through the same way once ``gridsample20-modes`` renamed its modes
#: (4-D input: GridSample-16 and -20 compute the same).
TYPE_ONLY_CHANGES: dict[str, int] = {"ConstantOfShape": 20, "GridSample": 20}

#: ops that did not exist below opset 20 and have no decomposition here: a stage holding one
#: cannot be lowered (a one-line error names the op)
NO_LOWERING: dict[str, str] = {
    "AffineGrid": "introduced in opset 20, no decomposition",
    "ImageDecoder": "introduced in opset 20",
    "RegexFullMatch": "introduced in opset 20 (strings)",
    "StringConcat": "introduced in opset 20 (strings)",
    "StringSplit": "introduced in opset 20 (strings)",
}


