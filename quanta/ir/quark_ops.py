"""AMD Quark's quantize / dequantize operators, written back as the operators they compute
(a canonicalization of real files, applied when a model is loaded).

Quark's ONNX quantizer (``quark.onnx.ModelQuantizer``) writes plain QDQ for its 8-bit
configurations, but its extended ones (BF16, FP16, some 16- and 32-bit settings) write
``com.amd.quark::ExtendedQuantizeLinear`` / ``ExtendedDequantizeLinear``, which ONNX
Runtime runs only with Quark's custom-op library registered. Their arithmetic
(``quark/onnx/operators/custom_ops/src/qdq/cpu/quantize_linear.h``), per tensor or along
``axis`` (a 1-element scale is per tensor, as ONNX Runtime reads it):

=======================================  ===============================================
node (zero point type)                   computes, in float32, written as
=======================================  ===============================================
ExtendedQuantizeLinear (8/16-bit int)    sat(rne(x / s) + z): com.microsoft QuantizeLinear
ExtendedDequantizeLinear (8/16/32 int)   f32(q − z) · s: com.microsoft DequantizeLinear
ExtendedQuantizeLinear (bf16, f16)       T(x / s + f32(z)), T's round to nearest even:
                                         Cast(Add(Div(x, s), z), to=T)
ExtendedDequantizeLinear (bf16, f16)     (f32(q) − f32(z)) · s: Mul(Sub(Cast(q), z), s)
=======================================  ===============================================

The com.microsoft pair computes the same map (eq. (2) with a float32 division; eq. (1)),
and quanta lowers it like ONNX's; the float forms are the same float32 operations in the
same order. Quark's fake-quantization nodes (``MXQuantizeDequantize``,
``BFPQuantizeDequantize``) stay as they are and run on their reference kernels
(kernels/reference/quark_qdq.py); anything else of the domain
(``ExtendedInstanceNormalization``, ``ExtendedLSTM``, a float-storage quantizer with a
computed scale) stays too, and the runtime names it at load time.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.graph import unused_name
from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.ir.shape_hints import tensor_types

__all__ = ["QUARK_DOMAIN", "decompose_quark_ops"]

QUARK_DOMAIN = "com.amd.quark"

_INT_Q = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16}
_INT_DQ = _INT_Q | {TensorProto.INT32}
_FLOAT_Q = {TensorProto.BFLOAT16, TensorProto.FLOAT16}
_OPS = ("ExtendedQuantizeLinear", "ExtendedDequantizeLinear")


class _Left(Exception):
    """A node in a form this module does not write: it stays as it is."""


def decompose_quark_ops(proto: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """Rewrites, in place, the main graph's Quark quantize / dequantize nodes listed in the
    module docstring; (node, op, why) for each one left as it is."""
    graph = proto.graph
    if not any(n.domain == QUARK_DOMAIN and n.op_type in _OPS for n in graph.node):
        return []
    inits = {t.name: t for t in graph.initializer}
    types, ranks = _declared(proto)
    taken = {n.name for n in graph.node} | {o for n in graph.node for o in n.output}
    taken |= set(inits) | {i.name for i in graph.input}
    left: list[tuple[str, str, str]] = []
    new_nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    uses_ms = False
    for node in graph.node:
        if node.domain != QUARK_DOMAIN or node.op_type not in _OPS:
            new_nodes.append(node)
            continue
        if node.input and node.input[0] in ranks and node.output:  # both keep their input's shape
            ranks.setdefault(node.output[0], ranks[node.input[0]])
        try:
            nodes, consts, ms = _rewrite(node, inits, types, ranks, taken)
        except _Left as e:
            left.append((node.name, node.op_type, str(e)))
            new_nodes.append(node)
            continue
        new_nodes.extend(nodes)
        new_inits.extend(consts)
        uses_ms = uses_ms or ms
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(new_inits)
    if proto.ir_version < 4:  # IR 3: every initializer is also a graph input
        graph.input.extend(
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in new_inits
        )
    if uses_ms and not any(o.domain == MS_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return left


def _declared(proto: onnx.ModelProto) -> tuple[dict[str, int], dict[str, int]]:
    """Element types and ranks of the graph's initializers, inputs and declared values."""
    g = proto.graph
    types = {t.name: t.data_type for t in g.initializer}
    ranks = {t.name: len(t.dims) for t in g.initializer}
    for name, t in tensor_types([*g.input, *g.value_info, *g.output]).items():
        if t.elem_type:
            types.setdefault(name, t.elem_type)
        if t.HasField("shape"):
            ranks.setdefault(name, len(t.shape.dim))
    return types, ranks


