"""MatMulInteger and ConvInteger: the integer accumulator of eq. (4) (normative reference).

    acc[i, j] = Σ_k (x[i, k] − zx[i]) · (w[k, j] − zw[j])          eq. (4), int32

ONNX: "The production MUST never overflow. The accumulation may overflow if and only if in
32 bits." This reference accumulates exactly in int64 (8-bit operands: |product| ≤ 65536,
so int64 cannot overflow below K = 2^47) and then wraps to int32 (two's complement), which
is the same as accumulating in wrapping int32 in any order.

Zero points: MatMulInteger takes ``a_zero_point`` per tensor or per row of A (``[M]`` for a
2-D A, ``[..., M, 1]`` for N-D), ``b_zero_point`` per tensor or per column of B (``[N]`` or
``[..., 1, N]``); ConvInteger ``x_zero_point`` per tensor and ``w_zero_point`` per tensor
or per output channel (``[M]``).

A rank-2 B shared by a batch of A is never copied per batch: A is reshaped to
``(batch·M, K)`` and multiplied by the single (K, N) matrix (docs/design.md).

:func:`matmul_integer_loops` and :func:`conv_integer_loops` are the loop forms (written
from the formula, for small shapes); the vectorised forms are tested against them.

Native kernels compute the same ``acc`` through the four-term folding of eq. (5) and, on
u8×s8 hardware, the +128 shift of eq. (8); float32 accumulation is allowed there only
while eq. (9) holds (K ≤ 258). test_qlinear.py evaluates eqs. (5), (8), (9) against this
reference.

``saturating_pairs`` (a quanta attribute the session sets under ``float_functions="ort"``
where ONNX Runtime's u8·s8 kernels saturate, quanta/passes/rules/ort_float_functions.py):
uint8 A times int8 B as ORT computes it on x86 without VNNI, docs/float-ops.md (QM1)::

    acc = Σ_j sat16(a[2j]·b[2j] + a[2j+1]·b[2j+1])  − za·Σ_k b' − zb·Σ_k a + K·za·zb
          (raw codes, k paired from 0; sat16 clips to [−32768, 32767]; the rest exact)

Other type pairs stay exact (ORT's u8·u8 and s8·s8 kernels widen to int16 first).
"""

from __future__ import annotations

import itertools

import numpy as np

from quanta.kernels.reference.conv_geometry import ConvGeometry, conv_attrs, conv_nd
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = [
    "a_param",
    "b_param",
    "conv_integer",
    "conv_integer_loops",
    "matmul_integer",
    "matmul_integer_loops",
    "wrap_int32",
]

_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def wrap_int32(acc: np.ndarray) -> np.ndarray:
    """Two's-complement wrap of an exact (int64) accumulator to int32.

    >>> wrap_int32(np.array([2**31, -(2**31) - 1, 5], np.int64))
    array([-2147483648,  2147483647,           5], dtype=int32)
    """
    return np.asarray(acc, dtype=np.int64).astype(np.int32)  # astype wraps modulo 2^32


def a_param(p: np.ndarray | None, a_shape: tuple[int, ...], what: str) -> np.ndarray:
    """A per-tensor or per-row parameter of A (..., M, K), shaped to broadcast against A."""
    if p is None:
        return np.zeros((), np.int64)
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    if len(a_shape) < 2:
        raise OpError(f"{what}: expected a scalar for a 1-D input, got shape {p.shape}")
    m = a_shape[-2]
    if p.ndim == 1 and p.shape[0] == m:
        return p.reshape(m, 1)
    if p.ndim >= 2 and p.shape[-1] == 1 and p.shape[-2] == m:
        return p
    raise OpError(
        f"{what}: expected a scalar, [{m}] or [..., {m}, 1] (per row of shape {a_shape}), got shape {p.shape}"
    )


def b_param(p: np.ndarray | None, b_shape: tuple[int, ...], what: str) -> np.ndarray:
    """A per-tensor or per-column parameter of B (..., K, N), shaped to broadcast against B."""
    if p is None:
        return np.zeros((), np.int64)
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    n = b_shape[-1]
    if len(b_shape) < 2:
        raise OpError(f"{what}: expected a scalar for a 1-D input, got shape {p.shape}")
    if p.ndim == 1 and p.shape[0] == n:
        return p
    if p.ndim >= 2 and p.shape[-2] == 1 and p.shape[-1] == n:
        return p
    raise OpError(
        f"{what}: expected a scalar, [{n}] or [..., 1, {n}] (per column of shape {b_shape}), got shape {p.shape}"
    )


