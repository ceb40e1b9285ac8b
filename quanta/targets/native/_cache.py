"""A small bounded cache for what native kernels derive from their arguments per call
(lookup tables per parameter set, transpose plans and pooling geometry per input shape):
filled on first use, cleared when it reaches its limit, so that run-time parameters or
input shapes that keep changing (a server fed every sequence length) cannot grow it
without bound."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["BoundedCache"]


class BoundedCache:
    """``get(key, build)``: the cached value, or ``build()`` stored under ``key``."""

    LIMIT = 32

    def __init__(self) -> None:
        self._items: dict[Hashable, Any] = {}

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        item = self._items.get(key)
        if item is None:
            if len(self._items) >= self.LIMIT:
                self._items.clear()
            item = self._items[key] = build()
        return item
