"""quanta::MatMulBias: a float MatMul by a constant 2-D weight and the constant bias Add
after it, as one node (reference twin; passes/rules/fuse_matmul_bias.py makes it)::

    y = Add(MatMul(a, w), bias)          bias: float32 [N] (one value per column of w)

The twin is the two registered ONNX operators in that order, so the node's bytes on the
reference target are the graph's as written. The native kernel adds the bias in the
float GEMM's store (sgemm.h's epilogue, f32(v + bias[j]): the Add's one rounding of the
same operands), so it is the native MatMul followed by the native Add, bit for bit.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, get_op, register

__all__ = ["QUANTA_DOMAIN", "matmul_bias"]

QUANTA_DOMAIN = "quanta"


@register("MatMulBias", QUANTA_DOMAIN)
def matmul_bias(ctx: OpContext, a: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """quanta::MatMulBias (module docstring)."""
    a, w, bias = np.asarray(a), np.asarray(w), np.asarray(bias)
    if w.ndim != 2 or bias.shape != (w.shape[1],):
        raise OpError(
            f"MatMulBias: expected W [K, N] and bias [N], got W {list(w.shape)} and bias {list(bias.shape)}"
        )
    matmul, add = get_op("MatMul"), get_op("Add")
    assert matmul is not None and add is not None
    return np.asarray(add(ctx, matmul(ctx, a, w), bias))
