"""A forced name (a layer the last build put on the CPU) that names a node an NPU rewrite made moves the op it
replaced: the model has no node of that name."""

from __future__ import annotations

from rkpart.grouping.capability import _model_op

NAMES = {"node_ScatterND_558", "/model/blocks.0/attn1/Concat_10", "/model/blocks.0/attn1/to_q/MatMul"}


def test_a_rewrite_node_stands_for_the_op_it_replaced() -> None:
    assert _model_op("node_ScatterND_558/Reshape", NAMES) == "node_ScatterND_558"
    assert _model_op("node_ScatterND_558/Reshape/back", NAMES) == "node_ScatterND_558"
    assert _model_op("/model/blocks.0/attn1/Concat_10/Slice", NAMES) == "/model/blocks.0/attn1/Concat_10"


def test_a_model_op_and_an_unknown_name_stay_as_they_are() -> None:
    assert _model_op("/model/blocks.0/attn1/to_q/MatMul", NAMES) == "/model/blocks.0/attn1/to_q/MatMul"
    assert _model_op("other/Reshape", NAMES) == "other/Reshape"
    # a scope of op names is no op: nothing above it is taken either
    assert _model_op("/model/blocks.0/attn1", NAMES) == "/model/blocks.0/attn1"
