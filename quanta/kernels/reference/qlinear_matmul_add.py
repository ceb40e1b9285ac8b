"""quanta::QLinearMatMulAdd: a QLinearMatMul and the QLinearAdd of a constant after it,
as one node (normative reference; passes/lower/qlinear_matmul_add.py fuses the pair)::

    z = QLinearMatMulAdd(a, sa, za, b, sb, zb, sy, zy, c, sc, zc, sz, zz) {c_first}
      = QLinearAdd(c, sc, zc, y, sy, zy, sz, zz)     c_first = 1
      = QLinearAdd(y, sy, zy, c, sc, zc, sz, zz)     c_first = 0
        with y = QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)

``c`` is a constant of one value or one per column of y (leading 1s); every scale and zero
point of the QLinearAdd is per tensor. The value is the two twins in order
(qlinear_matmul.qlinear_matmul, ms_qlinear.qlinear_add), so the node is exact.

On the codes y of one column n, QLinearAdd (ms_qlinear note (a)) is an affine map of
the 8-bit code y with per-column constants (docs/quantization-math.md (QA1)-(QA3))::

    (QA1)  rA = f32(sA/sz), rB = f32(sB/sz), kk = f32(zz − fma(rA, zA, f32(rB·zB)))
           (A, B: QLinearAdd's first and second operands, zA, zB their zero points)
    (QA2)  c_first = 1 (A = c, B = y):  z = sat(rne(fma(c[n], rA, fma(y, rB, kk))))
    (QA3)  c_first = 0 (A = y, B = c):  z = sat(rne(fma(0, 0, fma(y, rA, fma(c[n], rB, kk)))))

both of the one form ``sat(rne(fma(u[n], r2, fma(y, r1, k[n]))))`` that the native qgemm
runs as the second affine stage of its output stage (qgemm.h ``post_k``), with
:func:`post_stage_constants` its (k, u, r1, r2). ``fma(0, 0, t) = t`` (a zero sum's sign
does not survive rounding to a code), so (QA3) is QLinearAdd's own arithmetic.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.ms_qlinear import _fma_f32, qlinear_add
from quanta.kernels.reference.qlinear_matmul import qlinear_matmul
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["QUANTA_DOMAIN", "post_stage_constants", "qlinear_matmul_add"]

QUANTA_DOMAIN = "quanta"
F32 = np.float32


def _scalar(v: np.ndarray | float, dtype: type) -> np.ndarray:
    a = np.asarray(v)
    if a.size != 1:
        raise OpError(f"QLinearMatMulAdd: expected a per-tensor QLinearAdd parameter, got shape {a.shape}")
    return a.reshape(()).astype(dtype)


def post_stage_constants(
    c: np.ndarray,
    c_scale: np.ndarray | float,
    c_zero_point: np.ndarray | int,
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int,
    z_scale: np.ndarray | float,
    z_zero_point: np.ndarray | int,
    n: int,
    c_first: bool,
) -> tuple[np.ndarray, np.ndarray, np.float32, np.float32]:
    """``(k[n], u[n], r1, r2)`` of (QA1)-(QA3) for a constant ``c`` of one value or one per
    column (``n`` columns), float32: ``z = sat(rne(fma(u, r2, fma(y, r1, k))))``.

    >>> k, u, r1, r2 = post_stage_constants(np.array([3, 5], np.uint8), 0.5, 1, 0.25, 2, 1.0, 4, 2, True)
    >>> k.tolist(), u.tolist(), float(r1), float(r2)
    ([3.0, 3.0], [3.0, 5.0], 0.25, 0.5)
    """
    cc = np.asarray(c)
    cols = np.broadcast_to(cc.reshape(-1) if cc.size != 1 else cc.reshape(1), (n,)).astype(F32)
    sc, sy, sz = (_scalar(s, F32) for s in (c_scale, y_scale, z_scale))
    zc, zy, zz = (int(_scalar(z, np.int64)) for z in (c_zero_point, y_zero_point, z_zero_point))
    (sA, zA), (sB, zB) = ((sc, zc), (sy, zy)) if c_first else ((sy, zy), (sc, zc))
    rA = F32(sA / sz)
    rB = F32(sB / sz)
    kk = F32(F32(zz) - _fma_f32(F32(zA), rA, F32(rB * F32(zB))))
    if c_first:  # (QA2)
        return np.full(n, kk, F32), np.ascontiguousarray(cols), rB, rA
    # (QA3): the inner fma of the constant operand, once per column
    return np.ascontiguousarray(_fma_f32(cols, rB, np.full(n, kk, F32))), np.zeros(n, F32), rA, F32(0.0)


def qlinear_matmul_add(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    c: np.ndarray,
    c_scale: np.ndarray,
    c_zero_point: np.ndarray,
    z_scale: np.ndarray,
    z_zero_point: np.ndarray,
    c_first: bool,
) -> np.ndarray:
    """QLinearMatMul, then QLinearAdd of ``c`` (the module docstring), the twins in order.

    >>> a = np.array([[5, 7]], np.uint8); b = np.array([[1], [2]], np.int8)
    >>> qlinear_matmul_add(a, 0.5, np.uint8(1), b, 1.0, np.int8(0), 1.0, np.uint8(3),
    ...                    np.array([4], np.uint8), 0.5, np.uint8(0), 2.0, np.uint8(10), True).tolist()
    [[15]]
    """
    y = qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)
    if c_first:
        return qlinear_add(c, c_scale, c_zero_point, y, y_scale, y_zero_point, z_scale, z_zero_point)
    return qlinear_add(y, y_scale, y_zero_point, c, c_scale, c_zero_point, z_scale, z_zero_point)


@register("QLinearMatMulAdd", QUANTA_DOMAIN)
def qlinear_matmul_add_op(
    ctx: OpContext,
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    c: np.ndarray,
    c_scale: np.ndarray,
    c_zero_point: np.ndarray,
    z_scale: np.ndarray,
    z_zero_point: np.ndarray,
    *,
    c_first: int = 1,
) -> np.ndarray:
    """quanta QLinearMatMulAdd (the module docstring): the ops' own checks, then their twins."""
    from quanta.kernels.reference.qlinear_matmul import qlinear_matmul_op

    y = qlinear_matmul_op(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)
    if c.dtype != y.dtype or z_zero_point.dtype != y.dtype:
        raise OpError(
            f"QLinearMatMulAdd: expected c and z_zero_point of the product's type {y.dtype}, "
            f"got {c.dtype} and {z_zero_point.dtype}"
        )
    if c_first:
        return qlinear_add(c, c_scale, c_zero_point, y, y_scale, y_zero_point, z_scale, z_zero_point)
    return qlinear_add(y, y_scale, y_zero_point, c, c_scale, c_zero_point, z_scale, z_zero_point)
