"""The outputs of a model file on some feeds, run once per quantize_static call.

quantize_static's measurements run files through quanta's session
(quanta.quantize.accuracy.run_outputs) on held-out calibration feeds: eq. (24)'s and eq.
(29b)'s choices each run the float model and two candidates, eq. (28) the float model and
the file, eq. (27) the float model and two files. Several of those are the same file on
the same feeds: the float reference of eqs. (24) and (29b), and eq. (29b)'s per-channel
candidate, which has the ranges of eq. (24)'s winner. Each run compiles a session (most
of its cost) and runs every feed; :func:`run_file` runs a file once and hands the same
outputs to the next measurement that asks for the same bytes and feeds.

A hit returns what the run would return: the session is deterministic (the float kernels'
bytes do not depend on the thread count) and the key is the file's bytes and the feeds'
contents. A file that keeps tensors in external data files is run every time (its bytes
do not say what it computes). The memory is bounded (:data:`MAX_BYTES`); a miss costs
only time.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

__all__ = ["MAX_BYTES", "remembering_outputs", "run_file"]

#: bytes of outputs kept at most (the oldest entries go first)
MAX_BYTES = 256 << 20

F = TypeVar("F", bound=Callable[..., Any])


class _Memo:
    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], list[list[np.ndarray]]] = {}
        self.sizes: dict[tuple[str, str], int] = {}

    def add(self, key: tuple[str, str], outs: list[list[np.ndarray]]) -> None:
        size = sum(int(getattr(o, "nbytes", 0)) for feed in outs for o in feed)
        if size > MAX_BYTES:
            return
        while self.entries and sum(self.sizes.values()) + size > MAX_BYTES:
            oldest = next(iter(self.entries))
            del self.entries[oldest], self.sizes[oldest]
        self.entries[key], self.sizes[key] = outs, size


_ACTIVE: contextvars.ContextVar[_Memo | None] = contextvars.ContextVar("quanta_file_outputs", default=None)


def remembering_outputs(fn: F) -> F:
    """``fn`` (quantize_static) with :func:`run_file` remembering outputs for the length of
    the outermost call (the calls it makes itself share them)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _ACTIVE.get() is not None:
            return fn(*args, **kwargs)
        token = _ACTIVE.set(_Memo())
        try:
            return fn(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    return wrapper  # type: ignore[return-value]


def _file_key(path: str | os.PathLike) -> str | None:
    """sha256 of the file's bytes, or None when it keeps tensors in external data."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    with open(path, "rb") as f:
        data = f.read()
    model = onnx.load_from_string(data)
    if any(uses_external_data(t) for t in _get_all_tensors(model)):
        return None
    return hashlib.sha256(data).hexdigest()


def _feeds_key(feeds: Sequence[dict[str, np.ndarray]]) -> str:
    h = hashlib.sha256()
    for feed in feeds:
        h.update(b"\x00feed")
        for name in sorted(feed):
            a = np.ascontiguousarray(feed[name])
            h.update(f"\x00{name}\x00{a.dtype.str}\x00{a.shape}\x00".encode())
            h.update(repr(a.tolist()).encode() if a.dtype.kind == "O" else a.tobytes())
    return h.hexdigest()


def run_file(path: str | os.PathLike, feeds: Sequence[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """quanta.quantize.accuracy.run_outputs(path, feeds), run once per file and feeds
    inside a :func:`remembering_outputs` call."""
    from quanta.quantize.accuracy import run_outputs

    memo = _ACTIVE.get()
    if memo is None:
        return run_outputs(path, feeds)
    file_key = _file_key(path)
    if file_key is None:
        return run_outputs(path, feeds)
    key = (file_key, _feeds_key(feeds))
    outs = memo.entries.get(key)
    if outs is None:
        outs = run_outputs(path, feeds)
        memo.add(key, outs)
    # the lists are the caller's; the arrays are only read
    return [list(feed) for feed in outs]
