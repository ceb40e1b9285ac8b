"""OCP Microscaling (MX v1.0): quantization, dequantization, dot products (normative).

Math: docs/quantization-math.md section 11, eqs. (MX1)-(MX7).

- :func:`quantize_mx`: float32 -> (elements, E8M0 scales), per block of ``block``
  consecutive elements along ``axis``. Shared scale (eq. (MX3))
  ``X = 2^clamp(floor(log2(amax)) - emax_elem, -127, 127)``; each element is
  ``round(v / X)`` to the element format, rounding half to even, normal values that
  exceed the format's largest magnitude saturating to it (eq. (MX4)).
- ``mode="microxcaling"`` reproduces Microsoft's microxcaling reference
  (``mx/mx_ops.py::_quantize_mx`` with its defaults) where it differs from the
  specification's text: elements round half *away from zero* (its ``round="nearest"``),
  both exponents are ``floor(log2(.))`` evaluated in float32 (a value a few ulp below
  2^k then counts as 2^k: a coarser scale or quantum), and an all-zero block gets the
  exponent ``clamp(-126 - emax, -127)`` (from its ``log2(x + FP32_MIN_NORMAL)``).
- ``mode="ceil"`` keeps the OCP rounding and takes the shared exponent one step above
  (MX3) in a block whose maximum would saturate (eq. (MX3c)):
  ``e = clamp(ceil(log2(amax / max_elem)), -127, 127)``, so no finite element clips (the
  rule of NVIDIA's MXFP8 recipe). It matters for FP8 E4M3 (the top 1/8 of a binade
  clips under (MX3): up to 12.5 % off a block's largest value), hardly for INT8.
- :func:`dequantize_mx`: ``x = fl32(decode(P) · X)`` (eq. (MX1)), the ONNX
  DequantizeLinear of a float8e8m0 scale.
- :func:`mx_gemm` / :func:`mx_conv`: exact integer block dot products, then the
  float32 chain of eqs. (MX5)-(MX6) in block order; native kernels are bit-exact with it.

Edge blocks (docs (MX3) notes): a block holding a NaN or an infinity gets the NaN scale
(E8M0 0xFF) and zero elements, so it dequantizes to NaN everywhere, as the specification
says of a NaN scale; an all-zero block gets the smallest scale 2^-127 (code 0) and zero
elements; float32 subnormals quantize like any other value (the scale clamps at 2^-127).
MXINT8 elements saturate to [-127, 127] (symmetric, as microxcaling's
``max_norm = 127/64``); -128 (-2.0) is accepted on input and decodes as -2.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = [
    "MX_FORMATS",
    "MXFormat",
    "conv_mx_op",
    "dequantize_mx",
    "dq_scale_codes",
    "element_integers",
    "matmul_mx_op",
    "mx_conv",
    "mx_format",
    "mx_gemm",
    "ocp_codes",
    "quantize_mx",
    "quantize_mx_op",
    "scale_exponents",
]

E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


@dataclass(frozen=True)
class MXFormat:
    """One MX element format. A finite element decodes as ``n · 2^-frac_bits`` for an
    integer ``n`` (eq. (MX2)); ``emax`` is the exponent of its largest power of two."""

    name: str  # the IR element name: f8e4m3fn, f8e5m2, f6e3m2fn, f6e2m3fn, f4e2m1fn, i8
    dtype: np.dtype
    emax: int
    mbits: int  # explicit mantissa bits (for i8: the 6 fraction bits)
    emin: int  # exponent of the smallest normal (for i8: unused)
    max_norm: float
    frac_bits: int
    is_int: bool = False


MX_FORMATS: dict[str, MXFormat] = {
    f.name: f
    for f in (
        MXFormat("f8e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn), 8, 3, -6, 448.0, 9),
        MXFormat("f8e5m2", np.dtype(ml_dtypes.float8_e5m2), 15, 2, -14, 57344.0, 16),
        MXFormat("f6e3m2fn", np.dtype(ml_dtypes.float6_e3m2fn), 4, 2, -2, 28.0, 4),
        MXFormat("f6e2m3fn", np.dtype(ml_dtypes.float6_e2m3fn), 2, 3, 0, 7.5, 3),
        MXFormat("f4e2m1fn", np.dtype(ml_dtypes.float4_e2m1fn), 2, 1, 0, 6.0, 1),
        MXFormat("i8", np.dtype(np.int8), 0, 6, 0, 127.0 / 64.0, 6, is_int=True),
    )
}

_ALIASES = {
    "mxfp8_e4m3": "f8e4m3fn",
    "mxfp8_e5m2": "f8e5m2",
    "mxfp6_e3m2": "f6e3m2fn",
    "mxfp6_e2m3": "f6e2m3fn",
    "mxfp4": "f4e2m1fn",
    "mxint8": "i8",
}


def mx_format(name: str) -> MXFormat:
    """The format for an IR element name (``f8e4m3fn``) or an option name (``mxfp8_e4m3``)."""
    key = _ALIASES.get(name, name)
    if key not in MX_FORMATS:
        raise ValueError(
            f"unknown MX element format {name!r}: expected one of {', '.join(list(_ALIASES) + list(MX_FORMATS))}"
        )
    return MX_FORMATS[key]


def _blocks(x: np.ndarray, axis: int, block: int) -> tuple[np.ndarray, int]:
    """x moved to [..., nblocks, block] along ``axis`` (zero-padded); returns it and the
    padded length."""
    xm = np.moveaxis(x, axis, -1)
    k = xm.shape[-1]
    nb = -(-k // block)
    pad = nb * block - k
    if pad:
        xm = np.concatenate([xm, np.zeros((*xm.shape[:-1], pad), xm.dtype)], axis=-1)
    return xm.reshape((*xm.shape[:-1], nb, block)), k  # (an empty x keeps its shape)


def _unblocks(b: np.ndarray, axis: int, k: int) -> np.ndarray:
    y = b.reshape((*b.shape[:-2], b.shape[-2] * b.shape[-1]))[..., :k]
    return np.moveaxis(y, -1, axis)


def _floor_log2_exact(a: np.ndarray) -> np.ndarray:
    """floor(log2(a)) for a > 0, exact (frexp of the float64 value: a = m·2^e, m in [0.5, 1))."""
    _, e = np.frexp(a.astype(np.float64))
    return e.astype(np.int64) - 1


def _floor_log2_f32(a: np.ndarray) -> np.ndarray:
    """floor(log2(a)) with log2 evaluated in float32, as microxcaling's PyTorch code."""
    with np.errstate(divide="ignore"):
        return np.floor(np.log2(a.astype(np.float32))).astype(np.int64)


