"""Channels-last regions: integer convolutions and pools exchange NHWC tensors directly.

An NCHW model lowered to QOperator form runs every QLinearConv on NCHW data; the native
kernel computes in NHWC (channels are the GEMM's K), so each call would transpose its
input and its output. This pass does what ONNX Runtime's NhwcTransformer does, on the
graph where every step is visible (``quanta inspect --lowered`` prints the result)::

    %y = QLinearConv(%x, ...)                      (x: N x C x H x W)
      -> %x_nhwc = Transpose(%x) {perm=[0, 2, 3, 1]}
         %y_nhwc = com.microsoft::QLinearConv(%x_nhwc, ...) {channels_last=1}
         %y      = Transpose(%y_nhwc) {perm=[0, 3, 1, 2]}   (only for NCHW consumers)

and grows the region over the operators that do not care about the layout, so that
inside a region no Transpose is left and conversions sit only at its edges (the graph's
inputs and outputs, and float islands or operators without a channels-last form):

- *channels-last operators* (always in a region, rank 3 or 4): ai.onnx ``QLinearConv``
  (-> com.microsoft ``QLinearConv`` with ``channels_last=1``, w and the parameters
  unchanged), quanta ``MlasQLinearConv`` (ONNX Runtime's saturating u8·s8 QLinearConv on
  a file ORT's quantizer wrote: ``channels_last=1``, as ORT's NhwcTransformer keeps its
  QLinearConv chain NHWC), com.microsoft ``QLinearGlobalAveragePool`` and
  ``QLinearAveragePool`` (their own ``channels_last`` attribute);
- ai.onnx ``MaxPool`` on 8-bit data of rank 4 without the Indices output (-> com.microsoft
  ``NhwcMaxPool``, ONNX Runtime's channels-last quantized MaxPool), joined like a
  layout-agnostic operator: when its input comes from a region (a ResNet stem's pool
  between two convolutions; a lone MaxPool is not worth two Transposes);
- ai.onnx ``Pad`` with constant pads and no ``axes`` input, joined like a layout-agnostic
  operator, its pads permuted with the layout (any mode: each output element is the same
  input element or the fill; open_nsfw's edge pad between its stem and its max pool);
- *layout-agnostic operators* (joined when one of their layout inputs comes from a
  region): com.microsoft ``QLinearAdd`` / ``QLinearMul`` (elementwise with numpy
  broadcasting), ``QLinearSigmoid``, ``QLinearLeakyRelu``, quanta ``QLinearLookup``, ``Relu``, ``Clip``, and
  ``QLinearConcat`` (its ``axis`` renumbered). Their other layout inputs must be region
  values or constants (a constant is permuted, after its broadcast rank is made
  explicit; exact: the same elements meet the same elements).

Exactness: a Transpose moves bytes; the channels-last operators compute each output
element from the same input elements with the same arithmetic (the reference twins move
the channel axis and call the NCHW implementation), so the graph's outputs are
bit-identical before and after the pass.

Refusals (the node stays NCHW, recorded in :attr:`ChannelsLast.refused`): a
QLinearConv or MlasQLinearConv that would be a region alone (no region value in or out: its kernel moves
the channels-first input to NHWC and back itself, the same copies as the two Transposes
without their two steps); a rank other than 3 or 4 or unknown; a per-axis quantized layout value (its axis would move); an
agnostic operator whose other layout input is neither a region value nor a constant.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.ir.types import QuantType, TensorType
from quanta.passes.manager import Pass, PassResult
from quanta.passes.rules.sink_transposes import permuted_const

__all__ = ["ChannelsLast", "to_channels_first", "to_channels_last"]


#: (domain, op_type) -> indices of the layout inputs, for operators that always join.
_CHANNELS_LAST_OPS: dict[tuple[str, str], tuple[int, ...]] = {
    ("", "QLinearConv"): (0,),
    ("quanta", "MlasQLinearConv"): (0,),
    (MS_DOMAIN, "QLinearGlobalAveragePool"): (0,),
    (MS_DOMAIN, "QLinearAveragePool"): (0,),
}
#: the convolutions among them: refused when they would be a region alone
_CONVOLUTIONS = frozenset({"QLinearConv", "MlasQLinearConv"})
#: (domain, op_type) -> indices of the layout inputs (None: every third from 2, Concat).
_AGNOSTIC_OPS: dict[tuple[str, str], tuple[int, ...] | None] = {
    ("", "MaxPool"): (0,),  # joins as com.microsoft NhwcMaxPool (checked in _select)
    ("", "Pad"): (0,),  # its constant pads permuted with the layout (checked in _select)
    (MS_DOMAIN, "QLinearAdd"): (0, 3),
    (MS_DOMAIN, "QLinearMul"): (0, 3),
    (MS_DOMAIN, "QLinearSigmoid"): (0,),
    (MS_DOMAIN, "QLinearLeakyRelu"): (0,),
    ("quanta", "QLinearLookup"): (0,),
    ("", "Relu"): (0,),
    ("", "Clip"): (0,),
    (MS_DOMAIN, "QLinearConcat"): None,
}


def to_channels_last(rank: int) -> list[int]:
    """The perm NCHW -> NHWC (rank 4) or NCW -> NWC (rank 3)."""
    return [0, *range(2, rank), 1]


def to_channels_first(rank: int) -> list[int]:
    """The perm NHWC -> NCHW (rank 4) or NWC -> NCW (rank 3)."""
    return [0, rank - 1, *range(1, rank - 1)]


def _layout_inputs(node: Node) -> tuple[int, ...]:
    key = (node.domain, node.op_type)
    if key in _CHANNELS_LAST_OPS:
        return _CHANNELS_LAST_OPS[key]
    idx = _AGNOSTIC_OPS[key]
    if idx is None:  # QLinearConcat: Y_scale, Y_zero_point, then (x, scale, zp) triplets
        return tuple(range(2, len(node.inputs), 3))
    return tuple(i for i in idx if i < len(node.inputs) and node.inputs[i] is not None)


def _rank(v: Value | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


def _per_axis(v: Value | None) -> bool:
    return v is not None and isinstance(v.elem, QuantType) and v.elem.axis is not None


class ChannelsLast(Pass):
    """Channels-last regions around the integer convolutions (module docstring)."""

    name = "channels_last"

    def __init__(self) -> None:
        #: (node label, reason) for every candidate that stayed channels-first
        self.refused: list[tuple[str, str]] = []

    def requires(self, graph: Graph) -> None:
        del graph  # any graph: a graph without convolutions is left as is

    def call(self, graph: Graph) -> PassResult:
        self.refused = []
        region = self._without_lone_convolutions(self._select(graph))
        if not region:
            return PassResult(graph, False, {})
        self._rewrite(graph, region)
        graph.toposort()
        n_conv = sum(1 for n, _ in region.values() if n.op_type in _CONVOLUTIONS)
        n_transposes = sum(1 for n in graph.nodes if n.name.startswith("channels_last/"))
        return PassResult(
            graph, True, {"nodes": len(region), "convolutions": n_conv, "transposes": n_transposes}
        )

    # -- which nodes -------------------------------------------------------------
    def _select(self, graph: Graph) -> dict[int, tuple[Node, int]]:
        """id(node) -> (node, rank) for every node that computes channels-last."""
        region: dict[int, tuple[Node, int]] = {}
        produced: dict[int, int] = {}  # id(value) -> rank, values computed channels-last
        for node in graph.nodes:  # topological: producers first
            key = (node.domain, node.op_type)
            if key in _CHANNELS_LAST_OPS:
                if node.attrs.get("channels_last"):
                    continue
                x = node.input(0)
                rank = produced.get(id(x), _rank(x))
                if rank not in (3, 4):
                    self.refused.append((node.label, f"input rank {rank}: channels-last takes rank 3 or 4"))
                    continue
                if _per_axis(x) or _per_axis(node.outputs[0]):
                    self.refused.append(
                        (node.label, "a per-axis quantized input or output (the axis would move)")
                    )
                    continue
            elif key in _AGNOSTIC_OPS:
                if key in (("", "MaxPool"), ("", "Pad")):
                    reason = (
                        self._maxpool_refusal(node) if key == ("", "MaxPool") else self._pad_refusal(node)
                    )
                    if reason:
                        if id(node.input(0)) in produced:
                            self.refused.append((node.label, reason))
                        continue
                idx = _layout_inputs(node)
                ranks = {produced[id(node.inputs[i])] for i in idx if id(node.inputs[i]) in produced}
                if not ranks:
                    continue  # no input from a region: nothing to gain
                rank = ranks.pop()
                reason = ""
                if ranks or _rank(node.outputs[0]) not in (None, rank):
                    reason = "its inputs mix ranks"
                elif node.op_type == "Pad" and np.size(node.inputs[1].const) != 2 * rank:
                    reason = f"pads of {np.size(node.inputs[1].const)} values for rank {rank}"
                for i in idx:
                    v = node.inputs[i]
                    if reason:
                        break
                    if id(v) in produced:
                        continue
                    if not v.is_const:
                        reason = f"input {i} '{v.name}' is computed channels-first and is not a constant"
                    elif np.ndim(v.const) > rank:
                        reason = f"constant input {i} '{v.name}' has a higher rank than the output"
                if not reason and any(
                    _per_axis(v) for v in (*(node.inputs[i] for i in idx), node.outputs[0])
                ):
                    reason = "a per-axis quantized input or output (the axis would move)"
                if reason:
                    self.refused.append((node.label, reason))
                    continue
            else:
                continue
            region[id(node)] = (node, rank)
            produced[id(node.outputs[0])] = rank
        return region

    def _without_lone_convolutions(self, region: dict[int, tuple[Node, int]]) -> dict[int, tuple[Node, int]]:
        """``region`` less the QLinearConvs that would be a region alone (no region
        value in, none out): the kernel moves a channels-first input to NHWC and back
        itself, the same copies as the two Transposes, without their two steps (a
        streaming model's 1x1 convolutions on 33 pixels)."""
        linked: set[int] = set()
        for k, (node, _) in region.items():
            for v in node.inputs:
                if v is not None and v.producer is not None and id(v.producer) in region:
                    linked.update((k, id(v.producer)))
        lone = {k for k, (node, _) in region.items() if k not in linked and node.op_type in _CONVOLUTIONS}
        for k in lone:
            self.refused.append(
                (region[k][0].label, "a lone convolution: its kernel transposes, no Transpose steps")
            )
        return {k: v for k, v in region.items() if k not in lone}

    # -- the rewrite --------------------------------------------------------------
    def _rewrite(self, graph: Graph, region: dict[int, tuple[Node, int]]) -> None:
        with graph.naming():  # one set of taken names, not every name per new value
            self._rewrite_region(graph, region)

    def _rewrite_region(self, graph: Graph, region: dict[int, tuple[Node, int]]) -> None:
        twin: dict[int, Value] = {}  # id(NCHW value) -> its NHWC value
        originals: list[tuple[Value, Value, int]] = []  # (NCHW value, NHWC twin, rank)
        for node, rank in list(region.values()):
            fwd = to_channels_last(rank)
            for i in _layout_inputs(node):
                v = node.inputs[i]
                if id(v) not in twin:
                    if v.is_const:
                        twin[id(v)] = permuted_const(graph, v, to_channels_last(rank), "nhwc")
                    else:  # a channels-first value entering the region
                        twin[id(v)] = self._transpose(graph, v, fwd, before=node, suffix="nhwc")
                node.replace_input(i, twin[id(v)])
            if node.op_type == "Pad":  # [begins, ends] per axis, in the layout's axis order
                pads = node.inputs[1]
                a = np.asarray(pads.const).reshape(2, rank)[:, fwd].reshape(-1)
                c = graph.add_initializer(graph.fresh_name(f"{pads.name}_nhwc"), np.ascontiguousarray(a))
                if pads.type is not None:
                    c.type = TensorType(pads.elem, (2 * rank,))
                node.replace_input(1, c)
            out = node.outputs[0]
            shape = None if out.shape is None else tuple(out.shape[p] for p in fwd)
            t = Value(graph.fresh_name(f"{out.name}_nhwc"), TensorType(out.elem, shape) if out.type else None)
            out.producer = None
            node.outputs[0] = t
            t.producer = node
            twin[id(out)] = t
            originals.append((out, t, rank))
            self._retarget(node, rank)
        # Region values still read channels-first (consumers outside, graph outputs)
        # get one Transpose back, which takes over the original value (and its name).
        for out, t, rank in originals:
            is_output = any(o is out for o in graph.outputs)
            if out.uses or is_output:
                node = Node(
                    "Transpose",
                    [t],
                    [out],
                    {"perm": to_channels_first(rank)},
                    name=graph.fresh_name(f"channels_last/{out.name}_nchw"),
                )
                graph.add_node(node)

    @staticmethod
    def _pad_refusal(node: Node) -> str:
        pads = node.input(1)
        if pads is None or not pads.is_const:
            return "Pad without constant pads (or with pads as attributes, before opset 11)"
        if node.input(3) is not None:
            return "Pad with an axes input"
        return ""

    @staticmethod
    def _maxpool_refusal(node: Node) -> str:
        x = node.input(0)
        storage = None
        if x is not None and x.elem is not None:
            storage = str(x.elem.storage) if isinstance(x.elem, QuantType) else str(x.elem)
        if storage not in ("u8", "i8"):
            return f"MaxPool on {storage or 'unknown'} data (NhwcMaxPool takes uint8/int8)"
        if len(node.outputs) > 1 and (node.outputs[1].uses or node.outputs[1].name):
            return "MaxPool with its Indices output"
        ks = node.attrs.get("kernel_shape")
        if ks is None or len(ks) != 2 or int(node.attrs.get("storage_order", 0)):
            return "MaxPool other than 2-D windows in row-major storage order"
        return ""

    @staticmethod
    def _retarget(node: Node, rank: int) -> None:
        if node.op_type == "MaxPool":
            node.op_type = "NhwcMaxPool"
            node.domain = MS_DOMAIN
            node.attrs.pop("storage_order", None)
            node.attr_types.pop("storage_order", None)
            return
        if node.op_type == "QLinearConv":
            node.domain = MS_DOMAIN
            node.attrs["channels_last"] = 1
        elif node.op_type in ("MlasQLinearConv", "QLinearGlobalAveragePool", "QLinearAveragePool"):
            node.attrs["channels_last"] = 1
        elif node.op_type == "QLinearConcat" or (node.op_type == "QLinearLookup" and "axis" in node.attrs):
            # the concat axis, a per-channel table's axis: where that axis went
            axis = int(node.attrs.get("axis", 1))
            axis = axis + rank if axis < 0 else axis
            node.attrs["axis"] = to_channels_last(rank).index(axis)

    @staticmethod
    def _transpose(graph: Graph, v: Value, perm: list[int], *, before: Node, suffix: str) -> Value:
        shape = None if v.shape is None else tuple(v.shape[p] for p in perm)
        t = Value(graph.fresh_name(f"{v.name}_{suffix}"), TensorType(v.elem, shape) if v.type else None)
        graph.add_node(
            Node(
                "Transpose",
                [v],
                [t],
                {"perm": list(perm)},
                name=graph.fresh_name(f"channels_last/{v.name}_{suffix}"),
            ),
            before=before,
        )
        return t
