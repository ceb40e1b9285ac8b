"""Reads the printer's text back into a graph (the inverse of :func:`format_graph`)::

    graph main(%x: tensor<Nx3x8x6, f32>) {
      %w = const tensor<7x3x3x3, f32>
      %b = const tensor<7, f32> = [0.5, -1.0, 0.25, 0.0, 1.5, 2.0, -0.75]
      %c: tensor<Nx7x8x6, f32> = Conv(%x, %w, %b) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]}  # conv
      %y = Relu(%c)
      return %y
    }

so that a pass test can state its input graph as text, and the IR of a model can be
compared with a stored snapshot. Constants the printer shows without values (more than 8
elements) take theirs from ``consts``; a constant with neither is an error that names
it. Every error names the line.

Grammar (one statement a line; blank lines and lines starting with ``#`` are skipped)::

    header  := "graph" NAME "(" [ "%"NAME ":" TYPE { "," ... } ] ")" "{"
    const   := "%"NAME "=" "const" TYPE [ "=" LIST ]
    node    := OUT { "," OUT } "=" [ DOMAIN "::" ] OP "(" [ ARG { "," ARG } ] ")" [ "{" ATTRS "}" ] [ "#" NAME ]
    OUT     := "%"NAME [ ":" TYPE ]          ARG := "%"NAME | "_"   (an omitted optional input)
    ATTRS   := KEY "=" VALUE { "," ... }     VALUE := a Python literal | "tensor(" DTYPE "," LIST ")"
    return  := "return" [ "%"NAME { "," ... } ]
    TYPE    := "tensor<" DIMS "," ELEM ">" | "tensor<" ELEM ">" | "tensor<?," ELEM ">"
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Mapping

import numpy as np

from quanta.ir.graph import Graph, GraphError, Node, Value
from quanta.ir.types import TensorType, parse_elem

__all__ = ["IRParseError", "parse_graph", "parse_type"]


class IRParseError(GraphError):
    """Text that is not the printer's form; names the line and what was expected."""


