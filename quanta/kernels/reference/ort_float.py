"""quanta MlasLogistic, MlasTanh, MlasGeluTanh, OrtLSTM, MlasSoftmax, OrtLayerNorm and
OrtFastGelu: ONNX Runtime's float32 Sigmoid, Tanh, LSTM, Softmax, LayerNorm family and
FastGelu (normative), and a tanh GELU written out around ORT's Tanh.

ONNX defines Sigmoid and Tanh as the exact functions; quanta's Sigmoid and Tanh compute
them within 2.4 and 2 ulp (docs/float-ops.md (Σ1)-(Σ2), (T1)-(T4)). ONNX Runtime's CPU
kernels compute MLAS's rational approximations instead (``MlasComputeLogistic``,
``MlasComputeTanh``; on x86-64 with FMA their FMA3 kernels), which differ from the exact
functions in the last bits. In a file that ORT's quantizer wrote for ORT, such last bits
decide roundings downstream (a dynamically quantized model re-quantizes every
activation), so a session that must agree with ORT runs these in their place
(``SessionOptions.float_functions``, docs/float-ops.md "ONNX Runtime's functions")::

    MlasLogistic(x) = mlas_logistic(x)      clamp to [-18, 18], x·P(x²) / Q(x²) + 0.5, floor 0
    MlasTanh(x)     = mlas_tanh(x)          clamp to [-9, 9],   x·P(x²) / Q(x²)

(:mod:`quanta.kernels.reference.ms_lstm`, which DynamicQuantizeLSTM's gates use too).
``MlasGeluTanh`` is eq. (G2) of docs/float-ops.md with MLAS's tanh in place of (T1)-(T4):
the eight nodes of an exported ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` in a file
ORT's quantizer wrote (whose Tanh became MlasTanh), fused by FuseGeluTanh.
float32 only: other element types are an error naming the op.

``OrtLSTM`` is the ai.onnx LSTM (same inputs, outputs and attributes) as ORT's CPU kernel
computes it in float32: the products by MLAS's float GEMM (fused multiply-add chains in
blocks of 256 k, :func:`quanta.kernels.reference.rnn.mlas_sgemm_blocks`), the gates in
ORT's order with MLAS's logistic and tanh (docs/float-ops.md (RNN-ORT)). A file ORT's
quantizer wrote keeps an LSTM float between a DequantizeLinear and a QuantizeLinear; its Y
is quantized again, so the last bits of these products decide codes.

``OrtGRU`` is the ai.onnx GRU as ORT's CPU kernel computes it (deep_cpu_gru.cc): the
products by the same MLAS GEMM blocks, z by MLAS's logistic, r and the candidate by ORT's
own rational sigmoid and tanh (``deepcpu_sigmoid`` / ``deepcpu_tanh``), in its order
(docs/float-ops.md (RNN-ORT-GRU)). ORT's ``quantize_dynamic`` keeps a GRU float and
quantizes its Y again with DynamicQuantizeLinear (pyfrspell's files).

``OrtReduceSum`` / ``OrtReduceMean`` are float32 ReduceSum / ReduceMean over the trailing
axes as ORT's CPU kernel computes them (reduction_ops.h ``FastReduceKR``: rows [R, N],
each row summed by Eigen's ``.sum()`` on a ``Map``, SSE packets of 4 in ORT's x86-64
build, then ``/ f32(N)`` for the mean), docs/float-ops.md (ER1)-(ER4)::

    (ER1) a0 = min((−d·N) mod 4, N): row d's elements before a 16-byte boundary of ORT's
          buffer (its arena and NumPy's feeds are 16-byte aligned)
    (ER2) P_k = x[a0 + 4k .. a0 + 4k + 3], k < K = (N − a0) // 4; p0 = P_0, p1 = P_1 and
          p0 += P_2j, p1 += P_2j+1 for j = 1 .. K//2 − 1; then p0 += p1 (K >= 2) and
          p0 += P_K−1 when K is odd (and >= 3)
    (ER3) s = f32(f32(p0[0] + p0[2]) + f32(p0[1] + p0[3])), then s += x[i] for i < a0
          and for i >= a0 + 4K, in increasing i
    (ER4) K = 0: s = x[0], then s += x[i], i = 1 .. N − 1

``MlasGlobalAveragePool`` is the float32 GlobalAveragePool of an NC... input as ORT's CPU
kernel computes it: ``MlasPool`` with global pooling (pooling.cpp ``MlasPoolGlobalKernel``,
SSE vectors of 4 on x86-64), one row [N] per (n, c), N the product of the spatial sizes,
docs/float-ops.md (GP1)-(GP3)::

    (GP1) lane j (0 <= j < 4) starts at +0 and adds x[4k + j], k = 0 .. N//4 − 1, in order
    (GP2) s = f32(f32(l0 + l2) + f32(l1 + l3)), then s += x[i] for i = 4·(N//4) .. N − 1
    (GP3) y = f32(s / f32(N))

``MlasSoftmax`` is ORT's float32 Softmax (``MlasComputeSoftmax``: on an AVX2 host the FMA3
sum-exp kernel, 8 lanes; on an AVX-512F host the AVX-512F one, 16 lanes and vscalefps,
(SX1) and (SX2), chosen by the host as quanta.kernels.reference.ort_host
.onnxruntime_softmax_avx512f says), ``OrtLayerNorm`` its LayerNormalization (``kernel``
"layer_norm"), SimplifiedLayerNormalization ("simplified") and SkipLayerNormalization
("skip") kernels of ORT 1.32, ``OrtFastGelu`` its com.microsoft FastGelu; the equations
(SM1)-(SM5), (OL1)-(OL9) and (FG1) are docs/float-ops.md's ("ONNX Runtime's Softmax,
LayerNorm family and FastGelu"), each confirmed bit for bit against onnxruntime 1.32.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from quanta.kernels.reference.float_ops import GELU_C, GELU_K, fma_f32
from quanta.kernels.reference.ms_lstm import mlas_logistic, mlas_tanh
from quanta.kernels.reference.ort_host import onnxruntime_softmax_avx512f
from quanta.kernels.reference.registry import OpContext, OpError, register
from quanta.kernels.reference.rnn import default_activations, gru, lstm

__all__ = [
    "QUANTA_DOMAIN",
    "eigen_sum_rows",
    "mlas_gelu_tanh",
    "mlas_gelu_tanh_op",
    "mlas_global_average_pool_op",
    "mlas_global_average_rows",
    "mlas_logistic_op",
    "mlas_softmax_op",
    "mlas_softmax_rows",
    "mlas_sum_exp",
    "mlas_tanh_op",
    "ort_fast_gelu",
    "ort_fast_gelu_op",
    "ort_gru_op",
    "ort_layer_norm_op",
    "ort_layer_norm_rows",
    "ort_lstm_op",
    "ort_reduce_mean_op",
    "ort_reduce_sum_op",
]

QUANTA_DOMAIN = "quanta"


def _f32(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise OpError(f"{ctx.op_type or 'op'}: X: expected float32, got {x.dtype}")
    return x


@register("MlasLogistic", QUANTA_DOMAIN)
def mlas_logistic_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """quanta MlasLogistic-1: ORT's Sigmoid (module docstring)."""
    return mlas_logistic(_f32(ctx, x))


