"""AMD Quark's fake-quantization operators: ``com.amd.quark::MXQuantizeDequantize`` and
``BFPQuantizeDequantize`` (``to_bfp``), as Quark's CPU kernels compute them
(``quark/onnx/operators/custom_ops/src``: ``custom_op_mx.cc``, ``mx/cpu/mx_kernel.cc``,
``include/mx/funcs.cuh``, ``custom_op_bfp.cc``, ``bfp/cpu/bfp_kernel.cc``).

Quark's MX and BFP16 configurations write one such node per quantized tensor: it
quantizes and dequantizes at once, float32 (or float16, computed in float32) in and out.
Layout: a one-element tensor passes through; a rank-1 tensor is blocked along its only
axis; otherwise ``axis`` moves last. The last axis is padded with zeros to a multiple of
``block_size``, each block of consecutive elements is processed, the padding dropped and
the axis moved back. Per block, with E(v) the biased exponent field of a float32 value
(an Inf / NaN's 255 read as 0):

  (Q1) e = max E(x_i) − 127                                  (the shared exponent)
  (Q2) MX: s = fl32(2^(e − emax));  y_i = fl32(s · f(fl32(x_i / s)))
       f, FP elements: x rounded half to even onto the element's grid (mbits of mantissa,
          its exponent bias 2^(ebits−1) − 1 below which values are subnormal), |y| capped
          at the element's largest normal, a result that rounds to 0 is +0;
       f, INT8: fl32(clip(round(fl32(v / 2^−6)), −128, 127) · 2^−6), round by
          ``rounding_mode``;
  (Q3) BFP (``to_bfp``, m = bit_width − 9 mantissa bits): s = fl32(2^(e − (m − 1)));
       y_i = clip(fl32(round(fl32(x_i / s)) · s), −v, v), v = fl32(2^(e + 1) − s);
  an element that is Inf or NaN passes through (Q2, Q3).

``rounding_mode``: 0 half away from zero (``std::round``), 1 Quark's "DPU" rounding
(halves toward +inf), 2 half to even (its ``py3_round``). Quark's MX elements differ
from the OCP MX specification that quanta's own MX types follow (docs/quantization-math.md
sect. 11): INT8 reaches −128, an Inf / NaN stays one element's instead of the block's,
and a block's exponent comes from the exponent fields (so a subnormal block shares
2^(−127 − emax)). ``to_bfp_prime``, the "compiler" BFP kernel and
``convert_to_bfloat_before_bfp`` are not implemented (an OpError names them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, refuses, register

__all__ = ["QUARK_DOMAIN", "bfp_quantize_dequantize", "mx_quantize_dequantize"]

QUARK_DOMAIN = "com.amd.quark"
F32 = np.float32

#: element type: (ebits, mbits, emax, largest normal); INT8's implicit scale is 2^-6
_ELEMENTS = {
    "fp8_e5m2": (5, 2, 15, 57344.0),
    "fp8_e4m3": (4, 3, 8, 448.0),
    "fp6_e3m2": (3, 2, 4, 28.0),
    "fp6_e2m3": (2, 3, 2, 7.5),
    "fp4_e2m1": (2, 1, 2, 6.0),
    "int8": (0, 8, 0, 127.0),
}


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _exponent_field(x: np.ndarray) -> np.ndarray:
    return ((x.view(np.uint32) >> 23) & 0xFF).astype(np.int64)


def _round(v: np.ndarray, mode: int) -> np.ndarray:
    """Quark's three roundings of float32 ``v`` to integers (as float32)."""
    if mode == 2:  # py3_round: half to even from floor(v), so -0.2 -> +0
        fl = np.floor(v)
        d = v - fl
        odd = np.fmod(fl, 2) != 0
        return np.where((d > 0.5) | ((d == 0.5) & odd), fl + 1, fl)
    if mode == 1:  # ties toward +inf: (x < 0 and a half) ? ceil : std::round
        return np.where(v - np.floor(v) == 0.5, np.ceil(v), _round(v, 0))
    if mode == 0:  # std::round: ties away from zero (and -0.2 -> -0, as C's)
        t = np.trunc(v)
        return np.where(np.abs(v - t) >= 0.5, t + np.sign(v), t)
    raise OpError(f"rounding_mode: expected 0, 1 or 2, got {mode}")


