"""Load an ONNX model into a :class:`~rkpart.ir.graph.ModelGraph` without holding weight bytes twice.

The model is parsed with ``load_external_data=False``: external weights stay on disk and are
only referenced (file, offset, length) until a stage is written out, and inline weights stay
in the one ``ModelProto`` that was parsed.  Extraction streams weight bytes from there
straight into each stage's files (:mod:`rkpart.plan.extract`).

:func:`load_model` is a recipe of named steps, each refusing a bad input with one
:class:`~rkpart.errors.InvalidModelError` line before anything is written:

1. **Parse** (:func:`_parse`): read the file, protobuf-decode it, refuse non-UTF-8 text.
2. **Check the header** (:func:`_opset`, :func:`_check_initializers`,
   :func:`check_external_data`): a supported default-domain opset; initializers whose type
   and data fit their shape; external data inside the model folder and long enough.
3. **Fold constants** (:func:`_fold_constants`): small constant computations (``Shape`` of
   static tensors, index arithmetic) become initializers, so shapes resolve; ops whose results
   nothing reads any more (a ``Slice`` whose only reader was a folded ``Shape``) are dropped
   (:func:`_prune_dead`), so a shape-only read never keeps an intermediate alive across a cut.
   Once step 6 has typed every tensor, the ``Shape`` ops left (dynamic axes resolved by
   ``input_shapes``) become ``Constant`` nodes and dead ops are dropped again.
4. **Index tensors** (:func:`_index`): producer and consumers of every tensor; every read
   tensor produced exactly once, every output produced.
5. **Sort** (:func:`_sort`): nodes in a topological order (cycles refused); the rest of
   rkpart relies on model order being topological.
6. **Type** (:func:`_check_schema`, :func:`_infer_types`, :func:`_check_types`):
   ``onnx.checker`` and static shape inference on a weight-free copy; every read tensor gets
   a static type.
7. **Classify constants** (:func:`_const_ops`, :func:`_check_outputs`): ops that carry no
   data from the inputs; model outputs must not be constants.
8. **Build the graph** (:func:`_op_graph`): the op-level DAG with typed :class:`OpNode` data.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.errors import InvalidModelError, first_line
from rkpart.io import confined_file
from rkpart.ir.consts import evaluate, opsets_of
from rkpart.ir.graph import ModelGraph, OpNode, shape_as_constant
from rkpart.ir.infer import InferenceError, infer_shapes, light_copy
from rkpart.ir.ops import CONTROL_FLOW_OPS, DEFAULT_DOMAINS, GENERATIVE_OPS, RANDOM_OPS, SUPPORTED_DOMAINS
from rkpart.ir.shape_deps import node_reads, shape_varying
from rkpart.ir.tensors import (
    MAX_ELEMENTS,
    SUB_BYTE_BITS,
    SUPPORTED_DTYPES,
    TensorType,
    np_dtype_name,
    onnx_dtype_name,
    tensor_nbytes,
    value_type,
)
from rkpart.types import JsonObject

if TYPE_CHECKING:
    from google.protobuf.descriptor import FieldDescriptor
    from google.protobuf.message import Message

MIN_OPSET, MAX_OPSET = 7, 23
#: constant results up to this size are folded into initializers at load time
FOLD_LIMIT = 1 << 16
#: at most this many folding rounds (each runs shape inference once)
FOLD_ROUNDS = 64
#: never folded nor treated as constants: random ops differ per run, control flow is opaque
_NO_FOLD = RANDOM_OPS | CONTROL_FLOW_OPS


def load_model(
    path: str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    data_shapes: Mapping[str, TensorType] | None = None,
) -> ModelGraph:

    """Parse, validate and index an ONNX model.

    Parameters
    ----------
    path:
        The ``.onnx`` file; external data is resolved relative to its folder but not read.
    input_shapes:
        Static shapes for model inputs with symbolic dimensions.
    data_shapes:
        Types (dtype, shape) of tensors whose shapes depend on data, observed in a run on
        representative inputs (:mod:`rkpart.runtime.specialise`): the graph is specialised
        to them, as if shape inference had found them.

    Raises
    ------
    InvalidModelError
        Not ONNX, truncated, invalid references, cycles, unsupported opset, escaping or short
        external data, unresolved dynamic shapes.
    DataDependentShapeError
        Static inputs, yet a shape depends on data (``NonZero``, an ``If``, a sequence op) and
        ``data_shapes`` does not give it.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidModelError(f"no such model file: {path}")
    return _build(_parse(path), path, input_shapes, data_shapes)


def graph_of(
    model: onnx.ModelProto,
    path: str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    data_shapes: Mapping[str, TensorType] | None = None,
) -> ModelGraph:
    """:func:`load_model` for a model already parsed (e.g. a stage read without its weights).

    ``path`` names the model in messages and roots its external data.  ``model`` is copied,
    not changed.
    """
    own = onnx.ModelProto()
    own.CopyFrom(model)
    path = Path(path)
    _check_parsed(own, path)
    return _build(own, path, input_shapes, data_shapes)


@dataclass(frozen=True)
class GraphIO:
    """A graph's declared inputs (initializers excluded) and outputs with their types, in graph order."""

    inputs: dict[str, TensorType]
    outputs: dict[str, TensorType]


def graph_io(model: onnx.ModelProto | str | os.PathLike[str]) -> GraphIO:
    """The :class:`GraphIO` of ``model`` (a path is parsed without its external data).

    For a stage file, whose boundary types extraction wrote: what a runtime feeds and expects.
    """
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    g = model.graph
    inits = {t.name for t in g.initializer}
    return GraphIO(inputs={v.name: value_type(v) for v in g.input if v.name not in inits},
                   outputs={v.name: value_type(v) for v in g.output})


