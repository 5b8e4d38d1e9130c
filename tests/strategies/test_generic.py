"""The ``generic`` budget strategy on hand-built graphs, checked against a slow oracle."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from rkpart.errors import BudgetError, UserError
from rkpart.grouping.strategies.generic import segment
from rkpart.ir import load_model
from rkpart.pipeline import partition
from rkpart.runtime.executor import random_inputs, run_model, run_plan
from rkpart.validation.metrics import compare
from tests.strategies.footprint import crossing, footprint

D = 64  # width: activations [1, 64] fp32 = 256 B, weights [64, 64] fp32 = 16 KiB
W = D * D * 4
A = D * 4


def _save(nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray], outputs: list[str], path: Path) -> Path:
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, D])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, D]) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))
    return path


def _w(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((D, D)) / np.sqrt(D)).astype(np.float32)


@pytest.fixture
def diamond(tmp_path: Path) -> Path:
    r"""Five weight matrices; only one tensor (h1) crosses after the Add.

    ::

        x - MatMul(W0) - h0 -+- MatMul(Wa) - a -+- Add - h1 - MatMul(W2) - h2 - MatMul(W3) - y
                             +- MatMul(Wb) - b -+
    """
    nodes = [
        helper.make_node("MatMul", ["x", "W0"], ["h0"], name="mm0"),
        helper.make_node("MatMul", ["h0", "Wa"], ["a"], name="mma"),
        helper.make_node("MatMul", ["h0", "Wb"], ["b"], name="mmb"),
        helper.make_node("Add", ["a", "b"], ["h1"], name="add"),
        helper.make_node("MatMul", ["h1", "W2"], ["h2"], name="mm2"),
        helper.make_node("MatMul", ["h2", "W3"], ["y"], name="mm3"),
    ]
    inits = {k: _w(i) for i, k in enumerate(["W0", "Wa", "Wb", "W2", "W3"])}
    return _save(nodes, inits, ["y"], tmp_path / "diamond.onnx")


def test_cut_goes_where_one_small_tensor_crosses(diamond: Path, tmp_path: Path) -> None:
    # three matrices fit, four do not: two segments; of the feasible cuts (after mma, mmb or
    # add) only the one after the Add has a single tensor crossing
    budget = 3 * W + 8 * A
    plan = partition(diamond, tmp_path / "p", "generic", budget_bytes=budget)
    assert [s.id for s in plan.stages] == ["seg00", "seg01"]
    assert plan.stages[1].inputs == ("h1",)
    assert all(s.device == "npu" for s in plan.stages)
    assert plan.strategy["options"] == {"budget_bytes": budget, "device": "npu"}
    mg = load_model(diamond)
    for s, ops in zip(plan.stages, ([0, 1, 2, 3], [4, 5]), strict=True):
        w, act = footprint(mg, ops)
        assert s.weight_bytes == w
        assert w + act <= budget
    feeds = random_inputs(plan.tensors, plan.inputs)
    got = run_plan(plan, tmp_path / "p", feeds)
    assert compare(got["y"], run_model(diamond, feeds)["y"]).cosine >= 0.999999


def test_whole_model_when_it_fits(diamond: Path, tmp_path: Path) -> None:
    plan = partition(diamond, tmp_path / "p", "generic", budget_mib=1)
    assert [s.id for s in plan.stages] == ["seg00"]
    assert plan.stages[0].inputs == ("x",) and plan.stages[0].outputs == ("y",)


def test_budget_error_names_the_smallest_feasible_budget(diamond: Path, tmp_path: Path) -> None:
    mg = load_model(diamond)
    smallest = max(sum(footprint(mg, [i])) for i in sorted(mg.ops.nodes))
    assert smallest == W + 2 * A  # any MatMul alone: its matrix, the tensor it reads and the one it writes
    with pytest.raises(BudgetError) as e:
        partition(diamond, tmp_path / "p", "generic", budget_bytes=smallest - 1)
    msg = str(e.value)
    assert f"the smallest feasible budget is 0.02 MiB ({smallest} bytes)" in msg
    assert "\n" not in msg and not (tmp_path / "p").exists()
    plan = partition(diamond, tmp_path / "p", "generic", budget_bytes=smallest)
    assert len(plan.stages) == 6  # at the smallest budget every op is its own segment


def test_options_are_checked(diamond: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="either budget_mib or budget_bytes"):
        partition(diamond, tmp_path / "a", "generic", budget_mib=1, budget_bytes=10)
    with pytest.raises(UserError, match="budget must be positive"):
        partition(diamond, tmp_path / "b", "generic", budget_mib=0)
    with pytest.raises(UserError, match="budget must be a number"):
        partition(diamond, tmp_path / "c", "generic", budget_mib="lots")
    with pytest.raises(UserError, match="option device='gpu' is not one of npu, host"):
        partition(diamond, tmp_path / "d", "generic", device="gpu")
    plan = partition(diamond, tmp_path / "e", "generic", budget_mib=1, device="host")
    assert [s.device for s in plan.stages] == ["host"]


def test_same_input_gives_byte_identical_plans(diamond: Path, tmp_path: Path) -> None:
    for name in ("a", "b"):
        partition(diamond, tmp_path / name, "generic", budget_bytes=2 * W + 8 * A)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) >= 4
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


# -- optimality on random DAGs, against brute force --------------------------------------------


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray], list[str]]:
    n = draw(st.integers(2, 8))
    tensors = ["x"]
    nodes = []
    inits: dict[str, np.ndarray] = {}
    for i in range(n):
        if draw(st.booleans()):
            src = draw(st.sampled_from(tensors))
            inits[f"W{i}"] = _w(i)
            nodes.append(helper.make_node("MatMul", [src, f"W{i}"], [f"t{i}"], name=f"n{i}"))
        else:
            a, b = draw(st.sampled_from(tensors)), draw(st.sampled_from(tensors))
            nodes.append(helper.make_node("Add", [a, b], [f"t{i}"], name=f"n{i}"))
        tensors.append(f"t{i}")
    used = {t for nd in nodes for t in nd.input}
    outputs = [t for t in tensors[1:] if t not in used]
    return nodes, inits, outputs


@settings(max_examples=40, deadline=None)
@given(dag=dags(), slack=st.integers(0, 6))
def test_fewest_segments_then_least_crossing(tmp_path_factory: pytest.TempPathFactory,
                                             dag: tuple[list[onnx.NodeProto], dict[str, np.ndarray], list[str]],
                                             slack: int) -> None:
    nodes, inits, outputs = dag
    path = _save(nodes, inits, outputs, tmp_path_factory.mktemp("dag") / "m.onnx")
    mg = load_model(path)
    n = len(mg.ops.nodes)
    smallest = max(sum(footprint(mg, [i])) for i in range(n))
    budget = smallest + slack * A
    _, segs = segment(mg, budget)
    got = [s.start for s in segs[1:]]
    for sg in segs:
        w, act = footprint(mg, list(range(sg.start, sg.end)))
        assert (sg.weight_bytes, sg.activation_bytes) == (w, act)
        assert w + act <= budget

    def cost(cuts: tuple[int, ...]) -> tuple[int, int, int] | None:
        bounds = [0, *cuts, n]
        if any(sum(footprint(mg, list(range(a, b)))) > budget for a, b in itertools.pairwise(bounds)):
            return None
        cross = [crossing(mg, c) for c in cuts]
        return len(cuts) + 1, sum(b for b, _ in cross), sum(k for _, k in cross)

    best = min(c for r in range(n) for cuts in itertools.combinations(range(1, n), r)
               if (c := cost(cuts)) is not None)
    assert cost(tuple(got)) == best


def test_cli_budget_option_and_budget_error(diamond: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rkpart.cli import main

    runner = CliRunner()
    res = runner.invoke(main, ["partition", str(diamond), "-o", str(tmp_path / "ok"), "-s", "generic",
                               "--budget-mib", str((3 * W + 8 * A) / 2**20), "--json"])
    assert res.exit_code == 0, res.output
    assert '"npu_stages": 2' in res.output
    res = runner.invoke(main, ["partition", str(diamond), "-o", str(tmp_path / "no"), "-s", "generic",
                               "--budget-mib", "0.001"])
    assert res.exit_code == BudgetError.exit_code == 9
    assert res.output.strip().splitlines()[-1].startswith("rkpart: error: op 'mm0' (MatMul) alone needs 0.02 MiB")
    assert not (tmp_path / "no").exists()
    res = runner.invoke(main, ["partition", str(diamond), "-o", str(tmp_path / "zero"), "-s", "generic",
                               "--budget-mib", "0"])
    assert res.exit_code == 2 and "Invalid value for '--budget-mib'" in res.output


def test_default_budget_comes_from_the_target() -> None:
    from rkpart.grouping.strategies.generic import budget_from_options

    mib = 1 << 20
    assert budget_from_options({}) == 1024 * mib  # RK3588: a quarter of the 4 GiB NPU window
    assert budget_from_options({"board_ram_mib": 2048}) == 512 * mib  # a 2 GiB board: a quarter of its RAM
    assert budget_from_options({"ram_share": 0.5}) == 2048 * mib
    assert budget_from_options({"budget_mib": 64, "board_ram_mib": 2048}) == 64 * mib  # explicit wins
    with pytest.raises(UserError, match="unknown target 'rk1'"):
        budget_from_options({"target": "rk1"})
    with pytest.raises(UserError, match="budget must be a number, got 'lots'"):
        budget_from_options({"board_ram_mib": "lots"})
