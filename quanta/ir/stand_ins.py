"""Stand-ins that let ``onnx.shape_inference`` see through com.microsoft operators it
has no schema for.

ONNX's shape inference stops at a node of an unregistered domain: the outputs of
ORT's ``DynamicQuantizeLSTM`` get no type, nor does anything computed from them, so a
branch compiled for one input signature cannot fold a ``Shape`` downstream and keeps the
``If`` on it (silero-vad's int8 file: an If, a Shape, a Gather and an Equal per call,
15 us of a 130 us run). :func:`infer_through` runs the inference on a copy whose
DynamicQuantizeLSTM (quanta::DynamicQuantizeGRU) nodes are ai.onnx ``LSTM`` (``GRU``) nodes with the same X, ``hidden_size``,
``direction`` and ``layout`` (the outputs' shapes depend on nothing else: Y [T, D, B, H],
Y_h and Y_c [D, B, H]; W and R, int8 [D, I, 4H] here, are left out of the stand-in), then
puts the original nodes back. Top-level nodes only.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from quanta.ir.shape_hints import infer_shapes

__all__ = ["infer_through"]

MS_DOMAIN = "com.microsoft"
_SHAPE_ATTRS = ("hidden_size", "direction", "layout")


_STAND_IN_OF = {(MS_DOMAIN, "DynamicQuantizeLSTM"): "LSTM", ("quanta", "DynamicQuantizeGRU"): "GRU"}


def _stand_in(node: onnx.NodeProto) -> onnx.NodeProto | None:
    op = _STAND_IN_OF.get((node.domain, node.op_type))
    if op is None or not node.input:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in _SHAPE_ATTRS}
    return helper.make_node(op, [node.input[0], "", ""], list(node.output), name=node.name, **attrs)


def infer_through(proto: onnx.ModelProto, **kw: Any) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes(proto, **kw)`` with the stand-ins above."""
    originals: dict[int, onnx.NodeProto] = {}
    shadow = proto
    for k, node in enumerate(proto.graph.node):
        stand_in = _stand_in(node)
        if stand_in is None:
            continue
        if not originals:
            shadow = onnx.ModelProto()
            shadow.CopyFrom(proto)
        originals[k] = node
        shadow.graph.node[k].CopyFrom(stand_in)
    inferred = infer_shapes(shadow, **kw)
    for k, node in originals.items():
        inferred.graph.node[k].CopyFrom(node)
    return inferred
