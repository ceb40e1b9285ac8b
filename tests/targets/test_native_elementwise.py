"""The native elementwise and pooling binders (quanta/targets/native/elementwise.py).

Three levels:

1. the bound kernels called directly (as the runtime calls them) against the registered
   reference ops, over hypothesis cases, 1 and 2 threads, with
   ``RUNTIME_FALLBACKS`` checked so that a silent hand-over to the twin cannot pass;
2. single-node models through ``InferenceSession(backend="native")`` vs
   ``backend="reference"``, with the plan's kernel names;
3. the demo CNN quantized by ``quanta.quantize_static``: bit-exact, and QLinearAdd,
   QLinearMul, QLinearGlobalAveragePool, MaxPool and DequantizeLinear absent from
   ``sess.fallbacks``.

Tolerance 0 throughout: each kernel performs its twin's float32 operations in the twin's
order (tests/kernels/test_elementwise_native.py covers every ISA variant).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import quanta
from quanta.ir.graph import Node, Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.kernels.reference.registry import MS_DOMAIN, OpError, get_op
from quanta.targets.base import KernelContext
from quanta.targets.native import BINDERS, _load_families
from quanta.targets.native.elementwise import RUNTIME_FALLBACKS

F32 = np.float32
DTYPES = (np.uint8, np.int8)

_load_families()


def draw_zero_point(rng: np.random.Generator, dtype) -> int:
    info = np.iinfo(dtype)
    z = int(rng.integers(int(info.min), int(info.max) + 1))
    return z if z != 0 else 1


def codes(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    x = rng.integers(int(info.min), int(info.max) + 1, shape)
    flat = x.reshape(-1)
    if flat.size >= 2:
        flat[0], flat[-1] = info.min, info.max
    return x.astype(dtype)


def bind(
    op_type: str,
    domain: str,
    n_inputs: int,
    attrs: dict | None = None,
    consts: dict | None = None,
    n_outputs: int = 1,
    x_dtype=None,
):
    """The native kernel a binder returns for a node whose inputs carry no type except the
    first one's element type when ``x_dtype`` is given (``consts``: input index -> constant
    array, as initializers would be)."""
    consts = consts or {}
    inputs = [Value(f"in{i}", const=consts.get(i)) for i in range(n_inputs)]
    if x_dtype is not None:
        inputs[0].type = TensorType(elem_from_numpy(x_dtype))
    node = Node(op_type, inputs, [Value(f"out{i}") for i in range(n_outputs)], attrs or {}, domain=domain)
    kernel, reason = BINDERS[(domain, op_type)](None, node)
    assert kernel is not None, reason
    assert kernel.impl == "native"
    return kernel


def run_both(
    op_type: str,
    domain: str,
    inputs: list,
    attrs: dict | None = None,
    *,
    opset: int = 21,
    consts: dict | None = None,
    handover_ok: bool = False,
) -> None:
    """The bound native kernel (1 and 2 threads, with and without ``out=``) gives the bytes
    of the registered reference op, without handing the call to the twin (unless
    ``handover_ok``: a geometry the kernel leaves to its twin at run time)."""
    attrs = attrs or {}
    kernel = bind(op_type, domain, len(inputs), attrs, consts, x_dtype=getattr(inputs[0], "dtype", None))
    expected = get_op(op_type, domain)(KernelContext(opset=opset), *inputs, **attrs)
    before = sum(RUNTIME_FALLBACKS.values())
    for threads in (1, 2):
        ctx = KernelContext(opset=opset, num_threads=threads)
        got = kernel.fn(ctx, *inputs, **attrs, **kernel.params)
        exp_list = expected if isinstance(expected, tuple) else (expected,)
        got_list = got if isinstance(got, tuple) else (got,)
        for e, g in zip(exp_list, got_list, strict=True):
            assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
            np.testing.assert_array_equal(g, e, err_msg=f"{op_type} threads={threads}")
        if kernel.out and not isinstance(expected, tuple):
            buf = np.full(expected.shape, 77, expected.dtype)
            res = kernel.fn(ctx, *inputs, **attrs, **kernel.params, out=buf)
            assert res is buf
            np.testing.assert_array_equal(buf, expected, err_msg=f"{op_type} out= threads={threads}")
    if not handover_ok:
        assert sum(RUNTIME_FALLBACKS.values()) == before, f"{op_type} handed a supported call to the twin"


# --------------------------------------------------------------------------------------
# 1. Bound kernels vs registered twins (hypothesis)
# --------------------------------------------------------------------------------------


@st.composite
def binary_inputs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shapes = draw(
        st.sampled_from(
            [
                ((3, 7, 17), (3, 7, 17)),
                ((2, 7, 5, 3), (7, 1, 1)),
                ((2, 33), ()),
                ((1,), (2, 17)),
                ((5, 1, 3), (1, 4, 1)),
                ((2, 3, 9), (9,)),
            ]
        )
    )
    if draw(st.booleans()):
        shapes = shapes[::-1]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sa, sb = F32(rng.uniform(0.005, 0.2)), F32(rng.uniform(0.005, 0.2))
    sc = F32(rng.uniform(0.02, 0.5)) if draw(st.booleans()) else F32(0.001)
    dt = dtype
    zps = [np.array(draw_zero_point(rng, dtype), dt) for _ in range(3)]
    if draw(st.booleans()):
        zps[1] = None  # optional B_zero_point: 0
    return [
        codes(rng, shapes[0], dtype),
        np.array(sa),
        zps[0],
        codes(rng, shapes[1], dtype),
        np.array(sb),
        zps[1],
        np.array(sc),
        zps[2],
    ]


@given(inputs=binary_inputs(), op=st.sampled_from(["QLinearAdd", "QLinearMul"]), const_params=st.booleans())
def test_native_qlinear_add_mul_match_reference(inputs, op, const_params) -> None:
    # const_params: the scales and zero points are initializers, converted once at
    # compile time (the binder's prepared scalars) instead of on every call
    consts = {i: inputs[i] for i in (1, 2, 4, 5, 6, 7) if inputs[i] is not None} if const_params else None
    if const_params and inputs[5] is not None:  # (an omitted input is a runtime Value in bind())
        kernel = bind(op, MS_DOMAIN, len(inputs), None, consts, x_dtype=inputs[0].dtype)
        assert kernel.params["prepared"] is not None
    run_both(op, MS_DOMAIN, inputs, consts=consts)


@st.composite
def dequantize_inputs(draw):
    dtype = draw(st.sampled_from((*DTYPES, np.uint16, np.int16)))  # 16 bits: ORT's QUInt16 / QInt16
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.sampled_from([1, 3, 7, 17]), min_size=rank, max_size=rank)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    axis = draw(st.integers(-rank, rank - 1))
    per_axis = draw(st.booleans()) and shape[axis] > 1
    n = shape[axis] if per_axis else 1
    scale = np.asarray(rng.uniform(0.001, 2.0, n).astype(F32) if per_axis else F32(rng.uniform(0.001, 2.0)))
    zp = np.array([draw_zero_point(rng, dtype) for _ in range(n)], dtype).reshape(scale.shape)
    if draw(st.booleans()):
        zp = None
    return [codes(rng, shape, dtype), scale, zp], {"axis": axis}


@given(case=dequantize_inputs(), domain=st.sampled_from(["", MS_DOMAIN]))
def test_native_dequantize_linear_matches_reference(case, domain) -> None:
    inputs, attrs = case
    run_both("DequantizeLinear", domain, inputs, attrs)


@given(x=st.integers(0, 2**32 - 1).map(lambda s: np.random.default_rng(s).standard_normal((3, 17, 7)) * 5))
def test_native_dynamic_quantize_linear_matches_reference(x) -> None:
    run_both("DynamicQuantizeLinear", "", [np.asarray(x, F32)])


@st.composite
def unary_inputs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = codes(rng, (2, 7, 17), dtype)
    params = [
        np.array(F32(rng.uniform(0.01, 0.2))),
        np.array(draw_zero_point(rng, dtype), dtype),
        np.array(F32(rng.uniform(0.002, 0.05))),
        np.array(draw_zero_point(rng, dtype), dtype),
    ]
    return x, params, draw(st.booleans())


@given(case=unary_inputs(), op=st.sampled_from(["QLinearSigmoid", "QLinearLeakyRelu"]))
def test_native_lookup_activations_match_reference(case, op) -> None:
    """Constant parameters: the table is built at compile time; run-time parameters: at
    the first call (cached)."""
    x, params, constant = case
    attrs = {"alpha": 0.13} if op == "QLinearLeakyRelu" else {}
    consts = {i + 1: p for i, p in enumerate(params)} if constant else None
    run_both(op, MS_DOMAIN, [x, *params], attrs, consts=consts)


@st.composite
def softmax_inputs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = draw(st.sampled_from([(3, 17), (2, 7, 5), (1, 3, 4, 129)]))
    opset = draw(st.sampled_from([11, 13]))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    zy = np.array(-128 if dtype == np.int8 else 0, dtype)
    inputs = [
        codes(rng, shape, dtype),
        np.array(F32(rng.uniform(0.01, 0.3))),
        np.array(draw_zero_point(rng, dtype), dtype),
        np.array(F32(1 / 256)),
        zy,
    ]
    return inputs, {"opset": opset, "axis": axis}


@given(case=softmax_inputs())
def test_native_qlinear_softmax_matches_reference(case) -> None:
    inputs, attrs = case
    run_both("QLinearSoftmax", MS_DOMAIN, inputs, attrs, consts={1: inputs[1]})


@given(dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1), axis=st.sampled_from([0, 1, -1]))
def test_native_qlinear_concat_matches_reference(dtype, seed, axis) -> None:
    rng = np.random.default_rng(seed)
    sy, zy = np.array(F32(0.04)), np.array(draw_zero_point(rng, dtype), dtype)
    shapes = [(2, 3, 5), (2, 3, 5), (2, 3, 5)]
    shapes = [tuple(d + (i if a == axis % 3 else 0) for a, d in enumerate(s)) for i, s in enumerate(shapes)]
    triples = [
        [codes(rng, shapes[0], dtype), sy, zy],  # the output's parameters: copied
        [codes(rng, shapes[1], dtype), np.array(F32(0.09)), np.array(draw_zero_point(rng, dtype), dtype)],
        [codes(rng, shapes[2], dtype), np.array(F32(0.013)), np.array(draw_zero_point(rng, dtype), dtype)],
    ]
    inputs = [sy, zy, *(v for t in triples for v in t)]
    consts = {i: v for i, v in enumerate(inputs) if i < 2 or (i - 2) % 3}
    run_both("QLinearConcat", MS_DOMAIN, inputs, {"axis": axis}, consts=consts)


@st.composite
def pool_inputs(draw, op: str):
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    c = draw(st.sampled_from([3, 7, 17]))
    n_sp = draw(st.integers(1, 2))
    spatial = [draw(st.integers(2, 11)) for _ in range(n_sp)]
    kernel = [draw(st.integers(1, min(4, s))) for s in spatial]
    attrs = {
        "kernel_shape": kernel,
        "strides": [draw(st.integers(1, 3)) for _ in range(n_sp)],
        "ceil_mode": int(draw(st.booleans())),
    }
    auto_pad = draw(st.sampled_from(["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    else:
        attrs["auto_pad"] = auto_pad
    x = codes(rng, (2, c, *spatial), dtype)
    if op == "MaxPool":
        attrs["dilations"] = [draw(st.integers(1, 2)) if s >= 2 * k else 1 for s, k in zip(spatial, kernel)]
        return [x], attrs
    attrs["count_include_pad"] = int(draw(st.booleans()))
    if draw(st.booleans()):
        attrs["channels_last"] = 1
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    params = [
        np.array(F32(rng.uniform(0.01, 0.2))),
        np.array(draw_zero_point(rng, dtype), dtype),
        np.array(F32(rng.uniform(0.005, 0.1))),
        np.array(draw_zero_point(rng, dtype), dtype),
    ]
    return [x, *params], attrs


@given(case=pool_inputs("MaxPool"))
def test_native_max_pool_matches_reference(case) -> None:
    inputs, attrs = case
    run_both("MaxPool", "", inputs, attrs)


@given(case=pool_inputs("MaxPool"), seed=st.integers(0, 2**32 - 1), specials=st.booleans())
def test_native_float_max_pool_matches_reference(case, seed, specials) -> None:
    """float32 MaxPool (pool.h max_pool_2d_f32): the twin's values (max only selects),
    NaN and ±inf included; windows entirely in the padding give −inf as the twin's."""
    inputs, attrs = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(inputs[0].shape).astype(F32)
    if specials:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=min(3, flat.size), replace=False)
        flat[idx] = np.array([np.nan, np.inf, -np.inf], F32)[: idx.size]
    run_both("MaxPool", "", [x], attrs)


