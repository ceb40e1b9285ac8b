"""Q -> DQ pairs that ONNX Runtime's QDQ propagation would insert, written into the file.

ONNX Runtime (``QDQPropagationTransformer``, graph optimization level "extended" and
above) carries a DequantizeLinear forward through the data-movement ops after it
(Reshape, Transpose, Squeeze, Unsqueeze, Slice, MaxPool): when such an op's output does
not go on into a QuantizeLinear, it inserts ``Q -> DQ`` with the DequantizeLinear's own
scale and zero point after it. With a signed 8-bit zero point at opset >= 21 the Q node it
inserts fails its own type check (``output_dtype INT8 does not match y_zero_point type
UINT8``, ONNX Runtime 1.32 on x86, where it also rewrites signed 8-bit Q/DQ to unsigned)
and the session is refused: a GQA key ``DQ -> Unsqueeze -> Expand`` is enough.

The same pairs written by quanta leave that pass nothing to insert. They change no value:
a data-movement op moves codes, and ``Q(DQ(q))`` with the same scale and zero point is
``q`` again (docs/quantization-math.md eq. (2)), so quanta's runtime and ONNX Runtime
compute exactly what they computed without them.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.types import TensorType

__all__ = ["PROPAGATING_OPS", "settle_dq_propagation"]

#: the ops ONNX Runtime carries a DequantizeLinear through (qdq_propagation.cc)
PROPAGATING_OPS = frozenset({"MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice"})


def _scalar_const(v: Value | None) -> bool:
    return v is not None and v.const is not None and np.asarray(v.const).size == 1


def _signed_8bit_dq(node: Node) -> bool:
    if node.op_type != "DequantizeLinear" or node.domain or len(node.inputs) < 3:
        return False
    scale, zp = node.inputs[1], node.inputs[2]
    return _scalar_const(scale) and _scalar_const(zp) and np.asarray(zp.const).dtype == np.int8  # type: ignore[union-attr]


def needs_settling(opset: int) -> bool:
    """Whether ONNX Runtime's propagation breaks signed 8-bit pairs at this opset (its
    QuantizeLinear-21 type check); below 21 its inserted pairs are valid."""
    return opset >= 21


def settle_dq_propagation(graph: Graph, opset: int) -> int:
    """Insert, after every data-movement op that ONNX Runtime would carry a signed
    8-bit, per-tensor DequantizeLinear through, the ``Q -> DQ`` pair it would insert
    (same scale and zero point), so that it inserts none. Returns how many pairs."""
    if not needs_settling(opset):
        return 0
    added = 0
    # each pair's new DQ is a start of its own: the chain continues from it, as in ORT
    work = [n for n in graph.nodes if _signed_8bit_dq(n)]
    with graph.naming():
        while work:
            dq = work.pop()
            uses = list(dq.outputs[0].uses)
            # ONNX Runtime starts only from a DQ with one consumer (1.32 also from one
            # whose output is a graph output besides), carried through its data input
            if len(uses) != 1:
                continue
            node, slot = uses[0]
            if node.op_type not in PROPAGATING_OPS or node.domain or slot != 0:
                continue
            v = node.outputs[0]
            readers = list(v.uses)
            is_output = any(o is v for o in graph.outputs)
            if is_output and readers:
                continue  # ONNX Runtime propagates into neither
            if is_output or any(u.op_type != "QuantizeLinear" for u, _ in readers):
                work.append(_pair_after(graph, v, dq, is_output))
                added += 1
    if added:
        graph.toposort()
    return added


def _pair_after(graph: Graph, v: Value, dq: Node, is_output: bool) -> Node:
    """``v -> Q -> DQ`` with ``dq``'s scale and zero point; every consumer of ``v`` that is
    not a QuantizeLinear (and the graph output ``v``) reads the new DQ instead."""
    scale, zp = dq.inputs[1], dq.inputs[2]
    codes = dq.inputs[0].type
    qtype = None if codes is None else TensorType(codes.elem, v.shape)
    qv = Value(graph.fresh_name(f"{v.name}_quantized"), qtype)
    dqv = Value(graph.fresh_name(f"{v.name}_dequantized"), v.type)
    qnode = Node("QuantizeLinear", [v, scale, zp], [qv], name=graph.fresh_name(f"{v.name}_QuantizeLinear"))
    dqnode = Node(
        "DequantizeLinear", [qv, scale, zp], [dqv], name=graph.fresh_name(f"{v.name}_DequantizeLinear")
    )
    readers = [(u, i) for u, i in v.uses if u.op_type != "QuantizeLinear"]
    graph.add_node(qnode)
    graph.add_node(dqnode)
    for u, i in readers:
        u.replace_input(i, dqv)
    if is_output:
        name = v.name
        v.name = graph.fresh_name(f"{name}_float")
        dqv.name = name
        graph.outputs = [dqv if o is v else o for o in graph.outputs]
    return dqnode
