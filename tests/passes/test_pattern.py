"""The rule engine: pattern syntax, matching, the engine's sharing checks, the builder's
contract (staging, type guard, output names) and the NoMatch log."""

from __future__ import annotations

import numpy as np
import pytest

from quanta.ir.graph import Graph, Node, Value, result_type
from quanta.ir.printer import format_graph
from quanta.ir.types import F32, I8, QuantType, TensorType
from quanta.passes.pattern import (
    Match,
    NoMatch,
    PatternError,
    PCall,
    PLeaf,
    RewritePass,
    Rule,
    RuleError,
    RuleSet,
    parse_pattern,
)

T = TensorType(F32, (3, 7))


def chain(*ops: str, extra_use: bool = False) -> Graph:
    """x -> ops[0] -> ops[1] -> ... -> y (unary ops), optionally the first result also
    read by a Neg that is a graph output."""
    g = Graph()
    v = g.add_input("x", T)
    first = None
    for k, op in enumerate(ops):
        out = Value("y" if k == len(ops) - 1 else f"v{k}", T)
        g.add_node(Node(op, [v], [out], name=f"n{k}"))
        first = first or out
        v = out
    outs = [v]
    if extra_use:
        n = Value("neg", T)
        g.add_node(Node("Neg", [first], [n], name="neg"))
        outs.append(n)
    g.set_outputs(outs)
    return g


# -- syntax ---------------------------------------------------------------------------------


def test_parse_pattern_structure():
    p = parse_pattern("y = BatchNormalization(c = Conv|ConvTranspose(x, W, B?), g, _, ...)")
    assert p.outputs == ("y",) and p.ops == ("BatchNormalization",) and p.rest
    conv = p.args[0]
    assert isinstance(conv, PCall) and conv.ops == ("Conv", "ConvTranspose") and conv.outputs == ("c",)
    assert conv.args == (PLeaf("x", False), PLeaf("W", False), PLeaf("B", True))
    assert p.args[1:] == (PLeaf("g", False), PLeaf(None, False))


def test_parse_pattern_domains_wildcards_and_multiple_outputs():
    p = parse_pattern("a, b = com.microsoft::QLinearAdd(*(...), _?)")
    assert p.outputs == ("a", "b") and p.ops == ("com.microsoft::QLinearAdd",)
    assert p.args[0] == PCall(("*",), (), True, ()) and p.args[1] == PLeaf(None, True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("y = Conv(x, W", "pattern 'y = Conv(x, W': expected ',' or ')', got end of pattern"),
        ("y = Conv(x, ", "pattern 'y = Conv(x, ': expected an argument or ')', got end of pattern"),
        ("y = Conv(..., x)", "pattern 'y = Conv(..., x)': '...' must be the last argument"),
        ("y = Conv(x) z", "pattern 'y = Conv(x) z': unexpected 'z' after the pattern"),
        ("y = Conv(x; W)", "pattern 'y = Conv(x; W)': unexpected character at 10: '; W)'"),
        ("y = (x)", "pattern 'y = (x)': expected a name, got '('"),
    ],
)
def test_parse_pattern_errors(text, message):
    with pytest.raises(PatternError) as e:
        parse_pattern(text)
    assert str(e.value) == message


def test_rule_with_a_bad_pattern_fails_at_definition():
    with pytest.raises(PatternError) as e:

        class Broken(Rule):
            pattern = "y = Relu("

    assert str(e.value) == "rule Broken: pattern 'y = Relu(': expected an argument or ')', got end of pattern"


def test_rule_shared_ok_must_name_an_intermediate():
    with pytest.raises(PatternError) as e:

        class Broken(Rule):
            pattern = "y = Relu(a = Neg(x))"
            shared_ok = frozenset({"x"})

    assert str(e.value) == "rule Broken: shared_ok names ['x'] are not intermediate values"


# -- matching -------------------------------------------------------------------------------


class NegRelu(Rule):
    """%y = Relu(%a = Neg(%x)) -> %y = Abs-like test op"""

    pattern = "y = Relu(a = Neg(x))"

    def rewrite(self, m: Match, b) -> Value:
        y = m.value("y")
        return b.op("NegRelu", [m["x"]], types=result_type(shape_from=y, elem_from=y), name="fused")


