"""An elementwise function between two 8-bit tensors becomes a 256-entry table.

::

    %y = QuantizeLinear(f(DequantizeLinear(%x, sx, zx)), sy, zy)
      -> %y = quanta::QLinearLookup(%x, sx, zx, sy, zy, %table)                  (LowerLookup)

    table[bits(c)] = QuantizeLinear(f(DequantizeLinear(c, sx, zx)), sy, zy)   for each of the
                                                                              256 codes c

    table[c, bits(code)] = QuantizeLinear(f(DequantizeLinear(code, sx, zx)), sy, zy)    (T3)
                           for each code and each index c along the one axis the group's
                           constants vary along (a per-channel table, attribute ``axis``)

``f`` is any group of float elementwise nodes (``TABLE_OPS``) whose only non-constant
leaf is the one dequantized ``x`` and whose constants are scalars (or all vary along one
and the same axis of x, with an inference BatchNormalization counted as varying along
axis 1: then ``f`` is a function of the element and its channel, and the table has a row
per channel, eq. (T3); ONNX Runtime's quantizer leaves ``DQ -> BatchNormalization -> Q``
after a Conv whose output it quantized first, 35 times in the PP-OCR classifier): one activation
(HardSwish, HardSigmoid, Tanh, Exp, Gelu, a Clip or Relu the output quantization does not
imply), a gated pair (SiLU ``Mul(x, Sigmoid(x))``, Mish ``Mul(x, Tanh(Softplus(x)))``,
hardswish before opset 14 ``Mul(x, HardSigmoid(x))``), or arithmetic written out
(``x · Clip(x + 3, 0, 6) / 6``). ``bits(c)`` is the code's byte (int8 -128..-1 sit at
128..255), which is what the table kernel indexes with; the table holds the output's
codes, so input and output may differ in storage (NNCF quantizes a depthwise Conv's
output to int8 and the ReLU after its BatchNormalization to uint8).

16-bit codes (ONNX Runtime's ``activation_type=QUInt16`` files) take one table of 65536
entries per tensor (128 KiB), 16 bits in and out, and only scalar constants: a group
whose constants vary along an axis (a BatchNormalization, a per-channel bias) is the
affine map LowerAffine16 (passes/lower/wide.py) computes instead, and so is a per-tensor
affine group whose codes do not sit on rounding ties (LowerAffine16 runs first).

Numerics: the table is computed at compile time by running the group's own nodes on the
256 codes with the reference kernels the unlowered graph runs (the evaluator the runtime
injects, as constant folding's): the DequantizeLinear, each float op in graph order, the
QuantizeLinear. An elementwise float32 function of an element depends only on that
element, so ``table[bits(x)]`` is what the unlowered group computes for ``x``: the
lowering is bit-exact by construction, whatever ``f`` is (TFLite builds its int8
activation tables the same way).

Where ONNX Runtime has an operator for the group (QLinearSigmoid, QLinearLeakyRelu:
LowerUnary), that rule runs first; this rule takes the rest. Refused (each with its
reason): no evaluator; an 8-bit type missing or per-axis on either side; a constant that
varies along more than one axis of x, or constants along different axes (an element
would no longer depend on itself and its channel alone); a group
value used outside the group; more than ``MAX_GROUP`` nodes.
"""

from __future__ import annotations

import math

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.ir.types import QuantType
from quanta.passes.lower.code_group import MAX_GROUP, QUANTA_DOMAIN, CodeGroupRule, CodeSpec, lookup_codes
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe, node_qtype
from quanta.passes.rules.fold_constants import Evaluator

__all__ = [
    "CODE_MAPS16",
    "MAX_GROUP",
    "QUANTA_DOMAIN",
    "QUANTA_TABLE_OPS",
    "TABLE_OPS",
    "ComposeCodeMaps16",
    "ComposeCodeMaps16Pass",
    "ComposeLookups",
    "ComposeLookupsPass",
    "LowerLookup",
    "compose_tables",
    "constant_codes",
    "group_table",
    "lookup_codes",
]