@register("MlasTanh", QUANTA_DOMAIN)
def mlas_tanh_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """quanta MlasTanh-1: ORT's Tanh (module docstring)."""
    return mlas_tanh(_f32(ctx, x))


def mlas_gelu_tanh(x: np.ndarray) -> np.ndarray:
    """Eq. (G2) with MLAS's tanh, every step one float32 IEEE operation in the export's
    order::

        a = f32(K · f32(x + f32(C · f32(f32(x · x) · x))))     K = f32(√(2/π)), C = f32(0.044715)
        y = f32(f32(0.5 · x) · f32(1 + mlas_tanh(a)))"""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # x³ overflows from |x| = 7e12 on
        a = GELU_K * (x + GELU_C * ((x * x) * x))
        return (np.float32(0.5) * x) * (np.float32(1) + mlas_tanh(a))


@register("MlasGeluTanh", QUANTA_DOMAIN)
def mlas_gelu_tanh_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """quanta MlasGeluTanh-1: the tanh GELU with ORT's Tanh (module docstring)."""
    return mlas_gelu_tanh(_f32(ctx, x))


def _check_rnn(
    op: str, inputs: Sequence[np.ndarray | None], activations: Sequence[str] | None, attrs: dict
) -> None:
    """What Ort{op} takes: the default activations (the rule that writes the op keeps any
    other as it is), float32 operands (sequence_lens aside), clip > 0."""
    directions = 2 if attrs.get("direction", "forward") == "bidirectional" else 1
    if not default_activations(op, activations, directions):
        raise OpError(f"Ort{op}: only the default activations, got {list(activations or [])}")
    for k, v in enumerate(inputs):
        if k != 4 and v is not None and np.asarray(v).dtype != np.float32:
            raise OpError(f"Ort{op}: input {k} must be float32, got {np.asarray(v).dtype}")
    clip = attrs.get("clip")
    if clip is not None and not float(clip) > 0:
        raise OpError(f"Ort{op}: clip must be > 0, got {clip}")


