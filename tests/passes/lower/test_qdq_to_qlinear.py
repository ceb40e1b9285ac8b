"""Instruction selection (passes/lower/qdq_to_qlinear.py): the four parts for every rule
(fired N times; structure; numerics on the reference target; the verifier in the
lowered stage) and one negative test per NoMatch reason, asserting the reason.

Numeric tolerance, derived: the QDQ group rounds once after a float32 computation on
dequantized values, the integer op once after an exact int32 accumulation; both
round the same real value, which they compute with a relative error of at most a few
float32 ulps, so a result can move across a rounding boundary by at most one step:
|lowered - qdq| <= 1 LSB on every quantized tensor, and at most one output scale on
the dequantized outputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage, verify
from quanta.passes.lower.qdq_to_qlinear import (
    LowerBinary,
    LowerConcat,
    LowerConv,
    LowerMatMul,
    LowerMatMulFloatOutput,
    LowerPool,
    LowerQdqToQLinear,
    LowerUnary,
)
from quanta.passes.pattern import RewritePass
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fuse_activation import DropImpliedActivation
from quanta.runtime.compile import compile as compile_plan
from tests.ir import models
from tests.ort_int8 import fit_s8  # weights ORT computes exactly on this CPU
from tests.passes.helpers import run_passes, run_ref

FLOAT_COMPUTE = {
    "Conv",
    "MatMul",
    "Gemm",
    "Add",
    "Mul",
    "Concat",
    "AveragePool",
    "GlobalAveragePool",
    "Sigmoid",
}


def has_qgemm() -> bool:
    from quanta.kernels.reference.registry import get_op

    return get_op("QGemm", "com.microsoft") is not None


def lower(model, rules=None):
    passes = [
        DropImpliedActivation(),
        LowerQdqToQLinear() if rules is None else RewritePass(rules),
        EliminateDead(),
    ]
    if rules is not None:
        passes[1].produces_stage = Stage.LOWERED
    result = run_passes(model, passes)
    if any(n.domain == "com.microsoft" for n in model.graph.nodes):
        model.opset_imports.setdefault("com.microsoft", 1)
    return result


def quantized(tmp_path, proto, feeds, **options):
    src, out = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(proto, src)
    quanta.quantize_static(src, out, feeds, verbose=False, **options)
    return out


def assert_within_one_step(a: np.ndarray, b: np.ndarray, step: float) -> None:
    # <= 1 LSB of the last quantized tensor, dequantized (see the module docstring)
    assert np.max(np.abs(a - b)) <= step * 1.0001


def cnn_feeds(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 3, 8, 6)).astype(np.float32)} for _ in range(n)]


def test_lower_quantized_cnn_conv_relu_pool(tmp_path):
    path = quantized(
        tmp_path, models.float_cnn(), cnn_feeds(), op_types=["Conv", "Relu", "MaxPool", "Flatten", "Gemm"]
    )
    model = load(path)
    result = lower(model)
    assert result.fired("LowerConv") == 1
    assert result.fired("DropActivationImpliedByQuantize") == 1  # Relu output zp == qmin
    counts = model.graph.op_counts()
    assert counts["QLinearConv"] == 1 and "Conv" not in counts and "Relu" not in counts
    verify(model.graph, Stage.LOWERED)
    conv = model.graph.find_nodes("QLinearConv")[0]
    assert conv.inputs[8] is not None and conv.inputs[8].const.dtype == np.int32  # int32 bias kept
    feed = cnn_feeds(1, seed=5)[0]
    a, b = run_ref(load(path), feed)[0], run_ref(model, feed)[0]
    # the head (Gemm) is float here: one step of the Relu output, times |W_fc| row sums
    np.testing.assert_allclose(a, b, atol=0.05)


def test_lower_matches_qdq_on_every_quantized_tensor_of_the_demo(tmp_path):
    from quanta.cli.demo import MODEL, load_demo_data

    data = load_demo_data()
    out = tmp_path / "d.onnx"
    quanta.quantize_static(MODEL, out, [{"input": data["calib_x"][:50]}], verbose=False)
    qdq = load(out)
    model = load(out)
    result = lower(
        model, None if has_qgemm() else [r for r in LowerQdqToQLinear().ruleset.rules if "Gemm" not in r.name]
    )
    assert (
        result.fired("LowerConv") == 6 and result.fired("LowerBinary") == 3 and result.fired("LowerPool") == 1
    )
    assert not FLOAT_COMPUTE & set(model.graph.op_counts()) - ({"Gemm"} if not has_qgemm() else set())
    # expose every quantized value both graphs still share and compare them
    names = [n.outputs[0].name for n in model.graph.nodes if n.op_type.startswith("QLinear")]
    for m in (qdq, model):
        by = {v.name: v for v in m.graph.values()}
        m.graph.outputs = [*m.graph.outputs, *(by[n] for n in names)]
        m.graph.output_signature = [v.type for v in m.graph.outputs]
    feed = {"input": data["test_x"][:64]}
    outs_q, outs_l = run_ref(qdq, feed), run_ref(model, feed)
    for name, a, b in zip(["logits", *names], outs_q, outs_l):
        if a.dtype.kind in "iu":
            assert np.abs(a.astype(np.int32) - b.astype(np.int32)).max() <= 1, name


def test_lower_attention_matmul_both_operands_activations(tmp_path):
    path = quantized(
        tmp_path,
        models.encoder_block(),
        models.encoder_feeds(),
        op_types=["MatMul", "Add", "Reshape", "Transpose"],
    )
    model = load(path)
    rules = [LowerMatMul(), LowerMatMulFloatOutput(), LowerBinary()]
    result = lower(model, rules)
    # quantized products: q/k/v projections and the context; float products (their
    # consumers are float: the score scaling, the residual Adds, the FFN): the other 4
    assert result.fired("LowerMatMul") == 4 and result.fired("LowerMatMulFloatOutput") == 4
    # both operands activations: the context product (softmax output x V) is quantized;
    # the score product feeds the float score scaling and is an integer->float MatMul
    context = next(n for n in model.graph.nodes if n.name == "context")
    assert context.op_type == "QLinearMatMul" and not context.inputs[3].is_const
    scores = next(n for n in model.graph.nodes if n.name == "scores")
    assert scores.op_type == "MatMulIntegerToFloat" and not scores.inputs[1].is_const
    verify(model.graph, Stage.LOWERED)
    feed = models.encoder_feeds(1, seed=2)[0]
    a, b = run_ref(load(path), feed)[0], run_ref(model, feed)[0]
    # LayerNorm output (float): a 1-LSB change of an int8 input moves it by <~ 0.05 here
    np.testing.assert_allclose(a, b, atol=0.1)


# -- NoMatch reasons -------------------------------------------------------------------


def qdq_conv_proto(*, sx_const=True, w_const=True, bias="int32", x_axis=False, storage=TensorProto.UINT8):
    """x -Q-DQ-> Conv(w: DQ) [+ bias] -Q-DQ-> y with non-zero zero points, 3 -> 7 channels."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.float32(0.02), "sx"),
        numpy_helper.from_array(np.array(131, dtype=helper.tensor_dtype_to_np_dtype(storage)), "zx"),
        numpy_helper.from_array(fit_s8(rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8)), "w"),
        numpy_helper.from_array(np.linspace(0.004, 0.013, 7).astype(np.float32), "sw"),
        numpy_helper.from_array(np.zeros(7, np.int8), "zw"),
        numpy_helper.from_array(np.float32(0.07), "sy"),
        numpy_helper.from_array(np.array(119, dtype=helper.tensor_dtype_to_np_dtype(storage)), "zy"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 5])]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"], name="dqx"),
    ]
    if not sx_const:
        inputs.append(helper.make_tensor_value_info("sx_in", TensorProto.FLOAT, []))
        nodes[1] = helper.make_node("DequantizeLinear", ["xq", "sx_in", "zx"], ["xf"], name="dqx")
    if w_const:
        nodes.append(helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], name="dqw", axis=0))
    else:
        inputs.append(helper.make_tensor_value_info("w_in", TensorProto.INT8, [7, 3, 3, 3]))
        nodes.append(helper.make_node("DequantizeLinear", ["w_in", "sw", "zw"], ["wf"], name="dqw", axis=0))
    conv_in = ["xf", "wf"]
    if bias == "int32":
        sb = (np.float32(0.02) * np.linspace(0.004, 0.013, 7).astype(np.float32)).astype(np.float32)
        inits += [
            numpy_helper.from_array(np.arange(-3, 4, dtype=np.int32) * 50, "bq"),
            numpy_helper.from_array(sb, "sb"),
        ]
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "sb"], ["bf"], name="dqb", axis=0))
        conv_in.append("bf")
    elif bias == "float":
        inits.append(numpy_helper.from_array(np.linspace(-0.1, 0.1, 7).astype(np.float32), "bf"))
        conv_in.append("bf")
    elif bias == "wrong_scale":
        inits += [
            numpy_helper.from_array(np.arange(-3, 4, dtype=np.int32), "bq"),
            numpy_helper.from_array(np.full(7, 0.5, np.float32), "sb"),
        ]
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "sb"], ["bf"], name="dqb", axis=0))
        conv_in.append("bf")
    nodes += [
        helper.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["cq"], name="qc"),
        helper.make_node("DequantizeLinear", ["cq", "sy", "zy"], ["y"], name="dqc"),
    ]
    g = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 9, 5])], inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_lower_conv_bit_exact_structure_and_numerics():
    proto = qdq_conv_proto()
    model = load(proto)
    assert lower(model, [LowerConv()]).fired("LowerConv") == 1
    assert model.graph.op_counts() == {"DequantizeLinear": 1, "QLinearConv": 1, "QuantizeLinear": 1}
    x = np.random.default_rng(3).standard_normal((1, 3, 9, 5)).astype(np.float32) * 2
    assert_within_one_step(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0], 0.07)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (dict(sx_const=False), "quantization parameter sx 'sx_in' (a graph input) is not a constant"),
        (dict(w_const=False), "weight 'w_in' (a graph input) is not a constant"),
    ],
)
def test_lower_conv_no_match_reasons(kwargs, reason):
    model = load(qdq_conv_proto(**kwargs))
    result = lower(model, [LowerConv()])
    assert result.fired("LowerConv") == 0
    assert [r.reason for r in result.why_not("LowerConv")] == [reason]
    assert "Conv" in model.graph.op_counts()


