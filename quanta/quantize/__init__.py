"""Quantization: ranges -> parameters (params.py), recipes, QDQ insertion."""

from __future__ import annotations

from quanta.quantize.params import (
    adjust_weight_scale_for_bias,
    bias_params,
    compute_scale_zero_point,
    params_from_range,
    quant_range,
    quantize_bias,
)

__all__ = [
    "adjust_weight_scale_for_bias",
    "bias_params",
    "compute_scale_zero_point",
    "params_from_range",
    "quant_range",
    "quantize_bias",
]
