"""Native com.microsoft Gelu (float32): the float_ops family's (G1) kernel, as the ai.onnx
Gelu with approximate = "none" (reference twin: reference/ms_gelu.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder
from quanta.targets.native.float_ops import _GELU_OPS, _check_f32, _gelu_native, _unary_specializer

__all__ = ["bind_ms_gelu"]


def _ms_gelu_native(ctx: Any, x: Any, *, out: Any = None) -> np.ndarray:
    return _gelu_native(ctx, x, out=out)


@register_binder("Gelu", "com.microsoft")
def bind_ms_gelu(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 com.microsoft Gelu."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("Gelu", ("X", node.input(0)))
    if reason:
        return None, reason
    specialize = _unary_specializer(_GELU_OPS["none"], _ms_gelu_native)
    return Kernel(
        _ms_gelu_native, "native", "native:gelu_f32", out=len(node.outputs) == 1, specialize=specialize
    ), ""
