"""quanta MlasConv: ONNX Runtime's float32 Conv as MLAS computes it on x86-64 with FMA.

ORT runs a QDQ Conv group it does not fuse into an integer kernel (int8 activations on x86
without ``session.qdqisint8allowed``, 16-bit activations, a Conv whose output feeds
something other than one QuantizeLinear) as ``DequantizeLinear -> Conv (float32) ->``.
Its float Conv is ``MlasConv`` (convolve.cpp), whose value depends on a schedule chosen
from the shape and ORT's thread count. Per image and group, with F filters, K = C/G·kh·kw
and N = oh·ow output pixels (docs/float-ops.md, "ONNX Runtime's float convolution",
eqs. (MC1)-(MC6))::

    (MC1) cols[k, n] = x[c, oh·sh − pt + i·dh, ow·sw − pl + j·dw]  (0 outside),  k = (c, i, j)
    (MC2) the outputs split into parts (m0, mc, n0, cn, sk, kind): the path and ORT's thread
          count give each output the K block length sk and the kernel of the MLAS call that
          computes it (mlas_conv_plan)
    (MC3) per block [k0, k0 + sk): acc = +0; acc = fma(w[f, k], cols[k, n], acc), k increasing
    (MC4) y = acc of the first block; y = f32(y + acc) for each further block, in order
    (MC5) F = 1 (depthwise: MLAS's M = 1 kernel, no FMA): per 4 k, t = f32(f32(f32(p0 + p1)
          + p2) + p3), p = f32(w·x); y = f32(y + t) from y = +0; then a pair, then a single
          the same way, for the K mod 4 left
    (MC5') one output pixel (MLAS's N = 1 kernel, no FMA): eight lane sums of f32(w·x) in
          increasing k, reduced by the row's place in its thread's rows (:func:`_dot`)
    (MC6) y = f32(y + b[f]) if the Conv has a bias

The parts (MC2), from MlasConvPrepare / MlasConv / MlasGemmBatch / MlasSgemmOperation
(StrideN = StrideK = 128, thread complexity 65 536, thread alignment 16):

    stride_k(n, K): n >= K: halve StrideK while StrideK / 2 >= K (so a block is all of K,
      or 128); n < K: double StrideK (halving StrideN) while StrideN > 16 and StrideN / 2 >= n
    pointwise (1x1, stride 1, no padding) with group or batch > 1: one GEMM F x N x K per
      image and group at one thread. Pointwise otherwise, and F > N always: MlasGemm,
      T = min(threads, F·N·K / 65536 + 1); N > F: the 16-column blocks of N split over T
      threads (MlasPartitionWork), else the rows
    otherwise, im2col in segments: group or batch > 1: one segment N; else T as above
      (capped at 16), a thread stride ⌈N / T⌉ rounded up to 16 (then T adjusted), segments
      of that stride; each segment's slices are StrideN wide with sk = stride_k(segment, K)

A thread's share of one row runs the M = 1 kernel (MC5), a one-pixel output the N = 1
kernel (MC5'). Refused (``mlas_conv_plan`` returns None; quanta keeps its own arithmetic):
3-D convs and the GEMM-direct forms of a one-channel conv whose kernel spans the input's
width or height (MlasConvPrepare's TransB paths).

Measured: bit for bit against ORT 1.32's float Conv (ORT_ENABLE_EXTENDED, so no NCHWc
rewrite; a QDQ file's Conv reads its weight from a DequantizeLinear and is never NCHWc) at 1
and 2 threads (tests/kernels/test_mlas_conv.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from quanta.kernels.reference.float_ops import fma_f32
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["ConvShape", "conv_shape", "mlas_conv", "mlas_conv_plan", "stride_k"]

F32 = np.float32
QUANTA_DOMAIN = "quanta"

STRIDE_N = 128  # MLAS_SGEMM_STRIDEN
STRIDE_K = 128  # MLAS_SGEMM_STRIDEK
THREAD_COMPLEXITY = 64 * 1024  # MLAS_SGEMM_THREAD_COMPLEXITY
THREAD_ALIGN = 16  # MLAS_SGEMM_STRIDEN_THREAD_ALIGN
MAX_THREADS = 16  # MLAS_MAXIMUM_THREAD_COUNT

#: one unit of work: rows [m0, m0 + mc) and columns [n0, n0 + cn) of one image and group,
#: K blocks of sk, and the kernel: CHAINS (MC3)-(MC4), M1 (MC5) or DOT (MC5')
Part = tuple[int, int, int, int, int, int]
CHAINS, M1, DOT = 0, 1, 2


def stride_k(n: int, k: int) -> tuple[int, int]:
    """(StrideN, StrideK) of MlasSgemmOperation / MlasConvOperation for ``n`` columns, K = ``k``.

    >>> stride_k(800, 288), stride_k(64, 576), stride_k(36, 1152), stride_k(100, 27)
    ((128, 128), (64, 256), (64, 256), (512, 32))"""
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


def _sgemm(m0: int, mc: int, n0: int, count: int, k: int) -> list[Part]:
    """MlasSgemmOperation on rows [m0, m0 + mc), columns [n0, n0 + count): M = 1 and
    N = 1 (a one-pixel output, ldb = ldc = 1) take MLAS's dedicated kernels."""
    if mc == 1:
        return [(m0, 1, n0, count, k, M1)]
    if count == 1:
        return [(m0, mc, n0, 1, k, DOT)]
    sn, sk = stride_k(count, k)
    return [(m0, mc, n0 + s, min(sn, count - s), sk, CHAINS) for s in range(0, count, sn)]


