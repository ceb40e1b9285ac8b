"""If, Loop, Scan and SequenceMap: the node with its subgraphs, run by ``onnx.reference``.

Sessions run these nodes with their subgraphs compiled into plans
(:mod:`quanta.runtime.control_flow`); this twin is the fallback for a subgraph that
does not compile (an operator with no kernel at all; ``onnx.reference`` has no
SequenceMap and no Scan-8, so those two then fail naming the node) and what the plain
interpreter (``Target.prepare``) uses. The node is evaluated by
``onnx.reference.ReferenceEvaluator`` as a one-node model whose
inputs are the node's own inputs plus the enclosing-scope values its subgraphs read
(``ctx.extra["outer_names"]``: the runtime passes those values after the node's own
inputs, in that order).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["run_control_flow"]


def run_control_flow(ctx: OpContext, *inputs: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """Outputs of the If/Loop/Scan node ``ctx.onnx_node`` for ``inputs`` (its own
    inputs, then one value per name of ``ctx.extra["outer_names"]``)."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    node = ctx.onnx_node
    if node is None:
        raise OpError(f"{ctx.op_type}: needs the node with its subgraphs (ctx.onnx_node)")
    outer = list(ctx.extra.get("outer_names", ()))
    own = list(node.input)
    if len(inputs) != len(own) + len(outer):
        raise OpError(
            f"{node.op_type}: expected {len(own)} input(s) and {len(outer)} outer-scope value(s), got {len(inputs)} values"
        )
    feeds: dict[str, np.ndarray] = {}
    for name, value in zip(own + outer, inputs):
        if name and value is not None:
            feeds[name] = np.asarray(value)
    graph_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for name, v in feeds.items()
    ]
    graph_outputs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
    graph = helper.make_graph([node], "control_flow", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ctx.opset)])
    results = dict(zip([o.name for o in graph_outputs], ReferenceEvaluator(model).run(None, feeds)))
    # an omitted output ("") has no graph output: an empty placeholder keeps the positions
    return tuple(np.asarray(results[o]) if o else np.zeros(0, np.float32) for o in node.output)


def _op(ctx: OpContext, *inputs: np.ndarray | None, **attrs: Any) -> tuple[np.ndarray, ...]:
    del attrs  # unused: the subgraphs and attributes are read from ctx.onnx_node
    return run_control_flow(ctx, *inputs)


for _name in ("If", "Loop", "Scan", "SequenceMap"):
    register(_name)(_op)
