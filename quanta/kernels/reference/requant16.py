"""quanta QLinearAffine16 / QLinearAdd16 / QLinearMul16: elementwise ops on 16-bit codes (normative).

The groups a 16-bit QDQ file leaves between its convolutions (ONNX Runtime's quantizer with
``activation_type=QUInt16``: a BatchNormalization, an Add / Mul / Div by a constant, a
HardSigmoid, a residual Add, a Mul of two activations) as one operator each, computed from
the codes in float64 (docs/quantization-math.md "A16 elementwise", eqs. (E1)-(E4))::

    QLinearAffine16(x, sx, zx, sy, zy, a, b) {axis?, y_min?, y_max?}
        y = sat(rne(clamp(f64(x − zx)·M_c + B_c, lo, hi)))       M_c = sx·a_c/sy, B_c = b_c/sy + zy
    QLinearMul16(a, sa, za, b, sb, zb, sy, zy)
        y = sat(rne(f32(f32(f32(a − za)·sa) · f32(f32(b − zb)·sb)) / sy) + zy)
    QLinearAdd16(a, sa, za, b, sb, zb, sy, zy)
        y = sat(rne(f32(f32(f32(a − za)·sa) + f32(f32(b − zb)·sb)) / sy) + zy)

``a`` and ``b`` of QLinearAffine16 are the float group's real affine map ``f(v) = a_c·v + b_c``
(one value, or one per index of ``axis``: an axis of x when >= 0, as BatchNormalization's 1;
counted from the end when < 0, the values then broadcasting against x as numpy aligns a
constant of that rank, so x may hold 1 there); ``y_min`` / ``y_max`` its real clip (HardSigmoid's
[0, 1], Relu's [0, inf)), applied as the codes ``lo = max(qmin, Q(y_min))``, ``hi = min(qmax,
Q(y_max))`` (Q is monotone, so clipping before and after it agree). Every product and sum is
one float64 rounding, in the order written (no fused multiply-add), so the native kernels
(quanta/kernels/cpp/a16w8/requant16.h) compute the same codes; float64 keeps the result
within 2^-36 of a step of the exact value, where the float32 group rounds at 2^-8 of a step
on large codes: they differ only where the float32 group's own rounding crosses a tie.
The binary ops are the float group itself, every step one float32 operation as ONNX
writes it (DequantizeLinear, the op, QuantizeLinear's division): a product or sum of two
activations has no map of one code to rewrite, and rounding the exact value once parted
from ONNX Runtime's float32 group on 41 of 147 456 codes of ppocr_cls's 16-bit file (a
code a group, 22 output steps downstream). Binary operands broadcast as numpy does and
share one storage type with the output.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = [
    "QUANTA_DOMAIN",
    "SIXTEEN_BIT",
    "affine16",
    "affine16_params",
    "binary16",
    "binary16_params",
]

QUANTA_DOMAIN = "quanta"
SIXTEEN_BIT = (np.dtype(np.uint16), np.dtype(np.int16))


def _range(dt: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def _scalar(v: np.ndarray | float | int | None, what: str, default: float = 0.0) -> float:
    if v is None:
        return default
    a = np.asarray(v)
    if a.size != 1:
        raise OpError(f"{what}: expected one value (per tensor), got shape {a.shape}")
    return float(a.reshape(()))


def _code(v: float, sy: np.float32, zy: int, dt: np.dtype) -> int:
    """QuantizeLinear of one real value (float32 division, round half to even, saturated)."""
    lo, hi = _range(dt)
    if np.isinf(v):
        return hi if v > 0 else lo
    q = float(np.rint(np.float32(v) / sy)) + zy
    return int(min(max(q, lo), hi))


def affine16_params(
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None,
    a: np.ndarray,
    b: np.ndarray,
    out_dtype: np.dtype,
    y_min: float | None = None,
    y_max: float | None = None,
) -> tuple[np.ndarray, np.ndarray, int, float, float]:
    """``(M, B, zx, lo, hi)`` of eq. (E1): float64 ``M_c``, ``B_c`` (shape of ``a``/``b``
    broadcast together, flattened), the input zero point and the output's code bounds."""
    sx = np.float64(np.float32(_scalar(x_scale, "x_scale")))
    sy32 = np.float32(_scalar(y_scale, "y_scale"))
    sy = np.float64(sy32)
    zx = int(_scalar(x_zero_point, "x_zero_point"))
    zy = int(_scalar(y_zero_point, "y_zero_point"))
    av, bv = np.broadcast_arrays(np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1))
    m = np.ascontiguousarray(sx * av / sy)
    bias = np.ascontiguousarray(bv / sy + zy)
    qmin, qmax = _range(out_dtype)
    lo = qmin if y_min is None else max(qmin, _code(float(y_min), sy32, zy, out_dtype))
    hi = qmax if y_max is None else min(qmax, _code(float(y_max), sy32, zy, out_dtype))
    return m, bias, zx, float(lo), float(max(lo, hi))


