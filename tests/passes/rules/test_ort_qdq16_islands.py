"""The float islands ONNX Runtime keeps in a 16-bit QDQ file (passes/rules/ort_float_functions.py):
``DQ -> BatchNormalization -> Q`` whose scale is itself ``Q(const) -> DQ`` (BatchNormToOrtAffine),
and ``DQ -> GlobalAveragePool -> Q`` (GlobalAveragePoolToMlasPool). With ``float_functions="ort"``
quanta's codes are ORT's bit for bit (native and reference); the twin of MLAS's global pooling
equals ORT's float GlobalAveragePool on odd shapes; ONNX's exact map differs somewhere, so the
tests can tell the two apart."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.kernels.reference.ort_float import mlas_global_average_rows
from quanta.passes.rules.ort_float_functions import OrtFloatFunctions
from quanta.session import InferenceSession, SessionOptions
from tests.passes.helpers import run_passes

U16, I16 = TensorProto.UINT16, TensorProto.INT16


def ort_run(proto, f, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = level
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, f
    )


def quanta_run(proto, f, ff: str, backend: str):
    so = SessionOptions(float_functions=ff)
    return InferenceSession(proto, so, backend=backend).run(None, f)


def _np(elem: int):
    return np.uint16 if elem == U16 else np.int16


def island_proto(op: str, c: int, elem: int, zx: int, zy: int, sx: float, sy: float, seed: int):
    """y = Q(op(DQ(xq))) on 16-bit codes [2, c, 9, 13]; BatchNormalization's scale is
    ``DQ(Q(scale))`` of 16-bit codes, as ORT's quantizer writes it."""
    rng = np.random.default_rng(seed)
    t = _np(elem)
    inits = [
        numpy_helper.from_array(np.array(sx, np.float32), "sx"),
        numpy_helper.from_array(np.array(zx, t), "zx"),
        numpy_helper.from_array(np.array(sy, np.float32), "sy"),
        numpy_helper.from_array(np.array(zy, t), "zy"),
    ]
    nodes = [helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"], name="dq")]
    if op == "BatchNormalization":
        scale = rng.uniform(0.3, 1.7, c).astype(np.float32)
        ss = np.float32(np.abs(scale).max() / 30000)
        inits += [
            numpy_helper.from_array(scale, "scale"),
            numpy_helper.from_array(np.array(ss, np.float32), "ss"),
            numpy_helper.from_array(np.array(0, np.uint16), "zs"),
            numpy_helper.from_array(rng.normal(0, 0.5, c).astype(np.float32), "b"),
            numpy_helper.from_array(rng.normal(0, 0.5, c).astype(np.float32), "mean"),
            numpy_helper.from_array(rng.uniform(0.2, 3.0, c).astype(np.float32), "var"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", ["scale", "ss", "zs"], ["scale_q"], name="q_scale"),
            helper.make_node("DequantizeLinear", ["scale_q", "ss", "zs"], ["scale_dq"], name="dq_scale"),
            helper.make_node(
                "BatchNormalization", ["x", "scale_dq", "b", "mean", "var"], ["f"], name="bn", epsilon=1e-5
            ),
        ]
    else:
        nodes.append(helper.make_node("GlobalAveragePool", ["x"], ["f"], name="gap"))
    nodes.append(helper.make_node("QuantizeLinear", ["f", "sy", "zy"], ["y"], name="q"))
    shape = [2, c, 9, 13]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("xq", elem, shape)],
        [helper.make_tensor_value_info("y", elem, None)],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.producer_name = "onnx.quantize"
    return m


def island_feed(c: int, elem: int, seed: int):
    info = np.iinfo(_np(elem))
    rng = np.random.default_rng(seed)
    return {"xq": rng.integers(info.min, info.max, [2, c, 9, 13], endpoint=True).astype(_np(elem))}


CASES = [  # channels, codes, zx, zy, sx, sy
    (3, U16, 33065, 28534, 1.3166631e-4, 2.6171352e-4),
    (7, U16, 1, 65000, 3.1e-5, 1.7e-5),
    (17, I16, -123, 77, 2.3e-4, 4.1e-4),
]


@pytest.mark.parametrize("op", ["BatchNormalization", "GlobalAveragePool"])
@pytest.mark.parametrize("c, elem, zx, zy, sx, sy", CASES)
def test_16bit_island_codes_are_onnxruntime_bit_for_bit(op, c, elem, zx, zy, sx, sy):
    proto = island_proto(op, c, elem, zx, zy, sx, sy, seed=c)
    model = load(proto)
    result = run_passes(model, [OrtFloatFunctions(threads=1)])
    rule = "BatchNormToOrtAffine" if op == "BatchNormalization" else "GlobalAveragePoolToMlasPool"
    assert result.fired(rule) == 1
    for seed in range(4):
        f = island_feed(c, elem, 100 * c + seed)
        expected = ort_run(proto, f)[0]
        for backend in ("native", "reference"):
            np.testing.assert_array_equal(quanta_run(proto, f, "ort", backend)[0], expected)


def test_16bit_islands_exact_map_differs_from_onnxruntime():
    """ONNX's exact value rounded once (float_functions="onnx") is not ORT's float32 order on
    these islands: the tests above could not pass with it."""
    differ = {"BatchNormalization": 0, "GlobalAveragePool": 0}
    # a pool gives one code per channel: many channels, a fine output step
    many = [(301, U16, 30000, 100, 1e-4, 1e-5)]
    for op in differ:
        for c, elem, zx, zy, sx, sy in CASES if op == "BatchNormalization" else many:
            proto = island_proto(op, c, elem, zx, zy, sx, sy, seed=c)
            for seed in range(4):
                f = island_feed(c, elem, 100 * c + seed)
                got = quanta_run(proto, f, "onnx", "reference")[0]
                differ[op] += int(np.count_nonzero(got != ort_run(proto, f)[0]))
    assert all(n > 0 for n in differ.values()), differ


@pytest.mark.parametrize(
    "shape",
    [
        (1, 8, 24, 96),
        (2, 7, 5, 3),
        (1, 17, 13, 11),
        (1, 3, 1, 1),
        (1, 3, 1, 3),
        (1, 5, 9),
        (3, 88, 3, 24),
        (1, 4, 2, 3, 5),
    ],
)
def test_mlas_global_average_twin_is_onnxruntime_float_pool(shape):
    """(GP1)-(GP3) against ORT's float GlobalAveragePool as written (MlasPool; the NCHWc
    transformer leaves a pool of a DequantizeLinear alone), values over 10 decades."""
    g = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-11, 11, shape))).astype(np.float32)
    expected = ort_run(proto, {"x": x}, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)[0]
    rows = x.reshape(shape[0] * shape[1], -1)
    np.testing.assert_array_equal(mlas_global_average_rows(rows).reshape(expected.shape), expected)
    exact = rows.astype(np.float64).mean(axis=1).astype(np.float32).reshape(expected.shape)
    if rows.shape[1] >= 15:  # enough terms for the order to show
        assert np.any(exact != expected)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "shape", [(1, 8, 24, 96), (2, 7, 5, 3), (1, 17, 13, 11), (1, 3, 1, 1), (1, 5, 9), (3, 88, 3, 24)]
)
def test_mlas_global_average_native_equals_twin_and_onnxruntime(shape, threads):
    """Failure signature: a native row kernel that sums in another order (one accumulator,
    eight lanes, a pairwise tree, FMA contraction) or lets a lane of −0 stay −0: last-bit
    differences in the squeeze-excite means and written-out norms ORT's files feed into
    QuantizeLinear. The C++ kernel equals the twin bit for bit and both equal ORT's pool,
    values over 10 decades with a band of −0, at 1 and 2 kernel threads."""
    from quanta.kernels import _native

    if not hasattr(_native, "mlas_global_average_rows_f32"):
        pytest.skip("the native extension predates mlas_global_average_rows_f32")
    rng = np.random.default_rng(sum(shape) + threads)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-11, 11, shape))).astype(np.float32)
    x.reshape(-1)[: x.size // 3] = -0.0
    rows = np.ascontiguousarray(x.reshape(shape[0] * shape[1], -1))
    got = _native.mlas_global_average_rows_f32(rows, threads)
    want = mlas_global_average_rows(rows)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    g = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    expected = ort_run(proto, {"x": x}, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)[0]
    np.testing.assert_array_equal(got.reshape(expected.shape), expected)


def test_mlas_global_average_native_refuses_a_row_tensor_of_other_rank():
    """The binding names the argument and the shape it got."""
    from quanta.kernels import _native

    if not hasattr(_native, "mlas_global_average_rows_f32"):
        pytest.skip("the native extension predates mlas_global_average_rows_f32")
    with pytest.raises(ValueError, match=r"mlas_global_average_rows_f32: x: expected \[rows, n\]"):
        _native.mlas_global_average_rows_f32(np.zeros((2, 3, 4), np.float32), 1)


def test_mlas_global_average_lanes_start_at_positive_zero():
    """A row of −0 averages to +0 (MLAS's lanes start at +0), in the lanes and in the tail."""
    for n in (3, 4, 9):
        got = mlas_global_average_rows(np.full((2, n), -0.0, np.float32))
        assert not np.any(np.signbit(got))
    assert mlas_global_average_rows(np.array([[-0.0, 1.0, -0.0, -0.0]], np.float32))[0] == np.float32(0.25)


def test_global_average_pool_after_a_float_conv_is_left_with_its_reason():
    """ORT's NCHWc transformer pools a float Conv's output (through a Relu) and a graph
    input in its blocked layout; a pool of a Relu of a graph input is MlasPool's (measured)."""
    w = numpy_helper.from_array(np.ones((8, 8, 1, 1), np.float32), "w")
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("GlobalAveragePool", ["r"], ["y"]),
            helper.make_node("GlobalAveragePool", ["x"], ["y2"]),
            helper.make_node("Relu", ["x"], ["rx"]),
            helper.make_node("GlobalAveragePool", ["rx"], ["y3"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y2", "y3")],
        initializer=[w],
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    p = OrtFloatFunctions(threads=1)
    run_passes(model, [p])
    assert [n.op_type for n in model.graph.nodes].count("MlasGlobalAveragePool") == 1
    assert [r.reason for r in p.why_not("GlobalAveragePoolToMlasPool")] == [
        "a 2-D pool of a graph input or after a float Conv (ORT pools it in NCHWc)"
    ] * 2
    x = np.random.default_rng(2).standard_normal((1, 8, 5, 5)).astype(np.float32)
    want = ort_run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), {"x": x})[2]
    np.testing.assert_array_equal(
        mlas_global_average_rows(np.maximum(x, 0).reshape(8, -1)).reshape(want.shape), want
    )


def test_8bit_global_average_pool_group_onnxruntime_fuses_is_left_with_its_reason():
    """uint8 ``DQ -> GlobalAveragePool -> Q`` is ORT's QLinearGlobalAveragePool (integer)."""
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "s"),
        numpy_helper.from_array(np.array(3, np.uint8), "z"),
    ]
    g = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["x"]),
            helper.make_node("GlobalAveragePool", ["x"], ["f"]),
            helper.make_node("QuantizeLinear", ["f", "s", "z"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, 8, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        initializer=inits,
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    p = OrtFloatFunctions(threads=1)
    result = run_passes(model, [p])
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("GlobalAveragePoolToMlasPool")] == [
        "ONNX Runtime fuses this 8-bit group into QLinearGlobalAveragePool: integer arithmetic"
    ]