@pytest.mark.parametrize("dtype", [F32, np.uint8])
def test_max_pool_the_native_kernel_refuses_falls_back_to_the_twin(dtype) -> None:
    """A call the native MaxPool refuses at run time (a 6-D input to a node bound for 2-D
    windows) runs on the twin with the node's attributes only."""
    kernel = bind("MaxPool", "", 1, {"kernel_shape": [2, 2]}, None, x_dtype=np.dtype(dtype))
    x = (np.arange(2 * 3 * 4 * 5 * 2 * 3) % 251).astype(dtype).reshape(2, 3, 4, 5, 2, 3)
    attrs = {"kernel_shape": [2, 2, 1, 2]}
    before = RUNTIME_FALLBACKS[("", "MaxPool")]
    got = kernel.fn(KernelContext(), x, **attrs, **kernel.params)
    assert RUNTIME_FALLBACKS[("", "MaxPool")] == before + 1
    np.testing.assert_array_equal(got, get_op("MaxPool", "")(KernelContext(), x, **attrs))


def test_native_float_max_pool_large_plane_threads() -> None:
    """Enough planes for the pool to split them: 1 and 2 threads, stride 1 and 2."""
    x = np.random.default_rng(5).standard_normal((1, 64, 40, 52)).astype(F32)
    run_both("MaxPool", "", [x], {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]})
    run_both("MaxPool", "", [x], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})