def _round_clamp(v: np.ndarray, lo: float, hi: float, dt: np.dtype) -> np.ndarray:
    # clamping to integer bounds before or after rounding gives the same codes
    return np.rint(np.minimum(np.maximum(v, lo), hi)).astype(dt)


def affine16(
    x: np.ndarray,
    m: np.ndarray,
    bias: np.ndarray,
    zx: int,
    lo: float,
    hi: float,
    out_dtype: np.dtype,
    axis: int | None = None,
) -> np.ndarray:
    """Eq. (E1) on codes ``x`` with the parameters of :func:`affine16_params`.

    >>> affine16(np.array([0, 10, 65535], np.uint16), np.array([0.5]), np.array([3.0]), 10, 0.0, 65535.0,
    ...          np.dtype(np.uint16))
    array([    0,     3, 32766], dtype=uint16)
    """
    x = np.asarray(x)
    if x.dtype not in SIXTEEN_BIT:
        raise OpError(f"x: expected uint16 or int16, got {x.dtype}")
    m = np.asarray(m, np.float64).reshape(-1)
    bias = np.asarray(bias, np.float64).reshape(-1)
    if m.size == 1:
        mc, bc = m.reshape(()), bias.reshape(())
    elif axis is not None and axis >= 0:
        if axis >= x.ndim or x.shape[axis] != m.size:
            raise OpError(f"a, b: {m.size} values, but axis {axis} of x {x.shape} is not that long")
        shape = [1] * x.ndim
        shape[axis] = m.size
        mc, bc = m.reshape(shape), bias.reshape(shape)
    elif axis is not None:
        # counted from the end: the values broadcast against x as numpy aligns them
        shape = [m.size] + [1] * (-axis - 1)
        mc, bc = m.reshape(shape), bias.reshape(shape)
    else:
        raise OpError(f"a, b: {m.size} values need an axis")
    d = (x.astype(np.int64) - zx).astype(np.float64)
    return _round_clamp(d * mc + bc, lo, hi, np.dtype(out_dtype))


def binary16_params(
    op: str,
    a_scale: np.ndarray,
    b_scale: np.ndarray,
    y_scale: np.ndarray,
) -> tuple[float, float, float]:
    """``(sa, sb, sy)`` of eqs. (E2) / (E3): the three scales as float32 values (``op`` is
    checked only)."""
    if op not in ("Add", "Mul"):
        raise OpError(f"binary16: expected Add or Mul, got {op}")
    return tuple(  # type: ignore[return-value]
        float(np.float32(_scalar(v, what)))
        for v, what in ((a_scale, "a_scale"), (b_scale, "b_scale"), (y_scale, "y_scale"))
    )


