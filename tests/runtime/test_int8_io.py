"""The float I/O helpers for int8 stages on the board runtime (issue 27)."""

from __future__ import annotations

import numpy as np

from rkpart.runtime.int8_io import dequantize, npu_inputs, quantize


def test_quantized_stages_get_float32_and_fp16_stages_are_left_alone() -> None:
    h = np.ones((1, 4), np.float16)
    idx = np.arange(3, dtype=np.int64)
    assert [a.dtype for a in npu_inputs([h, idx], "int8")] == [np.float32, np.int64]
    assert [a.dtype for a in npu_inputs([h, idx], "hybrid")] == [np.float32, np.int64]
    assert [a.dtype for a in npu_inputs([h, idx], "fp16")] == [np.float16, np.int64]


def test_round_trip_is_within_half_a_step_and_saturates() -> None:
    # the scale and zero point the 2.5.0 build chose for b00.attn's input (its .quantization.cfg)
    scale, zp = 0.06978561924953086, -13
    x = np.linspace(-8.0, 9.78, 101, dtype=np.float32)
    back = dequantize(quantize(x, scale, zp), scale, zp)
    assert back.dtype == np.float32 and float(np.abs(back - x).max()) <= scale / 2 + 1e-6
    assert quantize(np.array([100.0, -100.0]), scale, zp).tolist() == [127, -128]
