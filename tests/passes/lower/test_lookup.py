"""LowerLookup (passes/lower/lookup.py): Q(f(DQ(x))) for an elementwise f becomes
quanta::QLinearLookup with a 256-entry table. Four parts (fired; structure: no float op
left; numerics: bit-exact with the unlowered QDQ graph on the reference target, and the
native target bit-exact with both, since the table is the unlowered group run on every
code; the verifier in the lowered stage) and one refusal per reason. Then the whole
path: quantize_static plans a gated activation (SiLU, Mish, hardswish before opset 14) as
one group, writes a file that onnx's checker and ONNX Runtime accept, and the session
lowers every activation to a table."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage, verify
from quanta.passes.lower.lookup import LowerLookup, compose_tables, lookup_codes
from quanta.passes.pattern import RewritePass
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.runtime.compile import reference_evaluator
from quanta.session import InferenceSession
from tests.ort_int8 import ort_session_options  # saturating fused int8 off where ORT has it
from tests.passes.helpers import run_passes, run_ref

SHAPE = [2, 3, 7, 9]


def c(name: str, v, dtype=np.float32) -> TensorProto:
    return numpy_helper.from_array(np.asarray(v, dtype), name)


def activation(kind: str, x: str, y: str) -> tuple[list, list]:
    """Nodes computing y = kind(x) (float), and their constants."""
    mk = helper.make_node
    if kind == "hardswish":
        return [mk("HardSwish", [x], [y])], []
    if kind == "hardswish_pair":
        return [mk("HardSigmoid", [x], ["g"], alpha=1 / 6, beta=0.5), mk("Mul", [x, "g"], [y])], []
    if kind == "hardsigmoid":
        return [mk("HardSigmoid", [x], [y], alpha=0.2, beta=0.5)], []
    if kind == "silu":
        return [mk("Sigmoid", [x], ["g"]), mk("Mul", ["g", x], [y])], []
    if kind == "mish":
        return [mk("Softplus", [x], ["sp"]), mk("Tanh", ["sp"], ["g"]), mk("Mul", [x, "g"], [y])], []
    if kind == "tanh":
        return [mk("Tanh", [x], [y])], []
    if kind == "relu":  # between two different types: DropImpliedActivation cannot remove it
        return [mk("Relu", [x], [y])], []
    if kind == "exp":
        return [mk("Exp", [x], [y])], []
    if kind == "clip":  # narrower than the output range: not implied by the quantization
        return [mk("Clip", [x, "lo", "hi"], [y])], [c("lo", -0.5), c("hi", 1.25)]
    if kind == "written":  # x * Clip(x + 3, 0, 6) / 6, as exported
        return [
            mk("Add", [x, "three"], ["s"]),
            mk("Clip", ["s", "zero", "six"], ["r"]),
            mk("Mul", [x, "r"], ["m"]),
            mk("Div", ["m", "six"], [y]),
        ], [c("three", 3.0), c("zero", 0.0), c("six", 6.0)]
    if kind == "prelu_one":  # PyTorch's nn.PReLU(): one slope, exported as [1, 1, 1]
        return [mk("PRelu", [x, "slope"], [y])], [c("slope", np.full((1, 1, 1), 0.23, np.float32))]
    raise ValueError(kind)


KINDS = [
    "hardswish",
    "hardswish_pair",
    "hardsigmoid",
    "silu",
    "mish",
    "tanh",
    "exp",
    "clip",
    "relu",
    "written",
    # GTCRN's PReLU slopes [1, 1, 1] on a rank-4 x (ORT's quantized file: DQ -> PRelu -> Q
    # after every convolution): the table is computed on codes of x's rank (PRelu refuses
    # a slope of higher rank than its input)
    "prelu_one",
]


def qdq_proto(kind: str, dtype=np.uint8, *, sx=0.043, zx=131, sy=0.0271, zy=17, opset=17):
    """x_in -> Q -> DQ -> f -> Q -> DQ -> y, the group between one 8-bit type and another."""
    if dtype == np.int8:
        zx, zy = zx - 128, zy - 128
    mk = helper.make_node
    nodes = [
        mk("QuantizeLinear", ["x_in", "sx", "zx"], ["xq"]),
        mk("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
    ]
    act, consts = activation(kind, "x", "f")
    nodes += act
    nodes += [
        mk("QuantizeLinear", ["f", "sy", "zy"], ["yq"]),
        mk("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
    ]
    for i, n in enumerate(nodes):
        n.name = f"{n.op_type.lower()}{i}"
    inits = [c("sx", sx), c("zx", zx, dtype), c("sy", sy), c("zy", zy, dtype), *consts]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x_in", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def feeds(sx=0.043):
    rng = np.random.default_rng(4)
    # every code and beyond both saturation ends
    x = rng.uniform(-140 * sx, 140 * sx, size=SHAPE).astype(np.float32)
    return {"x_in": x}


def lower(model):
    p = RewritePass([LowerLookup(reference_evaluator(model.opset_imports))])
    p.produces_stage = Stage.LOWERED
    result = run_passes(model, [p, EliminateDead()])
    model.opset_imports.setdefault("quanta", 1)
    return result


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("kind", KINDS)
def test_lookup_is_bit_exact_with_the_group(kind, dtype):
    proto = qdq_proto(kind, dtype)
    model = load(proto)
    result = lower(model)
    assert result.fired("LowerLookup") == 1
    assert model.graph.op_counts() == {
        "QuantizeLinear": 1,
        "quanta::QLinearLookup": 1,
        "DequantizeLinear": 1,
    }
    verify(model.graph, Stage.LOWERED)
    f = feeds()
    expected = run_ref(proto, f)[0]
    np.testing.assert_array_equal(expected, run_ref(model, f)[0])
    # the sessions lower by themselves (both backends): the same bytes
    for backend in ("reference", "native"):
        got = InferenceSession(proto.SerializeToString(), backend=backend).run(None, f)[0]
        np.testing.assert_array_equal(expected, got, err_msg=backend)


def test_lookup_table_is_the_group_on_every_code():
    """The table entry of bits i is q(f(dq(code))): HardSwish by hand, in float32."""
    model = load(qdq_proto("hardswish"))
    lower(model)
    node = next(n for n in model.graph.nodes if n.op_type == "QLinearLookup")
    table = np.asarray(node.inputs[5].const)
    v = np.float32(0.043) * (lookup_codes(np.uint8).astype(np.float32) - np.float32(131))
    hs = v * np.maximum(np.float32(0), np.minimum(np.float32(1), v * np.float32(1 / 6) + np.float32(0.5)))
    q = np.clip(np.rint(hs / np.float32(0.0271)) + 17, 0, 255).astype(np.uint8)
    # float32 HardSwish evaluated two ways may differ by an ulp; the codes agree except
    # where hs / sy sits within that ulp of an x.5: at most a handful, each by one step
    assert node.attrs["function"] == "HardSwish"
    assert np.abs(table.astype(int) - q.astype(int)).max() <= 1
    assert np.count_nonzero(table != q) <= 3


def test_lookup_refuses_without_evaluator():
    model = load(qdq_proto("tanh"))
    rule = LowerLookup(None)
    q = next(n for n in model.graph.nodes if n.op_type == "QuantizeLinear" and n.outputs[0].name == "yq")
    m = rule.match(model.graph, q)
    assert rule.check(m).reason == "no evaluator to compute the table with (the runtime injects one)"


def _refusal(proto, reason: str) -> None:
    model = load(proto)
    rule = LowerLookup(reference_evaluator(model.opset_imports))
    p = RewritePass([rule])
    p.produces_stage = Stage.LOWERED
    before = model.graph.op_counts()
    run_passes(model, [p])
    assert model.graph.op_counts() == before
    reasons = [r.reason for r in p.why_not("LowerLookup")]
    assert reason in reasons, reasons


@pytest.mark.parametrize("x_type,y_type", [(np.uint8, np.int8), (np.int8, np.uint8)])
@pytest.mark.parametrize("kind", ["tanh", "bn"])
def test_lookup_between_storages_is_bit_exact(kind, x_type, y_type):
    """Input and output of different 8-bit storage (NNCF: a depthwise Conv's int8 output,
    then BatchNormalization and ReLU quantized to uint8): the table holds the output's
    codes, indexed by the input's byte; the reference and native sessions give the
    group's bytes, 1 and 2 threads."""
    if kind == "tanh":
        proto, shape = qdq_proto("tanh", x_type), SHAPE
    else:
        shape = (2, 7, 5, 33)
        proto = channel_proto("bn", x_type, shape, 1)
    zy = {np.dtype(np.uint8): 131, np.dtype(np.int8): -111}[np.dtype(y_type)]
    for t in proto.graph.initializer:
        if t.name == "zy":
            t.CopyFrom(c("zy", zy, y_type))
    model = load(proto)
    assert lower(model).fired("LowerLookup") == 1
    node = next(n for n in model.graph.nodes if n.op_type == "QLinearLookup")
    assert np.asarray(node.inputs[5].const).dtype == np.dtype(y_type)
    verify(model.graph, Stage.LOWERED)
    kernels = sessions_give_the_groups_bytes(proto, model, shape, seed=6)
    table = f"{'channels_' if kind == 'bn' else ''}{'u8' if y_type == np.uint8 else 's8'}"
    assert kernels == [f"native:qlinear_lookup_{table}"]  # named by the output's storage


