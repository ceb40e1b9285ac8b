"""quanta MlasConv: ONNX Runtime's float32 Conv as MLAS computes it on x86-64 with FMA.

ORT runs a QDQ Conv group it does not fuse into an integer kernel (int8 activations on x86
without ``session.qdqisint8allowed``, 16-bit activations, a Conv whose output feeds
something other than one QuantizeLinear) as ``DequantizeLinear -> Conv (float32) ->``.
Its float Conv is ``MlasConv`` (convolve.cpp), whose value depends on a schedule chosen
from the shape and ORT's thread count. Per image and group, with F filters, K = C/G·kh·kw
and N = oh·ow output pixels (docs/float-ops.md, "ONNX Runtime's float convolution",
eqs. (MC1)-(MC6))::

    (MC1) cols[k, n] = x[c, oh·sh − pt + i·dh, ow·sw − pl + j·dw]  (0 outside),  k = (c, i, j)
    (MC2) the columns split into slices (n0, cn, sk): the path and ORT's thread count give
          each output pixel the K block length sk of the slice it falls in (mlas_conv_plan)
    (MC3) per block [k0, k0 + sk): acc = +0; acc = fma(w[f, k], cols[k, n], acc), k increasing
    (MC4) y = acc of the first block; y = f32(y + acc) for each further block, in order
    (MC5) F = 1 (depthwise: MLAS's M = 1 kernel, no FMA): per 4 k, t = f32(f32(f32(p0 + p1)
          + p2) + p3), p = f32(w·x); y = f32(y + t) from y = +0; then a pair, then a single
          the same way, for the K mod 4 left
    (MC6) y = f32(y + b[f]) if the Conv has a bias

The slices (MC2), from MlasConvPrepare / MlasConv / MlasGemmBatch / MlasSgemmOperation
(StrideN = StrideK = 128, thread complexity 65 536, thread alignment 16):

    stride_k(n, K): n >= K: halve StrideK while StrideK / 2 >= K (so a block is all of K,
      or 128); n < K: double StrideK (halving StrideN) while StrideN > 16 and StrideN / 2 >= n
    pointwise (1x1, stride 1, no padding), or F > N: one GEMM F x N x K. Group or batch > 1:
      the whole N at one thread. Else MlasGemm: T = min(threads, F·N·K / 65536 + 1); N > F:
      the 16-column blocks of N split over T threads (MlasPartitionWork), else rows split
    otherwise, im2col in segments: group or batch > 1: one segment N; else T as above
      (capped at 16), a thread stride ⌈N / T⌉ rounded up to 16 (then T adjusted), segments
      of that stride; each segment's slices are StrideN wide with sk = stride_k(segment, K)

Refused (``mlas_conv_plan`` returns None; quanta keeps its own arithmetic): 3-D convs, an
output of one pixel (MLAS's transposed M = 1 kernel, not modelled), F > 1 rows split over
threads so that one thread gets a single row, and the GEMM-direct forms of a one-channel
conv whose kernel spans the input's width or height (MlasConvPrepare's TransB paths).

Measured: bit for bit against ORT 1.32's float Conv (ORT_ENABLE_EXTENDED, so no NCHWc
rewrite; a QDQ file's Conv reads its weight from a DequantizeLinear and is never NCHWc) at 1
and 2 threads (tests/kernels/test_mlas_conv.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.float_ops import fma_f32
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["mlas_conv", "mlas_conv_plan", "stride_k"]

F32 = np.float32
QUANTA_DOMAIN = "quanta"

STRIDE_N = 128  # MLAS_SGEMM_STRIDEN
STRIDE_K = 128  # MLAS_SGEMM_STRIDEK
THREAD_COMPLEXITY = 64 * 1024  # MLAS_SGEMM_THREAD_COMPLEXITY
THREAD_ALIGN = 16  # MLAS_SGEMM_STRIDEN_THREAD_ALIGN
MAX_THREADS = 16  # MLAS_MAXIMUM_THREAD_COUNT

Slices = list[tuple[int, int, int]]


def stride_k(n: int, k: int) -> tuple[int, int]:
    """(StrideN, StrideK) of MlasSgemmOperation / MlasConvOperation for ``n`` columns, K = ``k``.

    >>> stride_k(800, 288), stride_k(64, 576), stride_k(36, 1152), stride_k(100, 27)
    ((128, 128), (64, 256), (32, 512), (512, 32))"""
    sn, sk = STRIDE_N, STRIDE_K
    if n >= k:
        while sk // 2 >= k:
            sn *= 2
            sk //= 2
    else:
        while sn > 16 and sn // 2 >= n:
            sk *= 2
            sn //= 2
    return sn, sk


def _slices(n0: int, count: int, k: int) -> Slices:
    sn, sk = stride_k(count, k)
    return [(n0 + s, min(sn, count - s), sk) for s in range(0, count, sn)]


def _partition(index: int, threads: int, total: int) -> tuple[int, int]:
    """MlasPartitionWork: (start, count) of ``index``'s share of ``total``."""
    per, extra = divmod(total, threads)
    if index < extra:
        return (per + 1) * index, per + 1
    return per * index + extra, per


