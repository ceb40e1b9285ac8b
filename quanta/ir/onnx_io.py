"""ONNX import and export.

``load`` reads a path, bytes or ``onnx.ModelProto`` into a :class:`~quanta.ir.graph.Model`:

1. parse (a truncated or non-ONNX file is a one-line :class:`ModelLoadError`);
2. external data: every ``location`` must resolve inside the model's folder (no
   absolute paths, no ``..`` escapes, no symlinks pointing out), then it is loaded;
3. structure: every input of every node is a graph input, an initializer or the output
   of some node (else "missing initializer or value"); nodes are sorted topologically
   (a cycle is an error naming its nodes); an initializer repeated with equal contents
   is kept once, one repeated with different values is an error naming it; ONNX Runtime's fused transformer operators
   become the ONNX operators they fuse (:mod:`quanta.ir.ms_contrib`), and ONNX's
   Attention, RMSNormalization and RotaryEmbedding their specification's function
   bodies (:mod:`quanta.ir.onnx_functions`);
4. ``onnx.checker`` (unknown operators are reported with the node's name) and
   ``onnx.shape_inference`` (non-strict: a model whose shapes cannot all be inferred
   still loads); the shapes the file declares for outputs and ``value_info`` are hints,
   re-inferred and never copied broken into a written file
   (:func:`quanta.ir.shape_hints.reinfer_declared_shapes`);
5. quantized types: values whose quantization parameters are constants become
   :class:`~quanta.ir.types.QuantType` (see :func:`annotate_quantized_types`);
6. subgraphs (If branches, Loop/Scan bodies) stay ``GraphProto`` attributes; the values
   of the enclosing graph they read are bound as trailing inputs of their node
   (:attr:`~quanta.ir.graph.Node.outer_names`), so use lists and liveness see them.

A model whose data reaches protobuf's 2 GB is checked from its file and shape-inferred
before its external data is loaded.

Q/DQ design decision: QuantizeLinear / DequantizeLinear stay *nodes* of the graph; the
tensor between them carries the quantized type. Export therefore gives back the same
QDQ structure, with each quantized value written as its storage type.

``save`` writes atomically (temporary file in the destination folder, then
``os.replace``), refuses to overwrite the file the model was loaded from (or its
external data), and produces byte-identical files for identical graphs. A model loaded
from a file with external data, or whose tensors reach 2 GB, is written with external
data (``<output>.data``). Every graph output gets a shape (inferred for the written
graph, else the one it was loaded with); values of unknown rank are left out of
``value_info``; subgraphs read the current names of the outer values they use.

This module is over 800 lines: loading, the two conversions between proto and IR and
saving share the proto walkers (``_all_tensors``, the external-data entries) and the
checker's error wording. Self-contained parts live next to it: declared shapes as hints
(:mod:`quanta.ir.shape_hints`) and subgraph scopes (:mod:`quanta.ir.subgraphs`).
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import secrets
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from quanta.ir.graph import Graph, GraphError, Model, Node, Value, toposort_nodes
from quanta.ir.ms_contrib import decompose_contrib_ops
from quanta.ir.onnx_functions import expand_function_ops, inline_model_functions, nested_graphs
from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.ir.op_facts import derive
from quanta.ir.quark_ops import decompose_quark_ops
from quanta.ir.shape_hints import infer_shapes as infer_light
from quanta.ir.shape_hints import reinfer_declared_shapes, tensor_types, without_weight_data
from quanta.ir.subgraphs import renamed_graph, subgraph_outer_names, subgraph_outer_names_of_graph
from quanta.ir.types import (
    E8M0,
    CalibratedType,
    FloatType,
    IntType,
    MXType,
    QuantType,
    TensorType,
    elem_from_numpy,
    elem_from_onnx,
)

__all__ = [
    "QUANT_OPERANDS",
    "ModelLoadError",
    "annotate_quantized_types",
    "attribute_to_python",
    "load",
    "load_proto",
    "lower_opset_for_qdq",
    "reinfer_declared_shapes",
    "save",
    "share_equal_initializers",
    "to_proto",
    "upgrade_opset",
]


class ModelLoadError(ValueError):
    """A model file or proto that quanta cannot accept; the message names the file,
    node or tensor and what was expected."""


# -- loading -----------------------------------------------------------------


def load_proto(model: str | os.PathLike | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """Parse and validate, returning the proto (external data loaded) and its path."""
    proto, path, _ = _load_proto(model)
    return proto, path


def _load_proto(
    model: str | os.PathLike | bytes | onnx.ModelProto,
) -> tuple[onnx.ModelProto, str | None, dict[str, str]]:
    """:func:`load_proto`, plus why each foreign operator the canonicalizations left as
    written was left (node name -> reason; ``Model.load_notes``)."""
    path: str | None = None
    left: list[tuple[str, str, str]] = []
    # the serialized model as given passed onnx.checker: the canonicalizations below
    # (tested rewrites) need no second check of the whole proto, whose serialization
    # doubles the load's peak memory and takes ~0.5 s on an 84 MB model
    checked = False
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        where = "model"
    elif isinstance(model, (bytes, bytearray, memoryview)):
        raw = bytes(model)
        checked = _passes_checker(raw)
        proto = _parse(raw, "model bytes")
        del raw
        where = "model bytes"
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        where = path
        if not os.path.exists(path):
            raise ModelLoadError(f"{path}: no such file")
        if os.path.isdir(path):
            raise ModelLoadError(f"{path}: is a folder, expected an .onnx file")
        with open(path, "rb") as f:
            raw = f.read()
        checked = _passes_checker(raw)  # before the parse: the file's bytes and a proto, not three copies
        proto = _parse(raw, path)
        del raw
        base = os.path.dirname(os.path.abspath(path))
        # the file's size is the proto's (ByteSize serializes the message to count it)
        if os.path.getsize(path) + _external_bytes(proto, base) >= PROTO_LIMIT:
            # Over protobuf's 2 GB with its data: the checker reads the file (external
            # data stays on disk) and shapes are inferred before the data is loaded
            _check_structure(proto.graph, where)
            _check_file(path)
            inline_model_functions(proto)
            left = decompose_contrib_ops(proto) + decompose_quark_ops(proto)
            expand_function_ops(proto)
            reinfer_declared_shapes(proto)
            _load_external_data(proto, base, path)
            return proto, path, _notes(left)
        # the checker reads the sizes of tensors only once their data is in the proto
        checked = checked and not _uses_external_data(proto)
        _load_external_data(proto, base, path)
    else:
        raise TypeError(f"expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    if path is None and _uses_external_data(proto):
        raise ModelLoadError(f"{where}: tensors use external data; load the model from its file path instead")
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{where}: not an ONNX model (no graph)")
    _drop_shadowed_initializers(proto.graph, where)
    _check_structure(proto.graph, where)
    _type_bare_declarations(proto, where)
    # the model's own functions (a quantizer's quant::QMatMulStatic8bits), as their bodies
    inline_model_functions(proto)
    # ONNX Runtime's fused transformer operators, as the ONNX operators they fuse
    left = decompose_contrib_ops(proto)
    # AMD Quark's extended quantize / dequantize, as the operators they compute
    left += decompose_quark_ops(proto)
    # ONNX's Attention, RMSNormalization, RotaryEmbedding, as their function bodies
    expand_function_ops(proto)
    if checked:
        _sort(proto)
    else:
        _check(proto, where)
    reinfer_declared_shapes(proto)
    return proto, path, _notes(left)


def _notes(left: list[tuple[str, str, str]]) -> dict[str, str]:
    return {name: why for name, _, why in left if name}


def _drop_shadowed_initializers(graph: onnx.GraphProto, where: str) -> None:
    """Initializers that repeat a name with equal contents: one is kept (onnx.checker
    refuses the file, ONNX Runtime runs it). Copies that differ are an error naming the
    tensor: ONNX Runtime's choice among them is an implementation detail (the last copy
    of a tensor under 128 bytes, the second to last from 128 on, in 1.32), so the file has no
    one meaning. Intel Neural Compressor writes an LSTM's quantized biases once per use
    under one name, with equal zero points and differing values and scales."""
    first: dict[str, onnx.TensorProto] = {}
    drop: list[int] = []
    for k, t in enumerate(graph.initializer):
        seen = first.setdefault(t.name, t)
        if seen is t:
            continue
        if seen.SerializeToString(deterministic=True) != t.SerializeToString(deterministic=True):
            copies = sum(1 for u in graph.initializer if u.name == t.name)
            raise ModelLoadError(
                f"{where}: initializer '{t.name}' is defined {copies} times with different "
                "values; ONNX Runtime's choice among them is an implementation detail, so "
                "the model is ambiguous (keep one copy per name)"
            )
        drop.append(k)
    for k in reversed(drop):
        del graph.initializer[k]


def _type_bare_declarations(proto: onnx.ModelProto, where: str) -> None:
    """Declarations without a type (``ValueInfoProto`` holding a name only): a
    ``value_info`` entry is a hint and is dropped; a graph output gets the type shape
    inference gives it, as ONNX Runtime runs such files (onnx.checker refuses them). An
    output whose type cannot be inferred is an error naming it."""
    g = proto.graph
    bare_vi = [vi for vi in g.value_info if not vi.type.WhichOneof("value")]
    for vi in bare_vi:
        g.value_info.remove(vi)
    bare_out = [vi for vi in g.output if not vi.type.WhichOneof("value")]
    if not bare_out:
        return
    probe = without_weight_data(proto)
    del probe.graph.output[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False).graph
        types = {vi.name: vi.type for vi in [*inferred.value_info, *inferred.input]}
    except Exception:  # inference failing as a whole: every bare output is untyped
        types = {}
    types.update({t.name: onnx.helper.make_tensor_type_proto(t.data_type, None) for t in g.initializer})
    for vi in bare_out:
        t = types.get(vi.name)
        if (
            t is None
            or not t.WhichOneof("value")
            or (t.HasField("tensor_type") and not t.tensor_type.elem_type)
        ):
            raise ModelLoadError(
                f"{where}: graph output '{vi.name}' declares no type and shape inference gives it "
                "none; declare its element type"
            )
        vi.type.CopyFrom(t)


def _external_bytes(proto: onnx.ModelProto, base_dir: str) -> int:
    """Bytes the model's external data adds when loaded (from the ``length`` entries,
    else the size of the file from ``offset`` on)."""
    total = 0
    for t in _all_tensors(proto.graph):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        if "length" in info:
            total += int(info["length"])
        else:
            f = os.path.join(base_dir, info.get("location", ""))
            total += max(os.path.getsize(f) - int(info.get("offset", 0)), 0) if os.path.isfile(f) else 0
    return total


def _check_file(path: str) -> None:
    """``onnx.checker`` on the file itself (for models too large to check in memory)."""
    try:
        onnx.checker.check_model(path)
    except (onnx.checker.ValidationError, ValueError) as e:
        first = next((line for line in str(e).strip().splitlines() if line.strip()), "invalid model")
        raise ModelLoadError(f"{path}: ONNX checker: {first}") from None


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # google.protobuf.message.DecodeError and friends
        raise ModelLoadError(f"{where}: not a valid ONNX model (protobuf parse failed: {e})") from None
    if not proto.HasField("graph") or proto.ir_version == 0:
        raise ModelLoadError(f"{where}: not a valid ONNX model (no graph or ir_version; truncated file?)")
    return proto


def _uses_external_data(proto: onnx.ModelProto) -> bool:
    return any(t.data_location == TensorProto.EXTERNAL for t in _all_tensors(proto.graph))


def _all_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == AttributeProto.GRAPH:
                yield from _all_tensors(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_tensors(g)


def _load_external_data(proto: onnx.ModelProto, base_dir: str, where: str) -> None:
    base = os.path.realpath(base_dir)
    for t in _all_tensors(proto.graph):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if not loc:
            raise ModelLoadError(f"{where}: tensor '{t.name}' has external data without a location")
        if os.path.isabs(loc):
            raise ModelLoadError(
                f"{where}: tensor '{t.name}' external data location '{loc}' is absolute; "
                "expected a path inside the model's folder"
            )
        target = os.path.realpath(os.path.join(base, loc))
        if os.path.commonpath([base, target]) != base:
            raise ModelLoadError(
                f"{where}: tensor '{t.name}' external data location '{loc}' escapes the model's folder {base}"
            )
        if not os.path.isfile(target):
            raise ModelLoadError(f"{where}: tensor '{t.name}' external data file '{loc}' does not exist")
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
        size = os.path.getsize(target)
        if offset < 0 or offset > size or (length is not None and offset + length > size):
            raise ModelLoadError(
                f"{where}: tensor '{t.name}' external data [{offset}, +{length}) is outside '{loc}' ({size} bytes)"
            )
        with open(target, "rb") as f:
            f.seek(offset)
            t.raw_data = f.read() if length is None else f.read(length)
        del t.external_data[:]
        t.data_location = TensorProto.DEFAULT


def _check_structure(graph: onnx.GraphProto, where: str) -> None:
    """Names that are used but never defined, and cycles, before onnx.checker (whose
    messages for these are long and name neither the value nor the cycle)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    produced: dict[str, onnx.NodeProto] = {}
    for n in graph.node:
        for o in n.output:
            if o:
                produced[o] = n
    outer = _outer_scope_names(graph)
    for k, n in enumerate(graph.node):
        for name in n.input:
            if name and name not in defined and name not in produced and name not in outer:
                label = f"'{n.name}' ({n.op_type})" if n.name else f"#{k} ({n.op_type})"
                raise ModelLoadError(
                    f"{where}: node {label} uses '{name}', which is not a graph input, "
                    "an initializer or the output of any node (missing initializer?)"
                )
    for o in graph.output:
        if o.name not in defined and o.name not in produced:
            raise ModelLoadError(f"{where}: graph output '{o.name}' is not produced by any node")
    # cycle check on names (iterative DFS: a 10,000-node chain must not hit Python's
    # recursion limit)
    state: dict[int, int] = {}  # id(node) -> 1 visiting, 2 done
    for start in list(produced):
        if state.get(id(produced[start])) == 2:
            continue
        stack: list[tuple[onnx.NodeProto, int]] = [(produced[start], 0)]
        path: list[onnx.NodeProto] = []
        while stack:
            node, k = stack.pop()
            if k == 0:
                if state.get(id(node)) == 2:
                    continue
                state[id(node)] = 1
                path.append(node)
            inputs = [i for i in node.input if i and i not in defined and i in produced]
            if k < len(inputs):
                stack.append((node, k + 1))
                nxt = produced[inputs[k]]
                s_ = state.get(id(nxt))
                if s_ == 1:
                    cyc = path[path.index(nxt) :] if nxt in path else [nxt]
                    labels = [f"'{x.name or x.op_type}'" for x in cyc]
                    raise ModelLoadError(f"{where}: graph has a cycle through {' -> '.join(labels)}")
                if s_ != 2:
                    stack.append((nxt, 0))
            else:
                state[id(node)] = 2
                path.pop()


