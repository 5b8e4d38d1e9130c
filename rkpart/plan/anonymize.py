"""Strip a model of every name that could tell a partitioner where its blocks are.

Node names become ``n0, n1, ...``; every tensor that is not a model input or output --
activations, initializers, value_info entries, names used inside subgraphs -- becomes
``t0, t1, ...`` in order of first use; ``metadata_props`` (model and node level, where the
dynamo exporter keeps ``namespace`` / ``pkg.torch.onnx.name_scopes``) and doc strings are
dropped.  The computed function is unchanged, so discovery on the result must find the same
blocks and regions from graph structure alone.

Library use only (no CLI): :func:`anonymize` maps a ``ModelProto`` to a new one,
:func:`anonymize_file` rewrites a file (inline or external weights).
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx import GraphProto, ModelProto

__all__ = ["anonymize", "anonymize_file"]


def _rename_graph(g: GraphProto, names: dict[str, str], keep: frozenset[str], counters: list[int]) -> None:
    """Rename ``g`` in place; ``names`` is shared with outer graphs (subgraphs read outer tensors)."""

    def tensor(name: str) -> str:
        if not name or name in keep:
            return name
        if name not in names:
            names[name] = f"t{counters[1]}"
            counters[1] += 1
        return names[name]

    # graph inputs first (initializer-backed inputs of old IR versions), then node order
    for vi in g.input:
        vi.name = tensor(vi.name)
        vi.doc_string = ""
    for node in g.node:
        node.name = f"n{counters[0]}"
        counters[0] += 1
        node.doc_string = ""
        del node.metadata_props[:]
        for k, t in enumerate(node.input):
            node.input[k] = tensor(t)
        for k, t in enumerate(node.output):
            node.output[k] = tensor(t)
        for attr in node.attribute:
            attr.doc_string = ""
            if attr.HasField("g"):
                _rename_graph(attr.g, names, keep, counters)
            for sub in attr.graphs:
                _rename_graph(sub, names, keep, counters)
    for init in g.initializer:
        init.name = tensor(init.name)
        init.doc_string = ""
    for sparse in g.sparse_initializer:
        sparse.values.name = tensor(sparse.values.name)
    for vi in g.value_info:
        vi.name = tensor(vi.name)
        vi.doc_string = ""
    for vi in g.output:
        vi.name = tensor(vi.name)
        vi.doc_string = ""
    for ann in g.quantization_annotation:
        ann.tensor_name = tensor(ann.tensor_name)
    g.doc_string = ""
    del g.metadata_props[:]


def anonymize(model: ModelProto) -> ModelProto:
    """Return a copy of ``model`` with meaningless node and tensor names and no metadata.

    Model inputs and outputs keep their names (they are the model's interface).  External
    data references are kept as they are (they name files, not tensors).

    Examples
    --------
    >>> anon = anonymize(onnx.load("model.onnx"))  # doctest: +SKIP
    >>> anon.graph.node[0].name  # doctest: +SKIP
    'n0'
    """
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    init_names = {i.name for i in g.initializer}
    keep = frozenset(
        [i.name for i in g.input if i.name not in init_names] + [o.name for o in g.output]
    )
    _rename_graph(g, {}, keep, [0, 0])
    g.name = "anonymous"
    del out.metadata_props[:]
    out.doc_string = ""
    out.producer_name = ""
    out.producer_version = ""
    for f in out.functions:
        del f.metadata_props[:]
        f.doc_string = ""
    return out


def anonymize_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Write an anonymised copy of the model file ``src`` to ``dst``.

    Weights stored as external data are written as external data next to ``dst``
    (``<dst name>.data``); inline weights stay inline.
    """
    from rkpart.io import atomic_writer

    src, dst = Path(src), Path(dst)
    model = onnx.load(str(src), load_external_data=False)
    external = any(i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer)
    if external:
        onnx.external_data_helper.load_external_data_for_model(model, str(src.parent))
    anon = anonymize(model)
    del model
    dst.parent.mkdir(parents=True, exist_ok=True)
    if external:
        data = dst.name + ".data"
        onnx.save_model(anon, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data, size_threshold=1024)
    else:
        with atomic_writer(dst) as tmp:
            onnx.save_model(anon, str(tmp))
    return dst