def test_lower_conv_quantizes_a_float_constant_bias_as_onnxruntime_does():
    """Failure signature: PaddlePaddle exports quantized by ORT (bias as a float Constant)
    move 0.1-2 % of a Conv's codes by 1 in quanta, because ORT's BiasQuantization rounds the
    bias to int32 with scale sx*sw and fuses QLinearConv while quanta kept the float group.
    Tolerance 0 against ORT: both run QLinearConv with bq = rne(f32(b / f32(sx*sw)))."""
    import onnxruntime as ort

    proto = qdq_conv_proto(bias="float")
    model = load(proto)
    assert lower(model, [LowerConv()]).fired("LowerConv") == 1
    assert model.graph.op_counts() == {"DequantizeLinear": 1, "QLinearConv": 1, "QuantizeLinear": 1}
    conv = next(n for n in model.graph.nodes if n.op_type == "QLinearConv")
    bf = next(i for i in proto.graph.initializer if i.name == "bf")
    scale = np.float32(0.02) * np.linspace(0.004, 0.013, 7).astype(np.float32)
    expected_bq = np.rint(numpy_helper.to_array(bf) / scale).astype(np.int32)
    np.testing.assert_array_equal(conv.inputs[8].const, expected_bq)
    x = np.random.default_rng(5).standard_normal((1, 3, 9, 5)).astype(np.float32) * 2
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    for backend in ("reference", "native"):
        np.testing.assert_array_equal(
            quanta.InferenceSession(proto, backend=backend).run(None, {"x": x})[0], want
        )


