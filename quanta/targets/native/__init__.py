"""The native target: C++ kernels (quanta.kernels._native) where one exists for a node,
the reference implementation otherwise.

Kernel families register a *binder* per operator in :data:`BINDERS` (one module each:
``quantize.py``, ``gemm.py``, ``conv.py``, ``elementwise.py`` …). A binder looks at
the node (types, constant inputs, attributes) at compile time and returns a
:class:`~quanta.targets.base.Kernel` — with its weights prepacked into ``params`` — or
None and the reason it cannot, which the plan records as a fallback to the reference
twin. Every native kernel is bit-exact with its reference twin (tests/targets/).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.ir.op_facts import derive
from quanta.kernels import native_available
from quanta.targets.base import Kernel
from quanta.targets.reference import ReferenceTarget, reference_kernel

__all__ = ["BINDERS", "Binder", "NativeTarget", "register_binder"]

Binder = Callable[[Model, Node], "tuple[Kernel | None, str]"]

#: (domain, op_type) -> binder. Filled by the family modules of this package.
BINDERS: dict[tuple[str, str], Binder] = {}


def register_binder(op_type: str, domain: str = "") -> Callable[[Binder], Binder]:
    def deco(fn: Binder) -> Binder:
        key = (domain, op_type)
        if key in BINDERS:
            raise RuntimeError(f"native binder for {domain or 'ai.onnx'}::{op_type} registered twice")
        BINDERS[key] = fn
        return fn

    return deco


_loaded = False


def _load_families() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        importlib.import_module(f"{__name__}.{info.name}")


def native_kernel_for(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """The native kernel for ``node``, or None and why there is none."""
    if not native_available():
        return None, "the native extension is not built"
    _load_families()
    binder = BINDERS.get((node.domain, node.op_type))
    if binder is None:
        return None, "no native kernel for this operator yet"
    return binder(model, node)


class NativeTarget(ReferenceTarget):
    """Native kernels where one exists; the reference twin (recorded as a fallback,
    with the reason) otherwise."""

    name = "native"

    def program_factory(self) -> Callable[[], Any] | None:
        """``_native.Program``: records the recordable kernels' calls and runs them as one
        C++ call with the GIL released once (bindings_program.cc)."""
        if not native_available():
            return None
        from quanta.kernels._native import Program

        return Program

    def select_kernel(self, model: Model, node: Node) -> Kernel:
        kernel, reason = native_kernel_for(model, node)
        if kernel is not None:
            return kernel
        kernel = reference_kernel(node, fallback=reason)
        if node.op_type == "Pad" and node.domain == "":
            from quanta.targets.native._pad import pad_specialized

            kernel.specialize = pad_specialized
        if node.op_type in BLAS_OPS and native_available():
            kernel.fn = _resting(
                kernel.fn, 0 if node.op_type in ("Conv", "ConvTranspose") else REST_MIN_ELEMENTS
            )
        return kernel


#: Reference twins whose NumPy work runs on BLAS, which starts its own threads (float
#: Conv / ConvTranspose / MatMul / Gemm reach them only when the native float GEMM family,
#: float_gemm.py, refused the node: computed weights): the
#: kernel pool's workers, spinning for the next native kernel, would take a core from
#: them (an FP32 MobileNet-style CNN on 2 threads took 20 ms against 12.5 ms on 1, and
#: 12.7 ms with BLAS on one thread). The pool rests before every float Conv (im2col and a
#: GEMM: even the CNN's 7x7 layers needed it, 16.9-24.9 ms without, 13.3-13.9 with), and
#: before the other ops when their inputs hold at least REST_MIN_ELEMENTS elements: before
#: a small MatMul the workers' wake-up for the next native kernel costs more than it frees
#: (all-MiniLM-L6-v2 dynamically quantized, its 12 attention MatMuls of 98K input elements
#: each: 9.7-10.0 ms without a rest, 10.1-11.0 ms with one before each, 2 threads).
BLAS_OPS = derive("quanta.targets.native.BLAS_OPS", lambda t: t.ops_where(blas=True))
REST_MIN_ELEMENTS = 1 << 17


def _resting(fn: Callable[..., Any], min_elements: int) -> Callable[..., Any]:
    """``fn`` after a pool rest, when it runs with several threads and its array inputs
    hold at least ``min_elements`` elements."""
    from quanta.kernels import _native

    rest = _native.pool_rest

    def run(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(ctx, "num_threads", 1) > 1 and (
            min_elements == 0 or sum(a.size for a in args if isinstance(a, np.ndarray)) >= min_elements
        ):
            rest()
        return fn(ctx, *args, **kwargs)

    return run