def scale_exponents(
    x: np.ndarray, fmt: MXFormat | str, axis: int = -1, block: int = 32, mode: str = "ocp"
) -> np.ndarray:
    """Unbiased shared exponents (int64, the scale tensor's shape) of eq. (MX3); NaN blocks
    give 128 (the E8M0 NaN code 255 − 127)."""
    f = fmt if isinstance(fmt, MXFormat) else mx_format(fmt)
    b, _ = _blocks(np.asarray(x, np.float32), axis % max(np.ndim(x), 1), block)
    return _exponents(b, f, mode)


def _exponents(b: np.ndarray, f: MXFormat, mode: str) -> np.ndarray:
    a = np.abs(b.astype(np.float32))
    bad = ~np.all(np.isfinite(a), axis=-1)
    amax = np.where(np.isfinite(a), a, 0).max(axis=-1) if a.shape[-1] else np.zeros(a.shape[:-1], np.float32)
    zero = amax == 0
    if mode == "ocp":
        e = _floor_log2_exact(np.where(zero, 1.0, amax)) - f.emax
        e = np.where(zero, -127, e)
    elif mode == "ceil":
        # the smallest power of two under which the block's maximum does not saturate:
        # one step above (MX3) when amax / 2^e lies past the largest element
        e = _floor_log2_exact(np.where(zero, 1.0, amax)) - f.emax
        e = e + (amax.astype(np.float64) > np.ldexp(f.max_norm, e.astype(np.int32)))
        e = np.where(zero, -127, e)
    elif mode == "microxcaling":
        e = _floor_log2_f32(np.where(zero, np.float32(2.0**-126), amax)) - f.emax
    else:
        raise ValueError(f"quantize_mx: mode must be 'ocp', 'ceil' or 'microxcaling', got {mode!r}")
    e = np.clip(e, -127, 127)
    return np.where(bad, 128, e)