def _build(model: onnx.ModelProto, path: Path, input_shapes: Mapping[str, tuple[int, ...]] | None,
           data_shapes: Mapping[str, TensorType] | None = None) -> ModelGraph:
    """Steps 2-8 of the module docstring on a parsed ``model`` (changed in place: folded, sorted)."""
    opset = _opset(model, path)
    _check_initializers(model, path)
    check_external_data(model, path.parent)
    _check_declared_sizes(model, path)  # before anything runs ONNX shape inference
    # --shape first: what folds (chunk() arithmetic, a squeeze's If) is computed from the shapes
    _apply_input_shapes(model, input_shapes)
    _fold_constants(model, path)
    _prune_dead(model)
    index = _sort(model, _index(model, path), path)
    # after our own checks (clearer messages) and the topological re-sort (the checker
    # insists on sorted nodes; rkpart accepts any order)
    _check_schema(model, path)
    try:
        types = _infer_types(model, path, input_shapes, data_shapes)
    except _ShapesFollowInputs as e:
        # every shape follows from the static input shapes, inference just cannot follow it:
        # one run on inputs of those shapes shows them (any inputs: the values decide none)
        seen = _observe_types(model, path, e.tensors, e.first)
        types = _infer_types(model, path, input_shapes, {**seen, **(data_shapes or {})})
    _check_types(index, types, path)
    if _static_shapes_as_constants(model, types) | _squeezes_as_torch_meant(model, types):
        _prune_dead(model)
        index = _index(model, path)  # same order: nodes were only replaced or dropped
    return _graph(model, path, index, types, opset)


def _graph(model: onnx.ModelProto, path: Path, index: _Index, types: dict[str, TensorType], opset: int,
           specialised: tuple[JsonObject, ...] = ()) -> ModelGraph:
    """Steps 7-8: classify constants and build the :class:`ModelGraph` of an indexed, typed model."""
    const_ops = frozenset(_const_ops(index.nodes, index.initializers, types))
    _check_outputs(index, const_ops, path)
    op_nodes = tuple(OpNode.of(i, n, _scope_of(n)) for i, n in enumerate(index.nodes))
    return ModelGraph(
        path=path,
        model=model,
        nodes=tuple(index.nodes),
        tensor_types=types,
        initializers=index.initializers,
        producer=index.producer,
        consumers=index.consumers,
        const_ops=const_ops,
        ops=_op_graph(index, const_ops, op_nodes),
        inputs=index.inputs,
        outputs=index.outputs,
        opset=opset,
        op_nodes=op_nodes,
        specialised=specialised,
    )


def edited(mg: ModelGraph, model: onnx.ModelProto, types: Mapping[str, TensorType]) -> ModelGraph:
    """The graph of ``model``, an edited copy of ``mg.model`` (:func:`own_copy`): indexed and
    classified again, typed by ``types`` (``mg``'s types and those of the tensors the edit added;
    no shape inference runs).  ``mg`` is not changed."""
    return _graph(model, mg.path, _index(model, mg.path), dict(types), mg.opset, mg.specialised)