@register("OrtLSTM", QUANTA_DOMAIN)
def ort_lstm_op(
    ctx: OpContext,
    *inputs: np.ndarray | None,
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] = (),
    activation_beta: Sequence[float] = (),
    **attrs: Any,
) -> tuple[np.ndarray, ...]:
    """quanta OrtLSTM-1: ORT's float32 LSTM (module docstring); the default activations
    only (the rule that writes this op keeps any other LSTM as it is)."""
    _check_rnn("LSTM", inputs, activations, attrs)
    return lstm(*inputs, **attrs, functions="ort")[: max(1, ctx.n_outputs)]


@register("OrtGRU", QUANTA_DOMAIN)
def ort_gru_op(
    ctx: OpContext,
    *inputs: np.ndarray | None,
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] = (),
    activation_beta: Sequence[float] = (),
    **attrs: Any,
) -> tuple[np.ndarray, ...]:
    """quanta OrtGRU-1: ORT's float32 GRU (module docstring); the default activations
    only (the rule that writes this op keeps any other GRU as it is)."""
    _check_rnn("GRU", inputs, activations, attrs)
    return gru(*inputs, **attrs, functions="ort")[: max(1, ctx.n_outputs)]


# --------------------------------------------------------------------------------------
# ReduceSum / ReduceMean over the trailing axes: Eigen's packet order (ER1)-(ER4)
# --------------------------------------------------------------------------------------

#: floats in one of Eigen's SSE packets (ORT's x86-64 build compiles Eigen for SSE)
EIGEN_PACKET = 4


