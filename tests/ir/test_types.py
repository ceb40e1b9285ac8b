"""Element types compare by value and print/parse round-trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.ir.types import (
    F32,
    I8,
    U8,
    CalibratedType,
    QuantType,
    TensorType,
    elem_from_numpy,
    elem_from_onnx,
    parse_elem,
)


def test_quant_types_with_different_scales_are_different_types():
    assert QuantType(I8, F32, 0.02, 0) != QuantType(I8, F32, 0.08, 0)
    assert QuantType(I8, F32, 0.02, 0) == QuantType(I8, F32, [0.02], [0])
    assert hash(QuantType(I8, F32, 0.02, 0)) == hash(QuantType(I8, F32, 0.02, 0))


def test_quant_type_scale_is_the_float32_value():
    # ONNX stores scales as float32: 0.1 (float64) and float32(0.1) are one type.
    import numpy as np

    assert QuantType(U8, F32, 0.1, 3) == QuantType(U8, F32, float(np.float32(0.1)), 3)


def test_per_axis_types_compare_every_channel():
    a = QuantType(I8, F32, [2.0, 3.0, 4.0], [10, 20, 30], axis=0)
    b = QuantType(I8, F32, [2.0, 3.0, 4.0], [10, 20, 31], axis=0)
    assert a != b
    assert a != QuantType(I8, F32, [2.0, 3.0, 4.0], [10, 20, 30], axis=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(scale=[0.5, 0.25], zero_point=[3], axis=0), "2 scales but 1 zero points"),
        (dict(scale=[0.5, 0.25], zero_point=[3, 4]), "per-tensor type has 2 scales (expected 1)"),
        (dict(scale=0.0, zero_point=0), "scale must be positive and finite, got 0.0"),
        (dict(scale=1.0, zero_point=128), "zero point 128 outside [-128, 127] of i8"),
        (dict(scale=1.0, zero_point=0, block=32), "block size given without an axis"),
    ],
)
def test_quant_type_rejects_inconsistent_parameters(kwargs, message):
    with pytest.raises(ValueError) as e:
        QuantType(I8, F32, **kwargs)
    assert str(e.value) == "quantized type: " + message


def test_calibrated_type_rejects_inverted_range():
    with pytest.raises(ValueError, match=r"calibrated type: min 2.0 > max 1.0"):
        CalibratedType(F32, 2.0, 1.0)


scales = st.floats(min_value=2.0**-26, max_value=2.0**14, allow_nan=False, allow_infinity=False, width=32)


@given(
    storage=st.sampled_from([I8, U8]),
    data=st.data(),
    n=st.integers(1, 5),
    per_axis=st.booleans(),
)
def test_quant_type_print_parse_round_trip(storage, data, n, per_axis):
    n = n if per_axis else 1
    s = data.draw(st.lists(scales, min_size=n, max_size=n))
    z = data.draw(st.lists(st.integers(storage.qmin, storage.qmax), min_size=n, max_size=n))
    q = QuantType(storage, F32, s, z, axis=1 if per_axis else None)
    assert parse_elem(str(q)) == q


def test_calibrated_type_print_parse_round_trip():
    for c in [CalibratedType(F32, -1.5, 3.25), CalibratedType(F32, [-1.0, -2.0], [1.0, 0.5], axis=0)]:
        assert parse_elem(str(c)) == c


def test_element_types_from_onnx_and_numpy_agree():
    import ml_dtypes
    import numpy as np
    from onnx import TensorProto

    for code, dtype in [
        (TensorProto.FLOAT, np.float32),
        (TensorProto.UINT8, np.uint8),
        (TensorProto.INT4, ml_dtypes.int4),
        (TensorProto.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn),
        (TensorProto.BFLOAT16, ml_dtypes.bfloat16),
    ]:
        assert elem_from_onnx(code) == elem_from_numpy(dtype)
        assert elem_from_onnx(code).onnx == code


def test_tensor_type_prints_symbolic_dims():
    assert str(TensorType(QuantType(U8, F32, 0.5, 3), ("N", 3, None))) == "tensor<Nx3x?, Q(u8:f32, 0.5, 3)>"