def own_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` to edit: a graph is a value, and a proposal that edits one makes another
    (its inline weights are copied too; external ones are references)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def with_merged_tensors(mg: ModelGraph, same: Mapping[str, str]) -> ModelGraph:
    """A new graph: ``mg`` with each tensor ``t`` of ``same`` read as ``same[t]``, which holds the same
    values (:func:`rkpart.ir.values.same_values`), and the ops nothing reads any more dropped.  Exact.
    ``mg`` is not changed."""
    if not same:
        return mg
    model = own_copy(mg.model)
    for n in model.graph.node:
        for k, x in enumerate(n.input):
            if x in same:
                n.input[k] = same[x]
    _prune_dead(model)
    return edited(mg, model, mg.tensor_types)


@dataclass
class _Index:
    """Who produces and who reads each tensor (step 4)."""

    nodes: list[onnx.NodeProto]
    initializers: dict[str, TensorProto]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    producer: dict[str, int]
    consumers: dict[str, list[int]]


def _index(model: onnx.ModelProto, path: Path) -> _Index:
    g = model.graph
    initializers = {i.name: i for i in g.initializer}
    graph_inputs = tuple(i.name for i in g.input if i.name not in initializers)
    if not graph_inputs:
        raise InvalidModelError(f"{path}: model has no inputs")
    nodes = list(g.node)
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.domain not in SUPPORTED_DOMAINS:
            raise InvalidModelError(f"{path}: node {n.name or i} uses unsupported domain {n.domain!r}")
        for t in n.output:
            if not t:
                continue
            if t in producer or t in initializers or t in graph_inputs:
                raise InvalidModelError(f"{path}: tensor {t!r} is produced more than once")
            producer[t] = i
    known = set(producer) | set(initializers) | set(graph_inputs)
    for i, n in enumerate(nodes):
        for t in n.input:
            if t and t not in known:
                raise InvalidModelError(
                    f"{path}: node {n.name or i} ({n.op_type}) reads {t!r}, which nothing produces"
                )
    outputs = tuple(o.name for o in g.output)
    for o in outputs:
        if o not in known:
            raise InvalidModelError(f"{path}: model output {o!r} is produced by nothing")
    return _Index(nodes, initializers, graph_inputs, outputs, producer, _consumers(nodes))


def _consumers(nodes: list[onnx.NodeProto]) -> dict[str, list[int]]:
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            if t:
                consumers.setdefault(t, []).append(i)
    return consumers


def _sort(model: onnx.ModelProto, index: _Index, path: Path) -> _Index:
    """Re-order the nodes topologically (in ``model`` too) when the exporter did not."""
    order = _toposort(index.nodes, index.producer, path)
    if order == list(range(len(index.nodes))):
        return index
    nodes = [index.nodes[i] for i in order]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    producer = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    return _Index(nodes, index.initializers, index.inputs, index.outputs, producer, _consumers(nodes))


def _check_types(index: _Index, types: Mapping[str, TensorType], path: Path) -> None:
    for i, n in enumerate(index.nodes):
        for t in n.output:
            if t and t not in types and index.consumers.get(t):
                raise InvalidModelError(f"{path}: cannot infer the type of {t!r} (node {n.name or i})")
        _check_element_counts(n, i, types, path)


def _check_outputs(index: _Index, const_ops: frozenset[int], path: Path) -> None:
    outputs = index.outputs
    if not outputs:
        raise InvalidModelError(f"{path}: model has no outputs")
    if len(set(outputs)) != len(outputs):
        dup = next(o for o in outputs if outputs.count(o) > 1)
        raise InvalidModelError(f"{path}: model output {dup!r} is listed twice")
    for o in outputs:
        p = index.producer.get(o)
        if o in index.initializers or (p is not None and p in const_ops):
            raise InvalidModelError(
                f"{path}: model output {o!r} is a constant, not computed from the inputs; remove it"
            )


def _op_graph(index: _Index, const_ops: frozenset[int], op_nodes: tuple[OpNode, ...]) -> nx.DiGraph:
    """The op-level DAG over data ops: an edge ``p -> i`` when ``i`` reads a tensor ``p`` produces."""
    ops = nx.DiGraph()
    for i in range(len(index.nodes)):
        if i not in const_ops:
            ops.add_node(i, op=op_nodes[i])
    for i, n in enumerate(index.nodes):
        if i in const_ops:
            continue
        for t in n.input:
            p = index.producer.get(t)
            if p is not None and p not in const_ops:
                ops.add_edge(p, i)
    return ops


def _value_info_type(vi: onnx.ValueInfoProto) -> tuple[str, tuple[int | str, ...]] | None:
    t = vi.type
    if not t.HasField("tensor_type"):
        return None
    tt = t.tensor_type
    dims: list[int | str] = []
    if tt.HasField("shape"):
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or "?")
    else:
        return np_dtype_name(tt.elem_type), ("<unranked>",)
    return np_dtype_name(tt.elem_type), tuple(dims)


def parse_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The checked ``ModelProto`` of ``path``, its external data not read (what :func:`load_model` parses)."""
    return _parse(Path(path))


def _parse(path: Path) -> onnx.ModelProto:
    from google.protobuf.message import DecodeError

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InvalidModelError(f"cannot read {path}: {e.strerror}") from None
    if not data:
        raise InvalidModelError(f"{path} is empty, not an ONNX model")
    try:
        model = onnx.ModelProto.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidModelError(f"{path} is not an ONNX model (protobuf parse failed: {e})") from None
    del data
    _check_parsed(model, path)
    return model


def _check_parsed(model: onnx.ModelProto, path: Path) -> None:
    if _has_bad_text(model):
        _check_text(model, path)  # finds it again, to name where it is
    if not model.HasField("graph") or not model.graph.node:
        raise InvalidModelError(f"{path} is not an ONNX model (no graph nodes)")


def _repeated(fd: FieldDescriptor) -> bool:
    # protobuf >= 5 has is_repeated (and later drops .label); older ones only .label
    rep = getattr(fd, "is_repeated", None)
    return bool(rep) if rep is not None else bool(fd.label == fd.LABEL_REPEATED)


#: per field: 0 a message, 1 repeated messages, 2 a string, 3 repeated strings, 4 anything else
_FIELD_KINDS: dict[FieldDescriptor, int] = {}
_is_bytes = bytes.__instancecheck__


def _field_kind(fd: FieldDescriptor) -> int:
    kind = _FIELD_KINDS.get(fd)
    if kind is None:
        from google.protobuf.descriptor import FieldDescriptor as FD

        rep = _repeated(fd)
        kind = (1 if rep else 0) if fd.type == FD.TYPE_MESSAGE else (3 if rep else 2) if fd.type == FD.TYPE_STRING \
            else 4
        _FIELD_KINDS[fd] = kind
    return kind


def _has_bad_text(msg: Message) -> bool:
    """Whether any string field under ``msg`` is not valid UTF-8 (:func:`_check_text` without
    building a location per field: the common case of a good model is checked fast)."""
    kinds = _FIELD_KINDS
    for fd, value in msg.ListFields():
        kind = kinds.get(fd)
        if kind is None:
            kind = _field_kind(fd)
        if kind == 1:
            for x in value:
                if _has_bad_text(x):
                    return True
        elif kind == 0:
            if _has_bad_text(value):
                return True
        elif kind == 3:
            if any(map(_is_bytes, value)):
                return True
        elif kind == 2 and _is_bytes(value):
            return True
    return False


def _check_text(msg: Message, path: Path, where: str = "model") -> None:
    """Refuse string fields that are not valid UTF-8 (a corrupt or crafted file).

    protobuf (upb) parses them anyway and hands them out as ``bytes`` instead of ``str``,
    which would surface as a TypeError deep inside rkpart.  Weights are ``bytes`` fields and
    are not looked at.
    """
    from google.protobuf.descriptor import FieldDescriptor as FD

    for fd, value in msg.ListFields():
        if fd.type == FD.TYPE_MESSAGE:
            if _repeated(fd):
                for i, x in enumerate(value):
                    _check_text(x, path, f"{where}.{fd.name}[{i}]")
            else:
                _check_text(value, path, f"{where}.{fd.name}")
        elif fd.type == FD.TYPE_STRING:
            vals = value if _repeated(fd) else [value]
            if any(isinstance(v, bytes) for v in vals):
                raise InvalidModelError(
                    f"{path} is not a valid ONNX model: {where}.{fd.name} is not valid UTF-8 text (corrupt file?)"
                )


def _opset(model: onnx.ModelProto, path: Path) -> int:
    ops = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not ops:
        raise InvalidModelError(f"{path}: model imports no default-domain opset")
    v = int(ops[0])
    if not MIN_OPSET <= v <= MAX_OPSET:
        raise InvalidModelError(
            f"{path}: opset {v} is not supported (supported: {MIN_OPSET}..{MAX_OPSET})"
        )
    return v


def _check_initializers(model: onnx.ModelProto, path: Path) -> None:
    """Refuse initializers whose type is unknown or whose inline data does not fit their shape.

    Counting bytes (raw) or elements (typed fields) is enough; no weight is decoded here.
    """
    for init in model.graph.initializer:
        what = f"{path.name}: initializer {init.name!r}"
        need = tensor_nbytes(init.data_type, init.dims, what)
        if init.data_location == TensorProto.EXTERNAL:
            continue
        if init.HasField("raw_data"):
            have = len(init.raw_data)
            if have != need:
                raise InvalidModelError(
                    f"{what}: {have} bytes of data for shape {list(init.dims)} "
                    f"{onnx_dtype_name(init.data_type)} (needs {need})"
                )
            continue
        field_name = helper.tensor_dtype_to_field(init.data_type)
        count = len(getattr(init, field_name))
        numel = 1
        for d in init.dims:
            numel *= int(d)
        if init.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
            numel *= 2
        packed = int(init.data_type) in SUB_BYTE_BITS
        if not packed and count != numel:
            raise InvalidModelError(
                f"{what}: {count} values for shape {list(init.dims)} (needs {numel})"
            )


def _check_declared_sizes(model: onnx.ModelProto, path: Path) -> None:
    """Refuse absurd static input sizes *before* shape inference: with data propagation, ONNX's
    inference materialises shape-derived values (Shape -> Range/ConstantOfShape/Expand) and a
    2^50-element input made it allocate tens of GB (found by the structure fuzz)."""
    for vi in model.graph.input:
        n = 1
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                n *= max(int(d.dim_value), 1)
        if n > MAX_ELEMENTS:
            dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]
            raise InvalidModelError(f"{path}: tensor {vi.name!r} has an absurd shape {dims} ({n} elements)")


def check_external_data(model: onnx.ModelProto, folder: Path) -> None:
    """Refuse external data that leaves the model folder, is missing, or is too short.

    The location is checked lexically first (absolute, ``..``) and then after resolving
    symlinks, so neither a crafted path nor a symlink can make rkpart read (and copy into a
    stage) a file outside the model's folder.
    """
    sizes: dict[str, int] = {}  # location -> size, once it passed the confinement check
    for init in model.graph.initializer:
        if init.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in init.external_data}
        loc = info.get("location", "")
        tname = f"tensor {init.name!r}"
        if not loc:
            raise InvalidModelError(f"{tname}: external data has no location")
        size = sizes.get(loc)
        if size is None:
            # the one confinement check (rkpart.io): inside the folder, a regular file
            full = confined_file(folder, loc, what=f"{tname}: external data location", error=InvalidModelError,
                                 within="model folder").resolve()
            size = sizes[loc] = full.stat().st_size
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise InvalidModelError(
                f"{tname}: external data offset/length in {loc!r} are not integers "
                f"({info.get('offset')!r}, {info.get('length')!r})"
            ) from None
        if offset < 0 or (length is not None and length < 0):
            raise InvalidModelError(f"{tname}: negative external data offset/length in {loc!r}")
        need = tensor_nbytes(init.data_type, init.dims, tname)
        if length is not None and length != need:
            raise InvalidModelError(
                f"{tname}: external data length {length} in {loc!r} does not match the {need} bytes "
                f"its shape {list(init.dims)} needs"
            )
        if offset + need > size:
            raise InvalidModelError(
                f"{tname}: external data file {loc!r} is too short ({size} bytes, needs {offset + need})"
            )


def _check_schema(model: onnx.ModelProto, path: Path) -> None:
    """``onnx.checker`` on the weight-free copy: attributes, types and arity against the opset.

    Every extracted stage must pass the checker; a node that does not (e.g. an attribute the
    declared opset removed) is the input's fault and is reported here, before any writing.
    """
    try:
        onnx.checker.check_model(light_copy(model))
    except (onnx.checker.ValidationError, RuntimeError, ValueError) as e:
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        first = lines[0] if lines else type(e).__name__
        where = next((ln for ln in lines[1:] if ln.startswith("==> Context:")), "")
        raise InvalidModelError(
            f"{path}: not a valid ONNX model: {first}{' (' + where[4:].strip() + ')' if where else ''}"
        ) from None


def _real_inputs(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


class DataDependentShapeError(InvalidModelError):
    """Static inputs, yet some shapes depend on the data: ``rkpart partition --inputs`` resolves them.

    ``tensors`` are every tensor whose shape is unresolved (sorted); ``sources`` the ops whose
    outputs are the first of them, as ``(op_type, node name, tensor)`` in graph order.
    """

    def __init__(self, message: str, tensors: tuple[str, ...], sources: tuple[tuple[str, str, str], ...]) -> None:
        super().__init__(message)
        self.tensors = tensors
        self.sources = sources


def data_dependent_sources(nodes: list[onnx.NodeProto], unresolved: set[str],
                           known: set[str] | None = None) -> list[tuple[str, str, str]]:
    """``(op_type, name, tensor)`` of the ops that make an unresolved shape from resolved inputs.

    ``known``: the tensors whose static type is known; an input outside it (no type inferred
    at all) is not resolved either.  Without ``known`` only ``unresolved`` counts.
    """
    out = []
    for n in nodes:
        hit = [t for t in n.output if t in unresolved]
        ins = [t for t in n.input if t]
        if hit and not any(t in unresolved or (known is not None and t not in known) for t in ins):
            out.append((n.op_type, n.name, hit[0]))
    return out


class _ShapesFollowInputs(Exception):
    """Shape inference left ``tensors`` unresolved, but their shapes follow from the static input
    shapes (:func:`rkpart.ir.shape_deps.shape_varying`); ``first`` is the first as reported."""

    def __init__(self, tensors: tuple[str, ...], first: str) -> None:
        super().__init__(first)
        self.tensors = tensors
        self.first = first


def _observe_types(model: onnx.ModelProto, path: Path, tensors: tuple[str, ...], first: str) -> dict[str, TensorType]:
    """The dtype and shape of each of ``tensors`` in one ONNX Runtime run of ``model`` on zeros.

    Only each tensor's ``Shape`` is fetched (and the tensor itself where inference did not even
    give its element type), so the run holds no more memory than a plain inference.  A model
    ONNX Runtime cannot run is refused with the unresolved shape as shape inference left it.
    """
    import onnxruntime as ort  # the IR layer runs a model only here (rkpart.runtime sits above it)

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inferred = infer_shapes(m)
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in [*inferred.graph.value_info, *inferred.graph.output]
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
    del g.output[:]
    fetch: list[tuple[str, str, str]] = []  # (tensor, fetched name, "shape" | "value")
    for k, t in enumerate(tensors):
        name = f"rkpart_observe_shape_{k}"
        g.node.append(helper.make_node("Shape", [t], [name], name=name))
        fetch.append((t, name, "shape"))
        if t not in elem:
            fetch.append((t, t, "value"))
    g.output.extend(onnx.ValueInfoProto(name=f) for _, f, _ in fetch)
    inits = {i.name for i in g.initializer}
    feeds = {}
    for vi in g.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        feeds[vi.name] = np.zeros([d.dim_value for d in tt.shape.dim], helper.tensor_dtype_to_np_dtype(tt.elem_type))
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
        sess = ort.InferenceSession(m.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])
        got = dict(zip([f for _, f, _ in fetch], sess.run([f for _, f, _ in fetch], feeds), strict=True))
    except Exception as e:  # noqa: BLE001 - any ORT failure: the model stays unresolved, as inference left it
        raise InvalidModelError(
            f"{path}: unresolved dynamic shape of {first} (shape inference gives up; every shape follows from "
            f"the input shapes, but ONNX Runtime cannot run the model to show them: {first_line(e)})"
        ) from None
    out: dict[str, TensorType] = {}
    for t, f, kind in fetch:
        if kind == "shape":
            dtype = np_dtype_name(elem[t]) if t in elem else None
            out[t] = (dtype or "", tuple(int(d) for d in np.asarray(got[f]).reshape(-1)))
        else:
            out[t] = (np.asarray(got[f]).dtype.name, out[t][1])
    return out


def _set_types(model: onnx.ModelProto, data_shapes: Mapping[str, TensorType]) -> None:
    """Record ``data_shapes`` as the value_info of those tensors (replacing what was there)."""
    g = model.graph
    keep = [vi for vi in g.value_info if vi.name not in data_shapes]
    del g.value_info[:]
    g.value_info.extend(keep)
    for name, (dtype, shape) in sorted(data_shapes.items()):
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        for vi in g.output:
            if vi.name == name:
                vi.CopyFrom(helper.make_tensor_value_info(name, elem, list(shape)))
                break
        else:
            g.value_info.append(helper.make_tensor_value_info(name, elem, list(shape)))


def _apply_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]] | None) -> None:
    """Give the model inputs the static shapes of ``--shape`` (in place; checked against the inputs)."""
    if not input_shapes:
        return
    names = {i.name for i in model.graph.input}
    for name, shape in input_shapes.items():
        if name not in names:
            raise InvalidModelError(
                f"--shape names {name!r}, which is not a model input (inputs: {', '.join(sorted(names))})"
            )
        for vi in model.graph.input:
            if vi.name == name:
                dims = vi.type.tensor_type.shape.dim
                if len(dims) != len(shape):
                    raise InvalidModelError(
                        f"--shape {name}: rank {len(shape)} given, model input has rank {len(dims)}"
                    )
                for d, v in zip(dims, shape, strict=True):
                    d.ClearField("dim_param")
                    d.dim_value = int(v)


def _infer_types(
    model: onnx.ModelProto, path: Path, input_shapes: Mapping[str, tuple[int, ...]] | None,
    data_shapes: Mapping[str, TensorType] | None = None,
) -> dict[str, tuple[str, tuple[int, ...]]]:
    _apply_input_shapes(model, input_shapes)
    if data_shapes:
        _set_types(model, data_shapes)
    try:
        inferred = infer_shapes(model, check_type=True, data_prop=True)
    except (InferenceError, onnx.checker.ValidationError, RuntimeError, ValueError,
            TypeError) as e:
        # ValueError: e.g. "Invalid tensor data type 0." for a Cast to an undefined type
        msg = first_line(e)
        raise InvalidModelError(f"{path}: shape inference failed: {msg}") from None
    types: dict[str, tuple[str, tuple[int, ...]]] = {}
    unresolved: list[str] = []
    g = inferred.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        t = _value_info_type(vi)
        if t is None:
            continue
        dt, dims = t
        if dt not in SUPPORTED_DTYPES:
            kind = "string" if dt == "object" else dt.removeprefix("onnx:")
            raise InvalidModelError(f"{path}: tensor {vi.name!r} has an unsupported element type {kind}")
        if any(not isinstance(d, int) for d in dims):
            unresolved.append(f"{vi.name!r} {list(dims)}")
            continue
        types[vi.name] = (dt, tuple(int(d) for d in dims))
    for init in g.initializer:
        types[init.name] = (np_dtype_name(init.data_type), tuple(int(d) for d in init.dims))
    # before anything runs the model to resolve the rest (_observe_types)
    for name, (_, shape) in types.items():
        n = 1
        for d in shape:
            if d < 0:
                raise InvalidModelError(f"{path}: tensor {name!r} has a negative dimension {d} (shape {list(shape)})")
            n *= d
        if n > MAX_ELEMENTS:
            raise InvalidModelError(f"{path}: tensor {name!r} has an absurd shape {list(shape)} ({n} elements)")
    if unresolved:
        names = {vi.name for vi in [*g.input, *g.value_info, *g.output]
                 if (t := _value_info_type(vi)) is not None and not all(isinstance(d, int) for d in t[1])}
        static_inputs = not any(n in names for n in _real_inputs(model))
        # typed but not tensors (a Loop's sequence): known, if not as a tensor type
        other = {vi.name for vi in [*g.input, *g.value_info, *g.output] if not vi.type.HasField("tensor_type")
                 and vi.type.WhichOneof("value") is not None}
        sources = data_dependent_sources(list(model.graph.node), names, set(types) | other)
        if static_inputs:
            # tensors inference typed without a static shape, and those it could not type at all
            pending = names | {t for n in model.graph.node for t in n.output
                               if t and t not in types and t not in other}
            _, varying = shape_varying(model.graph.node, _real_inputs(model))
            if not pending & varying:
                raise _ShapesFollowInputs(tuple(sorted(pending)), unresolved[0])
            # the ops by which the data decides a shape, not one inference merely gave up on
            # (an ONNX Runtime contrib op types nothing after it, but decides nothing)
            origins = [(n.op_type, n.name, hit[0]) for n in model.graph.node
                       if (hit := [o for o in n.output if o in varying and o in pending])
                       and not _reads(n) & varying]
            sources = origins + [s for s in sources if s[2] in varying and s not in origins]
            names = pending
        if static_inputs and sources:
            op, node, tensor = sources[0]
            raise DataDependentShapeError(
                f"{path}: the shape of {tensor!r} depends on values, not only on the input shapes: {op} node "
                f"{node or '(unnamed)'!r} computes it; give representative inputs with --inputs FILE.npz "
                "to specialise the plan to them",
                tuple(sorted(names)), tuple(sources))
        raise InvalidModelError(
            f"{path}: unresolved dynamic shape of {unresolved[0]}; give the model inputs static shapes "
            f"with --shape NAME=D0,D1,... (inputs: {', '.join(_real_inputs(model))})"
        )
    return types


def _fold_constants(model: onnx.ModelProto, path: Path) -> None:
    """Fold small constant computations (``Shape`` of static tensors, index arithmetic) in place.

    TorchScript exports ``tensor.chunk(n)`` as ``Shape -> Gather -> Add -> Div -> Mul ->
    Slice``; ONNX shape inference does not propagate values through that arithmetic, so the
    slices would keep symbolic shapes.  Evaluating these tiny constant subgraphs (with the
    ONNX reference evaluator) and re-running inference resolves them.  Large constant
    computations (e.g. transposed weights) are left as ops and copied into each stage.
    """
    g = model.graph
    opsets = opsets_of(model)
    values: dict[str, np.ndarray] = {}
    for init in g.initializer:
        if init.data_location != TensorProto.EXTERNAL and init.ByteSize() <= FOLD_LIMIT:
            values[init.name] = numpy_helper.to_array(init)
    # a round folds what the shapes known at its start resolve; each chunk() of a tensor whose shape
    # an earlier chunk's fold made known takes a round more (TorchScript: Shape -> Gather -> Add ->
    # Div -> Mul per chunk, block after block), so rounds go on while they fold something
    for _ in range(FOLD_ROUNDS):
        # shape inference runs when a fold first needs a shape: a Constant's is its value's
        shapes = _Shapes(model)
        folded: dict[int, list[np.ndarray]] = {}
        # another round sees more only if this one changed what shape inference knows (a
        # Constant's ``value`` is known to inference as an initializer's is) or passed over an
        # op whose inputs all became values later in the pass (an op listed before a producer)
        again = False
        for i, n in enumerate(g.node):
            if n.op_type in _NO_FOLD or n.domain not in DEFAULT_DOMAINS:
                continue
            ins = [t for t in n.input if t]
            plain = _plain_constant(n)
            if plain is not None:
                if int(plain.size) * 8 > FOLD_LIMIT:  # what _small_result says of its inferred shape
                    continue
                res: list[np.ndarray] = [plain]
            elif shapes.failed():
                return  # as below: no fold in a round whose inference failed
            elif n.op_type == "Shape" and ins:
                shp = shapes.get(ins[0])
                if shp is None or not all(isinstance(d, int) for d in shp):
                    continue
                attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
                full = [int(d) for d in shp]
                st, en = attrs.get("start", 0), attrs.get("end")
                res = [np.array(full[st:en] if en is not None else full[st:], dtype=np.int64)]
                again = True
            elif all(t in values for t in ins) and (ins or n.op_type == "Constant"):
                if not _small_result(n, shapes, values):
                    continue
                again = True
                named = [t for t in n.output if t]
                try:
                    vals = dict(zip(named, evaluate([n], named, opsets, feeds={t: values[t] for t in ins}),
                                    strict=True))
                except Exception:  # noqa: BLE001 - an op we cannot evaluate simply stays an op
                    continue
                res = [vals[t] if t else np.zeros(0) for t in n.output]
            else:
                continue
            if sum(np.asarray(r).nbytes for r in res) > FOLD_LIMIT:
                continue
            for t, r in zip(n.output, res, strict=False):
                if t:
                    values[t] = np.asarray(r)
            folded[i] = [np.asarray(r) for r in res]
        if shapes.failed():
            return  # inference failed (reported by _infer_types later)
        if not folded and not any(_decided_branch(n, values) for n in g.node):
            return  # nothing to fold
        again = again or any(
            i not in folded and n.op_type not in _NO_FOLD and n.domain in DEFAULT_DOMAINS
            and (ins := [t for t in n.input if t]) and all(t in values for t in ins)
            for i, n in enumerate(g.node))
        keep = [n for i, n in enumerate(g.node) if i not in folded]
        new_inits = []
        for i in sorted(folded):
            n = g.node[i]
            for t, r in zip(n.output, folded[i], strict=False):
                if t:
                    new_inits.append(numpy_helper.from_array(r, name=t))
        del g.node[:]
        g.node.extend(keep)
        g.initializer.extend(new_inits)
        again = _inline_decided_ifs(g, values) or again
        # drop folded tensors nobody reads any more
        # (a Loop/If body's reads of outer tensors included: they name no input)
        used = {t for n in g.node for t in _reads(n)} | {o.name for o in g.output}
        live = [init for init in g.initializer if init.name in used]
        if len(live) != len(g.initializer):
            del g.initializer[:]
            g.initializer.extend(live)
        if not again:
            return


def _decided_branch(n: onnx.NodeProto, values: Mapping[str, np.ndarray]) -> onnx.GraphProto | None:
    """The branch an ``If`` takes when its condition is a known value (and the branch fits), else ``None``."""
    if n.op_type != "If" or n.domain not in DEFAULT_DOMAINS or not n.input or n.input[0] not in values:
        return None
    cond = np.asarray(values[n.input[0]])
    if cond.size != 1:
        return None
    which = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    branch = next((a.g for a in n.attribute if a.name == which), None)
    return branch if branch is not None and len(branch.output) == len(n.output) else None


def _inline_decided_ifs(g: onnx.GraphProto, values: Mapping[str, np.ndarray]) -> bool:
    """Replace every ``If`` whose condition folded to a value by the branch it takes; True if any was.

    TorchScript exports ``x.squeeze(d)`` of a dim it cannot prove is 1 as ``If(Shape(x)[d] == 1,
    Squeeze, Identity)``: with static shapes the condition folds, but the ``If`` stayed, and its
    output's shape (the two branches disagree on the rank) read as value-dependent (Helios was
    refused without ``--inputs``).  The branch's nodes and initializers move into the graph where
    the ``If`` was (a branch reads outer tensors by name, and ONNX forbids a branch to shadow
    them, so its names are free in the graph); its outputs reach the ``If``'s names through
    ``Identity`` nodes (dropped later with every no-op).
    """
    out: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    done = False
    for n in g.node:
        branch = _decided_branch(n, values)
        if branch is None:
            out.append(n)
            continue
        out.extend(branch.node)
        inits.extend(branch.initializer)
        out.extend(helper.make_node("Identity", [o_br.name], [o_if], name=f"{n.name or o_if}/inlined")
                   for o_if, o_br in zip(n.output, branch.output, strict=True) if o_if)
        done = True
    if done:
        del g.node[:]
        g.node.extend(out)
        g.initializer.extend(inits)
    return done


#: element types whose ``numpy_helper.to_array`` is exactly what the reference evaluator returns
_PLAIN_DTYPES = frozenset({
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL,
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
})


def _plain_constant(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` holding one inline tensor of a plain numeric type, else ``None``.

    Most constants of an export are these; reading them directly is what the reference
    evaluator does, without building an evaluator per node.
    """
    if node.op_type != "Constant" or node.input or len(node.attribute) != 1:
        return None
    a = node.attribute[0]
    if a.name != "value" or a.type != onnx.AttributeProto.TENSOR or a.ref_attr_name:
        return None
    t = a.t
    if t.data_type not in _PLAIN_DTYPES or t.data_location == TensorProto.EXTERNAL or t.HasField("segment"):
        return None
    try:
        return np.asarray(numpy_helper.to_array(t))
    except (ValueError, TypeError):  # data that does not fit its shape: the evaluator's call
        return None


class _Shapes(Mapping[str, tuple[int | str, ...]]):
    """Tensor shapes of ``model`` as shape inference (with data propagation) gives them, for
    folding: inference runs when a shape is first asked for (:meth:`failed` says whether it
    could not); initializers' own shapes win over value infos, later value infos over
    earlier ones; each is decoded when first asked for (folding asks about few of thousands)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._model = model
        self._infos: dict[str, onnx.ValueInfoProto] | None = None
        self._inits: dict[str, TensorProto] = {}
        self._failed = False
        self._done: dict[str, tuple[int | str, ...] | None] = {}

    def _infer(self) -> None:
        if self._infos is not None:
            return
        self._infos = {}
        try:
            inferred = infer_shapes(self._model, data_prop=True)
        except Exception:  # noqa: BLE001 - the caller folds nothing; _infer_types reports the error
            self._failed = True
            return
        g = inferred.graph
        self._infos = {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]}
        self._inits = {i.name: i for i in self._model.graph.initializer}

    def failed(self) -> bool:
        """Whether shape inference was needed and failed."""
        return self._failed

    def _get(self, name: str) -> tuple[int | str, ...] | None:
        if name in self._done:
            return self._done[name]
        self._infer()
        assert self._infos is not None
        init = self._inits.get(name)
        if init is not None:
            shp: tuple[int | str, ...] | None = tuple(int(d) for d in init.dims)
        else:
            vi = self._infos.get(name)
            t = _value_info_type(vi) if vi is not None else None
            shp = t[1] if t is not None else None
        self._done[name] = shp
        return shp

    def __getitem__(self, name: str) -> tuple[int | str, ...]:
        shp = self._get(name)
        if shp is None:
            raise KeyError(name)
        return shp

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._get(name) is not None

    def get(self, name: str, default: object = None) -> Any:
        shp = self._get(name)
        return default if shp is None else shp

    def __iter__(self) -> Iterator[str]:
        self._infer()
        return iter(n for n in {**(self._infos or {}), **self._inits} if self._get(n) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _static_shapes_as_constants(model: onnx.ModelProto, types: Mapping[str, TensorType]) -> bool:
    """Replace each ``Shape`` of a statically typed tensor by its ``Constant`` (in place).

    Folding ran before ``input_shapes`` resolved the symbolic dimensions of a dynamic-axes
    export, so such ``Shape`` ops survive it; they are constants all the same
    (:func:`rkpart.ir.graph.shape_as_constant`), and as ``Constant`` nodes they no longer read
    the tensor, which :func:`_prune_dead` can then drop when nothing else reads it.
    """
    changed = False
    for n in model.graph.node:
        if n.op_type == "Shape" and n.domain in DEFAULT_DOMAINS and n.input and n.input[0] in types \
                and all(isinstance(d, int) for d in types[n.input[0]][1]):
            n.CopyFrom(shape_as_constant(n, dict(types)))
            changed = True
    return changed


def _squeezes_as_torch_meant(model: onnx.ModelProto, types: Mapping[str, TensorType]) -> bool:
    """Drop the axes of a ``Squeeze`` whose dims are not 1 (in place): ``x.squeeze(d)`` of such a dim
    is a no-op in torch, and the dynamo exporter writes it as a Squeeze all the same.

    ONNX calls that graph invalid: ONNX Runtime refuses the whole model or any stage holding it
    ("Dimension of input 2 must be 1 instead of 32": LTX-2's audio attention, PixArt's
    ``adaln_single``, Allegro), while shape inference (non-strict) types the output as the input,
    which is what torch computed and what rkpart's graph already says.  The node becomes an
    ``Identity`` (no axis left) or squeezes the axes that are 1.
    """
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    changed = False
    for n in g.node:
        if n.op_type != "Squeeze" or n.domain not in DEFAULT_DOMAINS or not n.input or n.input[0] not in types:
            continue
        shape = types[n.input[0]][1]
        attr = next((a for a in n.attribute if a.name == "axes"), None)
        if attr is not None:
            axes = list(attr.ints)
        elif len(n.input) > 1 and n.input[1] in inits:
            axes = [int(a) for a in numpy_helper.to_array(inits[n.input[1]]).reshape(-1)]
        else:
            continue  # no axes: every dim of 1 (always valid), or axes computed at run time
        rank = len(shape)
        if not all(-rank <= a < rank for a in axes):
            continue
        keep = [a for a in axes if shape[a % rank] == 1]
        if len(keep) == len(axes):
            continue
        changed = True
        if not keep:
            ident = helper.make_node("Identity", [n.input[0]], list(n.output), name=n.name)
            n.CopyFrom(ident)
        elif attr is not None:
            del attr.ints[:]
            attr.ints.extend(keep)
        else:
            name = f"{n.input[1]}__squeezable"
            if name not in inits:
                inits[name] = numpy_helper.from_array(np.array(keep, dtype=np.int64), name)
                g.initializer.append(inits[name])
            n.input[1] = name
    return changed


def _prune_dead(model: onnx.ModelProto) -> bool:
    """Drop ops none of whose outputs is read or a model output (in place), and the initializers
    only they read.

    Folding leaves such ops behind: TorchScript reads ``x.shape`` of a slice of an intermediate
    as ``Slice -> Shape``; once the ``Shape`` is a constant the ``Slice`` computes nothing
    anyone reads, yet as a data op it would land in some stage and pull its input across a
    cut (Wan's RoPE ``ScatterND`` chain).  Removing it changes no output.  A graph with no op
    left would not be a model any more: it is left alone (and refused later for what it is).
    """
    g = model.graph
    nodes = list(g.node)
    needed = {o.name for o in g.output}
    alive = [False] * len(nodes)
    # from the outputs back (one pass for sorted nodes; unsorted ones are sorted later: repeat)
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(nodes))):
            n = nodes[i]
            if not alive[i] and any(t and t in needed for t in n.output):
                alive[i] = True
                needed.update(_reads(n))
                changed = True
    if all(alive) or not any(alive):
        return False
    before = {t for n in nodes for t in _reads(n)}
    del g.node[:]
    g.node.extend(n for i, n in enumerate(nodes) if alive[i])
    gone = before - needed - {v.name for v in g.input}  # an initializer listed as an input stays
    if any(init.name in gone for init in g.initializer):
        live = [init for init in g.initializer if init.name not in gone]
        del g.initializer[:]
        g.initializer.extend(live)
    return True


