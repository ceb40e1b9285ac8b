"""The rewrite-rule engine: pattern, ``check`` (a reason when it refuses), ``rewrite``.

A rule is three parts (onnxscript's rewriter, tinygrad's compactness)::

    class FoldBatchNormIntoConv(Rule):
        '''y = BatchNormalization(Conv(x, W, B?), g, beta, mean, var) -> y = Conv(x, W', B')'''
        pattern = "y = BatchNormalization(c = Conv(x, W, B?), g, beta, mean, var)"
        def check(self, m: Match) -> Match | NoMatch:
            if not m.all_const("W", "g", "beta", "mean", "var"):
                return NoMatch("BN parameters or W are not constants")
            return m
        def rewrite(self, m: Match, b: Builder) -> Value:
            ...   # build with b.op / b.const; return the value that replaces y

Pattern language (parsed once, when the rule class is defined)::

    pattern := [out {, out} =] call
    call    := ops ( [arg {, arg}] )          ops := op {| op}     op := [domain::]Name | *
    arg     := name | name? | _ | _? | ... | [name =] call

- ``name`` captures the input value; ``name?`` also matches an omitted optional input
  (captured as None); the same name twice must bind the same value.
- ``_`` matches any present input without capturing it, ``...`` any remaining inputs.
- a nested ``call`` matches when the input is output 0 of a node of one of those ops;
  ``c = Conv(...)`` names that intermediate value ``c``.
- ``*`` as op matches every op (a rule for any node, e.g. constant folding).

Engine guarantees (checked before ``check`` runs, each refusal with a reason):

- an intermediate value (the output of a nested call) that is also used outside the
  pattern, or is a graph output, refuses the match, unless its name is in the rule's
  ``shared_ok`` (the nested node then stays for its other users);
- ``rewrite`` only stages changes in a :class:`Builder`; they are committed after it
  returns, so a refusal (``b.refuse(reason)``) leaves the graph untouched;
- a replaced value must keep its element type (docs/design.md: result types come from the
  replaced op's contract, never from an input); a rule that breaks this raises
  :class:`RuleError` naming itself, instead of silently retyping a graph;
- a replaced graph output keeps its name (the new value takes it over).

Every refusal is recorded per (rule, node) in a :class:`NoMatchLog`;
``RewritePass.no_matches()`` returns them so ``quanta inspect --why-not RULE`` can show
why a rule did not fire (see docs/passes.md, "debugging a rule that does not fire").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.passes.manager import Pass, PassResult

__all__ = [
    "Builder",
    "Match",
    "NoMatch",
    "NoMatchLog",
    "NoMatchRecord",
    "PatternError",
    "RewritePass",
    "RewriteRefused",
    "Rule",
    "RuleError",
    "RuleSet",
    "parse_pattern",
]


class PatternError(ValueError):
    """A pattern string that does not parse (raised when the rule class is defined)."""


class RuleError(RuntimeError):
    """A rule broke the engine's contract (e.g. changed a replaced value's type)."""


class RewriteRefused(Exception):
    """Raised by :meth:`Builder.refuse`: the rewrite found it cannot proceed."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# -- pattern syntax ------------------------------------------------------------------


@dataclass(frozen=True)
class PLeaf:
    name: str | None  # None for "_"
    optional: bool


@dataclass(frozen=True)
class PCall:
    ops: tuple[str, ...]  # "Conv", "com.microsoft::QLinearAdd", or "*"
    args: tuple[PLeaf | PCall, ...]
    rest: bool  # "..." at the end
    outputs: tuple[str, ...]  # capture names of the outputs (root: all given; nested: 0 or 1)

    def accepts(self, node: Node) -> bool:
        if "*" in self.ops:
            return True
        key = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        return key in self.ops

    def describe(self) -> str:
        return "|".join(self.ops)


