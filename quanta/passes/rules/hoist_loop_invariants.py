"""A Loop-carried value that the body passes through unchanged and that starts as a
constant is that constant on every iteration: the body reads it from the enclosing scope.

    %v_final, ... = Loop(%M, %cond, %w (constant), ...) { body(i, c, w_in, ...) -> (c', w_in, ...) }
      -> ... = Loop(%M, %cond, ...) { body(i, c, ...) -> (c', ...), reading %w }
         and the readers of %v_final read %w

Why: Paddle2ONNX carries every weight a decoder Loop uses as a loop variable (SLANet's
attention GRU: four weights, 501 iterations). As loop variables they are run-time values
inside the body, so the Transposes of them run on every iteration and the float GEMMs
pack them on every call; read from the enclosing scope they are constants of the body,
the Transposes fold when the body compiles and the GEMMs pack once.

Exact: the body computes with the same array on every iteration (it is the initial value,
passed through), and the final value the Loop returned is that array. Refused: a body
that changes the value (its output is not its input), an initial value that is not a
constant, a final value that is a graph output (it would lose its name), and a constant
whose name the body defines itself (reading it by that name would read the body's own).
"""

from __future__ import annotations

import onnx

from quanta.ir.graph import Graph, Node
from quanta.ir.subgraphs import rebind_outer_values, renamed_graph
from quanta.passes.manager import Pass, PassResult

__all__ = ["HoistLoopInvariants"]


def _defined(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for n in graph.node:
        names.update(o for o in n.output if o)
    return names


class HoistLoopInvariants(Pass):
    """Constant loop variables passed through unchanged become enclosing-scope constants
    of the body (module docstring)."""

    name = "hoist_loop_invariants"

    def call(self, graph: Graph) -> PassResult:
        hoisted = 0
        for node in list(graph.nodes):
            if node.op_type == "Loop" and not node.domain:
                hoisted += self._hoist(graph, node)
        return PassResult(graph, hoisted > 0, {"hoisted": hoisted})

    @staticmethod
    def _hoist(graph: Graph, node: Node) -> int:
        body = node.attrs.get("body")
        if not isinstance(body, onnx.GraphProto):
            return 0
        n_own = len(node.inputs) - len(node.outer_names)
        n_carried = n_own - 2
        ins = [i.name for i in body.input]
        outs = [o.name for o in body.output]
        if n_carried <= 0 or len(ins) != 2 + n_carried or len(outs) < 1 + n_carried:
            return 0
        defined = _defined(body)
        graph_outputs = {id(o) for o in graph.outputs}
        picks: list[int] = []
        for i in range(n_carried):
            v0 = node.inputs[2 + i]
            if outs[1 + i] != ins[2 + i] or v0 is None or v0.const is None:
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
        constants = [node.inputs[2 + i] for i in picks]
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
