"""Quantization-aware training whose fake quantization is quanta's integer arithmetic
(docs/qat.md). Needs PyTorch: ``pip install "quanta[torch]"``.

- :func:`prepare`: float model -> trainable :class:`QatModel` with Q/DQ where
  ``quantize_static`` puts them, initialised from quanta's calibration;
- :func:`distill`: label-free distillation against the float model's outputs;
- :func:`export`: the trained model as a QDQ ONNX file quanta lowers to integer kernels.

The names are imported on first use, so ``quanta.qat.cli`` (the ``quanta qat``
subcommand's parser) loads without PyTorch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DistillResult", "QatModel", "UnsupportedNodeError", "distill", "export", "prepare", "to_onnx"]

_WHERE = {
    "DistillResult": "train",
    "distill": "train",
    "export": "write",
    "QatModel": "module",
    "UnsupportedNodeError": "module",
    "prepare": "convert",
    "to_onnx": "convert",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'quanta.qat' has no attribute {name!r}")
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise ImportError('quanta.qat needs PyTorch: pip install "quanta[torch]"') from e
    return getattr(importlib.import_module(f"quanta.qat.{_WHERE[name]}"), name)
