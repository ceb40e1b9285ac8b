"""C++ kernels of ONNX Runtime's float spatial orders (quanta/kernels/cpp/ort_spatial)
against their NumPy twins: ``ort_resize_linear_f32`` against reference/ort_resize.py
(eqs. (RB1)-(RB3)) and ``mlas_average_pool_f32`` (with the global and vector
orders, through the native binder) against reference/mlas_pool.py (eqs. (AP-M1)-(AP-M5)).

Failure signature this guards against: a float Resize or squeeze-excite AveragePool of a
file ORT's quantizer wrote (MediaPipe's selfie segmenter) whose native kernel sums in
another order than ORT: an ulp on some elements, which moves the scale of the
DynamicQuantizeLinear after it and every code after that.

Tolerance 0 throughout: every step is one float32 operation in the twin's order in both
implementations (NaN at the same places; identical bits elsewhere). Every ISA the CPU
supports runs (``_native.set_isa``: portable and AVX2 here), threads 1 and 2."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels import _native
from quanta.kernels.reference.mlas_pool import GENERIC, mlas_average_pool, pool_kind
from quanta.kernels.reference.ort_resize import ORT_RESIZE_MODES, ort_resize_geometry, ort_resize_linear
from quanta.targets.native.mlas_pool import average_pool
from quanta.targets.native.ort_resize import resize_linear
from tests.isa import assert_same, every_isa

F32 = np.float32


def _data(shape: tuple[int, ...], seed: int, plane_axes: int = 2) -> np.ndarray:
    """Magnitudes over 2^±9, about half −0 (relu(x)·x), and, when there are several planes
    (the last ``plane_axes`` axes), a first plane of −0 only: sums of −0 must keep the
    twin's sign."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-6, 6, shape))).astype(F32)
    x = np.where(rng.random(shape) < 0.5, np.multiply(np.maximum(x, 0), x, dtype=F32), x).astype(F32)
    planes = x.reshape(-1, int(np.prod(shape[len(shape) - plane_axes :])))
    if planes.shape[0] > 1:
        planes[0] = F32(-0.0)
    return x


# (input shape, scales of H and W or sizes): channels 3 / 7 / 17, odd sizes, 2x / 3x /
# 1.5x / 2.5x up, 0.5x / 0.75x / 0.3x down, one row (i1 = i2: weights 0.5), output widths
# 1-7 (the AVX2 row's scalar tail only), 15 / 17 / 33 (8-column steps ± 1), rank 2, 3 and 5
RESIZES = [
    ((1, 7, 17, 13), (2.0, 2.0), None),
    ((2, 3, 9, 11), (3.0, 1.5), None),
    ((1, 17, 20, 30), (0.5, 0.75), None),
    ((1, 3, 1, 5), (2.0, 2.5), None),
    ((1, 3, 31, 57), (0.3, 0.3), None),
    ((2, 5, 31, 29), (2.0, 3.0), None),
    ((1, 7, 6, 4), None, (11, 7)),
    ((1, 3, 13, 9), None, (5, 17)),
    ((1, 17, 8, 16), None, (17, 33)),
    ((9, 11), (1.5, 2.0), None),
    ((3, 5, 7), None, (9, 15)),
    ((2, 3, 2, 5, 7), (2.0, 2.0), None),
]


@pytest.mark.parametrize("mode", ORT_RESIZE_MODES)
@pytest.mark.parametrize("case", RESIZES, ids=str)
def test_ort_resize_linear_native_is_the_twin_every_isa(case, mode):
    shape, scales, sizes = case
    x = _data(shape, sum(shape))
    s_h, s_w, n_h, n_w = ort_resize_geometry(shape, scales or [0.0, 0.0], sizes or [0, 0])
    want = ort_resize_linear(x, s_h, s_w, n_h, n_w, mode)
    for threads in (1, 2):
        every_isa(
            lambda isa, t=threads: assert_same(
                want, resize_linear(x, s_h, s_w, n_h, n_w, mode, num_threads=t), f"{isa}, {t} threads"
            )
        )


