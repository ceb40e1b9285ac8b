"""GridSample (reference/grid_sample.py, eqs. (GS1)-(GS4); native grid_sample_f32 in
kernels/cpp/tensor_ops/grid_sample.h).

- the twin against onnx's own reference (float tolerance: onnx rounds its coordinates
  through float64 and sums by dot products);
- the native kernel against the twin, byte for byte, 1 and 2 threads, with and without
  ``out=``: linear and nearest, zeros and border padding, align_corners 0 / 1, grids past
  the image, NaN and infinite coordinates, odd sizes and channel counts (3, 7, 17);
- a session runs a deformable-attention-style graph without fallback; the modes the
  native kernel leaves to the twin say so.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import quanta
from quanta.kernels.reference.registry import get_op
from quanta.targets.base import KernelContext
from quanta.targets.native.float_ops import RUNTIME_FALLBACKS
from tests.targets.test_native_tensor_ops import assert_bit_exact, bind

F32 = np.float32


def _grid(rng, n, ho, wo, spread=1.2, specials=False):
    g = rng.uniform(-spread, spread, (n, ho, wo, 2)).astype(F32)
    if specials and g.size > 8:
        g.flat[rng.integers(0, g.size, 4)] = [np.nan, np.inf, -np.inf, 1.0]
    return g


def _native_vs_twin(x, g, attrs):
    kernel, reason = bind("GridSample", [x, g], attrs)
    assert kernel is not None, reason
    before = RUNTIME_FALLBACKS["GridSample"]
    want = get_op("GridSample")(KernelContext(opset=20), x, g, **attrs)
    for threads in (1, 2):
        ctx = KernelContext(opset=20, num_threads=threads)
        assert_bit_exact(want, kernel.fn(ctx, x, g, **attrs), f"GridSample {attrs} {threads}t")
        out = np.full(want.shape, np.nan, F32)
        assert kernel.fn(ctx, x, g, **attrs, out=out) is out
        assert_bit_exact(want, out, f"GridSample {attrs} {threads}t out=")
    assert RUNTIME_FALLBACKS["GridSample"] == before, "the kernel handed a supported call to the twin"
    return want


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.sampled_from([1, 3, 7, 17]),
    hw=st.tuples(st.integers(1, 9), st.integers(1, 11)),
    out_hw=st.tuples(st.integers(1, 6), st.integers(1, 7)),
    mode=st.sampled_from(["linear", "nearest", "bilinear"]),
    padding=st.sampled_from(["zeros", "border"]),
    align=st.sampled_from([0, 1]),
    specials=st.booleans(),
    seed=st.integers(0, 999),
)
def test_native_grid_sample_is_the_twins_bytes(n, c, hw, out_hw, mode, padding, align, specials, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, *hw)).astype(F32)
    g = _grid(rng, n, *out_hw, specials=specials)
    _native_vs_twin(x, g, {"mode": mode, "padding_mode": padding, "align_corners": align})


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align", [0, 1])
def test_twin_agrees_with_onnx_reference(mode, padding, align):
    from quanta.kernels.reference.delegate import delegate_to_onnx_reference

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 5, 7)).astype(F32)
    g = _grid(rng, 2, 4, 6)
    # keep nearest off the exact half-pixel ties, where float64 and float32 coordinates
    # may round apart
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    ctx = KernelContext(opset=20, op_type="GridSample")
    want = delegate_to_onnx_reference(ctx, (x, g), attrs)[0]
    got = get_op("GridSample")(KernelContext(opset=20), x, g, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_deformable_attention_sampling_runs_natively_in_a_session():
    """RT-DETR's multi-scale deformable attention samples each level's value map with
    F.grid_sample (linear, zeros, align_corners 0): 8 heads x 32 channels of an 20 x 20
    map at 300 queries x 4 points."""
    g = helper.make_graph(
        [
            helper.make_node(
                "GridSample", ["v", "g"], ["y"], align_corners=0, mode="linear", padding_mode="zeros"
            )
        ],
        "g",
        [
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [8, 32, 20, 20]),
            helper.make_tensor_value_info("g", TensorProto.FLOAT, [8, 300, 4, 2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()
    rng = np.random.default_rng(1)
    feeds = {"v": rng.standard_normal((8, 32, 20, 20)).astype(F32), "g": _grid(rng, 8, 300, 4, spread=1.0)}
    native = quanta.InferenceSession(model)
    assert native.fallbacks == []
    want = quanta.InferenceSession(model, backend="reference").run(None, feeds)[0]
    assert native.run(None, feeds)[0].tobytes() == want.tobytes()
    ort = pytest.importorskip("onnxruntime")
    got_ort = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(want, got_ort, rtol=1e-5, atol=1e-5)


def test_what_the_native_kernel_leaves_to_the_twin_says_so():
    x, g = np.zeros((1, 1, 2, 2), F32), np.zeros((1, 1, 1, 2), F32)
    assert "cubic" in bind("GridSample", [x, g], {"mode": "cubic"})[1]
    assert "reflection" in bind("GridSample", [x, g], {"padding_mode": "reflection"})[1]
    assert (
        bind("GridSample", [x.astype(np.float64), g], {})[1]
        == "native GridSample takes float32 X, got float64"
    )


# --------------------------------------------------------------------------------------
# RoiAlign (reference/roi_align.py, eqs. (RA1)-(RA4); native roi_align_f32)
# --------------------------------------------------------------------------------------


def _rois(rng, r, h, w, scale):
    xy = rng.uniform(-4, max(w, h) / scale, (r, 2))
    wh = rng.uniform(-2, 12 / scale, (r, 2))  # some malformed (x2 < x1)
    rois = np.concatenate([xy, xy + wh], 1).astype(F32)
    if r > 3:
        rois[0] = [np.nan, 1, 2, 3]  # a NaN coordinate: its samples are outside
    return rois


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.sampled_from([1, 3, 17]),
    hw=st.tuples(st.integers(1, 19), st.integers(1, 23)),
    r=st.integers(0, 9),
    out_hw=st.tuples(st.integers(1, 7), st.integers(1, 5)),
    sampling=st.sampled_from([0, 1, 2]),
    scale=st.sampled_from([1.0, 0.25, 0.0625]),
    mode=st.sampled_from(["avg", "max"]),
    ctm=st.sampled_from(["half_pixel", "output_half_pixel"]),
    seed=st.integers(0, 999),
)
def test_native_roi_align_is_the_twins_bytes(n, c, hw, r, out_hw, sampling, scale, mode, ctm, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, *hw)).astype(F32)
    rois = _rois(rng, r, *hw, scale)
    batch = rng.integers(0, n, r).astype(np.int64)
    attrs = {
        "mode": mode,
        "output_height": out_hw[0],
        "output_width": out_hw[1],
        "sampling_ratio": sampling,
        "spatial_scale": scale,
        "coordinate_transformation_mode": ctm,
    }
    kernel, reason = bind("RoiAlign", [x, rois, batch], attrs)
    assert kernel is not None, reason
    before = RUNTIME_FALLBACKS["RoiAlign"]
    want = get_op("RoiAlign")(KernelContext(opset=16), x, rois, batch, **attrs)
    for threads in (1, 2):
        got = kernel.fn(KernelContext(opset=16, num_threads=threads), x, rois, batch, **attrs)
        assert_bit_exact(want, got, f"RoiAlign {attrs} {threads}t")
    assert RUNTIME_FALLBACKS["RoiAlign"] == before


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
def test_roi_align_twin_is_onnx_references_bytes(mode, ctm):
    """ONNX's reference runs the same float32 steps (numpy scalars): the same bytes."""
    from quanta.kernels.reference.delegate import delegate_to_onnx_reference

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 13, 17)).astype(F32)
    rois = _rois(rng, 3, 13, 17, 0.5)
    batch = np.array([0, 1, 1], np.int64)
    attrs = {"mode": mode, "output_height": 3, "output_width": 4, "sampling_ratio": 0, "spatial_scale": 0.5}
    attrs["coordinate_transformation_mode"] = ctm
    want = delegate_to_onnx_reference(KernelContext(opset=16, op_type="RoiAlign"), (x, rois, batch), attrs)[0]
    assert_bit_exact(want, get_op("RoiAlign")(KernelContext(opset=16), x, rois, batch, **attrs), "twin")
