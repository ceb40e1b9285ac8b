"""Run one op with ``onnx.reference`` (the ONNX Python reference evaluator).

A reference op that would cost many lines of NumPy for a rarely used feature can register
itself as ``return delegate_to_onnx_reference(ctx, inputs, attrs)`` and be listed in
:data:`DELEGATED_OPS` with the reason. quanta's reference then means "what onnx.reference
computes" for that op, which is also what generates the ONNX backend node tests.

Delegated at run time (registry.get_op, listed in DELEGATED_AT_RUNTIME when used): the
ai.onnx ops without a twin here (RNN, NonMaxSuppression, Det, Unique, DeformConv, ...),
and the forms GridSample's and RoiAlign's twins leave to it (cubic or reflection
GridSample, N-D grids, RoiAlign of other dtypes). Every float NN op of the common
exports (nn.py, nn_conv.py, nn_pool.py, nn_norm.py, nn_resize.py) has its own NumPy
implementation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError

__all__ = ["DELEGATED_OPS", "delegate_to_onnx_reference"]

# (domain, op_type) -> one-line reason the op is delegated rather than written in NumPy.
DELEGATED_OPS: dict[tuple[str, str], str] = {}


def _node_for(ctx: OpContext, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]):
    """ctx.onnx_node when the caller has it, else a NodeProto rebuilt from ctx and attrs."""
    import onnx
    from onnx import numpy_helper

    if ctx.onnx_node is not None:
        return ctx.onnx_node
    if not ctx.op_type:
        raise OpError("delegate_to_onnx_reference: expected ctx.op_type or ctx.onnx_node, got neither")
    converted = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v for k, v in attrs.items()}
    return onnx.helper.make_node(
        ctx.op_type,
        ["" if v is None else f"input_{i}" for i, v in enumerate(inputs)],
        [f"output_{i}" for i in range(max(ctx.n_outputs, 1))],
        name=ctx.node_name or None,
        domain=ctx.domain or None,
        **converted,
    )


def delegate_to_onnx_reference(
    ctx: OpContext, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
) -> tuple[np.ndarray, ...]:
    """Outputs of ``ctx.op_type`` evaluated by ``onnx.reference.ReferenceEvaluator`` at
    opset ``ctx.opset`` of the op's domain. ``inputs`` are in ONNX order, None for an
    omitted optional input; ``attrs`` are used only when ``ctx.onnx_node`` is absent."""
    from onnx.reference import ReferenceEvaluator

    node = _node_for(ctx, inputs, attrs)
    names = list(node.input)
    if len(inputs) > len(names):
        raise OpError(f"{node.op_type}: expected at most {len(names)} inputs (the node's), got {len(inputs)}")
    feeds = {name: value for name, value in zip(names, inputs) if name and value is not None}
    missing = [name for name, value in zip(names, inputs) if name and value is None]
    if missing:
        raise OpError(f"{node.op_type}: inputs {missing} are named by the node but have no value")
    evaluator = ReferenceEvaluator(node, opsets={node.domain or "": ctx.opset})
    outputs = evaluator.run(None, feeds)
    # a sequence output stays a list: its tensors may differ in shape (SplitToSequence)
    return tuple(v if isinstance(v, list) else np.asarray(v) for v in outputs)
