"""The rule engine's bookkeeping shortcuts give the graph the plain forms give.

`Builder.commit` keys the initializers anew only when a constant it renamed sits under
a stale key (after the first rebuild of a run); the plain form rebuilt the dict on
every rewrite that renamed a constant. On random small graphs built by code, with
rules that fold constants, replace node outputs by constants and constants by node
outputs (renaming both ways), and with keys made stale before the run, the engine
gives the same graph text, the same initializer keys in the same order, the same fire
counts and the same refusal records as the plain form.
"""

from __future__ import annotations

import numpy as np
import pytest

from quanta.ir.graph import Graph, Node, Value, result_type
from quanta.ir.printer import format_graph
from quanta.ir.types import F32, TensorType
from quanta.passes import pattern
from quanta.passes.pattern import Builder, Match, NoMatch, Rule, RuleSet

T = TensorType(F32, (3,))


class FoldAddConsts(Rule):
    """%y = Add(%a const, %b const) -> %y = const a + b"""

    pattern = "y = Add(a, b)"

    def check(self, m: Match) -> Match | NoMatch:
        if not m.all_const("a", "b"):
            return NoMatch("an operand is not a constant")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.const(m.value("y").name, np.asarray(m.const("a") + m.const("b"), np.float32))


class NegOfConst(Rule):
    """%y = Neg(%c const) -> %y = const -c"""

    pattern = "y = Neg(c)"

    def check(self, m: Match) -> Match | NoMatch:
        return m if m.is_const("c") else NoMatch("not a constant")

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.const("neg", -np.asarray(m.const("c")))


class ConstThroughRelu(Rule):
    """%y = Relu(%x) -> %y = Abs(%x) when %x is a graph input: a new node output takes
    the name of the replaced one, and a graph output renames its old value."""

    pattern = "y = Relu(x)"

    def rewrite(self, m: Match, b: Builder) -> Value:
        y = m.value("y")
        return b.op("Abs", [m["x"]], types=result_type(shape_from=y, elem_from=y))


class MulByOneConst(Rule):
    """%y = Mul(%x, %c const) -> %y = Mul(%x, %c') with a fresh copy of c (the old
    constant renamed "__replaced" while a node still reads it)."""

    pattern = "y = Mul(x, c)"

    def check(self, m: Match) -> Match | NoMatch:
        c = m.value("c")
        if not c.is_const or c.doc == "copy":
            return NoMatch("not an original constant")
        return m

    def rewrite(self, m: Match, b: Builder) -> None:
        c = m.value("c")
        copy = b.const(c.name + "_copy", np.asarray(c.const))
        copy.doc = "copy"
        b.replace(c, copy)
        return None


class ConstAsNode(Rule):
    """%y = Sub(%x, %c const) -> %y = Sub(%x, Identity(%c')): the constant is replaced by
    a new node's output, which takes its name; the renamed constant stays an initializer
    (under the key of its old name until the dict is keyed anew)."""

    pattern = "y = Sub(x, c)"

    def check(self, m: Match) -> Match | NoMatch:
        return m if m.is_const("c") else NoMatch("not a constant")

    def rewrite(self, m: Match, b: Builder) -> None:
        c = m.value("c")
        copy = b.const("k", np.asarray(c.const))
        b.replace(c, b.op("Identity", [copy], types=result_type(shape_from=c, elem_from=c)))
        return None


RULES = [FoldAddConsts(), NegOfConst(), ConstThroughRelu(), MulByOneConst(), ConstAsNode()]


def random_graph(rng: np.random.Generator, stale: bool) -> Graph:
    g = Graph()
    pool: list[Value] = [g.add_input("x", T)]
    for k in range(int(rng.integers(1, 5))):
        pool.append(g.add_initializer(f"c{k}", rng.standard_normal(3).astype(np.float32)))
    n_nodes = int(rng.integers(2, 14))
    for k in range(n_nodes):
        op = str(rng.choice(["Add", "Neg", "Relu", "Mul", "Sub"]))
        arity = 1 if op in ("Neg", "Relu") else 2
        ins = [pool[int(rng.integers(0, len(pool)))] for _ in range(arity)]
        if rng.random() < 0.3:  # a fresh constant operand
            c = g.add_initializer(f"k{k}", rng.standard_normal(3).astype(np.float32))
            ins[-1] = c
        out = Value(f"v{k}", T)
        g.add_node(Node(op, ins, [out], name=f"n{k}" if rng.random() < 0.8 else ""))
        pool.append(out)
    outs = [v for v in pool[1:] if v.producer is not None and not v.uses] or [pool[-1]]
    g.set_outputs(outs[:3] if outs[0].producer is not None else [pool[-1]])
    if stale and g.initializers:
        # code before the pass renamed a constant without keying it anew
        v = next(iter(g.initializers.values()))
        v.name = v.name + "_renamed"
    return g


class _PlainNames(pattern._Names):
    """Never marked keyed: every rewrite that renames a constant rebuilds the dict."""

    @property  # type: ignore[override]
    def initializers_keyed(self) -> bool:
        return False

    @initializers_keyed.setter
    def initializers_keyed(self, value: bool) -> None:
        pass


def run(g: Graph) -> tuple[str, list[str], list[str], dict[str, int], list[str]]:
    log = pattern.NoMatchLog()
    counts = RuleSet(RULES).apply(g, log)
    return (
        format_graph(g),
        list(g.initializers),
        [v.name for v in g.initializers.values()],
        counts,
        [str(r) for r in log.records()],
    )


@pytest.mark.parametrize("seed", range(150))
def test_commit_keys_initializers_as_a_full_rebuild_does(seed, monkeypatch):
    stale = seed % 3 == 0
    a = random_graph(np.random.default_rng(seed), stale)
    b = random_graph(np.random.default_rng(seed), stale)
    assert format_graph(a) == format_graph(b)
    fast = run(a)
    monkeypatch.setattr(pattern, "_Names", _PlainNames)
    assert run(b) == fast


def test_the_random_graphs_rename_constants_and_leave_stale_keys():
    """The cases the comparison is about occur: constants renamed by commits, and keys
    a rename before the run made stale, which the first rebuild keys anew."""
    renamed = stale_fixed = 0
    for seed in range(150):
        g = random_graph(np.random.default_rng(seed), seed % 3 == 0)
        stale_before = any(k != v.name for k, v in g.initializers.items())
        _, keys, names, _, _ = run(g)
        renamed += any("__replaced" in k for k in keys)
        stale_fixed += stale_before and keys == names
    assert renamed > 10 and stale_fixed > 5
