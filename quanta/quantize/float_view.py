"""The float view of an already-quantized ONNX file: the float model it stands for.

A file quantized by another tool (ONNX Runtime's QDQ, QOperator or dynamic formats, NNCF,
a QAT export) often ships without its float original. Its float view is what the file
computes with every activation quantization removed and every weight dequantized::

    W_f = (W_q - zp_W) * s_W                          (per tensor, per axis or per block)
    DQ(Q(x))                    -> x                  (an activation Q/DQ pair is dropped)
    QLinearConv(x_q, .., W_q, .., B_q)
                                -> Conv(x_f, W_f, B_q * s_x * s_W)
    QLinearMatMul / QLinearAdd / QLinearMul / QLinearSigmoid / QLinearLeakyRelu /
    QLinearSoftmax / QLinearAveragePool / QLinearGlobalAveragePool / QLinearConcat / QGemm
                                -> their float operator on the float views of the inputs
    Mul(Cast(MatMulInteger(DynamicQuantizeLinear(x), W_q, .., zp_W)), s_x * s_W)
                                -> MatMul(x, W_f)      (ConvInteger -> Conv alike)
    DynamicQuantizeMatMul / MatMulIntegerToFloat -> MatMul (+ Add of the bias)
    DynamicQuantizeLSTM(x, W_q, R_q, ..)  -> LSTM(x, W_f^T, R_f^T, ..)

Every value keeps its name: a quantized operator's output is the float operator's output
under the same name (so ``quanta debug`` matches the two models tensor by tensor), and a
DequantizeLinear's output becomes the float value the pair stood for. An integer value
that something the view keeps still reads (a graph output, an operator with no float
counterpart listed here) is quantized again from its float view with the file's own
parameters, so the view is a valid model whatever it holds; what stays quantized is
listed in :attr:`FloatView.kept` with the reason.

Data-movement operators that ONNX Runtime's QOperator format runs on 8-bit data
(Reshape, Transpose, MaxPool, Slice, ...) commute with dequantization (a monotone map
applied elementwise), so the view runs them on the float values.

Only the main graph is rewritten; the bodies of If / Loop / Scan are kept as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.graph import unused_name
from quanta.kernels.reference.quantize import dequantize_linear, quantize_linear

__all__ = ["FloatView", "derive_float_view", "is_quantized", "quantized_ops"]


#: Operators that only quantized files hold (any domain): the default ONNX ones and the
#: com.microsoft ones ONNX Runtime's quantizer writes
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearSoftmax",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QLinearReduceMean",
        "QLinearWhere",
        "QGemm",
        "QAttention",
        "QEmbedLayerNormalization",
        "DynamicQuantizeLSTM",
        "DynamicQuantizeGRU",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
    }
)

#: Operators that move or select elements: on 8-bit data they compute what they compute
#: on the dequantized data (dequantization is elementwise and monotone)
_MOVES = frozenset(
    {
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Identity",
        "MaxPool",
        "Slice",
        "Split",
        "Gather",
        "GatherElements",
        "Expand",
        "Tile",
        "DepthToSpace",
        "SpaceToDepth",
        "Pad",
        "Resize",
        "ReduceMax",
        "ReduceMin",
        "Concat",
        "GlobalMaxPool",
    }
)

#: QLinear operators with one float counterpart: (float op, data input positions, output
#: scale and zero-point positions)
_QLINEAR: dict[str, tuple[str, tuple[int, ...], tuple[int, int]]] = {
    "QLinearMatMul": ("MatMul", (0, 3), (6, 7)),
    "QLinearAdd": ("Add", (0, 3), (6, 7)),
    "QLinearMul": ("Mul", (0, 3), (6, 7)),
    "QLinearSigmoid": ("Sigmoid", (0,), (3, 4)),
    "QLinearLeakyRelu": ("LeakyRelu", (0,), (3, 4)),
    "QLinearSoftmax": ("Softmax", (0,), (3, 4)),
    "QLinearAveragePool": ("AveragePool", (0,), (3, 4)),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", (0,), (3, 4)),
}


#: Layers whose following Relu / Clip the tools fold into the output's quantization grid
_FOLDS_ACTIVATION = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "MatMul",
        "Gemm",
        "Add",
        "Sub",
        "Sum",
        "BatchNormalization",
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QGemm",
    }
)


def quantized_ops(proto: onnx.ModelProto) -> list[str]:
    """The quantization operators of the main graph, sorted (empty for a float model)."""
    return sorted({n.op_type for n in proto.graph.node if n.op_type in QUANTIZED_OPS})


def is_quantized(proto: onnx.ModelProto) -> bool:
    return bool(quantized_ops(proto))


@dataclass
class FloatView:
    """The derived float model and what the derivation did."""

    model: onnx.ModelProto
    dequantized_weights: int = 0
    dropped_pairs: int = 0
    clamps: int = 0  # activation grids starting at 0: a Relu (or Clip(0, 6)) in the view
    mapped: dict[str, int] = field(default_factory=dict)  # quantized op -> how many became float
    kept: list[tuple[str, str, str]] = field(default_factory=list)  # (node, op, reason) still quantized
    # the file's own activation grids: float tensor of the view -> (scale, zero point,
    # storage type name), per tensor only
    activation_params: dict[str, tuple[float, int, str]] = field(default_factory=dict)

    def format(self) -> str:
        parts = [
            f"{self.dequantized_weights} weight(s) dequantized",
            f"{self.dropped_pairs} Q/DQ pair(s) dropped",
        ]
        if self.clamps:
            parts.append(f"{self.clamps} activation grid(s) starting at 0 kept as Relu / Clip(0, 6)")
        parts += [f"{op} {n}" for op, n in sorted(self.mapped.items())]
        line = "float view: " + ", ".join(parts)
        if self.kept:
            line += f"; {len(self.kept)} node(s) kept quantized: " + ", ".join(
                f"{name or '<unnamed>'} ({op}: {why})" for name, op, why in self.kept[:6]
            )
        return line


def dequantize(
    q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, axis: int = 1, block_size: int = 0
) -> np.ndarray:
    """DequantizeLinear of a constant (per tensor, per axis ``axis``, or per block of
    ``block_size`` along it): the reference twin, in the scale's float type."""
    return dequantize_linear(q, scale, zero_point, axis=axis, block=block_size or None)


