"""Rewrites weighed for memory (:mod:`rkpart.compile.weigh`): the verdict's rule, the anatomy that shares
it between stages, and the cache that keeps it.  Fast: no toolkit (the builds are in
``tests/compile/test_weigh_real.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkpart.compile.weigh import Figures, Verdict, VerdictStore, judge, verdict_key
from rkpart.ir.anatomy import model_anatomy as stage_anatomy
from rkpart.targets.rewrites import REWRITES, Rewrite, weighed_rewrites_for

MIB = 1 << 20


def fig(cpu: int, weight_mib: float | None, internal_mib: float | None) -> Figures:
    return Figures(cpu, None if weight_mib is None else int(weight_mib * MIB),
                   None if internal_mib is None else int(internal_mib * MIB))


def test_more_memory_same_cpu_layers_is_left_out() -> None:
    """docs/cost-model.md's 1024 px fused block: heads-table-layout 357.02 MiB internal with, 312.02 without."""
    v = judge(["heads-table-layout"], fig(0, 134.07, 357.02), fig(0, 134.07, 312.02))
    assert not v.kept
    assert v.why.startswith("left out: 45.00 MiB more device memory with")


def test_less_memory_is_kept() -> None:
    """The 512 px self-attention: 32.0 MiB internal with it, 44.5 without."""
    v = judge(["heads-table-layout"], fig(0, 32.6, 32.0), fig(0, 32.6, 44.5))
    assert v.kept and "12.50 MiB less device memory" in v.why


def test_fewer_cpu_layers_win_over_memory() -> None:
    """Placement first: a build with a CPU layer fewer is kept however much more memory it takes, and one
    with a CPU layer more is left out however much it saves."""
    assert judge(["x"], fig(0, 134.07, 357.02), fig(1, 134.07, 265.14)).kept
    assert not judge(["x"], fig(2, 1.0, 1.0), fig(1, 1.0, 100.0)).kept


def test_a_tie_goes_to_fewer_rewrites() -> None:
    v = judge(["heads-table-layout"], fig(0, 8.4, 20.0), fig(0, 8.4, 20.0))
    assert not v.kept
    assert v.why == "left out: the same device memory with and without (28.40 MiB), 0 CPU layers either way"
    assert "4.0 KiB less" in judge(["x"], Figures(0, 4096, 0), Figures(0, 8192, 0)).why


def test_no_figure_or_failed_build_keeps_them() -> None:
    """Nothing says the rewrite costs anything: a build without memory figures, or a failed build without."""
    assert judge(["x"], fig(0, None, 3.0), fig(0, 1.0, 2.0)).kept
    v = judge(["x"], fig(0, 1.0, 3.0), None, "compiler crashed: SIGSEGV")
    assert v.kept and "SIGSEGV" in v.why


def test_verdict_round_trips_and_names_are_sorted() -> None:
    v = judge(["rope-halves", "heads-table-layout"], fig(0, 1.0, 2.0), fig(0, 1.0, 1.5))
    assert v.rewrites == ("heads-table-layout", "rope-halves")
    assert Verdict.from_json(json.loads(json.dumps(v.to_json()))) == v
    with pytest.raises(ValueError):
        Figures.from_json({"cpu_layers": -1})


def test_only_layout_memory_rows_are_weighed() -> None:
    """The table says which rows are weighed: memory rewrites that change a layout, on the toolkits they apply
    to; a placement rewrite (gelu-f16-sqrt2 moves an Erf onto the NPU) never is, and cannot be declared so."""
    weighed = {r.name for r in REWRITES if r.weighed}
    assert weighed == {"heads-table-layout", "rope-halves"}
    assert {r.name for r in weighed_rewrites_for("2.5.0")} == {"heads-table-layout"}
    assert {r.name for r in weighed_rewrites_for("2.3.0")} == {"rope-halves"}
    assert weighed_rewrites_for("2.5.0", frozenset({"heads-table-layout"})) == ()
    gelu = next(r for r in REWRITES if r.name == "gelu-f16-sqrt2")
    assert gelu.purpose == "placement" and not gelu.weighed
    with pytest.raises(ValueError, match="only a memory rewrite is weighed"):
        Rewrite("x", "Erf", "npu", ("*",), "", gelu.apply, weighed=True)


