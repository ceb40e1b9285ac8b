"""A group of ops on one tensor's 16-bit codes becomes one 65536-entry table
(passes/lower/lookup.py ComposeCodeMaps16, docs/passes.md (T6)), and the 16-bit steps run
from native programs (their specialized calls are recordable).

The models are written as ONNX Runtime's quantizer writes a 16-bit QDQ file
(``activation_type=QUInt16`` / ``QInt16``): a Conv, a BatchNormalization and HardSwish's
``x + 3``, ``x · (x + 3)``, ``/ 6``, each between Q / DQ pairs. The composed session must
give the bytes of the same session with the rule refused (the unfused steps, native and
reference), on every ISA, at 1 and 2 threads; the feed covers every code of the group's
input once, so every table entry is compared.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
import quanta.passes.lower.lookup as lookup_pass
from quanta.passes.pattern import NoMatch

F32 = np.float32
native = pytest.importorskip("quanta.kernels._native")
ISAS = [i for i in ("portable", "avx2", "avx512vnni") if i in native.supported_isas()]


@pytest.fixture(params=ISAS)
def isa(request):
    native.set_isa(request.param)
    yield request.param
    native.clear_isa()


def _model(
    dt, shape, *, conv: bool, leak: bool = False, two_inputs: bool = False, no_div: bool = False
) -> bytes:
    """x -> Q/DQ [-> Conv 3x3 (uint8 weight, per-channel scales) -> Q/DQ -> BN -> Q/DQ]
    -> HardSwish written out (Add 3, Mul, Div 6, each -> Q/DQ) -> out. ``leak``: x + 3 is
    also a graph output; ``two_inputs``: the Mul reads a second input instead of x;
    ``no_div``: the group ends at the Mul (x · (x + 3))."""
    unsigned = dt is np.uint16
    rng = np.random.default_rng(5)
    c = shape[1]
    inits, nodes = [], []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def qdq(src, name, scale, zp):
        z = const(f"{name}_z", dt(zp))
        nodes.append(
            helper.make_node("QuantizeLinear", [src, const(f"{name}_s", F32(scale)), z], [f"{name}_q"])
        )
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", z], [f"{name}_d"]))
        return f"{name}_d"

    # distinct scales, non-zero zero points (centred for the signed type)
    zx, zb, za, zm, zy = (
        (30001, 33333, 1234, 4321, 20000) if unsigned else (-1234, 777, -32000, -30000, -9000)
    )
    h = qdq("x", "x", 7.0 / 65535, zx)
    if conv:
        w = rng.integers(0, 256, (c, c, 3, 3)).astype(np.uint8)
        ws = rng.uniform(0.002, 0.006, c).astype(F32)
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [const("w", w), const("ws", ws), const("wz", rng.integers(100, 156, c).astype(np.uint8))],
                ["wd"],
                axis=0,
            )
        )
        nodes.append(helper.make_node("Conv", [h, "wd"], ["conv"], pads=[1, 1, 1, 1]))
        h = qdq("conv", "conv", 9.0 / 65535, zx + 11)
        args = [const(n, rng.uniform(lo, hi, c).astype(F32)) for n, lo, hi in
                (("g", 0.5, 2), ("beta", -1, 1), ("mean", -1, 1), ("var", 0.2, 2))]  # fmt: skip
        nodes.append(helper.make_node("BatchNormalization", [h, *args], ["bn"], epsilon=1e-5))
        h = qdq("bn", "bn", 8.0 / 65535, zb)
    second = h
    if two_inputs:
        inputs.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, list(shape)))
        second = qdq("x2", "x2", 5.0 / 65535, zx - 7)
    nodes.append(helper.make_node("Add", [h, const("three", F32(3.0))], ["add"]))
    a = qdq("add", "add", 6.2 / 65535, za)
    if leak:
        nodes.append(helper.make_node("Identity", [a], ["add_out"]))
        outputs.append(helper.make_tensor_value_info("add_out", TensorProto.FLOAT, None))
    nodes.append(helper.make_node("Mul", [second, a], ["mul"]))
    m = qdq("mul", "mul", 21.0 / 65535, zm)
    y = m
    if not no_div:
        nodes.append(helper.make_node("Div", [m, const("six", F32(6.0))], ["div"]))
        y = qdq("div", "div", 3.3 / 65535, zy)
    nodes.append(helper.make_node("Identity", [y], ["out"]))
    graph = helper.make_graph(nodes, "hardswish16", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def _unfused(monkeypatch):
    monkeypatch.setattr(
        lookup_pass.ComposeCodeMaps16, "check", lambda self, m: NoMatch("refused by the test")
    )


def _every_code(dt, shape, scale=7.0 / 65535):
    """A feed whose codes at x's quantization are every code of dt once (65536 elements),
    shuffled, plus values beyond both ends (saturation)."""
    info = np.iinfo(dt)
    zx = 30001 if dt is np.uint16 else -1234
    codes = np.random.default_rng(1).permutation(np.arange(info.min, info.max + 1, dtype=np.int64))
    x = ((codes - zx) * np.float64(scale)).astype(F32)
    x[:3] = [-1e4, 1e4, 0.0]
    return x.reshape(shape)


def _steps(sess):
    return [s.node.op_type for s in sess.plan.steps]


@pytest.mark.parametrize("dt", [np.uint16, np.int16])
def test_every_code_through_the_table_is_the_unfused_steps(isa, dt, monkeypatch):
    shape = (1, 16, 64, 64)
    blob = _model(dt, shape, conv=False)
    x = {"x": _every_code(dt, shape)}
    sess = quanta.InferenceSession(blob)
    assert _steps(sess).count("QLinearLookup") == 1
    assert not {"QLinearMul16", "QLinearAffine16"} & set(_steps(sess)), _steps(sess)
    (step,) = [s for s in sess.plan.steps if s.node.op_type == "QLinearLookup"]
    assert step.kernel.name == f"native:qlinear_lookup16_{'u16' if dt is np.uint16 else 's16'}"
    got = sess.run(None, x)[0]
    _unfused(monkeypatch)
    plain = quanta.InferenceSession(blob)
    assert {"QLinearMul16", "QLinearAffine16"} <= set(_steps(plain))
    ref = quanta.InferenceSession(blob, backend="reference")
    assert "QLinearMul16" in _steps(ref)
    want, twin = plain.run(None, x)[0], ref.run(None, x)[0]
    assert got.tobytes() == want.tobytes() == twin.tobytes()
    assert len(np.unique(got)) > 1000  # the group is not flat over the codes


@pytest.mark.parametrize("dt", [np.uint16, np.int16])
def test_a_group_ending_in_a_product_of_codes_is_composed(isa, dt, monkeypatch):
    """x · (x + 3) with no Div after it: the root is QLinearMul16 (each alternative of the
    rule's pattern names its domain), one table, the unfused bytes on every code."""
    shape = (1, 16, 64, 64)
    blob = _model(dt, shape, conv=False, no_div=True)
    x = {"x": _every_code(dt, shape)}
    sess = quanta.InferenceSession(blob)
    assert _steps(sess).count("QLinearLookup") == 1 and "QLinearMul16" not in _steps(sess), _steps(sess)
    got = sess.run(None, x)[0]
    _unfused(monkeypatch)
    plain = quanta.InferenceSession(blob)
    assert "QLinearMul16" in _steps(plain)
    assert got.tobytes() == plain.run(None, x)[0].tobytes()


@pytest.mark.parametrize("dt", [np.uint16, np.int16])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 7, 5, 9), (2, 17, 13, 3), (1, 3, 33, 41)])
def test_conv_bn_hardswish_composed_and_recorded_gives_the_unfused_bytes(
    isa, dt, threads, shape, monkeypatch
):
    blob = _model(dt, shape, conv=True)
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(blob, opts)
    ops = _steps(sess)
    assert ops.count("QLinearLookup") == 1 and "QLinearMul16" not in ops, ops
    assert ops.count("QLinearAffine16") == 1  # the BatchNormalization: a map per channel
    loop = quanta.InferenceSession(blob, opts)
    loop.executor.native_programs = False
    _unfused(monkeypatch)
    plain = quanta.InferenceSession(blob, opts)
    ref = quanta.InferenceSession(blob, backend="reference")
    rng = np.random.default_rng(threads)
    for _ in range(3):
        x = {"x": rng.uniform(-3.0, 4.5, shape).astype(F32)}
        x["x"].flat[:2] = [-50.0, 50.0]  # both ends of x's codes
        got = sess.run(None, x)[0]
        assert got.tobytes() == loop.run(None, x)[0].tobytes()
        assert got.tobytes() == plain.run(None, x)[0].tobytes() == ref.run(None, x)[0].tobytes()
    (bound,) = sess.executor.bound_runs().values()
    # the Q of the feed (small: staged into the bound signature's buffer), the conv, the
    # BN map and the table run from a program; the DQ into the graph output stays in the
    # Python loop
    assert bound.program_steps == (4, 5)


