"""Dead-code elimination.

    %a = Neg(%x)          # %a unused, not a graph output
    %y = Relu(%x)
    return %y
  ->
    %y = Relu(%x)
    return %y

A node is dead when none of its outputs is used by a live node or is a graph output;
removal runs backwards over the topological order, so chains of dead nodes go in one
sweep. Initializers no node reads (and that are not graph outputs or graph inputs with
a default) are dropped too. ONNX operators have no side effects, so nothing else needs
to be kept.
"""

from __future__ import annotations

from quanta.ir.graph import Graph
from quanta.passes.manager import Pass, PassResult, PostconditionError

__all__ = ["EliminateDead"]


class EliminateDead(Pass):
    name = "eliminate_dead"

    def call(self, graph: Graph) -> PassResult:
        outputs = {id(v) for v in graph.outputs}
        removed = 0
        for node in reversed(list(graph.nodes)):
            if any(v.uses or id(v) in outputs for v in node.outputs):
                continue
            graph.remove_node(node)
            removed += 1
        used = {id(v) for n in graph.nodes for v in n.inputs if v is not None} | outputs
        before = len(graph.initializers)
        graph.initializers = {k: v for k, v in graph.initializers.items() if id(v) in used}
        dropped = before - len(graph.initializers)
        stats = {k: v for k, v in (("nodes", removed), ("initializers", dropped)) if v}
        return PassResult(graph, bool(removed or dropped), stats)

    def ensures(self, graph: Graph) -> None:
        outputs = {id(v) for v in graph.outputs}
        for node in graph.nodes:
            if not any(v.uses or id(v) in outputs for v in node.outputs):
                raise PostconditionError(f"{node.label} is still dead after dead-code elimination")