def test_lower_conv_requantizes_a_bias_with_another_scale():
    """Failure signature: ONNX Runtime's QDQ file of a TorchScript ResNet-18 export (one
    deduplicated bias constant shared by 16 Convs of different sx*sw) ran 16 % of its MACs
    in integer: every Conv but the first refused its bias ("has scale ..., not sx*sw").
    Eq. (6b): the float bias f32(bq*sb) rounded to a multiple of sx*sw; the integer op then
    agrees with ONNX Runtime's float group within one output step."""
    import onnxruntime as ort

    proto = qdq_conv_proto(bias="wrong_scale")
    model = load(proto)
    assert lower(model, [LowerConv()]).fired("LowerConv") == 1
    conv = next(n for n in model.graph.nodes if n.op_type == "QLinearConv")
    sxsw = np.float32(0.02) * np.linspace(0.004, 0.013, 7).astype(np.float32)
    expected = np.rint((np.arange(-3, 4, dtype=np.float32) * np.float32(0.5)).astype(np.float64) / sxsw)
    np.testing.assert_array_equal(conv.inputs[8].const, expected.astype(np.int32))
    x = np.random.default_rng(7).standard_normal((1, 3, 9, 5)).astype(np.float32) * 2
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    for backend in ("reference", "native"):
        got = quanta.InferenceSession(proto, backend=backend).run(None, {"x": x})[0]
        assert_within_one_step(want, got, 0.07)


