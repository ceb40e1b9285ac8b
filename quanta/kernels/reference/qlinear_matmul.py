"""QLinearMatMul: integer matmul + float requantization (normative reference).

    acc = Σ_k (a[.., i, k] − za[i]) · (b[.., k, j] − zb[j])              eq. (4), int32
    y   = saturate(round_half_even(float32(acc) · m[i, j]) + zy)           eq. (6)
    m   = float32(float32(sa[i] · sb[j]) / sy)

``a_scale``/``a_zero_point`` are per tensor or per row of a (``[M]`` or ``[..., M, 1]``),
``b_scale``/``b_zero_point`` per tensor or per column of b (``[N]`` or ``[..., 1, N]``);
``y_scale``/``y_zero_point`` per tensor. The output type is the type of ``y_zero_point``.

Rounding is applied to ``acc·m`` and ``zy`` is added afterwards, as the ONNX text
(``y = saturate((x / y_scale) + y_zero_point)``, "rounding to nearest ties to even" for
``x / y_scale``) and ONNX Runtime do. The ONNX reference implementation adds ``zy`` before
rounding and multiplies in float64; both differences are pinned in test_qlinear.py and
described in docs/quantization-math.md.

``saturating_pairs`` (a quanta attribute the session sets under ``float_functions`` "ort"
or "auto" on a file ORT's quantizer wrote, where ORT's u8·s8 kernels saturate): uint8 a
times int8 b sums pairs of products in saturating int16 first, docs/float-ops.md (QM1)
(ORT fuses a QDQ MatMul group into QLinearMatMul and runs it on those kernels); eq. (6)
is unchanged.

Scales of type float16/bfloat16 are converted to float32 (exactly) before eq. (6).
The float8 variants QLinearMatMul-21 allows are not implemented here (no ONNX Runtime CPU
kernel to compare with): they raise an OpError.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.integer_ops import a_param, b_param, matmul_integer
from quanta.kernels.reference.registry import OpContext, OpError, register
from quanta.kernels.reference.requant import requant_multiplier, requantize

__all__ = ["qlinear_matmul"]

_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def qlinear_matmul(
    a: np.ndarray,
    a_scale: np.ndarray | float,
    a_zero_point: np.ndarray | int,
    b: np.ndarray,
    b_scale: np.ndarray | float,
    b_zero_point: np.ndarray | int,
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int,
    dtype: np.dtype | type | None = None,
    *,
    saturating_pairs: bool = False,
) -> np.ndarray:
    """Quantized ``a @ b`` with numpy.matmul broadcasting (eqs. (4), (6)).

    ``dtype`` is the output storage type, default the dtype of ``y_zero_point``;
    ``saturating_pairs``: eq. (4) as (QM1) for uint8 a and int8 b (module docstring).

    >>> a = np.array([[5]], np.uint8); b = np.array([[1]], np.uint8)
    >>> qlinear_matmul(a, 0.5, 0, b, 1.0, 0, 1.0, np.uint8(3)).tolist()  # 2.5 -> 2, + 3
    [[5]]
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if dtype is None:
        dtype = np.asarray(y_zero_point).dtype
    acc = matmul_integer(a, b, a_zero_point, b_zero_point, saturating_pairs=saturating_pairs)
    sa = a_param(np.asarray(a_scale, np.float32), a.shape, "a_scale")
    sb = b_param(np.asarray(b_scale, np.float32), b.shape, "b_scale")
    if np.asarray(y_scale).size != 1 or np.asarray(y_zero_point).size != 1:
        raise OpError(
            f"y_scale, y_zero_point: expected scalars (per-tensor), got shapes "
            f"{np.shape(y_scale)} and {np.shape(y_zero_point)}"
        )
    if a.ndim == 1 and sa.ndim:  # 1-D a: matmul drops the row axis
        raise OpError("a_scale: expected a scalar for a 1-D a")
    if b.ndim == 1:
        sb = sb.reshape(())
    m = requant_multiplier(sa, sb, np.asarray(y_scale, np.float32).reshape(()))
    if m.ndim and (a.ndim == 1 or b.ndim == 1):
        m = m.reshape(-1)
    zy = int(np.asarray(y_zero_point).reshape(()))
    return requantize(acc, m, zy, dtype)


@register("QLinearMatMul")
def qlinear_matmul_op(
    ctx: OpContext,
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    *,
    saturating_pairs: int = 0,
) -> np.ndarray:
    """ONNX QLinearMatMul-10/21 (int8/uint8); quanta's ``saturating_pairs``: (QM1) (module
    docstring)."""
    del ctx  # unused
    for name, v in (("a", a), ("b", b), ("y_zero_point", y_zero_point)):
        if v.dtype not in _EIGHT_BIT:
            raise OpError(
                f"{name}: expected int8 or uint8 (float8 QLinearMatMul is not implemented), got {v.dtype}"
            )
    for name, zp, v in (("a_zero_point", a_zero_point, a), ("b_zero_point", b_zero_point, b)):
        if zp.dtype != v.dtype:
            raise OpError(f"{name}: expected the type of its input ({v.dtype}), got {zp.dtype}")
    for name, s, zp in (
        ("a", a_scale, a_zero_point),
        ("b", b_scale, b_zero_point),
        ("y", y_scale, y_zero_point),
    ):
        if s.size != zp.size:
            raise OpError(f"{name}_zero_point: expected the shape of {name}_scale {s.shape}, got {zp.shape}")
    return qlinear_matmul(
        a,
        a_scale,
        a_zero_point,
        b,
        b_scale,
        b_zero_point,
        y_scale,
        y_zero_point,
        saturating_pairs=bool(saturating_pairs),
    )