def _round(v: np.ndarray, mode: str) -> np.ndarray:
    if mode != "microxcaling":
        return np.rint(v)  # half to even (float64, |v| < 2^52: exact)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)  # microxcaling "nearest": half away from zero


def _round_elements(y: np.ndarray, f: MXFormat, mode: str) -> np.ndarray:
    """y (float64, = v / X exactly) rounded to the element grid and saturated (eq. (MX4))."""
    if f.is_int:
        q = _round(y * 64.0, mode) / 64.0
    else:
        ay = np.abs(y)
        nz = ay > 0
        if mode != "microxcaling":
            e = np.where(nz, _floor_log2_exact(np.where(nz, ay, 1.0)), f.emin)
        else:
            e = np.where(nz, _floor_log2_f32(np.where(nz, ay, 1.0)), f.emin)
        e = np.maximum(e, f.emin)
        quantum = np.ldexp(1.0, (e - f.mbits).astype(np.int32))
        q = _round(y / quantum, mode) * quantum
    return np.clip(q, -f.max_norm, f.max_norm)


def quantize_mx(
    x: np.ndarray, fmt: MXFormat | str, axis: int = -1, block: int = 32, mode: str = "ocp"
) -> tuple[np.ndarray, np.ndarray]:
    """MX-quantize float ``x`` (cast to float32 first) in blocks of ``block`` along ``axis``.

    Returns ``(elements, scales)``: elements of ``x``'s shape in the format's dtype
    (ml_dtypes float8/6/4, or int8 for MXINT8 holding ``q`` with value ``q · 2^-6``),
    scales as ``ml_dtypes.float8_e8m0fnu`` with dimension ``axis`` of length
    ``ceil(x.shape[axis] / block)``. ``mode``: ``"ocp"`` (the specification, default),
    ``"ceil"`` (no saturation of a block's maximum) or ``"microxcaling"`` (see the module
    docstring).
    """
    f = fmt if isinstance(fmt, MXFormat) else mx_format(fmt)
    if block <= 0:
        raise ValueError(f"quantize_mx: block size must be positive, got {block}")
    x = np.asarray(x, np.float32)
    if x.ndim == 0:
        x = x.reshape(1)
    ax = axis % x.ndim
    b, k = _blocks(x, ax, block)
    e = _exponents(b, f, mode)
    bad = e == 128
    y = b.astype(np.float64) * np.ldexp(1.0, -np.where(bad, 0, e)).astype(np.float64)[..., None]
    y = np.where(bad[..., None] | ~np.isfinite(y), 0.0, y)
    q = _round_elements(y, f, mode)
    if f.is_int:
        el = (q * 64.0).astype(np.int8)
    else:
        el = q.astype(np.float32).astype(f.dtype)  # exact: q is on the element grid
    elements = _unblocks(el, ax, k)
    scales = np.moveaxis((e + 127).astype(np.uint8), -1, ax).view(E8M0)
    return np.ascontiguousarray(elements), np.ascontiguousarray(scales)


def _expand(scales: np.ndarray, axis: int, block: int, k: int) -> np.ndarray:
    return np.repeat(scales, block, axis=axis).take(np.arange(k), axis=axis)


