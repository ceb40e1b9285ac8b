"""The QDQ groups ORT fuses into its u8·s8 integer operators, as its kernels without VNNI
compute them (docs/float-ops.md (QC1)-(QC4), (QM1)): a MatMul group becomes QLinearMatMul
and a Gemm group QGemm with ``saturating_pairs = 1``, a 1-D Conv group MlasQLinearConv.

Failure signature guarded against: a file ORT's quantizer wrote (pipecat's smart-turn
Whisper encoder) 42 output LSB from ORT's default session, its first Conv group 10,816
codes and its MatMul groups up to 2,876 codes apart from identical inputs, because quanta
summed these groups exactly and ORT's ``vpmaddubsw`` pairs saturate.

The host is a parameter (``onnxruntime_int8_saturates`` of an AVX2 CPU's flags and of a
VNNI one's): on the AVX2 host the rules fire, native and reference give the same codes,
those differ from the exact sum, and they are ORT's where this CPU saturates; on the VNNI
host nothing fires and the session keeps the exact sum (ORT's there).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta.quantize.ort_saturation as ort_saturation
from quanta.ir.onnx_io import load
from quanta.passes.rules.ort_float_functions import OrtFloatFunctions
from quanta.session import InferenceSession, SessionOptions
from tests.passes.helpers import run_passes

THIS_HOST_SATURATES = ort_saturation.onnxruntime_int8_saturates()


def heavy_int8(rng, shape):
    """int8 weights mostly at the extremes: pairs of products of large codes leave int16."""
    w = rng.integers(-128, 128, shape)
    return np.where(rng.random(shape) < 0.6, np.where(rng.random(shape) < 0.5, 127, -128), w).astype(np.int8)


def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def qdq_file(nodes, inits, x_shape, y_signed=False):
    """x -> Q(u8) -> DQ -> ``nodes`` (reading ``xd``, writing ``y``) -> Q(u8 or i8) -> DQ ->
    out, written as ORT's quantizer writes it (producer "onnx.quantize", which "auto" reads)."""
    inits = [
        *inits,
        const("sx", np.float32(0.031)),
        const("zx", np.uint8(23)),
        const("sy", np.float32(0.57)),
        const("zy", np.int8(-7) if y_signed else np.uint8(131)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        *nodes,
        helper.make_node("QuantizeLinear", ["y", "sy", "zy"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["out"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)], producer_name="onnx.quantize")
    model.ir_version = 9
    return model


def weight(rng, shape, axis, per_channel):
    """int8 weight codes, scales and zero points (per channel along ``axis``, zero points 0
    there as ORT's quantizer writes them; per tensor a non-zero one)."""
    wq = heavy_int8(rng, shape)
    n = shape[axis] if per_channel else 1
    sw = rng.uniform(0.0011, 0.0023, n).astype(np.float32)
    zw = np.zeros(n, np.int8) if per_channel else np.array([-3], np.int8)
    if not per_channel:
        sw, zw = sw.reshape(()), zw.reshape(())
    return wq, sw, zw


def matmul_file(k, n, per_channel, seed, batch=(2, 9), y_signed=False):
    rng = np.random.default_rng(seed)
    wq, sw, zw = weight(rng, (k, n), 1, per_channel)
    dq = helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=1)
    nodes = [dq, helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    inits = [const("wq", wq), const("sw", sw), const("zw", zw)]
    return qdq_file(nodes, inits, (*batch, k), y_signed), (*batch, k)


def weight_and_bias(rng, shape, per_channel):
    """DequantizeLinear of int8 weight codes (``weight``, output axis 0) and of an int32
    bias whose scales are 0.031 of the weight's, and their initializers."""
    wq, sw, zw = weight(rng, shape, 0, per_channel)
    sb = (np.float32(0.031) * sw).astype(np.float32)
    b = rng.integers(-3000, 3000, shape[0]).astype(np.int32)
    nodes = [
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=0),
        helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], axis=0),
    ]
    zb = np.zeros(sb.shape, np.int32)
    inits = [
        const("wq", wq),
        const("sw", sw),
        const("zw", zw),
        const("bq", b),
        const("sb", sb),
        const("zb", zb),
    ]
    return nodes, inits


def gemm_file(k, n, per_channel, seed, m=5):
    nodes, inits = weight_and_bias(np.random.default_rng(seed), (n, k), per_channel)
    nodes.append(helper.make_node("Gemm", ["xd", "wd", "bd"], ["y"], transB=1))
    return qdq_file(nodes, inits, (m, k)), (m, k)


