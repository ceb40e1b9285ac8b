"""Range -> (scale, zero point): the ONLY place quanta computes quantization parameters.

QDQ insertion, dynamic quantization and every other consumer ask this module (the MSE
observer in calibrate/ only *models* a grid of ``qmax - qmin`` steps to choose a range;
it does not produce parameters). The formulas are docs/design.md's contract and follow ONNX
Runtime's quantization tool (``onnxruntime.quantization.quant_utils.compute_scale_zp``)
bit for bit, so the same calibrated range gives the same scale and zero point in both
tools (tested).

Quantized range [qmin, qmax] of the storage type (:func:`quant_range`)::

    plain:          the storage's full range            i8 [-128, 127]   u8 [0, 255]
    symmetric:      signed storage drops its lowest     i8 [-127, 127]   u8 [0, 255]
                    value, so -absmax maps to -qmax     (ORT/TensorRT "restricted range")
    reduce_range:   ORT's 7-bit table (VPMADDUBSW       i8 [-64, 64]     u8 [0, 127]
                    pair sums cannot saturate)          i16 [-16384, 16384], u16 [0, 32767]
                                                        i4 [-4, 3], u4 [0, 7]

Parameters (docs/calibration.md eqs. (1)-(5)); rmin, rmax are first rounded to the
expressed type (float32), the arithmetic is float64 as in ORT, the scale is then stored
in the expressed type::

    (1)  rmin' = min(rmin, 0),  rmax' = max(rmax, 0)                  range includes 0
    (2)  symmetric:  rmax' = max(|rmin'|, |rmax'|),  rmin' = -rmax'
    (3)  scale = (rmax' - rmin') / (qmax - qmin)                       float64, then stored
    (4)  asymmetric: zero_point = clamp(round_half_even(qmin - rmin' / scale), qmin, qmax)
         symmetric:  zero_point = round_half_even((qmin + qmax) / 2)   0 for signed, 128 for u8
    (5)  scale < smallest normal of the expressed type (zero range):  scale = 1, zero_point = 0
         (float16: smallest subnormal, as ORT: x is divided by the scale in float32)

In (4) ``rmin'/scale`` uses the float64 scale of (3), before it is rounded to float32:
that is what ORT does. Signed symmetric gives ``scale = absmax / qmax`` (``absmax/127``
for int8); unsigned symmetric gives ``scale = 2·absmax / 255`` and zero point 128, which
is docs/design.md's ``max(|min|, |max|) / ((qmax - qmin) / 2)`` for both.

Bias (int32, zero point 0, eq. (6))::

    (6)  sb = sx · sw          float32 product, per output channel when w is per-channel

A bias whose float value exceeds what int32 holds at scale sb (``|b| / sb > 2^31 - 1``)
would saturate. ORT's QDQ quantizer then *raises the weight scale* of that channel
(``_adjust_weight_scale_for_int32_bias``) so that sb covers the bias; quanta does the
same in :func:`adjust_weight_scale_for_bias` (eq. (7)), which must run before the weight
is quantized. See that function for where quanta differs.
"""

from __future__ import annotations

from types import EllipsisType

import ml_dtypes
import numpy as np

from quanta.ir.types import F32, I32, CalibratedType, FloatType, IntType, QuantType

__all__ = [
    "adjust_weight_scale_for_bias",
    "bias_params",
    "compute_scale_zero_point",
    "params_from_range",
    "quant_range",
    "quantize_bias",
]

# ORT's ONNX_INT_TYPE_REDUCED_RANGE, keyed by the printed storage name. The 8-bit rows
# come from the u8 x s8 VPMADDUBSW instruction, which adds two u8*s8 products into an
# int16 and saturates: 2 * 255 * 64 = 32640 and 2 * 127 * 127 = 32258 stay below 32767.
_REDUCED_RANGE: dict[str, tuple[int, int]] = {
    "u8": (0, 127),
    "i8": (-64, 64),
    "u16": (0, 32767),
    "i16": (-16384, 16384),
    "u4": (0, 7),
    "i4": (-4, 3),
}


