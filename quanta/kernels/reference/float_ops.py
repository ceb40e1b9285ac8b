"""quanta's float32 Softmax and LayerNormalization: the NumPy twin of kernels/cpp/float_ops.

np.exp and NumPy's pairwise summation cannot be reproduced in C++, so quanta defines its
own float32 algorithm once (docs/float-ops.md, equations (E1)-(E6), (R1)-(R3), (S1)-(S5),
(L1)-(L5)) and implements it twice, bit-identically: here, and in C++ (portable, AVX2,
AVX-512). Every step is one float32 IEEE operation in the order written: no fused
multiply-add except where an equation writes fma (the sigmoid's exp (EN1)-(EN6), one
rounding, :func:`fma_f32`), true divisions and square roots (both correctly rounded),
round half to even. The registered ops (nn.py ``Softmax``, nn_norm.py ``LayerNormalization``) call
these functions for float32 inputs.

exp (eq. (E1)-(E6)), Cody–Waite range reduction and the Cephes ``expf`` polynomial::

    (E1) t  = min(max(x, −104), 89)                      NaN stays NaN
    (E2) n  = rne(f32(t · L2E))                          L2E = 0x3FB8AA3B (log2 e)
    (E3) r  = f32(f32(t − f32(n · C1)) − f32(n · C2))    C1 = 0x3F318000 (0.693359375)
                                                         C2 = 0xB95E8083 (−2.12194440e−4)
    (E4) h  = P0; h = f32(f32(h · r) + Pk) for k = 1..5  (Horner, P0..P5 below)
    (E5) p  = f32(f32(f32(h · f32(r · r)) + r) + 1)
    (E6) y  = f32(f32(p · 2^n1) · 2^n2),  n1 = floor(n / 2), n2 = n − n1
                                         (2^k from exponent bits; the first product is exact,
                                          the second rounds once: y = rne(p · 2^n))

Accuracy: at most 1 ulp from the exact e^x for results in the normal range (measured
0.99 ulp on 2^25 random inputs; tests/kernels/test_float_ops_native.py checks it);
below FLT_MIN (x < −87.34) the result is rne(p · 2^n), within 2^−149 of e^x; x > 88.72
gives +inf, x < −103.97 gives 0.

Row reductions (R1)-(R3), "16 lanes in index order, then a fixed tree"::

    (R1) lane j (0 <= j < 16) accumulates, from acc_j = +0, the elements i ≡ j (mod 16)
         in increasing i: acc_j = f32(acc_j + v_i)   (missing elements of the last block
         add nothing; adding +0 would not change acc_j either, since acc_j is never −0)
    (R2) h = 8, 4, 2, 1: acc_j = f32(acc_j + acc_{j+h}) for j < h
    (R3) sum16(v) = acc_0

The reference loops over the 16-wide blocks explicitly (one ``np.add`` per block over
every row at once), so the order is sequential by construction and does not depend on
how NumPy reduces. A row max needs no order: max only selects (NaN elements are skipped;
the sign of a zero maximum does not change any result, see (S2)).

cos (CS1)-(CS6) and sin (SN1), the Cephes ``cosf`` / ``sinf`` schemes (docs/float-ops.md,
section "cos and sin").

log (LN1)-(LN6), the Cephes ``logf`` scheme, and LogSoftmax (LS1)-(LS5) on exp, sum16 and
log (docs/float-ops.md, sections "log", "LogSoftmax").
atan (AT1)-(AT4), the Cephes ``atanf`` scheme (docs/float-ops.md, section "atan").
pow (PW1)-(PW3) on log and exp, for a float32 Pow whose one exponent has no exact form
(docs/float-ops.md, section "Pow and Exp").

Elementwise functions built on exp (docs/float-ops.md, sections "erf", "tanh, sigmoid,
Gelu"): erf (F1)-(F5), tanh (T1)-(T4), sigmoid (Σ1)-(Σ2) on the fused exp (EN1)-(EN6),
Gelu (G1)-(G2). Each is a
fixed sequence of float32 operations with both branches of a split evaluated for every
element and one selected, so SIMD lanes need no branches.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = [
    "LANES",
    "atan_f32",
    "cos_f32",
    "elu_f32",
    "erf_f32",
    "exp_f32",
    "exp_fused_nonpositive_f32",
    "expm1_f32",
    "fma_f32",
    "gelu_f32",
    "gelu_tanh_f32",
    "layer_norm_div_rows",
    "layer_norm_rows",
    "log_f32",
    "log_softmax_rows",
    "pow_f32",
    "row_max",
    "sigmoid_f32",
    "sin_f32",
    "softmax_rows",
    "sum16",
    "tanh_f32",
]

F32 = np.float32
LANES = 16

_L2E = np.uint32(0x3FB8AA3B).view(F32)  # f32(log2(e))
_C1 = np.uint32(0x3F318000).view(F32)  # 0.693359375: 9 significant bits, n·C1 is exact
_C2 = np.uint32(0xB95E8083).view(F32)  # −2.12194440e−4: ln 2 − C1, rounded to float32
#: Cephes expf: e^r ≈ 1 + r + r²·(P5 + r·(P4 + r·(P3 + r·(P2 + r·(P1 + r·P0)))))
EXP_POLY = tuple(
    F32(c)
    for c in (
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
    )
)
EXP_LO, EXP_HI = F32(-104.0), F32(89.0)


def _pow2(k: np.ndarray) -> np.ndarray:
    """2^k as float32 from its exponent bits (k in [−126, 127])."""
    return ((k + 127) << 23).astype(np.int32).view(F32)


def exp_f32(x: np.ndarray) -> np.ndarray:
    """e^x for float32 ``x`` by eqs. (E1)-(E6) (bit-identical to the C++ kernels)."""
    x = np.asarray(x, F32)
    t = np.minimum(np.maximum(x, EXP_LO), EXP_HI)  # (E1); np.maximum/minimum keep NaN
    n = np.rint(t * _L2E)  # (E2), half to even
    r = (t - n * _C1) - n * _C2  # (E3)
    h = np.full_like(r, EXP_POLY[0])
    for c in EXP_POLY[1:]:
        h = h * r + c  # (E4)
    p = ((h * (r * r)) + r) + F32(1)  # (E5)
    ni = np.where(np.isnan(n), F32(0), n).astype(np.int32)  # NaN: any exponent, p is NaN
    n1 = ni >> 1  # floor(n / 2)
    with np.errstate(over="ignore"):
        return (p * _pow2(n1)) * _pow2(ni - n1)  # (E6)


def fma_f32(a: np.ndarray, b: np.ndarray | np.float32, c: np.ndarray | np.float32) -> np.ndarray:
    """``a·b + c`` for float32 operands, rounded once to float32 (an FMA instruction).

    The product is exact in float64 (24 + 24 bits); the float64 sum rounds once more, and
    that second rounding only matters when it lands exactly halfway between two float32
    values: then the sum's rounding error (TwoSum) says which side the exact value is on,
    and the float64 value is moved one ulp that way before the float32 rounding. (Results
    in float32's normal range, or exact ones: the midpoint test reads the bits of a normal
    float32's rounding position.)"""
    a = np.asarray(a, F32)
    p = a.astype(np.float64) * np.asarray(b, F32).astype(np.float64)
    cc = np.broadcast_to(np.asarray(c, F32).astype(np.float64), p.shape)
    s = p + cc
    bb = s - p
    err = (p - (s - bb)) + (cc - bb)
    half = (s.view(np.uint64) & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)
    fix = half & (err != 0)
    if np.any(fix):
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


def exp_fused_nonpositive_f32(x: np.ndarray) -> np.ndarray:
    """e^x for float32 ``x <= 0`` (or NaN) by eqs. (EN1)-(EN6): (E1)-(E6) with the second
    step of the reduction and the polynomial as fused multiply-adds (one rounding each)::

        (EN1) t = max(x, −104)                              NaN stays NaN
        (EN2) n = rne(f32(t · L2E))                          (E2)
        (EN3) r = fma(−n, C2, f32(t − f32(n · C1)))          n·C1 exact, as in (E3)
        (EN4) h = P0; h = fma(h, r, Pk) for k = 1..5
        (EN5) p = f32(fma(h, f32(r · r), r) + 1)
        (EN6) y = f32(f32(p · 2^n1) · 2^n2)                  (E6)

    The sigmoid's exp (Σ1): a SIMD lane evaluates it in 13 operations where (E1)-(E6)
    take 22. Every fma result here is in float32's normal range or exact (r = t when
    n = 0), which :func:`fma_f32` needs."""
    x = np.asarray(x, F32)
    t = np.maximum(x, EXP_LO)  # (EN1); np.maximum keeps NaN
    n = np.rint(t * _L2E)  # (EN2)
    r = fma_f32(-n, _C2, t - n * _C1)  # (EN3)
    h = np.full_like(r, EXP_POLY[0])
    for c in EXP_POLY[1:]:
        h = fma_f32(h, r, c)  # (EN4)
    p = fma_f32(h, r * r, r) + F32(1)  # (EN5)
    ni = np.where(np.isnan(n), F32(0), n).astype(np.int32)
    n1 = ni >> 1
    return (p * _pow2(n1)) * _pow2(ni - n1)  # (EN6)


#: (LN4) the split of the reduced mantissa, f32(√½)
LOG_SQRT_HALF = np.uint32(0x3F3504F3).view(F32)
#: (LN5) Cephes logf: log(1 + f) ≈ f − f²/2 + f³·Q(f), Q0 .. Q8
LOG_POLY = tuple(
    np.uint32(b).view(F32)
    for b in (
        0x3D9021BB,
        0xBDEBD1B8,
        0x3DEF251A,
        0xBDFE5D4F,
        0x3E11E9BF,
        0xBE2AAE50,
        0x3E4CCEAC,
        0xBE7FFFFC,
        0x3EAAAAAA,
    )
)


def log_f32(x: np.ndarray) -> np.ndarray:
    """ln(x) for float32 ``x`` by eqs. (LN1)-(LN6) (bit-identical to the C++ kernels)::

        (LN1) ±0 → −inf, +inf → +inf, x < 0 or NaN → NaN; otherwise
        (LN2) x < FLT_MIN: x' = f32(x · 2^23), e0 = −23; else x' = x, e0 = 0
        (LN3) x' = m · 2^e (frexp: m in [0.5, 1), exact); e = e + e0
        (LN4) m < f32(√½): e = e − 1, f = f32(f32(m + m) − 1); else f = f32(m − 1)
        (LN5) z = f32(f · f); p = Q0; p = f32(f32(p · f) + Qk), k = 1..8;
              y = f32(f32(p · f) · z)
        (LN6) y = f32(y + f32(e · C2)); y = f32(y − f32(0.5 · z));
              y = f32(f32(f + y) + f32(e · C1))                    C1, C2 of (E3)

    (LN4)'s subtractions are exact (Sterbenz) and e is a small integer, exact in float32."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):  # the special values' lanes compute garbage, replaced below
        tiny = x < np.finfo(F32).tiny  # (LN2)
        m, e = np.frexp(np.where(tiny, x * F32(2.0**23), x))  # (LN3)
        e = e - np.where(tiny, 23, 0)
        lo = m < LOG_SQRT_HALF  # (LN4)
        e = np.where(lo, e - 1, e).astype(F32)
        f = np.where(lo, (m + m) - F32(1), m - F32(1))
        z = f * f  # (LN5)
        p = np.full_like(f, LOG_POLY[0])
        for c in LOG_POLY[1:]:
            p = p * f + c
        y = (p * f) * z
        y = y + e * _C2  # (LN6)
        y = y - F32(0.5) * z
        y = (f + y) + e * _C1
    y = np.where(x == 0, F32(-np.inf), y)  # (LN1)
    y = np.where(x == np.inf, F32(np.inf), y)
    return np.asarray(np.where(x >= 0, y, F32(np.nan)), F32)


def pow_f32(
    x: np.ndarray,
    e: float,
    log: Callable[[np.ndarray], np.ndarray] = log_f32,
    exp: Callable[[np.ndarray], np.ndarray] = exp_f32,
) -> np.ndarray:
    """x^e for float32 ``x`` and one finite float32 exponent ``e`` by eqs. (PW1)-(PW3)
    (docs/float-ops.md, "Pow and Exp")::

        (PW1) e = 0: y = 1 (every x, NaN too)
        (PW2) t = f32(log(|x|) · e);  y = exp(t)          log (LN1)-(LN6), exp (E1)-(E6)
        (PW3) e an odd integer: y = −y where x's sign bit is set;
              e not an integer: y = NaN where −inf < x < 0

    ``log`` and ``exp`` are the twins here and the C++ kernels in the native target; the
    rest is the same NumPy calls in both, so the two are bit-identical. The special values
    follow C's pow: |x| = 0 gives log −inf, so 0 for e > 0 and +inf for e < 0 (−0 and −inf
    for an odd e with a negative zero); x = ±inf gives inf or 0 by the sign of e
    ((E1) clamps t to 89, whose exp overflows); x = 1 gives log 0 exactly, so 1."""
    x = np.asarray(x, F32)
    e32 = F32(e)
    if e32 == 0:  # (PW1)
        return np.ones_like(x)
    with np.errstate(all="ignore"):
        y = np.asarray(exp(np.asarray(log(np.abs(x)) * e32, F32)), F32)  # (PW2)
    if float(e32).is_integer():  # (PW3)
        if abs(float(e32)) < 2.0**24 and int(e32) % 2:
            y = np.where(np.signbit(x), -y, y)
        return y
    return np.where((x < 0) & (x > F32(-np.inf)), F32(np.nan), y)


#: (AT1)-(AT4): Cephes atanf's constants: tan(3π/8), tan(π/8), π/2, π/4 and the
#: polynomial's coefficients, each rounded to float32 (the C++ spells the same bits)
ATAN_T3P8, ATAN_TP8, ATAN_PIO2, ATAN_PIO4 = (
    np.uint32(b).view(F32) for b in (0x401A827A, 0x3ED413CD, 0x3FC90FDB, 0x3F490FDB)
)
ATAN_P = tuple(np.uint32(b).view(F32) for b in (0x3DA4F0D1, 0xBE0E1B85, 0x3E4C925F, 0xBEAAAA2A))


def atan_f32(x: np.ndarray) -> np.ndarray:
    """atan(x) for float32 ``x`` by eqs. (AT1)-(AT4), the Cephes ``atanf`` scheme
    (bit-identical to the C++ kernels)::

        (AT1) a = |x|
        (AT2) a > T3P8: y0 = π/2, r = f32(−1 / a)
              a > TP8:  y0 = π/4, r = f32(f32(a − 1) / f32(a + 1))
              else:     y0 = 0,   r = a
        (AT3) z = f32(r · r);  p = P0;  p = f32(f32(p · z) + Pk), k = 1 … 3
              y = f32(y0 + f32(f32(f32(p · z) · r) + r))
        (AT4) y with the sign bit of x (atan(−0) = −0; NaN stays NaN)

    Both branches of (AT2) are computed for every element and one selected."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        a = np.abs(x)  # (AT1)
        big, mid = a > ATAN_T3P8, a > ATAN_TP8  # (AT2)
        r = np.where(big, F32(-1) / a, np.where(mid, (a - F32(1)) / (a + F32(1)), a))
        y0 = np.where(big, ATAN_PIO2, np.where(mid, ATAN_PIO4, F32(0)))
        z = r * r  # (AT3)
        p = np.full_like(z, ATAN_P[0])
        for c in ATAN_P[1:]:
            p = p * z + c
        y = y0 + (((p * z) * r) + r)
    return np.asarray(np.copysign(y, x), F32)  # (AT4)


