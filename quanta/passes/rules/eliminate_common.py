"""Common-subexpression elimination.

    %a = Transpose(%x) {perm=[1, 0]}
    %b = Transpose(%x) {perm=[1, 0]}
    %y = Add(%a, %b)
  ->
    %a = Transpose(%x) {perm=[1, 0]}
    %y = Add(%a, %a)

Two steps, in one pass:

1. equal constants are merged: same dtype, shape, bytes *and type* (the element type
   includes the quantization parameters, so an int8 tensor typed ``Q(i8:f32, 0.02, 0)``
   never merges with the same bytes typed ``Q(i8:f32, 0.08, 0)``) and the same ``doc``
   (a folded BatchNormalization offset, ``_util.FOLDED_OFFSET``, is lowered differently
   from a file's bias of the same values);
2. nodes are merged, in topological order, when they have the same domain, op,
   attributes and (after step 1) the same input values, and their outputs have the same
   element types. Quantization parameters are inputs (scale / zero-point constants) or
   parts of types, so nodes with different quantization parameters never merge.

Not merged: non-deterministic ops, nodes with subgraph attributes, and a node whose
output is a graph output (the graph would lose that output's name; the first node keeps
its own). Graph inputs with a default initializer are never merged (a feed may
override them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Graph, Node, Value, const_fingerprint
from quanta.passes.manager import Pass, PassResult
from quanta.passes.rules._util import NONDETERMINISTIC_OPS

__all__ = ["EliminateCommon"]


def _attr_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, float) and value != value:  # NaN: equal to itself here
        return ("nan",)
    return value


def _has_subgraph(node: Node) -> bool:
    def is_graph(v: Any) -> bool:
        return hasattr(v, "node") and hasattr(v, "input")

    # an attribute list holds one kind of element (ONNX's GRAPHS or INTS ...): its first
    # says which, so a forest's million-entry lists are not walked
    return any(
        is_graph(v) or (isinstance(v, list) and bool(v) and is_graph(v[0])) for v in node.attrs.values()
    )


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` and ``b`` (same dtype and shape) hold the same bits (NaNs included)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.dtype.hasobject:
        return bool(np.array_equal(a, b))
    return a.tobytes() == b.tobytes()


class EliminateCommon(Pass):
    name = "eliminate_common"

    def call(self, graph: Graph) -> PassResult:
        consts = self._merge_constants(graph)
        nodes = self._merge_nodes(graph)
        stats = {k: v for k, v in (("constants", consts), ("nodes", nodes)) if v}
        return PassResult(graph, bool(consts or nodes), stats)

    @staticmethod
    def _merge_constants(graph: Graph) -> int:
        outputs = {id(v) for v in graph.outputs}
        inputs = {id(v) for v in graph.inputs}
        # constants are grouped by what is cheap to compare first, then by a sample of their
        # elements; only equal samples are compared whole (hashing every weight of an 84 MB
        # model took ~0.3 s a call)
        groups: dict[tuple, list[tuple[str, Value]]] = {}
        for name, v in graph.initializers.items():
            if id(v) in outputs or id(v) in inputs:
                continue
            c = v.const
            groups.setdefault((c.dtype.str, c.shape, v.type, v.doc), []).append((name, v))
        merged = 0
        for group in groups.values():
            if len(group) < 2:
                continue
            seen: dict[bytes, list[Value]] = {}
            for name, v in group:
                arr = np.ascontiguousarray(v.const)
                candidates = seen.setdefault(const_fingerprint(arr), [])
                first = next((c for c in candidates if _same_bytes(c.const, arr)), None)
                if first is None:
                    candidates.append(v)
                    continue
                graph.replace_all_uses(v, first)
                del graph.initializers[name]
                merged += 1
        return merged

    @staticmethod
    def _merge_nodes(graph: Graph) -> int:
        outputs = {id(v) for v in graph.outputs}
        # nodes are bucketed by what is cheap (op, inputs, output types); attributes are
        # keyed only for a node whose bucket holds an earlier one, so a node with lists of
        # millions of entries (a tree ensemble's) and no twin costs nothing
        buckets: dict[tuple, list[tuple[Node, Any]]] = {}
        merged = 0
        for node in list(graph.nodes):
            if node.op_type in NONDETERMINISTIC_OPS or _has_subgraph(node):
                continue
            key = (
                node.domain,
                node.op_type,
                tuple(None if v is None else id(v) for v in node.inputs),
                tuple(None if v.type is None else v.type.elem for v in node.outputs),
            )
            bucket = buckets.setdefault(key, [])
            if not bucket:
                bucket.append((node, None))
                continue
            attrs = _attrs_key(node)
            for i, (earlier, earlier_attrs) in enumerate(bucket):
                if earlier_attrs is None:
                    earlier_attrs = _attrs_key(earlier)
                    bucket[i] = (earlier, earlier_attrs)
                if earlier_attrs == attrs:
                    first = earlier
                    break
            else:
                bucket.append((node, attrs))
                continue
            if any(id(v) in outputs for v in node.outputs):
                continue
            for old, new in zip(node.outputs, first.outputs):
                graph.replace_all_uses(old, new)
            graph.remove_node(node)
            merged += 1
        return merged


def _attrs_key(node: Node) -> tuple:
    return tuple(sorted((k, _attr_key(a)) for k, a in node.attrs.items()))
