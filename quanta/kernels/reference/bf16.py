"""quanta::MatMulBf16: a bf16 float island (reference twin; docs/float-ops.md "bf16 islands").

::

    y = f32( bf16(a) @ w ) (+ bias)                                            eq. (BF1)

``a`` float32 is rounded to bfloat16 (nearest, ties to even), ``w`` is a bfloat16
constant ``[K, N]``; the products of two bf16 values are exact in float32 and the sum is
a float32 GEMM (np.matmul here, in the BLAS's order), so the native kernels
(vdpbf16ps, or the widened float32 path) are compared with it within the float GEMM
family's bound (FG1), not bit for bit. Against the float32 island it replaces, the
difference is the rounding of the operands: at most ``2^-8`` relative per factor.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["QUANTA_DOMAIN", "matmul_bf16", "round_bf16"]

QUANTA_DOMAIN = "quanta"
BF16 = np.dtype(ml_dtypes.bfloat16)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 value (ties to even), as float32.

    >>> round_bf16(np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8], np.float32)).tolist()  # ties -> even
    [1.0, 1.015625]
    """
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def matmul_bf16(a: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Eq. (BF1): ``a [..., K]`` float32, ``w [K, N]`` bfloat16, ``bias [N]`` float32."""
    y = np.matmul(round_bf16(a), np.asarray(w).astype(np.float32))
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    return y.astype(np.float32, copy=False)


@register("MatMulBf16", QUANTA_DOMAIN)
def matmul_bf16_op(
    ctx: OpContext, a: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None
) -> np.ndarray:
    """quanta::MatMulBf16 (module docstring)."""
    del ctx  # unused
    if a.dtype != np.float32:
        raise OpError(f"MatMulBf16: A: expected float32, got {a.dtype}")
    if w.dtype != BF16 or w.ndim != 2 or a.ndim < 1 or a.shape[-1] != w.shape[0]:
        raise OpError(
            f"MatMulBf16: W: expected bfloat16 [{a.shape[-1] if a.ndim else '?'}, N], got {w.dtype} {list(w.shape)}"
        )
    if bias is not None and (bias.dtype != np.float32 or bias.size != w.shape[1]):
        raise OpError(
            f"MatMulBf16: bias: expected float32 [{w.shape[1]}], got {bias.dtype} {list(bias.shape)}"
        )
    return matmul_bf16(a, w, bias)
