"""``quantize_dynamic``: weights quantized ahead of time, activations at run time.

Each MatMul / Gemm / Conv with a constant float weight becomes (ONNX Runtime's form)::

    x -> DynamicQuantizeLinear -> (xq: u8, sx, zx)                docs eq. (10)
    acc = MatMulInteger(xq, wq, zx, zw) | ConvInteger(...)         int32, eq. (4)
    y   = Cast(acc, float) * (sx * sw)  [+ bias]                   sw per output channel

Weights are int8, symmetric (so ``zw`` is one scalar, 0, whatever the granularity) and
per output channel by default: the per-channel scale is applied by the float multiply,
so the integer op needs none. Gemm's ``transB`` is folded into the stored weight,
``alpha`` into its scale and ``beta`` into the bias; ``transA = 1`` stays float.

An LSTM with constant W and R becomes ONNX Runtime's ``com.microsoft`` DynamicQuantizeLSTM
(as ORT's own ``quantize_dynamic`` writes it; quanta.quantize.recurrent, which
``quantize_static`` shares), a GRU quanta::DynamicQuantizeGRU with its ONNX function.

A weight is quantized once however many nodes read it (same values, same granularity): the
integer copy and its scales are shared, so a weight used by several MatMuls costs one int8
tensor. A weight whose values are not finite, or whose range is degenerate (all zero,
|w| >= 1e9), stays float with the reason in the summary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from quanta.ir.graph import Graph, Model, Node, Value
from quanta.ir.types import F16, F32, I32, U8, FloatType, TensorType
from quanta.ir.verify import Stage, verify
from quanta.kernels.reference.quantize import quantize_linear
from quanta.quantize.ort_saturation import file_note
from quanta.quantize.qdq import TensorPlan, _weight_type, weight_float_reason
from quanta.quantize.recipe import Recipe, RecurrentMode
from quanta.quantize.recurrent import LstmWeights, recurrent_float_reason, rewrite_gru, rewrite_lstm
from quanta.quantize.static import (
    QuantizationSummary,
    _recipe_from,
    check_integer_share,
    load_for_quantization,
    prepare_float_graph,
)
from quanta.runtime.control_flow import node_scope
from quanta.runtime.coverage import lowered_coverage

__all__ = ["DYNAMIC_OP_TYPES", "quantize_dynamic"]

DYNAMIC_OP_TYPES = frozenset({"MatMul", "Gemm", "Conv", "LSTM", "GRU"})


#: Why quantize_dynamic leaves an If / Loop / Scan float, bodies included: ONNX Runtime's
#: quantize_dynamic quantizes inside subgraphs only with its EnableSubgraph option (off by
#: default), so its default file keeps them float too.
DYNAMIC_SUBGRAPH_REASON = (
    "control flow: quantize_dynamic keeps its subgraphs float (as ONNX Runtime's quantize_dynamic "
    "without EnableSubgraph); quantize_static quantizes LSTMs inside them, and every op with "
    "recipe subgraphs: quantize"
)


def _has_subgraphs(node: Node) -> bool:
    return any(
        isinstance(v, onnx.GraphProto)
        or (isinstance(v, list) and any(isinstance(g, onnx.GraphProto) for g in v))
        for v in node.attrs.values()
    )


def _why_not(node: Node, recipe: Recipe, model: Model) -> str | None:
    if _has_subgraphs(node):
        return DYNAMIC_SUBGRAPH_REASON
    if node.op_type not in DYNAMIC_OP_TYPES or node.op_type not in recipe.op_types | DYNAMIC_OP_TYPES:
        return f"{node.op_type} is not in the quantized op types (dynamic: MatMul, Gemm, Conv, LSTM, GRU)"
    if node.domain not in ("", "ai.onnx"):
        return f"{node.domain}::{node.op_type} is not the ONNX operator"
    if node.op_type in ("LSTM", "GRU"):
        return recurrent_float_reason(node, model, recipe)
    if recipe.excludes(node):
        return "excluded by the recipe"
    x, w = node.input(0), node.input(1)
    if x is None or x.type is None or x.type.elem not in (F32, F16):
        return "dynamic quantization needs a float32 or float16 activation input"
    wc = None if w is None else w.const  # None unless w.is_const
    if w is None or wc is None or wc.dtype not in (np.float32, np.float16):
        return "weight input is not a float32 or float16 constant"
    reason = weight_float_reason(w)
    if reason is not None:
        return reason
    if node.op_type == "Gemm" and node.attrs.get("transA", 0):
        return "Gemm with transA=1 stays float"
    if node.op_type == "MatMul" and wc.ndim != 2:
        return f"MatMul weight of rank {wc.ndim} (only rank 2 is quantized)"
    if node.op_type == "Conv" and wc.ndim < 3:
        return "Conv weight of rank < 3"
    return None


def quantize_dynamic(
    model_input: str | os.PathLike | bytes | onnx.ModelProto,
    model_output: str | os.PathLike,
    recipe: Recipe | str | os.PathLike | None = None,
    *,
    verbose: bool = True,
    **options: Any,
) -> QuantizationSummary:
    """Quantize the weights of MatMul/Gemm/Conv; activations are quantized per batch at
    run time by DynamicQuantizeLinear. Options as for ``quantize_static`` (``per_channel``,
    ``exclude``, ``weight_type``…).

    A ``model_input`` that is already quantized (Q/DQ, QOperator or dynamic operators) is
    quantized through its float view (quanta.quantize.float_view): its weights again
    from their dequantized values, its activation grids dropped (each run computes its
    own); the summary says so."""
    t0 = time.perf_counter()
    recipe = _recipe_from(recipe, options)
    if recipe.recurrent is RecurrentMode.AUTO:  # nothing to measure on: no calibration data
        recipe = dataclasses.replace(recipe, recurrent=RecurrentMode.DYNAMIC)
    from quanta.quantize.prequantized import (
        guard_input,
        load_if_quantized,
        prepare_prequantized_dynamic,
        quantizing_view,
    )

    quantized_input = load_if_quantized(model_input)
    if quantized_input is not None:
        guard_input(model_input, model_output)
        prepared = prepare_prequantized_dynamic(quantized_input)
        assert prepared is not None
        view, notes = prepared
        with quantizing_view():
            summary = quantize_dynamic(view, model_output, recipe, verbose=False)
        summary.notes[:0] = notes
        summary.input_bytes = quantized_input.ByteSize()
        summary.seconds = time.perf_counter() - t0
        if verbose:
            print(summary.format())
        return summary
    model = load_for_quantization(model_input)
    prepare_float_graph(model)
    g = model.graph
    summary = QuantizationSummary(output=str(model_output), method="dynamic")
    dq_cache: dict[int, tuple[Value, Value, Value]] = {}
    weights = _WeightCache(g, recipe)
    lstm_weights = LstmWeights(model, recipe)
    with g.naming():  # every new value and node is named through fresh_name
        for node in list(g.nodes):
            reason = _why_not(node, recipe, model)
            if reason is not None:
                summary.float_nodes.append((node.name, node.op_type, reason))
                continue
            if node.op_type == "LSTM":
                rewrite_lstm(node, lstm_weights)
            elif node.op_type == "GRU":
                rewrite_gru(node, lstm_weights)
            else:
                _rewrite(g, node, recipe, dq_cache, weights)
            summary.quantized.append((node.name, node.op_type))
    g.toposort()
    g.remove_unused_initializers()
    verify(g, Stage.LOWERED)
    model.metadata["quanta.recipe"] = recipe.to_json()
    # the share of MACs in integer as a session compiles this file; nothing is written below the minimum
    summary.coverage = lowered_coverage(model)
    scopes = tuple(f"{node_scope(n, i)}/" for i, n in enumerate(g.nodes) if _has_subgraphs(n))
    for c in summary.coverage.nodes if scopes else ():
        # a body's compute stays float because of where it is, not of its own operands
        if c.name.startswith(scopes) and not c.integer_op and c.macs:
            c.reasons = [DYNAMIC_SUBGRAPH_REASON]
    check_integer_share(summary.coverage, recipe.min_integer_share, model_output)
    from quanta.ir.onnx_io import save, share_equal_initializers, to_proto

    proto = to_proto(model)
    for name in _restore_folded_constants(proto, model_input):
        summary.float_tensors.append(
            (
                name,
                "a large constant computed by a subgraph of the input: kept as that "
                "subgraph (folded, it stayed float and only grew the file)",
            )
        )
    share_equal_initializers(proto)  # readers whose integer weights came out equal share one
    save(proto, model_output, protect=[model.path] if model.path else [])
    summary.seconds = time.perf_counter() - t0
    if model.path and os.path.exists(model.path):
        summary.input_bytes = os.path.getsize(model.path)
    summary.output_bytes = os.path.getsize(model_output)
    note = file_note(model_output)
    if note:
        summary.notes.append(note)
    if verbose:
        print(summary.format())
    return summary


#: A folded float constant this large that the input computed by a subgraph is stored as
#: that subgraph again (see _restore_folded_constants).
UNFOLD_MIN_BYTES = 1 << 16


def _tensor_bytes(t: onnx.TensorProto) -> int:
    if t.data_location == TensorProto.EXTERNAL:
        return -1
    return int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def _restore_folded_constants(proto: onnx.ModelProto, model_input: Any) -> list[str]:
    """Put back the subgraphs that computed large constants which stayed float.

    Quantization folds constant subgraphs first so that weights they compute can be
    quantized; a folded result that is no weight (a causal mask from ConstantOfShape ->
    Trilu, position ids from Range) stays float and can be many times the bytes of the few
    nodes that made it (a 512 x 512 mask: 1 MiB from 3 nodes). Each such initializer whose
    input subgraph needs under a quarter of its bytes is replaced by that subgraph (the
    input's own nodes and initializers, inserted before the first reader); the runtime folds
    it again at load. Returns the restored names."""
    try:
        if isinstance(model_input, onnx.ModelProto):
            original = model_input
        elif isinstance(model_input, bytes):
            original = onnx.load_from_string(model_input)
        else:
            original = onnx.load(os.fspath(model_input), load_external_data=False)
    except Exception:
        return []
    opsets = {o.domain or "": o.version for o in proto.opset_import}
    if {o.domain or "": o.version for o in original.opset_import}.get("") != opsets.get(""):
        return []  # the input was converted to another opset: its nodes may not apply
    g = proto.graph
    orig_inits = {t.name: t for t in original.graph.initializer}
    producers = {o: n for n in original.graph.node for o in n.output if o}
    position = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    available = {i.name for i in g.input} | {t.name for t in g.initializer} | set(position)
    restored: list[str] = []
    for t in list(g.initializer):
        size = _tensor_bytes(t)
        if t.name in orig_inits or t.name not in producers or size < UNFOLD_MIN_BYTES:
            continue
        readers = [k for k, n in enumerate(g.node) if t.name in n.input]
        if not readers:
            continue
        nodes: list[onnx.NodeProto] = []
        inits: list[onnx.TensorProto] = []
        stack, seen, ok = [t.name], set(), True
        while stack and ok:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name != t.name and name in available:
                ok = position.get(name, -1) < readers[0]  # computed before the first reader
                continue
            if name in orig_inits:
                inits.append(orig_inits[name])
                continue
            n = producers.get(name)
            if (
                n is None
                or n.domain not in ("", "ai.onnx")
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)
            ):
                ok = False
                break
            if any(o and o != t.name and o in available for o in n.output):
                ok = False  # a name the quantized graph already uses
                break
            nodes.append(n)
            stack.extend(i for i in n.input if i)
        cost = sum(_tensor_bytes(i) for i in inits)
        if not ok or any(_tensor_bytes(i) < 0 for i in inits) or cost * 4 > size:
            continue
        order = _toposorted(nodes, available | {i.name for i in inits})
        if order is None:
            continue
        g.initializer.remove(t)
        g.initializer.extend(inits)
        first = readers[0]
        for k, n in enumerate(order):
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            g.node.insert(first + k, copy)
        position = {o: k for k, n in enumerate(g.node) for o in n.output if o}
        available |= {i.name for i in inits} | {o for n in order for o in n.output if o}
        restored.append(t.name)
    return restored


def _toposorted(nodes: list[onnx.NodeProto], known: set[str]) -> list[onnx.NodeProto] | None:
    out, have, todo = [], set(known), list(reversed(nodes))
    while todo:
        ready = [n for n in todo if all(not i or i in have for i in n.input)]
        if not ready:
            return None
        for n in ready:
            todo.remove(n)
            out.append(n)
            have.update(o for o in n.output if o)
    return out


def _const(g: Graph, base: str, arr: np.ndarray) -> Value:
    return g.add_initializer(g.fresh_name(base), np.asarray(arr))


def _dynamic_quantize(g: Graph, x: Value, before: Node, cache: dict) -> tuple[Value, Value, Value]:
    """One DynamicQuantizeLinear per activation, shared by all its consumers."""
    if id(x) in cache:
        return cache[id(x)]
    source = x
    if x.type is not None and x.type.elem == F16:  # DynamicQuantizeLinear takes float32 only
        x = Value(g.fresh_name(f"{x.name}_float32"), TensorType(F32, x.shape))
        g.add_node(
            Node("Cast", [source], [x], {"to": TensorProto.FLOAT}, name=g.fresh_name(f"{source.name}_Cast")),
            before=before,
        )
    xq = Value(g.fresh_name(f"{x.name}_quantized"), TensorType(U8, x.shape))
    sx = Value(g.fresh_name(f"{x.name}_scale"), TensorType(F32, ()))
    zx = Value(g.fresh_name(f"{x.name}_zero_point"), TensorType(U8, ()))
    g.add_node(
        Node(
            "DynamicQuantizeLinear", [x], [xq, sx, zx], name=g.fresh_name(f"{x.name}_DynamicQuantizeLinear")
        ),
        before=before,
    )
    cache[id(source)] = (xq, sx, zx)
    return cache[id(source)]


class _WeightCache:
    """Quantized weights by content: the same float values quantized the same way (a
    weight read by several nodes, or equal copies left by constant folding) become one
    integer initializer and one set of scale / zero-point constants."""

    def __init__(self, g: Graph, recipe: Recipe):
        self.g = g
        self.recipe = recipe
        self.entries: dict[tuple, Any] = {}

    def _key(self, data: np.ndarray, *how: Any) -> tuple:
        digest = hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()
        return (digest, data.shape, str(data.dtype), *how)

    def matmul_like(self, w: Value, wdata: np.ndarray, axis: int | None, *, k_pairs: bool = False):
        """(qtype, int weight, zero point) of ``wdata`` (w's values, maybe transposed).
        ``k_pairs``: ``wdata`` is a MatMulInteger's [K, N], whose int8 codes ONNX Runtime's
        saturating u8·s8 GEMM adds in pairs along K: with ``recipe.weight_pairs`` "ort" /
        "ort_rows" every pair keeps eq. (12m), as the static QDQ weights and the
        DynamicQuantizeLSTM weights do (the per-row 7-bit choice of "ort_rows" needs the
        layer error GPTQ measures on calibration data, which dynamic quantization has not)."""
        recipe = self.recipe
        storage = recipe.weight_storage if recipe.weight_storage.bits == 8 else U8
        key = self._key(wdata, "w", axis, str(storage), k_pairs)
        if key not in self.entries:
            g = self.g
            plan = TensorPlan(w.name, "weight", storage, True, axis=axis)
            expressed = w.type.elem if w.type is not None and isinstance(w.type.elem, FloatType) else F32
            expressed = F32 if expressed == F16 else expressed  # the scale multiplies in float32
            qw = _weight_type(wdata, plan, expressed, recipe)
            wq_data = quantize_linear(wdata, qw.scale_array(), qw.zero_point_array(), axis=qw.axis)
            if k_pairs and recipe.weight_pairs in ("ort", "ort_rows") and storage.signed and wdata.ndim == 2:
                wq_data = _pair_safe_k(wdata, wq_data, qw)
            wq = g.add_initializer(
                g.fresh_name(f"{w.name}_quantized"), wq_data, TensorType(qw, tuple(wq_data.shape))
            )
            zw = _const(g, f"{w.name}_zero_point", np.asarray(qw.zero_point[0], dtype=storage.numpy))
            self.entries[key] = (qw, wq, zw)
        return self.entries[key]

    def scale(self, w: Value, sw: np.ndarray) -> Value:
        """The float scale constant ``sw`` (shared by equal uses)."""
        key = self._key(sw, "scale")
        if key not in self.entries:
            self.entries[key] = _const(self.g, f"{w.name}_scale", sw)
        return self.entries[key]


def _pair_safe_k(wdata: np.ndarray, codes: np.ndarray, qw: Any) -> np.ndarray:
    """The int8 codes ``codes`` of ``wdata`` [K, N] (scale per tensor or per column ``qw``)
    with every pair of K rows (2j, 2j + 1) kept within eq. (12m) (ort_pairs.project_pairs:
    a pair that breaks it moves to the nearest pair on its bound; the others stay)."""
    from quanta.quantize.ort_pairs import k_partners, project_pairs

    if int(np.abs(codes.astype(np.int32)).max(initial=0)) <= 64:
        return codes  # every pair sum is at most 128
    scale = np.asarray(qw.scale_array(), np.float32)
    zp = np.asarray(qw.zero_point_array(), np.float64)
    shape = (1, -1) if scale.size > 1 else (1, 1)
    # the real codes nearest rounding rounds (eq. (2): the quotient in float32)
    u = (wdata.astype(np.float32) / scale.reshape(shape)).astype(np.float64) + zp.reshape(shape)
    info = np.iinfo(codes.dtype)
    new, _ = project_pairs(u.T, codes.T, k_partners(wdata.shape[0]), int(info.min) + 1, int(info.max))
    return np.ascontiguousarray(new.T.astype(codes.dtype))


def _rewrite(g: Graph, node: Node, recipe: Recipe, cache: dict, weights: _WeightCache) -> None:
    x, w = node.inputs[0], node.inputs[1]
    assert x is not None and w is not None
    y = node.outputs[0]
    # a float16 layer (a Keras mixed-precision export): integer product, float32 scaling,
    # the result cast back to float16 (DynamicQuantizeLinear and its scale are float32)
    half = y.type is not None and y.type.elem == F16
    op = node.op_type
    wdata = np.asarray(w.const, np.float32)
    alpha, beta = 1.0, 1.0
    if op == "Gemm":
        if node.attrs.get("transB", 0):
            wdata = wdata.T
        alpha = float(node.attrs.get("alpha", 1.0))
        beta = float(node.attrs.get("beta", 1.0))
    axis = (0 if op == "Conv" else 1) if recipe.per_channel else None
    qw, wq, zw = weights.matmul_like(w, wdata, axis, k_pairs=op != "Conv")
    xq, sx, zx = _dynamic_quantize(g, x, node, cache)
    # Detach the float node first: its output y gets a new producer below.
    anchor = g.nodes[g.nodes.index(node) + 1] if g.nodes.index(node) + 1 < len(g.nodes) else None
    bias = node.input(2)
    node.outputs = []
    y.producer = None
    g.remove_node(node)
    acc = Value(g.fresh_name(f"{y.name}_acc"), TensorType(I32, y.shape))
    if op == "Conv":
        keep = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
        attrs = {k: v for k, v in node.attrs.items() if k in keep}
        types = {k: node.attr_types[k] for k in attrs if k in node.attr_types}
        integer = Node(
            "ConvInteger",
            [xq, wq, zx, zw],
            [acc],
            attrs,
            name=g.fresh_name(f"{node.name or 'conv'}_ConvInteger"),
            attr_types=types,
        )
    else:
        integer = Node(
            "MatMulInteger",
            [xq, wq, zx, zw],
            [acc],
            name=g.fresh_name(f"{node.name or 'matmul'}_MatMulInteger"),
        )
    new_nodes = [integer]
    accf = Value(g.fresh_name(f"{y.name}_acc_float"), TensorType(F32, y.shape))
    new_nodes.append(
        Node("Cast", [acc], [accf], {"to": TensorProto.FLOAT}, name=g.fresh_name(f"{y.name}_Cast"))
    )
    # sw (per output channel) * alpha, shaped to broadcast over the output (channel axis 1 for Conv)
    sw = qw.scale_array().astype(np.float32) * np.float32(alpha)
    rank = len(y.shape) if y.shape is not None else wdata.ndim
    if op == "Conv" and sw.ndim == 1:
        sw = sw.reshape((1, -1) + (1,) * (rank - 2))
    sw_v = weights.scale(w, sw)
    scale = Value(g.fresh_name(f"{y.name}_scale"), TensorType(F32, None))
    new_nodes.append(Node("Mul", [sx, sw_v], [scale], name=g.fresh_name(f"{y.name}_scale_Mul")))
    y32 = Value(g.fresh_name(f"{y.name}_float32"), TensorType(F32, y.shape)) if half else y
    out = y32 if bias is None else Value(g.fresh_name(f"{y.name}_unbiased"), TensorType(F32, y.shape))
    new_nodes.append(Node("Mul", [accf, scale], [out], name=g.fresh_name(f"{y.name}_Mul")))
    if bias is not None:
        b = bias
        if half and not bias.is_const:
            b = Value(g.fresh_name(f"{bias.name}_float32"), TensorType(F32, bias.shape))
            new_nodes.append(
                Node("Cast", [bias], [b], {"to": TensorProto.FLOAT}, name=g.fresh_name(f"{bias.name}_Cast"))
            )
        if bias.is_const and (op == "Conv" or beta != 1.0 or half):
            bdata = np.asarray(bias.const, np.float32) * np.float32(beta)
            if op == "Conv":
                bdata = bdata.reshape((1, -1) + (1,) * (rank - 2))
            b = _const(g, f"{bias.name}_scaled", bdata)
        elif beta != 1.0:
            bscaled = Value(g.fresh_name(f"{bias.name}_scaled"), b.type)
            beta_v = _const(g, f"{y.name}_beta", np.float32(beta))
            new_nodes.append(Node("Mul", [b, beta_v], [bscaled], name=g.fresh_name(f"{y.name}_beta_Mul")))
            b = bscaled
        new_nodes.append(Node("Add", [out, b], [y32], name=g.fresh_name(f"{y.name}_bias_Add")))
    if half:
        new_nodes.append(
            Node("Cast", [y32], [y], {"to": TensorProto.FLOAT16}, name=g.fresh_name(f"{y.name}_Cast_half"))
        )
    for n in new_nodes:
        g.add_node(n, before=anchor)