def _outer_scope_names(graph: onnx.GraphProto) -> set[str]:
    # Subgraph bodies (If/Loop) may refer to names of the enclosing graph; only the top
    # level is checked strictly, so nothing from outside is expected here.
    del graph  # unused: top-level graphs have no outer scope
    return set()


def _sorted_copy(graph: onnx.GraphProto) -> onnx.GraphProto:
    """The graph with nodes in topological order (ONNX requires it; some exporters
    write them unsorted, which ONNX Runtime accepts)."""
    names_available = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    order: list[int] = []
    seen: set[int] = set()
    for root in range(len(graph.node)):
        if root in seen:
            continue
        stack = [(root, 0)]
        seen.add(root)
        while stack:
            k, j = stack.pop()
            ins = [i for i in graph.node[k].input if i and i not in names_available and i in producer]
            if j < len(ins):
                stack.append((k, j + 1))
                p = producer[ins[j]]
                if p not in seen:
                    seen.add(p)
                    stack.append((p, 0))
            else:
                order.append(k)
    if order == list(range(len(graph.node))):
        return graph
    g = onnx.GraphProto()
    g.CopyFrom(graph)
    del g.node[:]
    g.node.extend(graph.node[k] for k in order)
    return g


def _passes_checker(data: bytes) -> bool:
    """Whether ``onnx.checker`` accepts the serialized model ``data`` as it is (a model
    it refuses is checked again after the canonicalizations, which report the error)."""
    try:
        onnx.checker.check_model(data)
    except Exception:  # ValidationError, ValueError (opset, size), C++ errors
        return False
    return True


def _sort(proto: onnx.ModelProto) -> None:
    sorted_graph = _sorted_copy(proto.graph)
    if sorted_graph is not proto.graph:
        proto.graph.CopyFrom(sorted_graph)


def _check(proto: onnx.ModelProto, where: str) -> None:
    _sort(proto)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        if "Field 'shape' of 'type' is required but missing" in str(e) and _io_without_shape(proto):
            # A graph input/output typed without a shape (unknown rank): ONNX Runtime
            # accepts it and so does quanta; the structure was checked above.
            return
        if "in initializer but not in graph input" in str(e) and proto.ir_version < 4:
            # IR 3 lists every initializer as a graph input; a file of IR 3 that does not
            # list them follows IR 4's rule (initializers are constants), which is how
            # ONNX Runtime reads it: it is that file, at IR 4
            proto.ir_version = 4
            _check(proto, where)
            return
        msg = str(e).strip().splitlines()
        first = next((line for line in msg if line.strip()), "invalid model")
        node_line = next((line for line in msg if "==> Context:" in line), "")
        detail = f"{first} {node_line.replace('==> Context:', '(at').strip()})" if node_line else first
        raise ModelLoadError(f"{where}: ONNX checker: {detail}") from None
    except ValueError as e:  # e.g. ir_version/opset problems raised as ValueError
        raise ModelLoadError(f"{where}: ONNX checker: {e}") from None


