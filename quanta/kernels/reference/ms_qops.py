"""com.microsoft QLinearSoftmax, QLinearWhere, QuantizeLinear, DequantizeLinear, as ONNX
Runtime's CPU kernels compute them (normative reference).

These ops have no ONNX spec; their definition is ONNX Runtime's CPU implementation
(contrib_ops/cpu/quantization/qlinear_softmax.cc, qlinear_where.cc, quantize_ops.cc).

QLinearSoftmax (ORT 1.32's CPU kernel, contrib_ops ``QlinearSoftmaxCPU<T>``: a 256-entry
float32 table of exponentials, a float32 row sum in index order, one float64 division per
element)::

    D        = x.shape[axis]            (opset >= 13)   or   Π x.shape[axis:]   (opset < 13,
                                                            the input coerced to [N, D])
    s        = max(0, f32(logf(f32(FLT_MAX / D))) − 5) / sx                    float64    (1)
    T[j]     = f32(exp((j − 255 + s) · sx)),  j = 0..255                      float64    (2)
    d        = max(x_row) − x       (0..255: T[255 − d] = exp(sx·(x − max)) · e^(s·sx))
    sum      = Σ T[255 − d]   in float32, in index order                                 (3)
    Ys       = f32(floor(f32(1 / sy)))                                                   (4)
    y        = sat(rne(f64(T[255 − d]) · Ys / f64(sum)) + zy)             float64        (5)

- ``x_zero_point`` is not read: softmax is shift invariant and only ``max − x`` is used.
- (1) makes the largest term ``e^(s·sx) = FLT_MAX / (D · e^5)`` so the sum cannot
  overflow. The logarithm is float32's (``logf``); ``f32(log(q))`` here equals glibc's
  logf for every D below 60,594 (22 of the D up to 2^20 differ by one ulp, the first at
  60,594: not modelled). With float64's log unrounded the table differs by one ulp in
  some entries, which moved a code on one of 10^5 values (lore_proc's first
  QLinearSoftmax, 3 LSB at the model's output).
- (5) rounds the float64 quotient half to even, then adds ``zy`` (so an odd ``zy`` does
  not change which way a tie goes), then saturates to the storage type.
- The output scale is ``1 / Ys``, not ``sy``, whenever ``1 / sy`` is not an integer
  (ORT's quantizer always picks ``sy = 1/256``, where the two agree).
- vs ORT 1.32 on x86-64: bit for bit (uint8 / int8, odd zero points, sy ≠ 1/256, D from 1
  to 300; ``test_qlinear_softmax_is_onnxruntime_bit_for_bit``). ORT's wheel runs this
  contrib kernel, not MLAS's ``MlasComputeQSoftmax`` (whose AVX2 / AVX-512 kernels sum a
  row in SIMD lanes and multiply by a float32 reciprocal): the library holds no gather
  instruction, and its QLinearSoftmax loop is scalar (``addss`` over the row, then
  ``mulsd`` / ``divsd`` / ``nearbyint``).

QLinearWhere::

    z = where(condition, q_z(dq_x(x)), q_z(dq_y(y)))     numpy broadcasting of all three

with ``dq(v) = f32(scale · f32(v − zero_point))`` and ``q_z`` eq. (2) with a float32
division (``MlasQuantizeLinear``), evaluated by ORT once per code into 256-entry tables. When
an input's (scale, zero point) equal z's, ORT copies the codes instead; ``q_z(dq_x(v)) == v``
holds then anyway (``|v − zx| <= 255``: the two float32 roundings move it by < 2^-15).

QuantizeLinear / DequantizeLinear (com.microsoft, version 1): ORT runs its ONNX kernels, so
these are :func:`quantize.quantize_linear` / :func:`quantize.dequantize_linear` with ORT's
contrib type lists: x float32 or float16 with a scale of the same type (the division is
float32 for float16 too, ORT converts both operands); storage int8, uint8, int16, uint16,
int4, uint4 (and int32 for DequantizeLinear, whose zero point is subtracted like any
other); ``axis`` (default 1) applies when the scale is not a scalar. The output of
DequantizeLinear has the scale's type.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from quanta.kernels.reference.quantize import dequantize_linear, quantize_linear
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, OpError, register
from quanta.kernels.reference.requant import storage_range

__all__ = [
    "ms_dequantize_linear",
    "ms_quantize_linear",
    "qlinear_softmax",
    "qlinear_where",
    "softmax_exp_table",
]

F32 = np.float32
_U8, _I8 = np.dtype(np.uint8), np.dtype(np.int8)
_EIGHT_BIT = (_U8, _I8)
_F32_DT = np.dtype(np.float32)
#: scale types a Q/DQ of a half-precision model has (opset 19 on): the fused ops take them
#: converted to float32, exactly
HALF_SCALE_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def widen_half_scale(v: np.ndarray) -> np.ndarray:
    """A float16 / bfloat16 scale (a half-precision model's Q/DQ, opset 19 on) as the
    float32 the fused ops compute in, exactly; any other array unchanged."""
    return v.astype(np.float32) if v.dtype in HALF_SCALE_DTYPES else v


_FLT_MAX = F32(np.finfo(np.float32).max)


def _per_tensor(v: np.ndarray | float | int, what: str, dtype: np.dtype | None = None) -> np.ndarray:
    """A per-tensor parameter as a 0-d array (ORT: rank 0 or shape [1])."""
    v = np.asarray(v)
    if not (v.ndim == 0 or (v.ndim == 1 and v.shape[0] == 1)):
        raise OpError(
            f"{what}: expected a scalar or a 1-D tensor of size 1 (per tensor), got shape {v.shape}"
        )
    if dtype == _F32_DT:
        v = widen_half_scale(v)
    if dtype is not None and v.dtype != dtype:
        raise OpError(f"{what}: expected {dtype}, got {v.dtype}")
    return v.reshape(())


# --------------------------------------------------------------------------------------
# QLinearSoftmax
# --------------------------------------------------------------------------------------


def softmax_exp_table(x_scale: float | np.ndarray, reduce_len: int) -> np.ndarray:
    """ORT's exponential table (1), (2): ``T[j] = f32(exp((j − 255 + s) · sx))``.

    Entry 255 belongs to the row maximum (``d = 0``) and is the largest:

    >>> t = softmax_exp_table(F32(0.5), 10)
    >>> bool(t[255] == t.max()), float(t[254] / t[255]) == float(F32(math.exp(-0.5)))
    (True, True)
    """
    sx = float(F32(x_scale))
    if reduce_len < 1:
        raise OpError(f"QLinearSoftmax: expected a reduced dimension of size >= 1, got {reduce_len}")
    # FLT_MAX / D divides in float32 (C++ float / size_t), the log is logf (float32, then
    # widened), the rest is double.
    log_q = float(F32(math.log(float(_FLT_MAX / F32(reduce_len)))))
    shift = max(0.0, log_q - 5.0) / sx
    j = np.arange(256, dtype=np.float64)
    return np.exp((j - 255.0 + shift) * sx).astype(F32)


def qlinear_softmax(
    x: np.ndarray,
    x_scale: np.ndarray | float,
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int | None = None,
    *,
    axis: int = -1,
    opset: int = 13,
) -> np.ndarray:
    """Quantized softmax of ``x`` (uint8 or int8) along ``axis`` by ORT's table (module
    docstring); ``opset`` is the ai.onnx opset of the Softmax it replaces (< 13: the input is
    coerced to 2-D at ``axis``). The output has ``x``'s type and shape.

    Two equal inputs with ``sy = 1/256`` share 256/2: 128 each; rounding is half to even:

    >>> qlinear_softmax(np.array([7, 7], np.uint8), F32(0.1), F32(1 / 256))
    array([128, 128], dtype=uint8)
    """
    x = np.asarray(x)
    if x.dtype not in _EIGHT_BIT:
        raise OpError(f"X: expected uint8 or int8, got {x.dtype}")
    if x.ndim == 0:
        raise OpError("X: expected a tensor of rank >= 1, got a scalar")
    rank = x.ndim
    if not -rank <= axis < rank:
        raise OpError(f"axis: expected a value in [{-rank}, {rank - 1}], got {axis}")
    axis %= rank
    sx = _per_tensor(np.asarray(x_scale, F32) if isinstance(x_scale, float) else x_scale, "X_scale", _F32_DT)
    sy = _per_tensor(np.asarray(y_scale, F32) if isinstance(y_scale, float) else y_scale, "y_scale", _F32_DT)
    zy = 0 if y_zero_point is None else int(_per_tensor(y_zero_point, "y_zero_point", x.dtype))
    if x.size == 0:
        return x.copy()

    if opset < 13:
        rows = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
    else:
        rows = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
    table = softmax_exp_table(sx, rows.shape[1])
    d = rows.max(axis=1, keepdims=True).astype(np.int64) - rows.astype(np.int64)
    vt = table[255 - d]
    vsum = np.cumsum(vt, axis=1, dtype=F32)[:, -1:]  # (3): cumsum accumulates in order
    ys = F32(np.floor(np.divide(F32(1.0), sy, dtype=F32)))  # (4)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = (vt.astype(np.float64) * float(ys)) / vsum.astype(np.float64)  # (5), float64
    qmin, qmax = storage_range(x.dtype)
    q = np.clip(np.rint(v) + zy, qmin, qmax).astype(x.dtype)  # rint: half to even; + zy; saturate

    if opset < 13:
        return q.reshape(x.shape)
    moved = np.moveaxis(x, axis, -1).shape
    return np.moveaxis(q.reshape(moved), -1, axis)


@register("QLinearSoftmax", MS_DOMAIN)
def qlinear_softmax_op(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    y_scale: np.ndarray | None = None,
    y_zero_point: np.ndarray | None = None,
    *,
    opset: int | None = None,
    axis: int = -1,
) -> np.ndarray:
    """com.microsoft QLinearSoftmax-1: ``opset`` is required; ``axis`` defaults to -1 for
    every ``opset`` (the contrib schema's default, which ORT's kernel reads: its own
    opset-dependent fallback to Softmax-11's default 1 is never reached)."""
    del ctx  # unused
    if opset is None:
        raise OpError("opset: expected the attribute (the opset of the replaced Softmax), got none")
    if y_scale is None:
        raise OpError("y_scale: expected an input, got none")
    if x_zero_point is not None:
        _per_tensor(x_zero_point, "x_zero_point", x.dtype)  # checked, not used (shift invariance)
    return qlinear_softmax(x, x_scale, y_scale, y_zero_point, axis=axis, opset=opset)


# --------------------------------------------------------------------------------------
# QLinearWhere
# --------------------------------------------------------------------------------------


def _requantize_codes(
    v: np.ndarray, sv: np.ndarray, zv: np.ndarray, sz: np.ndarray, zz: np.ndarray
) -> np.ndarray:
    """``q_z(dq_v(v))``: ORT's identity lookup table, evaluated per element."""
    return quantize_linear(dequantize_linear(v, sv, zv), sz, zz, dtype=v.dtype)


def qlinear_where(
    condition: np.ndarray,
    x: np.ndarray,
    x_scale: np.ndarray | float,
    x_zero_point: np.ndarray | int,
    y: np.ndarray,
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int,
    z_scale: np.ndarray | float,
    z_zero_point: np.ndarray | int,
) -> np.ndarray:
    """``z = where(condition, q_z(dq_x(x)), q_z(dq_y(y)))`` with numpy broadcasting.

    >>> c = np.array([True, False]); x = np.array([10, 10], np.uint8); y = np.array([4, 3], np.uint8)
    >>> qlinear_where(c, x, F32(0.5), np.uint8(2), y, F32(1.0), np.uint8(0), F32(0.25), np.uint8(1))
    array([17, 13], dtype=uint8)
    """
    condition, x, y = np.asarray(condition), np.asarray(x), np.asarray(y)
    if condition.dtype != np.bool_:
        raise OpError(f"condition: expected bool, got {condition.dtype}")
    if x.dtype not in _EIGHT_BIT:
        raise OpError(f"X: expected uint8 or int8, got {x.dtype}")
    if y.dtype != x.dtype:
        raise OpError(f"Y: expected the type of X ({x.dtype}), got {y.dtype}")
    params = []
    for name, s, z in (
        ("x", x_scale, x_zero_point),
        ("y", y_scale, y_zero_point),
        ("z", z_scale, z_zero_point),
    ):
        s = np.asarray(s, F32) if isinstance(s, float) else s
        params.append(
            (_per_tensor(s, f"{name}_scale", _F32_DT), _per_tensor(z, f"{name}_zero_point", x.dtype))
        )
    try:
        np.broadcast_shapes(condition.shape, x.shape, y.shape)
    except ValueError as e:
        raise OpError(
            f"QLinearWhere: expected broadcastable shapes, got {condition.shape}, {x.shape} and {y.shape}"
        ) from e
    (sx, zx), (sy, zy), (sz, zz) = params
    return np.where(condition, _requantize_codes(x, sx, zx, sz, zz), _requantize_codes(y, sy, zy, sz, zz))


@register("QLinearWhere", MS_DOMAIN)
def qlinear_where_op(
    ctx: OpContext,
    condition: np.ndarray,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    y: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    z_scale: np.ndarray,
    z_zero_point: np.ndarray,
) -> np.ndarray:
    """com.microsoft QLinearWhere-1 (all nine inputs required)."""
    del ctx  # unused
    return qlinear_where(condition, x, x_scale, x_zero_point, y, y_scale, y_zero_point, z_scale, z_zero_point)


# --------------------------------------------------------------------------------------
# com.microsoft QuantizeLinear / DequantizeLinear
# --------------------------------------------------------------------------------------

_Q_STORAGE = tuple(
    np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, ml_dtypes.int4, ml_dtypes.uint4)
)
_DQ_STORAGE = (*_Q_STORAGE, np.dtype(np.int32))
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def _axis_or_none(scale: np.ndarray, axis: int) -> int | None:
    return None if scale.ndim == 0 or (scale.ndim == 1 and scale.shape[0] == 1) else axis


