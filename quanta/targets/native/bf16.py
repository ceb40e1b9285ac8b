"""Native quanta::MatMulBf16 on the bf16 island kernels (quanta/kernels/cpp/bf16).

Run-time dispatch in the kernel: vdpbf16ps on CPUs with AVX512_BF16, the bf16 values
widened to float32 (exact) with fused multiply-adds otherwise; both within eq. (FG1) of
the twin's float64 value (docs/float-ops.md "bf16 islands"). The bf16 weight is packed
once at compile time (:func:`pack_bf16`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.bf16 import BF16, QUANTA_DOMAIN
from quanta.kernels.reference.registry import get_op
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder
from quanta.targets.native._values import const_of as _const
from quanta.targets.native._values import threads as _threads
from quanta.targets.native._values import value_dtype as _dtype

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = ["bind_matmul_bf16", "pack_bf16"]


def pack_bf16(w: np.ndarray) -> np.ndarray:
    """bfloat16 ``[K, N]`` -> uint16 ``[blocks, k2, 32]``: per 16-column block and pair of k,
    16 × 2 values (bf16.h), zero padded."""
    bits = np.asarray(w, BF16).view(np.uint16)
    k, n = bits.shape
    k2, blocks = (k + 1) // 2, 2 * ((n + 31) // 32)
    padded = np.zeros((2 * k2, blocks * 16), np.uint16)
    padded[:k, :n] = bits
    return np.ascontiguousarray(
        padded.reshape(k2, 2, blocks, 16).transpose(2, 0, 3, 1).reshape(blocks, k2, 32)
    )


def _bf16_native(
    ctx: Any,
    a: np.ndarray,
    *rest: Any,
    out: np.ndarray | None = None,
    packed: np.ndarray,
    n: int,
    k: int,
    bias: np.ndarray | None,
) -> np.ndarray:
    if a.dtype == np.float32 and a.ndim >= 1 and a.shape[-1] == k:
        return _native.bf16_matmul(
            np.ascontiguousarray(a), packed, n, bias, num_threads=_threads(ctx), out=out
        )
    y = get_op("MatMulBf16", QUANTA_DOMAIN)(ctx, a, *rest)
    if out is None:
        return y
    np.copyto(out, y)
    return out


@register_binder("MatMulBf16", QUANTA_DOMAIN)
def bind_matmul_bf16(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """A constant bfloat16 weight [K, N] and float32 bias."""
    del model  # unused
    if _native is None:
        return None, "the native extension is not built"
    w, bias = _const(node.input(1)), _const(node.input(2))
    if w is None or w.dtype != BF16 or w.ndim != 2:
        return None, "native MatMulBf16 takes a constant bfloat16 [K, N] weight"
    if node.input(2) is not None and (bias is None or bias.dtype != np.float32):
        return None, "native MatMulBf16 takes a constant float32 bias"
    if _dtype(node.input(0)) not in (None, np.dtype(np.float32)):
        return None, f"native MatMulBf16 takes float32 A, got {_dtype(node.input(0))}"
    k, n = w.shape
    params = {
        "packed": pack_bf16(w),
        "n": n,
        "k": k,
        "bias": None if bias is None else np.ascontiguousarray(bias.reshape(n), np.float32),
    }
    return Kernel(_bf16_native, "native", "native:matmul_bf16", params=params, out=True), ""