def dequantize_mx(
    elements: np.ndarray,
    scales: np.ndarray,
    axis: int = -1,
    block: int = 32,
    fmt: MXFormat | str | None = None,
) -> np.ndarray:
    """``x = fl32(decode(P) · X)`` (eq. (MX1)); a NaN scale gives NaN for its whole block."""
    el = np.asarray(elements)
    if fmt is None:
        fmt = next((f for f in MX_FORMATS.values() if f.dtype == el.dtype), None)
        if fmt is None:
            raise ValueError(f"dequantize_mx: elements of dtype {el.dtype} are no MX element type")
    f = fmt if isinstance(fmt, MXFormat) else mx_format(fmt)
    ax = axis % el.ndim
    s = _expand(np.asarray(scales).view(E8M0).astype(np.float64), ax, block, el.shape[ax])
    v = el.astype(np.float64) * (2.0**-6 if f.is_int else 1.0)
    return (v * s).astype(np.float32)


def element_integers(elements: np.ndarray, fmt: MXFormat | str) -> np.ndarray:
    """``n`` with ``decode(P) = n · 2^-frac_bits`` exactly (eq. (MX2)), as int64; NaN and
    infinite elements (float8 only) give 0 (their block's result is NaN anyway)."""
    f = fmt if isinstance(fmt, MXFormat) else mx_format(fmt)
    el = np.asarray(elements)
    if f.is_int:
        return el.astype(np.int64)
    v = el.astype(np.float64)
    v = np.where(np.isfinite(v), v, 0.0)
    return np.ldexp(v, f.frac_bits).astype(np.int64)


def _bad_elements(elements: np.ndarray, f: MXFormat) -> np.ndarray:
    if f.is_int:
        return np.zeros(np.shape(elements), bool)
    return ~np.isfinite(np.asarray(elements).astype(np.float32))


def _round_int_to_f32(d: np.ndarray) -> np.ndarray:
    """fl32 of exact integers (int64 or Python ints): one rounding, half to even."""
    if d.dtype != object:
        if np.all(np.abs(d) < 2**53):
            return d.astype(np.float64).astype(np.float32)  # exact in float64, then one rounding
    out = np.empty(d.shape, np.float32)
    for idx, v in np.ndenumerate(d):
        a = abs(int(v))
        shift = max(a.bit_length() - 24, 0)
        if shift:
            q, r = a >> shift, a & ((1 << shift) - 1)
            half = 1 << (shift - 1)
            if r > half or (r == half and q & 1):
                q += 1
            a = q << shift
        with np.errstate(over="ignore"):
            out[idx] = np.float32(float(a) if int(v) >= 0 else -float(a))
    return out


def _pow2_f32(e: np.ndarray) -> np.ndarray:
    """fl32(2^e) for unbiased int exponents; 128 (the NaN code) gives NaN."""
    with np.errstate(over="ignore"):
        p = np.ldexp(np.float64(1.0), np.clip(e, -300, 300).astype(np.int32)).astype(np.float32)
    return np.where(e == 128, np.float32(np.nan), p).astype(np.float32)


def _block_scale(ea: np.ndarray, eb: np.ndarray, fa: MXFormat, fb: MXFormat) -> np.ndarray:
    """s = fl32(fl32(2^(ea − fa)) · fl32(2^(eb − fb))) (eq. (MX5b)); NaN if either is NaN."""
    sa = np.where(ea == 128, np.float32(np.nan), _pow2_f32(np.where(ea == 128, 0, ea - fa.frac_bits)))
    sb = np.where(eb == 128, np.float32(np.nan), _pow2_f32(np.where(eb == 128, 0, eb - fb.frac_bits)))
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        return (sa.astype(np.float32) * sb.astype(np.float32)).astype(np.float32)


