"""LayerNorm written out as float ops becomes one quanta::LayerNormDiv.

    %m = ReduceMean(%x, axes);  %d = Sub(%x, %m)                  axes: the trailing axes
    %p = Pow(%d, 2) | Mul(%d, %d);  %v = ReduceMean(%p, axes)     keepdims 1 (both)
    %s = Sqrt(Add(%v, eps));  %y = Div(%d, %s)                     eps: a float32 scalar
    [%y = Mul(%y, scale)] [%y = Add(%y, bias)]                    constants, either order
      -> %y = quanta::LayerNormDiv(%x, scale?, bias?, axis, epsilon)            FuseLayerNorm

Why: a model exported from a hand-written LayerNorm (``(x - mean) / sqrt(var + eps)``,
openWakeWord's classifiers, many audio and OCR heads) runs seven to nine steps of a few
elements each; on a small model the executor's cost per step, not the arithmetic,
is the run time. The fused op is one step and one pass over the row.

Numerics: exact. The fused op computes eqs. (L1)-(L3), (L4'), (L5') of
docs/float-ops.md, which are the replaced nodes' own float32 operations in their order:
ReduceMean is f32(sum16 / D) on both targets (reduce_ops, native/reduce.py), Pow's
exponent 2 is f32(d · d) (math_ops.POW_EXACT_FORMS), then one IEEE addition, square
root, division, multiplication and addition per element. ONNX's LayerNormalization
multiplies by the reciprocal of the standard deviation instead (a different rounding),
which is why this is not an ai.onnx LayerNormalization. A Mul or Add whose constant
would broadcast the result to a larger shape is left as it is.

In a quantized graph the rule runs after lowering (``lower_qdq``): there the island is
ReduceMean .. Div between a DequantizeLinear (or an integer GEMM's float output) and a
QuantizeLinear, and the Mul / Add by the LayerNorm's weights are integer operators.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Graph, Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["FuseLayerNorm", "FuseLayerNormPass"]


def _producer(v: Value | None, *ops: str) -> Node | None:
    if v is None or v.producer is None or v.producer.domain or v.producer.op_type not in ops:
        return None
    return v.producer


def _const(v: Value | None) -> np.ndarray | None:
    """An initializer's value, or a ``Constant`` node's (ort_float_functions matches these
    patterns before constant folding, where an export's scalars are Constant nodes)."""
    if v is None:
        return None
    if v.is_const:
        return np.asarray(v.const)
    p = v.producer
    if p is not None and p.op_type == "Constant" and not p.domain and "value" in p.attrs:
        return np.asarray(p.attrs["value"])
    return None


def _f32_const(v: Value | None) -> np.ndarray | None:
    a = _const(v)
    return a if a is not None and a.dtype == np.float32 else None


def _is_f32(v: Value | None) -> bool:
    return v is not None and v.elem is not None and str(v.elem) == "f32"


def _internal(v: Value, graph: Graph, uses: int = 1) -> bool:
    """``v`` is read by exactly ``uses`` nodes and is not a graph output."""
    return len(v.consumers()) == uses and not any(o is v for o in graph.outputs)


def _rank(v: Value) -> int | None:
    shape = v.shape
    return None if shape is None else len(shape)


def _mean_axis(node: Node, rank: int | None) -> int | None:
    """The first axis of a ReduceMean over the trailing axes of its input, keepdims 1
    (negative when the rank is unknown), else None."""
    if node.attrs.get("keepdims", 1) != 1:
        return None
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1:
        const = _const(node.inputs[1])
        if const is None or const.dtype.kind not in "iu":
            return None
        axes = const.reshape(-1).tolist()
    if not axes:
        return None
    axes = sorted(int(a) for a in axes)
    if all(a < 0 for a in axes):
        if axes != list(range(-len(axes), 0)):
            return None
        return -len(axes) if rank is None else rank - len(axes)
    if rank is None:
        return None
    axes = sorted(a % rank for a in axes)
    if axes != list(range(rank - len(axes), rank)):
        return None
    return axes[0]


def _scalar_operand(node: Node, other: Value, value: float | None, rank: int | None) -> np.ndarray | None:
    """The float32 constant of size 1 that ``node`` combines with ``other`` (``value``:
    it must be exactly that), when it does not add dimensions; else None."""
    a, b = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    c = b if a is other else a if b is other else None
    arr = _f32_const(c)
    if (
        arr is None
        or arr.size != 1
        or (rank is not None and arr.ndim > rank)
        or (rank is None and arr.ndim > 1)
    ):
        return None
    if value is not None and float(arr.reshape(())) != value:
        return None
    return arr


def _keeps_shape(param: np.ndarray, x: Value, axis: int) -> bool:
    """``param`` broadcast against x (shape kept) varies only over the normalized axes."""
    shape = x.shape
    if shape is None or param.ndim > len(shape):
        return False
    first = axis % len(shape)
    for k in range(1, param.ndim + 1):
        n, dim = param.shape[-k], shape[-k]
        if len(shape) - k < first:
            if n != 1:
                return False
        elif n != 1 and n != dim:
            return False
    return True


def _affine(y: Value, graph: Graph, op: str, x: Value, axis: int) -> tuple[Node, np.ndarray, Value] | None:
    """The Mul / Add by a constant that is ``y``'s only reader, when it keeps x's shape:
    (node, constant, constant value)."""
    if not _internal(y, graph):
        return None
    node = y.consumers()[0]
    if node.domain or node.op_type != op or len(node.inputs) != 2 or not _is_f32(node.outputs[0]):
        return None
    c = node.inputs[1] if node.inputs[0] is y else node.inputs[0]
    arr = _f32_const(c)
    if arr is None or c is y or not _keeps_shape(arr, x, axis):
        return None
    return node, arr, c


def _mean_square_root(
    sqrt: Node, d: Value, rank: int | None, what: str
) -> tuple[Node, Node, Node, np.ndarray] | NoMatch:
    """(add, mean, square, eps) of ``sqrt = Sqrt(Add(ReduceMean(Pow(d, 2) | Mul(d, d)), eps))``
    with eps a float32 scalar (the denominator LayerNorm and RMS norm share), else the
    NoMatch that says which part differs (``what``: how the reason names d)."""
    add = _producer(sqrt.inputs[0], "Add")
    mean = None
    if add is not None:
        for v in add.inputs:
            mean = _producer(v, "ReduceMean") or mean
    if add is None or mean is None:
        return NoMatch("the Sqrt does not read Add(ReduceMean(...), eps)")
    eps = _scalar_operand(add, mean.outputs[0], None, rank)
    if eps is None:
        return NoMatch("the Add does not add a float32 scalar epsilon")
    square = _producer(mean.inputs[0], "Pow", "Mul")
    if square is None or square.inputs[0] is not d:
        return NoMatch(f"the ReduceMean does not average Pow(d, 2) or Mul(d, d) of {what}")
    if square.op_type == "Mul" and square.inputs[1] is not d:
        return NoMatch(f"the ReduceMean does not average Mul(d, d) of {what}")
    if square.op_type == "Pow" and _scalar_operand(square, d, 2.0, rank) is None:
        return NoMatch("the Pow has an exponent other than a float32 2")
    return add, mean, square, eps


class FuseLayerNorm(Rule):
    """Div(Sub(x, ReduceMean(x)), Sqrt(Add(ReduceMean(Pow(d, 2)), eps))) [· scale] [+ bias]
    -> quanta::LayerNormDiv(x, scale?, bias?)"""

    pattern = "y = Div(d, s)"

    def check(self, m: Match) -> Match | NoMatch:
        y, d, s = m.value("y"), m.value("d"), m.value("s")
        if not _is_f32(y):
            return NoMatch("not a float32 Div")
        sub = _producer(d, "Sub")
        sqrt = _producer(s, "Sqrt")
        if sub is None or sqrt is None:
            return NoMatch("not Div(Sub(x, mean), Sqrt(...))")
        x, mean = sub.inputs[0], sub.inputs[1]
        mean_node = _producer(mean, "ReduceMean")
        if mean_node is None or mean_node.inputs[0] is not x or not _is_f32(x):
            return NoMatch("the Sub does not subtract ReduceMean(x) from a float32 x")
        rank = _rank(x)
        axis = _mean_axis(mean_node, rank)
        if axis is None:
            return NoMatch("the mean is not over the trailing axes with keepdims 1")
        found = _mean_square_root(sqrt, d, rank, "d = x - mean")
        if isinstance(found, NoMatch):
            return found
        add, var_node, square, eps = found
        if _mean_axis(var_node, rank) != axis:
            return NoMatch("the variance is not over the mean's axes")
        g = m.graph
        chain = [mean_node, sub, square, var_node, add, sqrt]
        if not _internal(d, g, uses=2):
            return NoMatch(f"'{d.name}' (x - mean) has readers besides the Pow and the Div")
        for node in chain[2:]:
            if not _internal(node.outputs[0], g):
                return NoMatch(f"the intermediate '{node.outputs[0].name}' has other users")
        if not _internal(mean, g):
            return NoMatch(f"the mean '{mean.name}' has other users")
        scale = _affine(y, g, "Mul", x, axis)
        bias = _affine(scale[0].outputs[0] if scale else y, g, "Add", x, axis)
        m.data.update(x=x, axis=axis, eps=float(eps.reshape(())), scale=scale, bias=bias)
        # the engine removes the matched nodes whose outputs the rewrite left unread, in
        # this order: from the last node the fused op replaces back to the mean
        tail = [a[0] for a in (bias, scale) if a is not None]
        m.matched = [*tail, m.root, *reversed(chain)]
        return m

    def rewrite(self, m: Match, b: Builder) -> None:
        x, scale, bias = m.data["x"], m.data["scale"], m.data["bias"]
        inputs: list[Value | None] = [x, scale[2] if scale else None, bias[2] if bias else None]
        while inputs[-1] is None:
            inputs.pop()
        last = (bias or scale or (None, None, None))[0]
        old = m["y"] if last is None else last.outputs[0]
        assert old is not None
        attrs = {"axis": int(m.data["axis"]), "epsilon": m.data["eps"]}
        new = b.op(
            "LayerNormDiv", inputs, attrs, types=result_type(shape_from=old, elem_from=old), domain="quanta"
        )
        b.replace(old, new)


class FuseLayerNormPass(RewritePass):
    """FuseLayerNorm, then FuseRMSNorm (passes/rules/fuse_rms_norm.py) on what is left:
    the written-out norms of a float graph or of a quantized graph's float islands."""

    name = "fuse_layer_norm"

    def __init__(self) -> None:
        # imported here: fuse_rms_norm reads this module's pattern helpers
        from quanta.passes.rules.fuse_rms_norm import FuseRMSNorm

        super().__init__([FuseLayerNorm(), FuseRMSNorm()])