#: (CS1)-(CS6): Cephes cosf's constants: f32(4/π), π/4 in three parts, the cos and sin
#: polynomials' coefficients
COS_T_MAX = F32(2.0**24)
COS_FOPI, COS_DP1, COS_DP2, COS_DP3 = (
    np.uint32(b).view(F32) for b in (0x3FA2F983, 0x3F490000, 0x397DA000, 0x33222169)
)
COS_C = tuple(np.uint32(b).view(F32) for b in (0x37CCF5CE, 0xBAB6061A, 0x3D2AAAA5))
COS_S = tuple(np.uint32(b).view(F32) for b in (0xB94CA1F9, 0x3C08839E, 0xBE2AAAA3))


def _trig_parts(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(CS1)-(CS5) for a = |x| (float32): the octant o = q mod 8 and the cos and sin
    polynomials yc, ys (garbage for a NaN or infinite a, which the callers replace)."""
    t = np.minimum(a, COS_T_MAX)  # (CS1)
    j = np.trunc(t * COS_FOPI)  # (CS2)
    q = F32(2) * np.ceil(j * F32(0.5))
    o = q - F32(8) * np.floor(q * F32(0.125))  # (CS3)
    z = ((t - q * COS_DP1) - q * COS_DP2) - q * COS_DP3  # (CS4)
    s = z * z  # (CS5)
    yc = ((COS_C[0] * s + COS_C[1]) * s + COS_C[2]) * s * s
    yc = (yc - F32(0.5) * s) + F32(1)
    ys = ((COS_S[0] * s + COS_S[1]) * s + COS_S[2]) * s * z + z
    return o, yc, ys


def cos_f32(x: np.ndarray) -> np.ndarray:
    """cos(x) for float32 ``x`` by eqs. (CS1)-(CS6) (bit-identical to the C++ kernels)::

    (CS1) NaN, ±inf → NaN;  t = min(|x|, 2^24)
    (CS2) j = trunc(f32(t · f32(4/π)));  q = 2 · ceil(f32(j · 0.5))        exact
    (CS3) o = q − 8 · floor(f32(q · 0.125))                                q mod 8
    (CS4) z = f32(f32(f32(t − f32(q · DP1)) − f32(q · DP2)) − f32(q · DP3))
    (CS5) s = f32(z · z)
          yc = f32(f32(f32(f32(f32(f32(f32(C0 · s) + C1) · s) + C2) · s) · s) − f32(0.5 · s)) + 1)
          ys = f32(f32(f32(f32(f32(f32(f32(S0 · s) + S1) · s) + S2) · s) · z) + z)
    (CS6) y = o in {2, 6} ? ys : yc, negated for o in {2, 4}"""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        a = np.abs(x)
        o, yc, ys = _trig_parts(a)
        y = np.where((o == 2) | (o == 6), ys, yc)  # (CS6)
        y = np.where((o == 2) | (o == 4), -y, y)
    return np.asarray(np.where(a < np.inf, y, F32(np.nan)), F32)


def sin_f32(x: np.ndarray) -> np.ndarray:
    """sin(x) for float32 ``x``: (CS1)-(CS5) of |x|, then (bit-identical to the C++ kernels)::

    (SN1) y = o in {2, 6} ? yc : ys, negated for o in {4, 6}, negated again when the
          sign bit of x is set (Cephes sinf; sin is odd bit for bit, sin(−0) = −0)"""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        a = np.abs(x)
        o, yc, ys = _trig_parts(a)
        y = np.where((o == 2) | (o == 6), yc, ys)  # (SN1)
        y = np.where(o >= 4, -y, y)
        y = np.where(np.signbit(x), -y, y)
    return np.asarray(np.where(a < np.inf, y, F32(np.nan)), F32)


def sum16(v: np.ndarray) -> np.ndarray:
    """Sum of every row of ``v`` [R, D] (float32) by eqs. (R1)-(R3); shape [R]."""
    return lanes16(v, np.add, 0.0)


def lanes16(v: np.ndarray, op: np.ufunc, identity: float) -> np.ndarray:
    """Every row of ``v`` [R, D] (float32) folded by ``op`` in the order of eqs. (R1)-(R3):
    lane j starts at ``identity`` and takes acc_j = f32(op(acc_j, v_i)) for i = j (mod 16)
    in increasing i (a missing element is the identity: exact), then the tree (R2); shape
    [R]. np.add is sum16, np.multiply the product of eq. (P16)."""
    v = np.asarray(v, F32)
    rows, d = v.shape
    blocks = -(-d // LANES)
    padded = np.full((rows, blocks * LANES), identity, F32)
    padded[:, :d] = v
    lanes = padded.reshape(rows, blocks, LANES)
    acc = np.full((rows, LANES), identity, F32)
    for b in range(blocks):  # (R1): one block at a time, in index order
        op(acc, lanes[:, b, :], out=acc)
    h = LANES // 2
    while h >= 1:  # (R2)
        acc = op(acc[:, :h], acc[:, h : 2 * h])
        h //= 2
    return acc[:, 0]  # (R3)


def row_max(v: np.ndarray) -> np.ndarray:
    """The largest non-NaN element of every row of ``v`` [R, D] (−inf if none); shape [R]."""
    return np.fmax.reduce(np.asarray(v, F32), axis=1, initial=-np.inf).astype(F32)


def log_softmax_rows(v: np.ndarray) -> np.ndarray:
    """LogSoftmax of every row of ``v`` [R, D] (float32), eqs. (LS1)-(LS5)::

        (LS1) m   = row_max(x)                       the largest non-NaN element
        (LS2) t_i = f32(x_i − m)
        (LS3) s   = sum16(exp_f32(t))                (E1)-(E6), (R1)-(R3)
        (LS4) l   = log_f32(s)                       (LN1)-(LN6)
        (LS5) y_i = f32(t_i − l)

    Which maximum (±0, or NaN where a row has one) changes no result: a NaN or ±inf
    element makes s, hence every y of its row, NaN, and l > 0 whenever two elements
    tie at ±0."""
    v = np.asarray(v, F32)
    with np.errstate(invalid="ignore"):  # a row of −inf: −inf − −inf is NaN, as ONNX Runtime's
        t = v - row_max(v)[:, None]  # (LS1), (LS2)
        s = sum16(exp_f32(t))  # (LS3)
        return t - log_f32(s)[:, None]  # (LS4), (LS5)


def softmax_rows(v: np.ndarray, *, fused: bool = False) -> np.ndarray:
    """Softmax of every row of ``v`` [R, D] (float32), eqs. (S1)-(S5)::

        (S1) m   = row_max(x)
        (S2) e_i = exp_f32(f32(x_i − m))     fused: exp_fused_nonpositive_f32, (EN1)-(EN6)
        (S3) s   = sum16(e)
        (S4) r   = f32(1 / s)                a true division, once per row
        (S5) y_i = f32(e_i · r)

    A row whose maximum is ±inf or NaN-only (every entry −inf: a fully masked attention
    row) gives NaN everywhere, as the previous reference and ONNX Runtime do. ``fused``:
    quanta::SoftmaxQuant's rows (docs/float-ops.md "SoftmaxQuant")."""
    v = np.asarray(v, F32)
    m = row_max(v)  # (S1)
    # −inf − −inf (the fully masked row: NaN expected), x − m below −FLT_MAX (−inf, e = 0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = (exp_fused_nonpositive_f32 if fused else exp_f32)(v - m[:, None])  # (S2)
        r = F32(1) / sum16(e)  # (S3), (S4)
        return e * r[:, None]  # (S5)


