"""Example DiT models: an Anima / Cosmos-Predict2 builder (pure ONNX) and torch module.

``rkpart.models.anima`` needs only numpy + onnx.  ``rkpart.models.anima_torch`` needs torch
(the ``export`` extra) and is not imported here.
"""

from rkpart.models.anima import AnimaConfig, build_anima_onnx

__all__ = ["AnimaConfig", "build_anima_onnx"]
