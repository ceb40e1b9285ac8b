"""The shapes an ONNX file declares are hints: graph outputs and ``value_info`` are
re-inferred on load (:func:`reinfer_declared_shapes`), so a broken declaration (rank 0
for "unknown", a wrong rank or dimension, ``-1``, a type without a shape) never reaches a
written file. Used by :mod:`quanta.ir.onnx_io`; works on protos only."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["infer_shapes", "reinfer_declared_shapes", "tensor_types", "without_weight_data"]

#: element types whose tensors never hold a shape, and the size from which their data
#: is left out of the copy that shape inference reads (a Reshape target, a Resize
#: scale, a Range bound are int64 or a few floats: kept whole)
_WEIGHT_TYPES = frozenset(
    {
        TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16,
        TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16,
        TensorProto.INT4, TensorProto.UINT4,
    }
)  # fmt: skip
_WEIGHT_MIN_ELEMENTS = 1024
_DATA_FIELDS = ("raw_data", "float_data", "double_data", "int32_data")


def _tensors(graph: onnx.GraphProto):
    """Every TensorProto of ``graph`` in a fixed order: initializers, then the tensor
    attributes of its nodes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.TENSORS:
                yield from a.tensors
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from _tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _tensors(g)


def _is_weight(t: onnx.TensorProto) -> bool:
    if t.data_type not in _WEIGHT_TYPES or t.data_location == TensorProto.EXTERNAL:
        return False
    n = 1
    for d in t.dims:
        n *= d
    return n >= _WEIGHT_MIN_ELEMENTS


