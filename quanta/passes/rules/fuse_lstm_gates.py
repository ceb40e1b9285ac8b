"""One node for the elementwise half of an exported LSTM cell.

torch.onnx writes ``nn.LSTMCell`` (and an unrolled ``nn.LSTM``) as two Gemms, an Add and
then ten elementwise nodes per step::

    %a_0, %a_1, %a_2, %a_3 = Split(%s) {axis=1, four equal chunks}
    %i = Sigmoid(%a_I)   %f = Sigmoid(%a_F)   %g = Tanh(%a_G)   %o = Sigmoid(%a_O)
    %c' = Add(Mul(%f, %c), Mul(%i, %g))
    %h' = Mul(%o, Tanh(%c'))
  ->
    %h', %c' = quanta::LSTMGates(%s, %c) {order=[I, F, G, O]}

The chunks' roles are read off the graph (the Sigmoid whose output meets ``%c`` is the
forget gate, the one that meets the Tanh the input gate, the one that meets ``Tanh(%c')``
the output gate), operands of Mul and Add in either order. The fused node computes the
same float32 operations on the same values (reference/rnn.py ``lstm_gates``, (LG1)-(LG2);
float32 products and sums commute exactly), so the graph's bytes do not change; the gain
is ten steps fewer per cell and step (silero-vad: one cell per call; captcha_crnn: 40).

Not taken: another consumer of any intermediate value, a graph output among them, a
Split of unequal or unknown chunks or along another axis than the last of a rank-2
value, non-float32 values.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.types import elem_from_numpy
from quanta.passes.manager import Pass, PassResult

__all__ = ["FuseLSTMGates"]

_F32 = elem_from_numpy(np.float32)


def only_consumer(v: Value, outputs: set[int]) -> Node | None:
    """The one node that reads ``v`` (None when several do, or ``v`` is a graph output,
    ``outputs`` holding their ids): a value a fused step may take over."""
    if id(v) in outputs or len(v.uses) != 1:
        return None
    return v.uses[0][0]


def _other(node: Node, v: Value) -> Value | None:
    """The other operand of a binary node one of whose operands is ``v``."""
    a, b = node.input(0), node.input(1)
    if a is v:
        return b
    if b is v:
        return a
    return None


def _equal_chunks(split: Node, s: Value) -> bool:
    shape = s.shape
    if shape is None or len(shape) != 2 or int(split.attrs.get("axis", 0)) not in (1, -1):
        return False
    width = shape[1] if isinstance(shape[1], int) else None
    sizes = split.input(1)
    if sizes is not None:
        if not sizes.is_const:
            return False
        parts = [int(v) for v in np.asarray(sizes.const).reshape(-1)]
    elif "split" in split.attrs:
        parts = [int(v) for v in split.attrs["split"]]
    else:
        return width is not None and width % 4 == 0  # equal chunks by the spec
    return len(parts) == 4 and len(set(parts)) == 1 and (width is None or sum(parts) == width)


def _match(split: Node, outputs: set[int]) -> tuple[list[Node], list[int], Value, Value, Value] | None:
    """(the nodes to replace, order, c, h', c') of a cell whose Split is ``split``."""
    if split.op_type != "Split" or split.domain or len(split.outputs) != 4:
        return None
    s = split.input(0)
    if s is None or s.elem != _F32 or not _equal_chunks(split, s):
        return None
    acts: list[Node] = []
    for a in split.outputs:
        act = only_consumer(a, outputs)
        if act is None or act.domain or act.op_type not in ("Sigmoid", "Tanh"):
            return None
        acts.append(act)
    if sorted(a.op_type for a in acts) != ["Sigmoid", "Sigmoid", "Sigmoid", "Tanh"]:
        return None
    mul_of = [only_consumer(a.outputs[0], outputs) for a in acts]
    if any(m is None or m.op_type != "Mul" or m.domain for m in mul_of):
        return None
    g = next(k for k, a in enumerate(acts) if a.op_type == "Tanh")
    m1 = mul_of[g]
    i = next((k for k in range(4) if k != g and mul_of[k] is m1), None)
    if i is None:
        return None
    rest = [k for k in range(4) if k not in (g, i)]
    # the forget gate's Mul takes c, which no gate computes; the output gate's Mul takes Tanh(c')
    add = None
    for f, o in (rest, rest[::-1]):
        m0, m2 = mul_of[f], mul_of[o]
        if m0 is m2 or m0 is m1 or m2 is m1:
            return None
        add = only_consumer(m0.outputs[0], outputs)
        if (
            add is None
            or add.op_type != "Add"
            or add.domain
            or _other(add, m0.outputs[0]) is not m1.outputs[0]
        ):
            continue
        c = _other(m0, acts[f].outputs[0])
        c_new = add.outputs[0]
        t2 = _other(m2, acts[o].outputs[0])
        tanh_c = None if t2 is None else t2.producer
        if (
            c is None
            or c.elem != _F32
            or tanh_c is None
            or tanh_c.op_type != "Tanh"
            or tanh_c.domain
            or tanh_c.input(0) is not c_new
            or only_consumer(t2, outputs) is not m2
            or only_consumer(m1.outputs[0], outputs) is not add
        ):
            continue
        nodes = [split, *acts, m0, m1, add, tanh_c, m2]
        return nodes, [i, f, g, o], c, m2.outputs[0], c_new
    return None


class FuseLSTMGates(Pass):
    name = "fuse_lstm_gates"

    def call(self, graph: Graph) -> PassResult:
        outputs = {id(v) for v in graph.outputs}
        fused = 0
        for split in [n for n in graph.nodes if n.op_type == "Split"]:
            m = _match(split, outputs)
            if m is None:
                continue
            nodes, order, c, h_new, c_new = m
            s = split.input(0)
            old = {id(n) for n in nodes}
            add = nodes[-3]
            k = graph.nodes.index(add) + 1
            anchor = next((n for n in graph.nodes[k:] if id(n) not in old), None)
            for node in nodes:  # the old nodes go together, their outputs live on in the fused node
                for j, v in enumerate(node.inputs):
                    if v is not None:
                        v.uses.remove((node, j))
                for v in node.outputs:
                    v.producer = None
                graph.nodes.remove(node)
            fused_node = Node(
                "LSTMGates",
                [s, c],
                [h_new, c_new],
                {"order": order},
                name=graph.fresh_name(f"{split.name or 'lstm'}_gates"),
                domain="quanta",
            )
            graph.add_node(fused_node, before=anchor)
            fused += 1
        return PassResult(graph, bool(fused), {"cells": fused} if fused else {})