#: tensors a node reads, its subgraphs' reads of outer tensors included
_reads = node_reads


def _small_result(node: onnx.NodeProto, shapes: Mapping[str, tuple[int | str, ...]],
                  values: Mapping[str, np.ndarray]) -> bool:
    """Whether evaluating ``node`` for folding is known to produce at most ``FOLD_LIMIT`` bytes.

    Decided *before* evaluating: a hostile model can ask for an output of any size, and
    checking the result afterwards would be too late.
    """
    outs = [t for t in node.output if t]
    known = [shapes.get(t) for t in outs]
    if all(k is not None and all(isinstance(d, int) and d >= 0 for d in k) for k in known):
        n = sum(math.prod(int(d) for d in k) for k in known if k is not None)
        return n * 8 <= FOLD_LIMIT
    if node.op_type == "NonZero" and node.input and node.input[0] in values:
        # one int64 index per element and axis at most: a constant mask's indices (a boolean index
        # into a constant, TorchScript's NonZero of a Constant) fold to a static shape
        x = values[node.input[0]]
        return int(x.size) * max(x.ndim, 1) * 8 <= FOLD_LIMIT
    if node.op_type in GENERATIVE_OPS:
        return False
    # other ops produce at most about what their inputs hold
    return sum(int(values[t].size) for t in node.input if t) * 8 <= FOLD_LIMIT


