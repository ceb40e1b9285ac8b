"""Quantization-aware training whose fake quantization is quanta's integer arithmetic
(docs/qat.md). Needs PyTorch: ``pip install "quanta[torch]"``.

- :func:`prepare`: float model -> trainable :class:`QatModel` with Q/DQ where
  ``quantize_static`` puts them, initialised from quanta's calibration;
- :func:`distill`: label-free distillation against the float model's outputs;
- :func:`export`: the trained model as a QDQ ONNX file quanta lowers to integer kernels.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError('quanta.qat needs PyTorch: pip install "quanta[torch]"') from e

from quanta.qat.distill import DistillResult, distill
from quanta.qat.export import export
from quanta.qat.module import QatModel, UnsupportedNodeError
from quanta.qat.prepare import prepare, to_onnx

__all__ = ["DistillResult", "QatModel", "UnsupportedNodeError", "distill", "export", "prepare", "to_onnx"]
