"""com.microsoft quantized ops, as ONNX Runtime defines them (normative reference).

These ops have no ONNX spec; their definition is ONNX Runtime's CPU implementation
(contrib_ops/cpu/quantization/*, MLAS qladd/qlmul/qlgavgpool/quantize). Each function
below writes down the float32 steps ORT performs, in ORT's order. ``q(v)`` is MLAS's
``MlasQuantizeLinear``: ``saturate(round_half_even(float32(v / scale)) + zero_point)``
(eq. (2)); ``dq(x) = float32(scale · float32(x − zero_point))``.

=====================  ==========================================================  =========
op                     definition                                                  vs ORT
=====================  ==========================================================  =========
QLinearAdd             ``sat(rne(fma(a, ra, fma(b, rb, k))))``, ``ra = f32(sa/sc)``, exact (a)
                       ``rb = f32(sb/sc)``, ``k = f32(zc − fma(ra, za, f32(rb·zb)))``
QLinearMul             ``sat(rne(f32(f32(acc · r) + zc)))``, ``acc = (a−za)(b−zb)``  exact
                       ``r = f32(f32(sa · sb) / sc)``
QLinearConcat          per input: copy if ``(sx, zx) == (sy, zy)`` else ``q(dq(x))``  exact
QLinearLeakyRelu       ``q(v if v >= 0 else f32(alpha · v))``, ``v = dq(x)``         exact
QLinearSigmoid         ``q(mlas_logistic(v))``, ``v = dq(x)``                        exact (b)
QLinearGlobalAvgPool   eq. (6) on ``acc = Σ x − zx · HW``, ``m = f32(sx / f32(sy · HW))`` exact
QLinearAveragePool     ``sat(rne(f32(f32(avg / sy) + zy)))``, ``avg`` a float32 sum   exact
                       of ``dq(x)`` in window order divided by ``f32(count)`` (c)
=====================  ==========================================================  =========

(a) ORT's x86 kernel (MLAS AVX2 / AVX-512, what ORT runs on any x86-64 CPU with AVX2):
    the codes scaled by the ratios ``sa/sc``, ``sb/sc`` in fused multiply-adds onto a
    fixed part that holds ``zc`` and both zero points; a scalar ``b`` is folded into the
    fixed part once, which gives the same value. The fixed part's ``ra·za + rb·zb`` is
    itself contracted to one FMA by the compiler: rounding the two products separately
    moves the code of ``a = za`` by 1 when ``rb·(b − zb) + zc`` is an x.5 (HardSwish's
    ``0 + 3`` at ``sc = 6/255``). Measured equal to ORT 1.32 on every
    (a, b) code pair for int8 and uint8, scalar and full ``b``
    (``test_qlinear_add_matches_onnxruntime_on_every_code_pair``). MLAS's portable path
    (``qlinear_add_portable``, the formula of ORT's op documentation; the C++ kernel
    ``qlinear_add`` computes the x86 form above) dequantizes first and divides by ``sc``; it differs
    from ORT by 1 near x.5 boundaries, and on some scale pairs often: with ``sb/sc = 0.5``
    and an odd ``b − zb`` every value sits near a tie (PP-OCRv4's HardSwish ``x + 3``:
    2.5 % of the codes). ARM uses a fixed-point path (not followed).
(b) ORT builds its table with ``MlasComputeLogistic`` (x86 with FMA:
    ``MlasLogisticKernelFma3``, a rational approximation, ``ms_lstm.mlas_logistic``), and
    so does this reference; the same function is what ORT's float Sigmoid computes, so a
    QDQ Sigmoid group ORT leaves float (int8 activations on x86) gives the same codes.
    The exact sigmoid rounded to float32 differs from it by an ulp on about 40 % of
    inputs, which moved a code by 1 wherever ``sigmoid(v) / sy`` sat within that ulp of an
    x.5 boundary.
(c) The window of output ``o`` along an axis is ``[max(o·s − p_begin, 0), min(o·s −
    p_begin + k, D))``; ``count`` is ``Π k`` with ``count_include_pad`` else the window's
    size; sums run in row-major window order (as ORT's loops). When the kernel covers the
    whole input and all pads are 0, ORT switches to its QLinearGlobalAveragePool kernel
    (an integer sum) and so does this reference. Output sizes use ORT's formula
    ``floor_or_ceil((D + p_begin + p_end − k) / s) + 1`` (with ``ceil_mode``, minus 1 when
    the last window would start in the end padding) and ORT's SAME pads.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from quanta.kernels.reference.ms_lstm import mlas_logistic
from quanta.kernels.reference.ms_qops import widen_half_scale
from quanta.kernels.reference.quantize import quantize_linear
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, OpError, register
from quanta.kernels.reference.requant import requantize, storage_range

__all__ = [
    "qlinear_add",
    "qlinear_add_portable",
    "qlinear_average_pool",
    "qlinear_concat",
    "qlinear_global_average_pool",
    "qlinear_leaky_relu",
    "qlinear_mul",
    "qlinear_sigmoid",
]

_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def _f32_scalar(v: np.ndarray | float, what: str) -> np.float32:
    v = np.asarray(v)
    if v.size != 1:
        raise OpError(f"{what}: expected a scalar or a 1-element tensor (per-tensor), got shape {v.shape}")
    v = widen_half_scale(v)
    if v.dtype != np.float32:
        raise OpError(f"{what}: expected float32, got {v.dtype}")
    return np.float32(v.reshape(()))


def _zp_scalar(v: np.ndarray | int | None, dtype: np.dtype, what: str) -> int:
    if v is None:
        return 0
    if isinstance(v, int):  # a plain Python value from the function API
        return v
    v = np.asarray(v)
    if v.size != 1:
        raise OpError(f"{what}: expected a scalar or a 1-element tensor (per-tensor), got shape {v.shape}")
    if v.dtype != dtype:
        raise OpError(f"{what}: expected {dtype}, got {v.dtype}")
    return int(v.reshape(()))


def _dequantize_f32(x: np.ndarray, scale: np.float32, zero_point: int) -> np.ndarray:
    """``dq(x) = float32(scale · float32(x − zero_point))``: the integer difference is exact."""
    return np.multiply(
        scale, (x.astype(np.int32) - np.int32(zero_point)).astype(np.float32), dtype=np.float32
    )


def _quantize_f32(v: np.ndarray, scale: np.float32, zero_point: int, dtype: np.dtype) -> np.ndarray:
    """MLAS QuantizeLinear: eq. (2) with a float32 division."""
    return quantize_linear(v.astype(np.float32), scale, zero_point, dtype=dtype)


def _round_sat_f32(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``saturate(round_half_even(v))`` for a float32 ``v`` that already includes the zero point."""
    qmin, qmax = storage_range(dtype)
    v = np.where(np.isnan(v), np.float32(qmin), v)
    return np.clip(np.rint(v), qmin, qmax).astype(dtype)