def test_lookup_refuses_a_constant_along_two_axes():
    proto = qdq_proto("clip")
    mk = helper.make_node
    # f = Clip(x) + a bias per (channel, row): an element no longer depends on itself and
    # its channel alone
    proto.graph.node[2].output[0] = "f0"
    proto.graph.node.insert(3, mk("Add", ["f0", "chan"], ["f"], name="chan_add"))
    proto.graph.initializer.append(c("chan", np.arange(21, dtype=np.float32).reshape(3, 7, 1)))
    _refusal(
        proto,
        "'chan_add' (Add): constant 'chan' (a constant) is not a scalar of rank <= 4 "
        "nor a vector along one axis of x 'xq' (output of 'quantizelinear0' (QuantizeLinear))",
    )


def test_lookup_refuses_constants_along_different_axes():
    proto = qdq_proto("clip")
    mk = helper.make_node
    proto.graph.node[2].output[0] = "f0"
    proto.graph.node.insert(3, mk("Add", ["f0", "chan"], ["f1"], name="chan_add"))
    proto.graph.node.insert(4, mk("Mul", ["f1", "cols"], ["f"], name="col_mul"))
    proto.graph.initializer.append(c("chan", np.arange(3, dtype=np.float32).reshape(3, 1, 1)))
    proto.graph.initializer.append(c("cols", np.linspace(0.5, 1.5, 9, dtype=np.float32)))
    _refusal(proto, "the group's constants vary along different axes of x ([1, 3])")


