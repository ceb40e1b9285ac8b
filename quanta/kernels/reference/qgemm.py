"""The int8 GEMM core and its fused output stages: the NumPy twin of the native ``qgemm``.

The contract is the one in ``quanta/kernels/cpp/qgemm/qgemm.h``; equation numbers cite
docs/quantization-math.md.

Accumulator (int32, wrapping modulo 2^32 as ONNX's int32 accumulator)::

    acc[m,n] = Σ_k (x[m,k] − zx[m])·(w[k,n] − zw[n]) + bias[n]                       eq. (4)

``zx`` is a scalar or one zero point per row of x (shape ``x.shape[:-1]``, as
MatMulInteger allows); ``zw`` a scalar or one per column of w.

Folded form, what the kernels compute (eq. (5) with the u8 shift of eq. (8))::

    acc[m,n] = Σ_k x'[m,k]·w'[k,n] − zw'[n]·Σ_k x'[m,k] − zx'[m]·cs[n] + bias[n]
    x' = x + 128, zx' = zx + 128 for int8 x   (x' = x for uint8: vpdpbusd is u8 x s8)
    w' = w − 128, zw' = zw − 128 for uint8 w  (w' = w for int8)
    cs[n] = Σ_k (w[k,n] − zw[n])              (column sums, computed once at packing)

Output stages (``lo``/``hi`` the optional fused clamp, in the output's domain)::

    int32:   y = clip(acc, lo, hi)
    float32: y = clip(float32(acc) · multiplier[n] [+ float_bias[n]], lo, hi)   two roundings
    uint8/int8, float requantization (eq. (6)):
             y = clip(requant.requantize(acc, multiplier, zy, dtype), lo, hi)
    uint8/int8, fixed point (eq. (7)):
             y = clip(requant.requantize_fixed_point(acc, fixed_multiplier, fixed_shift, zy, dtype), lo, hi)

Three forms, each tested against the previous one:

- :func:`qgemm_loop` — the triple loop in Python integers (ruy ``reference_mul.h``), the
  truth, for small shapes only;
- :func:`qgemm` — eq. (4) vectorised in int64;
- :func:`accumulate_folded` — eq. (5)/(8) exactly as the kernels split it, which is what
  makes the header's formula a tested statement.

The output stages call :mod:`quanta.kernels.reference.requant` (the one implementation of
eqs. (6) and (7)); nothing here re-implements rounding.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference import requant

__all__ = [
    "accumulate",
    "accumulate_folded",
    "accumulate_loop",
    "output_stage",
    "pairs_fit_int16",
    "qgemm",
    "qgemm_loop",
]

# The largest sum of one sign's w' codes a vpmaddubsw pair holds exactly for every uint8
# x' (docs/kernels.md eq. (K2); kernel.h kPairCodeBound).
PAIR_CODE_BOUND = 128

_OUT_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float32))


def _wrap_int32(v: np.ndarray) -> np.ndarray:
    """Two's-complement wrap of int64 values to int32 (the accumulator's modulo 2^32)."""
    return np.asarray(v, dtype=np.int64).astype(np.uint32).view(np.int32)


def _as_column(v: np.ndarray | int | float | None, n: int, dtype: type) -> np.ndarray | None:
    if v is None:
        return None
    a = np.asarray(v, dtype=dtype)
    if a.size == 1:
        return np.full(n, a.reshape(()), dtype=dtype)
    if a.shape != (n,):
        raise ValueError(f"expected a scalar or shape ({n},), got shape {a.shape}")
    return a


def _zx_rows(zx: np.ndarray | int, x: np.ndarray) -> np.ndarray:
    """zx as an int64 array of shape x.shape[:-1] + (1,) (scalar broadcast, or per row)."""
    z = np.asarray(zx, dtype=np.int64)
    rows = x.shape[:-1]
    if z.ndim == 0:
        return np.broadcast_to(z, (*rows, 1))
    if z.shape == rows or (z.ndim == 1 and z.size == int(np.prod(rows))):
        return z.reshape((*rows, 1))
    raise ValueError(f"zx: expected a scalar or shape {rows}, got shape {z.shape}")


def _check_operands(x: np.ndarray, w: np.ndarray) -> None:
    if x.dtype not in (np.uint8, np.int8):
        raise TypeError(f"x: expected uint8 or int8, got {x.dtype}")
    if w.dtype not in (np.uint8, np.int8):
        raise TypeError(f"w: expected uint8 or int8, got {w.dtype}")
    if w.ndim != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"x [..., K] and w [K, N]: expected matching K, got shapes {x.shape} and {w.shape}")


def accumulate_loop(
    x: np.ndarray, w: np.ndarray, zx: np.ndarray | int, zw: np.ndarray | int, bias: np.ndarray | None = None
) -> np.ndarray:
    """eq. (4) as a triple loop over Python integers, wrapped to int32 at the end.

    >>> accumulate_loop(np.array([[3, 4]], np.uint8), np.array([[1], [-2]], np.int8), 1, 0)
    array([[-4]], dtype=int32)
    """
    x, w = np.asarray(x), np.asarray(w)
    _check_operands(x, w)
    x2 = x.reshape(-1, x.shape[-1])
    zx_row = _zx_rows(zx, x).reshape(-1)
    M, K = x2.shape
    N = w.shape[1]
    zw_col = _as_column(zw, N, np.int64)
    b = _as_column(bias, N, np.int64)
    out = np.zeros((M, N), dtype=np.int32)
    for m in range(M):
        for n in range(N):
            acc = 0
            for k in range(K):
                acc += (int(x2[m, k]) - int(zx_row[m])) * (int(w[k, n]) - int(zw_col[n]))
            if b is not None:
                acc += int(b[n])
            out[m, n] = _wrap_int32(acc)
    return out.reshape((*x.shape[:-1], N))


def accumulate(
    x: np.ndarray, w: np.ndarray, zx: np.ndarray | int, zw: np.ndarray | int, bias: np.ndarray | None = None
) -> np.ndarray:
    """eq. (4) vectorised: an int64 matmul of the zero-point-shifted operands, wrapped to int32.

    Exact in int64 while K < 2^33 / 255^2; the wrap then equals int32 arithmetic mod 2^32.
    """
    x, w = np.asarray(x), np.asarray(w)
    _check_operands(x, w)
    N = w.shape[1]
    zw_col = _as_column(zw, N, np.int64)
    acc = (x.astype(np.int64) - _zx_rows(zx, x)) @ (w.astype(np.int64) - zw_col)
    if bias is not None:
        acc = acc + _as_column(bias, N, np.int64)
    return _wrap_int32(acc)


def accumulate_folded(
    x: np.ndarray, w: np.ndarray, zx: np.ndarray | int, zw: np.ndarray | int, bias: np.ndarray | None = None
) -> np.ndarray:
    """eq. (5) with the u8 shift of eq. (8), split into the terms the kernels compute.

    ``Σ x'·w'`` is the micro-kernel product (u8 × s8), ``cs`` the packed column sums,
    ``Σ x'`` the per-call row sums; every term wraps to int32 like the kernels' adds.
    """
    x, w = np.asarray(x), np.asarray(w)
    _check_operands(x, w)
    N = w.shape[1]
    K = w.shape[0]
    zw_col = _as_column(zw, N, np.int64)
    x_shift = 128 if x.dtype == np.int8 else 0
    w_shift = 128 if w.dtype == np.uint8 else 0
    xp = x.astype(np.int64) + x_shift  # x' in [0, 255]
    zxp = _zx_rows(zx, x) + x_shift  # [..., 1]
    wp = w.astype(np.int64) - w_shift  # w' in [-128, 127]
    zwp = zw_col - w_shift
    assert (
        xp.min(initial=0) >= 0
        and xp.max(initial=0) <= 255
        and wp.min(initial=0) >= -128
        and wp.max(initial=0) <= 127
    )
    product = _wrap_int32(xp @ wp)  # the kernels' Σ x'·w'
    cs = _wrap_int32(w.astype(np.int64).sum(axis=0) - K * zw_col)  # Σ_k (w − zw), packing
    rowsum = _wrap_int32(xp.sum(axis=-1))  # Σ_k x'
    b = np.zeros(N, np.int64) if bias is None else _as_column(bias, N, np.int64)
    zx_term = _wrap_int32(zxp * cs.astype(np.int64))  # zx'·cs (a column constant for a scalar zx)
    zw_term = _wrap_int32(zwp * rowsum[..., None].astype(np.int64))  # zw'·Σ x'
    return _wrap_int32(product.astype(np.int64) + b - zx_term - zw_term)


def pairs_fit_int16(w: np.ndarray) -> bool:
    """Whether the avx2 pair-safe family (``qgemm_u8s8p_s32_5x16c4__avx2``) computes
    ``Σ_k x'·w'`` of w [K, N] exactly: twin of ``pack.cc::weights_pairs_fit_int16``.

    ``vpmaddubsw`` adds ``x'[2j]·w'[2j, n] + x'[2j+1]·w'[2j+1, n]`` in a saturating int16
    (k paired from 0 in w's own K order; a lone last k pairs with the packing's 0). With
    x' in [0, 255] the pair lies in ``[−255·Q, 255·P]``, P the sum of its positive w', Q the
    sum of its negative w' magnitudes (docs/kernels.md eq. (K1)), so it is exact for every
    x' iff ``P <= 128`` and ``Q <= 128`` (eq. (K2): 255·128 = 32640 <= 32767, 255·129 >
    32768). w' = w for int8 w and w − 128 for uint8 w; the zero points do not enter (the
    kernels add their terms in int32, eq. (5)).

    >>> pairs_fit_int16(np.array([[127], [1]], np.int8)), pairs_fit_int16(np.array([[127], [2]], np.int8))
    (True, False)
    >>> pairs_fit_int16(np.array([[-128], [0], [-128]], np.int8))  # k = 2 pairs with the padding
    True
    """
    w = np.asarray(w)
    if w.dtype not in (np.uint8, np.int8) or w.ndim != 2:
        raise TypeError(f"w: expected int8 or uint8 [K, N], got {w.dtype} of shape {w.shape}")
    wp = w.astype(np.int64) - (128 if w.dtype == np.uint8 else 0)
    wp = np.pad(wp, ((0, wp.shape[0] % 2), (0, 0)))  # the packing's zero after an odd K
    pairs = wp.reshape(-1, 2, wp.shape[1])
    positive = np.maximum(pairs, 0).sum(axis=1)
    negative = np.maximum(-pairs, 0).sum(axis=1)
    return bool(positive.max(initial=0) <= PAIR_CODE_BOUND and negative.max(initial=0) <= PAIR_CODE_BOUND)


def output_stage(
    acc: np.ndarray,
    out_dtype: np.dtype | type | str = np.int32,
    *,
    multiplier: np.ndarray | float | None = None,
    float_bias: np.ndarray | None = None,
    fixed_multiplier: np.ndarray | int | None = None,
    fixed_shift: np.ndarray | int | None = None,
    zy: int = 0,
    clamp: tuple[float, float] | None = None,
) -> np.ndarray:
    """The fused output stage of the contract applied to an int32 accumulator [..., N].

    Ties follow eq. (6) (half to even) or eq. (7) (gemmlowp), via :mod:`requant`:

    >>> output_stage(np.array([[5, 7, -5, -7]], np.int32), np.int8, multiplier=np.float32(0.5), zy=1)
    array([[ 3,  5, -1, -3]], dtype=int8)
    """
    acc = np.asarray(acc)
    if acc.dtype != np.int32:
        raise TypeError(f"acc: expected int32, got {acc.dtype}")
    dt = np.dtype(out_dtype)
    if dt not in _OUT_DTYPES:
        raise ValueError(f"out_dtype: expected one of uint8, int8, int32, float32, got {dt}")
    N = acc.shape[-1]
    if dt == np.int32:
        y = acc
        if clamp is not None:
            y = np.clip(y, np.int32(clamp[0]), np.int32(clamp[1])).astype(np.int32)
        return y
    if dt == np.float32:
        m = _as_column(multiplier, N, np.float32)
        y = np.multiply(acc.astype(np.float32), m, dtype=np.float32)
        if float_bias is not None:
            y = np.add(y, _as_column(float_bias, N, np.float32), dtype=np.float32)
        if clamp is not None:
            y = np.minimum(np.maximum(y, np.float32(clamp[0])), np.float32(clamp[1]))
        return y
    if multiplier is not None:
        y = requant.requantize(acc, _as_column(multiplier, N, np.float32), zy, dt)
    else:
        y = requant.requantize_fixed_point(
            acc, _as_column(fixed_multiplier, N, np.int64), _as_column(fixed_shift, N, np.int64), zy, dt
        )
    if clamp is not None:
        y = np.clip(y, dt.type(clamp[0]), dt.type(clamp[1])).astype(dt)
    return y


def qgemm_loop(
    x: np.ndarray,
    w: np.ndarray,
    zx: np.ndarray | int,
    zw: np.ndarray | int,
    out_dtype: np.dtype | type | str = np.int32,
    *,
    bias: np.ndarray | None = None,
    **stage: object,
) -> np.ndarray:
    """The truth: :func:`accumulate_loop` then :func:`output_stage` (small shapes only)."""
    return output_stage(accumulate_loop(x, w, zx, zw, bias), out_dtype, **stage)


def qgemm(
    x: np.ndarray,
    w: np.ndarray,
    zx: np.ndarray | int,
    zw: np.ndarray | int,
    out_dtype: np.dtype | type | str = np.int32,
    *,
    bias: np.ndarray | None = None,
    row_bias: np.ndarray | None = None,
    row_multiplier: np.ndarray | None = None,
    **stage: object,
) -> np.ndarray:
    """The vectorised twin of ``_native.qgemm`` (x [..., K], w [K, N] unpacked).

    Keyword arguments of the output stage as :func:`output_stage` (``multiplier``,
    ``float_bias``, ``fixed_multiplier``, ``fixed_shift``, ``zy``, ``clamp``). The
    transposed form (qgemm.h): ``row_bias`` (int32, one per row of x) is added to the
    accumulator, wrapping; ``row_multiplier`` (float32, one per row) replaces
    ``multiplier``, row m's output stage using row_multiplier[m].

    >>> x = np.array([[130, 2], [7, 255]], np.uint8)
    >>> w = np.array([[1, -2, 3], [-4, 5, -6]], np.int8)
    >>> qgemm(x, w, 128, np.array([0, 1, -1]), bias=np.array([10, 0, -10], np.int32))
    ... # row 0: x − zx = [2, −126], w − zw = [[1, −3, 4], [−4, 4, −5]] -> [506, −510, 638] + bias
    array([[  516,  -510,   628],
           [ -619,   871, -1129]], dtype=int32)
    """
    acc = accumulate(x, w, zx, zw, bias)
    if row_bias is not None:
        rb = np.asarray(row_bias, np.int64).reshape((*acc.shape[:-1], 1))
        acc = _wrap_int32(acc.astype(np.int64) + rb)
    if row_multiplier is None:
        return output_stage(acc, out_dtype, **stage)
    # one output stage per row: the same float32 operations with that row's multiplier
    rm = np.asarray(row_multiplier, np.float32).reshape(-1)
    rows = acc.reshape(-1, acc.shape[-1])
    y = [output_stage(rows[i : i + 1], out_dtype, multiplier=rm[i], **stage) for i in range(rows.shape[0])]
    out = np.concatenate(y, axis=0) if y else output_stage(rows, out_dtype, multiplier=np.float32(1), **stage)
    return out.reshape(acc.shape)