def eigen_sum_rows(rows: np.ndarray) -> np.ndarray:
    """Sum of every row of ``rows`` [R, N] (float32, row d at element d·N of a 16-byte
    aligned buffer) in Eigen's order (ER1)-(ER4) (module docstring); shape [R].

    >>> v = np.array([[1e8, 1, 1, 1, 1, 1, 1, 1, 1]], np.float32)   # a0 = 0, K = 2
    >>> float(eigen_sum_rows(v)[0])   # lanes (1e8 + 1, 2, 2, 2): (1e8 + 2) + 4 ties to 1e8, + 1
    100000000.0
    >>> float(np.sum(v, dtype=np.float64))
    100000008.0
    """
    rows = np.asarray(rows, np.float32)
    r, n = rows.shape
    out = np.zeros(r, np.float32)
    if r == 0 or n == 0:
        return out
    d = np.arange(r, dtype=np.int64)
    a0_of = np.minimum((-d * n) % EIGEN_PACKET, n)  # (ER1)
    add = np.add
    for a0 in np.unique(a0_of):
        sel = np.nonzero(a0_of == a0)[0]
        x = rows[sel]
        a0 = int(a0)
        k = (n - a0) // EIGEN_PACKET
        if k == 0:  # (ER4)
            s = x[:, 0].copy()
            for i in range(1, n):
                s = add(s, x[:, i])
            out[sel] = s
            continue
        pk = x[:, a0 : a0 + EIGEN_PACKET * k].reshape(len(sel), k, EIGEN_PACKET)
        p0 = pk[:, 0].copy()  # (ER2)
        if k >= 2:
            p1 = pk[:, 1].copy()
            for j in range(1, k // 2):
                p0 = add(p0, pk[:, 2 * j])
                p1 = add(p1, pk[:, 2 * j + 1])
            p0 = add(p0, p1)
            if k % 2:
                p0 = add(p0, pk[:, k - 1])
        s = add(add(p0[:, 0], p0[:, 2]), add(p0[:, 1], p0[:, 3]))  # (ER3)
        for i in list(range(a0)) + list(range(a0 + EIGEN_PACKET * k, n)):
            s = add(s, x[:, i])
        out[sel] = s
    return out


def trailing_rows(
    op: str, x: np.ndarray, axes: Sequence[int] | None
) -> tuple[np.ndarray, tuple[int, ...], int]:
    """``x`` as rows [R, N] over its trailing ``axes`` (every axis when None or empty), the
    kept dimensions, and how many axes are reduced."""
    rank = x.ndim
    chosen = list(range(rank)) if not axes else sorted({int(a) % max(rank, 1) for a in axes})
    if chosen != list(range(rank - len(chosen), rank)):
        raise OpError(f"{op}: axes {list(axes or [])} are not the trailing axes of a rank-{rank} input")
    kept = tuple(x.shape[: rank - len(chosen)])
    n = int(np.prod(x.shape[rank - len(chosen) :], dtype=np.int64))
    rows = np.ascontiguousarray(x).reshape(int(np.prod(kept, dtype=np.int64)), n)
    return rows, kept, len(chosen)


def _ort_reduce(
    op: str, ctx: OpContext, x: np.ndarray, axes: Sequence[int] | None, keepdims: int, mean: bool
):
    rows, kept, reduced = trailing_rows(op, _f32(ctx, x), axes)
    s = eigen_sum_rows(rows)
    if mean:
        with np.errstate(invalid="ignore"):  # N = 0: 0 / 0
            s = np.divide(s, np.float32(rows.shape[1]), dtype=np.float32)
    return s.reshape(kept + (1,) * reduced if keepdims else kept)


@register("OrtReduceSum", QUANTA_DOMAIN)
def ort_reduce_sum_op(ctx: OpContext, x: np.ndarray, *, axes: Sequence[int] | None = None, keepdims: int = 1):
    """quanta OrtReduceSum-1: float32 ReduceSum over the trailing ``axes`` (all when
    absent) as ORT computes it, (ER1)-(ER4) (module docstring)."""
    return _ort_reduce("OrtReduceSum", ctx, x, axes, keepdims, mean=False)


@register("OrtReduceMean", QUANTA_DOMAIN)
def ort_reduce_mean_op(
    ctx: OpContext, x: np.ndarray, *, axes: Sequence[int] | None = None, keepdims: int = 1
):
    """quanta OrtReduceMean-1: float32 ReduceMean over the trailing ``axes`` (all when
    absent) as ORT computes it: f32(s / f32(N)), s by (ER1)-(ER4) (module docstring)."""
    return _ort_reduce("OrtReduceMean", ctx, x, axes, keepdims, mean=True)


# --------------------------------------------------------------------------------------
# GlobalAveragePool: MLAS's global pooling kernel (GP1)-(GP3)
# --------------------------------------------------------------------------------------

#: floats in one of MLAS's MLAS_FLOAT32X4 vectors (its NCHW pooling kernels are SSE on x86-64)
MLAS_POOL_LANES = 4


def mlas_global_average_rows(rows: np.ndarray) -> np.ndarray:
    """The mean of every row of ``rows`` [R, N] (float32) in MLAS's order (GP1)-(GP3)
    (module docstring); shape [R]. ``np.add.accumulate`` is a running sum, element by
    element in order, so its last entry is (GP1)'s sequential lane sum.

    >>> v = np.array([[2**24, 1, 1, 1, 1, 1, 1, 1]], np.float32)    # lanes 2^24, 2, 2, 2
    >>> float(mlas_global_average_rows(v)[0]) * 8                    # in order: 2^24
    16777222.0
    """
    rows = np.asarray(rows, np.float32)
    r, n = rows.shape
    k = n // MLAS_POOL_LANES
    if k:
        blocks = rows[:, : MLAS_POOL_LANES * k].reshape(r, k, MLAS_POOL_LANES)
        # + 0: the lanes start at +0, so a lane of −0 elements is +0 (accumulate starts at x)
        lanes = np.add(np.add.accumulate(blocks, axis=1)[:, -1], np.float32(0))
        s = np.add(np.add(lanes[:, 0], lanes[:, 2]), np.add(lanes[:, 1], lanes[:, 3]))
    else:
        s = np.zeros(r, np.float32)
    for i in range(MLAS_POOL_LANES * k, n):
        s = np.add(s, rows[:, i])
    with np.errstate(invalid="ignore"):  # N = 0: 0 / 0
        return np.divide(s, np.float32(n), dtype=np.float32)


@register("MlasGlobalAveragePool", QUANTA_DOMAIN)
def mlas_global_average_pool_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """quanta MlasGlobalAveragePool-1: float32 GlobalAveragePool of x [N, C, spatial...] as
    ORT's MlasPool computes it, (GP1)-(GP3) (module docstring)."""
    x = _f32(ctx, x)
    if x.ndim < 3:
        raise OpError(f"MlasGlobalAveragePool: input of rank {x.ndim}, expected N, C and spatial axes")
    rows = np.ascontiguousarray(x).reshape(x.shape[0] * x.shape[1], -1)
    return mlas_global_average_rows(rows).reshape(x.shape[:2] + (1,) * (x.ndim - 2))


# --------------------------------------------------------------------------------------
# Softmax: MLAS's MlasComputeSoftmax, AVX2 and AVX-512F hosts (SM1)-(SM5), (SX1), (SX2)
# --------------------------------------------------------------------------------------

#: MlasExpConstants (compute.cpp) as MlasComputeSumExpF32KernelFma3 reads them
MLAS_EXP_LOWER = np.float32(-88.3762626647949)  # LowerRangeSumExp
MLAS_EXP_LOWER_AVX512F = np.float32(-103.9720840454)  # LowerRange: the AVX-512F kernel's clamp
MLAS_EXP_BIAS = np.float32(12582912.0)  # RoundingBias, 1.5 · 2^23
MLAS_EXP_LOG2E = np.float32(1.44269504088896341)  # Log2Reciprocal
MLAS_EXP_LN2_HI = np.float32(-6.93145752e-1)  # Log2High
MLAS_EXP_LN2_LO = np.float32(-1.42860677e-6)  # Log2Low
MLAS_EXP_POLY = tuple(
    np.float32(float.fromhex(h))
    for h in (
        "0x1.694000p-10",
        "0x1.125edcp-7",
        "0x1.555b5ap-5",
        "0x1.555450p-3",
        "0x1.fffff6p-2",
        "0x1.0p+0",
    )
)
#: floats in one of MlasComputeSumExpF32KernelFma3's ymm accumulators
MLAS_SOFTMAX_LANES = 8
#: floats in MlasComputeSumExpF32KernelAvx512F's zmm accumulator
MLAS_SOFTMAX_LANES_AVX512F = 16


def mlas_sum_exp(v: np.ndarray, avx512f: bool = False) -> np.ndarray:
    """(SM2): MLAS's exp of v = x − max (``MlasComputeSumExpF32KernelFma3``, element by
    element; every step one float32 operation, ``fma`` one rounding)::

        t = max(−88.376, v);  b = fma(t, log2(e), 1.5·2^23);  m = b − 1.5·2^23
        r = fma(m, LN2_HI, t);  r = fma(m, LN2_LO, r)
        p = P0;  p = fma(p, r, Pk), k = 1..4;  p = fma(p, r, 1);  p = fma(p, r, 1)
        y = f32(p · 2^m)   2^m: the bits (bits(b) << 23) + 0x3F800000 (32-bit wrap)

    ``avx512f``: (SX1), ``MlasComputeSumExpF32KernelAvx512F``'s same steps from
    t = max(−103.972, v) (LowerRange) with y = vscalefps(p, m), p · 2^m rounded once (a
    subnormal result too)."""
    with np.errstate(invalid="ignore"):
        t = np.maximum(MLAS_EXP_LOWER_AVX512F if avx512f else MLAS_EXP_LOWER, np.asarray(v, np.float32))
    b = fma_f32(t, MLAS_EXP_LOG2E, MLAS_EXP_BIAS)
    m = b - MLAS_EXP_BIAS
    r = fma_f32(m, MLAS_EXP_LN2_HI, t)
    r = fma_f32(m, MLAS_EXP_LN2_LO, r)
    p = np.full_like(r, MLAS_EXP_POLY[0])
    for c in MLAS_EXP_POLY[1:5]:
        p = fma_f32(p, r, c)
    p = fma_f32(p, r, MLAS_EXP_POLY[5])
    p = fma_f32(p, r, MLAS_EXP_POLY[5])
    if avx512f:  # m is an integer in [-150, 0] (or NaN): p · 2^m is exact in float64
        with np.errstate(invalid="ignore"):
            return (p.astype(np.float64) * np.exp2(m.astype(np.float64))).astype(np.float32)
    scale = ((b.view(np.uint32) << np.uint32(23)) + np.uint32(0x3F800000)).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return p * scale


@functools.cache
def _host_avx512f() -> bool:
    return onnxruntime_softmax_avx512f()


def mlas_softmax_rows(rows: np.ndarray, avx512f: bool | None = None) -> np.ndarray:
    """Softmax of every row of ``rows`` [R, D] (float32) as ORT's MlasComputeSoftmax,
    (SM1)-(SM5) (module docstring); shape [R, D]. ``avx512f``: the AVX-512F host's order,
    (SX1) and (SX2); None: this host's (quanta.kernels.reference.ort_host
    .onnxruntime_softmax_avx512f), as ``_native.mlas_softmax_f32`` chooses.

    >>> mlas_softmax_rows(np.array([[0.0, 1.0, 2.0]], np.float32), avx512f=False).tolist()
    [[0.09003057330846786, 0.2447284758090973, 0.6652409434318542]]
    >>> x = np.array([[0.0, -95.0]], np.float32)  # e^-95: subnormal, 2^m not a float32
    >>> [float(mlas_softmax_rows(x, a)[0, 1]) for a in (False, True)]
    [0.0, 5.521115949439779e-42]
    """
    if avx512f is None:
        avx512f = _host_avx512f()
    x = np.asarray(rows, np.float32)
    r, d = x.shape
    if r == 0 or d == 0:
        return x.copy()
    lowest = np.float32(np.finfo(np.float32).min)
    m = np.fmax(np.nanmax(np.where(np.isnan(x), lowest, x), axis=1), lowest)  # (SM1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        e = mlas_sum_exp(x + (-m)[:, None], avx512f)  # (SM2), (SX1)
        lanes = MLAS_SOFTMAX_LANES_AVX512F if avx512f else MLAS_SOFTMAX_LANES
        k = d // lanes
        acc = np.zeros((r, lanes), np.float32)
        for g in range(k):  # (SM3) lane j adds e[8g + j] in increasing g
            acc = acc + e[:, lanes * g : lanes * (g + 1)]
        if d > lanes * k:  # the masked last vector: its empty lanes add +0
            tail = np.zeros((r, lanes), np.float32)
            tail[:, : d - lanes * k] = e[:, lanes * k :]
            acc = acc + tail
        if avx512f:  # (SX2): the high 8 lanes onto the low 8, then (SM3)'s tree
            acc = acc[:, 8:] + acc[:, :8]
        s = ((acc[:, 0] + acc[:, 1]) + (acc[:, 2] + acc[:, 3])) + (
            (acc[:, 4] + acc[:, 5]) + (acc[:, 6] + acc[:, 7])
        )
        scale = np.float32(1) / s  # (SM4)
        return e * scale[:, None]  # (SM5)


@register("MlasSoftmax", QUANTA_DOMAIN)
def mlas_softmax_op(ctx: OpContext, x: np.ndarray, *, axis: int = -1, coerce_2d: int = 0) -> np.ndarray:
    """quanta MlasSoftmax-1: float32 Softmax along ``axis`` as ORT computes it, (SM1)-(SM5)
    (module docstring); ``coerce_2d`` = 1: the opset < 13 form (rows of the 2-D coercion
    [prod(shape[:axis]), prod(shape[axis:])])."""
    x = _f32(ctx, x)
    if x.ndim == 0 or x.size == 0:
        return x.copy()
    if not -x.ndim <= axis < x.ndim:
        raise OpError(f"MlasSoftmax: axis expected in [{-x.ndim}, {x.ndim - 1}], got {axis}")
    axis %= x.ndim
    if coerce_2d:
        return mlas_softmax_rows(x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)).reshape(x.shape)
    moved = np.moveaxis(x, axis, -1)
    y = mlas_softmax_rows(np.ascontiguousarray(moved).reshape(-1, x.shape[axis]))
    return np.moveaxis(y.reshape(moved.shape), -1, axis)