#: ai.onnx ops that are elementwise functions of their inputs (with numpy broadcasting),
#: so a group of them fed by one tensor and scalar constants is a function of each element
TABLE_OPS = frozenset(
    {
        # unary activations and math
        "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Celu", "Clip", "Cos",
        "Cosh", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity",
        "LeakyRelu", "Log", "Mish", "Neg", "Reciprocal", "Relu", "Round", "Selu", "Shrink",
        "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh",
        "ThresholdedRelu",
        # binary arithmetic (with scalar constants or group values); PRelu's slope is a
        # constant per channel in the Keras and Caffe nets that use it (a table per channel)
        "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu",
    }
)  # fmt: skip

#: ops that are a function of each element and its index along the channel axis (axis 1):
#: in a group they make a table per channel (docs/passes.md (T3))
CHANNEL_OPS = frozenset({"BatchNormalization"})

#: quanta-domain elementwise float32 functions: ONNX Runtime's Sigmoid and Tanh
#: (passes/rules/ort_float_functions.py puts them in place of Sigmoid and Tanh)
QUANTA_TABLE_OPS = frozenset({"MlasLogistic", "MlasTanh"})

#: the storage types the table kernel maps (float8 and 4-bit codes are not its business)
EIGHT_BIT = ("u8", "i8")
#: 16-bit codes: one table of 65536 entries per tensor (128 KiB), 16-bit in and out
SIXTEEN_BIT = ("u16", "i16")


def _channel_axis(const_shape: tuple[int, ...], x_shape: tuple | None) -> int | None:
    """The one axis of x along which a constant of ``const_shape`` varies (numpy
    broadcasting, x of rank >= 2 with that dimension known and equal), else None."""
    if x_shape is None or len(x_shape) < 2 or len(const_shape) > len(x_shape):
        return None
    padded = (1,) * (len(x_shape) - len(const_shape)) + tuple(const_shape)
    varying = [i for i, d in enumerate(padded) if d != 1]
    if (
        len(varying) != 1
        or not isinstance(x_shape[varying[0]], int)
        or x_shape[varying[0]] != padded[varying[0]]
    ):
        return None
    return varying[0]


def constant_codes(v: Value | None) -> bool:
    """``v`` is a constant or a QuantizeLinear of constants (ONNX Runtime's quantizer writes
    a Constant node's value as ``QuantizeLinear(Constant)``, which stays a node until
    constant folding runs), so the same codes on every run."""
    if v is None:
        return False
    if v.is_const:
        return True
    p = v.producer
    return (
        p is not None
        and p.op_type == "QuantizeLinear"
        and not p.domain
        and all(i is None or i.is_const for i in p.inputs)
    )


def _dequantized_constant(v: Value) -> bool:
    """``v`` is a DequantizeLinear of constant codes (a quantized weight), so a constant too."""
    p = v.producer
    return (
        p is not None
        and p.op_type == "DequantizeLinear"
        and not p.domain
        and bool(p.inputs)
        and constant_codes(p.inputs[0])
        and all(i is None or i.is_const for i in p.inputs[1:])
    )


def _constant_shape(v: Value | None) -> tuple[int, ...] | None:
    """The shape of a constant or a dequantized one; None for a computed value."""
    if v is None:
        return None
    if v.is_const:
        return tuple(np.shape(v.const))
    p = v.producer
    if p is not None and _dequantized_constant(v):
        codes = p.inputs[0]
        if codes is not None and not codes.is_const and codes.producer is not None:
            codes = codes.producer.inputs[0]  # QuantizeLinear(constant): the constant's shape
        return tuple(np.shape(codes.const)) if codes is not None else None
    return None


