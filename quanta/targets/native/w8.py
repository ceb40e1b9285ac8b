"""Native quanta::MatMulW8 (a float MatMul of an 8-bit weight; reference/w8.py) on the
weight-only float GEMM (quanta/kernels/cpp/sgemm/w8.h).

The weight stays 8-bit in memory: the kernel dequantizes each K-block × 32-column panel
into L1 by eq. (W8) as it streams, then runs the float GEMM family's tiles on it, so the
result is the native float MatMul of the dequantized weight byte for byte (docs/float-ops.md
"Weight-only 8-bit MatMul") and a small-M product reads a quarter of the bytes. A uint8
weight is stored as ``q − 128`` (int8) with zero points ``zp − 128``: ``q − zp`` is the
same integer.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.registry import get_op
from quanta.kernels.reference.w8 import QUANTA_DOMAIN
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import SMALL_MACS, guarded, step_threads
from quanta.targets.native._values import const_of as _const
from quanta.targets.native._values import threads as _threads
from quanta.targets.native._values import value_dtype as _dtype

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = ["bind_matmul_w8", "pack_w8"]


def pack_w8(
    q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q_packed int8, zero points float32, scales float32) for ``_native.matmul_w8_f32``:
    one zero point and scale per column (scalars broadcast), uint8 shifted to int8."""
    n = q.shape[1]
    zp = (
        np.zeros(n, np.float32)
        if zero_point is None
        else np.broadcast_to(zero_point.astype(np.float32), (n,))
    )
    if q.dtype == np.uint8:
        q = (q.astype(np.int16) - 128).astype(np.int8)
        zp = zp - np.float32(128)  # an integer: q − zp unchanged, exactly
    s = np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), (n,))
    return _native.sgemm_pack_w8(
        np.ascontiguousarray(q, np.int8),
        np.ascontiguousarray(zp, np.float32),
        np.ascontiguousarray(s, np.float32),
    )


def _w8_native(
    ctx: Any,
    a: np.ndarray,
    *rest: Any,
    out: np.ndarray | None = None,
    packed: tuple[np.ndarray, np.ndarray, np.ndarray],
    n: int,
    k: int,
) -> np.ndarray:
    if isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim >= 1 and a.shape[-1] == k:
        q, zp, s = packed
        return _native.matmul_w8_f32(np.ascontiguousarray(a), q, zp, s, n, num_threads=_threads(ctx), out=out)
    y = get_op("MatMulW8", QUANTA_DOMAIN)(ctx, a, *rest)
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _w8_specialized(
    sig: Specialization, *, packed: tuple[np.ndarray, np.ndarray, np.ndarray], n: int, k: int
) -> Any:
    """One float32 A shape: the kernel called positionally with the packed weight and the
    thread count bound in (the 36 MatMuls of a 6-layer encoder, a few hundred
    microseconds of Python per run otherwise)."""
    shape = sig.shapes[0]
    if shape is None or sig.dtypes[0] != np.float32 or not shape or shape[-1] != k:
        return None
    q, zp, s = packed
    threads, out = step_threads(sig, math.prod(shape) * n, SMALL_MACS), sig.out
    matmul = _native.matmul_w8_f32

    def call(a: np.ndarray, *rest: Any) -> np.ndarray:
        return matmul(a, q, zp, s, n, None, threads, out)

    return guarded(call, _w8_native, {"packed": packed, "n": n, "k": k}, out, reads=1)


@register_binder("MatMulW8", QUANTA_DOMAIN)
def bind_matmul_w8(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Constant 8-bit [K, N] weight, per-column (or scalar) float32 scale and zero point."""
    del model  # unused
    if _native is None:
        return None, "the native extension is not built"
    q, scale = _const(node.input(1)), _const(node.input(2))
    zp = _const(node.input(3))
    if q is None or scale is None or (node.input(3) is not None and zp is None):
        return None, "native MatMulW8 takes a constant weight, scale and zero point"
    if q.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) or q.ndim != 2:
        return None, f"native MatMulW8 takes an 8-bit [K, N] weight, got {q.dtype} {list(q.shape)}"
    k, n = q.shape
    if scale.dtype != np.float32 or scale.size not in (1, n) or scale.ndim > 1:
        return (
            None,
            f"native MatMulW8 takes a float32 scale [{n}] or scalar, got {scale.dtype} {list(scale.shape)}",
        )
    if zp is not None and (zp.dtype != q.dtype or zp.size not in (1, n) or zp.ndim > 1):
        return None, f"native MatMulW8 takes a {q.dtype} zero point [{n}] or scalar"
    if _dtype(node.input(0)) not in (None, np.dtype(np.float32)):
        return None, f"native MatMulW8 takes float32 A, got {_dtype(node.input(0))}"
    params = {"packed": pack_w8(q, scale, zp), "n": int(n), "k": int(k)}
    kernel = Kernel(
        _w8_native, "native", "native:matmul_w8_f32", params=params, out=True, specialize=_w8_specialized
    )
    return kernel, ""
