"""FuseMulQuant: a Mul by a constant per-column (SmoothQuant) factor and a per-tensor
QuantizeLinear become one quanta::MulQuant, bit for bit the pair it replaces; the refusals
with their reasons; and the native kernel against the twin on every ISA (rows of 1, 7,
17, 384 and 4099 values, scalar and per-column factors, saturation at both ends,
quantization ties, non-zero zero points)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage
from quanta.passes.lower.mul_quant import FuseGeluMulQuant, FuseMulQuant, FuseMulQuantPass
from quanta.passes.pattern import RewritePass
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.session import InferenceSession, SessionOptions
from tests.passes.helpers import run_passes, run_ref

X = (2, 5, 17)


def smoothed(
    *,
    c_shape: tuple = (17,),
    swap: bool = False,
    signed: bool = False,
    per_channel_y: bool = False,
    extra_use: bool = False,
    x_shape: tuple = X,
) -> onnx.ModelProto:
    """x -> Mul(c) -> Q -> DQ -> y, and x also read by an Add (a LayerNorm output feeds the
    residual Add too); a Relu also reads the product when ``extra_use``."""
    zy_t = np.int8 if signed else np.uint8
    n = x_shape[-1]
    c = np.linspace(0.37, 2.9, int(np.prod(c_shape))).astype(np.float32).reshape(c_shape)
    inits = [
        numpy_helper.from_array(c, "c"),
        numpy_helper.from_array(
            np.linspace(0.03, 0.05, n).astype(np.float32) if per_channel_y else np.float32(0.0413), "sy"
        ),
        numpy_helper.from_array(
            np.full(n, -100 if signed else 77, zy_t)
            if per_channel_y
            else np.array(-100 if signed else 77, zy_t),
            "zy",
        ),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    kw = {"axis": -1} if per_channel_y else {}
    nodes = [
        helper.make_node("Mul", ["c", "x"] if swap else ["x", "c"], ["v"], name="smooth_mul"),
        helper.make_node("QuantizeLinear", ["v", "sy", "zy"], ["q"], name="q", **kw),
        helper.make_node("DequantizeLinear", ["q", "sy", "zy"], ["y"], name="dq", **kw),
        helper.make_node("Add", ["x", "x"], ["residual"], name="residual"),
    ]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("residual", TensorProto.FLOAT, None),
    ]
    if extra_use:
        nodes.append(helper.make_node("Relu", ["v"], ["r"], name="other_reader"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "smooth", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(x_shape: tuple = X) -> dict[str, np.ndarray]:
    x = (np.random.default_rng(5).standard_normal(x_shape) * 3).astype(np.float32)
    x.reshape(-1)[:3] = [np.float32(3e38), np.float32(-3e38), np.float32(np.nan)]
    return {"x": x}


def fused(proto: onnx.ModelProto):
    model = load(proto)
    result = run_passes(model, [FuseMulQuantPass(), EliminateDead()], stage=Stage.LOWERED)
    return model, result


@pytest.mark.parametrize("c_shape", [(17,), (1, 1, 17), (1,), ()])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("signed", [False, True])
def test_fuses_bit_exact_reference_and_native(c_shape, swap, signed):
    proto = smoothed(c_shape=c_shape, swap=swap, signed=signed)
    model, result = fused(proto)
    assert result.fired("FuseMulQuant") == 1
    ops = sorted((n.op_type, n.domain) for n in model.graph.nodes)
    assert ops == [("Add", ""), ("DequantizeLinear", ""), ("MulQuant", "quanta")]
    f = feeds()
    with np.errstate(all="ignore"):  # 3e38 / y_scale overflows to inf before the clamp
        expected = run_ref(proto, f)
        got = run_ref(model, f)
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(g, e)
    # the whole pipeline on the native target: the kernel gives the twin's bytes
    for threads in (1, 2):
        opts = SessionOptions()
        opts.intra_op_num_threads = threads
        sess = InferenceSession(proto, opts, backend="native")
        assert any(s.kernel.name == "native:mul_quant" for s in sess.plan.steps)
        np.testing.assert_array_equal(sess.run(None, f)[0], expected[0])


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"per_channel_y": True}, "y_scale"),
        ({"extra_use": True}, "'v' (output of 'smooth_mul' (Mul)) is also used"),
        ({"c_shape": (5, 1)}, "the Mul is not a float32 activation times a per-column float32 constant"),
        ({"c_shape": (2, 5, 17)}, "the Mul is not a float32 activation times a per-column float32 constant"),
    ],
)
def test_refusals(kwargs, reason):
    model = load(smoothed(**kwargs))
    p = RewritePass([FuseMulQuant()])
    result = run_passes(model, [p], stage=Stage.LOWERED)
    assert result.fired("FuseMulQuant") == 0
    reasons = [r.reason for r in p.why_not("FuseMulQuant")]
    assert any(r.startswith(reason) for r in reasons), reasons


@pytest.mark.parametrize("shape", [(3, 7), (5, 1), (2, 3, 17), (4, 384), (2, 4099)])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("signed", [False, True])
def test_native_mul_quant_matches_the_twin_every_isa(shape, per_column, signed):
    from quanta.kernels import _native
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext

    rng = np.random.default_rng(shape[-1] * 7 + len(shape))
    ys = np.float32(0.0371)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    n = shape[-1]
    c = rng.uniform(0.2, 3.0, n if per_column else 1).astype(np.float32)
    # products on (or one rounding away from) the ties between codes k and k + 1
    k = rng.integers(-60, 60, shape).astype(np.float32)
    x.reshape(-1)[::3] = (
        ((k + np.float32(0.5)) * ys / np.broadcast_to(c, shape)).astype(np.float32).reshape(-1)[::3]
    )
    x.reshape(-1)[:4] = [np.float32(3e38), np.float32(-3e38), np.float32(np.nan), np.float32(0)][: x.size]
    zy = np.array(-77 if signed else 5, np.int8 if signed else np.uint8)
    with np.errstate(all="ignore"):
        twin = get_op("MulQuant", "quanta")(KernelContext(), x, c, ys, zy)
    assert twin.dtype == zy.dtype and twin.shape == shape
    try:
        for isa in _native.supported_isas():
            _native.set_isa(isa)
            for threads in (1, 2):
                got = _native.mul_quant(x, c, float(ys), int(zy), bool(signed), threads)
                assert got.tobytes() == twin.tobytes(), (isa, threads)
    finally:
        _native.clear_isa()


def test_native_mul_quant_refuses_a_factor_of_another_length():
    from quanta.kernels import _native

    with pytest.raises(ValueError, match=r"mul_quant: c: expected 1 or 17 values, got 3"):
        _native.mul_quant(np.zeros((2, 17), np.float32), np.ones(3, np.float32), 0.1, 0, False)


# --- FuseGeluMulQuant: Gelu -> MulQuant as one node, eq. (OV1) of docs/float-ops.md ---------


def gelu_smoothed(
    *,
    approximate: str = "none",
    extra_use: bool = False,
    signed: bool = False,
    x_shape: tuple = (3, 1031),
    ms: bool = False,
) -> onnx.ModelProto:
    """x -> Gelu -> Mul(c) -> Q -> DQ -> y (opset 20's Gelu, or with ``ms`` the com.microsoft
    Gelu of an opset-17 file, what FuseGelu writes there; a row longer than the kernel's
    1024-float piece); a Relu also reads the Gelu's output when ``extra_use``."""
    n = x_shape[-1]
    zy_t = np.int8 if signed else np.uint8
    inits = [
        numpy_helper.from_array(np.linspace(0.41, 2.3, n).astype(np.float32), "c"),
        numpy_helper.from_array(np.float32(0.0297), "sy"),
        numpy_helper.from_array(np.array(-93 if signed else 61, zy_t), "zy"),
    ]
    nodes = [
        helper.make_node("Gelu", ["x"], ["g"], name="ffn_gelu", domain="com.microsoft")
        if ms
        else helper.make_node("Gelu", ["x"], ["g"], name="ffn_gelu", approximate=approximate),
        helper.make_node("Mul", ["g", "c"], ["v"], name="smooth_mul"),
        helper.make_node("QuantizeLinear", ["v", "sy", "zy"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "sy", "zy"], ["y"], name="dq"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_use:
        nodes.append(helper.make_node("Relu", ["g"], ["r"], name="other_reader"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes,
        "gelu_smooth",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        outputs,
        inits,
    )
    if ms:  # ONNX's shape inference does not know the contrib op: its output's type as a file states it
        g.value_info.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, list(x_shape)))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)] if ms else None
    return helper.make_model(g, opset_imports=opsets or [helper.make_opsetid("", 20)])