def _batchnorm_refusal(n: Node, x_shape: tuple | None) -> str:
    """Why an inference BatchNormalization cannot sit in a per-channel table ("" if it can)."""
    if int(n.attrs.get("training_mode", 0)) or not int(n.attrs.get("spatial", 1)):
        return f"{n.label} is not an inference BatchNormalization over the channel axis"
    if any(o.uses for o in n.outputs[1:]):
        return f"{n.label}: a running-statistics output is used"
    if x_shape is None or len(x_shape) < 2 or not isinstance(x_shape[1], int):
        return f"{n.label}: its input's channel count is not known"
    for v in n.inputs[1:]:
        if _constant_shape(v) != (x_shape[1],):
            return f"{n.label}: parameter {describe(v) if v is not None else '(none)'} is not a constant [{x_shape[1]}]"
    return ""


def _elem_dtype(q: QuantType) -> np.dtype:
    return np.dtype(q.storage.numpy)  # type: ignore[union-attr]


def group_table(
    evaluator: Evaluator,
    dq: Node,
    nodes: list[Node],
    root: Node,
    qx: QuantType,
    qy: QuantType,
    axis: int | None,
) -> np.ndarray:
    """The codes ``root`` (a QuantizeLinear) gives for every code of ``dq``'s input through
    ``nodes`` (the float group, in graph order), computed by the reference kernels: the
    table of LowerLookup, [2^bits] per tensor or [C, 256] along ``axis``."""
    values: dict[int, np.ndarray] = {}

    def arg(v: Value | None) -> np.ndarray | None:
        if v is None:
            return None
        if id(v) in values:
            return values[id(v)]
        if not v.is_const:  # a dequantized weight: its DequantizeLinear (and QuantizeLinear)
            p = v.producer
            assert p is not None and (_dequantized_constant(v) or constant_codes(v))
            values[id(v)] = np.asarray(evaluator(p, [arg(i) for i in p.inputs])[0])
            return values[id(v)]
        return np.asarray(v.const)

    codes = lookup_codes(_elem_dtype(qx))
    if axis is not None:
        # the 256 codes along another axis of a [1, .., C, .., 256, .., 1] tensor, so
        # the per-channel constants broadcast as they do on x: row c of the result is
        # the group on every code of channel c (docs/passes.md (T3))
        shape = [1] * len(dq.inputs[0].type.shape)
        other = len(shape) - 1 if axis != len(shape) - 1 else len(shape) - 2
        shape[axis], shape[other] = int(dq.inputs[0].type.shape[axis]), 256
        codes = np.ascontiguousarray(
            np.broadcast_to(codes.reshape([256 if i == other else 1 for i in range(len(shape))]), shape)
        )
    elif dq.inputs[0].type is not None and dq.inputs[0].type.shape is not None:
        # the codes along the last axis of a [1, .., 1, 256] tensor of x's rank: a
        # one-element constant of x's rank broadcasts onto it as onto x (PRelu takes
        # no slope of a higher rank than x: GTCRN's slopes are [1, 1, 1])
        codes = codes.reshape([1] * (len(dq.inputs[0].type.shape) - 1) + [codes.size])
    values[id(dq.inputs[0])] = codes
    for node in [dq, *nodes, root]:
        outs = evaluator(node, [arg(v) for v in node.inputs])
        values[id(node.outputs[0])] = np.asarray(outs[0])
    out = values[id(root.outputs[0])]
    if axis is None:
        table = out.reshape(codes.size)
    else:
        table = np.ascontiguousarray(np.moveaxis(out, (axis, other), (0, 1)).reshape(shape[axis], 256))
    if table.dtype != _elem_dtype(qy):
        raise AssertionError(f"table of {root.label}: {table.dtype}")
    return table