# --------------------------------------------------------------------------------------
# FastGelu: com.microsoft FastGelu's CPU kernel (FG1)
# --------------------------------------------------------------------------------------

#: bias_gelu.cc: B = f32(√(2/π)), C = f32(0.044715 · √(2/π))
ORT_FAST_GELU_B = np.float32(0.7978845608028654)
ORT_FAST_GELU_C = np.float32(0.035677408136300125)


def ort_fast_gelu(x: np.ndarray) -> np.ndarray:
    """(FG1), ORT's FastGelu of v (after its bias), every step one float32 operation::

        a = f32(v · f32(f32(f32(C · v) · v) + B));  y = f32(f32(0.5 · v) · f32(mlas_tanh(a) + 1))

    >>> ort_fast_gelu(np.array([0.0, 1.0, -3.0], np.float32)).tolist()
    [0.0, 0.8411920070648193, -0.0036375224590301514]
    """
    v = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        a = v * ((ORT_FAST_GELU_C * v) * v + ORT_FAST_GELU_B)
        return (np.float32(0.5) * v) * (mlas_tanh(a) + np.float32(1))


@register("OrtFastGelu", QUANTA_DOMAIN)
def ort_fast_gelu_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """quanta OrtFastGelu-1: com.microsoft FastGelu (no bias) as ORT's CPU kernel, (FG1)."""
    return ort_fast_gelu(_f32(ctx, x))