@pytest.mark.parametrize("k", [5, 9, 13])
def test_native_float_max_pool_spp_windows_larger_than_the_plane(k) -> None:
    """SPP pools (stride 1, pad k // 2) on a 13 x 11 plane run separably (row maxima,
    then the maximum of k of them): the twin's values, NaN and the rows and columns
    whose windows reach past every edge included; a dilated window too."""
    x = np.random.default_rng(k).standard_normal((1, 17, 13, 11)).astype(F32)
    x[0, 3, 6, 5] = np.nan
    x[0, 4, 0, 10] = np.inf
    run_both("MaxPool", "", [x], {"kernel_shape": [k, k], "pads": [k // 2] * 4})
    run_both("MaxPool", "", [x], {"kernel_shape": [3, 5], "dilations": [2, 2], "pads": [2, 4, 1, 3]})


@given(case=pool_inputs("QLinearAveragePool"))
def test_native_qlinear_average_pool_matches_reference(case) -> None:
    inputs, attrs = case
    # ORT's SAME geometry with a kernel smaller than its stride has negative pads (windows
    # start inside the input): the twin follows ORT, the native kernel hands it over
    same = attrs.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER")
    negative = same and any(
        k < s for k, s in zip(attrs["kernel_shape"], attrs.get("strides", []), strict=False)
    )
    run_both("QLinearAveragePool", MS_DOMAIN, inputs, attrs, handover_ok=negative)


@given(
    seed=st.integers(0, 2**32 - 1),
    channels_last=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    spatial=st.sampled_from([(5,), (3, 7), (2, 3, 4), (1, 1)]),
)
def test_native_qlinear_global_average_pool_matches_reference(seed, channels_last, dtype, spatial) -> None:
    rng = np.random.default_rng(seed)
    shape = (2, *spatial, 17) if channels_last else (2, 17, *spatial)
    inputs = [
        codes(rng, shape, dtype),
        np.array(F32(0.07)),
        np.array(draw_zero_point(rng, dtype), dtype),
        np.array(F32(rng.uniform(0.01, 0.1))),
        np.array(draw_zero_point(rng, dtype), dtype),
    ]
    run_both("QLinearGlobalAveragePool", MS_DOMAIN, inputs, {"channels_last": int(channels_last)})


def test_native_qlinear_average_pool_whole_image_takes_the_global_path() -> None:
    """Kernel == input and no pads: the twin (as ORT) uses the integer global average,
    whose zero point is added after rounding; a float-sum kernel differs on ties."""
    rng = np.random.default_rng(3)
    x = codes(rng, (2, 7, 3, 5), np.uint8)
    inputs = [x, np.array(F32(0.5)), np.array(3, np.uint8), np.array(F32(0.25)), np.array(100, np.uint8)]
    run_both("QLinearAveragePool", MS_DOMAIN, inputs, {"kernel_shape": [3, 5]})


# --------------------------------------------------------------------------------------
# Refusals: at compile time (binder reasons) and at run time (hand-over to the twin)
# --------------------------------------------------------------------------------------


def binder_reason(
    op_type: str, domain: str, inputs: list[Value], attrs: dict | None = None, n_outputs: int = 1
):
    node = Node(op_type, inputs, [Value(f"o{i}") for i in range(n_outputs)], attrs or {}, domain=domain)
    kernel, reason = BINDERS[(domain, op_type)](None, node)
    assert kernel is None
    return reason


def test_native_binders_refuse_with_reasons() -> None:
    u8 = Value("x", const=np.zeros((1, 3, 4, 4), np.uint8))
    f32 = Value("f", const=np.zeros((1, 3, 4, 4), np.float32))
    per_axis = Value("s", const=np.ones(3, F32))
    one = Value("one", const=np.array(F32(1)))
    z = Value("z", const=np.array(0, np.uint8))
    assert (
        binder_reason(
            "MaxPool", "", [Value("h", const=np.zeros((1, 3, 4, 4), np.float16))], {"kernel_shape": [2, 2]}
        )
        == "native MaxPool takes uint8/int8/float32 x, got float16"
    )
    assert binder_reason("MaxPool", "", [f32], {"kernel_shape": [2, 2]}, n_outputs=2) == (
        "native MaxPool has no Indices output"
    )
    assert binder_reason("MaxPool", "", [u8], {"kernel_shape": [2, 2]}, n_outputs=2) == (
        "native MaxPool has no Indices output"
    )
    assert (
        binder_reason(
            "MaxPool",
            "",
            [Value("x4", const=np.zeros((1, 1, 2, 2, 2, 2), np.uint8))],
            {"kernel_shape": [1, 1, 1, 1]},
        )
        == "native MaxPool takes 1-D, 2-D and 3-D windows, got 4-D"
    )
    assert binder_reason("QLinearAdd", MS_DOMAIN, [u8, per_axis, z, u8, one, z, one, z]) == (
        "native QLinearAdd takes a per-tensor A_scale, got 3 elements"
    )
    assert binder_reason("DequantizeLinear", "", [u8, one, z], {"block_size": 2}) == (
        "blocked DequantizeLinear has no native kernel yet"
    )
    assert binder_reason("DequantizeLinear", "", [Value("i32", const=np.zeros(3, np.int32)), one]) == (
        "native DequantizeLinear takes uint8/int8/uint16/int16 x, got int32"
    )
    assert binder_reason("QLinearSoftmax", MS_DOMAIN, [u8, one, z, one, z]) == (
        "QLinearSoftmax without its opset attribute (the twin raises)"
    )


def test_native_qlinear_add_unbroadcastable_raises_the_twins_error() -> None:
    """Run-time shapes outside the fast path go to the twin, which raises the operator's
    own message; the hand-over is counted."""
    kernel = bind("QLinearAdd", MS_DOMAIN, 8)
    a, b = np.zeros((2, 3), np.uint8), np.zeros((4,), np.uint8)
    s, z = np.array(F32(0.1)), np.array(1, np.uint8)
    before = RUNTIME_FALLBACKS[(MS_DOMAIN, "QLinearAdd")]
    with pytest.raises(OpError, match=r"QLinearAdd: expected broadcastable shapes, got \(2, 3\) and \(4,\)"):
        kernel.fn(KernelContext(), a, s, z, b, s, z, s, z, **kernel.params)
    assert RUNTIME_FALLBACKS[(MS_DOMAIN, "QLinearAdd")] == before + 1


def test_native_dequantize_per_axis_before_opset_13_raises_the_twins_error() -> None:
    kernel = bind("DequantizeLinear", "", 3)
    x, s, z = np.zeros((2, 3), np.uint8), np.ones(3, F32), np.zeros(3, np.uint8)
    with pytest.raises(
        OpError, match=r"DequantizeLinear-10: expected a scalar scale \(per-axis needs opset 13\)"
    ):
        kernel.fn(KernelContext(opset=10), x, s, z, **kernel.params)


# --------------------------------------------------------------------------------------
# 2. Single-node models through sessions
# --------------------------------------------------------------------------------------


def single_node_model(
    op_type: str, domain: str, feeds: dict, inits: list, out_types: list, attrs=None, input_order=None
) -> onnx.ModelProto:
    infos = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for k, v in feeds.items()
    ]
    inits_p = [onnx.numpy_helper.from_array(np.asarray(v), name=k) for k, v in inits]
    outs = [
        helper.make_tensor_value_info(f"y{i}", helper.np_dtype_to_tensor_dtype(np.dtype(t)), None)
        for i, t in enumerate(out_types)
    ]
    node = helper.make_node(
        op_type,
        input_order,
        [f"y{i}" for i in range(len(out_types))],
        domain=domain,
        name="node",
        **(attrs or {}),
    )
    model = helper.make_model(
        helper.make_graph([node], "g", infos, outs, inits_p),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)],
    )
    model.ir_version = 10
    return model


