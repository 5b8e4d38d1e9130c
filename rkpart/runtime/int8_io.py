"""Float I/O of int8 (w8a8) and hybrid stages on the RKNN runtimes (issue 27), for the bundle
runner (``board_runner.py``, which runs on the board with numpy alone and holds
:func:`npu_inputs`, used by its ``RknnLiteSession`` for a manifest stage whose ``precision`` is
int8 or hybrid, and by ``rkpart run/profile --backend rknnlite``).

An int8 build turns the stage's inputs and outputs into int8 ("The default input dtype of ...
is changed from 'float32' to 'int8'").  The Python runtimes convert at the boundary
themselves: the toolkit's simulator (measured here, 2.3.0 and 2.5.0) and RKNNLite
(toolkit-lite2: ``inference`` without ``inputs_pass_through`` quantizes float inputs with the
model's scale and zero point, and returns float32 outputs) take floats and give float32.
What the caller must do: hand over float32 (not the fp16 arrays an fp16 plan passes between
stages; the conversion is defined from float32), and cast the float32 outputs back to the
plan's dtype (the runner's ``_conform`` does).  Raw int8 outputs (a runtime asked for
pass-through) are dequantized with :func:`dequantize`.
"""

from __future__ import annotations

import numpy as np

# the bundle runner's own (board_runner.py runs on the board with numpy alone, so it holds them)
from rkpart.runtime.board_runner import QUANTIZED, npu_inputs


def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """An asymmetric int8 tensor (``rknn_tensor_attr`` ``scale``/``zp``) as float32."""
    return ((q.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)).astype(np.float32)


def quantize(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """float -> asymmetric int8 as the runtime does it (round to nearest, saturate)."""
    return np.clip(np.rint(x.astype(np.float32) / np.float32(scale)) + zero_point, -128, 127).astype(np.int8)


__all__ = ["QUANTIZED", "dequantize", "npu_inputs", "quantize"]
