"""Transposes move down through elementwise operators until they meet their inverse
(SinkTransposes), as ONNX Runtime's transpose optimizer does for a graph converted from
TensorFlow::

    %a = Transpose(%c) {perm=[0, 2, 3, 1]}         the NCHW Conv's output, to NHWC
    %b = Add(Mul(Sub(%a, m), g), b)                  per-channel constants [C] on the last axis
    %r = Relu(%b)
    %x = Transpose(%r) {perm=[0, 3, 1, 2]}         back to NCHW for the next Conv
      -> %r' = Relu(Add(Mul(Sub(%c, m'), g'), b'))   m', g', b': [1, C, 1, 1]
         %x  = %r'

tf2onnx and TF-to-torch re-exports (open_nsfw: 110 Transposes, one pair around every
Conv) write every convolution between two Transposes and the BatchNormalization,
bias and activation between them in NHWC. Sunk and cancelled, the Conv's affine
epilogue and activation sit right after the Conv, where FoldConvAffine and the fused
activation take them, and no Transpose is left but at the graph's edges.

Rules, applied in graph order until nothing changes (each exact: a Transpose only moves
bytes, and an elementwise operator computes each element from the same elements)::

    U(Transpose(x, p))                      -> Transpose(U(x), p)        U unary elementwise
    B(Transpose(x, p), Transpose(y, p), c)  -> Transpose(B(x, y, c'), p) B elementwise (n-ary)
    Reduce(Transpose(x, p), axes)           -> Transpose(Reduce(x, p[axes]), p)        keepdims=1
                                            -> Reduce(x, p[axes])   keepdims=0, the kept
                                               axes in x's order (NHWC's mean over H, W)
    Transpose(Pad(x, pads), p)              -> Pad(Transpose(x, p), pads')   constant pads
    Transpose(Transpose(x, p), q)           -> Transpose(x, p∘q), or x when p∘q is the identity
    Shape(Transpose(x, p))                  -> Gather(Shape(x), p)   (the Transpose read by Shapes only)
    Squeeze(Transpose(x, p), axes)          -> Transpose(Squeeze(x, p[axes]), p')
    Unsqueeze(Transpose(x, p), axes)        -> Transpose(Unsqueeze(x, axes), p'')
    U(Squeeze(x, axes))                     -> Squeeze(U(x), axes)       U unary elementwise
    Unsqueeze(Squeeze(x, axes), axes)       -> x    (the same axes of x's rank)

with ``y.shape[i] = x.shape[p[i]]`` for ``y = Transpose(x, p)``. A Squeeze or Unsqueeze
only drops or adds axes of size 1, so it commutes with a Transpose whose perm is
re-indexed to the new rank: p' is p without the removed axes, each kept axis j of x
renumbered to j minus the removed axes below it; p'' keeps the new axes at their
positions (both outputs have them at the same places) and sends x's other axes where p
sends them, counted among the positions that are not new. A TF Conv1D export (madmom's
TCN, onsets CNN) writes ``Conv -> T(0,2,3,1) -> Squeeze(0) -> Elu -> Unsqueeze(0) ->
T(0,3,1,2) -> MaxPool``: the first Transpose sinks through all three and cancels the
second. A perm that then only moved axes of size 1 out of the way is the identity, and
no Transpose follows. The Squeeze then sinks below the Elu (read by it alone) and meets
its Unsqueeze: the Conv, Elu and MaxPool read each other's 4-D tensors, and the blocked
layout (passes/lower/nchwc.py) takes all three into one region. A constant operand of
rank <= R is given its leading 1s and permuted by the inverse perm (c'); an operand whose
every dimension is 1 broadcasts alike in both layouts and stays. A move happens only
when the Transposes it reads are read by nothing else (their count never grows), and
every computed operand is such a Transpose with the same perm or an all-ones operand.
A Pad moves the other way (its Transpose goes above it, when the Pad is read by that
Transpose alone), so that a TF "same" padding written as a Pad in NHWC ends up right
before its Conv or pool in NCHW, where FoldPad takes it into the node's pads; the two
directions never meet (no sinking through a Pad), so the rules terminate.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.types import TensorType
from quanta.passes.manager import Pass, PassResult

__all__ = ["SinkTransposes", "permuted_const"]

#: elementwise operators of one data input (the others, if any, are scalars: Clip's bounds)
UNARY = frozenset(
    {
        "Abs", "Cast", "Ceil", "Celu", "Clip", "Cos", "Elu", "Erf", "Exp", "Floor", "Gelu",
        "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Log", "Mish",
        "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin",
        "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
    }
)  # fmt: skip
#: reductions over ``axes`` (an attribute, or input 1 from the opsets that made it one)
REDUCE = frozenset(
    {
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
    }
)  # fmt: skip
#: elementwise operators over all their inputs (numpy broadcasting)
NARY = frozenset(
    {
        "Add", "And", "BitShift", "Div", "Equal", "Greater", "GreaterOrEqual", "Less",
        "LessOrEqual", "Max", "Mean", "Min", "Mod", "Mul", "Or", "Pow", "PRelu", "Sub", "Sum",
        "Where", "Xor",
    }
)  # fmt: skip


def _perm(node: Node) -> list[int] | None:
    """The explicit perm of a Transpose (None: reversed axes of an unknown rank)."""
    p = node.attrs.get("perm")
    if p is None:
        x = node.input(0)
        if x is None or x.shape is None:
            return None
        return list(range(len(x.shape)))[::-1]
    return [int(i) for i in p]


def _inverse(p: list[int]) -> list[int]:
    inv = [0] * len(p)
    for i, j in enumerate(p):
        inv[j] = i
    return inv


def _transposed(v: Value | None) -> tuple[Node, list[int]] | None:
    """``(node, perm)`` when ``v`` is the output of a plain ai.onnx Transpose."""
    if v is None or v.producer is None:
        return None
    n = v.producer
    if n.op_type != "Transpose" or n.domain not in ("", "ai.onnx"):
        return None
    p = _perm(n)
    return None if p is None else (n, p)


def _raw_axes(node: Node) -> list[int] | None:
    """A Reduce's, Squeeze's or Unsqueeze's axes as written: its ``axes`` attribute (the
    opsets before they became input 1) or its constant input 1; None when computed or
    absent."""
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    v = node.input(1)
    if v is None or not v.is_const:
        return None
    return [int(a) for a in np.asarray(v.const).reshape(-1)]


def _set_axes(graph: Graph, node: Node, axes: list[int]) -> None:
    """Gives ``node`` the ``axes`` in the form it had them (attribute or constant input)."""
    if "axes" in node.attrs:
        node.attrs["axes"] = axes
        return
    old = node.input(1)
    c = graph.add_initializer(graph.fresh_name(f"{old.name}_t"), np.asarray(axes, np.int64))
    node.replace_input(1, c)


def _read_only_by(graph: Graph, v: Value, node: Node) -> bool:
    """``v`` is read by ``node`` alone and is not a graph output (it may be rewritten)."""
    return all(c is node for c in v.consumers()) and not any(o is v for o in graph.outputs)


def _view_axes(node: Node, rank: int | None) -> list[int] | None:
    """A Squeeze's / Unsqueeze's axes (an attribute before opset 13, a constant input
    after), sorted and taken modulo ``rank`` when given; None when not known."""
    raw = _raw_axes(node)
    if raw is None:
        return None
    if rank is None:
        return sorted(raw) if raw else None
    axes = sorted({a % rank for a in raw})
    return axes if raw and len(axes) == len(raw) else None


def _all_ones(v: Value, rank: int) -> bool:
    return v.shape is not None and len(v.shape) <= rank and all(d == 1 for d in v.shape)


def permuted_const(graph: Graph, v: Value, perm: list[int], suffix: str) -> Value:
    """A new initializer: the constant ``v`` with its leading 1s made explicit (numpy
    broadcasting aligns trailing axes) and transposed by ``perm``; its element type kept."""
    rank = len(perm)
    a = np.asarray(v.const)
    a = np.ascontiguousarray(np.transpose(a.reshape((1,) * (rank - a.ndim) + a.shape), perm))
    c = graph.add_initializer(graph.fresh_name(f"{v.name}_{suffix}"), a)
    elem = v.elem if v.type is not None else None
    if elem is not None:
        c.type = TensorType(elem, tuple(a.shape))
    return c


def _transpose_after(graph: Graph, node: Node, p: list[int]) -> None:
    """``node`` now computes in the layout before Transpose(p): its output becomes a new
    value, and a Transpose(p) after it takes over the old one (and its name, its readers)."""
    out = node.outputs[0]
    inv = _inverse(p)
    shape = None if out.shape is None else tuple(out.shape[inv[j]] for j in range(len(p)))
    t = Value(graph.fresh_name(f"{out.name}_t"), TensorType(out.elem, shape) if out.type else None)
    out.producer = None
    node.outputs[0] = t
    t.producer = node
    graph.add_node(
        Node("Transpose", [t], [out], {"perm": p}, name=graph.fresh_name(f"sink_transposes/{out.name}")),
    )


class SinkTransposes(Pass):
    """The rules of the module docstring, to a fixed point."""

    name = "sink_transposes"

    def call(self, graph: Graph) -> PassResult:
        moved = cancelled = 0
        changed = True
        while changed:
            changed = False
            # a rule removes or moves only the node it is called on: the snapshot stays valid
            for node in list(graph.nodes):
                if node.op_type == "Transpose" and not node.domain and self._compose(graph, node):
                    cancelled += 1
                    changed = True
                elif node.op_type == "Transpose" and not node.domain and self._hoist_over_pad(graph, node):
                    moved += 1
                    changed = True
                elif node.domain in ("", "ai.onnx") and self._sink(graph, node):
                    moved += 1
                    changed = True
                elif (
                    not node.domain
                    and node.op_type == "Unsqueeze"
                    and self._unsqueeze_of_squeeze(graph, node)
                ):
                    cancelled += 1
                    changed = True
                elif not node.domain and node.op_type in UNARY and self._sink_squeeze(graph, node):
                    moved += 1
                    changed = True
            if changed:  # a Transpose left unread would count as a reader in the next round
                self._remove_dead_transposes(graph)
        if moved or cancelled:
            self._remove_dead_transposes(graph)
            graph.toposort()
        return PassResult(graph, bool(moved or cancelled), {"moved": moved, "cancelled": cancelled})

    # -- Transpose(Transpose(x, p), q) ------------------------------------------------
    def _compose(self, graph: Graph, node: Node) -> bool:
        inner = _transposed(node.input(0))
        q = _perm(node)
        if inner is None or q is None:
            return False
        first, p = inner
        if len(p) != len(q):
            return False
        r = [p[i] for i in q]
        x = first.inputs[0]
        y = node.outputs[0]
        if r == list(range(len(r))) and not any(o is y for o in graph.outputs):
            graph.replace_all_uses(y, x)
            graph.remove_node(node)
        else:
            node.replace_input(0, x)
            node.attrs["perm"] = r
        return True

    # -- an operator that reads Transposes -------------------------------------------
    def _sink(self, graph: Graph, node: Node) -> bool:
        op = node.op_type
        if len(node.outputs) != 1 or node.outputs[0] is None:
            return False
        if op == "Shape":
            return self._shape(graph, node)
        if op in REDUCE:
            return self._reduce(graph, node)
        if op in ("Squeeze", "Unsqueeze"):
            return self._squeeze(graph, node)
        if op in UNARY:
            data = [0]
            for v in node.inputs[1:]:
                if (
                    v is not None
                    and not _all_ones(v, 0)
                    and not (v.is_const and np.asarray(v.const).size == 1)
                ):
                    return False
        elif op in NARY:
            data = [i for i, v in enumerate(node.inputs) if v is not None]
        else:
            return False
        found = [_transposed(node.inputs[i]) for i in data]
        perms = {tuple(f[1]) for f in found if f is not None}
        if len(perms) != 1:
            return False
        p = list(perms.pop())
        rank = len(p)
        out = node.outputs[0]
        if out.shape is not None and len(out.shape) != rank:
            return False
        # the Transposes read here must be read by nothing else (their count never grows)
        producers = {id(f[0]): f[0] for f in found if f is not None}
        if not all(_read_only_by(graph, t.outputs[0], node) for t in producers.values()):
            return False
        inv = _inverse(p)
        new_inputs: dict[int, Value] = {}
        for i, f in zip(data, found, strict=True):
            v = node.inputs[i]
            if f is not None:
                new_inputs[i] = f[0].inputs[0]
            elif v.is_const:
                if np.ndim(v.const) > rank:
                    return False
                new_inputs[i] = permuted_const(graph, v, inv, "t")
            elif not _all_ones(v, rank):
                return False
        for i, v in new_inputs.items():
            node.replace_input(i, v)
        _transpose_after(graph, node, p)
        return True

    def _hoist_over_pad(self, graph: Graph, node: Node) -> bool:
        """Transpose(Pad(x, pads), p) -> Pad(Transpose(x, p), pads'), the Pad read by the
        Transpose alone."""
        pad = node.input(0).producer if node.input(0) is not None else None
        p = _perm(node)
        if pad is None or pad.op_type != "Pad" or pad.domain or p is None:
            return False
        pv, mid = pad.outputs[0], pad.inputs[0]
        if not _read_only_by(graph, pv, node):
            return False
        if len(pad.inputs) > 3 and pad.inputs[3] is not None:
            return False  # an axes input
        pads_v = pad.input(1)
        if pads_v is None or not pads_v.is_const or "pads" in pad.attrs or mid is None:
            return False
        pads = np.asarray(pads_v.const, np.int64).reshape(-1)
        r = len(p)
        if pads.size != 2 * r:
            return False
        new = np.zeros(2 * r, np.int64)
        for i, j in enumerate(p):  # axis i of the Transpose's output is axis p[i] of x
            new[i], new[r + i] = pads[j], pads[r + j]
        y = node.outputs[0]
        shape = None if mid.shape is None else tuple(mid.shape[j] for j in p)
        t = Value(graph.fresh_name(f"{mid.name}_t"), TensorType(mid.elem, shape) if mid.type else None)
        # the Transpose now reads x and writes t; the Pad reads t and writes y
        node.replace_input(0, mid)
        y.producer = None
        node.outputs[0] = t
        t.producer = node
        pad.replace_input(0, t)
        pad.replace_input(1, graph.add_initializer(graph.fresh_name(f"{pad.name or 'pad'}_pads_t"), new))
        pv.producer = None
        pad.outputs[0] = y
        y.producer = pad
        graph.nodes.remove(pad)
        graph.nodes.insert(graph.nodes.index(node) + 1, pad)
        return True

    @staticmethod
    def _reduce(graph: Graph, node: Node) -> bool:
        f = _transposed(node.input(0))
        if f is None:
            return False
        t, p = f
        r = len(p)
        if not _read_only_by(graph, t.outputs[0], node):
            return False
        raw = _raw_axes(node)
        if raw is None:
            return False  # no axes: every axis (or none), a case left as written
        axes = sorted({a % r for a in raw})
        if not axes or int(node.attrs.get("noop_with_empty_axes", 0)):
            return False
        new_axes = sorted(p[a] for a in axes)
        keep = int(node.attrs.get("keepdims", 1))
        kept = [p[i] for i in range(r) if i not in axes]
        if not keep and kept != sorted(kept):
            return False  # the kept axes would come out in another order
        node.replace_input(0, t.inputs[0])
        _set_axes(graph, node, new_axes)
        if keep:
            _transpose_after(graph, node, p)
        # keepdims=0: the same shape and element order, nothing after it
        return True

    @staticmethod
    def _squeeze(graph: Graph, node: Node) -> bool:
        """Squeeze(Transpose(x, p), axes) -> Transpose(Squeeze(x, p[axes]), p') and
        Unsqueeze(Transpose(x, p), axes) -> Transpose(Unsqueeze(x, axes), p'') (module
        docstring): the axes an attribute (before opset 13) or a constant input 1, as the
        node has them."""
        f = _transposed(node.input(0))
        if f is None:
            return False
        t, p = f
        r = len(p)
        if not _read_only_by(graph, t.outputs[0], node):
            return False
        raw = _raw_axes(node)
        if raw is None:
            return False  # a Squeeze of every 1 (which ones needs the shape) or computed axes
        squeeze = node.op_type == "Squeeze"
        out_rank = r - len(raw) if squeeze else r + len(raw)
        axes = sorted({a % (r if squeeze else out_rank) for a in raw})
        if not axes or len(axes) != len(raw):
            return False
        if squeeze:
            gone = sorted(p[a] for a in axes)  # x's axes the Squeeze removes
            kept = [p[i] for i in range(r) if i not in axes]
            new_axes = gone
            # x's kept axis j is axis j − #{removed axes below j} of the squeezed x
            q = [j - sum(g < j for g in gone) for j in kept]
        else:
            # the new axes of size 1 at the same positions of both outputs; x's axis j at
            # the j-th position that is not new, and the Transpose keeps the new ones in place
            new_axes = axes
            old_pos = [i for i in range(out_rank) if i not in axes]
            q = [0] * out_rank
            for a in axes:
                q[a] = a
            for k, i in enumerate(old_pos):
                q[i] = old_pos[p[k]]
        node.replace_input(0, t.inputs[0])
        _set_axes(graph, node, new_axes)
        if q == list(range(len(q))):
            return True  # the Transpose only moved axes of size 1 (one no longer there)
        _transpose_after(graph, node, q)
        return True

    @staticmethod
    def _sink_squeeze(graph: Graph, node: Node) -> bool:
        """U(Squeeze(x, axes)) -> Squeeze(U(x), axes), U unary elementwise, the Squeeze read
        by U alone: so that an Unsqueeze of the same axes after U meets it."""
        v = node.input(0)
        sq = v.producer if v is not None else None
        if sq is None or sq.op_type != "Squeeze" or sq.domain or len(node.outputs) != 1:
            return False
        if not _read_only_by(graph, v, node):
            return False
        if _view_axes(sq, None) is None:
            return False
        for extra in node.inputs[1:]:  # Clip's bounds: scalars, whatever the rank
            if extra is not None and not (extra.is_const and np.asarray(extra.const).size == 1):
                return False
        x, out = sq.inputs[0], node.outputs[0]
        t = Value(graph.fresh_name(f"{out.name}_unsq"), TensorType(out.elem, x.shape) if out.type else None)
        node.replace_input(0, x)
        out.producer = None
        node.outputs[0] = t
        t.producer = node
        graph.add_node(
            Node(
                "Squeeze",
                [t, *sq.inputs[1:]],
                [out],
                dict(sq.attrs),
                name=graph.fresh_name(f"{sq.name or 'sq'}_s"),
            )
        )
        graph.remove_node(sq)
        return True

    @staticmethod
    def _unsqueeze_of_squeeze(graph: Graph, node: Node) -> bool:
        """Unsqueeze(Squeeze(x, axes), axes) -> x: the same axes of x's rank, removed and
        put back as the same 1s."""
        v = node.input(0)
        sq = v.producer if v is not None else None
        if sq is None or sq.op_type != "Squeeze" or sq.domain:
            return False
        x, y = sq.inputs[0], node.outputs[0]
        if x is None or x.shape is None or any(o is y for o in graph.outputs):
            return False
        r = len(x.shape)
        a, b = _view_axes(sq, r), _view_axes(node, r)
        if a is None or a != b:
            return False
        graph.replace_all_uses(y, x)
        graph.remove_node(node)
        return True

    @staticmethod
    def _shape(graph: Graph, node: Node) -> bool:
        f = _transposed(node.input(0))
        if f is None or "start" in node.attrs or "end" in node.attrs:
            return False
        t, p = f
        if any(c.op_type != "Shape" for c in t.outputs[0].consumers()):
            return False  # the Transpose stays for its other readers: a Gather more, none less
        x = t.inputs[0]
        out = node.outputs[0]
        s = Value(graph.fresh_name(f"{out.name}_pre"), TensorType(out.elem, (len(p),)) if out.type else None)
        graph.add_node(
            Node("Shape", [x], [s], {}, name=graph.fresh_name(f"{node.name or 'shape'}_pre")), before=node
        )
        idx = graph.add_initializer(graph.fresh_name(f"{node.name or 'shape'}_perm"), np.asarray(p, np.int64))
        node.op_type = "Gather"
        node.replace_input(0, s)
        node.inputs.append(None)
        node.replace_input(1, idx)
        node.attrs = {"axis": 0}
        node.attr_types = {}
        return True

    @staticmethod
    def _remove_dead_transposes(graph: Graph) -> None:
        for node in reversed(list(graph.nodes)):
            out = node.outputs[0] if node.outputs else None
            if (
                node.op_type == "Transpose"
                and out is not None
                and not out.uses
                and not any(o is out for o in graph.outputs)
            ):
                graph.remove_node(node)
