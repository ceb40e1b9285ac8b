"""com.microsoft integer GEMMs, as ONNX Runtime's CPU kernels compute them (normative reference).

QGemm, MatMulIntegerToFloat and DynamicQuantizeMatMul have no ONNX spec: their definition is
ONNX Runtime's CPU implementation (contrib_ops/cpu/quantization/quant_gemm.cc and
dynamic_quantize_matmul.cc over MLAS ``MlasGemmBatch`` and its output processors). All
three share the int32 accumulator of eq. (4), exact and wrapping modulo 2^32 (QGemm adds its
int32 bias ``C`` into the accumulator first, MLAS "accumulate mode")::

    acc[.., m, n] = C[m, n] + Σ_k (a[.., m, k] − za) · (b[.., k, n] − zb[n])

and differ only in the output stage. Every step below is one float32 operation, in ORT's
order; nothing is fused (MLAS's scale-bias processor calls ``MlasMultiplyFloat32x4`` and then
``MlasAddFloat32x4``, two roundings, no FMA)::

    QGemm, y_scale given     m[n] = f32(f32(f32(alpha · sa) · sb[n]) / sy)        (1)
                             y    = requant.requantize(acc, m, zy)               eq. (6)
    QGemm, no y_scale        m[n] = f32(f32(alpha · sa) · sb[n])                 (2)
                             y    = f32(f32(acc) · m[n])                         float32
    MatMulIntegerToFloat     m[n] = f32(sa · sb[n])                              (3)
                             y    = f32(f32(f32(acc) · m[n]) + bias[n])
    DynamicQuantizeMatMul    (qa, sa, za) = DynamicQuantizeLinear(a)             eq. (10)
                             then MatMulIntegerToFloat(qa, b, sa, sb, za, zb, bias)

(1) is ``ComputeOutputScale`` in quant_gemm.cc (``alpha_ * a_scale * b_scale[i]``, then
``/= y_scale``), a different rounding order from :func:`requant.requant_multiplier` as soon as
``alpha != 1``; eq. (6) itself is ``MlasRequantizeOutput``.

Scale layouts of MatMulIntegerToFloat / DynamicQuantizeMatMul (``FixupScaleTensor`` and
``IsBQuantParamSupported`` in ORT; "scalar" means rank 0 or shape ``[1]``):

- ``sb`` per column (``[N]`` for a 2-D b, ``[..., 1, N]`` of b's rank) or scalar enters
  (3); any other ``sb`` shape is multiplied into the output afterwards,
  ``y = f32(y · sb)`` with numpy broadcasting, and (3) uses ``m = sa``;
- a non-scalar ``sa`` (per row, ``[..., M, 1]``) enters (3) as 1.0 and is multiplied into
  the output afterwards (after the bias); ORT first swaps ``sa`` and ``sb`` when their shapes
  say they were given in the wrong order (a non-scalar ``sa`` of rank 1 or with a last
  dimension != 1; a non-scalar ``sb`` of rank > 1 whose second-to-last dimension != 1);
- zero points: ``za`` scalar; ``zb`` scalar or per column as ``sb``.

float16 scales and bias (allowed by the MatMulIntegerToFloat schema): ORT has no float16
kernel and runs the float32 one between Casts (its InsertCastTransformer), so the result is
the float32 result rounded once to float16.

``DynamicQuantizeLinear`` (:func:`quantize.dynamic_quantize_linear`) differs from ORT's
``GetQuantizationParameter`` only for an all-zero ``a`` (scale 1/255 vs 1): then
``qa == za`` everywhere, ``acc == 0`` and ``y == bias`` either way.

``saturating_pairs`` (a quanta attribute of QGemm, MatMulIntegerToFloat and DynamicQuantizeMatMul,
set under ``float_functions="ort"`` where ORT's u8·s8 kernels saturate): the accumulator of
uint8 a and int8 b is (QM1) of :mod:`quanta.kernels.reference.integer_ops`, pairs of
products in saturating int16 as MLAS's AVX2 kernel without VNNI forms them.

K = 0 follows the formulas (acc = C); ORT takes a separate path there (``HandleZeroKCase``)
whose float output is not defined, and it is not compared.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.integer_ops import matmul_integer, saturating_pairs_correction, wrap_int32
from quanta.kernels.reference.ms_qops import widen_half_scale
from quanta.kernels.reference.qgemm import accumulate, output_stage
from quanta.kernels.reference.quantize import dynamic_quantize_linear
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, OpError, register
from quanta.kernels.reference.requant import requantize

__all__ = [
    "dynamic_quantize_matmul",
    "matmul_integer_to_float",
    "qgemm_ms",
]

F32 = np.float32
_U8, _I8 = np.dtype(np.uint8), np.dtype(np.int8)
_EIGHT_BIT = (_U8, _I8)


def _is_scalar(t: np.ndarray) -> bool:
    """ORT's ``IsScalarOr1ElementVector``: rank 0, or rank 1 of length 1 (a [1, 1] is not)."""
    return t.ndim == 0 or (t.ndim == 1 and t.shape[0] == 1)


