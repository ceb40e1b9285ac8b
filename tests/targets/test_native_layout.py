"""Native Transpose (targets/native/layout.py, kernels/cpp/layout/transpose.h): the perms
that are a batched 2-D transpose run natively and give the reference twin's bytes for
every dtype and thread count; other perms copy the transposed view natively
(copy_strided, tests/targets/test_native_tensor_ops.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

import quanta
from quanta.kernels import _native
from quanta.targets.native.layout import batched_transpose_split

DTYPES = {
    np.uint8: TensorProto.UINT8,
    np.int8: TensorProto.INT8,
    np.float16: TensorProto.FLOAT16,
    np.float32: TensorProto.FLOAT,
    np.int64: TensorProto.INT64,
}


def transpose_model(rank: int, perm: list[int] | None, elem: int):
    attrs = {} if perm is None else {"perm": perm}
    g = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], name="t", **attrs)],
        "g",
        [helper.make_tensor_value_info("x", elem, [None] * rank)],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_split_of_the_perms_a_compiler_inserts():
    assert batched_transpose_split([0, 2, 3, 1]) == (1, 2, 4)  # NCHW -> NHWC: rows C, cols H·W
    assert batched_transpose_split([0, 3, 1, 2]) == (1, 3, 4)  # NHWC -> NCHW: rows H·W, cols C
    assert batched_transpose_split([0, 2, 1, 3]) == (1, 2, 3)  # attention heads: element = last axis
    assert batched_transpose_split([1, 0]) == (0, 1, 2)
    assert batched_transpose_split([0, 1, 2]) is None  # identity: nothing to do
    assert batched_transpose_split([3, 2, 1, 0]) is None  # a full reversal is not one swap
    assert batched_transpose_split([0, 3, 2, 1]) is None
    assert batched_transpose_split([0, 0, 1]) is None  # not a permutation


@given(
    perm=st.sampled_from(
        [[0, 2, 3, 1], [0, 3, 1, 2], [0, 2, 1, 3], [1, 0, 2, 3], [2, 3, 0, 1], [0, 1, 3, 2]]
    ),
    shape=st.lists(st.sampled_from([1, 2, 3, 7, 16, 17, 33]), min_size=4, max_size=4),
    dtype=st.sampled_from(list(DTYPES)),
)
def test_native_transpose_is_the_twins_bytes(perm, shape, dtype):
    x = (np.random.default_rng(sum(shape)).integers(-100, 100, shape)).astype(dtype)
    m = transpose_model(4, perm, DTYPES[dtype])
    ref = quanta.InferenceSession(m, backend="reference").run(None, {"x": x})[0]
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(m, sess_options=opts, backend="native")
        assert sess.fallbacks == []
        y = sess.run(None, {"x": x})[0]
        assert y.dtype == ref.dtype and y.shape == ref.shape and y.tobytes() == ref.tobytes()


def test_large_plane_splits_over_threads_identically():
    # above the 64 KiB single-thread cutoff: the 2-thread split must give the same bytes
    x = np.random.default_rng(3).integers(0, 256, (2, 17, 131, 97)).astype(np.uint8)
    one = _native.transpose_batched(x, 2, 17, 131 * 97, 1)
    two = _native.transpose_batched(x, 2, 17, 131 * 97, 2)
    assert one.tobytes() == two.tobytes() == np.ascontiguousarray(x.transpose(0, 2, 3, 1)).tobytes()


def assert_every_isa_and_thread_count(x: np.ndarray) -> None:
    """transpose_batched of x [B, R, C] gives x.transpose(0, 2, 1)'s bytes on every ISA the
    CPU runs, with 1 and 2 threads."""
    batch, rows, cols = x.shape
    want = np.ascontiguousarray(x.transpose(0, 2, 1)).tobytes()
    try:
        for isa in _native.supported_isas():
            _native.set_isa(isa)
            for threads in (1, 2):
                got = _native.transpose_batched(x, batch, rows, cols, threads)
                assert got.dtype == x.dtype and got.size == x.size, (isa, threads)
                assert got.tobytes() == want, (isa, threads)
    finally:
        _native.clear_isa()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("cols", [1, 31, 32, 33, 4097, 131 * 97])
def test_few_rows_interleave_every_isa_and_thread_count(rows, cols):
    """1-byte elements with 2..4 rows (an image's channels going NHWC) take the few-rows
    path: vpshufb over 32 columns (every ISA but portable) or a per-pixel loop, column
    ranges split over the threads (131·97·R·2 bytes is above the 512 KiB cutoff for R >= 3);
    1 and 5 rows take the tiles. Failure signature: bytes of a neighbouring row or column in
    a 16-byte piece (a wrong vpshufb mask or vperm2i128 pairing), or a missing tail column."""
    x = np.random.default_rng(rows * 1000 + cols).integers(-128, 128, (2, rows, cols)).astype(np.int8)
    assert_every_isa_and_thread_count(x)


@pytest.mark.parametrize("itemsize", [1, 4])
@pytest.mark.parametrize(("rows", "cols"), [(8, 1), (17, 63), (16, 65), (65, 4000), (300, 97), (7, 130)])
def test_simd_tiles_every_isa_and_thread_count(itemsize, rows, cols):
    """1-byte elements with >= 8 rows and 4-byte elements run the convolution paths' SIMD
    tile transposes (16 x 64 bytes, 8 x 8 int32) over blocks of whole source columns
    (65 x 4000 bytes spans two blocks). Every bit pattern is copied (float32 NaN payloads
    included): the elements are random raw bits. Failure signature: a neighbouring row's
    or column's element in a tile edge, or a column block written twice or not at all."""
    rng = np.random.default_rng(rows * 7919 + cols)
    dtype = np.uint8 if itemsize == 1 else np.float32
    x = rng.integers(0, 256, (2, rows, cols * itemsize), dtype=np.uint8).view(dtype)
    assert_every_isa_and_thread_count(x)


def test_default_perm_and_other_perms_run_natively():
    # the default perm reverses the axes: [2, 1, 0] is not one swap -> copy_strided of the
    # transposed view (tensor_ops.py), natively, with the twin's bytes
    x = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    sess = quanta.InferenceSession(transpose_model(3, None, TensorProto.FLOAT), backend="native")
    assert sess.fallbacks == []
    assert [s.kernel.name for s in sess.plan.steps] == ["native:transpose_strided"]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.T)


