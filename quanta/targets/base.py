"""What every back end offers: prepare a model once, then run it on feeds.

A target decides per node whether it can run it (``unsupported`` returns a reason or
None) and binds kernels to nodes in ``prepare``. The reference target is the living
definition of the numerics; other targets are tested bit-exact against it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from quanta.ir.graph import Model, Node

__all__ = ["Executable", "Target", "TargetError"]


class TargetError(ValueError):
    """A node a target cannot run, or a failure while running one; names the node."""


class Executable(ABC):
    """A model prepared for one target."""

    #: nodes this executable runs with a fallback implementation (name, op, reason)
    fallbacks: list[tuple[str, str, str]]

    @abstractmethod
    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        on_value: Callable[[str, np.ndarray], None] | None = None,
    ) -> list[np.ndarray]:
        """Run on validated feeds; return the named outputs in order.

        ``on_value(name, array)`` is called for every value a node produces, as soon as
        it is produced (calibration observes activations this way without keeping
        them alive)."""


class Target(ABC):
    name: str = ""

    @abstractmethod
    def unsupported(self, model: Model, node: Node) -> str | None:
        """Why this target cannot run ``node``, or None when it can."""

    @abstractmethod
    def prepare(self, model: Model) -> Executable:
        """Bind every node to an implementation; raise TargetError for unsupported ones."""