def test_ort_resize_linear_native_special_values_every_isa():
    """±inf and NaN inputs: a zero weight times inf is NaN in both (no shortcut for w = 0)."""
    x = _data((1, 3, 9, 13), 3)
    x[0, 1, 2, 3], x[0, 1, 5, 7], x[0, 2, 4, 4] = np.inf, -np.inf, np.nan
    for mode in ORT_RESIZE_MODES:
        with np.errstate(invalid="ignore"):  # 0 · inf in the twin, as in the kernel
            want = ort_resize_linear(x, 2.0, 2.0, 18, 26, mode)
        assert np.isnan(want).any()
        every_isa(
            lambda isa, m=mode, w=want: assert_same(w, resize_linear(x, 2.0, 2.0, 18, 26, m), f"{isa} {m}")
        )


def test_ort_resize_linear_native_writes_into_out_and_checks_taps():
    x = _data((1, 3, 5, 6), 1)
    out = np.empty((1, 3, 10, 12), F32)
    y = resize_linear(x, 2.0, 2.0, 10, 12, "half_pixel", out=out)
    assert y is out
    assert_same(ort_resize_linear(x, 2.0, 2.0, 10, 12, "half_pixel"), out, "out=")
    z = np.zeros(10, np.int32)
    d = np.zeros(10, F32)
    bad = np.full(12, 6, np.int32)  # one past the last column
    with pytest.raises(ValueError, match=r"ort_resize_linear_f32: x1: expected indices in \[0, 6\), got 6"):
        _native.ort_resize_linear_f32(x, z, z, d, d, bad, bad, np.zeros(12, F32), np.zeros(12, F32))


# (shape, kernel, strides, pads, count_include_pad): planes 1, 3, 7, 17, 24 (8-plane blocks
# ± 1 and a tail), windows of 16,384 / 323 / 1,600 taps (> 258), overlapping windows with
# pads (partial windows: counts 4, 6, 9 ...), 1-D and 3-D, both count modes; the global
# (kernel = input, strides 1) and the vector (W stride <= 2, kernel <= 32) orders, which the
# binder runs on their own kernels
POOLS = [
    ((1, 16, 128, 128), (128, 128), (128, 128), (0, 0, 0, 0), 0),  # the selfie segmenter's last mean
    ((1, 24, 17, 19), (17, 19), (17, 19), (0, 0, 0, 0), 0),
    ((1, 7, 40, 40), (40, 40), (40, 40), (0, 0, 0, 0), 0),
    ((1, 1, 33, 35), (33, 35), (33, 35), (0, 0, 0, 0), 1),
    ((1, 3, 37, 41), (9, 7), (3, 5), (2, 1, 3, 2), 0),
    ((1, 3, 37, 41), (9, 7), (3, 5), (2, 1, 3, 2), 1),
    ((1, 3, 8, 17), (2, 5), (3, 3), (0, 2, 1, 2), 0),
    ((2, 17, 9, 11), (3, 3), (2, 3), (1, 1, 1, 1), 0),
    ((2, 7, 301), (37,), (5,), (3, 4), 0),
    ((2, 7, 301), (37,), (5,), (3, 4), 1),
    ((1, 3, 9, 10, 11), (3, 4, 5), (2, 3, 3), (1, 0, 2, 1, 2, 0), 0),
    ((1, 17, 7, 9), (7, 9), (1, 1), (0, 0, 0, 0), 0),  # global
    ((1, 7, 9, 11), (3, 3), (2, 2), (0, 0, 0, 0), 0),  # vector
    ((1, 480, 3, 80), (3, 2), (3, 2), (0, 0, 0, 0), 0),  # vector; NCHWc: generic
    ((1, 3, 5, 5), (2, 2), (2, 2), (0, 0, 0, 3), 0),  # a window wholly in the end padding: the twin
]


