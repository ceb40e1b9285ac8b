"""QdqConvToMlasQLinearConv and quanta::MlasQLinearConv (reference/mlas_qconv.py): the Conv
groups ONNX Runtime fuses into QLinearConv, as its u8·s8 kernels without VNNI compute them
(pairs of raw-code products saturate to int16). The twin equals ORT's QLinearConv on odd
geometries where the exact sum does not; a QDQ file's codes with ``float_functions="ort"``
are ORT's (native and reference), with ``"auto"`` (quanta's exact integer Conv) they are
not; groups ORT does not fuse, depthwise groups and uint8 weights are left with reasons."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.kernels.reference.mlas_qconv import mlas_qlinear_conv, mlas_qlinear_conv_op
from quanta.passes.rules.ort_float_functions import OrtFloatFunctions
from quanta.quantize.ort_saturation import onnxruntime_int8_saturates
from tests.ort_int8 import ort_functions_differ_from_exact
from tests.passes.helpers import run_passes

needs_saturating_cpu = pytest.mark.skipif(
    not onnxruntime_int8_saturates(), reason="ONNX Runtime's u8·s8 kernels saturate only on x86 without VNNI"
)

GEOMETRIES = [  # C, F, kernel, stride, pad
    (3, 8, 3, 2, 1),
    (7, 9, 3, 1, 0),
    (17, 7, 1, 1, 0),
    (5, 6, 5, 2, 2),
    (1, 3, 7, 2, 3),
]


def heavy_weights(rng, shape):
    """int8 weights mostly at ±120: pairs of products of large codes leave int16."""
    w = rng.integers(-127, 128, shape)
    big = rng.random(shape) < 0.7
    return np.where(big, np.where(rng.random(shape) < 0.5, 120, -120), w).astype(np.int8)


def ort_run(proto, f):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, f
    )


@needs_saturating_cpu
@pytest.mark.parametrize("c, f, k, s, p", GEOMETRIES)
@pytest.mark.parametrize("per_channel", [False, True])
def test_twin_is_onnxruntime_qlinear_conv_bit_for_bit(c, f, k, s, p, per_channel):
    rng = np.random.default_rng(c * 31 + f)
    x = rng.integers(120, 256, (2, c, 11, 13)).astype(np.uint8)
    w = heavy_weights(rng, (f, c, k, k))
    sx, zx = np.array(0.02, np.float32), np.array(137, np.uint8)
    sw = (rng.uniform(0.001, 0.004, f) if per_channel else np.array(0.003)).astype(np.float32)
    zw = np.zeros(f, np.int8) if per_channel else np.array(-5, np.int8)  # per channel: symmetric
    sy, zy = np.array(0.9, np.float32), np.array(100, np.uint8)
    b = rng.integers(-1000, 1000, f).astype(np.int32)
    values = dict(sx=sx, zx=zx, w=w, sw=sw, zw=zw, sy=sy, zy=zy, b=b)
    node = helper.make_node(
        "QLinearConv", ["x", *values], ["y"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        initializer=[numpy_helper.from_array(v, n) for n, v in values.items()],
    )
    expected = ort_run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), {"x": x})[0]
    got = mlas_qlinear_conv(x, sx, zx, w, sw, zw, sy, zy, b, strides=[s, s], pads=[p] * 4)
    np.testing.assert_array_equal(got, expected)


def qdq_conv_proto(c: int, f: int, k: int, s: int, p: int, act: int, per_channel: bool, seed: int):
    """x -> Q -> DQ -> Conv(DQ(Q(w)), DQ(b)) -> Q -> DQ -> Mul -> y: the form ORT's quantizer writes
    (weights as Q of float constants); ``act`` uint8 or int8 (S8ToU8 makes the lone pairs uint8)."""
    rng = np.random.default_rng(seed)
    w = heavy_weights(rng, (f, c, k, k)).astype(np.float32)
    sw = (rng.uniform(0.001, 0.004, f) if per_channel else np.array([0.003])).astype(np.float32)
    wf = w * sw.reshape(-1, 1, 1, 1)
    t = np.uint8 if act == TensorProto.UINT8 else np.int8
    zx = np.array(137 if t == np.uint8 else -9, t)
    zy = np.array(100 if t == np.uint8 else -28, t)
    sx = np.float32(0.02)
    bias_codes = rng.integers(-1000, 1000, f).astype(np.int32)
    sb = (sx * sw).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.array(sx, np.float32), "sx"),
        numpy_helper.from_array(zx, "zx"),
        numpy_helper.from_array(wf, "wf"),
        numpy_helper.from_array(sw if per_channel else sw.reshape(()), "sw"),
        numpy_helper.from_array(np.zeros(f, np.int8) if per_channel else np.array(0, np.int8), "zw"),
        numpy_helper.from_array(bias_codes, "bq"),
        numpy_helper.from_array(sb if per_channel else sb.reshape(()), "sb"),
        numpy_helper.from_array(np.zeros(f, np.int32) if per_channel else np.array(0, np.int32), "zb"),
        numpy_helper.from_array(np.array(0.9, np.float32), "sy"),
        numpy_helper.from_array(zy, "zy"),
        numpy_helper.from_array(np.array(1.5, np.float32), "k"),
    ]
    axis = {"axis": 0} if per_channel else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("QuantizeLinear", ["wf", "sw", "zw"], ["wq"], **axis),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], **axis),
        helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], **axis),
        helper.make_node(
            "Conv", ["xd", "wd", "bd"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4
        ),
        helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["yd"]),
        # a float op reads the codes' DequantizeLinear (not a graph output): ORT's
        # QDQS8ToU8Transformer then makes an int8 pair uint8 and fuses the group
        helper.make_node("Mul", ["yd", "k"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 11, 13])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.producer_name = "onnx.quantize"
    return m


def qdq_feed(c: int, seed: int):
    rng = np.random.default_rng(seed)
    return {"x": rng.uniform(-0.2, 2.4, (1, c, 11, 13)).astype(np.float32)}


@needs_saturating_cpu
@pytest.mark.parametrize("c, f, k, s, p", GEOMETRIES[:4])
@pytest.mark.parametrize("act", [TensorProto.UINT8, TensorProto.INT8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_fused_conv_group_codes_are_onnxruntime_with_ort_functions(c, f, k, s, p, act, per_channel):
    proto = qdq_conv_proto(c, f, k, s, p, act, per_channel, seed=c + k)
    model = load(proto)
    result = run_passes(model, [OrtFloatFunctions(threads=2, u8s8_saturates=True)])
    assert result.fired("QdqConvToMlasQLinearConv") == 1
    differ_exact = 0
    for seed in range(3):
        feed = qdq_feed(c, seed)
        expected = ort_run(proto, feed)[0]
        differ_exact += ort_functions_differ_from_exact(proto, feed, expected, exact_backend="reference")
    assert differ_exact > 0  # quanta's exact sum is not ORT's here


def test_groups_the_rule_leaves_say_why():
    proto = qdq_conv_proto(4, 4, 3, 1, 1, TensorProto.UINT8, False, seed=1)
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    conv.attribute.append(helper.make_attribute("group", 4))
    w = next(i for i in proto.graph.initializer if i.name == "wf")
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w)[:, :1].copy(), "wf"))
    model = load(proto)
    p = OrtFloatFunctions(u8s8_saturates=True)
    run_passes(model, [p])
    assert [r.reason for r in p.why_not("QdqConvToMlasQLinearConv")] == [
        "a depthwise Conv: ORT's depthwise kernel is exact (quanta's own path)"
    ]


@needs_saturating_cpu
@pytest.mark.parametrize("c, f, k, g", [(8, 6, 3, 2), (12, 8, 1, 4), (20, 10, 3, 10)])
def test_grouped_twin_is_onnxruntime_qlinear_conv_bit_for_bit(c, f, k, g):
    """A grouped (not depthwise) QLinearConv is one saturating GEMM per group."""
    rng = np.random.default_rng(c + g)
    x = rng.integers(150, 256, (1, c, 11, 13)).astype(np.uint8)
    w = heavy_weights(rng, (f, c // g, k, k))
    values = dict(
        sx=np.array(0.02, np.float32),
        zx=np.array(137, np.uint8),
        w=w,
        sw=np.array(0.003, np.float32),
        zw=np.array(0, np.int8),
        sy=np.array(0.9, np.float32),
        zy=np.array(100, np.uint8),
        b=rng.integers(-1000, 1000, f).astype(np.int32),
    )
    node = helper.make_node(
        "QLinearConv", ["x", *values], ["y"], kernel_shape=[k, k], pads=[k // 2] * 4, group=g
    )
    gr = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        initializer=[numpy_helper.from_array(v, n) for n, v in values.items()],
    )
    expected = ort_run(helper.make_model(gr, opset_imports=[helper.make_opsetid("", 13)]), {"x": x})[0]
    got = mlas_qlinear_conv_op(None, x, *values.values(), pads=[k // 2] * 4, group=g)
    np.testing.assert_array_equal(got, expected)


def test_rule_runs_only_where_onnxruntime_saturates():
    model = load(qdq_conv_proto(3, 8, 3, 2, 1, TensorProto.UINT8, False, seed=2))
    result = run_passes(model, [OrtFloatFunctions(threads=2)])
    assert result.fired("QdqConvToMlasQLinearConv") == 0


@pytest.mark.parametrize("saturates", [True, False])
def test_auto_on_onnxruntimes_file_follows_the_hosts_sum(saturates, monkeypatch):
    """ "auto" on a file ORT's quantizer wrote: where ORT's u8·s8 kernels saturate, the fused
    Conv group is MlasQLinearConv on the native kernel (ORT's codes where this host is such
    a host); on a VNNI host (exact: ORT's sum is quanta's) it stays quanta's integer Conv."""
    import quanta.quantize.ort_saturation as ort_saturation
    from quanta.session import InferenceSession, SessionOptions

    monkeypatch.setattr(ort_saturation, "onnxruntime_int8_saturates", lambda *a, **k: saturates)
    proto = qdq_conv_proto(7, 9, 3, 1, 0, TensorProto.UINT8, True, seed=4)
    so = SessionOptions(enable_profiling=True)
    so.intra_op_num_threads = 2
    sess = InferenceSession(proto, so)
    exact = InferenceSession(proto, SessionOptions(float_functions="onnx"), backend="reference")
    differ = 0
    for seed in range(3):
        feed = qdq_feed(7, seed)
        got = sess.run(None, feed)[0]
        differ += int(np.count_nonzero(got != exact.run(None, feed)[0]))
        if saturates and onnxruntime_int8_saturates():
            np.testing.assert_array_equal(got, ort_run(proto, feed)[0])
    kernels = {(st.op_type, st.kernel) for st in sess.profile_summary(top=1000).steps}
    assert (("MlasQLinearConv", "native:mlas_qconv") in kernels) == saturates
    assert (differ > 0) == saturates


