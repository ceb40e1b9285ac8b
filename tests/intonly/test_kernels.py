"""The integer-only golden against float math and against the npu-sim C++ kernels
(bit-exact, hypothesis over shapes and parameters)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.ir.graph import Node, Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.kernels.reference import intonly as g
from quanta.kernels.reference.integer_ops import conv_integer, matmul_integer
from quanta.kernels.reference.requant import requantize_fixed_point
from quanta.passes.lower.integer_only import (
    add_params,
    fixed_point,
    fixed_points,
    layer_norm_params,
    softmax_exp_table,
)
from quanta.targets.npu_sim.kernels import DeviceKernelError, execute, supported

native = pytest.importorskip("quanta.kernels._native")
HAS_NATIVE = hasattr(native, "intonly_matmul")
needs_native = pytest.mark.skipif(not HAS_NATIVE, reason="no native intonly kernels")

MODES = st.sampled_from(g.ROUNDING_MODES)


def node(op: str, arrays: list[np.ndarray | None], out_dtype: str = "int8", **attrs) -> Node:
    ins = [
        None if a is None else Value(f"in{i}", TensorType(elem_from_numpy(a.dtype), a.shape), const=a)
        for i, a in enumerate(arrays)
    ]
    out = Value("y", TensorType(elem_from_numpy(np.dtype(out_dtype)), None))
    return Node(
        op,
        ins,
        [out],
        {"out_type": out_dtype, **attrs} if op != "IntLookup" else attrs,
        name=f"t_{op}",
        domain=g.INT_DOMAIN,
    )


def both(n: Node, arrays: list[np.ndarray | None]) -> np.ndarray:
    """The golden's result, after checking the native kernel gives the same bytes."""
    ref = execute(n, arrays, impl="reference")[0]
    # an 8-bit table read is the golden's own kernel; the int16 interpolated one is C++
    if HAS_NATIVE and (n.op_type != "IntLookup" or np.asarray(arrays[1]).shape == (513,)):
        nat = execute(n, arrays, impl="native")[0]
        assert nat.dtype == ref.dtype and nat.shape == ref.shape
        np.testing.assert_array_equal(nat, ref)
    return ref


def rand(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


@settings(max_examples=15)
@given(
    m=st.integers(1, 9), k=st.sampled_from([1, 3, 17, 259]), n=st.sampled_from([1, 3, 7, 17]),
    za=st.integers(-128, 127), seed=st.integers(0, 2**16), mode=MODES, a16=st.booleans(),
)  # fmt: skip
def test_matmul_const_b_matches_the_integer_reference_and_native(m, k, n, za, seed, mode, a16):
    rng = np.random.default_rng(seed)
    adt = np.int16 if a16 else np.int8
    if a16:
        za = 0  # int16 activations are symmetric
    a = rand(rng, (2, m, k), adt)
    b = rand(rng, (k, n), np.int8)
    bias = rng.integers(-5000, 5000, n).astype(np.int64)
    c = (bias - za * b.astype(np.int64).sum(0)).astype(np.int32)  # (IO4)
    mult, shift = fixed_points(np.exp(rng.uniform(-12, -3, n)))
    nd = node("IntMatMul", [a, b, c], a_zero_point=za, b_zero_point=0, y_zero_point=3,
              multiplier=mult, shift=shift, rounding=mode)  # fmt: skip
    y = both(nd, [a, b, c])
    acc = (matmul_integer(a.astype(np.int32), b.astype(np.int32), za, 0).astype(np.int64) + bias).astype(
        np.int32
    )
    if mode == "double":  # the same arithmetic as requant.py's TFLite form
        want = np.stack(
            [requantize_fixed_point(acc[..., j], mult[j], shift[j], 3, np.int8) for j in range(n)], -1
        )
        np.testing.assert_array_equal(y, want)
    real = acc.astype(np.float64) * np.array([mm * 2.0 ** (s - 31) for mm, s in zip(mult, shift)]) + 3
    assert np.all(np.abs(y - np.clip(real, -128, 127)) <= 1.0)  # within one step of the real value


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), za=st.integers(-128, 127), zb=st.integers(-128, 127), mode=MODES)
def test_matmul_two_activations_four_terms(seed, za, zb, mode):
    rng = np.random.default_rng(seed)
    a = rand(rng, (2, 3, 5, 17), np.int8)
    b = rand(rng, (2, 3, 17, 7), np.int8)
    mult, shift = fixed_points(np.array([0.0013]))
    nd = node("IntMatMul", [a, b], a_zero_point=za, b_zero_point=zb, y_zero_point=-4, multiplier=mult,
              shift=shift, rounding=mode)  # fmt: skip
    y = both(nd, [a, b])
    acc = (a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)
    assert np.all(np.abs(y - np.clip(acc * (mult[0] * 2.0 ** (shift[0] - 31)) - 4, -128, 127)) <= 1.0)