def test_rescaled_bias_saturates_and_rounds_half_to_even():
    from quanta.passes.lower.qdq_to_qlinear import _rescaled_bias

    codes = np.array([3, 5, -3, 2**31 - 1, -(2**31)], np.int32)
    got = _rescaled_bias(codes, np.float32(0.5), np.float32(1.0))
    np.testing.assert_array_equal(got, [2, 2, -2, 2**30, -(2**30)])
    big = _rescaled_bias(np.array([2**31 - 1, -(2**31)], np.int32), np.float32(4.0), np.float32(1.0))
    np.testing.assert_array_equal(big, [2**31 - 1, -(2**31)])


def test_lower_conv_refuses_16_bit_activations():
    model = load(qdq_conv_proto(storage=TensorProto.UINT16))
    result = lower(model, [LowerConv()])
    assert [r.reason for r in result.why_not("LowerConv")] == [
        "input x is stored as u16; the integer kernels take u8 or i8"
    ]


def qdq_binary_proto(storages=(TensorProto.UINT8, TensorProto.UINT8, TensorProto.UINT8), op="Add"):
    names = ["a", "b", "y"]
    scales = [0.03, 0.05, 0.11]
    zps = [125, -3 if storages[1] == TensorProto.INT8 else 131, 121]
    inits, nodes = [], []
    for n, s, z, st in zip(names, scales, zps, storages):
        inits += [
            numpy_helper.from_array(np.float32(s), f"s{n}"),
            numpy_helper.from_array(np.array(z, dtype=helper.tensor_dtype_to_np_dtype(st)), f"z{n}"),
        ]
    for n in ("a", "b"):
        nodes += [
            helper.make_node("QuantizeLinear", [n, f"s{n}", f"z{n}"], [f"{n}q"], name=f"q{n}"),
            helper.make_node("DequantizeLinear", [f"{n}q", f"s{n}", f"z{n}"], [f"{n}f"], name=f"dq{n}"),
        ]
    nodes += [
        helper.make_node(op, ["af", "bf"], ["c"], name="op"),
        helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["cq"], name="qc"),
        helper.make_node("DequantizeLinear", ["cq", "sy", "zy"], ["out"], name="dqc"),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 7]) for n in ("a", "b")]
    g = helper.make_graph(
        nodes, "g", io, [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 7])], inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_lower_binary_with_different_scales(op):
    proto = qdq_binary_proto(op=op)
    model = load(proto)
    assert lower(model, [LowerBinary()]).fired("LowerBinary") == 1
    assert model.graph.op_counts()[f"com.microsoft::QLinear{op}"] == 1
    rng = np.random.default_rng(1)
    feeds = {
        "a": rng.standard_normal((3, 7)).astype(np.float32) * 3,
        "b": rng.standard_normal((3, 7)).astype(np.float32) * 5,
    }
    assert_within_one_step(run_ref(proto, feeds)[0], run_ref(model, feeds)[0], 0.11)


