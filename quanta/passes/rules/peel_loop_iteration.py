"""Peel a Loop's first iteration when a loop variable becomes invariant after it.

Paddle2ONNX carries a decoder's encoder features through its Loop as
``v_out = Squeeze(Unsqueeze(v_in) + 0)`` (an ``assign`` written as arithmetic). The
update is not the identity: ``x + 0`` turns a −0 into +0, so iteration 0 reads the
initial value ``v0`` and every later one ``v1 = v0 + 0``, and a node of the body reading
``v_in`` (SLANet's attention projection, a [1, 256, 96] x [96, 96] MatMul, 501 times a
run) is not loop-invariant as written. It is invariant from iteration 1 on, because the
update is idempotent: ``g(g(x)) = g(x)`` bit for bit (eq. (PL1) of docs/passes.md):

    x + (+0) + (+0) = x + (+0)        (only a −0 changes, and only once)
    x − (−0), x · 1, x / 1, x + (−0), x − (+0): the identity

and the views around it (an Unsqueeze undone by a Squeeze of the same axes, Identity)
move no element. So the pass runs iteration 0 before the Loop, as a copy of the body's
nodes on the initial values (the same operators on the same arrays: the same bytes),
and leaves the Loop the remaining ``M − 1`` iterations, starting from iteration 0's
results and condition, with that variable passed through unchanged (its value is
``g(v0)`` on entry and ``g(g(v0)) = g(v0)`` after each iteration).
``HoistLoopInvariants`` then reads it from the enclosing scope and moves the nodes on it
before the Loop:

    ... = Loop(%M, %c, %v0, %h0) { body(i, c, v, h) -> (c', g(v), h') }
      -> %c1, %v1, %h1 = <body nodes on (0, %c, %v0, %h0)>
         ... = Loop(%M - 1, %c1, %v1, %h1) { body(i + 1, c, v, h) -> (c', v, h') }

Taken only where it is exact and plain: a trip count that is a constant >= 1 (or
none) and a condition that is a constant true (or none), so that iteration 0 runs
whatever the data; no scan outputs (their first slice would need a Concat); a body
without subgraphs or random operators; and a loop variable whose update is such a
chain, read in the body by a node that the peel makes loop-invariant (otherwise
nothing is gained).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from quanta.ir.graph import Graph, Node, Value, unused_name
from quanta.ir.onnx_io import node_from_proto, value_info_types
from quanta.ir.subgraphs import rebind_outer_values
from quanta.passes.manager import Pass, PassResult
from quanta.passes.rules._util import NONDETERMINISTIC_OPS
from quanta.passes.rules.hoist_loop_invariants import defined_names, loop_parts

__all__ = ["PeelLoopIteration"]

_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
#: operators whose result is worth computing once: anything but a view or a shape read
_CHEAP = {"Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Shape", "Size", "Constant"}


def _body_constants(body: onnx.GraphProto) -> dict[str, np.ndarray]:
    """The body's initializers and Constant-node values (``value`` attribute), by name."""
    out = {t.name: numpy_helper.to_array(t) for t in body.initializer}
    for n in body.node:
        if (
            n.op_type == "Constant"
            and not n.domain
            and len(n.attribute) == 1
            and n.attribute[0].name == "value"
        ):
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _scalar_const(v: Value | None) -> np.ndarray | None:
    if v is None or v.const is None or v.const.size != 1:
        return None
    return np.asarray(v.const)


def _is_identity_or_add_zero(op: str, c: np.ndarray, data_first: bool) -> bool:
    """Whether ``op(x, c)`` (``op(c, x)`` when not ``data_first``) is idempotent in x, bit
    for bit: x ± 0 and x · 1, x / 1 (eq. (PL1))."""
    if c.size != 1 or c.dtype.kind != "f":
        return False
    value = float(c.reshape(-1)[0])
    if op == "Add":
        return value == 0.0  # either zero, either order: x + 0 or x itself
    if op == "Sub":
        return data_first and value == 0.0
    if op == "Mul":
        return value == 1.0
    if op == "Div":
        return data_first and value == 1.0
    return False


