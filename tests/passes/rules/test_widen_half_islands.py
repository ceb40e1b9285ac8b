"""WidenHalfIslands (passes/rules/widen_half_islands.py): a float16 model's islands run
in float32 between Casts, on native kernels, keeping the graph's input and output names
and types; numerics as docs/float-ops.md "float16 models" states them."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.ir.types import F16, F32
from quanta.passes.manager import PassManager
from quanta.passes.rules.widen_half_islands import WidenHalfIslands

F16_NP = np.float16


def half_model(dtype: type = np.float16, code: int = TensorProto.FLOAT16):
    """x [N, 3, 9, 7] -> Conv 3->7 (3x3, pads 1, bias) -> Relu -> Conv 7->17 (1x1) ->
    Softmax over the 17 channels -> y; the Relu output is a second graph output ``r``
    and is also read by a ReduceMean; weights of ``dtype`` holding float16 values."""
    rng = np.random.default_rng(11)

    def weights(bound: float, shape: tuple) -> np.ndarray:  # float16 values in every dtype
        return rng.uniform(-bound, bound, shape).astype(F16_NP).astype(dtype)

    inits = [
        numpy_helper.from_array(weights(0.4, (7, 3, 3, 3)), "w1"),
        numpy_helper.from_array(weights(0.2, (7,)), "b1"),
        numpy_helper.from_array(weights(0.6, (17, 7, 1, 1)), "w2"),
        numpy_helper.from_array(np.array([1, 2, 3], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["c2"], name="conv2"),
        helper.make_node("Softmax", ["c2"], ["y"], axis=1, name="softmax"),
        helper.make_node("ReduceMean", ["r", "axes"], ["m"], keepdims=0, name="mean"),
    ]
    graph = helper.make_graph(
        nodes,
        "half",
        [helper.make_tensor_value_info("x", code, ["N", 3, 9, 7])],
        [
            helper.make_tensor_value_info("y", code, None),
            helper.make_tensor_value_info("r", code, None),
            helper.make_tensor_value_info("m", code, None),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def feed() -> np.ndarray:
    return (np.random.default_rng(4).standard_normal((2, 3, 9, 7)) * 2).astype(F16_NP)


def test_island_is_float32_between_one_cast_in_and_casts_at_the_outputs() -> None:
    model = load(half_model())
    PassManager([WidenHalfIslands()], verify=True).run(model)
    g = model.graph
    ops = [(n.op_type, n.attrs.get("to")) for n in g.nodes]
    assert ops == [
        ("Cast", TensorProto.FLOAT),  # x, once for both of its readers
        ("Conv", None),
        ("Relu", None),
        ("Cast", TensorProto.FLOAT16),  # r: a graph output
        ("Conv", None),
        ("Softmax", None),
        ("Cast", TensorProto.FLOAT16),  # y
        ("ReduceMean", None),
        ("Cast", TensorProto.FLOAT16),  # m
    ], ops
    for n in g.nodes:
        if n.op_type != "Cast":
            assert not any(v.elem == F16 for v in n.inputs if v), n.label
            assert [v.elem for v in n.outputs] == [F32], n.label
    assert {v.name: v.const.dtype for v in g.initializers.values() if v.name.startswith("w")} == {
        "w1/f32": np.float32,
        "w2/f32": np.float32,
    }
    # the names and types the file declares
    assert [(v.name, v.elem) for v in g.inputs] == [("x", F16)]
    assert [(v.name, v.elem) for v in g.outputs] == [("y", F16), ("r", F16), ("m", F16)]


def test_cast_to_float_of_an_island_value_is_that_value_and_shape_reads_float32() -> None:
    # Cast(f32 -> f16) into the island stays (the file rounds there); Cast(to=FLOAT) of
    # an island value goes; Shape reads the float32 value and causes no Cast; Hardmax is
    # no island op: it reads the exit Cast and keeps float16
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.uniform(-1, 1, (5, 3)).astype(F16_NP), "w")
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
        helper.make_node("MatMul", ["h", "w"], ["p"]),
        helper.make_node("Cast", ["p"], ["p32"], to=TensorProto.FLOAT),
        helper.make_node("Shape", ["p"], ["s"]),
        helper.make_node("Hardmax", ["p"], ["hm"]),
        helper.make_node("Mul", ["p32", "p32"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "casts",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("s", TensorProto.INT64, None),
            helper.make_tensor_value_info("hm", TensorProto.FLOAT16, None),
        ],
        [w],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model = load(proto)
    PassManager([WidenHalfIslands()], verify=True).run(model)
    ops = [(n.op_type, n.attrs.get("to")) for n in model.graph.nodes]
    assert ops == [
        ("Cast", TensorProto.FLOAT16),
        ("Cast", TensorProto.FLOAT),
        ("MatMul", None),
        ("Cast", TensorProto.FLOAT16),
        ("Shape", None),
        ("Hardmax", None),
        ("Mul", None),
    ], ops
    shape, hardmax = model.graph.nodes[4], model.graph.nodes[5]
    assert shape.inputs[0].elem == F32 and hardmax.inputs[0].elem == F16
    x = rng.standard_normal((4, 5)).astype(np.float32)
    got = quanta.InferenceSession(proto).run(None, {"x": x})
    p = x.astype(F16_NP).astype(np.float32) @ w_f32(w)
    np.testing.assert_allclose(got[0], p * p, rtol=1e-6, atol=1e-6)
    assert got[1].tolist() == [4, 3] and got[2].dtype == F16_NP


def w_f32(t) -> np.ndarray:
    return numpy_helper.to_array(t).astype(np.float32)


def test_float16_model_runs_on_native_kernels_and_keeps_its_signature() -> None:
    sess = quanta.InferenceSession(half_model())
    assert sess.fallbacks == []
    assert [(i.name, i.type) for i in sess.get_inputs()] == [("x", "tensor(float16)")]
    assert [(o.name, o.type) for o in sess.get_outputs()] == [
        ("y", "tensor(float16)"),
        ("r", "tensor(float16)"),
        ("m", "tensor(float16)"),
    ]
    outs = sess.run(None, {"x": feed()})
    assert [o.dtype for o in outs] == [F16_NP] * 3
    assert [s.kernel.name for s in sess.plan.steps if s.op_type == "Cast"] == [
        "native:cast_float32",
        "native:cast_float16",
        "native:cast_float16",
        "native:cast_float16",
    ]


def test_outputs_are_the_float32_graph_rounded_once_to_float16() -> None:
    # the float16 file's outputs are bit for bit the float32 file's (same weights, the
    # input widened) rounded to float16: the island is the float32 graph
    x = feed()
    got = quanta.InferenceSession(half_model()).run(None, {"x": x})
    wide = quanta.InferenceSession(half_model(np.float32, TensorProto.FLOAT)).run(
        None, {"x": x.astype(np.float32)}
    )
    for g, w in zip(got, wide):
        assert g.tobytes() == w.astype(F16_NP).tobytes()


def test_outputs_within_the_float16_rounding_of_float64() -> None:
    # docs/float-ops.md (H1): |y - y64| <= 2^-11·|y64| + (1 + 2^-11)·e32 + 2^-25 with e32
    # the float32 island's error; here e32 <= 2^-18·max|y64| (the float GEMM family's
    # (FG1) for K <= 27 is far below it). Per-operator float16 rounding (the file as
    # written, on the reference) has no such bound: each operator rounds once more.
    x = feed()
    got = quanta.InferenceSession(half_model()).run(None, {"x": x})
    off = quanta.SessionOptions()
    off.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    exact = quanta.InferenceSession(
        half_model(np.float64, TensorProto.DOUBLE), sess_options=off, backend="reference"
    ).run(None, {"x": x.astype(np.float64)})
    as_written = quanta.InferenceSession(half_model(), sess_options=off, backend="reference").run(
        None, {"x": x}
    )
    for name, g, e, a in zip("yrm", got, exact, as_written):
        err = np.abs(g.astype(np.float64) - e)
        bound = 2.0**-11 * np.abs(e) + (1 + 2.0**-11) * 2.0**-18 * np.abs(e).max() + 2.0**-25
        assert np.all(err <= bound), (name, float((err - bound).max()))
        assert err.max() <= np.abs(a.astype(np.float64) - e).max(), name


def test_float16_atan2_runs_in_the_island() -> None:
    """tf2onnx's Atan2 (Atan of a quotient, Sign, Where) in a float16 model converted by
    onnxconverter-common (afis's LEADER): "native Atan takes float32 input, got float16"
    left the Atan on its twin; Atan is an island operator, so every step is native and
    the output is the float32 graph's rounded once."""
    nodes = [
        helper.make_node("Div", ["y", "x"], ["q"], name="div"),
        helper.make_node("Atan", ["q"], ["a"], name="atan"),
        helper.make_node("Sign", ["x"], ["s"], name="sign"),
        helper.make_node("Mul", ["a", "s"], ["o"], name="mul"),
    ]
    graph = helper.make_graph(
        nodes,
        "atan2",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [3, 17]) for n in ("x", "y")],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT16, [3, 17])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = quanta.InferenceSession(model)
    assert sess.fallbacks == []
    rng = np.random.default_rng(29)
    feeds = {n: rng.standard_normal((3, 17)).astype(F16_NP) for n in ("x", "y")}
    got = sess.run(None, feeds)[0]
    from quanta.kernels.reference.float_ops import atan_f32

    x32, y32 = (feeds[n].astype(np.float32) for n in ("x", "y"))
    want = (atan_f32(y32 / x32) * np.sign(x32)).astype(F16_NP)
    assert got.dtype == F16_NP and got.tobytes() == want.tobytes()