def conv1d_file(c, f, k, stride, seed, length=37):
    nodes, inits = weight_and_bias(np.random.default_rng(seed), (f, c, k), True)
    pads = [k // 2, k // 2]
    nodes.append(
        helper.make_node("Conv", ["xd", "wd", "bd"], ["y"], kernel_shape=[k], strides=[stride], pads=pads)
    )
    return qdq_file(nodes, inits, (2, c, length)), (2, c, length)


CASES = {  # name: (file, x shape, the rule that writes the group, the native kernel's name)
    "matmul_per_channel": (
        *matmul_file(301, 17, True, 1),
        "QdqMatMulToSaturatingQLinearMatMul",
        "native:qlinear_matmul_u8s8_saturating",
    ),
    "matmul_per_tensor": (
        *matmul_file(259, 7, False, 2, batch=(3,)),
        "QdqMatMulToSaturatingQLinearMatMul",
        "native:qlinear_matmul_u8s8_saturating",
    ),
    "matmul_int8_y": (  # ORT fuses uint8 a with an int8 y too
        *matmul_file(67, 17, True, 9, batch=(1, 5), y_signed=True),
        "QdqMatMulToSaturatingQLinearMatMul",
        "native:qlinear_matmul_u8s8_saturating",
    ),
    "gemm_per_channel": (
        *gemm_file(517, 3, True, 3),
        "QdqGemmToSaturatingQGemm",
        "native:qgemm_u8s8_saturating",
    ),
    "gemm_per_tensor": (
        *gemm_file(33, 17, False, 4, m=1),
        "QdqGemmToSaturatingQGemm",
        "native:qgemm_u8s8_saturating",
    ),
    "conv1d_k3": (*conv1d_file(80, 7, 3, 1, 5), "QdqConvToMlasQLinearConv", "native:mlas_qconv"),
    "conv1d_stride2": (*conv1d_file(17, 3, 3, 2, 6), "QdqConvToMlasQLinearConv", "native:mlas_qconv"),
}


def feeds(shape, seed: int, n: int = 2):
    """Activations whose codes are large next to each other (uint8 pairs near 255)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(0, 2, shape).astype(np.float32)
        x[..., ::2] = np.abs(x[..., ::2]) * 4
        out.append({"x": x})
    return out


def ort_run(proto, feed):
    """ORT's default session (it fuses the groups), one thread."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feed
    )[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_auto_follows_the_hosts_onnxruntime(case, host):
    _, saturates = host
    proto, shape, rule, kernel = CASES[case]
    result = run_passes(load(proto), [OrtFloatFunctions(u8s8_saturates=saturates)])
    assert result.fired(rule) == (1 if saturates else 0)
    sessions = {
        b: InferenceSession(proto, SessionOptions(float_functions="auto"), backend=b)
        for b in ("native", "reference")
    }
    names = {s.kernel.name for s in sessions["native"].plan.steps}
    assert (kernel in names) == saturates, sorted(names)
    exact = InferenceSession(proto, SessionOptions(float_functions="onnx"), backend="reference")
    differ_exact = 0
    for feed in feeds(shape, seed=len(case)):
        got = {b: s.run(None, feed)[0] for b, s in sessions.items()}
        np.testing.assert_array_equal(got["native"], got["reference"])
        e = exact.run(None, feed)[0]
        if not saturates:
            np.testing.assert_array_equal(got["reference"], e)
        differ_exact += int(np.count_nonzero(got["reference"] != e))
        if saturates == THIS_HOST_SATURATES:  # the session's host is this one: ORT's codes
            np.testing.assert_array_equal(got["native"], ort_run(proto, feed))
    assert (differ_exact > 0) == saturates, "no pair saturated: the case cannot tell the sums apart"


def test_exact_operand_types_are_left_with_reasons():
    """uint8 weights (ORT's u8·u8 kernel widens to int16: exact) keep LowerMatMul's exact sum."""
    proto, _ = matmul_file(33, 5, False, 7)
    for name, to in (
        ("wq", lambda v: (v.astype(np.int16) + 128).astype(np.uint8)),
        ("zw", lambda v: np.uint8(125)),
    ):
        init = next(i for i in proto.graph.initializer if i.name == name)
        init.CopyFrom(numpy_helper.from_array(np.asarray(to(numpy_helper.to_array(init))), name))
    p = OrtFloatFunctions(u8s8_saturates=True)
    result = run_passes(load(proto), [p])
    assert result.fired("QdqMatMulToSaturatingQLinearMatMul") == 0
    assert [r.reason for r in p.why_not("QdqMatMulToSaturatingQLinearMatMul")] == [
        "b is u8, not int8 (ORT's u8·u8 kernel widens to int16: exact)"
    ]


def test_a_runtime_b_is_left_with_its_reason():
    """Attention's MatMul of two activations: ORT packs B per call, and quanta's saturating
    pairs are prepacked only (u8·s8 activations are rare there: ORT's quantizer writes
    uint8 activations, so such a product is u8·u8 and exact anyway)."""
    proto, _ = matmul_file(33, 5, True, 8)
    g = proto.graph
    wq = next(i for i in g.initializer if i.name == "wq")
    g.initializer.remove(wq)
    g.input.append(helper.make_tensor_value_info("wq", TensorProto.INT8, [33, 5]))
    p = OrtFloatFunctions(u8s8_saturates=True)
    run_passes(load(proto), [p])
    assert [r.reason for r in p.why_not("QdqMatMulToSaturatingQLinearMatMul")] == [
        "b is not a constant matrix (ORT prepacks only a constant 2-D b)"
    ]
