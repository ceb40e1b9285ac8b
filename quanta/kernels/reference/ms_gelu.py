"""com.microsoft Gelu: ONNX Runtime's fused GELU (what its GeluFusion writes, and what
quanta's FuseGelu writes into graphs whose opset predates ai.onnx Gelu-20):
``y = x/2 · (1 + erf(x/√2))``, no attributes. float32 follows eq. (G1) of
docs/float-ops.md, exactly the ai.onnx Gelu twin with approximate = "none"."""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.nn import gelu
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, OpError, register

__all__ = ["ms_gelu"]


@register("Gelu", MS_DOMAIN)
def ms_gelu(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """com.microsoft Gelu-1 (float types).

    >>> ms_gelu(OpContext(), np.array([0.0, 1.0], np.float32)).tolist()
    [0.0, 0.8413447141647339]
    """
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise OpError(f"X: expected a float tensor, got {x.dtype}")
    return gelu(ctx, x)