def channel_proto(kind: str, dtype=np.uint8, shape=(2, 7, 5, 33), axis: int = 1):
    """x_in -> Q -> DQ -> f -> Q -> DQ with f varying along ``axis``: a BatchNormalization
    ("bn", axis 1), ORT's affine form of one (Mul, Add by [C, 1, 1] constants), a PRelu
    with a slope per channel, or a per-channel Add then HardSigmoid."""
    rng = np.random.default_rng(11)
    ch = shape[axis]
    zx, zy = (131, 17) if dtype == np.uint8 else (3, -111)
    mk = helper.make_node
    nodes = [
        mk("QuantizeLinear", ["x_in", "sx", "zx"], ["xq"]),
        mk("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
    ]
    trailing = (1,) * (len(shape) - 1 - axis)
    if kind == "bn":
        nodes.append(mk("BatchNormalization", ["x", "g", "b", "mean", "var"], ["f"], epsilon=1e-3))
        consts = [
            c("g", rng.uniform(0.3, 2.5, ch)),
            c("b", rng.uniform(-1, 1, ch)),
            c("mean", rng.uniform(-0.5, 0.5, ch)),
            c("var", rng.uniform(0.2, 3, ch)),
        ]
    elif kind == "prelu":  # Keras / Caffe face detectors: a slope per channel, both signs
        nodes.append(mk("PRelu", ["x", "slope"], ["f"]))
        consts = [c("slope", rng.uniform(-0.5, 0.8, (ch, *trailing)))]
    elif kind == "affine":
        nodes += [mk("Mul", ["x", "a"], ["m"]), mk("Add", ["m", "k"], ["f"])]
        consts = [c("a", rng.uniform(0.3, 2.5, (ch, *trailing))), c("k", rng.uniform(-1, 1, (ch, *trailing)))]
    else:
        nodes += [mk("Add", ["x", "k"], ["m"]), mk("HardSigmoid", ["m"], ["f"], alpha=0.2, beta=0.5)]
        consts = [c("k", rng.uniform(-2, 2, (ch, *trailing)))]
    nodes += [
        mk("QuantizeLinear", ["f", "sy", "zy"], ["yq"]),
        mk("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
    ]
    for i, n in enumerate(nodes):
        n.name = f"{n.op_type.lower()}{i}"
    inits = [c("sx", 0.043), c("zx", zx, dtype), c("sy", 0.0271), c("zy", zy, dtype), *consts]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x_in", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(
    "kind,shape,axis",
    [
        ("bn", (2, 7, 5, 33), 1),
        ("bn", (1, 17, 259), 1),
        ("affine", (2, 7, 5, 33), 1),
        ("add", (3, 4, 17), 2),
        ("prelu", (2, 7, 5, 33), 1),
        ("prelu", (3, 4, 17), 2),
    ],
)
def test_lookup_per_channel_is_bit_exact_with_the_group(kind, shape, axis, dtype):
    """Failure signature: a row of the table computed for the wrong channel (the codes laid
    along the wrong axis of the evaluation tensor), or the kernel indexing channels by the
    wrong stride; every channel's parameters differ, so either shows."""
    proto = channel_proto(kind, dtype, shape, axis)
    model = load(proto)
    assert lower(model).fired("LowerLookup") == 1
    node = next(n for n in model.graph.nodes if n.op_type == "QLinearLookup")
    assert node.attrs["axis"] == axis and np.shape(node.inputs[5].const) == (shape[axis], 256)
    verify(model.graph, Stage.LOWERED)
    kernels = sessions_give_the_groups_bytes(proto, model, shape, seed=5)
    assert kernels == [f"native:qlinear_lookup_channels_{'u8' if dtype == np.uint8 else 's8'}"]


def sessions_give_the_groups_bytes(proto, model, shape, *, seed: int) -> list[str]:
    """The lowered ``model`` and sessions of ``proto`` (reference and native, 1 and 2
    threads) give the float group's bytes on inputs beyond both saturation ends; returns
    the native session's QLinearLookup kernel names."""
    rng = np.random.default_rng(seed)
    f = {"x_in": rng.uniform(-140 * 0.043, 140 * 0.043, size=shape).astype(np.float32)}
    expected = run_ref(proto, f)[0]
    np.testing.assert_array_equal(expected, run_ref(model, f)[0])
    names: list[str] = []
    for backend in ("reference", "native"):
        for threads in (1, 2):
            so = quanta.SessionOptions()
            so.intra_op_num_threads = threads
            sess = InferenceSession(proto.SerializeToString(), so, backend=backend)
            np.testing.assert_array_equal(expected, sess.run(None, f)[0], err_msg=f"{backend} t{threads}")
            if backend == "native":
                names = [s.kernel.name for s in sess.plan.steps if s.op_type == "QLinearLookup"]
    return names


def test_lookup_per_channel_off_for_one_table_targets():
    proto = channel_proto("bn")
    model = load(proto)
    p = RewritePass([LowerLookup(reference_evaluator(model.opset_imports), per_channel=False)])
    p.produces_stage = Stage.LOWERED
    run_passes(model, [p])
    assert "quanta::QLinearLookup" not in model.graph.op_counts()
    assert "the group varies along an axis of x and this target takes one table per tensor" in [
        r.reason for r in p.why_not("LowerLookup")
    ]


def test_lookup_refuses_a_value_used_outside():
    proto = qdq_proto("silu")
    proto.graph.output.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, SHAPE))
    _refusal(proto, "'g' (output of 'sigmoid2' (Sigmoid)) is a graph output")


