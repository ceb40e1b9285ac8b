"""Plan which tensors to quantize, then insert QuantizeLinear / DequantizeLinear pairs.

The plan is tensor-centric (as ONNX Runtime's QDQ quantizer): each quantizable node asks
for some of its inputs and outputs to be quantized; a tensor that any node asks for gets
*one* Q -> DQ pair right after its producer, and every consumer reads the DQ output.

Roles of a node's operands (``OP_ROLES``):

- activations: calibrated ranges -> per-tensor parameters (recipe's activation type);
- weights: constant, quantized from their own values, per output channel when the
  recipe says so (Conv: axis 0, ConvTranspose: axis 1, MatMul B: last axis, Gemm B:
  axis 0 with transB=1 else 1);
- bias: int32 with scale ``sx·sw`` (quanta.quantize.params.bias_params), after the
  weight scale was raised where the bias needs it (adjust_weight_scale_for_bias);
- views (Reshape, Transpose, Flatten, Squeeze/Unsqueeze, Slice, Split, Gather's data,
  MaxPool) and Pad: the output keeps the input's type (no range of its own), and the
  input is quantized whenever the view is (a graph input or a float op's output gets its
  own range), so a view never leaves the compute op it feeds float. Pad is neutral in
  the same way: ``Q(Pad(DQ(q), v)) = Pad(q, Q(v))``, an integer Pad whose padded cells
  hold ``Q(v)`` (the zero point for the usual v = 0, which every activation range
  contains; a v off the grid is rounded and saturated, as ONNX Runtime's QDQ quantizer
  does). Only a Pad whose value is omitted or a constant is neutral;
- Relu / Clip: absorbed — the producer's output is not quantized when its only consumers
  are quantized Relu/Clip nodes, whose outputs carry the (clipped) range instead;
- Concat: an input consumed by nothing else takes the output's parameters, so the
  concatenation needs no requantization;
- gated activations ``Mul(x, g(x))`` (``GATES``: SiLU's Sigmoid, hardswish's HardSigmoid
  before opset 14, Mish's Tanh of Softplus): one function of ``x``, planned as a unary op
  on ``x``: ``x`` and the Mul's output are quantized, the gate's nodes stay float inside
  the group, and lowering turns the group into one 256-entry table
  (passes/lower/lookup.py). Quantizing the gate's output as well would round it, then
  the product, and leave two integer ops where one table does.

Tensors that are not float, whose range is degenerate (NaN, +-inf, |x| >= 1e9 masks, all
zero), that are computed from input shapes and constants alone (a table fixed per shape,
``shape_only_values``) or that the recipe excludes stay float; the nodes that needed them stay float too
and the summary says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from quanta.calibrate.observer import is_degenerate
from quanta.ir.graph import Graph, Node, Value
from quanta.ir.op_facts import QdqRole, derive
from quanta.ir.types import F32, CalibratedType, FloatType, IntType, QuantType, TensorType
from quanta.kernels.reference.conv_geometry import is_depthwise
from quanta.kernels.reference.quantize import expand_param, quantize_linear
from quanta.kernels.reference.requant import storage_range
from quanta.quantize.params import adjust_weight_scale_for_bias, bias_params, params_from_range, quantize_bias
from quanta.quantize.recipe import Recipe, storage_from_name

__all__ = [
    "GATES",
    "NodeDecision",
    "QdqPlan",
    "TensorPlan",
    "consumer_channel_weights",
    "gated_activation",
    "insert_qdq",
    "plan_qdq",
]

# how the plan treats each op (quanta.ir.op_facts, column qdq)
VIEW_OPS = derive("quanta.quantize.qdq.VIEW_OPS", lambda t: t.ops_where(qdq=QdqRole.VIEW))
ABSORBING_ACTIVATIONS = derive(
    "quanta.quantize.qdq.ABSORBING_ACTIVATIONS", lambda t: t.ops_where(qdq=QdqRole.ABSORB)
)
OUTPUT_ONLY_OPS = derive(
    "quanta.quantize.qdq.OUTPUT_ONLY_OPS",
    lambda t: t.ops_where(qdq=QdqRole.ABSORB) | t.ops_where(qdq=QdqRole.OUTPUT),
)
UNARY_QUANT_OPS = derive("quanta.quantize.qdq.UNARY_QUANT_OPS", lambda t: t.ops_where(qdq=QdqRole.UNARY))
NARY_QUANT_OPS = derive("quanta.quantize.qdq.NARY_QUANT_OPS", lambda t: t.ops_where(qdq=QdqRole.NARY))
MAC_OPS = derive("quanta.quantize.qdq.MAC_OPS", lambda t: t.ops_where(qdq=QdqRole.MAC))


#: gates g(x) whose product ``Mul(x, g(x))`` the plan treats as one function of x, each a
#: chain of ops from the Mul's input outwards (SiLU, hardswish before opset 14, Mish)
#: Ops an integer-only recipe (a device target) plans as unary on input 0: Softmax reads
#: its input quantized (an integer softmax), LayerNormalization too (its scale and bias stay
#: float constants, folded into integers by the lowering), a division by a constant is a
#: table
INTEGER_ONLY_UNARY = frozenset({"Softmax", "LayerNormalization", "Div"})

GATES: tuple[tuple[str, ...], ...] = (("Sigmoid",), ("HardSigmoid",), ("Tanh", "Softplus"))


def gated_activation(node: Node, graph: Graph) -> tuple[int, list[Node]] | None:
    """For ``node = Mul(x, g(x))`` with ``g`` one of :data:`GATES` whose values are used only
    on the way to the Mul: (the index of ``x`` among the Mul's inputs, g's nodes); else None."""
    if node.op_type != "Mul" or node.domain or len(node.inputs) != 2:
        return None
    outputs = {id(v) for v in graph.outputs}
    for xi in (0, 1):
        x, g = node.inputs[xi], node.inputs[1 - xi]
        if x is None or g is None or x is g:
            continue
        for chain in GATES:
            nodes: list[Node] = []
            v = g
            for op in chain:
                p = v.producer
                if p is None or p.domain or p.op_type != op or len(v.uses) != 1 or id(v) in outputs:
                    break
                nodes.append(p)
                v = p.inputs[0]
            else:
                if v is x:
                    return xi, nodes
    return None


@dataclass
class TensorPlan:
    """What happens to one tensor."""

    name: str
    role: str  # "activation" | "weight" | "bias"
    storage: IntType
    symmetric: bool
    axis: int | None = None
    inherit_from: str | None = None  # a view's output: the input's type
    share_with: str | None = None  # a Concat input: the Concat output's type
    bias_of: tuple[str, str] | None = None  # (x, w) of a bias
    qtype: QuantType | None = None
    float_reason: str | None = None
    fixed_range: tuple[float, float] | None = None
    block: int | None = None  # per-block weights: block size along ``axis``
    values: np.ndarray | None = None  # replaces the constant's values (a corrected bias)
    codes: np.ndarray | None = None  # a weight's integers chosen beforehand (quanta.quantize.rounding)
    # a depthwise Conv's weight: ONNX Runtime's and quanta's AVX2 depthwise kernels widen its
    # taps to int16 (vpmaddwd, exact at 8 bits), so weight_bits = 7 leaves it on 8 bits
    depthwise: bool = False


@dataclass
class NodeDecision:
    node: Node
    quantize: bool
    reason: str = ""
    inputs: list[tuple[int, str]] = field(default_factory=list)  # (input index, tensor plan key)
    output: str | None = None


@dataclass
class QdqPlan:
    tensors: dict[str, TensorPlan] = field(default_factory=dict)
    decisions: list[NodeDecision] = field(default_factory=list)

    def activations_to_calibrate(self) -> list[str]:
        return [
            t.name
            for t in self.tensors.values()
            if t.role == "activation"
            and t.inherit_from is None
            and t.fixed_range is None
            and t.float_reason is None
        ]


def _is_float(v: Value | None) -> bool:
    return (
        v is not None
        and v.type is not None
        and isinstance(v.type.elem, FloatType)
        and v.type.elem.name
        in (
            "f32",
            "f16",
        )
    )


def _pad_reason(node: Node) -> str | None:
    """Why a Pad is not neutral (module docstring), or None."""
    value = node.input(2)
    if value is not None and not value.is_const:
        return "its pad value is computed at run time: the integer Pad needs Q(value) ahead of time"
    return None


def _weight_axis(node: Node, w: Value) -> int | None:
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        # w[C_i, C_o/g, ...]: axis 1 is the output channel only when g = 1; with groups,
        # output channel G·C_o/g + o shares the scale of o in every group, so one scale per
        # output channel (what the bias's sx·sw needs) does not exist: per tensor
        return 1 if int(node.attrs.get("group", 1)) == 1 else None
    if node.op_type == "Gemm":
        return 0 if node.attrs.get("transB", 0) else 1
    rank = w.const.ndim
    if rank > 2:
        # a batched weight (a grouped linear layer's [g, i, h], an Einsum made MatMul): a
        # scale per column would be shared by every batch, and neither ONNX Runtime's
        # QLinearMatMul / MatMulIntegerToFloat nor the integer MatMul takes one scale
        # vector for a rank-3 operand: per tensor, which both run
        return None
    return rank - 1  # MatMul: one scale per output column


def _key(v: Value, role: str, suffix: str = "") -> str:
    return v.name if role == "activation" else f"{v.name}{suffix}"


def _typed_by_override(v: Value, recipe: Recipe) -> bool:
    """The recipe gives ``v`` a storage type: quantized even when only float ops read it
    (a 16-bit MatMul's output: the A16W8 group is integer only with its output quantized)."""
    ov = recipe.overrides.get(v.name)
    return ov is not None and ov.dtype is not None


#: ops whose output depends on their input's shape only, not on its values
SHAPE_OPS = frozenset({"Shape", "Size"})

#: why a node computed from input shapes and constants alone stays float
SHAPE_ONLY_REASON = (
    "computed from input shapes and constants only (an index, window or DFT-basis table "
    "fixed per shape): quantizing it rounds values the graph needs exact and saves no time"
)


#: a view or Gather of a constant table at positions from the shape (a learned position
#: table sliced or gathered to the sequence's length) keeps the table's own plan: an
#: 8-bit embedding, or a view of the constant
TABLE_VIEWS = VIEW_OPS | {"Gather"}


def shape_only_values(graph: Graph) -> set[int]:
    """ids of the values of ``graph`` computed from input shapes and constants alone:
    a Shape / Size output, and the output of a node (without subgraphs) whose inputs are
    all constants or such values, at least one of them such a value. A value read from
    outside the graph (a graph input, an outer scope's value) is data. A DFT basis a
    graph builds from its input's length (Range / CumSum indices, their outer product,
    Sin / Cos of it) is one: 8-bit codes of indices up to N and angles up to N² wreck it
    (docs/passes.md, "Values fixed by shapes")."""
    fixed: set[int] = set()
    for node in graph.nodes:  # topological: a producer comes before its consumers
        if node.op_type in SHAPE_OPS:
            fixed.update(id(o) for o in node.outputs if o is not None)
            continue
        if _reads_subgraph(node):
            continue
        ins = [v for v in node.inputs if v is not None]
        if ins and all(v.is_const or id(v) in fixed for v in ins) and any(id(v) in fixed for v in ins):
            fixed.update(id(o) for o in node.outputs if o is not None)
    return fixed


def _reads_subgraph(node: Node) -> bool:
    """If / Loop / Scan: their bodies may read outer values that are no input of theirs."""
    return any(
        isinstance(v, onnx.GraphProto)
        or (isinstance(v, list) and any(isinstance(g, onnx.GraphProto) for g in v))
        for v in node.attrs.values()
    )


def plan_qdq(graph: Graph, recipe: Recipe) -> QdqPlan:
    """Decide per node and per tensor (module docstring). No graph changes."""
    plan = QdqPlan()
    act_storage = recipe.activation_storage
    w_storage = recipe.weight_storage
    output_ids = {id(v) for v in graph.outputs}
    shape_only = shape_only_values(graph)

    def want_activation(v: Value) -> str | None:
        if not _is_float(v):
            return None
        ov = recipe.overrides.get(v.name)
        if v.name not in plan.tensors:
            storage = storage_from_name(ov.dtype, v.name) if ov and ov.dtype else act_storage
            sym = ov.symmetric if ov and ov.symmetric is not None else recipe.symmetric_activations
            fixed = ov.range if ov and ov.range else None
            if fixed is None and v.is_const:
                # a constant operand (Add's bias, a normalization constant): its range is its data
                c = np.asarray(v.const, dtype=np.float64)
                fixed = (float(c.min(initial=0.0)), float(c.max(initial=0.0)))
            plan.tensors[v.name] = TensorPlan(v.name, "activation", storage, sym, fixed_range=fixed)
        return v.name

    def node_ok(node: Node) -> str | None:
        if node.op_type not in recipe.op_types:
            return f"{node.op_type} is not in the quantized op types"
        if recipe.excludes(node):
            return "excluded by the recipe"
        table = node.input(0)
        if (
            node.outputs
            and all(o is None or id(o) in shape_only for o in node.outputs)
            and any(_is_float(o) for o in node.outputs if o is not None)
            and not (node.op_type in TABLE_VIEWS and table is not None and table.is_const)
        ):
            return SHAPE_ONLY_REASON
        if node.op_type == "Pad":
            return _pad_reason(node)
        if node.op_type == "AveragePool" and any(int(d) != 1 for d in node.attrs.get("dilations", ())):
            # ONNX Runtime fuses a Q/DQ AveragePool into com.microsoft QLinearAveragePool,
            # whose schema has no dilations: its session refuses the whole file
            return "dilated: ONNX Runtime's QLinearAveragePool, which its QDQ fusion makes of it, has no dilations"
        if node.op_type == "Div":
            d = node.input(1)
            if d is None or not d.is_const or np.asarray(d.const).size != 1:
                return "the divisor is not a scalar constant (only x / c is a table)"
        return None

    # gated activations: the Mul is the group's unary op on x, its gate nodes are inside
    gated: dict[int, tuple[int, list[Node]]] = {}
    inside: dict[int, Node] = {}
    for n in graph.nodes:
        found = gated_activation(n, graph) if node_ok(n) is None else None
        if found is not None and _is_float(n.inputs[found[0]]):
            gated[id(n)] = found
            inside.update((id(g), n) for g in found[1])
    quantizable = {id(n) for n in graph.nodes if node_ok(n) is None and id(n) not in inside}
    kept, wanted = _profitable(graph, quantizable, recipe, gated)

    def absorbed(v: Value) -> bool:
        cons = v.consumers()
        return (
            bool(cons)
            and id(v) not in output_ids
            and all(c.op_type in ABSORBING_ACTIVATIONS and id(c) in quantizable for c in cons)
        )

    for node in graph.nodes:
        if id(node) in inside and id(inside[id(node)]) in kept:
            mul = inside[id(node)]
            plan.decisions.append(
                NodeDecision(
                    node, False, f"inside the gated activation {mul.label}: one function of its input"
                )
            )
            continue
        reason = node_ok(node)
        table = node.input(0)
        if (
            reason is None
            and node.op_type == "Gather"
            and table is not None
            and table.is_const
            and _is_float(table)
        ):
            # An embedding table: stored int8 per-tensor (weight-only: 4x smaller file),
            # gathered then dequantized; one scale keeps it a view on the integers.
            key = f"{table.name}@{node.name or id(node)}"
            plan.tensors[key] = TensorPlan(table.name, "weight", w_storage, True, axis=None)
            plan.decisions.append(NodeDecision(node, True, inputs=[(0, key)]))
            continue
        if reason is None and id(node) not in kept:
            reason = "its output feeds only float ops: quantizing it would add error and save no time"
        if reason is not None:
            plan.decisions.append(NodeDecision(node, False, reason))
            continue
        d = NodeDecision(node, True)
        op = node.op_type
        out = node.outputs[0] if node.outputs else None
        if id(node) in gated:
            # one function of x: only x is read quantized (the gate's value stays inside)
            xi = gated[id(node)][0]
            d.inputs.append((xi, want_activation(node.inputs[xi])))
        elif op in VIEW_OPS:
            x = node.input(0)
            if x is not None and _is_float(x):
                if not x.is_const:
                    # the view's input is quantized with it: its producer's output, or a
                    # range of its own (a graph input, a float op's output)
                    d.inputs.append((0, want_activation(x)))
                for o in node.outputs:
                    if _is_float(o):
                        plan.tensors[o.name] = TensorPlan(
                            o.name, "activation", act_storage, False, inherit_from=x.name
                        )
                d.output = out.name if out is not None and out.name in plan.tensors else None
            plan.decisions.append(d)
            continue
        elif op in MAC_OPS:
            x, w = node.input(0), node.input(1)
            if not _is_float(x):
                plan.decisions.append(NodeDecision(node, False, "input 0 is not a float tensor"))
                continue
            d.inputs.append((0, want_activation(x)))
            if w is not None and w.is_const and _is_float(w):
                axis = _weight_axis(node, w) if recipe.per_channel else None
                block = None
                if w_storage.bits == 4:
                    # 4-bit weights are blocked along the reduction axis (MatMul/Gemm);
                    # a Conv keeps one scale per output channel
                    block_axis = _block_axis(op, w.const, int(node.attrs.get("transB", 0)))
                    if block_axis is not None:
                        axis, block = block_axis, recipe.weight_block_size
                key = f"{w.name}@{node.name or id(node)}"
                plan.tensors[key] = TensorPlan(
                    w.name,
                    "weight",
                    w_storage,
                    recipe.symmetric_weights,
                    axis=axis,
                    block=block,
                    depthwise=op == "Conv"
                    and is_depthwise(int(node.attrs.get("group", 1)), np.shape(w.const)),
                )
                d.inputs.append((1, key))
            elif op in ("MatMul", "Gemm") and _is_float(w):
                d.inputs.append((1, want_activation(w)))  # attention: both operands are activations
            else:
                plan.decisions.append(NodeDecision(node, False, "weight input is not a float tensor"))
                continue
            b = node.input(2)
            if b is not None and b.is_const and _is_float(b) and b.const.ndim == 1 and op != "MatMul":
                key = f"{b.name}@{node.name or id(node)}"
                plan.tensors[key] = TensorPlan(
                    b.name, "bias", IntType(32, True), True, bias_of=(x.name, d.inputs[1][1])
                )
                d.inputs.append((2, key))
        elif op in NARY_QUANT_OPS:
            for i, v in enumerate(node.inputs):
                if v is None:
                    continue
                if not _is_float(v):
                    break
                d.inputs.append((i, want_activation(v)))
            if len(d.inputs) != sum(1 for v in node.inputs if v is not None):
                plan.decisions.append(NodeDecision(node, False, "an input is not a float tensor"))
                continue
        elif op in UNARY_QUANT_OPS or (recipe.integer_only and op in INTEGER_ONLY_UNARY):
            x = node.input(0)
            if not _is_float(x):
                plan.decisions.append(NodeDecision(node, False, "input 0 is not a float tensor"))
                continue
            d.inputs.append((0, want_activation(x)))
        elif op in OUTPUT_ONLY_OPS:
            pass
        if out is not None and _is_float(out):
            if id(out) in output_ids and not recipe.quantize_outputs:
                pass  # graph outputs stay float (the last op dequantizes)
            elif _typed_by_override(out, recipe) and op in MAC_OPS:
                d.output = want_activation(out)
            elif id(out) not in wanted and id(out) not in output_ids:
                pass  # no quantized consumer: the op produces float (its consumers are float)
            elif op not in ABSORBING_ACTIVATIONS and absorbed(out):
                pass  # Relu/Clip after it carries the range
            else:
                d.output = want_activation(out)
        plan.decisions.append(d)

    if recipe.integer_only:
        _widen(graph, plan, recipe)
    # Concat inputs used only by the Concat share its output's parameters.
    for d in plan.decisions:
        if d.quantize and d.node.op_type == "Concat" and d.output:
            for _, key in d.inputs:
                v = graph.value(key)
                t = plan.tensors[key]
                if (
                    len(v.uses) == 1
                    and id(v) not in output_ids
                    and t.inherit_from is None
                    and t.fixed_range is None
                ):
                    t.share_with = d.output
    return plan


def _masked_sum_range(v: Value, ranges: dict[str, CalibratedType]) -> CalibratedType | None:
    """The calibrated range of the finite operand of an ``Add`` producing ``v``."""
    p = v.producer
    if p is None or p.op_type != "Add" or p.domain:
        return None
    for x in p.inputs:
        if x is not None and x.name in ranges and is_degenerate(ranges[x.name]) is None:
            return ranges[x.name]
    return None


def _widen(graph: Graph, plan: QdqPlan, recipe: Recipe) -> None:
    """Integer-only targets: the activations their ``wide_activations`` name become int16
    symmetric (recipe.TARGETS). "residual": every LayerNormalization input and, back
    through the Adds that compute it, their activation inputs; "gelu": every Gelu
    output; "gelu_input": every Gelu input; "softmax": every Softmax input and, back
    through the Add/Sub/Mul/Div that compute it, their activation inputs (the attention
    scores); "softmax_output": every Softmax output (the attention weights); "outputs":
    the graph outputs (a classifier's logits)."""
    from quanta.quantize.recipe import TARGETS

    kinds = TARGETS[recipe.target].get("wide_activations", ())
    wide: set[str] = set()

    def back_through(starts: list, ops: tuple[str, ...]) -> None:
        """``starts`` and, back through producers among ``ops``, their activation inputs."""
        stack = list(starts)
        while stack:
            v = stack.pop()
            if v is None or v.is_const or v.name in wide:
                continue
            wide.add(v.name)
            p = v.producer
            if p is not None and p.op_type in ops and not p.domain:
                stack.extend(p.inputs)

    if "residual" in kinds:
        back_through(
            [n.inputs[0] for n in graph.nodes if n.op_type == "LayerNormalization" and n.inputs], ("Add",)
        )
    if "gelu" in kinds:
        wide.update(n.outputs[0].name for n in graph.nodes if n.op_type == "Gelu")
    if "gelu_input" in kinds:
        # the GELU input and, back through the bias Add, the MatMul that computes it: an
        # 8-bit product ahead of a 16-bit sum would keep the 8-bit step
        back_through([n.inputs[0] for n in graph.nodes if n.op_type == "Gelu" and n.inputs], ("Add",))
    if "softmax" in kinds:
        # attention scores: the Softmax input and, back through the elementwise ops
        # that scale and mask it, the MatMul that computes them (the device's i-exp
        # polynomial takes 16-bit inputs; 8 bits step the exponent by sx·max ≈ 0.1)
        back_through(
            [n.inputs[0] for n in graph.nodes if n.op_type == "Softmax" and n.inputs],
            ("Add", "Sub", "Mul", "Div"),
        )
    if "softmax_output" in kinds:  # attention weights below 2^-9 are not all zero
        wide.update(n.outputs[0].name for n in graph.nodes if n.op_type == "Softmax")
    if "outputs" in kinds:  # logits: 8 bits would tie close classes
        wide.update(v.name for v in graph.outputs)
    for name in wide:
        t = plan.tensors.get(name)
        if t is not None and t.role == "activation" and t.inherit_from is None:
            t.storage = IntType(16, True)
            t.symmetric = True


def _profitable(
    graph: Graph, quantizable: set[int], recipe: Recipe, gated: dict[int, tuple[int, list[Node]]]
) -> tuple[set[int], set[int]]:
    """Which quantizable nodes are worth quantizing, and which values some kept node
    reads as a quantized input (one backward pass over the graph).

    Conv/ConvTranspose/Gemm/MatMul are always kept: their multiply-accumulates are the
    time. Every other op (Add, Mul, Concat, pools, Sigmoid…, views, Relu/Clip, Softmax's
    output) is kept only when its output is read quantized by a kept node: a residual
    Add whose only consumer is a float LayerNormalization would otherwise get a Q/DQ pair
    that adds rounding error and saves nothing (docs/accuracy.md: MiniLM's residual
    stream). A kept Relu/Clip reads its input as the (absorbed) quantized range of its
    producer, so the producer counts as wanted.
    """
    output_ids = {id(v) for v in graph.outputs}
    kept: set[int] = set()
    wanted: set[int] = set()
    if recipe.integer_only:
        # a device without float units: every quantizable op is kept and reads its
        # activations quantized (Softmax's input too); nothing is "unprofitable"
        for node in graph.nodes:
            if id(node) not in quantizable or not node.outputs:
                continue
            kept.add(id(node))
            reads = [node.inputs[gated[id(node)][0]]] if id(node) in gated else node.inputs
            if node.op_type in INTEGER_ONLY_UNARY:
                reads = node.inputs[:1]
            wanted.update(id(v) for v in reads if v is not None and not v.is_const)
        return kept, wanted
    for node in reversed(graph.nodes):
        if id(node) not in quantizable or not node.outputs:
            continue
        op = node.op_type
        out = node.outputs[0]
        out_wanted = any(id(o) in wanted for o in node.outputs) or (
            recipe.quantize_outputs and id(out) in output_ids
        )
        if op in MAC_OPS:
            kept.add(id(node))
            for v in node.inputs[:2]:
                if v is not None and not v.is_const:
                    wanted.add(id(v))
            continue
        if not out_wanted:
            continue
        kept.add(id(node))
        if id(node) in gated:  # a gated activation reads only x quantized
            wanted.add(id(node.inputs[gated[id(node)][0]]))
            continue
        if op in OUTPUT_ONLY_OPS and op not in ABSORBING_ACTIVATIONS:
            continue  # Softmax: its input stays float
        if op in VIEW_OPS or op in ABSORBING_ACTIVATIONS:
            if node.input(0) is not None:
                wanted.add(id(node.input(0)))
            continue
        for v in node.inputs:
            if v is not None and not v.is_const:
                wanted.add(id(v))
    return kept, wanted


def resolve_params(
    graph: Graph,
    plan: QdqPlan,
    ranges: dict[str, CalibratedType],
    recipe: Recipe,
) -> None:
    """Turn ranges (and weight values) into QuantTypes; mark what stays float and why."""
    by_name = {v.name: v for v in graph.values()}
    # 1. activations with their own range
    for t in plan.tensors.values():
        if t.role != "activation" or t.inherit_from is not None or t.share_with is not None:
            continue
        if t.float_reason is not None:  # set by calibration (degenerate observations)
            continue
        if t.fixed_range is not None:
            cal = CalibratedType(_expressed(by_name[t.name]), *t.fixed_range)
        elif t.name in ranges:
            cal = ranges[t.name]
        elif recipe.integer_only and (masked := _masked_sum_range(by_name[t.name], ranges)) is not None:
            # integer-only: an additive mask (-1e9/-3.4e38; calibration left it out) saturates
            # to qmin; the range is that of the Add's finite operand (the attention scores)
            cal = masked
        else:
            t.float_reason = "no calibration range (never computed on the calibration data)"
            continue
        reason = is_degenerate(cal, bits=t.storage.bits)
        if reason is not None and recipe.integer_only and "zero range" in reason:
            # integer-only: a constant tensor still has to reach the device as integers;
            # a range around the constant represents it exactly (its own step)
            c = float(np.asarray(cal.min, np.float64).reshape(-1)[0])
            half = abs(c) if c != 0.0 else 1.0
            cal = CalibratedType(cal.expressed, min(c, 0.0) - half, max(c, 0.0) + half)
            reason = None
        if reason is not None:
            t.float_reason = reason
            continue
        t.qtype = params_from_range(cal, t.storage, symmetric=t.symmetric, reduce_range=recipe.reduce_range)
    # 2. shared (Concat inputs) and inherited (views), in graph order
    for t in plan.tensors.values():
        if t.share_with is not None:
            src = plan.tensors[t.share_with]
            if src.qtype is not None:
                t.qtype = src.qtype
            else:
                t.float_reason = src.float_reason
    for node in graph.nodes:
        for o in node.outputs:
            t = plan.tensors.get(o.name)
            if t is not None and t.inherit_from is not None:
                src = plan.tensors.get(t.inherit_from)
                if src is None or src.qtype is None:
                    t.float_reason = "a view of a tensor that stays float"
                else:
                    t.qtype = src.qtype  # a view keeps its input's element type
    # 3. weights, then biases (the bias may raise the weight's scale: eq. (7))
    for t in plan.tensors.values():
        if t.role == "weight":
            w = by_name[t.name].const
            t.float_reason = _non_finite_reason(w)
            if t.float_reason is None:
                t.qtype = _weight_type(w, t, _expressed(by_name[t.name]), recipe)
    for t in plan.tensors.values():
        if t.role != "bias" or t.bias_of is None:
            continue
        t.float_reason = _non_finite_reason(by_name[t.name].const)
        if t.float_reason is not None:
            continue  # a float bias: the node is still quantized, its bias added in float
        x_t, w_t = plan.tensors.get(t.bias_of[0]), plan.tensors.get(t.bias_of[1])
        if x_t is None or w_t is None or x_t.qtype is None or w_t.qtype is None:
            t.float_reason = "its input or weight stays float"
            continue
        if w_t.qtype.block is not None:
            t.float_reason = "the weight is quantized per block: no single sx*sw per channel"
            continue
        b = by_name[t.name].const
        w_t.qtype = adjust_weight_scale_for_bias(x_t.qtype, w_t.qtype, b)
        t.qtype = bias_params(x_t.qtype, w_t.qtype)


#: float types NumPy tests and reduces natively (an ml_dtypes type takes the float64 path)
_NATIVE_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _non_finite_reason(c: np.ndarray) -> str | None:
    """Why a constant (weight, bias) has no quantized form, or None: a NaN or an infinity
    has no place on an integer grid, and one of them would make every scale of its
    channel (or of the tensor) infinite or NaN."""
    c = np.asarray(c)
    # the test in the constant's own type (a float64 copy of 85 MB of float32 weights
    # costs more than the test): converting to float64 keeps every value finite or not
    if c.dtype in _NATIVE_FLOATS and np.isfinite(c).all():
        return None
    c64 = np.asarray(c, dtype=np.float64)
    finite = np.isfinite(c64)
    if finite.all():
        return None
    nan = int(np.isnan(c64).sum())
    inf = int(c64.size - finite.sum()) - nan
    parts = [f"{nan} NaN" if nan else "", f"{inf} infinite" if inf else ""]
    return f"{' and '.join(p for p in parts if p)} value(s) among its {c64.size}: keep float"


def weight_float_reason(w: Value, what: str = "weight") -> str | None:
    """Why a constant weight has no int8 form of its own (kept float), or None: values
    that are not finite, or a degenerate range (all zero, |w| >= 1e9)."""
    reason = _non_finite_reason(w.const)
    if reason is not None:
        return f"{what} '{w.name}': {reason}"
    w64 = np.asarray(w.const, np.float64)
    reason = is_degenerate(CalibratedType(F32, float(w64.min(initial=0.0)), float(w64.max(initial=0.0))))
    if reason is not None:
        return f"{what} '{w.name}': {reason}"
    return None


def bias_correction_inputs(plan: QdqPlan) -> dict[str, int]:
    """Activation -> channel axis whose per-channel mean bias correction needs: the input
    of every quantized Conv (axis 1, NCHW) and Gemm (last axis) that has a bias."""
    out: dict[str, int] = {}
    for d in plan.decisions:
        roles = dict(d.inputs)
        if not d.quantize or 2 not in roles or 0 not in roles:
            continue
        if d.node.op_type == "Conv":
            out[roles[0]] = 1
        elif d.node.op_type == "Gemm" and not d.node.attrs.get("transA", 0):
            out[roles[0]] = -1
    return out


def consumer_channel_weights(graph: Graph, plan: QdqPlan) -> dict[str, tuple[int, np.ndarray]]:
    """Activation -> (channel axis, g_c of eq. (22)) for the calibrated activations whose
    every consumer is a quantized Conv, Gemm (transA = 0) or 2-D MatMul reading it as
    input 0 with a constant weight (the weighted-MSE range, calibrate/weighted_mse.py).
    The g_c of several consumers add up. A tensor that anything else reads (an Add, a
    view, a graph output, a float op) is left out: its error does not reach the graph
    only through those weights."""
    from quanta.calibrate.weighted_mse import consumer_weights

    decided = {id(d.node): d for d in plan.decisions}
    output_ids = {id(v) for v in graph.outputs}
    by_name = {v.name: v for v in graph.values()}
    out: dict[str, tuple[int, np.ndarray]] = {}
    for name in plan.activations_to_calibrate():
        v = by_name.get(name)
        if v is None or id(v) in output_ids or not v.uses:
            continue
        total: np.ndarray | None = None
        axis = None
        for node, idx in v.uses:
            d = decided.get(id(node))
            roles = dict(d.inputs) if d is not None and d.quantize else {}
            w_key = roles.get(1)
            w_plan = plan.tensors.get(w_key) if w_key is not None else None
            if (
                idx != 0
                or w_plan is None
                or w_plan.role != "weight"
                or node.op_type not in ("Conv", "Gemm", "MatMul")
            ):
                total = None
                break
            w = node.input(1).const
            if not np.isfinite(w).all():  # such a weight stays float (weight_float_reason)
                total = None
                break
            if node.op_type == "Conv":
                ax = 1
                g = consumer_weights("Conv", w, group=int(node.attrs.get("group", 1)))
            elif w.ndim == 2 and not (node.op_type == "Gemm" and node.attrs.get("transA", 0)):
                ax = -1
                g = consumer_weights(node.op_type, w, trans_b=bool(node.attrs.get("transB", 0)))
            else:
                total = None
                break
            if (axis is not None and ax != axis) or (total is not None and total.shape != g.shape):
                total = None
                break
            axis, total = ax, g if total is None else total + g
        if total is not None and axis is not None:
            out[name] = (axis, total)
    return out


def _output_quantized(node: Node, decided: Mapping[int, NodeDecision]) -> bool:
    """``node`` is quantized and its output is, directly or after a Relu / Clip that the
    codes imply (plan_qdq's absorbed activation)."""
    d = decided.get(id(node))
    if d is None or not d.quantize:
        return False
    if d.output is not None:
        return True
    out = node.outputs[0] if node.outputs else None
    if out is None or len(out.uses) != 1:
        return False
    act, _ = out.uses[0]
    da = decided.get(id(act))
    return act.op_type in ("Relu", "Clip") and not act.domain and da is not None and da.output is not None


def depthwise_only_inputs(graph: Graph, plan: QdqPlan, weights: Mapping[str, tuple[int, Any]]) -> list[str]:
    """The calibrated 8-bit activations that may take one grid per channel (eq. (29),
    calibrate/weighted_mse.py): every reader is a quantized depthwise Conv (group = C,
    weight [C, 1, ...]) reading it as input 0, and the producer is a Relu / Clip of a Conv
    output that nothing else reads (the activation is then implied by the codes), so that passes/lower/per_channel_activation.py folds the channel scales into
    both convolutions' multipliers. ``weights``: consumer_channel_weights (its tensors
    already have only Conv readers with constant weights)."""
    decided = {id(d.node): d for d in plan.decisions}
    by_name = {v.name: v for v in graph.values()}
    out = []
    for name, (axis, _) in weights.items():
        t = plan.tensors.get(name)
        v = by_name.get(name)
        if v is None or t is None or axis != 1 or t.share_with is not None or t.storage.bits != 8:
            continue
        shape = v.shape
        channels = shape[1] if shape is not None and len(shape) >= 3 else None
        if not isinstance(channels, int) or channels < 2:
            continue
        # each depthwise Conv's output is quantized too: the lowering folds the channel
        # scales into its multiplier (a float depthwise Conv would also keep the producer
        # float, which a per-tensor grid lowers)
        if not all(
            node.op_type == "Conv"
            and int(node.attrs.get("group", 1)) == channels
            and node.input(1).const.shape[:2] == (channels, 1)
            and _output_quantized(node, decided)
            for node, _ in v.uses
        ):
            continue
        # the producer: Conv -> Relu / Clip. A Conv read directly stays per tensor: ONNX
        # Runtime fuses DQ -> Conv -> Q into QLinearConv whatever the y scale's shape, and
        # its QLinearConv then refuses the vector zero point at run time (yunet); with the
        # activation between, it leaves the groups as float Conv + Q / DQ
        p = v.producer
        if p is None or p.domain or p.op_type not in ("Relu", "Clip") or len(p.inputs[0].uses) != 1:
            continue
        p = p.inputs[0].producer
        d = decided.get(id(p)) if p is not None else None
        if p is None or p.domain or p.op_type != "Conv" or d is None or not d.quantize:
            continue
        out.append(name)
    return out


def correct_biases(graph: Graph, plan: QdqPlan, means: dict[str, np.ndarray]) -> int:
    """Empirical bias correction (AIMET / Nagel et al. 2019, "Data-free quantization",
    sec. 4.2, with the input means measured on the calibration data)::

        ΔW = DQ(Q(W)) - W                         the weight's rounding error
        E[Δy_c] = Σ_k ΔW[c, k] · E[x_k]           what it adds to output channel c on average
        b'_c = b_c - E[Δy_c]                      so the quantized layer is unbiased

    For a Conv, k runs over the input channels of c's group and the kernel positions
    (padding, which sees zeros, is neglected); for a Gemm over K (alpha included).
    Returns the number of biases corrected. Call after :func:`resolve_params`, before
    :func:`insert_qdq` (which quantizes the corrected values)."""
    from quanta.kernels.reference.quantize import dequantize_linear

    by_name = {v.name: v for v in graph.values()}
    n = 0
    for d in plan.decisions:
        roles = dict(d.inputs)
        if not d.quantize or 0 not in roles or 1 not in roles or 2 not in roles:
            continue
        x_key, w_key, b_key = roles[0], roles[1], roles[2]
        w_t, b_t = plan.tensors[w_key], plan.tensors[b_key]
        mean = means.get(x_key)
        if mean is None or w_t.qtype is None or b_t.qtype is None or w_t.role != "weight":
            continue
        q = w_t.qtype
        w = np.asarray(by_name[w_t.name].const, dtype=np.float32)
        wq = w_t.codes
        if wq is None:
            wq = quantize_linear(
                w, q.scale_array(), q.zero_point_array(), axis=q.axis, block=q.block, dtype=q.storage.numpy
            )
        dw = dequantize_linear(wq, q.scale_array(), q.zero_point_array(), axis=q.axis, block=q.block).astype(
            np.float64
        )
        dw -= w.astype(np.float64)
        node = d.node
        if node.op_type == "Conv":
            group = int(node.attrs.get("group", 1))
            cout, cin_g = dw.shape[0], dw.shape[1]
            if mean.size != cin_g * group:
                continue
            per_in = dw.reshape(cout, cin_g, -1).sum(axis=2)  # [Cout, Cin/g]
            groups = np.arange(cout) // (cout // group)
            x_g = mean.reshape(group, cin_g)[groups]  # [Cout, Cin/g]
            corr = (per_in * x_g).sum(axis=1)
        elif node.op_type == "Gemm":
            dwk = dw.T if node.attrs.get("transB", 0) else dw  # [K, N]
            if mean.size != dwk.shape[0]:
                continue
            corr = float(node.attrs.get("alpha", 1.0)) * (mean @ dwk)
        else:
            continue
        b = np.asarray(by_name[b_t.name].const, dtype=np.float64)
        if b.shape != corr.shape:
            continue
        b_t.values = (b - corr).astype(by_name[b_t.name].const.dtype)
        n += 1
    return n


def _expressed(v: Value) -> FloatType:
    assert v.type is not None and isinstance(v.type.elem, FloatType)
    return v.type.elem


def _block_axis(node_op: str, w: np.ndarray, trans_b: int) -> int | None:
    """The reduction axis of a MatMul/Gemm weight (blocks run along it), else None."""
    if w.ndim != 2:
        return None
    if node_op == "MatMul":
        return 0  # B is [K, N]
    if node_op == "Gemm":
        return 1 if trans_b else 0  # B is [N, K] with transB
    return None


def _blocked_weight_type(
    w: np.ndarray,
    axis: int,
    block: int,
    storage: IntType,
    expressed: FloatType,
    symmetric: bool,
    reduce_range: bool,
) -> QuantType:
    """Per-block parameters (sub-channel, as MatMulNBits / DequantizeLinear-21
    ``block_size``): one scale per ``block`` consecutive values along ``axis`` (the
    reduction axis), per output column. The last block may be short."""
    from quanta.quantize.params import compute_scale_zero_point

    w64 = np.moveaxis(np.asarray(w, dtype=np.float64), axis, 0)  # [K, N]
    k = w64.shape[0]
    nb = -(-k // block)
    pad = nb * block - k
    padded = np.pad(w64, [(0, pad)] + [(0, 0)] * (w64.ndim - 1), constant_values=np.nan)
    blocks = padded.reshape(nb, block, *w64.shape[1:])
    lo = np.nanmin(blocks, axis=1)
    hi = np.nanmax(blocks, axis=1)
    scale, zp = compute_scale_zero_point(
        lo, hi, storage, symmetric=symmetric, reduce_range=reduce_range, expressed=expressed
    )
    scale, zp = np.moveaxis(scale, 0, axis), np.moveaxis(zp, 0, axis)
    return QuantType(
        storage, expressed, scale.reshape(-1), zp.reshape(-1), axis=axis, block=block, scale_shape=scale.shape
    )


def seven_bit(t: TensorPlan, recipe: Recipe) -> bool:
    """Whether ``t``'s weights use the 7-bit table of quant_range (recipe.py weight_bits):
    ``reduce_range`` everywhere; ``weight_bits = 7`` on 8-bit weights that meet a u8 x s8
    GEMM, whose AVX2 form sums product pairs in int16 (docs/kernels.md "AVX2"), i.e. all
    but a depthwise Conv's."""
    if recipe.reduce_range:
        return True
    return recipe.weight_bits == 7 and t.storage.bits == 8 and not t.depthwise


#: ops whose constant weight (input 1) ONNX Runtime's QDQ fusion hands to its u8·s8 GEMM
#: (the pairing of a ConvTranspose is not modelled: left alone)
_ORT_U8S8_OPS = ("Conv", "MatMul", "Gemm")


def pair_safe_codes(graph: Graph, plan: QdqPlan, recipe: Recipe) -> int:
    """Eq. (12m) (``recipe.weight_pairs`` "ort" / "ort_rows", quanta.quantize.ort_pairs) on every int8
    weight that ONNX Runtime's saturating u8·s8 GEMM reads: a Conv / MatMul / Gemm weight
    whose layer input is uint8, not depthwise. Codes chosen beforehand (GPTQ, which keeps
    eq. (12m) itself) stay unless a pair breaks it; the others are nearest rounding with
    each pair that breaks it moved to the nearest pair that keeps it
    (ort_pairs.project_pairs). Call after the rounding, before bias correction and
    insert_qdq. Returns the number of codes moved."""
    if recipe.weight_pairs not in ("ort", "ort_rows"):
        return 0
    from quanta.quantize.ort_pairs import pair_partners, project_pairs
    from quanta.quantize.params import quant_range

    by_name = {v.name: v for v in graph.values()}
    moved = 0
    for d in plan.decisions:
        roles = dict(d.inputs)
        node = d.node
        if not d.quantize or node.op_type not in _ORT_U8S8_OPS or 0 not in roles or 1 not in roles:
            continue
        x_t, w_t = plan.tensors[roles[0]], plan.tensors[roles[1]]
        q, qx = w_t.qtype, x_t.qtype
        if w_t.role != "weight" or q is None or qx is None or q.block is not None:
            continue
        if not (q.storage.signed and q.storage.bits == 8) or qx.storage.signed or qx.storage.bits != 8:
            continue
        w = np.asarray(by_name[w_t.name].const, np.float32)
        group = int(node.attrs.get("group", 1))
        if node.op_type == "Conv" and (w.ndim < 3 or is_depthwise(group, w.shape)):
            continue
        if node.op_type != "Conv" and w.ndim != 2:
            continue
        qmin, qmax = quant_range(q.storage, symmetric=w_t.symmetric, reduce_range=seven_bit(w_t, recipe))
        if max(qmax, -qmin) <= 64:
            continue  # every pair sum is at most 128
        scale, zp = q.scale_array(), q.zero_point_array()
        codes = w_t.codes
        if codes is None:
            codes = quantize_linear(w, scale, zp, axis=q.axis, dtype=q.storage.numpy)
        # the real codes nearest rounding rounds (eq. (2): the quotient in float32)
        shape = [1] * w.ndim
        if q.axis is not None:
            shape[q.axis] = -1
        u = (w / np.asarray(scale, np.float32).reshape(shape)).astype(np.float64)
        u += np.asarray(zp, np.float64).reshape(shape)
        trans_b = bool(node.attrs.get("transB", 0))
        partners = pair_partners(node.op_type, w.shape, trans_b=trans_b)
        # quanta's [rows, K] layout: the pairs along the last axis
        if node.op_type == "Conv":
            c2, u2 = codes.reshape(w.shape[0], -1), u.reshape(w.shape[0], -1)
        elif trans_b:
            c2, u2 = codes, u
        else:
            c2, u2 = codes.T, u.T
        new, n = project_pairs(u2, c2, partners, qmin, qmax)
        if n:
            new = new.reshape(w.shape) if node.op_type == "Conv" else (new if trans_b else new.T)
            w_t.codes = np.ascontiguousarray(new.astype(q.storage.numpy))
            moved += n
    return moved


def _weight_type(w: np.ndarray, t: TensorPlan, expressed: FloatType, recipe: Recipe) -> QuantType:
    reduce = seven_bit(t, recipe)
    if t.block is not None and t.axis is not None:
        return _blocked_weight_type(w, t.axis, t.block, t.storage, expressed, t.symmetric, reduce)
    w = np.asarray(w)
    # the extrema in the weight's own type, then widened: float64 conversion is exact
    # and keeps the order, so they are the extrema of the float64 copy, without the copy
    wv = w if w.dtype in _NATIVE_FLOATS else np.asarray(w, dtype=np.float64)
    if t.axis is None:
        cal = CalibratedType(expressed, float(wv.min(initial=0.0)), float(wv.max(initial=0.0)))
    else:
        moved = np.moveaxis(wv, t.axis, 0).reshape(wv.shape[t.axis], -1)
        lo = moved.min(axis=1).astype(np.float64)
        hi = moved.max(axis=1).astype(np.float64)
        cal = CalibratedType(expressed, tuple(lo), tuple(hi), axis=t.axis)
    return params_from_range(cal, t.storage, symmetric=t.symmetric, reduce_range=reduce)


# -- insertion -----------------------------------------------------------------------


def _scalar_or_vector(q: QuantType) -> tuple[np.ndarray, np.ndarray]:
    return q.scale_array(), q.zero_point_array()


def insert_qdq(graph: Graph, plan: QdqPlan) -> None:
    """Rewrite ``graph`` in place: Q/DQ pairs for activations, quantized initializers +
    DQ for weights and biases. Decisions whose needed tensors stayed float are undone
    (the node stays float) and say why."""
    by_name = {v.name: v for v in graph.values()}
    # Nodes that need every input quantized (the integer op takes no float operand).
    for d in plan.decisions:
        if not d.quantize:
            continue
        if d.node.op_type in VIEW_OPS and not d.inputs:  # (a Gather table is a weight input)
            t = plan.tensors.get(d.output) if d.output else None
            if t is None or t.qtype is None:
                d.quantize = False
                d.reason = "its input stays float (a view keeps its input's type)"
            continue
        for _, key in d.inputs:
            t = plan.tensors[key]
            if t.qtype is None and t.role != "bias":
                d.quantize = False
                d.reason = f"{t.role} '{t.name}' stays float: {t.float_reason}"
                break
    # Activations: one Q -> DQ pair per quantized tensor that some quantized node uses
    # (as input or output).
    needed: list[str] = []
    for d in plan.decisions:
        if not d.quantize:
            continue
        for _, key in d.inputs:
            if plan.tensors[key].role == "activation":
                needed.append(key)
        if d.output is not None and plan.tensors[d.output].qtype is not None:
            needed.append(d.output)
    graph.toposort()  # sorted already (verify checks it): the constants' DQ placement relies on it
    with graph.naming():
        for name in dict.fromkeys(needed):
            t = plan.tensors[name]
            if t.qtype is None:
                continue
            _insert_activation_qdq(graph, by_name[name], t.qtype)
        # Weights and biases: per consumer.
        for d in plan.decisions:
            if not d.quantize:
                continue
            for idx, key in d.inputs:
                t = plan.tensors[key]
                if t.role in ("weight", "bias") and t.qtype is not None:
                    _insert_constant_dq(graph, d.node, idx, by_name[t.name], t)
    graph.remove_unused_initializers()


def _const(graph: Graph, base: str, arr: np.ndarray) -> Value:
    return graph.add_initializer(graph.fresh_name(base), arr)


def _insert_activation_qdq(graph: Graph, v: Value, q: QuantType) -> None:
    scale, zp = _scalar_or_vector(q)
    s = _const(graph, f"{v.name}_scale", scale)
    z = _const(graph, f"{v.name}_zero_point", zp)
    if v.is_const:
        # A constant operand is stored quantized: initializer + DequantizeLinear, no Q node.
        data = quantize_linear(np.asarray(v.const, dtype=np.float32), scale, zp, axis=q.axis)
        wq = graph.add_initializer(
            graph.fresh_name(f"{v.name}_quantized"), data, TensorType(q, tuple(data.shape))
        )
        out = Value(graph.fresh_name(f"{v.name}_dequantized"), v.type)
        users = list(v.uses)
        dq = Node("DequantizeLinear", [wq, s, z], [out], name=graph.fresh_name(f"{v.name}_DequantizeLinear"))
        # right before the first user in graph order: where a (stable) toposort of the
        # sorted graph puts it, without sorting the whole graph once per constant (1,120
        # constants of a diffusion UNet: 15 s per file)
        position = {id(n): k for k, n in enumerate(graph.nodes)}
        here = [node for node, _ in users if id(node) in position]
        first = min(here, key=lambda n: position[id(n)], default=None)
        graph.add_node(dq, before=first)
        for node, i in users:
            node.replace_input(i, out)
        return
    qv = Value(graph.fresh_name(f"{v.name}_quantized"), TensorType(q, v.shape))
    dqv = Value(graph.fresh_name(f"{v.name}_dequantized"), v.type)
    users = list(v.uses)
    # a per-channel activation (eq. (29): the input of depthwise Convs) carries its axis
    attrs = {} if q.axis is None else {"axis": int(q.axis)}
    qnode = Node(
        "QuantizeLinear", [v, s, z], [qv], dict(attrs), name=graph.fresh_name(f"{v.name}_QuantizeLinear")
    )
    dqnode = Node(
        "DequantizeLinear",
        [qv, s, z],
        [dqv],
        dict(attrs),
        name=graph.fresh_name(f"{v.name}_DequantizeLinear"),
    )
    anchor = _after(graph, v)
    graph.add_node(qnode, before=anchor)
    graph.add_node(dqnode, before=anchor)
    for node, i in users:
        node.replace_input(i, dqv)
    if any(o is v for o in graph.outputs) and not any(i is v for i in graph.inputs):
        # a quantized graph output (Recipe.quantize_outputs): the dequantized value is
        # what the graph returns, under the output's name. A graph input that is also an
        # output keeps its name and is returned as it was fed.
        name = v.name
        v.name = graph.fresh_name(f"{name}_float")
        dqv.name = name
        graph.outputs = [dqv if o is v else o for o in graph.outputs]


def _after(graph: Graph, v: Value) -> Node | None:
    """The node right after ``v``'s producer (None: append at the end)."""
    if v.producer is None:
        return graph.nodes[0] if graph.nodes else None
    k = graph.nodes.index(v.producer)
    return graph.nodes[k + 1] if k + 1 < len(graph.nodes) else None


#: storage types :func:`quantize_weight` takes: every bound qmin − zp, qmax − zp is exact in float32
_FLOAT32_BOUNDED = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))