def _idempotent_chain(
    body: onnx.GraphProto, start: str, end: str, consts: dict[str, np.ndarray], rank: int | None
) -> list[str] | None:
    """The values of the chain ``end = g(start)`` when g is idempotent (eq. (PL1)), in
    order from ``start``'s first reader; None otherwise."""
    producer = {o: n for n in body.node for o in n.output if o}
    chain: list[onnx.NodeProto] = []
    name = end
    while name != start:
        n = producer.get(name)
        if n is None or n.domain or len(n.output) != 1:
            return None
        chain.append(n)
        if n.op_type in ("Add", "Sub", "Mul", "Div"):
            if len(n.input) != 2:
                return None
            a, b = n.input
            if b in consts and _is_identity_or_add_zero(n.op_type, consts[b], True):
                c, name = consts[b], a
            elif a in consts and _is_identity_or_add_zero(n.op_type, consts[a], False):
                c, name = consts[a], b
            else:
                return None
            # a constant of more axes than x would widen it: only with x's rank known to
            # be at least the constant's (x's rank never falls below v0's before the Add)
            if c.ndim > 0 and (rank is None or rank < c.ndim):
                return None
        elif n.op_type in ("Identity", "Squeeze", "Unsqueeze"):
            if any(x not in consts for x in n.input[1:] if x) or any(a.name != "axes" for a in n.attribute):
                return None
            name = n.input[0]
        else:
            return None
    chain.reverse()
    # the views cancel: every Unsqueeze undone by a Squeeze of the same axes, innermost
    # first, so the chain maps a tensor to one of the same shape and element order
    stack: list[tuple[int, ...]] = []
    for n in chain:
        if n.op_type not in ("Squeeze", "Unsqueeze"):
            continue
        if len(n.input) > 1 and n.input[1]:
            axes = tuple(int(a) for a in consts[n.input[1]].reshape(-1))
        else:
            attr = [a for a in n.attribute if a.name == "axes"]
            if not attr:
                return None  # a Squeeze of every size-1 axis: not known to undo anything
            axes = tuple(attr[0].ints)
        if n.op_type == "Unsqueeze":
            stack.append(axes)
        elif not stack or stack.pop() != axes:
            return None
    if stack:
        return None
    return [n.output[0] for n in chain]


