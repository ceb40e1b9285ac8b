"""Values, nodes and graphs of the quanta IR.

Values and nodes compare by identity; their types (:mod:`quanta.ir.types`) compare by
value. The graph keeps producer/uses bookkeeping up to date through its mutation
methods (:meth:`Graph.add_node`, :meth:`Graph.remove_node`,
:meth:`Node.replace_input`, :meth:`Graph.replace_all_uses`), so passes never edit
``inputs`` lists by hand.

A graph remembers the types its outputs promised when it was built or loaded
(``output_signature``); the verifier checks that rewrites keep that promise
(docs/design.md: a rewrite takes its result type from what it replaces).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quanta.ir.types import ElemType, TensorType, elem_from_numpy

__all__ = ["Graph", "GraphError", "Model", "Node", "Value", "result_type", "unused_name"]


def unused_name(base: str, taken: set[str]) -> str:
    """``base``, else ``base_1``, ``base_2``… : the first not in ``taken``, added to it
    (deterministic; the proto rewriters of the loader and the quantizer name their new
    values with it, as :meth:`Graph.fresh_name` names the IR's)."""
    name = base
    for k in itertools.count(1):
        if name not in taken:
            break
        name = f"{base}_{k}"
    taken.add(name)
    return name


class GraphError(ValueError):
    """A structural problem in a graph (cycle, dangling value, duplicate name)."""


class Value:
    """A tensor in the graph: a graph input, an initializer (``const`` set), or a node output."""

    __slots__ = ("const", "doc", "name", "producer", "type", "uses")

    def __init__(self, name: str, type: TensorType | None = None, const: np.ndarray | None = None):
        self.name = name
        self.type = type
        self.const = const
        self.producer: Node | None = None
        self.uses: list[tuple[Node, int]] = []
        self.doc = ""

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def elem(self) -> ElemType | None:
        return None if self.type is None else self.type.elem

    @property
    def shape(self) -> tuple | None:
        return None if self.type is None else self.type.shape

    def consumers(self) -> list[Node]:
        seen: dict[int, Node] = {}
        for node, _ in self.uses:
            seen.setdefault(id(node), node)
        return list(seen.values())

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.type})"


#: elements of a constant that :func:`const_fingerprint` reads (evenly spaced)
FINGERPRINT_SAMPLE = 257