def _check_operand_types(a: np.ndarray, b: np.ndarray) -> None:
    """The type pairs ORT registers: (uint8, uint8), (uint8, int8), (int8, int8)."""
    if a.dtype not in _EIGHT_BIT:
        raise OpError(f"A: expected uint8 or int8, got {a.dtype}")
    if b.dtype not in _EIGHT_BIT:
        raise OpError(f"B: expected uint8 or int8, got {b.dtype}")
    if a.dtype == _I8 and b.dtype != _I8:
        raise OpError(
            f"B: expected int8 for an int8 A (ONNX Runtime has no int8 x uint8 kernel), got {b.dtype}"
        )


def _f32_scale(v: np.ndarray, what: str) -> np.ndarray:
    v = np.asarray(v)
    v = widen_half_scale(v)
    if v.dtype != np.float32:
        raise OpError(f"{what}: expected float32, got {v.dtype}")
    return v


# --------------------------------------------------------------------------------------
# QGemm
# --------------------------------------------------------------------------------------


def qgemm_ms(
    a: np.ndarray,
    a_scale: np.ndarray | float,
    a_zero_point: np.ndarray | int,
    b: np.ndarray,
    b_scale: np.ndarray | float,
    b_zero_point: np.ndarray | int,
    c: np.ndarray | None = None,
    y_scale: np.ndarray | float | None = None,
    y_zero_point: np.ndarray | int | None = None,
    *,
    alpha: float = 1.0,
    trans_a: bool = False,
    trans_b: bool = False,
    saturating_pairs: bool = False,
) -> np.ndarray:
    """com.microsoft QGemm: ``y = alpha · A' @ B' (+ C)`` with A' = A or Aᵀ, B' = B or Bᵀ;
    ``saturating_pairs``: the accumulator of uint8 A and int8 B in (QM1) (module docstring).

    With ``y_scale`` the output is requantized by eq. (6) with multiplier (1) into the
    type of ``y_zero_point`` (that of ``a`` when omitted); without it the output is float32
    by (2). ``b_scale`` / ``b_zero_point`` are scalars or per column (``[N]``); ``C`` is
    int32 and broadcasts to ``[M, N]`` from ``()``, ``[N]``, ``[1, N]``, ``[M, 1]``.

    >>> a = np.array([[130, 129]], np.uint8); b = np.array([[1, -2], [-4, 5]], np.int8)
    >>> qgemm_ms(a, F32(0.5), np.uint8(128), b, F32(0.25), np.int8(0))  # acc = [2, 1] @ b = [-2, 1]
    array([[-0.25 ,  0.125]], dtype=float32)
    """
    a, b = np.asarray(a), np.asarray(b)
    _check_operand_types(a, b)
    if a.ndim != 2 or b.ndim != 2:
        raise OpError(f"QGemm: expected 2-D A and B, got shapes {a.shape} and {b.shape}")
    a2 = a.T if trans_a else a
    b2 = b.T if trans_b else b
    M, K = a2.shape
    if b2.shape[0] != K:
        raise OpError(
            f"QGemm: expected A' [M, K] and B' [K, N] with equal K (transA={int(trans_a)}, "
            f"transB={int(trans_b)}), got shapes {a.shape} and {b.shape}"
        )
    N = b2.shape[1]
    sa = _f32_scale(np.asarray(a_scale, F32) if isinstance(a_scale, float) else a_scale, "a_scale")
    za = np.asarray(a_zero_point)
    if not _is_scalar(sa) or not _is_scalar(za):
        raise OpError(f"a_scale, a_zero_point: expected scalars, got shapes {sa.shape} and {za.shape}")
    if za.dtype != a.dtype:
        raise OpError(f"a_zero_point: expected {a.dtype}, got {za.dtype}")
    sb = _f32_scale(np.asarray(b_scale, F32) if isinstance(b_scale, float) else b_scale, "b_scale")
    zb = np.asarray(b_zero_point)
    if zb.dtype != b.dtype:
        raise OpError(f"b_zero_point: expected {b.dtype}, got {zb.dtype}")
    for what, v in (("b_scale", sb), ("b_zero_point", zb)):
        if not (v.ndim == 0 or (v.ndim == 1 and v.shape[0] in (1, N))):
            raise OpError(
                f"{what}: expected a scalar or a 1-D tensor of length 1 or {N}, got shape {v.shape}"
            )
    if sb.shape != zb.shape:
        raise OpError(f"b_zero_point: expected the shape of b_scale {sb.shape}, got {zb.shape}")

    acc = accumulate(a2, b2, int(za.reshape(())), zb.astype(np.int64).reshape(-1))
    if saturating_pairs and a.dtype == np.uint8 and b.dtype == np.int8:
        acc = wrap_int32(acc.astype(np.int64) + saturating_pairs_correction(a2, b2))
    if c is not None:
        c = np.asarray(c)
        if c.dtype != np.int32:
            raise OpError(f"C: expected int32, got {c.dtype}")
        if c.ndim > 2 or not _broadcasts_to(c.shape, (M, N)):
            raise OpError(f"C: expected a shape that broadcasts to [M, N] = [{M}, {N}], got {c.shape}")
        acc = (acc.astype(np.int64) + c.astype(np.int64)).astype(np.int32)  # int32 add, wraps

    m = np.multiply(np.multiply(F32(alpha), sa.reshape(()), dtype=F32), sb.reshape(-1), dtype=F32)
    if y_scale is None:
        if y_zero_point is not None:
            raise OpError("y_zero_point: expected none without y_scale (float output), got a tensor")
        return output_stage(acc, np.float32, multiplier=m)
    sy = _f32_scale(np.asarray(y_scale, F32) if isinstance(y_scale, float) else y_scale, "y_scale")
    if not _is_scalar(sy):
        raise OpError(f"y_scale: expected a scalar, got shape {sy.shape}")
    zy = np.zeros((), a.dtype) if y_zero_point is None else np.asarray(y_zero_point)
    if zy.dtype != a.dtype or not _is_scalar(zy):
        raise OpError(f"y_zero_point: expected a scalar of A's type {a.dtype}, got {zy.dtype} {zy.shape}")
    m = np.divide(m, sy.reshape(()), dtype=F32)
    return requantize(acc, m, int(zy.reshape(())), a.dtype)


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Unidirectional (numpy) broadcasting of ``shape`` to ``target``."""
    return len(shape) <= len(target) and all(s in (1, t) for s, t in zip(shape[::-1], target[::-1]))


@register("QGemm", MS_DOMAIN)
def qgemm_op(
    ctx: OpContext,
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    c: np.ndarray | None = None,
    y_scale: np.ndarray | None = None,
    y_zero_point: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    saturating_pairs: int = 0,
) -> np.ndarray:
    """com.microsoft QGemm-1 (see :func:`qgemm_ms`); quanta's ``saturating_pairs``: (QM1)."""
    del ctx  # unused
    return qgemm_ms(
        a,
        a_scale,
        a_zero_point,
        b,
        b_scale,
        b_zero_point,
        c,
        y_scale,
        y_zero_point,
        alpha=alpha,
        trans_a=bool(transA),
        trans_b=bool(transB),
        saturating_pairs=bool(saturating_pairs),
    )


