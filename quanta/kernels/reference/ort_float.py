"""quanta MlasLogistic and MlasTanh: ONNX Runtime's float32 Sigmoid and Tanh (normative).

ONNX defines Sigmoid and Tanh as the exact functions; quanta's Sigmoid and Tanh compute
them within 2.4 and 2 ulp (docs/float-ops.md (Σ1)-(Σ2), (T1)-(T4)). ONNX Runtime's CPU
kernels compute MLAS's rational approximations instead (``MlasComputeLogistic``,
``MlasComputeTanh``; on x86-64 with FMA their FMA3 kernels), which differ from the exact
functions in the last bits. In a file that ORT's quantizer wrote for ORT, such last bits
decide roundings downstream (a dynamically quantized model re-quantizes every
activation), so a session that must agree with ORT runs these in their place
(``SessionOptions.float_functions``, docs/float-ops.md "ONNX Runtime's functions")::

    MlasLogistic(x) = mlas_logistic(x)      clamp to [-18, 18], x·P(x²) / Q(x²) + 0.5, floor 0
    MlasTanh(x)     = mlas_tanh(x)          clamp to [-9, 9],   x·P(x²) / Q(x²)

(:mod:`quanta.kernels.reference.ms_lstm`, which DynamicQuantizeLSTM's gates use too).
float32 only: other element types are an error naming the op.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.ms_lstm import mlas_logistic, mlas_tanh
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["QUANTA_DOMAIN", "mlas_logistic_op", "mlas_tanh_op"]

QUANTA_DOMAIN = "quanta"


def _f32(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise OpError(f"{ctx.op_type or 'op'}: X: expected float32, got {x.dtype}")
    return x


@register("MlasLogistic", QUANTA_DOMAIN)
def mlas_logistic_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """quanta MlasLogistic-1: ORT's Sigmoid (module docstring)."""
    return mlas_logistic(_f32(ctx, x))


@register("MlasTanh", QUANTA_DOMAIN)
def mlas_tanh_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """quanta MlasTanh-1: ORT's Tanh (module docstring)."""
    return mlas_tanh(_f32(ctx, x))