def quantize_weight(
    w: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int | None, dtype: Any
) -> np.ndarray:
    """``quantize_linear(w, scale, zero_point, axis=axis, dtype=dtype)`` (eq. (2)), bit for
    bit, for a float32 weight with float32 scales, per tensor or per axis, on 8- or 16-bit
    integer storage: the same float32 division and rounding, then the clamp in float32 in
    the same buffer. The reference widens the whole weight to float64 and int64 for the
    clamp (eq. (24)'s candidates quantize rxnmap's 21M weights each); in float32 the
    bounds are exact integers, so every comparison, NaN -> qmin included, comes out the
    same. Anything else goes to the reference."""
    x, s, dt = np.asarray(w), np.asarray(scale), np.dtype(dtype)
    if x.dtype != np.float32 or s.dtype != np.float32 or dt not in _FLOAT32_BOUNDED:
        return quantize_linear(x, s, zero_point, axis=axis, dtype=dt)
    qmin, qmax = storage_range(dt)
    zp = expand_param(np.asarray(zero_point), x.shape, axis, None, "zero_point").astype(np.int32)
    q = np.asarray(np.divide(x, expand_param(s, x.shape, axis, None, "scale"), dtype=np.float32))
    np.rint(q, out=q)
    np.fmax(q, (qmin - zp).astype(np.float32), out=q)
    np.minimum(q, (qmax - zp).astype(np.float32), out=q)
    out = q.astype(np.int32)
    out += zp
    res = out.astype(dt)
    return res if res.ndim else res[()]


