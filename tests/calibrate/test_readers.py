"""Calibration data in every accepted form, and errors that name sample and input."""

from __future__ import annotations

import numpy as np
import pytest

from quanta.calibrate.readers import CalibrationDataError, ImagePreprocess, iter_feeds
from quanta.ir.graph import Value
from quanta.ir.types import F32, I64, TensorType


def inputs_x(shape=("N", 3, 4, 5)):
    return [Value("x", TensorType(F32, shape))]


def test_iter_feeds_iterable_reader_and_single_dict():
    feeds = [{"x": np.zeros((1, 3, 4, 5), np.float32)} for _ in range(3)]
    assert len(list(iter_feeds(feeds, inputs_x()))) == 3
    assert len(list(iter_feeds(feeds[0], inputs_x()))) == 1

    class Reader:
        def __init__(self):
            self.rewound = 0
            self.it = iter(feeds)

        def rewind(self):
            self.rewound += 1
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    r = Reader()
    assert len(list(iter_feeds(r, inputs_x()))) == 3
    assert len(list(iter_feeds(r, inputs_x()))) == 3 and r.rewound == 2


def test_iter_feeds_limit():
    feeds = ({"x": np.zeros((1, 3, 4, 5), np.float32)} for _ in range(100))
    assert len(list(iter_feeds(feeds, inputs_x(), limit=7))) == 7


def test_iter_feeds_npz_file_and_folder(tmp_path):
    np.savez(tmp_path / "one.npz", x=np.ones((2, 3, 4, 5), np.float32))
    (got,) = list(iter_feeds(tmp_path / "one.npz", inputs_x()))
    assert got["x"].shape == (2, 3, 4, 5)
    folder = tmp_path / "many"
    folder.mkdir()
    for k in range(4):
        np.savez(folder / f"s{k}.npz", x=np.full((1, 3, 4, 5), k, np.float32))
    got = list(iter_feeds(folder, inputs_x()))
    assert [float(f["x"][0, 0, 0, 0]) for f in got] == [0.0, 1.0, 2.0, 3.0]  # sorted by name
    # several arrays for a single-input model: one sample each
    np.savez(tmp_path / "samples.npz", np.zeros((1, 3, 4, 5), np.float32), np.ones((1, 3, 4, 5), np.float32))
    assert len(list(iter_feeds(tmp_path / "samples.npz", inputs_x()))) == 2


def test_iter_feeds_refuses_pickled_npz(tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.array([object()], dtype=object))
    with pytest.raises(CalibrationDataError, match=r"cannot read as \.npz without pickle"):
        list(iter_feeds(tmp_path / "bad.npz", inputs_x()))


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        (
            {"y": np.zeros((1, 3, 4, 5), np.float32)},
            "calibration sample 0: unknown input 'y'; the model expects 'x' tensor<Nx3x4x5, f32>",
        ),
        (
            {"x": np.zeros((1, 3, 4, 5), np.float64)},
            "calibration sample 0: input 'x' has dtype float64, the model expects float32",
        ),
        (
            {"x": np.zeros((3, 4, 5), np.float32)},
            "calibration sample 0: input 'x' has shape [3, 4, 5] (rank 3), the model expects rank 4 ['N', 3, 4, 5]",
        ),
        (
            {"x": np.zeros((1, 3, 4, 6), np.float32)},
            "calibration sample 0: input 'x' dimension 3 is 6, the model expects 5 (shape ['N', 3, 4, 5])",
        ),
        ({}, "calibration sample 0: missing input(s) ['x']; the model expects 'x' tensor<Nx3x4x5, f32>"),
        ([1, 2], "calibration sample 0: expected a dict of input name -> array, got list"),
    ],
)
def test_iter_feeds_errors_name_sample_and_input(feed, message):
    with pytest.raises(CalibrationDataError) as e:
        list(iter_feeds([feed], inputs_x()))
    assert str(e.value) == message


def test_iter_feeds_variable_symbolic_dims():
    inputs = [Value("ids", TensorType(I64, ("N", "S")))]
    feeds = [{"ids": np.zeros((1, s), np.int64)} for s in (3, 9, 17)]
    assert [f["ids"].shape[1] for f in iter_feeds(feeds, inputs)] == [3, 9, 17]


def test_iter_feeds_image_folder_with_preprocessing(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(3):
        Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(folder / f"{k}.png")
    pre = ImagePreprocess(resize=20, crop=(16, 16), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    feeds = list(iter_feeds(folder, [Value("img", TensorType(F32, ("N", 3, 16, 16)))], preprocess=pre))
    assert len(feeds) == 3 and feeds[0]["img"].shape == (1, 3, 16, 16) and feeds[0]["img"].dtype == np.float32
    # a pixel of value p maps to (p/255 - 0.5)/0.25: the range is [-2, 2]
    assert feeds[0]["img"].min() >= -2.0 and feeds[0]["img"].max() <= 2.0
    nhwc = ImagePreprocess(crop=(16, 16), layout="NHWC")
    feeds = list(iter_feeds(folder, [Value("img", TensorType(F32, ("N", 16, 16, 3)))], preprocess=nhwc))
    assert feeds[0]["img"].shape == (1, 16, 16, 3)


def test_iter_feeds_image_folder_needs_preprocessing(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "a.png")
    with pytest.raises(CalibrationDataError, match="a folder of images needs a declared preprocessing"):
        list(iter_feeds(folder, inputs_x()))
