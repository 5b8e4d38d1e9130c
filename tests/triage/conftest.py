"""Fixtures for triage tests: FAKE toolkits that crash on demand, tiny graphs.

Real toolkits (the ``real_toolkits`` fixture) come from tests/conftest.py and tests/toolkits.py.

FAKE toolkits are registry entries whose "python" is a wrapper that sets ``FAKE_TK_VERSION``
and runs ``fake_crash_worker.py`` (with rkpart's own python) in place of the worker script it
is given; they crash on demand in milliseconds, so the reduction logic and the CLI are
tested without waiting for the real compiler.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

FAKE_WORKER = Path(__file__).with_name("fake_crash_worker.py")
FAKE_VERSIONS = ("2.3.0", "2.3.2", "2.5.0")


@pytest.fixture(scope="session")
def fake_toolkits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toolkits root with FAKE 2.3.0 / 2.3.2 / 2.5.0 entries (wrapper pythons, no rknn)."""
    root = tmp_path_factory.mktemp("fake-toolkits")
    for v in FAKE_VERSIONS:
        d = root / v
        d.mkdir()
        wrapper = d / "python"
        # argv is "<python> <worker script> build REQUEST": whatever worker rkpart names, run the FAKE one.
        wrapper.write_text(f"#!/bin/sh\nshift\nFAKE_TK_VERSION={v} exec {sys.executable} {FAKE_WORKER} \"$@\"\n")
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        (d / "toolkit.json").write_text(json.dumps({"version": v, "python": str(wrapper), "managed": False}))
    return root


def _w(rng: np.random.Generator, name: str, *shape: int) -> TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)


def make_adaln_chain(path: Path) -> Path:
    """A 12-op AdaLN chain (opset 17) for the fake-crash reduction tests::

        x[1,8,16] ─ MatMul(w_in) ─ h ─ LayerNorm ─ n ─ Mul ─ m ─ Add ─ a ─ MatMul(w_q) ─ q ─ Relu ─ r ─┐
                                                   │         │                                    Add ─ y
        t[1,16] ─ Sigmoid ─ MatMul(w_mod) ─ Split ─┼ scale ─ Add(1) ─ s1 ┘ (to Mul)                    │
                                                   └ shift ───────────── (to Add)   h ──────────────────┘
        t ─ Tanh ─ Mul(0.5) ─ z                    (an unrelated branch, a second output)

    The fake toolkit crashes iff ``ln -> mul -> add_shift -> q`` are all present, so the
    minimal reproducer is exactly those four ops.
    """
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h"], name="in_proj"),
        helper.make_node("Sigmoid", ["t"], ["sig"], name="act"),
        helper.make_node("MatMul", ["sig", "w_mod"], ["mod"], name="mod_proj"),
        helper.make_node("Split", ["mod", "split_sizes"], ["scale", "shift"], name="split", axis=1),
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["n"], name="ln", axis=-1, epsilon=1e-6),
        helper.make_node("Add", ["scale", "one"], ["s1"], name="one_plus_scale"),
        helper.make_node("Mul", ["n", "s1"], ["m"], name="mul"),
        helper.make_node("Add", ["m", "shift"], ["a"], name="add_shift"),
        helper.make_node("MatMul", ["a", "w_q"], ["q"], name="q"),
        helper.make_node("Relu", ["q"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "h"], ["y"], name="residual"),
        helper.make_node("Tanh", ["t"], ["th"], name="tanh"),
        helper.make_node("Mul", ["th", "half"], ["z"], name="half_tanh"),
    ]
    inits = [
        _w(rng, "w_in", 16, 16), _w(rng, "w_mod", 16, 32), _w(rng, "w_q", 16, 16),
        numpy_helper.from_array(np.array([16, 16], dtype=np.int64), "split_sizes"),
        numpy_helper.from_array(np.ones(16, np.float32), "gamma"),
        numpy_helper.from_array(np.zeros(16, np.float32), "beta"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    graph = helper.make_graph(
        nodes, "adaln_chain",
        [helper.make_tensor_value_info("x", f, [1, 8, 16]), helper.make_tensor_value_info("t", f, [1, 16])],
        [helper.make_tensor_value_info("y", f, [1, 8, 16]), helper.make_tensor_value_info("z", f, [1, 16])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


#: the FAKE crash condition for make_adaln_chain and the ops it implies
CHAIN_CRASH_EDGES = [["ln", "mul"], ["mul", "add_shift"], ["add_shift", "q"]]
CHAIN_MINIMAL = ["ln", "mul", "add_shift", "q"]


@pytest.fixture
def adaln_chain(tmp_path: Path) -> Path:
    return make_adaln_chain(tmp_path / "adaln_chain.onnx")