def _body_refs(graph: onnx.GraphProto) -> set[str]:
    """Every name the nodes of ``graph``'s If / Loop / Scan bodies read (outer-scope
    values among them), recursively."""
    out: set[str] = set()
    for n in graph.node:
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for sub in subs:
                out.update(x for m in sub.node for x in m.input)
                out |= _body_refs(sub)
    return out


def quantize(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    axis: int = 1,
    block_size: int = 0,
    saturate: int = 1,
) -> np.ndarray:
    """QuantizeLinear of a constant, as the file computes it at run time: the reference
    twin (the division in the scale's type, round half to even, saturated to the zero
    point's type; uint8 without one)."""
    dtype = np.dtype(np.uint8) if zero_point is None else zero_point.dtype
    return np.asarray(
        quantize_linear(
            x, scale, zero_point, axis=axis, block=block_size or None, dtype=dtype, saturate=bool(saturate)
        )
    )


class _Deriver:
    """One pass over the source's nodes in order; every rewrite emits its float nodes at
    the place of the node it replaces, so the view stays topologically ordered."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        self.src = proto
        g = proto.graph
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        for n in g.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
                for a in n.attribute:
                    if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                        self.consts[n.output[0]] = numpy_helper.to_array(a.t)
        self.users: dict[str, list[onnx.NodeProto]] = {}
        self.producer: dict[str, onnx.NodeProto] = {}
        for n in g.node:
            for x in n.input:
                if x:
                    self.users.setdefault(x, []).append(n)
            for y in n.output:
                if y:
                    self.producer[y] = n
        self.body_refs = _body_refs(g)
        # integer value -> (the name of its float view, scale name, zero-point name); an
        # integer value whose producer the view no longer has
        self.real: dict[str, tuple[str, str, str]] = {}
        # DynamicQuantizeLinear outputs: the float view is the input, the node is kept
        # (dead-code removal drops it when nothing integer reads it)
        self.dql: dict[str, tuple[str, onnx.NodeProto]] = {}
        self.alias: dict[str, str] = {}  # a dropped DequantizeLinear's output -> its float view
        self.requantized: dict[str, str] = {}  # integer value -> its re-quantized name
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}
        self.skip: set[int] = set()  # source nodes a rewrite consumed
        self.view = FloatView(onnx.ModelProto())
        self.taken = set(self.consts) | set(self.producer) | {i.name for i in g.input}

    # ---------------------------------------------------------------- helpers
    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def fresh(self, base: str) -> str:
        return unused_name(base, self.taken)

    def add_init(self, base: str, arr: np.ndarray) -> str:
        name = self.fresh(base)
        self.inits[name] = arr
        return name

    def mapped(self, op: str) -> None:
        self.view.mapped[op] = self.view.mapped.get(op, 0) + 1

    def f(self, name: str) -> str:
        """The view's name for a float value of the source."""
        return self.alias.get(name, name)

    def real_of(self, name: str) -> str | None:
        """The float view of integer value ``name`` (None: it has none here)."""
        if name in self.real:
            return self.real[name][0]
        if name in self.dql:
            return self.dql[name][0]
        return None

    def weight(self, q: str, scale: str, zp: str, axis: int, base: str) -> str | None:
        """A dequantized constant as a new initializer (None: not a constant)."""
        qa, sa = self.const(q), self.const(scale)
        if qa is None or sa is None:
            return None
        self.view.dequantized_weights += 1
        return self.add_init(base, dequantize(qa, sa, self.const(zp), axis))

    def operand(self, n: onnx.NodeProto, i: int, axis: int) -> str | None:
        """Input ``i`` of a QLinear operator (its scale and zero point at i + 1, i + 2)
        as a float value of the view."""
        ins = [*list(n.input), "", ""]
        r = self.real_of(ins[i])
        return r if r is not None else self.weight(ins[i], ins[i + 1], ins[i + 2], axis, ins[i] + "_float")

    def emit(
        self, op: str, ins: list[str], outs: list[str], name: str, domain: str = "", **attrs: Any
    ) -> None:
        self.nodes.append(helper.make_node(op, ins, outs, name=name, domain=domain, **attrs))
        self.taken.update(outs)

    @staticmethod
    def attrs(node: onnx.NodeProto, drop: Iterable[str] = ()) -> dict[str, Any]:
        skip = set(drop)
        return {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in skip}

    def integer(self, x: str) -> str:
        """The name of integer value ``x`` for a node that reads it as an integer: the
        source's, or, where the view replaced its producer, ``x`` quantized again from its
        float view with the file's parameters."""
        if x not in self.real:
            return x
        if x not in self.requantized:
            r, s, z = self.real[x]
            # the source's name, unless the float operator that replaced its producer writes it
            name = self.fresh(x + "_q") if any(x in m.output for m in self.nodes) else x
            self.emit(
                "QuantizeLinear", [r, s] + ([z] if z else []), [name], name=self.fresh(x + "_requantize")
            )
            self.requantized[x] = name
        return self.requantized[x]

    # ---------------------------------------------------------------- rules
    def run(self) -> FloatView:
        for node in self.src.graph.node:
            if id(node) in self.skip:
                continue
            op = node.op_type
            handler = getattr(self, "_" + op, None)
            if op in QUANTIZED_OPS and handler is not None and handler(node):
                continue
            if op in QUANTIZED_OPS:
                self.view.kept.append((node.name, op, "no float form here: kept quantized"))
            self.keep(node)
        return self.finish()

    def keep(self, node: onnx.NodeProto) -> None:
        """Copy ``node``; a data-movement node on an integer value runs on its float view."""
        ins = list(node.input)
        for x in ins:
            if x in self.dql and node.op_type in _MOVES:  # the run-time scale and zero point
                d = self.dql[x][1]
                self.real.setdefault(x, (self.dql[x][0], d.output[1], d.output[2]))
                self.requantized.setdefault(x, x)  # the kept node writes it
        data = [i for i, x in enumerate(ins) if x in self.real and self.real[x][1]]
        new = onnx.NodeProto()
        new.CopyFrom(node)
        if node.op_type in _MOVES and data and (node.op_type == "Concat" or data == [0]):
            for i in data:
                new.input[i] = self.real[ins[i]][0]
            for i, x in enumerate(ins):
                if i not in data and x:
                    new.input[i] = self.integer(x) if x in self.real else self.f(x)
            s, z = self.real[ins[data[0]]][1:]
            if node.op_type == "Pad" and len(ins) > 2 and ins[2] in self.consts and self.const(s) is not None:
                # the pad value is a level of the data's grid: its real value pads the view
                real = dequantize(self.consts[ins[2]], np.asarray(self.const(s)), self.const(z))
                new.input[2] = self.add_init(ins[2] + "_float", real.astype(np.float32))
            self.nodes.append(new)
            for y in node.output:  # float now, under their own names
                if y:
                    self.real[y] = (y, s, z)
            self.mapped(node.op_type + " on 8-bit data")
            return
        for i, x in enumerate(ins):
            if x:
                new.input[i] = self.integer(x) if x in self.real else self.f(x)
        self.nodes.append(new)

    # QDQ
    def _QuantizeLinear(self, n: onnx.NodeProto) -> bool:
        x = n.input[0]
        if len(n.input) < 2:
            return False
        if x in self.consts:  # a float weight quantized in the file: the integer weight it holds
            xa, sa = self.const(x), self.const(n.input[1])
            if xa is None or sa is None:
                return False
            zp = self.const(n.input[2]) if len(n.input) > 2 else None
            a = self.attrs(n)
            qa = quantize(
                xa, sa, zp, int(a.get("axis", 1)), int(a.get("block_size", 0)), int(a.get("saturate", 1))
            )
            # an initializer for whatever reads it as an integer (dropped when nothing does)
            self.consts[n.output[0]] = self.inits[n.output[0]] = qa
            return True
        self.real[n.output[0]] = (self.f(x), n.input[1], n.input[2] if len(n.input) > 2 else "")
        self.record(self.f(x), n.input[1], n.input[2] if len(n.input) > 2 else "")
        return True

    def record(self, name: str, scale: str, zp: str) -> None:
        s = self.const(scale)
        z = self.const(zp) if zp else np.zeros((), np.uint8)
        if s is None or z is None or s.size != 1 or z.size != 1 or z.dtype.kind not in "iu":
            return
        self.view.activation_params.setdefault(
            name, (float(s.reshape(-1)[0]), int(z.reshape(-1)[0]), z.dtype.name)
        )

    def _DequantizeLinear(self, n: onnx.NodeProto) -> bool:
        x, y = n.input[0], n.output[0]
        zp = n.input[2] if len(n.input) > 2 else ""
        if x in self.consts:
            qa, sa = self.const(x), self.const(n.input[1])
            if qa is None or sa is None:
                return False
            a = self.attrs(n)
            self.inits[y] = dequantize(
                qa, sa, self.const(zp), int(a.get("axis", 1)), int(a.get("block_size", 0))
            )
            self.view.dequantized_weights += 1
            return True
        r = self.real_of(x)
        sa = self.const(n.input[1])
        chain = self._moved_weight(x) if r is None and sa is not None and sa.size == 1 else None
        if chain and sa is not None:
            # a per-tensor weight moved in 8 bits (an embedding's Gather, a Transpose): the
            # same moves of the dequantized weight (per axis, a move would move the axis)
            qa = self.consts[chain[-1].input[0]]
            cur = self.add_init(chain[-1].input[0] + "_float", dequantize(qa, sa, self.const(zp)))
            self.view.dequantized_weights += 1
            for k, m in enumerate(reversed(chain)):
                moved = onnx.NodeProto()
                moved.CopyFrom(m)
                moved.input[:] = [cur] + [self.f(v) for v in m.input[1:]]
                cur = y if k == len(chain) - 1 else self.fresh(m.output[0] + "_float")
                moved.output[:] = [cur]
                moved.name = self.fresh(m.name + "_float")
                self.nodes.append(moved)
            return True
        if r is None:
            return False  # an integer graph input, an operator kept quantized: DQ kept
        if (
            x in self.real
            and self.producer.get(x) is not None
            and self.producer[x].op_type == "QuantizeLinear"
        ):
            self.view.dropped_pairs += 1
        q = self.producer.get(x)
        made_by = self.producer.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else q
        if x in self.real and self.clamp(r, y, *self.real[x][1:], made_by=made_by):
            pass
        elif y in {o.name for o in self.src.graph.output} or y in self.body_refs:
            self.emit("Identity", [r], [y], name=self.fresh(y + "_float_view"))
        else:
            self.alias[y] = r
        return True

    def clamp(self, x: str, y: str, scale: str, zp: str, made_by: onnx.NodeProto | None) -> bool:
        """``y`` = ``x`` clamped as the tools fold an activation into a quantization grid,
        if the grid says so: its lowest level the real 0 (zero point the type's minimum)
        after a layer the tools fold a Relu into (``made_by``: the node that computes the
        grid's float value) is a folded Relu; a top level of 6 too is a folded Relu6 /
        Clip(0, 6) (ONNX Runtime sets the grid to the clip's range, exact to float
        rounding; a calibrated maximum is never 6 to 1e-5). A grid at 0 after anything
        else (a GELU whose negative tail a percentile range dropped, a Softmax) is the
        file's clipping, which the reference must not share. False: nothing emitted."""
        if made_by is None or made_by.op_type not in _FOLDS_ACTIVATION:
            return False
        s = self.const(scale)
        if s is None or s.size != 1:
            return False
        z = self.const(zp) if zp else np.zeros((), np.uint8)
        if z is None or z.size != 1 or z.dtype.kind not in "iu":
            return False
        info = np.iinfo(z.dtype)
        if int(z.reshape(-1)[0]) != int(info.min):
            return False
        top = float(info.max - info.min) * float(s.reshape(-1)[0])
        name = self.fresh(y + "_clamp")
        if abs(top - 6.0) <= 1e-5 * 6.0:
            lo = self.add_init(y + "_clip_min", np.zeros((), np.float32))
            hi = self.add_init(y + "_clip_max", np.array(6.0, np.float32))
            self.emit("Clip", [x, lo, hi], [y], name=name)
        else:
            self.emit("Relu", [x], [y], name=name)
        self.view.clamps += 1
        return True

    def _moved_weight(self, x: str) -> list[onnx.NodeProto] | None:
        """The one-output moves from an integer constant to ``x``, nearest first (None:
        ``x`` is not one)."""
        chain: list[onnx.NodeProto] = []
        while len(chain) < 8:
            p = self.producer.get(x)
            if p is None or p.op_type not in _MOVES or len(p.output) != 1 or not p.input:
                return None
            chain.append(p)
            x = p.input[0]
            if x in self.consts:
                return chain
        return None

    # QOperator
    def _qout(self, n: onnx.NodeProto, s: int, z: int) -> None:
        """The float operator writes ``n``'s output under its name; its integer meaning
        keeps the file's output parameters."""
        y = n.output[0]
        zp = n.input[z] if len(n.input) > z else ""
        self.real[y] = (y, n.input[s], zp)
        self.record(y, n.input[s], zp)
        self.mapped(n.op_type)
        last = self.nodes[-1]
        pre = self.fresh(y + "_unclamped")
        if self.clamp(pre, y, n.input[s], zp, made_by=n):  # a folded activation (see clamp)
            last.output[0] = pre
        else:
            self.taken.discard(pre)

    def _QLinearConv(self, n: onnx.NodeProto) -> bool:
        x = self.real_of(n.input[0])
        xs, ws = self.const(n.input[1]), self.const(n.input[4])
        if x is None or xs is None or ws is None:
            return False
        w = self.weight(n.input[3], n.input[4], n.input[5], 0, n.input[3] + "_float")
        if w is None:
            return False
        ins = [x, w]
        if len(n.input) > 8 and n.input[8]:
            b = self.const(n.input[8])
            if b is None:
                return False
            real_b = b.astype(np.float64) * float(xs.reshape(-1)[0]) * ws.astype(np.float64).reshape(-1)
            ins.append(self.add_init(n.input[8] + "_float", real_b.astype(np.float32)))
        self.emit("Conv", ins, [n.output[0]], name=n.name, **self.attrs(n))
        self._qout(n, 6, 7)
        return True

    def _qlinear(self, n: onnx.NodeProto) -> bool:
        op, data, (s, z) = _QLINEAR[n.op_type]
        if any(a.name == "channels_last" and a.i for a in n.attribute):
            return False
        found = [self.operand(n, i, -1) for i in data]
        ins = [x for x in found if x is not None]
        if len(ins) != len(found):
            return False
        attrs = self.attrs(n, drop=("opset", "channels_last"))
        opset = next((a.i for a in n.attribute if a.name == "opset"), 13)
        y = n.output[0]
        if op == "Softmax" and opset < 13:
            # before opset 13 Softmax normalizes the input flattened to 2-D at ``axis``
            flat, soft, shape = self.fresh(y + "_2d"), self.fresh(y + "_softmax"), self.fresh(y + "_shape")
            self.emit(
                "Flatten",
                [ins[0]],
                [flat],
                name=self.fresh(n.name + "_flatten"),
                axis=int(attrs.get("axis", 1)),
            )
            self.emit("Softmax", [flat], [soft], name=n.name, axis=-1)
            self.emit("Shape", [ins[0]], [shape], name=self.fresh(n.name + "_shape"))
            self.emit("Reshape", [soft, shape], [y], name=self.fresh(n.name + "_reshape"))
        else:
            self.emit(op, ins, [y], name=n.name, **attrs)
        self._qout(n, s, z)
        return True

    _QLinearMatMul = _QLinearAdd = _QLinearMul = _QLinearSigmoid = _qlinear
    _QLinearLeakyRelu = _QLinearSoftmax = _QLinearAveragePool = _QLinearGlobalAveragePool = _qlinear

    def _QLinearConcat(self, n: onnx.NodeProto) -> bool:
        ins = [self.operand(n, i, 1) for i in range(2, len(n.input), 3)]
        if not ins or any(x is None for x in ins):
            return False
        self.emit("Concat", [x for x in ins if x is not None], [n.output[0]], name=n.name, **self.attrs(n))
        self._qout(n, 0, 1)
        return True

    def _QGemm(self, n: onnx.NodeProto) -> bool:
        ins = list(n.input) + [""] * 9
        a, b = self.operand(n, 0, -1), self.operand(n, 3, -1)
        attrs = self.attrs(n)
        axis = 0 if attrs.get("transB", 0) else -1
        if b is None:
            return False
        if ins[3] in self.consts:  # per-column scales follow B's output axis
            b = self.weight(ins[3], ins[4], ins[5], axis, ins[3] + "_float")
        sa, sb = self.const(ins[1]), self.const(ins[4])
        if a is None or b is None or sa is None or sb is None:
            return False
        gemm_in = [a, b]
        if ins[6]:
            c = self.const(ins[6])
            if c is None:
                return False
            # C is int32 at scale alpha * s_A * s_B (ONNX Runtime's QGemm)
            real_c = (
                c.astype(np.float64)
                * float(attrs.get("alpha", 1.0))
                * float(sa.reshape(-1)[0])
                * sb.astype(np.float64).reshape(-1)
            )
            gemm_in.append(self.add_init(ins[6] + "_float", real_c.astype(np.float32)))
            attrs["beta"] = 1.0
        self.emit("Gemm", gemm_in, [n.output[0]], name=n.name, **attrs)
        if ins[7]:
            self._qout(n, 7, 8)
        else:
            self.mapped(n.op_type)
        return True

    # dynamic quantization
    def _DynamicQuantizeLinear(self, n: onnx.NodeProto) -> bool:
        # its output's float view is its input; the node stays for whatever reads the
        # integer (dead-code removal drops it when only the rewrites below read it)
        self.dql[n.output[0]] = (self.f(n.input[0]), n)
        self.keep(n)
        return True

    def _integer_chain(self, n: onnx.NodeProto) -> tuple[list[onnx.NodeProto], str, str] | None:
        """MatMulInteger / ConvInteger -> Cast(float) -> Mul(., s_x * s_W), as ONNX
        Runtime's quantize_dynamic writes them: the two nodes after the integer op, the
        float result's name and the weight scale's name."""
        users = self.users.get(n.output[0], [])
        if len(users) != 1 or users[0].op_type != "Cast":
            return None
        cast = users[0]
        users = self.users.get(cast.output[0], [])
        if len(users) != 1 or users[0].op_type != "Mul" or n.input[0] not in self.dql:
            return None
        mul = users[0]
        dql = self.dql[n.input[0]][1]
        other = mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]
        p = self.producer.get(other)
        if p is None or p.op_type != "Mul":
            return None
        a, b = p.input
        if a == dql.output[1] and b in self.consts:
            return [cast, mul], mul.output[0], b
        if b == dql.output[1] and a in self.consts:
            return [cast, mul], mul.output[0], a
        return None

    def _integer_op(self, n: onnx.NodeProto, op: str, axis: int) -> bool:
        chain = self._integer_chain(n)
        if chain is None:
            return False
        nodes, out, ws = chain
        zp = n.input[3] if len(n.input) > 3 else ""
        w = self.weight(n.input[1], ws, zp, axis, n.input[1] + "_float")
        x = self.real_of(n.input[0])
        if w is None or x is None:
            return False
        self.emit(op, [x, w], [out], name=n.name, **self.attrs(n))
        self.skip.update(id(m) for m in nodes)
        self.mapped(n.op_type)
        return True

    def _MatMulInteger(self, n: onnx.NodeProto) -> bool:
        return self._integer_op(n, "MatMul", -1)

    def _ConvInteger(self, n: onnx.NodeProto) -> bool:
        return self._integer_op(n, "Conv", 0)

    def _with_bias(self, n: onnx.NodeProto, a: str, w: str, bias: str) -> None:
        y = n.output[0]
        if bias:
            mm = self.fresh(y + "_matmul")
            self.emit("MatMul", [a, w], [mm], name=n.name)
            self.emit("Add", [mm, self.f(bias)], [y], name=self.fresh(n.name + "_bias"))
        else:
            self.emit("MatMul", [a, w], [y], name=n.name)
        self.mapped(n.op_type)

    def _DynamicQuantizeMatMul(self, n: onnx.NodeProto) -> bool:
        ins = list(n.input) + [""] * 5
        w = self.weight(ins[1], ins[2], ins[3], -1, ins[1] + "_float")
        if w is None:
            return False
        self._with_bias(n, self.f(ins[0]), w, ins[4])
        return True

    def _MatMulIntegerToFloat(self, n: onnx.NodeProto) -> bool:
        ins = list(n.input) + [""] * 7
        w = self.weight(ins[1], ins[3], ins[5], -1, ins[1] + "_float")
        a = self.real_of(ins[0])
        if w is None:
            return False
        if a is None:  # an integer activation of the file: dequantized as the operator does
            a = self.fresh(ins[0] + "_float")
            self.emit("DequantizeLinear", [ins[0], ins[2]] + ([ins[4]] if ins[4] else []), [a], name=a)
        self._with_bias(n, a, w, ins[6])
        return True

    def _DynamicQuantizeLSTM(self, n: onnx.NodeProto) -> bool:
        return self._dynamic_recurrent(n, "LSTM", 8)

    def _DynamicQuantizeGRU(self, n: onnx.NodeProto) -> bool:
        """quanta::DynamicQuantizeGRU (kernels/reference/dq_gru.py) -> GRU: the same layout
        as DynamicQuantizeLSTM's, its scales and zero points at inputs 6-9."""
        return self._dynamic_recurrent(n, "GRU", 6)

    def _dynamic_recurrent(self, n: onnx.NodeProto, op: str, params: int) -> bool:
        """A dynamic recurrent node -> ``op`` with dequantized W, R; inputs 3 .. params − 1
        as the float op's, then W_scale, W_zero_point, R_scale, R_zero_point."""
        ins = list(n.input) + [""] * 12
        mats = []
        for q, s, z in ((ins[1], ins[params], ins[params + 1]), (ins[2], ins[params + 2], ins[params + 3])):
            qa, sa = self.const(q), self.const(s)
            if qa is None or sa is None or qa.ndim != 3:
                return False
            za = self.const(z)
            # ORT's layout [D, I, G·H], scales per direction [D] or per gate column [D, G·H]
            sc = sa.astype(np.float64).reshape(qa.shape[0], 1, -1)
            zc = np.zeros_like(sc) if za is None else za.astype(np.float64).reshape(qa.shape[0], 1, -1)
            real = ((qa.astype(np.float64) - zc) * sc).astype(np.float32)
            mats.append(self.add_init(q + "_float", np.ascontiguousarray(real.transpose(0, 2, 1))))
            self.view.dequantized_weights += 1
        rest = [self.f(x) if x else "" for x in ins[3:params]]
        while rest and not rest[-1]:
            rest.pop()
        self.emit(op, [self.f(ins[0]), *mats, *rest], list(n.output), name=n.name, **self.attrs(n))
        self.mapped(n.op_type)
        return True

    # ---------------------------------------------------------------- output
    def finish(self) -> FloatView:
        g = self.src.graph
        written = {y for n in self.nodes for y in n.output}
        outputs = []
        for o in g.output:
            v = onnx.ValueInfoProto()
            v.CopyFrom(o)
            if o.name in self.real:  # the view's output is the float value it stands for
                r = self.real[o.name][0]
                if o.name not in written:
                    self.emit("Identity", [r], [o.name], name=self.fresh(o.name + "_float_view"))
                v.type.tensor_type.elem_type = TensorProto.FLOAT
            outputs.append(v)
        used = {o.name for o in g.output} | self.body_refs
        keep: list[onnx.NodeProto] = []
        for n in reversed(self.nodes):  # dead code: scale products, unread parameters
            if any(y in used for y in n.output) or not n.output:
                keep.append(n)
                used.update(n.input)
        keep.reverse()
        inits = [t for t in g.initializer if t.name in used and t.name not in self.inits]
        inits += [numpy_helper.from_array(a, k) for k, a in self.inits.items() if k in used]
        graph = helper.make_graph(keep, g.name, list(g.input), outputs, inits, doc_string=g.doc_string)
        m = onnx.ModelProto()
        m.CopyFrom(self.src)
        m.graph.CopyFrom(graph)
        # a DynamicQuantizeGRU's function goes with the last node that reads it (the view
        # writes those nodes as GRUs): a file quantized again keeps no unused body
        used = {(n.domain, n.op_type, n.overload) for n in keep}
        functions = [
            f
            for f in m.functions
            if (f.domain, f.name) != ("quanta", "DynamicQuantizeGRU")
            or (f.domain, f.name, f.overload) in used
        ]
        del m.functions[:]
        m.functions.extend(functions)
        self.view.model = m
        return self.view


def _is_integer(v: onnx.ValueInfoProto) -> bool:
    return v.type.tensor_type.elem_type in (
        TensorProto.INT8,
        TensorProto.UINT8,
        TensorProto.INT16,
        TensorProto.UINT16,
        TensorProto.INT32,
    )


def derive_float_view(model: str | os.PathLike | bytes | onnx.ModelProto) -> FloatView:
    """The float model an already-quantized file stands for (module docstring); a float
    model comes back unchanged (with nothing mapped)."""
    from quanta.ir.onnx_io import load_proto

    proto, _ = load_proto(model)
    return _Deriver(proto).run()