class LowerLookup(Rule):
    """``Q(f(DQ(x))) -> quanta::QLinearLookup(x, sx, zx, sy, zy, table)`` (module docstring)."""

    pattern = "y = QuantizeLinear(f, sy, zy?)"

    def __init__(self, evaluator: Evaluator | None = None, *, per_channel: bool = True) -> None:
        self.evaluator = evaluator
        # False: scalar constants and 8-bit codes only (one 256-entry table, IntLookup's form)
        self.per_channel = per_channel

    def check(self, m: Match) -> Match | NoMatch:
        if self.evaluator is None:
            return NoMatch("no evaluator to compute the table with (the runtime injects one)")
        q = m.root
        for name in ("sy", "zy"):
            if m[name] is not None and not m[name].is_const:
                return NoMatch(f"{name} {describe(m[name])} is not a constant")
        qy = node_qtype(q, m["y"], m["sy"], m["zy"])
        storages = EIGHT_BIT + (SIXTEEN_BIT if self.per_channel else ())
        if qy is None or qy.axis is not None or str(qy.storage) not in storages:
            return NoMatch(f"output y is not a per-tensor u8/i8 quantized value ({qy})")
        group = self._group(m, m.value("f"))
        if isinstance(group, NoMatch):
            return group
        nodes, dq = group
        x = dq.inputs[0]
        if any(v is not None and not v.is_const for v in dq.inputs[1:]):
            return NoMatch(f"{dq.label}: its scale or zero point is not a constant")
        qx = node_qtype(dq, x, dq.input(1), dq.input(2))
        if qx is None or qx.axis is not None or str(qx.storage) not in storages:
            return NoMatch(f"input {describe(x)} is not a per-tensor u8/i8 quantized value ({qx})")
        wide = str(qx.storage) in SIXTEEN_BIT
        if wide != (str(qy.storage) in SIXTEEN_BIT):
            return NoMatch(
                f"input {qx.storage} and output {qy.storage}: the table maps 8 to 8 or 16 to 16 bits"
            )
        shape = x.type.shape if x.type is not None and x.type.shape is not None else None
        rank = len(shape) if shape is not None else 0
        axes: set[int] = set()
        for n in nodes:
            if n.op_type == "BatchNormalization":
                why = _batchnorm_refusal(n, shape)
                if why:
                    return NoMatch(why)
                axes.add(1)
                continue
            for v in n.inputs:
                cshape = _constant_shape(v)
                if cshape is None or (math.prod(cshape) == 1 and len(cshape) <= rank):
                    continue
                axis = _channel_axis(cshape, shape)
                if axis is None:
                    return NoMatch(
                        f"{n.label}: constant {describe(v)} is not a scalar of rank <= {rank} "
                        f"nor a vector along one axis of x {describe(x)}"
                    )
                axes.add(axis)
        if axes and not self.per_channel:
            return NoMatch("the group varies along an axis of x and this target takes one table per tensor")
        if len(axes) > 1:
            return NoMatch(f"the group's constants vary along different axes of x ({sorted(axes)})")
        if axes and wide:
            return NoMatch(
                "16-bit codes with constants along an axis: a table per channel would take C·128 KiB "
                "(LowerAffine16 takes the affine ones)"
            )
        m.data.update(nodes=nodes, dq=dq, qx=qx, qy=qy, axis=axes.pop() if axes else None)
        # the group's nodes go with the rewrite (last first: each then has no user left),
        # so the table op can take the name of the group's last op
        m.matched.extend(reversed(nodes))
        return m

    def _group(self, m: Match, f: Value) -> tuple[list[Node], Node] | NoMatch:
        """The float nodes between the one DequantizeLinear and the root, in graph order."""
        graph = m.graph
        members: dict[int, Node] = {}
        dq: Node | None = None
        stack = [f]
        seen: set[int] = set()
        while stack:
            v = stack.pop()
            if id(v) in seen or v.is_const:
                continue
            seen.add(id(v))
            p = v.producer
            if p is None:
                return NoMatch(f"{describe(v)} is not computed from a DequantizeLinear")
            if _dequantized_constant(v):
                continue  # a weight's DequantizeLinear (ORT quantizes a BN scale): a constant
            if p.op_type == "DequantizeLinear" and not p.domain:
                if dq is not None and dq is not p:
                    return NoMatch(f"the group reads two dequantized tensors ({dq.label}, {p.label})")
                dq = p
                continue
            if p.op_type not in {"": TABLE_OPS | CHANNEL_OPS, QUANTA_DOMAIN: QUANTA_TABLE_OPS}.get(
                p.domain, ()
            ):
                return NoMatch(f"{p.label} is not an elementwise op a table can hold")
            if len(p.outputs) != 1:
                return NoMatch(f"{p.label} has {len(p.outputs)} outputs")
            members[id(p)] = p
            if len(members) > MAX_GROUP:
                return NoMatch(
                    f"more than {MAX_GROUP} nodes between the DequantizeLinear and the QuantizeLinear"
                )
            stack.extend(i for i in p.inputs if i is not None)
        if dq is None or not members:
            return NoMatch("no float op between a DequantizeLinear and the QuantizeLinear")
        for n in members.values():
            out = n.outputs[0]
            if any(o is out for o in graph.outputs):
                return NoMatch(f"'{out.name}' (output of {n.label}) is a graph output")
            for c in out.consumers():
                if id(c) not in members and c is not m.root:
                    return NoMatch(
                        f"'{out.name}' (output of {n.label}) is also used by {c.label} outside the group"
                    )
        # a few members: their positions by list search (a node equals only itself),
        # not a position map of the whole graph per check
        return sorted(members.values(), key=graph.nodes.index), dq

    def _table(self, m: Match) -> np.ndarray:
        """Run DQ, the group's nodes in graph order and Q on the 256 (65536) codes (reference kernels)."""
        assert self.evaluator is not None
        return group_table(
            self.evaluator, m.data["dq"], m.data["nodes"], m.root, m.data["qx"], m.data["qy"], m.data["axis"]
        )

    def rewrite(self, m: Match, b: Builder) -> Value:
        try:
            table = self._table(m)
        except Exception as e:  # a reference kernel refusing the 256 codes (a bad attribute)
            b.refuse(f"the table could not be computed: {type(e).__name__}: {e}")
            raise
        dq: Node = m.data["dq"]
        ops = [n.op_type for n in m.data["nodes"]]
        sx, zx = dq.inputs[1], dq.input(2)
        zy = m["zy"]
        if zx is None:
            zx = b.const("x_zero_point", np.zeros((), _elem_dtype(m.data["qx"])))
        if zy is None:
            zy = b.const("y_zero_point", np.zeros((), _elem_dtype(m.data["qy"])))
        t = b.const(f"{m.root.name or 'lookup'}_table", table)
        attrs: dict[str, object] = {"function": "/".join(ops)}
        if m.data["axis"] is not None:
            attrs["axis"] = int(m.data["axis"])
        return b.op(
            "QLinearLookup",
            [dq.inputs[0], sx, zx, m["sy"], zy, t],
            attrs,
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            # the group's last op names the table (coverage pairs a node with what it became)
            name=m.value("f").producer.name or m.root.name or None,
        )


