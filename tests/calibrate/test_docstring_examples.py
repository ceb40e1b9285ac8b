"""The examples in the observers' and params' docstrings are executed (docs/style.md: every
formula in a comment has a test that evaluates it)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "quanta.calibrate.observer",
    "quanta.calibrate.minmax",
    "quanta.calibrate.moving_average",
    "quanta.calibrate.histogram",
    "quanta.calibrate.entropy",
    "quanta.calibrate.percentile",
    "quanta.calibrate.mse",
    "quanta.quantize.params",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