@pytest.mark.parametrize("nchwc", [False, True])
@pytest.mark.parametrize("case", POOLS, ids=str)
def test_mlas_average_pool_native_is_the_twin_every_isa(case, nchwc):
    shape, k, s, pads, cip = case
    if nchwc and len(k) != 2:
        pytest.skip("NCHWc blocks 2-D pools only")
    x = _data(shape, len(shape) + sum(k), plane_axes=len(k))
    want = mlas_average_pool(x, k, s, pads, cip, nchwc=nchwc)
    assert want is not None
    kind = pool_kind(x.shape[2:], k, s, pads, nchwc)
    if kind == GENERIC and all(p < kk for p, kk in zip(pads, k + k, strict=True)):
        # the plane of −0 only: MLAS's sum from +0 ends at +0 (a window wholly in the
        # padding aside, whose count is not positive)
        assert not np.any(np.signbit(want.reshape(-1, *want.shape[2:])[0]))
    for threads in (1, 2):
        every_isa(
            lambda isa, t=threads: assert_same(
                want,
                average_pool(x, k, s, pads, cip, nchwc=nchwc, num_threads=t),
                f"{kind} {isa}, {t} threads",
            )
        )


def test_mlas_average_pool_generic_native_checks_its_geometry():
    x = _data((1, 3, 5, 5), 2)
    with pytest.raises(ValueError, match="expected the last window to start inside the input on axis 3"):
        _native.mlas_average_pool_f32(x, [2, 2], [2, 3], [0, 0], [2, 3], False)
    with pytest.raises(
        ValueError, match="expected kernel, strides, pads_begin and out_sizes of 2 values each"
    ):
        _native.mlas_average_pool_f32(x, [2], [2], [0], [2], False)


def _selfie_like_model(path: str) -> None:
    """A squeeze-excite mean (AveragePool, kernel = strides = the input), a 2x bilinear
    Resize and a DynamicQuantizeLinear after each, in a file ORT's quantizer wrote
    (producer onnx.quantize: "auto" takes ORT's float orders)."""
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["xk"]),
        helper.make_node("AveragePool", ["xk"], ["m"], kernel_shape=[19, 23], strides=[19, 23]),
        helper.make_node("Mul", ["xk", "m"], ["g"]),
        helper.make_node(
            "Resize", ["g", "roi", "s"], ["y"], mode="linear", coordinate_transformation_mode="half_pixel"
        ),
        helper.make_node("DynamicQuantizeLinear", ["y"], ["q", "qs", "qz"]),
        helper.make_node("DynamicQuantizeLinear", ["m"], ["mq", "ms", "mz"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([1.7], F32), "k"),
        numpy_helper.from_array(np.array([], F32), "roi"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], F32), "s"),
    ]
    outs = [
        helper.make_tensor_value_info(n, t, None)
        for n, t in (("q", TensorProto.UINT8), ("mq", TensorProto.UINT8))
    ]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 17, 19, 23])]
    m = helper.make_model(
        helper.make_graph(nodes, "g", ins, outs, inits),
        opset_imports=[helper.make_opsetid("", 13)],
        producer_name="onnx.quantize",
    )
    m.ir_version = 8
    onnx.save(m, path)


def test_session_runs_ort_resize_and_many_tap_pool_on_cpp_kernels(tmp_path):
    """The native target binds both ORT-order operators to their C++ kernels (no ``numpy:``
    kernel, no fallback) and gives the reference target's bytes."""
    path = str(tmp_path / "m.onnx")
    _selfie_like_model(path)
    x = _data((1, 17, 19, 23), 9)
    # by name: "auto" takes ORT's float pool order only where this host's ORT is the one the
    # twins model (AVX2 + FMA, no AVX-512F: quanta.quantize.ort_saturation)
    opts = quanta.SessionOptions(float_functions="ort")
    native = quanta.InferenceSession(path, opts, backend="native")
    names = {s.op_type: s.kernel.name for s in native.plan.steps}
    assert names["OrtResizeLinear"] == "native:ort_resize_linear_f32"
    assert names["MlasAveragePool"] == "native:mlas_average_pool_f32"
    assert native.fallbacks == []
    reference = quanta.InferenceSession(path, opts, backend="reference")
    for got, want in zip(native.run(None, {"x": x}), reference.run(None, {"x": x}), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
