"""Pair-safe int8 weights: full-range codes that ONNX Runtime's saturating kernels sum exactly
(``Recipe(weight_pairs="ort")``, docs/debugger.md eq. (12m)).

On x86 CPUs without VNNI, ONNX Runtime's u8·s8 GEMM (MLAS ``MlasGemmU8S8KernelAvx2``: its
QLinearConv, QLinearMatMul, MatMulInteger, DynamicQuantizeLSTM) adds the products of two
adjacent reduction steps, x_a·w_a + x_b·w_b, in a saturating int16
(ort_saturation.py). With x in [0, 255] the pair stays inside [−32768, 32767] for every
input exactly when::

    255 · Σ_{i∈{a,b}, w_i>0} w_i ≤ 32767   and   255 · Σ_{i∈{a,b}, w_i<0} |w_i| ≤ 32768
    ⇔   P(w_a, w_b) = max(w_a⁺ + w_b⁺, w_a⁻ + w_b⁻) ≤ 128                        (12m)

(w⁺ = max(w, 0), w⁻ = max(−w, 0); 255·128 = 32640). A pair of opposite signs never
overflows, and a lone code never does (255·128 < 32768). So only same-sign pairs whose
magnitudes add past 128 must change, which keeps the 8-bit grid (and its scale) for
every weight, against ``weight_bits=7``, which halves the grid of every layer.

The pairs are ORT's, on the raw int8 codes it multiplies (any zero point: MLAS corrects
zero points afterwards from row and column sums): for a Conv the (kh, kw, c) im2col order
of one group, k = t·C_g + c, paired from k = 0, an odd K's last code paired with the
zero padding (reference/mlas_qconv.py (QC1)-(QC2), checked against ORT bit for bit); for
a MatMul / Gemm / LSTM the K axis. quanta stores a Conv's weights as [F, C_g, kh, kw]
and GPTQ visits its columns in (c, kh, kw) order, so the two codes of a pair are
generally far apart in GPTQ's order and either may come first; :func:`pair_partners`
maps every column to its partner's column in quanta's layout, and the constraint acts
on whichever of the two is rounded second (:func:`pair_bounds`).

Left alone, as ORT does not saturate them: depthwise Convs (ORT widens their taps to
int16), uint8 weights (MLAS's u8·u8 kernel widens to int16), and layers whose input is
int8 (ORT runs a QDQ Conv with int8 activations unfused, in float). The constraint is a
property of the written file, the same on every host.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from quanta.kernels.reference.qgemm import PAIR_CODE_BOUND

__all__ = [
    "PAIR_LIMIT",
    "conv_partners",
    "k_partners",
    "pair_bounds",
    "pair_excess",
    "pair_partners",
    "project_pairs",
]

#: the largest sum of same-sign code magnitudes in a pair that no uint8 input overflows, eq. (12m):
#: the bound of the kernels' own pair check (reference/qgemm.py pairs_fit_int16, eq. (K2)), one fact
PAIR_LIMIT = PAIR_CODE_BOUND


def k_partners(k: int) -> np.ndarray:
    """The partner of each of ``k`` reduction steps paired from 0 (2j with 2j + 1); −1 for
    an odd K's last step (paired with MLAS's zero padding).

    >>> k_partners(5).tolist()
    [1, 0, 3, 2, -1]
    """
    idx = np.arange(k)
    out = idx ^ 1
    out[out >= k] = -1
    return out


def conv_partners(channels: int, kernel: Sequence[int]) -> np.ndarray:
    """For a Conv group of ``channels`` input channels and taps ``kernel``, the partner of
    each column of quanta's layout (column c·T + t, T = prod(kernel), as
    ``w.reshape(F, -1)``) in ORT's pairing, whose reduction index is k = t·C + c; −1 where
    the partner is the zero padding.

    >>> conv_partners(3, (1, 2)).tolist()  # ORT's pairs (t0 c0, t0 c1) (t0 c2, t1 c0) (t1 c1, t1 c2)
    [2, 4, 0, 5, 1, 3]
    """
    taps = int(np.prod(kernel, dtype=np.int64)) if len(kernel) else 1
    k = channels * taps
    col = np.arange(k)
    c, t = col // taps, col % taps
    ort_k = t * channels + c
    partner_k = k_partners(k)[ort_k]
    safe = np.maximum(partner_k, 0)
    partner_col = (safe % channels) * taps + safe // channels
    return np.where(partner_k >= 0, partner_col, -1)


def pair_partners(op: str, shape: Sequence[int], *, trans_b: bool = False) -> np.ndarray:
    """The partner columns of a weight of ``shape`` read by ``op`` in quanta's [rows, K]
    layout (rounding.RoundedLayer.rows_2d): a Conv's rows are its filters [F, C_g, taps...]
    and its columns one group's (c, taps); a MatMul's or Gemm's columns are K, the first
    axis of [K, N] (the second with ``trans_b``), an LSTM's the last of [D, 4H, K].

    >>> pair_partners("MatMul", (3, 8)).tolist(), pair_partners("Gemm", (8, 3), trans_b=True).tolist()
    ([1, 0, -1], [1, 0, -1])
    """
    if op in ("Conv", "QLinearConv"):
        return conv_partners(int(shape[1]), tuple(int(s) for s in shape[2:]))
    if op in ("LSTM", "GRU") or trans_b:
        return k_partners(int(shape[-1]))
    return k_partners(int(shape[0]))


def pair_bounds(partner_codes: np.ndarray, qmin: int, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """The range eq. (12m) leaves a code whose partner already holds ``partner_codes``:
    [qmin, min(qmax, 128 − p)] for p > 0, [max(qmin, −128 − p), qmax] for p < 0, the whole
    grid for p = 0 (never empty: |p| ≤ 128).

    >>> lo, hi = pair_bounds(np.array([100, -128, 0]), -127, 127)
    >>> lo.astype(int).tolist(), hi.astype(int).tolist()
    ([-127, 0, -127], [28, 127, 127])
    """
    p = np.asarray(partner_codes, np.float64)
    hi = np.where(p > 0, np.minimum(qmax, PAIR_LIMIT - p), qmax)
    lo = np.where(p < 0, np.maximum(qmin, -PAIR_LIMIT - p), qmin)
    return lo, hi


def pair_excess(codes: np.ndarray, partners: np.ndarray) -> np.ndarray:
    """max(0, P(w_a, w_b) − 128) of eq. (12m) for every column of ``codes`` [..., K] and
    its partner (0 where there is none): nonzero exactly where a uint8 input can
    saturate the pair."""
    q = np.asarray(codes, np.int64)
    has = partners >= 0
    mate = np.where(has, q[..., np.maximum(partners, 0)], 0)
    same = (q > 0) & (mate > 0) | (q < 0) & (mate < 0)
    return np.where(same & has, np.maximum(np.abs(q + mate) - PAIR_LIMIT, 0), 0)


def project_pairs(
    u: np.ndarray, codes: np.ndarray, partners: np.ndarray, qmin: int, qmax: int
) -> tuple[np.ndarray, int]:
    """``codes`` [..., K] with every pair that breaks eq. (12m) replaced by the integer
    pair nearest to the real codes ``u`` (w / s + z, the values nearest rounding rounds)
    on the boundary w_a + w_b = ±128: the nearest integers already break the bound, the
    squared error is convex and separable, so the constrained minimum lies on the
    boundary, at w_a = round((±128 + u_a − u_b) / 2) kept on the grid. Pairs that keep
    the bound are untouched (GPTQ's codes stay GPTQ's). Returns (codes, codes moved)."""
    q = np.array(codes, np.int64)
    u = np.asarray(u, np.float64)
    a = np.flatnonzero(partners > np.arange(partners.size))  # each pair once
    b = partners[a]
    qa, qb = q[..., a], q[..., b]
    s = qa + qb
    moved = 0
    for sign in (1, -1):
        bad = s * sign > PAIR_LIMIT
        if not bad.any():
            continue
        target = sign * PAIR_LIMIT
        lo, hi = max(qmin, target - qmax), min(qmax, target - qmin)
        na = np.clip(np.rint((target + u[..., a] - u[..., b]) / 2), lo, hi).astype(np.int64)
        new_a = np.where(bad, na, qa)
        new_b = np.where(bad, target - na, qb)
        moved += int(np.count_nonzero(new_a != qa) + np.count_nonzero(new_b != qb))
        qa, qb = new_a, new_b
    q[..., a], q[..., b] = qa, qb
    return q, moved
