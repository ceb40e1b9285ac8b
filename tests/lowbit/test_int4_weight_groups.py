"""4-bit weights with one scale per tensor or per channel (ONNX Runtime's
``quantize_static(weight_type=QInt4 | QUInt4)``) run on the 8-bit integer kernels:
WidenFourBitWeight (passes/lower/w4.py, docs/quantization-math.md eq. (W10)) writes each
as int8 codes ``q - z`` with zero point 0, and the 8-bit rules lower the groups.

Every group here: u8 activations with non-zero zero points, distinct scales, channel
counts 3 / 7 / 17, reductions over 258; int4 and uint4, per tensor and per channel (axis 0
and axis 1), with and without bias, depthwise; ai.onnx DequantizeLinear-21 and the
com.microsoft op ORT writes at earlier opsets."""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.cli.bench import reference_steps
from quanta.ir.onnx_io import load
from quanta.kernels.reference.quantize import dequantize_linear
from quanta.passes.lower.w4 import WidenFourBitWeightsPass
from quanta.runtime.coverage import lowered_coverage
from tests.passes.helpers import run_passes

F32 = np.float32
MS = "com.microsoft"


@dataclass
class Group:
    """One ``Q(op(DQ(x), DQ(w), b?))`` group: ``op`` over a u8 input of ``x_shape`` and a
    4-bit weight of ``codes`` (``signed``: int4, else uint4), per channel along ``axis``
    (None: per tensor) with zero points ``zw``; ``out``: a u8 output step, or None for a
    float product (no QuantizeLinear after the op)."""

    op: str
    x_shape: tuple[int, ...]
    codes: np.ndarray
    sw: np.ndarray
    zw: np.ndarray
    signed: bool
    axis: int | None
    attrs: dict = field(default_factory=dict)
    bias: bool = False
    out: bool = True
    contrib: bool = False