def _rewrite(
    node: onnx.NodeProto,
    inits: dict[str, onnx.TensorProto],
    types: dict[str, int],
    ranks: dict[str, int],
    taken: set[str],
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], bool]:
    """(nodes, initializers, whether they use com.microsoft) standing for ``node``."""
    ins = list(node.input) + [""] * (3 - len(node.input))
    x, s, z = ins[:3]
    if not z:
        raise _Left("no zero point: its type (the storage) is not known")
    ztype = types.get(z)
    if ztype is None:
        raise _Left(f"the zero point {z!r} has no known type")
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    quantize = node.op_type == "ExtendedQuantizeLinear"
    base = node.name or node.output[0]
    if ztype in (_INT_Q if quantize else _INT_DQ):
        attrs = [a for a in node.attribute if a.name == "axis"]
        ms = helper.make_node(
            "QuantizeLinear" if quantize else "DequantizeLinear",
            [x, s, z],
            list(node.output[:1]),
            name=node.name,
            domain=MS_DOMAIN,
        )
        ms.attribute.extend(attrs)
        return [ms], [], True
    if ztype not in _FLOAT_Q:
        raise _Left(f"zero point of type {TensorProto.DataType.Name(ztype)}: no ONNX form written")
    if s not in inits or z not in inits:
        raise _Left("a float-storage quantizer with a computed scale or zero point")
    scale = numpy_helper.to_array(inits[s]).astype(np.float32)
    zero = _float_of(inits[z])
    if scale.size != 1 or zero.size != 1:
        rank = ranks.get(x)
        if rank is None or rank == 0:
            raise _Left(f"a per-channel scale on {x!r}, whose rank is not declared")
        if scale.ndim != 1 or zero.shape != scale.shape:
            raise _Left(
                f"scale {scale.shape} and zero point {zero.shape}: expected one value or one per channel"
            )
        dims = [1] * rank
        dims[axis % rank] = scale.size
        scale, zero = scale.reshape(dims), zero.reshape(dims)
    else:
        scale, zero = scale.reshape(()), zero.reshape(())
    consts = [
        numpy_helper.from_array(scale, unused_name(f"{base}/scale_f32", taken)),
        numpy_helper.from_array(zero, unused_name(f"{base}/zero_point_f32", taken)),
    ]
    sname, zname = consts[0].name, consts[1].name

    def op(op_type: str, inputs: list[str], tag: str, out: str | None = None, **attrs) -> onnx.NodeProto:
        y = out if out is not None else unused_name(f"{base}/{tag}", taken)
        return helper.make_node(op_type, inputs, [y], name=unused_name(f"{base}/{tag}_node", taken), **attrs)

    if quantize:
        div = op("Div", [x, sname], "scaled")
        add = op("Add", [div.output[0], zname], "shifted")
        cast = op("Cast", [add.output[0]], "cast", out=node.output[0], to=ztype)
        return [div, add, cast], consts, False
    up = op("Cast", [x], "widened", to=TensorProto.FLOAT)
    sub = op("Sub", [up.output[0], zname], "centered")
    mul = op("Mul", [sub.output[0], sname], "dequantized", out=node.output[0])
    return [up, sub, mul], consts, False


def _float_of(t: onnx.TensorProto) -> np.ndarray:
    """A bf16 / f16 initializer's values as float32 (exact)."""
    if t.data_type == TensorProto.BFLOAT16:
        import ml_dtypes

        raw = numpy_helper.to_array(t)
        return np.asarray(raw.view(ml_dtypes.bfloat16) if raw.dtype == np.uint16 else raw).astype(np.float32)
    return numpy_helper.to_array(t).astype(np.float32)