def half_qdq_model(dtype: type = np.float16, code: int = TensorProto.FLOAT16):
    """What NVIDIA ModelOpt's int8 mode writes (TensorRT style): the float part in half
    precision, Q / DQ with float16 scales around each Conv. x [N, 3, 9, 7] -> Q/DQ
    (zero point 7) -> Conv 3->7 (3x3, int8 weights per channel, float bias) -> Relu ->
    Q/DQ (zero point -113) -> Conv 7->17 (1x1) -> y; ``dtype`` holds the float16 values."""
    rng = np.random.default_rng(5)

    def f(values) -> np.ndarray:
        return np.asarray(values).astype(F16_NP).astype(dtype)

    inits = [
        numpy_helper.from_array(f(0.031), "sx"),
        numpy_helper.from_array(np.int8(7), "zx"),
        numpy_helper.from_array(f(0.019), "sr"),
        numpy_helper.from_array(np.int8(-113), "zr"),
        numpy_helper.from_array(rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8), "w1q"),
        numpy_helper.from_array(f(np.linspace(0.002, 0.009, 7)), "s1"),
        numpy_helper.from_array(np.zeros(7, np.int8), "z1"),
        numpy_helper.from_array(f(rng.uniform(-0.3, 0.3, 7)), "b1"),
        numpy_helper.from_array(rng.integers(-127, 128, (17, 7, 1, 1)).astype(np.int8), "w2q"),
        numpy_helper.from_array(f(np.linspace(0.003, 0.011, 17)), "s2"),
        numpy_helper.from_array(np.zeros(17, np.int8), "z2"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w1q", "s1", "z1"], ["w1"], axis=0),
        helper.make_node("Conv", ["xd", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "sr", "zr"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "sr", "zr"], ["rd"]),
        helper.make_node("DequantizeLinear", ["w2q", "s2", "z2"], ["w2"], axis=0),
        helper.make_node("Conv", ["rd", "w2"], ["y"], name="conv2"),
    ]
    graph = helper.make_graph(
        nodes,
        "half_qdq",
        [helper.make_tensor_value_info("x", code, ["N", 3, 9, 7])],
        [helper.make_tensor_value_info("y", code, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_float16_qdq_groups_lower_to_integer_kernels() -> None:
    # the Q / DQ join the island with float32 scales, so the groups are a float32
    # model's: integer convolutions, nothing on a twin (they ran on NumPy, 8x ORT)
    sess = quanta.InferenceSession(half_qdq_model())
    assert sess.fallbacks == []
    ops = [s.op_type for s in sess.plan.steps]
    assert "Conv" not in ops and not any(s.kernel.name.startswith("reference") for s in sess.plan.steps)
    assert [o.type for o in sess.get_outputs()] == ["tensor(float16)"]


def test_float16_qdq_outputs_are_the_float32_file_rounded_once() -> None:
    # QuantizeLinear divides in float32 for a float16 input, so the codes of the widened
    # island are the file's; the output is the float32 twin's (float16 values of every
    # scale, bias and input, in float32) rounded once to float16
    x = feed()
    got = quanta.InferenceSession(half_qdq_model()).run(None, {"x": x})[0]
    wide = quanta.InferenceSession(half_qdq_model(np.float32, TensorProto.FLOAT)).run(
        None, {"x": x.astype(np.float32)}
    )[0]
    assert got.dtype == F16_NP and got.tobytes() == wide.astype(F16_NP).tobytes()


def test_widened_quantize_linear_writes_a_float32_expressed_type() -> None:
    model = load(half_qdq_model())
    PassManager([WidenHalfIslands()]).run(model)
    q = next(n for n in model.graph.nodes if n.op_type == "QuantizeLinear")
    assert q.input(1).type.elem == F32 and q.outputs[0].type.elem.expressed == F32
    assert str(q.outputs[0].type.elem.storage) == "i8"
