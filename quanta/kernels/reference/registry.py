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

__all__ = [
    "MS_DOMAIN",  # for the kernels of com.microsoft operators
    "OPS",
    "REFUSALS",
    "OpContext",
    "OpError",
    "get_op",
    "refusal",
    "refuses",
    "register",
]

ONNX_DOMAIN = ""
ML_DOMAIN = "ai.onnx.ml"
# the kernels import nothing from quanta (tests/test_layers.py), so this layer keeps its
# own copy of quanta.ir.op_facts.MS
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


#: What a twin leaves out of its operator: (domain, op_type) -> ``fn(attrs, given)``, the
#: reason a node cannot run or None. ``attrs`` are the node's attributes as plain values
#: (only those it sets), ``given[i]`` whether it gives input ``i``. Targets consult it
#: when a session is built (``ReferenceTarget.unsupported``), so such a node is refused
#: at load time, named, rather than failing on its first run.
Refusal = Callable[[dict[str, Any], list[bool]], "str | None"]
REFUSALS: dict[tuple[str, str], Refusal] = {}


def refuses(op_type: str, domain: str = ONNX_DOMAIN) -> Callable[[Refusal], Refusal]:
    """Decorator: ``@refuses("Op", domain)`` adds the function to :data:`REFUSALS`."""

    def deco(fn: Refusal) -> Refusal:
        REFUSALS[(domain, op_type)] = fn
        return fn

    return deco


def refusal(op_type: str, domain: str, attrs: dict[str, Any], given: list[bool]) -> str | None:
    """Why the twin of this node cannot run it (:data:`REFUSALS`), or None."""
    _load_all()
    fn = REFUSALS.get((ONNX_DOMAIN if domain == "ai.onnx" else domain, op_type))
    return None if fn is None else fn(attrs, given)


#: Ops quanta runs through onnx.reference because it has no NumPy twin of its own
#: (filled lazily by get_op; ``quanta inspect`` and the docs list them).
DELEGATED_AT_RUNTIME: set[tuple[str, str]] = set()

# Ops with subgraph attributes read names of the enclosing graph, which a one-node
# onnx.reference evaluation cannot see; If/Loop/Scan have a kernel that is handed those
# values (control_flow.py).
_NOT_DELEGABLE = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def get_op(op_type: str, domain: str = ONNX_DOMAIN) -> OpFn | None:
    """The implementation for an op, or None. ``ai.onnx`` is the same as ``""``.

    An ai.onnx or ai.onnx.ml op without a NumPy twin here falls back to ``onnx.reference``
    when that has it, or, for an ai.onnx op the standard defines as a function (e.g.
    MeanVarianceNormalization), when its schema has the function body that
    ``onnx.reference`` expands (recorded in :data:`DELEGATED_AT_RUNTIME`)."""
    _load_all()
    if domain == "ai.onnx":
        domain = ONNX_DOMAIN
    fn = OPS.get((domain, op_type))
    if (
        fn is None
        and domain in (ONNX_DOMAIN, ML_DOMAIN)
        and op_type not in _NOT_DELEGABLE
        and _onnx_reference_has(op_type, domain)
    ):
        from quanta.kernels.reference.delegate import delegate_to_onnx_reference

        def fn(ctx: OpContext, *inputs: np.ndarray | None, **attrs: Any):
            return delegate_to_onnx_reference(ctx, inputs, attrs)

        DELEGATED_AT_RUNTIME.add((domain, op_type))
    return fn


def _onnx_reference_has(op_type: str, domain: str = ONNX_DOMAIN) -> bool:
    try:
        if domain == ML_DOMAIN:
            from onnx.reference.ops.aionnxml import load_op as load_ml_op

            load_ml_op(ML_DOMAIN, op_type, None)
            return True
        from onnx.reference.ops import load_op

        load_op("", op_type)
        return True
    except Exception:
        pass
    if domain != ONNX_DOMAIN:
        return False
    try:
        import onnx.defs

        schema = onnx.defs.get_schema(op_type, domain="")
    except Exception:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


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
