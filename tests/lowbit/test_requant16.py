"""Elementwise groups on 16-bit codes lower to quanta::QLinearAffine16 / QLinearAdd16 /
QLinearMul16 (passes/lower/wide.py) and run on the native requant16 kernels.

Kernels: native == twin (reference/requant16.py) bit for bit, on both ISAs, over odd
shapes, channel counts 3 / 7 / 17 and zero points 32768 / 12345. Lowering: QDQ files
written here as ONNX Runtime's quantizer writes them with ``activation_type=QUInt16``
(a float op between 16-bit Q/DQ), each group lowers to one integer step, native equals
the reference target bit for bit, and both are within one output step of ONNX Runtime
running the float group (it fuses no 16-bit group).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels.reference.requant16 import affine16, affine16_params, binary16, binary16_params

F32 = np.float32
native = pytest.importorskip("quanta.kernels._native")
ISAS = [i for i in ("portable", "avx2", "avx512vnni") if i in native.supported_isas()]


@pytest.fixture(params=ISAS)
def isa(request):
    native.set_isa(request.param)
    yield request.param
    native.clear_isa()


def _codes(rng, shape, dt):
    info = np.iinfo(dt)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dt)


@pytest.mark.parametrize("xdt", [np.uint16, np.int16])
@pytest.mark.parametrize("ydt", [np.uint16, np.int16])
@pytest.mark.parametrize(
    ("shape", "axis"), [((2, 7, 5, 3), 1), ((1, 17, 9, 11), 1), ((3, 5, 7), -1), ((13,), None)]
)
def test_affine16_native_matches_twin(isa, xdt, ydt, shape, axis):
    rng = np.random.default_rng(len(shape) + 7 * (xdt is np.int16))
    x = _codes(rng, shape, xdt)
    c = 1 if axis is None else shape[axis]
    a = rng.uniform(-2.0, 2.0, c)
    b = rng.uniform(-3.0, 3.0, c)
    zx = np.array(12345 if xdt is np.uint16 else -1234, xdt)
    zy = np.array(32768 if ydt is np.uint16 else 17, ydt)
    m, bias, zxv, lo, hi = affine16_params(F32(0.0013), zx, F32(0.00071), zy, a, b, np.dtype(ydt), 0.0, 9.5)
    want = affine16(x, m, bias, zxv, lo, hi, np.dtype(ydt), axis)
    got = native.a16w8_affine16(
        x, zxv, m, bias, lo, hi, 0 if axis is None else axis, "u16" if ydt is np.uint16 else "i16"
    )
    assert got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()
    # the clip reaches some codes and not all: both branches of the clamp run
    assert lo > np.iinfo(ydt).min and (want == lo).any() and (want > lo).any()


@pytest.mark.parametrize("dt", [np.uint16, np.int16])
@pytest.mark.parametrize("kind", ["Add", "Mul"])
@pytest.mark.parametrize(
    ("sa", "sb"),
    [((2, 7, 5, 3), (2, 7, 5, 3)), ((1, 17, 9, 11), (1, 17, 1, 1)), ((3,), (7, 1)), ((5, 3), ())],
)
def test_binary16_native_matches_twin(isa, dt, kind, sa, sb):
    rng = np.random.default_rng(len(sa) * 11 + len(sb))
    a, b = _codes(rng, sa, dt), _codes(rng, sb, dt)
    za, zb, zy = (32768, 12345, 30001) if dt is np.uint16 else (-7, 1234, 3)
    scales = binary16_params(kind, F32(0.0021), F32(0.0007), F32(0.0009 if kind == "Add" else 1e-6))
    want = binary16(kind, a, za, b, zb, *scales, zy)
    got = native.a16w8_binary16(kind, a, za, b, zb, *scales, zy)
    assert got.shape == want.shape == np.broadcast_shapes(sa, sb)
    assert got.tobytes() == want.tobytes()
    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
    assert (want == lo).any() or (want == hi).any()  # saturation reached


@pytest.mark.parametrize("kind", ["Add", "Mul"])
def test_binary16_rounds_the_quotient_half_to_even_before_the_zero_point(isa, kind):
    """A quotient on a tie with an odd zero point: QuantizeLinear rounds 22661.5 to 22662,
    then adds 2443; rounding the sum 25104.5 would give 25104 (ppocr_cls's 16-bit file)."""
    f32 = F32
    a = np.array([41824, 28534 + 3, 28534 + 5], np.uint16)
    b = np.array([65535, 1, 3], np.uint16)
    scales = (float(f32(2.6171352e-4)), float(f32(9.155413e-5)), float(f32(9.2090265e-4)))
    if kind == "Add":  # quotients 3.5, 4.5, 1.5: every one a tie
        a = np.array([3, 3, 1], np.uint16)
        b = np.array([1, 3, 1], np.uint16)
        scales = (0.5, 0.25, 0.5)
    want = binary16(kind, a, 28534 if kind == "Mul" else 0, b, 0, *scales, 2443)
    got = native.a16w8_binary16(kind, a, 28534 if kind == "Mul" else 0, b, 0, *scales, 2443)
    assert got.tobytes() == want.tobytes()
    if kind == "Mul":
        assert int(want[0]) == 25105
    else:
        assert want.tolist() == [2443 + 4, 2443 + 4, 2443 + 2]  # the sums would give 2446, 2448, 2444


def test_affine16_rounds_half_to_even():
    x = np.array([10, 11, 12, 13], np.uint16)
    got = affine16(x, np.array([0.5]), np.array([0.0]), 10, 0.0, 65535.0, np.dtype(np.uint16))
    assert got.tolist() == [0, 0, 1, 2]  # 0, 0.5 -> 0, 1, 1.5 -> 2
    assert native.a16w8_affine16(
        x, 10, np.array([0.5]), np.array([0.0]), 0.0, 65535.0, 0, "u16"
    ).tolist() == [0, 0, 1, 2]


@pytest.mark.parametrize(
    ("xdt", "ydt"), [(np.uint16, np.uint16), (np.int16, np.uint16), (np.uint16, np.int16)]
)
def test_lut16_native_matches_twin(xdt, ydt):
    from quanta.kernels.reference.lookup import qlinear_lookup

    rng = np.random.default_rng(17)
    x = _codes(rng, (3, 7, 17), xdt)
    table = _codes(rng, (65536,), ydt)
    got = native.a16w8_lut16(x, table)
    want = qlinear_lookup(x, table)
    assert got.dtype == want.dtype == np.dtype(ydt)
    assert got.tobytes() == want.tobytes()


# -- lowering -------------------------------------------------------------------------------

SHAPE = [1, 7, 5, 3]


def _model(kind: str, zx: int = 32768):
    """x -> Q(u16) -> DQ -> op -> Q(u16) -> DQ -> out; two-activation ops take a second input."""
    rng = np.random.default_rng(3)
    inits, nodes, inputs = [], [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)]

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def qdq(src, name, scale, zp):
        nodes.append(
            helper.make_node(
                "QuantizeLinear",
                [src, const(f"{name}_s", F32(scale)), const(f"{name}_z", np.uint16(zp))],
                [f"{name}_q"],
            )
        )
        nodes.append(
            helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_d"])
        )
        return f"{name}_d"

    xd = qdq("x", "x", 6.0 / 65535, zx)
    c = SHAPE[1]
    if kind == "bn":
        args = [
            const("g", rng.uniform(0.5, 2, c).astype(F32)),
            const("beta", rng.uniform(-1, 1, c).astype(F32)),
        ]
        args += [
            const("mean", rng.uniform(-1, 1, c).astype(F32)),
            const("var", rng.uniform(0.2, 2, c).astype(F32)),
        ]
        nodes.append(helper.make_node("BatchNormalization", [xd, *args], ["y"], epsilon=1e-5))
        sy, zy = 20.0 / 65535, 12345
    elif kind == "add_channel":  # a quantized per-channel constant, as the file's conv biases
        kq = rng.integers(0, 65536, (1, c, 1, 1)).astype(np.uint16)
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [const("kq", kq), const("ks", F32(1e-4)), const("kz", np.uint16(40000))],
                ["k"],
            )
        )
        nodes.append(helper.make_node("Add", [xd, "k"], ["y"]))
        sy, zy = 12.0 / 65535, 33000
    elif kind == "add3":  # HardSwish's x + 3, clipped to [0, 6] by the output's range
        nodes.append(helper.make_node("Add", [xd, const("three", F32(3.0))], ["y"]))
        sy, zy = 6.0 / 65535, 0
    elif kind == "div6":
        nodes.append(helper.make_node("Div", [xd, const("six", F32(6.0))], ["y"]))
        sy, zy = 1.0 / 65535, 32768
    elif kind == "hardsigmoid":
        nodes.append(helper.make_node("HardSigmoid", [xd], ["y"], alpha=0.2, beta=0.5))
        sy, zy = 0.8 / 65535, 0
    elif kind == "relu":
        nodes.append(helper.make_node("Relu", [xd], ["y"]))
        sy, zy = 3.0 / 65535, 7
    elif kind == "relu_same":  # y's step is x's: every code maps to an integer, no rounding
        nodes.append(helper.make_node("Relu", [xd], ["y"]))
        sy, zy = 6.0 / 65535, 7
    elif kind == "add3_ort":  # ppocr_cls's 16-bit file (ORT's quantizer): x + DQ(Q(3))
        xd = qdq("x", "x2", 2.6171352e-4, 28534)
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [const("tq", np.uint16(65535)), const("ts", F32(4.5777066e-05)), const("tz", np.uint16(0))],
                ["three"],
            )
        )
        nodes.append(helper.make_node("Add", [xd, "three"], ["y"]))
        sy, zy = 9.155413e-05, 0
    else:  # mul, mul_se, residual: a second activation
        shape2 = [1, c, 1, 1] if kind == "mul_se" else SHAPE
        inputs.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, shape2))
        x2 = qdq("x2", "x2", 2.0 / 65535, 12345)
        nodes.append(helper.make_node("Add" if kind == "residual" else "Mul", [xd, x2], ["y"]))
        sy, zy = (7.0 / 65535, 30000) if kind == "residual" else (4.0 / 65535, 32768)
    yd = qdq("y", "y", sy, zy)
    nodes.append(helper.make_node("Identity", [yd], ["out"]))
    graph = helper.make_graph(
        nodes, kind, inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString(), sy


# per-channel affine groups become the affine map; a per-tensor one becomes the map where
# it gives the float group's code for all 65536 codes, else a 65536-entry table (the float
# group bit for bit: x + 3 at a 6/65535 step is x - 0.5 exactly, a tie on every code; ORT's
# x + DQ(Q(3)) parts on 35 codes); two activations become the binary ops (float32 steps)
KINDS = {
    "bn": "QLinearAffine16",
    "add_channel": "QLinearAffine16",
    "add3": "QLinearLookup",
    "add3_ort": "QLinearLookup",
    "div6": ("QLinearAffine16", "QLinearLookup"),
    "hardsigmoid": ("QLinearAffine16", "QLinearLookup"),
    "relu": ("QLinearAffine16", "QLinearLookup"),
    "relu_same": "QLinearAffine16",
    "mul": "QLinearMul16",
    "mul_se": "QLinearMul16",
    "residual": "QLinearAdd16",
}
PER_CHANNEL = {"bn", "add_channel"}


def _feeds():
    rng = np.random.default_rng(11)
    return {
        "x": rng.uniform(-2.9, 2.9, SHAPE).astype(F32),
        "x2": rng.uniform(-1.0, 1.0, SHAPE).astype(F32),
        "x2_se": rng.uniform(-1.0, 1.0, [1, SHAPE[1], 1, 1]).astype(F32),
    }


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("zx", [32768, 12345])
def test_sixteen_bit_group_lowers_to_one_integer_step_within_one_step_of_ort(kind, zx):
    blob, sy = _model(kind, zx)
    feeds = _feeds()
    feed = {"x": feeds["x"]}
    if kind in ("mul", "residual"):
        feed["x2"] = feeds["x2"]
    elif kind == "mul_se":
        feed["x2"] = feeds["x2_se"]
    sess = quanta.InferenceSession(blob)
    ops = [s.node.op_type for s in sess.plan.steps]
    want = KINDS[kind] if isinstance(KINDS[kind], tuple) else (KINDS[kind],)
    (chosen,) = set(want) & set(ops)
    assert not {"BatchNormalization", "Add", "Mul", "Div", "HardSigmoid", "Relu"} & set(ops), ops
    (step,) = [s for s in sess.plan.steps if s.node.op_type == chosen]
    assert step.kernel.impl == "native", step.kernel.name
    if chosen == "QLinearLookup":
        assert step.kernel.name == "native:qlinear_lookup16_u16"
    y = sess.run(None, feed)[0]
    ref = quanta.InferenceSession(blob, backend="reference").run(None, feed)[0]
    assert y.tobytes() == ref.tobytes()
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.max(np.abs(o - y)) <= sy * 1.0001
    if kind not in PER_CHANNEL:  # the table, a map equal to it, the float32 steps: ORT's codes
        assert o.tobytes() == y.tobytes()


def test_affine_map_on_ties_would_part_from_the_float_group_on_half_the_codes():
    """Why the exact check sends x + 3 to the table: the affine map of the same group,
    forced, rounds x - 0.5 half to even where ONNX Runtime's float32 group rounds by its
    own error, so about half the codes are one apart (all within one step)."""
    import quanta.passes.lower.wide as wide

    blob, sy = _model("add3")
    x = ((np.arange(105) * 613 % 65536) - 32768).astype(F32).reshape(SHAPE) * F32(6.0 / 65535)
    saved = wide.EXACT_CHECK
    wide.EXACT_CHECK = False
    try:
        sess = quanta.InferenceSession(blob)
    finally:
        wide.EXACT_CHECK = saved
    assert "QLinearAffine16" in [s.node.op_type for s in sess.plan.steps]
    y = sess.run(None, {"x": x})[0]
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    codes_apart = np.rint(np.abs(o.astype(np.float64) - y) / sy)
    assert codes_apart.max() == 1
    assert 0.2 < (codes_apart == 1).mean() < 0.8


def test_per_channel_constant_broadcasting_a_single_channel_runs_on_the_twin():
    """x [1, 1, 5, 3] plus a [1, 7, 1, 1] constant: the output has 7 channels, x one, so
    the native kernel (x's own channels) hands the step to the twin, which broadcasts."""
    blob, sy = _model("add_channel")
    import onnx

    m = onnx.load_from_string(blob)
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 1
    blob = m.SerializeToString()
    x = np.random.default_rng(2).uniform(-2.9, 2.9, [1, 1, 5, 3]).astype(F32)
    y = quanta.InferenceSession(blob).run(None, {"x": x})[0]
    assert y.shape == (1, 7, 5, 3)
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.max(np.abs(o - y)) <= sy * 1.0001