def layer_norm_rows(v: np.ndarray, epsilon: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The statistics of every row of ``v`` [R, D] (float32), eqs. (L1)-(L4)::

        (L1) mean    = f32(sum16(x) / D)
        (L2) d_i     = f32(x_i − mean)
        (L3) var     = f32(sum16(f32(d_i · d_i)) / D)
        (L4) inv_std = f32(1 / f32(sqrt(f32(var + epsilon))))

    Returns (d [R, D], mean [R], inv_std [R]); the caller finishes with (L5)
    y_i = f32(f32(f32(d_i · inv_std) · scale_i) + bias_i)."""
    d, mean, var = _layer_norm_var(v)
    with np.errstate(invalid="ignore", divide="ignore"):
        inv_std = F32(1) / np.sqrt(var + F32(epsilon))  # (L4)
    return d, mean, inv_std


def layer_norm_div_rows(v: np.ndarray, epsilon: np.float32) -> np.ndarray:
    """Every row of ``v`` [R, D] (float32) normalized by dividing by its standard deviation,
    as written-out exports compute it (``quanta::LayerNormDiv``): (L1)-(L3), then::

        (L4') s   = f32(sqrt(f32(var + epsilon)))
        (L5') y_i = f32(d_i / s)

    (the caller multiplies by scale and adds bias, one IEEE operation each). These are
    the operations of ReduceMean, Sub, Pow(·, 2), ReduceMean, Add, Sqrt, Div in that
    order: (L1) and (L3) are ReduceMean's f32(sum16 / D) (reduce_ops), Pow's exponent 2
    is f32(d · d) (math_ops.POW_EXACT_FORMS)."""
    d, _, var = _layer_norm_var(v)
    with np.errstate(invalid="ignore", divide="ignore"):
        return d / np.sqrt(var + F32(epsilon))[:, None]  # (L4'), (L5')


def rms_norm_rows(v: np.ndarray, epsilon: np.float32, *, reciprocal: bool) -> np.ndarray:
    """Every row of ``v`` [R, D] (float32) divided by its root mean square, as T5-style
    exports write it out (``quanta::RMSNormDiv``)::

        (RMS1)  ms  = f32(sum16(f32(x_i · x_i)) / D)
        (RMS2)  s   = f32(sqrt(f32(ms + epsilon)))
        (RMS3)  y_i = f32(x_i / s)                             reciprocal False: Div(x, s)
        (RMS3') r   = f32(1 / s);  y_i = f32(x_i · r)          reciprocal True: Div(1, s) or
                                                             Reciprocal(s), then Mul

    (the caller multiplies by scale and adds bias, one IEEE operation each, (RMS4)). These
    are the operations of Pow(·, 2) (or Mul(x, x)), ReduceMean, Add, Sqrt and the division
    in that order: (RMS1) is ReduceMean's f32(sum16 / D) (reduce_ops) of Pow's f32(x · x)
    (math_ops.POW_EXACT_FORMS)."""
    v = np.asarray(v, F32)
    count = F32(v.shape[1])
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # D = 0: 0 / 0 is NaN
        s = np.sqrt(sum16(v * v) / count + F32(epsilon))  # (RMS1), (RMS2)
        if reciprocal:
            return v * (F32(1) / s)[:, None]  # (RMS3')
        return v / s[:, None]  # (RMS3)


def _layer_norm_var(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(L1)-(L3) of every row of ``v`` [R, D]: (d [R, D], mean [R], var [R])."""
    v = np.asarray(v, F32)
    count = F32(v.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):  # D = 0: 0 / 0 is NaN, as np.mean
        mean = sum16(v) / count  # (L1)
        if v.shape[1]:  # (L1c): clamped to the row's range; a NaN mean stays NaN
            lo, hi = v.min(axis=1), v.max(axis=1)
            mean = np.where(mean < lo, lo, mean)
            mean = np.where(mean > hi, hi, mean).astype(F32)
        d = v - mean[:, None]  # (L2)
        var = sum16(d * d) / count  # (L3)
    return d, mean, var


def _f32_bits(*bits: int) -> tuple[np.float32, ...]:
    return tuple(np.uint32(b).view(F32) for b in bits)


#: (F1) |x| is clamped to 3.925 (erf rounds to 1 in float32 from 3.9192 on) and split at 0.921875.
ERF_T_MAX, ERF_SPLIT = _f32_bits(0x407B3333, 0x3F6C0000)
#: (F3) erf(t) ≈ t + t·P(t²) for t <= 0.921875 (P's last coefficient is 2/√π − 1); the
#: MLAS / N. Juffa erff coefficients, A0 .. A5.
ERF_SMALL = _f32_bits(0xBA1D0D41, 0x3BA39FA4, 0xBCDB45E9, 0x3DE70D23, 0xBEC09370, 0x3E0375D3)
#: (F4) erf(t) ≈ 1 − exp(−(t + t·Q(t))) for t > 0.921875, B0 .. B6.
ERF_BIG = _f32_bits(0x37911480, 0xB9C8E966, 0x3B7E899B, 0xBCC6B180, 0x3DDAAE58, 0x3F228550, 0x3E03CE86)


def erf_f32(x: np.ndarray) -> np.ndarray:
    """erf(x) for float32 ``x`` by eqs. (F1)-(F5) (bit-identical to the C++ kernels)::

        (F1) t  = min(|x|, 3.925)                              NaN stays NaN
        (F2) s  = f32(t · t)
        (F3) p  = A0; p = fma(p, s, Ak), k = 1..5;  ys = fma(p, t, t)
        (F4) q  = B0; q = fma(q, t, Bk), k = 1..6;  q = fma(q, t, t)
             yb = f32(1 − exp(−q))                             exp: (EN1)-(EN6)
        (F5) y  = copysign(t > 0.921875 ? yb : ys, x)

    At most 1.11 ulp from erf(x) (docs/float-ops.md); |x| >= 3.9192 and ±inf give ±1
    exactly, ±0 gives ±0."""
    x = np.asarray(x, F32)
    t = np.minimum(np.abs(x), ERF_T_MAX)  # (F1); np.minimum keeps NaN
    s = t * t  # (F2)
    p = np.full_like(t, ERF_SMALL[0])
    for c in ERF_SMALL[1:]:
        p = fma_f32(p, s, c)  # (F3)
    small = fma_f32(p, t, t)
    q = np.full_like(t, ERF_BIG[0])
    for c in ERF_BIG[1:]:
        q = fma_f32(q, t, c)  # (F4)
    q = fma_f32(q, t, t)
    big = F32(1) - exp_fused_nonpositive_f32(-q)
    return np.copysign(np.where(t > ERF_SPLIT, big, small), x)  # (F5)


#: (T1) tanh is split at 0.75.
TANH_SPLIT = F32(0.75)
#: (T2) tanh(t) ≈ t + t·s·P(s), s = t², P's coefficients T0 .. T5 (a float64 minimax fit
#: on [0, 0.75] rounded to float32; T0 ≈ −1/3).
TANH_SMALL = _f32_bits(0xBEAAAAA5, 0x3E0886DC, 0xBD5CBE9E, 0x3CAFBC2A, 0xBBFAE9A2, 0x3AE3A9B2)


def tanh_f32(x: np.ndarray) -> np.ndarray:
    """tanh(x) for float32 ``x`` by eqs. (T1)-(T4)::

        (T1) t  = |x|,  s = f32(t · t)
        (T2) p  = T5; p = f32(f32(p · s) + Tk), k = 4..0;  ys = f32(t + f32(t · f32(s · p)))
        (T3) e  = exp(f32(t + t));  yb = f32(1 − f32(2 / f32(e + 1)))    exp: (E1)-(E6)
        (T4) y  = copysign(t < 0.75 ? ys : yb, x)                        NaN: (T3), NaN

    At most 1.1 ulp from tanh(x) (docs/float-ops.md); |x| >= 9.011 gives ±1 exactly."""
    x = np.asarray(x, F32)
    t = np.abs(x)  # (T1)
    # overflow: s = inf for t > 1.8e19 and e = inf for t > 44.36 only reach the branch
    # that is not selected, or give 2 / inf = 0, y = 1
    with np.errstate(over="ignore", invalid="ignore"):
        s = t * t
        p = np.full_like(t, TANH_SMALL[-1])
        for c in TANH_SMALL[-2::-1]:
            p = p * s + c  # (T2)
        small = t + t * (s * p)
        e = exp_f32(t + t)  # (T3)
        big = F32(1) - F32(2) / (e + F32(1))
    return np.copysign(np.where(t < TANH_SPLIT, small, big), x)  # (T4)


def sigmoid_f32(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^−x) for float32 ``x`` by eqs. (Σ1)-(Σ2), the exp of a non-positive
    argument only (no overflow; subnormal results for x < −87.3)::

        (Σ1) e = exp(−|x|)                                             exp: (EN1)-(EN6)
        (Σ2) y = x >= 0 ? f32(1 / f32(1 + e)) : f32(e / f32(1 + e))    NaN: the second"""
    x = np.asarray(x, F32)
    e = exp_fused_nonpositive_f32(-np.abs(x))  # (Σ1)
    d = F32(1) + e
    return np.where(x >= 0, F32(1) / d, e / d)  # (Σ2)


#: (X3) the split of expm1, f32(ln 2 / 2)
EXPM1_SPLIT = np.uint32(0x3EB17218).view(F32)
#: (X1) Q0 .. Q6 = f32(1 / (k + 2)!): expm1(x) = x + x²·(1/2! + x/3! + … + x⁶/8!)
EXPM1_POLY = _f32_bits(0x3F000000, 0x3E2AAAAB, 0x3D2AAAAB, 0x3C088889, 0x3AB60B61, 0x39500D01, 0x37D00D01)


def expm1_f32(x: np.ndarray) -> np.ndarray:
    """e^x − 1 for float32 ``x`` by eqs. (X1)-(X3): the Taylor polynomial where the
    subtraction would cancel, exp (E1)-(E6) minus 1 elsewhere::

        (X1) q = Q6; q = f32(f32(q · x) + Qk), k = 5..0;  ys = f32(x + f32(f32(x · x) · q))
        (X2) yb = f32(exp(x) − 1)
        (X3) y = |x| < f32(ln 2 / 2) ? ys : yb                 NaN: yb, NaN

    From |x| = ln 2 / 2 on, |e^x − 1| >= 0.29, so the subtraction loses at most two bits
    of exp's result (docs/float-ops.md, "expm1 and Elu")."""
    x = np.asarray(x, F32)
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.full_like(x, EXPM1_POLY[6])
        for c in EXPM1_POLY[5::-1]:
            q = q * x + c  # (X1)
        small = x + (x * x) * q
        big = exp_f32(x) - F32(1)  # (X2)
    return np.where(np.abs(x) < EXPM1_SPLIT, small, big)  # (X3)


def elu_f32(x: np.ndarray, alpha: float) -> np.ndarray:
    """Elu for float32 ``x``, eq. (EL): x < 0 ? f32(f32(α) · expm1(x)) : x (NaN and ±0
    pass through; expm1 (X1)-(X3))."""
    x = np.asarray(x, F32)
    e = expm1_f32(np.minimum(x, F32(0)))  # the x >= 0 lanes are not selected
    return np.where(x < 0, F32(alpha) * e, x)


def softplus_f32(x: np.ndarray) -> np.ndarray:
    """Softplus for float32 ``x``, eqs. (SP1)-(SP3): exp (E1)-(E6) of −|x|, log1p by
    Goldberg's form on log (LN1)-(LN6), plus max(x, 0)."""
    x = np.asarray(x, F32)
    t = exp_f32(-np.abs(x))  # (SP1)
    return softplus_tail(x, t, log_f32(F32(1) + t))


def softplus_tail(x: np.ndarray, t: np.ndarray, log_u: np.ndarray) -> np.ndarray:
    """(SP2)-(SP3) from t = exp(−|x|) and log_u = log(f32(1 + t)) (the native binder
    computes those two with the C++ exp and log, then this)::

        (SP2) u = f32(1 + t);  l = u == 1 ? t : f32(log_u · f32(t / f32(u − 1)))
        (SP3) y = f32(max(x, 0) + l)                  (np.maximum: a NaN x gives NaN)
    """
    u = F32(1) + t
    with np.errstate(divide="ignore", invalid="ignore"):
        l1p = np.where(u == F32(1), t, log_u * (t / (u - F32(1))))
    return np.asarray(np.maximum(x, F32(0)) + l1p)


GELU_SQRT2 = np.uint32(0x3FB504F3).view(F32)  # f32(√2)
GELU_K = np.uint32(0x3F4C422A).view(F32)  # f32(√(2/π))
GELU_C = np.uint32(0x3D372713).view(F32)  # f32(0.044715)


def gelu_f32(x: np.ndarray) -> np.ndarray:
    """Gelu (approximate = "none") for float32 ``x``, eq. (G1)::

    (G1) y = f32(f32(0.5 · x) · f32(1 + erf(f32(x / √2))))     erf: (F1)-(F5), a true division"""
    x = np.asarray(x, F32)
    with np.errstate(invalid="ignore"):  # x = −inf: −inf · (1 + −1) is NaN, as in float64
        return (F32(0.5) * x) * (F32(1) + erf_f32(x / GELU_SQRT2))


def gelu_tanh_f32(x: np.ndarray) -> np.ndarray:
    """Gelu (approximate = "tanh") for float32 ``x``, eq. (G2)::

    (G2) a = f32(K · f32(x + f32(C · f32(f32(x · x) · x))))     K = f32(√(2/π)), C = f32(0.044715)
         y = f32(f32(0.5 · x) · f32(1 + tanh(a)))              tanh: (T1)-(T4)"""
    x = np.asarray(x, F32)
    with np.errstate(over="ignore", invalid="ignore"):  # x³ overflows from |x| = 7e12 on
        a = GELU_K * (x + GELU_C * ((x * x) * x))
        return (F32(0.5) * x) * (F32(1) + tanh_f32(a))