def const_fingerprint(arr: np.ndarray) -> bytes:
    """A digest of up to FINGERPRINT_SAMPLE evenly spaced elements of ``arr``: equal arrays
    have equal fingerprints; arrays that differ mostly differ in the sample (a cheap
    first comparison of large constants before their bytes)."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    step = max(1, flat.size // FINGERPRINT_SAMPLE)
    sample = flat[::step]
    raw = repr(sample.tolist()).encode() if arr.dtype.hasobject else sample.tobytes()
    return hashlib.sha1(raw).digest()


class Node:
    """One operator application. ``inputs`` may hold None for an omitted optional input."""

    __slots__ = (
        "attr_types",
        "attrs",
        "doc",
        "domain",
        "inputs",
        "name",
        "op_type",
        "outer_names",
        "outputs",
        "overload",
        "requant",
    )

    def __init__(
        self,
        op_type: str,
        inputs: Sequence[Value | None],
        outputs: Sequence[Value],
        attrs: dict[str, Any] | None = None,
        *,
        name: str = "",
        domain: str = "",
        attr_types: dict[str, int] | None = None,
    ):
        self.op_type = op_type
        self.domain = "" if domain == "ai.onnx" else domain
        self.name = name
        self.inputs: list[Value | None] = list(inputs)
        self.outputs: list[Value] = list(outputs)
        self.attrs: dict[str, Any] = dict(attrs or {})
        # ONNX AttributeProto types of the attributes as loaded (export keeps them
        # exactly, e.g. an empty INTS list); attributes set by passes infer theirs.
        self.attr_types: dict[str, int] = dict(attr_types or {})
        self.doc = ""
        self.overload = ""
        # If/Loop/Scan: the names of the enclosing graph that the subgraph attributes
        # read. The values bound to them are the node's last len(outer_names) inputs, so
        # use lists, dead-code elimination and liveness see them; ONNX writes only the
        # inputs before them (quanta.ir.onnx_io).
        self.outer_names: tuple[str, ...] = ()
        # The requantization parameters a lowering pass derived for the kernels
        # (quanta.passes.lower.requant_params); in memory only, never written to ONNX.
        self.requant: Any = None

    @property
    def label(self) -> str:
        """How errors name the node: ``'name' (OpType)`` or ``OpType`` when unnamed."""
        return f"'{self.name}' ({self.op_type})" if self.name else f"({self.op_type})"

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def replace_input(self, i: int, value: Value | None) -> None:
        old = self.inputs[i]
        if old is not None:
            old.uses.remove((self, i))
        self.inputs[i] = value
        if value is not None:
            value.uses.append((self, i))

    def __repr__(self) -> str:
        return f"Node({self.op_type}, name={self.name!r})"


@dataclass
class Graph:
    """A dataflow graph in topological order."""

    name: str = "main"
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    initializers: dict[str, Value] = field(default_factory=dict)
    output_signature: list[TensorType | None] = field(default_factory=list)
    #: serialized onnx TypeProto of inputs / outputs whose type the IR does not model
    #: (sequence, map, optional), by name: written back as loaded
    foreign_types: dict[str, bytes] = field(default_factory=dict)
    doc: str = ""
    # the names taken while :meth:`naming` is active
    _taken: set[str] | None = field(default=None, init=False, repr=False, compare=False)

    # -- construction -------------------------------------------------------
    def add_input(self, name: str, type: TensorType | None) -> Value:
        v = Value(name, type)
        self.inputs.append(v)
        return v

    def add_initializer(self, name: str, array: np.ndarray, type: TensorType | None = None) -> Value:
        if type is None:
            type = TensorType(elem_from_numpy(array.dtype), tuple(array.shape))
        v = Value(name, type, const=array)
        self.initializers[name] = v
        return v

    def add_node(self, node: Node, *, before: Node | None = None) -> Node:
        """Append ``node`` (or insert it before ``before``) and record its uses."""
        for i, v in enumerate(node.inputs):
            if v is not None:
                v.uses.append((node, i))
        for v in node.outputs:
            if v.producer is not None and v.producer is not node:
                raise GraphError(f"value '{v.name}' already has a producer {v.producer.label}")
            v.producer = node
        if before is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(self.nodes.index(before), node)
        return node

    def set_outputs(
        self, outputs: Sequence[Value], signature: Sequence[TensorType | None] | None = None
    ) -> None:
        self.outputs = list(outputs)
        self.output_signature = list(signature) if signature is not None else [v.type for v in outputs]

    # -- mutation -----------------------------------------------------------
    def remove_node(self, node: Node) -> None:
        """Remove ``node``; its outputs must no longer be used or be graph outputs."""
        for v in node.outputs:
            if v.uses:
                users = ", ".join(n.label for n, _ in v.uses)
                raise GraphError(f"cannot remove {node.label}: its output '{v.name}' is used by {users}")
            if any(v is o for o in self.outputs):
                raise GraphError(f"cannot remove {node.label}: its output '{v.name}' is a graph output")
            v.producer = None
        for i, v in enumerate(node.inputs):
            if v is not None:
                v.uses.remove((node, i))
        self.nodes.remove(node)

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Make every consumer of ``old`` (and the graph outputs) use ``new``."""
        for node, i in list(old.uses):
            node.replace_input(i, new)
        self.outputs = [new if o is old else o for o in self.outputs]

    def remove_unused_initializers(self) -> None:
        used = {id(v) for n in self.nodes for v in n.inputs if v is not None} | {id(v) for v in self.outputs}
        self.initializers = {k: v for k, v in self.initializers.items() if id(v) in used}

    # -- queries --------------------------------------------------------------
    def values(self) -> Iterator[Value]:
        """Every value once: inputs, initializers, then node outputs in order."""
        seen: set[int] = set()
        for v in itertools.chain(
            self.inputs, self.initializers.values(), (o for n in self.nodes for o in n.outputs)
        ):
            if id(v) not in seen:
                seen.add(id(v))
                yield v

    def value(self, name: str) -> Value:
        for v in self.values():
            if v.name == name:
                return v
        raise KeyError(f"graph '{self.name}' has no value named '{name}'")

    def find_nodes(self, op_type: str) -> list[Node]:
        return [n for n in self.nodes if n.op_type == op_type]

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            key = n.op_type if not n.domain else f"{n.domain}::{n.op_type}"
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def fresh_name(self, base: str) -> str:
        """A value/node name not used in the graph (deterministic: base, base_1, base_2…)."""
        if self._taken is not None:
            return unused_name(base, self._taken)
        return unused_name(base, {v.name for v in self.values()} | {n.name for n in self.nodes})

    @contextlib.contextmanager
    def naming(self) -> Iterator[None]:
        """Inside, :meth:`fresh_name` reads the names taken from one set built on entry and
        adds each name it returns, instead of collecting every name of the graph per call
        (quadratic in a pass that inserts a node per tensor: 25 of MiniLM's 67 s of
        quantize_static). For code that names every new value and node through
        :meth:`fresh_name` (renames may reuse names already taken), the names are those
        of the per-call form."""
        if self._taken is not None:  # nested: the outer set stays in charge
            yield
            return
        self._taken = {v.name for v in self.values()} | {n.name for n in self.nodes}
        try:
            yield
        finally:
            self._taken = None

    def toposort(self) -> None:
        """Reorder ``nodes`` topologically (stable); raise GraphError naming a cycle."""
        self.nodes = toposort_nodes(
            self.nodes, {id(v) for v in self.inputs} | {id(v) for v in self.initializers.values()}
        )