def _model(g: Group, seed: int = 0) -> tuple[onnx.ModelProto, float]:
    """The group as ORT writes it; returns the model and the output step (sy)."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    dom = MS if g.contrib else ""
    w4 = TensorProto.INT4 if g.signed else TensorProto.UINT4

    def const(name, arr, dtype=None):
        arr = np.asarray(arr)
        if dtype is None:
            inits.append(numpy_helper.from_array(arr, name))
        else:
            inits.append(helper.make_tensor(name, dtype, list(arr.shape), arr.ravel().tolist()))
        return name

    sx, zx = F32(4.7 / 255), np.uint8(131)
    sy, zy = F32(rng.uniform(0.05, 0.2)), np.uint8(117)
    axis = {} if g.axis is None else {"axis": g.axis}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", const("sx", sx), const("zx", zx)], ["xq"], domain=dom),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], domain=dom),
        helper.make_node(
            "DequantizeLinear",
            [const("wq", g.codes, w4), const("sw", g.sw), const("zw", g.zw, w4)],
            ["wd"],
            domain=dom,
            **axis,
        ),
    ]
    ins = ["xd", "wd"]
    if g.bias:
        n_out = g.sw.size if g.sw.size > 1 else (g.codes.shape[0] if g.op == "Conv" else g.codes.shape[-1])
        sb = (sx * np.broadcast_to(g.sw, (n_out,))).astype(F32)
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [
                    const("bq", rng.integers(-2000, 2000, n_out).astype(np.int32)),
                    const("sb", sb),
                    const("zb", np.zeros(n_out, np.int32)),
                ],
                ["bd"],
                domain=dom,
                axis=0,
            )
        )
        ins.append("bd")
    last = "y" if not g.out else "c"
    nodes.append(helper.make_node(g.op, ins, [last], **g.attrs))
    if g.out:
        nodes += [
            helper.make_node("QuantizeLinear", ["c", const("sy", sy), const("zy", zy)], ["yq"], domain=dom),
            helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"], domain=dom),
        ]
    graph = helper.make_graph(
        nodes,
        "int4_group",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(g.x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 17 if g.contrib else 21)]
    if g.contrib:
        opsets.append(helper.make_opsetid(MS, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model, float(sy)


def _weights(rng, shape, signed, per_channel_at, *, zero_points=True):
    """Codes over the whole 4-bit range, a scale per channel (or one), zero points."""
    lo, hi = (-8, 8) if signed else (0, 16)
    codes = rng.integers(lo, hi, shape)
    n = 1 if per_channel_at is None else shape[per_channel_at]
    sw = rng.uniform(0.01, 0.05, n).astype(F32)
    if not zero_points:
        zw = np.zeros(n, np.int64)
    else:
        zw = rng.integers(-3, 4, n) if signed else rng.integers(4, 12, n)
    if per_channel_at is None:
        return codes, sw.reshape(()), zw.reshape(())
    return codes, sw, zw


def _groups() -> dict[str, Group]:
    rng = np.random.default_rng(21)
    conv = {"pads": [1, 1, 1, 1], "kernel_shape": [4, 4]}
    out: dict[str, Group] = {}
    # Conv: K = 17 * 4 * 4 = 272
    c, s, z = _weights(rng, (7, 17, 4, 4), True, 0)
    out["conv_int4_per_channel_bias"] = Group("Conv", (1, 17, 9, 8), c, s, z, True, 0, conv, bias=True)
    c, s, z = _weights(rng, (3, 17, 4, 4), False, None)
    out["conv_uint4_per_tensor"] = Group("Conv", (2, 17, 7, 6), c, s, z, False, None, conv)
    c, s, z = _weights(rng, (17, 1, 3, 3), False, 0)
    dw = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3], "group": 17}
    out["depthwise_uint4_per_channel_bias"] = Group("Conv", (1, 17, 9, 8), c, s, z, False, 0, dw, bias=True)
    # Gemm: K = 263; transB=1 has its channels on axis 0, transB=0 on axis 1
    c, s, z = _weights(rng, (17, 263), True, 0)
    out["gemm_int4_transB_bias"] = Group("Gemm", (3, 263), c, s, z, True, 0, {"transB": 1}, bias=True)
    c, s, z = _weights(rng, (263, 7), False, 1)
    out["gemm_uint4_axis1"] = Group("Gemm", (3, 263), c, s, z, False, 1)
    # MatMul: K = 300, channels on axis 1
    c, s, z = _weights(rng, (300, 17), False, 1)
    out["matmul_uint4_axis1"] = Group("MatMul", (2, 3, 300), c, s, z, False, 1)
    c, s, z = _weights(rng, (300, 7), True, None)
    out["matmul_int4_per_tensor"] = Group("MatMul", (5, 300), c, s, z, True, None)
    c, s, z = _weights(rng, (300, 3), False, 1)
    out["matmul_uint4_float_output"] = Group("MatMul", (5, 300), c, s, z, False, 1, out=False)
    # ORT's file at opset 17: every Q / DQ com.microsoft
    c, s, z = _weights(rng, (7, 17, 4, 4), False, 0)
    out["contrib_conv_uint4_bias"] = Group(
        "Conv", (1, 17, 9, 8), c, s, z, False, 0, conv, bias=True, contrib=True
    )
    c, s, z = _weights(rng, (17, 263), True, 0, zero_points=False)
    out["contrib_gemm_int4_bias"] = Group(
        "Gemm", (3, 263), c, s, z, True, 0, {"transB": 1}, bias=True, contrib=True
    )
    return out


GROUPS = _groups()
INTEGER_OP = {"Conv": "QLinearConv", "Gemm": "QGemm", "MatMul": "QLinearMatMul"}


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_int4_group_runs_integer_bit_exact_with_the_reference_and_within_a_step_of_ort(name):
    g = GROUPS[name]
    model, step = _model(g)
    blob = model.SerializeToString()
    report = lowered_coverage(load(model))
    assert report.integer_share == 1.0, report.format()
    want = INTEGER_OP[g.op] if g.out else "MatMulIntegerToFloat"
    assert [n.integer_op for n in report.nodes] == [want]

    rng = np.random.default_rng(5)
    feed = {"x": rng.uniform(-2.3, 2.3, g.x_shape).astype(F32)}
    sess = quanta.InferenceSession(blob)
    assert not reference_steps(sess.plan)
    y = sess.run(None, feed)[0]
    golden = quanta.InferenceSession(blob, backend="reference").run(None, feed)[0]
    assert np.array_equal(y, golden)

    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    if g.out:
        assert np.max(np.abs(o - y)) <= step * 1.0001
        assert len(np.unique(y)) > 10  # the output range is used
    else:
        # float product: exact int32 sums scaled once against ORT's float32 sums
        np.testing.assert_allclose(y, o, rtol=0, atol=2e-5 * float(np.max(np.abs(o))))


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_widened_weight_dequantizes_to_the_same_bits(signed, axis):
    """Eq. (W10) on every code against the extreme zero points: ``q - z`` reaches ±15."""
    lo, hi = (-8, 8) if signed else (0, 16)
    codes = np.add.outer(np.arange(16), np.arange(16)) % 16 + lo  # every code in every row and column
    rng = np.random.default_rng(1)
    n = 1 if axis is None else codes.shape[axis]
    zw = np.resize(np.array([lo, hi - 1, 0 if signed else 8, 3]), n)
    sw = rng.uniform(0.01, 0.3, n).astype(F32)
    if axis is None:
        sw, zw = sw.reshape(()), zw.reshape(())
    # (per row, axis 0, no MatMul lowers: the pass alone runs here)
    g = Group("MatMul", (2, 16), codes, sw, zw, signed, axis, out=False)
    model = load(_model(g)[0])
    dtype = ml_dtypes.int4 if signed else ml_dtypes.uint4
    want = dequantize_linear(codes.astype(dtype), sw, zw.astype(dtype), axis=axis)
    result = run_passes(model, [WidenFourBitWeightsPass()])
    assert result.fired("WidenFourBitWeight") == 1
    (dq,) = [n for n in model.graph.nodes if n.op_type == "DequantizeLinear" and n.input(0).is_const]
    wide, zero = np.asarray(dq.input(0).const), np.asarray(dq.input(2).const)
    assert wide.dtype == np.int8 and not zero.any() and zero.dtype == np.int8
    assert dq.domain == "" and int(np.abs(wide.astype(np.int64)).max()) == 15
    got = dequantize_linear(wide, np.asarray(dq.input(1).const), zero, axis=axis)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("storage", [TensorProto.INT4, TensorProto.INT8], ids=["int4", "int8"])
def test_weight_per_block_along_n_stays_float_and_says_why(storage):
    """ORT's BlockSize with per_channel on a MatMul: scales [K, N / B] (a block of
    columns per row of K) have no single scale per output column; the group stays float
    with the reason (an int8 one lowered to QLinearMatMul and failed to compile)."""
    rng = np.random.default_rng(4)
    k, n, block = 288, 17, 8
    bits4 = storage == TensorProto.INT4
    codes = rng.integers(-8, 8, (k, n)) if bits4 else rng.integers(-127, 128, (k, n))
    sw = rng.uniform(0.01, 0.05, (k, -(-n // block))).astype(F32)
    inits = [
        helper.make_tensor("wq", storage, [k, n], codes.ravel().tolist()),
        numpy_helper.from_array(sw, "sw"),
        numpy_helper.from_array(F32(0.02), "sx"),
        numpy_helper.from_array(np.uint8(100), "zx"),
        numpy_helper.from_array(F32(0.3), "sy"),
        numpy_helper.from_array(np.uint8(120), "zy"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "sw"], ["wd"], axis=1, block_size=block),
        helper.make_node("MatMul", ["xd", "wd"], ["c"], name="mm"),
        helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "blocked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    report = lowered_coverage(load(model))
    (node,) = report.nodes
    assert node.integer_op is None
    assert any("quantized per block of 8 along axis 1" in r for r in node.reasons), node.reasons
    blob = model.SerializeToString()
    feed = {"x": rng.uniform(-2, 2, (3, k)).astype(F32)}
    y = quanta.InferenceSession(blob).run(None, feed)[0]
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.max(np.abs(o - y)) <= 0.3 * 1.0001


def _small_cnn() -> onnx.ModelProto:
    """A float CNN built by code: Conv 3->17 (bias), depthwise 17 (bias), Relu, Conv 17->7
    (no bias), Flatten, Gemm 7*6*5=210 -> 33 (bias), MatMul 33 -> 19 (channels on axis 1)."""
    rng = np.random.default_rng(8)

    def init(name, shape, scale):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(F32), name)

    inits = [
        init("w1", (17, 3, 3, 3), 0.3),
        init("b1", (17,), 0.1),
        init("w2", (17, 1, 3, 3), 0.3),
        init("b2", (17,), 0.1),
        init("w3", (7, 17, 1, 1), 0.3),
        init("w4", (33, 210), 0.1),
        init("b4", (33,), 0.1),
        init("w5", (33, 19), 0.2),
    ]
    p1 = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="c1", **p1),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="dw", group=17, **p1),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], name="c3", kernel_shape=[1, 1]),
        helper.make_node("Flatten", ["c3"], ["f"]),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["g"], name="fc", transB=1),
        helper.make_node("MatMul", ["g", "w5"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 19])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
@pytest.mark.parametrize("weight_type", ["QInt4", "QUInt4"])
def test_ort_quantizer_int4_file_runs_integer(tmp_path, weight_type, per_channel):
    """ONNX Runtime's own int4 / uint4 QDQ file (opset 17: every Q / DQ com.microsoft)."""
    oq = pytest.importorskip("onnxruntime.quantization")
    ort = pytest.importorskip("onnxruntime")
    src, dst = tmp_path / "cnn.onnx", tmp_path / "cnn_int4.onnx"
    onnx.save(_small_cnn(), src)
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 6, 5)).astype(F32)} for _ in range(6)]

    class Reader(oq.CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    oq.quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=oq.QuantFormat.QDQ,
        weight_type=getattr(oq.QuantType, weight_type),
        activation_type=oq.QuantType.QUInt8,
        per_channel=per_channel,
    )
    model = onnx.load(dst)
    storage = {TensorProto.INT4: "QInt4", TensorProto.UINT4: "QUInt4"}
    assert {storage.get(t.data_type) for t in model.graph.initializer} >= {weight_type}
    report = lowered_coverage(load(model))
    assert report.integer_share == 1.0, report.format()
    assert len(report.nodes) == 5
    blob = model.SerializeToString()
    feed = {"x": np.random.default_rng(9).normal(0, 1, (1, 3, 6, 5)).astype(F32)}
    sess = quanta.InferenceSession(blob)
    assert not reference_steps(sess.plan)
    y = sess.run(None, feed)[0]
    assert np.array_equal(y, quanta.InferenceSession(blob, backend="reference").run(None, feed)[0])
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    last = next(n for n in model.graph.node if n.output[0] == "y")
    step = float(numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == last.input[1])))
    assert np.max(np.abs(o - y)) <= step * 1.0001
