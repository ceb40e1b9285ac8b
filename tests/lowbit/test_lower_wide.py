"""16-bit QDQ groups lower to quanta::QLinearConv16 / QLinearMatMul16 (passes/lower/wide.py)
and run on the native a16w8 kernels.

Models are QDQ files written here with onnx.helper, as ONNX Runtime's quantizer writes
them with ``activation_type=QUInt16`` / ``QInt16`` (16-bit Q/DQ around the activations,
int8 or 16-bit weights, an int32 bias with scale ``sx·sw``). Checks: the rule fires and the
plan runs the native kernel (no fallback); native == reference target bit for bit; and
the lowered op against ONNX Runtime running the float QDQ group (ORT does not fuse
16-bit groups): within one output step, because both round the same real value once,
after a float32 convolution (ORT) or an exact integer sum (quanta), see
tests/passes/lower/test_qdq_to_qlinear.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.lower.wide import LowerConv16, LowerGemm16, LowerMatMul16
from quanta.passes.pattern import Match, NoMatch

F32 = np.float32


def _qdq_model(kind: str, act=TensorProto.UINT16, wdt=np.int8, out=TensorProto.UINT16, per_channel=True):
    rng = np.random.default_rng(5)
    np_act = helper.tensor_dtype_to_np_dtype(act).type
    np_out = helper.tensor_dtype_to_np_dtype(out).type
    inits, nodes = [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    if kind == "conv":
        x_shape, w_shape, n_out = [1, 7, 9, 11], [17, 7, 3, 3], 17
    elif kind == "matmul":
        x_shape, w_shape, n_out = [2, 5, 300], [300, 17], 17
    else:  # gemm, transB
        x_shape, w_shape, n_out = [4, 300], [17, 300], 17
    info_a, info_w = np.iinfo(np_act), np.iinfo(wdt)
    sx = F32(6.0 / (info_a.max - info_a.min))
    zx = np_act((int(info_a.min) + int(info_a.max)) // 2 + (int(info_a.max) - int(info_a.min)) // 64)
    wq = rng.integers(info_w.min, info_w.max + 1, w_shape).astype(wdt)
    axis = 0 if kind in ("conv", "gemm") else 1
    # real weights of about ±0.3 whatever the storage type
    sw_base = 0.6 / (int(info_w.max) - int(info_w.min))
    sw = (rng.uniform(0.5, 1.5, n_out) * sw_base).astype(F32) if per_channel else F32(sw_base)
    zw = rng.integers(info_w.min // 8, info_w.max // 8, n_out).astype(wdt) if per_channel else wdt(3)
    nodes.append(helper.make_node("QuantizeLinear", ["x", const("sx", sx), const("zx", zx)], ["xq"]))
    nodes.append(helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]))
    nodes.append(
        helper.make_node(
            "DequantizeLinear", [const("wq", wq), const("sw", sw), const("zw", zw)], ["wd"], axis=axis
        )
    )
    bias = rng.integers(-5000, 5000, n_out).astype(np.int32)
    nodes.append(
        helper.make_node(
            "DequantizeLinear", [const("bq", bias), const("sb", (sx * sw).astype(F32))], ["bd"], axis=0
        )
    )
    if kind == "conv":
        nodes.append(helper.make_node("Conv", ["xd", "wd", "bd"], ["y"], pads=[1, 0, 1, 2], strides=[1, 2]))
    elif kind == "matmul":
        nodes.append(helper.make_node("MatMul", ["xd", "wd"], ["y0"]))
        nodes.append(helper.make_node("Add", ["y0", "bd"], ["y"]))
    else:
        nodes.append(helper.make_node("Gemm", ["xd", "wd", "bd"], ["y"], transB=1))
    info_y = np.iinfo(np_out)
    sy = F32(40.0 / (info_y.max - info_y.min))
    zy = np_out((int(info_y.min) + int(info_y.max)) // 2)
    nodes.append(helper.make_node("QuantizeLinear", ["y", const("sy", sy), const("zy", zy)], ["yq"]))
    nodes.append(helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["out"]))
    graph = helper.make_graph(
        nodes,
        kind,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [f"d{i}" for i in range(len(x_shape))])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model, x_shape, float(sy)


def _feed(shape, seed=1):
    return {"x": np.random.default_rng(seed).uniform(-2.9, 2.9, shape).astype(F32)}


CASES = [
    ("conv", TensorProto.UINT16, np.int8, TensorProto.UINT16, True),
    ("conv", TensorProto.INT16, np.uint8, TensorProto.INT8, False),
    ("conv", TensorProto.UINT16, np.uint16, TensorProto.UINT16, True),
    ("gemm", TensorProto.INT16, np.int8, TensorProto.INT16, True),
    ("gemm", TensorProto.UINT16, np.int16, TensorProto.UINT8, False),
]


@pytest.mark.parametrize(("kind", "act", "wdt", "out", "per_channel"), CASES)
def test_sixteen_bit_groups_run_native_and_match_reference_and_ort(kind, act, wdt, out, per_channel):
    model, shape, step = _qdq_model(kind, act, wdt, out, per_channel)
    blob = model.SerializeToString()
    sess = quanta.InferenceSession(blob)
    ops = {n.op_type for n in sess.model.graph.nodes}
    want_op = "QLinearConv16" if kind == "conv" else "QLinearMatMul16"
    assert want_op in ops and "Conv" not in ops and "Gemm" not in ops, ops
    names = [s.kernel.name for s in sess.plan.steps if s.node.op_type == want_op]
    assert names and all(n.startswith("native:qlinear_") for n in names), names
    assert not [f for f in sess.fallbacks if want_op in str(f)]
    feed = _feed(shape)
    y = sess.run(None, feed)[0]
    ref = quanta.InferenceSession(blob, backend="reference").run(None, feed)[0]
    np.testing.assert_array_equal(y, ref)
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.max(np.abs(o - y)) <= step * 1.0001
    assert len(np.unique(y)) > 50  # the output range is used


def test_matmul_with_float_add_bias_lowers_the_matmul():
    model, _shape, _step = _qdq_model("matmul")
    # MatMul -> float Add(bias) -> Q: the MatMul's output is not quantized, so the rule
    # must refuse (and say why) rather than drop the Add
    sess = quanta.InferenceSession(model.SerializeToString())
    assert "QLinearMatMul16" not in {n.op_type for n in sess.model.graph.nodes}


def test_matmul16_rule_fires_on_a_quantized_product():
    model, shape, _ = _qdq_model("matmul")
    g = model.graph
    # make the product itself quantized: MatMul -> Q -> DQ -> Add
    add = next(n for n in g.node if n.op_type == "Add")
    g.node.remove(add)
    extra = [
        helper.make_node("QuantizeLinear", ["y0", "sy", "zy"], ["y0q"]),
        helper.make_node("DequantizeLinear", ["y0q", "sy", "zy"], ["y0d"]),
        helper.make_node("Add", ["y0d", "bd"], ["y"]),
    ]
    pos = next(i for i, n in enumerate(g.node) if n.op_type == "MatMul") + 1
    for i, n in enumerate(extra):
        g.node.insert(pos + i, n)
    blob = model.SerializeToString()
    sess = quanta.InferenceSession(blob)
    assert "QLinearMatMul16" in {n.op_type for n in sess.model.graph.nodes}
    feed = _feed(shape)
    np.testing.assert_array_equal(
        sess.run(None, feed)[0], quanta.InferenceSession(blob, backend="reference").run(None, feed)[0]
    )


def test_eight_bit_groups_are_left_to_the_eight_bit_rules(tmp_path):
    model, _, _ = _qdq_model("conv", TensorProto.UINT8, np.int8, TensorProto.UINT8)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    m = load(path)
    q = next(n for n in m.graph.nodes if n.op_type == "QuantizeLinear" and n.input(0).name == "y")
    rule = LowerConv16()
    res = rule.match(m.graph, q)
    assert isinstance(res, Match)
    res = rule.check(res)
    assert isinstance(res, NoMatch) and "no operand is stored in 16 bits" in res.reason


def test_rules_are_named():
    assert {r.name for r in (LowerConv16(), LowerMatMul16(), LowerGemm16())} == {
        "LowerConv16",
        "LowerMatMul16",
        "LowerGemm16",
    }


def test_contrib_domain_sixteen_bit_qdq_lower_like_the_onnx_ops():
    """ONNX Runtime's quantizer writes 16-bit Q/DQ as com.microsoft ops (ppocr_cls.ort_qdq_u16):
    MsQdqToOnnx makes them ai.onnx ops first, so the weight stays an integer constant and the
    group lowers to QLinearConv16."""
    model, shape, step = _qdq_model("conv")
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[0] != "bq":
            n.domain = "com.microsoft"
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    blob = model.SerializeToString()
    sess = quanta.InferenceSession(blob)
    names = [s.kernel.name for s in sess.plan.steps if s.node.op_type == "QLinearConv16"]
    assert names == ["native:qlinear_conv16_u16i8"]
    feed = _feed(shape)
    y = sess.run(None, feed)[0]
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.max(np.abs(o - y)) <= step * 1.0001


@pytest.mark.parametrize(("kind", "act", "wdt", "out", "per_channel"), [CASES[0], CASES[3]])
def test_sixteen_bit_binders_take_the_carried_multiplier(kind, act, wdt, out, per_channel):
    """The lowering carries QLinearConv16 / QLinearMatMul16's multiplier on the node
    (passes/lower/requant_params.py) and the native binder takes it as it is: with every
    carried multiplier doubled, the native output is the reference's on the same graph
    with that node's y_scale halved (exact: a power of two), and differs from the
    unaltered run."""
    import copy

    from quanta.ir.onnx_io import load
    from quanta.passes.lower.requant_params import FloatRequant, float_multiplier
    from quanta.passes.manager import PassManager
    from quanta.passes.pipelines import lower_qdq
    from quanta.runtime.compile import compile as compile_plan
    from quanta.runtime.compile import reference_evaluator
    from quanta.runtime.execute import Executor

    proto, x_shape, _ = _qdq_model(kind, act, wdt, out, per_channel)
    model = load(proto)
    PassManager(lower_qdq(opset=21, evaluator=reference_evaluator(model.opset_imports))).run(model)
    (node,) = [n for n in model.graph.nodes if n.op_type in ("QLinearConv16", "QLinearMatMul16")]
    sx, sw, sy = (np.asarray(node.input(i).const) for i in (1, 4, 6))
    assert isinstance(node.requant, FloatRequant)
    assert node.requant.multiplier.tobytes() == float_multiplier(sx, sw, sy).tobytes()
    feed, names = _feed(x_shape), [v.name for v in model.graph.outputs]

    def run(m, target):
        plan = compile_plan(m, target, passes=[])
        return Executor(plan).run(feed, names)[0], plan

    plain, _ = run(copy.deepcopy(model), "native")
    halved = copy.deepcopy(model)
    (h,) = [n for n in halved.graph.nodes if n.op_type == node.op_type]
    h.replace_input(
        6, halved.graph.add_initializer("sy_half", np.asarray(sy / F32(2), F32).reshape(sy.shape))
    )
    h.requant = None
    want, _ = run(halved, "reference")
    node.requant = FloatRequant(node.requant.multiplier * F32(2))
    got, plan = run(model, "native")
    (step,) = [s for s in plan.steps if s.node.op_type == node.op_type]
    assert step.kernel.impl == "native", step.kernel.name
    assert got.tobytes() == want.tobytes()
    assert not np.array_equal(got, plain)


def _scores_model(act=TensorProto.UINT16, out=TensorProto.INT16):
    """x [2, 3, 19, K] -> Q/DQ (a) and Transpose -> Q/DQ with its own scale and zero
    point (b) -> MatMul -> Q -> DQ: ``x @ xᵀ`` of two run-time 16-bit operands, as ONNX
    Runtime's ``activation_type=QInt16`` file of an attention score or a Gram matrix."""
    k = 301
    zt = np.uint16 if act == TensorProto.UINT16 else np.int16
    zo = np.int16 if out == TensorProto.INT16 else np.uint16
    inits = [
        numpy_helper.from_array(np.float32(0.00011), "sa"),
        numpy_helper.from_array(np.array(31000 if zt is np.uint16 else -700, zt), "za"),
        numpy_helper.from_array(np.float32(0.00013), "sb"),
        numpy_helper.from_array(np.array(33000 if zt is np.uint16 else 900, zt), "zb"),
        numpy_helper.from_array(np.float32(0.0041), "sy"),
        numpy_helper.from_array(np.array(-37 if zo is np.int16 else 30000, zo), "zy"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sa", "za"], ["aq"]),
        helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["af"]),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]),
        helper.make_node("QuantizeLinear", ["xt", "sb", "zb"], ["bq"]),
        helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bf"]),
        helper.make_node("MatMul", ["af", "bf"], ["s"]),
        helper.make_node("QuantizeLinear", ["s", "sy", "zy"], ["sq"]),
        helper.make_node("DequantizeLinear", ["sq", "sy", "zy"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "scores",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 19, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 19, 19])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), (2, 3, 19, k)


