"""quanta MlasLogistic, MlasTanh, MlasGeluTanh and OrtLSTM: ONNX Runtime's float32 Sigmoid,
Tanh and LSTM (normative), and a tanh GELU written out around ORT's Tanh.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from quanta.kernels.reference.float_ops import GELU_C, GELU_K
from quanta.kernels.reference.ms_lstm import mlas_logistic, mlas_tanh
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
    "mlas_tanh_op",
    "ort_gru_op",
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
    >>> float(eigen_sum_rows(v)[0])                                  # (1e8 + 1 + ...) in lanes
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