class ComposeLookups(Rule):
    """Two tables in a row are one:
    ``QLinearLookup(QLinearLookup(x, t1), t2) -> QLinearLookup(x, t)`` with

    ::

        t[c, b] = t2[c, bits(t1[c, b])]                         (T5, docs/passes.md)

    a per-tensor table taken for every channel (its row for each c), both tables per
    channel along the same axis of x, or one of them per tensor. The inner table holds the
    intermediate codes, so ``t2[bits(t1[bits(x)])]`` is what the two steps compute: exact by
    construction. ONNX Runtime's quantizer writes a BatchNormalization decomposed into
    Sub / Mul / Add as a Q / DQ pair around every op (open_nsfw: 213 per-channel tables,
    four in a row after each convolution), each its own pass over the tensor; composed,
    one pass. 8-bit codes only (a 16-bit table is 65536 entries a step)."""

    pattern = (
        "y = quanta::QLinearLookup(m = quanta::QLinearLookup(x, sx, zx?, _, _?, t1), _, _?, sy, zy?, t2)"
    )

    def check(self, m: Match) -> Match | NoMatch:
        inner = m.value("m").producer
        assert inner is not None
        for name in ("t1", "t2"):
            if not m[name].is_const:
                return NoMatch(f"table {describe(m[name])} is not a constant")
            if np.asarray(m[name].const).dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
                return NoMatch(f"table {describe(m[name])} is not of 8-bit codes")
        shape = m["x"].type.shape if m["x"].type is not None else None
        axes = []
        for node in (inner, m.root):
            axis = node.attrs.get("axis")
            if axis is not None and axis < 0:
                if shape is None:
                    return NoMatch(f"{node.label}: a negative axis on x of unknown rank")
                axis += len(shape)
            axes.append(axis)
        t1, t2 = np.asarray(m["t1"].const), np.asarray(m["t2"].const)
        if axes[0] is not None and axes[1] is not None and (axes[0] != axes[1] or t1.shape != t2.shape):
            return NoMatch(f"tables along axes {axes[0]} {t1.shape} and {axes[1]} {t2.shape} of x")
        m.data["axis"] = axes[0] if axes[0] is not None else axes[1]
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        inner = m.value("m").producer
        assert inner is not None
        t1, t2 = np.asarray(m["t1"].const), np.asarray(m["t2"].const)
        table = compose_tables(t1, t2)
        zx, zy = m["zx"], m["zy"]
        if zx is None:
            zx = b.const("x_zero_point", np.zeros((), _code_dtype(m["x"])))
        if zy is None:
            zy = b.const("y_zero_point", np.zeros((), t2.dtype))
        t = b.const(f"{m.root.name or 'lookup'}_table", np.ascontiguousarray(table))
        functions = [inner.attrs.get("function", ""), m.root.attrs.get("function", "")]
        attrs: dict[str, object] = {"function": ", ".join(f for f in functions if f)}
        if m.data["axis"] is not None:
            attrs["axis"] = int(m.data["axis"])
        return b.op(
            "QLinearLookup",
            [m["x"], m["sx"], zx, m["sy"], zy, t],
            attrs,
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.root.name or None,
        )


