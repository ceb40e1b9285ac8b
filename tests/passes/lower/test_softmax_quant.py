"""FuseSoftmaxQuant: an attention score's scale Mul, mask Add, Softmax and per-tensor
QuantizeLinear become one quanta::SoftmaxQuant, bit for bit the chain it replaces; the
refusals with their reasons; and the native kernel against the twin on every ISA (rows
of 1, 17, 128, 258 and 1030 values, masks broadcast over heads and rows, fully masked
rows, saturation at both ends, non-zero zero points)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage
from quanta.passes.lower.softmax_quant import FuseSoftmaxQuant, FuseSoftmaxQuantPass
from quanta.passes.pattern import RewritePass
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.session import InferenceSession, SessionOptions
from tests.passes.helpers import run_passes, run_ref

X = (2, 3, 5, 17)


def attention_scores(
    *,
    mask_shape: tuple | None = (1, 1, 5, 17),
    scale: bool = True,
    swap: bool = False,
    axis: int = -1,
    signed: bool = False,
    per_channel_y: bool = False,
    extra_use: bool = False,
    x_shape: tuple = X,
    dequantized: bool = False,
) -> onnx.ModelProto:
    """x -> Mul(0.17677669) -> Add(mask) -> Softmax -> Q -> DQ -> y; a Relu also reads
    the Softmax when ``extra_use``."""
    zy_t = np.int8 if signed else np.uint8
    inits = [
        numpy_helper.from_array(np.float32(0.17677669), "c"),
        numpy_helper.from_array(
            np.linspace(0.003, 0.005, x_shape[-1]).astype(np.float32)
            if per_channel_y
            else np.float32(1 / 255),
            "sy",
        ),
        numpy_helper.from_array(
            np.full(x_shape[-1], -100 if signed else 3, zy_t)
            if per_channel_y
            else np.array(-100 if signed else 3, zy_t),
            "zy",
        ),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    nodes, v = [], "x"
    if dequantized:  # Softmax(DQ(Q(x))): the integer lowerings' pattern
        inits += [numpy_helper.from_array(np.float32(0.01), "sx"), numpy_helper.from_array(np.int16(3), "zx")]
        nodes += [
            helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
            helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
        ]
        v = "xd"
    if scale:
        nodes.append(helper.make_node("Mul", ["c", "x"] if swap else ["x", "c"], ["v"], name="mul"))
        v = "v"
    if mask_shape is not None:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, list(mask_shape)))
        nodes.append(helper.make_node("Add", ["mask", v] if swap else [v, "mask"], ["w"], name="add"))
        v = "w"
    nodes += [
        helper.make_node("Softmax", [v], ["s"], name="softmax", axis=axis),
        helper.make_node(
            "QuantizeLinear", ["s", "sy", "zy"], ["q"], name="q", **({"axis": -1} if per_channel_y else {})
        ),
        helper.make_node(
            "DequantizeLinear", ["q", "sy", "zy"], ["y"], name="dq", **({"axis": -1} if per_channel_y else {})
        ),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_use:
        nodes.append(helper.make_node("Relu", ["s"], ["r"], name="other_reader"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(mask_shape: tuple | None = (1, 1, 5, 17), x_shape: tuple = X) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    out = {"x": (rng.standard_normal(x_shape) * 9).astype(np.float32)}
    if mask_shape is not None:
        m = np.where(rng.random(mask_shape) < 0.3, np.float32(-3.4028235e38), np.float32(0)).astype(
            np.float32
        )
        out["mask"] = m
    return out


def fused(proto: onnx.ModelProto):
    model = load(proto)
    result = run_passes(model, [FuseSoftmaxQuantPass(17), EliminateDead()], stage=Stage.LOWERED)
    return model, result


@pytest.mark.parametrize("mask_shape", [(1, 1, 5, 17), (2, 1, 1, 17), (17,), None])
@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("signed", [False, True])
def test_fuses_reference_and_native(mask_shape, scale, swap, signed):
    """The fused node's twin is the chain's but for the exp ((EN1)-(EN6) for (E1)-(E6)):
    its codes are the chain's within one (here: all equal, no value lies near a rounding
    tie), and the whole pipeline on the native target gives the fused twin's bytes."""
    proto = attention_scores(mask_shape=mask_shape, scale=scale, swap=swap, signed=signed)
    model, result = fused(proto)
    assert result.fired("FuseSoftmaxQuant") == 1
    ops = [(n.op_type, n.domain) for n in model.graph.nodes]
    assert ops == [("SoftmaxQuant", "quanta"), ("DequantizeLinear", "")]
    f = feeds(mask_shape)
    chain = run_ref(proto, f)[0]
    expected = run_ref(model, f)[0]
    assert np.all(np.abs(expected - chain) <= np.float32(1 / 255) * 1.0001)
    np.testing.assert_array_equal(expected, chain)
    for threads in (1, 2):
        opts = SessionOptions()
        opts.intra_op_num_threads = threads
        sess = InferenceSession(proto, opts, backend="native")
        assert any(s.kernel.name == "native:softmax_quant" for s in sess.plan.steps)
        np.testing.assert_array_equal(sess.run(None, f)[0], expected)