def test_binding_rejects_bad_arguments():
    x = np.zeros((4, 6), np.uint8)
    with pytest.raises(ValueError, match="not a multiple"):
        _native.transpose_batched(x, 1, 5, 5)
    with pytest.raises(ValueError, match="C-contiguous"):
        _native.transpose_batched(x[:, ::2], 1, 4, 3)
    with pytest.raises(ValueError, match="out: expected"):
        _native.transpose_batched(x, 1, 4, 6, 1, np.zeros((6, 4), np.int8))
    with pytest.raises(ValueError, match="overlaps"):
        _native.transpose_batched(x, 1, 4, 6, 1, x)


def test_per_shape_plans_stay_bounded_under_changing_shapes():
    # a server fed every sequence length must not grow the per-shape plans without limit
    from quanta.targets.native._cache import BoundedCache

    sess = quanta.InferenceSession(transpose_model(4, [0, 2, 1, 3], TensorProto.UINT8), backend="native")
    plans = next(s.kernel.params["plans"] for s in sess.plan.steps if s.op_type == "Transpose")
    for seq in range(1, 3 * BoundedCache.LIMIT):
        x = np.arange(2 * seq * 3 * 5, dtype=np.uint8).reshape(2, seq, 3, 5)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.transpose(0, 2, 1, 3))
        assert len(plans._items) <= BoundedCache.LIMIT


@pytest.mark.parametrize(("batch", "rows", "cols"), [(1, 604 * 81, 1), (3, 1, 4097), (2, 17, 1), (1, 1, 1)])
def test_one_row_or_one_column_is_a_copy(batch, rows, cols):
    """A perm that only moves an axis of size 1 (madmom's input [1, T, 81, 1] to NCHW) is a
    transpose of one row or one column: its bytes are the input's, copied whole."""
    x = (
        np.random.default_rng(rows + cols)
        .integers(0, 256, (batch, rows, cols * 4), dtype=np.uint8)
        .view(np.float32)
    )
    assert_every_isa_and_thread_count(x)


@pytest.mark.parametrize("cols", [2, 3, 4, 5])
@pytest.mark.parametrize("rows", [1, 7, 4097, 614 * 80])
def test_few_columns_of_4_bytes_every_isa_and_thread_count(rows, cols):
    """4-byte elements with 2..4 columns (onsets CNN's 3-channel input going NCHW) scatter
    each row's values into the output rows, row ranges of 4096 split over the threads (614·80
    rows span 12); 5 columns take the tiles. Every bit pattern is copied (raw bits).
    Failure signature: a value of the neighbouring column, or a missing last row range."""
    x = (
        np.random.default_rng(rows * 10 + cols)
        .integers(0, 256, (2, rows, cols * 4), dtype=np.uint8)
        .view(np.float32)
    )
    assert_every_isa_and_thread_count(x)
