"""The one byte counter: element types and sizes of tensors.

Two spellings of a type meet here: ONNX's ``TensorProto.DataType`` enum (initializers, value
infos) and the numpy dtype name the graph keeps per tensor (``ModelGraph.tensor_types``).
Both end in :func:`nbytes` semantics: elements times element size, sub-byte types packed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from rkpart.errors import InvalidModelError, UserError

#: element types of tensors flowing through a partitioned model (what ONNX Runtime and
#: rknn-toolkit2 both handle); float8/int4/complex/string tensors are refused at load time
SUPPORTED_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
                              "uint8", "uint16", "uint32", "uint64", "bool"})
#: packed element types: bits per element (INT4, UINT4, FLOAT4E2M1, UINT2, INT2)
SUB_BYTE_BITS: dict[int, int] = {22: 4, 21: 4, 23: 4, 25: 2, 26: 2}
#: no real model has a tensor this large; larger shapes are corrupt (or hostile) files
MAX_ELEMENTS = 1 << 36

#: (numpy dtype name, static shape) of one tensor
TensorType = tuple[str, tuple[int, ...]]


@functools.cache  # called per tensor of every value info: numpy builds the name each time
def np_dtype_name(elem_type: int) -> str:
    """numpy name of an ONNX element type (``"onnx:N"`` when numpy has none)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return f"onnx:{elem_type}"


def onnx_dtype_name(data_type: int) -> str:
    """ONNX's own name of an element type, lower case (``float``, ``int64``), for messages."""
    try:
        return str(TensorProto.DataType.Name(data_type)).lower()
    except ValueError:
        return f"type {data_type}"


def itemsize(dtype: str) -> int:
    """Bytes per element of a numpy dtype name; 4 for types numpy cannot name (``onnx:N``)."""
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        return 4


def nbytes(dtype: str, shape: Iterable[int]) -> int:
    """Bytes of a dense tensor of numpy dtype name ``dtype`` and static ``shape``."""
    return itemsize(dtype) * int(math.prod(int(d) for d in shape))


def value_type(vi: onnx.ValueInfoProto) -> TensorType:
    """The (numpy dtype name, shape) a value info declares; a symbolic dimension reads as 0."""
    tt = vi.type.tensor_type
    return np_dtype_name(tt.elem_type), tuple(int(d.dim_value) for d in tt.shape.dim)


def tensor_nbytes(data_type: int, dims: Iterable[int], what: str = "tensor") -> int:
    """Bytes of a dense tensor of ONNX element type ``data_type``, checked.

    Raises
    ------
    InvalidModelError
        Unknown or unsupported (string) element type, a negative dimension, or an absurd size.
    """
    if data_type in (TensorProto.UNDEFINED, TensorProto.STRING):
        raise InvalidModelError(f"{what} has unsupported element type {onnx_dtype_name(data_type)}")
    try:
        np_dt = np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
    except (KeyError, TypeError, ValueError):
        raise InvalidModelError(f"{what} has unknown element type {data_type}") from None
    n = 1
    for d in dims:
        if d < 0:
            raise InvalidModelError(f"{what} has a negative dimension {d}")
        n *= int(d)
    if n > MAX_ELEMENTS:
        raise InvalidModelError(f"{what} has an absurd size ({n} elements)")
    bits = SUB_BYTE_BITS.get(int(data_type))
    if bits is not None:
        return (n * bits + 7) // 8
    return n * int(np_dt.itemsize)


def random_feeds(specs: Iterable[tuple[str, str | np.dtype, Sequence[int]]], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded arrays for ``(name, dtype, shape)``: floats ~ N(0, 1); integers in [0, 4); bools random.

    Small non-negative integers keep index-like inputs (labels, positions) in range.
    """
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for n, dtype, shape in specs:
        dt = np.dtype(dtype)
        if dt.kind == "f":
            feeds[n] = rng.standard_normal(tuple(shape)).astype(dt)
        elif dt.kind in "iu":
            feeds[n] = rng.integers(0, 4, size=tuple(shape)).astype(dt)
        elif dt.kind == "b":
            feeds[n] = rng.integers(0, 2, size=tuple(shape)).astype(bool)
        else:
            raise UserError(f"cannot make random input for {n!r} of type {dt}; pass --inputs")
    return feeds


__all__ = [
    "MAX_ELEMENTS",
    "SUB_BYTE_BITS",
    "SUPPORTED_DTYPES",
    "TensorType",
    "itemsize",
    "nbytes",
    "np_dtype_name",
    "onnx_dtype_name",
    "random_feeds",
    "tensor_nbytes",
    "value_type",
]
