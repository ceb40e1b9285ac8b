"""Native quanta::OrtResizeLinear: ONNX Runtime's float32 bilinear Resize (reference/
ort_resize.py, eqs. (RB1)-(RB3)). No C++ kernel: the binder runs the twin's NumPy, four
gathers and seven float32 array operations per call, each in (RB3)'s order."""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.ir.types import F32 as IR_F32
from quanta.kernels.reference.ort_resize import QUANTA_DOMAIN, ort_resize_linear_op
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder


def _ort_resize_linear(ctx: Any, x: Any, *, out: np.ndarray | None = None, **attrs: Any) -> np.ndarray:
    y = ort_resize_linear_op(ctx, np.asarray(x), **attrs)
    if out is None:
        return y
    np.copyto(out, y)
    return out


@register_binder("OrtResizeLinear", QUANTA_DOMAIN)
def bind_ort_resize_linear(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::OrtResizeLinear on float32: the twin's NumPy (module docstring)."""
    del model  # unused
    x = node.input(0)
    if x is not None and x.type is not None and x.type.elem is not None and x.type.elem != IR_F32:
        return None, f"native OrtResizeLinear takes float32, got {x.type.elem}"
    return Kernel(_ort_resize_linear, "native", "numpy:ort_resize_linear", out=True), ""