# --------------------------------------------------------------------------------------
# Elementwise binary: QLinearAdd, QLinearMul (numpy broadcasting)
# --------------------------------------------------------------------------------------


def _fma_f32(x: np.ndarray, y: np.float32, z: np.ndarray) -> np.ndarray:
    """``f32(x·y + z)`` rounded once, as a float32 FMA: ``x`` holds 8-bit codes, so ``x·y``
    is exact in float64 and so is the sum while the addends' exponents differ by at most
    29 (scale ratios within 2^±20); outside that the float64 sum rounds first, which can
    move the float32 result only if it lands exactly on a float32 midpoint."""
    return (np.asarray(x, np.float64) * np.float64(y) + np.asarray(z, np.float64)).astype(np.float32)


def _binary_params(a_scale, a_zero_point, b_scale, b_zero_point, c_scale, c_zero_point, dtype):
    sa = _f32_scalar(np.asarray(a_scale, np.float32), "A_scale")
    sb = _f32_scalar(np.asarray(b_scale, np.float32), "B_scale")
    sc = _f32_scalar(np.asarray(c_scale, np.float32), "C_scale")
    za = _zp_scalar(a_zero_point, dtype, "A_zero_point")
    zb = _zp_scalar(b_zero_point, dtype, "B_zero_point")
    zc = _zp_scalar(c_zero_point, dtype, "C_zero_point")
    return sa, za, sb, zb, sc, zc


