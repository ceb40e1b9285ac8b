"""The ``saturating_pairs`` rules of OrtFloatFunctions (docs/float-ops.md (QM1)): ORT's
dynamic-int8 ops with uint8 activations and int8 weights (MatMulInteger, com.microsoft
MatMulIntegerToFloat, DynamicQuantizeMatMul, DynamicQuantizeLSTM) as its u8·s8 kernels
compute them on x86 without VNNI, pairs of raw-code products in saturating int16.

The host is a parameter (``onnxruntime_int8_saturates(flags, machine)`` with an AVX2 CPU's
flags and a VNNI one's): with ``float_functions="ort"`` on the AVX2 host the nodes take the
attribute, native and reference give the same bits, and those are ORT's where this CPU
saturates; on the VNNI host nothing changes (ORT's VNNI kernels are exact, and so is
quanta's default sum), which is ORT's where this CPU has VNNI. ``"auto"`` keeps the exact
sum on either host.
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
from tests.ort_int8 import ort_functions_differ_from_exact
from tests.passes.helpers import run_passes

THIS_HOST_SATURATES = ort_saturation.onnxruntime_int8_saturates()
MS = "com.microsoft"


def ort_run(proto, feed):
    """ORT at one thread: with more, its DynamicQuantizeLSTM quantizes H in blocks of rows
    (reference/ms_lstm.py ``rows_per_block``), which the registered op does not."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def heavy_int8(rng, shape):
    """int8 weights mostly at the extremes: pairs of products of large codes leave int16."""
    w = rng.integers(-128, 128, shape)
    return np.where(rng.random(shape) < 0.6, np.where(rng.random(shape) < 0.5, 127, -128), w).astype(np.int8)


def dynamic_matmul_proto(k: int, n: int, seed: int):
    """ORT's quantize_dynamic form: DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul
    (the two scales' product) -> Add(bias)."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(heavy_int8(rng, (k, n)), "w"),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
        numpy_helper.from_array(np.array(0.004, np.float32), "ws"),
        numpy_helper.from_array(rng.normal(0, 0.1, n).astype(np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["s"]),
        helper.make_node("Mul", ["accf", "s"], ["p"]),
        helper.make_node("Add", ["p", "bias"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def contrib_matmul_proto(op: str, k: int, n: int, seed: int):
    """com.microsoft DynamicQuantizeMatMul(x: f32, w) or MatMulIntegerToFloat(xq: u8, w),
    per-column scales and zero-point-free int8 weights (ORT's symmetric default)."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(heavy_int8(rng, (k, n)), "w"),
        numpy_helper.from_array(rng.uniform(0.002, 0.005, n).astype(np.float32), "ws"),
        numpy_helper.from_array(rng.normal(0, 0.1, n).astype(np.float32), "bias"),
    ]
    if op == "DynamicQuantizeMatMul":
        node = helper.make_node(op, ["x", "w", "ws", "", "bias"], ["y"], domain=MS)
        x_type = TensorProto.FLOAT
    else:
        inits += [
            numpy_helper.from_array(np.array(0.03, np.float32), "xs"),
            numpy_helper.from_array(np.array(119, np.uint8), "xz"),
        ]
        node = helper.make_node(op, ["x", "w", "xs", "ws", "xz", "", "bias"], ["y"], domain=MS)
        x_type = TensorProto.UINT8
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", x_type, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)])


def dq_lstm_proto(n_in: int, hidden: int, direction: str, seed: int):
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    inits = [
        numpy_helper.from_array(heavy_int8(rng, (d, n_in, 4 * hidden)), "W"),
        numpy_helper.from_array(heavy_int8(rng, (d, hidden, 4 * hidden)), "R"),
        numpy_helper.from_array(rng.normal(0, 0.1, (d, 8 * hidden)).astype(np.float32), "B"),
        numpy_helper.from_array(rng.uniform(0.002, 0.004, (d, 4 * hidden)).astype(np.float32), "Ws"),
        numpy_helper.from_array(np.zeros((d, 4 * hidden), np.int8), "Wz"),
        numpy_helper.from_array(np.full(d, 0.02, np.float32), "Rs"),
        numpy_helper.from_array(np.zeros(d, np.int8), "Rz"),
    ]
    node = helper.make_node(
        "DynamicQuantizeLSTM",
        ["x", "W", "R", "B", "", "", "", "", "Ws", "Wz", "Rs", "Rz"],
        ["y", "yh", "yc"],
        domain=MS,
        hidden_size=hidden,
        direction=direction,
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, n_in])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in ("y", "yh", "yc")],
        initializer=inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)])


