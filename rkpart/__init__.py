"""rkpart: partition DiT ONNX graphs for Rockchip NPUs."""
__version__ = "0.1.0"
