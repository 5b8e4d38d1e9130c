"""The float I/O helpers for int8 stages on the board runtime (issue 27)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from rkpart.runtime import board_runner as board
from rkpart.runtime.int8_io import dequantize, npu_inputs, quantize
from tests.bundle.fake_rknnlite import FakeRKNNLite


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


class _DtypeRecordingRKNNLite(FakeRKNNLite):
    """FAKE RKNNLite (stands in for the board): records what ``inference`` is handed, returns float32."""

    seen: ClassVar[list[list[Any]]] = []

    def __init__(self, verbose=False, verbose_file=None):  # type: ignore[no-untyped-def]  # the real signature
        self.path = None

    def load_rknn(self, path):  # type: ignore[no-untyped-def]
        return 0

    def init_runtime(self, target=None, device_id=None, async_mode=False, core_mask=0):  # type: ignore[no-untyped-def]
        return 0

    def inference(self, inputs, data_type=None, data_format=None, inputs_pass_through=None,  # type: ignore[no-untyped-def]
                  get_frame_id=False):
        self.seen.append([a.dtype for a in inputs])
        return [np.zeros((1, 4), np.float32)]

    def release(self):  # type: ignore[no-untyped-def]
        pass


def test_the_board_runners_npu_session_feeds_an_int8_stage_float32(tmp_path: Path) -> None:
    """The bundle runner's RknnLiteSession (also ``run --backend rknnlite``'s) converts for int8 and
    hybrid stages only: the plan's fp16 activations go to RKNNLite as float32, integer inputs unchanged."""
    h = np.ones((1, 4), np.float16)
    idx = np.arange(3, dtype=np.int64)
    for precision, want in (("int8", [np.float32, np.int64]), ("hybrid", [np.float32, np.int64]),
                            ("fp16", [np.float16, np.int64])):
        _DtypeRecordingRKNNLite.seen = []
        sess = board.RknnLiteSession(tmp_path / "s.rknn", 0, _DtypeRecordingRKNNLite, "s", precision)
        sess.load()
        sess.init()
        (out,) = sess.infer([h, idx])
        assert _DtypeRecordingRKNNLite.seen == [want] and out.dtype == np.float32
        sess.release()
    assert board.npu_inputs is npu_inputs  # one conversion: the runner's, re-exported here
