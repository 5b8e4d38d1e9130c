"""The reproducers of :mod:`rkpart.targets.known_issues`: the graphs each known toolkit bug was seen on.

Every entry of the known-issue table names the reproducers that prove it (:class:`Reproducer`):
a graph made here by a function (the AdaLN graphs of the exnorm fusion crash, in every norm
form, so that the forms that *build* are on record too) or an ONNX file under
``rkpart/data/known_issues`` (the 2.5.0 crashes, reduced from a family's stage by ``rkpart
repro``), the toolkit it was built with and what that build did.  The toolkit-marked test
``tests/targets/test_known_issue_reproducers.py`` builds every one again and checks that it still
does so; the fast tests check that each issue's op signature (:mod:`rkpart.targets.known_issues`)
matches its crashing reproducers and none of its building ones.

The AdaLN graph (``x`` [1, T, C], conditioning ``emb`` [1, C])::

    x ──norm──► n ──Mul──► Add ──► MatMul(W) ──► out
                     ▲       ▲
            1 + scale│       │shift        scale, shift: graph inputs [1, 1, C] ("inputs"), or
                                           SiLU(emb) @ W_mod + b, sliced and unsqueezed ("silu-linear"),
                                           or table + t sliced, t [1, 2, C] an input (PixArt's, "table"),
                                           or constants [1, T, C], a row per token ("token-constant":
                                           Flux.3's context modulation, folded on load)

``norm`` is ``LayerNormalization`` (opset 17, ``layernorm``), its opset-13 decomposition
``(x - mean) / sqrt(var + eps)`` (``layernorm-decomposed``), or an RMSNorm as TorchScript writes it,
``x * 1/sqrt(mean(x^2) + eps) * w`` (``rmsnorm``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DATA = Path(__file__).resolve().parent.parent / "data" / "known_issues"

NORMS = ("layernorm", "layernorm-decomposed", "rmsnorm")
MODULATIONS = ("inputs", "silu-linear", "table", "token-constant")


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def adaln_matmul(norm: str, modulation: str, *, tokens: int = 16, hidden: int = 64, seed: int = 0) -> onnx.ModelProto:
    """The AdaLN graph above: ``norm`` of :data:`NORMS`, ``modulation`` of :data:`MODULATIONS`.

    Opset 17 for ``layernorm`` (the first opset with ``LayerNormalization``), 13 otherwise (what the
    TorchScript exporter writes at opset 13, and how it writes RMSNorm at any opset).
    """
    if norm not in NORMS or modulation not in MODULATIONS:
        raise ValueError(f"norm must be one of {NORMS} and modulation one of {MODULATIONS}, got {norm!r}, "
                         f"{modulation!r}")
    rng = np.random.default_rng(seed)
    c = hidden
    f32 = np.float32
    nodes: list[onnx.NodeProto] = []
    inits = [_const("W", (rng.standard_normal((c, c)) / np.sqrt(c)).astype(f32)), _const("one", np.array(1.0, f32)),
             _const("eps", np.array(1e-6, f32)), _const("axes", np.array([-1], np.int64))]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, c])]
    if norm == "layernorm":
        inits += [_const("gamma", np.ones(c, f32)), _const("beta", np.zeros(c, f32))]
        nodes.append(helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-6,
                                      name="norm/LayerNormalization"))
    elif norm == "layernorm-decomposed":
        inits.append(_const("two", np.array(2.0, f32)))
        nodes += [helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=1, name="norm/ReduceMean", axes=[-1]),
                  helper.make_node("Sub", ["x", "mean"], ["d"], name="norm/Sub"),
                  helper.make_node("Pow", ["d", "two"], ["sq"], name="norm/Pow"),
                  helper.make_node("ReduceMean", ["sq"], ["var"], keepdims=1, name="norm/ReduceMean_1", axes=[-1]),
                  helper.make_node("Add", ["var", "eps"], ["ve"], name="norm/Add"),
                  helper.make_node("Sqrt", ["ve"], ["sd"], name="norm/Sqrt"),
                  helper.make_node("Div", ["d", "sd"], ["n"], name="norm/Div")]
    else:
        inits += [_const("two", np.array(2.0, f32)), _const("w", (1 + 0.1 * rng.standard_normal(c)).astype(f32))]
        nodes += [helper.make_node("Pow", ["x", "two"], ["sq"], name="norm/Pow"),
                  helper.make_node("ReduceMean", ["sq"], ["ms"], keepdims=1, name="norm/ReduceMean", axes=[-1]),
                  helper.make_node("Add", ["ms", "eps"], ["mse"], name="norm/Add"),
                  helper.make_node("Sqrt", ["mse"], ["rms"], name="norm/Sqrt"),
                  helper.make_node("Div", ["one", "rms"], ["inv"], name="norm/Div"),
                  helper.make_node("Mul", ["x", "inv"], ["xn"], name="norm/Mul"),
                  helper.make_node("Mul", ["xn", "w"], ["n"], name="norm/Mul_1")]
    if modulation == "inputs":
        inputs += [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 1, c]) for t in ("scale", "shift")]
    elif modulation == "token-constant":
        # a modulation that depends on weights alone, folded to a constant with a row per token
        inits += [_const("scale", (0.1 * rng.standard_normal((1, tokens, c))).astype(f32)),
                  _const("shift", (0.1 * rng.standard_normal((1, tokens, c))).astype(f32))]
    elif modulation == "table":
        inputs.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 2, c]))
        inits += [_const("table", (0.1 * rng.standard_normal((1, 2, c))).astype(f32)),
                  _const("s0", np.array([0], np.int64)), _const("s1", np.array([1], np.int64)),
                  _const("s2", np.array([2], np.int64)), _const("ax1", np.array([1], np.int64))]
        nodes += [helper.make_node("Add", ["table", "t"], ["m"], name="mod/Add"),
                  helper.make_node("Slice", ["m", "s0", "s1", "ax1"], ["scale"], name="mod/Slice"),
                  helper.make_node("Slice", ["m", "s1", "s2", "ax1"], ["shift"], name="mod/Slice_1")]
    else:
        inputs.append(helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, c]))
        inits += [_const("W_mod", (rng.standard_normal((c, 2 * c)) / np.sqrt(c) * 0.1).astype(f32)),
                  _const("b_mod", np.zeros(2 * c, f32)),
                  _const("s0", np.array([0], np.int64)), _const("s1", np.array([c], np.int64)),
                  _const("s2", np.array([2 * c], np.int64)), _const("ax1", np.array([1], np.int64))]
        nodes += [helper.make_node("Sigmoid", ["emb"], ["sig"], name="mod/Sigmoid"),
                  helper.make_node("Mul", ["emb", "sig"], ["silu"], name="mod/Mul"),
                  helper.make_node("Gemm", ["silu", "W_mod", "b_mod"], ["m"], name="mod/Gemm"),
                  helper.make_node("Slice", ["m", "s0", "s1", "axes"], ["scale2"], name="mod/Slice"),
                  helper.make_node("Slice", ["m", "s1", "s2", "axes"], ["shift2"], name="mod/Slice_1"),
                  helper.make_node("Unsqueeze", ["scale2", "ax1"], ["scale"], name="mod/Unsqueeze"),
                  helper.make_node("Unsqueeze", ["shift2", "ax1"], ["shift"], name="mod/Unsqueeze_1")]
    nodes += [helper.make_node("Add", ["scale", "one"], ["scale1"], name="adaln/Add"),
              helper.make_node("Mul", ["n", "scale1"], ["y0"], name="adaln/Mul"),
              helper.make_node("Add", ["y0", "shift"], ["y"], name="adaln/Add_1"),
              helper.make_node("MatMul", ["y", "W"], ["out"], name="proj/MatMul")]
    graph = helper.make_graph(nodes, f"adaln_{norm}_{modulation}", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, tokens, c])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17 if norm == "layernorm" else 13)],
                              producer_name="rkpart.targets.known_issues_repro")
    model.ir_version = 8  # what every toolkit's onnx (1.16) reads
    onnx.checker.check_model(model, full_check=True)
    return model


@dataclass(frozen=True)
class Reproducer:
    """One graph a known issue was (or, for a control, was not) seen on, and what its build did.

    ``make`` returns the graph (``file`` names it under :data:`DATA` instead); ``outcome`` is the
    build's: ``"SIGSEGV"`` (a crash the issue's log signature recognises) or ``"ok"`` (a control: the
    form the issue does *not* need, which builds, so its signature must not match it).
    """

    name: str
    toolkit: str
    outcome: str
    make: Callable[[], onnx.ModelProto] | None = None
    file: str | None = None
    what: str = ""

    def model(self) -> onnx.ModelProto:
        if self.make is not None:
            return self.make()
        assert self.file is not None
        return onnx.load(str(DATA / self.file))

    def save(self, path: str | Path) -> Path:
        """The graph as an ONNX file at ``path`` (for a build)."""
        path = Path(path)
        onnx.save(self.model(), str(path))
        return path


__all__ = ["DATA", "MODULATIONS", "NORMS", "Reproducer", "adaln_matmul"]