def _zero_point_fits(zero_point: np.ndarray, scale: np.ndarray) -> bool:
    """The zero point has the scale's shape, or both are one value (a scalar or a
    1-element vector each: ONNX Runtime's contrib kernels read either as per tensor, and
    AMD Quark writes a [1] scale beside a scalar zero point)."""
    return np.shape(zero_point) == scale.shape or (
        np.size(zero_point) == 1 and scale.size == 1 and scale.ndim <= 1
    )


def ms_quantize_linear(
    x: np.ndarray, y_scale: np.ndarray, y_zero_point: np.ndarray | None = None, *, axis: int = 1
) -> np.ndarray:
    """com.microsoft QuantizeLinear: eq. (2) with a float32 division for float32 and float16
    ``x``; storage is the type of ``y_zero_point`` (uint8 when omitted).

    >>> ms_quantize_linear(np.array([0.25, -0.25], np.float16), np.float16(0.5), np.int16(-7))
    array([-7, -7], dtype=int16)
    """
    x, y_scale = np.asarray(x), np.asarray(y_scale)
    if x.dtype not in _FLOATS:
        raise OpError(f"x: expected float32 or float16, got {x.dtype}")
    if y_scale.dtype != x.dtype:
        raise OpError(f"y_scale: expected the type of x ({x.dtype}), got {y_scale.dtype}")
    dtype = np.dtype(np.uint8) if y_zero_point is None else np.asarray(y_zero_point).dtype
    if dtype not in _Q_STORAGE:
        raise OpError(f"y_zero_point: expected one of {', '.join(map(str, _Q_STORAGE))}, got {dtype}")
    if y_zero_point is not None and not _zero_point_fits(y_zero_point, y_scale):
        raise OpError(
            f"y_zero_point: expected the shape of y_scale {y_scale.shape}, got {np.shape(y_zero_point)}"
        )
    return quantize_linear(
        x, y_scale, y_zero_point, axis=_axis_or_none(y_scale, axis), dtype=dtype, precision=np.float32
    )