def test_lookup_refuses_a_non_elementwise_op():
    proto = qdq_proto("tanh")
    proto.graph.node[2].op_type = "Softmax"
    _refusal(proto, "'tanh2' (Softmax) is not an elementwise op a table can hold")


# -- the whole path: quantize_static, the file, the session ------------------------------


def conv_act_proto(kind: str, opset: int = 17):
    """Conv(3 -> 7) -> activation -> Conv(7 -> 5): the activation between two quantized convs."""
    rng = np.random.default_rng(1)
    mk = helper.make_node
    act, consts = activation(kind, "a", "b")
    nodes = [mk("Conv", ["x_in", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]), *act, mk("Conv", ["b", "w2"], ["y"])]
    inits = [
        c("w1", rng.standard_normal((7, 3, 3, 3)) * 0.4),
        c("b1", rng.standard_normal(7) * 0.3),
        c("w2", rng.standard_normal((5, 7, 1, 1)) * 0.4),
        *consts,
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [1, 3, 11, 13])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 11, 13])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(
    "kind,opset",
    [("silu", 17), ("mish", 17), ("hardswish_pair", 13), ("hardsigmoid", 17)],
)
def test_quantized_activation_is_one_table(tmp_path, kind, opset):
    ort = pytest.importorskip("onnxruntime")
    proto = conv_act_proto(kind, opset)
    src, out = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(proto, src)
    rng = np.random.default_rng(2)
    calib = [{"x_in": rng.standard_normal((1, 3, 11, 13)).astype(np.float32)} for _ in range(4)]
    summary = quanta.quantize_static(src, out, calib, verbose=False)
    # the coverage report counts every op of the group as integer (the table holds it)
    stayed = [(c.name, c.op, c.reasons) for c in summary.coverage.nodes if not c.integer_op]
    assert not stayed, stayed
    q = onnx.load(str(out))
    onnx.checker.check_model(q, full_check=True)
    # Q/DQ only around the group: nothing quantizes a gate's output
    produced = {o: n.op_type for n in q.graph.node for o in n.output}
    quantized_from = {produced.get(n.input[0]) for n in q.graph.node if n.op_type == "QuantizeLinear"}
    assert quantized_from <= {"Conv", "Mul", "HardSwish", "HardSigmoid", None}, quantized_from
    f = {"x_in": rng.standard_normal((1, 3, 11, 13)).astype(np.float32)}
    sess = ort.InferenceSession(str(out), ort_session_options(), providers=["CPUExecutionProvider"])
    ort_y = sess.run(None, f)[0]
    ref = InferenceSession(str(out), backend="reference")
    nat = InferenceSession(str(out))
    y_ref, y_nat = ref.run(None, f)[0], nat.run(None, f)[0]
    np.testing.assert_array_equal(y_ref, y_nat)
    # (the last Conv has a float output: ConvInteger -> AccumulatorToFloat, not the group)
    float_ops = {"Sigmoid", "Tanh", "Softplus", "HardSigmoid", "HardSwish", "Clip", "Div", "Mul"}
    ops = [s.op_type for s in nat.plan.steps]
    assert not float_ops & set(ops) and ops.count("AccumulatorToFloat") == 1, ops
    assert [s.kernel.name for s in nat.plan.steps if s.op_type == "QLinearLookup"] == [
        "native:qlinear_lookup_u8"
    ]
    # against ONNX Runtime running the QDQ file: a few output steps (the convolutions
    # round in different places, docs/passes.md), not a float island's drift
    y_scale = max(abs(float(np.max(np.abs(ort_y)))), 1e-6) / 127
    assert np.max(np.abs(ort_y - y_ref)) <= 4 * y_scale