# --------------------------------------------------------------------------------------
# MatMulIntegerToFloat, DynamicQuantizeMatMul
# --------------------------------------------------------------------------------------


def _b_param_supported(p_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """ORT's ``IsBQuantParamSupported``: scalar, ``[N]`` for a 2-D b, or b's shape with 1
    in the second-to-last dimension (per column of each batch matrix)."""
    rank = len(p_shape)
    if rank == 0 or (rank == 1 and p_shape[0] == 1):
        return True
    if rank == 1 and len(b_shape) == 2 and p_shape[0] == b_shape[1]:
        return True
    if rank != len(b_shape) or rank <= 1 or p_shape[-2] != 1:
        return False
    return all(p == d for i, (p, d) in enumerate(zip(p_shape, b_shape, strict=True)) if i != rank - 2)


def _scale_output(y: np.ndarray, scale: np.ndarray, what: str) -> np.ndarray:
    """ORT's ``ScaleOutput``: ``y = f32(y · scale)``, scale broadcast to y's shape."""
    try:
        if np.broadcast_shapes(scale.shape, y.shape) != y.shape:
            raise ValueError
    except ValueError as e:
        raise OpError(
            f"{what}: expected a shape that broadcasts to the output {y.shape}, got {scale.shape}"
        ) from e
    return np.multiply(y, scale.astype(F32), dtype=F32)


def _integer_to_float(
    qa: np.ndarray,
    b: np.ndarray,
    sa: np.ndarray,
    sb: np.ndarray,
    za: np.ndarray | None,
    zb: np.ndarray | None,
    bias: np.ndarray | None,
    saturating_pairs: bool = False,
) -> np.ndarray:
    """The shared ``MatMulIntegerToFloatBase::ComputeCommon`` plus the post-scalings."""
    if za is not None:
        if not _is_scalar(za):
            raise OpError(f"a_zero_point: expected a scalar (per tensor), got shape {za.shape}")
        if za.dtype != qa.dtype:
            raise OpError(f"a_zero_point: expected {qa.dtype}, got {za.dtype}")
    if zb is not None:
        if zb.dtype != b.dtype:
            raise OpError(f"b_zero_point: expected {b.dtype}, got {zb.dtype}")
        if not _b_param_supported(zb.shape, b.shape):
            raise OpError(
                f"b_zero_point: expected a scalar, [N] for a 2-D B, or B's shape with 1 at axis -2 "
                f"(B has shape {b.shape}), got shape {zb.shape}"
            )
    # zb: scalar, [N] or [..., 1, N], as validated above
    acc = matmul_integer(qa, b, za, zb, saturating_pairs=saturating_pairs)
    # a 1-D B (numpy.matmul: a vector, no N axis in the output) has one column
    n = b.shape[-1] if b.ndim >= 2 else 1
    a_is_scalar = _is_scalar(sa)
    sa_gemm = sa.reshape(()).astype(F32) if a_is_scalar else F32(1.0)
    b_supported = _b_param_supported(sb.shape, b.shape)
    if b_supported:
        m = np.multiply(sa_gemm, sb.reshape(()) if _is_scalar(sb) else sb, dtype=F32)  # (3)
    else:
        m = np.asarray(sa_gemm, F32)
    y = np.multiply(acc.astype(F32), m, dtype=F32)
    if bias is not None:
        if bias.shape != (n,) and not (b.ndim == 1 and bias.size == 1):
            raise OpError(f"bias: expected shape [{n}] (one value per output column), got {bias.shape}")
        y = np.add(y, bias.astype(F32), dtype=F32)
    if not a_is_scalar:
        y = _scale_output(y, sa, "a_scale")
    if not b_supported:
        y = _scale_output(y, sb, "b_scale")
    return y


def matmul_integer_to_float(
    a: np.ndarray,
    b: np.ndarray,
    a_scale: np.ndarray,
    b_scale: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    saturating_pairs: bool = False,
) -> np.ndarray:
    """com.microsoft MatMulIntegerToFloat: ``y = (a − za) @ (b − zb) · sa · sb + bias``
    with numpy.matmul broadcasting, computed as (3) and the scale layouts in the module
    docstring. The output type is the scales' type (float32 or float16).

    >>> a = np.array([[3, 5]], np.uint8); b = np.array([[2], [-1]], np.int8)
    >>> matmul_integer_to_float(a, b, F32(0.5), F32(0.25), np.uint8(1), None, np.array([1.0], F32))
    array([[1.]], dtype=float32)
    """
    a, b = np.asarray(a), np.asarray(b)
    sa, sb = np.asarray(a_scale), np.asarray(b_scale)
    _check_operand_types(a, b)
    out_dtype = sa.dtype
    if out_dtype not in (np.float32, np.float16) or sb.dtype != out_dtype:
        raise OpError(
            f"a_scale, b_scale: expected both float32 or both float16, got {sa.dtype} and {sb.dtype}"
        )
    if bias is not None and np.asarray(bias).dtype != out_dtype:
        raise OpError(f"bias: expected {out_dtype} (the scales' type), got {np.asarray(bias).dtype}")
    # FixupScaleTensor: scales given in the wrong order are swapped back.
    if not _is_scalar(sa):
        if sa.ndim == 1 or sa.shape[-1] != 1:
            sa, sb = sb, sa
    elif not _is_scalar(sb) and sb.ndim > 1 and sb.shape[-2] != 1:
        sa, sb = sb, sa
    y = _integer_to_float(
        a,
        b,
        sa.astype(F32),
        sb.astype(F32),
        None if a_zero_point is None else np.asarray(a_zero_point),
        None if b_zero_point is None else np.asarray(b_zero_point),
        None if bias is None else np.asarray(bias).astype(F32),
        saturating_pairs,
    )
    return y.astype(out_dtype)


def dynamic_quantize_matmul(
    a: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    saturating_pairs: bool = False,
) -> np.ndarray:
    """com.microsoft DynamicQuantizeMatMul: ``a`` (float32) quantized to uint8 by eq. (10)
    over the whole tensor, then :func:`matmul_integer_to_float` with ``a``'s scalar scale.

    >>> a = np.array([[-1.0, 254.0]], F32); b = np.array([[1], [1]], np.int8)
    >>> dynamic_quantize_matmul(a, b, F32(0.5))  # qa = [0, 255], za = 1, sa = 1: (-1 + 254) / 2
    array([[126.5]], dtype=float32)
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != np.float32:
        raise OpError(f"A: expected float32, got {a.dtype}")
    if b.dtype not in _EIGHT_BIT:
        raise OpError(f"B: expected uint8 or int8, got {b.dtype}")
    sb = _f32_scale(np.asarray(b_scale), "b_scale")
    if bias is not None and np.asarray(bias).dtype != np.float32:
        raise OpError(f"bias: expected float32, got {np.asarray(bias).dtype}")
    qa, sa, za = dynamic_quantize_linear(a)
    return _integer_to_float(
        qa, b, sa, sb, za, None if b_zero_point is None else np.asarray(b_zero_point), bias, saturating_pairs
    )


@register("MatMulIntegerToFloat", MS_DOMAIN)
def matmul_integer_to_float_op(
    ctx: OpContext,
    a: np.ndarray,
    b: np.ndarray,
    a_scale: np.ndarray,
    b_scale: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    saturating_pairs: int = 0,
) -> np.ndarray:
    """com.microsoft MatMulIntegerToFloat-1 (see :func:`matmul_integer_to_float`)."""
    del ctx  # unused
    return matmul_integer_to_float(
        a, b, a_scale, b_scale, a_zero_point, b_zero_point, bias, saturating_pairs=bool(saturating_pairs)
    )


@register("DynamicQuantizeMatMul", MS_DOMAIN)
def dynamic_quantize_matmul_op(
    ctx: OpContext,
    a: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    saturating_pairs: int = 0,
) -> np.ndarray:
    """com.microsoft DynamicQuantizeMatMul-1 (see :func:`dynamic_quantize_matmul`)."""
    del ctx  # unused
    return dynamic_quantize_matmul(a, b, b_scale, b_zero_point, bias, saturating_pairs=bool(saturating_pairs))
