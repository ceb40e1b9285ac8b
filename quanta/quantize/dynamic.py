"""``quantize_dynamic``: weights quantized ahead of time, activations at run time.

Each MatMul / Gemm / Conv with a constant float weight becomes (ONNX Runtime's form)::

    x -> DynamicQuantizeLinear -> (xq: u8, sx, zx)                docs eq. (10)
    acc = MatMulInteger(xq, wq, zx, zw) | ConvInteger(...)         int32, eq. (4)
    y   = Cast(acc, float) * (sx * sw)  [+ bias]                   sw per output channel

Weights are int8, symmetric (so ``zw`` is one scalar, 0, whatever the granularity) and
per output channel by default: the per-channel scale is applied by the float multiply,
so the integer op needs none. Gemm's ``transB`` is folded into the stored weight,
``alpha`` into its scale and ``beta`` into the bias; ``transA = 1`` stays float.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.types import F32, I32, U8, FloatType, TensorType
from quanta.ir.verify import Stage, verify
from quanta.kernels.reference.quantize import quantize_linear
from quanta.quantize.qdq import TensorPlan, _weight_type
from quanta.quantize.recipe import Recipe
from quanta.quantize.static import (
    QuantizationSummary,
    _recipe_from,
    load_for_quantization,
    prepare_float_graph,
)

__all__ = ["DYNAMIC_OP_TYPES", "quantize_dynamic"]

DYNAMIC_OP_TYPES = frozenset({"MatMul", "Gemm", "Conv"})


def _why_not(node: Node, recipe: Recipe) -> str | None:
    if node.op_type not in DYNAMIC_OP_TYPES or node.op_type not in recipe.op_types | DYNAMIC_OP_TYPES:
        return f"{node.op_type} is not in the quantized op types (dynamic: MatMul, Gemm, Conv)"
    if recipe.excludes(node):
        return "excluded by the recipe"
    x, w = node.input(0), node.input(1)
    if x is None or x.type is None or x.type.elem != F32:
        return "dynamic quantization needs a float32 activation input"
    if w is None or not w.is_const or w.const.dtype != np.float32:
        return "weight input is not a float32 constant"
    if node.op_type == "Gemm" and node.attrs.get("transA", 0):
        return "Gemm with transA=1 stays float"
    if node.op_type == "MatMul" and w.const.ndim != 2:
        return f"MatMul weight of rank {w.const.ndim} (only rank 2 is quantized)"
    if node.op_type == "Conv" and w.const.ndim < 3:
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
    ``exclude``, ``weight_type``…)."""
    t0 = time.perf_counter()
    recipe = _recipe_from(recipe, options)
    model = load_for_quantization(model_input)
    prepare_float_graph(model)
    g = model.graph
    summary = QuantizationSummary(output=str(model_output), method="dynamic")
    dq_cache: dict[int, tuple[Value, Value, Value]] = {}
    for node in list(g.nodes):
        reason = _why_not(node, recipe)
        if reason is not None:
            summary.float_nodes.append((node.name, node.op_type, reason))
            continue
        _rewrite(g, node, recipe, dq_cache)
        summary.quantized.append((node.name, node.op_type))
    g.toposort()
    g.remove_unused_initializers()
    verify(g, Stage.LOWERED)
    model.metadata["quanta.recipe"] = recipe.to_json()
    from quanta.ir.onnx_io import save

    save(model, model_output, protect=[model.path] if model.path else [])
    summary.seconds = time.perf_counter() - t0
    if model.path and os.path.exists(model.path):
        summary.input_bytes = os.path.getsize(model.path)
    summary.output_bytes = os.path.getsize(model_output)
    if verbose:
        print(summary.format())
    return summary


def _const(g: Graph, base: str, arr: np.ndarray) -> Value:
    return g.add_initializer(g.fresh_name(base), np.asarray(arr))


def _dynamic_quantize(g: Graph, x: Value, before: Node, cache: dict) -> tuple[Value, Value, Value]:
    """One DynamicQuantizeLinear per activation, shared by all its consumers."""
    if id(x) in cache:
        return cache[id(x)]
    xq = Value(g.fresh_name(f"{x.name}_quantized"), TensorType(U8, x.shape))
    sx = Value(g.fresh_name(f"{x.name}_scale"), TensorType(F32, ()))
    zx = Value(g.fresh_name(f"{x.name}_zero_point"), TensorType(U8, ()))
    g.add_node(Node("DynamicQuantizeLinear", [x], [xq, sx, zx], name=g.fresh_name(f"{x.name}_DynamicQuantizeLinear")), before=before)
    cache[id(x)] = (xq, sx, zx)
    return cache[id(x)]


