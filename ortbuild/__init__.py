"""ortbuild: declarative multi-target ONNX Runtime builds."""

__version__ = "0.1.0"