#: dynamo spells a submodule reached through ``__dict__`` (a module torch.export inlined
#: from an attribute access) as ``model.__dict__['_modules']['transformer_blocks'].0`` (Cosmos)
_DICT_MODULE = re.compile(r"(?:[\w.]*\.)?__dict__\[['\"]_modules['\"]\]\[['\"]([^'\"]+)['\"]\]")


def _scope_of(node: onnx.NodeProto) -> str:
    return _DICT_MODULE.sub(r"\1", _raw_scope(node))


def _raw_scope(node: onnx.NodeProto) -> str:
    # dynamo exporter: metadata carries the module path; TorchScript: the node name does.
    meta = {p.key: p.value for p in node.metadata_props}
    scopes = meta.get("pkg.torch.onnx.name_scopes")
    if scopes:
        try:
            import ast

            parsed = ast.literal_eval(scopes)
            if isinstance(parsed, list) and parsed:
                return "/" + "/".join(str(s) for s in parsed if s)
        except (ValueError, SyntaxError):
            pass
    ns = meta.get("namespace")
    if ns:
        # "transformer_blocks.3: Block/attn1: Attention/..." -> "/transformer_blocks.3/attn1/..."
        return "/" + "/".join(part.split(":")[0].strip() for part in ns.split("/"))
    return node.name or ""