def _io_without_shape(proto: onnx.ModelProto) -> bool:
    return any(
        vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")
        for vi in [*proto.graph.input, *proto.graph.output]
    )


# -- opset upgrade ---------------------------------------------------------------


def _changed_ops(proto: onnx.ModelProto, source: int, target: int) -> list[str]:
    """ai.onnx ops of the main graph whose definition changed in (source, target]:
    those need the version converter's adapters; the others mean the same at both."""
    changed = set()
    for n in proto.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        try:
            at_target = onnx.defs.get_schema(n.op_type, target, "").since_version
        except Exception:  # not an ai.onnx op at the target: it changed (was removed)
            changed.add(n.op_type)
            continue
        if at_target > source:
            changed.add(n.op_type)
    return sorted(changed)


#: How :func:`upgrade_opset` keeps a Scan of opset 8 (batch axis, ``sequence_lens``)
#: through ONNX's version converter, whose Scan 8 -> 9 adapter drops the batch axis from
#: the graph's inputs: ``quanta::Scan8``, which ``passes.rules.scan8_as_loop`` writes in
#: standard operators (a Loop over the batch rows of a Scan).
SCAN8_DOMAIN, SCAN8_OP = "quanta", "Scan8"


def _converted_body(proto: onnx.ModelProto, body: onnx.GraphProto, target: int) -> onnx.GraphProto:
    """``body`` (a subgraph of ``proto``) at ai.onnx opset ``target``: the version
    converter, which converts the bodies of ai.onnx nodes but not of a node of another domain
    such as ``quanta::Scan8``, run on the body as a model of its own
    whose extra inputs stand for the enclosing-scope values it reads (typed as the main
    graph types them); ``body`` itself when such a value has no known type or the
    converter refuses."""
    from onnx import version_converter

    outer = subgraph_outer_names_of_graph(body)
    try:
        typed = infer_light(proto, strict_mode=False, data_prop=False)
    except Exception:  # shapes that cannot be inferred: the declared types only
        typed = proto
    g = typed.graph
    known = {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]}
    for t in g.initializer:
        known.setdefault(t.name, helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    if any(name not in known for name in outer):
        return body
    wrapped = onnx.GraphProto()
    wrapped.CopyFrom(body)
    wrapped.input.extend(known[name] for name in outer)
    model = helper.make_model(wrapped, opset_imports=list(proto.opset_import))
    model.ir_version = max(proto.ir_version, 4)
    try:
        converted = version_converter.convert_version(model, target).graph
    except Exception:  # an adapter the converter lacks: the body as written
        return body
    out = onnx.GraphProto()
    out.CopyFrom(converted)
    del out.input[len(body.input) :]
    return out


def _mark_scan8(proto: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """``proto`` with each Scan of its main graph as ``quanta::Scan8`` (the same inputs,
    outputs and attributes; its body converted to opset ``target``, which the converter
    does not do for a node of another domain); ``proto`` itself when it has none."""
    if not any(n.op_type == "Scan" and n.domain in ("", "ai.onnx") for n in proto.graph.node):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for n in out.graph.node:
        if n.op_type == "Scan" and n.domain in ("", "ai.onnx"):
            n.op_type, n.domain = SCAN8_OP, SCAN8_DOMAIN
            for a in n.attribute:
                if a.name == "body" and a.type == AttributeProto.GRAPH:
                    a.g.CopyFrom(_converted_body(proto, a.g, target))
    if not any(o.domain == SCAN8_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(SCAN8_DOMAIN, 1))
    return out


def upgrade_opset(proto: onnx.ModelProto, target: int, where: str = "model") -> onnx.ModelProto:
    """``proto`` converted to ai.onnx opset ``target`` (a model already there is
    returned as it is).

    1. ``onnx.version_converter`` (Upsample -> Resize, Pad/Slice attributes -> inputs,
       BatchNormalization's spatial, Dropout's ratio ...); a Scan of opset 8 comes out
       as ``quanta::Scan8`` (:data:`SCAN8_OP`), for ``passes.rules.scan8_as_loop``;
    2. if it fails (an adapter it lacks, or its own checks refusing a model ONNX
       Runtime runs), and no op of the model changed definition between the two
       opsets, the opset import alone is raised: the graph means the same;
    3. otherwise a ModelLoadError names the ops that need converting and why the
       converter refused.
    """
    source = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), target)
    if source >= target:
        return proto
    from onnx import version_converter

    if source < 9 <= target:
        proto = _mark_scan8(proto, target)
    try:
        return version_converter.convert_version(proto, target)
    except Exception as e:
        reason = (str(e).strip().splitlines() or ["unknown error"])[0]
    changed = _changed_ops(proto, source, target)
    if changed:
        raise ModelLoadError(
            f"{where}: opset {source} must be converted to {target} and the ONNX version converter failed "
            f"({reason}); ops whose definition changed in between: {', '.join(changed)}"
        )
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = target
    ops = [helper.make_opsetid(o.domain, o.version) for o in out.opset_import]
    out.ir_version = max(out.ir_version, helper.find_min_ir_version_for(ops, ignore_unknown=True))
    return out


#: The newest ai.onnx opset whose QuantizeLinear / DequantizeLinear ONNX Runtime 1.32 runs
#: (version 25, which holds for opsets 25-27; version 28 has no kernel there).
QDQ_RUNNABLE_OPSET = 27

#: Ops whose next version only adds element types (or drops integer ones a valid model
#: cannot use): a node of them means the same at the older opset when its types and
#: attributes are the older schema's, which strict, type-checking shape inference decides.
_TYPES_ONLY_CHANGES = frozenset(
    {
        "BitShift", "Cast", "Celu", "Compress", "DequantizeLinear", "Einsum", "OneHot",
        "Optional", "OptionalGetElement", "OptionalHasElement", "QuantizeLinear",
        "ReduceLogSum", "ReduceLogSumExp", "ReverseSequence", "Unique",
    }
)  # fmt: skip


def lower_opset_for_qdq(proto: onnx.ModelProto, target: int = QDQ_RUNNABLE_OPSET) -> onnx.ModelProto:
    """``proto`` at ai.onnx opset ``target`` when it is above it and every node means the
    same there (the Q / DQ that quantization inserts then have a version ONNX Runtime
    runs); else ``proto`` as it is. A node means the same when its op did not change in
    (target, source], or changed only by adding types and uses none of the new ones nor a
    new attribute (strict shape inference on the lowered model checks the types)."""
    source = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if source <= target:
        return proto
    for g in nested_graphs(proto.graph):
        for n in g.node:
            if n.domain not in ("", "ai.onnx"):
                continue
            try:
                new = onnx.defs.get_schema(n.op_type, source, "")
                old = onnx.defs.get_schema(n.op_type, target, "")
            except Exception:  # not an op at the target opset
                return proto
            if new.since_version == old.since_version:
                continue
            if n.op_type not in _TYPES_ONLY_CHANGES or any(a.name not in old.attributes for a in n.attribute):
                return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = target
    try:
        onnx.shape_inference.infer_shapes(out, check_type=True, strict_mode=True)
    except Exception:  # a type or form the older schema does not have: keep the opset
        return proto
    return out


def load(model: str | os.PathLike | bytes | onnx.ModelProto, *, infer_shapes: bool = True) -> Model:
    """Load an ONNX model into the quanta IR (see module docstring)."""
    proto, path, notes = _load_proto(model)
    where = path or "model"
    if infer_shapes:
        from quanta.ir.stand_ins import infer_through  # through com.microsoft Q / DQ and LSTM

        try:
            proto = infer_through(proto, strict_mode=False, data_prop=True)
        except Exception:  # a model whose shapes cannot be inferred still loads
            pass
    m = from_proto(proto, where)
    m.path = path
    m.load_notes = notes
    return m


def node_from_proto(
    n: onnx.NodeProto, inputs: Sequence[Value | None], outputs: Sequence[Value], *, name: str | None = None
) -> Node:
    """The IR node of ``n`` on ``inputs`` / ``outputs``: its op, domain, attributes (and
    their ONNX types, which export keeps), doc and overload; named ``name`` or n's name."""
    node = Node(
        n.op_type,
        inputs,
        outputs,
        {a.name: attribute_to_python(a) for a in n.attribute},
        name=n.name if name is None else name,
        domain=n.domain,
        attr_types={a.name: int(a.type) for a in n.attribute},
    )
    node.doc = n.doc_string
    node.overload = getattr(n, "overload", "")
    return node