class PeelLoopIteration(Pass):
    """Iteration 0 of a Loop runs before it when that makes a loop variable invariant
    (module docstring)."""

    name = "peel_loop_iteration"

    def call(self, graph: Graph) -> PassResult:
        peeled = 0
        for node in list(graph.nodes):
            if node.op_type == "Loop" and not node.domain:
                peeled += self._peel(graph, node)
        return PassResult(graph, peeled > 0, {"peeled": peeled})

    @staticmethod
    def _peel(graph: Graph, node: Node) -> int:
        parts = loop_parts(node)
        if parts is None:
            return 0
        body, n_own, n_carried, ins, outs = parts
        if len(outs) != 1 + n_carried:
            return 0  # scan outputs: iteration 0's slices would need a Concat
        if any(n.op_type in NONDETERMINISTIC_OPS for n in body.node):
            return 0
        if any(a.type in _GRAPH_ATTRS for n in body.node for a in n.attribute):
            return 0
        m, cond = node.inputs[0], node.inputs[1]
        m_const = _scalar_const(m)
        if m is not None and (m_const is None or int(m_const.reshape(-1)[0]) < 1):
            return 0
        c_const = _scalar_const(cond)
        if cond is not None and (c_const is None or not bool(c_const.reshape(-1)[0])):
            return 0
        if any(v is None for v in node.inputs[2:n_own]):
            return 0

        consts = _body_constants(body)
        outer = dict(zip(node.outer_names, node.inputs[n_own:]))
        for name, v in outer.items():
            if v is not None and v.const is not None and name not in consts:
                consts[name] = v.const
        # loop variables the body passes through (read from the enclosing scope once
        # HoistLoopInvariants runs)
        passed = {ins[2 + j] for j in range(n_carried) if outs[1 + j] == ins[2 + j]}
        picks: list[int] = []
        for i in range(n_carried):
            v0 = node.inputs[2 + i]
            assert v0 is not None
            rank = None if v0.shape is None else len(v0.shape)
            if outs[1 + i] == ins[2 + i]:
                continue  # passed through already: HoistLoopInvariants' step 1
            chain = _idempotent_chain(body, ins[2 + i], outs[1 + i], consts, rank)
            if chain is None:
                continue
            fixed = {ins[2 + i], *chain}
            stable = fixed | passed | set(outer) | set(consts)
            for n in body.node:
                if n.op_type in _CHEAP or any(o in fixed for o in n.output):
                    continue
                reads = [x for x in n.input if x]
                if reads and any(x in fixed for x in reads) and all(x in stable for x in reads):
                    picks.append(i)
                    break
        if not picks:
            return 0

        # every name the body reads resolves: its inputs, initializers, outputs of its
        # nodes, or a bound enclosing-scope value (checked before anything changes)
        known = set(ins) | {t.name for t in body.initializer} | {k for k, v in outer.items() if v is not None}
        for n in body.node:
            if any(x and x not in known for x in n.input):
                return 0
            known.update(o for o in n.output if o)
        if any(o not in known for o in outs):
            return 0

        # iteration 0, before the Loop: the body's nodes on the initial values
        taken = {v.name for v in graph.values()} | {n.name for n in graph.nodes}
        types = value_info_types(body)
        prefix = f"{node.name or 'loop'}/iter0"
        env: dict[str, Value] = dict((k, v) for k, v in outer.items() if v is not None)
        env[ins[0]] = graph.add_initializer(unused_name(f"{prefix}/i", taken), np.array(0, np.int64))
        taken.add(env[ins[0]].name)
        if cond is None:
            cond = graph.add_initializer(unused_name(f"{prefix}/cond", taken), np.array(True))
            taken.add(cond.name)
        env[ins[1]] = cond
        for i in range(n_carried):
            v0 = node.inputs[2 + i]
            assert v0 is not None
            env[ins[2 + i]] = v0
        for t in body.initializer:
            env[t.name] = graph.add_initializer(
                unused_name(f"{prefix}/{t.name}", taken), numpy_helper.to_array(t)
            )
            taken.add(env[t.name].name)
        for n in body.node:
            inputs = [env[x] if x else None for x in n.input]
            outputs = []
            for j, o in enumerate(n.output):
                # an omitted optional output gets a private, unused value, as on load
                base = o or f"{n.name or n.op_type}__unused_output_{j}"
                v = Value(unused_name(f"{prefix}/{base}", taken), types.get(o))
                taken.add(v.name)
                if o:
                    env[o] = v
                outputs.append(v)
            label = unused_name(f"{prefix}/{n.name or n.op_type}", taken)
            taken.add(label)
            graph.add_node(node_from_proto(n, inputs, outputs, name=label), before=node)

        # the Loop: the remaining iterations from iteration 0's state
        new_body = onnx.GraphProto()
        new_body.CopyFrom(body)
        for i in picks:
            new_body.output[1 + i].name = ins[2 + i]  # g(v) = v from iteration 1 on (PL1)
        if any(ins[0] in n.input for n in new_body.node):
            # the body sees the original iteration numbers: i + 1
            # new names clash with nothing the body defines or reads (an outer name it
            # reads would be shadowed)
            seen = defined_names(body) | {x for n in body.node for x in n.input} | set(node.outer_names)
            shifted = unused_name(f"{ins[0]}_plus_1", seen)
            one = unused_name(f"{ins[0]}_one", seen | {shifted})
            for n in new_body.node:
                for k, x in enumerate(n.input):
                    if x == ins[0]:
                        n.input[k] = shifted
            new_body.initializer.append(numpy_helper.from_array(np.array(1, np.int64), one))
            new_body.node.insert(0, onnx.helper.make_node("Add", [ins[0], one], [shifted]))
        new_inputs: list[Value | None] = []
        if m is not None:
            assert m_const is not None
            left = np.asarray(m_const.astype(np.int64) - 1).reshape(m_const.shape)
            new_inputs.append(graph.add_initializer(unused_name(f"{prefix}/M", taken), left))
        else:
            new_inputs.append(None)
        new_inputs.append(env[outs[0]])
        new_inputs.extend(env[outs[1 + i]] for i in range(n_carried))
        for k, v in enumerate(node.inputs):
            if v is not None:
                v.uses.remove((node, k))
        node.inputs = [*new_inputs, *node.inputs[n_own:]]
        for k, v in enumerate(node.inputs):
            if v is not None:
                v.uses.append((node, k))
        node.attrs["body"] = new_body
        rebind_outer_values(node)
        return 1
