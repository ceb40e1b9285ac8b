"""The native float32 binders (quanta/targets/native/float_ops.py).

Four levels:

1. the bound kernels called as the runtime calls them (with and without ``out=``)
   against the registered reference ops, opsets before and from 13 for Softmax, every
   LayerNormalization output count, 1 and 2 threads; ``RUNTIME_FALLBACKS`` is checked so
   a silent hand-over to the twin cannot pass;
2. binder reasons and run-time hand-overs (other dtypes, errors raised by the twin);
3. the ONNX backend node tests of the touched ops through the native backend (tolerance:
   the one each case declares) and through the reference (the new twin);
4. the encoder block quantized by ``quanta.quantize_static``: native vs reference
   bit-exact, with Softmax, LayerNormalization, Add, Sub and Mul running natively; the
   GELU of exported BERTs (Div, Erf, Add, Mul, Mul), a Gelu node of each approximation,
   Tanh, Sigmoid and Relu in one graph: native vs reference bit-exact.

Tolerance 0 for native vs reference: the kernels perform the twin's float32 operations
in the twin's order (tests/kernels/test_float_ops_native.py covers every ISA).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

import quanta
from quanta.ir.graph import Node, Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.kernels.reference.registry import OpError, get_op
from quanta.targets.base import KernelContext
from quanta.targets.native import BINDERS, _load_families
from quanta.targets.native.float_ops import RUNTIME_FALLBACKS
from tests.ir import models
from tests.onnx_node import cases_for, run_case

F32 = np.float32
_load_families()


def bind(op_type: str, n_inputs: int, attrs: dict | None = None, n_outputs: int = 1, dtype=np.float32):
    inputs = [Value(f"in{i}", type=TensorType(elem_from_numpy(np.dtype(dtype)))) for i in range(n_inputs)]
    node = Node(op_type, inputs, [Value(f"out{i}") for i in range(n_outputs)], attrs or {})
    return BINDERS[("", op_type)](None, node)


def assert_bit_exact(expected, got) -> None:
    expected, got = np.asarray(expected), np.asarray(got)
    assert expected.dtype == got.dtype and expected.shape == got.shape, (expected.shape, got.shape)
    np.testing.assert_array_equal(got, expected)  # NaN at the same places, equal elsewhere
    finite = ~np.isnan(expected)
    assert expected[finite].tobytes() == got[finite].tobytes()  # and the signs of zeros


def run_both(op_type: str, inputs: list, attrs: dict, opset: int = 21, n_outputs: int = 1) -> None:
    """The bound kernel (threads 1 and 2, with out= when single-output) vs the registered
    reference op; no run-time hand-over."""
    kernel, reason = bind(op_type, len(inputs), attrs, n_outputs)
    assert kernel is not None, reason
    before = RUNTIME_FALLBACKS[op_type]
    expected = get_op(op_type)(KernelContext(opset=opset, n_outputs=n_outputs), *inputs, **attrs)
    for threads in (1, 2):
        ctx = KernelContext(opset=opset, n_outputs=n_outputs, num_threads=threads)
        got = kernel.fn(ctx, *inputs, **attrs, **kernel.params)
        if n_outputs == 1:
            assert_bit_exact(expected, got)
            out = np.full(np.shape(expected), np.nan, F32)
            assert kernel.fn(ctx, *inputs, **attrs, **kernel.params, out=out) is out
            assert_bit_exact(expected, out)
        else:
            assert len(got) == len(expected) == n_outputs
            for e, g in zip(expected, got, strict=True):
                assert_bit_exact(e, g)
    assert RUNTIME_FALLBACKS[op_type] == before, "the kernel handed a supported call to the twin"


# --------------------------------------------------------------------------------------
# 1. bound kernels vs the registered reference ops
# --------------------------------------------------------------------------------------

SHAPES = [(17,), (3, 65), (2, 3, 16), (1, 6, 15, 128), (2, 1, 384)]


@given(
    shape=st.sampled_from(SHAPES),
    axis_pick=st.integers(0, 7),
    opset=st.sampled_from([11, 13, 21]),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_softmax_kernel_matches_reference(shape, axis_pick, opset, masked, seed) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 5).astype(F32)
    if masked:
        x[rng.random(shape) < 0.2] = -np.inf
    axis = axis_pick % (2 * len(shape)) - len(shape)  # every valid axis, negative and positive
    run_both("Softmax", [x], {"axis": axis}, opset=opset)
    if axis_pick == 0 and (opset >= 13 or len(shape) >= 2):
        run_both("Softmax", [x], {}, opset=opset)  # the default axis of each opset (1 before 13)


@given(
    shape=st.sampled_from([*SHAPES, (3, 7, 17), (2, 1000)]),
    axis_pick=st.integers(0, 7),
    opset=st.sampled_from([11, 13, 21]),
    specials=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_log_softmax_kernel_matches_reference(shape, axis_pick, opset, specials, seed) -> None:
    """Every axis (a transposed copy off the last one), both opset conventions; rows with
    −inf (masked), +inf and NaN (all NaN) and ±0 ties (the maximum's sign is not pinned)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 5).astype(F32)
    if specials:
        flat = x.reshape(-1)
        k = rng.integers(0, flat.size, size=max(1, flat.size // 5))
        flat[k] = rng.choice(np.array([-np.inf, np.inf, np.nan, 0.0, -0.0, 80.0, -80.0], F32), size=k.size)
    axis = axis_pick % (2 * len(shape)) - len(shape)
    run_both("LogSoftmax", [x], {"axis": axis}, opset=opset)
    if axis_pick == 0 and (opset >= 13 or len(shape) >= 2):
        run_both("LogSoftmax", [x], {}, opset=opset)


def test_log_softmax_of_signed_zero_ties_and_one_element_rows() -> None:
    x = np.array([[0.0, -0.0, -0.0], [-0.0, 0.0, -1e-45], [-0.0, -200.0, -300.0]], F32)
    run_both("LogSoftmax", [x], {"axis": -1})
    run_both("LogSoftmax", [x.reshape(9, 1)], {"axis": -1})  # l = log(1) = +0: y = t


@given(
    shape=st.sampled_from(SHAPES),
    axis_pick=st.integers(0, 7),
    n_outputs=st.integers(1, 3),
    with_bias=st.booleans(),
    full_scale=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_layer_normalization_kernel_matches_reference(
    shape, axis_pick, n_outputs, with_bias, full_scale, seed
) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(F32)
    axis = axis_pick % (2 * len(shape)) - len(shape)
    norm_shape = shape[axis % len(shape) :]
    # scale over the whole normalized shape, or over its last dimension (broadcast)
    s_shape = norm_shape if full_scale else norm_shape[-1:]
    scale = (1 + 0.1 * rng.standard_normal(s_shape)).astype(F32)
    inputs = [x, scale]
    if with_bias:
        inputs.append((0.1 * rng.standard_normal(s_shape)).astype(F32))
    run_both("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, n_outputs=n_outputs)


@given(
    n=st.integers(1, 2),
    groups=st.sampled_from([1, 3, 7]),
    per_group=st.sampled_from([1, 2, 3]),
    spatial=st.sampled_from([(5,), (17, 3), (300,), (2, 3, 7), ()]),
    offset=st.sampled_from([0.0, 40.0]),
    seed=st.integers(0, 999),
)
def test_instance_and_group_normalization_kernels_match_reference(
    n, groups, per_group, spatial, offset, seed
) -> None:
    """One row per (n, channel) or (n, group) of (L1)-(L3), (L4'), (L5'), then (IN1):
    rows from 1 element to > 258 (300; and 7 channels x 300 in a group), channel counts
    3, 7, 17-like, scales and biases that differ per channel; GroupNormalization with
    per-group (opset 18) and per-channel (21) scale."""
    rng = np.random.default_rng(seed)
    c = groups * per_group
    x = (rng.standard_normal((n, c, *spatial)) * 3 + offset).astype(F32)
    if spatial:
        gamma, beta = (rng.uniform(-2, 2, c).astype(F32) for _ in range(2))
        run_both("InstanceNormalization", [x, gamma, beta], {"epsilon": 1e-3})
    for opset, k in ((18, groups), (21, c)):
        gamma, beta = (rng.uniform(-2, 2, k).astype(F32) for _ in range(2))
        run_both("GroupNormalization", [x, gamma, beta], {"num_groups": groups, "epsilon": 1e-5}, opset=opset)


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((1, 128, 384), (384,)),
        ((1, 6, 128, 128), (1, 1, 1, 128)),
        ((), (1, 128)),
        ((1, 128), ()),
        ((3, 1), (1, 7)),
    ],
)
def test_binary_kernels_match_reference(op_type, a_shape, b_shape) -> None:
    rng = np.random.default_rng(len(a_shape) * 10 + len(b_shape))
    a = np.array(rng.standard_normal(a_shape), F32)
    b = np.array(rng.standard_normal(b_shape) + 2, F32)
    run_both(op_type, [a, b], {})


@pytest.mark.parametrize(
    ("x_shape", "slope_shape"),
    [
        ((2, 7, 5, 3), (7, 1, 1)),  # a slope per channel, NCHW (Caffe, torch)
        ((1, 17, 9, 13), (1, 17, 1, 1)),  # keras2onnx's [1, C, 1, 1]
        ((2, 5, 3, 17), (17,)),  # NHWC (tf2onnx), and a Dense layer's [N, 17]
        ((3, 65), ()),  # one slope
        ((1, 3, 7, 7), (1, 3, 7, 7)),  # a slope per element
    ],
)
def test_prelu_kernel_matches_reference(x_shape, slope_shape) -> None:
    """Slopes of both signs and zero; x with the IEEE specials (a NaN stays NaN, -0 keeps
    its sign: -0 < 0 is false)."""
    rng = np.random.default_rng(len(x_shape) * 10 + len(slope_shape))
    x = unary_operand(rng, x_shape)
    slope = np.array(rng.standard_normal(slope_shape) * 0.3, F32)
    slope.reshape(-1)[:1] = 0.0
    run_both("PRelu", [x, slope], {}, opset=16)


def test_prelu_slope_wider_than_x_goes_to_the_twin_and_its_error() -> None:
    kernel, reason = bind("PRelu", 2)
    assert kernel is not None and kernel.name == "native:prelu_f32", reason
    before = RUNTIME_FALLBACKS["PRelu"]
    with pytest.raises(OpError, match="slope must broadcast to x"):
        kernel.fn(KernelContext(opset=16), np.ones((1, 3), F32), np.ones((2, 3), F32), **kernel.params)
    assert RUNTIME_FALLBACKS["PRelu"] == before + 1
    assert bind("PRelu", 2, dtype=np.float16) == (None, "native PRelu takes float32 X, got float16")


def unary_operand(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Normal values around the splits of erf / tanh with IEEE specials sprinkled in."""
    x = np.array(rng.standard_normal(shape) * 2.5, F32)
    flat = x.reshape(-1)
    if flat.size:
        k = rng.integers(0, flat.size, size=max(1, flat.size // 6))
        flat[k] = rng.choice(
            np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3.925, 0.921875, 0.75, 4.0, 3e38], F32),
            size=k.size,
        )
    return x


UNARY_NODES = [
    ("Erf", {}),
    ("Tanh", {}),
    ("Sigmoid", {}),
    ("Relu", {}),
    ("Gelu", {}),
    ("Gelu", {"approximate": "none"}),
    ("Gelu", {"approximate": "tanh"}),
    ("Log", {}),
    ("Cos", {}),
    ("Sin", {}),
    ("Atan", {}),
    ("Elu", {}),
    ("Elu", {"alpha": 0.5}),
    ("Elu", {"alpha": 2.3}),
    ("Softplus", {}),
    ("Mish", {}),
]


@pytest.mark.parametrize(("op_type", "attrs"), UNARY_NODES, ids=[f"{o}{a}" for o, a in UNARY_NODES])
@pytest.mark.parametrize("shape", [(), (17,), (3, 65), (1, 128, 1536)])
def test_unary_kernels_match_reference(op_type, attrs, shape) -> None:
    """[1, 128, 1536]: the MiniLM FFN activation, 12 chunks of 2^14 for two threads."""
    x = unary_operand(np.random.default_rng(len(shape)), shape)
    run_both(op_type, [x], attrs, opset=21)


# --------------------------------------------------------------------------------------
# 2. binder reasons, run-time hand-overs
# --------------------------------------------------------------------------------------


def test_binders_refuse_other_types_with_reasons() -> None:
    assert bind("Softmax", 1, dtype=np.float16) == (None, "native Softmax takes float32 input, got float16")
    assert bind("Add", 2, dtype=np.int16) == (None, "native Add takes float32 A, got int16")
    assert bind("Div", 2, dtype=np.int16) == (None, "native Div takes float32 A, got int16")
    assert bind("Div", 2, dtype=np.int32)[0].name == "native:div_int32"  # tensor_ops' broadcast_op
    assert bind("Max", 2, dtype=np.int64)[0].name == "native:max_int64"
    assert bind("Add", 2, dtype=np.int64)[0].name == "native:add_int64"  # tensor_ops' broadcast_op
    assert bind("LayerNormalization", 3, {"stash_type": 11}) == (
        None,
        "native LayerNormalization computes in float32 only (stash_type 1)",
    )
    kernel, _ = bind("LayerNormalization", 3, n_outputs=3)
    assert kernel.name == "native:layer_norm_f32" and not kernel.out  # out= only for one output
    kernel, _ = bind("Div", 2)
    assert kernel.name == "native:div_f32" and kernel.out


def test_unary_binders_refuse_other_types_and_unknown_gelu_modes() -> None:
    assert bind("Erf", 1, dtype=np.float16) == (None, "native Erf takes float32 input, got float16")
    assert bind("Relu", 1, dtype=np.int8) == (None, "native Relu takes float32 input, got int8")
    assert bind("Gelu", 1, {"approximate": "fast"}) == (
        None,
        "native Gelu takes approximate 'none' or 'tanh', got 'fast'",
    )
    assert bind("Gelu", 1, {"approximate": "tanh"})[0].name == "native:gelu_tanh_f32"
    kernel, _ = bind("Erf", 1)
    assert kernel.name == "native:erf_f32" and kernel.out
    assert bind("Log", 1, dtype=np.float64) == (None, "native Log takes float32 input, got float64")
    assert bind("LogSoftmax", 1, dtype=np.float16) == (
        None,
        "native LogSoftmax takes float32 input, got float16",
    )
    assert bind("LogSoftmax", 1)[0].name == "native:log_softmax_f32"


def test_run_time_erf_of_integers_and_float64_goes_to_the_twin() -> None:
    """Erf of int32 rounds erf to the integer type; float64 keeps float64 erf (nn.erf_op)."""
    kernel, _ = bind("Erf", 1)
    before = RUNTIME_FALLBACKS["Erf"]
    got = kernel.fn(KernelContext(), np.array([-3, 0, 2], np.int32), **kernel.params)
    assert got.dtype == np.int32 and np.array_equal(got, [-1, 0, 1])
    x64 = np.array([0.5, -1.5])
    assert kernel.fn(KernelContext(), x64, **kernel.params).dtype == np.float64
    assert RUNTIME_FALLBACKS["Erf"] == before + 2


def test_run_time_other_dtypes_go_to_the_twin() -> None:
    kernel, _ = bind("Mul", 2)
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    before = RUNTIME_FALLBACKS["Mul"]
    got = kernel.fn(KernelContext(), a, a, **kernel.params)
    assert got.dtype == np.int64 and np.array_equal(got, a * a)
    assert RUNTIME_FALLBACKS["Mul"] == before + 1


def test_run_time_softmax_bad_axis_raises_the_twins_error() -> None:
    kernel, _ = bind("Softmax", 1, {"axis": 3})
    with pytest.raises(OpError, match=r"axis: expected in \[-2, 1\], got 3"):
        kernel.fn(KernelContext(opset=13), np.zeros((2, 3), F32), axis=3, **kernel.params)


def test_run_time_scale_that_widens_the_output_goes_to_the_twin() -> None:
    kernel, _ = bind("LayerNormalization", 2)
    x, scale = np.ones((3, 4), F32), np.ones((2, 1, 4), F32)  # broadcasting adds a dimension
    got = kernel.fn(KernelContext(), x, scale, **kernel.params)
    assert got.shape == (2, 3, 4)


# --------------------------------------------------------------------------------------
# 3. ONNX backend node tests
# --------------------------------------------------------------------------------------

NODE_OPS = frozenset(
    {
        "Softmax",
        "LogSoftmax",
        "LayerNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Erf",
        "Gelu",
        "Tanh",
        "Sigmoid",
        "Relu",
        "Log",
        "Cos",
        "Sin",
        "Atan",
        "Mod",
    }
)
NODE_CASES = [pytest.param(c, id=c.name) for c in cases_for(NODE_OPS)]


@pytest.mark.parametrize("case", NODE_CASES)
def test_onnx_node_cases_native_and_reference(case) -> None:
    run_case(case)  # the reference backend: the new twin passes the ONNX expectations
    model = case.model
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    sess = quanta.InferenceSession(model.SerializeToString(), backend="native")
    for inputs, expected in case.data_sets:
        got = sess.run(None, dict(zip(names, inputs, strict=True)))
        for g, e in zip(got, expected, strict=True):
            e = np.asarray(e)
            assert g.shape == e.shape and g.dtype == e.dtype
            if e.dtype.kind == "f":
                np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)  # the case's own tolerance
            else:
                np.testing.assert_array_equal(g, e)


# --------------------------------------------------------------------------------------
# 4. the quantized encoder block
# --------------------------------------------------------------------------------------


def test_quantized_encoder_native_matches_reference_bit_exact(tmp_path) -> None:
    """quanta.quantize_static on the BERT-style block (d=48, 4 heads, padded masks): the
    float islands run natively and the whole model is bit-exact with the reference,
    fully padded rows included."""
    fp32, int8 = tmp_path / "enc.onnx", tmp_path / "enc.int8.onnx"
    onnx.save(models.encoder_block(d=48, heads=4), fp32)
    quanta.quantize_static(str(fp32), str(int8), models.encoder_feeds(d=48), verbose=False)
    rng = np.random.default_rng(4)
    mask = np.ones((2, 19), np.int64)
    mask[1, 11:] = 0
    feeds = {"x": rng.standard_normal((2, 19, 48)).astype(F32), "mask": mask}
    ref = quanta.InferenceSession(str(int8), backend="reference").run(None, feeds)[0]
    before = sum(RUNTIME_FALLBACKS.values())
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(str(int8), sess_options=opts, backend="native")
        assert_bit_exact(ref, sess.run(None, feeds)[0])
        ran = {s.op_type for s in sess.plan.steps if s.kernel.impl == "native"}
        # the attention's scale, mask Add, Softmax and QuantizeLinear run as one SoftmaxQuant
        assert {"SoftmaxQuant", "LayerNormalization", "Add", "Sub", "Mul"} <= ran, sess.fallbacks
    assert sum(RUNTIME_FALLBACKS.values()) == before


def test_activations_graph_native_matches_reference_bit_exact() -> None:
    """The GELU of exported BERTs, y = (x · (1 + Erf(x / √2))) · 0.5 (as all-MiniLM-L6-v2
    has it), beside a Gelu node of each approximation, Tanh, Sigmoid and Relu: every
    node runs natively and the outputs are the reference's bytes for 1 and 2 threads."""
    n = helper.make_node
    nodes = [
        n("Div", ["x", "sqrt2"], ["z"]),
        n("Erf", ["z"], ["e"]),
        n("Add", ["e", "one"], ["e1"]),
        n("Mul", ["x", "e1"], ["xe"]),
        n("Mul", ["xe", "half"], ["bert_gelu"]),
        n("Gelu", ["x"], ["gelu"]),
        n("Gelu", ["x"], ["gelu_tanh"], approximate="tanh"),
        n("Tanh", ["x"], ["tanh"]),
        n("Sigmoid", ["x"], ["sigmoid"]),
        n("Relu", ["x"], ["relu"]),
    ]
    outputs = ["bert_gelu", "gelu", "gelu_tanh", "tanh", "sigmoid", "relu"]
    consts = {"sqrt2": 1.4142135381698608, "one": 1.0, "half": 0.5}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 1536])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [onnx.numpy_helper.from_array(np.array(v, F32), k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    feeds = {"x": unary_operand(np.random.default_rng(9), (1, 128, 1536))}
    ref = quanta.InferenceSession(model, backend="reference").run(None, feeds)
    before = sum(RUNTIME_FALLBACKS.values())
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(model, sess_options=opts, backend="native")
        assert all(s.kernel.impl == "native" for s in sess.plan.steps), sess.fallbacks
        for e, g in zip(ref, sess.run(None, feeds), strict=True):
            assert_bit_exact(e, g)
    assert sum(RUNTIME_FALLBACKS.values()) == before


def test_single_node_layer_normalization_session_with_three_outputs() -> None:
    x = np.random.default_rng(6).standard_normal((2, 5, 33)).astype(F32)
    scale, bias = np.full(33, 1.5, F32), np.full(33, -0.25, F32)
    node = helper.make_node(
        "LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv_std"], axis=-1, name="node"
    )
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "mean", "inv_std")]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        outs,
        [onnx.numpy_helper.from_array(scale, "s"), onnx.numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    ref = quanta.InferenceSession(model, backend="reference").run(None, {"x": x})
    sess = quanta.InferenceSession(model, backend="native")
    got = sess.run(None, {"x": x})
    assert [s.kernel.name for s in sess.plan.steps] == ["native:layer_norm_f32"]
    assert got[1].shape == (2, 5, 1)
    for e, g in zip(ref, got, strict=True):
        assert_bit_exact(e, g)


# --------------------------------------------------------------------------------------
# integer Mod (broadcast_op "mod" / "fmod")
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("fmod", [0, 1])
def test_int_mod_matches_reference(dtype, fmod) -> None:
    """Both signs, divisors 0 and -1 (C's % traps on MIN % -1; the twin gives 0), the
    type's extremes, broadcasting of a [7, 1] by a [17] and of a scalar divisor."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3 + fmod)
    a = rng.integers(-1000, 1000, size=(7, 17)).astype(dtype)
    a[0, :4] = [info.min, info.max, info.min, -7]
    b = rng.integers(-9, 10, size=(17,)).astype(dtype)
    b[:6] = [-1, 0, 3, 2, info.min, -2]
    kernel, reason = bind("Mod", 2, {"fmod": fmod}, dtype=dtype)
    assert kernel is not None and kernel.name == f"native:mod_{np.dtype(dtype)}", reason
    before = RUNTIME_FALLBACKS["Mod"]
    for x, y in ((a, b), (a[:, :1], b), (a, np.array(7, dtype)), (np.array(-7, dtype), b)):
        expected = get_op("Mod")(KernelContext(), x, y, fmod=fmod)
        for threads in (1, 2):
            got = kernel.fn(KernelContext(num_threads=threads), x, y, fmod=fmod, **kernel.params)
            assert_bit_exact(expected, got)
    assert RUNTIME_FALLBACKS["Mod"] == before, "the kernel handed a supported call to the twin"
    assert get_op("Mod")(KernelContext(), np.array([-7], dtype), np.array([2], dtype), fmod=fmod)[0] == (
        -1 if fmod else 1
    )


def test_mod_binder_refuses_float_and_mixed_types() -> None:
    assert bind("Mod", 2, {"fmod": 1}) == (
        None,
        "native Mod takes two int32 or two int64 inputs, got float32, float32",
    )
    assert bind("Mod", 2, dtype=np.int16)[0] is None
    kernel, _ = bind("Mod", 2, dtype=np.int64)
    before = RUNTIME_FALLBACKS["Mod"]
    got = kernel.fn(KernelContext(), np.array([5, -5], np.int64), np.array([3, 3], np.int32), **kernel.params)
    assert np.array_equal(got, [2, 1]) and RUNTIME_FALLBACKS["Mod"] == before + 1  # the twin's promotion


def test_mod_of_a_width_runs_natively_in_a_session() -> None:
    """A recognizer's width remainder (Sub, Mod by a constant, int64) on the native path:
    no fallback, the twin's values."""
    w = helper.make_tensor_value_info("w", TensorProto.INT64, [5])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [5])
    graph = helper.make_graph(
        [
            helper.make_node("Sub", ["w", "one"], ["d"]),
            helper.make_node("Mod", ["d", "eight"], ["y"]),
        ],
        "width_mod",
        [w],
        [y],
        [
            helper.make_tensor("one", TensorProto.INT64, [], [1]),
            helper.make_tensor("eight", TensorProto.INT64, [], [8]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = quanta.InferenceSession(model.SerializeToString())
    assert not [f for f in sess.fallbacks if f[1] == "Mod"], sess.fallbacks
    widths = np.array([0, 1, 9, 17, 300], np.int64)
    (got,) = sess.run(None, {"w": widths})
    assert np.array_equal(got, np.mod(widths - 1, 8))


def test_softplus_pass_is_the_twin_on_every_isa() -> None:
    """unary_f32("softplus") runs (SP1)-(SP3) in one pass: the twin's values on every ISA
    and thread count, over the range where u = f32(1 + t) rounds to 1 (|x| > ~17), the
    clamps of exp, ±0, subnormals, ±inf and NaN, 1031 elements (a masked tail)."""
    from quanta.kernels import _native
    from quanta.kernels.reference.float_ops import softplus_f32

    rng = np.random.default_rng(29)
    x = np.concatenate(
        [
            (rng.standard_normal(1000) * 40).astype(F32),
            np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 16.6, -16.6, 17.4, -17.4], F32),
            np.array([88.7, -88.7, 103.9, -103.9, 104.1, -104.1, 1e-8, -1e-8, 3e38, -3e38], F32),
            np.array([0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 0.0078125, -0.0078125, 9.5, -9.5], F32),
        ]
    )
    want = softplus_f32(x)
    try:
        for isa in ("portable", "avx2", "avx512vnni"):
            try:
                _native.set_isa(isa)
            except (ValueError, RuntimeError):
                continue  # the CPU lacks it
            for threads in (1, 2):
                assert_bit_exact(want, _native.unary_f32("softplus", x, threads, None))
    finally:
        _native.clear_isa()