def mlas_conv_plan(
    f: int,
    k: int,
    n: int,
    *,
    pointwise: bool,
    spans_input: bool,
    many: bool,
    threads: int,
) -> Slices | None:
    """The column slices (n0, cn, sk) of one image and group (MC2), or None where the
    schedule is not modelled. ``f`` filters per group, ``k`` = C/G·kh·kw, ``n`` output
    pixels; ``pointwise``: 1x1 kernel, stride 1, no padding; ``spans_input``: MLAS's
    one-channel GEMM-direct TransB forms; ``many``: group or batch > 1; ``threads``: ORT's
    intra-op thread count.

    >>> mlas_conv_plan(32, 288, 1600, pointwise=False, spans_input=False, many=False, threads=2)[:2]
    [(0, 128, 128), (128, 128, 128)]
    >>> mlas_conv_plan(64, 576, 100, pointwise=False, spans_input=False, many=False, threads=2)
    [(0, 64, 256), (64, 36, 256)]"""
    if n <= 1 or spans_input:
        return None
    threads = max(1, threads)
    if pointwise or f > n:  # MlasConvAlgorithmGemmDirect / ExpandThenGemm: one GEMM
        if many:
            return _slices(0, n, k)
        t = min(threads, int(f * n * k / THREAD_COMPLEXITY) + 1)
        if n > f:
            blocked = -(-n // THREAD_ALIGN)
            t = min(t, blocked)
            out: Slices = []
            for i in range(t):
                start, count = _partition(i, t, blocked)
                start *= THREAD_ALIGN
                count = min(n - start, count * THREAD_ALIGN)
                if count > 0:
                    out += _slices(start, count, k)
            return out
        t = min(t, f)
        if f > 1 and any(_partition(i, t, f)[1] == 1 for i in range(t)):
            return None  # a thread's single row runs MLAS's M = 1 kernel
        return _slices(0, n, k)
    if many:
        return _slices(0, n, k)
    cx = f * n * k
    t = int(cx / THREAD_COMPLEXITY) + 1 if cx < THREAD_COMPLEXITY * MAX_THREADS else MAX_THREADS
    t = min(t, threads)
    stride = -(-n // t)
    if t > 1:
        stride = (stride + THREAD_ALIGN - 1) & ~(THREAD_ALIGN - 1)
        if stride >= n:
            t = 1
    if t == 1 or stride >= n:
        return _slices(0, n, k)
    out = []
    for s0 in range(0, n, stride):
        out += _slices(s0, min(stride, n - s0), k)
    return out


def _im2col(x: np.ndarray, kernel: tuple[int, int], strides, dilations, pads) -> tuple[np.ndarray, int, int]:
    """(MC1) of one image and group: cols [C·kh·kw, oh·ow], k = (c, i, j)."""
    c, h, w = x.shape
    kh, kw = kernel
    xp = np.pad(x, ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    taps = [
        xp[
            :,
            i * dilations[0] : i * dilations[0] + strides[0] * (oh - 1) + 1 : strides[0],
            j * dilations[1] : j * dilations[1] + strides[1] * (ow - 1) + 1 : strides[1],
        ]
        for i in range(kh)
        for j in range(kw)
    ]
    return np.stack(taps, axis=1).reshape(c * kh * kw, oh * ow), oh, ow


def _gemm_slices(a: np.ndarray, cols: np.ndarray, slices: Slices) -> np.ndarray:
    """(MC3)-(MC4) for every slice."""
    y = np.zeros((a.shape[0], cols.shape[1]), F32)
    k_total = a.shape[1]
    for n0, cn, sk in slices:
        b = cols[:, n0 : n0 + cn]
        part = None
        for k0 in range(0, k_total, sk):
            acc = np.zeros((a.shape[0], cn), F32)
            for k in range(k0, min(k_total, k0 + sk)):
                acc = fma_f32(a[:, k : k + 1], b[k : k + 1, :], acc)
            part = acc if part is None else np.add(part, acc, dtype=F32)
        y[:, n0 : n0 + cn] = part
    return y


def _gemm_m1(a: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(MC5): MLAS's M = 1 kernel (SgemmKernelM1Avx: vmulps / vaddps, four k a step)."""
    k_total = cols.shape[0]
    prods = np.multiply(a[0][:, None], cols, dtype=F32)
    y = np.zeros(cols.shape[1], F32)
    k = 0
    for width in [4] * (k_total // 4) + ([2] if k_total % 4 >= 2 else []) + ([1] if k_total % 2 else []):
        t = prods[k]
        for j in range(1, width):
            t = np.add(t, prods[k + j], dtype=F32)
        y = np.add(y, t, dtype=F32)
        k += width
    return y[None, :]


def mlas_conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    *,
    strides=(1, 1),
    dilations=(1, 1),
    pads=(0, 0, 0, 0),
    group: int = 1,
    threads: int = 1,
) -> np.ndarray | None:
    """ORT's float32 Conv of ``x [B, C, H, W]`` (or ``[B, C, W]``) by ``w [M, C/G, kh, kw]``
    (MC1)-(MC6); None where :func:`mlas_conv_plan` refuses the shape."""
    x = np.asarray(x, F32)
    w = np.asarray(w, F32)
    one_d = x.ndim == 3
    if one_d:
        x, w = x[:, :, None, :], w[:, :, None, :]
        strides, dilations = (1, strides[0]), (1, dilations[0])
        pads = (0, pads[0], 0, pads[1])
    if x.ndim != 4:
        return None
    batch, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    f = m // group
    k = cg * kh * kw
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    pointwise = kh == kw == 1 and tuple(strides) == (1, 1) and not any(pads)
    spans = (
        not pointwise
        and cg == 1
        and tuple(strides) == (1, 1)
        and tuple(dilations) == (1, 1)
        and not any(pads)
        and (kw == wd or (kh == h and kw == 1))
    )
    slices = mlas_conv_plan(
        f, k, oh * ow, pointwise=pointwise, spans_input=spans, many=batch > 1 or group > 1, threads=threads
    )
    if slices is None:
        return None
    y = np.empty((batch, m, oh * ow), F32)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(batch):
            for g in range(group):
                cols, _, _ = _im2col(x[i, g * cg : (g + 1) * cg], (kh, kw), strides, dilations, pads)
                a = w[g * f : (g + 1) * f].reshape(f, k)
                out = _gemm_m1(a, cols) if f == 1 else _gemm_slices(a, cols, slices)
                if b is not None:
                    out = np.add(out, np.asarray(b, F32)[g * f : (g + 1) * f, None], dtype=F32)
                y[i, g * f : (g + 1) * f] = out
    y = y.reshape(batch, m, oh, ow)
    return y[:, :, 0, :] if one_d else y


def conv_geometry(node_attrs: dict[str, Any], w_shape: tuple[int, ...]) -> tuple[Any, Any, Any, int]:
    """(strides, dilations, pads (t, l, b, r) or (l, r) for 1-D, group) of a Conv's
    attributes; auto_pad other than NOTSET is refused (OpError)."""
    rank = len(w_shape) - 2
    auto = node_attrs.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto not in ("NOTSET", ""):
        raise OpError(f"MlasConv: auto_pad {auto} is resolved to pads before this op")
    strides = tuple(int(s) for s in node_attrs.get("strides", [1] * rank))
    dilations = tuple(int(d) for d in node_attrs.get("dilations", [1] * rank))
    pads = tuple(int(p) for p in node_attrs.get("pads", [0] * (2 * rank)))
    return strides, dilations, pads, int(node_attrs.get("group", 1))


@register("MlasConv", QUANTA_DOMAIN)
def mlas_conv_op(
    ctx: OpContext, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, *, threads: int = 1, **attrs: Any
) -> np.ndarray:
    """quanta MlasConv-1: ONNX Runtime's float Conv (module docstring); attributes those of
    Conv (explicit pads) plus ``threads``, ORT's intra-op thread count the schedule follows."""
    del ctx  # unused
    strides, dilations, pads, group = conv_geometry(attrs, np.shape(w))
    y = mlas_conv(x, w, b, strides=strides, dilations=dilations, pads=pads, group=group, threads=int(threads))
    if y is None:
        raise OpError("MlasConv: a shape whose MLAS schedule is not modelled (the rewrite refuses these)")
    return y
