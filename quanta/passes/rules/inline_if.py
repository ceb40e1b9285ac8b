"""Inline an If whose condition is a constant: the chosen branch's nodes replace it.

Rule (exact, bit for bit: the If computes its chosen branch and nothing else)::

    %y, ... = If(%c: const) {then_branch = T, else_branch = E}
        -> the nodes of T when c is true, else of E, reading the If's
           enclosing-scope values; %y, ... become the branch's outputs      InlineConstantIf

The branch's initializers become initializers of the graph, its nodes nodes of the
graph (names made fresh where they clash), a nested If / Loop / Scan keeps its
subgraphs and binds the enclosing-scope values it reads (:attr:`Node.outer_names`) to
the values of the new scope. Value types come from the branch's declared value_info.

Why it matters: exporters guard shape-dependent code with an If on a shape test
(``If(Equal(Size(Shape(x)), 3))``); once constant folding has turned the shapes of a
static graph into constants, the condition is a constant and the If is an indirection
that costs a subgraph call per run.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from quanta.ir.graph import Value
from quanta.ir.onnx_io import attribute_to_python, value_info_types
from quanta.ir.subgraphs import subgraph_outer_names
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = ["InlineConstantIf", "InlineIf"]


class InlineConstantIf(Rule):
    """%y, ... = If(%c: const) {then_branch, else_branch} -> the chosen branch's nodes"""

    pattern = "If(c, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        cond = m.value("c")
        if not cond.is_const:
            return NoMatch(f"condition {describe(cond)} is not a constant")
        if np.asarray(cond.const).size != 1:
            return NoMatch(
                f"condition {describe(cond)} holds {np.asarray(cond.const).size} elements, not one"
            )
        branch = self._branch(m)
        if not isinstance(branch, onnx.GraphProto):
            return NoMatch("the If has no graph for the chosen branch")
        if branch.sparse_initializer:
            return NoMatch("the chosen branch has sparse initializers")
        if len(branch.output) != len(m.root.outputs):
            return NoMatch(
                f"the chosen branch has {len(branch.output)} outputs, the If {len(m.root.outputs)}"
            )
        return m

    @staticmethod
    def _branch(m: Match) -> onnx.GraphProto | None:
        taken = bool(np.asarray(m.value("c").const).reshape(-1)[0])
        return m.root.attrs.get("then_branch" if taken else "else_branch")

    def rewrite(self, m: Match, b: Builder) -> list[Value]:
        root = m.root
        branch = self._branch(m)
        n_outer = len(root.outer_names)
        scope: dict[str, Value] = dict(zip(root.outer_names, root.inputs[len(root.inputs) - n_outer :]))
        for init in branch.initializer:
            scope[init.name] = b.const(init.name, numpy_helper.to_array(init))
        types = value_info_types(branch)
        for k, n in enumerate(branch.node):
            ins: list[Value | None] = []
            for name in n.input:
                if name and name not in scope:
                    b.refuse(f"branch node '{n.name or n.op_type}' reads '{name}', which is defined nowhere")
                ins.append(scope[name] if name else None)
            outer = [name for name in subgraph_outer_names(n) if name in scope]
            ins.extend(scope[name] for name in outer)
            out_names = [o or f"{n.name or n.op_type}__unused_output_{j}_{k}" for j, o in enumerate(n.output)]
            outs = b.op(
                n.op_type,
                ins,
                {a.name: attribute_to_python(a) for a in n.attribute},
                types=[types.get(o) for o in n.output],
                domain=n.domain,
                name=n.name or n.op_type.lower(),
                out_names=out_names,
                n_outputs=len(n.output),
                attr_types={a.name: int(a.type) for a in n.attribute},
            )
            node = b.new_nodes[-1]
            node.outer_names = tuple(outer)
            outs = [outs] if len(n.output) == 1 else list(outs)
            for name, v in zip(n.output, outs):
                if name:
                    scope[name] = v
        results = []
        for o in branch.output:
            if o.name not in scope:
                b.refuse(f"branch output '{o.name}' is defined nowhere")
            results.append(scope[o.name])
        return results


class InlineIf(RewritePass):
    """Inline every If whose condition is a constant."""

    name = "inline_if"
    rules = (InlineConstantIf(),)
