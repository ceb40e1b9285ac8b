"""What share of a model's compute runs in integer once a session has compiled it.

``lowered_coverage(model)`` lowers a copy of ``model`` with the pipeline a session runs
for the file's target (:func:`quanta.runtime.compile.target_pipeline`: the target its
``quanta.recipe`` metadata names, e.g. npu-sim's integer-only stage, else the host's
:func:`~quanta.runtime.compile.default_pipeline`) and compares it with the model as
given (:func:`quanta.passes.coverage.coverage`). ``quantize_static`` and
``quantize_dynamic`` report it for the file they write, ``quanta inspect`` for any file.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from quanta.ir.graph import Model
from quanta.ir.onnx_io import from_proto, to_proto
from quanta.passes.coverage import CoverageReport, coverage
from quanta.passes.manager import PassManager

__all__ = ["file_target", "lowered_coverage"]


def lowered_coverage(
    model: Model, shapes: Mapping[str, tuple[int, ...]] | None = None, target: str | None = None
) -> CoverageReport:
    """Coverage of ``model`` (unchanged) after the lowering pipeline of ``target`` (None:
    :func:`file_target`); a float model (no quantization operator) is not lowered, so its
    compute counts as float.

    ``shapes`` (value name -> shape seen in a calibration sample) stands in for shapes
    the file leaves symbolic or unknown when MACs are counted: a sequence length left
    symbolic would count as 1 and hide an LSTM's whole cost."""
    from quanta.runtime.compile import target_pipeline
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
    passes = target_pipeline(get_target(target or file_target(model)), lowered)
    no_matches = PassManager(passes).run(lowered).no_matches if passes else []
    report = coverage(before.graph, lowered.graph, no_matches, shapes)
    # a trip count that a Constant node or a constant expression computes is a constant
    # once lowered (as in a file whose writer turned it into an initializer): counted
    # the same either way, two files of one model compare
    trips = {
        n.name: int(np.asarray(n.inputs[0].const).reshape(-1)[0])
        for n in lowered.graph.nodes
        if n.op_type == "Loop" and not n.domain and n.inputs and n.inputs[0] is not None
        if n.inputs[0].const is not None and np.asarray(n.inputs[0].const).size == 1
    }
    _add_bodies(report, before, shapes or {}, trips=trips)
    return report


def file_target(model: Model) -> str:
    """The target a file was quantized for: its ``quanta.recipe`` metadata's ``target``
    (``quantize_static(..., target="npu-sim")``), else "reference" (the host numerics)."""
    import json

    try:
        recipe = json.loads(model.metadata.get("quanta.recipe", "{}"))
    except ValueError:
        return "reference"
    target = recipe.get("target") if isinstance(recipe, dict) else None
    from quanta.targets import registered_targets

    return target if isinstance(target, str) and target in registered_targets() else "reference"


