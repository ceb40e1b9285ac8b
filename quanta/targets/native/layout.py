"""Native Transpose: the permutations that are a batched 2-D transpose
(quanta/kernels/cpp/layout/transpose.h), a byte copy and therefore bit-exact with the
reference twin (``np.transpose``) for every dtype.

A perm reduces to that form when, after merging runs of axes that stay adjacent and in
order, it reads ``[lead..., B, A, trail...]`` for an input ``[lead..., A, B, trail...]``:
the leading axes are the batch, A the rows, B the columns and the trailing axes one
element (their bytes move together). NCHW -> NHWC ``[0, 2, 3, 1]`` (A = C, B = H·W),
NHWC -> NCHW ``[0, 3, 1, 2]``, and the attention-head ``[0, 2, 1, 3]`` (element =
head_dim values) all do. Other perms, and a rank the binder cannot see at compile time,
copy the transposed view with ``copy_strided`` (runs of the innermost contiguous axis
moved by memcpy; tensor_ops.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._cache import BoundedCache
from quanta.targets.native._specialize import guarded, step_threads

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = ["batched_transpose_split", "bind_transpose"]


def batched_transpose_split(perm: list[int]) -> tuple[int, int, int] | None:
    """For a perm of rank r: (a, b, c) with perm == [0..a) + [b..c) + [a..b) + [c..r),
    a <= b <= c, both swapped groups non-empty; None when the perm is not of that form
    (the identity is not: it needs no kernel)."""
    r = len(perm)
    if sorted(perm) != list(range(r)):
        return None
    a = 0
    while a < r and perm[a] == a:
        a += 1
    c = r
    while c > a and perm[c - 1] == c - 1:
        c -= 1
    if a == c:
        return None
    b = perm[a]  # the first moved axis starts the second group [b, c)
    expected = list(range(b, c)) + list(range(a, b))
    if b <= a or perm[a:c] != expected:
        return None
    return a, b, c


def _transpose_native(
    ctx: Any,
    data: np.ndarray,
    *,
    split: tuple[int, int, int],
    plans: BoundedCache,
    perm: list[int] | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``np.transpose(data, perm)`` as one batched 2-D transpose into a contiguous array
    (``split``: :func:`batched_transpose_split` of the perm, found at compile time;
    ``plans``: (batch, rows, cols, output shape) per input shape, filled on first use,
    so a call costs one dictionary lookup on top of the kernel)."""
    shape = data.shape
    p = list(range(data.ndim))[::-1] if perm is None else perm
    if len(shape) != len(p):
        return np.ascontiguousarray(np.transpose(data, p))
    a, b, c = split
    batch, rows, cols, out_shape = plans.get(
        shape,
        lambda: (
            math.prod(shape[:a]),
            math.prod(shape[a:b]),
            math.prod(shape[b:c]),
            tuple(shape[i] for i in p),
        ),
    )
    x = data if data.flags.c_contiguous else np.ascontiguousarray(data)
    if out is None:
        out = np.empty(out_shape, dtype=x.dtype)
    _native.transpose_batched(
        x, batch, rows, cols, ctx.num_threads if hasattr(ctx, "num_threads") else 1, out
    )
    return out


def _transpose_specialized(
    sig: Specialization, *, split: tuple[int, int, int], perm: list[int] | None = None, **params: Any
) -> Callable[..., Any] | None:
    """The batched transpose of one input shape: its (batch, rows, cols) and output once."""
    shape = sig.shapes[0]
    p = list(range(len(shape)))[::-1] if perm is None else perm
    if len(shape) != len(p) or sig.out_shape is None:
        return None
    a, b, c = split
    batch, rows, cols = math.prod(shape[:a]), math.prod(shape[a:b]), math.prod(shape[b:c])
    out_shape, dtype, out = sig.out_shape, sig.dtypes[0], sig.out
    transpose, threads = _native.transpose_batched, step_threads(sig)
    if out is not None:

        def call(x: np.ndarray) -> np.ndarray:
            transpose(x, batch, rows, cols, threads, out)
            return out
    else:

        def call(x: np.ndarray) -> np.ndarray:
            y = np.empty(out_shape, dtype)
            transpose(x, batch, rows, cols, threads, y)
            return y

    generic_attrs = {"split": split, "perm": perm, **params}
    return guarded(call, _transpose_native, generic_attrs, out, recordable=True)


@register_binder("Transpose")
def bind_transpose(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Transpose whose perm is a batched 2-D transpose, with a known input rank."""
    del model  # unused: the choice depends on the node alone
    if _native is None:
        return None, "the native extension is not built"
    x = node.input(0)
    rank = None if x is None or x.shape is None else len(x.shape)
    perm = node.attrs.get("perm")
    from quanta.targets.native.tensor_ops import _transpose_any, _transpose_any_specialized

    any_perm = Kernel(
        _transpose_any, "native", "native:transpose_strided", out=True, specialize=_transpose_any_specialized
    )

    if perm is None:
        if rank is None:  # reversed axes of a rank seen at run time
            return any_perm, ""
        perm = list(range(rank))[::-1]
    perm = [int(p) for p in perm]
    if rank is not None and rank != len(perm):
        return None, f"perm {perm} does not match the input rank {rank}"
    split = batched_transpose_split(perm)
    if split is None:
        # any other perm: the transposed view copied by copy_strided (tensor_ops.py)
        return any_perm, ""
    kernel = Kernel(
        _transpose_native,
        "native",
        "native:transpose_batched",
        params={"split": split, "plans": BoundedCache()},
        out=True,
        specialize=_transpose_specialized,
    )
    return kernel, ""