def _top_level(text: str):
    """(index, character) of the characters of ``text`` outside brackets and quotes."""
    depth, quote = 0, ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif depth == 0:
            yield i, ch


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets and quotes."""
    cuts = [i for i, ch in _top_level(text) if ch == sep]
    if not cuts and not text.strip():
        return []
    bounds = [-1, *cuts, len(text)]
    return [text[a + 1 : b].strip() for a, b in itertools.pairwise(bounds)]


def _find_top(text: str, target: str) -> int:
    """Index of the first ``target`` outside brackets and quotes, or -1."""
    return next((i for i, _ in _top_level(text) if text.startswith(target, i)), -1)


def parse_type(text: str) -> TensorType:
    """``tensor<Nx3x8x6, f32>`` (``?`` an unknown dimension, ``tensor<?, T>`` an unknown
    rank, ``tensor<T>`` a scalar) as a TensorType."""
    m = re.fullmatch(r"\s*tensor<(.*)>\s*", text)
    if not m:
        raise ValueError(f"expected a type 'tensor<DIMS, ELEM>', got {text!r}")
    parts = _split_top(m.group(1))
    if len(parts) == 1:
        return TensorType(parse_elem(parts[0]), ())
    dims_text, elem_text = parts[0], ", ".join(parts[1:])
    elem = parse_elem(elem_text)
    if dims_text == "?":
        return TensorType(elem, None)
    dims: list[int | str | None] = []
    for d in dims_text.split("x"):
        dims.append(None if d == "?" else int(d) if re.fullmatch(r"-?\d+", d) else d)
    return TensorType(elem, tuple(dims))


def _attr(text: str) -> object:
    m = re.fullmatch(r"tensor\((\w+),\s*(.*)\)", text, re.S)
    if m:
        if m.group(2).startswith("shape="):
            raise ValueError(f"a tensor attribute printed without its values ({text}) cannot be read back")
        return np.asarray(ast.literal_eval(m.group(2)), dtype=np.dtype(m.group(1)))
    if text.startswith("<graph"):
        raise ValueError("subgraph attributes are printed as a name only and cannot be read back")
    return ast.literal_eval(text)


def _typed(part: str, what: str) -> tuple[str, TensorType | None]:
    """``%name`` or ``%name: TYPE`` (names may hold ':', as ONNX exporters' do)."""
    m = re.fullmatch(r"(%\S+?)\s*(?::\s*(tensor<.*>))?", part.strip())
    if not m:
        raise ValueError(f"expected {what} as '%name' or '%name: TYPE', got {part!r}")
    return _name(m.group(1), what), parse_type(m.group(2)) if m.group(2) else None


def _name(token: str, what: str) -> str:
    if not re.fullmatch(r"%[^\s,()]+", token):
        raise ValueError(f"expected {what} as '%name', got {token!r}")
    return token[1:]


def parse_graph(text: str, consts: Mapping[str, np.ndarray] | None = None) -> Graph:
    """The graph :func:`quanta.ir.printer.format_graph` printed as ``text``."""
    consts = dict(consts or {})
    lines = [(i + 1, ln.strip()) for i, ln in enumerate(text.splitlines())]
    lines = [(n, ln) for n, ln in lines if ln and not ln.startswith("#")]
    if not lines:
        raise IRParseError("empty text: expected 'graph NAME(...) {'")
    values: dict[str, Value] = {}
    graph: Graph | None = None
    done = False
    for number, line in lines:
        try:
            if graph is None:
                m = re.fullmatch(r"graph\s+(\S*)\((.*)\)\s*\{", line)
                if not m:
                    raise ValueError("expected 'graph NAME(%input: TYPE, ...) {'")
                graph = Graph(name=m.group(1))
                for part in _split_top(m.group(2)):
                    name, ttype = _typed(part, "an input")
                    values[name] = graph.add_input(name, ttype)
                continue
            if done:
                raise ValueError("text after the closing '}'")
            if line == "}":
                done = True
                continue
            if line.startswith("return"):
                outs = [values[_defined(_name(t, "an output"), values)] for t in _split_top(line[6:])]
                graph.set_outputs(outs)
                continue
            eq = _find_top(line, "=")
            if eq < 0:
                raise ValueError("expected 'return ...', '}', a constant or a node ('%out = Op(...)')")
            lhs, rhs = line[:eq].strip(), line[eq + 1 :].strip()
            if rhs.startswith("const "):
                _parse_const(graph, values, lhs, rhs[6:].strip(), consts)
            else:
                _parse_node(graph, values, lhs, rhs)
        except (ValueError, KeyError, SyntaxError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise IRParseError(f"line {number}: {msg}: {line!r}") from None
    if graph is None or not done:
        raise IRParseError("the graph is not closed: expected a line '}'")
    return graph


def _defined(name: str, values: Mapping[str, Value]) -> str:
    if name not in values:
        raise ValueError(f"'%{name}' is used before it is defined")
    return name


def _parse_const(
    graph: Graph, values: dict[str, Value], lhs: str, rest: str, consts: Mapping[str, np.ndarray]
) -> None:
    name = _name(lhs, "a constant")
    eq = _find_top(rest, "=")
    ttype = parse_type(rest if eq < 0 else rest[:eq])
    if ttype.shape is None or any(not isinstance(d, int) for d in ttype.shape):
        raise ValueError(f"constant '%{name}' needs a static shape")
    dtype = ttype.elem.storage.numpy if hasattr(ttype.elem, "storage") else ttype.elem.numpy
    shape = tuple(int(d) for d in ttype.shape)  # type: ignore[arg-type]
    if eq >= 0:
        array = np.asarray(ast.literal_eval(rest[eq + 1 :].strip()), dtype=dtype).reshape(shape)
    elif name in consts:
        array = np.asarray(consts[name], dtype=dtype)
        if array.shape != shape:
            raise ValueError(f"consts['{name}'] has shape {array.shape}, the text says {shape}")
    else:
        raise ValueError(f"constant '%{name}' is printed without values: give them as consts['{name}']")
    if name in values:
        raise ValueError(f"'%{name}' is defined twice")
    values[name] = graph.add_initializer(name, array, ttype)


def _parse_node(graph: Graph, values: dict[str, Value], lhs: str, rhs: str) -> None:
    outs: list[Value] = []
    for part in _split_top(lhs):
        name, ttype = _typed(part, "a node output")
        if name in values:
            raise ValueError(f"'%{name}' is defined twice")
        values[name] = Value(name, ttype)
        outs.append(values[name])
    node_name = ""
    hash_at = _find_top(rhs, "#")
    if hash_at >= 0:
        node_name, rhs = rhs[hash_at + 1 :].strip(), rhs[:hash_at].strip()
    m = re.fullmatch(r"(?:([\w.]+)::)?(\w+)\((.*?)\)\s*(?:\{(.*)\})?", rhs, re.S)
    if not m:
        raise ValueError("expected 'Op(%a, %b) {attr=value}' or 'domain::Op(...)'")
    domain, op, args_text, attrs_text = m.groups()
    inputs: list[Value | None] = []
    for token in _split_top(args_text):
        inputs.append(None if token == "_" else values[_defined(_name(token, "an input"), values)])
    attrs: dict[str, object] = {}
    for item in _split_top(attrs_text or ""):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"expected an attribute 'key=value', got {item!r}")
        attrs[key.strip()] = _attr(value.strip())
    graph.add_node(Node(op, inputs, outs, attrs, name=node_name, domain=domain or ""))