def int8_chain_proto(seed: int):
    """x -> 1x1 Conv 3 -> 7 -> depthwise 3x3 Conv (7 groups) -> 1x1 Conv 7 -> 5 -> Mul, every
    tensor int8 Q -> DQ (a lone pair each, as ORT's MinMax file of yunet), per-tensor weights
    with zero point 0, odd 13 x 11 planes: ORT's QDQS8ToU8Transformer makes every pair uint8
    and fuses all three groups."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "s0"),
        numpy_helper.from_array(np.int8(-9), "z0"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
        helper.make_node("DequantizeLinear", ["q0", "s0", "z0"], ["d0"]),
    ]
    prev, sx = "d0", 0.02
    for i, (c, f, k, g) in enumerate([(3, 7, 1, 1), (7, 7, 3, 7), (7, 5, 1, 1)], start=1):
        w = heavy_weights(rng, (f, c // g, k, k)).astype(np.float32) * np.float32(0.003)
        sy, zy = np.float32(0.05 + 0.03 * i), np.int8(-20 + 7 * i)
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.float32(0.003), f"sw{i}"),
            numpy_helper.from_array(np.int8(0), f"zw{i}"),
            numpy_helper.from_array(rng.integers(-500, 500, f).astype(np.int32), f"b{i}"),
            numpy_helper.from_array(np.float32(sx * 0.003), f"sb{i}"),
            numpy_helper.from_array(np.int32(0), f"zb{i}"),
            numpy_helper.from_array(sy, f"s{i}"),
            numpy_helper.from_array(zy, f"z{i}"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", [f"w{i}", f"sw{i}", f"zw{i}"], [f"wq{i}"]),
            helper.make_node("DequantizeLinear", [f"wq{i}", f"sw{i}", f"zw{i}"], [f"wd{i}"]),
            helper.make_node("DequantizeLinear", [f"b{i}", f"sb{i}", f"zb{i}"], [f"bd{i}"]),
            helper.make_node(
                "Conv", [prev, f"wd{i}", f"bd{i}"], [f"c{i}"], name=f"conv{i}", group=g, pads=[k // 2] * 4
            ),
            helper.make_node("QuantizeLinear", [f"c{i}", f"s{i}", f"z{i}"], [f"q{i}"]),
            helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"]),
        ]
        prev, sx = f"d{i}", float(sy)
    inits.append(numpy_helper.from_array(np.array(1.5, np.float32), "k"))
    nodes.append(helper.make_node("Mul", [prev, "k"], ["y"]))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 13, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.producer_name = "onnx.quantize"
    return m


def test_a_depthwise_group_between_fused_groups_is_fused_as_onnxruntime_does(tmp_path):
    """The depthwise group's int8 pairs are lone in the file as written, so ORT makes them
    uint8 and fuses it (its optimized graph has three QLinearConvs); the rule decides the
    same whether or not its neighbours were rewritten to MlasQLinearConv first: no group is
    left to float MlasConv, and the depthwise one stays quanta's integer Conv."""
    proto = int8_chain_proto(3)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    import onnx

    fused = [n.op_type for n in onnx.load(str(tmp_path / "ort.onnx")).graph.node if "Conv" in n.op_type]
    assert fused == ["QLinearConv"] * 3
    model = load(proto)
    p = OrtFloatFunctions(threads=1, u8s8_saturates=True)
    result = run_passes(model, [p])
    assert result.fired("QdqConvToMlasQLinearConv") == 2
    assert result.fired("ConvToMlasConv") == 0
    assert [r.reason for r in p.why_not("QdqConvToMlasQLinearConv")] == [
        "a depthwise Conv: ORT's depthwise kernel is exact (quanta's own path)"
    ]
    if onnxruntime_int8_saturates():  # then the codes are ORT's
        from quanta.session import InferenceSession

        sess = InferenceSession(proto)
        for seed in range(2):
            feed = {"x": np.random.default_rng(seed).uniform(-0.2, 2.4, (1, 3, 13, 11)).astype(np.float32)}
            np.testing.assert_array_equal(sess.run(None, feed)[0], ort_run(proto, feed)[0])
