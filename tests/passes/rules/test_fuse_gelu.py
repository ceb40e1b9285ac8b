"""FuseGelu (passes/rules/fuse_gelu.py): the five-op GELU of BERT-style exports becomes
one Gelu. Four parts (fired; the structure: com.microsoft Gelu before opset 20, ai.onnx
Gelu from 20; bit-exact numerics on the reference target for both forms, on inputs
away from the subnormal range where form A's order could differ; the verifier) and the
refusals, each with its reason; the native binder of com.microsoft Gelu."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.pattern import RewritePass
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fuse_gelu import FuseGelu, FuseGeluPass
from tests.passes.helpers import run_passes, run_ref

SQRT2 = np.float32(np.sqrt(2.0))


def gelu_proto(
    form: str = "A", *, opset: int = 17, divisor=SQRT2, extra_use: bool = False, add_first=False, half=0.5
):
    inits = [
        numpy_helper.from_array(np.asarray(divisor, np.float32), "c_sqrt2"),
        numpy_helper.from_array(np.float32(1.0), "one"),
        numpy_helper.from_array(np.asarray(half, np.float32), "half"),
    ]
    nodes = [
        helper.make_node("Relu", ["x_in"], ["x"], name="pre"),
        helper.make_node("Div", ["x", "c_sqrt2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["one", "e"] if add_first else ["e", "one"], ["a"], name="add"),
    ]
    if form == "A":  # 0.5 * x * (1 + erf): (x * a) * 0.5
        nodes += [
            helper.make_node("Mul", ["x", "a"], ["m"], name="mul"),
            helper.make_node("Mul", ["m", "half"], ["y"], name="mul_half"),
        ]
    else:  # x * 0.5 * (1 + erf): (x * 0.5) * a
        nodes += [
            helper.make_node("Mul", ["half", "x"], ["m"], name="mul_half"),
            helper.make_node("Mul", ["a", "m"], ["y"], name="mul"),
        ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 257])]
    if extra_use:
        outputs.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, [3, 257]))
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [3, 257])], outputs, inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def feeds():
    x = np.random.default_rng(6).standard_normal((3, 257)).astype(np.float32) * 4
    return {"x_in": x}


@pytest.mark.parametrize("form", ["A", "B"])
@pytest.mark.parametrize("add_first", [False, True])
def test_gelu_fuses_bit_exact(form, add_first):
    proto = gelu_proto(form, add_first=add_first)
    model = load(proto)
    result = run_passes(model, [FuseGeluPass(17), EliminateDead()])
    assert result.fired("FuseGelu") == 1
    assert [(n.op_type, n.domain) for n in model.graph.nodes] == [("Relu", ""), ("Gelu", "com.microsoft")]
    np.testing.assert_array_equal(run_ref(proto, feeds())[0], run_ref(model, feeds())[0])


# form C: the 0.5 with a per-channel factor folded in (a SmoothQuant file), distinct
# values on the 257 columns, and a scalar other than 0.5
SMOOTH = (0.5 * np.random.default_rng(3).uniform(0.3, 3.0, 257)).astype(np.float32)


@pytest.mark.parametrize("half", [SMOOTH, np.float32(0.37)], ids=["per-column", "scalar"])
@pytest.mark.parametrize("add_first", [False, True])
def test_gelu_with_a_constant_factor_fuses_bit_exact(half, add_first):
    proto = gelu_proto("A", add_first=add_first, half=half)
    model = load(proto)
    result = run_passes(model, [FuseGeluPass(17), EliminateDead()])
    assert result.fired("FuseGelu") == 1
    assert [(n.op_type, n.domain) for n in model.graph.nodes] == [
        ("Relu", ""),
        ("Gelu", "com.microsoft"),
        ("Mul", ""),
    ]
    factor = model.graph.nodes[-1].inputs[1].const
    np.testing.assert_array_equal(factor, np.asarray(half, np.float32) * np.float32(2))
    np.testing.assert_array_equal(run_ref(proto, feeds())[0], run_ref(model, feeds())[0])


def test_gelu_with_a_factor_whose_double_overflows_is_left_alone():
    model = load(gelu_proto("A", half=np.float32(3e38)))
    result = run_passes(model, [FuseGeluPass(17)])
    assert result.fired("FuseGelu") == 0


def test_opset_20_uses_the_onnx_op():
    proto = gelu_proto("B", opset=20)
    model = load(proto)
    run_passes(model, [FuseGeluPass(20)])
    gelu = next(n for n in model.graph.nodes if n.op_type == "Gelu")
    assert gelu.domain == "" and gelu.attrs == {"approximate": "none"}
    np.testing.assert_array_equal(run_ref(proto, feeds())[0], run_ref(model, feeds())[0])


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"divisor": np.float32(1.41421)}, "not a GELU"),  # not f32(√2)
        ({"extra_use": True}, "the intermediate 'e' has other users"),
    ],
)
def test_refusals(kwargs, reason):
    model = load(gelu_proto("A", **kwargs))
    p = RewritePass([FuseGelu(17)])
    result = run_passes(model, [p])
    assert result.fired("FuseGelu") == 0
    assert any(r.reason.startswith(reason) for r in p.why_not("FuseGelu")), [
        r.reason for r in p.why_not("FuseGelu")
    ]


def test_native_com_microsoft_gelu_matches_its_twin():
    proto = gelu_proto("A")
    model = load(proto)
    run_passes(model, [FuseGeluPass(17)])
    from quanta.ir.onnx_io import to_proto

    fused = to_proto(model)
    ref = quanta.InferenceSession(fused, backend="reference").run(None, feeds())[0]
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(fused, sess_options=opts, backend="native")
        assert sess.fallbacks == []
        assert any(s.kernel.name == "native:gelu_f32" for s in sess.plan.steps)
        np.testing.assert_array_equal(sess.run(None, feeds())[0], ref)
