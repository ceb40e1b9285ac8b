"""Fusion coverage (:mod:`quanta.passes.coverage`), re-exported where the debugger's tools live;
:func:`quanta.runtime.coverage.lowered_coverage` lowers a model first."""

from quanta.passes.coverage import COMPUTE_OPS, CoverageReport, NodeCoverage, coverage, macs
from quanta.runtime.coverage import lowered_coverage

__all__ = ["COMPUTE_OPS", "CoverageReport", "NodeCoverage", "coverage", "lowered_coverage", "macs"]
