"""Scan-8 as a Loop over the batch rows of a Scan of opset 9 or newer.

Scan-8 (opsets 8) has a batch axis: every state input is ``[B, ...]``, every scan
input ``[B, T, ...]``, and the optional first input ``sequence_lens`` ``[B]`` gives row
b its own number of steps ``n_b <= T``. Its body sees one row's state and one step's
slice. Scan-9 dropped the batch axis and ``sequence_lens``; ONNX's version converter
turns a Scan-8 into a Scan-9 on the same inputs (its adapter rewrites the graph's
input shapes without their batch axis and runs the body over the batch axis as if it
were the time axis), which is not the model. ``upgrade_opset`` therefore keeps every
Scan-8 through the converter as ``quanta::Scan8`` (same inputs, outputs, attributes)
and this pass writes it in standard operators, row by row as the ONNX pseudo-code
defines it:

    %s_N..., %y... = quanta::Scan8(%lens?, %s_0..., %x...) {body, num_scan_inputs, directions}
      -> %B = Gather(Shape(%x_1), 0)
         %s_N..., %y... = Loop(%B, ) {
           body(b, c):
             %x_b = Gather(%x, b, axis=0)                       # [T, ...]
             %x_b' = Slice(%x_b, [0], Reshape(Gather(%lens, b), [1]), [0])   (with lens)
             %f..., %u... = Scan(Gather(%s_0, b, axis=0)..., %x_b'...)
                               {body, num_scan_inputs, scan_input_directions = directions}
             %u' = Pad(%u, [0, .., 0, T - n_b, 0, .., 0])      (with lens)
             -> (c, %f..., %u'...)
         }

The Loop stacks its per-row outputs on a new axis 0: final states ``[B, ...]`` and scan
outputs ``[B, T, ...]``, the shapes Scan-8 gives. Row b's scan output past its
``n_b`` steps is undefined in ONNX; the Pad writes zeros there, as ONNX Runtime's
Scan-8 and quanta's own (``runtime/control_flow.py``) do. A reverse scan input reads
row b's first ``n_b`` steps backwards in both forms (Scan-8: ``x[b, n_b - 1 - t]``).
Exact: the same body runs on the same slices in the same order; only views, a zero
Pad and index arithmetic are added. The rewritten operators mean the same at ai.onnx
opsets 11 and newer (Pad takes its pads as an input from 11); ``upgrade_opset`` only
marks a Scan-8 when raising a model to opset 9 or newer, and quantization raises to
13 at least.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quanta.ir.graph import Graph, Node, Value, unused_name
from quanta.ir.onnx_io import SCAN8_DOMAIN, SCAN8_OP, node_from_proto
from quanta.ir.subgraphs import rebind_outer_values
from quanta.ir.types import TensorType, elem_from_onnx
from quanta.passes.manager import Pass, PassResult

__all__ = ["SCAN8_DOMAIN", "SCAN8_OP", "Scan8AsLoop"]

_INT64_MAX = np.iinfo(np.int64).max


def _names_in(graph: onnx.GraphProto, out: set[str]) -> None:
    """Every name ``graph`` defines or reads, nested subgraphs included."""
    out.update(i.name for i in graph.input)
    out.update(o.name for o in graph.output)
    out.update(t.name for t in graph.initializer)
    out.update(v.name for v in graph.value_info)
    for n in graph.node:
        out.update(x for x in n.input if x)
        out.update(x for x in n.output if x)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _names_in(a.g, out)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _names_in(g, out)


def _scan_output_type(vi: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    """A per-row scan output: the body's element type, one more (leading) axis of
    unnamed size when the body's shape is known."""
    tt = vi.type.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = [None, *[d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]]
    return helper.make_tensor_value_info(name, tt.elem_type, shape)