def feeds(shape, seed: int, n: int = 3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(0, 1, shape).astype(np.float32)
        x[..., ::2] = np.abs(x[..., ::2]) * 3  # large codes next to each other
        out.append({"x": x})
    return out


CASES = {  # name: (proto, feed shape, the op the rule marks)
    "matmul_integer": (dynamic_matmul_proto(301, 17, 1), (5, 301), "MatMulIntegerSaturatingPairs"),
    "matmul_integer_m1": (dynamic_matmul_proto(259, 7, 2), (1, 259), "MatMulIntegerSaturatingPairs"),
    "dynamic_quantize_matmul": (
        contrib_matmul_proto("DynamicQuantizeMatMul", 517, 3, 3),
        (6, 517),
        "DynamicQuantizeMatMulSaturatingPairs",
    ),
    "dq_lstm_bidirectional": (
        dq_lstm_proto(259, 7, "bidirectional", 4),
        (4, 3, 259),
        "DynamicQuantizeLstmSaturatingPairs",
    ),
    "dq_lstm_forward": (
        dq_lstm_proto(33, 17, "forward", 5),
        (6, 1, 33),
        "DynamicQuantizeLstmSaturatingPairs",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ort_functions_follow_the_hosts_onnxruntime(case, host):
    _, saturates = host
    proto, shape, rule = CASES[case]
    result = run_passes(load(proto), [OrtFloatFunctions(u8s8_saturates=saturates)])
    assert result.fired(rule) == (1 if saturates else 0)
    differ_exact = 0
    for feed in feeds(shape, seed=len(case)):
        outs = {
            b: InferenceSession(proto, SessionOptions(float_functions="ort"), backend=b).run(None, feed)
            for b in ("native", "reference")
        }
        exact = InferenceSession(proto, SessionOptions(float_functions="auto"), backend="reference").run(
            None, feed
        )
        for got_native, got_ref, e in zip(outs["native"], outs["reference"], exact, strict=True):
            np.testing.assert_array_equal(got_native, got_ref)
            if not saturates:
                np.testing.assert_array_equal(got_ref, e)
            differ_exact += int(np.count_nonzero(got_ref != e))
        if saturates == THIS_HOST_SATURATES:  # the session's host is this one: ORT's bits
            for got, e in zip(outs["native"], ort_run(proto, feed), strict=True):
                np.testing.assert_array_equal(got, e)
    assert (differ_exact > 0) == saturates


@pytest.mark.skipif(
    not THIS_HOST_SATURATES, reason="ONNX Runtime's u8·s8 kernels saturate only on x86 without VNNI"
)
def test_matmul_integer_to_float_is_onnxruntime_bit_for_bit():
    proto = contrib_matmul_proto("MatMulIntegerToFloat", 301, 17, 6)
    rng = np.random.default_rng(6)
    for _ in range(3):
        feed = {"x": rng.integers(150, 256, (7, 301)).astype(np.uint8)}
        expected = ort_run(proto, feed)[0]
        assert ort_functions_differ_from_exact(proto, feed, expected, exact_backend="native") > 0


def test_exact_type_pairs_are_left_with_reasons():
    """uint8 weights (ORT's u8·u8 kernel widens to int16) keep the exact sum."""
    proto = dynamic_matmul_proto(33, 5, 7)
    w = next(i for i in proto.graph.initializer if i.name == "w")
    w.CopyFrom(
        numpy_helper.from_array((numpy_helper.to_array(w).astype(np.int16) + 128).astype(np.uint8), "w")
    )
    z = next(i for i in proto.graph.initializer if i.name == "wz")
    z.CopyFrom(numpy_helper.from_array(np.array(128, np.uint8), "wz"))
    p = OrtFloatFunctions(u8s8_saturates=True)
    result = run_passes(load(proto), [p])
    assert result.fired("MatMulIntegerSaturatingPairs") == 0
    assert [r.reason for r in p.why_not("MatMulIntegerSaturatingPairs")] == [
        "no int8 weight (ORT's u8·u8 kernel widens to int16: exact)"
    ]