def _partition(index: int, threads: int, total: int) -> tuple[int, int]:
    """MlasPartitionWork: (start, count) of ``index``'s share of ``total``."""
    per, extra = divmod(total, threads)
    if index < extra:
        return (per + 1) * index, per + 1
    return per * index + extra, per


def _mlas_gemm(f: int, n: int, k: int, threads: int) -> list[Part]:
    """MlasGemm (MlasGemmBatch with one GEMM): N > M splits 16-column blocks of N over
    the threads, else the rows."""
    t = min(threads, int(f * n * k / THREAD_COMPLEXITY) + 1)
    out: list[Part] = []
    if n > f:
        blocked = -(-n // THREAD_ALIGN)
        t = min(t, blocked)
        for i in range(t):
            start, count = _partition(i, t, blocked)
            start *= THREAD_ALIGN
            count = min(n - start, count * THREAD_ALIGN)
            out += _sgemm(0, f, start, count, k)
        return out
    t = min(t, f)
    for i in range(t):
        m0, mc = _partition(i, t, f)
        out += _sgemm(m0, mc, 0, n, k)
    return out


def mlas_conv_plan(
    f: int,
    k: int,
    n: int,
    *,
    pointwise: bool,
    spans_input: bool,
    many: bool,
    threads: int,
) -> list[Part] | None:
    """The parts (m0, mc, n0, cn, sk, kind) of one image and group (MC2), or None where
    the schedule is not modelled. ``f`` filters per group, ``k`` = C/G·kh·kw, ``n`` output
    pixels; ``pointwise``: 1x1 kernel, stride 1, no padding; ``spans_input``: MLAS's
    one-channel GEMM-direct TransB forms; ``many``: group or batch > 1; ``threads``: ORT's
    intra-op thread count.

    >>> mlas_conv_plan(32, 288, 1600, pointwise=False, spans_input=False, many=False, threads=2)[:2]
    [(0, 32, 0, 128, 128, 0), (0, 32, 128, 128, 128, 0)]
    >>> mlas_conv_plan(64, 576, 100, pointwise=False, spans_input=False, many=False, threads=2)
    [(0, 64, 0, 64, 256, 0), (0, 64, 64, 36, 256, 0)]"""
    if spans_input:
        return None
    threads = max(1, threads)
    if pointwise:  # MlasConvAlgorithmGemmDirect
        return _sgemm(0, f, 0, n, k) if many else _mlas_gemm(f, n, k, threads)
    if f > n:  # MlasConvAlgorithmExpandThenGemm: MlasGemm per image and group
        return _mlas_gemm(f, n, k, threads)
    if many:  # MlasConvExpandThenGemmSegmentedThreaded: one segment per image and group
        return _segment(f, 0, n, k)
    cx = f * n * k
    t = int(cx / THREAD_COMPLEXITY) + 1 if cx < THREAD_COMPLEXITY * MAX_THREADS else MAX_THREADS
    t = min(t, threads)
    stride = -(-n // t)
    if t > 1:
        stride = (stride + THREAD_ALIGN - 1) & ~(THREAD_ALIGN - 1)
    if t == 1 or stride >= n:
        return _segment(f, 0, n, k)
    out: list[Part] = []
    for s0 in range(0, n, stride):
        out += _segment(f, s0, min(stride, n - s0), k)
    return out


def _segment(f: int, n0: int, count: int, k: int) -> list[Part]:
    """MlasConvOperation on one segment: StrideN-wide slices, K blocks of StrideK (the
    segment's), each block one MlasSgemmOperation (M = 1: MLAS's M = 1 kernel)."""
    sn, sk = stride_k(count, k)
    kind = M1 if f == 1 else CHAINS
    return [(0, f, n0 + s, min(sn, count - s), sk, kind) for s in range(0, count, sn)]


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


def _chains(a: np.ndarray, b: np.ndarray, sk: int) -> np.ndarray:
    """(MC3)-(MC4): ``a [mc, K] · b [K, cn]``."""
    part = None
    for k0 in range(0, a.shape[1], sk):
        acc = np.zeros((a.shape[0], b.shape[1]), F32)
        for k in range(k0, min(a.shape[1], k0 + sk)):
            acc = fma_f32(a[:, k : k + 1], b[k : k + 1, :], acc)
        part = acc if part is None else np.add(part, acc, dtype=F32)
    assert part is not None
    return part


def _m1(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(MC5): MLAS's M = 1 kernel (SgemmKernelM1Avx: vmulps / vaddps, four k a step)."""
    k_total = b.shape[0]
    prods = np.multiply(a[0][:, None], b, dtype=F32)
    y = np.zeros(b.shape[1], F32)
    k = 0
    for width in [4] * (k_total // 4) + ([2] if k_total % 4 >= 2 else []) + ([1] if k_total % 2 else []):
        t = prods[k]
        for j in range(1, width):
            t = np.add(t, prods[k + j], dtype=F32)
        y = np.add(y, t, dtype=F32)
        k += width
    return y[None, :]


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(MC5'): MLAS's N = 1 kernel (SgemmKernelM1TransposeBAvx) on rows a [mc, K] and one
    column b [K, 1]: eight lane sums s[l] = Σ_j f32(a[8j + l]·b[8j + l]) in increasing j,
    reduced per row by the row's place: in blocks of four rows ((s0 + s1) + s2) + s3 +
    (((s4 + s5) + s6) + s7), then a pair ((s0 + s2) + (s4 + s6)) + ((s1 + s3) + (s5 + s7)),
    then a single ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))."""
    mc, k_total = a.shape
    pad = (-k_total) % 8
    prods = np.multiply(a, b[:, 0][None, :], dtype=F32)
    prods = np.concatenate([prods, np.zeros((mc, pad), F32)], axis=1).reshape(mc, -1, 8)
    s = np.zeros((mc, 8), F32)
    for j in range(prods.shape[1]):
        s = np.add(s, prods[:, j], dtype=F32)
    add = np.add
    y = np.empty(mc, F32)
    fours = mc // 4 * 4
    for r in range(mc):
        v = s[r]
        if r < fours:
            y[r] = add(add(add(add(v[0], v[1]), v[2]), v[3]), add(add(add(v[4], v[5]), v[6]), v[7]))
        elif r < fours + (2 if mc % 4 >= 2 else 0):
            y[r] = add(add(add(v[0], v[2]), add(v[4], v[6])), add(add(v[1], v[3]), add(v[5], v[7])))
        else:
            y[r] = add(add(add(v[0], v[1]), add(v[2], v[3])), add(add(v[4], v[5]), add(v[6], v[7])))
    return y[:, None]


def _run_parts(a: np.ndarray, cols: np.ndarray, parts: list[Part]) -> np.ndarray:
    y = np.zeros((a.shape[0], cols.shape[1]), F32)
    for m0, mc, n0, cn, sk, kind in parts:
        ar, b = a[m0 : m0 + mc], cols[:, n0 : n0 + cn]
        fn = _chains(ar, b, sk) if kind == CHAINS else _m1(ar, b) if kind == M1 else _dot(ar, b)
        y[m0 : m0 + mc, n0 : n0 + cn] = fn
    return y


class ConvShape(NamedTuple):
    """One MlasConv's geometry in its 2-D form (a 1-D Conv runs with a unit height, as
    MLAS promotes it): x [batch, group·cg, h, w], w [group·f, cg, kh, kw], y [batch,
    group·f, oh, ow]. The one place the output size and the schedule's inputs are
    computed (the twin, the native binder; the C++ binding only checks against it).

    >>> s = conv_shape((1, 32, 20, 20), (32, 32, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1)
    >>> (s.oh, s.ow, s.f, s.k, s.n, s.pointwise)
    (20, 20, 32, 288, 400, False)
    >>> conv_shape((2, 8, 50), (4, 8, 3), (2,), (1,), (1, 1), 1)[1:5]
    (1, 50, (1, 2), (1, 1))"""

    batch: int
    h: int
    w: int
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]
    group: int
    m: int
    cg: int
    kh: int
    kw: int
    oh: int
    ow: int

    @property
    def f(self) -> int:
        return self.m // self.group

    @property
    def k(self) -> int:
        return self.cg * self.kh * self.kw

    @property
    def n(self) -> int:
        return self.oh * self.ow

    @property
    def pointwise(self) -> bool:
        return self.kh == self.kw == 1 and self.strides == (1, 1) and not any(self.pads)

    @property
    def spans_input(self) -> bool:
        """MlasConvPrepare's GEMM-direct TransB forms: a one-channel stride-1 unpadded
        kernel spanning the input's width, or its height with width 1."""
        return (
            not self.pointwise
            and self.cg == 1
            and self.strides == (1, 1)
            and self.dilations == (1, 1)
            and not any(self.pads)
            and (self.kw == self.w or (self.kh == self.h and self.kw == 1))
        )

    def plan(self, threads: int) -> list[Part] | None:
        """The parts of one image and group for ORT's ``threads`` (mlas_conv_plan)."""
        return mlas_conv_plan(
            self.f,
            self.k,
            self.n,
            pointwise=self.pointwise,
            spans_input=self.spans_input,
            many=self.batch > 1 or self.group > 1,
            threads=threads,
        )


def conv_shape(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], strides, dilations, pads, group: int
) -> ConvShape:
    """The :class:`ConvShape` of x, w of rank 3 (1-D: pads (l, r)) or 4 (pads (t, l, b, r))."""
    if len(w_shape) == 3:  # 1-D: MLAS promotes it to 2-D with a unit height
        strides, dilations, pads = (1, strides[0]), (1, dilations[0]), (0, pads[0], 0, pads[1])
        x_shape = (x_shape[0], x_shape[1], 1, x_shape[2])
        w_shape = (w_shape[0], w_shape[1], 1, w_shape[2])
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise OpError(
            f"MlasConv: 1-D and 2-D only, got x of rank {len(x_shape)} and w of rank {len(w_shape)}"
        )
    st = (int(strides[0]), int(strides[1]))
    dl = (int(dilations[0]), int(dilations[1]))
    pd = (int(pads[0]), int(pads[1]), int(pads[2]), int(pads[3]))
    batch, _, h, w = (int(d) for d in x_shape)
    m, cg, kh, kw = (int(d) for d in w_shape)
    oh = (h + pd[0] + pd[2] - dl[0] * (kh - 1) - 1) // st[0] + 1
    ow = (w + pd[1] + pd[3] - dl[1] * (kw - 1) - 1) // st[1] + 1
    return ConvShape(batch, h, w, st, dl, pd, int(group), m, cg, kh, kw, oh, ow)


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
    if x.ndim not in (3, 4):
        return None
    s = conv_shape(x.shape, w.shape, strides, dilations, pads, group)
    parts = s.plan(threads)
    if parts is None:
        return None
    x = x.reshape(s.batch, -1, s.h, s.w)
    w = w.reshape(s.m, s.cg, s.kh, s.kw)
    f, k = s.f, s.k
    y = np.empty((s.batch, s.m, s.n), F32)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(s.batch):
            for g in range(group):
                cols, _, _ = _im2col(
                    x[i, g * s.cg : (g + 1) * s.cg], (s.kh, s.kw), s.strides, s.dilations, s.pads
                )
                a = w[g * f : (g + 1) * f].reshape(f, k)
                out = _run_parts(a, cols, parts)
                if b is not None:
                    out = np.add(out, np.asarray(b, F32)[g * f : (g + 1) * f, None], dtype=F32)
                y[i, g * f : (g + 1) * f] = out
    y = y.reshape(s.batch, s.m, s.oh, s.ow)
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
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    threads: int = 1,
    **attrs: Any,
) -> np.ndarray:
    """quanta MlasConv-1: ONNX Runtime's float Conv (module docstring); attributes those of
    Conv (explicit pads) plus ``threads``, ORT's intra-op thread count the schedule follows."""
    del ctx  # unused
    strides, dilations, pads, group = conv_geometry(attrs, np.shape(w))
    y = mlas_conv(x, w, b, strides=strides, dilations=dilations, pads=pads, group=group, threads=int(threads))
    if y is None:
        raise OpError("MlasConv: a shape whose MLAS schedule is not modelled (the rewrite refuses these)")
    return y
