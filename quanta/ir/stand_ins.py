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

com.microsoft ``QuantizeLinear`` / ``DequantizeLinear`` (ONNX Runtime's quantizer writes
every Q / DQ of a file in that domain when a weight type needs a newer ai.onnx opset than
the model's: int4 weights at opset 17) stand in as the ai.onnx ops, which compute the same
shapes (the input's) and types (the scale's for DQ, the zero point's for Q). Their 4- and
16-bit constant codes and zero points stand in as 8-bit tensors of the same dims (the ai.onnx
ops accept 4- and 16-bit storage from opset 21 only); each Q output then gets its zero
point's real type back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.ir.shape_hints import infer_shapes

__all__ = ["infer_through"]

_SHAPE_ATTRS = ("hidden_size", "direction", "layout")


_STAND_IN_OF = {(MS_DOMAIN, "DynamicQuantizeLSTM"): "LSTM", ("quanta", "DynamicQuantizeGRU"): "GRU"}


def _stand_in(node: onnx.NodeProto) -> onnx.NodeProto | None:
    op = _STAND_IN_OF.get((node.domain, node.op_type))
    if op is None or not node.input:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in _SHAPE_ATTRS}
    return helper.make_node(op, [node.input[0], "", ""], list(node.output), name=node.name, **attrs)


#: storage the ai.onnx Q / DQ accept only from opset 21 -> the 8-bit type that stands in
_EIGHT_BIT_OF = {
    TensorProto.INT4: TensorProto.INT8,
    TensorProto.UINT4: TensorProto.UINT8,
    TensorProto.INT16: TensorProto.INT8,
    TensorProto.UINT16: TensorProto.UINT8,
}
_MS_QDQ = ("QuantizeLinear", "DequantizeLinear")


def infer_through(proto: onnx.ModelProto, **kw: Any) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes(proto, **kw)`` with the stand-ins above."""
    originals: dict[int, onnx.NodeProto] = {}
    shadow = proto
    inits = {t.name: k for k, t in enumerate(proto.graph.initializer)}
    retyped: set[int] = set()  # initializers that stand in as 8-bit tensors
    q_types: dict[str, int] = {}  # a com.microsoft Q's output -> its zero point's type
    for k, node in enumerate(proto.graph.node):
        if node.domain == MS_DOMAIN and node.op_type in _MS_QDQ:
            stand_in = helper.make_node(node.op_type, list(node.input), list(node.output), name=node.name)
            stand_in.attribute.extend(a for a in node.attribute if a.name == "axis")
            codes = [node.input[2]] if len(node.input) > 2 else []
            if node.op_type == "DequantizeLinear":
                codes.append(node.input[0])
            for name in codes:
                i = inits.get(name)
                if i is not None and proto.graph.initializer[i].data_type in _EIGHT_BIT_OF:
                    retyped.add(i)
            if node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in inits:
                q_types[node.output[0]] = proto.graph.initializer[inits[node.input[2]]].data_type
        else:
            stand_in = _stand_in(node)
        if stand_in is None:
            continue
        if not originals:
            shadow = onnx.ModelProto()
            shadow.CopyFrom(proto)
        originals[k] = node
        shadow.graph.node[k].CopyFrom(stand_in)
    for i in retyped:  # dims kept, data dropped: inference reads neither the codes nor their type's width
        t = shadow.graph.initializer[i]
        dims, name, dtype = list(t.dims), t.name, _EIGHT_BIT_OF[t.data_type]
        t.Clear()
        t.name, t.data_type = name, dtype
        t.dims.extend(dims)
        t.raw_data = bytes(int(np.prod(dims, dtype=np.int64)))
    inferred = infer_shapes(shadow, **kw)
    for k, node in originals.items():
        inferred.graph.node[k].CopyFrom(node)
    for i in retyped:
        inferred.graph.initializer[i].CopyFrom(proto.graph.initializer[i])
    for vi in inferred.graph.value_info:
        if vi.name in q_types and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.elem_type = q_types[vi.name]
    return inferred