def toposort_nodes(nodes: Iterable[Node], available: set[int]) -> list[Node]:
    """Depth-first topological order, stable in the original order (a node comes as
    late as its first use allows). Values in ``available`` (graph inputs,
    initializers) need no producer. Iterative: deep chains do not hit Python's
    recursion limit. A cycle raises GraphError naming its nodes."""
    nodes = list(nodes)
    producer_of: dict[int, Node] = {id(o): n for n in nodes for o in n.outputs}
    order: list[Node] = []
    state: dict[int, int] = {}  # 1 visiting, 2 done

    def deps(n: Node) -> list[Node]:
        out = []
        for v in n.inputs:
            if v is None or id(v) in available:
                continue
            p = producer_of.get(id(v))
            if p is not None:
                out.append(p)
        return out

    for root in nodes:
        if state.get(id(root)) == 2:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        path: list[Node] = [root]
        state[id(root)] = 1
        while stack:
            n, k = stack.pop()
            ds = deps(n)
            if k < len(ds):
                stack.append((n, k + 1))
                d = ds[k]
                st = state.get(id(d))
                if st == 1:
                    start = next(i for i, p in enumerate(path) if p is d)
                    cycle = " -> ".join(p.label for p in [*path[start:], d])
                    raise GraphError(f"graph has a cycle: {cycle}")
                if st != 2:
                    state[id(d)] = 1
                    path.append(d)
                    stack.append((d, 0))
            else:
                state[id(n)] = 2
                path.pop()
                order.append(n)
    return order


@dataclass
class Model:
    """A graph plus what an ONNX file carries around it (opsets, metadata, functions)."""

    graph: Graph
    opset_imports: dict[str, int] = field(default_factory=lambda: {"": 21})
    ir_version: int = 10
    producer_name: str = "quanta"
    producer_version: str = ""
    model_version: int = 0
    doc: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    functions: list[Any] = field(default_factory=list)  # onnx.FunctionProto, carried as-is
    path: str | None = None  # file it was loaded from, for error messages
    # node name -> why the loader left a foreign operator as written (ir/ms_contrib.py,
    # ir/quark_ops.py): a target that cannot run the node says it (never serialized)
    load_notes: dict[str, str] = field(default_factory=dict)

    def opset(self, domain: str = "") -> int:
        if domain == "ai.onnx":
            domain = ""
        if domain not in self.opset_imports:
            raise KeyError(f"model imports no opset for domain '{domain or 'ai.onnx'}'")
        return self.opset_imports[domain]


def result_type(
    *,
    shape_from: Value | TensorType | tuple | None,
    elem_from: Value | TensorType | ElemType,
) -> TensorType:
    """Build a result type, making the caller say where each part comes from.

    docs/design.md: a rewrite constructs its result type from the result contract of what it
    replaces, never by copying its input's type. So there is no ``like=`` shortcut: the
    caller names the source of the shape and the source of the element type separately,
    e.g. ``result_type(shape_from=x, elem_from=replaced_output)`` for a fused op whose
    shape follows its input but whose quantization follows the output it replaces.
    """
    if isinstance(shape_from, Value):
        shape = shape_from.shape
    elif isinstance(shape_from, TensorType):
        shape = shape_from.shape
    else:
        shape = shape_from
    if isinstance(elem_from, Value):
        if elem_from.type is None:
            raise GraphError(
                f"result_type: value '{elem_from.name}' has no type to take the element type from"
            )
        elem = elem_from.type.elem
    elif isinstance(elem_from, TensorType):
        elem = elem_from.elem
    else:
        elem = elem_from
    return TensorType(elem, shape)