def test_unfused_steps_are_recorded_too():
    """The affine maps and the product of two codes are recordable on their own (a group
    the rule refuses: the Mul reads a second input)."""
    shape = (1, 7, 5, 9)
    blob = _model(np.uint16, shape, conv=True, two_inputs=True)
    sess = quanta.InferenceSession(blob)
    ops = _steps(sess)
    assert "QLinearMul16" in ops and "QLinearLookup" not in ops, ops
    loop = quanta.InferenceSession(blob)
    loop.executor.native_programs = False
    rng = np.random.default_rng(3)
    x = {"x": rng.uniform(-3, 4, shape).astype(F32), "x2": rng.uniform(-2, 2, shape).astype(F32)}
    for _ in range(2):
        assert sess.run(None, x)[0].tobytes() == loop.run(None, x)[0].tobytes()
    (bound,) = sess.executor.bound_runs().values()
    # the two Qs of the (staged) feeds, conv, BN, x + 3, the product, / 6; the DQ stays
    assert bound.program_steps == (7, 8)


def test_a_group_value_read_outside_the_group_is_not_composed():
    """x + 3 is also a graph output: it stays a step, and the product reads it and x (two
    tensors), so nothing composes; the bytes are the reference's."""
    shape = (1, 7, 5, 9)
    blob = _model(np.uint16, shape, conv=False, leak=True)
    sess = quanta.InferenceSession(blob)
    ops = _steps(sess)
    assert "QLinearMul16" in ops and "QLinearLookup" not in ops, ops
    x = {"x": np.random.default_rng(0).uniform(-4, 4, shape).astype(F32)}
    ref = quanta.InferenceSession(blob, backend="reference")
    for a, b in zip(sess.run(None, x), ref.run(None, x), strict=True):
        assert a.tobytes() == b.tobytes()


