"""quanta's float32 Softmax and LayerNormalization: the NumPy twin of kernels/cpp/float_ops.

np.exp and NumPy's pairwise summation cannot be reproduced in C++, so quanta defines its
own float32 algorithm once (docs/float-ops.md, equations (E1)-(E6), (R1)-(R3), (S1)-(S4),
(L1)-(L5)) and implements it twice, bit-identically: here, and in C++ (portable, AVX2,
AVX-512). Every step is one float32 IEEE operation in the order written: no fused
multiply-add, true divisions and square roots (both correctly rounded), round half to
even. The registered ops (nn.py ``Softmax``, nn_norm.py ``LayerNormalization``) call
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
"""

from __future__ import annotations

import numpy as np

__all__ = ["LANES", "exp_f32", "layer_norm_rows", "row_max", "softmax_rows", "sum16"]

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


def sum16(v: np.ndarray) -> np.ndarray:
    """Sum of every row of ``v`` [R, D] (float32) by eqs. (R1)-(R3); shape [R]."""
    v = np.asarray(v, F32)
    rows, d = v.shape
    blocks = -(-d // LANES)
    padded = np.zeros((rows, blocks * LANES), F32)
    padded[:, :d] = v
    lanes = padded.reshape(rows, blocks, LANES)
    acc = np.zeros((rows, LANES), F32)
    for b in range(blocks):  # (R1): one block at a time, in index order
        np.add(acc, lanes[:, b, :], out=acc)
    h = LANES // 2
    while h >= 1:  # (R2)
        acc = acc[:, :h] + acc[:, h : 2 * h]
        h //= 2
    return acc[:, 0]  # (R3)


def row_max(v: np.ndarray) -> np.ndarray:
    """The largest non-NaN element of every row of ``v`` [R, D] (−inf if none); shape [R]."""
    return np.fmax.reduce(np.asarray(v, F32), axis=1, initial=-np.inf).astype(F32)


def softmax_rows(v: np.ndarray) -> np.ndarray:
    """Softmax of every row of ``v`` [R, D] (float32), eqs. (S1)-(S4)::

        (S1) m   = row_max(x)
        (S2) e_i = exp_f32(f32(x_i − m))
        (S3) s   = sum16(e)
        (S4) y_i = f32(e_i / s)

    A row whose maximum is ±inf or NaN-only (every entry −inf: a fully masked attention
    row) gives NaN everywhere, as the previous reference and ONNX Runtime do."""
    v = np.asarray(v, F32)
    m = row_max(v)  # (S1)
    # −inf − −inf (the fully masked row: NaN expected), x − m below −FLT_MAX (−inf, e = 0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = exp_f32(v - m[:, None])  # (S2)
        s = sum16(e)  # (S3)
        return e / s[:, None]  # (S4)


def layer_norm_rows(v: np.ndarray, epsilon: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The statistics of every row of ``v`` [R, D] (float32), eqs. (L1)-(L4)::

        (L1) mean    = f32(sum16(x) / D)
        (L2) d_i     = f32(x_i − mean)
        (L3) var     = f32(sum16(f32(d_i · d_i)) / D)
        (L4) inv_std = f32(1 / f32(sqrt(f32(var + epsilon))))

    Returns (d [R, D], mean [R], inv_std [R]); the caller finishes with (L5)
    y_i = f32(f32(f32(d_i · inv_std) · scale_i) + bias_i)."""
    v = np.asarray(v, F32)
    count = F32(v.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):  # D = 0: 0 / 0 is NaN, as np.mean
        mean = sum16(v) / count  # (L1)
        d = v - mean[:, None]  # (L2)
        var = sum16(d * d) / count  # (L3)
        inv_std = F32(1) / np.sqrt(var + F32(epsilon))  # (L4)
    return d, mean, inv_std
