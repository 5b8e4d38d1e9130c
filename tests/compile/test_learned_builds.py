"""The learned-placement store across models, with real rknn-toolkit2 2.5.0 builds (issue 50).

Two small probe graphs stand for two families compiled one after the other on one cache: the
first (a head split whose merged heads feed a projection) leaves a CPU layer the store learns;
the second (an attention of another width) has projections of the same op, ranks and unit dims.
Keyed without sizes (store version 4), what the first taught took the second's projections off
the NPU; now its partition moves nothing, and its build shows every op on the NPU.  A third model
has an op of exactly the learned pattern that builds on the NPU: ``compile --repartition`` checks
the store's move by a build and drops the pattern.  Five builds of one small stage each (~65 s).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from rkpart.cli import main
from rkpart.grouping.capability import pattern_of
from rkpart.grouping.learned import load_learned
from rkpart.ir import load_model
from tests.toolkits import get_toolkit

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]

_N = helper.make_node


def _save(path: Path, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], x: list[int], y: list[int]) -> Path:
    g = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def _w(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name)


def _i64(name: str, v: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(v, np.int64), name)


def merged_heads(path: Path, tokens: int = 16, heads: int = 2, head_dim: int = 32) -> Path:
    """``x @ W``, split into heads, heads first, merged as ``[1, heads, tokens * head_dim]`` and projected:
    2.5.0 converts the merged tensor on the CPU (``Reshape:t3_rs``, traced to the projection, learned)."""
    c, rng = heads * head_dim, np.random.default_rng(0)
    return _save(path, [_N("MatMul", ["x", "W1"], ["h"], name="mm1"),
                        _N("Reshape", ["h", "s4"], ["h4"], name="view"),
                        _N("Transpose", ["h4"], ["t"], perm=[0, 2, 1, 3], name="heads"),
                        _N("Reshape", ["t", "s3"], ["t3"], name="merge"),
                        _N("MatMul", ["t3", "W2"], ["y"], name="proj")],
                 [_w(rng, "W1", c, c), _i64("s4", [1, tokens, heads, head_dim]),
                  _i64("s3", [1, heads, tokens * head_dim]), _w(rng, "W2", tokens * head_dim, 64)], [1, tokens, c],
                 [1, heads, 64])


def attention(path: Path, tokens: int = 64, heads: int = 2, head_dim: int = 88) -> Path:
    """Self-attention of ``heads`` heads of ``head_dim``: q/k/v/out projections, head splits, softmax."""
    c, rng = heads * head_dim, np.random.default_rng(1)
    nodes = []
    for p in "qkv":
        nodes += [_N("MatMul", ["x", f"W{p}"], [f"{p}0"], name=f"to_{p}"),
                  _N("Reshape", [f"{p}0", "s4"], [f"{p}1"], name=f"view_{p}"),
                  _N("Transpose", [f"{p}1"], [f"{p}2"], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3],
                     name=f"heads_{p}")]
    nodes += [_N("MatMul", ["q2", "k2"], ["a0"], name="qk"), _N("Mul", ["a0", "sc"], ["a1"], name="scale"),
              _N("Softmax", ["a1"], ["a2"], axis=-1, name="softmax"), _N("MatMul", ["a2", "v2"], ["o0"], name="av"),
              _N("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3], name="merge_heads"),
              _N("Reshape", ["o1", "s3"], ["o2"], name="merge"), _N("MatMul", ["o2", "Wo"], ["y"], name="to_out")]
    inits = [_w(rng, f"W{p}", c, c) for p in "qkvo"] + [
        _i64("s4", [1, tokens, heads, head_dim]), _i64("s3", [1, tokens, c]),
        numpy_helper.from_array(np.array(head_dim ** -0.5, np.float32), "sc")]
    return _save(path, nodes, inits, [1, tokens, c], [1, tokens, c])


def projection(path: Path, tokens: int = 2, width: int = 512) -> Path:
    """``relu(x @ W) @ W2`` on a model input of the merged heads' shape: its first projection has the very
    pattern :func:`merged_heads` teaches (the same sizes, types and constants), in a context with no
    conversion (it builds on the NPU)."""
    rng = np.random.default_rng(2)
    return _save(path, [_N("MatMul", ["x", "W"], ["h"], name="proj"), _N("Relu", ["h"], ["r"], name="relu"),
                        _N("MatMul", ["r", "W2"], ["y"], name="out")],
                 [_w(rng, "W", width, 64), _w(rng, "W2", 64, 64)], [1, tokens, width], [1, tokens, 64])


def _old_class(p: object) -> tuple[object, ...]:
    """What a version-4 store keyed a pattern by: no sizes, no attributes."""
    return tuple(getattr(p, k) for k in ("op_type", "dtype", "ranks", "domain", "consts", "dims", "form"))


def test_what_one_model_taught_moves_nothing_of_another_that_builds_on_the_npu(tmp_path: Path) -> None:
    from rkpart.grouping.learned import load_contradicted

    tk = get_toolkit("2.5.0")
    cli = CliRunner()
    first, second = merged_heads(tmp_path / "first.onnx"), attention(tmp_path / "second.onnx")
    for model in (first, second):
        r = cli.invoke(main, ["partition", str(model), "-s", "generic", "-o", str(tmp_path / model.stem), "-q",
                              "--toolkit", "2.5.0"])
        assert r.exit_code == 0, r.output
        r = cli.invoke(main, ["compile", str(tmp_path / model.stem), "--toolkit", str(tk.python), "--json", "-q"])
        assert r.exit_code == 0, r.output
        rep = json.loads(r.output)
        if model is first:
            # the first model's build leaves a CPU layer, and the store learns its projection at its sizes
            assert [c for s in rep["stages"] for c in s["artifact"]["cpu_ops"]] == ["Reshape:t3_rs"]
            learned = load_learned("rk3588", "2.5.0")
            assert [(p.op_type, p.shapes) for p in learned] == [("MatMul", "1,2,512;512,64>1,2,64")]
            # the version-4 class of it matches the second model's four projections: that store moved them
            mg = load_model(second)
            assert sum(_old_class(pattern_of(mg, i)) in {_old_class(p) for p in learned}
                       for i in mg.ops.nodes) == 4
            # the second model partitioned on the same cache: nothing moved (the capability records no host op)
            continue
        plan = json.loads((tmp_path / "second" / "plan.json").read_text())
        assert "capability" not in plan["extra"] and all(s["device"] == "npu" for s in plan["stages"]
                                                         if s["kind"] != "io")
        # and its build shows every op of it on the NPU: a move would have been wrong
        assert [c for s in rep["stages"] for c in s["artifact"]["cpu_ops"]] == []
    (taught,) = load_learned("rk3588", "2.5.0")

    # the store's move checked by a build of the stage it lands in: a third model whose first projection has
    # exactly the learned pattern, in a context where it builds on the NPU.  Its partition moves it (the store
    # cannot tell); compile --repartition puts it back, builds, sees it on the NPU, drops the pattern, and
    # keeps the plan with the op on the NPU; a new partition on the cache moves nothing
    third = projection(tmp_path / "third.onnx")
    r = cli.invoke(main, ["partition", str(third), "-s", "generic", "-o", str(tmp_path / "third"), "-q",
                          "--toolkit", "2.5.0"])
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "third" / "plan.json").read_text())
    assert [h["op"] for h in plan["extra"]["capability"]["host_ops"] if "learned placement" in h["why"]] == ["proj"]
    r = cli.invoke(main, ["compile", str(tmp_path / "third"), "--toolkit", str(tk.python), "--repartition", "--json",
                          "-q"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    check = rep["repartition"]["rounds"][0]
    assert check["round"] == 0 and check["checked"] == ["proj"] and check["cpu_layers_after"] == 0
    assert all(not s["artifact"]["cpu_ops"] for s in rep["stages"])
    plan = json.loads((tmp_path / "third" / "plan.json").read_text())
    assert "capability" not in plan["extra"]
    assert load_learned("rk3588", "2.5.0") == frozenset() and load_contradicted("rk3588", "2.5.0") == {taught}
    r = cli.invoke(main, ["partition", str(third), "-s", "generic", "-o", str(tmp_path / "again"), "-q",
                          "--toolkit", "2.5.0"])
    assert r.exit_code == 0 and "capability" not in json.loads((tmp_path / "again" / "plan.json").read_text())["extra"]
