"""Integer-only numerics: the golden of the ``quanta.int`` operator stage (normative).

Every operator here computes in integers only (int8/int16/int32/int64 intermediates, no
float anywhere): the arithmetic an integer-only accelerator (TFLite Micro, CMSIS-NN, Arm
Ethos-U, TOSA) runs. Whatever needs real numbers — requantization multipliers, lookup
tables, LayerNormalization's scaled gamma — was computed once at compile time by the
lowering (``quanta/passes/lower/integer_only.py``, docs/passes.md "Integer-only stage")
and arrives as integer attributes or inputs. The npu-sim target's kernels
(``quanta/targets/npu_sim/kernels.py``, the C++ ``intonly`` family) are bit-exact with
these functions.

Requantization (docs/quantization-math.md eqs. (7), (IO1)-(IO3)): a real multiplier
``m`` is carried as ``multiplier · 2^(shift - 31)`` with ``multiplier ∈ [2^30, 2^31)``
(or 0) and ``shift ∈ [-31, 30]``, applied to an int32 accumulator in one of three named
rounding modes:

- ``"double"`` — TFLite ``MultiplyByQuantizedMultiplier`` (gemmlowp): SRDHM (ties half
  up) then RoundingDivideByPOT (ties half away from zero): two roundings;
- ``"single"`` — TFLite single rounding (``TFLITE_SINGLE_ROUNDING``):
  ``(acc · multiplier + 2^(t-1)) >> t`` with ``t = 31 - shift``: one rounding, ties half up;
- ``"tosa"`` — TOSA ``apply_scale_32`` with ``double_round = true``: as single, but when
  the total shift exceeds 31 the rounding constant moves by ``±2^30`` (sign of ``acc``):
  TOSA's one-step form of TFLite's double rounding. For ``shift <= 0`` it gives exactly
  the "double" results (nested floor divisions compose); for ``shift > 0`` it rounds
  once, as "single" does, where "double" shifts the accumulator left in int32 first
  (tests/intonly/test_requant_modes.py).

Operators (domain ``quanta.int``), each ``fn(ctx, *inputs, **attributes)``:

=================  ============================================================
``IntRescale``     ``y = sat(apply_scale(x - zx) + zy)`` (TOSA RESCALE)
``IntConv``        ``acc = Σ x_pad·w + c``, padded with ``zx``; ``c = bias - zx·Σw``
``IntMatMul``      ``acc = Σ a·b - zb·Σ_k a + c`` (b constant, ``c`` folds ``za``), or
                   the four terms at run time when ``c`` is absent
``IntAdd``/``Mul`` TFLite's integer Add (inputs left-shifted by 20, rescaled, summed,
                   rescaled) and Mul (``(a - za)(b - zb)`` rescaled)
``IntLookup``      ``y = table[bits(x)]`` (8-bit inputs; every unary non-linearity), or
                   for int16 inputs a 513-entry table with linear interpolation (TFLite)
``IntSoftmax``     ``e = E[max - x]`` (a 256-entry int32 exp table; int16 ``x``: I-BERT's
                   i-exp polynomial), ``y = round(e·2^k / Σe) + zy``
``IntGelu``        I-BERT's i-GELU (second-order polynomial erf) for int16 ``x``
``IntLayerNorm``   ``c = n·(x - zx) - Σ(x - zx)``, ``D = isqrt((Σc² + ε) // n)`` (Newton),
                   ``y = round((c·G + B·D) / (D·2^g)) + zy``
``IntGlobalAveragePool````y = sat(apply_scale(Σ(x - zx)) + zy)``
=================  ============================================================

``act_min`` / ``act_max`` (optional attributes of IntConv, IntMatMul, IntAdd, IntMul) clamp the
result after the zero point is added (a fused ReLU/ReLU6), inside the storage range.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.conv_geometry import conv_attrs, conv_nd
from quanta.kernels.reference.registry import OpContext, OpError, register
from quanta.kernels.reference.requant import (
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
)

__all__ = [
    "INT_DOMAIN",
    "ROUNDING_MODES",
    "apply_scale",
    "bit_length",
    "int_add",
    "int_conv",
    "int_exp",
    "int_gelu",
    "int_global_average_pool",
    "int_layer_norm",
    "int_lookup",
    "int_matmul",
    "int_mul",
    "int_rescale",
    "int_softmax",
    "isqrt",
    "round_div",
    "storage_dtype",
]

INT_DOMAIN = "quanta.int"
ROUNDING_MODES = ("double", "single", "tosa")
#: fixed-point bits of the Softmax exp table: E[0] = 2^EXP_BITS (the row maximum)
EXP_BITS = 20
_STORAGE = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32}
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


def storage_dtype(name: str) -> np.dtype:
    """``"int8"`` -> ``np.dtype(np.int8)`` (the ``out_type`` attribute)."""
    try:
        return np.dtype(_STORAGE[name])
    except KeyError:
        raise OpError(f"out_type: expected one of {sorted(_STORAGE)}, got {name!r}") from None


def _range(dt: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def _check_mode(rounding: str) -> None:
    if rounding not in ROUNDING_MODES:
        raise OpError(f"rounding: expected one of {ROUNDING_MODES}, got {rounding!r}")


def apply_scale(
    acc: np.ndarray, multiplier: np.ndarray | int, shift: np.ndarray | int, rounding: str
) -> np.ndarray:
    """``acc · multiplier · 2^(shift - 31)`` rounded in ``rounding`` mode (module docstring).

    ``acc`` is int32 (int64 accepted when every value fits int32); ``multiplier`` and
    ``shift`` broadcast against it (per channel). Returns int64 (the caller adds the zero
    point and saturates). Ties of 0.5 show the three modes apart:

    >>> a = np.array([5, -5, 3, -3]); m = 1 << 30   # m·2^(shift-31) = 2^-3 with shift -2
    >>> [apply_scale(a * 4 + 0, m, -2, r).tolist() for r in ("double", "single", "tosa")]
    [[3, -3, 2, -2], [3, -2, 2, -1], [3, -3, 2, -2]]
    """
    _check_mode(rounding)
    a = np.asarray(acc).astype(np.int64)
    mult = np.asarray(multiplier).astype(np.int64)
    sh = np.asarray(shift).astype(np.int64)
    if np.any(sh > 30) or np.any(sh < -31):
        raise OpError(f"shift: expected values in [-31, 30], got {np.unique(sh).tolist()}")
    if np.any(mult < 0) or np.any(mult > _I32_MAX):
        raise OpError("multiplier: expected values in [0, 2^31)")
    if rounding == "double":
        left = np.maximum(sh, 0)
        right = np.maximum(-sh, 0)
        shifted = (a << left).astype(np.int32)  # wraps as the int32 C++ does
        high = saturating_rounding_doubling_high_mul(shifted, mult.astype(np.int64))
        return rounding_divide_by_pot(high, right).astype(np.int64)
    total = 31 - sh  # in [1, 62]
    rnd = np.left_shift(np.int64(1), total - 1)
    if rounding == "tosa":
        big = total > 31
        rnd = np.where(big & (a >= 0), rnd + (1 << 30), rnd)
        rnd = np.where(big & (a < 0), rnd - (1 << 30), rnd)
    # |a·mult| < 2^62 and |rnd| <= 2^61 + 2^30: the int64 sum cannot overflow
    return (a * mult + rnd) >> total


def _saturate(v: np.ndarray, dt: np.dtype, act_min: int | None, act_max: int | None) -> np.ndarray:
    lo, hi = _range(dt)
    if act_min is not None:
        lo = max(lo, int(act_min))
    if act_max is not None:
        hi = min(hi, int(act_max))
    return np.clip(v, lo, hi).astype(dt)


def _wrap32(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.int64).astype(np.int32).astype(np.int64)


def _channel(v: np.ndarray | list | int, n: int, ndim: int, axis: int, what: str) -> np.ndarray:
    """A per-tensor (size 1) or per-channel (size n) parameter shaped to broadcast on ``axis``."""
    a = np.asarray(v, np.int64).reshape(-1)
    if a.size == 1:
        return a.reshape(())
    if a.size != n:
        raise OpError(f"{what}: expected 1 or {n} values (one per output channel), got {a.size}")
    shape = [1] * ndim
    shape[axis] = n
    return a.reshape(shape)


def int_rescale(
    x: np.ndarray,
    *,
    input_zero_point: int,
    output_zero_point: int,
    multiplier: list[int] | int,
    shift: list[int] | int,
    rounding: str = "double",
    out_type: str = "int8",
) -> np.ndarray:
    """``y = sat(apply_scale(x - zx) + zy)``: a change of quantization parameters."""
    x = np.asarray(x)
    v = apply_scale(x.astype(np.int64) - int(input_zero_point), _flat(multiplier), _flat(shift), rounding)
    return _saturate(v + int(output_zero_point), storage_dtype(out_type), None, None)


def _flat(v: list[int] | int | np.ndarray) -> np.ndarray:
    a = np.asarray(v, np.int64).reshape(-1)
    return a.reshape(()) if a.size == 1 else a


def _check_int8_operand(name: str, v: np.ndarray, kinds: tuple = (np.int8, np.uint8, np.int16)) -> None:
    if v.dtype not in tuple(np.dtype(k) for k in kinds):
        raise OpError(f"{name}: expected one of {[np.dtype(k).name for k in kinds]}, got {v.dtype}")


def int_conv(
    x: np.ndarray,
    w: np.ndarray,
    c: np.ndarray,
    *,
    x_zero_point: int,
    y_zero_point: int,
    multiplier: list[int],
    shift: list[int],
    rounding: str = "double",
    out_type: str = "int8",
    group: int = 1,
    act_min: int | None = None,
    act_max: int | None = None,
    **geometry,
) -> np.ndarray:
    """Integer convolution, NCHW: ``acc = Σ x_pad · w + c`` with the padding holding ``zx``
    (the real 0) and ``c[m] = bias[m] - zx · Σ w[m]`` (the column-sum constant, eq. (IO4));
    ``y = sat(apply_scale(acc, M[m], s[m]) + zy)``. Weights are symmetric (no zero point).
    """
    x = np.asarray(x)
    w = np.asarray(w)
    _check_int8_operand("x", x)
    _check_int8_operand("w", w, (np.int8,))
    if x.ndim < 3 or w.ndim != x.ndim:
        raise OpError(
            f"x, w: expected (N, C, ...) and (M, C/group, ...) of equal rank >= 3, got {x.shape}, {w.shape}"
        )
    m_out = w.shape[0]
    c = np.asarray(c)
    if c.dtype != np.int32 or c.shape != (m_out,):
        raise OpError(f"c: expected int32 of shape ({m_out},), got {c.dtype}{list(c.shape)}")
    geom = conv_attrs(x.shape, w.shape[2:], **geometry)
    acc = conv_nd(x.astype(np.int64), w.astype(np.int64), geom, group, pad_value=int(x_zero_point))
    chan = (m_out,) + (1,) * (x.ndim - 2)
    acc = _wrap32(acc + c.astype(np.int64).reshape(chan))
    mult = _channel(multiplier, m_out, x.ndim, 1, "multiplier")
    sh = _channel(shift, m_out, x.ndim, 1, "shift")
    v = apply_scale(acc, mult, sh, rounding) + int(y_zero_point)
    return _saturate(v, storage_dtype(out_type), act_min, act_max)


def int_matmul(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    a_zero_point: int,
    b_zero_point: int = 0,
    y_zero_point: int,
    multiplier: list[int] | int,
    shift: list[int] | int,
    rounding: str = "double",
    out_type: str = "int8",
    act_min: int | None = None,
    act_max: int | None = None,
) -> np.ndarray:
    """Integer matrix product with the four-term zero-point decomposition (eq. (IO4))::

        Σ_k (a - za)(b - zb) = Σ a·b - zb·Σ_k a - za·Σ_k b + K·za·zb

    With ``c`` (int32 [N], ``b`` a constant): ``c = bias - za·Σ_k b + K·za·zb`` was folded
    at compile time, and ``acc = Σ a·b - zb·Σ_k a + c``. Without ``c``: every term at run
    time (``b`` an activation, attention's Q·Kᵀ and P·V). Multipliers per column of b or
    per tensor.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    _check_int8_operand("a", a)
    _check_int8_operand("b", b)
    if a.ndim < 1 or b.ndim < 2:
        raise OpError(f"a, b: expected rank >= 1 and >= 2, got {a.shape}, {b.shape}")
    k = a.shape[-1]
    if b.shape[-2] != k:
        raise OpError(f"a, b: inner dimensions differ: {a.shape} @ {b.shape}")
    a64 = a.astype(np.int64)
    b64 = b.astype(np.int64)
    za, zb = int(a_zero_point), int(b_zero_point)
    acc = np.matmul(a64, b64) - zb * a64.sum(axis=-1, keepdims=True)
    n = b.shape[-1]
    if c is not None:
        c = np.asarray(c)
        if c.dtype != np.int32 or c.shape != (n,):
            raise OpError(f"c: expected int32 of shape ({n},), got {c.dtype}{list(c.shape)}")
        acc = acc + c.astype(np.int64)
    else:
        acc = acc - za * b64.sum(axis=-2, keepdims=True) + k * za * zb
    acc = _wrap32(acc)
    mult = _channel(multiplier, n, acc.ndim, acc.ndim - 1, "multiplier")
    sh = _channel(shift, n, acc.ndim, acc.ndim - 1, "shift")
    v = apply_scale(acc, mult, sh, rounding) + int(y_zero_point)
    return _saturate(v, storage_dtype(out_type), act_min, act_max)


def int_add(
    a: np.ndarray,
    b: np.ndarray,
    *,
    a_zero_point: int,
    b_zero_point: int,
    y_zero_point: int,
    a_multiplier: int,
    a_shift: int,
    b_multiplier: int,
    b_shift: int,
    multiplier: int,
    shift: int,
    left_shift: int = 20,
    rounding: str = "double",
    out_type: str = "int8",
    act_min: int | None = None,
    act_max: int | None = None,
) -> np.ndarray:
    """TFLite's integer Add (eq. (IO5)), broadcasting::

        a' = apply_scale((a - za) · 2^L, Ma, sa);  b' likewise
        y  = sat(apply_scale(a' + b', M, s) + zy)

    with ``ma = sa_real / (2·max(sa_real, sb_real))`` (< 1) and
    ``m = 2·max(sa_real, sb_real) / (2^L · sy_real)``; ``L = 20`` for 8-bit inputs (15 for
    16-bit) keeps the shifted inputs within int32.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    _check_int8_operand("a", a)
    _check_int8_operand("b", b)
    a1 = apply_scale(
        (a.astype(np.int64) - int(a_zero_point)) << int(left_shift), a_multiplier, a_shift, rounding
    )
    b1 = apply_scale(
        (b.astype(np.int64) - int(b_zero_point)) << int(left_shift), b_multiplier, b_shift, rounding
    )
    s = _wrap32(a1 + b1)
    v = apply_scale(s, multiplier, shift, rounding) + int(y_zero_point)
    return _saturate(v, storage_dtype(out_type), act_min, act_max)


def int_mul(
    a: np.ndarray,
    b: np.ndarray,
    *,
    a_zero_point: int,
    b_zero_point: int,
    y_zero_point: int,
    multiplier: int,
    shift: int,
    rounding: str = "double",
    out_type: str = "int8",
    act_min: int | None = None,
    act_max: int | None = None,
) -> np.ndarray:
    """``y = sat(apply_scale((a - za)(b - zb), M, s) + zy)``, ``m = sa·sb/sy`` (eq. (IO6))."""
    a = np.asarray(a)
    b = np.asarray(b)
    _check_int8_operand("a", a)
    _check_int8_operand("b", b)
    prod = _wrap32((a.astype(np.int64) - int(a_zero_point)) * (b.astype(np.int64) - int(b_zero_point)))
    v = apply_scale(prod, multiplier, shift, rounding) + int(y_zero_point)
    return _saturate(v, storage_dtype(out_type), act_min, act_max)


def int_lookup(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``y = table[bits(x)]`` for an 8-bit ``x`` (int8 -128..-1 index 128..255; the
    table's dtype is the output's); for an int16 ``x`` and a 513-entry int16 table,
    TFLite's int16 lookup with linear interpolation (eq. (IO14))::

        j = (x + 32768) >> 7,  o = (x + 32768) & 127
        y = T[j] + ((T[j + 1] - T[j])·o + 64) >> 7      (int32; the result lies between T[j] and T[j + 1])

    >>> int_lookup(np.array([-128, -1, 0, 5], np.int8), np.arange(256, dtype=np.int16))
    array([128, 255,   0,   5], dtype=int16)
    >>> t = (np.arange(513) * 8 - 2048).astype(np.int16)   # y ≈ x / 16, sampled every 128 codes
    >>> int_lookup(np.array([-32768, -32705, 0, 100, 32767], np.int16), t).tolist()
    [-2048, -2044, 0, 6, 2048]
    """
    x = np.asarray(x)
    table = np.asarray(table)
    if x.dtype == np.dtype(np.int16):
        if table.shape != (513,) or table.dtype != np.dtype(np.int16):
            raise OpError(
                f"table: expected 513 int16 entries for an int16 input (512 steps of 128 codes and "
                f"the end point), got {table.dtype}{list(table.shape)}"
            )
        u = x.astype(np.int32) + 32768
        j, o = u >> 7, u & 127
        base = table.astype(np.int32)[j]
        slope = table.astype(np.int32)[j + 1] - base
        return (base + ((slope * o + 64) >> 7)).astype(np.int16)
    if x.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise OpError(f"x: expected int8 or uint8 (a table has 256 entries) or int16, got {x.dtype}")
    if table.shape != (256,) or table.dtype.kind not in "iu":
        raise OpError(f"table: expected 256 integers, got {table.dtype}{list(table.shape)}")
    return table[x.view(np.uint8)]


def round_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``round(num / den)`` with ties away from zero, ``den > 0``, in int64 (exact).

    >>> round_div(np.array([5, -5, 7, -7, 6]), np.array(2)).tolist()
    [3, -3, 4, -4, 3]
    """
    num = np.asarray(num, np.int64)
    den = np.asarray(den, np.int64)
    mag = (np.abs(num) * 2 + den) // (den * 2)
    return np.where(num < 0, -mag, mag)


def int_exp(d: np.ndarray, x0: int, b: int, c: int, exp_shift: int) -> np.ndarray:
    """I-BERT's i-exp (eq. (IO12)) of ``-d`` for ``d >= 0`` in units of the input scale
    ``sx``, as ``floor(p · 2^(exp_shift - z))``::

        z = d // -x0,  r = -(d - z·(-x0)) ∈ (x0, 0]      (-x0 = floor(ln2 / sx): exp(-d·sx) = 2^-z · exp(r·sx))
        p = (r + b)² + c                                 (b = floor(1.353/sx), c = floor(0.344/(0.3585·sx²)))

    ``exp(r·sx) ≈ 0.3585 · sx² · p``; ``exp_shift`` (compile time) scales ``p(0) = b² + c``
    to 30 bits, so every result is an integer in ``[0, 2^30]``. int64 throughout.

    >>> int_exp(np.array([0, 693, 1386, 100000]), -693, 1352, 959553, 8).tolist()   # sx = 1e-3
    [713588992, 356794496, 178397248, 0]
    """
    d = np.asarray(d, np.int64)
    ln2 = -int(x0)
    p0 = int(b) ** 2 + int(c)
    if ln2 < 1 or ln2 > int(b) or int(c) < 0 or p0.bit_length() + max(int(exp_shift), 0) > 62:
        raise OpError(
            f"exp_x0 {x0}, exp_b {b}, exp_c {c}, exp_shift {exp_shift}: expected 0 < -x0 <= b, c >= 0 "
            "and (b² + c)·2^exp_shift < 2^62"
        )
    z = d // ln2
    r = -(d - z * ln2)
    p = (r + int(b)) ** 2 + int(c)
    sh = z - int(exp_shift)  # right shift of p; negative: a left shift
    right = np.clip(sh, 0, 63)
    left = np.clip(-sh, 0, 62)
    return np.where(sh >= 63, 0, (p << left) >> right)


def int_softmax(
    x: np.ndarray,
    exp_table: np.ndarray | None = None,
    *,
    axis: int = -1,
    y_zero_point: int = -128,
    y_shift: int = 8,
    out_type: str = "int8",
    exp_x0: int | None = None,
    exp_b: int | None = None,
    exp_c: int | None = None,
    exp_shift: int | None = None,
) -> np.ndarray:
    """Integer softmax along ``axis`` (eq. (IO7)): ``d = max(x) - x``, ``e = exp(-sx·d)``
    in fixed point, ``y = sat(round_half_up(e · 2^k / Σe) + zy)``: the output scale is
    ``2^-k``. An 8-bit ``x`` reads ``e = E[d]`` from ``exp_table`` (int32, ``E[j] =
    round(2^20 · exp(-sx·j))`` made at compile time, ``d ∈ [0, 255]``); a wider ``x``
    (int16) has no table and computes ``e = int_exp(d, exp_x0, exp_b, exp_c, exp_shift)``
    (I-BERT's integer polynomial, eq. (IO12)).

    >>> e = np.array([1 << 20] + [0] * 255, np.int32)   # exp(-sx·j) = 0 for j >= 1
    >>> int_softmax(np.array([[3, 3, 1]], np.int8), e).tolist()   # two maxima share 256
    [[0, 0, -128]]
    >>> int_softmax(np.array([[0, -693, -1386, 0]], np.int16), exp_x0=-693, exp_b=1352,
    ...             exp_c=959553, exp_shift=8).tolist()   # sx = 1e-3: weights 1, 1/2, 1/4, 1
    [[-35, -81, -105, -35]]
    """
    x = np.asarray(x)
    if exp_table is None:
        if x.dtype not in (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16)):
            raise OpError(f"x: expected int8, uint8 or int16, got {x.dtype}")
        if None in (exp_x0, exp_b, exp_c, exp_shift):
            raise OpError("exp_x0, exp_b, exp_c, exp_shift: expected all four without an exp_table")
    else:
        e_tab = np.asarray(exp_table)
        if x.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            raise OpError(f"x: expected int8 or uint8 with an exp_table, got {x.dtype}")
        if e_tab.shape != (256,) or e_tab.dtype != np.int32 or np.any(e_tab < 0):
            raise OpError(f"exp_table: expected 256 non-negative int32, got {e_tab.dtype}{list(e_tab.shape)}")
    if x.ndim == 0:
        raise OpError("x: expected rank >= 1")
    if x.size == 0:
        return np.empty(x.shape, storage_dtype(out_type))
    ax = axis % x.ndim
    xi = x.astype(np.int64)
    d = xi.max(axis=ax, keepdims=True) - xi
    if exp_table is None:
        e = int_exp(d, int(exp_x0), int(exp_b), int(exp_c), int(exp_shift))
    else:
        e = e_tab.astype(np.int64)[d]
    total = e.sum(axis=ax, keepdims=True)  # >= E[0] > 0: the maximum is in every row
    num = e << int(y_shift)
    q = (2 * num + total) // (2 * total)  # half up; num >= 0
    return _saturate(q + int(y_zero_point), storage_dtype(out_type), None, None)


def bit_length(v: np.ndarray) -> np.ndarray:
    """``int.bit_length`` of non-negative int64 values, by halving comparisons.

    >>> bit_length(np.array([0, 1, 2, 255, 256, 2**62])).tolist()
    [0, 1, 2, 8, 9, 63]
    """
    t = np.asarray(v, np.int64).copy()
    n = np.zeros(t.shape, np.int64)
    for step in (32, 16, 8, 4, 2, 1):
        big = t >= (np.int64(1) << step)
        n += np.where(big, step, 0)
        t = np.where(big, t >> step, t)
    return n + (t > 0)


def isqrt(v: np.ndarray) -> np.ndarray:
    """``floor(sqrt(v))`` of non-negative int64 values by Newton's iteration (I-BERT's
    integer square root): ``r_0 = 2^ceil(bits(v)/2) >= sqrt(v)``, ``r_{i+1} = (r_i +
    v // r_i) // 2`` while it decreases; the first ``r`` that does not is the floor
    (eq. (IO9)). At most 7 steps for 63-bit values.

    >>> isqrt(np.array([0, 1, 3, 4, 15, 16, 2**52 + 1, 2**63 - 1])).tolist()
    [0, 1, 1, 2, 3, 4, 67108864, 3037000499]
    """
    v = np.asarray(v, np.int64)
    if np.any(v < 0):
        raise OpError("isqrt: negative input")
    r = np.where(v == 0, 0, np.left_shift(np.int64(1), (bit_length(v) + 1) >> 1))
    while True:
        nxt = (r + v // np.maximum(r, 1)) >> 1
        done = (nxt >= r) | (v == 0)
        if done.all():
            return r
        r = np.where(done, r, nxt)


def int_layer_norm(
    x: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
    *,
    x_zero_point: int,
    y_zero_point: int,
    eps: int,
    gamma_shift: int,
    out_type: str = "int8",
) -> np.ndarray:
    """Integer LayerNormalization over the last axis (eq. (IO8)), I-BERT's integer sqrt::

        d = x - zx,  c = n·d - Σd              (= n·(d - mean), exact)
        D = isqrt((Σc² + eps) // n)            (= n·std in x's units)
        y = sat(round((c·G + B·D) / (D·2^g)) + zy)

    ``G[i] = round(γ[i]/sy · 2^g)`` and ``B[i] = round(β[i]/sy · 2^g)`` (int32, compile
    time), ``eps = round(ε·n³/sx²)``. A constant row (``D = 0``) gives ``β``.
    """
    x = np.asarray(x)
    _check_int8_operand("x", x)
    g = np.asarray(gamma)
    bt = np.asarray(beta)
    n = x.shape[-1]
    if g.shape != (n,) or bt.shape != (n,) or g.dtype != np.int32 or bt.dtype != np.int32:
        raise OpError(
            f"gamma, beta: expected int32 of shape ({n},), got {g.dtype}{list(g.shape)}, {bt.dtype}{list(bt.shape)}"
        )
    d = x.astype(np.int64) - int(x_zero_point)
    c = n * d - d.sum(axis=-1, keepdims=True)
    var = ((c * c).sum(axis=-1, keepdims=True) + int(eps)) // n
    den = np.maximum(isqrt(var), 1)
    num = c * g.astype(np.int64) + bt.astype(np.int64) * den
    q = round_div(num, den << int(gamma_shift))
    return _saturate(q + int(y_zero_point), storage_dtype(out_type), None, None)


def int_gelu(
    x: np.ndarray,
    *,
    x_zero_point: int,
    erf_b: int,
    erf_c: int,
    pre_shift: int,
    multiplier: int,
    shift: int,
    y_zero_point: int,
    rounding: str = "double",
    out_type: str = "int16",
) -> np.ndarray:
    """I-BERT's i-GELU (eq. (IO13)) for inputs wider than a table: with ``d = x - zx``
    and ``erf(t) ≈ sign(t)·(1 - 0.2888·(1.769 - min(|t|, 1.769))²)`` on ``t = d·sx/√2``::

        u = min(|d|, b),  L = c - (b - u)²              (b = floor(1.769/se), c = floor(1/(0.2888·se²)), se = sx/√2)
        q = d · (c + sign(d)·L)                          (= GELU(d·sx) / (sx·0.2888·se²/2))
        y = sat(apply_scale(round_half_up(q / 2^t), M, s) + zy)

    ``t = pre_shift`` brings ``q`` into int32 (compile time, from the bound of ``|d|``);
    ``M, s`` is the fixed-point ``sx·0.2888·se²·2^t / (2·sy)``. int64 throughout.
    """
    x = np.asarray(x)
    _check_int8_operand("x", x)
    d = x.astype(np.int64) - int(x_zero_point)
    b, c, t = int(erf_b), int(erf_c), int(pre_shift)
    if b < 1 or c < b * b or not 0 <= t <= 62:
        raise OpError(f"erf_b {b}, erf_c {c}, pre_shift {t}: expected b >= 1, c >= b², 0 <= pre_shift <= 62")
    u = np.minimum(np.abs(d), b)
    L = c - (b - u) ** 2
    q = d * (c + np.sign(d) * L)
    if t:
        q = (q + (np.int64(1) << (t - 1))) >> t
    if np.any(q > _I32_MAX) or np.any(q < _I32_MIN):
        raise OpError(f"pre_shift {t} leaves a value outside int32 (x beyond the compile-time bound)")
    v = apply_scale(q, multiplier, shift, rounding) + int(y_zero_point)
    return _saturate(v, storage_dtype(out_type), None, None)


def int_global_average_pool(
    x: np.ndarray,
    *,
    x_zero_point: int,
    y_zero_point: int,
    multiplier: int,
    shift: int,
    rounding: str = "double",
    out_type: str = "int8",
) -> np.ndarray:
    """``y = sat(apply_scale(Σ_spatial (x - zx), M, s) + zy)`` with ``m = sx / (sy · H·W)``."""
    x = np.asarray(x)
    _check_int8_operand("x", x)
    if x.ndim < 3:
        raise OpError(f"x: expected (N, C, ...) of rank >= 3, got {x.shape}")
    axes = tuple(range(2, x.ndim))
    acc = _wrap32((x.astype(np.int64) - int(x_zero_point)).sum(axis=axes, keepdims=True))
    v = apply_scale(acc, multiplier, shift, rounding) + int(y_zero_point)
    return _saturate(v, storage_dtype(out_type), None, None)


# --------------------------------------------------------------------------------------
# Registration: the reference target runs the integer stage with these functions
# --------------------------------------------------------------------------------------


@register("IntRescale", INT_DOMAIN)
def _rescale_op(ctx: OpContext, x: np.ndarray, **attrs) -> np.ndarray:
    del ctx
    return int_rescale(x, **attrs)


@register("IntConv", INT_DOMAIN)
def _conv_op(ctx: OpContext, x: np.ndarray, w: np.ndarray, c: np.ndarray, **attrs) -> np.ndarray:
    del ctx
    return int_conv(x, w, c, **attrs)


@register("IntMatMul", INT_DOMAIN)
def _matmul_op(
    ctx: OpContext, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, **attrs
) -> np.ndarray:
    del ctx
    return int_matmul(a, b, c, **attrs)


@register("IntAdd", INT_DOMAIN)
def _add_op(ctx: OpContext, a: np.ndarray, b: np.ndarray, **attrs) -> np.ndarray:
    del ctx
    return int_add(a, b, **attrs)


@register("IntMul", INT_DOMAIN)
def _mul_op(ctx: OpContext, a: np.ndarray, b: np.ndarray, **attrs) -> np.ndarray:
    del ctx
    return int_mul(a, b, **attrs)


@register("IntLookup", INT_DOMAIN)
def _lookup_op(ctx: OpContext, x: np.ndarray, table: np.ndarray, *, function: str = "") -> np.ndarray:
    del ctx, function
    return int_lookup(x, table)


@register("IntSoftmax", INT_DOMAIN)
def _softmax_op(ctx: OpContext, x: np.ndarray, exp_table: np.ndarray | None = None, **attrs) -> np.ndarray:
    del ctx
    return int_softmax(x, exp_table, **attrs)


@register("IntLayerNorm", INT_DOMAIN)
def _layer_norm_op(ctx: OpContext, x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, **attrs) -> np.ndarray:
    del ctx
    return int_layer_norm(x, gamma, beta, **attrs)


@register("IntGelu", INT_DOMAIN)
def _gelu_op(ctx: OpContext, x: np.ndarray, **attrs) -> np.ndarray:
    del ctx
    return int_gelu(x, **attrs)


@register("IntGlobalAveragePool", INT_DOMAIN)
def _gap_op(ctx: OpContext, x: np.ndarray, **attrs) -> np.ndarray:
    del ctx
    return int_global_average_pool(x, **attrs)
