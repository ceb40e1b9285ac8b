"""Textual form of a graph, one node per line (MLIR-like)::

    graph main(%input: tensor<Nx1x8x8, f32>) {
      %w = const tensor<12x1x3x3, Q(i8:f32, axis=0, [...], [...])>
      %q: tensor<Nx1x8x8, Q(u8:f32, 0.0078, 128)> = QuantizeLinear(%input, %s, %z)
      %y: tensor<Nx12x8x8, f32> = Conv(%xf, %wf, %b) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]}
      return %y
    }

Constants print their type and, when small (at most 8 elements), their values. Used by
``quanta inspect --ir``, pass dumps (``--dump-after``) and snapshot tests.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Graph, Node, Value

__all__ = ["format_graph", "format_node"]


def _fmt_value(v: Value | None) -> str:
    return "%" + v.name if v is not None else "_"


def _fmt_attr(value: object) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            return f"tensor({value.dtype}, {value.tolist()})"
        return f"tensor({value.dtype}, shape={list(value.shape)})"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value)
    if hasattr(value, "node") and hasattr(value, "input"):  # GraphProto
        return f"<graph {getattr(value, 'name', '')}>"
    return str(value)


def format_node(node: Node) -> str:
    outs = ", ".join(f"%{v.name}: {v.type}" if v.type is not None else f"%{v.name}" for v in node.outputs)
    op = node.op_type if not node.domain else f"{node.domain}::{node.op_type}"
    args = ", ".join(_fmt_value(v) for v in node.inputs)
    attrs = ""
    if node.attrs:
        attrs = " {" + ", ".join(f"{k}={_fmt_attr(node.attrs[k])}" for k in sorted(node.attrs)) + "}"
    name = f"  # {node.name}" if node.name else ""
    return f"{outs} = {op}({args}){attrs}{name}"


def format_graph(graph: Graph, *, show_consts: bool = True) -> str:
    ins = ", ".join(f"%{v.name}: {v.type}" for v in graph.inputs)
    lines = [f"graph {graph.name}({ins}) {{"]
    if show_consts:
        for name, v in graph.initializers.items():
            body = ""
            if v.const is not None and v.const.size <= 8:
                body = f" = {np.asarray(v.const).tolist()}"
            lines.append(f"  %{name} = const {v.type}{body}")
    for node in graph.nodes:
        lines.append("  " + format_node(node))
    lines.append("  return " + ", ".join(f"%{v.name}" for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines)
