"""HistogramObserver: a streaming histogram with bounded memory and exact merges.

ORT's ``HistogramCollector`` keeps every activation of every sample until the end of
the pass (then histograms them), and grows its number of bins with the range; PyTorch's
``HistogramObserver`` keeps a fixed number of bins but re-ranges them by *interpolating*
old counts into new bins, so its result depends on the order of the samples and a merge
is not exact. quanta's histogram has neither problem: the bins sit on a power-of-two grid
anchored at 0, and growing the range only ever *merges pairs of bins*, which is exact.

Grid (per channel; docs/calibration.md eqs. (11)-(13))::

    (11) bin g (an integer, may be negative) covers [g·w, (g+1)·w),   w = 2^k
    (12) k = min{k : (hi - lo) <= (B - 2)·2^k},   lo = min(min, 0),  hi = max(max, 0)
    (13) stored window: bins start .. start + B - 1,   start = floor(lo / w)

where min/max are the finite extrema of everything seen so far and B = ``bins``. The
grid spans [min, max] widened to include 0, as every quantization range is (eq. (1)):
bin 0 is always in the window and |x| never needs more than B bins. (12) guarantees the
data fits in the window (the ``- 2`` absorbs float64 rounding of ``hi - lo``); bin
indices are below B in magnitude. Both k and start are functions of (lo, hi) alone, k is
monotone in the range, and the grid of exponent k + d is the grid of k with 2^d
neighbouring bins summed, so::

    state after any sequence of samples = histogram of all of them on grid (12)-(13)

whatever the order or split of the samples: ``a.merge(b)`` equals the single stream
bit for bit (tested through the JSON form). [lo, hi] covers between B/2 and B bins of
the window, so the resolution is never worse than (hi - lo) / (B/2).

Counts (docs/scale.md, "Why the merge is exact"): int32 while every channel has seen at
most 2^31 - 1 values (each bin holds at most its channel's value count, ``_count``), int64
from the first sample or merge that could pass it: the dtype is a function of the value
counts alone (:func:`_counts_dtype`), so it is the same whatever the order of the samples
or merges, and the counts themselves are the same integers either way. Half the bytes of
int64 to fault in, add, pack and copy.

Values: NaN is ignored, +-inf is not binned (the exact extrema record it and the
observer reports the tensor degenerate), exact zeros are also counted separately
(``zeros``) because 0 is always exactly representable after quantization, which the MSE
observer's error model uses.

``HistogramObserver.range()`` is the exact [min, max]; the Entropy, Percentile and MSE
observers are subclasses that choose a clipping range from the same state, so one saved
histogram can be evaluated by any of them (:meth:`HistogramObserver.convert`).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from quanta.calibrate.observer import ObserverBase, _dec, _enc

__all__ = ["DEFAULT_BINS", "HistogramObserver", "HistogramView"]

# B: 32 KiB per channel. The data covers B/2..B bins, so the finest clipping threshold
# the entropy search can reach (L = 128 bins of |x|) is 1/16..1/32 of max|x|.
DEFAULT_BINS = 4096

K_FLOOR = -1074  # exponent of the smallest float64 subnormal: the grid of an all-zero channel
_MAX_SHIFT = 62  # shifting an index (|g| < 2^62) right by more than this is the same as by 62

H = TypeVar("H", bound="HistogramObserver")

# The largest count an int32 row holds: counts stay int32 while every channel's value
# count (the bound of each of its bins) stays at or below it.
_NARROW_MAX = int(np.iinfo(np.int32).max)


def _counts_dtype(value_counts: np.ndarray) -> type[np.int32] | type[np.int64]:
    """The in-memory type of a histogram's counts after ``value_counts`` values per channel
    (the observer's ``_count`` then): every bin of channel c holds at most
    ``value_counts[c]``, so int32 is exact up to 2^31 - 1 values a channel. Narrow only when
    the native update accepts int32 counts (an extension built before it did would refuse
    them; the NumPy twin accepts both)."""
    if value_counts.size and int(value_counts.max()) > _NARROW_MAX:
        return np.int64
    return np.int32 if _native_narrow() else np.int64


_NATIVE_NARROW: list[bool] = []


def _native_narrow() -> bool:
    """Whether the native update takes int32 counts (True without the native update)."""
    if not _NATIVE_NARROW:
        native, ok = _native_update(), True
        if native is not None:
            k, start = np.zeros(1, np.int64), np.zeros(1, np.int64)
            try:
                native(
                    np.zeros((1, 1), np.float32), k, start, np.zeros((1, 16), np.int32), np.zeros(1, np.int64)
                )
            except (TypeError, ValueError):
                ok = False
        _NATIVE_NARROW.append(ok)
    return _NATIVE_NARROW[0]


def _native_update() -> Any:
    """The native histogram update (``_native.histogram_update``), or None."""
    try:
        from quanta.kernels import _native
    except ImportError:
        return None
    return getattr(_native, "histogram_update", None)


def grid_exponent(lo: np.ndarray, hi: np.ndarray, bins: int) -> np.ndarray:
    """Eq. (12), vectorised, for finite extrema (``lo > hi`` marks a channel without
    finite data, which gets K_FLOOR, as an all-zero channel does).

    >>> int(grid_exponent(np.array([-1.0]), np.array([3.0]), 2048)[0])  # 4/2046 = 0.001955: > 2^-9, <= 2^-8
    -8
    >>> int(grid_exponent(np.array([1000.0]), np.array([1001.0]), 2048)[0])  # [0, 1001]: 0.489 <= 2^-1
    -1
    """
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    empty = ~(lo <= hi)
    span = np.where(empty, 0.0, np.maximum(hi, 0.0) - np.minimum(lo, 0.0))
    mant, exp = np.frexp(span / (bins - 2))  # r = mant·2^exp, mant in [0.5, 1)
    k = np.where(mant == 0.5, exp - 1, exp)
    return np.where(span > 0, np.maximum(k, K_FLOOR), K_FLOOR).astype(np.int64)


def _window_start(lo: np.ndarray, hi: np.ndarray, k: np.ndarray) -> np.ndarray:
    lo = np.where(lo <= hi, np.minimum(lo, 0.0), 0.0)
    return np.floor(np.ldexp(lo, -k)).astype(np.int64)


def _moved_rows(k: np.ndarray, start: np.ndarray, k_new: np.ndarray, start_new: np.ndarray) -> np.ndarray:
    """The channels whose grid (k, start) differs from (k_new, start_new)."""
    return np.flatnonzero((k != k_new) | (start != start_new))


def _regrid_rows(
    counts: np.ndarray,
    k: np.ndarray,
    start: np.ndarray,
    k_new: np.ndarray,
    start_new: np.ndarray,
    rows: np.ndarray,
) -> np.ndarray:
    """The channels ``rows`` of (C, B) counts on the new grid, as a (len(rows), B) array.

    Bin g of exponent k lies in bin ``g >> (k_new - k)`` of exponent k_new (arithmetic
    shift = floor division, also for negative g), so this only sums counts: exact.
    """
    b = counts.shape[1]
    k, start, k_new, start_new = k[rows], start[rows], k_new[rows], start_new[rows]
    d = np.minimum(k_new - k, _MAX_SHIFT)
    if (d < 0).any():
        raise AssertionError("regrid: the grid can only get coarser")
    sub = counts if rows.size == counts.shape[0] else counts[rows]  # rows: ascending
    if rows.size > 1 and all((v == v[0]).all() for v in (d, start, start_new)):
        # every row moves alike (a grid shared by the channels, e.g. the weighted MSE
        # observer's tensor grid): whole-array slicing and sums, no per-bin scatter
        return _regrid_uniform(sub, int(d[0]), int(start[0]), int(start_new[0]))
    r, cols = np.nonzero(sub)  # only occupied bins move (most are empty)
    local = ((start[r] + cols) >> d[r]) - start_new[r]
    if (local < 0).any() or (local >= b).any():
        raise AssertionError("regrid: data outside the new window (grid invariant broken)")
    out = np.bincount(r * b + local, weights=sub[r, cols].astype(np.float64), minlength=rows.size * b)
    # sums of integers < 2^53: exact; each at most its channel's value count, which the
    # counts' type holds
    return out.reshape(rows.size, b).astype(counts.dtype)


def _regrid_uniform(sub: np.ndarray, d: int, start: int, start_new: int) -> np.ndarray:
    """(R, B) counts whose rows share one move: window start ``start`` at exponent k to
    ``start_new`` at k + ``d``. Local bin j holds grid bin start + j, which lies in bin
    ``(start + j) >> d`` of the coarser grid: the bins of each group of 2^d (aligned on
    the coarse grid) are summed, the groups placed at their new local index. Integer sums
    of the same bins as :func:`_regrid_rows`' scatter: the same counts."""
    r, b = sub.shape
    out = np.zeros_like(sub)
    if d == 0:
        shift = start - start_new
        lo, hi = max(0, -shift), min(b, b - shift)  # local bins that land in the new window
        if lo >= hi or sub[:, :lo].any() or sub[:, hi:].any():
            if sub.any():
                raise AssertionError("regrid: data outside the new window (grid invariant broken)")
            return out
        out[:, lo + shift : hi + shift] = sub[:, lo:hi]
        return out
    first = start >> d  # coarse bin of local bin 0
    if (1 << d) <= b:
        # pad on the left to the start of bin `first`, on the right to a whole group
        size = 1 << d
        pad = start - (first << d)
        groups = -(-(pad + b) // size)
        padded = np.zeros((r, groups * size), sub.dtype)
        padded[:, pad : pad + b] = sub
        summed = padded.reshape(r, groups, size).sum(axis=2)
    else:  # 2^d > B: the window spans at most two coarse bins
        coarse = (start + np.arange(b, dtype=np.int64)) >> d
        cuts = np.flatnonzero(np.diff(coarse)) + 1
        summed = np.add.reduceat(sub, np.concatenate(([0], cuts)), axis=1)
    at = first - start_new  # new local index of the first group
    lo, hi = max(0, -at), min(summed.shape[1], b - at)
    if lo >= hi or summed[:, :lo].any() or summed[:, hi:].any():
        if sub.any():
            raise AssertionError("regrid: data outside the new window (grid invariant broken)")
        return out
    out[:, lo + at : hi + at] = summed[:, lo:hi]
    return out


def regrid(
    counts: np.ndarray, k: np.ndarray, start: np.ndarray, k_new: np.ndarray, start_new: np.ndarray
) -> np.ndarray:
    """Move (C, B) counts from grid (k, start) to a coarser-or-equal grid (k_new, start_new)
    (a new array; only the channels whose grid changes are re-binned)."""
    out = counts.copy()
    rows = _moved_rows(k, start, k_new, start_new)
    if rows.size:
        out[rows] = _regrid_rows(counts, k, start, k_new, start_new, rows)
    return out


def add_regridded(
    acc: np.ndarray,
    counts: np.ndarray,
    k: np.ndarray,
    start: np.ndarray,
    k_new: np.ndarray,
    start_new: np.ndarray,
) -> None:
    """``acc += regrid(counts, k, start, k_new, start_new)`` in place, without the copy:
    one aligned addition of the whole (C, B) array, then the channels whose grid changes
    are corrected (their unaligned counts taken back out, the re-binned ones added).
    Integer arithmetic throughout, so the result is the same as the re-grid-then-add."""
    rows = _moved_rows(k, start, k_new, start_new)
    acc += counts
    if rows.size:
        acc[rows] += _regrid_rows(counts, k, start, k_new, start_new, rows) - counts[rows]


def _trim(row: np.ndarray) -> list[Any]:
    """JSON form of a count row: [index of the first non-zero bin, counts up to the last]."""
    nz = np.flatnonzero(row)
    if not nz.size:
        return [0, []]
    return [int(nz[0]), row[nz[0] : nz[-1] + 1].tolist()]


def _untrim(entry: list[Any], bins: int) -> np.ndarray:
    first, counts = entry
    row = np.zeros(bins, np.int64)
    row[first : first + len(counts)] = counts
    return row


def _count_dtype(top: int) -> type[np.unsignedinteger] | type[np.int64]:
    """The narrowest unsigned type that holds counts up to ``top`` (int64 beyond)."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(dtype).max:
            return dtype
    return np.int64


def _last_true(occupied: np.ndarray) -> np.ndarray:
    """Per row of a (C, B) bool array, the index of its last True (-1: none).

    ``argmax`` over the reversed rows copies the whole array first (a strided view); on a
    C-contiguous array with B a multiple of 8 the rows are read as 64-bit words instead
    (8 bins a word, bin 8j + i in byte i on a little-endian machine): the last non-zero
    word of each row from B/8 flags, then its highest non-zero byte. The bytes are 0 or
    1, so a word whose highest set byte is i lies in [2^(8i), 2^(8i)·(1 + 2^-7)), which
    float64 keeps inside [2^(8i), 2^(8i+1)): its frexp exponent is 8i + 1, exactly."""
    c, b = occupied.shape
    if b % 8 or sys.byteorder != "little" or not occupied.flags.c_contiguous or c == 0:
        has = occupied.any(axis=1)
        return np.where(has, b - 1 - occupied[:, ::-1].argmax(axis=1), -1).astype(np.int64)
    words = occupied.view(np.uint64)
    nonzero = words != 0
    word = nonzero.shape[1] - 1 - nonzero[:, ::-1].argmax(axis=1)
    top = words[np.arange(c), word]
    _, e = np.frexp(top.astype(np.float64))
    return np.where(nonzero.any(axis=1), 8 * word + (e.astype(np.int64) - 1) // 8, -1).astype(np.int64)


def _pack_ranges(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C, B) non-negative counts as per-row [first, last] occupied bins (last < first:
    an empty row) and the row-major concatenation of the counts inside those ranges, in
    the narrowest unsigned type that holds the largest count. The occupied bins are
    found on the narrowed array (fewer bytes to read than the counts); non-negative
    int32 counts are their uint32 form as they are (a view, no copy)."""
    dtype = _count_dtype(int(counts.max(initial=0)))
    if counts.dtype == np.int32 and dtype == np.uint32 and counts.flags.c_contiguous:
        narrow = counts.view(np.uint32)
    else:
        narrow = counts.astype(dtype)
    occupied = narrow != 0
    last = _last_true(occupied)
    first = np.where(last >= 0, occupied.argmax(axis=1), 0).astype(np.int64)
    # one slice a row: several times faster than a (C, B) mask and a boolean gather
    lo, hi = first.tolist(), (last + 1).tolist()
    rows = [narrow[i, lo[i] : hi[i]] for i in range(len(lo))]
    return first, last, np.concatenate(rows) if rows else narrow.reshape(-1)


def _unpack_ranges(
    shape: tuple[int, int],
    first: np.ndarray,
    last: np.ndarray,
    values: np.ndarray,
    dtype: type[np.signedinteger] = np.int64,
) -> np.ndarray:
    # One slice assignment a row (widened as it is written): np.zeros maps zero pages
    # that are only touched where a run lands. A single vectorised scatter needs the flat
    # index of every stored count (three int64 temporaries of the stored size, ~8 M
    # entries for EfficientNet-Lite0's state) and costs twice this loop over ~19 k rows.
    # ``dtype``: the counts' in-memory type (_counts_dtype), which holds every value.
    out = np.zeros(shape, dtype)
    lo = first.tolist()
    ends = np.cumsum(np.maximum(last - first + 1, 0)).tolist()
    begin = 0
    for row, end in enumerate(ends):
        if end > begin:
            out[row, lo[row] : lo[row] + end - begin] = values[begin:end]
        begin = end
    return out


def _pack_box(counts: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """(C, B) non-negative counts whose rows share one grid (the weighted MSE observer's
    channels, a per-tensor histogram) as the one run of columns [lo, hi] that holds every
    non-zero count, sent as a (C, hi - lo + 1) block: each count's low byte (uint8; ~1 %
    of the block's counts pass 255 on EfficientNet-Lite0) and, for the counts above 255,
    their flat index in the block and upper bits (``count >> 8``, in the counts' type).
    Exact: count = low + (high << 8). Whole-array operations (no loop over rows): on a
    shared grid the channels' occupied runs overlap, so the block holds ~1.8x the bins of
    the per-row runs, at a quarter of their bytes a bin."""
    # counts >= 0: their OR down a column is 0 exactly where the column is empty
    occupied = np.flatnonzero(np.bitwise_or.reduce(counts, axis=0))
    if not occupied.size:
        empty = np.zeros(0, np.int64)
        return 0, -1, np.zeros((counts.shape[0], 0), np.uint8), empty, empty.astype(counts.dtype)
    lo, hi = int(occupied[0]), int(occupied[-1])
    block = counts[:, lo : hi + 1]
    low = block.astype(np.uint8)  # modulo 256 (C casting): the low byte of a count >= 0
    big = np.flatnonzero(block > 255)  # flat indices in the block (C order): faster than np.nonzero's pairs
    rows, cols = np.divmod(big, hi - lo + 1)
    return lo, hi, low, big, block[rows, cols] >> 8


def _unpack_box(
    shape: tuple[int, int],
    packed: tuple[int, int, np.ndarray, np.ndarray, np.ndarray],
    dtype: type[np.signedinteger],
) -> np.ndarray:
    """The (C, B) counts of :func:`_pack_box`, in ``dtype`` (which holds every count)."""
    lo, hi, low, big, high = packed
    out = np.zeros(shape, dtype)
    if hi >= lo:
        block = out[:, lo : hi + 1]
        block[...] = low
        rows, cols = np.divmod(big, hi - lo + 1)
        block[rows, cols] += high.astype(dtype) << 8
    return out


def _shared_grid(k: np.ndarray, start: np.ndarray) -> bool:
    """Whether every channel sits on one grid (one exponent, one window start)."""
    return bool(k.size) and bool((k == k[0]).all()) and bool((start == start[0]).all())


@dataclass(frozen=True)
class HistogramView:
    """One channel's histogram, trimmed to its non-empty bins (what estimators read).

    ``counts[i]`` is the number of finite values in bin ``g0 + i``, which covers
    ``[(g0 + i)·w, (g0 + i + 1)·w)``; ``lo``/``hi`` are the exact finite extrema and
    ``zeros`` the number of exact zeros (inside bin 0).
    """

    counts: np.ndarray  # float64, first and last entries non-zero
    g0: int
    k: int
    lo: float
    hi: float
    zeros: int

    @property
    def width(self) -> float:
        return float(np.ldexp(1.0, self.k))

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    def edges(self) -> np.ndarray:
        """The len(counts) + 1 bin edges (exact multiples of the width)."""
        g = np.arange(self.g0, self.g0 + self.counts.size + 1, dtype=np.float64)
        return np.ldexp(g, self.k)

    def abs_counts(self) -> np.ndarray:
        """Histogram of |x| on the same grid: |x| in bin m covers [m·w, (m+1)·w).

        Signed bin g >= 0 folds onto m = g, g < 0 onto m = -g - 1 (exact: the grid is
        anchored at 0). Trailing empty bins are dropped.
        """
        g = np.arange(self.g0, self.g0 + self.counts.size, dtype=np.int64)
        m = np.where(g >= 0, g, -g - 1)
        out = np.bincount(m, weights=self.counts)
        nz = np.flatnonzero(out)
        return out[: nz[-1] + 1] if nz.size else out[:0]


class HistogramObserver(ObserverBase):
    """Streaming histogram on the exact power-of-two grid (11)-(13); ``range()`` is the
    exact [min, max]. ``bins`` (B) bounds the memory: 8·B bytes per channel.

    >>> import numpy as np
    >>> obs = HistogramObserver(bins=64)
    >>> obs.observe(np.array([-1.0, 0.0, 0.0, 2.5], np.float32))
    >>> v = obs.view(0)
    >>> v.width, v.g0, v.counts.tolist()[:2], v.zeros   # (12): 3.5 / 62 = 0.056 <= 2^-4
    (0.0625, -16, [1.0, 0.0], 2)
    """

    kind = "histogram"

    def __init__(self, *, bins: int = DEFAULT_BINS, axis: int | None = None) -> None:
        if bins < 16:
            raise ValueError(f"{type(self).__name__}: bins must be >= 16, got {bins}")
        super().__init__(axis=axis)
        self.bins = int(bins)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "bins": self.bins}

    # ------------------------------------------------------------------------- state
    def _init_state(self, channels: int) -> None:
        self._k = np.full(channels, K_FLOOR, np.int64)
        self._start = np.zeros(channels, np.int64)
        self._counts = np.zeros((channels, self.bins), _counts_dtype(np.zeros(0, np.int64)))
        self._lo = np.full(channels, np.inf)  # finite extrema (lo > hi: nothing yet)
        self._hi = np.full(channels, -np.inf)
        self._zeros = np.zeros(channels, np.int64)

    def _grid(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each channel's grid (k, start) for the finite extrema (lo, hi): eqs. (12)-(13)."""
        k = grid_exponent(lo, hi, self.bins)
        return k, _window_start(lo, hi, k)

    def _fit_counts(self, value_counts: np.ndarray) -> None:
        """Widen the counts before they take ``value_counts`` values a channel in all, if
        int32 could not hold them then (:func:`_counts_dtype`); they never narrow."""
        dtype = _counts_dtype(value_counts)
        if self._counts.dtype != dtype and np.dtype(dtype).itemsize > self._counts.dtype.itemsize:
            self._counts = self._counts.astype(dtype)

    def _move_to(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Re-grid the stored counts for the finite extrema (lo, hi)."""
        k, start = self._grid(lo, hi)
        if not (np.array_equal(k, self._k) and np.array_equal(start, self._start)):
            rows = _moved_rows(self._k, self._start, k, start)
            # a channel without a finite value yet holds no counts: nothing of it moves (at
            # the first sample none does, and the (C, B) zeros are not rewritten: a fixed
            # cost of every shard of quanta.scale)
            rows = rows[self._lo[rows] <= self._hi[rows]]
            if rows.size == self._counts.shape[0]:  # every channel (a shared grid): a new array
                self._counts = _regrid_rows(self._counts, self._k, self._start, k, start, rows)
            elif rows.size and self._counts[rows].any():  # in place: only moved channels
                self._counts[rows] = _regrid_rows(self._counts, self._k, self._start, k, start, rows)
            self._k, self._start = k, start
        self._lo, self._hi = lo, hi

    def _update(
        self, xc: np.ndarray, lo: np.ndarray, hi: np.ndarray, counted: np.ndarray, clean: bool
    ) -> None:
        assert self._count is not None
        self._fit_counts(self._count + counted)  # each bin holds at most its channel's values
        finite = None
        if not clean:
            finite = np.isfinite(xc)
            lo = np.where(finite, xc, np.inf).min(axis=1, initial=np.inf).astype(np.float64)
            hi = np.where(finite, xc, -np.inf).max(axis=1, initial=-np.inf).astype(np.float64)
            lo, hi = lo + 0.0, hi + 0.0  # no -0.0 extrema (observer.py)
        self._move_to(np.minimum(self._lo, lo), np.maximum(self._hi, hi))
        native = _native_update()
        counts, zeros = self._counts, self._zeros
        if (
            native is not None
            and xc.dtype in (np.float32, np.float64)
            and counts.dtype in (np.int64, np.int32)
            and zeros.dtype == np.int64
            and all(a.flags.c_contiguous and a.flags.writeable for a in (counts, zeros))
        ):
            # the same bins (quantize/histogram.h), without the (C, n) temporaries and the
            # (C, B) bincount of the NumPy form below: half of a calibration's time
            k = np.ascontiguousarray(self._k, np.int64)
            native(xc, k, np.ascontiguousarray(self._start, np.int64), counts, zeros)
            return
        self._update_numpy(xc, finite)

    def _update_numpy(self, xc: np.ndarray, finite: np.ndarray | None) -> None:
        """The bins of eq. (12) in NumPy (the native update's twin): each finite value of
        channel c counts in bin floor(x / 2^k[c]) - start[c] of its window."""
        c, b = self._counts.shape
        vals = xc if finite is None else np.where(finite, xc, 0)
        # floor(x / 2^k): exact in the sample's own float type (scaling by a power of two),
        # except that a negative value may underflow to -0.0 when k > 0 (a float32
        # subnormal on a coarse grid): its bin is -1, not 0.
        if (np.abs(self._k) <= 120).all():  # 2^-k is a normal float32: multiply (8x faster than ldexp)
            scaled = vals * np.ldexp(1.0, -self._k).astype(vals.dtype)[:, None]
        else:  # an all-zero channel (k = K_FLOOR) or a subnormal-sized range
            scaled = np.ldexp(vals, -self._k[:, None])
        g = np.floor(scaled).astype(np.int64)
        if (self._k > 0).any():
            g[(g == 0) & (vals < 0)] = -1
        g -= self._start[:, None]
        if c > 1:
            g += (np.arange(c, dtype=np.int64) * b)[:, None]
        flat = g.reshape(-1) if finite is None else g[finite]
        self._counts += np.bincount(flat, minlength=c * b).reshape(c, b)
        self._zeros += xc.shape[1] - np.count_nonzero(xc, axis=1)  # NaN is non-zero

    def _merge_from(self, other: ObserverBase) -> None:
        assert isinstance(other, HistogramObserver)
        assert self._count is not None and other._count is not None
        self._fit_counts(self._count + other._count)  # before the sums: int32 must hold them
        lo, hi = np.minimum(self._lo, other._lo), np.maximum(self._hi, other._hi)
        self._move_to(lo, hi)
        add_regridded(self._counts, other._counts, other._k, other._start, self._k, self._start)
        self._zeros = self._zeros + other._zeros

    def _state(self) -> dict[str, Any]:
        return {
            "k": self._k.tolist(),
            "start": self._start.tolist(),
            "counts": [_trim(row) for row in self._counts],
            "finite_min": _enc(self._lo),
            "finite_max": _enc(self._hi),
            "zeros": self._zeros.tolist(),
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        self._k = np.asarray(state["k"], dtype=np.int64)
        self._start = np.asarray(state["start"], dtype=np.int64)
        counts = np.stack([_untrim(row, self.bins) for row in state["counts"]])
        assert self._count is not None
        self._counts = counts.astype(_counts_dtype(self._count))
        self._lo = _dec(state["finite_min"]).reshape(-1)
        self._hi = _dec(state["finite_max"]).reshape(-1)
        self._zeros = np.asarray(state["zeros"], dtype=np.int64)

    # ------------------------------------------------------------------------ pickle
    def __getstate__(self) -> dict[str, Any]:
        # What a worker sends back: the (C, B) counts without the empty ends of the window.
        # Channels on one grid (the weighted MSE's, per-tensor histograms: the default
        # recipe's whole state) as one block of columns (_pack_box); channels on grids of
        # their own as each one's occupied bin range (first, last) and the counts inside
        # it, in the narrowest unsigned type that holds the largest count (_pack_ranges).
        # The in-memory type is not sent: the receiver derives it from the value counts.
        state = dict(self.__dict__)
        counts = state.get("_counts")
        if isinstance(counts, np.ndarray) and counts.ndim == 2:
            if _shared_grid(self._k, self._start):
                state["_counts"] = ("box", counts.shape, _pack_box(counts))
            else:
                state["_counts"] = ("ranges", counts.shape, *_pack_ranges(counts))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        counts = state.get("_counts")
        if isinstance(counts, tuple) and counts and counts[0] in ("ranges", "box"):
            dtype = _counts_dtype(np.asarray(state.get("_count", np.zeros(0, np.int64))))
            if counts[0] == "box":
                dense = _unpack_box(counts[1], counts[2], dtype)
            else:
                _, shape, first, last, values = counts
                dense = _unpack_ranges(shape, first, last, values, dtype)
            state = {**state, "_counts": dense}
        self.__dict__.update(state)

    def can_merge_in_place(self) -> bool:
        counts = getattr(self, "_counts", None)
        return not isinstance(counts, np.ndarray) or counts.flags.writeable

    def __deepcopy__(self, memo: dict[int, Any]) -> HistogramObserver:
        # a copy in memory copies the arrays; going through __getstate__ would pack and
        # unpack the counts (the transport form), several times the cost of a copy
        out = type(self).__new__(type(self))
        memo[id(self)] = out
        out.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items()})
        return out

    # --------------------------------------------------------------------- estimates
    def view(self, channel: int = 0) -> HistogramView:
        """The trimmed histogram of one channel (empty counts if it saw no finite value)."""
        if self._min is None:
            raise ValueError("histogram: nothing observed yet")
        row = self._counts[channel]
        nz = np.flatnonzero(row)
        first, last = (int(nz[0]), int(nz[-1])) if nz.size else (0, -1)
        return HistogramView(
            counts=row[first : last + 1].astype(np.float64),
            g0=int(self._start[channel]) + first,
            k=int(self._k[channel]),
            lo=float(self._lo[channel]),
            hi=float(self._hi[channel]),
            zeros=int(self._zeros[channel]),
        )

    def _estimate_channel(self, view: HistogramView) -> tuple[float, float]:
        """Range of one channel with finite data; subclasses choose a clipping range."""
        return view.lo, view.hi

    def _estimate(self) -> tuple[np.ndarray, np.ndarray]:
        assert self._min is not None and self._max is not None
        lo, hi = self._min.copy(), self._max.copy()
        for c in range(lo.size):
            if np.isfinite(lo[c]) and np.isfinite(hi[c]) and self._counts[c].any():
                lo[c], hi[c] = self._estimate_channel(self.view(c))
        return lo, hi

    def convert(self, cls: type[H], **config: Any) -> H:
        """The same histogram read by another histogram observer, e.g.
        ``hist.convert(PercentileObserver, percentile=99.99)``: no re-calibration."""
        if not (isinstance(cls, type) and issubclass(cls, HistogramObserver)):
            raise TypeError(f"convert: {cls!r} is not a histogram observer")
        out = cls(bins=self.bins, axis=self.axis, **config)
        out._rank = self._rank
        if self._min is not None:
            for name, value in vars(self).items():
                if isinstance(value, np.ndarray):
                    setattr(out, name, value.copy())
            out._expressed = self._expressed
        return out
