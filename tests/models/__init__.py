"""Example DiT models for tests and benchmarks: an Anima / Cosmos-Predict2 builder (pure ONNX)
and a torch module.  They are fixtures, not part of the installed ``rkpart`` package.

``tests.models.anima`` needs only numpy + onnx.  ``tests.models.anima_torch`` needs torch
(the ``export`` extra).  ``bench/`` and ``scripts/`` put the checkout's root on ``sys.path`` to
import them; pytest (run from the checkout as ``python -m pytest``) finds them as ``tests.models``.
"""