def assert_sessions_agree(model: onnx.ModelProto, feeds: dict, kernel_prefix: str) -> None:
    ref = quanta.InferenceSession(model, backend="reference").run(None, feeds)
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(model, sess_options=opts, backend="native")
        got = sess.run(None, feeds)
        for e, g in zip(ref, got, strict=True):
            assert e.dtype == g.dtype and e.shape == g.shape
            np.testing.assert_array_equal(g, e)
        assert not sess.fallbacks, sess.fallbacks
        assert [s.kernel.name for s in sess.plan.steps if s.node.name == "node"] == [kernel_prefix]


@pytest.mark.parametrize("dtype", DTYPES)
def test_session_native_qlinear_ops_bit_exact(dtype) -> None:
    rng = np.random.default_rng(20)
    x = codes(rng, (2, 7, 9, 5), dtype)
    y = codes(rng, (7, 1, 1), dtype)
    zs = [np.array(draw_zero_point(rng, dtype), dtype) for _ in range(3)]
    sfx = "u8" if dtype == np.uint8 else "s8"
    params = [
        ("sa", np.array(F32(0.05))),
        ("za", zs[0]),
        ("sb", np.array(F32(0.03))),
        ("zb", zs[1]),
        ("sc", np.array(F32(0.07))),
        ("zc", zs[2]),
    ]
    for op in ("QLinearAdd", "QLinearMul"):
        model = single_node_model(
            op,
            MS_DOMAIN,
            {"a": x, "b": y},
            params,
            [dtype],
            input_order=["a", "sa", "za", "b", "sb", "zb", "sc", "zc"],
        )
        assert_sessions_agree(
            model, {"a": x, "b": y}, f"native:{op.lower().replace('qlinear', 'qlinear_')}_{sfx}"
        )
    pool_params = params[:4]
    order = ["a", "sa", "za", "sb", "zb"]
    for op, attrs, name in (
        ("QLinearGlobalAveragePool", {"channels_last": 0}, "qlinear_global_average_pool"),
        (
            "QLinearAveragePool",
            {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "strides": [2, 1]},
            "qlinear_average_pool_2d",
        ),
        ("QLinearSigmoid", {}, "qlinear_sigmoid"),
        ("QLinearLeakyRelu", {"alpha": 0.2}, "qlinear_leaky_relu"),
    ):
        model = single_node_model(op, MS_DOMAIN, {"a": x}, pool_params, [dtype], attrs, input_order=order)
        assert_sessions_agree(model, {"a": x}, f"native:{name}_{sfx}")
    model = single_node_model(
        "MaxPool",
        "",
        {"a": x},
        [],
        [dtype],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        input_order=["a"],
    )
    assert_sessions_agree(model, {"a": x}, f"native:max_pool_2d_{sfx}")
    scale = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], F32)
    model = single_node_model(
        "DequantizeLinear",
        "",
        {"a": x},
        [("s", scale), ("z", np.full(7, zs[0], dtype))],
        [np.float32],
        {"axis": 1},
        input_order=["a", "s", "z"],
    )
    assert_sessions_agree(model, {"a": x}, f"native:dequantize_linear_{sfx}")