@pytest.mark.parametrize(
    "kind,chain", [("silu", ["Sigmoid"]), ("mish", ["Tanh", "Softplus"]), ("hardswish_pair", ["HardSigmoid"])]
)
def test_gated_activation_is_recognised(kind, chain):
    from quanta.quantize.qdq import gated_activation

    model = load(conv_act_proto(kind))
    mul = next(n for n in model.graph.nodes if n.op_type == "Mul")
    found = gated_activation(mul, model.graph)
    assert found is not None
    xi, nodes = found
    assert mul.inputs[xi].name == "a" and [n.op_type for n in nodes] == chain


def test_gate_read_elsewhere_is_not_a_group():
    """Failure signature: the gate's float output, also a graph output, would vanish
    into the table. Its Mul is then an ordinary binary op (both inputs quantized)."""
    from quanta.quantize.qdq import gated_activation

    proto = conv_act_proto("silu")
    proto.graph.output.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 7, 11, 13]))
    model = load(proto)
    mul = next(n for n in model.graph.nodes if n.op_type == "Mul")
    assert gated_activation(mul, model.graph) is None


def test_lookup_refuses_per_axis_input():
    proto = qdq_proto("tanh")
    for t in proto.graph.initializer:
        if t.name == "sx":
            t.CopyFrom(c("sx", [0.043, 0.05, 0.06]))
        if t.name == "zx":
            t.CopyFrom(c("zx", [131, 120, 128], np.uint8))
    for n in proto.graph.node[:2]:
        n.attribute.append(helper.make_attribute("axis", 1))
    model = load(proto)
    rule = LowerLookup(reference_evaluator(model.opset_imports))
    p = RewritePass([rule])
    p.produces_stage = Stage.LOWERED
    run_passes(model, [p])
    reasons = [r.reason for r in p.why_not("LowerLookup")]
    assert any(
        r.startswith("input 'xq' (output of 'quantizelinear0' (QuantizeLinear)) is not a per-tensor u8/i8")
        for r in reasons
    ), reasons