def compose_tables(inner: np.ndarray, outer: np.ndarray) -> np.ndarray:
    """The one table of ``outer`` after ``inner`` (8-bit codes, each [256] or [C, 256]),
    eq. (T5): ``t[c, b] = outer[c, bits(inner[c, b])]``, a [256] table standing for every
    row; [256] when both are."""
    bits = inner.view(np.uint8)  # the intermediate codes as the outer table's index
    if outer.ndim == 1:
        return outer[bits]
    if inner.ndim == 1:
        return np.ascontiguousarray(outer[:, bits])
    return np.take_along_axis(outer, bits, axis=1)


def _code_dtype(v: Value) -> np.dtype:
    assert v.type is not None
    return np.dtype(v.type.elem.numpy)  # type: ignore[union-attr]


class ComposeLookupsPass(RewritePass):
    """ComposeLookups to a fixed point: a chain of tables becomes one."""

    name = "compose_lookups"

    def __init__(self) -> None:
        super().__init__([ComposeLookups()])


#: quanta's elementwise ops on 16-bit codes whose result at an element depends on that
#: element's codes alone (per-tensor parameters): the members of a composed 16-bit table
CODE_MAPS16 = frozenset({"QLinearAffine16", "QLinearMul16", "QLinearAdd16", "QLinearLookup"})
#: the activation inputs of each (the other inputs are scales, zero points, constants)
_CODE_INPUTS = {
    "QLinearAffine16": (0,),
    "QLinearMul16": (0, 3),
    "QLinearAdd16": (0, 3),
    "QLinearLookup": (0,),
}
#: (scale, zero point) of the input read at each activation position, and of the output
_CODE_PARAMS = {
    "QLinearAffine16": {0: (1, 2), "y": (3, 4)},
    "QLinearMul16": {0: (1, 2), 3: (4, 5), "y": (6, 7)},
    "QLinearAdd16": {0: (1, 2), 3: (4, 5), "y": (6, 7)},
    "QLinearLookup": {0: (1, 2), "y": (3, 4)},
}


