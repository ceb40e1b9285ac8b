"""Optional, OptionalHasElement, OptionalGetElement.

An optional that holds a value is that value (a tensor, or a sequence as a list) and an
empty optional is None, as ONNX Runtime hands them across its API. ``onnx.reference``
wraps an optional's value in one more list instead, which a graph output or an If / Loop
body that returns an optional sequence would then carry as a nested sequence.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__: list[str] = []


@register("Optional")
def optional(ctx: OpContext, x: Any = None, **attrs: Any) -> tuple[Any]:
    del ctx, attrs  # the `type` attribute only types the empty optional
    return (x,)


@register("OptionalHasElement")
def optional_has_element(ctx: OpContext, x: Any = None, **attrs: Any) -> tuple[Any]:
    del ctx, attrs  # unused
    return (np.array(x is not None),)


@register("OptionalGetElement")
def optional_get_element(ctx: OpContext, x: Any = None, **attrs: Any) -> tuple[Any]:
    del attrs  # unused
    if x is None:
        raise OpError(
            f"OptionalGetElement{f' {ctx.node_name!r}' if ctx.node_name else ''}: the optional is empty"
        )
    return (x,)