def test_maps_each_alone_stay_affine_maps():
    """The product reads a second input: no group of two ops on one tensor's codes, and
    a single map stays the affine pass (cheaper than a gather from a 128 KiB table)."""
    blob = _model(np.uint16, (1, 7, 5, 9), conv=True, two_inputs=True)
    assert _steps(quanta.InferenceSession(blob)).count("QLinearAffine16") == 3  # BN, x + 3, / 6


@pytest.mark.parametrize("threads", [1, 2])
def test_matmul16_steps_run_from_a_program_with_the_bytes_of_the_loop(isa, threads):
    """x [3, 7, 17] -> MatMul by a uint8 [17, 13] (per-column scales, zero points 100-155)
    -> MatMul by an int8 [13, 7], each between int16 Q / DQ: both products recorded."""
    rng = np.random.default_rng(9)
    inits = []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    nodes = []

    def qdq(src, name, scale, zp):
        z = const(f"{name}_z", np.int16(zp))
        nodes.append(
            helper.make_node("QuantizeLinear", [src, const(f"{name}_s", F32(scale)), z], [f"{name}_q"])
        )
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", z], [f"{name}_d"]))
        return f"{name}_d"

    h = qdq("x", "x", 5.0 / 32767, -321)
    w1 = [const("w1", rng.integers(0, 256, (17, 13)).astype(np.uint8))]
    w1 += [const("w1s", rng.uniform(0.002, 0.01, 13).astype(F32))]
    w1 += [const("w1z", rng.integers(100, 156, 13).astype(np.uint8))]
    nodes.append(helper.make_node("DequantizeLinear", w1, ["w1d"], axis=1))
    nodes.append(helper.make_node("MatMul", [h, "w1d"], ["m1"]))
    h = qdq("m1", "m1", 40.0 / 32767, 77)
    w2 = [const("w2", rng.integers(-128, 128, (13, 7)).astype(np.int8)), const("w2s", F32(0.013))]
    nodes.append(helper.make_node("DequantizeLinear", w2, ["w2d"]))
    nodes.append(helper.make_node("MatMul", [h, "w2d"], ["m2"]))
    y = qdq("m2", "m2", 30.0 / 32767, -5)
    nodes.append(helper.make_node("Identity", [y], ["out"]))
    graph = helper.make_graph(
        nodes,
        "mm16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    blob = model.SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess, loop = quanta.InferenceSession(blob, opts), quanta.InferenceSession(blob, opts)
    loop.executor.native_programs = False
    ref = quanta.InferenceSession(blob, backend="reference")
    assert _steps(sess).count("QLinearMatMul16") == 2
    for _ in range(3):
        x = {"x": rng.uniform(-6, 6, (3, 7, 17)).astype(F32)}
        got = sess.run(None, x)[0]
        assert got.tobytes() == loop.run(None, x)[0].tobytes() == ref.run(None, x)[0].tobytes()
    (bound,) = sess.executor.bound_runs().values()
    assert bound.program_steps == (3, 4)  # the staged feed's Q and the two products; the DQ stays