def _check_eight_bit(name: str, v: np.ndarray) -> None:
    if v.dtype not in _EIGHT_BIT:
        raise OpError(f"{name}: expected int8 or uint8, got {v.dtype}")


def saturating_pairs_correction(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What (QM1)'s saturating pairs take from the exact ``a @ b`` of raw uint8 codes a
    [..., M, K] and raw int8 codes b [..., K, N] (numpy.matmul broadcasting; a 1-D operand
    is not taken), int64 of the product's shape."""
    from quanta.kernels.reference.mlas_qconv import saturation_correction

    if a.ndim < 2 or b.ndim < 2:
        raise OpError(f"saturating pairs: expected A and B of rank >= 2, got shapes {a.shape} and {b.shape}")
    k, n = b.shape[-2:]
    if b.ndim == 2:
        return saturation_correction(a.reshape(-1, k), b.T).reshape(*a.shape[:-1], n)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a_b = np.broadcast_to(a, (*batch, *a.shape[-2:])).reshape(-1, *a.shape[-2:])
    b_b = np.broadcast_to(b, (*batch, k, n)).reshape(-1, k, n)
    out = [saturation_correction(x, w.T) for x, w in zip(a_b, b_b, strict=True)]
    return np.stack(out).reshape(*batch, a.shape[-2], n)


def matmul_integer(
    a: np.ndarray,
    b: np.ndarray,
    a_zero_point: np.ndarray | int | None = None,
    b_zero_point: np.ndarray | int | None = None,
    *,
    saturating_pairs: bool = False,
) -> np.ndarray:
    """``acc = (a − za) @ (b − zb)`` with numpy.matmul broadcasting, int32 (eq. (4));
    ``saturating_pairs``: uint8 a times int8 b in (QM1) (module docstring).

    >>> matmul_integer(np.array([[1, 2]], np.uint8), np.array([[3], [4]], np.uint8), 1, 2)
    array([[2]], dtype=int32)
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if a.ndim == 0 or b.ndim == 0:
        raise OpError(f"MatMulInteger: expected inputs of rank >= 1, got shapes {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2 if b.ndim >= 2 else 0]:
        raise OpError(f"MatMulInteger: expected matching reduction dims, got shapes {a.shape} and {b.shape}")
    za = a_param(None if a_zero_point is None else np.asarray(a_zero_point), a.shape, "a_zero_point")
    zb = b_param(None if b_zero_point is None else np.asarray(b_zero_point), b.shape, "b_zero_point")
    a64 = a.astype(np.int64) - za.astype(np.int64)
    b64 = b.astype(np.int64) - zb.astype(np.int64)
    if b64.ndim == 2 and a64.ndim > 2:
        # Shared rank-2 B: one (batch·M, K) @ (K, N) product, B is never copied per batch.
        acc = (a64.reshape(-1, a64.shape[-1]) @ b64).reshape(*a64.shape[:-1], b64.shape[-1])
    else:
        acc = np.matmul(a64, b64)
    if saturating_pairs and a.dtype == np.uint8 and b.dtype == np.int8:
        acc = acc + saturating_pairs_correction(a, b)
    return wrap_int32(acc)


def matmul_integer_loops(
    a: np.ndarray, b: np.ndarray, a_zero_point: np.ndarray | int = 0, b_zero_point: np.ndarray | int = 0
) -> np.ndarray:
    """Loop form of eq. (4) for rank-2 ``a`` (M, K), ``b`` (K, N); zero points scalar,
    per row of a ([M]) or per column of b ([N]). Small shapes only."""
    m_rows, k_dim = a.shape
    n_cols = b.shape[1]
    za = np.broadcast_to(np.asarray(a_zero_point, np.int64).reshape(-1), (m_rows,))
    zb = np.broadcast_to(np.asarray(b_zero_point, np.int64).reshape(-1), (n_cols,))
    acc = np.zeros((m_rows, n_cols), np.int64)
    for i in range(m_rows):
        for j in range(n_cols):
            total = 0
            for k in range(k_dim):
                total += (int(a[i, k]) - int(za[i])) * (int(b[k, j]) - int(zb[j]))
            acc[i, j] = total
    return wrap_int32(acc)


def _w_channel_param(p: np.ndarray | None, m_out: int, w_ndim: int, what: str) -> np.ndarray:
    if p is None:
        return np.zeros((), np.int64)
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    if p.ndim != 1 or p.shape[0] != m_out:
        raise OpError(
            f"{what}: expected a scalar or a 1-D tensor of {m_out} (output channels), got shape {p.shape}"
        )
    return p.reshape((m_out,) + (1,) * (w_ndim - 1))


def _scalar_param(p: np.ndarray | None, what: str) -> np.ndarray:
    if p is None:
        return np.zeros((), np.int64)
    p = np.asarray(p)
    if p.size != 1:
        raise OpError(f"{what}: expected a scalar (per-tensor), got shape {p.shape}")
    return p.reshape(())


def conv_integer(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | int | None = None,
    w_zero_point: np.ndarray | int | None = None,
    *,
    geometry: ConvGeometry | None = None,
    group: int = 1,
    **attrs,
) -> np.ndarray:
    """Integer N-d convolution, int32 accumulator (eq. (4) with k over C/group × kernel).

    Padding holds the real value 0, i.e. the quantized value ``zx``: x is shifted by ``zx``
    first and padded with 0. ``attrs`` are ONNX conv attributes (``pads``, ``strides``,
    ``dilations``, ``auto_pad``, ``kernel_shape``) unless ``geometry`` is given.
    """
    x = np.asarray(x)
    w = np.asarray(w)
    if x.ndim < 3 or w.ndim != x.ndim:
        raise OpError(
            f"ConvInteger: expected x (N, C, ...) and w (M, C/group, ...) of equal rank >= 3, got {x.shape}, {w.shape}"
        )
    geom = geometry or conv_attrs(x.shape, w.shape[2:], **attrs)
    zx = _scalar_param(None if x_zero_point is None else np.asarray(x_zero_point), "x_zero_point")
    zw = _w_channel_param(
        None if w_zero_point is None else np.asarray(w_zero_point), w.shape[0], w.ndim, "w_zero_point"
    )
    x64 = x.astype(np.int64) - zx.astype(np.int64)
    w64 = w.astype(np.int64) - zw.astype(np.int64)
    return wrap_int32(conv_nd(x64, w64, geom, group, pad_value=0))


def conv_integer_loops(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: int,
    w_zero_point: np.ndarray | int,
    geom: ConvGeometry,
    group: int = 1,
) -> np.ndarray:
    """Loop form of the integer convolution, from the ONNX definition. Small shapes only."""
    n_batch = x.shape[0]
    m_out, cg = w.shape[:2]
    nsp = len(geom.kernel_shape)
    zw = np.broadcast_to(np.asarray(w_zero_point, np.int64).reshape(-1), (m_out,))
    mg = m_out // group
    acc = np.zeros((n_batch, m_out, *geom.out_shape), np.int64)
    for n in range(n_batch):
        for m in range(m_out):
            g = m // mg
            for o in itertools.product(*(range(v) for v in geom.out_shape)):
                total = 0
                for c in range(cg):
                    for k in itertools.product(*(range(v) for v in geom.kernel_shape)):
                        pos = [
                            o[i] * geom.strides[i] + k[i] * geom.dilations[i] - geom.pads[i]
                            for i in range(nsp)
                        ]
                        if all(0 <= pos[i] < x.shape[2 + i] for i in range(nsp)):
                            xv = int(x[(n, g * cg + c, *pos)]) - int(x_zero_point)
                        else:
                            xv = 0  # padding: real 0
                        total += xv * (int(w[(m, c, *k)]) - int(zw[m]))
                acc[(n, m, *o)] = total
    return wrap_int32(acc)


@register("MatMulInteger")
def matmul_integer_op(
    ctx: OpContext,
    a: np.ndarray,
    b: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
    *,
    saturating_pairs: int = 0,
) -> np.ndarray:
    """ONNX MatMulInteger-10; quanta's ``saturating_pairs`` attribute: (QM1) (module
    docstring)."""
    del ctx  # unused
    _check_eight_bit("A", a)
    _check_eight_bit("B", b)
    for name, zp, v in (("a_zero_point", a_zero_point, a), ("b_zero_point", b_zero_point, b)):
        if zp is not None and zp.dtype != v.dtype:
            raise OpError(f"{name}: expected the type of its input ({v.dtype}), got {zp.dtype}")
    return matmul_integer(a, b, a_zero_point, b_zero_point, saturating_pairs=bool(saturating_pairs))


@register("ConvInteger")
def conv_integer_op(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """ONNX ConvInteger-10."""
    del ctx  # unused
    _check_eight_bit("x", x)
    _check_eight_bit("w", w)
    return conv_integer(
        x,
        w,
        x_zero_point,
        w_zero_point,
        group=group,
        auto_pad=auto_pad,
        dilations=dilations,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