def attribute_to_python(attr: AttributeProto) -> Any:
    """An attribute as a plain Python value: int, float, str, list, numpy array for
    tensors, the GraphProto itself for subgraphs."""
    t = attr.type
    if t == AttributeProto.INT:
        return int(attr.i)
    if t == AttributeProto.FLOAT:
        return float(attr.f)
    if t == AttributeProto.STRING:
        return attr.s.decode("utf-8", errors="replace")
    if t == AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    if t == AttributeProto.GRAPH:
        return attr.g
    if t == AttributeProto.INTS:  # the repeated field yields Python ints / floats: no per-item call
        return list(attr.ints)
    if t == AttributeProto.FLOATS:
        return list(attr.floats)
    if t == AttributeProto.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in attr.strings]
    if t == AttributeProto.TENSORS:
        return [numpy_helper.to_array(x) for x in attr.tensors]
    if t == AttributeProto.GRAPHS:
        return list(attr.graphs)
    if t == AttributeProto.SPARSE_TENSOR:
        return attr.sparse_tensor
    if t == AttributeProto.TYPE_PROTO:
        return attr.tp
    return helper.get_attribute_value(attr)


def _type_from_value_info(vi: onnx.ValueInfoProto) -> TensorType | None:
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    if tt.elem_type == 0:
        return None
    elem = elem_from_onnx(tt.elem_type)
    if not tt.HasField("shape"):
        return TensorType(elem, None)
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorType(elem, tuple(dims))


def value_info_types(graph: onnx.GraphProto) -> dict[str, TensorType]:
    """The types ``graph`` declares (value_info, inputs, outputs), by value name."""
    types: dict[str, TensorType] = {}
    for vi in [*graph.value_info, *graph.input, *graph.output]:
        t = _type_from_value_info(vi)
        if t is not None:
            types[vi.name] = t
    return types


def from_proto(
    proto: onnx.ModelProto, where: str = "model", arrays: Mapping[str, np.ndarray] | None = None
) -> Model:
    """The IR of ``proto``. ``arrays``: the data of the initializers of those names, which
    ``proto`` holds without data (:func:`to_proto`'s ``arrays``); each is used read-only,
    as an array read from the proto's bytes is, without a copy."""
    g = proto.graph
    types: dict[str, TensorType] = {}
    for vi in [*g.value_info, *g.input, *g.output]:
        t = _type_from_value_info(vi)
        if t is None:
            continue
        known = types.get(vi.name)
        if known is not None and t.shape is None and known.shape is not None and known.elem == t.elem:
            continue  # a graph output declared without a shape keeps the inferred one
        types[vi.name] = t
    graph = Graph(name=g.name or "main", doc=g.doc_string)
    values: dict[str, Value] = {}
    for init in g.initializer:
        given = None if arrays is None else arrays.get(init.name)
        if given is None:
            arr = numpy_helper.to_array(init)
        else:
            if (
                tuple(given.shape) != tuple(init.dims)
                or helper.np_dtype_to_tensor_dtype(given.dtype) != init.data_type
            ):
                raise ModelLoadError(
                    f"{where}: the array given for initializer '{init.name}' is {given.dtype} "
                    f"{tuple(given.shape)}, the model declares {tuple(init.dims)} of type {init.data_type}"
                )
            arr = given.view()
            arr.flags.writeable = False
        v = graph.add_initializer(
            init.name, arr, TensorType(elem_from_onnx(init.data_type), tuple(arr.shape))
        )
        values[init.name] = v
    for sp in g.sparse_initializer:
        arr = _sparse_to_dense(sp)
        values[sp.values.name] = graph.add_initializer(sp.values.name, arr)
    for i in g.input:
        if i.name in values:  # an input that also has an initializer (a default): keep the input
            v = values[i.name]
            graph.initializers.pop(i.name)
            v.type = types.get(i.name, v.type)
            graph.inputs.append(v)
            continue
        values[i.name] = graph.add_input(i.name, types.get(i.name))
    for k, n in enumerate(g.node):
        ins: list[Value | None] = []
        for name in n.input:
            if not name:
                ins.append(None)
                continue
            if name not in values:
                raise ModelLoadError(f"{where}: node '{n.name or n.op_type}' uses undefined value '{name}'")
            ins.append(values[name])
        outs: list[Value] = []
        for name in n.output:
            if not name:
                # An omitted optional output: give it a private, unused value.
                name = f"{n.name or n.op_type}__unused_output_{len(outs)}_{k}"
                v = Value(name, None)
                v.doc = "omitted optional output"
            else:
                if name in values:
                    raise ModelLoadError(f"{where}: value '{name}' is produced twice (SSA violated)")
                v = Value(name, types.get(name))
            values[name] = v
            outs.append(v)
        outer = [name for name in subgraph_outer_names(n) if name in values]
        ins.extend(values[name] for name in outer)
        node = node_from_proto(n, ins, outs)
        node.outer_names = tuple(outer)
        graph.add_node(node)
    outputs = []
    for o in g.output:
        if o.name not in values:
            raise ModelLoadError(f"{where}: graph output '{o.name}' is not produced by any node")
        outputs.append(values[o.name])
    graph.set_outputs(outputs)
    # a sequence, map or optional input / output has no IR type: its declared type is
    # written back as it was (a value_info without a type is not a valid model)
    graph.foreign_types = {
        vi.name: vi.type.SerializeToString()
        for vi in [*g.input, *g.output]
        if vi.type.WhichOneof("value") not in (None, "tensor_type")
    }
    model = Model(
        graph=graph,
        opset_imports={
            ("" if op.domain == "ai.onnx" else op.domain): int(op.version) for op in proto.opset_import
        },
        ir_version=int(proto.ir_version),
        producer_name=proto.producer_name,
        producer_version=proto.producer_version,
        model_version=int(proto.model_version),
        doc=proto.doc_string,
        metadata={p.key: p.value for p in proto.metadata_props},
        functions=list(proto.functions),
    )
    annotate_quantized_types(graph)
    graph.output_signature = [v.type for v in graph.outputs]
    return model


def _sparse_to_dense(sp: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sp.values)
    indices = numpy_helper.to_array(sp.indices)
    dense = np.zeros(int(np.prod(sp.dims)), dtype=values.dtype)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, tuple(sp.dims))
    dense[flat] = values
    return dense.reshape(tuple(sp.dims))


# -- quantized types -----------------------------------------------------------

# For every op with quantization parameters as inputs: (operand, scale input index,
# zero-point input index), operand = ("in", i) or ("out", i). A missing zero point
# means 0 of the operand's storage type.
QUANT_OPERANDS: dict[tuple[str, str], list[tuple[tuple[str, int], int, int]]] = {
    ("", "QuantizeLinear"): [(("out", 0), 1, 2)],
    ("", "DequantizeLinear"): [(("in", 0), 1, 2)],
    ("", "QLinearConv"): [(("in", 0), 1, 2), (("in", 3), 4, 5), (("out", 0), 6, 7)],
    (MS_DOMAIN, "QLinearConv"): [(("in", 0), 1, 2), (("in", 3), 4, 5), (("out", 0), 6, 7)],
    ("", "QLinearMatMul"): [(("in", 0), 1, 2), (("in", 3), 4, 5), (("out", 0), 6, 7)],
    # the product's own (6, 7) describe the codes the node keeps inside
    ("quanta", "QLinearMatMulAdd"): [
        (("in", 0), 1, 2),
        (("in", 3), 4, 5),
        (("in", 8), 9, 10),
        (("out", 0), 11, 12),
    ],
    (MS_DOMAIN, "QLinearAdd"): [(("in", 0), 1, 2), (("in", 3), 4, 5), (("out", 0), 6, 7)],
    (MS_DOMAIN, "QLinearMul"): [(("in", 0), 1, 2), (("in", 3), 4, 5), (("out", 0), 6, 7)],
    (MS_DOMAIN, "QLinearGlobalAveragePool"): [(("in", 0), 1, 2), (("out", 0), 3, 4)],
    (MS_DOMAIN, "QLinearAveragePool"): [(("in", 0), 1, 2), (("out", 0), 3, 4)],
    (MS_DOMAIN, "QLinearSigmoid"): [(("in", 0), 1, 2), (("out", 0), 3, 4)],
    (MS_DOMAIN, "QLinearLeakyRelu"): [(("in", 0), 1, 2), (("out", 0), 3, 4)],
    (MS_DOMAIN, "QLinearSoftmax"): [(("in", 0), 1, 2), (("out", 0), 3, 4)],
    ("quanta", "QLinearLookup"): [(("in", 0), 1, 2), (("out", 0), 3, 4)],
    ("quanta", "QLinearConv16"): [(("in", 0), 1, 2), (("in", 3), 4, 5), (("out", 0), 6, 7)],
    ("quanta", "QLinearMatMul16"): [(("in", 0), 1, 2), (("in", 3), 4, 5), (("out", 0), 6, 7)],
    ("quanta", "QLinearAffine16"): [(("in", 0), 1, 2), (("out", 0), 3, 4)],
    ("quanta", "QLinearAdd16"): [(("in", 0), 1, 2), (("in", 3), 4, 5), (("out", 0), 6, 7)],
    ("quanta", "QLinearMul16"): [(("in", 0), 1, 2), (("in", 3), 4, 5), (("out", 0), 6, 7)],
    # the 4-bit weight keeps the per-block type its DequantizeLinear gave it
    ("quanta", "MatMulW4A8"): [(("in", 0), 1, 2), (("out", 0), 6, 7)],
}