@settings(max_examples=15)
@given(
    c_in=st.sampled_from([1, 3, 7]), group_dw=st.booleans(), k=st.sampled_from([1, 3, 5]),
    stride=st.integers(1, 2), dil=st.integers(1, 2), pad=st.integers(0, 2), zx=st.integers(-128, 127),
    seed=st.integers(0, 2**16), mode=MODES,
)  # fmt: skip
def test_conv_pads_with_the_zero_point_and_matches_native(
    c_in, group_dw, k, stride, dil, pad, zx, seed, mode
):
    rng = np.random.default_rng(seed)
    group = c_in if group_dw else 1
    m_out = c_in * 2 if group_dw else 17
    x = rand(rng, (1, c_in, 9, 7), np.int8)
    w = rand(rng, (m_out, c_in // group, k, k), np.int8)
    bias = rng.integers(-3000, 3000, m_out)
    c = (bias - zx * w.reshape(m_out, -1).astype(np.int64).sum(1)).astype(np.int32)
    mult, shift = fixed_points(np.exp(rng.uniform(-10, -4, m_out)))
    geo = {
        "kernel_shape": [k, k],
        "strides": [stride] * 2,
        "dilations": [dil] * 2,
        "pads": [pad] * 4,
        "group": group,
    }
    nd = node("IntConv", [x, w, c], x_zero_point=zx, y_zero_point=-7, multiplier=mult, shift=shift,
              rounding=mode, **geo)  # fmt: skip
    y = both(nd, [x, w, c])
    acc = conv_integer(x, w, zx, 0, group=group, **{kk: v for kk, v in geo.items() if kk != "group"})
    acc = (acc.astype(np.int64) + bias.reshape(1, -1, 1, 1)).astype(np.int32)
    scale = np.array([mm * 2.0 ** (s - 31) for mm, s in zip(mult, shift)]).reshape(1, -1, 1, 1)
    assert np.all(np.abs(y - np.clip(acc * scale - 7, -128, 127)) <= 1.0)


@settings(max_examples=15)
@given(seed=st.integers(0, 2**16), mode=MODES, wide=st.booleans(), act=st.booleans())
def test_add_and_mul_broadcast_and_stay_within_a_step(seed, mode, wide, act):
    rng = np.random.default_rng(seed)
    dt = np.int16 if wide else np.int8
    za, zb, zy = (0, 0, 0) if wide else (int(rng.integers(-20, 20)), int(rng.integers(-20, 20)), 5)
    a = rand(rng, (2, 3, 5), dt)
    b = rand(rng, (1, 3, 1), dt)
    sa, sb, sy = 0.02, 0.013, 0.03
    bits = 16 if wide else 8
    out = "int16" if wide else "int8"
    lo_hi = {"act_min": 0} if act else {}
    pa = add_params(sa, sb, sy, bits)
    pa["multiplier"], pa["shift"] = [pa["multiplier"]], [pa["shift"]]
    y = both(
        node(
            "IntAdd",
            [a, b],
            out,
            a_zero_point=za,
            b_zero_point=zb,
            y_zero_point=zy,
            rounding=mode,
            **pa,
            **lo_hi,
        ),
        [a, b],
    )
    real = ((a.astype(np.float64) - za) * sa + (b - zb) * sb) / sy + zy
    info = np.iinfo(dt)
    want = np.clip(real, 0 if act else info.min, info.max)
    assert np.all(np.abs(y - want) <= 1.0)
    mm, ms = fixed_point(sa * sb / sy)
    y = both(node("IntMul", [a, b], out, a_zero_point=za, b_zero_point=zb, y_zero_point=zy, multiplier=[mm],
                  shift=[ms], rounding=mode), [a, b])  # fmt: skip
    real = (a.astype(np.float64) - za) * (b - zb) * sa * sb / sy + zy
    # one rounding; "double" adds SRDHM's half unit of 2^shift before its final rounding
    assert np.all(np.abs(y - np.clip(real, info.min, info.max)) <= 0.5 + 2.0 ** (ms - 1) + 1e-9)


@settings(max_examples=15)
@given(
    rows=st.integers(1, 6),
    n=st.sampled_from([1, 2, 7, 300]),
    sx=st.floats(0.01, 0.5),
    seed=st.integers(0, 2**16),
)
def test_softmax_is_within_one_step_of_float_softmax(rows, n, sx, seed):
    rng = np.random.default_rng(seed)
    x = rand(rng, (rows, 2, n), np.int8)
    table = softmax_exp_table(sx)
    y = both(node("IntSoftmax", [x, table], axis=-1, y_shift=8, y_zero_point=-128), [x, table])
    xf = x.astype(np.float64) * float(np.float32(sx))
    p = np.exp(xf - xf.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    # the table rounds each exp to 2^-20 of the row maximum: a fraction of a step here
    assert np.all(np.abs((y.astype(np.float64) + 128) - np.clip(p * 256, 0, 255)) <= 0.5 + 1e-3 * 256)
    # other axes: the same row arithmetic on moved data
    y1 = both(node("IntSoftmax", [x, table], axis=1, y_shift=8, y_zero_point=-128), [x, table])
    np.testing.assert_array_equal(np.moveaxis(y1, 1, -1), g.int_softmax(np.moveaxis(x, 1, -1), table))


@settings(max_examples=12)
@given(n=st.sampled_from([3, 17, 384]), wide=st.booleans(), seed=st.integers(0, 2**16))
def test_layer_norm_is_within_a_step_of_float_layernorm(n, wide, seed):
    rng = np.random.default_rng(seed)
    dt = np.int16 if wide else np.int8
    zx = 0 if wide else int(rng.integers(-30, 30))
    x = rand(rng, (3, 2, n), dt)
    x[0, 0] = zx  # a constant row: the result is beta
    gamma = rng.uniform(0.5, 1.5, n)
    beta = rng.uniform(-0.3, 0.3, n)
    sx, sy, eps = (1e-3 if wide else 0.05), 0.03, 1e-5
    G, B, gs, e = layer_norm_params(gamma, beta, sx, sy, eps, n)
    y = both(
        node("IntLayerNorm", [x, G, B], x_zero_point=zx, y_zero_point=2, eps=e, gamma_shift=gs), [x, G, B]
    )
    xf = (x.astype(np.float64) - zx) * sx
    mu = xf.mean(-1, keepdims=True)
    ref = (xf - mu) / np.sqrt(xf.var(-1, keepdims=True) + eps) * gamma + beta
    want = np.clip(ref / sy + 2, -128, 127)
    # D = isqrt(...) floors n·std (in input steps): the normalized value is off by a
    # relative 1/D at most (plus eps's rounding), then one rounding to the output
    d = x.astype(np.int64) - zx
    c = n * d - d.sum(-1, keepdims=True)
    D = np.maximum(g.isqrt(((c * c).sum(-1, keepdims=True) + e) // n), 1).astype(np.float64)
    off = np.abs(want - np.clip(beta / sy + 2, -128, 127))
    assert np.all(np.abs(y - want) <= 0.5 + off * 1.5 / D + 1e-6)
    np.testing.assert_array_equal(y[0, 0], np.clip(np.rint(beta / sy) + 2, -128, 127))


@settings(max_examples=12)
@given(seed=st.integers(0, 2**16), mode=MODES)
def test_global_average_pool_and_rescale(seed, mode):
    rng = np.random.default_rng(seed)
    x = rand(rng, (2, 7, 5, 3), np.int8)
    m, s = fixed_point(0.05 / (0.02 * 15))
    y = both(
        node(
            "IntGlobalAveragePool",
            [x],
            x_zero_point=-3,
            y_zero_point=4,
            multiplier=[m],
            shift=[s],
            rounding=mode,
        ),
        [x],
    )
    real = (x.astype(np.float64) + 3).mean(axis=(2, 3), keepdims=True) * 0.05 / 0.02 + 4
    assert np.all(np.abs(y - np.clip(real, -128, 127)) <= 0.5 + 1e-6)
    m, s = fixed_point(0.05 / 0.0003)
    y = both(node("IntRescale", [x], "int16", input_zero_point=-3, output_zero_point=0, multiplier=[m],
                  shift=[s], rounding=mode), [x])  # fmt: skip
    assert np.all(np.abs(y - (x.astype(np.float64) + 3) * 0.05 / 0.0003) <= 0.5 + 1e-6)


def test_lookup_reads_the_table_by_byte():
    x = np.array([-128, -1, 0, 127], np.int8)
    table = np.arange(256, dtype=np.int16) * 3
    y = both(node("IntLookup", [x, table]), [x, table])
    np.testing.assert_array_equal(y, [384, 765, 0, 381])


def test_device_refuses_float_tensors_and_unknown_ops_naming_the_node():
    x = np.zeros((2, 3), np.float32)
    bad = Node("Relu", [Value("x", TensorType(elem_from_numpy(x.dtype), x.shape))],
               [Value("y", TensorType(elem_from_numpy(x.dtype), x.shape))], name="r")  # fmt: skip
    assert "[op] ai.onnx::Relu is not a npu-sim operator" in supported(bad)
    with pytest.raises(DeviceKernelError, match="node 'r' \\(Relu\\)"):
        execute(bad, [x])
    a = np.zeros((2, 3), np.int8)
    nd = node("IntMatMul", [a, np.zeros((3, 2), np.int8), np.zeros(2, np.int32)], a_zero_point=0,
              y_zero_point=0, multiplier=[1 << 29], shift=[0], rounding="double")  # fmt: skip
    assert "outside [2^30, 2^31)" in supported(nd)
    nd.attrs["multiplier"] = [1 << 30]
    nd.attrs["rounding"] = "stochastic"
    assert "[rounding]" in supported(nd)
