"""Direct-cast MX quantization: an FP32 ONNX model -> an MX-quantized ONNX model.

No calibration data: every MX scale comes from its own block's maximum (weights now, at
export; activations at run time), docs/quantization-math.md eqs. (MX3)-(MX4).

Which nodes: MatMul and Gemm whose B is a 2-D float32 initializer, and Conv with
``group = 1`` (a depthwise or grouped convolution reduces over fewer channels than a
block; it stays float, as MX accelerators keep it). Blocks run along each operand's
reduction axis: MatMul B [K, N] axis 0, Gemm B axis 0 (axis 1 when ``transB``), Conv W
[O, C, kh, kw] axis 1; activations along their last axis (MatMul), axis 1 (Gemm without
``transA``, Conv).

Two ONNX forms (``form``):

- ``"e8m0"`` (default, opset 24): weights are ``DequantizeLinear(elements, scale:
  float8e8m0, axis, block_size, output_dtype=FLOAT)``; activations pass through
  ``quanta::QuantizeMX`` (schema in docs/quantization-math.md section 11 and
  :func:`quanta.kernels.reference.mx.quantize_mx_op`) and a DequantizeLinear of the same
  kind. quanta runs it; ONNX Runtime 1.32 runs neither a float8e8m0 scale nor the quanta
  domain.
- ``"float-scale"`` (opset 21): the same values with each E8M0 scale written as the
  float32 power of two it stands for (exact), activations quantized by a subgraph of
  standard operators (:func:`_activation_subgraph`): ONNX Runtime runs it for MXINT8,
  MXFP8 E4M3 and E5M2 (its DequantizeLinear has no float4/float6 kernel).

In both forms the scale tensor is what DequantizeLinear multiplies by: for MXINT8 that
is the OCP scale times MXINT8's implicit 2^-6 (:func:`quanta.kernels.reference.mx.dq_scale_codes`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.types import MX_ELEMENTS
from quanta.kernels.reference import mx as mxref

__all__ = ["MX_TYPES", "MXSummary", "is_mx_type", "quantize_mx_model"]

#: the quantizer's option names (weight_type / activation_type)
MX_TYPES = frozenset(k for k in MX_ELEMENTS)

QUANTA_DOMAIN = "quanta"

_ONNX_ELEM = {
    "i8": TensorProto.INT8,
    "f8e4m3fn": TensorProto.FLOAT8E4M3FN,
    "f8e5m2": TensorProto.FLOAT8E5M2,
    "f4e2m1fn": TensorProto.FLOAT4E2M1,
    "f6e3m2fn": TensorProto.FLOAT6E3M2,
    "f6e2m3fn": TensorProto.FLOAT6E2M3,
}
#: element types ONNX's DequantizeLinear (opset 25) accepts: not float6
_DQ_ELEMS = frozenset({"i8", "f8e4m3fn", "f8e5m2", "f4e2m1fn"})
#: element types ONNX Runtime 1.32's DequantizeLinear runs (blocked, float32 scale)
ORT_ELEMS = frozenset({"i8", "f8e4m3fn", "f8e5m2"})


def is_mx_type(name: object) -> bool:
    return isinstance(name, str) and name.lower() in MX_TYPES


@dataclass
class MXSummary:
    """What :func:`quantize_mx_model` did."""

    weight_type: str | None
    activation_type: str | None
    block_size: int
    form: str
    quantized: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [
            f"MX direct cast: weights {self.weight_type or 'float'}, activations {self.activation_type or 'float'}, "
            f"block {self.block_size}, form {self.form}: {len(self.quantized)} nodes quantized"
        ]
        for name, why in self.skipped.items():
            lines.append(f"  float: {name}: {why}")
        return "\n".join(lines)


def _elem(name: str | None) -> str | None:
    if name is None:
        return None
    if not is_mx_type(name):
        raise ValueError(f"MX type: unknown {name!r}; expected one of {', '.join(sorted(MX_TYPES))}")
    return MX_ELEMENTS[name.lower()]


def quantize_mx_model(
    model: onnx.ModelProto | str | os.PathLike,
    weight_type: str | None = "mxint8",
    activation_type: str | None = "mxint8",
    *,
    block_size: int = 32,
    form: str = "e8m0",
    mode: str = "ocp",
    op_types: frozenset[str] = frozenset({"MatMul", "Gemm", "Conv"}),
    exclude: tuple[str, ...] = (),
    overrides: dict[str, tuple[str | None, str | None]] | None = None,
) -> tuple[onnx.ModelProto, MXSummary]:
    """Direct-cast MX quantization (module docstring). ``weight_type`` /
    ``activation_type``: mxfp8_e4m3, mxfp8_e5m2, mxint8, mxfp4 (mxfp6_e3m2 / mxfp6_e2m3
    only for activations in the e8m0 form is not offered: ONNX has no float6
    DequantizeLinear), or None for float. ``mode``: the rounding of
    :func:`quanta.kernels.reference.mx.quantize_mx`: "ocp" (eq. (MX3)), "ceil" (eq. (MX3c):
    the shared exponent one step up where a block's maximum would saturate) or
    "microxcaling". ``overrides``: node name (or regular expression, the first that
    matches) -> ``(weight_type, activation_type)`` for that node instead of the defaults,
    e.g. MXINT8 islands in an MXFP8 model; ``exclude`` still wins (the node stays float)."""
    if form not in ("e8m0", "float-scale"):
        raise ValueError(f"quantize_mx_model: form must be 'e8m0' or 'float-scale', got {form!r}")
    if block_size <= 0:
        raise ValueError(f"quantize_mx_model: block_size must be positive, got {block_size}")
    if mode not in ("ocp", "ceil", "microxcaling"):
        raise ValueError(f"quantize_mx_model: mode must be 'ocp', 'ceil' or 'microxcaling', got {mode!r}")
    if form == "float-scale" and mode == "microxcaling":
        raise ValueError(
            "quantize_mx_model: the float-scale form's activation subgraph rounds as the OCP rule "
            "(mode 'ocp' or 'ceil'), not as microxcaling"
        )
    we, ae = _elem(weight_type), _elem(activation_type)
    over = {p: (_elem(w), _elem(a)) for p, (w, a) in (overrides or {}).items()}
    choices = [("weight_type", we, weight_type), ("activation_type", ae, activation_type)]
    for p, (w, a) in (overrides or {}).items():
        choices += [
            (f"overrides[{p!r}] weight", over[p][0], w),
            (f"overrides[{p!r}] activation", over[p][1], a),
        ]
    for what, e, t in choices:
        if e is not None and e not in _DQ_ELEMS:
            raise ValueError(f"{what}: {t} has no ONNX DequantizeLinear (ONNX has no float6 input type)")
        if e is not None and form == "float-scale" and e not in ORT_ELEMS:
            raise ValueError(
                f"{what}: {t} in the float-scale form: ONNX Runtime's DequantizeLinear has no {e} kernel; "
                "use form='e8m0'"
            )
    op_types = frozenset(op_types) & {"MatMul", "Gemm", "Conv"}
    src = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))
    proto = onnx.ModelProto()
    proto.CopyFrom(_with_opset(src, 24 if form == "e8m0" else 21))  # never the caller's
    g = proto.graph
    _constants_to_initializers(g)
    inits = {t.name: t for t in g.initializer}
    summary = MXSummary(weight_type, activation_type, block_size, form)
    we0, ae0 = we, ae
    new_nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    act_cache: dict[tuple[str, int, str], str] = {}
    any_act = False
    used = {n for node in g.node for n in (*node.input, *node.output)} | set(inits)

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        return name

    for node in g.node:
        reason = _eligible(node, inits, op_types, exclude)
        if reason is not None:
            if node.op_type in op_types:
                summary.skipped[node.name or node.output[0]] = reason
            new_nodes.append(node)
            continue
        we, ae = _node_types(node, over, default=(we0, ae0))
        if we is None and ae is None:
            summary.skipped[node.name or node.output[0]] = "float by overrides"
            new_nodes.append(node)
            continue
        any_act |= ae is not None
        w_axis, x_axis = _axes(node)
        K = _reduction_length(node, inits)
        if we is not None:
            w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
            el, codes = mxref.quantize_mx(w, we, axis=w_axis, block=block_size, mode=mode)
            new_nodes_w, inits_w, wname = _dq_weight(
                node.input[1], el, codes, we, w_axis, block_size, form, fresh
            )
            new_nodes.extend(new_nodes_w)
            new_inits.extend(inits_w)
            node.input[1] = wname
        if ae is not None:
            key = (node.input[0], x_axis, ae)
            if key not in act_cache:
                if form == "e8m0":
                    nodes_a, inits_a, aname = _dq_activation(
                        node.input[0], ae, x_axis, block_size, form, mode, fresh
                    )
                else:
                    perm = {("Conv", 1): [0, 2, 3, 1], ("Gemm", 0): [1, 0]}.get((node.op_type, x_axis))
                    nodes_a, inits_a, aname = _activation_subgraph(
                        node.input[0], ae, perm, K, block_size, fresh, ceil=mode == "ceil"
                    )
                new_nodes.extend(nodes_a)
                new_inits.extend(inits_a)
                act_cache[key] = aname
            node.input[0] = act_cache[key]
        new_nodes.append(node)
        summary.quantized.append(node.name or node.output[0])
    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    live = {n for node in g.node for n in node.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in live]
    del g.initializer[:]
    g.initializer.extend(keep)
    if any_act and form == "e8m0" and not any(o.domain == QUANTA_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(QUANTA_DOMAIN, 1))
    ops = list(proto.opset_import)
    proto.ir_version = max(proto.ir_version, helper.find_min_ir_version_for(ops, ignore_unknown=True))
    return proto, summary


def _node_types(
    node: onnx.NodeProto,
    over: dict[str, tuple[str | None, str | None]],
    default: tuple[str | None, str | None],
) -> tuple[str | None, str | None]:
    import re

    for p, types in over.items():
        if node.name == p or (node.name and re.fullmatch(p, node.name)):
            return types
    return default


def _constants_to_initializers(g: onnx.GraphProto) -> None:
    """Constant nodes holding a tensor (``value``) become initializers: exporters write
    weights either way (PaddlePaddle's as Constant nodes)."""
    keep = []
    for node in g.node:
        if (
            node.op_type == "Constant"
            and node.domain in ("", "ai.onnx")
            and len(node.attribute) == 1
            and (node.attribute[0].name == "value")
        ):
            t = onnx.TensorProto()
            t.CopyFrom(node.attribute[0].t)
            t.name = node.output[0]
            g.initializer.append(t)
        else:
            keep.append(node)
    if len(keep) != len(g.node):
        del g.node[:]
        g.node.extend(keep)


def _with_opset(proto: onnx.ModelProto, version: int) -> onnx.ModelProto:
    from quanta.ir.onnx_io import SCAN8_DOMAIN, from_proto, to_proto, upgrade_opset

    out = upgrade_opset(proto, version, "model")
    if any(n.domain == SCAN8_DOMAIN for n in out.graph.node):
        # a Scan of opset 8 kept through the converter: written as a Loop of Scans
        from quanta.quantize.static import scan8_as_loops

        model = from_proto(out)
        scan8_as_loops(model)
        out = to_proto(model)
    return out


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _eligible(
    node: onnx.NodeProto, inits: dict, op_types: frozenset[str], exclude: tuple[str, ...]
) -> str | None:
    import re

    if node.op_type not in op_types or node.domain not in ("", "ai.onnx"):
        return "not an MX op type"
    if any(node.name == p or (node.name and re.fullmatch(p, node.name)) for p in exclude):
        return "excluded"
    if len(node.input) < 2 or node.input[1] not in inits:
        return "its weight is not an initializer"
    w = inits[node.input[1]]
    if w.data_type != TensorProto.FLOAT:
        return "its weight is not float32"
    if node.op_type in ("MatMul", "Gemm") and len(w.dims) != 2:
        return f"its weight has rank {len(w.dims)}, expected 2"
    if node.op_type == "Conv":
        if len(w.dims) != 4:
            return "not a 2-D convolution"
        if _attr(node, "group", 1) != 1:
            return "grouped / depthwise convolution (reduces over fewer channels than a block)"
    return None


def _axes(node: onnx.NodeProto) -> tuple[int, int]:
    """(weight block axis, activation block axis): the reduction axes."""
    if node.op_type == "MatMul":
        return 0, -1
    if node.op_type == "Gemm":
        return (1 if _attr(node, "transB", 0) else 0), (0 if _attr(node, "transA", 0) else 1)
    return 1, 1


def _reduction_length(node: onnx.NodeProto, inits: dict) -> int:
    dims = list(inits[node.input[1]].dims)
    if node.op_type == "Conv":
        return int(dims[1])
    if node.op_type == "Gemm" and _attr(node, "transB", 0):
        return int(dims[1])
    return int(dims[0])


def _dq_weight(name, el, codes, elem, axis, block, form, fresh):
    codes_dq, el_dq = np.asarray(mxref.dq_scale_codes(codes, elem)).view(np.uint8), el
    en = fresh(f"{name}_mx")
    sn = fresh(f"{name}_mx_scale")
    out = fresh(f"{name}_mx_dq")
    el_t = _element_tensor(el_dq, elem, en)
    if form == "e8m0":
        s_t = numpy_helper.from_array(codes_dq.view(ml_dtypes.float8_e8m0fnu), sn)
        dq = helper.make_node(
            "DequantizeLinear",
            [en, sn],
            [out],
            axis=axis,
            block_size=block,
            output_dtype=TensorProto.FLOAT,
            name=fresh(f"{name}_DequantizeMX"),
        )
    else:
        s_t = numpy_helper.from_array(_codes_to_f32(codes_dq), sn)
        dq = helper.make_node(
            "DequantizeLinear",
            [en, sn],
            [out],
            axis=axis,
            block_size=block,
            name=fresh(f"{name}_DequantizeMX"),
        )
    return [dq], [el_t, s_t], out


def _codes_to_f32(codes: np.ndarray) -> np.ndarray:
    return np.asarray(codes, np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)


def _element_tensor(el: np.ndarray, elem: str, name: str) -> onnx.TensorProto:
    if elem == "i8":
        return numpy_helper.from_array(np.asarray(el, np.int8), name)
    return numpy_helper.from_array(np.asarray(el), name)


def _dq_activation(x, elem, axis, block, form, mode, fresh):
    el = fresh(f"{x}_mx")
    sc = fresh(f"{x}_mx_scale")
    out = fresh(f"{x}_mx_dq")
    if form == "e8m0":
        q = helper.make_node(
            "QuantizeMX",
            [x],
            [el, sc],
            domain=QUANTA_DOMAIN,
            axis=axis,
            block_size=block,
            output_dtype=_ONNX_ELEM[elem],
            mode=mode,
            name=fresh(f"{x}_QuantizeMX"),
        )
        dq = helper.make_node(
            "DequantizeLinear",
            [el, sc],
            [out],
            axis=axis,
            block_size=block,
            output_dtype=TensorProto.FLOAT,
            name=fresh(f"{x}_DequantizeMX"),
        )
        return [q, dq], [], out
    raise AssertionError("the float-scale form builds its activations with _activation_subgraph")


def _activation_subgraph(x, elem, perm, K, block, fresh, ceil=False):
    """QuantizeMX + DequantizeLinear in standard operators (opset 21), for ONNX Runtime.

    The block axis is brought last (``perm``, inverted at the end), padded to whole
    blocks and viewed as [R, nb, B]; amax = ReduceMax(Abs), raised to 2^-149 (an all-zero
    block then clamps to 2^-127 as eq. (MX3)); e = floor(log2 amax) from Log, corrected
    by one step each way against Pow(2, e) (exact for integer e); X = Pow(2, clamp(e −
    emax, −127, 127)) (MXINT8: times 2^-6; with ``ceil``, e − emax one step up where
    amax > max_elem · 2^(e − emax), eq. (MX3c)); QuantizeLinear(x, X, block_size) rounds half
    to even and saturates (float8: saturate=1; int8: then Clip to [−127, 127]).
    The one difference from eq. (MX3): a block with a NaN or an infinity gets no NaN
    scale (ONNX's QuantizeLinear saturates it).
    """
    f = mxref.mx_format(elem)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    nb = -(-K // block)

    def const(val, dtype=np.float32):
        n = fresh(f"{x}_mxc")
        inits.append(numpy_helper.from_array(np.asarray(val, dtype), n))
        return n

    def node(op, ins, n_out=1, **attrs):
        outs = [fresh(f"{x}_mx_{op.lower()}") for _ in range(n_out)]
        nodes.append(helper.make_node(op, ins, outs, name=fresh(f"{x}_mx_{op}"), **attrs))
        return outs[0] if n_out == 1 else outs

    t = x if perm is None else node("Transpose", [x], perm=perm)
    # rows of K: ONNX Runtime's blocked QuantizeLinear wants a non-negative axis, and the
    # rank of a MatMul input is not always known
    t2 = node("Reshape", [t, const([-1, K], np.int64)])
    a = node("Abs", [t2])
    if nb * block != K:
        a = node("Pad", [a, const([0, nb * block - K], np.int64), const(0.0), const([1], np.int64)])
    a3 = node("Reshape", [a, const([-1, nb, block], np.int64)])
    amax = node("ReduceMax", [a3, const([-1], np.int64)], keepdims=0)
    amax = node("Max", [amax, const(np.float32(2.0**-149))])
    ln = node("Log", [amax])
    e0 = node("Floor", [node("Mul", [ln, const(np.float32(1.0 / np.log(2.0)))])])
    p = node("Pow", [const(2.0), e0])
    too_big = node("Cast", [node("Greater", [p, amax])], to=TensorProto.FLOAT)
    p2 = node("Mul", [p, const(2.0)])
    too_small = node("Cast", [node("LessOrEqual", [p2, amax])], to=TensorProto.FLOAT)
    e = node("Add", [node("Sub", [e0, too_big]), too_small])
    e = node("Sub", [e, const(float(f.emax))])
    if ceil:
        # eq. (MX3c): one step up where amax > max_elem · 2^e (exact: a power of two times
        # max_elem; where 2^e underflows, e is far below the clamp)
        lim = node("Mul", [node("Pow", [const(2.0), e]), const(np.float32(f.max_norm))])
        e = node("Add", [e, node("Cast", [node("Greater", [amax, lim])], to=TensorProto.FLOAT)])
    e = node("Clip", [e, const(-127.0), const(127.0)])
    if f.is_int:
        e = node("Sub", [e, const(6.0)])
    scale = node("Pow", [const(2.0), e])  # [R, nb]
    if f.is_int:
        q = node("QuantizeLinear", [t2, scale], axis=1, block_size=block, output_dtype=TensorProto.INT8)
        q = node("Clip", [q, const(-127, np.int8), const(127, np.int8)])
    else:
        q = node(
            "QuantizeLinear", [t2, scale], axis=1, block_size=block, output_dtype=_ONNX_ELEM[elem], saturate=1
        )
    dq = node("DequantizeLinear", [q, scale], axis=1, block_size=block)
    dq = node("Reshape", [dq, node("Shape", [t])])
    if perm is not None:
        inv = [perm.index(i) for i in range(len(perm))]
        dq = node("Transpose", [dq], perm=inv)
    return nodes, inits, dq