def qlinear_add(
    a: np.ndarray,
    a_scale: np.ndarray | float,
    a_zero_point: np.ndarray | int | None,
    b: np.ndarray,
    b_scale: np.ndarray | float,
    b_zero_point: np.ndarray | int | None,
    c_scale: np.ndarray | float,
    c_zero_point: np.ndarray | int | None,
) -> np.ndarray:
    """``c = sat(rne(fma(a, ra, fma(b, rb, k))))``: ORT's x86 kernel (note (a)), with
    ``ra = f32(sa / sc)``, ``rb = f32(sb / sc)``, ``k = f32(zc − fma(ra, za, f32(rb·zb)))``.

    The zero point ``zc`` sits in ``k``, so it is added *before* rounding, as ORT does.

    >>> a = np.array([10, 20], np.uint8); b = np.array([3, 3], np.uint8)
    >>> qlinear_add(a, np.float32(0.5), np.uint8(2), b, np.float32(0.25), np.uint8(1), np.float32(1.0), np.uint8(5))
    array([10, 14], dtype=uint8)
    """
    a = np.asarray(a)
    b = np.asarray(b)
    dtype = a.dtype
    sa, za, sb, zb, sc, zc = _binary_params(
        a_scale, a_zero_point, b_scale, b_zero_point, c_scale, c_zero_point, dtype
    )
    ra = np.float32(sa / sc)
    rb = np.float32(sb / sc)
    k = np.float32(np.float32(zc) - _fma_f32(np.float32(za), ra, np.float32(rb * np.float32(zb))))
    inner = _fma_f32(b.astype(np.float32), rb, k)
    return _round_sat_f32(_fma_f32(a.astype(np.float32), ra, inner), dtype)


def qlinear_add_portable(
    a: np.ndarray,
    a_scale: np.ndarray | float,
    a_zero_point: np.ndarray | int | None,
    b: np.ndarray,
    b_scale: np.ndarray | float,
    b_zero_point: np.ndarray | int | None,
    c_scale: np.ndarray | float,
    c_zero_point: np.ndarray | int | None,
) -> np.ndarray:
    """``c = sat(rne(f32(f32(dq_a(a) + dq_b(b)) / sc) + zc))``: MLAS's portable path and the
    contract of the C++ kernel ``qlinear_add`` (note (a): not what ORT runs on x86).

    >>> a = np.array([10, 20], np.uint8); b = np.array([3, 3], np.uint8)
    >>> qlinear_add_portable(a, np.float32(0.5), np.uint8(2), b, np.float32(0.25), np.uint8(1), np.float32(1.0), np.uint8(5))
    array([10, 14], dtype=uint8)
    """
    a = np.asarray(a)
    b = np.asarray(b)
    dtype = a.dtype
    sa, za, sb, zb, sc, zc = _binary_params(
        a_scale, a_zero_point, b_scale, b_zero_point, c_scale, c_zero_point, dtype
    )
    va = _dequantize_f32(a, sa, za)
    vb = _dequantize_f32(b, sb, zb)
    vc = np.divide(np.add(va, vb, dtype=np.float32), sc, dtype=np.float32)
    return _round_sat_f32(np.add(vc, np.float32(zc), dtype=np.float32), dtype)


def qlinear_mul(
    a: np.ndarray,
    a_scale: np.ndarray | float,
    a_zero_point: np.ndarray | int | None,
    b: np.ndarray,
    b_scale: np.ndarray | float,
    b_zero_point: np.ndarray | int | None,
    c_scale: np.ndarray | float,
    c_zero_point: np.ndarray | int | None,
) -> np.ndarray:
    """``c = sat(rne(f32(f32(acc · r) + zc)))``, ``acc = (a − za)(b − zb)`` exact,
    ``r = f32(f32(sa · sb) / sc)``: MLAS's SSE2 and NEON64 kernels.

    >>> a = np.array([10, 20], np.uint8); b = np.array([3, 5], np.uint8)
    >>> qlinear_mul(a, np.float32(0.5), np.uint8(2), b, np.float32(0.25), np.uint8(1), np.float32(1.0), np.uint8(5))
    array([ 7, 14], dtype=uint8)
    """
    a = np.asarray(a)
    b = np.asarray(b)
    dtype = a.dtype
    sa = _f32_scalar(np.asarray(a_scale, np.float32), "A_scale")
    sb = _f32_scalar(np.asarray(b_scale, np.float32), "B_scale")
    sc = _f32_scalar(np.asarray(c_scale, np.float32), "C_scale")
    ratio = np.float32(np.float32(sa * sb) / sc)
    acc = (a.astype(np.int32) - np.int32(_zp_scalar(a_zero_point, dtype, "A_zero_point"))) * (
        b.astype(np.int32) - np.int32(_zp_scalar(b_zero_point, dtype, "B_zero_point"))
    )
    prod = np.multiply(acc.astype(np.float32), ratio, dtype=np.float32)
    zc = _zp_scalar(c_zero_point, dtype, "C_zero_point")
    return _round_sat_f32(np.add(prod, np.float32(zc), dtype=np.float32), dtype)