def test_lower_binary_refuses_mixed_storage():
    model = load(qdq_binary_proto(storages=(TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT8)))
    result = lower(model, [LowerBinary()])
    assert [r.reason for r in result.why_not("LowerBinary")] == [
        "operands are stored as u8, i8 -> u8; the op takes one type"
    ]


def constant_operand_proto(op: str, storage: int, c: float, sc: float, zc: int, sy: float, zy: int):
    """``Q(op(DQ(Q(Erf(DQ(x)))), DQ(QuantizeLinear(Constant c))))`` as ONNX Runtime's quantizer
    writes a GELU's ``+ 1`` / ``* 0.5``: the activation reaches the op through a Q -> DQ
    pair of the graph, the constant through ``QuantizeLinear`` of a Constant node."""
    np_t = helper.tensor_dtype_to_np_dtype(storage)
    off = 0 if storage == TensorProto.INT8 else 128
    inits = [
        numpy_helper.from_array(np.float32(0.021), "sx"),
        numpy_helper.from_array(np.array(3 + off, np_t), "zx"),
        numpy_helper.from_array(np.float32(2 / 255), "sa"),  # erf in [-1, 1]
        numpy_helper.from_array(np.array(off, np_t), "za"),
        numpy_helper.from_array(np.float32(sc), "sc"),
        numpy_helper.from_array(np.array(zc + off, np_t), "zc"),
        numpy_helper.from_array(np.float32(sy), "sy"),
        numpy_helper.from_array(np.array(zy + off, np_t), "zy"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"], name="dqx"),
        helper.make_node("Erf", ["xf"], ["e"], name="erf"),
        helper.make_node("QuantizeLinear", ["e", "sa", "za"], ["eq"], name="qe"),
        helper.make_node("DequantizeLinear", ["eq", "sa", "za"], ["ef"], name="dqe"),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32(c)), name="cst"),
        helper.make_node("QuantizeLinear", ["c", "sc", "zc"], ["cq"], name="qcst"),
        helper.make_node("DequantizeLinear", ["cq", "sc", "zc"], ["cf"], name="dqcst"),
        helper.make_node(op, ["ef", "cf"], ["s"], name="op"),
        helper.make_node("QuantizeLinear", ["s", "sy", "zy"], ["y"], name="qy"),
    ]
    shape = [2, 7, 3, 17]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", storage, shape)],
        [helper.make_tensor_value_info("y", storage, shape)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


CONSTANT_OPERANDS = {
    # a GELU's "+ 1" at ORT's scales: (2/255-scaled codes + 1) requantized at 2/255 is an
    # exact tie on every code; float rounding breaks each tie its own way
    "gelu_add_one": ("Add", 1.0, 1 / 255, -128, 2 / 255, -128),
    "gelu_mul_half": ("Mul", 0.5, 1 / 510, -128, 1 / 255, 0),
    "distinct_scales": ("Add", 0.37, 0.0031, 5, 0.017, -3),
}


@pytest.mark.parametrize("case", sorted(CONSTANT_OPERANDS))
def test_int8_binary_with_a_constant_runs_as_onnx_runtime_runs_it(case):
    ort = pytest.importorskip("onnxruntime")
    op, c, sc, zc, sy, zy = CONSTANT_OPERANDS[case]
    proto = constant_operand_proto(op, TensorProto.INT8, c, sc, zc, sy, zy)
    onnx.checker.check_model(proto, full_check=True)
    model = load(proto)
    result = compile_plan(model, "reference").passes  # the session's pipeline: the Constant folded first
    assert [r.reason.split(":")[0] for r in result.why_not("LowerBinary")] == ["int8 with a constant operand"]
    counts = model.graph.op_counts()
    assert counts.get(f"com.microsoft::QLinear{op}", 0) == 0
    # DQ -> Erf -> Q and the constant's group, two tables in a row: one (ComposeLookups)
    assert counts["quanta::QLinearLookup"] == 1
    x = np.arange(-128, 128, dtype=np.int8)
    x = np.resize(np.random.default_rng(7).permutation(x), (2, 7, 3, 17)).astype(np.int8)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    got = quanta.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def test_uint8_binary_with_a_constant_stays_qlinear_as_onnx_runtime_fuses_it():
    ort = pytest.importorskip("onnxruntime")
    op, c, sc, zc, sy, zy = CONSTANT_OPERANDS["gelu_add_one"]
    proto = constant_operand_proto(op, TensorProto.UINT8, c, sc, zc, sy, zy)
    model = load(proto)
    passes = compile_plan(model, "reference").passes
    assert passes.fired("LowerBinary") == 1
    # the QLinearAdd of a one-element constant is a function of x's codes: ComposeCodeMaps8
    # makes it a table of what it computes (ORT's arithmetic, so still ORT's bytes)
    assert passes.fired("ComposeCodeMaps8") == 1
    assert model.graph.op_counts().get("com.microsoft::QLinearAdd", 0) == 0
    x = np.resize(np.random.default_rng(7).permutation(256).astype(np.uint8), (2, 7, 3, 17))
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    got = quanta.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def test_lower_concat_pool_and_unary(tmp_path):
    # Concat of two branches with their own scales, GlobalAveragePool, Sigmoid
    rng = np.random.default_rng(4)
    w1 = numpy_helper.from_array(rng.standard_normal((5, 3, 1, 1)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
        helper.make_node("Conv", ["x", "w2"], ["b"], name="c2", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["a", "b"], ["cat"], axis=1, name="cat"),
        helper.make_node("Sigmoid", ["cat"], ["s"], name="sig"),
        helper.make_node("AveragePool", ["s"], ["ap"], kernel_shape=[3, 3], strides=[2, 2], name="ap"),
        helper.make_node("GlobalAveragePool", ["ap"], ["gp"], name="gap"),
        helper.make_node("Flatten", ["gp"], ["y"], name="flat"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 11, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 9])],
        [w1, w2],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = [{"x": rng.standard_normal((1, 3, 11, 7)).astype(np.float32)} for _ in range(4)]
    path = quantized(tmp_path, proto, feeds, quantize_outputs=True)
    model = load(path)
    result = lower(model, [LowerConv(), LowerConcat(), LowerUnary(), LowerPool()])
    assert (
        result.fired("LowerConcat") == 1
        and result.fired("LowerUnary") == 1
        and result.fired("LowerPool") == 2
    )
    counts = model.graph.op_counts()
    assert counts["com.microsoft::QLinearConcat"] == 1 and counts["com.microsoft::QLinearSigmoid"] == 1
    assert (
        counts["com.microsoft::QLinearAveragePool"] == 1
        and counts["com.microsoft::QLinearGlobalAveragePool"] == 1
    )
    verify(model.graph, Stage.LOWERED)
    a, b = run_ref(load(path), feeds[0])[0], run_ref(model, feeds[0])[0]
    written = onnx.load(str(path)).graph
    y_dq = next(n for n in written.node if n.op_type == "DequantizeLinear" and n.output[0] == "y")
    # the scale y's DequantizeLinear reads (an equal tensor elsewhere may hold the name)
    step = float(numpy_helper.to_array(next(t for t in written.initializer if t.name == y_dq.input[1])))
    # Sigmoid: ORT's (and the reference's) QLinearSigmoid uses a table computed from
    # the dequantized input; the QDQ graph computes the same function: 1 step each
    # through three requantizations after it -> at most 3 output steps.
    assert np.max(np.abs(a - b)) <= 3 * step * 1.0001


def test_lowered_model_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    proto = qdq_conv_proto()
    model = load(proto)
    lower(model, [LowerConv()])
    out = tmp_path / "lowered.onnx"
    from quanta.ir.onnx_io import save

    save(model, out)
    x = np.random.default_rng(3).standard_normal((1, 3, 9, 5)).astype(np.float32)
    ours = run_ref(model, {"x": x})[0]
    theirs = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ours, theirs)  # 0: same integer op, same requantization