def _code_map16_refusal(n: Node) -> str:
    """Why ``n`` cannot sit in a composed 16-bit table ("" if it can): a quanta op on
    16-bit codes with constant per-tensor parameters (an affine map with one ``a`` and
    ``b``, a product or sum of two codes, a 65536-entry table)."""
    if n.domain != QUANTA_DOMAIN or n.op_type not in CODE_MAPS16 or len(n.outputs) != 1:
        return f"{n.label} is not a quanta elementwise op on 16-bit codes"
    acts = _CODE_INPUTS[n.op_type]
    for i, v in enumerate(n.inputs):
        if i in acts:
            t = v.type if v is not None else None
            if t is None or t.elem is None or np.dtype(t.elem.numpy) not in (np.uint16, np.int16):  # type: ignore[union-attr]
                return f"{n.label}: input {describe(v)} is not of 16-bit codes"
            if v is not None and v.is_const and np.asarray(v.const).size != 1:
                return f"{n.label}: constant operand {describe(v)} has more than one element"
        elif v is not None and not v.is_const:
            return f"{n.label}: parameter {describe(v)} is not a constant"
        elif v is not None and n.op_type != "QLinearLookup" and np.asarray(v.const).size != 1:
            if n.op_type == "QLinearAffine16" and i in (5, 6):
                return f"{n.label}: a and b vary along an axis (a map per channel)"
            return f"{n.label}: parameter {describe(v)} is not per tensor"
    if n.op_type == "QLinearLookup":
        t = n.input(5)
        if "axis" in n.attrs or t is None or np.asarray(t.const).shape != (65536,):
            return f"{n.label}: not one 65536-entry table per tensor"
    return ""


class ComposeCodeMaps16(CodeGroupRule):
    """A group of quanta ops on 16-bit codes that is a function of one tensor's codes
    becomes one 65536-entry table:

    ::

        y = g(x), g a group of QLinearAffine16 (per tensor), QLinearMul16, QLinearAdd16,
            QLinearLookup (per tensor) whose only run-time input is x
          -> y = quanta::QLinearLookup(x, sx, zx, sy, zy, table)
             table[bits(c)] = g(c) for each of the 65536 codes c                 (T6)

    ONNX Runtime's 16-bit QDQ file writes HardSwish as ``x + 3``, ``x · (x + 3)`` and
    ``/ 6``, each between Q / DQ pairs; lowered, three steps over the tensor (two affine
    maps and a product of two codes), composed, one gather. Every member maps the codes at
    an element to the codes at that element (the product's operands are both computed
    from x, so of x's shape), so ``g`` on the 65536 codes, run with the reference kernels
    the unlowered steps run (the injected evaluator), is what the steps compute for each
    element: (T6) is exact by construction, whatever the members round. A single member
    stays as it is (one affine pass costs less than a gather from a 128 KiB table).
    Refused: no evaluator, a member with per-axis parameters, a group reading two tensors,
    a group value used outside the group, more than ``MAX_GROUP`` members (the walk and the
    table: passes/lower/code_group.py)."""

    # (a domain names one alternative: each is written with its own)
    pattern = (
        "y = quanta::QLinearAffine16|quanta::QLinearMul16|quanta::QLinearAdd16|quanta::QLinearLookup(...)"
    )

    entries = 65536

    def spec(self, n: Node) -> CodeSpec:
        return _CODE_INPUTS[n.op_type], _CODE_PARAMS[n.op_type]

    def refusal(self, n: Node) -> str:
        return _code_map16_refusal(n)

    def single_refusal(self, n: Node) -> str:
        # one affine pass costs less than a gather from a 128 KiB table
        return "one op on the codes: nothing to compose"


class ComposeCodeMaps16Pass(RewritePass):
    """ComposeCodeMaps16 to a fixed point."""

    name = "compose_code_maps16"

    def __init__(self, evaluator: Evaluator | None = None) -> None:
        super().__init__([ComposeCodeMaps16(evaluator)])