# --------------------------------------------------------------------------------------
# LayerNormalization family: ORT 1.32's CPU kernels on an AVX2 host (OL1)-(OL9)
# --------------------------------------------------------------------------------------

#: OrtLayerNorm's ``kernel``: which of ORT's kernels the node stands for
ORT_LN_KERNELS = ("layer_norm", "simplified", "skip")
#: row lengths from which ORT's LayerNormalization / SimplifiedLayerNormalization take
#: their AVX2 kernels (shorter rows: Welford, resp. the sequential sum)
ORT_LN_AVX2_FROM = 8
ORT_SLN_AVX2_FROM = 16


def _avx2_square_sum(d: np.ndarray) -> np.ndarray:
    """(OL3): Σ d² of every row [R, N]: 8 lanes from +0 by FMA over blocks of 8, the lanes
    summed ((q0 + q4) + (q2 + q6)) + ((q1 + q5) + (q3 + q7)); then, when 4 or more remain,
    four f32(d·d) added in order; then one FMA per element left."""
    r, n = d.shape
    k = n // 8
    q = np.zeros((r, 8), np.float32)
    for g in range(k):
        blk = d[:, 8 * g : 8 * g + 8]
        q = fma_f32(blk, blk, q)
    h = q[:, :4] + q[:, 4:]
    s = (h[:, 0] + h[:, 2]) + (h[:, 1] + h[:, 3])
    i = 8 * k
    if n - i >= 4:
        for j in range(i, i + 4):
            s = s + d[:, j] * d[:, j]
        i += 4
    for j in range(i, n):
        s = fma_f32(d[:, j], d[:, j], s)
    return s