def qdq_gemm_float_bias_proto(*, quantized_output: bool, trans_b: int = 1):
    """x -Q-DQ-> Gemm(w: DQ per output column, float constant bias) [-Q-DQ->] y: NNCF's
    classifier head (the bias stays a float constant); 13 -> 5, distinct scales."""
    rng = np.random.default_rng(11)
    w_shape = (5, 13) if trans_b else (13, 5)
    inits = [
        numpy_helper.from_array(np.float32(0.031), "sx"),
        numpy_helper.from_array(np.uint8(121), "zx"),
        numpy_helper.from_array(rng.integers(-127, 128, w_shape).astype(np.int8), "w"),
        numpy_helper.from_array(np.linspace(0.004, 0.011, 5).astype(np.float32), "sw"),
        numpy_helper.from_array(np.zeros(5, np.int8), "zw"),
        numpy_helper.from_array(np.linspace(-0.7, 0.9, 5).astype(np.float32), "bias"),
        numpy_helper.from_array(np.float32(0.017), "sy"),
        numpy_helper.from_array(np.uint8(117), "zy"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"], name="dqx"),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], name="dqw", axis=0 if trans_b else 1),
        helper.make_node(
            "Gemm", ["xf", "wf", "bias"], ["g" if quantized_output else "y"], name="gemm", transB=trans_b
        ),
    ]
    if quantized_output:
        nodes += [
            helper.make_node("QuantizeLinear", ["g", "sy", "zy"], ["gq"], name="qg"),
            helper.make_node("DequantizeLinear", ["gq", "sy", "zy"], ["y"], name="dqg"),
        ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 13])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.skipif(not has_qgemm(), reason="no QGemm reference kernel")
