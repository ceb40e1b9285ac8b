"""What the native binders' ``Kernel.specialize`` hooks share (quanta.targets.base
Specialization): the thread count of one step, and the guard that hands a call the
specialized path cannot take to the generic kernel.

A specialized call is made once per input signature, when the runtime binds it: the
conversions of constant parameters, bounds, index tuples and output shapes the generic
kernel redoes on every call are done there, so a run pays the C++ call alone (on a
model of 261 steps of a few microseconds each, as a MobileNetV3 text classifier, the
Python around each call was as long as the call).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.targets.base import Specialization

__all__ = ["SMALL_MACS", "SMALL_WORK", "guarded", "into_places", "shape_free", "step_threads"]

#: Below this much work (elements moved or computed; multiply-adds for a convolution)
#: a step runs on the calling thread alone: the kernels split their work in chunks of
#: 16K elements, so a step this small makes at most two uneven chunks, and waking the
#: pool's worker (a futex and, in a VM, a vCPU wake-up of tens of microseconds when it
#: was not spinning) costs more than the half it would take over.
SMALL_WORK = 1 << 15

#: Multiply-adds below which a convolution, GEMM or recurrent step runs on one thread (a
#: few microseconds of work: less than handing half of it to the pool's worker).
SMALL_MACS = 1 << 18


def step_threads(sig: Specialization, work: int | None = None, small: int = SMALL_WORK) -> int:
    """The threads one step runs on: 1 when its ``work`` (default: the output's element
    count) is below ``small``, else the session's count."""
    if sig.num_threads <= 1:
        return 1
    if work is None:
        work = math.prod(sig.out_shape) if sig.out_shape is not None else small
    return 1 if work < small else sig.num_threads


def guarded(
    call: Callable[..., Any],
    generic: Callable[..., Any],
    attrs: dict[str, Any],
    out: Any,
    *,
    reads: int | tuple[int, ...] | None = None,
    fresh: bool = False,
    recordable: bool = False,
) -> Callable[..., Any]:
    """``call(*inputs)``, or ``generic(ctx, *inputs, out=out, **attrs)`` when the binding
    refuses the arguments (ValueError: a non-contiguous view, a value outside the fast
    path), which then computes the result or raises the operator's own error.

    ``fresh``: both calls return new arrays, never views of an input, so the runtime
    need not check a kernel without ``out=`` for results that share the arena's memory
    (three ``np.may_share_memory`` calls cost a DynamicQuantizeLinear about as much as
    its kernel at a GEMV's row).

    ``recordable``: ``call`` makes exactly one kernel call, through a binding that
    hands it to ``run_or_record`` (bindings.h), writes it into ``out`` (not None), and
    computes nothing else from the values of its inputs; the runtime may then record
    that call once and run it from a native program (quanta.runtime.execute
    ``_native_programs``) while the inputs and ``out`` stay where they are.

    The runtime's fast loop calls ``run.direct`` (``call``) itself, with the first
    ``run.reads`` inputs only (None: all of them; a tuple: the inputs at those positions;
    ``call`` ignores the others, which its specialization bound in), and hands a
    ValueError to ``run``: one Python frame and one argument tuple less per step
    (quanta.runtime.execute). ``run`` itself passes ``call`` what the fast loop would."""
    picks = reads if isinstance(reads, tuple) else None
    first = reads if isinstance(reads, int) else None

    def run(ctx: Any, *inputs: Any) -> Any:
        try:
            if picks is not None:
                return call(*[inputs[p] for p in picks])
            if first is not None:
                # a profiled run and a step the fast loop hands back call ``run``: ``call``
                # takes the inputs the fast loop gives it (OrtLayerNorm's takes x alone)
                return call(*inputs[:first])
            return call(*inputs)
        except ValueError:
            return generic(ctx, *inputs, out=out, **attrs)

    run.__wrapped__ = generic  # type: ignore[attr-defined]
    run.direct = call  # type: ignore[attr-defined]
    run.reads = reads  # type: ignore[attr-defined]
    run.fresh = fresh  # type: ignore[attr-defined]
    run.recordable = recordable and out is not None  # type: ignore[attr-defined]
    return run


def shape_free(specialize: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a ``Kernel.specialize`` hook that reads only the input dtypes, constant
    inputs, the thread count and ``out`` — never a shape — so the runtime also uses it
    on steps whose shapes the signature does not fix (after a NonZero: ``out`` is None
    there and the unstable shapes are None). A duration net's Casts, comparisons and
    elementwise steps after its first NonZero then make direct calls instead of the
    generic wrapper (quanta.runtime.execute)."""
    specialize.shape_free = True  # type: ignore[attr-defined]
    return specialize


def into_places(out: tuple[np.ndarray | None, ...], values: Any) -> tuple[Any, ...]:
    """A multi-output kernel's values copied into their planned places (``Kernel.out_all``),
    in order. A place of None (an output the node omits, or one without a place) hands its
    value on as it is; values past the last place (trailing outputs the node does not
    name, as an LSTM's Y_h, Y_c) are dropped."""
    values = tuple(values)[: len(out)]
    for place, value in zip(out, values, strict=True):
        if place is not None:
            np.copyto(place, value)
    return tuple(value if place is None else place for place, value in zip(out, values, strict=True))