def test_session_native_dynamic_quantize_linear_bit_exact() -> None:
    x = (np.random.default_rng(21).standard_normal((3, 37)) * 4).astype(F32)
    model = single_node_model(
        "DynamicQuantizeLinear", "", {"x": x}, [], [np.uint8, np.float32, np.uint8], input_order=["x"]
    )
    assert_sessions_agree(model, {"x": x}, "native:dynamic_quantize_linear_u8")


# --------------------------------------------------------------------------------------
# 3. The demo CNN, quantized
# --------------------------------------------------------------------------------------


def test_session_native_digits_cnn_bit_exact(tmp_path) -> None:
    """quanta.quantize_static on the demo model; native vs reference bit-exact on the
    test images, 1 and 2 threads; the elementwise and pooling nodes run natively."""
    from importlib.resources import files

    assets = files("quanta.cli") / "assets"
    data = np.load(str(assets / "digits_data.npz"))
    out = tmp_path / "digits.int8.onnx"
    calib = [{"input": data["calib_x"][i : i + 8]} for i in range(0, 64, 8)]
    quanta.quantize_static(str(assets / "digits_cnn.onnx"), out, calib, verbose=False)
    x = data["test_x"][:33]
    ref = quanta.InferenceSession(str(out), backend="reference").run(None, {"input": x})[0]
    before = sum(RUNTIME_FALLBACKS.values())
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(str(out), sess_options=opts, backend="native")
        np.testing.assert_array_equal(sess.run(None, {"input": x})[0], ref)
        fell_back = {op for _, op, _ in sess.fallbacks}
        ran = {s.op_type for s in sess.plan.steps if s.kernel.impl == "native"}
        assert not fell_back & {
            "QLinearAdd",
            "QLinearMul",
            "QLinearGlobalAveragePool",
            "MaxPool",
            "NhwcMaxPool",
            "DequantizeLinear",
        }, sess.fallbacks
        # the pool between the convolutions runs channels-last (com.microsoft NhwcMaxPool)
        assert {"QLinearAdd", "QLinearGlobalAveragePool", "NhwcMaxPool"} <= ran
    assert sum(RUNTIME_FALLBACKS.values()) == before
