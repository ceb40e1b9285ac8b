"""Kernels: the NumPy reference twins (``reference/``) and the C++ library (``_native``).

This layer imports nothing else from quanta.
"""

from __future__ import annotations

__all__ = ["native_available"]


def native_available() -> bool:
    """True when the C++ extension ``quanta.kernels._native`` is built and importable."""
    try:
        from quanta.kernels import _native  # noqa: F401
    except ImportError:
        return False
    return True
