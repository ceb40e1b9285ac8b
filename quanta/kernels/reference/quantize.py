"""QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear (normative reference).

Plain functions usable from any Python code (:func:`quantize_linear`,
:func:`dequantize_linear`, :func:`dynamic_quantize_linear`); the registered ONNX ops
(opsets 10..28) are thin wrappers that map ONNX inputs/attributes onto them.

Math (docs/quantization-math.md):

- eq. (2), quantize:   ``q = saturate(round_half_even(x / scale) + zero_point)``
  (integer storage); for float storage (float8/float6/float4) ``q = cast(x / scale +
  zero_point)`` with the cast rounding to nearest even and, when ``saturate``, clamping to
  the largest finite value first (float8 only: float6/float4 have no Inf/NaN and always
  saturate).
- eq. (1), dequantize: ``x = (q - zero_point) * scale``.
- eq. (10), DynamicQuantizeLinear.

Granularity is given by the shape of ``scale`` (``zero_point`` has the same shape):
per-tensor (scalar, or any one-element array), per-axis (1-D of length ``x.shape[axis]``),
blocked (rank of ``x``; ``ceil(x.shape[axis] / block)`` along ``axis``, the last block may
be short; equal to ``x.shape`` elsewhere).

Float precision, as the ONNX text says (checked against the node tests):

- QuantizeLinear divides in the ``precision`` attribute's type if given, else in the type
  of ``scale`` (both operands are converted to it first). A float8e8m0 scale (MX) divides in
  float32 (every E8M0 value is exact there); an int32 scale divides in float64.
- DequantizeLinear converts ``q - zero_point`` (computed exactly in int64) and ``scale`` to
  float32, multiplies in float32 and casts to the output type. This is what ONNX Runtime and
  the ONNX reference both compute; for float16/bfloat16 outputs the product is rounded
  twice (float32, then the output type).
- NaN in ``x`` is not defined by the spec; integer storage gets ``qmin`` (the same rule as
  :func:`quanta.kernels.reference.requant.requantize`).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from onnx import helper as onnx_helper

from quanta.kernels.reference.registry import OpContext, OpError, register
from quanta.kernels.reference.requant import storage_range

__all__ = [
    "FLOAT_STORAGE",
    "INTEGER_STORAGE",
    "dequantize_linear",
    "dynamic_quantize_linear",
    "expand_param",
    "quantize_linear",
]

INTEGER_STORAGE: tuple[np.dtype, ...] = tuple(
    np.dtype(t)
    for t in (
        np.int8,
        np.uint8,
        np.int16,
        np.uint16,
        np.int32,
        ml_dtypes.int4,
        ml_dtypes.uint4,
        ml_dtypes.int2,
        ml_dtypes.uint2,
    )
)
# Float storage with Inf/NaN encodings, where ``saturate`` matters.
_FLOAT8_STORAGE: tuple[np.dtype, ...] = tuple(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
FLOAT_STORAGE: tuple[np.dtype, ...] = (
    *_FLOAT8_STORAGE,
    np.dtype(ml_dtypes.float4_e2m1fn),
    np.dtype(ml_dtypes.float6_e2m3fn),
    np.dtype(ml_dtypes.float6_e3m2fn),
)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_FLOAT_COMPUTE = (
    np.dtype(np.float32),
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float64),
)


def expand_param(
    param: np.ndarray,
    x_shape: tuple[int, ...],
    axis: int | None,
    block: int | None,
    what: str = "scale",
) -> np.ndarray:
    """Reshape a scale or zero point so that it broadcasts elementwise against ``x``.

    - per-tensor: any one-element ``param`` -> a 0-d array (``axis``/``block`` unused);
    - per-axis (``block`` is None or 0): 1-D of length ``x_shape[axis]`` -> shape
      ``(1, .., D_axis, .., 1)``;
    - blocked: ``param.shape == x_shape`` except ``ceil(D_axis / block)`` at ``axis`` ->
      each entry repeated ``block`` times along ``axis``, cut to ``D_axis``.

    Incorrect / Correct::

        expand_param(np.ones(3), (2, 4), axis=1, block=None)   # Incorrect: 3 scales, axis 1 has 4
        expand_param(np.ones(4), (2, 4), axis=1, block=None)   # Correct

    >>> expand_param(np.array([[1.0, 2.0], [3.0, 4.0]]), (2, 3), axis=1, block=2).tolist()
    [[1.0, 1.0, 2.0], [3.0, 3.0, 4.0]]
    """
    param = np.asarray(param)
    if param.size == 1:
        return param.reshape(())
    rank = len(x_shape)
    if axis is None:
        raise OpError(
            f"{what}: expected a scalar for per-tensor quantization (axis=None), got shape {param.shape}"
        )
    if not -rank <= axis < rank:
        raise OpError(
            f"axis: expected a value in [{-rank}, {rank - 1}] for an input of rank {rank}, got {axis}"
        )
    axis = axis % rank
    dim = x_shape[axis]
    if not block:
        if param.ndim != 1 or param.shape[0] != dim:
            raise OpError(
                f"{what}: expected a scalar or a 1-D tensor of length {dim} (axis {axis} of input shape "
                f"{tuple(x_shape)}), got shape {param.shape}"
            )
        shape = [1] * rank
        shape[axis] = dim
        return param.reshape(shape)
    if block < 0:
        raise OpError(f"block_size: expected a positive integer, got {block}")
    n_blocks = math.ceil(dim / block)
    expected = (*x_shape[:axis], n_blocks, *x_shape[axis + 1 :])
    if param.shape != expected:
        raise OpError(
            f"{what}: expected shape {expected} for blocked quantization (input shape {tuple(x_shape)}, "
            f"axis {axis}, block_size {block}), got shape {param.shape}"
        )
    return np.repeat(param, block, axis=axis).take(np.arange(dim), axis=axis)


def _division_dtype(scale: np.ndarray, precision: np.dtype | None) -> np.dtype:
    if precision is not None:
        return np.dtype(precision)
    if scale.dtype in _FLOAT_COMPUTE:
        return scale.dtype
    if scale.dtype == _E8M0:
        return np.dtype(np.float32)
    return np.dtype(np.float64)  # an int32 scale


def quantize_linear(
    x: np.ndarray,
    scale: np.ndarray | float,
    zero_point: np.ndarray | int | None = None,
    *,
    axis: int | None = None,
    block: int | None = None,
    dtype: np.dtype | type | None = None,
    saturate: bool = True,
    precision: np.dtype | type | None = None,
) -> np.ndarray:
    """``q = saturate(round_half_even(x / scale) + zero_point)`` (eq. (2)).

    ``dtype`` is the storage type; it defaults to ``zero_point``'s dtype when that is a
    NumPy array or scalar, else uint8. ``axis=None`` means per-tensor; ``axis=k`` per-axis, or blocked with
    ``block``. The division runs in ``precision`` if given, else in ``scale``'s type.

    Ties round half to even for both signs (x.5 golden vectors):

    >>> quantize_linear(np.array([2.5, 3.5, -2.5, -3.5], np.float32), np.float32(1), 10, dtype=np.int8)
    array([12, 14,  8,  6], dtype=int8)
    >>> quantize_linear(np.array([300.0, -1.0], np.float32), np.float32(1), 3, dtype=np.uint8)
    array([255,   2], dtype=uint8)
    """
    x = np.asarray(x)
    scale = np.asarray(scale, dtype=np.float32) if isinstance(scale, float | int) else np.asarray(scale)
    if dtype is None:
        dtype = zero_point.dtype if isinstance(zero_point, np.ndarray | np.generic) else np.uint8
    dtype = np.dtype(dtype)
    work = _division_dtype(scale, None if precision is None else np.dtype(precision))
    s = expand_param(scale, x.shape, axis, block, "scale").astype(work)
    q = np.asarray(np.divide(x.astype(work), s, dtype=work))
    if dtype in INTEGER_STORAGE:
        qmin, qmax = storage_range(dtype)
        zp = (
            np.int64(0)
            if zero_point is None
            else expand_param(np.asarray(zero_point), x.shape, axis, block, "zero_point")
        )
        zp = np.asarray(zp).astype(np.int64)
        r = np.rint(q, out=q)  # round half to even, in the division's precision
        # Clamp in float first (monotone, integer bounds: same as saturating afterwards),
        # so Inf and huge values never reach the integer cast; NaN -> qmin (fmax takes
        # the bound where r is NaN). In place: a weight of millions of entries.
        lo = (qmin - zp).astype(np.float64)
        hi = (qmax - zp).astype(np.float64)
        r64 = r.astype(np.float64)
        np.fmax(r64, lo, out=r64)
        np.minimum(r64, hi, out=r64)
        out = r64.astype(np.int64)
        out += zp
        res = out.astype(dtype)
        return res if res.ndim else res[()]
    if dtype in FLOAT_STORAGE:
        q = q if q.ndim else q[()]
        v = q.astype(np.float32) if q.dtype != np.float64 else q
        if zero_point is not None:
            zp = expand_param(np.asarray(zero_point), x.shape, axis, block, "zero_point")
            v = v + np.asarray(zp).astype(v.dtype)
        if saturate and dtype in _FLOAT8_STORAGE:
            fmax = float(ml_dtypes.finfo(dtype).max)
            v = np.clip(v, -fmax, fmax)  # NaN stays NaN
        return v.astype(dtype)  # ml_dtypes: round to nearest even
    raise OpError(f"quantize_linear: expected an integer or float8/float6/float4 storage type, got {dtype}")


def dequantize_linear(
    x: np.ndarray,
    scale: np.ndarray | float,
    zero_point: np.ndarray | int | None = None,
    *,
    axis: int | None = None,
    block: int | None = None,
    dtype: np.dtype | type | None = None,
) -> np.ndarray:
    """``y = (x - zero_point) * scale`` (eq. (1)), product in float32, cast to ``dtype``.

    ``dtype`` defaults to ``scale``'s type (float32 for an E8M0 scale).

    >>> dequantize_linear(np.array([0, 3, 255], np.uint8), np.float32(0.5), 3)
    array([ -1.5,   0. , 126. ], dtype=float32)
    """
    x = np.asarray(x)
    scale = np.asarray(scale, dtype=np.float32) if isinstance(scale, float | int) else np.asarray(scale)
    if dtype is None:
        dtype = scale.dtype if scale.dtype in _FLOAT_COMPUTE else np.float32
    s = expand_param(scale, x.shape, axis, block, "scale").astype(np.float32)
    if x.dtype in INTEGER_STORAGE:
        d = x.astype(np.int64)
        if zero_point is not None:
            zp = expand_param(np.asarray(zero_point), x.shape, axis, block, "zero_point")
            d = d - np.asarray(zp).astype(np.int64)  # exact in int64
        d32 = d.astype(np.float32)
    elif x.dtype in FLOAT_STORAGE:
        d32 = x.astype(np.float32)
        if zero_point is not None:
            zp = expand_param(np.asarray(zero_point), x.shape, axis, block, "zero_point")
            d32 = d32 - np.asarray(zp).astype(np.float32)
    else:
        raise OpError(f"dequantize_linear: expected an integer or float8/float6/float4 input, got {x.dtype}")
    return np.multiply(d32, s, dtype=np.float32).astype(dtype)


def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DynamicQuantizeLinear, eq. (10): ``(y uint8, y_scale f32 0-d, y_zero_point u8 0-d)``.

    All in float32::

        max' = max(0, max(x)),  min' = min(0, min(x))        range widened to include 0
        y_scale = (max' - min') / 255,   or 1 / 255 when max' == min'  (all-zero input)
        y_zero_point = round_half_even(clamp(0 - min' / y_scale, 0, 255))
        y = saturate(round_half_even(x / y_scale) + y_zero_point)

    The all-zero case follows the ONNX reference implementation (``1/255``); ONNX Runtime
    returns ``y_scale = 1`` there (docs, "Where ONNX Runtime and the ONNX reference
    differ"). ``y`` and ``y_zero_point`` are 0 either way.

    >>> y, s, z = dynamic_quantize_linear(np.array([-1.0, 254.0], np.float32))
    >>> y.tolist(), float(s), int(z)
    ([0, 255], 1.0, 1)
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise OpError(f"DynamicQuantizeLinear: expected a float32 input, got {x.dtype}")
    qmin, qmax = 0, 255
    if x.size:
        hi = np.float32(max(np.float32(0), np.max(x)))
        lo = np.float32(min(np.float32(0), np.min(x)))
    else:
        hi = lo = np.float32(0)
    width = np.float32(1.0) if hi == lo else np.float32(hi - lo)
    y_scale = np.float32(width / np.float32(qmax - qmin))
    initial = np.float32(np.float32(qmin) - np.float32(lo / y_scale))
    zp = np.rint(np.float32(min(np.float32(qmax), max(np.float32(qmin), initial))))
    y = quantize_linear(x, y_scale, np.uint8(zp), dtype=np.uint8)
    return y, np.array(y_scale, dtype=np.float32), np.array(zp, dtype=np.uint8)


# --------------------------------------------------------------------------------------
# Registered ONNX ops
# --------------------------------------------------------------------------------------


def _onnx_dtype(code: int, what: str) -> np.dtype:
    try:
        return np.dtype(onnx_helper.tensor_dtype_to_np_dtype(int(code)))
    except (KeyError, ValueError) as e:
        raise OpError(f"{what}: expected an ONNX TensorProto data type, got {code}") from e


def _granularity_args(op: str, ctx: OpContext, x: np.ndarray, scale: np.ndarray, axis: int, block: int):
    if ctx.opset < 13 and scale.size != 1:
        raise OpError(
            f"{op}-{ctx.opset}: expected a scalar scale (per-axis needs opset 13), got shape {scale.shape}"
        )
    if scale.size == 1:
        return None, None
    if x.ndim == 0:
        raise OpError(f"{op}: expected a scalar scale for a scalar input, got shape {scale.shape}")
    return axis, (block or None)


@register("QuantizeLinear")
def quantize_linear_op(
    ctx: OpContext,
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    saturate: int = 1,
    precision: int = 0,
) -> np.ndarray:
    """ONNX QuantizeLinear 10..28: output type from ``y_zero_point``, else ``output_dtype``, else uint8."""
    if y_zero_point is not None:
        dtype = y_zero_point.dtype
        if output_dtype and _onnx_dtype(output_dtype, "output_dtype") != dtype:
            raise OpError(
                f"output_dtype: expected the type of y_zero_point ({dtype}), got "
                f"{_onnx_dtype(output_dtype, 'output_dtype')}"
            )
        if y_zero_point.shape != y_scale.shape and y_zero_point.size != y_scale.size:
            raise OpError(
                f"y_zero_point: expected the shape of y_scale {y_scale.shape}, got {y_zero_point.shape}"
            )
    elif output_dtype:
        dtype = _onnx_dtype(output_dtype, "output_dtype")
    else:
        dtype = np.dtype(np.uint8)
    if dtype == np.int32 or (dtype not in INTEGER_STORAGE and dtype not in FLOAT_STORAGE):
        raise OpError(f"QuantizeLinear: expected a quantized output type, got {dtype}")
    ax, block = _granularity_args("QuantizeLinear", ctx, x, y_scale, axis, block_size)
    prec = _onnx_dtype(precision, "precision") if precision else None
    return quantize_linear(
        x, y_scale, y_zero_point, axis=ax, block=block, dtype=dtype, saturate=bool(saturate), precision=prec
    )


@register("DequantizeLinear")
def dequantize_linear_op(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
) -> np.ndarray:
    """ONNX DequantizeLinear 10..28: output type ``output_dtype``, else the type of ``x_scale``."""
    if x_zero_point is not None and x_zero_point.dtype != x.dtype:
        raise OpError(f"x_zero_point: expected the type of x ({x.dtype}), got {x_zero_point.dtype}")
    if x.dtype == np.int32 and x_zero_point is not None and np.any(x_zero_point != 0):
        raise OpError("x_zero_point: expected 0 (or none) for an int32 input, got a non-zero value")
    dtype = _onnx_dtype(output_dtype, "output_dtype") if output_dtype else None
    ax, block = _granularity_args("DequantizeLinear", ctx, x, x_scale, axis, block_size)
    return dequantize_linear(x, x_scale, x_zero_point, axis=ax, block=block, dtype=dtype)


@register("DynamicQuantizeLinear")
def dynamic_quantize_linear_op(ctx: OpContext, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear-11 (see :func:`dynamic_quantize_linear`)."""
    del ctx  # unused
    return dynamic_quantize_linear(x)
