"""What the native differential tests share: the ISA override they loop over (every ISA
this CPU runs, `_native.supported_isas()`, each forced in turn with `_native.set_isa`, so
that the portable, AVX2 and AVX-512 paths are each checked against the twin on one
machine) and the bit-for-bit comparison of a float kernel's output with its twin's."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from quanta.kernels import _native

ISAS: list[str] = list(_native.supported_isas())


def every_isa(fn: Callable[[str], object]) -> None:
    """Run ``fn(isa)`` once per ISA with the override set, and clear it after."""
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            fn(isa)
    finally:
        _native.clear_isa()


def assert_same(expected: np.ndarray, actual: np.ndarray, label: str, **context) -> None:
    """Same shape and dtype, NaN at the same places, identical bits everywhere else;
    otherwise say where and with which parameters."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    detail = ", ".join(f"{k}={v}" for k, v in context.items())
    assert expected.shape == actual.shape and expected.dtype == actual.dtype, (
        f"{label}: expected {expected.dtype}{expected.shape}, got {actual.dtype}{actual.shape}; {detail}"
    )
    e_nan, a_nan = np.isnan(expected), np.isnan(actual)
    bad = (e_nan != a_nan) | (~e_nan & (expected.view(np.uint32) != actual.view(np.uint32)))
    if bad.any():
        idx = np.argwhere(bad)
        first = tuple(int(i) for i in idx[0])
        raise AssertionError(
            f"{label}: {len(idx)} of {expected.size} elements differ; first at {first}: expected "
            f"{expected[first]!r}, got {actual[first]!r}; {detail}"
        )
