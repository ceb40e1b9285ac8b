"""Buffer aliases (Reshape, Flatten, Squeeze, Unsqueeze, Identity, quanta's TransposeView and
RelabelCodes): no C++ kernel needed.

Their NumPy twins return views of the input's buffer (no data moves, O(1) in the tensor
size; quanta TransposeView a strided one, passes/lower/transpose_view.py), which is exactly what a native kernel would do, so the native target binds the
twin itself and does not report these nodes as fallbacks. Ops that move data
(Transpose, Slice with steps, Gather, Concat) are not in this list. (Not the runtime's
"shape-only" ops, quanta.runtime.static_steps, whose output *shape* follows from their
inputs' shapes: that is the table's column shape_only, this one is alias.)
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from quanta.ir.graph import Model, Node
from quanta.ir.op_facts import derive
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.reference import reference_kernel

__all__ = ["ALIAS_OPS"]

#: the ops whose output aliases their input (quanta.ir.op_facts, column alias)
ALIAS_OPS = derive("quanta.targets.native.views.ALIAS_OPS", lambda t: t.ops_where(alias=True))
#: the same rows as (domain, op type): the binders register each under its own domain
ALIAS_KEYS = derive(
    "quanta.targets.native.views.ALIAS_KEYS", lambda t: frozenset(r.key for r in t.where(alias=True))
)


def _reshape_to(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """For one signature every alias op is a reshape to the output shape it had: one
    NumPy call instead of the twin's argument checks (Unsqueeze's axes, Reshape's 0 and
    -1). The fast loop calls ``reshape.direct`` on x alone (quanta.runtime.execute): a
    C-level ``x.reshape(shape)``, no Python frame (gtcrn runs 86 alias steps a frame).
    A reshape of a signature's own shapes cannot fail, so there is no guard to hand to."""
    del attrs  # the output shape already says what they meant
    shape = sig.out_shape
    if shape is None or not sig.shapes or sig.shapes[0] is None:
        return None

    def reshape(ctx: Any, x: Any, *rest: Any) -> Any:
        return x.reshape(shape)

    reshape.direct = operator.methodcaller("reshape", shape)  # type: ignore[attr-defined]
    reshape.reads = 1  # type: ignore[attr-defined]
    return reshape


def _transpose_to(sig: Specialization, *, perm: list, **attrs: Any) -> Callable[..., Any] | None:
    """TransposeView of one signature: ``x.transpose(perm)``, the strided view (no copy);
    like _reshape_to, a C-level call the fast loop makes on x alone."""
    del sig, attrs  # a transpose of any shape of the signature's rank
    axes = tuple(int(p) for p in perm)

    def transpose(ctx: Any, x: Any, *rest: Any) -> Any:
        return x.transpose(axes)

    transpose.direct = operator.methodcaller("transpose", axes)  # type: ignore[attr-defined]
    transpose.reads = 1  # type: ignore[attr-defined]
    return transpose


def _bind_view(model: Model, node: Node) -> tuple[Kernel | None, str]:
    del model  # unused: a view is a view whatever the types
    k = reference_kernel(node)
    specialize = _transpose_to if node.op_type == "TransposeView" else _reshape_to
    return Kernel(k.fn, "native", f"native:view({node.op_type})", specialize=specialize), ""


for _domain, _op in sorted(ALIAS_KEYS):
    register_binder(_op, _domain)(_bind_view)