def without_weight_data(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose large weight tensors keep their type and dims but not
    their data: what shape inference reads of them. ``onnx.shape_inference`` serializes
    the whole model into C++ and back; on a 54 MB model that is 0.41 s a call, on the
    stripped copy 1 ms, with the same inferred types."""
    bare = onnx.ModelProto()
    bare.CopyFrom(proto)
    for t in _tensors(bare.graph):
        if _is_weight(t):
            for f in _DATA_FIELDS:
                t.ClearField(f)
    return bare


def infer_shapes(proto: onnx.ModelProto, **kw) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes(proto, **kw)``, computed on
    :func:`without_weight_data`'s copy; the returned model holds ``proto``'s data."""
    inferred = onnx.shape_inference.infer_shapes(without_weight_data(proto), **kw)
    # an ai.onnx.ml output typed from its schema lets inference type what follows it;
    # each round types at least one more such output, a chain of them takes a few
    for _ in range(4):
        if not _schema_element_types(inferred):
            break
        inferred = onnx.shape_inference.infer_shapes(inferred, **kw)
    for mine, theirs in zip(_tensors(inferred.graph), _tensors(proto.graph)):
        if _is_weight(theirs):
            mine.CopyFrom(theirs)
    return inferred


#: a schema's fixed tensor type string -> element type
_TENSOR_TYPES = {
    f"tensor({name})": value
    for name, value in (
        ("float", onnx.TensorProto.FLOAT),
        ("double", onnx.TensorProto.DOUBLE),
        ("int64", onnx.TensorProto.INT64),
        ("int32", onnx.TensorProto.INT32),
        ("string", onnx.TensorProto.STRING),
        ("bool", onnx.TensorProto.BOOL),
    )
}


def _schema_element_types(proto: onnx.ModelProto) -> bool:
    """Element types of ``ai.onnx.ml`` outputs that shape inference leaves untyped:
    most of that domain's operators (Scaler, Normalizer, Imputer, TreeEnsembleRegressor,
    …) have no inference function, so the float tensor a Scaler writes before a
    classifier's MatMul would have no type, and nothing after it would be quantized. The
    schema fixes the type (``tensor(float)``) or ties it to an input's (``T``); only the
    element type is added, as value_info of the main graph. Returns whether any was."""
    g = proto.graph
    ml_version = next((o.version for o in proto.opset_import if o.domain == "ai.onnx.ml"), None)
    if ml_version is None:
        return False
    added = False
    known: dict[str, int] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            known[vi.name] = vi.type.tensor_type.elem_type
    for t in g.initializer:
        known[t.name] = t.data_type
    declared = {vi.name for vi in (*g.input, *g.value_info, *g.output)}
    for node in g.node:
        if node.domain == "ai.onnx.ml":
            try:
                schema = onnx.defs.get_schema(node.op_type, ml_version, domain="ai.onnx.ml")
            except Exception:  # an operator this onnx does not know
                schema = None
            if schema is not None:
                for i, name in enumerate(node.output):
                    if not name or name in known or not schema.outputs:
                        continue
                    formal = schema.outputs[min(i, len(schema.outputs) - 1)].type_str
                    elem = _TENSOR_TYPES.get(formal)
                    if elem is None:  # a type parameter: the first input of the same one
                        for j, x in enumerate(node.input):
                            if j < len(schema.inputs) and schema.inputs[j].type_str == formal and x in known:
                                elem = known[x]
                                break
                    if elem is not None:
                        known[name] = elem
                        if name not in declared:
                            g.value_info.append(onnx.helper.make_tensor_value_info(name, elem, None))
                            added = True
    return added


def _clean_dims(tt: onnx.TypeProto.Tensor) -> None:
    """A negative ``dim_value`` (exporters write -1 for "dynamic") becomes an unknown
    dimension: ONNX dimensions are >= 0, and shape inference reports -1 as a conflict."""
    if not tt.HasField("shape"):
        return
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value < 0:
            d.ClearField("dim_value")


def _merged_tensor_type(
    inferred: onnx.TypeProto.Tensor, declared: onnx.TypeProto.Tensor
) -> onnx.TypeProto.Tensor:
    """The inferred type, with the declared dimension kept where inference left one
    unknown (a symbolic name such as ``batch`` is worth keeping). A declared shape of
    another rank, or a declared dimension that contradicts an inferred one, is dropped."""
    out = onnx.TypeProto.Tensor()
    out.CopyFrom(inferred)
    if not declared.HasField("shape") or len(declared.shape.dim) != len(inferred.shape.dim):
        return out
    for d, hint in zip(out.shape.dim, declared.shape.dim):
        if not d.HasField("dim_value") and not d.HasField("dim_param"):
            if hint.HasField("dim_value") or hint.HasField("dim_param"):
                d.CopyFrom(hint)
    return out


def tensor_types(vis) -> dict[str, onnx.TypeProto.Tensor]:
    """name -> tensor type of the ValueInfoProtos that hold a tensor type."""
    return {vi.name: vi.type.tensor_type for vi in vis if vi.type.HasField("tensor_type")}


# Rounds of "infer, then give rank hints where inference stopped": each round lets
# inference pass one more data-dependent shape (a Reshape to Concat(Cast(Shape(x)))).
_RANK_HINT_ROUNDS = 8


def _graph_facts(
    graph: onnx.GraphProto,
) -> tuple[dict[str, onnx.TypeProto.Tensor], dict[str, onnx.TensorProto]]:
    """What :func:`_rank_hints` reads of a graph that inference does not change: the
    types of the initializers and of the shaped graph inputs (inputs last: they win),
    and the constant tensors by name (initializers and Constant nodes)."""
    known: dict[str, onnx.TypeProto.Tensor] = {}
    for t in graph.initializer:
        known[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims)).tensor_type
    for vi in graph.input:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            known[vi.name] = vi.type.tensor_type
    consts = {t.name: t for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.output and any(a.name == "value" for a in n.attribute):
            consts[n.output[0]] = next(a.t for a in n.attribute if a.name == "value")
    return known, consts


def _rank_hints(
    graph: onnx.GraphProto,
    got: dict[str, onnx.TypeProto.Tensor],
    facts: tuple[dict[str, onnx.TypeProto.Tensor], dict[str, onnx.TensorProto]] | None = None,
) -> list[onnx.ValueInfoProto]:
    """Outputs whose shape inference left unknown but whose rank follows from an input's
    static shape: Reshape and ConstantOfShape have the length of their 1-D shape input
    as rank, Resize and Upsample the rank of their data input. ONNX's data propagation
    stops at ops it does not evaluate (Cast of a Shape, as Paddle exports write), and
    every op after such a Reshape would be left without a shape. ``facts``:
    :func:`_graph_facts` of ``graph``, when the caller has them from an earlier round
    (inference keeps the initializers, inputs and nodes)."""
    fixed, consts = facts if facts is not None else _graph_facts(graph)
    known = dict(got)
    known.update(fixed)
    hints = []
    for n in graph.node:
        if n.domain not in ("", "ai.onnx") or not n.output or not n.output[0] or n.output[0] in known:
            continue
        if n.op_type in ("Reshape", "ConstantOfShape"):
            shape_input = (
                n.input[1] if n.op_type == "Reshape" and len(n.input) > 1 else n.input[0] if n.input else ""
            )
            st = known.get(shape_input)
            if st is None or len(st.shape.dim) != 1 or not st.shape.dim[0].HasField("dim_value"):
                continue
            rank = st.shape.dim[0].dim_value
            if n.op_type == "Reshape":
                elem = known[n.input[0]].elem_type if n.input[0] in known else 0
            else:
                value = next((a.t for a in n.attribute if a.name == "value"), None)
                elem = value.data_type if value is not None else TensorProto.FLOAT
        elif n.op_type in ("Resize", "Upsample"):
            xt = known.get(n.input[0]) if n.input else None
            if xt is None:
                continue
            rank, elem = len(xt.shape.dim), xt.elem_type
        else:
            continue
        if not elem:
            continue
        dims: list[int | None] = [None] * rank
        target = consts.get(shape_input) if n.op_type in ("Reshape", "ConstantOfShape") else None
        if target is not None:
            values = numpy_helper.to_array(target).reshape(-1)
            allowzero = any(a.name == "allowzero" and a.i for a in n.attribute)
            dims = [
                int(v) if v > 0 or (v == 0 and (allowzero or n.op_type == "ConstantOfShape")) else None
                for v in values
            ]
        hints.append(helper.make_tensor_value_info(n.output[0], elem, dims))
        known[n.output[0]] = hints[-1].type.tensor_type
    return hints


def reinfer_declared_shapes(proto: onnx.ModelProto) -> None:
    """Re-infer the shapes of graph outputs and ``value_info`` in place; the declared
    ones are hints only.

    Exporters write outputs declared rank-0 (``shape {}`` for "unknown"), of the wrong
    rank or dimensions, ``-1`` dimensions, or ``value_info`` whose type has no shape.
    Copied into the output, each makes the written file fail ``onnx.checker`` (a type
    without a shape) or strict shape inference (ONNX Runtime's "Inferred shape and
    existing shape differ"). So:

    1. negative dimensions of inputs, outputs and ``value_info`` become unknown;
    2. shapes are inferred from the inputs and initializers alone (``value_info``
       removed, outputs reduced to their element type); where inference stops at a
       data-dependent shape, the rank the op implies is given as a hint and inference
       runs again (:func:`_rank_hints`);
    3. an inferred type wins; a declared dimension fills only a dimension inference left
       unknown (same rank); a value inference gives no shape keeps its declared shape
       when that has one (an output after a custom op), else only its element type
       (unknown rank: the writer leaves it out of ``value_info``, and infers an
       output's shape again from the written graph).
    """
    g = proto.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        if vi.type.HasField("tensor_type"):
            _clean_dims(vi.type.tensor_type)
    declared_outputs = tensor_types(g.output)
    declared_vi = tensor_types(g.value_info)
    bare = without_weight_data(proto)
    del bare.graph.value_info[:]
    for vi in bare.graph.output:
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
    got: dict[str, onnx.TypeProto.Tensor] = {}
    facts = None  # the rounds' graphs differ only in value_info
    for _ in range(_RANK_HINT_ROUNDS):
        try:
            inferred = onnx.shape_inference.infer_shapes(bare, strict_mode=False, data_prop=True).graph
        except Exception:  # inference that fails as a whole leaves only the declared hints
            break
        # an element type without a shape (unknown rank) still types the value in the IR;
        # the writer leaves such values out of value_info
        got = {
            name: tt
            for name, tt in tensor_types([*inferred.value_info, *inferred.output]).items()
            if tt.elem_type
        }
        if facts is None:
            facts = _graph_facts(inferred)
        hints = _rank_hints(inferred, {name: tt for name, tt in got.items() if tt.HasField("shape")}, facts)
        if not hints:
            break
        bare.graph.value_info.extend(hints)
    for vi in g.output:
        tt = got.get(vi.name)
        if tt is not None and tt.HasField("shape"):
            vi.type.tensor_type.CopyFrom(_merged_tensor_type(tt, declared_outputs[vi.name]))
    outputs = {vi.name for vi in g.output}
    kept = []
    for name, tt in got.items():
        if name in outputs:
            continue
        hint = declared_vi.get(name)
        if (
            not tt.HasField("shape")
            and hint is not None
            and hint.HasField("shape")
            and hint.elem_type == tt.elem_type
        ):
            tt = hint  # inference knows only the element type: the declared shape is the hint
        elif tt.HasField("shape"):
            tt = _merged_tensor_type(tt, hint if hint is not None else tt)
        kept.append(helper.make_value_info(name, onnx.TypeProto(tensor_type=tt)))
    for name, tt in declared_vi.items():
        if name not in got and name not in outputs and tt.HasField("shape") and tt.elem_type:
            kept.append(helper.make_value_info(name, onnx.TypeProto(tensor_type=tt)))
    non_tensor = [vi for vi in g.value_info if not vi.type.HasField("tensor_type")]
    del g.value_info[:]
    g.value_info.extend(kept + non_tensor)