def _binary_checks(op: str, a: np.ndarray, b: np.ndarray, types: tuple[np.dtype, ...]) -> None:
    if a.dtype not in types:
        raise OpError(f"A: expected one of {', '.join(str(t) for t in types)}, got {a.dtype}")
    if b.dtype != a.dtype:
        raise OpError(f"B: expected the type of A ({a.dtype}), got {b.dtype}")
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError as e:
        raise OpError(f"{op}: expected broadcastable shapes, got {a.shape} and {b.shape}") from e


def _binary_op(op: str, fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """The com.microsoft ``op`` (QLinearAdd, QLinearMul: the same inputs and checks) on ``fn``."""

    def op_fn(
        ctx: OpContext,
        a: np.ndarray,
        a_scale: np.ndarray,
        a_zero_point: np.ndarray | None,
        b: np.ndarray,
        b_scale: np.ndarray,
        b_zero_point: np.ndarray | None = None,
        c_scale: np.ndarray | None = None,
        c_zero_point: np.ndarray | None = None,
    ) -> np.ndarray:
        del ctx  # unused
        _binary_checks(op, a, b, _EIGHT_BIT)
        if c_scale is None:
            raise OpError("C_scale: expected an input, got none")
        return fn(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point)

    op_fn.__name__ = f"{fn.__name__}_op"
    op_fn.__doc__ = f"com.microsoft {op}-1 (uint8, int8)."
    return register(op, MS_DOMAIN)(op_fn)


qlinear_add_op = _binary_op("QLinearAdd", qlinear_add)
qlinear_mul_op = _binary_op("QLinearMul", qlinear_mul)


# --------------------------------------------------------------------------------------
# Lookup-table activations: QLinearLeakyRelu, QLinearSigmoid
# --------------------------------------------------------------------------------------


def qlinear_leaky_relu(
    x: np.ndarray,
    x_scale: np.ndarray | float,
    x_zero_point: np.ndarray | int | None,
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int | None,
    alpha: float = 0.01,
) -> np.ndarray:
    """``y = q(v >= 0 ? v : f32(alpha · v))``, ``v = dq(x)`` (ORT's 256-entry table).

    >>> qlinear_leaky_relu(np.array([0, 10, 20], np.uint8), np.float32(0.5), np.uint8(10), np.float32(0.25), np.uint8(100), 0.5)
    array([ 90, 100, 120], dtype=uint8)
    """
    x = np.asarray(x)
    dtype = x.dtype
    v = _dequantize_f32(
        x,
        _f32_scalar(np.asarray(x_scale, np.float32), "X_scale"),
        _zp_scalar(x_zero_point, dtype, "X_zero_point"),
    )
    f = np.where(v >= np.float32(0), v, np.multiply(np.float32(alpha), v, dtype=np.float32))
    return _quantize_f32(
        f,
        _f32_scalar(np.asarray(y_scale, np.float32), "Y_scale"),
        _zp_scalar(y_zero_point, dtype, "Y_zero_point"),
        dtype,
    )


def qlinear_sigmoid(
    x: np.ndarray,
    x_scale: np.ndarray | float,
    x_zero_point: np.ndarray | int | None,
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int | None,
) -> np.ndarray:
    """``y = q(mlas_logistic(v))``, ``v = dq(x)``: ORT's rational logistic (note (b)).

    >>> qlinear_sigmoid(np.array([0, 128, 255], np.uint8), np.float32(0.1), np.uint8(128), np.float32(1 / 256), np.uint8(0))
    array([  0, 128, 255], dtype=uint8)
    """
    x = np.asarray(x)
    dtype = x.dtype
    v = _dequantize_f32(
        x,
        _f32_scalar(np.asarray(x_scale, np.float32), "X_scale"),
        _zp_scalar(x_zero_point, dtype, "X_zero_point"),
    )
    s = mlas_logistic(v)
    return _quantize_f32(
        s,
        _f32_scalar(np.asarray(y_scale, np.float32), "Y_scale"),
        _zp_scalar(y_zero_point, dtype, "Y_zero_point"),
        dtype,
    )


def _unary_check(x: np.ndarray) -> None:
    if x.dtype not in _EIGHT_BIT:
        raise OpError(f"X: expected int8 or uint8, got {x.dtype}")


@register("QLinearLeakyRelu", MS_DOMAIN)
def qlinear_leaky_relu_op(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    alpha: float = 0.01,
) -> np.ndarray:
    """com.microsoft QLinearLeakyRelu-1."""
    del ctx  # unused
    _unary_check(x)
    return qlinear_leaky_relu(x, x_scale, x_zero_point, y_scale, y_zero_point, alpha)


@register("QLinearSigmoid", MS_DOMAIN)
def qlinear_sigmoid_op(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    """com.microsoft QLinearSigmoid-1."""
    del ctx  # unused
    _unary_check(x)
    return qlinear_sigmoid(x, x_scale, x_zero_point, y_scale, y_zero_point)


# --------------------------------------------------------------------------------------
# QLinearConcat
# --------------------------------------------------------------------------------------


def qlinear_concat(
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int,
    inputs: list[tuple[np.ndarray, np.ndarray | float, np.ndarray | int]],
    axis: int,
) -> np.ndarray:
    """Concatenate ``(x, sx, zx)`` triples along ``axis`` into ``(sy, zy)``.

    An input whose ``(sx, zx)`` equals ``(sy, zy)`` is copied; any other is requantized
    through ``q(dq(x))`` (ORT's identity lookup table).

    >>> qlinear_concat(np.float32(1.0), np.uint8(0), [(np.array([4], np.uint8), np.float32(0.5), np.uint8(1))], 0)
    array([2], dtype=uint8)
    """
    if not inputs:
        raise OpError("QLinearConcat: expected at least one (tensor, scale, zero_point) triple, got none")
    zy_arr = np.asarray(y_zero_point)
    dtype = zy_arr.dtype
    sy = _f32_scalar(np.asarray(y_scale, np.float32), "Y_scale")
    zy = _zp_scalar(zy_arr, dtype, "Y_zero_point")
    parts = []
    for i, (x, sx, zx) in enumerate(inputs):
        x = np.asarray(x)
        if x.dtype != dtype:
            raise OpError(f"input {i}: expected the type of Y_zero_point ({dtype}), got {x.dtype}")
        sx32 = _f32_scalar(np.asarray(sx), f"scale of input {i}")
        zx_int = _zp_scalar(np.asarray(zx), dtype, f"zero point of input {i}")
        if sx32 == sy and zx_int == zy:
            parts.append(x)
        else:
            parts.append(_quantize_f32(_dequantize_f32(x, sx32, zx_int), sy, zy, dtype))
    rank = parts[0].ndim
    if not -rank <= axis < rank:
        raise OpError(f"axis: expected a value in [{-rank}, {rank - 1}], got {axis}")
    try:
        return np.concatenate(parts, axis=axis)
    except ValueError as e:
        raise OpError(
            f"QLinearConcat: expected equal shapes except on axis {axis}, got {[p.shape for p in parts]}"
        ) from e


@register("QLinearConcat", MS_DOMAIN)
def qlinear_concat_op(
    ctx: OpContext, y_scale: np.ndarray, y_zero_point: np.ndarray, *rest: np.ndarray, axis: int | None = None
) -> np.ndarray:
    """com.microsoft QLinearConcat-1: inputs ``Y_scale, Y_zero_point, (X, X_scale, X_zero_point)...``."""
    del ctx  # unused
    if axis is None:
        raise OpError("axis: expected the (required) attribute, got none")
    if len(rest) % 3 or not rest:
        raise OpError(
            f"QLinearConcat: expected (tensor, scale, zero_point) triples after Y_zero_point, got {len(rest)} inputs"
        )
    if np.asarray(y_zero_point).dtype not in _EIGHT_BIT:
        raise OpError(f"Y_zero_point: expected int8 or uint8, got {np.asarray(y_zero_point).dtype}")
    triples = [(rest[i], rest[i + 1], rest[i + 2]) for i in range(0, len(rest), 3)]
    return qlinear_concat(y_scale, y_zero_point, triples, axis)


# --------------------------------------------------------------------------------------
# Pooling: QLinearGlobalAveragePool, QLinearAveragePool
# --------------------------------------------------------------------------------------


def qlinear_global_average_pool(
    x: np.ndarray,
    x_scale: np.ndarray | float,
    x_zero_point: np.ndarray | int,
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int,
    channels_last: bool = False,
) -> np.ndarray:
    """Mean over the spatial axes: eq. (6) with ``acc = Σ x − zx · HW`` (int32) and
    ``m = f32(sx / f32(sy · f32(HW)))``; zy added after rounding (MLAS).

    ``x`` is (N, C, *spatial), or (N, *spatial, C) with ``channels_last``; the spatial
    axes of the output have size 1.

    >>> x = np.array([[[[1, 2], [3, 5]]]], np.uint8)  # Σ = 11, HW = 4
    >>> qlinear_global_average_pool(x, np.float32(1.0), np.uint8(1), np.float32(0.5), np.uint8(3)).ravel()
    array([7], dtype=uint8)
    """
    x = np.asarray(x)
    if x.ndim < 3:
        raise OpError(f"X: expected rank >= 3, got shape {x.shape}")
    dtype = x.dtype
    spatial = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    image_size = math.prod(x.shape[i] for i in spatial)
    sx = _f32_scalar(np.asarray(x_scale, np.float32), "x_scale")
    sy = _f32_scalar(np.asarray(y_scale, np.float32), "y_scale")
    zx = _zp_scalar(x_zero_point, dtype, "x_zero_point")
    acc = x.astype(np.int64).sum(axis=spatial, keepdims=True) - zx * image_size
    m = np.float32(sx / np.float32(sy * np.float32(image_size)))
    return requantize(acc.astype(np.int32), m, _zp_scalar(y_zero_point, dtype, "y_zero_point"), dtype)


def _ort_pool_geometry(
    in_spatial: tuple[int, ...],
    kernel_shape: list[int],
    strides: list[int],
    pads: list[int],
    auto_pad: str,
    ceil_mode: bool,
) -> tuple[list[int], list[int]]:
    """ORT PoolAttributes: (pads, out_shape). SAME pads use ``ceil(D/s)``; no dilations."""
    n = len(in_spatial)
    pads = list(pads)
    out = []
    for i, (size, k, s) in enumerate(zip(in_spatial, kernel_shape, strides)):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            # negative when the kernel is smaller than the stride: ORT keeps the negative
            # pads (C++ division truncates toward zero), so a window starts -head into x
            need = (-(-size // s) - 1) * s + k - size
            head = int((need if auto_pad == "SAME_UPPER" else need + 1) / 2)
            pads[i], pads[i + n] = head, need - head
        elif auto_pad == "VALID":
            pads[i] = pads[i + n] = 0
        elif auto_pad not in ("NOTSET", ""):
            raise OpError(f"auto_pad: expected NOTSET, VALID, SAME_UPPER or SAME_LOWER, got {auto_pad!r}")
        span = size + pads[i] + pads[i + n] - k
        if span < 0:
            raise OpError(
                f"kernel_shape: expected at most the padded input size on spatial axis {i}, got {k}"
            )
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= size + pads[i]:
            o -= 1  # ORT (as PyTorch) drops a last window that starts in the end padding
        out.append(o)
    return pads, out


def qlinear_average_pool(
    x: np.ndarray,
    x_scale: np.ndarray | float,
    x_zero_point: np.ndarray | int | None,
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int | None,
    *,
    kernel_shape: list[int],
    strides: list[int] | None = None,
    pads: list[int] | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: bool = False,
    count_include_pad: bool = False,
    channels_last: bool = False,
) -> np.ndarray:
    """Average pooling on dequantized values, requantized with zy added before rounding
    (note (c) in the module docstring)."""
    x = np.asarray(x)
    if x.ndim < 3:
        raise OpError(f"X: expected rank >= 3, got shape {x.shape}")
    dtype = x.dtype
    if channels_last:
        x = np.moveaxis(x, -1, 1)
    n_sp = x.ndim - 2
    in_spatial = tuple(x.shape[2:])
    kernel_shape = [int(k) for k in kernel_shape]
    if len(kernel_shape) != n_sp:
        raise OpError(f"kernel_shape: expected {n_sp} values, got {len(kernel_shape)}")
    strides = [int(s) for s in strides] if strides else [1] * n_sp
    pads = [int(p) for p in pads] if pads else [0] * (2 * n_sp)
    pads, out_shape = _ort_pool_geometry(in_spatial, kernel_shape, strides, pads, auto_pad, bool(ceil_mode))
    sx = _f32_scalar(np.asarray(x_scale, np.float32), "x_scale")
    sy = _f32_scalar(np.asarray(y_scale, np.float32), "y_scale")
    zx = _zp_scalar(x_zero_point, dtype, "x_zero_point")
    zy = _zp_scalar(y_zero_point, dtype, "y_zero_point")

    if list(in_spatial) == kernel_shape and not any(pads):
        # ORT: "fallback_to_global" -> the integer QLinearGlobalAveragePool kernel.
        y = qlinear_global_average_pool(x, sx, zx, sy, zy)
    else:
        xf = _dequantize_f32(x, sx, zx)
        # Zero-pad so every window offset indexes inside the array; the added zeros are
        # float32 no-ops in the sum, so the order of the real terms is ORT's.
        pad_width = [(0, 0), (0, 0)]
        for i in range(n_sp):
            reach = (out_shape[i] - 1) * strides[i] + kernel_shape[i]
            pad_width.append((max(0, pads[i]), max(0, reach - pads[i] - in_spatial[i])))
            if pads[i] < 0:  # a negative head pad: the windows start inside x
                xf = xf[(slice(None),) * (2 + i) + (slice(-pads[i], None),)]
        xp = np.pad(xf, pad_width)
        total = np.zeros(x.shape[:2] + tuple(out_shape), np.float32)
        for offs in itertools.product(*(range(k) for k in kernel_shape)):
            window = (slice(o, o + (n - 1) * s + 1, s) for o, n, s in zip(offs, out_shape, strides))
            idx = (slice(None), slice(None), *window)
            total = np.add(total, xp[idx], dtype=np.float32)
        if count_include_pad:
            count = np.full(out_shape, math.prod(kernel_shape), np.int64)
        else:
            count = np.ones(out_shape, np.int64)
            for i in range(n_sp):
                start = np.arange(out_shape[i]) * strides[i] - pads[i]
                size = np.minimum(start + kernel_shape[i], in_spatial[i]) - np.maximum(start, 0)
                shape = [1] * n_sp
                shape[i] = out_shape[i]
                count = count * size.reshape(shape)
        avg = np.divide(total, count.astype(np.float32), dtype=np.float32)
        v = np.add(np.divide(avg, sy, dtype=np.float32), np.float32(zy), dtype=np.float32)
        y = _round_sat_f32(v, dtype)
    return np.moveaxis(y, 1, -1) if channels_last else y


@register("QLinearGlobalAveragePool", MS_DOMAIN)
def qlinear_global_average_pool_op(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    *,
    channels_last: int = 0,
) -> np.ndarray:
    """com.microsoft QLinearGlobalAveragePool-1."""
    del ctx  # unused
    _unary_check(x)
    return qlinear_global_average_pool(x, x_scale, x_zero_point, y_scale, y_zero_point, bool(channels_last))


@register("QLinearAveragePool", MS_DOMAIN)
def qlinear_average_pool_op(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    kernel_shape: list[int] | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    channels_last: int = 0,
    count_include_pad: int = 0,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """com.microsoft QLinearAveragePool-1."""
    del ctx  # unused
    _unary_check(x)
    if kernel_shape is None:
        raise OpError("kernel_shape: expected the (required) attribute, got none")
    return qlinear_average_pool(
        x,
        x_scale,
        x_zero_point,
        y_scale,
        y_zero_point,
        kernel_shape=kernel_shape,
        strides=strides,
        pads=pads,
        auto_pad=auto_pad,
        ceil_mode=bool(ceil_mode),
        count_include_pad=bool(count_include_pad),
        channels_last=bool(channels_last),
    )
