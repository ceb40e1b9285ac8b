"""Every docstring example in the package runs and prints what it says: the examples
are part of the documentation of the arithmetic (a wrong one misleads more than none)."""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest

import quanta

ROOT = pathlib.Path(quanta.__file__).parent
MODULES = sorted(
    ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
    for p in ROOT.rglob("*.py")
    if ">>>" in p.read_text(encoding="utf-8") and p.name != "__main__.py"
)


def test_the_package_has_docstring_examples():
    assert len(MODULES) >= 40, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=False
    )
    assert result.attempted > 0, f"{name}: its '>>>' is in no docstring doctest finds"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} docstring examples failed"
