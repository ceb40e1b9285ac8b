"""quanta MlasAveragePool: ONNX Runtime's float32 AveragePool with a kernel, as MlasPool
(pooling.cpp) computes it on x86-64.

MlasPool picks one of three kernels per call (docs/float-ops.md, "ONNX Runtime's
AveragePool", eqs. (AP-M1)-(AP-M4)):

    (AP-M1) the kernel equals the input, strides 1, no padding: the global kernel, (GP1)-(GP3)
    (AP-M2) 2-D, stride along W <= 2, every kernel extent <= 32 and W plus its pads within the
            2048 - 32 floats of the reduction buffer: the vector kernel. Per output, each
            window column's rows are summed first, in increasing h from the first row in the
            image; then the columns, in increasing w, from the window's first column (a column
            in the padding adds +0)
    (AP-M3) otherwise (1-D, 3-D, wider strides or kernels): the generic kernel, m = +0, then
            m = f32(m + x) over the window's positions inside the image, row-major
    (AP-M4) y = f32(m / count): count = kh·kw (count_include_pad) or the number of the
            window's positions inside the image

    (AP-M5) a 2-D pool of C % 8 = 0 channels at ORT's default optimization level: ORT's NCHWc
            transformer makes it NchwcAveragePool (AVX2's block of 8 channels), whose
            order is (AP-M3)'s

Refused (``mlas_average_pool`` returns None; the rewrite never writes such a
node): dilations, ceil_mode, 3-D pools on the vector kernel's condition.

Measured: bit for bit against ORT 1.32's AveragePool (ORT_DISABLE_ALL and the default
level, 1 and 2 threads) on odd shapes, strides 1-3, pads, both count modes
(tests/kernels/test_mlas_pool.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.ort_float import mlas_global_average_rows
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = [
    "divide_by_count",
    "mlas_average_pool",
    "mlas_pool_kernel",
    "output_sizes",
    "padded_input",
    "pool_kind",
]

F32 = np.float32
QUANTA_DOMAIN = "quanta"
REDUCTION_BUFFER = 2048 - 32  # MLAS_POOL_REDUCTION_BUFFER_STACK - MLAS_POOL_REDUCTION_BUFFER_PADDING
GLOBAL, VECTOR, GENERIC = "global", "vector", "generic"


def mlas_pool_kernel(spatial: tuple[int, ...], kernel, strides, pads) -> str:
    """Which MlasPool kernel (AP-M1)-(AP-M3) runs an input of ``spatial`` sizes.

    >>> mlas_pool_kernel((3, 80), (3, 2), (3, 2), (0, 0, 0, 0)), mlas_pool_kernel((8, 17), (2, 5), (3, 3), (0, 0, 0, 0))
    ('vector', 'generic')"""
    d = len(spatial)
    if tuple(kernel) == tuple(spatial) and all(s == 1 for s in strides) and not any(pads):
        return GLOBAL
    if d >= 2 and strides[-1] <= 2 and all(k <= 32 for k in kernel):
        if pads[d - 1] + pads[2 * d - 1] + spatial[-1] <= REDUCTION_BUFFER:
            return VECTOR
    return GENERIC


def mlas_average_pool(
    x: np.ndarray, kernel, strides=None, pads=None, count_include_pad: int = 0, nchwc: bool = False
) -> np.ndarray | None:
    """ORT's AveragePool of ``x [N, C, spatial...]`` (1-3 spatial axes, no dilation, floor
    output sizes) in MlasPool's order (AP-M1)-(AP-M4); None where it is not modelled.
    ``nchwc``: ORT's NCHWc transformer runs this 2-D pool blocked (AP-M5), the generic
    kernel's order."""
    args = pool_args(x, kernel, strides, pads)
    if args is None:
        return None
    x, kernel, strides, pads = args
    d, spatial = x.ndim - 2, x.shape[2:]
    kind = pool_kind(spatial, kernel, strides, pads, nchwc)
    if kind == GLOBAL:
        rows = x.reshape(x.shape[0] * x.shape[1], -1)
        return mlas_global_average_rows(rows).reshape(x.shape[:2] + (1,) * d)
    if kind == VECTOR and d != 2:
        return None  # MlasPool3DVectorKernel: not modelled
    out = output_sizes(spatial, kernel, strides, pads)
    if any(o < 1 for o in out):
        return None
    xp = padded_input(x, kind, out, kernel, strides, pads)

    def tap(offs: tuple[int, ...]) -> np.ndarray:
        window = (slice(o, o + (out[i] - 1) * strides[i] + 1, strides[i]) for i, o in enumerate(offs))
        return xp[(slice(None), slice(None), *window)]

    if kind == VECTOR:
        m = None
        for b in range(kernel[1]):
            col = tap((0, b))
            for a in range(1, kernel[0]):
                col = np.add(col, tap((a, b)), dtype=F32)
            m = col if m is None else np.add(m, col, dtype=F32)
    else:
        m = np.zeros(x.shape[:2] + tuple(out), F32)
        for offs in np.ndindex(*kernel):
            m = np.add(m, tap(offs), dtype=F32)
    assert m is not None
    return divide_by_count(m, spatial, kernel, strides, pads, count_include_pad)