def quant_operands(node: Node) -> list[tuple[tuple[str, int], int, int]]:
    return _quant_operands(node.domain, node.op_type, len(node.inputs))


def _quant_operands(domain: str, op_type: str, n_inputs: int) -> list[tuple[tuple[str, int], int, int]]:
    """(operand, scale input, zero point input) of each quantized operand of an operator
    with ``n_inputs`` inputs."""
    key = ("" if domain == "ai.onnx" else domain, op_type)
    if key == (MS_DOMAIN, "QLinearConcat"):
        # Y_scale, Y_zero_point, then (tensor, scale, zero_point) triplets
        ops = [(("out", 0), 0, 1)]
        for k in range(2, n_inputs, 3):
            ops.append((("in", k), k + 1, k + 2))
        return ops
    if key == (MS_DOMAIN, "QGemm"):
        # A, a_scale, a_zp, B, b_scale, b_zp, C?, y_scale?, y_zp?: only the output's type
        # (a uint8 / int8 Y with y_scale, float32 without); B's per-channel axis follows
        # transB, which the table's fixed axes cannot say. Untyped, a QGemm reading
        # another's output (ORT's QOperator file of Linear -> ReLU -> Linear) left the
        # native binder an A of unknown type: the NumPy twin.
        return [(("out", 0), 7, 8)] if n_inputs > 7 else []
    if key == (MS_DOMAIN, "QuantizeLinear"):
        return QUANT_OPERANDS[("", "QuantizeLinear")]
    if key == (MS_DOMAIN, "DequantizeLinear"):
        return QUANT_OPERANDS[("", "DequantizeLinear")]
    return QUANT_OPERANDS.get(key, [])


def quant_type_from_params(
    node: Node,
    storage_value: Value | None,
    scale: Value | None,
    zero_point: Value | None,
    axis_default: int = 1,
) -> QuantType | MXType | None:
    """The QuantType described by constant ``scale``/``zero_point`` inputs of ``node``
    for an operand stored as ``storage_value``'s element type; None when the parameters
    are not constants or the storage is unknown. A float8e8m0 scale with a block size
    (DequantizeLinear, opset 24+) describes an :class:`MXType`."""
    if scale is None or not scale.is_const:
        return None
    if np.asarray(scale.const).dtype == E8M0.numpy:
        return _mx_type_from_params(node, storage_value, axis_default)
    if zero_point is not None and not zero_point.is_const:
        return None
    storage = None
    if zero_point is not None:
        storage = elem_from_numpy(zero_point.const.dtype)
    elif storage_value is not None and storage_value.type is not None:
        st = storage_value.type.elem
        storage = st.storage if isinstance(st, QuantType) else st
    if storage is None and node.op_type == "QuantizeLinear":
        out_dtype = node.attrs.get("output_dtype")
        storage = elem_from_onnx(out_dtype) if out_dtype else elem_from_onnx(TensorProto.UINT8)
    if not isinstance(storage, (IntType, FloatType)) or (isinstance(storage, IntType) and storage.bits == 1):
        return None
    if isinstance(storage, FloatType) and storage.name in ("f32", "f16", "bf16", "f64"):
        return None
    s = np.asarray(scale.const)
    expressed = elem_from_numpy(s.dtype)
    if not isinstance(expressed, FloatType):
        return None
    zp = np.zeros(s.shape, dtype=np.int64) if zero_point is None else np.asarray(zero_point.const)
    if zp.shape != s.shape:
        if zp.size == 1 and s.size == 1:
            zp = zp.reshape(s.shape)
        else:
            return None
    if s.size == 1:  # per tensor, most of a QDQ file's: the same test on one float
        s64 = float(s.reshape(-1)[0])
        if not math.isfinite(s64) or s64 <= 0:
            return None
    elif not np.all(np.isfinite(s.astype(np.float64))) or np.any(s.astype(np.float64) <= 0):
        return None
    zp_vals = zp.astype(np.float64) if isinstance(storage, FloatType) else zp.astype(np.int64)
    if s.size == 1 and s.ndim <= 1 and node.attrs.get("block_size", 0) in (0, None):
        if s.ndim == 0:
            return QuantType(storage, expressed, s.reshape(-1), zp_vals.reshape(-1))
        axis = int(node.attrs.get("axis", axis_default))
        return QuantType(storage, expressed, s.reshape(-1), zp_vals.reshape(-1), axis=axis)
    axis = int(node.attrs.get("axis", axis_default))
    block = node.attrs.get("block_size")
    if block:
        return QuantType(
            storage,
            expressed,
            s.reshape(-1),
            zp_vals.reshape(-1),
            axis=axis,
            block=int(block),
            scale_shape=s.shape,
        )
    if s.ndim != 1:
        return None
    if node.op_type in ("QLinearConv", "QLinearConv16"):
        axis = 0
    elif node.op_type in ("QLinearMatMul", "QLinearMatMul16", "QLinearMatMulAdd"):
        axis = -1
    return QuantType(storage, expressed, s, zp_vals, axis=axis)


def _mx_type_from_params(node: Node, storage_value: Value | None, axis_default: int) -> MXType | None:
    """The MX type of a DequantizeLinear with a float8e8m0 scale: the element type is the
    input's, the block size and axis the node's; None when they do not make one (the
    verifier names what is wrong)."""
    if storage_value is None or storage_value.type is None:
        return None
    st = storage_value.type.elem
    st = st.element if isinstance(st, MXType) else st
    block = node.attrs.get("block_size") or 0
    out = node.attrs.get("output_dtype") or 0
    expressed = elem_from_onnx(out) if out else None
    try:
        return MXType(
            st,
            expressed if isinstance(expressed, FloatType) else FloatType("f32"),  # type: ignore[arg-type]
            int(node.attrs.get("axis", axis_default)),
            int(block),
        )
    except ValueError:
        return None


def mx_type_of_quantize_mx(node: Node) -> MXType | None:
    """The element output's type of a quanta::QuantizeMX node (None when its attributes
    name no MX type)."""
    code = int(node.attrs.get("output_dtype", TensorProto.INT8))
    try:
        return MXType(
            elem_from_onnx(code),
            FloatType("f32"),
            int(node.attrs.get("axis", -1)),  # type: ignore[arg-type]
            int(node.attrs.get("block_size", 32)),
        )
    except ValueError:
        return None


#: Ops that only move or select elements: their outputs keep the input's element type
#: (the verifier's view rule uses the same set, quanta.ir.op_rules.VIEW_OPS).
VIEW_OPS_KEEPING_TYPE = derive("quanta.ir.onnx_io.VIEW_OPS_KEEPING_TYPE", lambda t: t.ops_where(view=True))


def _propagate_view_type(node: Node) -> None:
    """A view of a per-tensor quantized value (a QOperator model's Reshape on u8 data)
    carries the same quantized type; per-axis types are left alone (the axis moves)."""
    x = node.input(0)
    if x is None or x.type is None or not isinstance(x.type.elem, QuantType) or x.type.elem.axis is not None:
        return
    q = x.type.elem
    outs = node.outputs[:1] if node.op_type in ("MaxPool", "NhwcMaxPool") else node.outputs
    for o in outs:
        if o.type is None:
            o.type = TensorType(q, None)
        elif o.type.elem == q.storage:
            o.type = TensorType(q, o.type.shape)


