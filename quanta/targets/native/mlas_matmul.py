"""Native quanta::MlasMatMul: ONNX Runtime's float32 MatMul / FusedMatMul in MLAS's order.

=============  ==========================================  =============================
operator       native call                                  twin (bit for bit)
=============  ==========================================  =============================
quanta         ``mlas_conv_f32`` (MlasConv's kernels): a    reference/mlas_matmul.py
MlasMatMul     batch of G GEMMs A [M, K] · B [K, N] is the   ``mlas_matmul``, eqs.
               pointwise convolution of B [1, G·K, 1, N]    (MM1)-(MM5)
               by A [G·M, K, 1, 1] in G groups
=============  ==========================================  =============================

Per input signature the plan (reference ``mlas_matmul_plan``: ORT's thread count, the
M = 1 / N = 1 kernels, K blocks) is computed once. (MM4)'s alpha: where every part is one
K block, y = f32(acc · alpha) is the convolution's acc times alpha, one float32 product
after the call; a K longer than one block with alpha ≠ 1 runs the twin (ORT's fused
scales are attention's 1/√d over K = d ≤ 128: one block). A one-row GEMM that ORT reads
with B transposed (kind DOT_COLUMNS) runs as the transposed product, B's columns the
rows of MLAS's N = 1 kernel.

Per input signature (``Kernel.specialize``) a GEMM whose operands need no broadcast copy
(equal batch dimensions, or a 2-D B) and no transposition is one ``mlas_conv_f32`` call
on views of A, B and the planned output, which a native program records; alpha ≠ 1 is
its one float32 product per element inside the same call (``alpha``; an extension built
before that argument takes the product in NumPy, unrecorded). The other signatures take
the generic call above (broadcast, transposed copies).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.mlas_conv import DOT
from quanta.kernels.reference.mlas_matmul import (
    DOT_COLUMNS,
    QUANTA_DOMAIN,
    batch_shape,
    mlas_matmul,
    mlas_matmul_plan,
)
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import SMALL_MACS, guarded, step_threads
from quanta.targets.native._values import threads as _threads

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

F32 = np.dtype(np.float32)


class _Plan:
    """One (A shape, B shape): the batch, the GEMM's sizes and the parts for the native call
    (None: the twin runs it)."""

    def __init__(self, a_shape: tuple[int, ...], b_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
        self.nb, self.m, self.n, self.k, self.folded = batch_shape(a_shape, b_shape)
        self.alpha = np.float32(attrs.get("alpha", 1.0))
        unit = self.alpha == np.float32(1)
        parts = mlas_matmul_plan(
            self.m,
            self.n,
            self.k,
            batch=self.nb,
            threads=int(attrs.get("threads", 1)),
            unit_alpha=bool(unit),
            trans_b=bool(attrs.get("trans_b", 0)),
        )
        self.transposed = any(p[5] == DOT_COLUMNS for p in parts)
        if self.transposed:  # one row: y^T [N, 1] = B^T [N, K] · A^T [K, 1], N = 1's kernel
            parts = [(n0, cn, 0, 1, sk, DOT) for (_, _, n0, cn, sk, _) in parts]
        self.native = unit or all(p[4] >= self.k for p in parts)
        self.parts = np.asarray(parts, np.int64).reshape(-1, 6)
        self.lead = () if self.folded else np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
        self.out_shape = (*a_shape[:-1], self.n) if self.folded else (*self.lead, self.m, self.n)


def _mlas_matmul(
    ctx: Any,
    a: Any,
    b: Any,
    *,
    out: np.ndarray | None = None,
    plans: dict,
    isa: str | None = None,
    **attrs: Any,
) -> Any:
    """``isa``: the kernel path (None: the CPU's; tests run every path)."""
    a = np.asarray(a)
    b = np.asarray(b)
    key = (a.shape, b.shape)
    plan = plans.get(key)
    if plan is None:
        plan = _Plan(a.shape, b.shape, attrs)
        if len(plans) < 64:  # dynamic shapes: keep it bounded
            plans[key] = plan
    if a.dtype != F32 or b.dtype != F32 or not plan.native or 0 in a.shape or 0 in b.shape:
        y = mlas_matmul(
            a,
            b,
            alpha=float(attrs.get("alpha", 1.0)),
            threads=int(attrs.get("threads", 1)),
            trans_b=bool(attrs.get("trans_b", 0)),
        )
    else:
        g, m, n, k = plan.nb, plan.m, plan.n, plan.k
        if plan.folded:
            aa, bb = a.reshape(m, k), b
        else:
            aa = np.broadcast_to(a, (*plan.lead, m, k))
            bb = np.broadcast_to(b, (*plan.lead, k, n))
        if plan.transposed:  # each GEMM's y^T = B^T · A^T: B^T the filters, A^T the pixels
            w = np.ascontiguousarray(np.swapaxes(bb.reshape(g, k, n), 1, 2)).reshape(g * n, k, 1, 1)
            x = np.ascontiguousarray(aa.reshape(g, m, k)).reshape(1, g * k, 1, m)
        else:
            w = np.ascontiguousarray(aa, dtype=F32).reshape(g * m, k, 1, 1)
            x = np.ascontiguousarray(bb, dtype=F32).reshape(1, g * k, 1, n)
        y = _native.mlas_conv_f32(
            x, w, None, [1, 1], [1, 1], [0, 0, 0, 0], g, plan.parts, _threads(ctx), None, isa
        )
        if plan.transposed:
            y = np.swapaxes(y.reshape(g, n, m), 1, 2)
        if plan.alpha != np.float32(1):
            y = np.multiply(y, plan.alpha, dtype=np.float32)
        y = y.reshape(plan.out_shape)
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _mlas_matmul_specialized(sig: Specialization, *, plans: dict, **attrs: Any) -> Any:
    """One (A shape, B shape) of float32 operands that ``mlas_conv_f32`` reads in place:
    A [G·M, K] and B [G·K, N] as views (equal batch dimensions, or a 2-D B folded into M),
    not transposed, the plan native; the call writes the planned output, recordable (alpha
    ≠ 1 too, when the extension takes it). None: the generic call."""
    a_shape, b_shape = sig.shapes[0], sig.shapes[1]
    if a_shape is None or b_shape is None or len(a_shape) < 2 or len(b_shape) < 2:
        return None
    if sig.dtypes[0] != F32 or sig.dtypes[1] != F32 or 0 in a_shape or 0 in b_shape:
        return None
    plan = _Plan(tuple(a_shape), tuple(b_shape), attrs)
    if not plan.native or plan.transposed:
        return None
    if not plan.folded and (tuple(a_shape[:-2]) != tuple(b_shape[:-2])):
        return None  # a broadcast batch: the generic call's copies
    g, m, n, k = plan.nb, plan.m, plan.n, plan.k
    x4, w4, y4 = (1, g * k, 1, n), (g * m, k, 1, 1), (1, g * m, 1, n)
    out = sig.out
    target = None if out is None else out.reshape(y4)
    threads = step_threads(sig, g * m * n * k, SMALL_MACS)
    parts = plan.parts
    alpha = plan.alpha
    unit = alpha == np.float32(1)
    conv = _native.mlas_conv_f32
    one, zero4 = [1, 1], [0, 0, 0, 0]
    out_shape = plan.out_shape

    generic_attrs = {"plans": plans, **attrs}
    if not unit and target is not None and _conv_takes_alpha():
        # (MM4) one K block: y = f32(acc · alpha) inside the call, so it is recordable
        f_alpha = float(alpha)

        def scaled(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            if not (a.flags.c_contiguous and b.flags.c_contiguous):
                raise ValueError("MlasMatMul: an operand that is not C-contiguous")
            conv(
                b.reshape(x4), a.reshape(w4), None, one, one, zero4, g, parts, threads, target, None, f_alpha
            )
            return out

        return guarded(scaled, _mlas_matmul, generic_attrs, out, reads=2, recordable=True)

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if not (a.flags.c_contiguous and b.flags.c_contiguous):
            # a reshape would copy, and a recorded call would read the copy: the generic call
            raise ValueError("MlasMatMul: an operand that is not C-contiguous")
        y = conv(b.reshape(x4), a.reshape(w4), None, one, one, zero4, g, parts, threads, target)
        if not unit:  # (MM4) one K block: y = f32(acc · alpha)
            np.multiply(y, alpha, out=y)
        if out is not None:
            return out
        return y.reshape(out_shape)

    return guarded(run, _mlas_matmul, generic_attrs, out, reads=2, recordable=bool(unit))


def _conv_takes_alpha() -> bool:
    """Whether ``mlas_conv_f32`` multiplies by ``alpha`` inside its (recorded) call; an
    extension built before that argument takes the product in NumPy after the call."""
    return _native is not None and "alpha" in (_native.mlas_conv_f32.__doc__ or "")


@register_binder("MlasMatMul", QUANTA_DOMAIN)
def bind_mlas_matmul(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::MlasMatMul on float32 A, B of rank >= 2."""
    del model  # unused
    if _native is None or not hasattr(_native, "mlas_conv_f32"):
        return None, "the native extension is not built (or predates mlas_conv_f32)"
    params: dict[str, Any] = {"plans": {}}
    kernel = Kernel(fn=_mlas_matmul, impl="native", name="native:mlas_conv_f32", params=params, out=True)
    kernel.specialize = _mlas_matmul_specialized
    return kernel, ""