@pytest.mark.parametrize(
    ("act", "out"), [(TensorProto.UINT16, TensorProto.INT16), (TensorProto.INT16, TensorProto.UINT16)]
)
def test_matmul16_of_two_runtime_operands_runs_native_and_matches_reference(act, out):
    model, shape = _scores_model(act, out)
    blob = model.SerializeToString()
    sess = quanta.InferenceSession(blob)
    names = [s.kernel.name for s in sess.plan.steps if s.node.op_type == "QLinearMatMul16"]
    assert names == ["native:qlinear_matmul16_runtime_b"], names
    assert sess.fallbacks == []
    feed = {"x": np.random.default_rng(7).uniform(-3.3, 3.3, shape).astype(F32)}
    y = sess.run(None, feed)[0]
    ref = quanta.InferenceSession(blob, backend="reference").run(None, feed)[0]
    np.testing.assert_array_equal(y, ref)
    assert len(np.unique(y)) > 50


def test_matmul16_runtime_b_kernel_is_the_twin_at_the_extremes():
    """Codes at both ends of every 16-bit type (products near 2^32, K = 301 of them),
    a bias, the out= path, and a 3-D b broadcast against a 4-D a."""
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext
    from quanta.targets.native.a16w8 import _matmul16_runtime_b

    rng = np.random.default_rng(11)
    for adt, bdt, ydt in (
        (np.uint16, np.int16, np.int16),
        (np.int16, np.uint16, np.uint16),
        (np.uint16, np.uint8, np.uint8),
    ):
        ia, ib = np.iinfo(adt), np.iinfo(bdt)
        a = rng.choice(np.array([ia.min, ia.max, ia.min + 1, ia.max - 3], adt), (2, 3, 5, 301))
        a[0, 0, 0, :17] = rng.integers(ia.min, int(ia.max) + 1, 17).astype(adt)
        b = rng.choice(np.array([ib.min, ib.max, ib.max - 1], bdt), (3, 301, 7))
        args = (
            a,
            np.float32(0.0007),
            np.array(ia.max // 3, adt),
            b,
            np.float32(0.0009),
            np.array(ib.min + 5, bdt),
            np.float32(173.0),
            np.array(np.iinfo(ydt).max // 2 - 11, ydt),
            rng.integers(-(2**30), 2**30, 7).astype(np.int32),
        )
        ctx = KernelContext()
        want = get_op("QLinearMatMul16", "quanta")(ctx, *args)
        got = _matmul16_runtime_b(ctx, *args)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype and len(np.unique(want)) > 3
        out = np.empty_like(want)
        assert _matmul16_runtime_b(ctx, *args, out=out) is out
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("ydt", [np.int16, np.uint16, np.uint8, np.int8])
def test_runtime_b_requantization_in_float32_is_the_twins(ydt):
    """The run-time-b output step (float32 in place) against reference.requant.requantize:
    ties of f32(acc)·m on both signs, both saturations, a product that overflows to inf,
    sums beyond 2^24 (f32(acc) rounds) and per-column multipliers."""
    from quanta.kernels.reference.requant import requantize
    from quanta.targets.native.a16w8 import _requantize_exact_sums

    rng = np.random.default_rng(3)
    info = np.iinfo(ydt)
    zy = int(info.min + (info.max - info.min) // 3)
    ties = np.array([1, 3, 5, -1, -3, -5, 7, -7], np.int64)  # · 0.5: x.5 on both signs
    big = np.array([2**40 + 1, -(2**40) - 3, 2**53 - 1, -(2**52), 2**24 + 1, -(2**24) - 3], np.int64)
    acc = np.concatenate([ties, big, rng.integers(-(2**34), 2**34, 50)])
    acc = np.resize(acc, (3, 64))
    m = np.array([0.5, 3.0e38, 1.7e-9, 0.5], F32)[np.arange(64) % 4]
    want = requantize(acc, m, zy, ydt)
    got = _requantize_exact_sums(acc.astype(np.float64), m, zy, np.dtype(ydt))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert {info.min, info.max} <= set(np.unique(got).tolist()) and len(np.unique(got)) > 10


def test_runtime_b_with_a_nan_scale_takes_the_twins_output():
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext
    from quanta.targets.native.a16w8 import _matmul16_runtime_b

    rng = np.random.default_rng(5)
    a = rng.integers(-3000, 3000, (2, 4, 9)).astype(np.int16)
    b = rng.integers(0, 65535, (2, 9, 7)).astype(np.uint16)
    sb = np.array([0.001, np.nan, 0.002, 0.003, 0.004, 0.005, 0.006], F32)
    args = (a, F32(0.01), np.int16(-5), b, sb, np.uint16(30001), F32(0.7), np.int16(12))
    ctx = KernelContext()
    np.testing.assert_array_equal(
        _matmul16_runtime_b(ctx, *args), get_op("QLinearMatMul16", "quanta")(ctx, *args)
    )