def _ties_of_the_two_exps(d: int, seed: int):
    """Rows x [64, d] and, for elements whose softmax differs between the exps (E1)-(E6)
    and (EN1)-(EN6) (by an ulp), a y_scale that puts the (E1)-(E6) value on a rounding
    tie: the (row, y_scale) pairs whose codes differ between the two exps."""
    from quanta.kernels.reference.float_ops import softmax_rows

    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((64, d)) * 6).astype(np.float32)
    ye, yn = softmax_rows(x), softmax_rows(x, fused=True)
    out = []
    for r, c in np.argwhere(ye != yn):
        for k in (40, 100, 200):
            sy = np.float32(ye[r, c] / np.float32(k + 0.5))
            a, b = (np.rint(np.float32(y[r, c]) / sy) for y in (ye, yn))
            if a != b:
                out.append((r, sy))
                break
    return x, out


@pytest.mark.parametrize(("d", "seed"), [(37, 5), (128, 6), (17, 8)])
def test_softmax_quant_uses_the_fused_exp_on_every_isa(d, seed):
    """On rows where the two exps give different 8-bit codes (found by search: a y_scale
    that puts one softmax value on a tie), the twin's codes are those of (EN1)-(EN6), not
    the unfused chain's, and the native kernel on every ISA gives the twin's bytes: a path
    that kept (E1)-(E6) would show here."""
    from quanta.kernels import _native
    from quanta.kernels.reference.nn import softmax
    from quanta.kernels.reference.quantize import quantize_linear_op
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext

    x, cases = _ties_of_the_two_exps(d, seed)
    assert len(cases) >= 3, len(cases)
    twin_op = get_op("SoftmaxQuant", "quanta")
    ctx = KernelContext()
    zy = np.array(3, np.uint8)
    try:
        for r, sy in cases[:6]:
            row = np.repeat(x[r : r + 1], 5, axis=0)  # a lockstep group of four and one row
            twin = twin_op(ctx, row, None, None, sy, zy)
            chain = quantize_linear_op(ctx, softmax(ctx, row, axis=-1), sy, zy)
            assert not np.array_equal(twin, chain)
            assert np.abs(twin.astype(np.int32) - chain.astype(np.int32)).max() == 1
            for isa in _native.supported_isas():
                _native.set_isa(isa)
                got = _native.softmax_quant(row, None, None, None, float(sy), int(zy), False, 1)
                assert got.tobytes() == twin.tobytes(), isa
    finally:
        _native.clear_isa()


@pytest.mark.parametrize("signed", [False, True])
def test_softmax_quant_codes_against_float64(signed):
    """docs/float-ops.md "SoftmaxQuant": every code is the float64 softmax's quantization
    within one, and a code differs from it only where the float64 quotient y/y_scale lies
    within 2e-3 of a rounding tie (the float32 softmax's relative error, measured at most
    67 · 2^-24, times at most 255 codes); rows of 7, 17, 128 and 300 values of spreads 0.1
    to 12, three scales, non-zero zero points."""
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext

    rng = np.random.default_rng(17 + signed)
    op, ctx = get_op("SoftmaxQuant", "quanta"), KernelContext()
    lo, hi = (-128, 127) if signed else (0, 255)
    zy = np.array(-101 if signed else 9, np.int8 if signed else np.uint8)
    for d in (7, 17, 128, 300):
        x = (rng.standard_normal((400, d)) * rng.uniform(0.1, 12, (400, 1))).astype(np.float32)
        x64 = x.astype(np.float64)
        p64 = np.exp(x64 - x64.max(axis=1, keepdims=True))
        p64 /= p64.sum(axis=1, keepdims=True)
        for sy in (np.float32(1 / 255), np.float32(1 / 256), np.float32(0.0031)):
            got = op(ctx, x, None, None, sy, zy).astype(np.int64)
            t = p64 / np.float64(sy)
            want = np.clip(np.rint(t) + int(zy), lo, hi)
            off = got != want
            assert np.abs(got - want).max() <= 1
            assert np.all(np.abs(t[off] - np.floor(t[off]) - 0.5) < 2e-3)


def test_a_mask_that_widens_x_keeps_the_graphs_value():
    # x [1, 1, 5, 17] + mask [2, 3, 5, 17]: the Add's result is the mask's shape; the native
    # kernel hands it to the twin, which broadcasts as the Add did
    proto = attention_scores(mask_shape=X, x_shape=(1, 1, 5, 17))
    model, result = fused(proto)
    assert result.fired("FuseSoftmaxQuant") == 1
    f = feeds(X, x_shape=(1, 1, 5, 17))
    expected = run_ref(proto, f)[0]
    assert expected.shape == X
    np.testing.assert_array_equal(run_ref(model, f)[0], expected)
    np.testing.assert_array_equal(InferenceSession(proto, backend="native").run(None, f)[0], expected)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"axis": 2}, "the Softmax's axis 2 is not the last"),
        ({"per_channel_y": True}, "y_scale"),
        ({"extra_use": True}, "'s' (output of 'softmax' (Softmax)) is also used"),
        (
            {"dequantized": True, "scale": False, "mask_shape": None},
            "the Softmax reads a DequantizeLinear: left to the integer lowerings",
        ),
    ],
)
def test_refusals(kwargs, reason):
    model = load(attention_scores(**kwargs))
    p = RewritePass([FuseSoftmaxQuant(17)])
    result = run_passes(model, [p], stage=Stage.LOWERED)
    assert result.fired("FuseSoftmaxQuant") == 0
    reasons = [r.reason for r in p.why_not("FuseSoftmaxQuant")]
    assert any(r.startswith(reason) for r in reasons), reasons


