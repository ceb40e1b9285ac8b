"""Small helpers shared by the rule families (descriptions for NoMatch reasons, scalar
constants, quantized-type lookups)."""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Node, Value
from quanta.ir.onnx_io import quant_type_from_params
from quanta.ir.op_facts import derive
from quanta.ir.types import FloatType, QuantType
from quanta.passes.pattern import Match

__all__ = [
    "FOLDED_OFFSET",
    "NONDETERMINISTIC_OPS",
    "describe",
    "first_nonconst",
    "float_elem",
    "node_qtype",
    "quant_elem",
    "scalar",
]

#: ``Value.doc`` of a Conv's float bias that a pass folded from a per-channel affine after
#: the convolution (FoldBatchNormIntoQuantizedConv): the file adds it in float after the
#: float convolution, so the lowering adds it after the scaling instead of rounding it
#: to the int32 accumulator grid as it does a bias the file gives the Conv itself
#: (qdq_to_qlinear.conv_check, conv_float_output.LowerConvFloatOutput).
FOLDED_OFFSET = "float offset folded from a per-channel affine after the convolution"

#: ops whose results may differ between runs (op facts' random column): never folded,
#: merged or moved
NONDETERMINISTIC_OPS = derive(
    "quanta.passes.rules._util.NONDETERMINISTIC_OPS", lambda t: t.ops_where(random=True)
)


def describe(v: Value | None) -> str:
    """``'w' (a constant)``, ``'wf' (output of DequantizeLinear 'dq_w')``, ``'x' (a graph input)``."""
    if v is None:
        return "an omitted input"
    if v.is_const:
        return f"'{v.name}' (a constant)"
    if v.producer is not None:
        return f"'{v.name}' (output of {v.producer.label})"
    return f"'{v.name}' (a graph input)"


def first_nonconst(m: Match, *names: str) -> str | None:
    """The first named capture that is present and not a constant, described."""
    for n in names:
        v = m[n]
        if v is not None and not v.is_const:
            return f"{n} {describe(v)}"
    return None


def quant_elem(v: Value | None) -> QuantType | None:
    if v is None or v.type is None or not isinstance(v.type.elem, QuantType):
        return None
    return v.type.elem


def float_elem(v: Value | None) -> FloatType | None:
    if v is None or v.type is None or not isinstance(v.type.elem, FloatType):
        return None
    return v.type.elem


def node_qtype(
    node: Node, operand: Value | None, scale: Value | None, zero_point: Value | None
) -> QuantType | None:
    """The QuantType a Q/DQ node's constant scale / zero point describe (None when they
    are not constants)."""
    return quant_type_from_params(node, operand, scale, zero_point)


def scalar(v: Value | None) -> float | None:
    """The value of a one-element constant, else None."""
    if v is None or not v.is_const or np.asarray(v.const).size != 1:
        return None
    return float(np.asarray(v.const).reshape(()))