@pytest.mark.parametrize("trans_b", [0, 1])
def test_lower_gemm_float_output_with_a_float_bias(trans_b):
    """The integer product, then the float bias added in float32: against the float
    Gemm of the dequantized operands, float32 rounding of a 13-term dot product only."""
    proto = qdq_gemm_float_bias_proto(quantized_output=False, trans_b=trans_b)
    model = load(proto)
    from quanta.passes.lower.qdq_to_qlinear import LowerGemmFloatOutput

    assert lower(model, [LowerGemmFloatOutput()]).fired("LowerGemmFloatOutput") == 1
    assert model.graph.op_counts() == {"QuantizeLinear": 1, "com.microsoft::QGemm": 1, "Add": 1}
    x = (np.random.default_rng(2).standard_normal((3, 13)) * 2).astype(np.float32)
    want, got = run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0]
    xf = (np.clip(np.rint(x / np.float32(0.031)) + 121, 0, 255) - 121) * 0.031
    w = numpy_helper.to_array(proto.graph.initializer[2]).astype(np.float64)
    w = w * (np.linspace(0.004, 0.011, 5)[:, None] if trans_b else np.linspace(0.004, 0.011, 5)[None, :])
    mag = np.abs(xf) @ (np.abs(w).T if trans_b else np.abs(w)) + 0.9
    from tests.passes.helpers import dot_tolerance

    assert np.all(np.abs(got - want) <= dot_tolerance(13, mag))


@pytest.mark.skipif(not has_qgemm(), reason="no QGemm reference kernel")
def test_lower_gemm_quantized_output_quantizes_a_float_bias():
    proto = qdq_gemm_float_bias_proto(quantized_output=True)
    model = load(proto)
    from quanta.passes.lower.qdq_to_qlinear import LowerGemm

    assert lower(model, [LowerGemm()]).fired("LowerGemm") == 1
    assert model.graph.op_counts() == {"QuantizeLinear": 1, "com.microsoft::QGemm": 1, "DequantizeLinear": 1}
    x = (np.random.default_rng(4).standard_normal((3, 13)) * 2).astype(np.float32)
    # the bias rounded to a multiple of sx·sw moves the output by at most half a step of that
    assert_within_one_step(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0], 0.017)