def _avx2_mean(x: np.ndarray) -> np.ndarray:
    """(OL1): f32(S / N), S in float64: 4 lanes over blocks of 4, (l0 + l2) + (l1 + l3),
    then the elements past the last block in order."""
    r, n = x.shape
    xd = x.astype(np.float64)
    k = n // 4
    acc = np.zeros((r, 4))
    for g in range(k):
        acc = acc + xd[:, 4 * g : 4 * g + 4]
    s = (acc[:, 0] + acc[:, 2]) + (acc[:, 1] + acc[:, 3])
    for j in range(4 * k, n):
        s = s + xd[:, j]
    return (s / n).astype(np.float32)


def ort_layer_norm_rows(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, epsilon: float, kernel: str
) -> np.ndarray:
    """Every row of ``x`` [R, N] normalized as ORT's ``kernel`` computes it (module
    docstring, (OL1)-(OL9)); shape [R, N]."""
    x = np.asarray(x, np.float32)
    scale = np.asarray(scale, np.float32).reshape(-1)
    bias = None if bias is None else np.asarray(bias, np.float32).reshape(-1)
    r, n = x.shape
    f = np.float32
    eps, count = f(epsilon), f(n)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if kernel == "simplified" and n >= ORT_SLN_AVX2_FROM:  # (OL6)
            inv = f(1) / np.sqrt(_avx2_square_sum(x) / count + eps)
            return (inv[:, None] * x) * scale
        if kernel == "simplified":  # (OL7)
            s = np.zeros(r, f)
            for j in range(n):
                s = s + x[:, j] * x[:, j]
            root = np.sqrt(s / count + eps)
            return (x / root[:, None]) * scale
        if kernel == "layer_norm" and n >= ORT_LN_AVX2_FROM:  # (OL1)-(OL5)
            mean = _avx2_mean(x)
            d = x - mean[:, None]  # (OL2)
            inv = f(1) / np.sqrt(_avx2_square_sum(d) / count + eps)  # (OL4)
            t = d * inv[:, None]
            if bias is None:
                return t * scale
            return fma_f32(t, np.broadcast_to(scale, t.shape), np.broadcast_to(bias, t.shape))  # (OL5)
        if kernel not in ORT_LN_KERNELS:
            raise ValueError(f"OrtLayerNorm: kernel expected one of {ORT_LN_KERNELS}, got {kernel!r}")
        mean = np.zeros(r, f)  # (OL8) Welford
        m2 = np.zeros(r, f)
        for j in range(n):
            v = x[:, j]
            delta = v - mean
            mean = mean + delta / f(j + 1)
            m2 = m2 + (v - mean) * delta
        std = np.sqrt(m2 / count + eps)
        y = ((x - mean[:, None]) / std[:, None]) * scale  # (OL9)
        return y if bias is None else y + bias