def test_match_binds_values_and_nodes():
    g = chain("Neg", "Relu")
    m = NegRelu().match(g, g.nodes[1])
    assert isinstance(m, Match)
    assert m["x"] is g.inputs[0] and m["a"] is g.nodes[0].outputs[0] and m["y"] is g.outputs[0]
    assert m.node("a") is g.nodes[0] and m.node("y") is g.nodes[1] and m.matched == [g.nodes[1], g.nodes[0]]
    with pytest.raises(KeyError):
        m["nope"]


def test_match_reports_the_structural_difference():
    g = chain("Sigmoid", "Relu")
    res = NegRelu().match(g, g.nodes[1])
    assert res == NoMatch("input 0 of 'n1' (Relu) 'v0' is produced by Sigmoid, expected Neg", "pattern")
    g = chain("Relu")
    res = NegRelu().match(g, g.nodes[0])
    assert res == NoMatch(
        "input 0 of 'n0' (Relu) 'x' is a graph input, expected the output of Neg", "pattern"
    )


def test_match_refuses_an_intermediate_used_outside_unless_shared_ok():
    g = chain("Neg", "Relu", extra_use=True)
    res = NegRelu().match(g, g.nodes[1])
    assert res == NoMatch(
        "'v0' (output of 'n0' (Neg)) is also used by 'neg' (Neg) outside the pattern", "shared"
    )

    class Shared(NegRelu):
        shared_ok = frozenset({"a"})

    assert isinstance(Shared().match(g, g.nodes[1]), Match)


def test_match_refuses_an_intermediate_that_is_a_graph_output():
    g = chain("Neg", "Relu")
    g.set_outputs([g.nodes[0].outputs[0], g.outputs[0]])
    assert NegRelu().match(g, g.nodes[1]) == NoMatch(
        "'v0' (output of 'n0' (Neg)) is a graph output", "shared"
    )


def test_match_optional_inputs_repeated_names_and_extra_inputs():
    class AddSame(Rule):
        pattern = "y = Add(x, x)"

    class ClipAny(Rule):
        pattern = "y = Clip(x, lo?, hi?)"

    g = Graph()
    x = g.add_input("x", T)
    z = g.add_input("z", T)
    same, diff, clip = Value("s", T), Value("d", T), Value("c", T)
    g.add_node(Node("Add", [x, x], [same], name="same"))
    g.add_node(Node("Add", [x, z], [diff], name="diff"))
    g.add_node(Node("Clip", [x, None], [clip], name="clip"))
    g.set_outputs([same, diff, clip])
    assert isinstance(AddSame().match(g, g.nodes[0]), Match)
    assert AddSame().match(g, g.nodes[1]).reason == (
        "'x' appears twice in the pattern but input 1 of 'diff' (Add) is a different value"
    )
    m = ClipAny().match(g, g.nodes[2])
    assert m["lo"] is None and m["hi"] is None and m.all_const("lo", "hi")

    class OneInput(Rule):
        pattern = "y = Add(x)"

    assert (
        OneInput().match(g, g.nodes[0]).reason
        == "'same' (Add) has input 1 set; the pattern expects at most 1 inputs"
    )


def test_match_requires_output_0_of_a_nested_node():
    class SplitFirst(Rule):
        pattern = "y = Relu(Split(x))"

    g = Graph()
    x = g.add_input("x", T)
    a, b, y = Value("a", T), Value("b", T), Value("y", T)
    g.add_node(Node("Split", [x], [a, b], name="split"))
    g.add_node(Node("Relu", [b], [y], name="relu"))
    g.set_outputs([a, y])
    assert (
        SplitFirst().match(g, g.nodes[1]).reason
        == "input 0 of 'relu' (Relu) 'b' is output 1 of 'split' (Split), expected output 0"
    )


# -- rewriting -----------------------------------------------------------------------------------


def test_rewrite_replaces_and_removes_the_matched_nodes_keeping_the_output_name():
    g = chain("Sigmoid", "Neg", "Relu")
    counts = RuleSet([NegRelu()]).apply(g)
    assert counts == {"NegRelu": 1}
    assert format_graph(g) == (
        "graph main(%x: tensor<3x7, f32>) {\n"
        "  %v0: tensor<3x7, f32> = Sigmoid(%x)  # n0\n"
        "  %y: tensor<3x7, f32> = NegRelu(%v0)  # fused\n"
        "  return %y\n"
        "}"
    )