def annotate_quantized_types(graph: Graph) -> None:
    """Give every value whose quantization parameters are constants its QuantType.

    - the output of QuantizeLinear (and of every QLinear* op) gets the type its
      scale/zero point inputs describe;
    - an input of DequantizeLinear / QLinear* ops that is an initializer or a graph
      input gets that type when all of its quantized consumers agree on it;
    - a value produced by one op and consumed with *different* parameters keeps its
      producer's type (the verifier reports the disagreement).

    Negative axes are kept as written; the rank is known only where shapes are.
    """
    wanted: dict[int, list[QuantType]] = {}
    for node in graph.nodes:
        if node.op_type in VIEW_OPS_KEEPING_TYPE and not node.domain:
            _propagate_view_type(node)
        if (node.domain, node.op_type) == ("quanta", "QuantizeMX") and node.outputs:
            t = mx_type_of_quantize_mx(node)
            if t is not None:
                node.outputs[0].type = TensorType(t, node.outputs[0].shape)
        for (kind, i), si, zi in quant_operands(node):
            v = node.input(i) if kind == "in" else (node.outputs[i] if i < len(node.outputs) else None)
            if v is None:
                continue
            q = quant_type_from_params(node, v, node.input(si), node.input(zi))
            if q is None:
                continue
            if kind == "out":
                v.type = TensorType(q, v.shape)
            else:
                wanted.setdefault(id(v), []).append(q)
    by_id = {id(v): v for v in graph.values()}
    for vid, qs in wanted.items():
        v = by_id[vid]
        if v.producer is not None and isinstance(v.elem, QuantType):
            continue  # keeps its producer's type
        if all(q == qs[0] for q in qs):
            v.type = TensorType(
                qs[0], v.shape if v.type is not None else (tuple(v.const.shape) if v.is_const else None)
            )


# -- export --------------------------------------------------------------------


def _elem_code(t: TensorType | None) -> int:
    if t is None:
        return 0
    e = t.elem
    if isinstance(e, (QuantType, MXType)):
        return e.storage.onnx
    if isinstance(e, CalibratedType):
        return e.expressed.onnx
    return e.onnx


def _value_info(
    v: Value, type_override: TensorType | None = None, foreign: dict[str, bytes] | None = None
) -> onnx.ValueInfoProto:
    t = type_override if type_override is not None else v.type
    if t is None:
        vi = onnx.ValueInfoProto()
        vi.name = v.name
        if foreign and v.name in foreign:
            vi.type.ParseFromString(foreign[v.name])
        return vi
    shape = None if t.shape is None else [d if d is not None else None for d in t.shape]
    return helper.make_tensor_value_info(v.name, _elem_code(t), shape)


def _attr_to_proto(name: str, value: Any, attr_type: int | None) -> AttributeProto:
    if attr_type == AttributeProto.FLOAT:
        return helper.make_attribute(name, float(value))
    if attr_type == AttributeProto.INT:
        return helper.make_attribute(name, int(value))
    if attr_type == AttributeProto.STRING:
        return helper.make_attribute(name, str(value))
    if attr_type in (AttributeProto.INTS, AttributeProto.FLOATS, AttributeProto.STRINGS) and len(value) == 0:
        return helper.make_attribute(name, [], attr_type=attr_type)
    if attr_type in (AttributeProto.FLOATS, AttributeProto.INTS):
        # filled in one C-level pass: a tree ensemble's lists hold millions of entries
        proto = AttributeProto(name=name, type=attr_type)
        if attr_type == AttributeProto.FLOATS:
            proto.floats.extend(np.asarray(value, np.float64).ravel().tolist())
        else:
            proto.ints.extend(np.asarray(value, np.int64).ravel().tolist())
        return proto
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [numpy_helper.from_array(x) for x in value])
    return helper.make_attribute(name, value)


# The initializer types whose ONNX bytes are the array's own bytes (``from_array``'s
# raw_data, on a little-endian machine): the ones ``to_proto(arrays=...)`` may leave out.
_PLAIN_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16,
        np.int32, np.uint32, np.int64, np.uint64, np.bool_,
    )
)  # fmt: skip
_ARRAY_MIN_BYTES = 4096  # smaller initializers stay in the proto: no buffer of their own


def _tensor_into(t: onnx.TensorProto, a: np.ndarray, name: str) -> None:
    """``numpy_helper.from_array(a, name)`` written into ``t``, an empty tensor already in
    its graph (no copy of the bytes into a message of its own first). A plain numeric
    array is written as from_array writes it: dims, the name when it has one, the
    little-endian bytes and the type; any other (strings, packed 4-bit, float8) through
    from_array itself."""
    if a.dtype not in _PLAIN_DTYPES:
        t.CopyFrom(numpy_helper.from_array(a, name))
        return
    t.dims.extend(a.shape)
    if name:
        t.name = name
    t.raw_data = numpy_helper.tobytes_little_endian(a)
    t.data_type = helper.np_dtype_to_tensor_dtype(a.dtype)


def to_proto(
    model: Model, *, data_limit: int | None = None, arrays: dict[str, np.ndarray] | None = None
) -> onnx.ModelProto:
    """The ONNX proto of ``model``; quantized values are written as their storage type.

    ``data_limit``: initializers of more elements than this are written as typed graph
    inputs without their data (a proto for shape inference only, which reads a weight's
    type but never its values: writing a ViT's 97 MB of weights cost 0.3 s).

    ``arrays``: initializers of a plain numeric type and at least 4 KB are written with
    their name, type and dims but no data, and their arrays (C-contiguous, not copied
    where they already are) put in this dict, in initializer order: a proto that
    :func:`from_proto` reads back with the same dict (``arrays=``) into the same model,
    for a transport that moves arrays without copying them (pickle protocol 5's
    out-of-band buffers, Ray's object store) where the weights would otherwise be copied
    into the proto, its serialisation and the pickle of those bytes."""
    g = model.graph
    # The proto is built in place: each initializer's bytes are written once, into the
    # model's own graph. onnx.helper's make_graph / make_model copy every initializer
    # twice more (extend, then CopyFrom of the whole graph): 85 MB of weights cost about
    # as much again in copies as in conversion. The fields set are the ones make_graph
    # and make_model set (proto2: a field set to its default is still written), so the
    # serialized bytes are the same.
    proto = onnx.ModelProto()
    graph = proto.graph
    inits = graph.initializer
    typed_only = []
    little = sys.byteorder == "little"
    for name, v in g.initializers.items():
        a = np.asarray(v.const)
        if arrays is not None and little and a.dtype in _PLAIN_DTYPES and a.nbytes >= _ARRAY_MIN_BYTES:
            bare = inits.add()
            bare.name = name
            bare.dims.extend(a.shape)
            bare.data_type = helper.np_dtype_to_tensor_dtype(a.dtype)
            arrays[name] = np.ascontiguousarray(a)
            continue
        if data_limit is not None and a.size > data_limit:
            try:
                elem = helper.np_dtype_to_tensor_dtype(a.dtype)
            except (KeyError, ValueError, TypeError):
                elem = None  # a dtype onnx does not map (written with its data below)
            if elem is not None:
                typed_only.append(helper.make_tensor_value_info(name, elem, list(a.shape)))
                continue
        _tensor_into(inits.add(), a, name)
    for v in g.inputs:  # an input with a default value (overridable initializer)
        if v.const is not None and v.name not in g.initializers:
            _tensor_into(inits.add(), np.asarray(v.const), v.name)
    nodes = []
    for n in g.nodes:
        node = onnx.NodeProto()
        node.op_type = n.op_type
        node.domain = n.domain
        if n.name:
            node.name = n.name
        node.input.extend("" if v is None else v.name for v in explicit_inputs(n))
        outs = [_written_output_name(v) for v in n.outputs]
        while outs and outs[-1] == "":
            outs.pop()
        node.output.extend(outs)
        for k in sorted(n.attrs):
            node.attribute.append(_attr_to_proto(k, n.attrs[k], n.attr_types.get(k)))
        _rename_outer_reads(node, n)
        if n.doc:
            node.doc_string = n.doc
        if n.overload:
            node.overload = n.overload
        nodes.append(node)
    foreign = getattr(g, "foreign_types", None)
    inputs = [_value_info(v, foreign=foreign) for v in g.inputs] + typed_only
    signature = getattr(g, "output_signature", None) or []
    # an output whose value lost its type (the Identity before it removed, its producer
    # unknown to inference) is written with the type it was loaded with
    outputs = [
        _value_info(v, signature[k] if v.type is None and k < len(signature) else None, foreign)
        for k, v in enumerate(g.outputs)
    ]
    io_names = {v.name for v in g.inputs} | {v.name for v in g.outputs} | set(g.initializers)
    value_info = [
        _value_info(v)
        for n in g.nodes
        for v in n.outputs
        if v.name not in io_names and v.type is not None and v.doc != "omitted optional output"
    ]
    # what helper.make_graph sets
    graph.node.extend(nodes)
    graph.name = g.name
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    graph.value_info.extend(value_info)
    if g.doc:
        graph.doc_string = g.doc
    # what helper.make_model sets
    proto.opset_import.extend(helper.make_opsetid(d, v) for d, v in sorted(model.opset_imports.items()))
    proto.producer_name = model.producer_name or "quanta"
    proto.producer_version = model.producer_version
    proto.ir_version = model.ir_version
    proto.model_version = model.model_version
    if model.doc:
        proto.doc_string = model.doc
    for k in sorted(model.metadata):
        p = proto.metadata_props.add()
        p.key, p.value = k, model.metadata[k]
    proto.functions.extend(model.functions)
    _infer_unknown_output_ranks(proto, signature)
    return proto


