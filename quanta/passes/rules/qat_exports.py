"""Three forms that QAT exporters write and the lowering would otherwise not recognise.

ScalarQdqParams (PyTorch's TorchScript exporter, torch.ao FakeQuantize)::

    %y = QuantizeLinear|DequantizeLinear(%x, %s[1]: const, %z[1]?: const) {axis?}
      -> the same node with %s, %z as 0-d constants (per tensor)

A one-element 1-D scale is per-tensor in ONNX Runtime (``IsScalarOr1ElementVector``)
and per axis of size 1 in the ONNX reference, which broadcasts it: the same values
either way. Typed per axis, the integer operators (one input scale) refuse it. Exact.
The computed operand of such a DequantizeLinear (an int32 accumulator whose scale is
``x_scale · w_scale`` of shape [1]) is typed per tensor with it, when every reader of
it is a DequantizeLinear with the same parameters.

PerChannelAffineAsBatchNorm (torch.ao's ConvBn QAT modules: the weight is scaled by
``γ/σ`` before its fake quantization, and the convolution's result is divided by that
factor again, then the bias and a BatchNormalization follow)::

    %y = Mul|Div|Add(%c = Conv(%x, DequantizeLinear(%wq, %sw, %zw?), %B?), %k: const)
      -> %y = BatchNormalization(%c, %g, %beta, 0, 1) {epsilon=0}

with ``g = k`` (Mul), ``1/k`` (Div, in float64 then float32), 1 (Add) and ``beta = k``
(Add), else 0; ``k`` is a scalar or one value per output channel (shape ``[1, M, 1..]``
or ``[M, 1..]``). The BatchNormalization is then the per-channel affine map
``g·c + beta`` exactly (``sqrt(1 + 0) = 1``), and FoldBatchNormIntoQuantizedConv folds
it into the weight scales and the bias: the integer weights stay as the QAT tool
quantized them; only the float32 rounding of ``sw·|g|`` and of the bias differ from
running the three float nodes (docs/qat.md, "Importing QAT models").
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.ir.types import QuantType, TensorType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules.fold_batchnorm import FoldBatchNormIntoQuantizedConv

__all__ = ["PerChannelAffineAsBatchNorm", "QatExports", "ScalarQdqParams", "TransposeOfDequantizedWeight"]


class ScalarQdqParams(Rule):
    """Q/DQ with a one-element 1-D constant scale (and zero point) -> 0-d (module docstring)."""

    pattern = "y = QuantizeLinear|DequantizeLinear(x, s, z?)"

    def check(self, m: Match) -> Match | NoMatch:
        s = m["s"]
        z = m["z"]
        if not s.is_const or np.asarray(s.const).shape != (1,):
            return NoMatch("the scale is not a one-element 1-D constant")
        if z is not None and (not z.is_const or np.asarray(z.const).shape != (1,)):
            return NoMatch("the zero point is not a one-element 1-D constant")
        if m.root.attrs.get("block_size", 0):
            return NoMatch("blocked quantization")
        if any(m["y"] is o for o in m.graph.outputs):
            return NoMatch("a graph output keeps the type its signature declares")
        x = m["x"]
        if m.root.op_type == "DequantizeLinear" and _per_axis(x) and not x.is_const:
            # a computed operand (an int32 accumulator) typed per axis of size 1 by this
            # scale: typed per tensor with it, so every reader must take the same 0-d form
            for use, _ in x.uses:
                if use.op_type != "DequantizeLinear" or not _same_one_element(use, m.root):
                    return NoMatch(
                        f"{x.name} is also read by {use.op_type} '{use.name}' with other parameters"
                    )
        return m

    def rewrite(self, m: Match, b: Builder) -> Value | None:
        s = b.const(f"{m['s'].name}_scalar", np.asarray(m["s"].const).reshape(()))
        z = m["z"]
        if z is not None:
            z = b.const(f"{z.name}_scalar", np.asarray(z.const).reshape(()))
        attrs = {k: v for k, v in m.root.attrs.items() if k != "axis"}
        y = m["y"]
        elem = y.type.elem if y.type is not None else None
        if isinstance(elem, QuantType) and elem.axis is not None:
            elem = QuantType(elem.storage, elem.expressed, elem.scale, elem.zero_point)
        t = None if y.type is None else TensorType(elem, y.type.shape)
        x = m["x"]
        if m.root.op_type == "DequantizeLinear" and _per_axis(x) and not x.is_const:
            q = x.type.elem
            x.type = TensorType(QuantType(q.storage, q.expressed, q.scale, q.zero_point), x.type.shape)
        new = b.op(m.root.op_type, [x, s, z], attrs, types=t, name=m.root.name or None)
        b.replace(y, new, retype=True)
        return None


def _per_axis(v: Value | None) -> bool:
    return (
        v is not None
        and v.type is not None
        and isinstance(v.type.elem, QuantType)
        and v.type.elem.axis is not None
    )


def _same_one_element(a: Node, b: Node) -> bool:
    """Two Q/DQ nodes with equal one-element constant scales and zero points."""
    for i in (1, 2):
        va, vb = a.input(i), b.input(i)
        if (va is None) != (vb is None):
            return False
        if va is None or vb is None:
            continue
        if not (va.is_const and vb.is_const):
            return False
        ca, cb = np.asarray(va.const), np.asarray(vb.const)
        if ca.size != 1 or cb.size != 1 or ca.dtype != cb.dtype or ca.reshape(()) != cb.reshape(()):
            return False
    return True


def _channel_vector(k: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``k`` as one float64 value per channel (axis 1 of a rank-``rank`` output), or None."""
    if k.size == 1:
        return np.full(channels, float(k.reshape(())), np.float64)
    if k.size != channels:
        return None
    shape = tuple(k.shape)
    if len(shape) > rank:
        return None
    full = (1,) * (rank - len(shape)) + shape
    if full[1] != channels or any(d != 1 for i, d in enumerate(full) if i != 1):
        return None
    return k.astype(np.float64).reshape(-1)


