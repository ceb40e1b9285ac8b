"""The native Gram of a convolution's narrow 8-bit rows (quantize/conv_gram.h), GPTQ's
statistics of depthwise and grouped layers and stems: the same exact sums as the im2col
path of quanta.quantize.rounding.RoundedLayer, on every instruction set's build."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.quantize.rounding import RoundedLayer
from tests.quantize.test_rounding import _grouped_conv


@settings(max_examples=25, deadline=None)
@given(
    cg=st.sampled_from([1, 2, 3]),
    groups=st.sampled_from([1, 3, 7, 17]),
    kernel=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    strides=st.tuples(st.integers(1, 3), st.integers(1, 2)),
    pads=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
    zp=st.sampled_from([0, 37, 121, 255]),
    hw=st.sampled_from([(5, 9), (11, 7), (70, 65)]),
)
def test_native_narrow_conv_gram_equals_the_im2col_sums(cg, groups, kernel, strides, pads, zp, hw):
    """The native Gram of narrow 8-bit rows (quantize/conv_gram.h: K < 32, a depthwise or
    grouped layer, a stem) equals the im2col path's exact float64 sums: strided, padded
    (padding reads the zero point), positions past one 4096-position chunk (70 x 65)."""
    from quanta.ir.onnx_io import from_proto
    from quanta.quantize import rounding

    kh, kw = kernel
    if cg * kh * kw >= 32 or hw[0] + pads[0] + pads[2] < kh or hw[1] + pads[1] + pads[3] < kw:
        return
    w = np.random.default_rng(6).standard_normal((2 * groups, cg, kh, kw)).astype(np.float32)
    proto = _grouped_conv(
        w, groups, pads=[pads[0], pads[1], pads[2], pads[3]], strides=list(strides), kernel_shape=[kh, kw]
    )
    n = from_proto(proto).graph.nodes[0]
    x = np.random.default_rng(7).standard_normal((2, cg * groups, *hw)).astype(np.float32) * 3

    def hessians(native: bool):
        layer = RoundedLayer(n, "x", "w", w)
        layer.set_input(0.0191, zp, 0, 255)
        if not native:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(rounding, "_native_conv_gram", lambda: None)
                layer.observe(x)
                layer.observe(x[:1] * 0.5)
        else:
            assert rounding._native_conv_gram() is not None
            layer.observe(x)
            layer.observe(x[:1] * 0.5)
        return layer.hessians(), layer.rows

    from quanta.kernels import _native

    (full_ref, odd_ref), rows_ref = hessians(False)
    assert odd_ref.any()
    try:
        for isa in _native.supported_isas():  # every instruction set's build of the sums
            _native.set_isa(isa)
            (full, odd), rows = hessians(True)
            assert rows == rows_ref
            np.testing.assert_array_equal(full, full_ref, err_msg=isa)
            np.testing.assert_array_equal(odd, odd_ref, err_msg=isa)
    finally:
        _native.clear_isa()


def test_native_conv_gram_names_what_it_expected():
    from quanta.kernels import _native

    x = np.zeros((1, 6, 5, 5), np.uint8)
    out = np.zeros((3, 18, 18), np.int64)
    _native.conv_gram_u8(x, 3, 3, (3, 3), (1, 1), (1, 1, 1, 1), out)
    with pytest.raises(ValueError, match="do not split into 4 groups"):
        _native.conv_gram_u8(x, 3, 4, (3, 3), (1, 1), (1, 1, 1, 1), out)
    with pytest.raises(ValueError, match=r"out: expected shape \(3, 18, 18\)"):
        _native.conv_gram_u8(x, 3, 3, (3, 3), (1, 1), (1, 1, 1, 1), np.zeros((3, 9, 9), np.int64))
    with pytest.raises(ValueError, match="zero_point"):
        _native.conv_gram_u8(x, 300, 3, (3, 3), (1, 1), (1, 1, 1, 1), out)
    with pytest.raises(ValueError, match="expected dtype uint8"):
        _native.conv_gram_u8(x.astype(np.int8), 3, 3, (3, 3), (1, 1), (1, 1, 1, 1), out)


def test_a_plain_1x1_conv_reads_its_codes_without_im2col(monkeypatch):
    """A 1x1, stride-1, unpadded Conv's rows are the sample's own codes: the same sums as
    the im2col path, with conv_rows never called."""
    from quanta.ir.onnx_io import from_proto
    from quanta.quantize import rounding

    w = np.random.default_rng(8).standard_normal((5, 41, 1, 1)).astype(np.float32)  # K = 41: native GEMM
    n = from_proto(_grouped_conv(w, 1)).graph.nodes[0]
    x = np.random.default_rng(9).standard_normal((2, 41, 7, 3)).astype(np.float32)
    layer = RoundedLayer(n, "x", "w", w)
    layer.set_input(0.021, 131, 0, 255)
    calls = []
    monkeypatch.setattr(rounding, "conv_rows", lambda *a, **k: calls.append(a))
    layer.observe(x)
    assert not calls
    xi = np.clip(np.rint(x.astype(np.float64) / np.float64(np.float32(0.021))) + 131, 0, 255) - 131
    r = xi.transpose(0, 2, 3, 1).reshape(-1, 41).astype(np.int64)
    np.testing.assert_array_equal(layer.hessians()[0][0], r.T @ r)


@pytest.mark.parametrize("native", [True, False])
def test_a_received_read_only_state_still_takes_narrow_conv_sums(native, monkeypatch):
    """A state received zero-copy from another process has read-only sums: observing more
    samples into it copies them first (RoundedLayer._writable), on the native narrow Gram
    and on the im2col path alike, and gives the sums of one stream."""
    from quanta.ir.onnx_io import from_proto
    from quanta.quantize import rounding

    if not native:
        monkeypatch.setattr(rounding, "_native_conv_gram", lambda: None)

    w = np.random.default_rng(11).standard_normal((14, 1, 3, 3)).astype(np.float32)  # depthwise, K = 9
    n = from_proto(_grouped_conv(w, 7, pads=[1, 1, 1, 1], strides=[2, 1])).graph.nodes[0]
    xs = [np.random.default_rng(12 + i).standard_normal((1, 7, 9, 13)).astype(np.float32) for i in range(3)]

    def layer():
        lay = RoundedLayer(n, "x", "w", w)
        lay.set_input(0.027, 113, 0, 255)
        return lay

    ref = layer()
    for x in xs:
        ref.observe(x)
    got = layer()
    got.observe(xs[0])
    got._even.flags.writeable = False
    got._odd.flags.writeable = False
    got.observe(xs[1])
    got.observe(xs[2])
    np.testing.assert_array_equal(got.hessians()[0], ref.hessians()[0])
    np.testing.assert_array_equal(got.hessians()[1], ref.hessians()[1])
    assert ref.hessians()[1].any()