def binary16(
    op: str, a: np.ndarray, za: int, b: np.ndarray, zb: int, sa: float, sb: float, sy: float, zy: int
) -> np.ndarray:
    """Eqs. (E2) (``op`` "Mul") and (E3) ("Add") with the scales of :func:`binary16_params`:
    DequantizeLinear, the op and QuantizeLinear in float32 (reference/quantize.py's).

    >>> binary16("Mul", np.array([3], np.uint16), 1, np.array([5], np.uint16), 2, 0.5, 0.5, 1.0, 100)
    array([102], dtype=uint16)
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype not in SIXTEEN_BIT or b.dtype != a.dtype:
        raise OpError(f"a, b: expected one of uint16 / int16 for both, got {a.dtype} and {b.dtype}")
    f32 = np.float32
    # a 17-bit difference is exact in float32; each product, the op and the division round once
    fa = (a.astype(np.int64) - za).astype(f32) * f32(sa)
    fb = (b.astype(np.int64) - zb).astype(f32) * f32(sb)
    if op == "Mul":
        v = fa * fb
    elif op == "Add":
        v = fa + fb
    else:
        raise OpError(f"binary16: expected Add or Mul, got {op}")
    q = np.rint(np.divide(v, f32(sy), dtype=f32)).astype(np.float64) + np.float64(zy)
    lo, hi = _range(a.dtype)
    return _round_clamp(q, lo, hi, a.dtype)


def _zero_point(z: np.ndarray | None, what: str) -> int:
    return int(_scalar(z, what))


def _out_dtype(y_zero_point: np.ndarray | None, what: str) -> np.dtype:
    if y_zero_point is None:
        raise OpError(f"{what}: y_zero_point is required (it gives the output's storage type)")
    dt = np.asarray(y_zero_point).dtype
    if dt not in SIXTEEN_BIT:
        raise OpError(f"{what}: y_zero_point: expected uint16 or int16, got {dt}")
    return dt


@register("QLinearAffine16", QUANTA_DOMAIN)
def qlinear_affine16_op(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None,
    a: np.ndarray,
    b: np.ndarray,
    *,
    axis: int | None = None,
    y_min: float | None = None,
    y_max: float | None = None,
    function: str = "",
) -> np.ndarray:
    """quanta QLinearAffine16-1, eq. (E1) (module docstring)."""
    del ctx, function  # ``function`` names the ops the map replaces, for reading
    dt = _out_dtype(y_zero_point, "QLinearAffine16")
    m, bias, zx, lo, hi = affine16_params(
        x_scale, x_zero_point, y_scale, y_zero_point, a, b, dt, y_min, y_max
    )
    return affine16(x, m, bias, zx, lo, hi, dt, axis)


def _binary_op(op: str) -> None:
    def fn(
        ctx: OpContext,
        a: np.ndarray,
        a_scale: np.ndarray,
        a_zero_point: np.ndarray | None,
        b: np.ndarray,
        b_scale: np.ndarray,
        b_zero_point: np.ndarray | None,
        y_scale: np.ndarray,
        y_zero_point: np.ndarray | None,
    ) -> np.ndarray:
        del ctx
        dt = _out_dtype(y_zero_point, f"QLinear{op}16")
        if np.asarray(a).dtype != dt:
            raise OpError(
                f"QLinear{op}16: a is {np.asarray(a).dtype}, the output {dt}: the op takes one type"
            )
        sa, sb, sy = binary16_params(op, a_scale, b_scale, y_scale)
        za = _zero_point(a_zero_point, "a_zero_point")
        zb = _zero_point(b_zero_point, "b_zero_point")
        return binary16(op, a, za, b, zb, sa, sb, sy, _zero_point(y_zero_point, "y_zero_point"))

    fn.__name__ = fn.__qualname__ = f"qlinear_{op.lower()}16_op"
    fn.__doc__ = f"quanta QLinear{op}16-1, eq. ({'E2' if op == 'Mul' else 'E3'}) (module docstring)."
    register(f"QLinear{op}16", QUANTA_DOMAIN)(fn)


_binary_op("Add")
_binary_op("Mul")
