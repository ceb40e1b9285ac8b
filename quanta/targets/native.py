"""The native target: C++ kernels (quanta.kernels._native) where one exists for a node,
the reference implementation otherwise.

Every node that runs on its reference twin is listed in ``Executable.fallbacks`` with
the reason, so a user can see what did not get a native kernel. Results are bit-exact
with the reference target (tests/targets/test_native.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels import native_available
from quanta.kernels.reference.registry import OpContext, OpError
from quanta.targets.reference import ReferenceExecutable, ReferenceTarget, bind_reference_steps, constants_of

__all__ = ["NativeTarget"]


def _quantize_linear_native(ctx: OpContext, x, y_scale, y_zero_point=None, *, axis: int = 1, **attrs: Any):
    """QuantizeLinear float32 -> u8/s8, per-tensor or per-axis, through the native kernel."""
    from quanta.kernels import _native

    del ctx  # unused: the binder only selects this kernel for supported opsets/attrs
    del attrs  # saturate/output_dtype only matter for float8 storage, excluded by the binder
    zp = np.zeros((), np.uint8) if y_zero_point is None else y_zero_point
    scale = np.ascontiguousarray(np.asarray(y_scale, np.float32).reshape(-1))
    zero_point = np.ascontiguousarray(np.asarray(zp).astype(np.int32).reshape(-1))
    x = np.ascontiguousarray(x)
    fn = _native.quantize_linear_u8 if zp.dtype == np.uint8 else _native.quantize_linear_s8
    try:
        return fn(x, scale, zero_point, int(axis))
    except ValueError as e:
        raise OpError(str(e)) from None


def _native_kernel_for(node: Node) -> tuple[Callable[..., Any] | None, str]:
    """The native implementation for ``node`` and why not when there is none."""
    if not native_available():
        return None, "the native extension is not built"
    if node.domain == "" and node.op_type == "QuantizeLinear":
        x, scale = node.input(0), node.input(1)
        zp = node.input(2)
        if node.attrs.get("block_size"):
            return None, "blocked QuantizeLinear has no native kernel yet"
        if x is None or x.type is None or str(x.type.elem) != "f32":
            return None, "native QuantizeLinear takes float32 input"
        if scale is None or scale.type is None or str(scale.type.elem) != "f32":
            return None, "native QuantizeLinear takes a float32 scale"
        out_dtype = node.attrs.get("output_dtype")
        if zp is None and out_dtype not in (None, 2, 3):
            return None, "native QuantizeLinear covers uint8/int8 storage only"
        if zp is not None and (zp.type is None or str(zp.type.elem) not in ("u8", "i8")):
            return None, "native QuantizeLinear covers uint8/int8 storage only"
        return _quantize_linear_native, ""
    return None, "no native kernel for this operator yet"


class NativeTarget(ReferenceTarget):
    name = "native"

    def prepare(self, model: Model) -> ReferenceExecutable:
        steps = bind_reference_steps(self, model)
        exe = ReferenceExecutable(model, steps, constants_of(model))
        for step in steps:
            fn, reason = _native_kernel_for(step.node)
            if fn is not None:
                step.fn = fn
                step.impl = "native"
            else:
                exe.fallbacks.append((step.node.name, step.node.op_type, reason))
        return exe
