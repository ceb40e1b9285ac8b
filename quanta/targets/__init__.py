"""Back ends: one interface (:mod:`quanta.targets.base`), several implementations,
registered by name with their capabilities (:mod:`quanta.targets.registry`)."""

from __future__ import annotations

from quanta.targets.base import Executable, Target, TargetError
from quanta.targets.registry import (
    TargetInfo,
    get_target,
    register_target,
    registered_targets,
    target_info,
)

__all__ = [
    "Executable",
    "Target",
    "TargetError",
    "TargetInfo",
    "get_target",
    "register_target",
    "registered_targets",
    "target_info",
]