@register("OrtLayerNorm", QUANTA_DOMAIN)
def ort_layer_norm_op(
    ctx: OpContext,
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    kernel: str = "layer_norm",
) -> np.ndarray:
    """quanta OrtLayerNorm-1: float32 x normalized over axes [axis, rank) as ORT's
    LayerNormalization (``kernel`` "layer_norm"), SimplifiedLayerNormalization
    ("simplified", no bias) or SkipLayerNormalization ("skip", x the sum it normalizes)
    computes it, (OL1)-(OL9) (module docstring)."""
    x = _f32(ctx, x)
    if kernel not in ORT_LN_KERNELS:
        raise OpError(f"OrtLayerNorm: kernel expected one of {', '.join(ORT_LN_KERNELS)}, got {kernel!r}")
    if not -x.ndim <= axis < x.ndim:
        raise OpError(f"OrtLayerNorm: axis expected in [{-x.ndim}, {x.ndim - 1}], got {axis}")
    axis %= x.ndim
    n = int(np.prod(x.shape[axis:], dtype=np.int64))
    for name, v in (("scale", scale), ("bias", bias)):
        if v is not None and (np.asarray(v).dtype != np.float32 or np.asarray(v).size != n):
            raise OpError(
                f"OrtLayerNorm: {name} must be float32 of {n} elements, got {np.asarray(v).dtype} {np.shape(v)}"
            )
    if kernel == "simplified" and bias is not None:
        raise OpError("OrtLayerNorm: the simplified kernel takes no bias")
    rows = np.ascontiguousarray(x).reshape(-1, n) if n else x.reshape(-1, 0)
    return ort_layer_norm_rows(rows, scale, bias, epsilon, kernel).reshape(x.shape)
