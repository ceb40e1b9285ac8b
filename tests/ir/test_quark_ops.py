"""AMD Quark's ExtendedQuantizeLinear / ExtendedDequantizeLinear (quanta/ir/quark_ops.py):
models built here run in quanta's native and reference backends, against Quark's
arithmetic written out in NumPy (its quantize_linear.h: a float32 division, round half to
even, saturation; bf16 / f16 by round to nearest even). ONNX Runtime needs Quark's
custom-op library for these nodes, which the tests do not install."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.quark_ops import QUARK_DOMAIN, decompose_quark_ops

F32 = np.float32
BACKENDS = ["native", "reference"]


def _tensor(name: str, value: np.ndarray) -> onnx.TensorProto:
    if value.dtype == ml_dtypes.bfloat16:  # raw bits: make_tensor reads a value list as floats
        bits = value.view(np.uint16).tobytes()
        return helper.make_tensor(name, TensorProto.BFLOAT16, value.shape, bits, raw=True)
    return numpy_helper.from_array(value, name)


def _qdq_model(x_shape, scale, zero, *, axis=None, dq_only=None, opset=13):
    """x -> ExtendedQuantizeLinear -> ExtendedDequantizeLinear -> y (float32); with
    ``dq_only`` (an integer array) a single ExtendedDequantizeLinear of that constant."""
    inits = [_tensor("s", scale), _tensor("z", zero)]
    attrs = {} if axis is None else {"axis": axis}
    if dq_only is not None:
        inits.append(_tensor("q", dq_only))
        nodes = [
            helper.make_node("ExtendedDequantizeLinear", ["q", "s", "z"], ["y"], domain=QUARK_DOMAIN, **attrs)
        ]
        inputs = []
    else:
        nodes = [
            helper.make_node(
                "ExtendedQuantizeLinear", ["x", "s", "z"], ["q"], name="q", domain=QUARK_DOMAIN, **attrs
            ),
            helper.make_node(
                "ExtendedDequantizeLinear", ["q", "s", "z"], ["y"], name="dq", domain=QUARK_DOMAIN, **attrs
            ),
        ]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x_shape))], inits
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(QUARK_DOMAIN, 1)]
    )
    m.ir_version = 8
    return m


def _along(p: np.ndarray, rank: int, axis: int | None) -> np.ndarray:
    if axis is None or p.size == 1:
        return p.reshape(())
    dims = [1] * rank
    dims[axis % rank] = p.size
    return p.reshape(dims)


def _quark_int(x, scale, zero, axis):
    """quantize_linear.h, integer storage: sat(nearbyint(f32(x / s)) + z), then f32(q − z)·s."""
    s = _along(scale.astype(F32), x.ndim, axis)
    z = _along(zero.astype(np.int64), x.ndim, axis)
    info = np.iinfo(zero.dtype)
    q = np.clip(np.rint((x / s).astype(F32)).astype(np.int64) + z, info.min, info.max)
    return ((q - z).astype(F32) * s).astype(F32)


def _quark_float(x, scale, zero, axis, dtype):
    """quantize_linear.h, bf16 / f16 storage: T(f32(x / s) + f32(z)), then (f32(q) − f32(z))·s."""
    s = _along(scale.astype(F32), x.ndim, axis)
    z = _along(zero.astype(F32), x.ndim, axis)
    with np.errstate(over="ignore"):  # f16 overflow is inf, as Quark's MLFloat16(float)
        q = ((x / s).astype(F32) + z).astype(F32).astype(dtype)
    return ((q.astype(F32) - z).astype(F32) * s).astype(F32)


def _run(model, feeds, backend):
    return quanta.InferenceSession(model.SerializeToString(), backend=backend).run(None, feeds)[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("storage", [np.int8, np.uint8, np.int16, np.uint16])
@pytest.mark.parametrize("axis", [None, 1, -1])
def test_integer_extended_qdq_is_quarks_arithmetic(backend, storage, axis):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 7, 17)) * 30).astype(F32)
    info = np.iinfo(storage)
    levels = float(info.max) - float(info.min)
    n = 1 if axis is None else x.shape[axis]
    scale = (rng.uniform(0.3, 1.7, n) * 60 / levels).astype(F32).reshape(() if axis is None else (n,))
    zero = rng.integers(info.min // 4 if info.min else 0, info.max // 4 + 1, scale.shape).astype(storage)
    x.ravel()[:6] = [2.5, -2.5, 3.5, 1e9, -1e9, 0.0]  # ties and saturation
    x.ravel()[:3] *= float(scale.ravel()[0])
    got = _run(_qdq_model(x.shape, scale, zero, axis=axis), {"x": x}, backend)
    np.testing.assert_array_equal(got, _quark_int(x, scale, zero, axis))


@pytest.mark.parametrize("backend", BACKENDS)
def test_int32_extended_dequantize_subtracts_its_zero_point(backend):
    q = np.array([[-(2**20), -5, 0, 3, 2**24 + 1]], np.int32)
    scale, zero = np.array([0.0173], F32), np.array(9, np.int32)
    got = _run(_qdq_model(q.shape, scale, zero, dq_only=q), {}, backend)
    np.testing.assert_array_equal(got, ((q.astype(np.int64) - 9).astype(F32) * F32(0.0173)).astype(F32))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("axis", [None, 1])
def test_float_extended_qdq_rounds_to_nearest_even(backend, dtype, axis):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((3, 5, 9)) * 40).astype(F32)
    # halfway cases of bf16 (8 bits of mantissa) and f16 (11), both signs, and f16 overflow
    x.ravel()[:4] = [F32(1 + 2**-8), F32(-(1 + 3 * 2**-8)), F32(1 + 2**-11), F32(70000.0)]
    n = 1 if axis is None else x.shape[axis]
    scale = rng.uniform(0.2, 1.3, n).astype(F32).reshape(() if axis is None else (n,))
    zero = rng.uniform(-2, 2, scale.shape).astype(dtype)
    if axis is None:
        scale, zero = np.array(1.0, F32), np.array(0.0, dtype)  # Quark's BF16 configuration
    got = _run(_qdq_model(x.shape, scale, zero, axis=axis), {"x": x}, backend)
    np.testing.assert_array_equal(got, _quark_float(x, scale, zero, axis, dtype))


def test_other_quark_operators_are_named_at_load():
    node = helper.make_node(
        "ExtendedLSTM", ["x", "w", "r"], ["y"], name="lstm0", domain=QUARK_DOMAIN, hidden_size=4
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "w", "r")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(QUARK_DOMAIN, 1)]
    )
    with pytest.raises(quanta.targets.base.TargetError, match=r"lstm0.*com\.amd\.quark::ExtendedLSTM"):
        quanta.InferenceSession(m.SerializeToString())


def test_a_computed_float_scale_stays_with_its_reason():
    inits = [_tensor("z", np.array(0.0, ml_dtypes.bfloat16))]
    node = helper.make_node("ExtendedQuantizeLinear", ["x", "s", "z"], ["q"], name="q0", domain=QUARK_DOMAIN)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("q", TensorProto.BFLOAT16, [4])],
        inits,
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(QUARK_DOMAIN, 1)]
    )
    # the session names the node and the loader's reason, not only the missing kernel
    with pytest.raises(
        quanta.targets.base.TargetError,
        match=r"q0.*ExtendedQuantizeLinear has no reference implementation; the loader left it as "
        r"written: a float-storage quantizer with a computed scale",
    ):
        quanta.InferenceSession(m.SerializeToString())
    left = decompose_quark_ops(m)
    assert left == [
        ("q0", "ExtendedQuantizeLinear", "a float-storage quantizer with a computed scale or zero point")
    ]
    assert m.graph.node[0].domain == QUARK_DOMAIN


def test_rewrite_is_deterministic_and_checks():
    rng = np.random.default_rng(1)
    scale = rng.uniform(0.1, 1, 7).astype(F32)
    zero = rng.integers(-100, 100, 7).astype(np.int16)
    a, b = _qdq_model((2, 7, 3), scale, zero, axis=1), _qdq_model((2, 7, 3), scale, zero, axis=1)
    decompose_quark_ops(a)
    decompose_quark_ops(b)
    assert a.SerializeToString() == b.SerializeToString()
    assert {(n.domain, n.op_type) for n in a.graph.node} == {
        ("com.microsoft", "QuantizeLinear"),
        ("com.microsoft", "DequantizeLinear"),
    }
    onnx.checker.check_model(a)
