"""One node for the elementwise half of an exported GRU cell.

torch.onnx (TorchScript exporter) writes ``nn.GRUCell`` as two Gemms, each split into three
chunks, and ten elementwise nodes per step::

    %x_0, %x_1, %x_2 = Split(%gx) {axis=1, three equal chunks}     (the input's product)
    %h_0, %h_1, %h_2 = Split(%gh) {axis=1, three equal chunks}     (the state's product)
    %r = Sigmoid(Add(%h_R, %x_R))   %z = Sigmoid(Add(%h_Z, %x_Z))
    %n = Tanh(Add(%x_N, Mul(%h_N, %r)))
    %h' = Add(Mul(Sub(%h, %n), %z), %n)
  ->
    %h' = quanta::GRUGates(%gx, %gh, %h) {order=[R, Z, N]}

The chunks' roles are read off the graph (the Sigmoid that meets the Tanh's Mul is the reset
gate, the one that meets ``Sub(%h, %n)`` the update gate), operands of Add and Mul in either
order; Sub is ``h − n`` as torch writes it. The fused node computes the same float32
operations on the same values (reference/rnn.py ``gru_gates``, (GG1)-(GG3); float32 products
and sums commute exactly), so the graph's bytes do not change; the gain is twelve steps fewer
per cell and step (g2p_en's decoder: one cell per call, 16 plan steps -> 5).

The products' and the state's rows may differ by name (the exporter names each input's
batch axis: g2p_en's decoder has ``token_0`` and ``h_0``): a row count of 1 broadcasts in
the fused node as in the replaced ones, and another mismatch is refused by both.

Not taken: another consumer of any intermediate value, a graph output among them, a Split of
unequal or unknown chunks, along another axis than the last of a rank-2 value, or with
another chunk order in the two Splits, a state that is not [rows, H], non-float32 values.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.types import elem_from_numpy
from quanta.passes.manager import Pass, PassResult
from quanta.passes.rules.fuse_lstm_gates import only_consumer

__all__ = ["FuseGRUGates"]

_F32 = elem_from_numpy(np.float32)


def _op(v: Value | None, op_type: str) -> Node | None:
    """The producer of ``v`` when it is a default-domain ``op_type`` node."""
    node = None if v is None else v.producer
    if node is None or node.op_type != op_type or node.domain:
        return None
    return node


def _chunk(split: Node, width_h: int) -> int | None:
    """H when ``split`` cuts its rank-2 float32 input into three equal chunks along the last axis."""
    s = split.input(0)
    if s is None or s.elem != _F32 or len(split.outputs) != 3:
        return None
    shape = s.shape
    if shape is None or len(shape) != 2 or int(split.attrs.get("axis", 0)) not in (1, -1):
        return None
    width = shape[1] if isinstance(shape[1], int) else None
    sizes = split.input(1) if len(split.inputs) > 1 else None
    if sizes is not None:
        if not sizes.is_const:
            return None
        parts = [int(v) for v in np.asarray(sizes.const).reshape(-1)]
    elif "split" in split.attrs:
        parts = [int(v) for v in split.attrs["split"]]
    elif width is not None and width % 3 == 0:
        parts = [width // 3] * 3  # equal chunks by the spec
    else:
        return None
    if len(parts) != 3 or len(set(parts)) != 1 or (width is not None and sum(parts) != width):
        return None
    return parts[0] if width_h in (0, parts[0]) else None


def _pair(node: Node | None, sx: Node, sh: Node) -> int | None:
    """k when ``node`` is an Add of chunk k of both Splits (either order)."""
    if node is None or node.op_type != "Add" or node.domain:
        return None
    a, b = node.input(0), node.input(1)
    for x, y in ((a, b), (b, a)):
        if x is not None and y is not None and x.producer is sx and y.producer is sh:
            k = sx.outputs.index(x)
            if sh.outputs.index(y) == k:
                return k
    return None


def _match(tanh: Node, outputs: set[int]) -> tuple[list[Node], list[int], Value, Value, Value, Value] | None:
    """(the nodes to replace, order, gx, gh, h, h') of a cell whose candidate Tanh is ``tanh``."""
    if tanh.op_type != "Tanh" or tanh.domain:
        return None
    t = tanh.outputs[0]
    if id(t) in outputs or len(t.uses) != 2:
        return None
    add_n = _op(tanh.input(0), "Add")
    if add_n is None or only_consumer(add_n.outputs[0], outputs) is not tanh:
        return None
    # Add(x_N, Mul(h_N, r))
    for mv, xn in ((add_n.input(0), add_n.input(1)), (add_n.input(1), add_n.input(0))):
        mul_r = _op(mv, "Mul")
        sx = _op(xn, "Split")
        if mul_r is None or sx is None:
            continue
        for rv, hn in ((mul_r.input(0), mul_r.input(1)), (mul_r.input(1), mul_r.input(0))):
            sig_r, sh = _op(rv, "Sigmoid"), _op(hn, "Split")
            if sig_r is None or sh is None or sh is sx or xn is None or hn is None:
                continue
            hs = _chunk(sx, 0)
            if hs is None or _chunk(sh, hs) is None:
                continue
            s_x, s_h = sx.input(0), sh.input(0)
            if s_x is None or s_h is None or s_x.shape is None or s_h.shape is None:
                continue
            kn = sx.outputs.index(xn)
            if sh.outputs.index(hn) != kn:
                continue
            add_r = _op(sig_r.input(0), "Add")
            kr = _pair(add_r, sx, sh)
            if add_r is None or kr is None or kr == kn:
                continue
            # Sub(h, n) -> Mul(·, z) -> Add(·, n)
            uses = [u for u, _ in t.uses]
            sub = next((u for u, j in t.uses if u.op_type == "Sub" and not u.domain and j == 1), None)
            add_o = next((u for u in uses if u.op_type == "Add" and not u.domain and u is not add_n), None)
            if sub is None or add_o is None:
                continue
            mul_z = only_consumer(sub.outputs[0], outputs)
            if mul_z is None or mul_z.op_type != "Mul" or mul_z.domain:
                continue
            zv = mul_z.input(1) if mul_z.input(0) is sub.outputs[0] else mul_z.input(0)
            sig_z = _op(zv, "Sigmoid")
            if sig_z is None or only_consumer(sig_z.outputs[0], outputs) is not mul_z:
                continue
            add_z = _op(sig_z.input(0), "Add")
            kz = _pair(add_z, sx, sh)
            if add_z is None or kz is None or kz in (kr, kn):
                continue
            if only_consumer(mul_z.outputs[0], outputs) is not add_o:
                continue
            # rows may differ by name (an exporter names each input's batch axis): a row of
            # 1 broadcasts in the fused node as in these, another mismatch fails in both
            h = sub.input(0)
            if h is None or h.elem != _F32 or h.shape is None or len(h.shape) != 2 or h.shape[1] != hs:
                continue
            if any(only_consumer(v, outputs) is None for v in [*sx.outputs, *sh.outputs]):
                continue
            if (
                only_consumer(add_r.outputs[0], outputs) is not sig_r
                or only_consumer(sig_r.outputs[0], outputs) is not mul_r
                or only_consumer(mul_r.outputs[0], outputs) is not add_n
                or only_consumer(add_z.outputs[0], outputs) is not sig_z
            ):
                continue
            nodes = [sx, sh, add_r, sig_r, add_z, sig_z, mul_r, add_n, tanh, sub, mul_z, add_o]
            return nodes, [kr, kz, kn], s_x, s_h, h, add_o.outputs[0]
    return None


class FuseGRUGates(Pass):
    name = "fuse_gru_gates"

    def call(self, graph: Graph) -> PassResult:
        outputs = {id(v) for v in graph.outputs}
        fused = 0
        for tanh in [n for n in graph.nodes if n.op_type == "Tanh"]:
            if tanh not in graph.nodes:
                continue
            m = _match(tanh, outputs)
            if m is None:
                continue
            nodes, order, s_x, s_h, h, h_new = m
            old = {id(n) for n in nodes}
            k = max(graph.nodes.index(n) for n in nodes) + 1
            anchor = next((n for n in graph.nodes[k:] if id(n) not in old), None)
            for node in nodes:  # the old nodes go together, h' lives on in the fused node
                for j, v in enumerate(node.inputs):
                    if v is not None:
                        v.uses.remove((node, j))
                for v in node.outputs:
                    v.producer = None
                graph.nodes.remove(node)
            sx = nodes[0]
            fused_node = Node(
                "GRUGates",
                [s_x, s_h, h],
                [h_new],
                {"order": order},
                name=graph.fresh_name(f"{sx.name or 'gru'}_gates"),
                domain="quanta",
            )
            graph.add_node(fused_node, before=anchor)
            fused += 1
        return PassResult(graph, bool(fused), {"cells": fused} if fused else {})