def mx_gemm(
    a: np.ndarray,
    a_scales: np.ndarray,
    b: np.ndarray,
    b_scales: np.ndarray,
    block: int = 32,
    a_format: MXFormat | str | None = None,
    b_format: MXFormat | str | None = None,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """Y[M, N] = A[M, K] · B[K, N] for MX operands, A blocked along K (scales [M, nb]) and B
    along K (scales [nb, N]); eqs. (MX5)-(MX6):

    - D_k = Σ_{i in block k} n^A_i · n^B_i, exact (int64, or Python ints when the
      format's bound exceeds 2^53);
    - p_k = fl32( fl32(D_k) · s_k ), s_k = fl32(fl32(2^(a_k − f_A)) · fl32(2^(b_k − f_B)));
    - y = fl32(…fl32(fl32(p_0 + p_1) + p_2)… + p_{nb−1}), blocks in order; then
      y = fl32(y + bias[n]) when a bias is given.

    A NaN scale or a NaN/Inf element makes its p_k NaN.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    fa = _fmt_of(a, a_format)
    fb = _fmt_of(b, b_format)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"mx_gemm: expected A [M, K] and B [K, N], got {a.shape} and {b.shape}")
    M, K = a.shape
    N = b.shape[1]
    nb = -(-K // block)
    ea = np.asarray(a_scales).view(np.uint8).astype(np.int64) - 127
    eb = np.asarray(b_scales).view(np.uint8).astype(np.int64) - 127
    if ea.shape != (M, nb) or eb.shape != (nb, N):
        raise ValueError(
            f"mx_gemm: expected scales of shape {(M, nb)} and {(nb, N)}, got {ea.shape} and {eb.shape}"
        )
    na = element_integers(a, fa)
    nbi = element_integers(b, fb)
    big = max(_bound(fa), 1) * max(_bound(fb), 1) * block >= 2**62
    bad_a = _bad_elements(a, fa)
    bad_b = _bad_elements(b, fb)
    y = np.zeros((M, N), np.float32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for k in range(nb):
            sl = slice(k * block, min(K, (k + 1) * block))
            if big:
                d = np.dot(na[:, sl].astype(object), nbi[sl].astype(object))
            else:
                d = na[:, sl] @ nbi[sl]
            s = _block_scale(ea[:, k][:, None], eb[k][None, :], fa, fb)
            p = (_round_int_to_f32(np.asarray(d)) * s).astype(np.float32)
            nan = bad_a[:, sl].any(axis=1)[:, None] | bad_b[sl].any(axis=0)[None, :]
            p = np.where(nan, np.float32(np.nan), p)
            y = p if k == 0 else (y + p).astype(np.float32)
        if bias is not None:
            y = (y + np.asarray(bias, np.float32)).astype(np.float32)
    return y


def _bound(f: MXFormat) -> int:
    return int(f.max_norm * 2**f.frac_bits) if not f.is_int else 128


def _fmt_of(el: np.ndarray, fmt: MXFormat | str | None) -> MXFormat:
    if fmt is not None:
        return fmt if isinstance(fmt, MXFormat) else mx_format(fmt)
    for f in MX_FORMATS.values():
        if f.dtype == el.dtype:
            return f
    raise ValueError(f"MX operand of dtype {el.dtype} is no MX element type")


def im2col_mx(
    x: np.ndarray,
    x_scales: np.ndarray,
    kernel: tuple[int, int],
    pads: tuple[int, int, int, int],
    strides: tuple[int, int],
    dilations: tuple[int, int],
    block: int,
) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Rows of the MX convolution as a GEMM (eq. (MX7)): for x [N, C, H, W] blocked along C,
    A[(n, oy, ox), (tap, c)] with taps (ky, kx) row-major and C padded to a whole number of
    blocks per tap, and its scales [(n, oy, ox), (tap, cblock)]. Padding pixels are zero
    elements under the smallest scale (code 0): their block products are +0."""
    N, C, H, W = x.shape
    kh, kw = kernel
    pt, pl, pb, pr = pads
    sh, sw = strides
    dh, dw = dilations
    nbc = -(-C // block)
    Cp = nbc * block
    OH = (H + pt + pb - dh * (kh - 1) - 1) // sh + 1
    OW = (W + pl + pr - dw * (kw - 1) - 1) // sw + 1
    xp = np.zeros((N, Cp, H + pt + pb, W + pl + pr), x.dtype)
    xp[:, :C, pt : pt + H, pl : pl + W] = x
    sp = np.zeros((N, nbc, H + pt + pb, W + pl + pr), np.uint8)
    sp[:, :, pt : pt + H, pl : pl + W] = np.asarray(x_scales).view(np.uint8)
    cols = np.empty((N, OH, OW, kh * kw, Cp), x.dtype)
    scols = np.empty((N, OH, OW, kh * kw, nbc), np.uint8)
    for ky in range(kh):
        for kx in range(kw):
            ys = ky * dh
            xs = kx * dw
            patch = xp[:, :, ys : ys + sh * (OH - 1) + 1 : sh, xs : xs + sw * (OW - 1) + 1 : sw]
            cols[:, :, :, ky * kw + kx, :] = patch.transpose(0, 2, 3, 1)
            sp_patch = sp[:, :, ys : ys + sh * (OH - 1) + 1 : sh, xs : xs + sw * (OW - 1) + 1 : sw]
            scols[:, :, :, ky * kw + kx, :] = sp_patch.transpose(0, 2, 3, 1)
    a = cols.reshape(N * OH * OW, kh * kw * Cp)
    a_s = scols.reshape(N * OH * OW, kh * kw * nbc).view(E8M0)
    return a, a_s, (OH, OW)


def weights_to_gemm_mx(w: np.ndarray, w_scales: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """W [O, C, kh, kw] blocked along C -> B[(tap, c), O] with C padded per tap, and its
    scales [(tap, cblock), O] (the GEMM form of eq. (MX7))."""
    n_out, C, kh, kw = w.shape
    nbc = -(-C // block)
    Cp = nbc * block
    wp = np.zeros((n_out, Cp, kh, kw), w.dtype)
    wp[:, :C] = w
    bmat = wp.transpose(2, 3, 1, 0).reshape(kh * kw * Cp, n_out)
    s = np.asarray(w_scales).view(np.uint8).transpose(2, 3, 1, 0).reshape(kh * kw * nbc, n_out)
    return np.ascontiguousarray(bmat), np.ascontiguousarray(s).view(E8M0)


def mx_conv(
    x: np.ndarray,
    x_scales: np.ndarray,
    w: np.ndarray,
    w_scales: np.ndarray,
    block: int = 32,
    bias: np.ndarray | None = None,
    pads: tuple[int, int, int, int] = (0, 0, 0, 0),
    strides: tuple[int, int] = (1, 1),
    dilations: tuple[int, int] = (1, 1),
    x_format: MXFormat | str | None = None,
    w_format: MXFormat | str | None = None,
) -> np.ndarray:
    """2-D convolution (group 1) of MX x [N, C, H, W] and MX w [O, C, kh, kw], both blocked
    along C; eq. (MX7): the block products of every tap in (ky, kx) row-major order, the
    channel blocks of a tap in order, accumulated as eq. (MX6). pads = (top, left,
    bottom, right) as ONNX. Returns float32 [N, O, OH, OW]."""
    x = np.asarray(x)
    w = np.asarray(w)
    if x.ndim != 4 or w.ndim != 4 or x.shape[1] != w.shape[1]:
        raise ValueError(
            f"mx_conv: expected x [N, C, H, W] and w [O, C, kh, kw], got {x.shape} and {w.shape}"
        )
    fx = _fmt_of(x, x_format)
    fw = _fmt_of(w, w_format)
    a, a_s, (OH, OW) = im2col_mx(x, x_scales, w.shape[2:], pads, strides, dilations, block)
    bm, b_s = weights_to_gemm_mx(w, w_scales, block)
    y = mx_gemm(a, a_s, bm, b_s, block, fx, fw, bias)
    return y.reshape(x.shape[0], OH, OW, w.shape[0]).transpose(0, 3, 1, 2).copy()


def dq_scale_codes(codes: np.ndarray, fmt: MXFormat | str) -> np.ndarray:
    """OCP E8M0 codes -> the codes a DequantizeLinear multiplies by (ONNX and quanta's IR).

    Equal for the float formats. MXINT8's value is ``q · 2^-6 · X``: its DequantizeLinear
    scale is ``2^-6 · X``, code − 6; a code below 6 (block values below 2^-120) becomes 0,
    so such a block reads 2^(6 − code) times too small (it is below 2^-114 either way).
    """
    f = fmt if isinstance(fmt, MXFormat) else mx_format(fmt)
    c = np.asarray(codes).view(np.uint8).astype(np.int64)
    if not f.is_int:
        return c.astype(np.uint8).view(E8M0)
    return np.where(c == 255, 255, np.maximum(c - 6, 0)).astype(np.uint8).view(E8M0)


#: ONNX element type code -> MX format, for quanta::QuantizeMX's output_dtype
_ONNX_FORMATS = {
    TensorProto.INT8: "i8",
    TensorProto.FLOAT8E4M3FN: "f8e4m3fn",
    TensorProto.FLOAT8E5M2: "f8e5m2",
    TensorProto.FLOAT4E2M1: "f4e2m1fn",
    TensorProto.FLOAT6E3M2: "f6e3m2fn",
    TensorProto.FLOAT6E2M3: "f6e2m3fn",
}


@register("QuantizeMX", "quanta")
def quantize_mx_op(
    ctx: OpContext,
    x: np.ndarray,
    *,
    axis: int = -1,
    block_size: int = 32,
    output_dtype: int = TensorProto.INT8,
    mode: str = "ocp",
) -> tuple[np.ndarray, np.ndarray]:
    """quanta::QuantizeMX (docs/quantization-math.md section 11, "quanta::QuantizeMX"):
    ``(Y, Y_scale) = QuantizeMX(X)``, ``DequantizeLinear(Y, Y_scale, axis, block_size)``
    reconstructs the MX values (Y_scale is :func:`dq_scale_codes` of the OCP scale)."""
    del ctx
    if output_dtype not in _ONNX_FORMATS:
        raise OpError(
            f"output_dtype: expected one of INT8, FLOAT8E4M3FN, FLOAT8E5M2, FLOAT4E2M1, FLOAT6E3M2, FLOAT6E2M3 "
            f"(ONNX codes {sorted(_ONNX_FORMATS)}), got {output_dtype}"
        )
    if block_size <= 0:
        raise OpError(f"block_size: expected a positive block size, got {block_size}")
    x = np.asarray(x)
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        raise OpError(f"axis: {axis} is out of range for an input of rank {x.ndim}")
    if mode not in ("ocp", "ceil", "microxcaling"):
        raise OpError(f"mode: expected 'ocp', 'ceil' or 'microxcaling', got {mode!r}")
    fmt = mx_format(_ONNX_FORMATS[output_dtype])
    el, codes = quantize_mx(x.astype(np.float32), fmt, axis=axis, block=block_size, mode=mode)
    return el, dq_scale_codes(codes, fmt)


def ocp_codes(dq_codes: np.ndarray, fmt: MXFormat | str) -> np.ndarray:
    """The inverse of :func:`dq_scale_codes`: a DequantizeLinear scale -> OCP E8M0 codes
    (MXINT8: code + 6; an MXINT8 code 0 stands for OCP codes 0..6, read as 6)."""
    f = fmt if isinstance(fmt, MXFormat) else mx_format(fmt)
    c = np.asarray(dq_codes).view(np.uint8).astype(np.int64)
    if not f.is_int:
        return c.astype(np.uint8).view(E8M0)
    return np.where(c == 255, 255, np.minimum(c + 6, 254)).astype(np.uint8).view(E8M0)


@register("MatMulMX", "quanta")
def matmul_mx_op(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    w_scale: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    k_block: int = 32,
    x_dtype: int = TensorProto.INT8,
    mode: str = "ocp",
) -> np.ndarray:
    """quanta::MatMulMX: ``x [..., K]`` float32, MX-quantized at run time along K
    (``x_dtype``, ``mode`` as quanta::QuantizeMX), times MX weights ``w [K, N]`` blocked
    along K with DequantizeLinear scales ``w_scale [ceil(K / k_block), N]``
    (:func:`dq_scale_codes`), plus ``bias [N]``: eqs. (MX5)-(MX6) through :func:`mx_gemm`.
    What ``MatMul(DQ(QuantizeMX(x)), DQ(w))`` computes, with the block dot products exact
    and summed in float32 in block order (the float MatMul sums the dequantized products
    instead: the two differ by float32 rounding)."""
    del ctx
    if x_dtype not in _ONNX_FORMATS:
        raise OpError(
            f"x_dtype: expected an MX element type (ONNX codes {sorted(_ONNX_FORMATS)}), got {x_dtype}"
        )
    x = np.asarray(x, np.float32)
    w = np.asarray(w)
    if x.ndim < 1 or w.ndim != 2 or x.shape[-1] != w.shape[0]:
        raise OpError(f"MatMulMX: expected x [..., K] and w [K, N], got {list(x.shape)} and {list(w.shape)}")
    fx = mx_format(_ONNX_FORMATS[x_dtype])
    fw = _fmt_of(w, None)
    K, N = w.shape
    nb = -(-K // k_block)
    if np.shape(w_scale) != (nb, N):
        raise OpError(
            f"MatMulMX: w_scale: expected shape [{nb}, {N}] (k_block {k_block}), got {list(np.shape(w_scale))}"
        )
    xe, xs = quantize_mx(x.reshape(-1, K), fx, axis=-1, block=k_block, mode=mode)
    y = mx_gemm(xe, xs, w, ocp_codes(w_scale, fw), k_block, fx, fw, bias)
    return y.reshape((*x.shape[:-1], N))


@register("ConvMX", "quanta")
def conv_mx_op(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    w_scale: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    k_block: int = 32,
    x_dtype: int = TensorProto.INT8,
    mode: str = "ocp",
    pads: tuple[int, ...] = (0, 0, 0, 0),
    strides: tuple[int, ...] = (1, 1),
    dilations: tuple[int, ...] = (1, 1),
) -> np.ndarray:
    """quanta::ConvMX: 2-D convolution (group 1) of ``x [N, C, H, W]`` float32, MX-quantized
    at run time along C (``x_dtype``, ``mode`` as quanta::QuantizeMX), and MX weights
    ``w [O, C, kh, kw]`` blocked along C with DequantizeLinear scales ``w_scale [O,
    ceil(C / k_block), kh, kw]``, plus ``bias [O]``: eq. (MX7) through :func:`mx_conv`.
    ``pads`` = (top, left, bottom, right) as ONNX."""
    del ctx
    if x_dtype not in _ONNX_FORMATS:
        raise OpError(
            f"x_dtype: expected an MX element type (ONNX codes {sorted(_ONNX_FORMATS)}), got {x_dtype}"
        )
    x = np.asarray(x, np.float32)
    w = np.asarray(w)
    if x.ndim != 4 or w.ndim != 4 or x.shape[1] != w.shape[1]:
        raise OpError(
            f"ConvMX: expected x [N, C, H, W] and w [O, C, kh, kw], got {list(x.shape)} and {list(w.shape)}"
        )
    n_out, C, kh, kw = w.shape
    want = (n_out, -(-C // k_block), kh, kw)
    if np.shape(w_scale) != want:
        raise OpError(
            f"ConvMX: w_scale: expected shape {list(want)} (k_block {k_block}), got {list(np.shape(w_scale))}"
        )
    if len(pads) != 4 or len(strides) != 2 or len(dilations) != 2:
        raise OpError("ConvMX: expected 4 pads, 2 strides and 2 dilations (a 2-D convolution)")
    fx = mx_format(_ONNX_FORMATS[x_dtype])
    fw = _fmt_of(w, None)
    xe, xs = quantize_mx(x, fx, axis=1, block=k_block, mode=mode)
    return mx_conv(
        xe,
        xs,
        w,
        ocp_codes(w_scale, fw),
        k_block,
        bias,
        tuple(int(p) for p in pads),  # type: ignore[arg-type]
        tuple(int(s) for s in strides),  # type: ignore[arg-type]
        tuple(int(d) for d in dilations),  # type: ignore[arg-type]
        fx,
        fw,
    )