def quant_range(storage: IntType, *, symmetric: bool, reduce_range: bool = False) -> tuple[int, int]:
    """The integer range [qmin, qmax] a quantizer targets (table in the module docstring).

    ``reduce_range`` wins over ``symmetric`` (as in ORT's ``get_qmin_qmax_for_qType``).

    >>> from quanta.ir.types import I8, U8
    >>> quant_range(I8, symmetric=True), quant_range(U8, symmetric=True)
    ((-127, 127), (0, 255))
    >>> quant_range(I8, symmetric=False, reduce_range=True)
    (-64, 64)
    """
    if not isinstance(storage, IntType) or storage.bits < 2:
        raise TypeError(f"quant_range: expected an integer storage type (i8, u8, ...), got {storage}")
    if reduce_range:
        if str(storage) not in _REDUCED_RANGE:
            raise ValueError(
                f"quant_range: reduce_range is defined for {sorted(_REDUCED_RANGE)}, got {storage}"
            )
        return _REDUCED_RANGE[str(storage)]
    if symmetric and storage.signed:
        return -storage.qmax, storage.qmax
    return storage.qmin, storage.qmax


def compute_scale_zero_point(
    rmin: np.ndarray | float,
    rmax: np.ndarray | float,
    storage: IntType,
    *,
    symmetric: bool,
    reduce_range: bool = False,
    expressed: FloatType = F32,
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised eqs. (1)-(5): ``(scale, zero_point)`` arrays of the broadcast shape of
    ``rmin``/``rmax``. ``scale`` holds values of the expressed dtype (as that dtype),
    ``zero_point`` is int64.

    Raises ``ValueError`` if a bound is NaN or infinite: such a tensor has no quantized
    form (calibrate.is_degenerate reports it so the caller keeps it float).

    Golden values (hand-checkable)::

        [-1, 3] -> u8:  scale = 4/255,  zero_point = round(0 + 1/(4/255)) = round(63.75) = 64
        [-1, 3] -> i8 symmetric: scale = 3/127, zero_point = 0
        [2, 2]  -> range widened to [0, 2]: scale = 2/255, zero_point = 0
        [0, 0]  -> scale = 1, zero_point = 0

    >>> from quanta.ir.types import I8, U8
    >>> s, z = compute_scale_zero_point([-1.0, 2.0, 0.0], [3.0, 2.0, 0.0], U8, symmetric=False)
    >>> s.tolist() == [np.float32(4 / 255), np.float32(2 / 255), 1.0], z.tolist()
    (True, [64, 0, 0])
    >>> s, z = compute_scale_zero_point(-1.0, 3.0, I8, symmetric=True)
    >>> s == np.float32(3 / 127), int(z)
    (np.True_, 0)
    """
    qmin, qmax = quant_range(storage, symmetric=symmetric, reduce_range=reduce_range)
    dtype = expressed.numpy
    lo = np.asarray(rmin, dtype=np.float64).astype(dtype)  # ORT takes the range in the tensor dtype
    hi = np.asarray(rmax, dtype=np.float64).astype(dtype)
    lo, hi = np.broadcast_arrays(lo, hi)
    lo64, hi64 = lo.astype(np.float64), hi.astype(np.float64)
    if not (np.isfinite(lo64).all() and np.isfinite(hi64).all()):
        raise ValueError(
            f"quantization parameters: range [{lo64.min()}, {hi64.max()}] is not finite; "
            "such a tensor cannot be quantized (keep it float; see calibrate.is_degenerate)"
        )
    if (lo64 > hi64).any():
        raise ValueError("quantization parameters: min > max")
    lo64 = np.minimum(lo64, 0.0)  # (1)
    hi64 = np.maximum(hi64, 0.0)
    if symmetric:  # (2)
        hi64 = np.maximum(np.abs(lo64), np.abs(hi64))
        lo64 = -hi64
    scale64 = (hi64 - lo64) / float(qmax - qmin)  # (3)
    fi = ml_dtypes.finfo(dtype)
    # ORT: float16 may keep a subnormal scale (x is divided in float32); others need a normal one.
    min_scale = float(fi.smallest_subnormal) if dtype == np.float16 else float(fi.tiny)
    stored = scale64.astype(dtype)
    too_small = (stored.astype(np.float64) if dtype == np.float16 else scale64) < min_scale  # (5)
    safe = np.where(too_small, 1.0, scale64)
    if symmetric:
        zp = np.full(lo64.shape, np.round((qmin + qmax) / 2.0))  # (4) symmetric; np.round is half-even
    else:
        zp = np.round(qmin - lo64 / safe)  # (4) asymmetric, float64 scale as ORT
    zp = np.clip(zp, qmin, qmax).astype(np.int64)
    scale = np.where(too_small, np.asarray(1.0, dtype), stored).astype(dtype)
    zp = np.where(too_small, 0, zp)
    return scale, zp


def params_from_range(
    cal: CalibratedType,
    storage: IntType,
    *,
    symmetric: bool,
    reduce_range: bool = False,
    axis: int | EllipsisType | None = ...,
) -> QuantType:
    """``Cal(expressed, min, max)`` -> ``Q(storage, expressed, scale, zero_point, axis)``.

    ``axis``: ``...`` (default) keeps the calibrated type's granularity; ``None`` turns
    a per-channel range into one per-tensor range (min of the minima, max of the
    maxima); an int must equal ``cal.axis`` (the observer decides the channel axis).

    Incorrect / Correct::

        params_from_range(Cal(f32, -inf, 2.0), U8, symmetric=False)
        # Incorrect: ValueError "range [-inf, 2.0] is not finite" (check is_degenerate first)
        params_from_range(Cal(f32, -1.0, 3.0), U8, symmetric=False)   # Correct
        # -> Q(u8:f32, 0.015686275, 64)

    >>> from quanta.ir.types import U8, F32
    >>> print(params_from_range(CalibratedType(F32, -1.0, 3.0), U8, symmetric=False))
    Q(u8:f32, 0.015686275, 64)
    """
    if axis is ...:
        axis = cal.axis
    mins = np.asarray(cal.min, dtype=np.float64)
    maxs = np.asarray(cal.max, dtype=np.float64)
    if axis is None and cal.axis is not None:
        mins, maxs = mins.min(keepdims=False), maxs.max(keepdims=False)
    elif axis is not None and axis != cal.axis:
        raise ValueError(
            f"params_from_range: axis {axis} requested but the range is "
            + ("per-tensor" if cal.axis is None else f"per-channel along axis {cal.axis}")
        )
    scale, zp = compute_scale_zero_point(
        mins, maxs, storage, symmetric=symmetric, reduce_range=reduce_range, expressed=cal.expressed
    )
    return QuantType(storage, cal.expressed, tuple(scale.reshape(-1)), tuple(zp.reshape(-1).tolist()), axis)


def bias_params(x: QuantType, w: QuantType) -> QuantType:
    """Eq. (6): the int32 type of a Conv/Gemm/MatMul bias, ``Q(i32, sx·sw, 0)``.

    The product is taken in the expressed dtype (float32), as ORT does
    (``input_scale * weight_scale``) and as the integer kernels assume. Per-channel when
    ``w`` is (then along axis 0 of the 1-D bias).

    A per-channel ``x`` (axis 1, the input of a depthwise Conv, eq. (29)) has one scale per
    output channel, as the weight: ``sb[c] = sx[c]·sw[c]``.

    Raises ``ValueError`` when a product is below float32's smallest normal number (or
    0): call :func:`adjust_weight_scale_for_bias` first, which raises such weight scales.
    """
    dtype = x.expressed.numpy
    sb = _input_scales(x, w, "bias_params").astype(dtype) * w.scale_array().astype(dtype).reshape(-1)
    tiny = float(ml_dtypes.finfo(dtype).tiny)
    if (sb.astype(np.float64) < tiny).any() or not np.isfinite(sb).all():
        bad = float(sb.astype(np.float64).min())
        raise ValueError(
            f"bias_params: bias scale sx*sw = {bad:g} is below the smallest normal {x.expressed} ({tiny:g}); "
            "raise the weight scale with adjust_weight_scale_for_bias before quantizing the weight"
        )
    axis = None if w.axis is None else 0
    return QuantType(I32, x.expressed, tuple(sb), (0,) * sb.size, axis)


def _input_scales(x: QuantType, w: QuantType, where: str) -> np.ndarray:
    """The input scale(s) a bias scale multiplies: one, or one per output channel when
    ``x`` is per channel along axis 1 with as many channels as ``w`` has scales."""
    if x.axis is None:
        return np.asarray(x.scale[:1], np.float32)
    if x.axis == 1 and w.axis is not None and len(x.scale) == len(w.scale):
        return np.asarray(x.scale, np.float32)
    raise ValueError(
        f"{where}: a per-channel input (axis={x.axis}, {len(x.scale)} scales) needs a weight with "
        f"one scale per channel (got {len(w.scale)})"
    )


_INT32_RANGE = float(np.iinfo(np.int32).max) - float(np.iinfo(np.int32).min + 1)  # 2^32 - 2, as ORT
_BIAS_EPSILON = 1.0001  # ORT's multiplicative_epsilon


def adjust_weight_scale_for_bias(x: QuantType, w: QuantType, b: np.ndarray) -> QuantType:
    """Raise ``sw`` where the bias scale ``sx·sw`` is too small for int32 (eq. (7)).

    ::

        (7)  sb_min = 1.0001 · 2·|b| / (2^32 - 2)            per channel (per-tensor: max |b|, 0 included)
             if 0 < sx·sw < sb_min:   sw' = sw · sb_min / (sx·sw)       (float64, then float32)

    This is ORT's ``QDQQuantizer._adjust_weight_scale_for_int32_bias`` (same epsilon,
    same int32 range, same float64 arithmetic). The channel it touches is one whose
    bias is more than 2^31 steps of ``sx·sw``: its weights are ~0 relative to the bias,
    so a coarser weight scale costs nothing.

    Where quanta differs from ORT, and why:

    - ORT adjusts only int8/int16 weights whose zero points are all 0. quanta adjusts
      any weight: growing the scale while keeping the zero point keeps 0 exact and the
      representable interval ``[(qmin - zw)·sw, (qmax - zw)·sw]`` only grows.
    - ORT leaves ``sx·sw`` alone when it underflows to 0 or to a float32 subnormal
      (the bias is then all zeros, or ORT falls back to a float bias scale that no
      integer kernel can use). quanta raises such a channel to ``sx·sw' >= tiny``
      (smallest normal float32), so :func:`bias_params` always gives a valid type whose
      scale is exactly what the integer kernels compute.

    Returns ``w`` unchanged (the same object) when nothing needs adjusting.
    """
    dtype = w.expressed.numpy
    bias = np.asarray(b, dtype=np.float64).reshape(-1)
    sw = np.asarray(w.scale, dtype=np.float64)
    if w.axis is None:
        absmax = float(np.abs(bias).max(initial=0.0))  # ORT: max(|min(b, 0)|, |max(b, 0)|)
        need = np.asarray([_BIAS_EPSILON * 2.0 * absmax / _INT32_RANGE])
    else:
        if bias.size != sw.size:
            raise ValueError(
                f"adjust_weight_scale_for_bias: bias has {bias.size} values but the weight {sw.size} scales"
            )
        need = _BIAS_EPSILON * 2.0 * np.abs(bias) / _INT32_RANGE
    sx = _input_scales(x, w, "adjust_weight_scale_for_bias").astype(np.float64)
    tiny = float(ml_dtypes.finfo(x.expressed.numpy).tiny)
    cand = sx * sw
    ort_rule = (cand < need) & (cand > 0.0)
    ratio = np.where(ort_rule, need / np.where(cand > 0.0, cand, 1.0), 1.0)
    new = (sw * ratio).astype(dtype).astype(np.float64)
    # quanta's extra guard: the float32 product sx*sw' must be a normal float32.
    sx = np.broadcast_to(sx, new.shape)
    prod = (sx.astype(np.float32) * new.astype(np.float32)).astype(np.float64)
    for i in np.flatnonzero(prod < tiny):
        # the raised scale is a value of the expressed type (a float16 model's scales are
        # float16: a float32 step between two of them would not survive the file)
        up = dtype.type(max(new[i], tiny / sx[i]))
        while float(np.float32(sx[i]) * np.float32(up)) < tiny:  # at most a few steps up
            up = np.nextafter(up, dtype.type(np.inf))
        new[i] = float(up)
    if np.array_equal(new, sw):
        return w
    return QuantType(w.storage, w.expressed, tuple(new), w.zero_point, w.axis, w.block, w.scale_shape)


def quantize_bias(b: np.ndarray, bias_type: QuantType) -> np.ndarray:
    """Bias values -> int32 at ``bias_type`` (from :func:`bias_params`), as ORT does:
    ``clip(round_half_even(float64(b) / float64(sb)), int32)``. Saturation (only possible
    when eq. (7) was skipped) is clipped, never wrapped."""
    if bias_type.storage != I32:
        raise ValueError(f"quantize_bias: expected an i32 bias type, got {bias_type}")
    scale = bias_type.scale_array().astype(np.float64)
    q = np.round(np.asarray(b, dtype=np.float64) / scale)
    info = np.iinfo(np.int32)
    return np.clip(q, info.min, info.max).astype(np.int32)