_TOKEN = re.compile(r"\s*(\.\.\.|::|[A-Za-z_][A-Za-z0-9_.]*|[()=,?|*])")


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise PatternError(f"pattern {text!r}: unexpected character at {pos}: {text[pos : pos + 10]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self, k: int = 0) -> str | None:
        j = self.i + k
        return self.tokens[j] if j < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise PatternError(
                f"pattern {self.text!r}: expected {expected or 'a token'}, got {tok or 'end of pattern'}"
            )
        self.i += 1
        return tok

    def ident(self) -> str:
        tok = self.take()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", tok):
            raise PatternError(f"pattern {self.text!r}: expected a name, got {tok!r}")
        return tok

    def parse(self) -> PCall:
        outputs: list[str] = []
        # lookahead: "a, b = Op(" or "a = Op("
        j = 0
        while self.peek(j) is not None and self.peek(j) not in ("(", "="):
            j += 1
        if self.peek(j) == "=":
            outputs.append(self.ident())
            while self.peek() == ",":
                self.take(",")
                outputs.append(self.ident())
            self.take("=")
        call = self.call(tuple(outputs))
        if self.peek() is not None:
            raise PatternError(f"pattern {self.text!r}: unexpected {self.peek()!r} after the pattern")
        return call

    def op(self) -> str:
        if self.peek() == "*":
            return self.take("*")
        name = self.ident()
        if self.peek() == "::":
            self.take("::")
            return f"{name}::{self.ident()}"
        return name

    def call(self, outputs: tuple[str, ...]) -> PCall:
        ops = [self.op()]
        while self.peek() == "|":
            self.take("|")
            ops.append(self.op())
        self.take("(")
        args: list[PLeaf | PCall] = []
        rest = False
        while self.peek() != ")":
            if self.peek() is None:
                raise PatternError(f"pattern {self.text!r}: expected an argument or ')', got end of pattern")
            if rest:
                raise PatternError(f"pattern {self.text!r}: '...' must be the last argument")
            if self.peek() == "...":
                self.take("...")
                rest = True
            else:
                args.append(self.arg())
            if self.peek() == ",":
                self.take(",")
            elif self.peek() != ")":
                raise PatternError(
                    f"pattern {self.text!r}: expected ',' or ')', got {self.peek() or 'end of pattern'}"
                )
        self.take(")")
        return PCall(tuple(ops), tuple(args), rest, outputs)

    def arg(self) -> PLeaf | PCall:
        nxt = self.peek(1)
        if self.peek() == "*" or nxt in ("(", "|", "::"):
            return self.call(())
        if nxt == "=":
            name = self.ident()
            self.take("=")
            return self.call((name,))
        name = self.ident()
        optional = False
        if self.peek() == "?":
            self.take("?")
            optional = True
        return PLeaf(None if name == "_" else name, optional)


def parse_pattern(text: str) -> PCall:
    """Parse a pattern string (see the module docstring for the syntax)."""
    return _Parser(text).parse()


# -- match results -------------------------------------------------------------------


@dataclass
class NoMatch:
    """A refusal, with the reason shown by ``--why-not``. Falsy.

    ``kind``: "check" (the rule's check or rewrite refused), "shared" (the engine:
    an intermediate value is used outside the pattern or is a graph output), or
    "pattern" (the structure around the root differs: not a candidate at all)."""

    reason: str
    kind: str = "check"

    def __bool__(self) -> bool:
        return False


@dataclass
class NoMatchRecord:
    rule: str
    node: str  # the root node's label and output, e.g. "'bn' (BatchNormalization) -> %y"
    reason: str
    kind: str = "check"

    def __str__(self) -> str:
        return f"{self.rule} at {self.node}: {self.reason}"


class Match:
    """The bindings of one match: values by capture name, matched nodes, and ``data``
    where ``check`` may leave what it computed for ``rewrite``."""

    def __init__(self, graph: Graph, root: Node):
        self.graph = graph
        self.root = root
        self.values: dict[str, Value | None] = {}
        self.nodes: dict[str, Node] = {}
        self.matched: list[Node] = []  # root first, then nested nodes in pattern order
        self.data: dict[str, Any] = {}

    def __bool__(self) -> bool:
        return True

    def __getitem__(self, name: str) -> Value | None:
        if name not in self.values:
            raise KeyError(f"pattern captures no value named '{name}' (captures: {sorted(self.values)})")
        return self.values[name]

    def value(self, name: str) -> Value:
        v = self[name]
        if v is None:
            raise KeyError(f"'{name}' is an omitted optional input")
        return v

    def node(self, name: str) -> Node:
        """The matched node producing the value captured as ``name``."""
        if name not in self.nodes:
            raise KeyError(f"pattern names no node output '{name}' (named: {sorted(self.nodes)})")
        return self.nodes[name]

    def const(self, name: str) -> np.ndarray | None:
        v = self[name]
        return None if v is None else v.const

    def is_const(self, name: str) -> bool:
        v = self[name]
        return v is not None and v.is_const

    def all_const(self, *names: str) -> bool:
        """True when every named value is a constant; an omitted optional input counts
        as constant (it is known: absent)."""
        return all(self[n] is None or self[n].is_const for n in names)

    def outside_users(self, name: str) -> list[Node]:
        v = self[name]
        if v is None:
            return []
        inside = {id(n) for n in self.matched}
        return [n for n in v.consumers() if id(n) not in inside]

    def has_outside_uses(self, name: str) -> bool:
        """Used by a node outside the match, or a graph output."""
        v = self[name]
        if v is None:
            return False
        return bool(self.outside_users(name)) or any(o is v for o in self.graph.outputs)


def _value_origin(v: Value, graph: Graph) -> str:
    if v.is_const:
        return "a constant"
    if any(v is i for i in graph.inputs):
        return "a graph input"
    return "not produced by any node"


def _where(where: Node | tuple[int, Node, Value]) -> str:
    """The text a refusal names its place by: the root's label, or ``input k of <node>
    'v'`` for a nested call (formatted only when a match fails)."""
    if isinstance(where, Node):
        return where.label
    k, parent, v = where
    return f"input {k} of {parent.label} '{v.name}'"


def _match_call(pc: PCall, node: Node, m: Match, where: Node | tuple[int, Node, Value]) -> NoMatch | None:
    # The texts of refusals are built only on the failing branch: a pass tries every
    # rule of an op on every node of that op, on every sweep, and most tries fail.
    if not pc.accepts(node):
        return NoMatch(f"{_where(where)} is produced by {node.op_type}, expected {pc.describe()}", "pattern")
    m.matched.append(node)
    inputs = node.inputs
    n_inputs = len(inputs)
    args = pc.args
    if not pc.rest and n_inputs > len(args):
        extra = [k for k in range(len(args), n_inputs) if inputs[k] is not None]
        if extra:
            return NoMatch(
                f"{node.label} has input {extra[0]} set; the pattern expects at most {len(args)} inputs",
                "pattern",
            )
    values = m.values
    for k, arg in enumerate(args):
        v = inputs[k] if k < n_inputs else None
        if isinstance(arg, PLeaf):
            if v is None and not arg.optional:
                return NoMatch(f"input {k} of {node.label} is omitted", "pattern")
            name = arg.name
            if name is not None:
                if name in values and values[name] is not v:
                    return NoMatch(
                        f"'{name}' appears twice in the pattern but input {k} of {node.label} is a different value",
                        "pattern",
                    )
                values[name] = v
            continue
        if v is None:
            return NoMatch(
                f"input {k} of {node.label} is omitted, expected the output of {arg.describe()}", "pattern"
            )
        producer = v.producer
        if producer is None:
            return NoMatch(
                f"input {k} of {node.label} '{v.name}' is {_value_origin(v, m.graph)}, "
                f"expected the output of {arg.describe()}",
                "pattern",
            )
        if producer.outputs[0] is not v:
            idx = next(i for i, o in enumerate(producer.outputs) if o is v)
            return NoMatch(
                f"input {k} of {node.label} '{v.name}' is output {idx} of {producer.label}, expected output 0",
                "pattern",
            )
        if any(producer is n for n in m.matched):
            return NoMatch(
                f"input {k} of {node.label}: {producer.label} appears twice in the match", "pattern"
            )
        res = _match_call(arg, producer, m, (k, node, v))
        if res is not None:
            return res
        if arg.outputs:
            name = arg.outputs[0]
            if name in values and values[name] is not v:
                return NoMatch(f"'{name}' appears twice in the pattern but binds different values", "pattern")
            values[name] = v
            m.nodes[name] = producer
    return None


# -- rules -------------------------------------------------------------------------------


class Rule:
    """A rewrite rule. Subclasses set ``pattern`` and implement ``check``/``rewrite``.

    ``shared_ok``: names of intermediate values that may have uses outside the pattern.
    ``name``: what ``--why-not`` and fire counts use (default: the class name).
    """

    pattern: ClassVar[str] = ""
    name: ClassVar[str] = ""
    shared_ok: ClassVar[frozenset[str]] = frozenset()
    _compiled: ClassVar[PCall | None] = None
    _intermediates: ClassVar[tuple[str, ...]] = ()  # the pattern's named intermediate values

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = cls.__name__
        if cls.__dict__.get("pattern"):
            try:
                cls._compiled = parse_pattern(cls.pattern)
            except PatternError as e:
                raise PatternError(f"rule {cls.__name__}: {e}") from None
            cls._intermediates = tuple(_intermediate_names(cls._compiled))
            intermediates = set(cls._intermediates)
            unknown = set(cls.shared_ok) - intermediates
            if unknown:
                raise PatternError(
                    f"rule {cls.__name__}: shared_ok names {sorted(unknown)} are not intermediate values"
                )

    @property
    def compiled(self) -> PCall:
        if self._compiled is None:
            raise PatternError(f"rule {type(self).__name__} has no pattern")
        return self._compiled

    @property
    def root_ops(self) -> tuple[str, ...]:
        return self.compiled.ops

    def match(self, graph: Graph, node: Node) -> Match | NoMatch:
        """Structural match at ``node`` plus the engine's sharing checks."""
        pc = self.compiled
        m = Match(graph, node)
        res = _match_call(pc, node, m, node)
        if res is not None:
            return res
        if len(pc.outputs) > len(node.outputs):
            return NoMatch(
                f"{node.label} has {len(node.outputs)} outputs, the pattern names {len(pc.outputs)}",
                "pattern",
            )
        for name, v in zip(pc.outputs, node.outputs):
            m.values[name] = v
            m.nodes[name] = node
        for name in self._intermediates:
            if name in self.shared_ok:
                continue
            v = m.values[name]
            producer = m.nodes[name]
            users = m.outside_users(name)
            if users:
                listed = ", ".join(u.label for u in users[:3])
                return NoMatch(
                    f"'{v.name}' (output of {producer.label}) is also used by {listed} outside the pattern",
                    "shared",
                )
            if any(o is v for o in graph.outputs):
                return NoMatch(f"'{v.name}' (output of {producer.label}) is a graph output", "shared")
        # unnamed intermediates are checked the same way
        for node_ in m.matched[1:]:
            v = node_.outputs[0]
            if any(v is x for x in m.values.values()):
                continue
            users = [n for n in v.consumers() if all(n is not k for k in m.matched)]
            if users or any(o is v for o in graph.outputs):
                what = f"also used by {users[0].label} outside the pattern" if users else "a graph output"
                return NoMatch(f"'{v.name}' (output of {node_.label}) is {what}", "shared")
        return m

    def check(self, m: Match) -> Match | NoMatch:
        """Return ``m`` (or any Match) to accept, ``NoMatch(reason)`` to refuse."""
        return m

    def rewrite(self, m: Match, b: Builder) -> Value | Sequence[Value] | None:
        """Build the replacement with ``b``; return the value(s) replacing the root's
        outputs in order, or call ``b.replace`` yourself and return None."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _intermediate_names(pc: PCall) -> list[str]:
    names = []
    for arg in pc.args:
        if isinstance(arg, PCall):
            names.extend(arg.outputs)
            names.extend(_intermediate_names(arg))
    return names


# -- building the replacement -----------------------------------------------------------------


class _Names:
    """Fresh value and node names for one pass run (deterministic: base, base_1, ...).

    The graph's names are read when a rewrite first asks for them (a Builder is made
    only once a rule's check accepts, before its rewrite changes anything), so they are
    the names the graph had when the run started; a run in which no rule fires, most of
    a pipeline's, does not walk the graph for them."""

    def __init__(self, graph: Graph):
        self._graph = graph
        self._taken: set[str] | None = None
        self._nodes: set[str] | None = None
        #: every initializer is keyed by its name (Builder.commit keyed them anew)
        self.initializers_keyed = False

    @property
    def taken(self) -> set[str]:
        if self._taken is None:
            self._taken = {v.name for v in self._graph.values()}
        return self._taken

    @property
    def nodes(self) -> set[str]:
        if self._nodes is None:
            self._nodes = {n.name for n in self._graph.nodes if n.name}
        return self._nodes

    def read(self) -> None:
        """Read the graph's names now if not yet (before a rewrite changes the graph)."""
        _ = self.taken, self.nodes

    @staticmethod
    def _fresh(base: str, taken: set[str]) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    def fresh(self, base: str) -> str:
        return self._fresh(base or "v", self.taken)

    def fresh_node(self, base: str) -> str:
        return self._fresh(base or "node", self.nodes)


class Builder:
    """Stages new constants, nodes and value replacements for one rewrite; the engine
    commits them after ``rewrite`` returns (new nodes go right before the root node)."""

    def __init__(self, graph: Graph, match: Match, names: _Names, rule: str):
        self.graph = graph
        self.match = match
        self.rule = rule
        self._names = names
        self.new_nodes: list[Node] = []
        self.new_consts: list[Value] = []
        self.replacements: list[tuple[Value, Value]] = []
        self._created: set[int] = set()
        self._wanted_names: list[str] = []

    def refuse(self, reason: str) -> None:
        """Abandon the rewrite (nothing has been changed); recorded as a NoMatch."""
        raise RewriteRefused(reason)

    def const(self, base: str, array: np.ndarray, type: TensorType | None = None) -> Value:
        """A new initializer. Its type comes from its own data unless given (a quantized
        constant passes its QuantType explicitly)."""
        array = np.asarray(array)
        if type is None:
            type = TensorType(elem_from_numpy(array.dtype), tuple(array.shape))
        v = Value(self._names.fresh(base), type, const=array)
        self.new_consts.append(v)
        self._created.add(id(v))
        return v

    def op(
        self,
        op_type: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        types: TensorType | Sequence[TensorType | None] | None,
        domain: str = "",
        name: str | None = None,
        out_names: Sequence[str] | None = None,
        n_outputs: int = 1,
        attr_types: dict[str, int] | None = None,
    ) -> Any:
        """A new node; returns its output (or a tuple when ``n_outputs`` > 1).

        ``types`` is required (None only for a value whose type is unknown): build it
        with ``result_type(shape_from=..., elem_from=...)`` from the replaced op's
        output, never by copying an input's type. ``attr_types`` keeps the ONNX
        attribute types of attributes copied from a replaced node (e.g. an empty INTS)."""
        if isinstance(types, TensorType) or types is None:
            types = [types] * n_outputs
        types = list(types)
        if len(types) != n_outputs:
            raise RuleError(f"rule {self.rule}: {len(types)} types for {n_outputs} outputs of {op_type}")
        base = name or self.match.root.name or op_type.lower()
        bases = list(out_names) if out_names else [self.match.root.outputs[0].name] * n_outputs
        outs = [Value(self._names.fresh(bases[k]), types[k]) for k in range(n_outputs)]
        node = Node(
            op_type, list(inputs), outs, dict(attrs or {}), name=self._names.fresh_node(base), domain=domain
        )
        if attr_types:
            node.attr_types = {k: t for k, t in attr_types.items() if k in node.attrs}
        self._wanted_names.append(base)
        self.new_nodes.append(node)
        for o in outs:
            self._created.add(id(o))
        return outs[0] if n_outputs == 1 else tuple(outs)

    def replace(self, old: Value, new: Value, *, retype: bool = False) -> None:
        """Every use of ``old`` (and the graph output slot) becomes ``new``.

        The element types must agree unless ``retype`` (a rule that means to change a
        value's type must say so)."""
        if not retype and old.type is not None and new.type is not None and old.type.elem != new.type.elem:
            raise RuleError(
                f"rule {self.rule}: replacing '{old.name}' ({old.type.elem}) by '{new.name}' ({new.type.elem}) "
                "changes its element type; a result type comes from the replaced op's contract"
            )
        if any(o is old for o in self.graph.outputs) and id(new) not in self._created:
            if new.is_const or any(new is i for i in self.graph.inputs):
                kind = "a constant" if new.is_const else "a graph input"
                self.refuse(f"graph output '{old.name}' would become '{new.name}' ({kind}) and lose its name")
            if any(new is o for o in self.graph.outputs):
                self.refuse(
                    f"graph output '{old.name}' would become '{new.name}', which is already a graph output"
                )
        self.replacements.append((old, new))

    # -- engine side -------------------------------------------------------------------
    def commit(self) -> list[Node]:
        """Apply the staged changes; return the matched nodes that were removed."""
        g = self.graph
        renamed: list[tuple[Value, str]] = []  # (value, the name it had)
        for old, new in self.replacements:
            if id(new) in self._created or any(o is old for o in g.outputs):
                # keep names stable: the replacement takes the old name
                old_name = old.name
                renamed.append((old, old_name))
                renamed.append((new, new.name))
                old.name = self._names.fresh(old_name + "__replaced")
                new.name = old_name
        for c in self.new_consts:
            g.initializers[c.name] = c
        # The initializers are keyed by name, in order: a renamed constant is keyed anew,
        # the dict rebuilt in the same order. The first such rebuild of a run also keys
        # anew whatever the code before the run renamed; after it only a constant renamed
        # here can sit under a stale key (one it no longer has), and a renamed constant
        # whose key a new constant took over is no longer in the dict: most renames need
        # no rebuild (a whole-dict rebuild per rewrite is quadratic in a graph that folds
        # hundreds of constants).
        if any(v.is_const for v, _ in renamed):
            inits = g.initializers
            names = self._names
            if not names.initializers_keyed or any(
                v.is_const and name != v.name and inits.get(name) is v for v, name in renamed
            ):
                g.initializers = {v.name: v for v in inits.values()}
                names.initializers_keyed = True
        for node in self.new_nodes:
            g.add_node(node, before=self.match.root)
        for old, new in self.replacements:
            g.replace_all_uses(old, new)
        removed: list[Node] = []
        for node in self.match.matched:  # root first: its inputs become dead next
            if all(not o.uses and not any(o is x for x in g.outputs) for o in node.outputs):
                g.remove_node(node)
                removed.append(node)
                self._names.nodes.discard(node.name)
        # a new node takes the name it asked for once the node that held it is gone
        for node, wanted in zip(self.new_nodes, self._wanted_names):
            if node.name != wanted and wanted not in self._names.nodes:
                self._names.nodes.discard(node.name)
                self._names.nodes.add(wanted)
                node.name = wanted
        return removed


# -- applying rules ---------------------------------------------------------------------------


class NoMatchLog:
    """The last refusal per (rule, node) during one pass run."""

    def __init__(self) -> None:
        # (rule, node name, op type, first output's name or None, reason, kind): the
        # names as they are when the refusal happens, the text built when read (most
        # refusals are overwritten or never read: a session drops them)
        self._records: dict[tuple[str, int], tuple[str, str, str, str | None, str, str]] = {}

    def add(self, rule: str, node: Node, reason: str, kind: str = "check") -> None:
        out = node.outputs[0].name if node.outputs else None
        self._records[(rule, id(node))] = (rule, node.name, node.op_type, out, reason, kind)

    def discard(self, rule: str, node: Node) -> None:
        self._records.pop((rule, id(node)), None)

    @staticmethod
    def _record(raw: tuple[str, str, str, str | None, str, str]) -> NoMatchRecord:
        rule, name, op_type, out, reason, kind = raw
        label = f"'{name}' ({op_type})" if name else f"({op_type})"  # Node.label
        return NoMatchRecord(rule, label if out is None else f"{label} -> %{out}", reason, kind)

    def records(self, rule: str | None = None, *, include_pattern: bool = True) -> list[NoMatchRecord]:
        """Refusals (of ``rule``: class or snake-case name, case-insensitive);
        ``include_pattern=False`` leaves out nodes whose surroundings differ from the
        pattern (kind "pattern"), keeping the refusals of candidates."""
        raws = [r for r in self._records.values() if include_pattern or r[5] != "pattern"]
        if rule is not None:
            key = rule.replace("_", "").lower()
            raws = [r for r in raws if r[0].replace("_", "").lower() == key]
        return [self._record(r) for r in raws]

    def clear(self) -> None:
        self._records.clear()


class RuleSet:
    """Rules applied together to a fixed point, in node order (a sweep over the graph,
    repeated while something changed)."""

    max_sweeps = 64

    def __init__(self, rules: Sequence[Rule]):
        self.rules = list(rules)
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"rule names must be unique, got {names}")

    def _candidates(self, node: Node) -> list[Rule]:
        key = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        return [r for r in self.rules if "*" in r.root_ops or key in r.root_ops]

    def apply(self, graph: Graph, log: NoMatchLog | None = None) -> dict[str, int]:
        """Rewrite ``graph`` in place; return how often each rule fired."""
        log = log if log is not None else NoMatchLog()
        counts: dict[str, int] = {}
        names = _Names(graph)
        # the rules by root op, once per run (a sweep asks for every node; ~50 rules)
        by_op: dict[tuple[str, str], list[Rule]] = {}
        for _sweep in range(self.max_sweeps):
            changed = False
            removed: set[int] = set()  # nodes of this sweep's list a rewrite removed
            for node in list(graph.nodes):
                if id(node) in removed:
                    continue
                key = (node.domain, node.op_type)
                rules = by_op.get(key)
                if rules is None:
                    rules = by_op[key] = self._candidates(node)
                for rule in rules:
                    res = self._try(rule, graph, node, names, log)
                    if res is None:
                        continue
                    for r in res:
                        removed.add(id(r))
                    counts[rule.name] = counts.get(rule.name, 0) + 1
                    changed = True
                    break
            if not changed:
                return counts
        fired = ", ".join(f"{k} x{v}" for k, v in counts.items())
        raise RuntimeError(f"rules did not reach a fixed point after {self.max_sweeps} sweeps ({fired})")

    @staticmethod
    def _try(rule: Rule, graph: Graph, node: Node, names: _Names, log: NoMatchLog) -> list[Node] | None:
        m = rule.match(graph, node)
        if not m:
            log.add(rule.name, node, m.reason, m.kind)  # type: ignore[union-attr]
            return None
        verdict = rule.check(m)  # type: ignore[arg-type]
        if not isinstance(verdict, Match):
            if not isinstance(verdict, NoMatch):
                raise RuleError(
                    f"rule {rule.name}: check must return a Match or NoMatch(reason), got {verdict!r}"
                )
            log.add(rule.name, node, verdict.reason, verdict.kind)
            return None
        names.read()  # the graph's names before this rewrite changes it
        b = Builder(graph, m, names, rule.name)  # type: ignore[arg-type]
        try:
            out = rule.rewrite(m, b)  # type: ignore[arg-type]
            if out is not None:
                outs = [out] if isinstance(out, Value) else list(out)
                for old, new in zip(node.outputs, outs):
                    b.replace(old, new)
        except RewriteRefused as e:
            log.add(rule.name, node, e.reason)
            return None
        if not b.replacements:
            raise RuleError(f"rule {rule.name}: rewrite replaced nothing (return a value or call b.replace)")
        removed = b.commit()
        log.discard(rule.name, node)
        return removed


class RewritePass(Pass):
    """A pass that applies a :class:`RuleSet` to a fixed point. Subclasses set
    ``rules`` (a list of Rule instances) and ``name``."""

    rules: ClassVar[Sequence[Rule]] = ()

    def __init__(self, rules: Sequence[Rule] | None = None):
        self.ruleset = RuleSet(list(rules) if rules is not None else list(type(self).rules))
        self.log = NoMatchLog()

    def call(self, graph: Graph) -> PassResult:
        self.log.clear()
        counts = self.ruleset.apply(graph, self.log)
        return PassResult(graph, bool(counts), counts)

    def no_matches(self) -> list[NoMatchRecord]:
        return self.log.records()

    def why_not(self, rule: str, *, include_pattern: bool = False) -> list[NoMatchRecord]:
        return self.log.records(rule, include_pattern=include_pattern)

    def __repr__(self) -> str:
        return f"{type(self).__name__}([{', '.join(r.name for r in self.ruleset.rules)}])"
