"""The ops that fail a stage's build, isolated for ``--repartition`` (rkpart.triage.isolate).

Real graphs and real ONNX machinery; the toolkit builds that find such ops for real are in
``tests/compile/test_repartition.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.ir import load_model
from rkpart.triage.isolate import _typed_ops, failure_regex, occurrences


def test_the_failure_regex_matches_the_same_error_on_a_smaller_graph() -> None:
    log = ("D RKNN: fuse_exmatmul_add\nValueError: Traceback (most recent call last):\n"
           "  File \"rknn/api/rknn_utils.py\", line 595\n"
           "ValueError: Can not reshape from [5, 2, 4, 1] to [5, 2, 8, 2]\n")
    rx = failure_regex(log)
    assert rx is not None
    assert re.search(rx, "E RKNN: ValueError: Can not reshape from [16, 2, 4, 1] to [1, 16, 2, 16]")
    assert not re.search(rx, "ValueError: Traceback (most recent call last):")
    assert not re.search(rx, "RuntimeError: Can not reshape from [1] to [2]")
    assert failure_regex("Segmentation fault\n") is None  # a crash: its signal is the test


def _rope(tmp_path: Path, sides: tuple[str, ...] = ("q", "k")) -> Path:
    """Kandinsky 6's 1-D RoPE, once per side: Reshape to rank 6, Mul by the rotation, ReduceSum, Reshape."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("s6", [1, 8, 2, 4, 1, 2]), ("s4", [1, 8, 2, 8]), ("ax", [-1]))]
    nodes = []
    for t in sides:
        inits += [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), f"W{t}"),
                  numpy_helper.from_array(rng.standard_normal((8, 1, 4, 2, 2)).astype(np.float32), f"f{t}")]
        nodes += [helper.make_node("MatMul", ["x", f"W{t}"], [f"{t}0"], name=f"{t}_proj"),
                  helper.make_node("Reshape", [f"{t}0", "s6"], [f"{t}6"], name=f"{t}_view6"),
                  helper.make_node("Mul", [f"{t}6", f"f{t}"], [f"{t}m"], name=f"{t}_rot"),
                  helper.make_node("ReduceSum", [f"{t}m", "ax"], [f"{t}s"], name=f"{t}_sum", keepdims=0),
                  helper.make_node("Reshape", [f"{t}s", "s4"], [f"{t}4"], name=f"{t}_view4")]
    nodes.append(helper.make_node("Concat", [f"{t}4" for t in sides], ["y"], name="cat", axis=1))
    g = helper.make_graph(nodes, "rope", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8 * len(sides), 2, 8])], inits)
    path = tmp_path / "rope.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_every_copy_of_a_failing_subgraph_is_found_by_its_shape_classes(tmp_path: Path) -> None:
    """The subgraph a reduction found on q's side (Mul/ReduceSum/Reshape) is found on k's too, and
    nowhere else: the projections' MatMuls and the rank-6 views have other shape classes."""
    mg = load_model(_rope(tmp_path))
    ix = {mg.op(i).name: i for i in mg.ops.nodes}
    motif = _typed_ops(mg, {ix["q_rot"], ix["q_sum"], ix["q_view4"]})
    found = sorted(sorted(mg.op(i).name for i in ops) for ops in occurrences(mg, motif))
    assert found == [["k_rot", "k_sum", "k_view4"], ["q_rot", "q_sum", "q_view4"]]
    # the edges count too: the Mul and the final Reshape alone, without the ReduceSum between, are no copy
    loose = _typed_ops(mg, {ix["q_rot"], ix["q_view4"]})
    assert loose.number_of_edges() == 0 and len(occurrences(mg, loose)) >= 2
    chain = _typed_ops(mg, {ix["q_sum"], ix["q_view4"]})
    assert chain.number_of_edges() == 1
    assert sorted(sorted(mg.op(i).name for i in ops) for ops in occurrences(mg, chain)) == [
        ["k_sum", "k_view4"], ["q_sum", "q_view4"]]