class PerChannelAffineAsBatchNorm(Rule):
    """Mul/Div/Add by a per-channel constant after a Conv with a dequantized weight ->
    BatchNormalization (module docstring)."""

    pattern = "y = Mul|Div|Add(c = Conv(x, wf = DequantizeLinear(wq, sw, zw?), B?), k)"

    def check(self, m: Match) -> Match | NoMatch:
        c = m["c"]
        if len(c.uses) != 1 or any(c is o for o in m.graph.outputs):
            return NoMatch("the Conv's output is read elsewhere")
        k = m["k"]
        if not k.is_const:
            return NoMatch("the factor is not a constant")
        wq = m["wq"]
        if not wq.is_const or np.asarray(wq.const).ndim < 3:
            return NoMatch("the weight is not a constant convolution weight")
        ct = c.type
        if ct is None or ct.shape is None:
            return NoMatch("the Conv's output rank is unknown")
        channels = int(np.asarray(wq.const).shape[0])
        vec = _channel_vector(np.asarray(k.const), channels, len(ct.shape))
        if vec is None:
            return NoMatch(f"the constant of shape {np.asarray(k.const).shape} is not per output channel")
        op = m.root.op_type
        with np.errstate(divide="ignore"):
            g = {"Mul": vec, "Div": 1.0 / vec, "Add": np.ones(channels)}[op]
        if not np.all(np.isfinite(g)) or np.any(g == 0):
            return NoMatch("a factor is zero or not finite")
        beta = vec if op == "Add" else np.zeros(channels)
        m.data.update(g=g.astype(np.float32), beta=beta.astype(np.float32), channels=channels)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        d = m.data
        n = d["channels"]
        base = m.root.name or "affine"
        ins = [
            m["c"],
            b.const(f"{base}_g", d["g"]),
            b.const(f"{base}_beta", d["beta"]),
            b.const(f"{base}_mean", np.zeros(n, np.float32)),
            b.const(f"{base}_var", np.ones(n, np.float32)),
        ]
        return b.op(
            "BatchNormalization",
            ins,
            {"epsilon": 0.0},
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.root.name or None,
        )


class TransposeOfDequantizedWeight(Rule):
    """%y = Transpose(%w = DequantizeLinear(%wq: const, %s: const, %z?: const) {axis}) {perm}
    -> %y = DequantizeLinear(transpose(%wq), %s, %z) {axis = perm.index(axis)}

    pytorch-quantization's QuantLinear exports ``MatMul(x, Transpose(DQ(Q(W))))`` with
    ``W`` as ``[out, in]`` quantized per output channel (axis 0). Transposing the integers
    and moving the axis with them is exact (every element keeps its scale)."""

    pattern = "y = Transpose(w = DequantizeLinear(wq, s, z?))"

    def check(self, m: Match) -> Match | NoMatch:
        if any(v is not None and not v.is_const for v in (m["wq"], m["s"], m["z"])):
            return NoMatch("the dequantized tensor or its parameters are not constants")
        if len(m["w"].uses) != 1:
            return NoMatch("the dequantized weight is read elsewhere")
        if m.node("w").attrs.get("block_size", 0):
            return NoMatch("blocked quantization")
        wq = np.asarray(m["wq"].const)
        perm = list(m.root.attrs.get("perm") or reversed(range(wq.ndim)))
        axis = None
        if np.asarray(m["s"].const).size > 1:
            axis = perm.index(int(m.node("w").attrs.get("axis", 1)) % wq.ndim)
        m.data.update(wq=np.ascontiguousarray(np.transpose(wq, perm)), axis=axis)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        d = m.data
        wq_type = m["wq"].type
        elem = wq_type.elem if wq_type is not None else None
        if isinstance(elem, QuantType) and elem.axis is not None:
            elem = QuantType(elem.storage, elem.expressed, elem.scale, elem.zero_point, d["axis"])
        t = None if elem is None else TensorType(elem, tuple(d["wq"].shape))
        wq = b.const(f"{m['wq'].name}_t", d["wq"], t)
        attrs = {} if d["axis"] is None else {"axis": d["axis"]}
        return b.op(
            "DequantizeLinear",
            [wq, m["s"], m["z"]],
            attrs,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.node("w").name or None,
        )


class QatExports(RewritePass):
    """The two rules, with FoldBatchNormIntoQuantizedConv in the same fixpoint so that a
    chain ``Conv -> Div -> Add -> BatchNormalization`` folds completely."""

    name = "qat_exports"
    rules = (
        ScalarQdqParams(),
        PerChannelAffineAsBatchNorm(),
        FoldBatchNormIntoQuantizedConv(),
        TransposeOfDequantizedWeight(),
    )