def _check_element_counts(
    node: onnx.NodeProto, i: int, types: Mapping[str, tuple[str, tuple[int, ...]]], path: Path
) -> None:
    # ONNX shape inference takes a Reshape's target shape on trust; a target with a different
    # element count (e.g. 2^50 elements from 16) only fails at run time, deep inside a stage.
    if node.op_type != "Reshape" or len(node.input) < 1 or not node.output:
        return
    src, dst = types.get(node.input[0]), types.get(node.output[0])
    if src is None or dst is None:
        return
    a, b = math.prod(src[1]), math.prod(dst[1])
    if a != b:
        raise InvalidModelError(
            f"{path}: Reshape {node.name or i} turns {list(src[1])} ({a} elements) into {list(dst[1])} ({b})"
        )


def _toposort(nodes: list[onnx.NodeProto], producer: dict[str, int], path: Path) -> list[int]:
    # a Loop/If body reads outer tensors without naming them as inputs: those count too (the
    # TorchScript exporter puts such a tensor's Constant after the Loop that reads it)
    reads = [_reads(n) if n.op_type in CONTROL_FLOW_OPS else {t for t in n.input if t} for n in nodes]
    if all(producer.get(t, -1) < i for i, r in enumerate(reads) for t in r):
        return list(range(len(nodes)))  # already sorted (as exporters write): the order below would keep it
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(nodes)))
    for i, _n in enumerate(nodes):
        for t in reads[i]:
            p = producer.get(t)
            if p is not None:
                dag.add_edge(p, i)
    try:
        # lexicographic: keep the exporter's order wherever it is already valid
        return list(nx.lexicographical_topological_sort(dag))
    except nx.NetworkXUnfeasible:
        cyc = nx.find_cycle(dag)
        names = [nodes[a].name or str(a) for a, _ in cyc]
        raise InvalidModelError(f"{path}: graph has a cycle through {' -> '.join(names[:4])}") from None


def _const_ops(
    nodes: list[onnx.NodeProto],
    initializers: Mapping[str, TensorProto],
    types: Mapping[str, tuple[str, tuple[int, ...]]],
) -> set[int]:
    const_tensors = set(initializers)
    const: set[int] = set()
    for i, n in enumerate(nodes):
        if n.op_type in _NO_FOLD:
            continue
        ins = [t for t in n.input if t]
        is_const = (
            n.op_type in ("Constant", "ConstantOfShape") and all(t in const_tensors for t in ins)
        ) or (ins and all(t in const_tensors for t in ins))
        if n.op_type == "Shape" and ins and ins[0] in types:
            is_const = True  # static shapes: Shape(x) is a constant, see shape_as_constant()
        if is_const:
            const.add(i)
            const_tensors.update(t for t in n.output if t)
    return const
