"""Native com.microsoft NhwcMaxPool (targets/native/pool_nhwc.py, pool.h
max_pool_2d_nhwc) against its reference twin (reference/ms_nhwc_pool.py): bit-exact over
hypothesis geometries, uint8 and int8, threads 1 and 2; the binding's errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from onnx import TensorProto, helper

import quanta
from quanta.kernels import _native
from quanta.kernels.reference.ms_nhwc_pool import nhwc_max_pool
from quanta.kernels.reference.registry import OpContext

MS = "com.microsoft"


def pool_model(elem: int, **attrs):
    g = helper.make_graph(
        [helper.make_node("NhwcMaxPool", ["x"], ["y"], name="mp", domain=MS, **attrs)],
        "g",
        [helper.make_tensor_value_info("x", elem, [None] * 4)],
        [helper.make_tensor_value_info("y", elem, [None] * 4)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


@given(
    hw=st.tuples(st.integers(1, 13), st.integers(1, 13)),
    c=st.sampled_from([1, 3, 7, 16, 17, 64, 65]),
    k=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    d=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pad=st.integers(0, 1),
    ceil=st.booleans(),
    signed=st.booleans(),
)
def test_native_matches_the_twin(hw, c, k, s, d, pad, ceil, signed):
    h, w = hw
    # a window no larger than the padded input, and a pad smaller than the window
    assume((k[0] - 1) * d[0] + 1 <= h + 2 * pad and (k[1] - 1) * d[1] + 1 <= w + 2 * pad and pad < min(k))
    dtype, elem = (np.int8, TensorProto.INT8) if signed else (np.uint8, TensorProto.UINT8)
    x = np.random.default_rng(h * 100 + w).integers(
        -128 if signed else 0, 128 if signed else 256, (2, h, w, c)
    )
    x = x.astype(dtype)
    attrs = {
        "kernel_shape": list(k),
        "strides": list(s),
        "dilations": list(d),
        "pads": [pad] * 4,
        "ceil_mode": int(ceil),
    }
    ref = nhwc_max_pool(OpContext(), x, **attrs)
    m = pool_model(elem, **attrs)
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(m, sess_options=opts, backend="native")
        assert sess.fallbacks == []
        y = sess.run(None, {"x": x})[0]
        assert y.dtype == dtype and y.shape == ref.shape and y.tobytes() == ref.tobytes()


@pytest.mark.parametrize("c", [1, 3, 7, 16, 17, 31, 32, 33, 48, 63, 64, 65, 130])
@pytest.mark.parametrize(
    "k, s, d, pads, ceil",
    [
        ((2, 2), (2, 2), (1, 1), (0, 0, 0, 0), False),  # yunet's, YOLO stems'
        ((3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False),  # ResNet stems'
        ((5, 5), (1, 1), (1, 1), (2, 2, 2, 2), False),  # SPPF's
        ((3, 2), (1, 3), (2, 1), (1, 0, 2, 1), True),  # dilated, uneven pads, ceil overhang
    ],
)
def test_native_matches_the_twin_on_every_isa(c, k, s, d, pads, ceil):
    """Every ISA's channel vectors (64 / 32 / 16 wide, masked or scalar tails) against
    the twin, signed and unsigned, windows cut by pads and by the ceil overhang."""
    from quanta.kernels.reference.conv_geometry import conv_attrs

    attrs = {"kernel_shape": list(k), "strides": list(s), "dilations": list(d), "pads": list(pads)}
    attrs["ceil_mode"] = int(ceil)
    for signed in (False, True):
        dtype = np.int8 if signed else np.uint8
        x = np.random.default_rng(c).integers(-128 if signed else 0, 128 if signed else 256, (2, 11, 13, c))
        x = x.astype(dtype)
        ref = nhwc_max_pool(OpContext(), x, **attrs)
        geom = conv_attrs((2, c, 11, 13), None, **{**attrs, "ceil_mode": ceil})
        try:
            for isa in _native.supported_isas():
                _native.set_isa(isa)
                for threads in (1, 2):
                    y = _native.max_pool_2d_nhwc(
                        x, list(k), list(s), list(d), list(pads[:2]), list(geom.out_shape), threads
                    )
                    assert y.tobytes() == ref.tobytes(), (isa, threads, signed)
        finally:
            _native.clear_isa()


def test_twin_is_the_nchw_maxpool_with_the_channel_axis_moved():
    x = np.random.default_rng(0).integers(0, 256, (1, 5, 6, 3)).astype(np.uint8)
    y = nhwc_max_pool(OpContext(), x, kernel_shape=[2, 3], strides=[1, 2])
    expected = np.zeros((1, 4, 2, 3), np.uint8)
    for oy in range(4):
        for ox in range(2):
            expected[0, oy, ox] = x[0, oy : oy + 2, 2 * ox : 2 * ox + 3].reshape(-1, 3).max(axis=0)
    np.testing.assert_array_equal(y, expected)


def test_binding_errors_name_the_argument():
    x = np.zeros((1, 4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match=r"x: expected dtype uint8 or int8, got float32"):
        _native.max_pool_2d_nhwc(x.astype(np.float32), [2, 2], [1, 1], [1, 1], [0, 0], [3, 3])
    with pytest.raises(ValueError, match=r"expected rank 4 \[N, H, W, C\]"):
        _native.max_pool_2d_nhwc(x[0], [2, 2], [1, 1], [1, 1], [0, 0], [3, 3])
    with pytest.raises(ValueError, match=r"out: expected shape \(1, 3, 3, 3\), got shape \(1, 3, 3, 4\)"):
        _native.max_pool_2d_nhwc(
            x, [2, 2], [1, 1], [1, 1], [0, 0], [3, 3], 1, np.zeros((1, 3, 3, 4), np.uint8)
        )
    with pytest.raises(ValueError, match="last window to start inside"):
        _native.max_pool_2d_nhwc(x, [2, 2], [1, 1], [1, 1], [0, 0], [9, 3])