def _attention(seed: int, tokens: int = 8, scale: float = 0.5, name: str = "a") -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), f"{name}.w")
    s = numpy_helper.from_array(np.array(scale, np.float32), f"{name}.scale")
    shape = numpy_helper.from_array(np.array([1, tokens, 2, 8], np.int64), f"{name}.shape")
    nodes = [helper.make_node("MatMul", ["x", f"{name}.w"], [f"{name}.q"]),
             helper.make_node("Mul", [f"{name}.q", f"{name}.scale"], [f"{name}.qs"]),
             helper.make_node("Reshape", [f"{name}.qs", f"{name}.shape"], [f"{name}.h"]),
             helper.make_node("Transpose", [f"{name}.h"], ["y"], perm=[0, 2, 1, 3])]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, tokens, 8])],
                          [w, s, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_anatomy_is_the_graph_not_its_weights() -> None:
    """Two blocks of one model (other weights, other tensor names) share an anatomy; another shape, another
    scalar or another attribute does not.  A tiny model's weights are small: still weights (the bundled
    example's two self-attention stages share one anatomy, measured on a real compile)."""
    a = stage_anatomy(_attention(0))
    small = _attention(0), _attention(1)
    for m, seed in zip(small, (2, 3), strict=True):
        m.graph.initializer.append(numpy_helper.from_array(
            np.random.default_rng(seed).standard_normal(16).astype(np.float32), "norm.w"))
        m.graph.node.append(helper.make_node("Mul", ["y", "norm.w"], ["z"]))
    assert stage_anatomy(small[0]) == stage_anatomy(small[1]) != a
    assert stage_anatomy(_attention(1, name="b")) == a
    assert stage_anatomy(_attention(0, tokens=16)) != a
    assert stage_anatomy(_attention(0, scale=0.25)) != a
    other = _attention(0)
    other.graph.node[3].attribute[0].ints[:] = [0, 1, 2, 3]
    assert stage_anatomy(other) != a


def test_anatomy_reads_no_external_data(tmp_path: Path) -> None:
    """A stage is keyed from its graph alone (load_external_data=False): weights kept outside are not read."""
    m = _attention(0)
    onnx.save(m, str(tmp_path / "s.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="s.onnx.data", size_threshold=64)
    head = onnx.load(str(tmp_path / "s.onnx"), load_external_data=False)
    assert stage_anatomy(head) == stage_anatomy(onnx.load(str(tmp_path / "s.onnx"), load_external_data=False))
    (tmp_path / "s.onnx.data").write_bytes(b"\0" * (tmp_path / "s.onnx.data").stat().st_size)
    assert stage_anatomy(onnx.load(str(tmp_path / "s.onnx"), load_external_data=False)) == stage_anatomy(head)


def test_key_follows_what_decides_the_builds() -> None:
    base = dict(anatomy="a" * 32, toolkit="2.5.0", target="rk3588", config={"target_platform": "rk3588"},
                candidates=["heads-table-layout"], skip=[], rules=["prepare-v11"])
    k = verdict_key(**base)  # type: ignore[arg-type]
    assert verdict_key(**{**base, "config": {"target_platform": "rk3588", "optimization_level": 3}}) == k  # type: ignore[arg-type]
    for change in ({"toolkit": "2.3.0"}, {"config": {"optimization_level": 1}}, {"skip": ["dedupe-constants"]},
                   {"rules": ["prepare-v12"]}, {"anatomy": "b" * 32}):
        assert verdict_key(**{**base, **change}) != k  # type: ignore[arg-type]


def test_store_reads_plan_first_then_shared_and_refuses_junk(tmp_path: Path) -> None:
    plan, shared = tmp_path / "plan", tmp_path / "shared"
    v = judge(["heads-table-layout"], fig(0, 1.0, 2.0), fig(0, 1.0, 1.0))
    VerdictStore([shared]).put("k1", v)
    store = VerdictStore([plan, shared])
    assert store.get("k1") == v
    assert (plan / "weigh" / "k1.json").is_file()  # copied into the plan's rknn/ on first use
    assert store.get("k2") is None
    (plan / "weigh" / "k3.json").write_text("{not json")
    (shared / "weigh" / "k4.json").write_text(json.dumps({"version": 1, "key": "other", "verdict": v.to_json()}))
    assert store.get("k3") is None and store.get("k4") is None