def subgraph_model(
    body: onnx.GraphProto,
    outer: Sequence[Value],
    outer_names: Sequence[str],
    parent: Model,
    *,
    infer_shapes: bool = True,
    fresh_shapes: bool = False,
) -> Model:
    """A subgraph (an If branch, a Loop or Scan body) as a model of its own: its formal
    inputs first, then one graph input per enclosing-scope name it reads
    (``outer_names``, typed as the parent's values ``outer`` bound to them; an outer
    value that is a constant becomes an initializer instead), its outputs as the graph
    outputs; opsets, IR version and functions of ``parent``. Names of
    ``outer_names`` the subgraph does not read are not added (a node binds the names all
    of its subgraphs read). ``fresh_shapes``: the subgraph's own ``value_info`` (inferred
    for the enclosing graph's symbolic shapes) is dropped, so shapes are inferred anew
    from the outer types given."""
    read = set(subgraph_outer_names_of_graph(body))
    g = onnx.GraphProto()
    g.CopyFrom(body)
    if fresh_shapes:
        del g.value_info[:]
    for name, v in zip(outer_names, outer):
        if name not in read:
            continue
        if v is not None and v.const is not None:
            # an outer constant (a weight the main graph holds) is a constant of the
            # body: binders prepack it, the quantizer quantizes it
            g.initializer.append(numpy_helper.from_array(np.asarray(v.const), name))
            continue
        vi = _value_info(v) if v is not None else onnx.ValueInfoProto(name=name)
        vi.name = name
        g.input.append(vi)
    opsets = [helper.make_opsetid(d, ver) for d, ver in sorted(parent.opset_imports.items())]
    proto = helper.make_model(g, opset_imports=opsets, ir_version=parent.ir_version)
    proto.functions.extend(parent.functions)
    if infer_shapes:
        try:
            proto = infer_light(proto, strict_mode=False, data_prop=True)
        except Exception:  # a subgraph whose shapes cannot be inferred still compiles
            pass
    proto.graph.CopyFrom(_sorted_copy(proto.graph))
    return from_proto(proto, where=f"subgraph '{body.name}'")


def reinferred(model: Model) -> Model:
    """``model`` written and loaded again with its shapes inferred anew (the declared
    ``value_info`` dropped): after a rewrite exposed values whose types were inferred
    for other shapes (an inlined If branch)."""
    proto = to_proto(model)
    del proto.graph.value_info[:]
    try:
        from quanta.ir.stand_ins import infer_through  # through com.microsoft recurrent ops

        proto = infer_through(proto, strict_mode=False, data_prop=True)
    except Exception:  # shapes that cannot be inferred: the model as it is
        pass
    return from_proto(proto, where=model.graph.name)


def explicit_inputs(node: Node) -> list[Value | None]:
    """The inputs ONNX writes for ``node``: all but the outer-scope values its
    subgraphs read (:attr:`Node.outer_names`)."""
    return node.inputs[: len(node.inputs) - len(node.outer_names)]


def _rename_outer_reads(proto: onnx.NodeProto, node: Node) -> None:
    """A pass may have replaced an outer-scope value a subgraph reads (a Q/DQ pair
    inserted after it, an Identity removed): the subgraph then reads the replacement's
    name."""
    bound = node.inputs[len(node.inputs) - len(node.outer_names) :]
    renames = {old: v.name for old, v in zip(node.outer_names, bound) if v is not None and v.name != old}
    if not renames:
        return
    for a in proto.attribute:
        if a.type == AttributeProto.GRAPH:
            a.g.CopyFrom(renamed_graph(a.g, renames))
        elif a.type == AttributeProto.GRAPHS:
            for g in a.graphs:
                g.CopyFrom(renamed_graph(g, renames))


def _infer_unknown_output_ranks(proto: onnx.ModelProto, signature: Sequence[TensorType | None]) -> None:
    """Graph outputs whose rank the IR does not know get the shape onnx infers for the
    written graph, else the shape the output had when the model was loaded
    (``signature``, position by position: a pass that removed the Identity in front of
    an output hands it a value inference could not shape). The checker requires a
    shape on every graph output."""
    missing = [
        (k, vi)
        for k, vi in enumerate(proto.graph.output)
        if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")
    ]
    if not missing:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(
            without_weight_data(proto), strict_mode=False, data_prop=True
        ).graph
        got = tensor_types([*inferred.value_info, *inferred.output])
    except Exception:  # only the signature is left
        got = {}
    for k, vi in missing:
        tt = got.get(vi.name)
        if tt is not None and tt.HasField("shape") and tt.elem_type == vi.type.tensor_type.elem_type:
            vi.type.tensor_type.shape.CopyFrom(tt.shape)
            continue
        loaded = signature[k] if k < len(signature) else None
        if (
            loaded is not None
            and loaded.shape is not None
            and _elem_code(loaded) == vi.type.tensor_type.elem_type
        ):
            vi.type.tensor_type.shape.CopyFrom(
                helper.make_tensor_type_proto(1, list(loaded.shape)).tensor_type.shape
            )


# Tensors of at least this many bytes go to the external data file when a model is
# written with external data (onnx's own default threshold).
EXTERNAL_DATA_THRESHOLD = 1024
# protobuf cannot serialize a message of 2 GB or more
PROTO_LIMIT = 2**31 - 1


def source_uses_external_data(path: str | os.PathLike | None) -> bool:
    """Whether the ONNX file at ``path`` keeps tensors in external data (read without
    loading the data)."""
    if not path or not os.path.isfile(path):
        return False
    try:
        return _uses_external_data(onnx.load(os.fspath(path), load_external_data=False))
    except Exception:  # not a readable model: nothing to follow
        return False


def _tensor_bytes(graph: onnx.GraphProto) -> int:
    return sum(len(t.raw_data) if t.HasField("raw_data") else t.ByteSize() for t in _all_tensors(graph))


def _externalize(proto: onnx.ModelProto, location: str, data_file) -> None:
    """Move every tensor of at least EXTERNAL_DATA_THRESHOLD bytes (initializers and
    Constant values, subgraphs included) into ``data_file``, in graph order (the same
    model gives the same bytes), and point the tensor at ``location``."""
    offset = 0
    for t in _all_tensors(proto.graph):
        if t.data_location == TensorProto.EXTERNAL:
            continue
        if not t.HasField("raw_data"):
            if t.ByteSize() < EXTERNAL_DATA_THRESHOLD or t.data_type in (
                TensorProto.STRING,
                TensorProto.UNDEFINED,
            ):
                continue
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t), t.name))
        raw = t.raw_data
        if len(raw) < EXTERNAL_DATA_THRESHOLD:
            continue
        data_file.write(raw)
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        offset += len(raw)


