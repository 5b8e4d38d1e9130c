"""Graph questions the ir answers for the packages above it: reachability, cut regions,
tensor lifetimes over a schedule, a stage file's declared boundary types."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import onnx
import pytest

from rkpart.ir import ModelGraph, graph_io, load_model, nbytes, value_type
from tests.ir.test_graph import _model, _ops


@pytest.fixture
def mg(tmp_path: Path) -> ModelGraph:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    return load_model(path)


def test_between_takes_the_ops_on_paths_from_cut_inputs_to_cut_outputs(mg: ModelGraph) -> None:
    # x -> matmul -> h -> {relu -> add -> y, sigmoid -> z}
    assert mg.between(["x"], ["y"]) == set(_ops(mg, "matmul", "relu", "add"))
    assert mg.between(["h"], ["z"]) == set(_ops(mg, "sigmoid"))
    assert mg.between(["h"], ["h"]) == set()  # the producer of h lies before its readers
    assert mg.between(["x"], ["W"]) == set()  # a weight has no producing op


def test_ancestors_and_descendants_are_networkx_over_the_op_dag(mg: ModelGraph) -> None:
    (matmul,) = _ops(mg, "matmul")
    (add,) = _ops(mg, "add")
    assert mg.descendants([matmul]) == nx.descendants(mg.ops, matmul) == set(_ops(mg, "relu", "add", "sigmoid"))
    assert mg.ancestors([add]) == set(_ops(mg, "matmul", "relu"))
    assert mg.ancestors([]) == mg.descendants([]) == set()


def test_lifetimes_over_model_order(mg: ModelGraph) -> None:
    life = mg.lifetimes()
    assert life.order == tuple(sorted(mg.ops.nodes))
    at = {t: k for k, t in enumerate(life.names)}
    h, x, y = at["h"], at["x"], at["y"]
    pos = {op: k for k, op in enumerate(life.order)}
    (matmul, sigmoid) = _ops(mg, "matmul", "sigmoid")
    assert life.born[x] == -1 and life.last[x] == pos[matmul]  # a model input: alive from the start
    assert life.born[h] == pos[matmul] and life.uses[h][-1] == life.last[h] == pos[sigmoid]
    assert life.last[y] == life.n - 1  # a model output: alive to the end
    live = life.live_bytes()
    assert live.shape == (life.n,)
    # at the MatMul both x and h are alive
    assert live[pos[matmul]] == nbytes("float32", (1, 128)) + nbytes("float32", (1, 160))
    assert np.all(live >= 0)


def test_graph_io_reads_a_stage_files_declared_boundary(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    io = graph_io(path)
    assert io.inputs == {"x": ("float32", (1, 128))}  # initializers are not inputs
    assert io.outputs == {"y": ("float32", (1, 160)), "z": ("float32", (1, 160))}
    assert graph_io(onnx.load(str(path))) == io
    assert value_type(onnx.helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT16, ["n", 4])) == \
        ("float16", (0, 4))


def test_peak_bytes_of_a_subgraph_counts_its_boundary_and_what_it_keeps(mg: ModelGraph) -> None:
    from rkpart.ir.liveness import peak_bytes

    f = 160 * 4  # one [1,160] float32 activation
    matmul, relu, sigmoid = _ops(mg, "matmul", "relu", "sigmoid")
    # h and r leave the stage: h (read by sigmoid outside) alive to the end, beside r
    assert peak_bytes(mg, mg.subgraph([matmul, relu])) == max(128 * 4 + f, 2 * f)
    # reading h from outside: h alive while relu and sigmoid run, with r and z (outputs)
    assert peak_bytes(mg, mg.subgraph([relu, sigmoid])) == 3 * f
    assert peak_bytes(mg, mg.subgraph([])) == 0