def _insert_constant_dq(graph: Graph, node: Node, idx: int, w: Value, t: TensorPlan) -> None:
    q = t.qtype
    assert q is not None
    if t.role == "bias":
        data = quantize_bias(w.const if t.values is None else t.values, q)
    elif t.codes is not None:
        data = t.codes
    elif q.block is None:
        data = quantize_weight(
            np.asarray(w.const, dtype=np.float32),
            q.scale_array(),
            q.zero_point_array(),
            q.axis,
            q.storage.numpy,
        )
    else:
        data = quantize_linear(
            np.asarray(w.const, dtype=np.float32),
            q.scale_array(),
            q.zero_point_array(),
            axis=q.axis,
            block=q.block,
            dtype=q.storage.numpy,
        )
    suffix = "_quantized"
    wq = graph.add_initializer(graph.fresh_name(f"{w.name}{suffix}"), data, TensorType(q, tuple(data.shape)))
    scale, zp = _scalar_or_vector(q)
    s = _const(graph, f"{w.name}_scale", scale)
    z = _const(graph, f"{w.name}_zero_point", zp)
    attrs = {} if q.axis is None else {"axis": int(q.axis)}
    if q.block is not None:
        attrs["block_size"] = int(q.block)
    out = Value(graph.fresh_name(f"{w.name}_dequantized"), w.type)
    dq = Node(
        "DequantizeLinear", [wq, s, z], [out], attrs, name=graph.fresh_name(f"{w.name}_DequantizeLinear")
    )
    graph.add_node(dq, before=node)
    node.replace_input(idx, out)
