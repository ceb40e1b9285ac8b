"""Loop-invariant code motion for ONNX Loops, in two exact steps.

1. A Loop-carried value that the body passes through unchanged is its initial value on
   every iteration: the body reads that value from the enclosing scope instead.

    %v_final, ... = Loop(%M, %cond, %w, ...) { body(i, c, w_in, ...) -> (c', w_in, ...) }
      -> ... = Loop(%M, %cond, ...) { body(i, c, ...) -> (c', ...), reading %w }
         and the readers of %v_final read %w

2. (``nodes=True``, the float pipeline) A body node whose inputs are all enclosing-scope
   values, body constants or results of such nodes computes the same array on every
   iteration: it moves before the Loop, and the body reads its result from the enclosing
   scope.

    ... = Loop(...) { %k = MatMul(%feat, %W); %s = Add(%k, %h_in); ... }
      -> %k = MatMul(%feat, %W); ... = Loop(...) { %s = Add(%k, %h_in); ... reading %k }

Why: Paddle2ONNX carries every weight and the encoder's features a decoder Loop uses as
loop variables (SLANet's attention GRU: four weights and the [1, 256, 96] features, 501
iterations). As loop variables they are run-time values inside the body, so the
Transposes of the weights run on every iteration and the float GEMMs pack them on every
call; read from the enclosing scope the weights are constants of the body (their
Transposes fold when the body compiles, the GEMMs pack once), and the attention's
projection of the features (a 2.4 M multiply-add MatMul) runs once instead of 501 times.

Exact: the body computes with the same arrays on every iteration (step 1: the initial
value, passed through; step 2: a node of deterministic ONNX operators applied to arrays
that do not change), and the final value the Loop returned is that array. The one
difference: a hoisted node runs once even when the Loop runs no iteration. Refused in
step 1: a body that changes the value (its output is not its input), a final value that
is a graph output (it would lose its name), and a value whose name the body defines
itself (reading it by that name would read the body's own). Refused in step 2: nodes of
other domains, with subgraphs, without inputs (a Constant: folded where it is), random
ones, quantization operators (their Q -> op -> DQ groups are lowered inside the body),
nodes whose results the body returns or whose names the enclosing graph already uses.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

from quanta.ir.graph import Graph, Node, Value, unused_name
from quanta.ir.onnx_io import node_from_proto, value_info_types
from quanta.ir.subgraphs import rebind_outer_values, renamed_graph
from quanta.passes.manager import Pass, PassResult
from quanta.passes.rules._util import NONDETERMINISTIC_OPS

__all__ = ["HoistLoopInvariants", "LoopParts", "defined_names", "loop_parts"]


class LoopParts(NamedTuple):
    """A default-domain Loop's body and how its inputs and outputs split."""

    body: onnx.GraphProto
    n_own: int  # M, cond and the carried initial values (the node's inputs before the outer ones)
    n_carried: int
    ins: list[str]  # the body's inputs: iteration number, condition, carried values
    outs: list[str]  # the body's outputs: condition, carried values, scan outputs


def loop_parts(node: Node) -> LoopParts | None:
    """``node``'s body and its input / output split, None for a body that is not a graph,
    carries nothing or does not match the node's inputs."""
    body = node.attrs.get("body")
    if not isinstance(body, onnx.GraphProto):
        return None
    n_own = len(node.inputs) - len(node.outer_names)
    n_carried = n_own - 2
    ins = [i.name for i in body.input]
    outs = [o.name for o in body.output]
    if n_carried <= 0 or len(ins) != 2 + n_carried or len(outs) < 1 + n_carried:
        return None
    return LoopParts(body, n_own, n_carried, ins, outs)


