"""quanta::AccumulatorToFloat: the float output stage of an integer convolution whose
result stays float (LowerConvFloatOutput, docs/passes.md)::

    y = AccumulatorToFloat(acc, bias?, scale, float_bias?)
      = Add?(Mul(Cast<float>(Add?(acc, bias)), scale), float_bias)

acc and bias are int32 (the sum wraps, as ai.onnx Add on int32 does here), scale and
float_bias float32; all broadcast numpy-style ([1, M, 1, ...] per output channel). Each
step is the ai.onnx operator's twin in this order, so the value is bit for bit the
four-node chain it replaces: one float32 rounding of the exact integer sum (the Cast),
then one per float operation.

    y = AccumulatorToQuant(acc, bias?, scale, float_bias?, y_scale, y_zero_point)
          {activation, activation_params}
      = QuantizeLinear(act(AccumulatorToFloat(acc, bias, scale, float_bias)), y_scale, y_zero_point)

the same stage followed by the float gate a float ``quanta::Conv`` fuses (``activation``:
none, SiLU, HardSwish, HardSigmoid, ClipMulDiv; nn_conv.fused_gate, the replaced nodes'
own functions in order) and a per-tensor QuantizeLinear (its twin): the chain that
passes/lower/accumulator_to_quant.py folds into one node, bit for bit.

    y = SoftmaxQuant(x, scale?, mask?, y_scale, y_zero_point)
      = QuantizeLinear(Softmax(Add?(Mul?(x, scale), mask), axis=-1), y_scale, y_zero_point)

an attention score's float stage (passes/lower/accumulator_to_quant.py, FuseSoftmaxQuant):
the Mul by one float32 value, the Add of a mask (numpy broadcasting), the Softmax
along the last axis and a per-tensor QuantizeLinear, each the ai.onnx operator's twin in
this order, except that the Softmax's exp is the fused (EN1)-(EN6) instead of (E1)-(E6)
(docs/float-ops.md "SoftmaxQuant": within 1.01 ulp like (E1)-(E6), the 8-bit output can
differ from the unfused chain's only where the product lies at a rounding tie).

    y = MulQuant(x, c, y_scale, y_zero_point) = QuantizeLinear(Mul(x, c), y_scale, y_zero_point)

a SmoothQuant file's per-column factor and the activation's quantization
(passes/lower/mul_quant.py, FuseMulQuant): c float32, one value or one per element of x's
last axis; the Mul's float32 rounding, then QuantizeLinear's twin. With the attribute
``activation="gelu"`` (FuseGeluMulQuant) x first goes through the Gelu twin (G1):
MulQuant(Gelu(x), c, ...) as one node, eq. (OV1) of docs/float-ops.md.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.registry import OpError, register

__all__ = ["QUANTA_DOMAIN", "accumulator_to_float", "accumulator_to_quant", "mul_quant", "softmax_quant"]

QUANTA_DOMAIN = "quanta"


@register("AccumulatorToFloat", QUANTA_DOMAIN)
def accumulator_to_float(
    ctx, acc: np.ndarray, bias: np.ndarray | None, scale: np.ndarray, float_bias: np.ndarray | None = None
) -> np.ndarray:
    del ctx  # unused
    if acc.dtype != np.int32 or (bias is not None and bias.dtype != np.int32):
        raise OpError(
            f"AccumulatorToFloat: expected int32 acc and bias, got {acc.dtype} and {getattr(bias, 'dtype', None)}"
        )
    if scale.dtype != np.float32 or (float_bias is not None and float_bias.dtype != np.float32):
        raise OpError("AccumulatorToFloat: expected float32 scale and float_bias")
    with np.errstate(all="ignore"):
        a = acc if bias is None else np.add(acc, bias)
        y = np.multiply(a.astype(np.float32), scale)
        if float_bias is not None:
            y = np.add(y, float_bias)
    return np.asarray(y, np.float32)


@register("AccumulatorToQuant", QUANTA_DOMAIN)
def accumulator_to_quant(
    ctx,
    acc: np.ndarray,
    bias: np.ndarray | None,
    scale: np.ndarray,
    float_bias: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    *,
    activation: str = "",
    activation_params: list[float] | None = None,
) -> np.ndarray:
    from quanta.kernels.reference.nn_conv import fused_gate
    from quanta.kernels.reference.quantize import quantize_linear_op

    y = np.asarray(accumulator_to_float(ctx, acc, bias, scale, float_bias))
    if activation:
        with np.errstate(all="ignore"):
            y = np.asarray(fused_gate(y, activation, activation_params, getattr(ctx, "node_name", "")))
    return np.asarray(quantize_linear_op(ctx, y, y_scale, y_zero_point))


@register("SoftmaxQuant", QUANTA_DOMAIN)
def softmax_quant(
    ctx,
    x: np.ndarray,
    scale: np.ndarray | None,
    mask: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
) -> np.ndarray:
    from quanta.kernels.reference.float_ops import softmax_rows
    from quanta.kernels.reference.nn import softmax
    from quanta.kernels.reference.quantize import quantize_linear_op

    if x.dtype != np.float32 or any(v is not None and v.dtype != np.float32 for v in (scale, mask)):
        raise OpError("SoftmaxQuant: expected float32 x, scale and mask")
    v = x
    with np.errstate(all="ignore"):
        if scale is not None:
            v = np.multiply(v, scale, dtype=np.float32)
        if mask is not None:
            v = np.add(v, mask, dtype=np.float32)
    if np.ndim(v) < 1:
        raise OpError("SoftmaxQuant: expected a result of rank >= 1")
    v = np.asarray(v, np.float32)
    if v.size:
        # (S1)-(S5) along the last axis with the fused exp (EN1)-(EN6) in (S2)
        y = softmax_rows(v.reshape(-1, v.shape[-1]), fused=True).reshape(v.shape)
    else:
        y = softmax(ctx, v, axis=-1)
    return np.asarray(quantize_linear_op(ctx, y, y_scale, y_zero_point))


@register("MulQuant", QUANTA_DOMAIN)
def mul_quant(
    ctx,
    x: np.ndarray,
    c: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    *,
    activation: str = "none",
) -> np.ndarray:
    """(OV1) of docs/float-ops.md: activation "gelu" is the Gelu twin (G1) first."""
    from quanta.kernels.reference.quantize import quantize_linear_op

    if x.dtype != np.float32 or c.dtype != np.float32:
        raise OpError("MulQuant: expected float32 x and c")
    if activation not in ("none", "gelu"):
        raise OpError(f"MulQuant: activation expected 'none' or 'gelu', got {activation!r}")
    if activation == "gelu":
        from quanta.kernels.reference import float_ops

        x = float_ops.gelu_f32(x)
    with np.errstate(all="ignore"):
        v = np.multiply(x, c, dtype=np.float32)
    return np.asarray(quantize_linear_op(ctx, v, y_scale, y_zero_point))
