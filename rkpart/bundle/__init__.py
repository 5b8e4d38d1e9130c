"""``rkpart bundle`` (:mod:`rkpart.bundle.build`): a compiled plan as a self-contained folder for the board.

The runner copied into every bundle is :mod:`rkpart.runtime.board_runner`, a leaf module that
imports nothing from rkpart (the board has only NumPy, ONNX Runtime and rknn-toolkit-lite2).
"""
