"""Static shape inference, in one place: ONNX's, on a copy of the model without its large weights.

Shape inference serialises the model it is given; with the weights inside it would hold them
twice (and a model over 2 GB cannot be serialised at all).  :func:`infer_shapes` runs it on
:func:`light_copy`, where large initializers are typed graph inputs: loading types every tensor
with it (:mod:`rkpart.ir.load`), folding asks it for shapes, and the rewrites' editing view asks it
for element types (:class:`rkpart.ir.edit.GraphEdit`).  Only this module runs
``onnx.shape_inference`` (``tests/test_graph_api.py``).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

#: what inference raises on a model it cannot type (beside the checker's errors)
InferenceError = onnx.shape_inference.InferenceError

#: initializers larger than this are replaced by typed graph inputs for shape inference
_LIGHT_LIMIT = 1 << 16


def light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` without large weight bytes, for shape inference.

    Shape inference serialises the model; doing that with the weights inside would hold them
    twice.  Large initializers become typed graph inputs (their values never matter for
    shapes); small ones (Reshape targets, axes) keep their data for data propagation.
    """
    g = model.graph
    light = onnx.ModelProto()
    light.CopyFrom(onnx.ModelProto(
        ir_version=model.ir_version, opset_import=model.opset_import, producer_name=model.producer_name
    ))
    lg = light.graph
    lg.name = g.name
    lg.node.extend(g.node)
    lg.input.extend(g.input)
    lg.output.extend(g.output)
    lg.value_info.extend(g.value_info)
    input_names = {i.name for i in g.input}
    for init in g.initializer:
        small = init.data_location != TensorProto.EXTERNAL and init.ByteSize() <= _LIGHT_LIMIT
        if small:
            lg.initializer.append(init)
        elif init.name not in input_names:
            lg.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return light


def infer_shapes(model: onnx.ModelProto, *, light: bool = True, check_type: bool = False,
                 data_prop: bool = False) -> onnx.ModelProto:
    """``model`` with the value infos ONNX shape inference gives it (non-strict), inferred on
    :func:`light_copy` (``light=False``: on ``model`` itself, for one whose local functions the copy
    would not carry).  ``model`` is not changed.  Raises what ``onnx.shape_inference`` raises."""
    return onnx.shape_inference.infer_shapes(light_copy(model) if light else model, check_type=check_type,
                                             strict_mode=False, data_prop=data_prop)


def inferred_value_infos(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The value infos ONNX shape inference gives ``model``'s intermediate tensors (a stage read
    back from disk; the loaded model's types are :attr:`rkpart.ir.graph.ModelGraph.tensor_types`)."""
    return list(onnx.shape_inference.infer_shapes(model).graph.value_info)


__all__ = ["InferenceError", "infer_shapes", "inferred_value_infos", "light_copy"]
