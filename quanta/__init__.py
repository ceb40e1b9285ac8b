"""quanta: quantization backend for ONNX models.

Public API (mirrors ONNX Runtime where it has an equivalent)::

    sess = quanta.InferenceSession("model.int8.onnx")   # backend="native" | "reference"
    outs = sess.run(None, {"input": x})
"""

from __future__ import annotations

from quanta.session import InferenceSession, InvalidArgument, NodeArg, SessionOptions

__all__ = ["InferenceSession", "InvalidArgument", "NodeArg", "SessionOptions", "__version__"]

__version__ = "0.1.0"
