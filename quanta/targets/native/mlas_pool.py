"""Native quanta::MlasAveragePool: ONNX Runtime's float32 AveragePool in MlasPool's order
(reference/mlas_pool.py, eqs. (AP-M1)-(AP-M5)).

Which kernel runs each of MlasPool's orders:

    (AP-M1) global      ``mlas_global_average_rows_f32`` (tensor_ops/ort_reduce.h), the
                        MlasGlobalAveragePool kernel
    (AP-M3) generic     ``mlas_average_pool_f32`` (ort_spatial/ort_spatial.h): each window
                        summed in its row-major order, 8 planes' sums in independent
                        chains; (AP-M5) NCHWc pools take this order too
    (AP-M2) vector      ``mlas_average_pool_f32(vector=True)``: per window its column sums,
                        then their sum, 8 planes at a time

Every pool the twin models runs in C++, bit for bit the twin
(tests/kernels/test_ort_spatial.py): the many-tap, few-window pools (a squeeze-excite mean
written as AveragePool with kernel = strides = the input, MediaPipe's selfie segmenter:
[1, 16, 128, 128] -> [1, 16, 1, 1], 16,384 taps) as well as the few-tap, many-window ones
(PaddleOCR's [1, 480, 3, 80] -> [1, 480, 1, 40])."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.ir.types import F32 as IR_F32
from quanta.kernels.reference.mlas_pool import (
    GENERIC,
    GLOBAL,
    QUANTA_DOMAIN,
    VECTOR,
    mlas_average_pool,
    output_sizes,
    pool_args,
    pool_kind,
)
from quanta.kernels.reference.registry import OpError
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import guarded, step_threads

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = ["average_pool", "bind_mlas_average_pool"]

F32 = np.dtype(np.float32)


def average_pool(
    x: np.ndarray,
    kernel,
    strides=None,
    pads=None,
    count_include_pad: int = 0,
    nchwc: bool = False,
    *,
    num_threads: int = 1,
    out: np.ndarray | None = None,
) -> np.ndarray | None:
    """The twin's :func:`mlas_average_pool`, bit for bit, on the C++ kernels (module
    docstring); None where the twin gives None."""
    args = pool_args(x, kernel, strides, pads)
    if args is None:
        return None
    x, kernel, strides, pads = args
    d, spatial = x.ndim - 2, x.shape[2:]
    kind = pool_kind(spatial, kernel, strides, pads, nchwc)
    if kind == GLOBAL and x.size > 0:
        rows = np.ascontiguousarray(x).reshape(x.shape[0] * x.shape[1], -1)
        target = None if out is None else out.reshape(-1)
        y = _native.mlas_global_average_rows_f32(rows, num_threads, target)
        return out if out is not None else y.reshape(x.shape[:2] + (1,) * d)
    out_sizes = output_sizes(spatial, kernel, strides, pads)
    modelled = kind == GENERIC or (kind == VECTOR and d == 2)
    # the kernel's windows each start inside the input or its begin padding
    starts = all(1 <= o and (o - 1) * st - p < n for o, st, p, n in zip(out_sizes, strides, pads, spatial))
    if modelled and x.size > 0 and starts:
        xc = np.ascontiguousarray(x)
        cip, vector = bool(count_include_pad), kind == VECTOR
        k, s, p = list(kernel), list(strides), list(pads[:d])
        return _native.mlas_average_pool_f32(xc, k, s, p, out_sizes, cip, vector, num_threads, out)
    # an empty input, a window wholly in the end padding, or a pool the twin refuses (None)
    y = mlas_average_pool(x, kernel, strides, pads, count_include_pad, nchwc)
    if y is None or out is None:
        return y
    np.copyto(out, y)
    return out


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
    del attrs  # unused
    threads = max(1, int(getattr(ctx, "num_threads", 1)))
    y = average_pool(
        np.asarray(x),
        kernel_shape,
        strides,
        pads,
        int(count_include_pad),
        bool(nchwc),
        num_threads=threads,
        out=out,
    )
    if y is None:
        raise OpError(
            "MlasAveragePool: a pool MlasPool's order is not modelled for (the rewrite refuses these)"
        )
    return y


def _mlas_average_pool_specialized(sig: Specialization, **attrs: Any) -> Any:
    """One float32 x shape whose order runs on ``mlas_average_pool_f32``: the geometry
    read here, once, and each run one kernel call into the planned output, which a native
    program records. None (the generic call) for the global order and what the twin
    refuses."""
    shape = sig.shapes[0]
    if shape is None or len(shape) < 3 or sig.dtypes[0] != F32 or 0 in shape or sig.out is None:
        return None
    d = len(shape) - 2
    # the twin's defaults for strides and pads; an empty array of x's rank stands for x
    args = pool_args(
        np.empty((0,) * len(shape), F32), attrs["kernel_shape"], attrs.get("strides"), attrs.get("pads")
    )
    if args is None:
        return None
    _, kernel, strides, pads = args
    spatial = tuple(shape[2:])
    kind = pool_kind(spatial, kernel, strides, pads, bool(attrs.get("nchwc", 0)))
    out_sizes = output_sizes(spatial, kernel, strides, pads)
    starts = all(1 <= o and (o - 1) * st - p < n for o, st, p, n in zip(out_sizes, strides, pads, spatial))
    if not (kind == GENERIC or (kind == VECTOR and d == 2)) or not starts:
        return None
    cip, vector = bool(attrs.get("count_include_pad", 0)), kind == VECTOR
    k, s, p = list(kernel), list(strides), list(pads[:d])
    threads, out = step_threads(sig, math.prod(shape)), sig.out
    pool = _native.mlas_average_pool_f32

    def run(x: np.ndarray, *rest: Any) -> np.ndarray:
        return pool(x, k, s, p, out_sizes, cip, vector, threads, out)

    return guarded(run, _mlas_average_pool, attrs, out, reads=1, recordable=True)


@register_binder("MlasAveragePool", QUANTA_DOMAIN)
def bind_mlas_average_pool(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::MlasAveragePool on float32: :func:`average_pool` (module docstring)."""
    del model  # unused
    if _native is None or not hasattr(_native, "mlas_average_pool_f32"):
        return None, "the native extension is not built with mlas_average_pool_f32"
    x = node.input(0)
    if x is not None and x.type is not None and x.type.elem is not None and x.type.elem != IR_F32:
        return None, f"native MlasAveragePool takes float32, got {x.type.elem}"
    kernel = Kernel(_mlas_average_pool, "native", "native:mlas_average_pool_f32", out=True)
    kernel.specialize = _mlas_average_pool_specialized
    return kernel, ""
