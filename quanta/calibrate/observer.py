"""Observers: record statistics of a tensor stream, then report a range.

The protocol follows PyTorch AO's observers (record statistics, compute later), minus
the parameters: an observer reports a :class:`~quanta.ir.types.CalibratedType`, and
``quanta.quantize.params`` alone turns ranges into scale and zero point (docs/design.md)::

    obs = HistogramObserver(axis=None)
    for x in activations:            # any shapes (variable sequence length is fine)
        obs.observe(x)               # NaN ignored (counted); +-inf kept in min/max
    cal = obs.range()                # Cal(f32, min, max), per channel when axis is set
    obs.merge(other)                 # a new observer: as if one observer saw both streams
    obs.to_dict(), observer_from_dict(d)   # JSON-able state (save_table / load_table)
    obs.nbytes                       # state size: constant in the number of samples

Per-channel observers (``axis=k``) reduce every dimension but ``k``; dimension ``k`` must
keep its size from sample to sample, the others may change. A negative axis is resolved
against the rank of the first sample, and the rank must then stay the same.

Every observer also keeps the exact extrema (docs/calibration.md eq. (8)). When a
channel's extrema are not finite (a mask filled with -inf), :meth:`ObserverBase.range`
returns them as they are instead of an estimate, so that :func:`is_degenerate` reports
the tensor and the quantizer can keep it float. A channel that saw no value reports
``[0, 0]``.

The math of each observer is in its module docstring and in docs/calibration.md.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from quanta.ir.types import BF16, F16, F32, F64, CalibratedType, FloatType

__all__ = [
    "EXTREME",
    "WIDE",
    "Observer",
    "ObserverBase",
    "ObserverResult",
    "dumps_table",
    "is_degenerate",
    "load_table",
    "loads_table",
    "observer_from_dict",
    "observer_type",
    "save_table",
]

FORMAT_VERSION = 1

# A range reaching this magnitude is reported as degenerate: an 8-bit step would then be
# >= 1e9 / 255 ~ 4e6, so nothing of ordinary size survives. Attention masks use -1e9,
# -1e38, finfo(float32).min = -3.4e38 or -inf; real activations of a model that also runs
# in float16 stay below 65504.
EXTREME = 1e9
#: how the reason of a non-negative tensor reaching EXTREME starts (16-bit accepts it)
WIDE = "wide dynamic range"


@runtime_checkable
class Observer(Protocol):
    """What the calibration runner and the quantizer rely on."""

    axis: int | None

    def observe(self, x: np.ndarray) -> None: ...

    def range(self) -> CalibratedType: ...

    def merge(self, other: Observer) -> Observer: ...

    def to_dict(self) -> dict[str, Any]: ...

    @property
    def nbytes(self) -> int: ...


_REGISTRY: dict[str, type[ObserverBase]] = {}


def _enc(a: np.ndarray | float) -> Any:
    """float64 values -> JSON (lists; non-finite as the strings 'inf', '-inf', 'nan')."""
    arr = np.asarray(a, dtype=np.float64)
    out = [v if math.isfinite(v) else repr(v) for v in arr.reshape(-1).tolist()]
    return out if arr.ndim else out[0]


def _dec(v: Any) -> np.ndarray:
    if isinstance(v, list):
        return np.asarray([float(e) for e in v], dtype=np.float64)
    return np.asarray(float(v), dtype=np.float64)


_EXPRESSED_BY_DTYPE = {np.dtype(np.float16): F16, np.dtype(np.float64): F64}


def _expressed_of(a: np.ndarray) -> FloatType:
    if a.dtype == BF16.numpy:
        return BF16
    return _EXPRESSED_BY_DTYPE.get(a.dtype, F32)


class ObserverBase:
    """Shared machinery: channel layout, exact extrema, merge, (de)serialisation.

    Subclasses set ``kind``, extend :meth:`config`, and implement ``_update`` (fold a
    batch in), ``_merge_from`` (fold another observer's state in), ``_estimate``
    (per-channel range over finite data) and ``_state`` / ``_load_state``.

    State arrays (all per channel, C = 1 for a per-tensor observer)::

        _min, _max   float64 (C,)   exact extrema of non-NaN values (+-inf included)
        _count       int64 (C,)     non-NaN values seen
        _nan         int64 (C,)     NaN values seen
    """

    kind: ClassVar[str] = ""
    #: observing the concatenation of several arrays leaves the same state, bit for bit,
    #: as observing them one by one (the extrema, counts and power-of-two histogram grids
    #: depend on the values only, not on how they were grouped), so the calibration
    #: runner may hand a per-tensor observer the many values a Loop or Scan body reports
    #: in one sample as one array; a statistic of each observation (eq. (9)) is not
    batch_invariant: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            _REGISTRY[cls.kind] = cls

    def __init__(self, *, axis: int | None = None) -> None:
        self.axis = axis
        self._rank: int | None = None
        self._expressed: FloatType | None = None
        self._min: np.ndarray | None = None
        self._max: np.ndarray | None = None
        self._count: np.ndarray | None = None
        self._nan: np.ndarray | None = None

    # ----------------------------------------------------------------- configuration
    def config(self) -> dict[str, Any]:
        """Constructor keyword arguments (JSON-able); equal configs can merge."""
        return {"axis": self.axis}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"

    @property
    def channels(self) -> int | None:
        """Number of channels (1 per-tensor); None before the first sample."""
        return None if self._min is None else int(self._min.size)

    @property
    def expressed(self) -> FloatType:
        return self._expressed or F32

    @property
    def nbytes(self) -> int:
        """Bytes held by the observer's state arrays (independent of the sample count)."""
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))

    # ------------------------------------------------------------------- observation
    def _as_channels(self, a: np.ndarray) -> np.ndarray:
        """``x`` -> array (C, N): channel axis first, everything else flattened. float32
        and float64 stay as they are; other real types become float32 (float16, bfloat16:
        exact) or float64 (integers)."""
        if a.dtype not in (np.float32, np.float64):
            a = a.astype(np.float64 if a.dtype.kind in "iu" else np.float32)
        if self.axis is None:
            return a.reshape(1, -1)
        if self._rank is None:
            if not -a.ndim <= self.axis < a.ndim:
                raise ValueError(f"observer: axis {self.axis} is out of range for a rank-{a.ndim} sample")
            self.axis = self.axis % a.ndim
            self._rank = a.ndim
        elif a.ndim != self._rank:
            raise ValueError(
                f"observer: per-channel samples must keep their rank: got rank {a.ndim}, "
                f"earlier samples had rank {self._rank}"
            )
        c = a.shape[self.axis]
        return np.moveaxis(a, self.axis, 0).reshape(c, -1)

    def observe(self, x: np.ndarray) -> None:
        """Fold one sample (any shape) into the statistics. NaN is ignored (counted)."""
        a = np.asarray(x)
        if a.dtype.kind not in "fiu" and a.dtype != BF16.numpy:
            raise TypeError(f"observer: expected a real-valued array, got dtype {a.dtype}")
        xc = self._as_channels(a)
        c = xc.shape[0]
        if self._min is None:
            self._expressed = _expressed_of(a)
            self._min = np.full(c, np.inf)
            self._max = np.full(c, -np.inf)
            self._count = np.zeros(c, np.int64)
            self._nan = np.zeros(c, np.int64)
            self._init_state(c)
        elif c != self._min.size:
            raise ValueError(
                f"observer: sample has {c} channels along axis {self.axis}, earlier samples had {self._min.size}"
            )
        # min/max propagate NaN: only a NaN result costs the masked second pass
        lo = xc.min(axis=1, initial=np.inf).astype(np.float64)
        hi = xc.max(axis=1, initial=-np.inf).astype(np.float64)
        n_nan = np.zeros(c, np.int64)
        if np.isnan(lo).any() or np.isnan(hi).any():
            nan = np.isnan(xc)
            n_nan = nan.sum(axis=1)
            lo = np.where(nan, np.inf, xc).min(axis=1, initial=np.inf).astype(np.float64)
            hi = np.where(nan, -np.inf, xc).max(axis=1, initial=-np.inf).astype(np.float64)
        # -0.0 + 0.0 = +0.0: min/max of signed zeros return whichever comes first, so
        # without this a merge order or a shard boundary could decide the sign of a bound
        lo, hi = lo + 0.0, hi + 0.0
        clean = not n_nan.any() and bool(np.isfinite(lo).all() and np.isfinite(hi).all())
        counted = xc.shape[1] - n_nan
        self._update(xc, lo, hi, counted, clean)
        self._min = np.minimum(self._min, lo)
        self._max = np.maximum(self._max, hi)
        self._count += counted
        self._nan += n_nan

    # hooks -------------------------------------------------------------------------
    def _init_state(self, channels: int) -> None:
        """Allocate the subclass state for ``channels`` channels."""

    def _update(
        self, xc: np.ndarray, lo: np.ndarray, hi: np.ndarray, counted: np.ndarray, clean: bool
    ) -> None:
        """Fold a batch (C, N) in; ``lo``/``hi``/``counted`` are its per-channel non-NaN
        extrema (float64) and count; ``clean``: every value is finite. Called before the
        base extrema are updated."""

    def _merge_from(self, other: ObserverBase) -> None:
        """Fold ``other``'s subclass state into ``self`` (base extrema not yet merged)."""

    def _estimate(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel (lo, hi) for channels whose extrema are finite."""
        assert self._min is not None and self._max is not None
        return self._min.copy(), self._max.copy()

    def _state(self) -> dict[str, Any]:
        return {}

    def _load_state(self, state: dict[str, Any]) -> None:
        del state  # unused: the base observer has no extra state

    # ------------------------------------------------------------------------ result
    def range(self) -> CalibratedType:
        """The calibrated range (per channel when ``axis`` is set).

        Channels that saw nothing give [0, 0]; channels with non-finite extrema give the
        extrema themselves (see :func:`is_degenerate`); others the observer's estimate,
        which always lies within the extrema.
        """
        if self._min is None:
            lo = hi = np.zeros(1)
        else:
            assert self._max is not None and self._count is not None
            finite = np.isfinite(self._min) & np.isfinite(self._max)
            lo, hi = self._estimate()
            lo = np.where(finite, np.clip(lo, self._min, self._max), self._min)
            hi = np.where(finite, np.clip(hi, self._min, self._max), self._max)
            empty = self._count == 0
            lo = np.where(empty, 0.0, lo)
            hi = np.where(empty, 0.0, np.maximum(hi, lo))
        if self.axis is None:
            return CalibratedType(self.expressed, float(lo[0]), float(hi[0]))
        return CalibratedType(self.expressed, tuple(lo.tolist()), tuple(hi.tolist()), self.axis)

    def extrema(self) -> CalibratedType:
        """The exact [min, max] of every non-NaN value seen (eq. (8)), whatever the
        observer's estimate; channels that saw nothing give [0, 0]."""
        if self._min is None:
            lo = hi = np.zeros(1)
        else:
            assert self._max is not None and self._count is not None
            empty = self._count == 0
            lo, hi = np.where(empty, 0.0, self._min), np.where(empty, 0.0, self._max)
        if self.axis is None:
            return CalibratedType(self.expressed, float(lo[0]), float(hi[0]))
        return CalibratedType(self.expressed, tuple(lo.tolist()), tuple(hi.tolist()), self.axis)

    def degenerate(self, bits: int = 8) -> str | None:
        """Why this tensor should stay float, or None: nothing observed, NaN observed, or
        the *exact extrema* are degenerate (:func:`is_degenerate`, for ``bits``-bit storage). The extrema, not the
        estimate, decide: a clipping observer may cut a -1e9 mask down to an ordinary
        looking range, but the tensor still carries the mask."""
        seen = self._count is not None and bool(self._count.any())
        nan = 0 if self._nan is None else int(self._nan.sum())
        return _degenerate(seen, nan, self.extrema() if seen else None, bits)

    def spread(self, bits: int = 8) -> float | None:
        """The share of the non-zero values below half a ``bits``-bit step of [0, max|x|]
        (eq. (26), quanta.calibrate.spread); None for an observer that does not count it."""
        del bits  # only SpreadObserver keeps the exponents it needs
        return None

    def result(self) -> ObserverResult:
        """What quantization reads from this observer (range, extrema, degeneracy), computed
        now: a worker of quanta.scale sends this instead of the state (docs/scale.md)."""
        seen = self._count is not None and bool(self._count.any())
        rng = self.range()
        # a per-channel choice (weighted_mse.py eq. (29)) travels with the per-tensor range
        # it beat, which eq. (29b) measures against
        per_tensor = getattr(self, "tensor_range", None)
        return ObserverResult(
            type(self),
            rng,
            self.extrema(),
            seen=seen,
            nan=0 if self._nan is None else int(self._nan.sum()),
            spread=self.spread(),
            tensor=per_tensor() if per_tensor is not None and rng.axis is not None else None,
        )

    # ------------------------------------------------------------------------- merge
    def merge(self, other: ObserverBase) -> ObserverBase:
        """A new observer equal to one that saw ``self``'s stream, then ``other``'s.

        Both must be the same class with the same configuration and channel count.
        (Only the moving average depends on the order of the two streams.)
        """
        if type(other) is not type(self):
            raise TypeError(f"merge: cannot merge {type(other).__name__} into {type(self).__name__}")
        if other.config() != self.config():
            raise ValueError(f"merge: configurations differ: {self.config()} vs {other.config()}")
        if other._min is None:
            return copy.deepcopy(self)
        if self._min is None:
            return copy.deepcopy(other)
        if other._min.size != self._min.size:
            raise ValueError(f"merge: {self._min.size} channels vs {other._min.size} channels")
        if self._rank is not None and other._rank is not None and self._rank != other._rank:
            raise ValueError(f"merge: per-channel samples of rank {self._rank} vs {other._rank}")
        out = copy.deepcopy(self)
        out._absorb(other)
        return out

    def can_merge_in_place(self) -> bool:
        """Whether :meth:`merge_in_place` may write into this observer's arrays (it
        otherwise only rebinds them; histograms add into their counts)."""
        return True

    def merge_in_place(self, other: ObserverBase) -> ObserverBase:
        """``self.merge(other)`` without copying ``self`` (which it changes and returns):
        a driver folding many large shard states into one accumulator."""
        if self._min is None or other._min is None or other._min.size != self._min.size:
            return self.merge(other)
        if type(other) is not type(self) or other.config() != self.config():
            return self.merge(other)  # raises with the reason
        self._absorb(other)
        return self

    def _absorb(self, other: ObserverBase) -> None:
        self._merge_from(other)
        assert self._max is not None and self._count is not None and self._nan is not None
        assert other._max is not None and other._count is not None and other._nan is not None
        self._min = np.minimum(self._min, other._min)
        self._max = np.maximum(self._max, other._max)
        self._count = self._count + other._count
        self._nan = self._nan + other._nan
        if self._expressed is None:
            self._expressed = other._expressed

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-able state. ``json.dumps(d, sort_keys=True)`` is byte-stable across a
        save/load round trip (floats are written in shortest round-trip form)."""
        state: dict[str, Any] = {"rank": self._rank}
        if self._min is not None:
            assert self._max is not None and self._count is not None and self._nan is not None
            state.update(
                expressed=str(self.expressed),
                min=_enc(self._min),
                max=_enc(self._max),
                count=self._count.tolist(),
                nan=self._nan.tolist(),
            )
            state.update(self._state())
        return {"type": self.kind, "version": FORMAT_VERSION, "config": self.config(), "state": state}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ObserverBase:
        """Inverse of :meth:`to_dict` (``cls`` must match ``d["type"]``; see
        :func:`observer_from_dict` to dispatch on it)."""
        if d.get("type") != cls.kind:
            raise ValueError(f"from_dict: expected an observer of type {cls.kind!r}, got {d.get('type')!r}")
        if d.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"from_dict: unsupported format version {d.get('version')!r} (expected {FORMAT_VERSION})"
            )
        obs = cls(**d["config"])
        state = d["state"]
        obs._rank = state.get("rank")
        if "min" in state:
            obs._expressed = FloatType(state["expressed"])
            obs._min = _dec(state["min"])
            obs._max = _dec(state["max"])
            obs._count = np.asarray(state["count"], dtype=np.int64)
            obs._nan = np.asarray(state["nan"], dtype=np.int64)
            obs._init_state(obs._min.size)
            obs._load_state(state)
        return obs


def _degenerate(seen: bool, nan: int, extrema: CalibratedType | None, bits: int) -> str | None:
    """:meth:`ObserverBase.degenerate` from what it reads: whether any non-NaN value was
    seen, the NaN count, the exact extrema (None when nothing was seen)."""
    if not seen:
        return f"every observed value is NaN ({nan} values)" if nan else "no values observed"
    if nan:
        return f"{nan} NaN values observed"
    assert extrema is not None
    return is_degenerate(extrema, bits=bits)


class ObserverResult:
    """An observer's final answers without its state: ``range()``, ``extrema()`` and
    ``degenerate(bits)`` as the observer gave them (:meth:`ObserverBase.result`). The
    range search of a histogram observer (the weighted MSE's, eq. (22)) runs where the
    merged state is, and a few numbers travel instead of the histograms; the answers are
    the observer's own, bit for bit. It cannot observe, merge or be saved as a table
    (those need the state). ``observer_type``: the class of the observer it came from."""

    __slots__ = ("_extrema", "_nan", "_range", "_seen", "_spread", "_tensor", "observer_type")

    def __init__(
        self,
        observer_type: type[ObserverBase],
        rng: CalibratedType,
        extrema: CalibratedType,
        *,
        seen: bool,
        nan: int,
        spread: float | None = None,
        tensor: CalibratedType | None = None,
    ) -> None:
        self.observer_type = observer_type
        self._tensor = tensor
        self._range = rng
        self._extrema = extrema
        self._seen = seen
        self._nan = nan
        self._spread = spread

    def __reduce__(self) -> tuple[Any, ...]:
        args = (
            self.observer_type,
            self._range,
            self._extrema,
            self._seen,
            self._nan,
            self._spread,
            self._tensor,
        )
        return (_observer_result, args)

    def __repr__(self) -> str:
        return f"ObserverResult({self.observer_type.__name__}, {self._range})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ObserverResult):
            return NotImplemented
        return self.__reduce__()[1] == other.__reduce__()[1]

    __hash__ = None  # type: ignore[assignment]

    def range(self) -> CalibratedType:
        return self._range

    def extrema(self) -> CalibratedType:
        return self._extrema

    def tensor_range(self) -> CalibratedType:
        """The per-tensor range a per-channel ``range()`` was chosen over (eq. (29)), else
        ``range()``."""
        return self._tensor if self._tensor is not None else self._range

    def degenerate(self, bits: int = 8) -> str | None:
        return _degenerate(self._seen, self._nan, self._extrema if self._seen else None, bits)

    def spread(self, bits: int = 8) -> float | None:
        """The observer's eq. (26) share at 8 bits (None when it does not count it)."""
        return self._spread if bits == 8 else None


def _observer_result(*args: Any) -> ObserverResult:
    observer_type, rng, extrema, seen, nan, spread, *tensor = args
    return ObserverResult(
        observer_type, rng, extrema, seen=seen, nan=nan, spread=spread, tensor=tensor[0] if tensor else None
    )


def observer_type(obs: ObserverBase | ObserverResult) -> type[ObserverBase]:
    """The observer class behind ``obs`` (an observer, or the result of one)."""
    return obs.observer_type if isinstance(obs, ObserverResult) else type(obs)


def observer_from_dict(d: Mapping[str, Any]) -> ObserverBase:
    """Rebuild any observer from :meth:`ObserverBase.to_dict` output."""
    kind = d.get("type")
    if kind not in _REGISTRY:
        raise ValueError(f"observer_from_dict: unknown observer type {kind!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[kind].from_dict(d)


def dumps_table(observers: Mapping[str, ObserverBase]) -> str:
    """A calibration table as JSON text: tensor name -> observer state. Byte-stable:
    keys sorted, compact separators, shortest round-trip floats."""
    doc = {
        "format": "quanta-calibration-table",
        "version": FORMAT_VERSION,
        "tensors": {name: obs.to_dict() for name, obs in observers.items()},
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"


def loads_table(text: str) -> dict[str, ObserverBase]:
    doc = json.loads(text)
    if doc.get("format") != "quanta-calibration-table":
        raise ValueError("calibration table: not a quanta calibration table (missing format tag)")
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"calibration table: unsupported version {doc.get('version')!r}")
    return {name: observer_from_dict(d) for name, d in doc["tensors"].items()}


def save_table(path: str | Path, observers: Mapping[str, ObserverBase]) -> None:
    """Write a calibration table (see :func:`dumps_table`)."""
    Path(path).write_text(dumps_table(observers), encoding="utf-8")


def load_table(path: str | Path) -> dict[str, ObserverBase]:
    """Read a table written by :func:`save_table`: the observers can keep observing,
    be merged with another run, or give their ranges."""
    return loads_table(Path(path).read_text(encoding="utf-8"))


def is_degenerate(cal: CalibratedType, *, extreme: float = EXTREME, bits: int = 8) -> str | None:
    """Why a calibrated range should not be quantized, or None if it can be.

    Reasons, in order: NaN bound; non-finite bound (-inf masks); a bound of magnitude
    >= ``extreme``: below -``extreme``, a mask filled with -1e9/-1e38; otherwise
    non-negative data of wide dynamic range (a power spectrum of int16-scale audio
    reaches 1e12), whose reason starts with :data:`WIDE` and which ``bits`` >= 16 (a
    16-bit activation) accepts; zero range (all-zero or constant tensor; per-channel
    only when *every* channel is constant — one dead channel of a weight is fine, it
    gets scale 1 and zero point 0).

    >>> from quanta.ir.types import F32
    >>> is_degenerate(CalibratedType(F32, -1.0, 3.0)) is None
    True
    >>> is_degenerate(CalibratedType(F32, -3.4e38, 8.0)).split(":")[0]
    'range [-3.4e+38, 8] reaches 3.4e+38 (>= 1e+09; a mask filled with -1e9/-1e38?)'
    >>> is_degenerate(CalibratedType(F32, 1.2, 1.4e12)).split(":")[0]
    'wide dynamic range [1.2, 1.4e+12]'
    >>> is_degenerate(CalibratedType(F32, 1.2, 1.4e12), bits=16) is None
    True
    """
    lo = np.asarray(cal.min, dtype=np.float64).reshape(-1)
    hi = np.asarray(cal.max, dtype=np.float64).reshape(-1)
    if np.isnan(lo).any() or np.isnan(hi).any():
        return "range has a NaN bound"
    rng = f"[{lo.min():.5g}, {hi.max():.5g}]"
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        return f"range {rng} is not finite (-inf/+inf in the data, e.g. an attention mask): keep float"
    mag = float(max(np.abs(lo).max(), np.abs(hi).max()))
    if mag >= extreme:
        span = max(float(hi.max()), 0.0) - min(float(lo.min()), 0.0)
        if float(lo.min()) >= 0.0:
            # no mask fills with large positives over non-negative data; energies do
            if bits >= 16:
                return None
            return (
                f"{WIDE} {rng}: an 8-bit step would be {span / 255:.3g}, larger than most values "
                f"(16-bit activations: step {span / 65535:.3g}; else keep float)"
            )
        return (
            f"range {rng} reaches {mag:.3g} (>= {extreme:g}; a mask filled with -1e9/-1e38?): "
            f"an 8-bit step would be {span / 255:.3g}, keep float"
        )
    if (lo == hi).all():
        if cal.axis is not None and lo.size > 1:
            return "every channel is constant (zero range)"
        if lo[0] == 0.0:
            return "every observed value is 0 (zero range)"
        return f"constant: every observed value is {lo[0]:.7g} (zero range)"
    return None
