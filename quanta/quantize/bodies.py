"""Quantize inside If / Loop / Scan bodies by the main graph's rules.

Each subgraph becomes a model of its own (:func:`quanta.ir.onnx_io.subgraph_model`:
formal inputs, the enclosing-scope values it reads as inputs, the outer constants it
reads, weights, as its own initializers) and goes through the same steps as the main
graph, nested bodies included:

1. :func:`prepare_bodies`: the float rewrites (constants folded, so weights held in
   Constant nodes become initializers; BatchNormalization folded) run on every body,
   which is written back into its node;
2. :func:`plan_bodies`: one QDQ plan per body (:func:`quanta.quantize.qdq.plan_qdq`);
   the activations to calibrate are named by their *scoped name*
   ``{node}/{attribute}/{value}`` (:func:`quanta.runtime.control_flow.scoped_name`),
   the name under which the calibration run reports a body's values;
3. after calibration, :func:`quantize_bodies` resolves each body's parameters from its
   ranges, inserts Q/DQ, writes LSTMs as DynamicQuantizeLSTM, renames what it created
   under the body's scope (so no name clashes with the enclosing graphs or a sibling
   branch) and writes the body back, innermost first; the node then binds exactly the
   outer values its new bodies read.

A tensor of a branch that the calibration data never took has no range: it stays float
with the observer's reason ("no values observed"), and so do the nodes that read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

from quanta.ir.graph import Model, Node
from quanta.ir.onnx_io import subgraph_model, to_proto
from quanta.ir.subgraphs import rebind_outer_values
from quanta.runtime.control_flow import CONTROL_FLOW_OPS, node_scope

if TYPE_CHECKING:
    from quanta.quantize.qdq import QdqPlan
    from quanta.quantize.recipe import Recipe

__all__ = ["BodyScope", "plan_bodies", "prepare_bodies", "quantize_bodies"]


@dataclass
class BodyScope:
    """One subgraph being quantized: where it sits, the model it became, its plan."""

    prefix: str  # "{node}/{attribute}/", nested scopes chained
    node: Node  # the If / Loop / Scan node holding it, in its parent's graph
    attribute: str
    model: Model
    outer_names: frozenset[str]  # the graph inputs that stand for enclosing-scope values
    outer_consts: dict[str, Any]  # outer constants copied in as initializers (name -> array)
    plan: QdqPlan | None = None
    lstms: dict[int, str | None] = field(default_factory=dict)
    children: list[BodyScope] = field(default_factory=list)

    def walk(self):
        """This scope and every scope nested in it, innermost last."""
        yield self
        for c in self.children:
            yield from c.walk()


def _graphs(node: Node) -> list[tuple[str, onnx.GraphProto]]:
    return sorted((k, v) for k, v in node.attrs.items() if isinstance(v, onnx.GraphProto))


def _body_model(
    parent: Model, node: Node, graph: onnx.GraphProto
) -> tuple[Model, frozenset[str], dict[str, Any]]:
    """The body as a model, the names of its inputs that stand for outer values, and
    the outer constants it holds as initializers (name -> the outer array)."""
    n_outer = len(node.outer_names)
    outer = node.inputs[len(node.inputs) - n_outer :] if n_outer else []
    sub = subgraph_model(graph, outer, node.outer_names, parent)
    formal = {i.name for i in graph.input}
    consts = {
        name: v.const for name, v in zip(node.outer_names, outer) if v is not None and v.const is not None
    }
    return sub, frozenset(v.name for v in sub.graph.inputs if v.name not in formal), consts


def _write_back(scope: BodyScope, parent: Model) -> None:
    """Put ``scope.model`` back into its node as the subgraph (enclosing-scope names as
    references again, not inputs; an outer constant it still reads unchanged is read
    from the enclosing scope again, not copied) and bind the node to what its bodies
    now read."""
    proto = to_proto(scope.model).graph
    kept = [i for i in proto.input if i.name not in scope.outer_names]
    del proto.input[:]
    proto.input.extend(kept)
    unchanged = [
        t
        for t in proto.initializer
        if t.name in scope.outer_consts and _same(numpy_helper.to_array(t), scope.outer_consts[t.name])
    ]
    for t in unchanged:
        proto.initializer.remove(t)
    scope.node.attrs[scope.attribute] = proto
    rebind_outer_values(scope.node)
    for domain, version in scope.model.opset_imports.items():
        parent.opset_imports.setdefault(domain, version)


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _control_flow_nodes(model: Model) -> list[tuple[int, Node]]:
    return [
        (k, n)
        for k, n in enumerate(model.graph.nodes)
        if n.op_type in CONTROL_FLOW_OPS and not n.domain and _graphs(n)
    ]


def prepare_bodies(model: Model, prepare: Any) -> None:
    """Run ``prepare(body_model)`` (the float rewrites) on every subgraph, nested ones
    included, and write each back into its node."""
    for _, node in _control_flow_nodes(model):
        for attribute, graph in _graphs(node):
            sub, outer, consts = _body_model(model, node, graph)
            prepare(sub)
            prepare_bodies(sub, prepare)
            _write_back(BodyScope("", node, attribute, sub, outer, consts), model)


def plan_bodies(model: Model, recipe: Recipe, prefix: str = "") -> list[BodyScope]:
    """A QDQ plan for every subgraph of ``model``'s control-flow nodes (nested ones as
    children). Node positions name unnamed nodes as the runtime does
    (:func:`quanta.runtime.control_flow.node_scope`), so the scoped names match what the
    calibration run reports."""
    from quanta.quantize.qdq import plan_qdq

    scopes = []
    for k, node in _control_flow_nodes(model):
        for attribute, graph in _graphs(node):
            sub, outer, consts = _body_model(model, node, graph)
            scope = BodyScope(
                f"{prefix}{node_scope(node, k)}/{attribute}/", node, attribute, sub, outer, consts
            )
            scope.plan = plan_qdq(sub.graph, recipe)
            scope.children = plan_bodies(sub, recipe, scope.prefix)
            scopes.append(scope)
    return scopes


def quantize_bodies(
    scopes: list[BodyScope],
    parent: Model,
    ranges: dict[str, Any],
    float_reasons: dict[str, str],
    means: dict[str, Any],
    recipe: Recipe,
) -> None:
    """Insert Q/DQ into every planned body (innermost first) from the calibrated
    ``ranges`` and ``float_reasons`` (scoped name -> range / why it stays float) and
    write it back into its node."""
    from quanta.quantize.ort_propagation import settle_dq_propagation
    from quanta.quantize.qdq import bias_correction_inputs, correct_biases, insert_qdq, resolve_params
    from quanta.quantize.recurrent import quantize_lstms

    for scope in scopes:
        quantize_bodies(scope.children, scope.model, ranges, float_reasons, means, recipe)
        plan = scope.plan
        assert plan is not None
        graph = scope.model.graph
        before = {v.name for v in graph.values()}
        local = {}
        ran = any(k.startswith(scope.prefix) for k in ranges)
        for name in plan.activations_to_calibrate():
            key = scope.prefix + name
            if key in ranges:
                local[name] = ranges[key]
            elif key in float_reasons:
                reason = float_reasons[key]
                if not ran and reason == "no values observed":
                    reason = f"no values observed: the calibration data never ran {scope.prefix.rstrip('/')}"
                plan.tensors[name].float_reason = reason
        resolve_params(graph, plan, local, recipe)
        if recipe.bias_correction:
            wanted = {scope.prefix + name: name for name in bias_correction_inputs(plan)}
            correct_biases(graph, plan, {wanted[k]: m for k, m in means.items() if k in wanted})
        insert_qdq(graph, plan)
        settle_dq_propagation(graph, scope.model.opset_imports.get("", 0))
        scope.lstms = quantize_lstms(scope.model, recipe, grus=False)
        _scope_new_names(scope.model, before, scope.prefix)
        _write_back(scope, parent)


def _scope_new_names(model: Model, before: set[str], prefix: str) -> None:
    """Names the quantizer created in a body (Q/DQ outputs, scales, zero points,
    quantized weights) get the body's scope as a prefix: ONNX forbids a subgraph to
    define a name of an enclosing graph, and the main graph's quantizer makes the same
    names (``x_scale``) for its own tensors."""
    graph = model.graph
    for v in list(graph.values()):
        if v.name not in before:
            v.name = prefix + v.name
    graph.initializers = {v.name: v for v in graph.initializers.values()}
