"""Back ends: one interface (:mod:`quanta.targets.base`), several implementations."""

from __future__ import annotations

from quanta.targets.base import Executable, Target, TargetError

__all__ = ["Executable", "Target", "TargetError", "get_target"]


def get_target(name: str) -> Target:
    """The target called ``name``: "reference" (bit-exact NumPy golden) or "native"."""
    if name == "reference":
        from quanta.targets.reference import ReferenceTarget

        return ReferenceTarget()
    if name == "native":
        from quanta.targets.native import NativeTarget

        return NativeTarget()
    raise ValueError(f"unknown backend '{name}': expected 'native' or 'reference'")