def gelu_feeds(x_shape: tuple = (3, 1031)) -> dict[str, np.ndarray]:
    """N(-0.6, 1.3) as an FFN's pre-activation, with both erf branches (|x/√2| past the
    split), large and tiny values."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(x_shape) * 1.3 - 0.6).astype(np.float32)
    flat = x.reshape(-1)
    flat[:8] = [5.5, -5.5, 3.1, -3.1, 40.0, -40.0, 1e-30, -0.0]
    flat[8::97] = rng.uniform(-9, 9, flat[8::97].size).astype(np.float32)
    return {"x": x}


@pytest.mark.parametrize("ms", [False, True])
@pytest.mark.parametrize("signed", [False, True])
def test_gelu_fuses_into_mul_quant_bit_exact(signed, ms):
    proto = gelu_smoothed(signed=signed, ms=ms)
    model, result = fused(proto)
    assert result.fired("FuseMulQuant") == 1 and result.fired("FuseGeluMulQuant") == 1
    nodes = sorted(model.graph.nodes, key=lambda n: n.op_type)
    assert [(n.op_type, n.domain) for n in nodes] == [("DequantizeLinear", ""), ("MulQuant", "quanta")]
    assert nodes[1].attrs.get("activation") == "gelu"
    f = gelu_feeds()
    expected = run_ref(proto, f)
    got = run_ref(model, f)
    np.testing.assert_array_equal(got[0], expected[0])
    # the codes span the grid: a test that only saw a saturated or constant output would pass vacuously
    assert len(np.unique(expected[0])) > 100
    for threads in (1, 2):
        opts = SessionOptions()
        opts.intra_op_num_threads = threads
        sess = InferenceSession(proto, opts, backend="native")
        assert any(s.kernel.name == "native:gelu_mul_quant" for s in sess.plan.steps)
        assert not any(s.op_type == "Gelu" for s in sess.plan.steps)
        np.testing.assert_array_equal(sess.run(None, f)[0], expected[0])


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"extra_use": True}, "'g' (output of 'ffn_gelu' (Gelu)) is also used"),
        ({"approximate": "tanh"}, "'ffn_gelu' (Gelu) is the tanh approximation"),
    ],
)
def test_gelu_mul_quant_refusals(kwargs, reason):
    model = load(gelu_smoothed(**kwargs))
    p = RewritePass([FuseMulQuant(), FuseGeluMulQuant()])
    result = run_passes(model, [p], stage=Stage.LOWERED)
    assert result.fired("FuseMulQuant") == 1 and result.fired("FuseGeluMulQuant") == 0
    assert any(n.op_type == "Gelu" for n in model.graph.nodes)
    reasons = [r.reason for r in p.why_not("FuseGeluMulQuant")]
    assert any(r.startswith(reason) for r in reasons), reasons


@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 17), (4, 384), (2, 1536), (3, 4099)])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("signed", [False, True])
def test_native_gelu_mul_quant_matches_the_twin_every_isa(shape, per_column, signed):
    from quanta.kernels import _native
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext

    rng = np.random.default_rng(shape[-1] * 5 + len(shape))
    x = (rng.standard_normal(shape) * 1.7 - 0.4).astype(np.float32)
    x.reshape(-1)[::11] = rng.uniform(-12, 12, x.reshape(-1)[::11].size).astype(np.float32)
    x.reshape(-1)[:4] = [np.float32(3e38), np.float32(-3e38), np.float32(np.nan), np.float32(-0.0)][: x.size]
    n = shape[-1]
    c = rng.uniform(0.2, 3.0, n if per_column else 1).astype(np.float32)
    ys = np.float32(0.0213)
    zy = np.array(-71 if signed else 9, np.int8 if signed else np.uint8)
    ctx = KernelContext()
    with np.errstate(all="ignore"):
        twin = get_op("MulQuant", "quanta")(ctx, x, c, ys, zy, activation="gelu")
        # (OV1) is the Gelu step's twin followed by the MulQuant step's twin
        chain = get_op("MulQuant", "quanta")(ctx, get_op("Gelu")(ctx, x), c, ys, zy)
        plain = get_op("MulQuant", "quanta")(ctx, x, c, ys, zy)
    assert twin.tobytes() == chain.tobytes()
    assert twin.tobytes() != plain.tobytes()  # the activation is applied
    try:
        for isa in _native.supported_isas():
            _native.set_isa(isa)
            for threads in (1, 2):
                got = _native.mul_quant(x, c, float(ys), int(zy), bool(signed), threads, None, True)
                assert got.tobytes() == twin.tobytes(), (isa, threads)
    finally:
        _native.clear_isa()