@pytest.mark.parametrize("kind", ["silu", "mish", "hardswish_pair"])
def test_gated_activation_plan_reads_only_x(kind):
    """Failure signature: the Mul planned as an ordinary binary op, its gate's output then
    quantized too (or the Mul left float because the gate's value has no known type)."""
    from quanta.quantize.qdq import plan_qdq
    from quanta.quantize.recipe import Recipe

    model = load(conv_act_proto(kind))
    plan = plan_qdq(model.graph, Recipe())
    d = next(d for d in plan.decisions if d.node.op_type == "Mul")
    assert d.quantize, d.reason
    assert [(model.graph.value(k).name) for _, k in d.inputs] == ["a"]
    assert d.output == "b"
    gate_decisions = [
        x for x in plan.decisions if x.node.op_type in ("Sigmoid", "Tanh", "Softplus", "HardSigmoid")
    ]
    assert gate_decisions and all(
        not x.quantize and x.reason.startswith("inside the gated activation") for x in gate_decisions
    )


@pytest.mark.parametrize("opset", [13, 17])
def test_written_out_hardswish_stays_as_written(tmp_path, opset):
    """Paddle2ONNX's x·Clip(x+3, 0, 6)/6 is left as written by quantize_static (no
    HardSwish, no gated pair): quantizing its input, the Conv's pre-activation output,
    cost PP-OCRv4's detector 6.5 points of map IoU (docs/passes.md, "Tables"). The Conv
    before it still runs in integer (ConvInteger with a float output)."""
    proto = conv_act_proto("written", opset)
    src, out = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(proto, src)
    rng = np.random.default_rng(4)
    calib = [{"x_in": rng.standard_normal((1, 3, 11, 13)).astype(np.float32)} for _ in range(4)]
    summary = quanta.quantize_static(src, out, calib, verbose=False)
    q = onnx.load(str(out))
    ops = {n.op_type for n in q.graph.node}
    assert {"Clip", "Div"} <= ops and not {"HardSwish", "HardSigmoid"} & ops, ops
    assert summary.integer_share == 1.0
    nat = InferenceSession(str(out))
    assert "QLinearLookup" not in [s.op_type for s in nat.plan.steps]