def defined_names(graph: onnx.GraphProto) -> set[str]:
    """The names ``graph`` defines itself: its inputs, initializers and node outputs."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for n in graph.node:
        names.update(o for o in n.output if o)
    return names


#: Operators never moved out of a body: their values are not a function of their inputs
#: (the random ones, and Dropout, whose training_mode may be set at run time), or a
#: lowering pass fuses them with their neighbours inside the body.
_KEPT = NONDETERMINISTIC_OPS | {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


class HoistLoopInvariants(Pass):
    """Loop variables passed through unchanged are read from the enclosing scope, and with
    ``nodes`` the body's loop-invariant nodes move before the Loop (module docstring)."""

    name = "hoist_loop_invariants"

    def __init__(self, *, nodes: bool = False) -> None:
        self.nodes = nodes

    def call(self, graph: Graph) -> PassResult:
        hoisted = moved = 0
        for node in list(graph.nodes):
            if node.op_type == "Loop" and not node.domain:
                hoisted += self._hoist(graph, node)
                if self.nodes:
                    moved += self._hoist_nodes(graph, node)
        return PassResult(graph, hoisted + moved > 0, {"hoisted": hoisted, "nodes": moved})

    @staticmethod
    def _hoist_nodes(graph: Graph, node: Node) -> int:
        """Step 2 of the module docstring: moves the body's loop-invariant nodes before
        ``node``; how many."""
        body = node.attrs.get("body")
        if not isinstance(body, onnx.GraphProto):
            return 0
        n_own = len(node.inputs) - len(node.outer_names)
        invariant: dict[str, Value | None] = dict(zip(node.outer_names, node.inputs[n_own:]))
        constants = {t.name: t for t in body.initializer}
        returned = {o.name for o in body.output}
        taken = {v.name for v in graph.values()} | {n.name for n in graph.nodes}
        types = value_info_types(body)
        moved: list[int] = []
        added: list[Value] = []
        lifted: dict[str, Value] = {}  # body constants a moved node reads, as outer ones
        for k, n in enumerate(body.node):
            ins = [name for name in n.input if name]
            outs = [name for name in n.output if name]
            if (
                n.domain not in ("", "ai.onnx")
                or n.op_type in _KEPT
                or not ins
                or any(a.type in _GRAPH_ATTRS for a in n.attribute)
                or not all(name in invariant or name in constants for name in ins)
                or not any(name in invariant for name in ins)
                or any(name in returned or name in taken for name in outs)
                or len(outs) != len(n.output)
            ):
                continue
            inputs: list[Value | None] = []
            for name in n.input:
                if not name:
                    inputs.append(None)
                elif name in invariant:
                    inputs.append(invariant[name])
                else:
                    if name not in lifted:
                        arr = np.array(numpy_helper.to_array(constants[name]))
                        lifted[name] = graph.add_initializer(unused_name(name, taken), arr)
                    inputs.append(lifted[name])
            outputs = [Value(name, types.get(name)) for name in n.output]
            label = unused_name(f"{node.name or 'loop'}/{n.name or n.op_type}", taken)
            graph.add_node(node_from_proto(n, inputs, outputs, name=label), before=node)
            taken.update(n.output)
            for v in outputs:
                invariant[v.name] = v
            added.extend(outputs)
            moved.append(k)
        if not moved:
            return 0
        new_body = onnx.GraphProto()
        new_body.CopyFrom(body)
        for k in reversed(moved):
            del new_body.node[k]
        # the lifted constants keep their body names inside the body (read as outer
        # values there only when a node still in the body reads them: it then reads its
        # own initializer, which is still there)
        node.attrs["body"] = new_body
        for v in added:
            node.inputs.append(v)
            v.uses.append((node, len(node.inputs) - 1))
        node.outer_names = (*node.outer_names, *(v.name for v in added))
        rebind_outer_values(node)
        return len(moved)

    @staticmethod
    def _hoist(graph: Graph, node: Node) -> int:
        parts = loop_parts(node)
        if parts is None:
            return 0
        body, n_own, n_carried, ins, outs = parts
        defined = defined_names(body)
        graph_outputs = {id(o) for o in graph.outputs}
        picks: list[int] = []
        for i in range(n_carried):
            v0 = node.inputs[2 + i]
            if outs[1 + i] != ins[2 + i] or v0 is None:
                continue
            if id(node.outputs[i]) in graph_outputs or v0.name in defined:
                continue
            picks.append(i)
        if not picks:
            return 0
        new = onnx.GraphProto()
        new.CopyFrom(body)
        renames = {}
        for i in sorted(picks, reverse=True):
            renames[ins[2 + i]] = node.inputs[2 + i].name
            del new.input[2 + i]
            del new.output[1 + i]
        new = renamed_graph(new, renames)
        # the node's inputs and outputs without the hoisted loop variables; the
        # constants bound as enclosing-scope values under their own names
        for k, v in enumerate(node.inputs):
            if v is not None:
                v.uses.remove((node, k))
        constants = [node.inputs[2 + i] for i in picks]  # the initial values, read as outer ones
        for i in picks:
            final = node.outputs[i]
            graph.replace_all_uses(final, node.inputs[2 + i])
            final.producer = None
        keep_in = [v for k, v in enumerate(node.inputs[:n_own]) if k - 2 not in picks]
        node.inputs = [*keep_in, *node.inputs[n_own:], *constants]
        node.outer_names = (*node.outer_names, *(v.name for v in constants))
        node.outputs = [o for k, o in enumerate(node.outputs) if k not in picks]
        for k, v in enumerate(node.inputs):
            if v is not None:
                v.uses.append((node, k))
        node.attrs["body"] = new
        rebind_outer_values(node)
        return len(picks)