def test_rewrite_that_changes_a_type_is_a_rule_error():
    # Failure signature: a rule copied its input's type onto its result.
    class CopiesInputType(NegRelu):
        def rewrite(self, m, b):
            x = m.value("x")
            return b.op("NegRelu", [x], types=result_type(shape_from=x, elem_from=x))

    g = Graph()
    x = g.add_input("x", TensorType(QuantType(I8, F32, 0.02, 3), (3,)))
    a = Value("a", TensorType(QuantType(I8, F32, 0.05, 1), (3,)))
    y = Value("y", TensorType(QuantType(I8, F32, 0.08, -5), (3,)))
    g.add_node(Node("Neg", [x], [a], name="neg"))
    g.add_node(Node("Relu", [a], [y], name="relu"))
    g.set_outputs([y])
    before = format_graph(g)
    with pytest.raises(RuleError) as e:
        RuleSet([CopiesInputType()]).apply(g)
    assert str(e.value) == (
        "rule CopiesInputType: replacing 'y' (Q(i8:f32, 0.08, -5)) by 'y_1' (Q(i8:f32, 0.02, 3)) changes its "
        "element type; a result type comes from the replaced op's contract"
    )
    assert format_graph(g) == before  # nothing was committed


def test_refused_rewrite_leaves_the_graph_untouched_and_is_logged():
    class Refuses(NegRelu):
        def rewrite(self, m, b):
            super().rewrite(m, b)  # stages a node ...
            b.refuse("changed my mind")  # ... then refuses

    g = chain("Neg", "Relu")
    before = format_graph(g)
    p = RewritePass([Refuses()])
    assert not p(g).modified
    assert format_graph(g) == before
    assert [(r.rule, r.node, r.reason) for r in p.why_not("refuses")] == [
        ("Refuses", "'n1' (Relu) -> %y", "changed my mind")
    ]


def test_check_must_return_match_or_nomatch():
    class Bare(NegRelu):
        def check(self, m):
            return False

    with pytest.raises(RuleError) as e:
        RuleSet([Bare()]).apply(chain("Neg", "Relu"))
    assert str(e.value) == "rule Bare: check must return a Match or NoMatch(reason), got False"


def test_rewrite_must_replace_something():
    class Nothing(NegRelu):
        def rewrite(self, m, b):
            return None

    with pytest.raises(RuleError) as e:
        RuleSet([Nothing()]).apply(chain("Neg", "Relu"))
    assert str(e.value) == "rule Nothing: rewrite replaced nothing (return a value or call b.replace)"


def test_rules_that_never_settle_hit_the_sweep_limit():
    class Flip(Rule):
        pattern = "y = Relu|Abs(x)"

        def rewrite(self, m, b):
            y = m.value("y")
            other = "Abs" if m.root.op_type == "Relu" else "Relu"
            return b.op(other, [m["x"]], types=result_type(shape_from=y, elem_from=y))

    with pytest.raises(RuntimeError) as e:
        RuleSet([Flip()]).apply(chain("Relu"))
    assert str(e.value) == "rules did not reach a fixed point after 64 sweeps (Flip x64)"


def test_rule_names_must_be_unique():
    with pytest.raises(ValueError):
        RuleSet([NegRelu(), NegRelu()])


def test_no_match_log_keeps_the_last_reason_and_forgets_on_success():
    class OnlyConst(Rule):
        pattern = "y = Neg(x)"

        def check(self, m):
            return m if m.is_const("x") else NoMatch(f"'{m.value('x').name}' is not a constant")

        def rewrite(self, m, b):
            y = m.value("y")
            return b.const("neg", -m.const("x"), result_type(shape_from=(2,), elem_from=y))

    g = Graph()
    x = g.add_input("x", TensorType(F32, (2,)))
    c = g.add_initializer("c", np.array([1.0, 2.0], np.float32))
    a, b_, s = (
        Value("a", TensorType(F32, (2,))),
        Value("b", TensorType(F32, (2,))),
        Value("s", TensorType(F32, (2,))),
    )
    g.add_node(Node("Neg", [x], [a], name="on_input"))
    g.add_node(Node("Neg", [c], [b_], name="on_const"))
    g.add_node(Node("Add", [a, b_], [s], name="add"))
    g.set_outputs([s])
    p = RewritePass([OnlyConst()])
    result = p(g)
    assert result.stats == {"OnlyConst": 1}
    assert [str(r) for r in p.why_not("only_const")] == [
        "OnlyConst at 'on_input' (Neg) -> %a: 'x' is not a constant"
    ]
    assert g.nodes[-1].inputs[1].const.tolist() == [-1.0, -2.0]