def conv_bn_conv_proto(dtype=np.uint8):
    """ORT's layout: Conv -> Q -> DQ -> BatchNormalization (scale dequantized from int8, as
    ORT's quantizer writes it) -> Q -> DQ -> Conv, all 8-bit; 7 channels between."""
    rng = np.random.default_rng(21)
    mk = helper.make_node
    zx, z1, z2, z3 = (131, 120, 17, 140) if dtype == np.uint8 else (3, -8, -111, 12)

    def qdq(src, dst, s, z):
        return [
            mk("QuantizeLinear", [src, s, z], [dst + "_q"]),
            mk("DequantizeLinear", [dst + "_q", s, z], [dst]),
        ]

    nodes = [
        *qdq("x_in", "x", "sx", "zx"),
        mk("DequantizeLinear", ["w1q", "sw1", "zw1"], ["w1"]),
        mk("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        *qdq("c1", "a", "s1", "z1"),
        mk("DequantizeLinear", ["gq", "sg", "zg"], ["g"]),
        mk("BatchNormalization", ["a", "g", "b", "mean", "var"], ["bn"]),
        *qdq("bn", "h", "s2", "z2"),
        mk("DequantizeLinear", ["w2q", "sw2", "zw2"], ["w2"]),
        mk("Conv", ["h", "w2"], ["c2"]),
        *qdq("c2", "y", "s3", "z3"),
    ]
    inits = [
        c("sx", 0.031),
        c("zx", zx, dtype),
        c("w1q", rng.integers(-127, 128, (7, 3, 3, 3)), np.int8),
        c("sw1", 0.011),
        c("zw1", 0, np.int8),
        c("s1", 0.09),
        c("z1", z1, dtype),
        c("gq", rng.integers(-127, 128, 7), np.int8),
        c("sg", 0.017),
        c("zg", 0, np.int8),
        c("b", rng.uniform(-1, 1, 7)),
        c("mean", rng.uniform(-0.5, 0.5, 7)),
        c("var", rng.uniform(0.2, 3, 7)),
        c("s2", 0.043),
        c("z2", z2, dtype),
        c("w2q", rng.integers(-127, 128, (5, 7, 1, 1)), np.int8),
        c("sw2", 0.013),
        c("zw2", 0, np.int8),
        c("s3", 0.05),
        c("z3", z3, dtype),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [1, 3, 11, 13])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 11, 13])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_per_channel_table_between_convs_channels_last(dtype):
    """Failure signature: the table's axis left at 1 when ChannelsLast moves the tensor to
    NHWC (channels innermost: every element read through the wrong channel's row), or the
    dequantized BN scale taken for a second activation. The session (native: NHWC, the
    gather path; reference) gives the bytes of the unlowered QDQ graph."""
    proto = conv_bn_conv_proto(dtype)
    rng = np.random.default_rng(6)
    f = {"x_in": rng.uniform(-4, 4, (1, 3, 11, 13)).astype(np.float32)}
    expected = run_ref(proto, f)[0]
    for backend in ("reference", "native"):
        for threads in (1, 2):
            so = quanta.SessionOptions()
            so.intra_op_num_threads = threads
            sess = InferenceSession(proto.SerializeToString(), so, backend=backend)
            np.testing.assert_array_equal(expected, sess.run(None, f)[0], err_msg=f"{backend} t{threads}")
            steps = [s for s in sess.plan.steps if s.op_type == "QLinearLookup"]
            assert len(steps) == 1 and "BatchNormalization" not in [s.op_type for s in sess.plan.steps]
            if backend == "native":
                channels_last = any(s.node.attrs.get("channels_last") for s in sess.plan.steps)
                assert steps[0].node.attrs["axis"] == (3 if channels_last else 1)