def _fake_fp(v: np.ndarray, ebits: int, mbits: int, max_norm: float) -> np.ndarray:
    """funcs.cuh ``fake_quantize_element``: float32 ``v`` rounded half to even onto the
    element grid (subnormal below the element's bias), capped at ``max_norm``."""
    bits = v.view(np.uint32).astype(np.int64)
    exp = (bits >> 23) & 0xFF
    sign = bits >> 31
    mant = np.where(exp != 0, (bits & 0x7FFFFF) | (1 << 23), bits & 0x7FFFFF)
    full = np.where(exp != 0, 24, 23)
    new_exp = exp - 127 + (1 << (ebits - 1)) - 1
    tail = 23 - mbits + np.where(new_exp > 0, 0, 1 - new_exp)
    gone = tail > 25
    tail = np.minimum(tail, 25)
    half = np.int64(1) << (tail - 1)
    rest = mant & ((np.int64(1) << tail) - 1)
    r = mant >> tail
    r = r + ((rest > half) | ((rest == half) & (r % 2 == 1)))
    zero = gone | (r == 0)
    m2 = r << tail
    carry = m2 >= (np.int64(1) << full)
    m2 = np.where(carry & (exp != 0), m2 >> 1, m2)
    exp2 = exp + carry
    magnitude = ((exp2 << 23) + (m2 & 0x7FFFFF)).astype(np.uint32).view(F32)
    magnitude = np.where(magnitude > F32(max_norm), F32(max_norm), magnitude)
    out = (magnitude.view(np.uint32).astype(np.int64) + (sign << 31)).astype(np.uint32).view(F32)
    out = np.where(zero, F32(0.0), out)
    return np.where(exp == 255, v, out).astype(F32)


