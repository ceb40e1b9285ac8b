"""quanta MlasLogistic, MlasTanh, MlasGeluTanh and OrtLSTM: ONNX Runtime's float32 Sigmoid,
Tanh and LSTM (normative), and a tanh GELU written out around ORT's Tanh.

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
``MlasGeluTanh`` is eq. (G2) of docs/float-ops.md with MLAS's tanh in place of (T1)-(T4):
the eight nodes of an exported ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` in a file
ORT's quantizer wrote (whose Tanh became MlasTanh), fused by FuseGeluTanh.
float32 only: other element types are an error naming the op.

``OrtLSTM`` is the ai.onnx LSTM (same inputs, outputs and attributes) as ORT's CPU kernel
computes it in float32: the products by MLAS's float GEMM (fused multiply-add chains in
blocks of 256 k, :func:`quanta.kernels.reference.rnn.mlas_sgemm_blocks`), the gates in
ORT's order with MLAS's logistic and tanh (docs/float-ops.md (RNN-ORT)). A file ORT's
quantizer wrote keeps an LSTM float between a DequantizeLinear and a QuantizeLinear; its Y
is quantized again, so the last bits of these products decide codes.

``OrtGRU`` is the ai.onnx GRU as ORT's CPU kernel computes it (deep_cpu_gru.cc): the
products by the same MLAS GEMM blocks, z by MLAS's logistic, r and the candidate by ORT's
own rational sigmoid and tanh (``deepcpu_sigmoid`` / ``deepcpu_tanh``), in its order
(docs/float-ops.md (RNN-ORT-GRU)). ORT's ``quantize_dynamic`` keeps a GRU float and
quantizes its Y again with DynamicQuantizeLinear (pyfrspell's files).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from quanta.kernels.reference.float_ops import GELU_C, GELU_K
from quanta.kernels.reference.ms_lstm import mlas_logistic, mlas_tanh
from quanta.kernels.reference.registry import OpContext, OpError, register
from quanta.kernels.reference.rnn import default_activations, gru, lstm

__all__ = [
    "QUANTA_DOMAIN",
    "mlas_gelu_tanh",
    "mlas_gelu_tanh_op",
    "mlas_logistic_op",
    "mlas_tanh_op",
    "ort_gru_op",
    "ort_lstm_op",
]

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


def mlas_gelu_tanh(x: np.ndarray) -> np.ndarray:
    """Eq. (G2) with MLAS's tanh, every step one float32 IEEE operation in the export's
    order::

        a = f32(K · f32(x + f32(C · f32(f32(x · x) · x))))     K = f32(√(2/π)), C = f32(0.044715)
        y = f32(f32(0.5 · x) · f32(1 + mlas_tanh(a)))"""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # x³ overflows from |x| = 7e12 on
        a = GELU_K * (x + GELU_C * ((x * x) * x))
        return (np.float32(0.5) * x) * (np.float32(1) + mlas_tanh(a))


@register("MlasGeluTanh", QUANTA_DOMAIN)
def mlas_gelu_tanh_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """quanta MlasGeluTanh-1: the tanh GELU with ORT's Tanh (module docstring)."""
    return mlas_gelu_tanh(_f32(ctx, x))


def _check_rnn(
    op: str, inputs: Sequence[np.ndarray | None], activations: Sequence[str] | None, attrs: dict
) -> None:
    """What Ort{op} takes: the default activations (the rule that writes the op keeps any
    other as it is), float32 operands (sequence_lens aside), clip > 0."""
    directions = 2 if attrs.get("direction", "forward") == "bidirectional" else 1
    if not default_activations(op, activations, directions):
        raise OpError(f"Ort{op}: only the default activations, got {list(activations or [])}")
    for k, v in enumerate(inputs):
        if k != 4 and v is not None and np.asarray(v).dtype != np.float32:
            raise OpError(f"Ort{op}: input {k} must be float32, got {np.asarray(v).dtype}")
    clip = attrs.get("clip")
    if clip is not None and not float(clip) > 0:
        raise OpError(f"Ort{op}: clip must be > 0, got {clip}")


@register("OrtLSTM", QUANTA_DOMAIN)
def ort_lstm_op(
    ctx: OpContext,
    *inputs: np.ndarray | None,
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] = (),
    activation_beta: Sequence[float] = (),
    **attrs: Any,
) -> tuple[np.ndarray, ...]:
    """quanta OrtLSTM-1: ORT's float32 LSTM (module docstring); the default activations
    only (the rule that writes this op keeps any other LSTM as it is)."""
    _check_rnn("LSTM", inputs, activations, attrs)
    return lstm(*inputs, **attrs, functions="ort")[: max(1, ctx.n_outputs)]


@register("OrtGRU", QUANTA_DOMAIN)
def ort_gru_op(
    ctx: OpContext,
    *inputs: np.ndarray | None,
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] = (),
    activation_beta: Sequence[float] = (),
    **attrs: Any,
) -> tuple[np.ndarray, ...]:
    """quanta OrtGRU-1: ORT's float32 GRU (module docstring); the default activations
    only (the rule that writes this op keeps any other GRU as it is)."""
    _check_rnn("GRU", inputs, activations, attrs)
    return gru(*inputs, **attrs, functions="ort")[: max(1, ctx.n_outputs)]
