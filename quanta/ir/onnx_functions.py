"""ONNX operators that the ONNX specification defines as functions of other operators,
written out as their function bodies when a model is loaded (a canonicalization of real
exports, like :mod:`quanta.ir.ms_contrib` for ONNX Runtime's fused operators).

PyTorch's exporter (``torch.onnx.export(..., dynamo=True, opset_version=23)``) writes
``scaled_dot_product_attention`` as ``Attention`` and ``nn.RMSNorm`` as
``RMSNormalization``; LLM exports add ``RotaryEmbedding``; opset 24 names SiLU
``Swish`` and opset 28 adds ``SwiGLU``. quanta has no kernel of its own for them. Run as single nodes they would take the reference fallback (slow), hide
their matrix products from the quantizer (the Q·Kᵀ and ·V products stay float and
uncounted) and from the float pipeline's fusions. Written out, they are the ordinary
operators quanta quantizes and runs natively.

The body is the specification's own: ``OpSchema.get_context_dependent_function`` of the
installed ``onnx`` builds it for the node's attributes and input types, so an optional
input, ``is_causal``, ``scale``, grouped-query heads, ``softcap``, a past state or 3-D
inputs with ``q_num_heads`` follow the spec without code here. Numerics are the body's
float32 operations in the spec's order (the reference; ONNX Runtime's fused kernels
differ in the last bits: ``tests/ir/test_onnx_functions.py`` compares both).

A node whose body cannot be built (input types that shape inference could not find, a
form the installed ``onnx`` does not define) stays as it is, and the runtime names it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import defs, numpy_helper

from quanta.ir.graph import unused_name
from quanta.ir.shape_hints import without_weight_data

__all__ = ["EXPANDED_OPS", "expand_function_ops", "inline_model_functions", "nested_graphs"]

#: default-domain operators written out as their function bodies: the transformer
#: operators of opset 23, Swish (opset 24's SiLU, whose body is the Sigmoid and Mul the
#: float and integer pipelines know) and SwiGLU (opset 28). Not the unary activations
#: (Mish, Celu, Selu, ThresholdedRelu, Shrink): between QuantizeLinear and
#: DequantizeLinear each is one 256-entry table (passes/lower/lookup.py), which its
#: written-out body would turn into two or three requantized steps
EXPANDED_OPS = frozenset({"Attention", "RMSNormalization", "RotaryEmbedding", "Swish", "SwiGLU"})
_BODY_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE})


def expand_function_ops(proto: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """Writes out, in place, the nodes of :data:`EXPANDED_OPS` of the main graph and of
    its If / Loop / Scan bodies as their ONNX function bodies (and those bodies' own such
    nodes: SwiGLU's Swish); (node, op, why) for each one left as it is."""
    left: list[tuple[str, str, str]] = []
    for _ in range(3):
        left, changed = _expand_round(proto)
        if not changed:
            break
    return left


#: the domain of quanta's own model-local functions (``quanta::DynamicQuantizeGRU``): the
#: runtime has kernels for them, and the body is there for ONNX Runtime
_OWN_DOMAIN = "quanta"


def inline_model_functions(proto: onnx.ModelProto) -> int:
    """Writes out, in place, the calls of the model's own functions (``ModelProto.functions``)
    as their bodies, as ONNX Runtime does when it loads the file; returns how many kinds of
    function were called. quanta's own functions stay calls.

    A tool that writes its operators as model-local functions (onnx-quantize 0.2: every
    quantized MatMul / Gemm is ``quant::QMatMulStatic8bits(X, W, scales, zero points)``,
    a function of QuantizeLinear, MatMulInteger and DequantizeLinear) makes files quanta
    could not run otherwise: no kernel knows the call, and the reference evaluator neither."""
    local = {(f.domain, f.name) for f in proto.functions}
    if not local:
        return 0
    called = {
        (n.domain, n.op_type)
        for g in nested_graphs(proto.graph)
        for n in g.node
        if (n.domain, n.op_type) in local and n.domain != _OWN_DOMAIN
    }
    if not called:
        return 0
    from onnx import inliner

    keep = sorted(key for key in local if key[0] == _OWN_DOMAIN)
    proto.CopyFrom(inliner.inline_selected_functions(proto, keep, exclude=True))
    return len(called)


def nested_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph nested in its nodes' attributes, outer ones first."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from nested_graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from nested_graphs(g)


def _expand_round(proto: onnx.ModelProto) -> tuple[list[tuple[str, str, str]], bool]:
    if not any(_is_expanded(n) for g in nested_graphs(proto.graph) for n in g.node):
        return [], False
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    types = _value_types(proto)
    # names of every scope: a body's new values must not shadow an outer one
    taken: set[str] = set()
    for g in nested_graphs(proto.graph):
        taken |= {n.name for n in g.node} | {o for n in g.node for o in n.output}
        taken |= {t.name for t in g.initializer} | {i.name for i in g.input}
    left: list[tuple[str, str, str]] = []
    changed = False
    # inner graphs first: rewriting a graph copies its nodes, bodies included
    for g in reversed(list(nested_graphs(proto.graph))):
        if any(_is_expanded(n) for n in g.node):
            kept, wrote = _expand_graph(g, opset, types, taken)
            left += kept
            changed |= wrote
    return left, changed


def _expand_graph(
    graph: onnx.GraphProto, opset: int, types: dict[str, onnx.TypeProto], taken: set[str]
) -> tuple[list[tuple[str, str, str]], bool]:
    left: list[tuple[str, str, str]] = []
    nodes: list[onnx.NodeProto] = []
    for i, node in enumerate(graph.node):
        if not _is_expanded(node):
            nodes.append(node)
            continue
        name = node.name or f"{node.op_type}_{i}"
        body, why = _body(node, opset, types)
        if body is None:
            left.append((name, node.op_type, why))
            nodes.append(node)
            continue
        body = _without_zero_bias(body)
        if node.op_type == "Attention" and _equal_heads(node, types):
            body = _without_head_repeat(body)
        nodes.extend(_inline(node, name, body, taken, _defaults(node, opset)))
    changed = len(left) < sum(_is_expanded(n) for n in graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return left, changed


def _is_expanded(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in EXPANDED_OPS


def _value_types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """name -> type of every value shape inference types, in every scope (weights by
    their dims)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(without_weight_data(proto), strict_mode=False)
    except Exception:  # types are what the bodies are built from: a node without them stays
        inferred = proto
    types: dict[str, onnx.TypeProto] = {}
    for g in nested_graphs(inferred.graph):
        for vi in [*g.value_info, *g.input, *g.output]:
            if vi.type.HasField("tensor_type"):
                types.setdefault(vi.name, vi.type)
    for t in (t for g in nested_graphs(proto.graph) for t in g.initializer):
        types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types


def _body(
    node: onnx.NodeProto, opset: int, types: dict[str, onnx.TypeProto]
) -> tuple[onnx.FunctionProto | None, str]:
    """The node's function body for its attributes and input types, or why there is none."""
    try:
        schema = defs.get_schema(node.op_type, opset, "")
    except defs.SchemaError:
        return None, f"the installed onnx has no {node.op_type} schema at opset {opset}"
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    plain = [v for v in schema.function_opset_versions if v <= opset]
    if not dependent and not plain:
        return None, f"the installed onnx defines no function body of {node.op_type} for opset {opset}"
    present = [i for i in node.input if i]
    missing = [i for i in present if i not in types]
    if missing:
        return None, f"the types of {missing} are unknown (shape inference did not reach them)"
    elem = types[present[0]].tensor_type.elem_type if present else 0
    if elem not in _BODY_TYPES:
        # bfloat16: the body rounds every intermediate to 8 bits, the operator's own
        # kernels (ONNX's reference, ONNX Runtime) compute in float32 and round once
        name = (
            onnx.TensorProto.DataType.Name(elem) if elem in onnx.TensorProto.DataType.values() else str(elem)
        )
        return None, f"its body is written out for float32, float16 and double inputs, not {name}"
    # the optional inputs left out at the end are dropped; one left out in the middle
    # passes an empty type, as the function builder expects
    last = max((k for k, i in enumerate(node.input) if i), default=-1)
    arg_types = [
        types[i].SerializeToString() if i else onnx.TypeProto().SerializeToString()
        for i in node.input[: last + 1]
    ]
    try:
        if dependent:
            raw = schema.get_context_dependent_function_with_opset_version(
                max(dependent), node.SerializeToString(), arg_types
            )
        else:
            raw = schema.get_function_with_opset_version(max(plain))
    except Exception as e:  # the builder refuses a form (ValidationError, RuntimeError)
        return (
            None,
            f"onnx could not build its function body: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
        )
    body = onnx.FunctionProto()
    body.ParseFromString(raw)
    if not body.node:
        return None, "onnx built an empty function body"
    return body, ""


def _equal_heads(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> bool:
    """Whether an Attention's query and key / value have as many heads (no grouped-query
    repeat): dimension 1 of 4-D inputs, else the ``q_num_heads`` / ``kv_num_heads``
    attributes."""
    attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
    dims = []
    for name in node.input[:3]:
        t = types.get(name)
        if t is None or not t.tensor_type.HasField("shape"):
            return False
        dims.append(t.tensor_type.shape.dim)
    if all(len(d) == 4 for d in dims):
        heads = [d[1].dim_value if d[1].HasField("dim_value") else None for d in dims]
        return heads[0] is not None and heads[0] == heads[1] == heads[2]
    q, kv = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
    return q is not None and q > 0 and q == kv


def _without_head_repeat(body: onnx.FunctionProto) -> onnx.FunctionProto:
    """``body`` with each ``Reshape(Expand(Unsqueeze(x, [2]), s), t)`` replaced by ``x``:
    the grouped-query repeat of the keys and values, which copies them once when the
    query has as many heads (the caller checks)."""
    producers = {o: n for n in body.node for o in n.output}

    def axes_two(n: onnx.NodeProto) -> bool:
        if len(n.input) < 2:
            return False
        c = producers.get(n.input[1])
        if c is None or c.op_type != "Constant":
            return False
        a = next((a for a in c.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
        return a is not None and numpy_helper.to_array(a.t).reshape(-1).tolist() == [2]

    alias: dict[str, str] = {}
    for n in body.node:
        if n.op_type != "Reshape":
            continue
        e = producers.get(n.input[0])
        u = producers.get(e.input[0]) if e is not None and e.op_type == "Expand" else None
        if u is not None and u.op_type == "Unsqueeze" and axes_two(u):
            alias[n.output[0]] = u.input[0]
    return _aliased(body, alias, set(alias))


def _aliased(body: onnx.FunctionProto, alias: dict[str, str], dropped: set[str]) -> onnx.FunctionProto:
    """``body`` without the nodes writing ``dropped`` values, every read of an ``alias``
    key redirected to its value (an Identity keeps a formal output's name)."""
    if not alias:
        return body

    def resolve(v: str) -> str:
        while v in alias:
            v = alias[v]
        return v

    out = onnx.FunctionProto()
    out.CopyFrom(body)
    del out.node[:]
    for n in body.node:
        if any(o in dropped for o in n.output):
            continue
        n2 = onnx.NodeProto()
        n2.CopyFrom(n)
        for k, i in enumerate(n2.input):
            n2.input[k] = resolve(i)
        out.node.append(n2)
    for o in out.output:
        if o in alias:
            out.node.append(onnx.helper.make_node("Identity", [resolve(o)], [o]))
    return out


def _without_zero_bias(body: onnx.FunctionProto) -> onnx.FunctionProto:
    """``body`` without the work an all-zero bias does: Attention's body adds a bias made
    by ``ConstantOfShape`` (zeros when there is no mask and no causal masking) to the
    scores before the Softmax, and zeroes the rows where that bias is -inf everywhere
    (none, for zeros). Dropped: an Add of such zeros whose result only a Softmax reads
    (through Casts): adding +0 changes at most a zero's sign, and exp(-0) = exp(+0), so
    the Softmax's bits are the same; a Where whose condition is Equal(ReduceMax(zeros),
    -inf), always false. Two passes over the score matrix per head less."""
    producers = {o: n for n in body.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in body.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def source(v: str) -> onnx.NodeProto | None:
        n = producers.get(v)
        while n is not None and n.op_type in ("Identity", "Cast", "CastLike") and n.input:
            n = producers.get(n.input[0])
        return n

    def constant(v: str) -> np.ndarray | None:
        n = source(v)
        if n is None or n.op_type != "Constant":
            return None
        a = next((a for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
        return None if a is None else numpy_helper.to_array(a.t)

    def zeros(v: str) -> bool:
        n = source(v)
        if n is None:
            return False
        if n.op_type == "ConstantOfShape":
            a = next((a for a in n.attribute if a.name == "value"), None)
            return a is None or not numpy_helper.to_array(a.t).any()
        return n.op_type in ("ReduceMax", "ReduceMin") and bool(n.input) and zeros(n.input[0])

    def only_softmax_reads(v: str) -> bool:
        users = readers.get(v, [])
        return bool(users) and all(
            u.op_type == "Softmax" or (u.op_type == "Cast" and only_softmax_reads(u.output[0])) for u in users
        )

    alias: dict[str, str] = {}
    for n in body.node:
        if n.op_type == "Add" and len(n.input) == 2 and zeros(n.input[1]) and only_softmax_reads(n.output[0]):
            alias[n.output[0]] = n.input[0]
        elif n.op_type == "Where" and len(n.input) == 3:
            cond = producers.get(n.input[0])
            if cond is not None and cond.op_type == "Equal" and zeros(cond.input[0]):
                c = constant(cond.input[1])
                if c is not None and c.size == 1 and np.isneginf(c).all():
                    alias[n.output[0]] = n.input[2]
    return _aliased(body, alias, set(alias))


def _defaults(node: onnx.NodeProto, opset: int) -> dict[str, onnx.AttributeProto]:
    """The schema's default of each attribute ``node`` leaves out (a plain function body
    reads them by reference: Selu's ``alpha`` and ``gamma``)."""
    schema = defs.get_schema(node.op_type, opset, "")
    given = {a.name for a in node.attribute}
    return {
        name: a.default_value
        for name, a in schema.attributes.items()
        if name not in given and a.default_value.type != onnx.AttributeProto.UNDEFINED
    }


def _inline(
    node: onnx.NodeProto,
    name: str,
    body: onnx.FunctionProto,
    taken: set[str],
    defaults: dict[str, onnx.AttributeProto] | None = None,
) -> list[onnx.NodeProto]:
    """``body``'s nodes with its formal inputs and outputs bound to ``node``'s and its
    own values renamed ``{name}/{value}`` (unique in the graph); an attribute the body
    reads by reference is the node's, else the schema's default (``defaults``)."""
    rename: dict[str, str] = {"": ""}
    for k, formal in enumerate(body.input):
        rename[formal] = node.input[k] if k < len(node.input) else ""
    for k, formal in enumerate(body.output):
        if k < len(node.output) and node.output[k]:
            rename[formal] = node.output[k]
    attrs = {**(defaults or {}), **{a.name: a for a in node.attribute}}

    def fresh(base: str) -> str:
        return unused_name(f"{name}/{base}", taken)

    out: list[onnx.NodeProto] = []
    for k, b in enumerate(body.node):
        n = onnx.NodeProto()
        n.CopyFrom(b)
        n.name = fresh(b.name or f"{b.op_type}_{k}")
        del n.input[:]
        n.input.extend(rename[i] if i in rename else _internal(i, rename, fresh) for i in b.input)
        del n.output[:]
        n.output.extend(rename[o] if o in rename else _internal(o, rename, fresh) for o in b.output)
        kept = []
        for a in n.attribute:
            if a.ref_attr_name:  # an attribute of the function: the node's own, or its default
                if a.ref_attr_name not in attrs:
                    continue
                a2 = onnx.AttributeProto()
                a2.CopyFrom(attrs[a.ref_attr_name])
                a2.name = a.name
                kept.append(a2)
            else:
                kept.append(a)
        del n.attribute[:]
        n.attribute.extend(kept)
        if b.domain in ("", "ai.onnx"):
            n.domain = ""
        out.append(n)
    return out


def _internal(value: str, rename: dict[str, str], fresh) -> str:
    if not value:
        return ""
    if value not in rename:
        rename[value] = fresh(value)
    return rename[value]
