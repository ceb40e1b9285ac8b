"""One matrix product for the input projections of an unrolled recurrence.

An RNN that an exporter unrolled (torch.onnx of an ``LSTMCell`` loop) reads its input
sequence ``X [T, B, K]`` step by step, and each step multiplies its row of it by the
same weight::

    %x_t = Gather(%X, t) {axis=0}                  for t in a set of constant indices
    %p_t = Gemm(%x_t, %W, %C) {transB, alpha=1, beta=1}
  ->
    %P   = MatMul(%X, W')                          W' = W (transB=0) or Wᵀ (transB=1), [K, N]
    %Pb  = Add(%P, C')                             C' = C as a row [N] (omitted without C)
    %p_t = Gather(%Pb, t) {axis=0}

(HG1) p_t[b, n] = Σ_k X[t, b, k] · W'[k, n] + C'[n]: the Gemm's value, as one product
over the T·B rows instead of T products of B rows. The weight streams through the cache
once instead of once per step: captcha_crnn's 400 x 4096 input weight (6.5 MB, larger
than the L2 cache) was read 20 times per direction, 350 us per step at M = 1. The float
GEMM family's error bound covers the rewrite (docs/float-ops.md); the reference and the
native target both run the rewritten graph.

The rewrite needs at least two such Gemms on one ``X`` with one constant float32 ``W`` and
one constant ``C`` of N or 1 elements, ``X`` of rank 3 (its last axis K), scalar constant
indices, ``alpha = beta = 1`` and ``transA = 0``; and the gathered steps must cover at
least half of a static T (the product computes every row).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Graph, Node, Value, result_type
from quanta.ir.types import elem_from_numpy
from quanta.passes.manager import Pass, PassResult

__all__ = ["HoistGatheredGemm"]

_F32 = elem_from_numpy(np.float32)


def _step(node: Node) -> tuple[Any, ...] | None:
    """The grouping key of a Gemm that (HG1) can take: (X, W, C, transB); else None."""
    if node.op_type != "Gemm" or node.domain:
        return None
    a = node.attrs
    if int(a.get("transA", 0)) or float(a.get("alpha", 1.0)) != 1.0 or float(a.get("beta", 1.0)) != 1.0:
        return None
    x_t, w, c = node.input(0), node.input(1), node.input(2)
    if x_t is None or w is None or not w.is_const or len(node.outputs) != 1:
        return None
    wc = np.asarray(w.const)
    if wc.dtype != np.float32 or wc.ndim != 2:
        return None
    trans_b = int(a.get("transB", 0))
    n = wc.shape[0] if trans_b else wc.shape[1]
    if c is not None and (not c.is_const or np.asarray(c.const).dtype != np.float32):
        return None
    if c is not None and np.asarray(c.const).size not in (1, n):
        return None
    if (
        c is not None
        and np.asarray(c.const).ndim > 1
        and np.asarray(c.const).shape[-1] != np.asarray(c.const).size
    ):
        return None  # a column bias [N, 1] or a full addend: not a row
    g = x_t.producer
    if g is None or g.op_type != "Gather" or g.domain or int(g.attrs.get("axis", 0)) != 0:
        return None
    x, idx = g.input(0), g.input(1)
    if x is None or idx is None or not idx.is_const or np.asarray(idx.const).ndim != 0:
        return None
    shape = x.shape
    k = wc.shape[1] if trans_b else wc.shape[0]
    if x.elem != _F32 or shape is None or len(shape) != 3 or shape[2] != k:
        return None
    return (id(x), id(w), None if c is None else id(c), trans_b)


class HoistGatheredGemm(Pass):
    name = "hoist_gathered_gemm"

    def call(self, graph: Graph) -> PassResult:
        groups: dict[tuple[Any, ...], list[Node]] = {}
        outputs = {id(v) for v in graph.outputs}
        for node in graph.nodes:
            key = _step(node)
            if key is not None and id(node.outputs[0]) in outputs:
                key = None  # a graph output keeps its producer (and its name)
            if key is not None:
                groups.setdefault(key, []).append(node)
        hoisted = steps = 0
        for nodes in groups.values():
            if len(nodes) < 2:
                continue
            x = nodes[0].input(0).producer.input(0)
            t = x.shape[0]
            if isinstance(t, int) and 2 * len(nodes) < t:
                continue  # most rows of the product would go unused
            self._hoist(graph, nodes)
            hoisted += 1
            steps += len(nodes)
        stats = {"groups": hoisted, "steps": steps} if hoisted else {}
        return PassResult(graph, bool(hoisted), stats)

    @staticmethod
    def _hoist(graph: Graph, nodes: list[Node]) -> None:
        first = nodes[0]
        x = first.input(0).producer.input(0)
        w, c = first.input(1), first.input(2)
        wc = np.asarray(w.const)
        wt = np.ascontiguousarray(wc.T if int(first.attrs.get("transB", 0)) else wc)
        n = int(wt.shape[1])
        w_val = graph.add_initializer(graph.fresh_name(f"{w.name}_hoisted"), wt)
        shape = (*x.shape[:2], n)
        out = first.outputs[0]
        p = Value(graph.fresh_name(f"{out.name}_all_steps"), result_type(shape_from=shape, elem_from=out))
        graph.add_node(
            Node("MatMul", [x, w_val], [p], name=graph.fresh_name(f"{first.name or 'gemm'}_all_steps")),
            before=first,
        )
        if c is not None:
            row = np.ascontiguousarray(np.broadcast_to(np.asarray(c.const, np.float32).reshape(-1), (n,)))
            c_val = graph.add_initializer(graph.fresh_name(f"{c.name}_row"), row)
            pb = Value(graph.fresh_name(f"{p.name}_bias"), result_type(shape_from=shape, elem_from=out))
            graph.add_node(
                Node("Add", [p, c_val], [pb], name=graph.fresh_name(f"{first.name or 'gemm'}_bias")),
                before=first,
            )
            p = pb
        for node in nodes:
            idx = node.input(0).producer.input(1)
            old = node.outputs[0]
            new = Value(graph.fresh_name(old.name), old.type)
            graph.add_node(Node("Gather", [p, idx], [new], {"axis": 0}, name=node.name), before=node)
            graph.replace_all_uses(old, new)
            graph.remove_node(node)