def _temporary_next_to(dest: Path) -> tuple[int, str]:
    """A new file next to ``dest`` opened for writing, created with the mode ``open(dest,
    "w")`` would give: 0666 less the umask, which the kernel applies (mkstemp's 0600 made
    quanta's files unreadable to other users, where any other tool's are not; reading
    the umask in Python means setting it, a race with other threads), or the replaced
    file's mode when ``dest`` exists."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = str(dest.parent / f".{dest.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", str(dest.parent))
    try:
        mode = stat.S_IMODE(os.stat(dest).st_mode)
    except OSError:
        return fd, tmp
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)
    return fd, tmp


def _write_atomically(dest: Path, write) -> str:
    """``write(file)`` into a temporary file next to ``dest``; returns its path (the
    caller renames it)."""
    fd, tmp = _temporary_next_to(dest)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def share_equal_initializers(proto: onnx.ModelProto) -> int:
    """Make every initializer that equals an earlier one (same element type, dims and
    bytes) a reference to that one, in place; the number dropped.

    A quantizer writes one integer copy of a weight per reader (its own scale, rounding
    and zero point); where several readers' copies come out equal (a CQT front end's
    filter bank read by nine convolutions, per-reader zero points of 0) the file held
    each of them. Exact: the graph reads the same values. The first of equal tensors in
    file order stays, so the result is deterministic. Tensors in external files, graph
    inputs and graph outputs keep their own names."""
    graph = proto.graph
    pinned = {v.name for v in graph.input} | {v.name for v in graph.output}
    stack = [a.g for n in graph.node for a in n.attribute if a.type == AttributeProto.GRAPH]
    stack += [g for n in graph.node for a in n.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]
    while stack:  # a name a body defines for itself is not renamed anywhere
        g = stack.pop()
        pinned |= (
            {v.name for v in g.input}
            | {t.name for t in g.initializer}
            | {o for n in g.node for o in n.output}
        )
        for n in g.node:
            for a in n.attribute:
                if a.type == AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
    first: dict[tuple, onnx.TensorProto] = {}
    rename: dict[str, str] = {}
    kept = []
    for t in graph.initializer:
        if t.name in pinned or t.data_location == TensorProto.EXTERNAL or t.HasField("segment"):
            kept.append(t)
            continue
        data = t.raw_data or numpy_helper.to_array(t).tobytes()
        key = (t.data_type, tuple(t.dims), hashlib.sha256(data).digest())
        same = first.get(key)
        if same is not None and (same.raw_data or numpy_helper.to_array(same).tobytes()) == data:
            rename[t.name] = same.name
            continue
        first.setdefault(key, t)
        kept.append(t)
    rename = _agreeing_quantized_readers(graph, rename)
    if not rename:
        return 0
    kept = [t for t in graph.initializer if t.name not in rename]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    stack = [graph]
    while stack:  # every scope: a body reads outer initializers by name
        g = stack.pop()
        for node in g.node:
            for k, name in enumerate(node.input):
                if name in rename:
                    node.input[k] = rename[name]
            for a in node.attribute:
                if a.type == AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
    dropped = set(rename)
    kept_info = [vi for vi in graph.value_info if vi.name not in dropped]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    return len(rename)


def _agreeing_quantized_readers(graph: onnx.GraphProto, rename: dict[str, str]) -> dict[str, str]:
    """``rename`` without the groups of equal tensors that quantized operands read with
    different parameters: the IR types a quantized value by its reader's scale, zero
    point and axis (:func:`annotate_quantized_types`), so two DequantizeLinears of one
    integer tensor with other scales would give it two types."""
    params: dict[str, set[tuple]] = {}
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            for (side, k), s_at, z_at in _quant_operands(node.domain, node.op_type, len(node.input)):
                if side != "in" or k >= len(node.input) or not node.input[k]:
                    continue
                scale = node.input[s_at] if s_at < len(node.input) else ""
                zero = node.input[z_at] if z_at < len(node.input) else ""
                attrs = tuple(sorted((a.name, a.i) for a in node.attribute if a.type == AttributeProto.INT))
                sig = (rename.get(scale, scale), rename.get(zero, zero), attrs)
                params.setdefault(node.input[k], set()).add(sig)
            for a in node.attribute:
                if a.type == AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
    groups: dict[str, list[str]] = {}
    for dropped, kept in rename.items():
        groups.setdefault(kept, [kept]).append(dropped)
    out = dict(rename)
    for members in groups.values():
        sigs = set().union(*(params.get(m, set()) for m in members))
        if len(sigs) > 1:
            for m in members[1:]:
                del out[m]
    return out


def save(
    model: Model | onnx.ModelProto,
    path: str | os.PathLike,
    *,
    protect: Sequence[str | os.PathLike] = (),
    check: bool = True,
    external_data: bool | None = None,
) -> None:
    """Write ``model`` to ``path`` atomically.

    Refuses to overwrite the file the model was loaded from (``model.path``) or any
    path in ``protect`` (e.g. the input of a quantization run). The bytes go to a
    temporary file in the destination folder, are checked with ``onnx.checker``, and
    only then renamed over ``path``: an interrupted save never leaves a half-written
    file.

    ``external_data``: write tensors of EXTERNAL_DATA_THRESHOLD bytes or more to
    ``<path name>.data`` next to ``path``. ``None`` (default) does so when the model
    was loaded from a file that used external data, or when the tensors reach 2 GB
    (protobuf's limit). The data file is never one of the protected inputs' files.
    """
    dest = Path(path)
    proto = to_proto(model) if isinstance(model, Model) else model
    proto = _without_rankless_value_info(proto, copy=not isinstance(model, Model))
    guarded = [Path(p) for p in protect]
    if isinstance(model, Model) and model.path:
        guarded.append(Path(model.path))
    for p in guarded:
        if dest.exists() and p.exists() and os.path.samefile(dest, p):
            raise FileExistsError(
                f"{dest}: refusing to overwrite the input model; choose another output path"
            )
    if dest.is_dir():
        raise IsADirectoryError(
            errno.EISDIR, "is a folder; expected the path of the .onnx file to write", str(dest)
        )
    folder = dest.parent if str(dest.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"{dest}: folder {folder} does not exist")
    dest = folder / dest.name
    if external_data is None:
        external_data = (
            any(source_uses_external_data(p) for p in guarded) or _tensor_bytes(proto.graph) >= PROTO_LIMIT
        )
    # the bytes written are serialized once and checked as they are (each serialization
    # of a large model takes a while: ~0.5 s for 84 MB of weights)
    data = None if external_data else proto.SerializeToString(deterministic=True)
    if check and (len(data) if data is not None else proto.ByteSize()) < PROTO_LIMIT:
        try:
            onnx.checker.check_model(data if data is not None else proto)
        except onnx.checker.ValidationError as e:
            first = str(e).strip().splitlines()[0]
            raise GraphError(f"{dest}: refusing to write an invalid model: {first}") from None
    data_tmp = None
    data_dest = folder / f"{dest.name}.data"
    if external_data:
        for p in guarded:
            for f in _external_files(p):
                if data_dest.exists() and os.path.samefile(data_dest, f):
                    raise FileExistsError(
                        f"{data_dest}: refusing to overwrite the input model's external data; choose another output path"
                    )
        proto_out = onnx.ModelProto()
        proto_out.CopyFrom(proto)
        data_tmp = _write_atomically(data_dest, lambda f: _externalize(proto_out, data_dest.name, f))
        if os.path.getsize(data_tmp) == 0:  # every tensor is small: nothing to keep apart
            os.unlink(data_tmp)
            data_tmp = None
        else:
            proto = proto_out
        data = proto.SerializeToString(deterministic=True)
    assert data is not None  # serialized above on either branch
    if len(data) > PROTO_LIMIT:
        raise ValueError(f"{dest}: the graph without its tensors is still over 2 GB")
    try:
        tmp = _write_atomically(dest, lambda f: f.write(data))
    except BaseException:
        if data_tmp is not None:
            os.unlink(data_tmp)
        raise
    if data_tmp is not None:
        os.replace(data_tmp, data_dest)
    os.replace(tmp, dest)


def _without_rankless_value_info(proto: onnx.ModelProto, *, copy: bool) -> onnx.ModelProto:
    """``proto`` without the ``value_info`` of values of unknown rank (the IR keeps
    their element type): a file may not hold them (the checker requires a shape), and
    they say nothing an ONNX reader would miss. ``copy``: leave ``proto`` itself as it is."""

    def rankless(vi: onnx.ValueInfoProto) -> bool:
        return vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")

    if not any(rankless(vi) for vi in proto.graph.value_info):
        return proto
    if copy:
        original, proto = proto, onnx.ModelProto()
        proto.CopyFrom(original)
    keep = [vi for vi in proto.graph.value_info if not rankless(vi)]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(keep)
    return proto


def _external_files(model_path: Path) -> list[Path]:
    """The external data files a model file refers to (existing ones only)."""
    if not model_path.is_file():
        return []
    try:
        proto = onnx.load(os.fspath(model_path), load_external_data=False)
    except Exception:  # not a readable model: it refers to nothing
        return []
    out = []
    for t in _all_tensors(proto.graph):
        if t.data_location == TensorProto.EXTERNAL:
            loc = {e.key: e.value for e in t.external_data}.get("location", "")
            f = model_path.parent / loc
            if loc and f.is_file() and f not in out:
                out.append(f)
    return out


def _written_output_name(v: Value) -> str:
    """The name a node output has in a NodeProto: "" for an omitted optional output
    (the importer's private value, still unread), else the value's name."""
    return "" if v.doc == "omitted optional output" and not v.uses else v.name


def node_from_proto_for_reference(node: Node) -> onnx.NodeProto:
    """Rebuild an onnx.NodeProto for a node (used by ops delegated to onnx.reference and
    by kernels that read it). Omitted optional outputs are "" as in the saved file, at
    their positions (nothing is trimmed: the kernel still returns every output)."""
    proto = onnx.NodeProto()
    proto.op_type = node.op_type
    proto.domain = node.domain
    proto.name = node.name
    proto.input.extend("" if v is None else v.name for v in explicit_inputs(node))
    proto.output.extend(_written_output_name(v) for v in node.outputs)
    for k in sorted(node.attrs):
        proto.attribute.append(_attr_to_proto(k, node.attrs[k], node.attr_types.get(k)))
    return proto


def toposort_or_raise(graph: Graph) -> None:
    """Topologically sort ``graph`` in place; a cycle is a GraphError naming it."""
    graph.nodes = toposort_nodes(
        graph.nodes, {id(v) for v in graph.inputs} | {id(v) for v in graph.initializers.values()}
    )