def _blocked(x: np.ndarray, axis: int, block: int, per_block) -> np.ndarray:
    """Quark's layout (module docstring): ``per_block`` maps [..., blocks, block] float32."""
    if block < 1:
        raise OpError(f"block_size: expected >= 1, got {block}")
    half = x.dtype == np.float16
    if x.dtype not in (np.dtype(F32), np.dtype(np.float16)):
        raise OpError(f"x: expected float32 or float16, got {x.dtype}")
    xf = np.asarray(x, F32)
    if xf.size == 1:
        return x.copy()
    if xf.ndim == 1:
        axis = 0
    if not -xf.ndim <= axis < xf.ndim:
        raise OpError(f"axis: expected in [{-xf.ndim}, {xf.ndim - 1}], got {axis}")
    moved = np.moveaxis(xf, axis, -1)
    n = moved.shape[-1]
    padded = np.zeros((*moved.shape[:-1], -(-n // block) * block), F32)
    padded[..., :n] = moved
    y = per_block(padded.reshape((*moved.shape[:-1], -1, block))).reshape(padded.shape)[..., :n]
    y = np.ascontiguousarray(np.moveaxis(y, -1, axis))
    return y.astype(np.float16) if half else y


def mx_quantize_dequantize(
    x: np.ndarray, element_dtype: str, axis: int = 1, block_size: int = 32, rounding_mode: int = 2
) -> np.ndarray:
    """Eqs. (Q1)-(Q2) of the module docstring.

    >>> mx_quantize_dequantize(np.array([[1.0, 0.3, -2.5, 0.01]], np.float32), "int8", block_size=4)
    array([[ 1.    ,  0.3125, -2.5   ,  0.    ]], dtype=float32)
    """
    name = _text(element_dtype)
    if name not in _ELEMENTS:
        raise OpError(f"element_dtype: expected one of {', '.join(_ELEMENTS)}, got {name!r}")
    ebits, mbits, emax, max_norm = _ELEMENTS[name]

    def per_block(b: np.ndarray) -> np.ndarray:
        e = _exponent_field(b)
        e = np.where(e == 255, 0, e).max(axis=-1, keepdims=True) - 127 - emax
        s = np.ldexp(np.ones(e.shape), e).astype(F32)  # 2^(e - emax), exact down to 2^-149
        v = (b / s).astype(F32)
        if ebits:
            q = _fake_fp(v, ebits, mbits, max_norm)
        else:
            lsb = F32(2.0**-6)
            q = (np.clip(_round((v / lsb).astype(F32), rounding_mode), -128.0, 127.0) * lsb).astype(F32)
        y = (s * q).astype(F32)
        return np.where(_exponent_field(b) == 255, b, y)

    with np.errstate(over="ignore", invalid="ignore"):
        return _blocked(np.asarray(x), axis, block_size, per_block)


def bfp_quantize_dequantize(
    x: np.ndarray,
    bit_width: int = 16,
    axis: int = 1,
    block_size: int = 8,
    rounding_mode: int = 0,
    bfp_method: str = "to_bfp",
) -> np.ndarray:
    """Eq. (Q3) of the module docstring (``to_bfp``).

    >>> bfp_quantize_dequantize(np.array([1.0, 0.3, -2.5, 1e-3], np.float32), block_size=4)
    array([ 1.    ,  0.3125, -2.5   ,  0.    ], dtype=float32)
    """
    if _text(bfp_method) != "to_bfp":
        raise OpError(f"bfp_method {_text(bfp_method)!r}: only 'to_bfp' is implemented")
    m = bit_width - 9
    if m < 1:
        raise OpError(f"bit_width: expected >= 10, got {bit_width}")

    def per_block(b: np.ndarray) -> np.ndarray:
        e = _exponent_field(b)
        e = np.where(e == 255, 0, e).max(axis=-1, keepdims=True) - 127
        s = np.ldexp(np.ones(e.shape), e - (m - 1)).astype(F32)
        top = (np.ldexp(np.ones(e.shape), e + 1) - s.astype(np.float64)).astype(F32)
        y = (_round((b / s).astype(F32), rounding_mode) * s).astype(F32)
        y = np.maximum(-top, np.minimum(y, top))
        return np.where(_exponent_field(b) == 255, b, y)

    with np.errstate(over="ignore", invalid="ignore"):
        return _blocked(np.asarray(x), axis, block_size, per_block)


@register("MXQuantizeDequantize", QUARK_DOMAIN)
def mx_quantize_dequantize_op(
    ctx: OpContext,
    x: np.ndarray,
    *,
    element_dtype: str | bytes = "int8",
    axis: int = 1,
    block_size: int = 32,
    rounding_mode: int = 2,
) -> np.ndarray:
    """com.amd.quark MXQuantizeDequantize (see :func:`mx_quantize_dequantize`)."""
    del ctx  # unused
    return mx_quantize_dequantize(x, _text(element_dtype), axis, block_size, rounding_mode)


@refuses("MXQuantizeDequantize", QUARK_DOMAIN)
def _mx_refusal(attrs: dict[str, Any], given: list[bool]) -> str | None:
    del given
    name = _text(attrs.get("element_dtype", "int8"))
    if name not in _ELEMENTS:
        return f"element_dtype {name!r}: expected one of {', '.join(_ELEMENTS)}"
    if int(attrs.get("rounding_mode", 2)) not in (0, 1, 2):
        return f"rounding_mode {attrs['rounding_mode']}: expected 0, 1 or 2"
    if int(attrs.get("block_size", 32)) < 1:
        return f"block_size {attrs['block_size']}: expected >= 1"
    return None


@refuses("BFPQuantizeDequantize", QUARK_DOMAIN)
def _bfp_refusal(attrs: dict[str, Any], given: list[bool]) -> str | None:
    del given
    method = _text(attrs.get("bfp_method", "to_bfp"))
    if method != "to_bfp":
        return f"bfp_method {method!r}: only 'to_bfp' is implemented"
    for flag in ("convert_to_bfloat_before_bfp", "use_compiler_version_cpu_kernel"):
        if int(attrs.get(flag, 0)):
            return f"{flag} = 1 is not implemented"
    if int(attrs.get("rounding_mode", 0)) not in (0, 1, 2):
        return f"rounding_mode {attrs['rounding_mode']}: expected 0, 1 or 2"
    if int(attrs.get("bit_width", 16)) < 10:
        return f"bit_width {attrs['bit_width']}: expected >= 10"
    if int(attrs.get("block_size", 8)) < 1:
        return f"block_size {attrs['block_size']}: expected >= 1"
    return None


@register("BFPQuantizeDequantize", QUARK_DOMAIN)
def bfp_quantize_dequantize_op(
    ctx: OpContext,
    x: np.ndarray,
    *,
    bfp_method: str | bytes = "to_bfp",
    axis: int = 1,
    bit_width: int = 16,
    block_size: int = 8,
    rounding_mode: int = 0,
    sub_block_size: int = 2,
    sub_block_shift_bits: int = 1,
    convert_to_bfloat_before_bfp: int = 0,
    use_compiler_version_cpu_kernel: int = 0,
) -> np.ndarray:
    """com.amd.quark BFPQuantizeDequantize, ``to_bfp`` (see :func:`bfp_quantize_dequantize`);
    ``sub_block_*`` belong to ``to_bfp_prime``, which is refused."""
    del ctx, sub_block_size, sub_block_shift_bits  # the sub-block attributes are to_bfp_prime's
    if convert_to_bfloat_before_bfp:
        raise OpError("convert_to_bfloat_before_bfp = 1 is not implemented")
    if use_compiler_version_cpu_kernel:
        raise OpError("use_compiler_version_cpu_kernel = 1 is not implemented")
    return bfp_quantize_dequantize(x, bit_width, axis, block_size, rounding_mode, _text(bfp_method))