@pytest.mark.parametrize(
    ("shape", "mask_shape"),
    [
        ((1, 12, 128, 128), (1, 1, 128, 128)),
        ((3, 7, 17), (3, 1, 17)),
        ((5, 1), (1,)),
        ((2, 3, 258), None),
        ((7, 1030), (7, 1030)),
        ((4097 // 17, 17), (17,)),
    ],
)
@pytest.mark.parametrize("scale", [None, np.float32(0.125)])
@pytest.mark.parametrize("signed", [False, True])
def test_native_softmax_quant_matches_the_twin_every_isa(shape, mask_shape, scale, signed):
    from quanta.ir.graph import Node, Value
    from quanta.kernels import _native
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext
    from quanta.targets.native import BINDERS, _load_families

    rng = np.random.default_rng(shape[-1] * 3 + len(shape))
    x = (rng.standard_normal(shape) * 12).astype(np.float32)
    x.reshape(-1)[:3] = [np.float32(3e38), np.float32(-3e38), np.float32(0)]
    mask = None
    if mask_shape is not None:
        mask = np.where(rng.random(mask_shape) < 0.2, np.float32(-3.4028235e38), np.float32(0)).astype(
            np.float32
        )
        mask.reshape(-1, mask_shape[-1])[0] = np.float32(-np.inf)  # a fully masked row: NaN scores
    ys = np.float32(0.0021)  # the largest probabilities saturate
    zy = np.array(-77 if signed else 5, np.int8 if signed else np.uint8)
    ctx = KernelContext()
    with np.errstate(all="ignore"):
        twin = get_op("SoftmaxQuant", "quanta")(ctx, x, scale, mask, ys, zy)
    assert twin.dtype == zy.dtype and twin.shape == shape
    _load_families()
    node = Node("SoftmaxQuant", [Value(n) for n in "xcmsz"], [Value("y")], {}, domain="quanta")
    kernel, reason = BINDERS[("quanta", "SoftmaxQuant")](None, node)
    assert kernel is not None, reason
    calls = _native.softmax_quant  # the native kernel runs (no fallback to the twin)
    try:
        for isa in _native.supported_isas():
            _native.set_isa(isa)
            for threads in (1, 2):
                got = kernel.fn(KernelContext(num_threads=threads), x, scale, mask, ys, zy)
                assert got.dtype == twin.dtype and got.tobytes() == twin.tobytes(), (isa, threads)
                rows = None
                if mask is not None:
                    from quanta.targets.native.tensor_ops import _mask_rows

                    rows = _mask_rows(x.shape, mask.shape)
                sc = None if scale is None else np.asarray(scale, np.float32).reshape(1)
                direct = calls(x, sc, mask, rows, float(ys), int(zy), bool(signed), threads)
                assert direct.tobytes() == twin.tobytes(), (isa, threads)
    finally:
        _native.clear_isa()


@pytest.mark.parametrize("d", [16, 128, 3 * 16 + 7])
@pytest.mark.parametrize("signed", [False, True])
def test_native_softmax_quant_near_quantization_ties(d, signed):
    """Uniform rows give y = 1/d, and y_scale = (1/d) / (k + 1/2) puts y / y_scale on (or one
    float32 rounding away from) a tie: the fused AVX-512 passes take QuantizeLinear's
    division fallback on exactly the lanes where its run does, as on every other ISA."""
    from quanta.kernels import _native
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext

    rows = 9  # two lockstep groups of four rows and one single row
    x = np.repeat(np.linspace(-3.0, 5.0, rows, dtype=np.float32)[:, None], d, axis=1)
    x[::2, 0] = np.nextafter(x[::2, 0], np.float32(np.inf))  # rows off the exact 1/d too
    zy = np.array(-3 if signed else 3, np.int8 if signed else np.uint8)
    for k in (2, 3, 6):
        ys = np.float32(np.float32(1.0 / d) / np.float32(k + 0.5))
        twin = get_op("SoftmaxQuant", "quanta")(KernelContext(), x, None, None, ys, zy)
        codes = set(np.unique(twin.astype(np.int32) - int(zy)).tolist())
        assert codes & {k, k + 1}, codes  # the row values sit at the tie between k and k + 1
        try:
            for isa in _native.supported_isas():
                _native.set_isa(isa)
                got = _native.softmax_quant(x, None, None, None, float(ys), int(zy), bool(signed), 1)
                assert got.tobytes() == twin.tobytes(), (isa, k)
        finally:
            _native.clear_isa()
