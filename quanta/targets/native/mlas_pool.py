"""Native quanta::MlasAveragePool: ONNX Runtime's float32 AveragePool in MlasPool's order
(reference/mlas_pool.py, eqs. (AP-M1)-(AP-M5)). The binder runs the twin's vector code
(one float32 add per kernel tap over all windows at once): no C++ kernel; the pools it
serves (PaddleOCR's [1, 480, 3, 80] -> [1, 480, 1, 40]) are a few tens of thousands of
elements."""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.ir.types import F32 as IR_F32
from quanta.kernels.reference.mlas_pool import QUANTA_DOMAIN, mlas_average_pool
from quanta.kernels.reference.registry import OpError
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder

F32 = np.dtype(np.float32)


def _mlas_average_pool(
    ctx: Any,
    x: Any,
    *,
    out: np.ndarray | None = None,
    kernel_shape: list[int],
    strides: list[int] | None = None,
    pads: list[int] | None = None,
    count_include_pad: int = 0,
    nchwc: int = 0,
    **attrs: Any,
) -> np.ndarray:
    del ctx, attrs  # unused
    y = mlas_average_pool(np.asarray(x), kernel_shape, strides, pads, int(count_include_pad), bool(nchwc))
    if y is None:
        raise OpError(
            "MlasAveragePool: a pool MlasPool's order is not modelled for (the rewrite refuses these)"
        )
    if out is None:
        return y
    np.copyto(out, y)
    return out


@register_binder("MlasAveragePool", QUANTA_DOMAIN)
def bind_mlas_average_pool(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::MlasAveragePool on float32: the twin's NumPy (module docstring)."""
    del model  # unused
    x = node.input(0)
    if x is not None and x.type is not None and x.type.elem is not None and x.type.elem != IR_F32:
        return None, f"native MlasAveragePool takes float32, got {x.type.elem}"
    return Kernel(_mlas_average_pool, "native", "numpy:mlas_average_pool", out=True), ""
