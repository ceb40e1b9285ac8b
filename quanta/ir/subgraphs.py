"""Subgraph attributes (If branches, Loop and Scan bodies) and the names of the
enclosing scope they read: which ones (:func:`subgraph_outer_names`, the order a node's
trailing inputs bind them in, :attr:`quanta.ir.graph.Node.outer_names`), and a copy
reading other names (:func:`renamed_graph`, when a rewrite replaced an outer value)."""

from __future__ import annotations

import onnx
from onnx import AttributeProto

from quanta.ir.graph import Node

__all__ = ["rebind_outer_values", "renamed_graph", "subgraph_outer_names", "subgraph_outer_names_of_graph"]


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def _free_names(graph: onnx.GraphProto, seen: dict[str, None]) -> None:
    """Add to ``seen`` (in first-use order) the names ``graph`` reads but does not
    define, nested subgraphs included."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    for n in graph.node:
        for name in n.input:
            if name and name not in defined:
                seen.setdefault(name, None)
        inner: dict[str, None] = {}
        for g in _subgraphs(n):
            _free_names(g, inner)
        for name in inner:
            if name not in defined:
                seen.setdefault(name, None)
        defined.update(o for o in n.output if o)
    for o in graph.output:
        if o.name not in defined:
            seen.setdefault(o.name, None)


def subgraph_outer_names(node: onnx.NodeProto | Node) -> list[str]:
    """The names of the enclosing scope that ``node``'s subgraph attributes (If
    branches, Loop/Scan bodies) read, in first-use order."""
    if isinstance(node, Node):
        graphs = [v for v in node.attrs.values() if isinstance(v, onnx.GraphProto)]
        graphs += [
            g for v in node.attrs.values() if isinstance(v, list) for g in v if isinstance(g, onnx.GraphProto)
        ]
    else:
        graphs = _subgraphs(node)
    seen: dict[str, None] = {}
    for g in graphs:
        _free_names(g, seen)
    return list(seen)


def subgraph_outer_names_of_graph(graph: onnx.GraphProto) -> list[str]:
    """The names of the enclosing scope that ``graph`` (one subgraph) reads, in first-use
    order."""
    seen: dict[str, None] = {}
    _free_names(graph, seen)
    return list(seen)


def renamed_graph(graph: onnx.GraphProto, renames: dict[str, str]) -> onnx.GraphProto:
    """A copy of ``graph`` reading ``renames[name]`` wherever it read an outer-scope
    ``name`` (names it defines itself shadow the outer ones)."""
    g = onnx.GraphProto()
    g.CopyFrom(graph)
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        for k, name in enumerate(n.input):
            if name in renames and name not in defined:
                n.input[k] = renames[name]
        inner = {old: new for old, new in renames.items() if old not in defined}
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                a.g.CopyFrom(renamed_graph(a.g, inner))
            elif a.type == AttributeProto.GRAPHS:
                for sub in a.graphs:
                    sub.CopyFrom(renamed_graph(sub, inner))
        defined.update(n.output)
    return g


def rebind_outer_values(node: Node) -> None:
    """After ``node``'s subgraphs were replaced: bind exactly the enclosing-scope names
    they now read (:attr:`Node.outer_names` and the node's trailing inputs, with their
    uses), keeping the values already bound to names still read. A name no longer read
    (a weight the subgraph now holds itself) is unbound; a newly read name must already
    be bound."""
    n_outer = len(node.outer_names)
    n_own = len(node.inputs) - n_outer
    bound = dict(zip(node.outer_names, node.inputs[n_own:]))
    names = [name for name in subgraph_outer_names(node) if name in bound]
    for i in range(n_own, len(node.inputs)):
        v = node.inputs[i]
        if v is not None:
            v.uses.remove((node, i))
    node.inputs = node.inputs[:n_own]
    for name in names:
        v = bound[name]
        node.inputs.append(v)
        if v is not None:
            v.uses.append((node, len(node.inputs) - 1))
    node.outer_names = tuple(names)
