"""Constant folding: Constant nodes, shape subgraphs, quantized constants, and (with an
evaluator) any node whose inputs are all constants.

Design choice. Passes may use only ``quanta.ir`` (docs/design.md layers), so they cannot call
the reference kernels. Folding is therefore split:

- natively, in this module, only what needs no operator semantics beyond shapes:
  ``Constant`` nodes, ``Shape`` of a statically shaped value, and small integer "shape
  tensors" (at most :data:`SHAPE_TENSOR_LIMIT` integers per input) through
  Gather / Unsqueeze / Squeeze / Concat / Reshape / Cast / Slice / Add / Sub / Mul, the
  ops exporters put between ``Shape`` and ``Reshape``. Their results are checked
  against the reference kernels in the tests;
- everything else through an *evaluator* the caller injects
  (``FoldConstants(evaluator=...)``): ``evaluate(node, inputs) -> outputs`` with numpy
  arrays, typically the reference kernels bound to the model's opsets (the runtime,
  which may import targets, builds it). Without one, only the native set folds.

Rules::

    %y = Constant() {value=...}            -> %y = const                   FoldConstantNode
    %y = Shape(%x: tensor<2x3x5, ...>)     -> %y = const [2, 3, 5]         FoldShape
    %y = Gather|Slice(Shape(%x: tensor<?x3x5>), const)
                                           -> %y = const [3, 5]            FoldShapeElements
    %y = Gather|...|Mul(const, ...)        -> %y = const (int, small)      FoldShapeArithmetic
    %y = AnyOp(const, ..., const)          -> %y = const (via evaluator)   FoldEvaluated
    %y = DequantizeLinear(%c: i8 const, %s, %z)
                                           -> %y = DequantizeLinear(%c': Q(i8:f32, s, z) const, %s, %z)
                                                                           TypeQuantizedConstant

A scale or zero point that folds into a constant (``DequantizeLinear(%acc, Mul(%c1, %c2))``,
onnx-quantize's ``x_scale · w_scale``; a Reshape or Cast of a constant scale) describes its
operand only once it is one: after the rules, the pass gives such an operand the QuantType
the loader gives it when the file writes the parameters as constants
(:func:`type_operands_of_constant_params`).

``QuantizeLinear(const)`` folds through the evaluator into a *quantized constant*: an
initializer of storage integers whose type is the Q output's QuantType (the replaced
op's contract). ``DequantizeLinear(const)`` is kept (see :data:`KEEP`) and its constant
gets a QuantType (TypeQuantizedConstant), so lowering sees quantized weights.
QuantizeLinear / DequantizeLinear of *activations* are never folded: their inputs are
not constants, and they carry the quantization decisions the lowering needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from quanta.ir.graph import Graph, Node, Value, result_type
from quanta.ir.onnx_io import quant_operands, quant_type_from_params
from quanta.ir.types import I32, IntType, MXType, QuantType, TensorType, elem_from_numpy
from quanta.passes.manager import PassResult
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import NONDETERMINISTIC_OPS, describe, node_qtype

__all__ = [
    "KEEP",
    "SHAPE_OPS",
    "SHAPE_TENSOR_LIMIT",
    "Evaluator",
    "FoldConstantNode",
    "FoldConstants",
    "FoldEvaluated",
    "FoldShape",
    "FoldShapeArithmetic",
    "FoldShapeElements",
    "TypeQuantizedConstant",
    "const_type",
    "type_operands_of_constant_params",
]

#: ``evaluate(node, inputs) -> outputs``: numpy arrays in ONNX order (None for an
#: omitted optional input), one array per node output.
Evaluator = Callable[[Node, Sequence["np.ndarray | None"]], Sequence[np.ndarray]]

#: Ops never folded even when every input is a constant, each with its reason.
KEEP: dict[str, str] = {
    "DequantizeLinear": (
        "a dequantized constant is a quantized weight: the integer lowering consumes its integers "
        "(a folded float copy is 4x larger and loses the quantization)"
    ),
    **{op: "non-deterministic" for op in sorted(NONDETERMINISTIC_OPS)},
}

#: the ops FoldShapeArithmetic evaluates natively on small integer tensors
SHAPE_OPS = ("Gather", "Unsqueeze", "Squeeze", "Concat", "Reshape", "Cast", "Slice", "Add", "Sub", "Mul")
SHAPE_TENSOR_LIMIT = 64

_INT_CASTS = {6: np.int32, 7: np.int64}  # TensorProto INT32, INT64


def const_type(array: np.ndarray, replaced: Value) -> TensorType:
    """The type of a folded constant: the element type of the value it replaces (its
    contract; e.g. a QuantType for a folded QuantizeLinear), the shape of the data."""
    if replaced.type is None:
        return TensorType(elem_from_numpy(array.dtype), tuple(array.shape))
    return result_type(shape_from=tuple(array.shape), elem_from=replaced)


def _check_dtype(array: np.ndarray, replaced: Value) -> str | None:
    if replaced.type is None:
        return None
    want = np.dtype(replaced.type.elem.numpy)
    if array.dtype != want:
        return f"folded '{replaced.name}' has dtype {array.dtype} but its type {replaced.type.elem} stores {want}"
    return None


class FoldConstantNode(Rule):
    """%y = Constant() {value=...} -> %y = const"""

    pattern = "y = Constant()"

    def check(self, m: Match) -> Match | NoMatch:
        attrs = m.root.attrs
        if "value" in attrs and isinstance(attrs["value"], np.ndarray):
            arr = attrs["value"]
        elif "value_float" in attrs:
            arr = np.asarray(attrs["value_float"], np.float32)
        elif "value_floats" in attrs:
            arr = np.asarray(attrs["value_floats"], np.float32)
        elif "value_int" in attrs:
            arr = np.asarray(attrs["value_int"], np.int64)
        elif "value_ints" in attrs:
            arr = np.asarray(attrs["value_ints"], np.int64)
        else:
            return NoMatch(
                f"Constant with attribute(s) {sorted(attrs)} is not folded (sparse or string values)"
            )
        reason = _check_dtype(arr, m.value("y"))
        if reason:
            return NoMatch(reason)
        m.data["array"] = arr
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y = m.value("y")
        return b.const(y.name, m.data["array"], const_type(m.data["array"], y))


class FoldShape(Rule):
    """%y = Shape(%x: tensor<d0x...xdn>) -> %y = const [d_start, ..., d_end) when every dimension is static"""

    pattern = "y = Shape(x)"

    def check(self, m: Match) -> Match | NoMatch:
        x = m.value("x")
        if x.shape is None:
            return NoMatch(f"{describe(x)} has an unknown rank")
        start = int(m.root.attrs.get("start", 0))
        end = m.root.attrs.get("end")
        dims = list(x.shape)[start : None if end is None else int(end)]
        if not all(isinstance(d, int) and d >= 0 for d in dims):
            shown = ["?" if d is None else d for d in x.shape]
            return NoMatch(f"{describe(x)} has shape {shown}: the dimensions read are not all static")
        m.data["array"] = np.asarray(dims, np.int64)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y = m.value("y")
        return b.const(y.name, m.data["array"], const_type(m.data["array"], y))


class FoldShapeElements(Rule):
    """%y = Gather(%s = Shape(%x: tensor<?x3x5>), const [1, 2]) -> %y = const [3, 5]

    (and ``Slice`` of such a shape by constants): the elements read are static dimensions
    though others (a symbolic batch) are not, as ONNX Runtime's symbolic shape inference
    folds them. A TF export computes its "same" pads from H and W this way."""

    pattern = "y = Gather|Slice(s = Shape(x), ...)"
    shared_ok = ("s",)

    def check(self, m: Match) -> Match | NoMatch:
        x, s, node = m.value("x"), m.value("s"), m.root
        if x.shape is None:
            return NoMatch(f"{describe(x)} has an unknown rank")
        for v in node.inputs[1:]:
            if v is not None and not v.is_const:
                return NoMatch(f"input {describe(v)} is not a constant", "pattern")
        if node.op_type == "Gather" and int(node.attrs.get("axis", 0)) != 0:
            return NoMatch("Gather of a shape along an axis other than 0")
        start = int(s.producer.attrs.get("start", 0))
        end = s.producer.attrs.get("end")
        rank = len(x.shape)
        dims = list(x.shape)[slice(start, None if end is None else int(end))]
        positions = np.arange(len(dims), dtype=np.int64)
        arrays = [positions] + [None if v is None else np.asarray(v.const) for v in node.inputs[1:]]
        try:
            picked = np.asarray(_evaluate_shape_op(node, arrays))
        except (ValueError, IndexError, KeyError, TypeError) as e:
            return NoMatch(f"{node.op_type} cannot be evaluated on a shape of rank {rank}: {e}")
        values = [dims[int(i)] for i in picked.reshape(-1)]
        if not all(isinstance(d, int) and d >= 0 for d in values):
            shown = ["?" if d is None else d for d in x.shape]
            return NoMatch(f"{describe(x)} has shape {shown}: the dimensions read are not all static")
        m.data["array"] = np.asarray(values, np.int64).reshape(picked.shape)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y = m.value("y")
        return b.const(y.name, m.data["array"], const_type(m.data["array"], y))


def _axes(node: Node, inputs: list[np.ndarray | None]) -> list[int] | None:
    if len(inputs) > 1 and inputs[1] is not None:
        return [int(a) for a in np.asarray(inputs[1]).reshape(-1)]
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    return None


def _slice(node: Node, inputs: list[np.ndarray | None]) -> np.ndarray:
    data = inputs[0]
    if "starts" in node.attrs:  # opset < 10: attributes
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes = node.attrs.get("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = [int(v) for v in inputs[1]]
        ends = [int(v) for v in inputs[2]]
        axes = (
            [int(v) for v in inputs[3]]
            if len(inputs) > 3 and inputs[3] is not None
            else list(range(len(starts)))
        )
        steps = (
            [int(v) for v in inputs[4]] if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
        )
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        # Python slicing normalizes negative bounds once and clamps, as ONNX Slice does
        index[a % data.ndim] = slice(s, e, st)
    return data[tuple(index)]


def _reshape(node: Node, inputs: list[np.ndarray | None]) -> np.ndarray:
    data, shape = inputs[0], [int(v) for v in inputs[1]]
    if not int(node.attrs.get("allowzero", 0)):
        shape = [data.shape[k] if d == 0 else d for k, d in enumerate(shape)]
    return data.reshape(shape)


def _evaluate_shape_op(node: Node, inputs: list[np.ndarray | None]) -> np.ndarray:
    op = node.op_type
    if op == "Gather":
        return np.take(inputs[0], inputs[1], axis=int(node.attrs.get("axis", 0)))
    if op == "Unsqueeze":
        return np.expand_dims(inputs[0], tuple(_axes(node, inputs) or ()))
    if op == "Squeeze":
        axes = _axes(node, inputs)
        return np.squeeze(inputs[0]) if axes is None else np.squeeze(inputs[0], axis=tuple(axes))
    if op == "Concat":
        return np.concatenate([a for a in inputs if a is not None], axis=int(node.attrs["axis"]))
    if op == "Reshape":
        return _reshape(node, inputs)
    if op == "Cast":
        return inputs[0].astype(_INT_CASTS[int(node.attrs["to"])])
    if op == "Slice":
        return _slice(node, inputs)
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op]
    return fn(inputs[0], inputs[1])


class FoldShapeArithmetic(Rule):
    """%y = Gather|Unsqueeze|Squeeze|Concat|Reshape|Cast|Slice|Add|Sub|Mul(const, ...) -> %y = const

    natively, for integer inputs of at most SHAPE_TENSOR_LIMIT elements (shape tensors).
    """

    pattern = "y = " + "|".join(SHAPE_OPS) + "(...)"

    def check(self, m: Match) -> Match | NoMatch:
        node = m.root
        for v in node.inputs:
            if v is not None and not v.is_const:
                return NoMatch(f"input {describe(v)} is not a constant", "pattern")
        arrays = [None if v is None else np.asarray(v.const) for v in node.inputs]
        for v, a in zip(node.inputs, arrays):
            if a is None:
                continue
            if a.dtype.kind not in "iu":
                return NoMatch(
                    f"input {describe(v)} has element type {a.dtype}: native folding covers integer shape tensors "
                    "(give FoldConstants an evaluator for the rest)"
                )
            if a.size > SHAPE_TENSOR_LIMIT:
                return NoMatch(
                    f"input {describe(v)} has {a.size} elements: native folding covers shape tensors of at most "
                    f"{SHAPE_TENSOR_LIMIT} (give FoldConstants an evaluator for the rest)"
                )
        if node.op_type == "Cast" and int(node.attrs.get("to", 0)) not in _INT_CASTS:
            return NoMatch(f"Cast to element type {node.attrs.get('to')} is not an integer shape cast")
        try:
            out = np.asarray(_evaluate_shape_op(node, arrays))
        except (ValueError, IndexError, KeyError, TypeError) as e:
            return NoMatch(f"{node.op_type} cannot be evaluated on these constants: {e}")
        reason = _check_dtype(out, m.value("y"))
        if reason:
            return NoMatch(reason)
        m.data["array"] = out
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y = m.value("y")
        return b.const(y.name, m.data["array"], const_type(m.data["array"], y))


class FoldEvaluated(Rule):
    """%y = AnyOp(const, ..., const) -> %y = const, computed by the injected evaluator

    Not folded: the ops in KEEP (with their reasons), nodes with subgraphs, and results
    that would grow the model (an output over ``max_output_elements`` that is larger
    than all its inputs together, e.g. Expand or ConstantOfShape of a big shape). A
    Concat of constant pieces is no larger than its pieces together and folds: torch's
    dynamo exporter writes an LSTM's / GRU's W and R as Unsqueeze(Concat(Slice(w)...))
    (the gates reordered), and an RNN whose weights are not constants runs on the
    reference kernel.
    """

    pattern = "y = *(...)"

    def __init__(self, evaluator: Evaluator, max_output_elements: int = 1 << 16):
        self.evaluator = evaluator
        self.max_output_elements = max_output_elements

    def check(self, m: Match) -> Match | NoMatch:
        node = m.root
        for v in node.inputs:
            if v is not None and not v.is_const:
                return NoMatch(f"input {describe(v)} is not a constant", "pattern")
        if not any(v.uses or any(v is o for o in m.graph.outputs) for v in node.outputs):
            return NoMatch("no output is used (dead code: EliminateDead removes it)", "pattern")
        if node.op_type == "Constant" and not node.domain:
            return NoMatch("Constant nodes fold natively (FoldConstantNode)", "pattern")
        reason = KEEP.get(node.op_type) if not node.domain else None
        if reason is not None:
            return NoMatch(f"{node.op_type} is kept: {reason}")
        if any(hasattr(a, "node") and hasattr(a, "input") for a in node.attrs.values()):
            return NoMatch(f"{node.op_type} has a subgraph attribute")
        arrays = [None if v is None else v.const for v in node.inputs]
        try:
            outs = [np.asarray(o) for o in self.evaluator(node, arrays)]
        except Exception as e:  # any failure means: not foldable here, with the reason
            return NoMatch(f"the evaluator failed on {node.op_type}: {type(e).__name__}: {e}")
        if len(outs) < len(node.outputs):
            return NoMatch(f"the evaluator returned {len(outs)} outputs for {len(node.outputs)}")
        all_inputs = sum(np.asarray(a).size for a in arrays if a is not None)
        for v, a in zip(node.outputs, outs):
            if a.size > self.max_output_elements and a.size > all_inputs:
                return NoMatch(
                    f"output '{v.name}' would have {a.size} elements (> {self.max_output_elements} and more than "
                    f"its inputs' {all_inputs} together): folding would grow the model"
                )
            reason = _check_dtype(a, v)
            if reason:
                return NoMatch(reason)
        m.data["arrays"] = outs
        return m

    def rewrite(self, m: Match, b: Builder) -> None:
        for v, a in zip(m.root.outputs, m.data["arrays"]):
            if v.uses or any(v is o for o in m.graph.outputs):
                b.replace(v, b.const(v.name, a, const_type(a, v)))


class TypeQuantizedConstant(Rule):
    """%y = DequantizeLinear(%c: i8 const, %s, %z) -> %y = DequantizeLinear(%c': Q(i8:f32, s, z) const, %s, %z)

    A constant read by DequantizeLinear is a quantized constant; it gets the QuantType
    its scale / zero point describe (a private copy when other nodes read the original,
    e.g. two DequantizeLinear with different scales sharing one integer tensor)."""

    pattern = "y = DequantizeLinear(c, s, z?)"

    def check(self, m: Match) -> Match | NoMatch:
        c = m.value("c")
        if not c.is_const:
            return NoMatch(f"{describe(c)} is not a constant", "pattern")
        if isinstance(c.elem, (QuantType, MXType)):
            # not the type's text: a per-channel type prints every scale, on every sweep
            return NoMatch(f"{describe(c)} already has a quantized type", "pattern")
        for n in ("s", "z"):
            v = m[n]
            if v is not None and not v.is_const:
                return NoMatch(f"{'scale' if n == 's' else 'zero point'} {describe(v)} is not a constant")
        z = m.const("z")
        if z is not None and np.asarray(z).dtype != np.asarray(c.const).dtype:
            return NoMatch(
                f"constant dtype {np.asarray(c.const).dtype} differs from the zero point's {np.asarray(z).dtype}"
            )
        qt = node_qtype(m.root, c, m["s"], m["z"])
        if not isinstance(qt, QuantType) or not isinstance(qt.storage, IntType):
            return NoMatch("the scale / zero point do not describe an integer quantized type")
        m.data["qtype"] = qt
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        c, y = m.value("c"), m.value("y")
        typed = b.const(c.name, c.const, TensorType(m.data["qtype"], tuple(np.shape(c.const))))
        dq = m.root
        return b.op(
            "DequantizeLinear",
            [typed, m["s"], m["z"]],
            dq.attrs,
            types=result_type(shape_from=y, elem_from=y),  # the replaced DQ output's contract
            name=dq.name or None,
            attr_types=dq.attr_types,
        )


def type_operands_of_constant_params(graph: Graph) -> int:
    """Give an int32 accumulator read by DequantizeLinear (``DequantizeLinear(%acc, %s)``
    after ``MatMulInteger`` / ``ConvInteger``) the QuantType its now-constant scale / zero
    point describe, as the loader does for parameters written as constants
    (``annotate_quantized_types``), when all its quantized readers agree. Only int32:
    an 8-bit value may sit between a QuantizeLinear and a DequantizeLinear whose
    parameters differ (a Cast of a QuantizeLinear's output), where the rules that look
    through it compare the two types. Returns how many values were typed."""
    wanted: dict[int, tuple[Value, list[QuantType]]] = {}
    for node in graph.nodes:
        for (kind, i), si, zi in quant_operands(node):
            v = node.input(i) if kind == "in" else None
            if v is None or v.producer is None or v.type is None or v.type.elem != I32:
                continue
            q = quant_type_from_params(node, v, node.input(si), node.input(zi))
            if isinstance(q, QuantType):
                wanted.setdefault(id(v), (v, []))[1].append(q)
    typed = 0
    for v, qs in wanted.values():
        if all(q == qs[0] for q in qs) and v.type is not None:
            v.type = TensorType(qs[0], v.type.shape)
            typed += 1
    return typed


class FoldConstants(RewritePass):
    """Constant folding (see the module docstring). ``evaluator``: folds any node with
    constant inputs (KEEP aside); without it only the native set folds."""

    name = "fold_constants"

    def __init__(self, evaluator: Evaluator | None = None, *, max_output_elements: int = 1 << 16):
        rules: list[Rule] = [FoldConstantNode(), FoldShape(), FoldShapeElements(), TypeQuantizedConstant()]
        if evaluator is None:
            rules.append(FoldShapeArithmetic())
        else:
            rules.append(FoldEvaluated(evaluator, max_output_elements))
        super().__init__(rules)

    def call(self, graph: Graph) -> PassResult:
        result = super().call(graph)
        if result.modified:
            typed = type_operands_of_constant_params(graph)
            if typed:
                result.stats["TypeOperandOfFoldedParams"] = typed
        return result
