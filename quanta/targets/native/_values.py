"""What every binder and kernel wrapper of the native target asks of a node's values and
of the kernel context: one definition each, so the families agree on them."""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Value
from quanta.kernels.reference.registry import get_op

__all__ = ["const_of", "run_twin", "threads", "value_dtype"]


def threads(ctx: Any) -> int:
    """The intra-op thread count (KernelContext.num_threads; 1 for a plain OpContext)."""
    return max(1, int(getattr(ctx, "num_threads", 1) or 1))


def const_of(v: Value | None) -> np.ndarray | None:
    """The value's initializer, or None (an omitted optional input is None too)."""
    return None if v is None else v.const


def value_dtype(v: Value | None) -> np.dtype | None:
    """The element dtype of a value (a quantized type: its storage), or None when unknown."""
    if v is None:
        return None
    if v.const is not None:
        return v.const.dtype
    if v.type is None:
        return None
    try:
        return np.dtype(v.type.elem.numpy)
    except (AttributeError, TypeError, KeyError):
        return None


def run_twin(op_type: str, domain: str, ctx: Any, inputs: tuple, attrs: dict, out: np.ndarray | None) -> Any:
    """The reference twin of ``op_type`` on ``inputs`` (a kernel wrapper's fallback for
    what its native kernel does not take), written into ``out`` when the runtime handed
    one."""
    y = get_op(op_type, domain)(ctx, *inputs, **attrs)
    if out is None:
        return y
    np.copyto(out, y)
    return out