def _add_bodies(
    report: CoverageReport,
    model: Model,
    shapes: Mapping[str, tuple[int, ...]],
    prefix: str = "",
    trips: Mapping[str, int] | None = None,
) -> None:
    """Add the compute nodes of ``model``'s If / Loop / Scan bodies to ``report``, named
    ``{node}/{attribute}/{name}``, each body lowered as a session compiles it.

    Which body counts: an If counts one branch, the one the calibration data ran
    (``shapes`` holds values of that branch's scope), else the one with more MACs; a
    Loop or Scan counts its body once per iteration when the trip count is a constant
    (in the file or once lowered: ``trips``, Loop node name -> trip count) or the scan
    length is static, else once. A constant trip count is an upper bound when the
    body's condition ends the loop early (a decoder's end token); it is counted, as in
    every file of the model, unless it is no bound at all (``UNBOUNDED_TRIP_COUNT`` or
    more: a while loop as exporters write it), which counts once like a missing one.
    Each choice is written in ``report.notes``."""
    import onnx

    from quanta.ir.onnx_io import subgraph_model
    from quanta.runtime.control_flow import CONTROL_FLOW_OPS, fold_static_ifs, node_scope

    for k, node in enumerate(model.graph.nodes):
        if node.op_type not in CONTROL_FLOW_OPS or node.domain:
            continue
        scope = prefix + node_scope(node, k)
        graphs = sorted((a, g) for a, g in node.attrs.items() if isinstance(g, onnx.GraphProto))
        n_outer = len(node.outer_names)
        outer = node.inputs[len(node.inputs) - n_outer :] if n_outer else []
        # outer values of a shape seen in the data: the body's shapes are inferred from it
        typed = [_with_shape(v, shapes) for v in outer]
        fresh = any(t is not v for t, v in zip(typed, outer))
        parts: dict[str, CoverageReport] = {}
        for attribute, graph in graphs:
            body_prefix = f"{scope}/{attribute}/"
            sub = subgraph_model(graph, typed, node.outer_names, model, fresh_shapes=fresh)
            if fresh and node.op_type == "If":  # as a session runs a branch for known shapes
                sub = fold_static_ifs(sub)
            body_shapes = {
                name[len(body_prefix) :]: s for name, s in shapes.items() if name.startswith(body_prefix)
            }
            part = lowered_coverage(sub, body_shapes)  # nested bodies included
            for c in part.nodes:
                c.name = body_prefix + c.name
            part.notes = [body_prefix + note for note in part.notes]
            parts[attribute] = part
        if not parts:
            continue
        if node.op_type == "If":
            ran = [a for a in parts if any(name.startswith(f"{scope}/{a}/") for name in shapes)]
            if len(ran) == 1:
                chosen, why = ran[0], "the branch the calibration data ran"
            else:
                chosen = max(parts, key=lambda a: (parts[a].total_macs, a))
                why = "the branch with more MACs (calibration ran neither or both)"
            report.notes.append(f"{scope} (If): MACs of {chosen}, {why}")
            times = 1
        else:
            chosen = "body"
            times, why = _iterations(node, shapes, (trips or {}).get(node.name))
            report.notes.append(f"{scope} ({node.op_type}): body MACs x {times} ({why})")
        part = parts[chosen]
        for c in part.nodes:
            c.macs *= times
        report.nodes.extend(part.nodes)
        for op, n in part.float_islands.items():
            report.float_islands[op] = report.float_islands.get(op, 0) + n
        report.notes.extend(part.notes)


def _with_shape(v, shapes: Mapping[str, tuple[int, ...]]):
    """``v`` typed with the shape ``shapes`` holds for it (a new Value), else ``v``."""
    from quanta.ir.graph import Value
    from quanta.ir.types import TensorType

    if v is None or v.const is not None or v.type is None or v.name not in shapes:
        return v
    return Value(v.name, TensorType(v.type.elem, tuple(shapes[v.name])))


#: a Loop trip count at or above this is no bound: exporters write a while loop (a decoder
#: running to its end token) as ``M = INT64_MAX`` (torch.onnx) or INT32_MAX with the
#: condition ending it, and counting its body that often makes every share the body's alone
UNBOUNDED_TRIP_COUNT = 2**31 - 1


def _iterations(node, shapes: Mapping[str, tuple[int, ...]], folded: int | None = None) -> tuple[int, str]:
    """How many times a Loop or Scan runs its body, as far as the file says (``folded``:
    a Loop's trip count once its constant expressions are folded)."""
    if node.op_type == "Loop":
        m = node.inputs[0] if node.inputs else None
        if m is not None and m.const is not None:
            folded = int(np.asarray(m.const).reshape(-1)[0])
        if folded is None:
            return 1, "trip count not a constant: one iteration counted"
        if folded >= UNBOUNDED_TRIP_COUNT:
            return 1, f"trip count {folded}, no bound (the condition ends the loop): one iteration counted"
        return max(folded, 0), "constant trip count"
    n_scan = int(node.attrs.get("num_scan_inputs", 0))
    n_own = len(node.inputs) - len(node.outer_names)
    axes = list(node.attrs.get("scan_input_axes") or [0] * n_scan)
    if n_scan:
        x = node.inputs[n_own - n_scan]
        shape = shapes.get(x.name) if x is not None else None
        if shape is None and x is not None and x.type is not None:
            shape = x.type.shape
        if shape is not None:
            axis = axes[0] + len(shape) if axes[0] < 0 else axes[0]
            if axis < len(shape) and isinstance(shape[axis], int) and shape[axis] > 0:
                return int(shape[axis]), "scan length"
    return 1, "scan length unknown: one iteration counted"