class Scan8AsLoop(Pass):
    """Every ``quanta::Scan8`` becomes a Loop over its batch rows of a Scan (module
    docstring)."""

    name = "scan8_as_loop"

    def call(self, graph: Graph) -> PassResult:
        count = 0
        for node in list(graph.nodes):
            if node.op_type == SCAN8_OP and node.domain == SCAN8_DOMAIN:
                self._rewrite(graph, node)
                count += 1
        return PassResult(graph, count > 0, {"Scan8AsLoop": count})

    @staticmethod
    def _rewrite(graph: Graph, node: Node) -> None:
        body = node.attrs["body"]
        n_own = len(node.inputs) - len(node.outer_names)
        n_scan_in = int(node.attrs["num_scan_inputs"])
        n_state = n_own - 1 - n_scan_in
        if n_state < 0 or n_scan_in < 1:
            raise ValueError(
                f"{node.label}: Scan-8 with num_scan_inputs = {n_scan_in} and {n_own - 1} inputs "
                "after sequence_lens"
            )
        directions = [int(d) for d in node.attrs.get("directions") or [0] * n_scan_in]
        lens = node.inputs[0]
        states = node.inputs[1 : 1 + n_state]
        xs = node.inputs[1 + n_state : n_own]
        if any(v is None for v in (*states, *xs)):
            raise ValueError(f"{node.label}: Scan-8 with an omitted state or scan input")
        n_scan_out = len(body.output) - n_state

        taken = {v.name for v in graph.values()} | {n.name for n in graph.nodes} | set(node.outer_names)
        _names_in(body, taken)
        prefix = node.name or "scan8"

        def fresh(base: str) -> str:
            return unused_name(f"{prefix}/{base}", taken)

        # the trip count: the batch size, read from the first scan input
        first = xs[0]
        assert first is not None
        shape_v = Value(fresh("shape"), TensorType(elem_from_onnx(onnx.TensorProto.INT64), (None,)))
        zero = graph.add_initializer(fresh("zero"), np.array(0, np.int64))
        taken.add(zero.name)
        batch_v = Value(fresh("batch"), TensorType(elem_from_onnx(onnx.TensorProto.INT64), ()))
        shape_node = Node("Shape", [first], [shape_v], name=fresh("Shape"))
        gather_node = Node("Gather", [shape_v, zero], [batch_v], {"axis": 0}, name=fresh("Gather"))

        # the Loop body, on names that shadow nothing the Scan-8 body reads
        it, cond_in, cond_out = fresh("b"), fresh("cond_in"), fresh("cond_out")
        nodes: list[onnx.NodeProto] = []
        inits: list[onnx.TensorProto] = []
        row_states, row_xs = [], []
        for v in states:
            assert v is not None
            r = fresh(f"{v.name}_row")
            nodes.append(helper.make_node("Gather", [v.name, it], [r], axis=0))
            row_states.append(r)
        len_1 = steps_1 = zero_1 = one_1 = int_max_1 = ""
        if lens is not None:
            one_shape, len_1 = fresh("one_shape"), fresh("len")
            len_s = fresh("len_scalar")
            inits.append(numpy_helper.from_array(np.array([1], np.int64), one_shape))
            nodes.append(helper.make_node("Gather", [lens.name, it], [len_s], axis=0))
            nodes.append(helper.make_node("Reshape", [len_s, one_shape], [len_1]))
            zero_1, one_1, int_max_1 = fresh("zero_1"), fresh("one_1"), fresh("int_max_1")
            inits.append(numpy_helper.from_array(np.array([0], np.int64), zero_1))
            inits.append(numpy_helper.from_array(np.array([1], np.int64), one_1))
            inits.append(numpy_helper.from_array(np.array([_INT64_MAX], np.int64), int_max_1))
        for v in xs:
            assert v is not None
            r = fresh(f"{v.name}_row")
            nodes.append(helper.make_node("Gather", [v.name, it], [r], axis=0))
            if lens is not None:
                cut = fresh(f"{v.name}_row_steps")
                nodes.append(helper.make_node("Slice", [r, zero_1, len_1, zero_1], [cut]))
                if not steps_1:
                    row_shape, steps_1 = fresh("row_shape"), fresh("steps")
                    nodes.append(helper.make_node("Shape", [r], [row_shape]))
                    nodes.append(helper.make_node("Slice", [row_shape, zero_1, one_1, zero_1], [steps_1]))
                r = cut
            row_xs.append(r)
        finals = [fresh(f"{o.name}_row") for o in node.outputs[:n_state]]
        scans = [fresh(f"{o.name}_row") for o in node.outputs[n_state:]]
        attrs: dict[str, object] = {"body": body, "num_scan_inputs": n_scan_in}
        if any(directions):
            attrs["scan_input_directions"] = directions
        nodes.append(helper.make_node("Scan", [*row_states, *row_xs], [*finals, *scans], **attrs))
        out_scans = scans
        if lens is not None:
            pad_len = fresh("pad_steps")
            nodes.append(helper.make_node("Sub", [steps_1, len_1], [pad_len]))
            out_scans = []
            for u in scans:
                sh, z, tail, pads, padded = (
                    fresh(f"{u}_{s}") for s in ("shape", "zeros", "tail", "pads", "padded")
                )
                nodes += [
                    helper.make_node("Shape", [u], [sh]),
                    helper.make_node("Sub", [sh, sh], [z]),
                    helper.make_node("Slice", [z, one_1, int_max_1, zero_1], [tail]),
                    helper.make_node("Concat", [z, pad_len, tail], [pads], axis=0),
                    helper.make_node("Pad", [u, pads], [padded]),
                ]
                out_scans.append(padded)
        nodes.append(helper.make_node("Identity", [cond_in], [cond_out]))
        outputs = [helper.make_tensor_value_info(cond_out, onnx.TensorProto.BOOL, [])]
        for k, name in enumerate(finals):
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(body.output[k])
            vi.name = name
            outputs.append(vi)
        outputs += [_scan_output_type(body.output[n_state + k], out_scans[k]) for k in range(n_scan_out)]
        loop_body = helper.make_graph(
            nodes,
            fresh("rows"),
            [
                helper.make_tensor_value_info(it, onnx.TensorProto.INT64, []),
                helper.make_tensor_value_info(cond_in, onnx.TensorProto.BOOL, []),
            ],
            outputs,
            inits,
        )

        # the Loop takes the Scan-8's outputs; its enclosing-scope values are the
        # Scan-8's inputs and whatever the Scan-8 body read
        outer: dict[str, Value | None] = dict(zip(node.outer_names, node.inputs[n_own:]))
        for v in [lens, *states, *xs]:
            if v is not None:
                outer[v.name] = v
        index = graph.nodes.index(node)
        for i, v in enumerate(node.inputs):
            if v is not None:
                v.uses.remove((node, i))
        graph.nodes.remove(node)
        for o in node.outputs:
            o.producer = None
        loop = node_from_proto(
            helper.make_node("Loop", [batch_v.name, ""], [o.name for o in node.outputs], body=loop_body),
            [batch_v, None],
            node.outputs,
            name=node.name,
        )
        loop.inputs += list(outer.values())
        loop.outer_names = tuple(outer)
        at = graph.nodes[index] if index < len(graph.nodes) else None
        graph.add_node(shape_node, before=at)
        graph.add_node(gather_node, before=at)
        graph.add_node(loop, before=at)
        rebind_outer_values(loop)