def chain_proto(channels: int, *, also_output: bool = False):
    """ORT's quantizer on a BatchNormalization written as Sub / Mul / Add by [C, 1, 1]
    constants, then a HardSigmoid: a Q / DQ pair around every op, so four tables in a row,
    three per channel and one per tensor; the codes go uint8 -> int8 -> uint8 -> int8 ->
    uint8 with a scale and a zero point of their own at every step. ``also_output``: the
    Mul's quantized output is a graph output too."""
    rng = np.random.default_rng(channels)
    shape = [2, channels, 5, 11]
    mk = helper.make_node
    steps = [  # (op, constant, output scale, output zero point, output storage)
        ("Sub", rng.uniform(-0.8, 0.8, (channels, 1, 1)), 0.037, -9, np.int8),
        ("Mul", rng.uniform(0.4, 2.2, (channels, 1, 1)), 0.061, 140, np.uint8),
        ("Add", rng.uniform(-1.5, 1.5, (channels, 1, 1)), 0.049, 21, np.int8),
        ("HardSigmoid", None, 0.0041, 3, np.uint8),
    ]
    nodes = [
        mk("QuantizeLinear", ["x_in", "s0", "z0"], ["q0"]),
        mk("DequantizeLinear", ["q0", "s0", "z0"], ["d0"]),
    ]
    inits = [c("s0", 0.043), c("z0", 131, np.uint8)]
    for i, (op, const, s, z, storage) in enumerate(steps, start=1):
        if const is None:
            nodes.append(mk(op, [f"d{i - 1}"], [f"f{i}"], alpha=0.2, beta=0.5))
        else:
            nodes.append(mk(op, [f"d{i - 1}", f"k{i}"], [f"f{i}"]))
            inits.append(c(f"k{i}", const))
        nodes += [
            mk("QuantizeLinear", [f"f{i}", f"s{i}", f"z{i}"], [f"q{i}"]),
            mk("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"]),
        ]
        inits += [c(f"s{i}", s), c(f"z{i}", z, storage)]
    for i, n in enumerate(nodes):
        n.name = f"{n.op_type.lower()}{i}"
    outputs = [helper.make_tensor_value_info("d4", TensorProto.FLOAT, shape)]
    if also_output:
        outputs.append(helper.make_tensor_value_info("d2", TensorProto.FLOAT, shape))
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x_in", TensorProto.FLOAT, shape)], outputs, inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("channels", [3, 7, 17])
def test_tables_in_a_row_are_one_table_with_the_chains_bytes(channels):
    """Failure signature: the outer table indexed by the inner's code instead of its byte
    (int8 intermediates -128..-1), or a per-tensor table's row taken for one channel only;
    every channel's constants differ and the inputs pass both saturation ends."""
    proto = chain_proto(channels)
    shape = [2, channels, 5, 11]
    rng = np.random.default_rng(channels + 1)
    f = {"x_in": rng.uniform(-140 * 0.043, 140 * 0.043, size=shape).astype(np.float32)}
    expected = run_ref(proto, f)[0]
    for backend in ("reference", "native"):
        for threads in (1, 2):
            so = quanta.SessionOptions()
            so.intra_op_num_threads = threads
            sess = InferenceSession(proto.SerializeToString(), so, backend=backend)
            assert [s.op_type for s in sess.plan.steps].count("QLinearLookup") == 1, backend
            np.testing.assert_array_equal(expected, sess.run(None, f)[0], err_msg=f"{backend} t{threads}")


def test_a_table_read_elsewhere_is_not_composed():
    """The Mul's codes are a graph output: the chain composes around it, not through it."""
    proto = chain_proto(7, also_output=True)
    f = {"x_in": np.random.default_rng(2).uniform(-6, 6, size=(2, 7, 5, 11)).astype(np.float32)}
    expected = run_ref(proto, f)
    sess = InferenceSession(proto.SerializeToString(), backend="native")
    assert [s.op_type for s in sess.plan.steps].count("QLinearLookup") == 2
    for e, got in zip(expected, sess.run(None, f), strict=True):
        np.testing.assert_array_equal(e, got)


def test_composed_table_is_the_outer_table_on_the_inner_codes():
    """(T4) on the three layouts: per channel after per tensor, per tensor after per
    channel, per channel after per channel."""
    from quanta.kernels.reference.lookup import qlinear_lookup

    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (2, 3, 4)).astype(np.int8)
    per_tensor = rng.integers(-128, 128, 256).astype(np.int8)
    per_channel = rng.integers(0, 256, (3, 256)).astype(np.uint8)
    per_channel_s8 = rng.integers(-128, 128, (3, 256)).astype(np.int8)
    for inner, outer, inner_axis, outer_axis in [
        (per_tensor, per_channel, None, 1),
        (per_channel_s8, rng.integers(0, 256, 256).astype(np.uint8), 1, None),
        (per_channel_s8, per_channel, 1, 1),
    ]:
        two_steps = qlinear_lookup(qlinear_lookup(x, inner, inner_axis), outer, outer_axis)
        table = compose_tables(inner, outer)
        assert table.shape == (3, 256) and table.dtype == outer.dtype
        np.testing.assert_array_equal(two_steps, qlinear_lookup(x, table, 1))
    one_step = compose_tables(per_tensor, per_tensor)
    np.testing.assert_array_equal(
        qlinear_lookup(qlinear_lookup(x, per_tensor), per_tensor), qlinear_lookup(x, one_step)
    )
