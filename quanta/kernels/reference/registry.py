"""The reference operator table: (domain, op_type) -> NumPy implementation.

Every implementation has the signature ``fn(ctx, *inputs, **attributes)``:

- ``ctx`` is an :class:`OpContext` (opset version of the op's domain, number of
  outputs the node asks for, node name for error messages);
- ``inputs`` are numpy arrays in ONNX input order, ``None`` for an omitted optional
  input (empty name in ONNX);
- ``attributes`` are plain Python values: int, float, str (decoded), list of those,
  numpy arrays for tensor attributes; attributes the node does not set are absent, so
  the function's keyword defaults are the ONNX defaults.

It returns one array or a tuple of arrays (one per output). It must not modify its
inputs. This layer imports nothing from quanta but other reference kernels: it is the
normative NumPy definition that native kernels are tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["OPS", "OpContext", "OpError", "get_op", "register"]

ONNX_DOMAIN = ""
MS_DOMAIN = "com.microsoft"


class OpError(ValueError):
    """Raised by a reference op when its inputs break the operator's contract."""


@dataclass
class OpContext:
    opset: int = 21
    n_outputs: int = 1
    node_name: str = ""
    op_type: str = ""
    domain: str = ""
    # The original onnx.NodeProto, when the caller has one: used only by ops that
    # delegate to onnx.reference (see delegate.py).
    onnx_node: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


OpFn = Callable[..., "np.ndarray | tuple[np.ndarray, ...]"]

OPS: dict[tuple[str, str], OpFn] = {}


def register(op_type: str, domain: str = ONNX_DOMAIN) -> Callable[[OpFn], OpFn]:
    """Decorator: ``@register("Conv")`` adds the function to :data:`OPS`."""

    def deco(fn: OpFn) -> OpFn:
        key = (domain, op_type)
        if key in OPS:
            raise RuntimeError(f"reference op {domain or 'ai.onnx'}::{op_type} registered twice")
        OPS[key] = fn
        return fn

    return deco


def get_op(op_type: str, domain: str = ONNX_DOMAIN) -> OpFn | None:
    """The implementation for an op, or None. ``ai.onnx`` is the same as ``""``."""
    _load_all()
    if domain == "ai.onnx":
        domain = ONNX_DOMAIN
    return OPS.get((domain, op_type))


_loaded = False


def _load_all() -> None:
    # Importing a module registers its ops. The list is explicit so that the order of
    # registration (and thus any duplicate error) is deterministic.
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import pkgutil

    from quanta.kernels import reference as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name not in ("registry",):
            importlib.import_module(f"{pkg.__name__}.{info.name}")
