"""quanta MlasMatMul: ONNX Runtime's float32 MatMul / FusedMatMul as MLAS computes it on
x86-64 with FMA.

ORT's CPU MatMul<float> (and FusedMatMul, the same kernel with ``alpha`` and transposes)
calls ``MlasGemmBatch`` once for all its GEMMs (sgemm.cpp). The value of an output depends
on a schedule chosen from the shape, ``alpha`` and ORT's intra-op thread count T
(docs/float-ops.md, "ONNX Runtime's float MatMul", eqs. (MM1)-(MM5))::

    (MM1) t = min(T, ⌊M·N·K / 65536⌋ + 1); per GEMM ⌈t / batch⌉ threads, at most
          ⌈N / 16⌉ (N > M: 16-column blocks of N split by MlasPartitionWork) or M (rows)
    (MM2) a thread's MlasSgemmOperation on its rows mc and columns cn:
          mc = 1, alpha = 1: MLAS's M = 1 kernel (SgemmKernelM1Avx, eq. (MC5)); with B read
          transposed (FusedMatMul transB) its N = 1 kernel over the columns (eq. (MC5'))
          N = 1 and B one contiguous column, alpha = 1: the N = 1 kernel over the rows (MC5')
          else StrideN-wide slices and K blocks of StrideK (mlas_conv.stride_k(cn, K))
    (MM3) per block [k0, k0 + sk): acc = +0; acc = fma(a[m, k], b[k, n], acc), k increasing
    (MM4) first block: y = f32(acc · alpha); each further block: y = fma(acc, alpha, y)
          (alpha = 1: y = acc, then y = f32(y + acc): eq. (MC4))
    (MM5) a constant 2-D B that ORT packs at load (MatMul::PrePack): no M = 1 / N = 1
          kernels, slices of 128 columns and K blocks of 256

(MM3)-(MM4) and the M = 1 / N = 1 orders are MlasConv's (reference/mlas_conv.py), whose
kernels this op reuses: one GEMM is the pointwise convolution of B [K, N] (K channels, N
pixels) by A [M, K] (M filters); a batch of GEMMs is that convolution with one group per
GEMM.

Measured: bit for bit against ORT 1.32's MatMul and FusedMatMul at 1 and 2 threads
(tests/kernels/test_mlas_matmul.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.float_ops import fma_f32
from quanta.kernels.reference.mlas_conv import (
    CHAINS,
    DOT,
    M1,
    THREAD_ALIGN,
    THREAD_COMPLEXITY,
    Part,
    _dot,
    _m1,
    _partition,
    stride_k,
)
from quanta.kernels.reference.registry import OpContext, register

__all__ = ["mlas_matmul", "mlas_matmul_plan"]

F32 = np.float32
QUANTA_DOMAIN = "quanta"

PACKED_STRIDE_N = 128  # MLAS_SGEMM_PACKED_STRIDEN
PACKED_STRIDE_K = 256  # MLAS_SGEMM_PACKED_STRIDEK
#: a part's kind when B is read transposed and the part is one row: the N = 1 kernel over
#: its columns (SgemmKernelM1TransposeBAvx with A as the vector)
DOT_COLUMNS = 3


def _operation(
    m0: int, mc: int, n0: int, cn: int, n: int, k: int, *, unit_alpha: bool, trans_b: bool, packed: bool
) -> list[Part]:
    """(MM2) / (MM5): MlasSgemmOperation (or the packed one) on rows [m0, m0 + mc) and
    columns [n0, n0 + cn) of one GEMM of N = ``n`` columns."""
    if packed:
        return [
            (m0, mc, n0 + s, min(PACKED_STRIDE_N, cn - s), PACKED_STRIDE_K, CHAINS)
            for s in range(0, cn, PACKED_STRIDE_N)
        ]
    if unit_alpha and mc == 1:
        return [(m0, 1, n0, cn, k, DOT_COLUMNS if trans_b else M1)]
    # ldc == 1 and ldb == 1: N is 1 and B one contiguous column (transposed: K = 1)
    if unit_alpha and n == 1 and (not trans_b or k == 1):
        return [(m0, mc, n0, 1, k, DOT)]
    sn, sk = stride_k(cn, k)
    return [(m0, mc, n0 + s, min(sn, cn - s), sk, CHAINS) for s in range(0, cn, sn)]


def mlas_matmul_plan(
    m: int,
    n: int,
    k: int,
    *,
    batch: int = 1,
    threads: int = 1,
    unit_alpha: bool = True,
    trans_b: bool = False,
    packed: bool = False,
) -> list[Part]:
    """The parts (m0, mc, n0, cn, sk, kind) of each GEMM of an ``m x k`` by ``k x n``
    MlasGemmBatch of ``batch`` GEMMs at ORT's ``threads`` (MM1)-(MM2), (MM5); every GEMM
    of the batch has the same parts.

    >>> mlas_matmul_plan(1, 40, 300)
    [(0, 1, 0, 40, 300, 1)]
    >>> mlas_matmul_plan(5, 200, 259, threads=2)
    [(0, 5, 0, 112, 128, 0), (0, 5, 112, 88, 128, 0)]"""
    t = min(max(1, threads), int(m * n * k / THREAD_COMPLEXITY) + 1)
    per = -(-t // max(1, batch))
    kw = {"unit_alpha": unit_alpha, "trans_b": trans_b, "packed": packed}
    out: list[Part] = []
    if n > m:
        blocked = -(-n // THREAD_ALIGN)
        per = min(per, blocked)
        for i in range(per):
            start, count = _partition(i, per, blocked)
            start *= THREAD_ALIGN
            count = min(n - start, count * THREAD_ALIGN)
            out += _operation(0, m, start, count, n, k, **kw)
        return out
    per = min(per, m)
    for i in range(per):
        m0, mc = _partition(i, per, m)
        out += _operation(m0, mc, 0, n, n, k, **kw)
    return out


def _chains_alpha(a: np.ndarray, b: np.ndarray, sk: int, alpha: F32) -> np.ndarray:
    """(MM3)-(MM4): ``a [mc, K] · b [K, cn]`` in K blocks of ``sk``."""
    part = None
    for k0 in range(0, a.shape[1], sk):
        acc = np.zeros((a.shape[0], b.shape[1]), F32)
        for k in range(k0, min(a.shape[1], k0 + sk)):
            acc = fma_f32(a[:, k : k + 1], b[k : k + 1, :], acc)
        if alpha == F32(1):
            part = acc if part is None else np.add(part, acc, dtype=F32)
        else:
            part = (
                np.multiply(acc, alpha, dtype=F32)
                if part is None
                else fma_f32(acc, np.full_like(acc, alpha), part)
            )
    assert part is not None
    return part


def _gemm(a: np.ndarray, b: np.ndarray, parts: list[Part], alpha: F32) -> np.ndarray:
    y = np.zeros((a.shape[0], b.shape[1]), F32)
    for m0, mc, n0, cn, sk, kind in parts:
        ar, br = a[m0 : m0 + mc], b[:, n0 : n0 + cn]
        if kind == CHAINS:
            y[m0 : m0 + mc, n0 : n0 + cn] = _chains_alpha(ar, br, sk, alpha)
        elif kind == M1:
            y[m0 : m0 + mc, n0 : n0 + cn] = _m1(ar, br)
        elif kind == DOT:
            y[m0 : m0 + mc, n0 : n0 + cn] = _dot(ar, br)
        else:  # DOT_COLUMNS: B's columns are the rows, A's one row the column
            y[m0 : m0 + mc, n0 : n0 + cn] = _dot(np.ascontiguousarray(br.T), np.ascontiguousarray(ar.T)).T
    return y


def batch_shape(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, int, int, int, bool]:
    """(batch, M, N, K, folded) of ORT's MatMulComputeHelper for float32 operands of rank
    >= 2: a 2-D B with an N-D A folds A's leading dimensions into M (one GEMM); otherwise
    one GEMM per broadcast batch index."""
    k, n = int(b_shape[-2]), int(b_shape[-1])
    if len(b_shape) == 2:
        m = int(np.prod(a_shape[:-1], dtype=np.int64))
        return 1, m, n, k, True
    m = int(a_shape[-2])
    lead = np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
    return int(np.prod(lead, dtype=np.int64)), m, n, k, False


def mlas_matmul(
    a: np.ndarray,
    b: np.ndarray,
    *,
    alpha: float = 1.0,
    threads: int = 1,
    trans_b: bool = False,
    packed: bool = False,
) -> np.ndarray:
    """ORT's float32 MatMul of ``a [..., M, K]`` by ``b [..., K, N]`` (ranks >= 2),
    (MM1)-(MM5); ``trans_b``: ORT reads B transposed (a FusedMatMul whose Transpose it
    folded), which only changes the M = 1 kernel; ``packed``: B is a constant 2-D weight ORT
    packed at load."""
    a = np.asarray(a, F32)
    b = np.asarray(b, F32)
    al = F32(alpha)
    nb, m, n, k, folded = batch_shape(a.shape, b.shape)
    parts = mlas_matmul_plan(
        m, n, k, batch=nb, threads=threads, unit_alpha=al == F32(1), trans_b=trans_b, packed=packed
    )
    with np.errstate(over="ignore", invalid="ignore"):
        if folded:
            y = _gemm(a.reshape(m, k), b, parts, al)
            return y.reshape(*a.shape[:-1], n)
        lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        ab = np.broadcast_to(a, (*lead, m, k)).reshape(-1, m, k)
        bb = np.broadcast_to(b, (*lead, k, n)).reshape(-1, k, n)
        y = np.stack([_gemm(ab[i], bb[i], parts, al) for i in range(nb)])
        return y.reshape(*lead, m, n)


@register("MlasMatMul", QUANTA_DOMAIN)
def mlas_matmul_op(
    ctx: OpContext,
    a: np.ndarray,
    b: np.ndarray,
    *,
    alpha: float = 1.0,
    threads: int = 1,
    trans_b: int = 0,
    packed: int = 0,
    **attrs: Any,
) -> np.ndarray:
    """quanta MlasMatMul-1: ONNX Runtime's float MatMul / FusedMatMul (module docstring):
    ``alpha`` the scale ORT folded in, ``threads`` ORT's intra-op thread count, ``trans_b``
    / ``packed`` what selects ORT's kernel for one row."""
    del ctx, attrs  # unused
    return mlas_matmul(a, b, alpha=alpha, threads=int(threads), trans_b=bool(trans_b), packed=bool(packed))
