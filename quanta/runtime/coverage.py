"""What share of a model's compute runs in integer once a session has compiled it.

``lowered_coverage(model)`` lowers a copy of ``model`` with the pipeline a session runs
(:func:`quanta.runtime.compile.default_pipeline`) and compares it with the model as
given (:func:`quanta.passes.coverage.coverage`). ``quantize_static`` and
``quantize_dynamic`` report it for the file they write, ``quanta inspect`` for any file.
"""

from __future__ import annotations

from collections.abc import Mapping

from quanta.ir.graph import Model
from quanta.ir.onnx_io import from_proto, to_proto
from quanta.passes.coverage import CoverageReport, coverage
from quanta.passes.manager import PassManager

__all__ = ["lowered_coverage"]


def lowered_coverage(model: Model, shapes: Mapping[str, tuple[int, ...]] | None = None) -> CoverageReport:
    """Coverage of ``model`` (unchanged) after the session's lowering pipeline; a float
    model (no quantization operator) is not lowered, so its compute counts as float.

    ``shapes`` (value name -> shape seen in a calibration sample) stands in for shapes
    the file leaves symbolic or unknown when MACs are counted: a sequence length left
    symbolic would count as 1 and hide an LSTM's whole cost."""
    from quanta.runtime.compile import default_pipeline
    from quanta.targets import get_target

    proto = to_proto(model)
    # coverage pairs a node with what it became by name: unnamed nodes get one
    taken = {n.name for n in proto.graph.node if n.name}
    for i, n in enumerate(proto.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in taken:
                name += "_"
            n.name = name
            taken.add(name)
    before = from_proto(proto, where=model.path or "model")
    lowered = from_proto(proto, where=model.path or "model")
    passes = default_pipeline(get_target("reference"), lowered)
    no_matches = PassManager(passes).run(lowered).no_matches if passes else []
    return coverage(before.graph, lowered.graph, no_matches, shapes)

