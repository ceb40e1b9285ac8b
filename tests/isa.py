"""The ISA override the native differential tests loop over: every ISA this CPU runs
(`_native.supported_isas()`), each forced in turn with `_native.set_isa`, so that the
portable, AVX2 and AVX-512 paths are each checked against the twin on one machine."""

from __future__ import annotations

from collections.abc import Callable

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