def quark_conv_proto(bias_storage=TensorProto.INT8, sb=2.0**-5, zb=0):
    """AMD Quark's XINT8 Conv group: uint8 x and y with zero point 128, power-of-two
    scales (sx 2^-5, sw 2^-10 per tensor, sy 2^-3) and an 8-bit bias with its own scale."""
    rng = np.random.default_rng(11)
    np_b = helper.tensor_dtype_to_np_dtype(bias_storage)
    inits = [
        numpy_helper.from_array(np.float32(2.0**-5), "sx"),
        numpy_helper.from_array(np.uint8(128), "zx"),
        numpy_helper.from_array(fit_s8(rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8)), "w"),
        numpy_helper.from_array(np.float32(2.0**-10), "sw"),
        numpy_helper.from_array(np.int8(0), "zw"),
        numpy_helper.from_array(
            np.array([-128, -77, -3, 0, 5, 101, 127], np.int64)
            .clip(np.iinfo(np_b).min, np.iinfo(np_b).max)
            .astype(np_b),
            "bq",
        ),
        numpy_helper.from_array(np.float32(sb), "sb"),
        numpy_helper.from_array(np.array(zb, np_b), "zb"),
        numpy_helper.from_array(np.float32(2.0**-3), "sy"),
        numpy_helper.from_array(np.uint8(128), "zy"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"], name="dqx"),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], name="dqw"),
        helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bf"], name="dqb"),
        helper.make_node("Conv", ["xf", "wf", "bf"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["cq"], name="qc"),
        helper.make_node("DequantizeLinear", ["cq", "sy", "zy"], ["y"], name="dqc"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 9, 5])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_lower_conv_takes_an_int8_bias_with_its_own_power_of_two_scale():
    """Failure signature: AMD Quark's EfficientNet-Lite0 ran all 49 Convs as float Convs
    (2.1x quanta's own file): its int8 bias behind DequantizeLinear(bq, 2^-5, 0) was
    refused ("is not an int32 constant"). Eq. (6b) with sb = 2^10·sx·sw: bq' = bq·2^10,
    exact, so the integer op is the file's group with the exact sum."""
    import onnxruntime as ort

    proto = quark_conv_proto()
    model = load(proto)
    assert lower(model, [LowerConv()]).fired("LowerConv") == 1
    conv = next(n for n in model.graph.nodes if n.op_type == "QLinearConv")
    bq = numpy_helper.to_array(next(i for i in proto.graph.initializer if i.name == "bq"))
    np.testing.assert_array_equal(conv.inputs[8].const, bq.astype(np.int32) * 2**10)
    x = np.random.default_rng(12).standard_normal((1, 3, 9, 5)).astype(np.float32) * 3
    native = quanta.InferenceSession(proto, backend="native").run(None, {"x": x})[0]
    twin = quanta.InferenceSession(proto, backend="reference").run(None, {"x": x})[0]
    np.testing.assert_array_equal(native, twin)  # 0: the integer op on both targets
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert_within_one_step(want, native, 2.0**-3)  # ORT's float Conv against the exact sum


def test_lower_conv_requantizes_a_uint8_bias_with_a_zero_point():
    """Eq. (6b) on DequantizeLinear's float value f32((bq - zb)·sb): a uint8 bias with zero
    point 131 and a scale that is no power-of-two multiple of sx·sw rounds half to even."""
    proto = quark_conv_proto(bias_storage=TensorProto.UINT8, sb=0.0123, zb=131)
    model = load(proto)
    assert lower(model, [LowerConv()]).fired("LowerConv") == 1
    conv = next(n for n in model.graph.nodes if n.op_type == "QLinearConv")
    bq = numpy_helper.to_array(next(i for i in proto.graph.initializer if i.name == "bq")).astype(np.int64)
    floats = ((bq - 131).astype(np.float32) * np.float32(0.0123)).astype(np.float64)
    want = np.rint(floats / np.float64(np.float32(2.0**-5) * np.float32(2.0**-10)))
    np.testing.assert_array_equal(conv.inputs[8].const, want.astype(np.int32))
    x = np.random.default_rng(13).standard_normal((1, 3, 9, 5)).astype(np.float32) * 3
    assert_within_one_step(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0], 2.0**-3)
