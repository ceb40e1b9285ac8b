"""Memory planner: liveness intervals of intermediate values -> offsets in one arena.

Input: one :class:`Interval` per buffer, ``[first, last]`` in step indices, inclusive
(a value is written at step ``first`` and read for the last time at step ``last``; a
step's inputs and outputs are live together, so nothing is computed in place).

Algorithm (:func:`plan_arena`): greedy by size with best fit, as TFLite's
``GreedyMemoryPlanner`` and ONNX Runtime's arena planner do, after Pisarchyk & Lee,
"Efficient Memory Management for Deep Neural Net Inference" (2020):

1. round every size up to ``alignment`` (64 bytes: one cache line, an AVX-512 register);
2. visit buffers by decreasing size (ties: the longest lifetime first);
3. for a buffer, take the already placed buffers whose intervals intersect its own,
   sorted by offset, and walk the gaps between them (from offset 0); place the buffer
   in the smallest gap that holds it (best fit), or after the highest of them when no
   gap does;
4. repeat with two other visiting orders (TFLite's tie-break, earlier first use; and
   size x lifetime) and keep the smallest arena (:data:`ORDERS`). Each pass costs
   O(n²) interval tests, vectorised (n buffers), whatever their lifetimes.

Invariants (tests/runtime/test_memory.py checks them over random liveness patterns):

- no two buffers whose intervals intersect share a byte;
- every offset is a multiple of ``alignment``;
- ``peak_bytes`` (the arena size, max of offset + size) >= ``lower_bound``, where
  ``lower_bound = max over steps t of Σ size(b) for b live at t`` (aligned sizes): no
  placement of these buffers can use less.

Aliases (:func:`liveness`): a view step (Reshape, Flatten, Squeeze, Unsqueeze,
Identity) returns its input's memory with another shape, and Split returns parts of
it, so their outputs get no buffers of their own; they join the input's alias class,
and the class's interval covers every member's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from quanta.ir.op_facts import derive

__all__ = [
    "ALIGNMENT",
    "ORDERS",
    "VIEW_OPS",
    "Interval",
    "MemoryPlan",
    "align",
    "check_plan",
    "liveness",
    "lower_bound",
    "plan_arena",
]

ALIGNMENT = 64

#: Ops whose outputs are their first input's memory (reshaped, as NumPy views a
#: contiguous input, or its parts: Split): the outputs share the input's buffer.
VIEW_OPS = derive(
    "quanta.runtime.memory.VIEW_OPS", lambda t: t.ops_where(alias=True) | t.ops_where(alias_parts=True)
)


def align(nbytes: int, alignment: int = ALIGNMENT) -> int:
    """``nbytes`` rounded up to a multiple of ``alignment``."""
    return -(-nbytes // alignment) * alignment


@dataclass(frozen=True)
class Interval:
    """Buffer ``key`` of ``nbytes`` bytes, live from step ``first`` to step ``last`` inclusive."""

    key: Hashable
    nbytes: int
    first: int
    last: int

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            raise ValueError(f"buffer {self.key!r}: nbytes: expected >= 0, got {self.nbytes}")
        if self.last < self.first:
            raise ValueError(
                f"buffer {self.key!r}: interval [{self.first}, {self.last}]: expected first <= last"
            )

    def overlaps(self, other: Interval) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass
class MemoryPlan:
    """Offsets of buffers in one arena, with the arena size and the liveness lower bound."""

    offsets: dict[Hashable, int]
    sizes: dict[Hashable, int]  # aligned sizes
    intervals: list[Interval]
    peak_bytes: int
    lower_bound: int
    alignment: int = ALIGNMENT
    #: alias -> the key of the buffer it shares (view outputs), see :func:`liveness`
    aliases: dict[Hashable, Hashable] = field(default_factory=dict)
    #: the visiting order (a key of :data:`ORDERS`) that gave this plan
    order: str = ""

    @property
    def ratio(self) -> float:
        """peak / lower bound (1.0 is optimal; 1.0 when there is nothing to place)."""
        return self.peak_bytes / self.lower_bound if self.lower_bound else 1.0

    def offset_of(self, key: Hashable) -> int | None:
        """Arena offset of ``key`` (following aliases), or None when it has no buffer."""
        return self.offsets.get(self.aliases.get(key, key))

    def summary(self) -> str:
        return (
            f"arena {self.peak_bytes:,} B, liveness lower bound {self.lower_bound:,} B "
            f"({self.ratio:.3f}x), {len(self.offsets)} buffer{'' if len(self.offsets) == 1 else 's'}, "
            f"alignment {self.alignment}"
        )


def lower_bound(intervals: Iterable[Interval], alignment: int = ALIGNMENT) -> int:
    """max over steps of the aligned bytes live at that step (a sweep over interval ends)."""
    events: list[tuple[int, int]] = []
    for b in intervals:
        size = align(b.nbytes, alignment)
        if size:
            events.append((b.first, size))
            events.append((b.last + 1, -size))
    events.sort(key=lambda e: (e[0], e[1]))  # frees at t before allocations at t
    live = best = 0
    for _, delta in events:
        live += delta
        best = max(best, live)
    return best


#: Visiting orders tried by :func:`plan_arena`; the smallest arena wins (ties: the first).
#: Equal sizes are common (every activation of a transformer layer has the same shape),
#: so the tie-break matters: long-lived buffers first keeps short-lived ones from
#: splitting the arena (the encoder block at d=384 reaches its lower bound this way
#: and 1.2x with TFLite's "earlier first use" tie-break).
ORDERS: dict[str, Callable[[Interval], tuple]] = {
    "size, then longest lifetime": lambda b: (-b.nbytes, b.first - b.last, b.first),
    "size, then first use": lambda b: (-b.nbytes, b.first),
    "size x lifetime": lambda b: (-b.nbytes * (b.last - b.first + 1), b.first),
}


def plan_arena(intervals: Sequence[Interval], alignment: int = ALIGNMENT) -> MemoryPlan:
    """Greedy-by-size, best-fit placement of ``intervals`` (module docstring), with each
    visiting order of :data:`ORDERS`; the plan with the smallest arena."""
    keys = [b.key for b in intervals]
    if len(set(keys)) != len(keys):
        raise ValueError("plan_arena: buffer keys must be unique")
    best: MemoryPlan | None = None
    for name, key in ORDERS.items():
        order = sorted(range(len(intervals)), key=lambda i: (*key(intervals[i]), i))
        offsets, sizes, peak = _place(intervals, order, alignment)
        if best is None or peak < best.peak_bytes:
            best = MemoryPlan(offsets, sizes, list(intervals), peak, 0, alignment, order=name)
    assert best is not None
    best.lower_bound = lower_bound(intervals, alignment)
    return best


def _place(
    intervals: Sequence[Interval], order: Sequence[int], alignment: int
) -> tuple[dict[Hashable, int], dict[Hashable, int], int]:
    """Place buffers in ``order``: each in the smallest gap between the already placed
    buffers live at the same time that holds it, else above the highest of them.

    The placed buffers are kept in arrays, and the ones a buffer meets are found with one
    vectorised interval test: O(n) per buffer whatever the lifetimes (a QDQ graph as
    written dequantizes every weight at the top, so its lifetimes are as long as the
    graph and a per-step index costs O(n²) per buffer)."""
    n = len(intervals)
    firsts = np.empty(n, np.int64)
    lasts = np.empty(n, np.int64)
    offs = np.empty(n, np.int64)
    szs = np.empty(n, np.int64)
    m = 0  # buffers placed (with a non-zero size)
    offsets: dict[Hashable, int] = {}
    sizes: dict[Hashable, int] = {}
    peak = 0
    for i in order:
        b = intervals[i]
        size = align(b.nbytes, alignment)
        sizes[b.key] = size
        if size == 0:
            offsets[b.key] = 0
            continue
        meet = np.flatnonzero((firsts[:m] <= b.last) & (lasts[:m] >= b.first))
        offset = 0
        if meet.size:
            o, z = offs[meet], szs[meet]
            by = np.lexsort((z, o))  # by offset, then size
            o, z = o[by], z[by]
            ends = np.maximum.accumulate(o + z)
            before = np.concatenate(([0], ends[:-1]))  # first free byte before each neighbour
            gaps = o - before
            fits = np.flatnonzero(gaps >= size)
            # best fit: the smallest gap that holds it, the lowest such on ties
            offset = int(ends[-1]) if fits.size == 0 else int(before[fits[np.argmin(gaps[fits])]])
        offsets[b.key] = offset
        firsts[m], lasts[m], offs[m], szs[m] = b.first, b.last, offset, size
        m += 1
        peak = max(peak, offset + size)
    return offsets, sizes, peak


def check_plan(plan: MemoryPlan) -> None:
    """Raise AssertionError when two buffers live at the same step share a byte, an
    offset is misaligned, a buffer leaves the arena, or peak < lower bound."""
    spans = []
    for b in plan.intervals:
        off, size = plan.offsets[b.key], plan.sizes[b.key]
        if off % plan.alignment:
            raise AssertionError(f"buffer {b.key!r}: offset {off} is not a multiple of {plan.alignment}")
        if size < b.nbytes or off + size > plan.peak_bytes:
            raise AssertionError(
                f"buffer {b.key!r}: [{off}, {off + size}) does not fit the arena of {plan.peak_bytes} B"
            )
        if size:
            spans.append((b, off, size))
    for i, (a, oa, sa) in enumerate(spans):
        for b, ob, sb in spans[i + 1 :]:
            if a.overlaps(b) and oa < ob + sb and ob < oa + sa:
                raise AssertionError(
                    f"buffers {a.key!r} [{oa}, {oa + sa}) steps {a.first}..{a.last} and {b.key!r} "
                    f"[{ob}, {ob + sb}) steps {b.first}..{b.last} are live together and overlap"
                )
    if plan.peak_bytes < plan.lower_bound:
        raise AssertionError(f"peak {plan.peak_bytes} B < lower bound {plan.lower_bound} B")


def liveness(
    steps: Sequence[tuple[str, Sequence[Hashable | None], Sequence[Hashable | None]]],
    sizes: Mapping[Hashable, int],
    outputs: Iterable[Hashable] = (),
) -> tuple[list[Interval], dict[Hashable, Hashable]]:
    """Intervals of the buffers produced by ``steps`` and the aliases of view outputs.

    ``steps``: ``(op_type, input keys, output keys)`` in execution order (None for an
    omitted input/output). ``sizes``: bytes of every key that needs a buffer; a key
    without a size (a graph input, a constant, a graph output) is not planned, and a
    view of it needs no buffer either. ``outputs``: keys read after the last step (the
    graph's outputs); a buffer one of them aliases lives to the end.

    Returns ``(intervals, aliases)``: one interval per alias class (keyed by the class's
    root, the first non-view producer), ``aliases[view_key] = root``.
    """
    root: dict[Hashable, Hashable] = {}
    first: dict[Hashable, int] = {}
    last: dict[Hashable, int] = {}
    aliases: dict[Hashable, Hashable] = {}
    for t, (op_type, inputs, step_outputs) in enumerate(steps):
        for key in inputs:
            if key is not None and key in root:
                r = root[key]
                last[r] = max(last[r], t)
        src = inputs[0] if inputs else None
        for key in step_outputs:
            if key is None:
                continue
            if op_type in VIEW_OPS and src is not None:
                if src in root:  # a view of a planned buffer shares it
                    r = root[src]
                    root[key] = r
                    aliases[key] = r
                # else: a view of an input/constant/output needs no buffer at all
            elif key in sizes:
                root[key] = key
                first[key] = last[key] = t
    end = len(steps) - 1
    for key in outputs:
        if key in root:
            last[root[key]] = end
    intervals = [Interval(k, int(sizes[k]), first[k], last[k]) for k in first]
    return intervals, aliases