def pool_args(
    x: np.ndarray, kernel, strides, pads
) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
    """(x as float32, kernel, strides, pads) as int tuples, the defaults of an AveragePool
    filled in; None for a pool of other than 1-3 spatial axes or a kernel of another rank."""
    x = np.asarray(x, F32)
    d = x.ndim - 2
    kernel = tuple(int(k) for k in kernel)
    strides = tuple(int(s) for s in (strides or [1] * d))
    pads = tuple(int(p) for p in (pads or [0] * 2 * d))
    if d < 1 or d > 3 or len(kernel) != d:
        return None
    return x, kernel, strides, pads


def pool_kind(spatial: tuple[int, ...], kernel, strides, pads, nchwc: bool) -> str:
    """The order (AP-M1)-(AP-M3) MLAS sums in; NCHWc's 2-D pool (AP-M5) is the generic one."""
    return GENERIC if nchwc and len(spatial) == 2 else mlas_pool_kernel(spatial, kernel, strides, pads)


def output_sizes(spatial: tuple[int, ...], kernel, strides, pads) -> list[int]:
    """Floor output sizes of a pool without dilation."""
    d = len(spatial)
    return [(spatial[i] + pads[i] + pads[i + d] - kernel[i]) // strides[i] + 1 for i in range(d)]


def padded_input(x: np.ndarray, kind: str, out: list[int], kernel, strides, pads) -> np.ndarray:
    """``x`` padded so every window lies inside: with −0, which adds nothing (−0 + v = v for
    every v, −0 too), as MLAS skips a padded position; the vector kernel's padding columns
    hold +0 (its reduction buffer's InitialValue), which a column sum then starts from."""
    d = x.ndim - 2
    spatial = x.shape[2:]
    pw = [(0, 0), (0, 0)]
    for i in range(d):
        need = (out[i] - 1) * strides[i] + kernel[i]
        pw.append((pads[i], max(0, need - spatial[i] - pads[i])))
    xp = np.pad(x, pw, constant_values=F32(-0.0))
    if kind == VECTOR:
        xp[..., : pw[3][0]] = F32(0)
        xp[..., xp.shape[-1] - pw[3][1] :] = F32(0)
    return xp


def divide_by_count(
    m: np.ndarray, spatial: tuple[int, ...], kernel, strides, pads, count_include_pad: int
) -> np.ndarray:
    """(AP-M4): the window sums ``m`` divided by the kernel's size or by each window's
    in-image positions."""
    d = len(spatial)
    out = m.shape[2:]
    if count_include_pad:
        count: Any = F32(np.prod(kernel))
    else:
        count = np.ones(tuple(out), F32)
        for i in range(d):
            start = np.arange(out[i]) * strides[i] - pads[i]
            inside = np.minimum(start + kernel[i], spatial[i]) - np.maximum(start, 0)
            shape = [1] * d
            shape[i] = out[i]
            count = count * inside.reshape(shape).astype(F32)  # small integers: exact
    with np.errstate(invalid="ignore", over="ignore"):
        return np.divide(m, count, dtype=F32)


@register("MlasAveragePool", QUANTA_DOMAIN)
def mlas_average_pool_op(
    ctx: OpContext,
    x: np.ndarray,
    *,
    kernel_shape: list[int],
    strides: list[int] | None = None,
    pads: list[int] | None = None,
    count_include_pad: int = 0,
    nchwc: int = 0,
    **attrs: Any,
) -> np.ndarray:
    """quanta MlasAveragePool-1: ONNX Runtime's float AveragePool (module docstring);
    AveragePool's attributes with explicit pads, no dilations, floor output sizes; ``nchwc``
    (AP-M5)."""
    del ctx, attrs  # unused
    y = mlas_average_pool(x, kernel_shape, strides, pads, int(count_include_pad), bool(nchwc))
    if y is None:
        raise OpError(
            "MlasAveragePool: a pool MlasPool's order is not modelled for (the rewrite refuses these)"
        )
    return y