def ms_dequantize_linear(
    x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None = None, *, axis: int = 1
) -> np.ndarray:
    """com.microsoft DequantizeLinear: eq. (1), product in float32, output in the scale's type.

    >>> ms_dequantize_linear(np.array([5, -5], np.int32), np.float32(0.5), np.int32(1))
    array([ 2., -3.], dtype=float32)
    """
    x, x_scale = np.asarray(x), np.asarray(x_scale)
    if x.dtype not in _DQ_STORAGE:
        raise OpError(f"x: expected one of {', '.join(map(str, _DQ_STORAGE))}, got {x.dtype}")
    if x_scale.dtype not in _FLOATS:
        raise OpError(f"x_scale: expected float32 or float16, got {x_scale.dtype}")
    if x_zero_point is not None:
        if np.asarray(x_zero_point).dtype != x.dtype:
            raise OpError(
                f"x_zero_point: expected the type of x ({x.dtype}), got {np.asarray(x_zero_point).dtype}"
            )
        if not _zero_point_fits(x_zero_point, x_scale):
            raise OpError(
                f"x_zero_point: expected the shape of x_scale {x_scale.shape}, got {np.shape(x_zero_point)}"
            )
    return dequantize_linear(x, x_scale, x_zero_point, axis=_axis_or_none(x_scale, axis), dtype=x_scale.dtype)


@register("QuantizeLinear", MS_DOMAIN)
def ms_quantize_linear_op(
    ctx: OpContext,
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
) -> np.ndarray:
    """com.microsoft QuantizeLinear-1 (see :func:`ms_quantize_linear`)."""
    del ctx  # unused
    return ms_quantize_linear(x, y_scale, y_zero_point, axis=axis)


@register("DequantizeLinear", MS_DOMAIN)
def ms_dequantize_linear_op(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
) -> np.ndarray:
    """com.microsoft DequantizeLinear-1 (see :func:`ms_dequantize_linear`)."""
    del ctx  # unused
    return ms_dequantize_linear(x, x_scale, x_zero_point, axis=axis)