def _rewrite(g: Graph, node: Node, recipe: Recipe, cache: dict) -> None:
    x, w = node.inputs[0], node.inputs[1]
    assert x is not None and w is not None
    y = node.outputs[0]
    op = node.op_type
    wdata = np.asarray(w.const, np.float32)
    alpha, beta = 1.0, 1.0
    if op == "Gemm":
        if node.attrs.get("transB", 0):
            wdata = wdata.T
        alpha = float(node.attrs.get("alpha", 1.0))
        beta = float(node.attrs.get("beta", 1.0))
    axis = (0 if op == "Conv" else 1) if recipe.per_channel else None
    storage = recipe.weight_storage if recipe.weight_storage.bits == 8 else U8
    plan = TensorPlan(w.name, "weight", storage, True, axis=axis)
    expressed = w.type.elem if w.type is not None and isinstance(w.type.elem, FloatType) else F32
    qw = _weight_type(wdata, plan, expressed, recipe)
    wq_data = quantize_linear(wdata, qw.scale_array(), qw.zero_point_array(), axis=qw.axis)
    wq = g.add_initializer(g.fresh_name(f"{w.name}_quantized"), wq_data, TensorType(qw, tuple(wq_data.shape)))
    zw = _const(g, f"{w.name}_zero_point", np.asarray(qw.zero_point[0], dtype=storage.numpy))
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
        integer = Node("ConvInteger", [xq, wq, zx, zw], [acc], attrs, name=g.fresh_name(f"{node.name or 'conv'}_ConvInteger"), attr_types=types)
    else:
        integer = Node("MatMulInteger", [xq, wq, zx, zw], [acc], name=g.fresh_name(f"{node.name or 'matmul'}_MatMulInteger"))
    new_nodes = [integer]
    accf = Value(g.fresh_name(f"{y.name}_acc_float"), TensorType(F32, y.shape))
    new_nodes.append(Node("Cast", [acc], [accf], {"to": TensorProto.FLOAT}, name=g.fresh_name(f"{y.name}_Cast")))
    # sw (per output channel) * alpha, shaped to broadcast over the output (channel axis 1 for Conv)
    sw = qw.scale_array().astype(np.float32) * np.float32(alpha)
    rank = len(y.shape) if y.shape is not None else wdata.ndim
    if op == "Conv" and sw.ndim == 1:
        sw = sw.reshape((1, -1) + (1,) * (rank - 2))
    sw_v = _const(g, f"{w.name}_scale", sw)
    scale = Value(g.fresh_name(f"{y.name}_scale"), TensorType(F32, None))
    new_nodes.append(Node("Mul", [sx, sw_v], [scale], name=g.fresh_name(f"{y.name}_scale_Mul")))
    out = y if bias is None else Value(g.fresh_name(f"{y.name}_unbiased"), TensorType(F32, y.shape))
    new_nodes.append(Node("Mul", [accf, scale], [out], name=g.fresh_name(f"{y.name}_Mul")))
    if bias is not None:
        b = bias
        if bias.is_const and (op == "Conv" or beta != 1.0):
            bdata = np.asarray(bias.const, np.float32) * np.float32(beta)
            if op == "Conv":
                bdata = bdata.reshape((1, -1) + (1,) * (rank - 2))
            b = _const(g, f"{bias.name}_scaled", bdata)
        elif beta != 1.0:
            bscaled = Value(g.fresh_name(f"{bias.name}_scaled"), bias.type)
            beta_v = _const(g, f"{y.name}_beta", np.float32(beta))
            new_nodes.append(Node("Mul", [bias, beta_v], [bscaled], name=g.fresh_name(f"{y.name}_beta_Mul")))
            b = bscaled
        new_nodes.append(Node("Add", [out, b], [y], name=g.fresh_name(f"{y.name}_bias_Add")))
    for n in new_nodes:
        g.add_node(n, before=anchor)
